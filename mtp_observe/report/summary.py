"""The summary: one drafter's every metric, slice and interval, the recording sampler and the verdict, as a Report.

Contract:
    summarize(run, cost, ...) -> Report
                                     every metric of ACCEPTANCE.md per K <= Kmax, sliced by segment, context length,
                                     turn and session, with bootstrap intervals, the recording sampler, the best K
                                     and the verdict (ACCEPTANCE.md, 'Metrics')
    summarize_at_batch(run, table, gated, ...) -> Report
                                     the same at the gated batch size, with speedup by batch size attached
    speculative_checks(run, steps)   `generate --speculative K`'s own loop beside the replay of its text

Decisions, written down once:
- τ_sim is the verdict's τ: speedup, best K and the gate read the simulated decode (exact for chain speculation on
  the recorded trajectory when the traffic is the target's own under its recording sampler). τ(K) is shown under
  vLLM's name, "mean acceptance length" (per-position formula).
- Speedup by batch size: speedup(K, B) takes the overall τ_sim(K) and its bootstrap replicates through
  cost.batch_speedup (the intervals are τ_sim's, the cost being fixed). The gate (--batch B or LO-HI) is judged at
  each gated batch size by the same rules as at batch 1 (judge); the report's slices, best K and verdict are at the
  binding one: the worst verdict, then the lowest lower bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..cost.speedup import StepTimes, batch_speedup, best_k, break_even, check_schedule, schedule
from ..errors import OptionError
from .advice import DEFAULT_MIN_SESSIONS, FLOOR_MIN_SESSIONS, Facts, Settings, facts_of
from .denominator import Cost, CostTable
from .metrics import MIN_SUPPORT, Counts, percentile_interval, rates, top_k
from .recording import RecordingSampler, recording_sampler
from .run import Run
from .tallies import (
    CONTEXT_BINS,
    Resampling,
    Slice,
    _slice,
    _to_sessions,
    context_bin,
    context_notes,
    resampling_for,
    simulated_walks,
    tally,
    what_if_steps,
)
from .verdict import Gate, Verdict, judge


@dataclass(frozen=True)
class Report:
    path: Path
    manifest: dict
    k: int  # Kmax
    profiles: tuple[str, ...]
    cost: Cost
    replicates: int  # bootstrap replicates B
    seed: int
    level: float  # interval level, 0.95
    rows: int  # positions rows
    overall: Slice
    segments: tuple[Slice, ...]  # by the drafted token's segment; bootstrapped
    turns: tuple[Slice, ...]  # by turn index (name "0", "1", ...); point estimates
    sessions: tuple[Slice, ...]  # one per session, in input order; point estimates
    best_k: int  # argmax of the token-weighted speedup (τ_sim)
    verdict: Verdict
    notes: tuple[str, ...]
    context: tuple[Slice, ...] = ()  # by the anchor's position (CONTEXT_BINS); bootstrapped
    recording: RecordingSampler | None = None
    resampling: Resampling | None = None
    speculative: tuple["SpeculativeCheck", ...] = ()  # one per K of `generate --speculative` loops in the run
    drafter: str = "mtp"  # the drafter these slices and the verdict are of
    drafters: tuple = ()  # drafters.DrafterSummary each: every drafter of the run, run.json order (summarize_drafters)
    ranking: tuple = ()  # drafters.Rank each: the drafters by speedup at their best K, best first
    batch: "BatchSpeedup | None" = None  # speedup by batch size (section 8); the slices' cost is at batch.binding
    trees: tuple = ()  # trees.TreeSummary each: each replayed tree configuration beside the chain (report/trees.py)
    configurations: tuple = ()  # trees.Configuration each: the best of the chain and the trees at each batch size (a what-if)
    layer_rules: tuple = ()  # trees.LayerRule each: a head with several MTP layers: each rule over the same anchors
    whatifs: object = None  # whatifs.WhatIfs or None: the head at other precisions and confidence-stopped drafting (report/whatifs.py)

    facts: Facts | None = None  # what the verdict's next-step commands are made of (advice.facts_of)
    grammar: dict | None = None  # replay --grammar's tool-call numbers (grammar.grammar_summary); None without it


def summarize(
    run: Run,
    cost: Cost,
    *,
    replicates: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    gate: Gate | None = None,
    min_support: float = MIN_SUPPORT,
    recorded_with: str | None = None,
    min_sessions: int = DEFAULT_MIN_SESSIONS,
    settings: Settings | None = None,
) -> Report:
    """Every metric, slice, interval, the recording sampler and the verdict for one run (ACCEPTANCE.md, 'Metrics')."""
    assert replicates >= 1, replicates
    assert min_sessions >= FLOOR_MIN_SESSIONS, min_sessions  # reading.py refuses a smaller --min-sessions
    S, K, N = len(run.sessions), run.k, len(run.spans.start)
    steps, step_accepted, step_drafted = simulated_walks(run)
    expected = what_if_steps(run)
    plan = resampling_for(run, replicates, seed)
    r = run.rows
    anchor_span = np.repeat(np.arange(N), run.spans.end - run.spans.start)  # [A] span of each anchor
    row_span = anchor_span[r.anchor]  # [R]

    def family(row_group: np.ndarray, G: int, span_group: np.ndarray | None) -> tuple[Counts, Counts]:
        """Counts [N, G, ...] per span and group, and [S, G, ...] per session."""
        counts = tally(run, row_span * G + row_group, N * G,
                       np.arange(N) * G + span_group if span_group is not None else None, steps, expected, step_accepted,
                       step_drafted)
        counts = Counts(**{f: v.reshape((N, G) + v.shape[1:]) for f, v in vars(counts).items() if v is not None})
        return counts, _to_sessions(counts, run)

    def units(per_span: Counts, per_session: Counts) -> Counts:
        return per_span if plan.unit == "turn" else per_session

    # 1. All rows: token-weighted = pooled, session-weighted = mean of sessions.
    all_span, all_session = family(np.zeros(len(r.depth), dtype=np.int64), 1, np.zeros(N, dtype=np.int64))
    overall = _slice("all", units(all_span.take((slice(None), 0)), all_session.take((slice(None), 0))),
                     all_session.take((slice(None), 0)), cost, plan, level)

    # 2. By segment of the drafted token (a decode walk crosses segments: no τ_sim there), and by context length.
    def sliced(row_group, names, span_group) -> tuple[Slice, ...]:
        per_span, per_session = family(row_group, len(names), span_group)
        return tuple(
            _slice(names[g], units(per_span.take((slice(None), g)), per_session.take((slice(None), g))),
                   per_session.take((slice(None), g)), cost, plan, level)
            for g in range(len(names)) if per_session.evaluable[:, g, 0].sum() > 0
        )

    segments = sliced(r.segment, run.segments, None)
    context = sliced(context_bin(r.pos), [name for _, _, name in CONTEXT_BINS], context_bin(run.spans.start))

    # 3. By turn index: point estimates; each (session, turn) is one span, so the per-span counts are per pair.
    turns = _by_turn(run, all_span.take((slice(None), 0)), cost, level)

    # 4. Per session: its own rates (no interval).
    sessions = _by_session(run, all_session.take((slice(None), 0)), cost)

    # 5. The recording sampler, the best K (by τ_sim's speedup) and the verdict.
    recording = recording_sampler(run, overall.value, recorded_with, min_support)
    k = top_k(overall.value.speedup)
    facts = facts_of(run, cost.source, settings)  # settings: the report's options, for the next steps
    verdict = judge(overall, k, gate, recording, str(run.manifest.get("status", "unknown")), S, plan, facts, min_sessions)
    notes = list(run.notes) + ([plan.note] if plan.note else []) + context_notes(run) + list(cost.notes)
    return Report(
        path=run.path, manifest=run.manifest, k=K, profiles=run.profiles, cost=cost, replicates=replicates, seed=seed,
        level=level, rows=len(r.depth), overall=overall, segments=segments, turns=turns, sessions=sessions,
        best_k=k, verdict=verdict, notes=tuple(notes), context=context, recording=recording, resampling=plan,
        speculative=speculative_checks(run, steps),
        drafter=run.drafter, facts=facts, grammar=_grammar(run),
    )


def _grammar(run: Run) -> dict | None:
    """replay --grammar's tool-call numbers (a what-if beside the verdict), None for a run without it."""
    from .grammar import grammar_summary

    return grammar_summary(run.path) if run.manifest.get("grammar") else None


