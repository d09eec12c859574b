"""The metrics: acceptance counts, and every rate derived from them, in one place.

Contract: `Counts` holds raw counts only (vLLM `spec_decode/metrics.py` style); `rates` turns
counts into every number the report shows; `simulate_decode` counts the steps of the greedy
speculative decode walk; `bootstrap_weights` draws the session resamples. Pure numpy — no
pandas, no torch.

Conventions (ACCEPTANCE.md), written down once. Depth k = 1..K sits at index k-1 of every
`[..., K]` array.

    α_k       = accepted(k) / on_path(k)        on_path(k): rows at depth k accepted at k-1
                                                (every row at k = 1, so α_1 = #match(1) / #anchors)
    A_k       = accepted(k) / evaluable(k)      vLLM's per_pos / num_drafts
    τ(K)      = 1 + Σ_{k<=K} A_k                mean acceptance length INCLUDES the bonus token
    τ_sim(K)  = span_tokens / steps(K)          the simulated greedy decode (see simulate_decode)
    τ_S(K)    = 1 + Σ_{k<=K} Π_{j<=k} ᾱ_j(S),   ᾱ_j(S) = p_accept_sum_S(j) / on_path(j)
    on-policy = on_policy / evaluable(1)        depth-1 rows whose recorded token is the target's argmax
    speedup(K)= τ(K) / (1 + K·c + v(K))         c: draft step / target decode step; v: extra verify cost

Every field of `Counts` may carry leading axes ([sessions], [replicates], [groups]) and every
rate broadcasts over them, so the point estimate, the per-session values and the bootstrap
replicates are computed by the same lines. A rate whose denominator is 0 is NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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

    def total(self, axis: int = 0) -> "Counts":
        """Pool the counts along a leading axis (token-weighted aggregation)."""
        return Counts(**{f: getattr(self, f).sum(axis=axis) for f in _FIELDS})

    def resample(self, weights: np.ndarray) -> "Counts":
        """weights: [B, S] (how often each of S sessions is drawn) and counts [S, ...] -> counts [B, ...]."""
        w = weights.astype(np.float64)
        return Counts(**{f: np.tensordot(w, getattr(self, f).astype(np.float64), axes=(1, 0)) for f in _FIELDS})

    def take(self, index) -> "Counts":
        """Index the leading axis: counts [S, ...] -> counts [len(index), ...] (or [...] for an int)."""
        return Counts(**{f: getattr(self, f)[index] for f in _FIELDS})


_FIELDS = ("evaluable", "on_path", "accepted", "p_accept", "on_policy", "span_tokens", "steps")


@dataclass(frozen=True)
class Rates:
    """Everything derived from `Counts` (same leading axes)."""

    alpha: np.ndarray  # [..., K]  α_k, conditional per-depth acceptance
    accept_rate: np.ndarray  # [..., K]  A_k, unconditional per-position acceptance
    tau: np.ndarray  # [..., K]  analytic τ(K) for K = 1..Kmax (bonus token included)
    tau_sim: np.ndarray  # [..., K]  simulated τ_sim(K); NaN where no spans were counted (segment slices)
    tau_profile: np.ndarray  # [..., P, K]  τ_S(K) under each sampling profile
    speedup: np.ndarray  # [..., K]  τ(K) / (1 + K c + v(K))
    on_policy: np.ndarray  # [...]  on-policy rate

    def map(self, fn) -> "Rates":
        return Rates(**{f: fn(getattr(self, f)) for f in RATE_FIELDS})


RATE_FIELDS = ("alpha", "accept_rate", "tau", "tau_sim", "tau_profile", "speedup", "on_policy")


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den as float64, NaN where den == 0."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def speedup(tau: np.ndarray, c: float, verify_extra: np.ndarray) -> np.ndarray:
    """speedup(K) = τ(K) / (1 + K c + v(K)); tau [..., K], verify_extra [K] -> [..., K].

    Worked example: τ(2) = 2.2, c = 0.1, v(2) = 0 -> 2.2 / 1.2 = 1.833.
    """
    k = np.arange(1, tau.shape[-1] + 1, dtype=np.float64)
    return tau / (1.0 + k * c + np.asarray(verify_extra, dtype=np.float64))


def rates(counts: Counts, c: float, verify_extra: np.ndarray) -> Rates:
    """Every rate of the module docstring, broadcast over the leading axes of `counts`."""
    alpha = ratio(counts.accepted, counts.on_path)
    accept_rate = ratio(counts.accepted, counts.evaluable)
    tau = 1.0 + np.cumsum(accept_rate, axis=-1)
    tau_sim = ratio(counts.span_tokens[..., None], counts.steps)
    profile_alpha = ratio(counts.p_accept, counts.on_path[..., None, :])  # [..., P, K]  ᾱ_j(S)
    tau_profile = 1.0 + np.cumsum(np.cumprod(profile_alpha, axis=-1), axis=-1)
    return Rates(
        alpha=alpha, accept_rate=accept_rate, tau=tau, tau_sim=tau_sim, tau_profile=tau_profile,
        speedup=speedup(tau, c, verify_extra), on_policy=ratio(counts.on_policy, counts.evaluable[..., 0]),
    )


def best_k(speedups: np.ndarray) -> int:
    """The K (1-based) with the largest speedup; the smallest such K on ties. speedups: [K]."""
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

    Computed without a Python loop over positions: each span is laid out as e - s anchor slots
    plus one terminal slot; next[i] = i + emitted; the step count from the span's first slot
    to its terminal slot is found by pointer doubling (log2 of the longest span rounds).
    """
    accepted_len = np.asarray(accepted_len, dtype=np.int64)
    span_len = np.asarray(span_len, dtype=np.int64)
    assert accepted_len.shape == (int(span_len.sum()),), (accepted_len.shape, int(span_len.sum()))
    assert k >= 1, k
    n_spans = span_len.shape[0]
    if n_spans == 0:
        return np.zeros(0, dtype=np.int64)
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
    while np.any(jump != goal):
        count = count + count[jump]
        jump = jump[jump]
    return count[first]


def simulate_decode_reference(accepted_len: list[int], k: int) -> int:
    """The walk of `simulate_decode` for one span, as a plain loop (the definition, for tests and reading)."""
    e = len(accepted_len)  # anchors s..e-1 relative to s = 0
    p, steps = 0, 0
    while p < e:
        p += min(min(accepted_len[p], k) + 1, e - p)
        steps += 1
    return steps


# ---------------------------------------------------------------------------------------------
# The bootstrap


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
