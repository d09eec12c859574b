"""The target pass: chunked prefill through transformers' cache equals one whole forward."""

from __future__ import annotations

import pytest
import torch

from mtp_observe.model.target import prefill_hidden


@pytest.mark.parametrize("chunk_size", [1, 7, 37, 64, 100])
def test_chunked_prefill_equals_whole_prefill_across_linear_and_full_attention_layers(tiny_model, chunk_size):
    model = tiny_model.target
    assert set(model.config.layer_types) == {"linear_attention", "full_attention"}
    ids = torch.randint(0, 990, (150,), generator=torch.Generator().manual_seed(5))
    whole = prefill_hidden(model, ids, chunk_size=10_000)
    chunked = prefill_hidden(model, ids, chunk_size=chunk_size)
    whole_logits, chunked_logits = model.lm_head(whole), model.lm_head(chunked)
    assert torch.equal(whole_logits.argmax(-1), chunked_logits.argmax(-1))
    assert (whole_logits - chunked_logits).abs().max() < 1e-4


def test_a_prefill_resumed_from_a_kept_prefix_equals_one_from_scratch(tiny_model):
    from mtp_observe.model.target import prefill

    model = tiny_model.target
    ids = torch.randint(0, 990, (150,), generator=torch.Generator().manual_seed(6))
    whole = prefill(model, ids, chunk_size=10_000)[0]
    other = torch.cat([ids[:97], torch.randint(0, 990, (40,), generator=torch.Generator().manual_seed(7))])
    _, kept = prefill(model, other, chunk_size=30, keep_at=97)  # another request sharing the first 97 tokens
    assert kept.length == 97 and kept.hidden.shape[0] == 97
    resumed, _ = prefill(model, ids, chunk_size=30, prefix=kept)
    assert (whole - resumed).abs().max() < 1e-4
    assert torch.equal(model.lm_head(whole).argmax(-1), model.lm_head(resumed).argmax(-1))
