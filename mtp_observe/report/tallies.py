"""The tallies, slices and resampling: counts per slice of the rows, and their rates with bootstrap intervals.

Contract:
    tally(run, row_group, n_groups, span_group, steps, ...) -> Counts
                                     counts per group (rates are derived only in metrics.py)
    simulated_walks(run) -> (steps [N, K], step_accepted [N, K, K], step_drafted [N, K, K] | None)
                                     the simulated decode of every span at every draft length (τ_sim), and what
                                     its steps drafted (None: every step drafts K)
    what_if_steps(run) -> [N, P, K]  expected decode steps under each profile's acceptance probabilities
    resampling_for(run, replicates, seed) -> Resampling
                                     whole sessions, turns within sessions, or none
    Slice                            one slice's token-weighted, session-weighted and bootstrapped rates

Decisions, written down once:
- What-if under another profile S: τ_S = span tokens / expected steps of the walk with S's acceptance
  probabilities (metrics.expected_decode_steps). Depth j's probability is p_accept_S of the row while the chain is
  on the recorded path; once an earlier draft was not the recorded token the row's p_accept is conditioned on the
  wrong prefix, so the run's mean conditional rate ᾱ_j(S) stands in. An estimate, and labelled so; the bootstrap
  treats ᾱ as fixed.
- Intervals: with at least metrics.MIN_SESSIONS_FOR_BOOTSTRAP sessions, whole sessions are resampled; with fewer,
  turns within sessions (said in a note: the interval then reflects turn-to-turn variation only); a run of one
  session, an interval of zero width or none at all makes no verdict.
- Context slices: rows by the anchor's position p (CONTEXT_BINS); τ_sim and the fit sums of a context slice walk
  the turns that start in it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .denominator import Cost
from .metrics import (
    MIN_SESSIONS_FOR_BOOTSTRAP,
    MIN_TURNS_FOR_BOOTSTRAP,
    RATE_FIELDS,
    Counts,
    Rates,
    bootstrap_weights,
    decode_walk,
    expected_decode_steps,
    nanmean,
    percentile_interval,
    rates,
    stratified_weights,
)
from .run import Run

CONTEXT_BINS = ((0, 4096, "0-4k"), (4096, 16384, "4k-16k"), (16384, 32768, "16k-32k"), (32768, 65536, "32k-64k"),
                (65536, None, "64k+"))  # [lo, hi) of the anchor position p


@dataclass(frozen=True)
class Resampling:
    """How the intervals resample: whole sessions, turns within sessions, or not at all."""

    unit: str  # "session" | "turn" | "none"
    weights: np.ndarray | None  # [B, U] draws of each unit (U = sessions or spans); None for "none"
    note: str | None  # said in the report when the unit is not the session
    strata: np.ndarray | None = None  # [U] the session of each turn ("turn" only)
    keys: tuple | None = None  # [U] (session id, request, start) of each turn ("turn" only), to pair turns across runs


def resampling_for(run: Run, replicates: int, seed: int) -> Resampling:
    S, N = len(run.sessions), len(run.spans.start)
    if S >= MIN_SESSIONS_FOR_BOOTSTRAP:
        return Resampling("session", bootstrap_weights(S, replicates, seed), None)
    if N >= MIN_TURNS_FOR_BOOTSTRAP and S >= 1:
        return Resampling("turn", stratified_weights(run.spans.session, replicates, seed),
                          f"{S} session(s), fewer than the {MIN_SESSIONS_FOR_BOOTSTRAP} a bootstrap over sessions needs: "
                          f"the intervals resample the {N} turns within their sessions, so they show turn-to-turn "
                          "variation only, not session-to-session", strata=run.spans.session,
                          keys=tuple((run.sessions[a], int(b), int(c)) for a, b, c in
                                     zip(run.spans.session, run.spans.request, run.spans.start)))
    return Resampling("none", None, f"{S} session(s) and {N} turn(s): too few to resample "
                                    f"(at least {MIN_TURNS_FOR_BOOTSTRAP} turns are needed); no intervals")


@dataclass(frozen=True)
class Slice:
    """One slice of the rows (all, a segment, a context range, a turn, a session): rates over K = 1..Kmax."""

    name: str
    anchors: int  # depth-1 rows in the slice
    sessions: int  # sessions with at least one anchor in the slice
    value: Rates  # token-weighted: the rates of the pooled counts; arrays [K] ([P, K], [P] per profile)
    session_weighted: Rates | None  # the mean over sessions of each session's rates (None for one session)
    lo: Rates | None  # bootstrap lower / upper percentile (None where not bootstrapped)
    hi: Rates | None
    replicates: Rates | None  # [B, ...] the bootstrap replicates
    per_session: Counts | None = None  # [S, ...] the slice's counts per session (baseline pairing)
    per_unit: Counts | None = None  # [U, ...] per resampled unit


def tally(run: Run, row_group: np.ndarray, n_groups: int, span_group: np.ndarray | None, steps: np.ndarray,
          expected: np.ndarray | None = None, step_accepted: np.ndarray | None = None,
          step_drafted: np.ndarray | None = None) -> Counts:
    """Counts per group: row_group [R] and span_group [N] (None: spans not counted, τ_sim NaN) -> Counts [G, ...].

    steps: [N, K] simulated decode steps of each span at K = 1..Kmax; expected: [N, P, K] the what-if
    expected steps per profile (None: zeros); step_accepted: [N, K, K] the walk's per-position counts at
    each draft length (simulated_walks; None: zeros); step_drafted: [N, K, K] its steps by draft length
    (simulated_walks; None: every step drafts K).
    """
    K, P = run.k, len(run.profiles)
    r = run.rows
    cell = row_group * K + (r.depth - 1)

    def per_cell(weights=None) -> np.ndarray:
        return np.bincount(cell, weights=weights, minlength=n_groups * K).reshape(n_groups, K)

    def per_span(values: np.ndarray) -> np.ndarray:  # [N, ...] -> [G, ...]
        out = np.zeros((n_groups,) + values.shape[1:])
        if span_group is not None:
            np.add.at(out, span_group, values)
        return out

    first = r.depth == 1
    p_accept = [per_cell(np.where(r.on_path, r.p_accept[:, i], 0.0)) for i in range(P)]
    N = len(run.spans.start)
    fit = per_span(run.spans.fit)  # [G, 5, P]
    return Counts(
        evaluable=per_cell().astype(np.int64),
        on_path=per_cell(r.on_path).astype(np.int64),
        accepted=per_cell(r.accepted).astype(np.int64),
        p_accept=np.stack(p_accept, axis=1) if p_accept else np.zeros((n_groups, 0, K)),
        on_policy=np.bincount(row_group[first], weights=r.on_policy[first], minlength=n_groups),
        span_tokens=per_span((run.spans.end - run.spans.start).astype(np.float64)).astype(np.int64),
        steps=per_span(steps.astype(np.float64)).astype(np.int64),
        expected_steps=per_span(expected if expected is not None else np.zeros((N, P, K))),
        fit_tokens=per_span(run.spans.fit_tokens.astype(np.float64)).astype(np.int64),
        fit_support=fit[:, 0, :], fit_q=fit[:, 1, :], fit_q2=fit[:, 2, :], fit_var=fit[:, 3, :], fit_ll=fit[:, 4, :],
        step_accepted=per_span(step_accepted if step_accepted is not None else np.zeros((N, K, K))).astype(np.int64),
        step_drafted=per_span(step_drafted).astype(np.int64) if step_drafted is not None else None,
    )


def simulated_steps(run: Run) -> np.ndarray:
    """[N, K] steps of the simulated decode of every span at K = 1..Kmax: with the draft made for K itself where a
    drafter's draft at K is not the first K tokens of its draft at Kmax (run.accepted_len_by_k), so τ_sim(K) is
    exact at every K."""
    return simulated_walks(run)[0]


def simulated_walks(run: Run) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """([N, K] steps, [N, K, K] step_accepted, [N, K, K] step_drafted or None) of the simulated decode of every span
    at draft length K = 1..Kmax (the draft made for K where run.accepted_len_by_k has one): step_accepted[n, K-1, k-1]
    counts the walk's steps that accept depth k, step_drafted[n, K-1, k-1] those whose draft holds at least k tokens
    (both 0 for k > K), as vLLM counts them (with the drafts it accepts past the end of a turn: run.past_end);
    step_drafted is None where every draft holds K (run.draft_len None)."""
    span_len = run.spans.end - run.spans.start
    N, Kmax = len(span_len), run.k
    by_k = run.accepted_len_by_k
    lengths = run.draft_len_by_k if by_k is not None else None
    steps = np.zeros((N, Kmax), dtype=np.int64)
    step_accepted = np.zeros((N, Kmax, Kmax), dtype=np.int64)
    step_drafted = np.zeros((N, Kmax, Kmax), dtype=np.int64) if run.draft_len is not None else None
    for k in range(1, Kmax + 1):
        draft_len = None if step_drafted is None else (run.draft_len if lengths is None else lengths[:, k - 1])
        past_end = run.past_end if run.past_end_by_k is None else run.past_end_by_k[:, k - 1]
        walk = decode_walk(run.accepted_len if by_k is None else by_k[:, k - 1], span_len, k, draft_len, past_end)
        steps[:, k - 1] = walk.steps
        step_accepted[:, k - 1, :k] = walk.step_accepted
        if step_drafted is not None:
            step_drafted[:, k - 1, :k] = walk.step_drafted
    return steps, step_accepted, step_drafted


def what_if_steps(run: Run) -> np.ndarray:
    """[N, P, K] expected decode steps of every span under each profile's acceptance probabilities (the what-if).

    Depth j's probability is the row's p_accept while the chain is on the recorded path, else ᾱ_j(S),
    the run's mean conditional rate at depth j under S (module docstring)."""
    K, P, r = run.k, len(run.profiles), run.rows
    A = int((r.depth == 1).sum())
    if not run.has_fit or P == 0:
        return np.zeros((len(run.spans.start), P, K))
    on = r.on_path
    mean = np.zeros((K, P))
    for k in range(1, K + 1):
        sel = on & (r.depth == k)
        mean[k - 1] = r.p_accept[sel].mean(axis=0) if sel.any() else 0.0
    accept = np.broadcast_to(mean[None], (A, K, P)).copy()
    accept[r.anchor[on], r.depth[on] - 1] = r.p_accept[on]
    return expected_decode_steps(accept, run.spans.end - run.spans.start, K)


