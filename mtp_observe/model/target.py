"""The target: chunked prefill through transformers' Qwen3.5, its serving sampler, and the reductions of its logits.

Contract: `prefill_hidden` runs one request's tokens through the model's own cache in chunks
and returns the post-final-norm hidden state at every position — the tensor the lm_head
consumes and the one the MTP head pairs with the next token. `sampler_distribution(logits,
profile, penalty_state)` is the serving sampler as vLLM applies it (penalties, temperature,
min-p, top-k, top-p; the rules and their sources are listed above `SamplingProfile`), a pure
function from a chunk of logits [c, V] to the distribution it draws from — what the replay
scores and what a generator samples from. `reduce_logits` applies the lm_head chunk by chunk
where rows need it and keeps reductions only: nothing vocabulary-sized is kept here.
"""

from __future__ import annotations

import inspect
import math
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .penalties import NO_PENALTIES, PenaltyState, penalised, penalised_ranking, turn_penalty_state

RECORDED = "recorded"  # the profile scored with each session's own meta.sampling (else the fallback)


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
            keep_at: int | None = None, on_chunk=None) -> tuple[Tensor, TargetPrefix | None]:
    """input_ids: [n] -> (h: [n, H] post-final-norm, the state after the first keep_at tokens or None).

    Chunks go through the model's own cache: the full-attention layers keep their KV and the
    linear-attention layers their conv and recurrent states, so chunked == whole wherever the
    boundaries fall. With `prefix` (whose tokens must be input_ids[:prefix.length]) the prefill
    starts after it; `keep_at` (>= the start) adds a chunk boundary there and snapshots the state.
    on_chunk(n), if given, is called after each chunk with its number of tokens (progress).
    """
    import copy

    from transformers import DynamicCache

    if getattr(model, "engine", None) is not None:  # --target-engine: the layers run in the engine
        from .engine_target import engine_hidden

        hidden = engine_hidden(model, input_ids, on_chunk=on_chunk)  # the whole request: the engine keeps no prefix
        return hidden, (TargetPrefix(keep_at, None, hidden[:keep_at]) if keep_at is not None else None)
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
        if on_chunk is not None:
            on_chunk(c1 - c0)
        if c1 == keep_at:
            kept = TargetPrefix(keep_at, copy.deepcopy(cache), torch.cat(pieces)[:keep_at])
    hidden = torch.cat([p.to(pieces[-1].device) for p in pieces])
    return hidden, kept


def prefill_hidden(model, input_ids: Tensor, chunk_size: int = 2048) -> Tensor:
    """input_ids: [n] -> h: [n, H], post-final-norm (see `prefill`)."""
    return prefill(model, input_ids, chunk_size)[0]


# ---------------------------------------------------------------------------------------------
# The serving sampler, as vLLM applies it
#
# Order and rules, read from vLLM's code (vllm-project/vllm):
#   vllm/v1/worker/gpu/sample/sampler.py  Sampler.sample: penalties, then temperature, then min-p,
#                                          then top-k and top-p together (the same order as the v1
#                                          vllm/v1/sample/sampler.py: penalties in
#                                          apply_logits_processors, then temperature, the argmax-
#                                          invariant processors (min-p), then TopKTopPSampler)
#   vllm/model_executor/layers/utils.py   apply_penalties: repetition over every token of the prompt
#                                          OR the output (positive logits divided by the penalty,
#                                          the others multiplied), then frequency (- f * count in the
#                                          output), then presence (- p * [count > 0]), OpenAI's definition
#   vllm/_custom_ops.py                    apply_repetition_penalties_torch (the reference of the kernel)
#   vllm/v1/sample/rejection_sampler.py,   the output tokens at a draft position are the request's
#   vllm/v1/worker/gpu/sample/penalties.py output so far plus the drafts before it in the same step
#                                          (_combine_outputs_with_spec_tokens; "base output counts +
#                                          cumulative draft counts")
#   vllm/v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p (:501-521): the Triton kernel where Triton is
#                                          (every GPU), else the PyTorch one. Triton's top-k keeps exactly
#                                          k, ties at the k-th value broken by the lowest token id
#                                          (vllm/v1/sample/ops/topk_topp_triton.py:385-392, 851-875; its
#                                          1e-9 tie tolerance is taken as exact equality here): ties="index".
#                                          PyTorch's (:524-587) keeps every logit >= the k-th largest
#                                          (exact ties at the k-th value are all kept): ties="all". Top-p
#                                          sorts ascending, drops while the cumulative probability is
#                                          <= 1 - top_p, always keeps the largest
#   vllm/v1/worker/gpu/sample/min_p.py     min-p drops logits < max + log(min_p) (probability below
#                                          min_p times the largest), after the temperature
#   vllm/v1/sample/rejection_sampler.py    V1's rejection sampler scores a draft position without min-p
#                                          (apply_sampling_constraints :589-643: temperature, then top-k /
#                                          top-p only), V2's with it (vllm/v1/worker/gpu/spec_decode/
#                                          rejection_sampler.py:250-296: the whole apply_sampling_params);
#                                          reduce_logits' `no_min_p` rows are those of a drafter V1 serves
#   vllm/v1/sample/sampler.py             temperature < 1e-5 is greedy: the argmax of the penalised logits
#   vllm/config/model.py:1860-1916         get_diff_sampling_param: a server's default sampler is the
#                                          checkpoint's generation_config.json: nine keys (repetition,
#                                          presence and frequency penalties, temperature, top_k, top_p,
#                                          min_p, max_new_tokens -> max_tokens, skip_special_tokens;
#                                          do_sample is not read); the seven of SAMPLING_PARAMS are the
#                                          ones that shape the distribution (generation_config_profile)
#
# Here a distribution is computed for a chunk of positions and reduced on the spot (the probability
# of a token, Σ q², Σ q³); nothing vocabulary-sized outlives the chunk. Dividing by a positive
# temperature keeps the order, so top-k profiles rank the (penalised) logits once and divide only the
# kept values; min-p's threshold depends only on the largest logit, so it is applied to the kept ones.
# Exact ties inside the top-p cut are ordered as torch.topk returns them (vLLM's order among exactly
# equal values is its sort's, likewise unspecified).

