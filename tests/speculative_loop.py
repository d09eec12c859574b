"""A real speculative-sampling loop, for tests only: argmax drafts from a head, rejection sampling against
the serving sampler, written from Leviathan et al. (2023) and vLLM's rejection sampler, sharing no code
with mtp_observe's replay or its sampler.

At anchor p (the target has just emitted x_p) the head drafts d_1..d_K by argmax; the target verifies
them in one forward over x + drafts; for j = 1..K, with q_j the sampler's distribution at position p+j-1
(penalties counting the turn's output so far and the drafts d_1..d_{j-1} before it, as vLLM does):

    accept d_j with probability q_j(d_j)                  (the draft is deterministic: its own probability is 1)
    on rejection emit a sample of q_j with d_j removed, renormalised, and stop
    if all K are accepted, emit a bonus token sampled from q_{K+1}

The target keeps a cache of the committed tokens (transformers' DynamicCache: KV and linear-attention
states): each step verifies x_p and the drafts on a copy of it, then advances the committed cache over x_p
and the accepted drafts only (a linear-attention state cannot be rolled back, so it is recomputed), in float64. The drafts
come from `head.draft(hidden, ids, p, K)`: tests.reference_head.ReferenceHead, or `ServedHead` below (the
served MtpHead, its row pass extended by each step's new rows). The sampler is tests/test_sampler.vllm_sampler
(vLLM's code path over the whole vocabulary).
"""

from __future__ import annotations

import torch

from .test_sampler import vllm_sampler


def _sample(q: torch.Tensor, gen: torch.Generator) -> int:
    return int(torch.multinomial(q / q.sum(), 1, generator=gen))


class ServedHead:
    """The served MtpHead behind ReferenceHead's interface: row pass over h_0..h_{p-1} with x_1..x_p, then the chain.

    The rows of the step before are kept and the pass extended by the new ones (row_pass's `prefix`, equal to the
    whole pass: tests/test_mtp_head.py) while h_0.. and x_1.. are those rows' own (the loop only appends committed
    ones); any other call (a new prompt) starts from row 0. Recomputing all rows at every step cost half the
    verdict fixture's time."""

    def __init__(self, head):
        self.head = head
        self.rows = None  # RowPass of rows 0..P-1
        self.inputs = None  # (hidden [P, H], next ids [P]) those rows were computed from

    def draft(self, hidden, ids, anchor: int, K: int):
        P = self.rows.states.shape[0] if self.rows is not None else 0
        kept = 0 < P <= anchor and torch.equal(hidden[:P], self.inputs[0]) and torch.equal(ids[1 : P + 1], self.inputs[1])
        if not kept:
            P, self.rows = 0, None
        if anchor > P:
            self.rows = self.head.row_pass(hidden[P:anchor], ids[P + 1 : anchor + 1], prefix=self.rows)
        self.inputs = (hidden[:anchor].clone(), ids[1 : anchor + 1].clone())
        chain = self.head.chain(self.rows, torch.tensor([anchor]), torch.tensor([K]))
        return chain.tokens[0].tolist(), None


def speculative_sampling(target, head, prompt: list[int], profile, k: int, n_new: int, gen: torch.Generator):
    """-> (prompt + n_new tokens, [(anchor p, accepted drafts a)] one per verify step)."""
    import copy

    from transformers import DynamicCache

    from mtp_observe.model.target import _cache_kwarg

    kw = _cache_kwarg(target.model)

    def forward(tokens, cache):  # tokens after the cache's -> (post-norm hidden [n, H]); the cache advances
        with torch.no_grad():
            return target.model(input_ids=torch.tensor(tokens)[None], use_cache=True, **{kw: cache}).last_hidden_state[0]

    def logits(h):
        with torch.no_grad():
            return target.lm_head(h).double()

    x = list(prompt)
    s = len(prompt)
    committed = DynamicCache(config=target.config)  # after x_0..x_{s-2}: x_{s-1} is fed with the first step
    hidden = forward(x[:-1], committed)  # [s-1, H]
    probe = copy.deepcopy(committed)
    last = forward(x[-1:], probe)
    x.append(_sample(vllm_sampler(logits(last)[-1], profile, prompt, []), gen))  # x_s comes from the prefill
    hidden = torch.cat([hidden, last])
    committed = probe  # after x_0..x_{s-1}
    steps = []
    while len(x) < s + n_new:
        p = len(x) - 1  # hidden holds h_0..h_{p-1}; the cache has consumed x_0..x_{p-1}
        drafts, _ = head.draft(hidden, torch.tensor(x), p, k)
        trial = copy.deepcopy(committed)
        verified = forward([x[p]] + drafts, trial)  # h_p .. h_{p+K}
        verify = logits(verified)  # verify[j]: position p + j, which predicts x_{p+j+1}
        emitted: list[int] = []
        for j in range(k):
            q = vllm_sampler(verify[j], profile, prompt, x[s:] + drafts[:j])
            d = drafts[j]
            if float(torch.rand((), generator=gen, dtype=torch.float64)) < float(q[d]):
                emitted.append(d)
                continue
            residual = q.clone()
            residual[d] = 0.0
            emitted.append(_sample(residual, gen))
            break
        else:
            emitted.append(_sample(vllm_sampler(verify[k], profile, prompt, x[s:] + drafts), gen))
        a = len(emitted) - 1
        steps.append((p, a))
        if a == k:
            committed = trial  # every draft was consumed and kept
        else:
            forward([x[p]] + drafts[:a], committed)  # x_p and the accepted drafts only
        hidden = torch.cat([hidden, verified[: a + 1]])  # h_p .. h_{p+a}: their tokens are the committed ones
        x.extend(emitted)
    return x[: s + n_new], steps


def tokens_per_step(steps: list[tuple[int, int]], s: int, e: int) -> tuple[int, int]:
    """(tokens, steps) of the loop on the kept trajectory x_s..x_e: the steps whose anchor is before e, each
    emitting its accepted drafts and one more token, none past e (the last step may be cut there)."""
    n = 0
    for p, _ in steps:
        if p < e:
            n += 1
    return e - s, n