def _to_sessions(per_span: Counts, run: Run) -> Counts:
    """Counts [N, ...] per span -> [S, ...] per session (counts add)."""
    S = len(run.sessions)

    def add(values: np.ndarray) -> np.ndarray:
        out = np.zeros((S,) + values.shape[1:], dtype=values.dtype)
        np.add.at(out, run.spans.session, values)
        return out

    return Counts(**{f: add(v) for f, v in vars(per_span).items() if v is not None})


def _slice(name: str, per_unit: Counts, per_session: Counts, cost: Cost, resampling: Resampling, level: float) -> Slice:
    """Counts of one slice per resampled unit and per session -> its token-weighted, session-weighted and
    bootstrapped rates."""
    present = per_session.evaluable[:, 0] > 0
    value = rates(per_session.total(), cost.c, cost.verify_extra)
    session_weighted = rates(per_session.take(present), cost.c, cost.verify_extra).map(nanmean)
    lo = hi = replicates = None
    if resampling.weights is not None:
        replicates = rates(per_unit.resample(resampling.weights), cost.c, cost.verify_extra)
        bounds = {f: percentile_interval(getattr(replicates, f), level) for f in RATE_FIELDS}
        lo = Rates(**{f: b[0] for f, b in bounds.items()})
        hi = Rates(**{f: b[1] for f, b in bounds.items()})
    return Slice(name=name, anchors=int(per_session.evaluable[:, 0].sum()), sessions=int(present.sum()), value=value,
                 session_weighted=session_weighted, lo=lo, hi=hi, replicates=replicates, per_session=per_session,
                 per_unit=per_unit)