def _by_turn(run: Run, per_span: Counts, cost: Cost, level: float) -> tuple[Slice, ...]:
    """By turn index: point estimates; each (session, turn) is one span, so the per-span counts are per pair."""
    return tuple(
        _slice(str(int(t)), per_span.take(np.flatnonzero(run.spans.turn == t)), per_span.take(np.flatnonzero(run.spans.turn == t)),
               cost, Resampling("none", None, None), level)
        for t in np.unique(run.spans.turn) if per_span.evaluable[run.spans.turn == t, 0].sum() > 0
    )


def _by_session(run: Run, per_session: Counts, cost: Cost) -> tuple[Slice, ...]:
    """Per session: its own rates (no interval)."""
    session_rates = rates(per_session, cost.c, cost.verify_extra)
    return tuple(
        Slice(name=run.sessions[s], anchors=int(per_session.evaluable[s, 0]), sessions=1,
              value=session_rates.map(lambda a, s=s: a[s]), session_weighted=None, lo=None, hi=None, replicates=None)
        for s in range(len(run.sessions))
    )


@dataclass(frozen=True)
class SpeculativeCheck:
    """`generate --speculative K`'s own loop beside the replay of the text it wrote (the same trajectory).

    Convention (vLLM's mean acceptance length): a step emits its accepted drafts and one token more, none
    past the end of the turn, so tokens / steps counts the bonus token; a turn's first token comes from the
    prefill and is no step's. Where the loop and the replay accept the same drafts at every anchor the walk
    visits, the replay's τ_sim(K) on those turns is the loop's tokens per step exactly."""

    k: int
    requests: int  # turns the loop generated
    tokens: int  # Σ (e - s) over their spans
    steps: int  # the loop's verify steps
    replay_steps: int | None  # the simulated decode's steps at K on the same spans (None when the run's Kmax < K)
    agree: int  # steps whose accepted length equals the replay's at the same anchor
    first_difference: str | None  # where the two first disagree, for people

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else float("nan")

    @property
    def replay_tau_sim(self) -> float:
        return self.tokens / self.replay_steps if self.replay_steps else float("nan")

    @property
    def agrees(self) -> bool:
        return self.replay_steps is not None and self.agree == self.steps and self.replay_steps == self.steps


