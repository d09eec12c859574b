"""The metrics: acceptance counts, and every rate derived from them, in one place.

Contract: `Counts` holds raw counts only (vLLM `spec_decode/metrics.py` style); `rates` turns
counts into every number the report shows; `simulate_decode` counts the steps of the speculative
decode walk on the recorded trajectory; `expected_decode_steps` walks it in expectation under
another sampler's acceptance probabilities (the what-if); `fits` is the rule that says whether
traffic fits a sampler; `bootstrap_weights` / `stratified_weights` draw the resamples. Pure numpy —
no pandas, no torch.

Conventions (ACCEPTANCE.md), written down once. Depth k = 1..K sits at index k-1 of every
`[..., K]` array.

    α_k       = accepted(k) / on_path(k)        on_path(k): rows at depth k accepted at k-1
                                                (every row at k = 1, so α_1 = #match(1) / #anchors)
    A_k       = accepted(k) / evaluable(k)      vLLM's per_pos / num_drafts
    τ(K)      = 1 + Σ_{k<=K} A_k                all-anchor mean acceptance length (vLLM's per-position
                                                formula over every anchor), INCLUDES the bonus token; shown, never judged
    τ_sim(K)  = span_tokens / steps(K)          the simulated decode (see simulate_decode): the verdict's τ

Engine-counted, as vLLM's counters will count them (vllm/v1/spec_decode/metrics.py: num_drafts,
num_draft_tokens, num_accepted_tokens, num_accepted_tokens_per_pos), over the steps the simulated decode
makes at draft length K — the anchors a decoder visits, not every anchor — that proposed a draft:

    num_drafts(K)                = step_drafted(K, 1)   steps whose draft holds at least one token
    num_draft_tokens(K)          = Σ_k step_drafted(K, k)
    per_pos(K, k)                = step_accepted(K, k) / num_drafts(K)   "per-position acceptance rate"
    mean_acceptance_length(K)    = 1 + Σ_k step_accepted(K, k) / num_drafts(K)   (bonus token included)
    draft_acceptance_rate(K)     = Σ_k step_accepted(K, k) / num_draft_tokens(K)

vLLM counts a step only when drafts were scheduled for it (vllm/v1/core/sched/scheduler.py:2346-2352
`if scheduled_spec_token_ids and ...: num_draft_tokens = len(scheduled_spec_token_ids)`; make_spec_decoding_stats
:3313 returns nothing for 0 drafts), so a step where a model-free drafter proposed nothing (V1's n-gram without a
match, suffix decoding) is no draft, and a short proposal is that many draft tokens. The MTP head and V2's n-gram
always draft K (step_drafted(K, k) = steps(K) for k <= K), the last step of a turn too (vLLM counts drafts before
its stop check); a drafted position past the end-of-turn token counts as drafted and rejected (the run has no row
there, so this is a lower bound on what the engine counts there). So mean_acceptance_length(K) >= τ_sim(K): at a
last step whose drafts reach the end-of-turn token, the engine counts a + 1 where the decode emits a.
    τ_S(K)    = span_tokens / E_S[steps(K)]     what-if estimate under sampler S (expected_decode_steps)
    speedup(K)= τ_sim(K) / (1 + K·c + v(K))     c: draft step / target decode step; v: extra verify cost
    on-policy = on_policy / evaluable(1)        depth-1 rows whose recorded token is the target's argmax
    support_S = fit_support / fit_tokens        scored tokens x_t with q_t(x_t) > 0 under S
    calibration_S = fit_q / fit_q2              Σ q_t(x_t) / Σ_t Σ_v q_t(v)²: ≈ 1 on S's own samples
    z_S       = (fit_q - fit_q2) / √fit_var     mean 0, variance 1 on S's own samples (below)
    ll_S      = (fit_ll + (fit_tokens - fit_support) log LL_FLOOR) / fit_tokens   per-token log-likelihood

Every field of `Counts` may carry leading axes ([sessions], [replicates], [groups]) and every
rate broadcasts over them, so the point estimate, the per-session values and the bootstrap
replicates are computed by the same lines. A rate whose denominator is 0 is NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cost.speedup import best_k, speedup  # noqa: F401  (re-exported: the report's names for them)


@dataclass(frozen=True)
class Counts:
    """Raw counts over a set of rows and spans. Leading axes `...` are free (sessions, replicates, groups)."""

    evaluable: np.ndarray  # [..., K]  rows at depth k (anchors p with p + k <= e)
    on_path: np.ndarray  # [..., K]  rows at depth k whose chain was accepted up to k-1 (= evaluable at k = 1)
    accepted: np.ndarray  # [..., K]  rows at depth k accepted (match at every depth 1..k)
    p_accept: np.ndarray  # [..., P, K]  Σ p_accept_S over on-path rows at depth k, one row per profile S
    on_policy: np.ndarray  # [...]  depth-1 rows with actual_token == target_token
    span_tokens: np.ndarray  # [...]  Σ (e - s) over scored spans: the tokens the simulated decode emits
    steps: np.ndarray  # [..., K]  simulated decode steps with draft length K = 1..Kmax (index K-1)
    expected_steps: np.ndarray  # [..., P, K]  Σ over spans of the expected decode steps under profile S (what-if)
    fit_tokens: np.ndarray  # [...]  scored tokens the recording-sampler sums cover
    fit_support: np.ndarray  # [..., P]  of those, tokens with q_t(x_t) > 0 under S
    fit_q: np.ndarray  # [..., P]  Σ q_t(x_t)
    fit_q2: np.ndarray  # [..., P]  Σ_t Σ_v q_t(v)²
    fit_var: np.ndarray  # [..., P]  Σ_t (Σ_v q_t(v)³ - (Σ_v q_t(v)²)²)
    fit_ll: np.ndarray  # [..., P]  Σ log q_t(x_t) over the tokens in the support
    step_accepted: np.ndarray  # [..., K, K]  simulated decode steps at draft length K (index K-1) whose accepted
    #                            length reaches depth k (index k-1): vLLM's num_accepted_tokens_per_pos; 0 for k > K
    step_drafted: np.ndarray | None = None  # [..., K, K]  of those steps, the ones whose draft holds at least k
    #                            tokens (index k-1; 0 for k > K); None: every step drafts K (the MTP head's)

    def _fields(self):
        return _FIELDS if self.step_drafted is not None else _FIELDS[:-1]

    def total(self, axis: int = 0) -> "Counts":
        """Pool the counts along a leading axis (token-weighted aggregation)."""
        return Counts(**{f: getattr(self, f).sum(axis=axis) for f in self._fields()})

    def resample(self, weights: np.ndarray) -> "Counts":
        """weights: [B, S] (how often each of S sessions is drawn) and counts [S, ...] -> counts [B, ...]."""
        w = weights.astype(np.float64)
        return Counts(**{f: np.tensordot(w, getattr(self, f).astype(np.float64), axes=(1, 0)) for f in self._fields()})

    def take(self, index) -> "Counts":
        """Index the leading axis: counts [S, ...] -> counts [len(index), ...] (or [...] for an int)."""
        return Counts(**{f: getattr(self, f)[index] for f in self._fields()})


_FIELDS = ("evaluable", "on_path", "accepted", "p_accept", "on_policy", "span_tokens", "steps", "expected_steps",
           "fit_tokens", "fit_support", "fit_q", "fit_q2", "fit_var", "fit_ll", "step_accepted", "step_drafted")


@dataclass(frozen=True)
class Rates:
    """Everything derived from `Counts` (same leading axes)."""

    alpha: np.ndarray  # [..., K]  α_k, conditional per-depth acceptance
    accept_rate: np.ndarray  # [..., K]  A_k, unconditional per-position acceptance
    tau: np.ndarray  # [..., K]  τ(K), vLLM's mean acceptance length (per-position formula, bonus token included)
    tau_sim: np.ndarray  # [..., K]  simulated τ_sim(K), the verdict's τ; NaN where no spans were counted (segments)
    tau_profile: np.ndarray  # [..., P, K]  what-if estimate of τ_sim under each sampling profile
    speedup: np.ndarray  # [..., K]  τ_sim(K) / (1 + K c + v(K))
    speedup_profile: np.ndarray  # [..., P, K]  τ_profile / (1 + K c + v(K)), what-if estimate
    on_policy: np.ndarray  # [...]  on-policy rate (greedy support on depth-1 rows)
    support: np.ndarray  # [..., P]  support rate of the recorded tokens under each profile
    calibration: np.ndarray  # [..., P]  Σ q(x) / Σ Σ q²
    fit_z: np.ndarray  # [..., P]  z-score of Σ q(x) - Σ Σ q² (NaN where the variance is 0: greedy)
    log_likelihood: np.ndarray  # [..., P]  per scored token, log q(x), a token outside the support counting log LL_FLOOR
    per_position_acceptance: np.ndarray  # [..., K, K]  engine-counted per_pos(K, k) (NaN for k > K)
    mean_acceptance_length: np.ndarray  # [..., K]  engine-counted 1 + accepted / num_drafts at draft length K
    draft_acceptance_rate: np.ndarray  # [..., K]  engine-counted accepted / num_draft_tokens at draft length K

    def map(self, fn) -> "Rates":
        return Rates(**{f: fn(getattr(self, f)) for f in RATE_FIELDS})


RATE_FIELDS = ("alpha", "accept_rate", "tau", "tau_sim", "tau_profile", "speedup", "speedup_profile", "on_policy",
               "support", "calibration", "fit_z", "log_likelihood", "per_position_acceptance", "mean_acceptance_length",
               "draft_acceptance_rate")


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den as float64, NaN where den == 0."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


# speedup(K) = τ(K) / (1 + K c + v(K)): the formula lives in cost.py (the one place it is computed, at any batch size).


def rates(counts: Counts, c: float, verify_extra: np.ndarray) -> Rates:
    """Every rate of the module docstring, broadcast over the leading axes of `counts`."""
    alpha = ratio(counts.accepted, counts.on_path)
    accept_rate = ratio(counts.accepted, counts.evaluable)
    tau = 1.0 + np.cumsum(accept_rate, axis=-1)
    tau_sim = ratio(counts.span_tokens[..., None], counts.steps)
    tau_profile = ratio(counts.span_tokens[..., None, None], counts.expected_steps)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = ratio(counts.fit_q - counts.fit_q2, np.sqrt(np.maximum(counts.fit_var, 0.0)))
    engine = engine_counted(counts.step_accepted, counts.steps, counts.step_drafted)
    return Rates(
        alpha=alpha, accept_rate=accept_rate, tau=tau, tau_sim=tau_sim, tau_profile=tau_profile,
        speedup=speedup(tau_sim, c, verify_extra), speedup_profile=speedup(tau_profile, c, verify_extra),
        on_policy=ratio(counts.on_policy, counts.evaluable[..., 0]),
        support=ratio(counts.fit_support, counts.fit_tokens[..., None]), calibration=ratio(counts.fit_q, counts.fit_q2),
        fit_z=z,
        log_likelihood=ratio(counts.fit_ll + (counts.fit_tokens[..., None] - counts.fit_support) * np.log(LL_FLOOR),
                             counts.fit_tokens[..., None]),
        per_position_acceptance=engine[0], mean_acceptance_length=engine[1], draft_acceptance_rate=engine[2],
    )


def full_drafts(steps: np.ndarray) -> np.ndarray:
    """[..., K] steps -> [..., K, K] step_drafted when every step drafts K tokens: steps(K) for k <= K, else 0."""
    steps = np.asarray(steps)
    K = steps.shape[-1]
    within = np.arange(1, K + 1)[None, :] <= np.arange(1, K + 1)[:, None]  # [K, K] position k within draft length K
    return np.where(within, steps[..., :, None], 0)


def engine_counted(step_accepted: np.ndarray, steps: np.ndarray,
                   step_drafted: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """vLLM's three derived numbers from the simulated decode's counts (module docstring): step_accepted
    [..., K, K], steps [..., K] and step_drafted [..., K, K] (None: every step drafts K) -> (per-position rate
    [..., K, K] with NaN for k > K, mean acceptance length [..., K], draft acceptance rate [..., K]).

    Worked example: at K = 2, 4 steps of which 3 accepted depth 1 and 1 depth 2: per-position [0.75, 0.25],
    mean acceptance length 1 + 4/4 = 2.0, draft acceptance rate 4 / (2·4) = 0.5. The same steps where one
    drafted nothing and one only a token (step_drafted [3, 2]): per-position [1.0, 0.33], mean acceptance length
    1 + 4/3, draft acceptance rate 4 / 5.
    """
    K = steps.shape[-1]
    drafted = full_drafts(steps) if step_drafted is None else np.asarray(step_drafted)
    draft_length = np.arange(1, K + 1)
    beyond = np.arange(1, K + 1)[None, :] > draft_length[:, None]  # [K, K] position k past draft length K
    num_drafts = drafted[..., 0]  # [..., K] steps with a draft
    num_draft_tokens = np.asarray(drafted, dtype=np.float64).sum(axis=-1)  # [..., K]
    per_pos = ratio(step_accepted, np.asarray(num_drafts)[..., None])
    per_pos = np.where(beyond, np.nan, per_pos)
    accepted = np.asarray(step_accepted, dtype=np.float64).sum(axis=-1)  # [..., K]
    return per_pos, 1.0 + ratio(accepted, num_drafts), ratio(accepted, num_draft_tokens)


# ---------------------------------------------------------------------------------------------
# The recording sampler: does the traffic fit a sampler?
#
# For own samples of S (x_t ~ q_t given the prefix), E[q_t(x_t)] = Σ_v q_t(v)² and
# Var[q_t(x_t)] = Σ_v q_t(v)³ - (Σ_v q_t(v)²)², so Σ_t (q_t(x_t) - Σ_v q_t(v)²) is a martingale with
# mean 0 and variance Σ_t Var_t: z is a standard score whatever the positions' dependence. Greedy
# traffic read under a sampler has calibration > 1 (it always took the likeliest token); foreign
# text < 1. The rule has to survive numerics as well as sampling noise: a bf16 replay of fp32 text
# flips near-ties of the argmax and moves the top-k / top-p boundary past a sampled token now and
# then (support a little under 1), and perturbs every q_t a little, which biases calibration by
# about the squared relative error (~0.1%) — tiny, but over a million tokens it is many standard
# errors. Hence: the support must be at least MIN_SUPPORT, and the calibration must be either
# statistically indistinguishable from 1 (|z| <= Z_MAX) or practically 1 (within CALIBRATION_TOLERANCE).
# Among the candidates that fit, the best is the likeliest (best_fit). Measured on the bundled model
# (tests/test_verdict.py): its own greedy text under greedy support 1.0; its own instruct_general text
# (T 0.7) under instruct_general support 1.0, calibration 0.998, under greedy support 0.93; the demo
# sessions (foreign, written by a script) support 0.75-0.89 under every profile.

MIN_SUPPORT = 0.95  # own traffic misses support only through numerics (near-ties, boundaries): 1-2% at most
LL_FLOOR = 1e-3  # the probability a token outside a candidate's support counts in its log-likelihood
Z_MAX = 4.0  # |z| above this is not sampling noise (p < 1e-4)
CALIBRATION_TOLERANCE = 0.01  # ten times the numerics bias of a bf16 replay


def fits(support: float, calibration: float, z: float, greedy: bool, min_support: float = MIN_SUPPORT) -> bool:
    """Whether traffic fits a sampler (greedy: the support alone; its calibration is the support)."""
    if not support >= min_support:
        return False
    if greedy:
        return True
    return bool(abs(z) <= Z_MAX or abs(calibration - 1.0) <= CALIBRATION_TOLERANCE)


def best_fit(names, log_likelihood, fitting) -> str | None:
    """The fitting candidate under which the recorded tokens are likeliest (the first on ties), or None.

    Maximum likelihood picks the true sampler in expectation (the expected log-likelihood of a sample of p
    under q is largest at q = p), and it tells close samplers apart where the calibration cannot: on the
    bundled model's own instruct_general text (T 0.7, top-p 0.8, presence 1.5), thinking_coding (T 0.6)
    has a calibration as close to 1 and a log-likelihood 0.02 nats/token lower. A token outside a
    candidate's support counts log LL_FLOOR, so greedy (log 1 = 0 on its support) does not win sampled
    text that misses its argmax 6% of the time (-0.41/token) and does win greedy text (0 against log q(argmax)).
    """
    best = None
    for name, ll, ok in zip(names, log_likelihood, fitting):
        if ok and np.isfinite(ll) and (best is None or ll > best[1]):
            best = (name, ll)
    return best[0] if best else None


def top_k(speedups: np.ndarray) -> int:
    """The K (1-based) with the largest speedup, the smallest such K on ties (1 when all are NaN): where the
    report reads its slices. best_k (cost.py) is the same K, or 0 when it does not beat 1. speedups: [K]."""
    if np.all(np.isnan(speedups)):
        return 1
    return int(np.nanargmax(speedups)) + 1


# ---------------------------------------------------------------------------------------------
# The simulated decode


def simulate_decode(accepted_len: np.ndarray, span_len: np.ndarray, k: int) -> np.ndarray:
    """Steps of greedy chain speculation with draft length k, walked over each scored span.

    accepted_len: [Σ span_len] int — the accepted length at every anchor p = s..e-1 of every
    span, spans concatenated in order (the largest depth accepted, 0 when d_1 missed);
    span_len: [spans] int — e - s, the anchors of each span -> steps: [spans] int64.

    The walk (ACCEPTANCE.md): start at anchor s; at anchor p with accepted length a (capped
    by k) one target step emits min(a + 1, e - p) tokens — the accepted drafts and the
    target's bonus token, none past the end of the turn — and the next anchor is p plus that.
    The walk ends at p = e (the end-of-turn token has been emitted; it has no anchor row).

    Worked example: one span s = 0, e = 5, accepted lengths at anchors 0..4 = [2, 0, 0, 1, 1], k = 2:
        p=0: a=2, emit min(3, 5) = 3 -> p=3;  p=3: a=1, emit min(2, 2) = 2 -> p=5 = e.
        2 steps for 5 tokens: τ_sim = 2.5. With k = 1: p=0: a=1 emit 2 -> 2; p=2: a=0 emit 1 -> 3;
        p=3: emit 2 -> 5: 3 steps. At the end of a turn: accepted length [1] with e - s = 1 emits
        min(2, 1) = 1 token in one step — no bonus token past the end-of-turn token.

    The walk itself is `decode_walk`, which also says which anchors it visits.
    """
    return decode_walk(accepted_len, span_len, k).steps


@dataclass(frozen=True)
class DecodeWalk:
    """The simulated decode at one draft length K over N spans (A = Σ span_len anchors)."""

    steps: np.ndarray  # [N] int64  target steps of each span's walk
    visited: np.ndarray  # [A] bool  the anchors the walk steps on (anchor s of every span among them)
    step_accepted: np.ndarray  # [N, K] int64  visited anchors whose accepted length (capped at K) reaches depth k
    step_drafted: np.ndarray | None = None  # [N, K] int64  visited anchors whose draft (capped at K) holds >= k
    #                                         tokens (None: no draft lengths given)


def decode_walk(accepted_len: np.ndarray, span_len: np.ndarray, k: int, draft_len: np.ndarray | None = None,
                past_end: np.ndarray | None = None) -> DecodeWalk:
    """The walk of `simulate_decode`, with the anchors it visits and vLLM's per-position counts over them.

    Worked example (simulate_decode's): accepted lengths [2, 0, 0, 1, 1], e - s = 5, k = 2: the walk visits
    anchors 0 and 3 -> steps 2, visited [T, F, F, T, F], step_accepted [[2, 1]] (both visited steps accept
    depth 1, the first also depth 2): per-position rates 1.0 and 0.5 over the two steps, where the all-anchor
    rates are A_1 = 3/5 and A_2 = 1/4 (p=0 only, of the 4 anchors with p + 2 <= e). With draft_len [A] (the tokens
    each anchor's draft holds, past the end of the turn too) [2, 2, 2, 1, 0]: step_drafted [[2, 1]] (anchor 3
    drafted one token).

    past_end [A] (accepted_past_end: the draft's first token past the end of the turn is the target's argmax after
    it): a visited step whose chain accepts through the end-of-turn token (a = e - p < k) counts one more accepted
    draft, as vLLM counts before it trims past the stop token (scheduler.py:2116-2135, :2166); the tokens emitted,
    and so the steps, are unchanged. Example: one span, e - s = 2, accepted lengths [2, 1], past_end [1, 0], k = 3:
    the walk visits anchor 0 only, which accepts both remaining tokens (the end-of-turn one last) and its third
    draft past it: step_accepted [[1, 1, 1]], where it is [[1, 1, 0]] without past_end.

    Computed without a Python loop over positions: each span is laid out as e - s anchor slots plus one
    terminal slot; next[i] = i + emitted; the step count from the span's first slot to its terminal slot is
    found by pointer doubling (log2 of the longest span rounds), keeping each round's 2^j-step jumps; the
    visited slots are then every next^t(first), t >= 0, marked by applying the jumps of every round in turn
    to the set marked so far (after round j it holds t < 2^(j+1)).
    """
    accepted_len = np.asarray(accepted_len, dtype=np.int64)
    span_len = np.asarray(span_len, dtype=np.int64)
    assert accepted_len.shape == (int(span_len.sum()),), (accepted_len.shape, int(span_len.sum()))
    assert k >= 1, k
    n_spans = span_len.shape[0]
    if n_spans == 0:
        return DecodeWalk(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool), np.zeros((0, k), dtype=np.int64))
    slots = span_len + 1  # anchors, then the terminal slot (p = e)
    first = np.concatenate([[0], np.cumsum(slots)[:-1]]).astype(np.int64)  # [spans] slot of anchor s
    terminal = first + span_len  # [spans]
    n = int(slots.sum())
    span_of_slot = np.repeat(np.arange(n_spans), slots)  # [n]
    offset = np.arange(n, dtype=np.int64) - first[span_of_slot]  # p - s
    is_terminal = offset == span_len[span_of_slot]
    remaining = span_len[span_of_slot] - offset  # e - p
    a = np.zeros(n, dtype=np.int64)
    a[~is_terminal] = np.minimum(accepted_len, k)
    emitted = np.where(is_terminal, 0, np.minimum(a + 1, remaining))
    assert np.all(a <= remaining), "an accepted length runs past the end of its turn"
    jump = np.arange(n, dtype=np.int64) + emitted  # [n] next slot (terminal slots point at themselves)
    count = (~is_terminal).astype(np.int64)  # steps covered by following `jump` once
    goal = terminal[span_of_slot]
    jumps = [jump]
    while np.any(jump != goal):
        count = count + count[jump]
        jump = jump[jump]
        jumps.append(jump)
    marked = np.zeros(n, dtype=bool)
    marked[first] = True
    for j in jumps:
        marked[j[marked]] = True
    visited = marked[~is_terminal]
    anchor_span = span_of_slot[~is_terminal]
    capped = a[~is_terminal]
    if past_end is not None:  # drafts accepted past the end-of-turn token, counted before the trim
        left = remaining[~is_terminal]
        capped = np.where((capped == left) & (left < k), np.minimum(capped + np.asarray(past_end, dtype=np.int64), k),
                          capped)
    histogram = np.bincount(anchor_span[visited] * (k + 1) + capped[visited], minlength=n_spans * (k + 1))
    histogram = histogram.reshape(n_spans, k + 1)  # [N, k+1] visited steps by accepted length 0..k
    reaching = np.cumsum(histogram[:, ::-1], axis=1)[:, ::-1]  # [N, k+1] steps accepting at least that length
    steps = count[first]
    assert np.array_equal(steps, reaching[:, 0]), "a walk's steps are its visited anchors"
    step_drafted = None
    if draft_len is not None:
        draft_len = np.minimum(np.asarray(draft_len, dtype=np.int64), k)
        assert draft_len.shape == accepted_len.shape and np.all(draft_len >= np.minimum(accepted_len, k)), \
            "a draft holds at least the tokens accepted from it"
        drafted = np.bincount(anchor_span[visited] * (k + 1) + draft_len[visited], minlength=n_spans * (k + 1))
        step_drafted = np.cumsum(drafted.reshape(n_spans, k + 1)[:, ::-1], axis=1)[:, ::-1][:, 1:].astype(np.int64)
    return DecodeWalk(steps=steps, visited=visited, step_accepted=reaching[:, 1:].astype(np.int64),
                      step_drafted=step_drafted)


def expected_decode_steps(accept: np.ndarray, span_len: np.ndarray, k_max: int) -> np.ndarray:
    """Expected steps of chain speculation walked over each span when depth j is accepted with probability
    accept[·, j-1] given depths 1..j-1 were (the what-if under another sampler than the recording one).

    accept: [Σ span_len, Kmax, B] conditional acceptance probabilities at every anchor p = s..e-1 of every
    span (spans concatenated in order, as simulate_decode), for B samplers; span_len: [N] -> [N, B, Kmax]
    expected steps with draft length K = 1..Kmax (index K-1).

    With c_j = Π_{i<=j} accept_i (c_0 = 1) the probability of accepting at least j drafts, m = min(K, e-p):
        E[p] = 1 + Σ_{a<m} (c_a - c_{a+1}) E[p + a + 1] + c_m E[p + min(m + 1, e - p)],   E[e] = 0
    (rejected at depth a+1: the a accepted drafts and the target's token; all m accepted: the bonus token
    too unless the turn ends). With 0/1 probabilities (the recorded matches) this is simulate_decode's walk.
    Worked example: one anchor (e - s = 1), accept 0.5: E = 1 (one step emits the end token either way).
    Two anchors, accept 0.5 at both, K = 1: E[s] = 1 + 0.5 E[s+1] + 0.5 E[e] = 1.5.

    Computed backwards from the ends of turns, all spans at once: iteration o visits the anchor o tokens
    before each span's end (spans sorted by length, the active ones a prefix), so the Python loop runs
    over the longest span's length, not over positions; each iteration is a few array operations.
    """
    accept = np.asarray(accept, dtype=np.float64)
    span_len = np.asarray(span_len, dtype=np.int64)
    n_spans = span_len.shape[0]
    B = accept.shape[2] if accept.ndim == 3 else 0
    assert accept.shape[:2] == (int(span_len.sum()), k_max), (accept.shape, int(span_len.sum()), k_max)
    if n_spans == 0 or B == 0:
        return np.zeros((n_spans, B, k_max))
    cum = np.concatenate([np.ones((accept.shape[0], 1, B)), np.cumprod(accept, axis=1)], axis=1)  # [A, Kmax+1, B] c_j
    slots = span_len + 1
    first_slot = np.concatenate([[0], np.cumsum(slots)[:-1]])
    first_anchor = np.concatenate([[0], np.cumsum(span_len)[:-1]])
    E = np.zeros((int(slots.sum()), B, k_max))  # terminal slots stay 0
    by_length = np.argsort(-span_len, kind="stable")
    sorted_len = span_len[by_length]
    K = np.arange(1, k_max + 1)
    for o in range(1, int(span_len.max()) + 1):
        active = by_length[: int(np.searchsorted(-sorted_len, -o, side="right"))]  # spans with e - s >= o
        slot = first_slot[active] + span_len[active] - o  # the anchor p = e - o
        c = cum[first_anchor[active] + span_len[active] - o]  # [n, Kmax+1, B]
        m = np.minimum(K, o)  # [Kmax] evaluable depths at this anchor for each K
        value = np.ones((active.shape[0], B, k_max))
        for a in range(min(k_max, o)):  # rejected at depth a + 1 (only where a < m, i.e. a < K)
            weight = (c[:, a] - c[:, a + 1])[:, :, None] * (a < m)[None, None, :]
            value += weight * E[slot + a + 1]
        final = E[slot[:, None] + np.minimum(m + 1, o)[None, :], :, K - 1]  # [n, Kmax, B]: E at the jump, per K
        value += c[:, m, :].transpose(0, 2, 1) * final.transpose(0, 2, 1)  # c_m (all accepted) for each K
        E[slot] = value
    return E[first_slot]


def expected_decode_steps_reference(accept: list[list[float]], k: int) -> float:
    """The recursion of `expected_decode_steps` for one span and one K, as a plain loop (for tests and reading)."""
    e = len(accept)
    E = [0.0] * (e + 1)
    for p in range(e - 1, -1, -1):
        m = min(k, e - p)
        c = [1.0]
        for j in range(m):
            c.append(c[-1] * accept[p][j])
        E[p] = 1.0 + sum((c[a] - c[a + 1]) * E[p + a + 1] for a in range(m)) + c[m] * E[p + min(m + 1, e - p)]
    return E[0]


def simulate_decode_reference(accepted_len: list[int], k: int) -> int:
    """The walk of `simulate_decode` for one span, as a plain loop (the definition, for tests and reading)."""
    return len(visited_anchors_reference(accepted_len, k))


def visited_anchors_reference(accepted_len: list[int], k: int) -> list[int]:
    """The anchors the walk of one span steps on, as a plain loop (for tests and reading)."""
    e = len(accepted_len)  # anchors s..e-1 relative to s = 0
    p, visited = 0, []
    while p < e:
        visited.append(p)
        p += min(min(accepted_len[p], k) + 1, e - p)
    return visited


# ---------------------------------------------------------------------------------------------
# The bootstrap


MIN_SESSIONS_FOR_BOOTSTRAP = 10
# Below 10 sessions a bootstrap over sessions cannot be trusted: the percentile interval of a mean of n
# resampled units is about x̄ ± 1.96·s·√((n-1)/n)/√n where Student's t says x̄ ± t_{n-1}·s/√n, so its real
# coverage of a nominal 95% is P(|T_{n-1}| < 1.96·√((n-1)/n)): 85% at n = 5, 90% at n = 10, 93% at n = 20
# (and at n = 2 there are only 3 distinct resamples). With fewer sessions the report resamples turns
# within sessions (stratified_weights) and says so; a single session never makes a verdict.
MIN_SESSIONS_FOR_VERDICT = 2
MIN_TURNS_FOR_BOOTSTRAP = 10  # the same coverage argument, for turns


def stratified_weights(strata: np.ndarray, replicates: int, seed: int) -> np.ndarray:
    """[replicates, N] int64: units (turns) resampled with replacement within their stratum (session):
    each stratum keeps its own number of units. strata: [N] stratum of each unit."""
    rng = np.random.default_rng(seed)
    strata = np.asarray(strata, dtype=np.int64)
    out = np.zeros((replicates, strata.shape[0]), dtype=np.int64)
    for s in np.unique(strata):
        members = np.flatnonzero(strata == s)
        out[:, members] = rng.multinomial(members.shape[0], np.full(members.shape[0], 1.0 / members.shape[0]), size=replicates)
    return out


def bootstrap_weights(n_sessions: int, replicates: int, seed: int) -> np.ndarray:
    """[replicates, n_sessions] int64: how often each session is drawn when sessions are resampled
    with replacement. Deterministic for a seed; two runs with the same session count get the same
    draws, so runs over the same sessions are compared pairwise."""
    rng = np.random.default_rng(seed)
    if n_sessions == 0:
        return np.zeros((replicates, 0), dtype=np.int64)
    return rng.multinomial(n_sessions, np.full(n_sessions, 1.0 / n_sessions), size=replicates).astype(np.int64)


def percentile_interval(replicates: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """[B, ...] -> (lo [...], hi [...]) percentile interval, ignoring NaN replicates (all NaN -> NaN)."""
    tail = (1.0 - level) / 2.0 * 100.0
    with np.errstate(invalid="ignore"), _quiet_all_nan():
        lo = np.nanpercentile(replicates, tail, axis=0)
        hi = np.nanpercentile(replicates, 100.0 - tail, axis=0)
    return lo, hi


def nanmean(values: np.ndarray, axis: int = 0) -> np.ndarray:
    """Mean ignoring NaN (a session without rows at a depth does not count there); all NaN -> NaN."""
    with _quiet_all_nan():
        return np.nanmean(values, axis=axis)


class _quiet_all_nan:
    """Silence numpy's 'All-NaN slice' / 'Mean of empty slice' warnings: NaN is the answer there."""

    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)
