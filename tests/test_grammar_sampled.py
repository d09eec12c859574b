"""replay --grammar tools, sampled acceptance under the mask (model/target.py reduce_logits' grammar_masks,
docs/grammar.md): the target's distribution with the grammar's disallowed tokens at -inf before the sampler, as
vLLM applies the bitmask to the logits before its rejection sampler. Values by hand on an 8-token vocabulary, and
equality with xgrammar's own bitmask kernel (the one vLLM calls) followed by the sampler."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mtp_observe.model.target import SamplingProfile, allowed_sets, reduce_logits, sampler_distribution

PROFILES = (SamplingProfile("plain", 1.0), SamplingProfile("greedy", 0.0), SamplingProfile("top2", 1.0, top_k=2))


def _packed(allowed: list[set[int]], V: int) -> torch.Tensor:
    """[M, ceil(V/32)] int32: xgrammar's packed bitmask rows (bit j of word w is token 32 w + j)."""
    words = np.zeros((len(allowed), (V + 31) // 32), dtype=np.uint32)
    for r, ids in enumerate(allowed):
        for t in ids:
            words[r, t // 32] |= np.uint32(1) << np.uint32(t % 32)
    return torch.from_numpy(words.view(np.int32))


def _reduce(logits: torch.Tensor, positions, drafts, masks=None, profiles=PROFILES):
    V = logits.shape[1]
    r = reduce_logits(torch.eye(V), logits, torch.tensor(positions), torch.tensor(drafts), torch.tensor(drafts),
                      profiles, grammar_masks=masks)
    return {name: v.tolist() for name, v in r.p_accept.items()}


def test_sampled_acceptance_under_the_mask_is_the_distribution_renormalised_over_the_allowed_set():
    # position 0 predicts x_1, whose allowed set is {1, 2, 5}; position 1 predicts x_2, which has no mask
    probs = [0.4, 0.12, 0.2, 0.05, 0.05, 0.08, 0.05, 0.05]
    logits = torch.tensor([[math.log(p) for p in probs]] * 2)
    masks = (torch.tensor([1]), _packed([{1, 2, 5}], 8))
    drafts = [0, 1, 2, 5, 0, 2]
    got = _reduce(logits, [0, 0, 0, 0, 1, 1], drafts, masks)
    # by hand: the allowed mass is 0.12 + 0.2 + 0.08 = 0.4 -> 0.3, 0.5, 0.2; the forbidden token 0 (the unmasked
    # argmax) accepts with probability 0; greedy emits the allowed argmax 2; top-2 of the allowed set keeps {2, 1}:
    # 0.2 / 0.32 and 0.12 / 0.32 (unmasked, top-2 would keep {0, 2})
    assert got["plain"][:4] == pytest.approx([0.0, 0.3, 0.5, 0.2], abs=1e-6)
    assert got["greedy"][:4] == [0.0, 0.0, 1.0, 0.0]
    assert got["top2"][:4] == pytest.approx([0.0, 0.375, 0.625, 0.0], abs=1e-6)
    # position 1 has no mask: as without any
    assert got["plain"][4:] == pytest.approx([0.4, 0.2], abs=1e-6)
    assert got["greedy"][4:] == [1.0, 0.0] and got["top2"][4:] == pytest.approx([2 / 3, 1 / 3], abs=1e-6)
    # negative control: without the masks, position 0 is the unmasked distribution
    plain = _reduce(logits, [0, 0, 0, 0, 1, 1], drafts)
    assert plain["plain"][:4] == pytest.approx([0.4, 0.12, 0.2, 0.08], abs=1e-6) and plain["greedy"][:4] == [1, 0, 0, 0]


def test_a_forced_position_accepts_its_one_allowed_draft_with_probability_one_under_every_sampler():
    logits = torch.tensor([[3.0, -1.0, 0.5, 2.0, 0.0, 0.0, 1.0, -2.0]])
    masks = (torch.tensor([1]), _packed([{6}], 8))
    profiles = PROFILES + (SamplingProfile("nucleus", 0.7, top_p=0.8, min_p=0.1),)
    got = _reduce(logits, [0, 0], [6, 0], masks, profiles)
    assert all(v == pytest.approx([1.0, 0.0], abs=1e-6) for v in got.values())


def test_masked_acceptance_equals_xgrammars_bitmask_kernel_then_the_sampler():
    import xgrammar as xgr  # the [test] extra installs it: never skipped

    g = torch.Generator().manual_seed(4)
    V, n = 300, 6  # ten 32-bit words, the last one partly past the vocabulary
    logits = torch.randn(n, V, generator=g) * 2
    allowed = [set(torch.randperm(V, generator=g)[: 1 + 40 * i].tolist()) for i in range(n)]
    bits = _packed(allowed, V)
    positions = torch.arange(n).repeat_interleave(4)
    drafts = torch.stack([torch.tensor([min(a), max(a)] + [t for t in range(V) if t not in a][:2]) for a in allowed])
    profiles = (SamplingProfile("nucleus", 0.8, top_p=0.9, top_k=50, min_p=0.05), SamplingProfile("plain", 1.0))
    # the grammar masks are keyed by the position predicted: row position p predicts x_{p+1}
    r = reduce_logits(torch.eye(V), logits, positions, drafts.reshape(-1), drafts.reshape(-1), profiles,
                      grammar_masks=(torch.arange(1, n + 1), bits))
    masked = logits.clone()
    xgr.apply_token_bitmask_inplace(masked, bits)  # what vLLM's apply_grammar_bitmask calls on the target's logits
    assert torch.equal(allowed_sets((torch.arange(1, n + 1), bits), torch.arange(1, n + 1), V),
                       torch.isfinite(masked))
    for p in profiles:
        want = sampler_distribution(masked, p).at(positions, drafts.reshape(-1))
        assert torch.allclose(r.p_accept[p.name], want, atol=1e-6)
        assert (r.p_accept[p.name].reshape(n, 4)[:, 2:] == 0).all()  # the drafts outside the allowed set
    soft = torch.softmax(masked, -1)  # T = 1, no truncation: renormalised over the allowed set
    assert torch.allclose(r.p_accept["plain"], soft[positions, drafts.reshape(-1)], atol=1e-6)