def speculative_checks(run: Run, steps: np.ndarray) -> tuple[SpeculativeCheck, ...]:
    """One check per K among the run's loops: steps [N, Kmax] are the simulated decode's per span."""
    loop = run.loop
    if loop is None:
        return ()
    span_len = run.spans.end - run.spans.start
    first_anchor = np.concatenate([[0], np.cumsum(span_len)[:-1]])  # [N] the anchor index of each span's s
    out = []
    for K in sorted(set(loop.k.tolist())):
        members = np.flatnonzero(loop.k == K)
        mine = np.isin(loop.owner, members)
        span = loop.span[loop.owner[mine]]
        anchor, accepted = loop.anchor[mine], loop.accepted[mine]
        comparable = K <= run.k
        agree, first, replay_steps = 0, None, None
        if comparable:
            replay = np.minimum(run.accepted_len[first_anchor[span] + anchor - run.spans.start[span]], K)
            agree = int((replay == accepted).sum())
            replay_steps = int(steps[loop.span[members], K - 1].sum())
            differ = np.flatnonzero(replay != accepted)
            if differ.size:
                i = int(differ[0])
                first = (f"session {run.sessions[run.spans.session[span[i]]]} request {int(run.spans.request[span[i]])} "
                         f"anchor {int(anchor[i])}: the loop kept {int(accepted[i])} drafts, the replay accepts {int(replay[i])}")
        else:
            first = f"the run replayed K <= {run.k}; replay with --k {K} or more to compare the loop's K = {K}"
        out.append(SpeculativeCheck(k=int(K), requests=int(members.size), tokens=int(span_len[loop.span[members]].sum()),
                                    steps=int(mine.sum()), replay_steps=replay_steps, agree=agree, first_difference=first))
    return tuple(out)