_SAMPLING_EPS = 1e-5  # vLLM: a temperature below this samples greedily
TIE_SLACK = 8  # ranked values kept past top_k, so that logits tied with the k-th are found without a full pass
PENALTY_SLACK = 32  # raw ranked values kept past that, so the penalised rankings come from it (penalised_ranking)
SAMPLING_PARAMS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                   "repetition_penalty")  # vLLM SamplingParams names


@dataclass(frozen=True)
class SamplingProfile:
    """A serving sampler: vLLM's penalties, temperature, min-p, top-k and top-p (order and rules above).

    Worked example of the penalties (presence 1.5, frequency 0.5, repetition 2.0): a token generated
    twice earlier in the turn with logit 3.0 becomes 3.0 / 2 - 0.5 * 2 - 1.5 = -1.0; one seen only in
    the prompt with logit -1.0 becomes -1.0 * 2 = -2.0 (repetition alone); an unseen one keeps its logit.
    """

    name: str
    temperature: float  # < 1e-5: greedy
    top_p: float = 1.0  # 1: off
    top_k: int = 0  # <= 0 (vLLM's -1 or 0) or >= vocabulary: off
    min_p: float = 0.0  # 0: off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1: off

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _SAMPLING_EPS

    @property
    def penalties(self) -> tuple[float, float, float]:
        return (float(self.repetition_penalty), float(self.frequency_penalty), float(self.presence_penalty))

    @property
    def penalised(self) -> bool:
        return self.penalties != NO_PENALTIES

    def params(self) -> tuple:
        """What the distribution depends on (two profiles with equal params are computed once)."""
        return tuple(float(getattr(self, k)) for k in SAMPLING_PARAMS)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in SAMPLING_PARAMS}

    def renamed(self, name: str) -> "SamplingProfile":
        return SamplingProfile(name, **self.as_dict())


# The Qwen3.5 model card's four recommended samplers (min_p 0, repetition_penalty 1.0 in all four), then greedy.
BUILTIN_PROFILES = (
    SamplingProfile("thinking_general", 1.0, top_p=0.95, top_k=20, presence_penalty=1.5),
    SamplingProfile("thinking_coding", 0.6, top_p=0.95, top_k=20),
    SamplingProfile("instruct_general", 0.7, top_p=0.8, top_k=20, presence_penalty=1.5),
    SamplingProfile("instruct_reasoning", 1.0, top_p=1.0, top_k=40, presence_penalty=2.0),
    SamplingProfile("greedy", 0.0),
)
VLLM_DEFAULTS = SamplingProfile("default", 1.0)  # vLLM SamplingParams() with no generation_config


