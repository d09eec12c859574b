"""The target pass: chunked prefill through transformers' cache equals one whole forward."""

from __future__ import annotations

import pytest
import torch

from mtp_observe.target import prefill_hidden


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