@dataclass(frozen=True)
class BatchSpeedup:
    """speedup(K, B) over the cost table's batch sizes, the best K at each, break-even τ and vLLM's schedule."""

    table: CostTable
    value: np.ndarray  # [NB, K] from the token-weighted τ_sim(K)
    lo: np.ndarray | None  # [NB, K] the bootstrap bounds (τ_sim's replicates through the same formula)
    hi: np.ndarray | None
    best_k: tuple[int, ...]  # [NB] argmax over K; 0 where no K beats 1
    break_even: np.ndarray  # [NB, K] the τ_sim(K) at which speedup(K, B) = 1
    schedule: tuple[tuple[int, int, int], ...]  # num_speculative_tokens_per_batch_size
    gated: tuple[int, ...]  # the batch sizes the gate is judged at
    binding: int  # the gated batch size whose verdict is the report's (its slices' cost)
    verdicts: tuple[Verdict, ...]  # [len(gated)]

    @property
    def times(self) -> StepTimes:
        return self.table.times

    @property
    def schedule_text(self) -> str:
        return "[" + ", ".join(f"[{a}, {b}, {k}]" for a, b, k in self.schedule) + "]"

    @property
    def speculative_config(self) -> dict | None:
        """vLLM's --speculative-config for the schedule (method "mtp", research A1); None when nothing pays anywhere."""
        k_max = max(k for _, _, k in self.schedule)
        if k_max == 0:
            return None
        return {"method": "mtp", "num_speculative_tokens": k_max,
                "num_speculative_tokens_per_batch_size": [list(r) for r in self.schedule]}


def batch_speedups(report: Report, table: CostTable, gated: tuple[int, int]) -> BatchSpeedup:
    """The table over batch sizes from the report's overall τ_sim, and the gate at each gated batch size."""
    times, o = table.times, report.overall
    value = batch_speedup(o.value.tau_sim, times)  # [NB, K]
    lo = hi = None
    if o.replicates is not None:
        lo, hi = percentile_interval(batch_speedup(o.replicates.tau_sim, times), report.level)
    best = tuple(best_k(value[i]) for i in range(len(times.batch)))
    ranges = schedule(times.batch, list(best))
    check_schedule(ranges, max(best) if max(best) > 0 else 0)
    lo_b, hi_b = gated
    chosen = tuple(b for b in times.batch if lo_b <= b <= hi_b)
    if not chosen:
        raise OptionError(f"--batch {lo_b}{'' if hi_b == lo_b else f'-{hi_b}'}: the cost table ({times.source}) has batch "
                          f"sizes {', '.join(map(str, times.batch))}; choose among them")
    verdicts = tuple(judge_at(report, value, lo, hi, times.batch.index(b), b if chosen != (1,) else None) for b in chosen)
    severity = {"UNRELIABLE": 0, "NO-GO": 1, "GO": 2}
    worst = min(range(len(chosen)), key=lambda i: (severity[verdicts[i].status],
                                                   verdicts[i].lower if math.isfinite(verdicts[i].lower) else -math.inf))
    return BatchSpeedup(table=table, value=value, lo=lo, hi=hi, best_k=best, break_even=break_even(times, report.k),
                        schedule=tuple(tuple(r) for r in ranges), gated=chosen, binding=chosen[worst], verdicts=verdicts)


def judge_at(report: Report, value: np.ndarray, lo: np.ndarray | None, hi: np.ndarray | None, i: int,
             b: int | None) -> Verdict:
    """The verdict with speedup(K, B) of row i in place of the slices' speedup (the same rules: judge); the reason
    names the batch size b (None: the default batch 1, said nowhere)."""
    from dataclasses import replace

    o = report.overall
    overall = replace(o, value=replace(o.value, speedup=value[i]),
                      lo=replace(o.lo, speedup=lo[i]) if o.lo is not None and lo is not None else o.lo,
                      hi=replace(o.hi, speedup=hi[i]) if o.hi is not None and hi is not None else o.hi)
    v = judge(overall, top_k(value[i]), report.verdict.gate if report.verdict.enforced else None, report.recording,
              str(report.manifest.get("status", "unknown")), len(report.sessions), report.resampling, report.facts,
              report.verdict.min_sessions)
    return v if b is None else replace(v, reason=f"at batch {b}: {v.reason}")


def summarize_at_batch(run: Run, table: CostTable, gated: tuple[int, int], **options) -> Report:
    """summarize at the binding gated batch size, with the batch table attached (the section's rules)."""
    from dataclasses import replace

    first = next((b for b in table.times.batch if gated[0] <= b <= gated[1]), 1)
    report = summarize(run, table.cost_at(first), **options)
    batch = batch_speedups(report, table, gated)
    if batch.binding != first:
        report = summarize(run, table.cost_at(batch.binding), **options)
    verdict = batch.verdicts[batch.gated.index(batch.binding)]
    notes = list(report.notes)
    if len(table.times.batch) == 1 and gated[1] > 1:
        notes.append(f"--batch {gated[0]}-{gated[1]}: the cost table has batch 1 only, so the gate is judged there")
    return replace(report, batch=batch, verdict=verdict, notes=tuple(notes))