def profile_from_params(name: str, params: dict, base: SamplingProfile) -> SamplingProfile:
    """A sampler from vLLM SamplingParams-named keys (absent or null keys take `base`'s value).

    Checked as vLLM's SamplingParams checks them; raises ValueError naming the key and its range.
    Keys outside SAMPLING_PARAMS (seed, max_tokens, n, stop, ...) do not change the distribution and are ignored.
    """
    values = base.as_dict()
    for key in SAMPLING_PARAMS:
        v = params.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
            raise ValueError(f"sampling {key} is {v!r}, expected a number")
        values[key] = v
    if values["temperature"] < 0:
        raise ValueError(f"sampling temperature {values['temperature']} < 0")
    if not 0 < values["top_p"] <= 1:
        raise ValueError(f"sampling top_p {values['top_p']} is outside (0, 1]")
    if int(values["top_k"]) != values["top_k"] or values["top_k"] < -1:
        raise ValueError(f"sampling top_k {values['top_k']} is not -1, 0 or a positive integer")
    if not 0 <= values["min_p"] <= 1:
        raise ValueError(f"sampling min_p {values['min_p']} is outside [0, 1]")
    for key in ("presence_penalty", "frequency_penalty"):
        if not -2 <= values[key] <= 2:
            raise ValueError(f"sampling {key} {values[key]} is outside [-2, 2]")
    if not values["repetition_penalty"] > 0:
        raise ValueError(f"sampling repetition_penalty {values['repetition_penalty']} must be > 0")
    values["top_k"] = max(int(values["top_k"]), 0)
    values = {k: (int(v) if k == "top_k" else float(v)) for k, v in values.items()}
    return SamplingProfile(name, **values)


