"""The target: chunked prefill through transformers' Qwen3.5, and the reductions of its logits.

Contract: `prefill_hidden` runs one request's tokens through the model's own cache in chunks
and returns the post-final-norm hidden state at every position — the tensor the lm_head
consumes and the one the MTP head pairs with the next token. Nothing vocabulary-sized is
kept here; logits are reduced chunk by chunk where rows need them.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


def _cache_kwarg(text_model) -> str:
    """transformers renamed `past_key_values` to `cache`; use whichever this version takes."""
    params = inspect.signature(text_model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@dataclass(frozen=True)
class TargetPrefix:
    """The target after the first `length` tokens of a request: where the next request can start.

    Consecutive requests of a session share long prefixes (a template that drops earlier reasoning
    re-renders only from the previous assistant turn on), so the replay carries this over instead
    of prefilling the shared tokens again — the serving engines' prefix cache, within a session.
    """

    length: int
    cache: object  # transformers DynamicCache after tokens [0, length) (KV and linear-attention states)
    hidden: Tensor  # [length, H] post-norm h_0 .. h_{length-1}


@torch.no_grad()
def prefill(model, input_ids: Tensor, chunk_size: int = 2048, prefix: TargetPrefix | None = None,
            keep_at: int | None = None) -> tuple[Tensor, TargetPrefix | None]:
    """input_ids: [n] -> (h: [n, H] post-final-norm, the state after the first keep_at tokens or None).

    Chunks go through the model's own cache: the full-attention layers keep their KV and the
    linear-attention layers their conv and recurrent states, so chunked == whole wherever the
    boundaries fall. With `prefix` (whose tokens must be input_ids[:prefix.length]) the prefill
    starts after it; `keep_at` (>= the start) adds a chunk boundary there and snapshots the state.
    """
    import copy

    from transformers import DynamicCache

    text_model = model.model
    device = text_model.embed_tokens.weight.device
    n = input_ids.shape[0]
    start = prefix.length if prefix is not None else 0
    assert start < n, "a prefix must leave at least one token to prefill"
    assert keep_at is None or start <= keep_at <= n, (start, keep_at, n)
    cache = prefix.cache if prefix is not None else DynamicCache(config=model.config)
    kw = _cache_kwarg(text_model)
    bounds = sorted(set(list(range(start, n, chunk_size)) + ([keep_at] if keep_at is not None else []) + [n]))
    pieces = [prefix.hidden] if prefix is not None else []
    kept = None
    if keep_at == start and prefix is not None:
        kept = TargetPrefix(start, copy.deepcopy(cache), prefix.hidden)
    for c0, c1 in zip(bounds[:-1], bounds[1:]):
        chunk = input_ids[c0:c1].to(device)[None]
        pieces.append(text_model(input_ids=chunk, use_cache=True, **{kw: cache}).last_hidden_state[0])
        if c1 == keep_at:
            kept = TargetPrefix(keep_at, copy.deepcopy(cache), torch.cat(pieces)[:keep_at])
    hidden = torch.cat([p.to(pieces[-1].device) for p in pieces])
    return hidden, kept


def prefill_hidden(model, input_ids: Tensor, chunk_size: int = 2048) -> Tensor:
    """input_ids: [n] -> h: [n, H], post-final-norm (see `prefill`)."""
    return prefill(model, input_ids, chunk_size)[0]


# ---------------------------------------------------------------------------------------------
# Reductions of the target's logits where rows need them


@dataclass(frozen=True)
class SamplingProfile:
    """A serving sampler: temperature, then top-k, then top-p (vLLM's order and tie rules)."""

    name: str
    temperature: float
    top_p: float = 1.0
    top_k: int = 0  # <= 0: no top-k

    def as_dict(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}


BUILTIN_PROFILES = (
    SamplingProfile("thinking", temperature=0.6, top_p=0.95, top_k=20),  # Qwen3.5's recommended thinking-mode sampler
    SamplingProfile("instruct", temperature=0.7, top_p=0.8, top_k=20),  # and its non-thinking one
)


@dataclass(frozen=True)
class Reductions:
    """What rows need from the target's logits at position p+k-1, one entry per (anchor, depth) row."""

    target_token: Tensor  # [R] int64  argmax: what greedy serving emits at p+k
    target_logprob: Tensor  # [R] fp32  log-softmax (T=1) at the draft d_k
    actual_logprob: Tensor  # [R] fp32  log-softmax (T=1) at the recorded x_{p+k}
    p_accept: dict  # profile name -> [R] fp32  probability the profile's sampler emits d_k


def sampler_probability(
    logits: Tensor, profile: SamplingProfile, rows: Tensor, tokens: Tensor, ranked: tuple[Tensor, Tensor] | None = None
) -> Tensor:
    """Probability that `profile`'s sampler emits tokens[r] from logits[rows[r]].

    logits: [c, V] fp32; rows: [R] indices into c; tokens: [R]; ranked: optionally logits.topk(k')
    for some k' >= top_k (values [c, k'] descending, index [c, k']), shared between profiles. As vLLM
    samples: divide by the temperature; keep the top_k largest (exactly k; exact ties at the k-th
    value are broken by index); then top-p on the kept distribution — sorted ascending, drop while
    the cumulative probability is <= 1 - top_p, always keep the largest; renormalise.
    Worked example: probabilities (0.5, 0.3, 0.15, 0.05), top_p 0.8: ascending cumsum
    (0.05, 0.2, 0.5, 1.0) <= 0.2 drops the two smallest; the rest renormalise to (0.625, 0.375).
    Dividing by a positive temperature keeps the order, so the ranking is taken on the raw logits
    and only the k kept values are divided (not the whole vocabulary).
    """
    if profile.temperature == 0:
        return (logits.argmax(-1)[rows] == tokens).float()
    V = logits.shape[-1]
    if 0 < profile.top_k < V:
        if ranked is not None and ranked[0].shape[-1] >= profile.top_k:
            values, index = ranked[0][:, : profile.top_k], ranked[1][:, : profile.top_k]
        else:
            values, index = logits.topk(profile.top_k, dim=-1)  # [c, k], descending
    else:
        values, index = logits.sort(dim=-1, descending=True)
    values = values / profile.temperature
    if profile.top_p < 1.0:
        ascending = torch.softmax(values, dim=-1).flip(-1)
        drop = ascending.cumsum(-1) <= 1 - profile.top_p
        drop[..., -1] = False
        values = values.masked_fill(drop.flip(-1), float("-inf"))
    probs = torch.softmax(values, dim=-1)
    if index.shape[-1] < V:
        hit = index[rows] == tokens[:, None]  # [R, k]
        return (probs[rows] * hit).sum(-1)
    return torch.zeros_like(probs).scatter_(-1, index, probs)[rows, tokens]


@torch.no_grad()
def reduce_logits(
    lm_head: Tensor,
    hidden: Tensor,
    positions: Tensor,
    drafts: Tensor,
    actuals: Tensor,
    profiles: tuple[SamplingProfile, ...],
    budget: int = 1 << 26,
) -> Reductions:
    """Apply the lm_head at the rows' positions only, in chunks, keeping reductions and nothing vocabulary-sized.

    lm_head: [V, H]; hidden: [n, H] post-norm; positions, drafts, actuals: [R] (position p+k-1,
    draft d_k, recorded x_{p+k}). Each distinct position's logits are computed once.
    """
    device = lm_head.device  # under a device map, the last device; the hidden rows are moved to it
    R = positions.shape[0]
    V = lm_head.shape[0]
    positions, drafts, actuals = positions.to(device), drafts.to(device), actuals.to(device)
    out_token = torch.empty(R, dtype=torch.long, device=device)
    out_target = torch.empty(R, dtype=torch.float32, device=device)
    out_actual = torch.empty(R, dtype=torch.float32, device=device)
    out_p = {p.name: torch.empty(R, dtype=torch.float32, device=device) for p in profiles}
    if R == 0:
        return Reductions(out_token, out_target, out_actual, out_p)
    unique, inverse = torch.unique(positions, return_inverse=True)  # unique ascending
    order = torch.argsort(inverse, stable=True)
    sorted_inverse = inverse[order]
    full_sort = any(not (0 < p.top_k < V) and p.temperature != 0 for p in profiles)
    chunk = max(1, budget // (V * (3 if full_sort else 1)))
    top_k = max((p.top_k for p in profiles if p.temperature != 0 and 0 < p.top_k < V), default=0)
    for c0 in range(0, unique.shape[0], chunk):
        c1 = min(unique.shape[0], c0 + chunk)
        lo, hi = torch.searchsorted(sorted_inverse, torch.tensor([c0, c1], device=device)).tolist()
        sel = order[lo:hi]  # rows whose position is in this chunk
        local = inverse[sel] - c0
        logits = F.linear(hidden[unique[c0:c1]].to(lm_head.device), lm_head).float()  # [c, V]: the only vocabulary-sized tensor
        token = logits.argmax(-1)
        out_token[sel] = token[local]
        ranked = logits.topk(top_k, dim=-1) if top_k else None  # one ranking for every top-k profile
        for p in profiles:
            out_p[p.name][sel] = sampler_probability(logits, p, local, drafts[sel], ranked)
        rowmax = logits.gather(1, token[:, None]).squeeze(1)
        draft_logit, actual_logit = logits[local, drafts[sel]] - rowmax[local], logits[local, actuals[sel]] - rowmax[local]
        # log Σ exp(logit - max), in place: logsumexp without another pass for the maxima or another [c, V] buffer
        lse = logits.sub_(rowmax[:, None]).exp_().sum(-1).log_()
        out_target[sel] = draft_logit - lse[local]
        out_actual[sel] = actual_logit - lse[local]
        del logits
    return Reductions(out_token, out_target, out_actual, out_p)
