"""The what-ifs: the head at other precisions and confidence-stopped drafting, beside the served head's numbers.

Contract:
    summarize_whatifs(report, run, table, **options) -> WhatIfs | None
                                     for a run written with `replay --head-precision` / `--draft-p-min` (version 3):
                                     every precision's rows summarised by `summarize` with its own draft cost, every
                                     threshold's decode walked by `stopped_walks`, each against the served head on
                                     the same resamples (paired), and which what-if pays most
    stopped_walks(run, thresholds) -> StopCounts
                                     the simulated decode of every span with a confidence stop, per threshold and
                                     largest draft length K (threshold 0 is fixed K: the summary's walk exactly)

Decisions, written down once (docs/whatifs.md):
- These are what-ifs: the verdict, the K to serve and every export stay about the head as it was loaded. A what-if is
  compared with the served head at its best K (report.best_k) at the gated batch size the verdict binds at.
- A precision's rows are the head re-run at that precision on the same anchors (precisions.py); its numbers are
  `summarize`'s on those rows with the draft cost of its bytes (denominator.precision_table), so α_k, τ_sim, the
  speedup and their intervals are computed by the same lines as the served head's.
- The confidence stop, as llama.cpp's --draft-p-min (mtp/head.py's module doc): at anchor p the head drafts until the
  first depth j whose draft has p < θ; that draft is dropped, so L = j - 1 drafts go to the verify and j draft steps
  were run; with none below θ it drafts K (steps K, verify K + 1 tokens). Depths past the end of the turn have no
  row (and no confidence): the head is taken to draft on there, as fixed K's cost counts them. The walk is the
  simulated decode with accepted length min(accepted, L); a step costs 1 + (draft steps)·c + v(L), v(0) = 0
  (cost.speedup_per_step), so threshold 0 is fixed K exactly and threshold 1 drafts nothing (τ_sim = 1).
- Engine-counted, as llama.cpp and vLLM count a run with a confidence stop: drafts = steps that drafted at least
  one token, mean acceptance length = 1 + accepted / drafts, draft acceptance rate = accepted / drafted tokens.
- By segment: a step belongs to the segment of the first token it emits (x_{p+1}); its tokens and its cost count
  there, so each segment has its own τ_sim and speedup for every rule, and the best fixed K and the best threshold
  are found per segment (point estimates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..cost.speedup import best_k, speedup_per_step
from .denominator import CostTable, precision_table
from .manifest import run_precisions, run_thresholds
from .metrics import decode_walk, percentile_interval, ratio, top_k
from .run import Run, load_run
from .summary import Report, summarize
from .tallies import Resampling


@dataclass(frozen=True)
class StopCounts:
    """The simulated decode with a confidence stop, per span: N spans, T thresholds, K largest draft lengths, G
    segments. Leading axis free (spans, sessions, replicates)."""

    tokens: np.ndarray  # [N] span tokens e - s (what every walk emits)
    steps: np.ndarray  # [N, T, K] target steps
    passes: np.ndarray  # [N, T, K] head draft steps (a stopped anchor's dropped draft included)
    hist: np.ndarray  # [N, T, K, K+1] steps by the number of drafts L = 0..K they verify
    accepted: np.ndarray  # [N, T, K] accepted drafts, over the steps
    drafts: np.ndarray  # [N, T, K] steps that verified at least one draft
    seg_tokens: np.ndarray  # [N, G, T, K] tokens emitted by steps whose first emitted token is of segment g
    seg_steps: np.ndarray  # [N, G, T, K]
    seg_passes: np.ndarray  # [N, G, T, K]
    seg_hist: np.ndarray  # [N, G, T, K, K+1]

    def add(self, index: np.ndarray, n: int) -> "StopCounts":
        """Counts [N, ...] -> [n, ...] summed by index [N] (spans to sessions)."""
        def group(a: np.ndarray) -> np.ndarray:
            out = np.zeros((n,) + a.shape[1:], dtype=np.float64)
            np.add.at(out, index, a)
            return out

        return StopCounts(**{f: group(getattr(self, f)) for f in self.__dataclass_fields__})

    def resample(self, weights: np.ndarray) -> "StopCounts":
        """weights [B, U] -> counts [B, ...] (metrics.Counts.resample's arithmetic, slice by slice of [U, K] so
        threshold 0 resamples exactly as the summary's fixed-K counts do)."""
        w = weights.astype(np.float64)

        def draw(a: np.ndarray) -> np.ndarray:
            a = a.astype(np.float64)
            if a.ndim <= 2:
                return np.tensordot(w, a, axes=(1, 0))
            flat = a.reshape(a.shape[0], -1, a.shape[-1])
            out = np.stack([np.tensordot(w, np.ascontiguousarray(flat[:, i]), axes=(1, 0)) for i in range(flat.shape[1])], 1)
            return out.reshape((w.shape[0],) + a.shape[1:])

        return StopCounts(**{f: draw(getattr(self, f)) for f in self.__dataclass_fields__})

    def total(self) -> "StopCounts":
        return StopCounts(**{f: getattr(self, f).sum(axis=0) for f in self.__dataclass_fields__})


def confidence_grid(run: Run) -> np.ndarray:
    """[A, K] the head's confidence at every anchor and depth (NaN where the anchor has no row: past e - p)."""
    r = run.rows
    A = int((r.depth == 1).sum())
    grid = np.full((A, run.k), np.nan)
    grid[r.anchor, r.depth - 1] = r.confidence
    return grid


def drafted_lengths(confidence: np.ndarray, threshold: float, k: int) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's rule at one threshold and largest draft length k: confidence [A, Kmax] (NaN: no row) ->
    (L [A] drafts verified, passes [A] draft steps run). Worked example, confidences (0.9, 0.4, 0.8), θ = 0.5,
    k = 3: depth 2 is below, so L = 1 and 2 draft steps ran; θ = 0.3: L = 3, 3 steps; θ = 0: always L = k."""
    below = confidence[:, :k] < threshold  # NaN compares False: drafting goes on past the last row
    stopped = below.any(axis=1)
    first = np.where(stopped, below.argmax(axis=1), k)
    return first, np.where(stopped, first + 1, k)


def stopped_walks(run: Run, thresholds: tuple[float, ...]) -> StopCounts:
    """The simulated decode of every span for each threshold and each largest draft length K = 1..Kmax."""
    spans = run.spans
    span_len = spans.end - spans.start
    N, K, T = len(span_len), run.k, len(thresholds)
    G = len(run.segments)
    anchor_span = np.repeat(np.arange(N), span_len)  # [A]
    offset = np.arange(len(anchor_span)) - np.repeat(np.cumsum(span_len) - span_len, span_len)
    remaining = span_len[anchor_span] - offset  # e - p
    first_rows = run.rows.depth == 1
    segment = run.rows.segment[first_rows]  # [A] segment of x_{p+1}, the first token a step there emits
    grid = confidence_grid(run)
    out = {f: np.zeros(s) for f, s in (("steps", (N, T, K)), ("passes", (N, T, K)), ("hist", (N, T, K, K + 1)),
                                       ("accepted", (N, T, K)), ("drafts", (N, T, K)), ("seg_tokens", (N, G, T, K)),
                                       ("seg_steps", (N, G, T, K)), ("seg_passes", (N, G, T, K)),
                                       ("seg_hist", (N, G, T, K, K + 1)))}
    for t, theta in enumerate(thresholds):
        for k in range(1, K + 1):
            L, passes = drafted_lengths(grid, theta, k)
            accepted = np.minimum(run.accepted_len, L)
            walk = decode_walk(accepted, span_len, k)
            v = walk.visited
            span, seg = anchor_span[v], segment[v]
            emitted = np.minimum(accepted[v] + 1, remaining[v])
            out["steps"][:, t, k - 1] = walk.steps
            out["passes"][:, t, k - 1] = np.bincount(span, weights=passes[v], minlength=N)
            out["hist"][:, t, k - 1, : k + 1] = np.bincount(span * (k + 1) + L[v], minlength=N * (k + 1)).reshape(N, k + 1)
            out["accepted"][:, t, k - 1] = np.bincount(span, weights=accepted[v], minlength=N)
            out["drafts"][:, t, k - 1] = np.bincount(span, weights=(L[v] > 0), minlength=N)
            cell = span * G + seg
            out["seg_tokens"][:, :, t, k - 1] = np.bincount(cell, weights=emitted, minlength=N * G).reshape(N, G)
            out["seg_steps"][:, :, t, k - 1] = np.bincount(cell, minlength=N * G).reshape(N, G)
            out["seg_passes"][:, :, t, k - 1] = np.bincount(cell, weights=passes[v], minlength=N * G).reshape(N, G)
            out["seg_hist"][:, :, t, k - 1, : k + 1] = np.bincount(cell * (k + 1) + L[v], minlength=N * G * (k + 1)).reshape(
                N, G, k + 1)
    return StopCounts(tokens=span_len.astype(np.float64), **out)


def stopped_speedup(tokens: np.ndarray, steps: np.ndarray, passes: np.ndarray, hist: np.ndarray, c: np.ndarray,
                    verify: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(τ_sim [..., T, K], speedup [..., NB, T, K]) from the counts (tokens broadcastable to steps) and the cost at NB
    batch sizes: c [NB], verify [NB, K] v_B(L) for L = 1..K."""
    tau = ratio(tokens, steps)  # [..., T, K]
    share = ratio(hist, steps[..., None])  # [..., T, K, K+1] steps by drafts verified
    full = np.concatenate([np.zeros((verify.shape[0], 1)), verify], axis=1)  # [NB, K+1] v(0) = 0
    v_bar = (share[..., None, :, :, :] * full[:, None, None, :]).sum(axis=-1)  # [..., NB, T, K]
    n_bar = ratio(passes, steps)[..., None, :, :]
    return tau, speedup_per_step(tau[..., None, :, :], n_bar, v_bar, np.asarray(c)[:, None, None])


# ---------------------------------------------------------------------------------------------
# The tables


@dataclass(frozen=True)
class PrecisionRow:
    """The head at one what-if precision, at its best K at the gated batch size."""

    precision: str
    k: int
    alpha: np.ndarray  # [Kmax] α_k
    tau_sim: float
    tau_sim_lo: float | None
    tau_sim_hi: float | None
    speedup: float
    speedup_lo: float | None
    speedup_hi: float | None
    c: float  # its draft step / a target decode step, at the gated batch size
    draft_step_bytes: int  # a batch-1 draft step's bytes (run.json model.head_precisions)
    gain: float  # speedup minus the served head's (at their best K)
    gain_lo: float | None  # paired bootstrap interval
    gain_hi: float | None
    fallbacks: tuple[str, ...]  # GGUF types llama-quantize would fall back from, in words
    drafts_equal: float  # share of the what-if's rows whose draft is the served head's


@dataclass(frozen=True)
class ThresholdRow:
    """Confidence-stopped drafting at one threshold, at the largest draft length K that pays best."""

    threshold: float
    k: int  # llama.cpp's n_max that pays best with this threshold
    tau_sim: float
    tau_sim_lo: float | None
    tau_sim_hi: float | None
    speedup: float
    speedup_lo: float | None
    speedup_hi: float | None
    gain: float
    gain_lo: float | None
    gain_hi: float | None
    drafted_per_step: float  # drafts verified per target step
    draft_steps_per_step: float  # head draft steps per target step (n̄)
    mean_acceptance_length: float  # engine-counted: 1 + accepted / drafts
    draft_acceptance_rate: float  # engine-counted: accepted / drafted tokens
    tau_sim_by_k: np.ndarray  # [Kmax]
    speedup_by_k: np.ndarray  # [Kmax] at the gated batch size


@dataclass(frozen=True)
class RuleBest:
    """At one batch size (or one segment): the best fixed K and the best threshold (with its K)."""

    name: str  # the batch size, or the segment
    tokens: int  # the tokens the rule's steps emit there (a segment's share; the whole run per batch size)
    fixed_k: int  # 0: no K beats 1
    fixed_speedup: float  # at the argmax K (even where it does not beat 1)
    threshold: float | None
    threshold_k: int
    threshold_speedup: float


@dataclass(frozen=True)
class BestWhatIf:
    """The what-if that would pay most at the gated batch size, against the served head (a what-if, not a verdict)."""

    kind: str  # "precision" | "draft_p_min"
    name: str  # the precision, or the threshold as text
    k: int
    speedup: float
    speedup_lo: float | None
    speedup_hi: float | None
    gain: float
    gain_lo: float | None
    gain_hi: float | None
    served_k: int
    served_speedup: float
    batch: int
    line: str  # the one line a first screen prints


@dataclass(frozen=True)
class WhatIfs:
    batch: int  # the gated batch size the verdict binds at (every speedup here is at it)
    served_k: int
    served_speedup: float
    precisions: tuple[PrecisionRow, ...]
    thresholds: tuple[ThresholdRow, ...]
    by_batch: tuple[RuleBest, ...]  # the best fixed K and the best threshold at every batch size of the cost table
    by_segment: tuple[RuleBest, ...]  # the same per segment, at the gated batch size
    best: BestWhatIf | None
    notes: tuple[str, ...]


def _bounds(replicates: np.ndarray | None, level: float) -> tuple[float | None, float | None]:
    if replicates is None:
        return None, None
    lo, hi = percentile_interval(replicates, level)
    return (float(lo) if math.isfinite(float(lo)) else None), (float(hi) if math.isfinite(float(hi)) else None)


def _fmt(theta: float) -> str:
    return f"{theta:g}"


def summarize_whatifs(report: Report, run: Run, table: CostTable, **options) -> WhatIfs | None:
    """The what-if tables of a run with what-ifs (None without): report is the served head's (at the gated batch
    size), run its rows, table the cost table every batch size comes from."""
    precisions, thresholds = run_precisions(run.manifest), run_thresholds(run.manifest)
    if not precisions and not thresholds:
        return None
    notes: list[str] = []
    if run.drafter != "mtp":
        return WhatIfs(batch=1, served_k=0, served_speedup=float("nan"), precisions=(), thresholds=(), by_batch=(),
                       by_segment=(), best=None, notes=(f"the run's what-ifs are of the MTP head; the report judges "
                                                        f"{run.drafter} (report --drafter mtp shows them)",))
    level = report.level
    at = report.batch.binding if report.batch is not None else 1
    served_k = report.best_k
    o = report.overall
    served_speedup = float(o.value.speedup[served_k - 1])
    served_reps = o.replicates.speedup[:, served_k - 1] if o.replicates is not None else None

    rows = []
    for p in precisions:
        other_run = load_run(run.path, "mtp", precision=p)
        assert other_run.sessions == run.sessions, "a what-if precision holds the served head's sessions"
        cost = precision_table(table, run, p).cost_at(at)
        other = summarize(other_run, cost, **options)
        k = other.best_k
        x = other.overall
        reps = x.replicates.speedup[:, k - 1] if x.replicates is not None else None
        entry = (run.manifest.get("model") or {}).get("head_precisions", {}).get(p, {})
        rows.append(PrecisionRow(
            precision=p, k=k, alpha=x.value.alpha, tau_sim=float(x.value.tau_sim[k - 1]),
            tau_sim_lo=float(x.lo.tau_sim[k - 1]) if x.lo is not None else None,
            tau_sim_hi=float(x.hi.tau_sim[k - 1]) if x.hi is not None else None,
            speedup=float(x.value.speedup[k - 1]), speedup_lo=float(x.lo.speedup[k - 1]) if x.lo is not None else None,
            speedup_hi=float(x.hi.speedup[k - 1]) if x.hi is not None else None, c=float(cost.c),
            draft_step_bytes=int(entry.get("draft_step_bytes", 0)),
            gain=float(x.value.speedup[k - 1]) - served_speedup,
            gain_lo=_bounds(reps - served_reps, level)[0] if reps is not None and served_reps is not None else None,
            gain_hi=_bounds(reps - served_reps, level)[1] if reps is not None and served_reps is not None else None,
            fallbacks=tuple(entry.get("fallbacks", ())),
            drafts_equal=float(np.mean(other_run.rows.draft_token == run.rows.draft_token)),
        ))

    stops, by_batch, by_segment = (), (), ()
    if thresholds and run.rows.confidence is None:
        notes.append("the run lists --draft-p-min thresholds but its rows carry no draft_confidence; re-run replay")
    elif thresholds:
        stops, by_batch, by_segment = _thresholds(report, run, table, thresholds, at, served_reps, served_speedup, level)
    best = _best(rows, stops, served_k, served_speedup, at)
    return WhatIfs(batch=at, served_k=served_k, served_speedup=served_speedup, precisions=tuple(rows), thresholds=stops,
                   by_batch=by_batch, by_segment=by_segment, best=best, notes=tuple(notes))


def _thresholds(report: Report, run: Run, table: CostTable, thresholds: tuple[float, ...], at: int, served_reps,
                served_speedup: float, level: float):
    plan: Resampling = report.resampling
    grid = (0.0,) + tuple(thresholds)  # threshold 0: fixed K, the rule every threshold is compared with
    per_span = stopped_walks(run, grid)
    S = len(run.sessions)
    per_session = per_span.add(run.spans.session, S)
    units = per_span if plan is not None and plan.unit == "turn" else per_session
    t = table.times
    c, verify = t.draft_cost(), t.verify_extra(run.k)
    b = t.index(at)
    total = per_session.total()
    tau, speed = stopped_speedup(total.tokens, total.steps, total.passes, total.hist, c, verify)  # [T, K], [NB, T, K]
    reps = None
    if plan is not None and plan.weights is not None:
        drawn = units.resample(plan.weights)
        rep_tau, rep_speed = stopped_speedup(drawn.tokens[:, None, None], drawn.steps, drawn.passes, drawn.hist, c[b : b + 1],
                                             verify[b : b + 1])
        reps = (rep_tau, rep_speed[:, 0])  # [B, T, K] each
    out = []
    for i, theta in enumerate(thresholds, start=1):
        k = top_k(speed[b, i])
        tau_lo, tau_hi = _bounds(reps[0][:, i, k - 1], level) if reps else (None, None)
        sp_lo, sp_hi = _bounds(reps[1][:, i, k - 1], level) if reps else (None, None)
        g_lo, g_hi = _bounds(reps[1][:, i, k - 1] - served_reps, level) if reps and served_reps is not None else (None, None)
        steps = total.steps[i, k - 1]
        drafted = float((total.hist[i, k - 1] * np.arange(run.k + 1)).sum())
        out.append(ThresholdRow(
            threshold=float(theta), k=k, tau_sim=float(tau[i, k - 1]), tau_sim_lo=tau_lo, tau_sim_hi=tau_hi,
            speedup=float(speed[b, i, k - 1]), speedup_lo=sp_lo, speedup_hi=sp_hi,
            gain=float(speed[b, i, k - 1]) - served_speedup, gain_lo=g_lo, gain_hi=g_hi,
            drafted_per_step=float(ratio(drafted, steps)), draft_steps_per_step=float(ratio(total.passes[i, k - 1], steps)),
            mean_acceptance_length=float(1.0 + ratio(total.accepted[i, k - 1], total.drafts[i, k - 1])),
            draft_acceptance_rate=float(ratio(total.accepted[i, k - 1], drafted)),
            tau_sim_by_k=tau[i], speedup_by_k=speed[b, i]))
    by_batch = tuple(_rule_best(str(B), int(total.tokens), speed[j], thresholds) for j, B in enumerate(t.batch))
    seg_tau, seg_speed = stopped_speedup(total.seg_tokens, total.seg_steps, total.seg_passes, total.seg_hist,
                                         c[b : b + 1], verify[b : b + 1])  # [G, T, K], [G, 1, T, K]
    by_segment = tuple(_rule_best(name, int(total.seg_tokens[g, 0, 0]), seg_speed[g, 0], thresholds)
                       for g, name in enumerate(run.segments) if total.seg_steps[g, 0, 0] > 0)
    return tuple(out), by_batch, by_segment


def _rule_best(name: str, tokens: int, speed: np.ndarray, thresholds: tuple[float, ...]) -> RuleBest:
    """speed [1 + T, K] (row 0 fixed K) -> the best fixed K and the best threshold with its K."""
    fixed = top_k(speed[0])
    flat = np.where(np.isfinite(speed[1:]), speed[1:], -np.inf)
    i, k = np.unravel_index(int(np.argmax(flat)), flat.shape) if np.isfinite(flat).any() else (0, 0)
    return RuleBest(name=name, tokens=tokens, fixed_k=best_k(speed[0]), fixed_speedup=float(speed[0, fixed - 1]),
                    threshold=float(thresholds[i]) if thresholds else None, threshold_k=int(k) + 1,
                    threshold_speedup=float(speed[1 + i, k]))


def _best(rows: list[PrecisionRow], stops: tuple[ThresholdRow, ...], served_k: int, served_speedup: float,
          batch: int) -> BestWhatIf | None:
    candidates = [("precision", r.precision, r.k, r.speedup, r.speedup_lo, r.speedup_hi, r.gain, r.gain_lo, r.gain_hi)
                  for r in rows]
    candidates += [("draft_p_min", _fmt(r.threshold), r.k, r.speedup, r.speedup_lo, r.speedup_hi, r.gain, r.gain_lo,
                    r.gain_hi) for r in stops]
    candidates = [x for x in candidates if math.isfinite(x[3])]
    if not candidates:
        return None
    kind, name, k, sp, lo, hi, gain, g_lo, g_hi = max(candidates, key=lambda x: x[3])
    what = f"the head at {name}" if kind == "precision" else f"--draft-p-min {name}"
    interval = "" if g_lo is None or g_hi is None else f" [{g_lo:+.2f}, {g_hi:+.2f}]"
    where = "" if batch == 1 else f" at batch {batch}"
    verb = "would pay most" if gain > 0 else "is the best what-if but pays no more than what you serve"
    line = (f"what-if: {what} at K={k} {verb}{where}: speedup {sp:.3f}, {gain:+.3f}{interval} against the head as served "
            f"({served_speedup:.3f} at K={served_k}); a what-if, not the verdict")
    return BestWhatIf(kind=kind, name=name, k=k, speedup=sp, speedup_lo=lo, speedup_hi=hi, gain=gain, gain_lo=g_lo,
                      gain_hi=g_hi, served_k=served_k, served_speedup=served_speedup, batch=batch, line=line)
