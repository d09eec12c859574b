"""Drafters ranked: every drafter of a run summarised on the same anchors and ranked by speedup at its best K.

Contract:
    summarize_drafters(report, run, table, ...) -> Report
                                     the judged drafter's report with every drafter summarised beside it and ranked
    rank_drafters(summaries) -> (Rank, ...)

Decisions, written down once: the judged drafter (`--drafter`, default mtp when the run has it, else its first) gets
the slices, the verdict and the baseline comparison, and every drafter is summarised and ranked beside it on the same
resamples (paired). Each pays its own draft cost (denominator.drafter_cost): the head's c for mtp and the hybrids, 0
for ngram and suffix (CPU-side); v(K) is every drafter's. τ_sim(K) of a per-K drafter (suffix, the hybrids) walks the
draft made for K; α_k, A_k, τ(K) and the what-if read its Kmax drafts. The recording-sampler check is of the
traffic, so the same for every drafter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .denominator import MODEL_FREE_DRAFTERS, Cost, CostTable, drafter_table
from .metrics import percentile_interval
from .run import Run, load_run
from .summary import Report, summarize
from .tallies import Slice


@dataclass(frozen=True)
class DrafterSummary:
    """One drafter's numbers over the run (its own Report's, with its own cost)."""

    name: str
    cost: Cost  # drafter_cost: the head's for mtp and the hybrids, c = 0 for ngram and suffix
    best_k: int  # argmax of its speedup
    overall: Slice
    segments: tuple[Slice, ...]
    context: tuple[Slice, ...]
    per_k: bool  # its τ_sim(K) walks the draft made for each K (suffix, the hybrids), not the Kmax draft cut at K
    judged: bool  # the verdict is of this drafter


@dataclass(frozen=True)
class Rank:
    """A drafter at its best K, against the best drafter on the same resamples (paired: same sessions drawn)."""

    drafter: str
    k: int
    speedup: float
    lo: float | None  # bootstrap interval of the speedup (None without intervals)
    hi: float | None
    tau_sim: float
    behind: float  # best drafter's speedup (at its K) - this one's (at its K); 0 for the best
    behind_lo: float | None  # its paired bootstrap interval (None for the best, or without intervals)
    behind_hi: float | None


def drafter_summary(report: Report, per_k: bool, judged: bool) -> DrafterSummary:
    return DrafterSummary(name=report.drafter, cost=report.cost, best_k=report.best_k, overall=report.overall,
                          segments=report.segments, context=report.context, per_k=per_k, judged=judged)


def rank_drafters(summaries: tuple[DrafterSummary, ...], level: float = 0.95) -> tuple[Rank, ...]:
    """The drafters by speedup at their own best K, best first (NaN last; run.json order on ties). Each is
    compared with the best on the same bootstrap resamples — every drafter's report resamples the same sessions
    (or turns) with the same seed — so the interval of the difference is paired."""
    def value(d: DrafterSummary) -> float:
        x = float(d.overall.value.speedup[d.best_k - 1])
        return x if math.isfinite(x) else -math.inf

    ordered = sorted(summaries, key=lambda d: -value(d))
    best = ordered[0]
    out = []
    for d in ordered:
        o, k = d.overall, d.best_k
        lo = float(o.lo.speedup[k - 1]) if o.lo is not None else None
        hi = float(o.hi.speedup[k - 1]) if o.hi is not None else None
        behind = float(best.overall.value.speedup[best.best_k - 1] - o.value.speedup[k - 1])
        b_lo = b_hi = None
        if d is not best and o.replicates is not None and best.overall.replicates is not None:
            diff = best.overall.replicates.speedup[:, best.best_k - 1] - o.replicates.speedup[:, k - 1]
            b_lo, b_hi = (float(x) for x in percentile_interval(diff, level))
        out.append(Rank(drafter=d.name, k=k, speedup=float(o.value.speedup[k - 1]), lo=lo, hi=hi,
                        tau_sim=float(o.value.tau_sim[k - 1]), behind=behind, behind_lo=b_lo, behind_hi=b_hi))
    return tuple(out)


def summarize_drafters(report: Report, run: Run, table: "CostTable", **options) -> Report:
    """The judged drafter's report with every drafter of the run summarised beside it (each its own rows, its own
    cost at the batch size the judged one's verdict binds at, the same resamples) and ranked."""
    from dataclasses import replace

    at = report.batch.binding if report.batch is not None else 1
    summaries = []
    for name in run.drafters:
        if name == run.drafter:
            other, other_run = report, run
        else:
            other_run = load_run(run.path, name)
            other = summarize(other_run, drafter_table(table, name).cost_at(at), **options)
        summaries.append(drafter_summary(other, per_k=other_run.accepted_len_by_k is not None, judged=name == run.drafter))
    summaries = tuple(summaries)
    notes = list(report.notes)
    model_free = [d.name for d in summaries if d.name in MODEL_FREE_DRAFTERS]
    if model_free:
        notes.append(f"{', '.join(model_free)} draft on the CPU between target steps: their speedup takes c = 0 (no "
                     "draft step on the GPU) and the same verify cost v(K) as every drafter")
    if any(d.per_k for d in summaries):
        notes.append(f"{', '.join(d.name for d in summaries if d.per_k)}: the draft at K is not the first K tokens of the "
                     "draft at Kmax (suffix decoding picks its match by a K-dependent score; the hybrids' threshold is K), so "
                     "τ_sim(K) and the speedup walk the draft made for each K; α_k, A_k and τ(K) are of the Kmax drafts")
    return replace(report, drafters=summaries, ranking=rank_drafters(summaries, report.level), notes=tuple(notes))