def context_bin(position: np.ndarray) -> np.ndarray:
    """[n] positions -> [n] index into CONTEXT_BINS."""
    edges = np.array([lo for lo, _, _ in CONTEXT_BINS[1:]])
    return np.searchsorted(edges, position, side="right")


def context_notes(run: Run) -> list[str]:
    """Warnings about positions the checkpoint was not trained for (run.json's model limits, version 2)."""
    model = run.manifest.get("model") or {}
    notes = []
    limit = model.get("max_position_embeddings")
    if isinstance(limit, int) and run.longest is not None:
        over = [run.sessions[i] for i in np.flatnonzero(run.longest > limit)]
        if over:
            notes.append(f"{len(over)} session(s) exceed the checkpoint's max_position_embeddings ({limit:,}; longest "
                         f"request {int(run.longest.max()):,} tokens, e.g. {over[0]}): acceptance there is measured past "
                         "the context the model was trained for")
    rope = model.get("rope_scaling")
    if rope:
        kind = rope.get("rope_type", rope.get("type", "?")) if isinstance(rope, dict) else rope
        factor = rope.get("factor") if isinstance(rope, dict) else None
        notes.append(f"the checkpoint's config scales RoPE ({kind}" + (f", factor {factor}" if factor else "") + "): "
                     "long-context slices measure the scaled model, which engines may serve with different settings")
    return notes