SPEC_POSITIONS = ("temperature", "top_p", "top_k", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p")


def profile_from_spec(spec: str) -> SamplingProfile:
    """'NAME=T,TOP_P,TOP_K[,PRESENCE[,FREQUENCY[,REPETITION[,MIN_P]]]]' -> a profile (ValueError when malformed).

    After the first three, a field may also be KEY=VALUE with a vLLM name, in any order:
    'creative=1.0,0.95,0,min_p=0.05'. Worked example: 'chat=0.7,0.8,20,1.5' is instruct_general.
    """
    name, _, values = spec.partition("=")
    parts = [v.strip() for v in values.split(",")] if values else []
    if not name or len(parts) < 3:
        raise ValueError("expected NAME=TEMPERATURE,TOP_P,TOP_K[,PRESENCE[,FREQUENCY[,REPETITION[,MIN_P]]]]")
    params: dict = {}
    for i, part in enumerate(parts):
        key, eq, value = part.partition("=")
        if eq and i >= 3:
            if key not in SAMPLING_PARAMS:
                raise ValueError(f"unknown key {key!r}; the keys are {', '.join(SAMPLING_PARAMS)}")
        elif not eq and i < len(SPEC_POSITIONS):
            key, value = SPEC_POSITIONS[i], part
        else:
            raise ValueError(f"field {i + 1} ({part!r}) is neither a number in place nor KEY=VALUE")
        if key in params:
            raise ValueError(f"{key} is given twice")
        try:
            params[key] = int(value) if key == "top_k" else float(value)
        except ValueError:
            raise ValueError(f"{key} {value!r} is not a number") from None
    return profile_from_params(name, params, VLLM_DEFAULTS)


def generation_config_profile(model_dir) -> SamplingProfile | None:
    """The checkpoint's generation_config.json as the sampler vLLM serves by default, or None without one.

    vLLM reads nine keys from it over its neutral defaults (vllm/config/model.py:1860-1916 get_diff_sampling_param);
    the seven that shape the sampler's distribution are read here (SAMPLING_PARAMS: temperature, top_p, top_k, min_p,
    presence_penalty, frequency_penalty, repetition_penalty; max_new_tokens and skip_special_tokens do not change
    it, do_sample is not one of them). A file that cannot be read counts as absent.
    """
    import json
    from pathlib import Path

    path = Path(model_dir) / "generation_config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(config, dict):
        return None
    try:
        return profile_from_params("generation_config", config, VLLM_DEFAULTS)
    except ValueError:
        return None


@dataclass(frozen=True)
class Distribution:
    """A sampler's distribution over the vocabulary at c positions, held as its possibly non-zero part.

    Token index[r, i] has probability probs[r, i]; every other token has 0. index None: the columns
    are the whole vocabulary in order. `dense` gives the [c, V] probabilities.
    """

    probs: Tensor  # [c, m] fp32
    index: Tensor | None  # [c, m] int64 vocabulary ids, or None (m == V)

    def at(self, rows: Tensor, tokens: Tensor) -> Tensor:
        """rows, tokens: [R] -> [R] the probability of tokens[r] at position rows[r]."""
        if self.index is None:
            return self.probs[rows, tokens]
        return (self.probs[rows] * (self.index[rows] == tokens[:, None])).sum(-1)

    def power_sum(self, power: int) -> Tensor:
        """[c] Σ_v q(v)^power (2: the chance two samples agree, E[q(X)] for X ~ q)."""
        return self.probs.pow(power).sum(-1)

    def dense(self, vocab_size: int) -> Tensor:
        if self.index is None:
            return self.probs
        return torch.zeros(self.probs.shape[0], vocab_size, dtype=self.probs.dtype, device=self.probs.device).scatter_add_(
            -1, self.index, self.probs)


TOP_K_TIES = ("all", "index")  # vLLM's PyTorch top-k (every tie kept) and its Triton top-k (exactly k, lowest ids)


def sampler_distribution(logits: Tensor, profile: SamplingProfile, state: PenaltyState | None = None,
                         ranked: tuple[Tensor, Tensor] | None = None, ties: str = "all") -> Distribution:
    """The distribution `profile`'s sampler draws from, at each of c positions. logits: [c, V] fp32 (left as
    given); state: the penalty state of the c positions (needed when the profile has penalties); ranked:
    optionally the (penalised) logits' topk(k') for some k' >= top_k + TIE_SLACK, shared between profiles;
    ties: which top-k keeps logits tied with the k-th ("all": vLLM's PyTorch top-k, "index": its Triton top-k).

    Worked example (top_k 4, top_p 0.8): probabilities (0.5, 0.3, 0.15, 0.05) ascending cumsum
    (0.05, 0.2, 0.5, 1.0) <= 0.2 drops the two smallest; the rest renormalise to (0.625, 0.375).
    With logits (0, 1, 2, 1) and top_k 2: ties "all" keeps tokens 1, 2 and 3 (both tied at 1), "index" keeps
    tokens 1 and 2 (exactly two; of the tied 1 and 3 the lower id).
    """
    with penalised(logits, profile.penalties, state) as penalised_logits:
        return _distribution(penalised_logits, profile, ranked, ties)


def _lowest_ids_of_ties(values: Tensor, index: Tensor, k: int) -> Tensor:
    """[c, m] bool: which of the ranked (values, index), holding every logit >= the k-th, Triton's top-k keeps:
    every value above the k-th, and of those equal to it the lowest token ids, k in all."""
    kth = values[:, k - 1 : k]
    above = values > kth
    tied = values == kth
    need = k - above.sum(-1, keepdim=True)  # [c, 1] >= 1
    big = torch.iinfo(index.dtype).max
    tie_ids = torch.where(tied, index, torch.full_like(index, big))
    order = tie_ids.argsort(dim=-1, stable=True)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    return above | (tied & (rank < need))


def _distribution(logits: Tensor, profile: SamplingProfile, ranked: tuple[Tensor, Tensor] | None,
                  ties: str = "all") -> Distribution:
    """sampler_distribution on logits that already carry the profile's penalties."""
    assert ties in TOP_K_TIES, ties
    c, V = logits.shape
    if profile.is_greedy:
        return Distribution(torch.ones(c, 1, dtype=torch.float32, device=logits.device), logits.argmax(-1, keepdim=True))
    k = profile.top_k if 0 < profile.top_k < V else 0
    if k:
        width = min(k + TIE_SLACK, V)
        if ranked is None or ranked[0].shape[-1] < width:
            ranked = logits.topk(width, dim=-1)
        values, index = ranked
        kth = values[:, k - 1 : k]
        kept = (values >= kth).sum(-1)  # [c] k plus the ties at the k-th value that the ranking holds
        if bool((kept == values.shape[-1]).any()) and values.shape[-1] < V:  # ties run past the slack: count them all
            kept = (logits >= kth).sum(-1)
            values, index = logits.topk(int(kept.max()), dim=-1)
        kept = kept.clamp(min=1)  # the largest value is always kept (also when NaN logits compare false: check_finite says so)
        m = int(kept.max())
        values, index = values[:, :m], index[:, :m]
        outside = torch.arange(m, device=logits.device)[None, :] >= kept[:, None]
        if ties == "index" and m > k:  # some row has ties past the k-th: keep exactly k, the lowest ids among them
            outside = outside | ~_lowest_ids_of_ties(values.masked_fill(outside, float("-inf")), index, k)
        values = values.masked_fill(outside, float("-inf"))
    elif profile.top_p < 1.0 or profile.min_p > 0.0:
        values, index = logits.sort(dim=-1, descending=True)
    else:
        values, index = logits, None
    values = values / profile.temperature
    if profile.min_p > 0.0:
        largest = values[:, :1] if index is not None else values.max(-1, keepdim=True).values
        values = values.masked_fill(values < largest + math.log(profile.min_p), float("-inf"))
    if profile.top_p < 1.0:
        ascending = torch.softmax(values, dim=-1).flip(-1)
        drop = ascending.cumsum(-1) <= 1 - profile.top_p
        drop[..., -1] = False
        values = values.masked_fill(drop.flip(-1), float("-inf"))
    return Distribution(torch.softmax(values, dim=-1), index)


# ---------------------------------------------------------------------------------------------
# Reductions of the target's logits where rows need them


@dataclass(frozen=True)
class Turns:
    """A request's scored spans [s, e], which the penalties read (prompt, output so far) and the fit sums cover."""

    input_ids: Tensor  # [n] int64
    starts: Tensor  # [N] int64  s
    ends: Tensor  # [N] int64  e (inclusive)


@dataclass(frozen=True)
class FitSums:
    """Recording-sampler sums of one profile per span, over its scored tokens x_t (t = s..e, t >= 1),
    q_t the profile's distribution at t given the recorded prefix (ACCEPTANCE.md, "The recording sampler")."""

    support: Tensor  # [N] int64  tokens with q_t(x_t) > 0
    q: Tensor  # [N] fp64  Σ_t q_t(x_t)
    q2: Tensor  # [N] fp64  Σ_t Σ_v q_t(v)^2
    var: Tensor  # [N] fp64  Σ_t (Σ_v q_t(v)^3 - (Σ_v q_t(v)^2)^2): the variance of Σ_t q_t(x_t) under own sampling
    ll: Tensor  # [N] fp64  Σ_t log q_t(x_t) over the tokens with q_t(x_t) > 0 (the log-likelihood on the support)


@dataclass(frozen=True)
class Reductions:
    """What rows need from the target's logits at position p+k-1, one entry per (anchor, depth) row,
    and the recording-sampler sums per span."""

    target_token: Tensor  # [R] int64  argmax: what greedy serving emits at p+k
    target_logprob: Tensor  # [R] fp32  log-softmax (T=1) at the draft d_k
    actual_logprob: Tensor  # [R] fp32  log-softmax (T=1) at the recorded x_{p+k}
    p_accept: dict  # profile name -> [R] fp32  probability the profile's sampler emits d_k
    fit_tokens: Tensor | None = None  # [N] int64  scored tokens each span's fit sums cover (None without turns)
    fit: dict | None = None  # profile name -> FitSums over the spans of `turns`


@torch.no_grad()
def reduce_logits(
    lm_head: Tensor,
    hidden: Tensor,
    positions: Tensor,
    drafts: Tensor,
    actuals: Tensor,
    profiles: tuple[SamplingProfile, ...],
    budget: int = 1 << 26,
    turns: Turns | None = None,
    top_k_ties: str = "all",
    no_min_p: Tensor | None = None,
    grammar_masks: tuple[Tensor, Tensor] | None = None,
) -> Reductions:
    """Apply the lm_head at the positions rows need, in chunks, keeping reductions and nothing vocabulary-sized.

    lm_head: [V, H]; hidden: [n, H] post-norm; positions, drafts, actuals: [R] (position p+k-1,
    draft d_k, recorded x_{p+k}). Each distinct position's logits are computed once. With `turns`
    (a request's spans) the penalties read each position's prompt and output, and every position
    s-1..e-1 of every span is reduced as well, to the fit sums of each profile (the probability of the
    recorded next token and its log, Σ q², Σ q³); p_accept is computed on the recorded path (its drafts there
    are the recorded tokens, which is what the penalties of a step count). top_k_ties: the top-k rule
    (sampler_distribution's ties); no_min_p: [R] bool, rows whose p_accept is scored as V1's rejection sampler scores
    a draft position, without min-p (the fit sums, the sampler that emitted the recorded tokens, keep it).
    grammar_masks: (positions [M] ascending, packed allowed sets [M, W] int32) of the tokens --grammar constrains:
    p_accept of a row predicting one is masked (_score_masked); every other output stays unmasked.
    """
    device = lm_head.device  # under a device map, the last device; the hidden rows are moved to it
    R = positions.shape[0]
    V = lm_head.shape[0]
    positions, drafts, actuals = positions.to(device), drafts.to(device), actuals.to(device)
    out_token, out_target, out_actual = (torch.empty(R, dtype=t, device=device) for t in (torch.long, torch.float32,
                                                                                         torch.float32))
    out_p = {p.name: torch.empty(R, dtype=torch.float32, device=device) for p in profiles}
    assert turns is not None or not any(p.penalised for p in profiles), "penalties need the turns (prompt, output so far)"

    # 1. The positions: every row's, and with turns every s-1..e-1 (the fit sums), each with its span.
    fit_positions = span_of = None
    if turns is not None:
        ids = turns.input_ids.to(device)
        starts, ends = turns.starts.to(device), turns.ends.to(device)
        lo, counts, fit_positions = _span_positions(starts, ends, device)
    all_positions = positions if fit_positions is None else torch.cat([positions, fit_positions])
    if all_positions.shape[0] == 0:
        return _empty_reductions(out_token, out_target, out_actual, out_p, profiles, turns, device)
    unique, inverse = torch.unique(all_positions, return_inverse=True)  # unique ascending
    inverse = inverse[:R]
    if turns is not None:
        span_of = torch.searchsorted(lo, unique, right=True) - 1  # [U] the span whose tokens each position predicts
        assert bool((span_of >= 0).all()) and bool((unique < ends[span_of]).all()), "a row position lies outside every span"
        fit = {p.name: [torch.zeros(starts.shape[0], dtype=torch.float64, device=device) for _ in range(5)] for p in profiles}
    order = torch.argsort(inverse, stable=True)
    sorted_inverse = inverse[order]

    # 2. Which profiles share work: equal parameters are computed once; a ranking per set of penalties.
    sharing = _Sharing.of(profiles, V, budget)
    any_penalties, chunk, top_k_all = sharing.any_penalties, sharing.chunk, sharing.top_k_all
    for c0 in range(0, unique.shape[0], chunk):
        c1 = min(unique.shape[0], c0 + chunk)
        lo_r, hi_r = torch.searchsorted(sorted_inverse, torch.tensor([c0, c1], device=device)).tolist()
        sel = order[lo_r:hi_r]  # rows whose position is in this chunk
        local = inverse[sel] - c0
        here = unique[c0:c1]
        logits = F.linear(hidden[here].to(lm_head.device), lm_head).float()  # [c, V]: the only vocabulary-sized tensor
        token = logits.argmax(-1)
        out_token[sel] = token[local]
        state = None
        if turns is not None:
            spans_here = span_of[c0:c1]
            next_token = ids[here + 1]
            if any_penalties:
                state = turn_penalty_state(ids, starts[spans_here], here, sharing.with_prompt)
        every = torch.arange(c1 - c0, device=device)
        raw = logits.topk(min(top_k_all + TIE_SLACK + (PENALTY_SLACK if any_penalties else 0), V), dim=-1) if top_k_all else None
        for penalties, members in sharing.groups.items():  # one ranking of the raw logits for every set of penalties
            with penalised(logits, penalties, state):
                ranked = _ranked(raw, logits, state, penalties, members)
                for p in members:
                    dist = _score(out_p[p.name], sel, local, drafts, logits, token, p, penalties, ranked, top_k_ties,
                                  no_min_p)
                    if turns is not None:
                        _add_fit_sums(fit[p.name], spans_here, dist, every, next_token)
                if grammar_masks is not None:  # replay --grammar: p_accept under the mask
                    _score_masked(out_p, sel, local, drafts, logits, here, grammar_masks, penalties, members, top_k_ties, no_min_p)
        out_target[sel], out_actual[sel] = _log_probs(logits, token, local, drafts[sel], actuals[sel])
        del logits
    _share_results(profiles, sharing.distinct, out_p, fit if turns is not None else None)
    if turns is None:
        return Reductions(out_token, out_target, out_actual, out_p)
    fit_sums = {p.name: FitSums(fit[p.name][0].round().long(), *fit[p.name][1:]) for p in profiles}
    return Reductions(out_token, out_target, out_actual, out_p, fit_tokens=counts.long(), fit=fit_sums)


def _span_positions(starts: Tensor, ends: Tensor, device) -> tuple[Tensor, Tensor, Tensor]:
    """(lo [S] each span's first position s-1, counts [S] its positions s-1..e-1, the positions [sum counts])."""
    lo = (starts - 1).clamp(min=0)
    counts = (ends - lo).clamp(min=0)
    fit_positions = torch.repeat_interleave(lo, counts) + torch.arange(int(counts.sum()), device=device) - \
        torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    return lo, counts, fit_positions


@dataclass(frozen=True)
class _Sharing:
    """Which profiles share work in reduce_logits: equal parameters are computed once; a ranking per set of
    penalties; the chunk of positions whose logits fit the budget."""

    distinct: dict  # {params: the first profile with them}
    groups: dict  # {penalties: [distinct profiles with them]}
    with_prompt: bool  # some profile's penalties read the prompt
    any_penalties: bool
    chunk: int  # positions per chunk
    top_k_all: int  # the largest top-k of a sampled profile (0: none)

    @staticmethod
    def of(profiles: tuple[SamplingProfile, ...], V: int, budget: int) -> "_Sharing":
        distinct: dict[tuple, SamplingProfile] = {}
        for p in profiles:
            distinct.setdefault(p.params(), p)
        groups: dict[tuple, list[SamplingProfile]] = {}
        for p in distinct.values():
            groups.setdefault(p.penalties, []).append(p)
        with_prompt = any(p.penalties[0] != 1.0 for p in distinct.values())
        any_penalties = any(p.penalised for p in distinct.values())
        full_sort = any(not (0 < p.top_k < V) and not p.is_greedy and (p.top_p < 1 or p.min_p > 0)
                        for p in distinct.values())
        chunk = max(1, budget // (V * ((3 if full_sort else 1) + (1 if any_penalties else 0))))
        top_k_all = max((p.top_k for p in distinct.values() if not p.is_greedy and 0 < p.top_k < V), default=0)
        return _Sharing(distinct, groups, with_prompt, any_penalties, chunk, top_k_all)


def _ranked(raw, logits: Tensor, state, penalties: tuple, members: list) -> tuple[Tensor, Tensor] | None:
    """The (penalised) ranking a set of profiles with the same penalties shares: top_k + TIE_SLACK values from the
    raw ranking, for the largest top-k among them (None when none samples with a top-k)."""
    V = logits.shape[-1]
    top_k = max((p.top_k for p in members if not p.is_greedy and 0 < p.top_k < V), default=0)
    return penalised_ranking(raw, logits, state if penalties != NO_PENALTIES else None,
                             min(top_k + TIE_SLACK, V)) if top_k else None


def _score(out: Tensor, sel: Tensor, local: Tensor, drafts: Tensor, logits: Tensor, token: Tensor, p: SamplingProfile,
           penalties: tuple, ranked, top_k_ties: str, no_min_p: Tensor | None) -> Distribution:
    """Profile p's distribution over a chunk's logits; writes p_accept of the chunk's rows `sel` (their drafts at
    `local`) into `out` — without min-p on the rows no_min_p marks. Returns the distribution (for the fit sums)."""
    if p.is_greedy and penalties == NO_PENALTIES:
        dist = Distribution(torch.ones(logits.shape[0], 1, device=logits.device), token[:, None])
    else:
        dist = _distribution(logits, p, ranked, top_k_ties)
    out[sel] = dist.at(local, drafts[sel])
    if no_min_p is not None and p.min_p > 0 and not p.is_greedy:
        plain = no_min_p.to(logits.device)[sel]
        if bool(plain.any()):
            without = _distribution(logits, SamplingProfile(p.name, **{**p.as_dict(), "min_p": 0.0}),
                                    ranked, top_k_ties)
            out[sel] = torch.where(plain, without.at(local, drafts[sel]), out[sel])
    return dist


def allowed_sets(grammar_masks: tuple[Tensor, Tensor], predicted: Tensor, V: int) -> Tensor | None:
    """[c, V] bool: the allowed set for the token at each of `predicted` [c] (True everywhere where no mask applies);
    None when none does. Bit j of word w is token 32 w + j (xgrammar's packed bitmask)."""
    positions, bits = grammar_masks
    positions = positions.to(predicted.device)
    if positions.numel() == 0:
        return None
    at = torch.searchsorted(positions, predicted).clamp(max=positions.numel() - 1)
    has = positions[at] == predicted
    if not bool(has.any()):
        return None
    assert sys.byteorder == "little", "the packed bitmask is read byte by byte, little-endian"
    octets = bits.to(predicted.device)[at].contiguous().view(torch.uint8)  # [c, 4 W]: token 8 b + j is bit j of byte b
    shifts = torch.arange(8, dtype=torch.uint8, device=predicted.device)
    allowed = ((octets[:, :, None] >> shifts) & 1).bool().reshape(octets.shape[0], -1)[:, :V]
    if allowed.shape[1] < V:  # ids past the grammar's vocabulary: never allowed
        allowed = F.pad(allowed, (0, V - allowed.shape[1]), value=False)
    return allowed | ~has[:, None]


def _score_masked(out_p: dict, sel: Tensor, local: Tensor, drafts: Tensor, logits: Tensor, here: Tensor,
                  grammar_masks: tuple[Tensor, Tensor], penalties: tuple, members: list, top_k_ties: str,
                  no_min_p: Tensor | None) -> None:
    """Overwrite p_accept of the chunk's rows that predict a grammar-constrained token with the profile's
    distribution over the (penalised) logits with the disallowed tokens at -inf: the distribution renormalised over
    the allowed set, a forbidden draft 0. vLLM 0.32 does the same: gpu_model_runner.py applies
    `apply_grammar_bitmask` (v1/structured_output/utils.py, xgrammar's apply_token_bitmask_inplace: -inf where the
    bit is 0) to the logits of every draft position before `_sample`, and the rejection sampler
    (v1/sample/rejection_sampler.py forward) takes those logits through its processors, temperature, top-k/top-p.
    The -inf logits stay -inf under every penalty, so the order of mask and penalties does not matter."""
    allowed = allowed_sets(grammar_masks, here + 1, logits.shape[-1])
    if allowed is None:
        return
    rows = allowed[local].logical_not().any(-1)  # the rows whose position has a mask that refuses some token
    if not bool(rows.any()):
        return
    masked = logits.masked_fill(~allowed, float("-inf"))  # already penalised: rank it as plain logits
    token = masked.argmax(-1)
    for p in members:
        scratch = torch.empty(sel.shape[0], dtype=torch.float32, device=logits.device)
        at = torch.arange(sel.shape[0], device=logits.device)
        _score(scratch, at, local, drafts[sel], masked, token, p, NO_PENALTIES if p.is_greedy else penalties, None,
               top_k_ties, no_min_p[sel.to(no_min_p.device)] if no_min_p is not None else None)
        out_p[p.name][sel[rows]] = scratch[rows]


def _log_probs(logits: Tensor, token: Tensor, local: Tensor, drafts: Tensor, actuals: Tensor) -> tuple[Tensor, Tensor]:
    """(log-prob of each row's draft, of its recorded token) from a chunk's logits [c, V] (overwritten: the row's
    argmax `token` is its maximum) at the rows' positions `local`."""
    rowmax = logits.gather(1, token[:, None]).squeeze(1)
    draft_logit, actual_logit = logits[local, drafts] - rowmax[local], logits[local, actuals] - rowmax[local]
    # log Σ exp(logit - max), in place: logsumexp without another pass for the maxima or another [c, V] buffer
    lse = logits.sub_(rowmax[:, None]).exp_().sum(-1).log_()
    return draft_logit - lse[local], actual_logit - lse[local]


def _add_fit_sums(sums: list[Tensor], spans_here: Tensor, dist: Distribution, every: Tensor, next_token: Tensor) -> None:
    """Add a chunk's positions to their spans' fit sums: support, Σ q, Σ q², Σ (q³ - (q²)²), Σ log q."""
    q_next = dist.at(every, next_token).double()
    q2, q3 = dist.power_sum(2).double(), dist.power_sum(3).double()
    sums[0].index_add_(0, spans_here, (q_next > 0).double())
    sums[1].index_add_(0, spans_here, q_next)
    sums[2].index_add_(0, spans_here, q2)
    sums[3].index_add_(0, spans_here, q3 - q2 * q2)
    sums[4].index_add_(0, spans_here, torch.where(q_next > 0, q_next, 1.0).log())


def _share_results(profiles, distinct: dict, out_p: dict, fit: dict | None) -> None:
    """Profiles equal to an earlier one share its results (p_accept, and the fit sums when there are)."""
    for p in profiles:
        first = distinct[p.params()]
        if first.name != p.name:
            out_p[p.name] = out_p[first.name]
            if fit is not None:
                fit[p.name] = fit[first.name]


def _empty_reductions(out_token, out_target, out_actual, out_p, profiles, turns, device) -> Reductions:
    if turns is None:
        return Reductions(out_token, out_target, out_actual, out_p)
    N = turns.starts.shape[0]
    zero = torch.zeros(N, dtype=torch.float64, device=device)
    fit = {p.name: FitSums(torch.zeros(N, dtype=torch.long, device=device), zero, zero, zero, zero) for p in profiles}
    return Reductions(out_token, out_target, out_actual, out_p, fit_tokens=torch.zeros(N, dtype=torch.long, device=device),
                      fit=fit)
