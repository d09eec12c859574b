"""Checks of the product head against the reference head (tests/reference_head.py), shared by the dense and the MoE tests."""

from __future__ import annotations

import torch

from .reference_head import CORRECT, Reading, ReferenceHead

K = 3
SAMPLE_ANCHORS = [1, 2, 9, 17, 33, 50, 64, 65, 81, 99, 130, 150, 177, 198]


def product_drafts(head, ids, hidden, anchors, k=K, chunk_size=64):
    """The product head's drafts [A, k] and their logits [A, k, V] at the anchors (rows over the whole request)."""
    rows = head.row_pass(hidden[:-1], ids[1:], chunk_size=chunk_size)
    anchors = torch.as_tensor(anchors)
    drafts = head.chain(rows, anchors, torch.full_like(anchors, k), keep_states=True)
    return drafts.tokens, head.logits(drafts.states.reshape(-1, head.geometry.hidden_size)).reshape(len(anchors), k, -1)


def reference(model, reading: Reading = CORRECT, text_config: dict | None = None) -> ReferenceHead:
    """The reference head over a loaded model's own head weights, read as `reading` says."""
    head = model.head
    return ReferenceHead(head.named_weights(), head.geometry, head.embed_tokens, head.lm_head, reading,
                         text_config=text_config)


def assert_wrong_reading_differs(model, ids, hidden, reading: Reading, anchors=SAMPLE_ANCHORS,
                                 text_config: dict | None = None):
    """The product equals the correct reference; the wrong reading gives a different answer."""
    tokens, logits = product_drafts(model.head, ids, hidden, anchors)
    right, wrong = reference(model, text_config=text_config), reference(model, reading, text_config=text_config)
    gap, drafts_differ = 0.0, False
    for a, p in enumerate(anchors):
        ref_tokens, ref_logits = right.draft(hidden, ids, p, K)
        wrong_tokens, wrong_logits = wrong.draft(hidden, ids, p, K)
        assert tokens[a].tolist() == ref_tokens
        assert (logits[a] - ref_logits).abs().max() < 1e-5
        gap = max(gap, float((wrong_logits - ref_logits).abs().max()))
        drafts_differ |= wrong_tokens != ref_tokens
    assert gap > 0.05, f"{reading}: the wrong reading is indistinguishable (max logit gap {gap})"
    assert drafts_differ, f"{reading}: the wrong reading drafts the same tokens"
