"""Presenting a report: rich tables for the terminal, Markdown for a CI job summary, a PNG.

Contract: `blocks(report, comparison, details)` lays the output out once — the first screen
(`first_screen`: the verdict, the K to run and its serve line or the next steps, τ_sim and the
speedup at the best K, the sampler fit, the slices that matter, one table by K), then with
--details every table (`report_tables`) and note; `print_rich` and `markdown` only draw them.
The PNG is plotting.py's. Nothing is computed here: every number comes from report.Report /
report.Comparison, and the decision (status, K to run, reason, next steps) from its Verdict.

What the user controls (session ids, run and model paths, notes quoting them) is drawn literally:
through `literal.literal` for rich, `literal.markdown_literal` for Markdown (every line and cell).
"""

from __future__ import annotations

import math

from ..literal import literal, markdown_literal, prose, visible
from ..run.tables import SEGMENTS as SEGMENT_ORDER
from ..wording import plural
from . import CONTEXT_BINS, Comparison, Delta, Report, Slice
from .flags import serve_lines, what_if_lines
from .layout import TextTable, column_groups, num, with_interval
from .metrics import CALIBRATION_TOLERANCE, Z_MAX
from .recording import candidate_stats

MAX_SESSIONS_SHOWN = 20  # the session table shows the lowest-τ_sim sessions; JSON has them all
FLAG = "⚑"


# ---------------------------------------------------------------------------------------------
# Numbers as text


def _at(r, field: str, index):
    return None if r is None else getattr(r, field)[index]


def cell(s: Slice, field: str, index) -> str:
    """A slice's value with its interval, e.g. '2.011 [1.90, 2.12]'."""
    return with_interval(getattr(s.value, field)[index], _at(s.lo, field, index), _at(s.hi, field, index))


def delta_cell(d: Delta, field: str, index, label: str) -> str:
    text = with_interval(getattr(d.value, field)[index], _at(d.lo, field, index), _at(d.hi, field, index), signed=True)
    return f"{text} {FLAG}" if label in d.flagged else text


# ---------------------------------------------------------------------------------------------
# The tables


# ---------------------------------------------------------------------------------------------
# The first screen: the verdict, the K to run, its serve line or the next steps, the numbers at the best K


INTERVAL_WORDS = {"session": "95%, resampling sessions",
                  "turn": "95%, resampling turns within these sessions only",
                  "none": "none (too few turns to resample)"}


def verdict_lines(report: Report) -> list[str]:
    """The verdict as every view opens with it: status and K to run, why (every cause), the serve lines when it
    serves, and the next steps (report/verdict.py Verdict, rendered, never re-derived)."""
    v = report.verdict
    shard = shard_of(report)
    lines = [v.headline]
    if shard is not None:
        lines.append(shard_line(shard))
    lines.append(f"why: {v.reason}")
    lines += [f"also: {c.reason}" for c in v.causes[1:]]
    lines += serve_lines(report)
    steps = ((merge_step(report.path, shard),) if shard is not None else ()) + tuple(v.next_steps)
    if steps:
        lines.append("next:")
        lines += [line for step in steps for line in step_lines(step)]
    return lines


def shard_of(report: Report) -> dict | None:
    """run.json `shard` of a run written with `replay --shard I/N` and not merged (a merged run has `merged` and no
    `shard`); None for any other run."""
    shard = report.manifest.get("shard")
    return shard if isinstance(shard, dict) and not report.manifest.get("merged") else None


def shard_line(shard: dict) -> str:
    sessions = shard.get("sessions")
    held = f", {plural(int(sessions), 'session')} of the job" if isinstance(sessions, int) else ""
    return (f"one shard: shard {shard.get('index')}/{shard.get('count')} (one of {shard.get('count')} shards{held}), "
            "not the whole job: merge the shards and report the merged run")


def merge_step(path, shard: dict) -> str:
    from .advice import merge_step as step

    return step(str(path), int(shard.get("count") or 0))


STEP_WIDTH = 100  # a step longer than this (indent included) gets its comment on a line of its own


def step_lines(step: str, width: int = STEP_WIDTH) -> list[str]:
    """A next step as printed: '  COMMAND  # what for' on one line when it fits in `width` columns, else the comment
    on its own line above the command (a terminal never wraps a pasted command in the middle of its comment)."""
    command, _, comment = step.partition("  # ")
    if not comment or len(step) + 2 <= width:
        return [f"  {step}"]
    return [f"  # {comment}", f"  {command}"]


def number_lines(report: Report, comparison: Comparison | None = None) -> list[str]:
    """The headline numbers at the best K (the one τ named there is τ_sim), the sampler fit in one line, the
    slices that matter most, the judged drafter among others, and where the run is."""
    m, o, v, k = report.manifest, report.overall, report.verdict, report.best_k
    at = batch_words(report) or " at batch 1"
    run_or_best = "the K to run" if v.run_k == k else "the best K"
    sessions = len(report.sessions)
    interval = INTERVAL_WORDS[v.interval].replace("these sessions", f"these {plural(sessions, 'session')}")
    lines = [f"at K = {k}, {run_or_best}{at}: τ_sim {cell(o, 'tau_sim', k - 1)}, speedup {cell(o, 'speedup', k - 1)}",
             f"intervals: {interval}; draft cost c = {report.cost.c:.3f} ({report.cost.source})"]
    rec = report.recording
    if rec is not None and not rec.checked:
        lines.append("sampler: not checked (no target ran)")
    elif rec is not None and rec.name is None:
        closest = max(rec.candidates, key=lambda c: c.log_likelihood, default=None)
        lines.append(f"sampler: none of {len(rec.candidates)} fits"
                     + (f"; closest {candidate_stats(closest)}" if closest is not None else ""))
    elif rec is not None:
        pick = rec.candidate(rec.name)
        lines.append(f"sampler: {rec.label} — {'fits' if rec.fits else 'DOES NOT FIT'}"
                     + (f" ({candidate_stats(pick).split(': ', 1)[1]})" if pick is not None else ""))
    lines += slice_lines(report)
    if len(report.drafters) > 1 and report.ranking:
        ranked = "; ".join(f"{r.drafter} {num(r.speedup)} at K={r.k}" for r in report.ranking)
        lines.append(f"drafters (speedup at each one's best K): {ranked}; judged: {report.drafter} (--drafter NAME)")
    if report.grammar is not None:  # replay --grammar: tool calls under their grammar (a what-if line)
        from .grammar import grammar_line

        lines.append(grammar_line(report.grammar))
    for c in report.speculative:
        state = (f"agree at all {c.steps} steps" if c.agrees else f"not compared ({c.first_difference})"
                 if c.replay_steps is None else f"DIFFER ({c.agree} of {c.steps} steps agree; first: {c.first_difference})")
        lines.append(f"speculative loop (generate --speculative {c.k}, {c.requests} turns): {num(c.tokens_per_step)} tokens "
                     f"per step over {c.steps} steps; the replay's τ_sim({c.k}) on the same turns {num(c.replay_tau_sim)} — "
                     f"{state}")
    if comparison is not None:
        d, kc = comparison.overall, min(k, comparison.k)
        lines.append(f"baseline {comparison.baseline_path}: Δspeedup at K={kc} "
                     f"{delta_cell(d, 'speedup', kc - 1, f'speedup@K={kc}')}, Δτ_sim "
                     f"{delta_cell(d, 'tau_sim', kc - 1, f'tau_sim@K={kc}')} (current - baseline; {FLAG} = its "
                     f"{report.level:.0%} interval excludes 0)")
    model = m.get("model") or {}
    where = "bundled model" if model.get("bundled") else f"model {model.get('path', '?')}"
    dtype = f" · {m['dtype']}" if m.get("dtype") else ""  # a model-free run ran no target: no dtype
    status = "" if m.get("status") == "complete" else f" · {m.get('status')}"  # another status is a cause above too
    lines.append(f"run {report.path}{status} · {plural(sessions, 'session')}, {plural(o.anchors, 'anchor')} · "
                 f"{where}{dtype} · Kmax {report.k}")
    return lines


def slice_lines(report: Report) -> list[str]:
    """The two slices that matter most, one line: the segment with the lowest depth-1 acceptance (the end-of-turn
    token aside) and the context range with the lowest τ_sim at the best K."""
    k = report.best_k
    segments = [s for s in report.segments if s.name != "end" and math.isfinite(float(s.value.alpha[0]))]
    parts = []
    if segments:
        worst = min(segments, key=lambda s: float(s.value.alpha[0]))
        best = max(segments, key=lambda s: float(s.value.alpha[0]))
        parts.append(f"worst segment {worst.name}: α_1 {cell(worst, 'alpha', 0)} ({plural(worst.anchors, 'anchor')}"
                     + (f"; best {best.name} {num(best.value.alpha[0])})" if best is not worst else ")"))
    context = [s for s in report.context if math.isfinite(float(s.value.tau_sim[k - 1]))]
    if len(context) > 1:
        worst = min(context, key=lambda s: float(s.value.tau_sim[k - 1]))
        parts.append(f"worst context {worst.name}: τ_sim {cell(worst, 'tau_sim', k - 1)}, speedup "
                     f"{cell(worst, 'speedup', k - 1)}")
    elif context:
        parts.append(f"context {context[0].name} only")
    return ["; ".join(parts)] if parts else []


def k_label(report: Report, k: int) -> str:
    """K as the tables show it: ★ the verdict's K to run; "best" the largest speedup when the verdict runs none."""
    return f"{k} ★" if k == report.verdict.run_k else (f"{k} best" if k == report.best_k else str(k))


def k_caption(report: Report) -> str:
    v = report.verdict
    if v.serves:
        return "★ the K to run"
    return f"K to run: 0; best = the largest speedup, {'not recommended' if v.status != 'GO' else 'not above 1'}"


def summary_table(report: Report, comparison: Comparison | None = None) -> TextTable:
    """τ_sim, speedup and the engine-counted mean acceptance length by K; the K to run starred."""
    o = report.overall
    title = f"by K ({k_caption(report)})"
    columns = ("K", "τ_sim(K)", "speedup", "mean acceptance length")
    rows = [(k_label(report, k), cell(o, "tau_sim", k - 1), cell(o, "speedup", k - 1), cell(o, "mean_acceptance_length", k - 1))
            for k in range(1, report.k + 1)]
    if comparison is not None:
        d = comparison.overall
        columns += ("Δspeedup vs baseline",)
        rows = [row + ((delta_cell(d, "speedup", k - 1, f"speedup@K={k}") if k <= comparison.k else "—"),)
                for k, row in enumerate(rows, start=1)]
    return TextTable(title=title, columns=columns, rows=tuple(rows))


def first_screen(report: Report, comparison: Comparison | None = None) -> list:
    """What `report` prints without --details: lines and one table (at most about 40 lines at 100 columns)."""
    notes = len(report.notes)
    more = ("more: --details (every table, τ variant, slice, sampler, batch, drafter"
            + (f"; {plural(notes, 'note')}" if notes else "") + ") or --format json")
    return [*verdict_lines(report), *number_lines(report, comparison), *best_what_if_lines(report),
            summary_table(report, comparison), more]


def best_what_if_lines(report: Report) -> list[str]:
    """The plain report's what-ifs, one line each when the run asked for them: the best tree (--tree) and the best
    what-if head (--head-precision / --draft-p-min); their tables are --details (docs/report.md)."""
    from .trees import best_tree_line

    tree = best_tree_line(report)
    lines = [tree] if tree is not None else []
    if report.whatifs is not None and report.whatifs.best is not None:
        lines.append(report.whatifs.best.line)
    return lines


def detail_lines(report: Report, comparison: Comparison | None = None) -> list[str]:
    """--details: how the numbers were made (bootstrap, cost), the schedule, the what-if serve line."""
    m = report.manifest
    o = report.overall
    plan = report.resampling
    unit = {"session": "sessions", "turn": "turns within sessions", "none": "nothing (no intervals)"}[plan.unit] if plan else "sessions"
    lines = [
        f"run {report.path}  status={m.get('status')}  model={(m.get('model') or {}).get('path', '?')}  "
        f"dtype={m.get('dtype')}  Kmax={report.k}",
        f"{plural(len(report.sessions), 'session')}, {plural(o.anchors, 'anchor')}, {plural(report.rows, 'row')}; "
        f"bootstrap {report.replicates} resamples of {unit} (seed {report.seed}), {report.level:.0%} intervals",
        f"draft cost c = {report.cost.c:.4f} ({report.cost.detail}); "
        f"v(K) = {', '.join(num(x, 3) for x in report.cost.verify_extra)}",
    ]
    if len(report.drafters) > 1:
        others = ", ".join(d.name for d in report.drafters)
        lines.append(f"drafter judged: {report.drafter} (of {others}; `report --drafter NAME` judges another); every "
                     "drafter is ranked below on the same anchors")
    said = {"sampler", "model-free"} & {c.name for c in report.verdict.causes}
    if report.recording is not None and report.recording.checked and not said:
        lines.append(f"recording sampler: {report.recording.reason}")
    k = report.best_k
    lines.append(f"at the best K = {k}{batch_words(report)}: on-policy rate (recorded token = argmax) "
                 f"{cell(o, 'on_policy', ())}; τ(K), the per-position formula over every anchor (vLLM's mean "
                 f"acceptance length formula), {cell(o, 'tau', k - 1)}; the engine-counted mean acceptance length "
                 f"{cell(o, 'mean_acceptance_length', k - 1)}")
    for c in report.verdict.causes:
        lines.append(f"UNRELIABLE, {c.name}: {c.detail}")
    lines += batch_lines(report)
    lines += what_if_lines(report)
    if comparison is not None:
        lines.append(f"baseline {comparison.baseline_path}: differences current - baseline over K <= {comparison.k}; "
                     f"{FLAG} = the difference's {report.level:.0%} interval excludes 0; {comparison.note}")
    return lines


def report_tables(report: Report, comparison: Comparison | None = None) -> list[TextTable]:
    if comparison is not None:
        return delta_tables(report, comparison)
    o, K, kb = report.overall, report.k, report.best_k
    rec = report.recording
    by_k = _by_k_table(report)
    tables = [by_k, engine_table(report)] + drafter_tables(report)
    if report.batch is not None:
        tables.append(batch_table(report))
    from .tree_tables import what_if_tables  # trees and layer rules (a what-if), when the run has them

    tables += what_if_tables(report)
    tables += whatif_tables(report)
    if rec is not None and rec.checked:
        tables.append(_recording_table(rec))
    sw = o.session_weighted
    tables.append(TextTable(
        title=f"session-weighted (mean over {plural(o.sessions, 'session')})",
        columns=("K", "α_k", "A_k", "τ_sim(K)", "τ(K) formula", "on-policy"),
        rows=tuple((str(k), num(sw.alpha[k - 1]), num(sw.accept_rate[k - 1]), num(sw.tau_sim[k - 1]), num(sw.tau[k - 1]),
                    num(sw.on_policy) if k == 1 else "") for k in range(1, K + 1)),
    ))
    tables.append(TextTable(
        title=f"by segment of the drafted token (at best K = {kb}; no τ_sim: a decode walk crosses segments)",
        columns=("segment", "anchors", "sessions", "α_1..α_K", "τ(K) formula", "τ(K) sess-w", "on-policy"),
        rows=tuple(
            (s.name, str(s.anchors), str(s.sessions), " ".join(num(a, 2) for a in s.value.alpha), cell(s, "tau", kb - 1),
             num(s.session_weighted.tau[kb - 1]), num(s.value.on_policy))
            for s in report.segments
        ),
    ))
    tables.append(TextTable(
        title=f"by context length at the anchor (at best K = {kb})",
        columns=("context", "anchors", "sessions", "α_1", "τ_sim(K)", "speedup", "τ(K) formula"),
        rows=tuple((s.name, str(s.anchors), str(s.sessions), num(s.value.alpha[0]), cell(s, "tau_sim", kb - 1),
                    cell(s, "speedup", kb - 1), num(s.value.tau[kb - 1])) for s in report.context),
        caption="rows by the anchor's position; τ_sim walks the turns that start in the range",
    ))
    tables.append(TextTable(
        title=f"by turn (at best K = {kb}; turn = index of the assistant message in its session)",
        columns=("turn", "sessions", "anchors", "α_1", "τ_sim(K)", "τ_sim(K) sess-w", "τ(K) formula", "on-policy"),
        rows=tuple(
            (s.name, str(s.sessions), str(s.anchors), num(s.value.alpha[0]), num(s.value.tau_sim[kb - 1]),
             num(s.session_weighted.tau_sim[kb - 1]), num(s.value.tau[kb - 1]), num(s.value.on_policy))
            for s in report.turns
        ),
    ))
    worst = sorted(report.sessions, key=lambda s: _sort_key(s.value.tau_sim[kb - 1]))[:MAX_SESSIONS_SHOWN]
    shown = len(worst) < len(report.sessions)
    tables.append(TextTable(
        title=f"by session (at best K = {kb})" + (f", the {len(worst)} lowest τ_sim of {len(report.sessions)}" if shown else ""),
        columns=("session", "anchors", "α_1", "τ_sim(K)", "τ(K) formula", "on-policy"),
        rows=tuple((s.name, str(s.anchors), num(s.value.alpha[0]), num(s.value.tau_sim[kb - 1]), num(s.value.tau[kb - 1]),
                    num(s.value.on_policy)) for s in worst),
        caption="every session is in --format json" if shown else "",
    ))
    return tables


def _by_k_table(report: Report) -> TextTable:
    """Acceptance and the projected speedup by K, with the what-if τ of each profile the recording sampler check
    names (every profile when it did not run; none in a version-1 run)."""
    o, K = report.overall, report.k
    profiles = report.profiles
    rec = report.recording
    shown = {c.name for c in rec.candidates} if rec is not None else set(profiles)  # `recorded` only where it means something
    what_if = [i for i, p in enumerate(profiles) if p in shown] if int(report.manifest.get("schema_version", 1)) >= 2 else []
    by_k = TextTable(
        title="acceptance and projected speedup by K (token-weighted)",
        columns=("K", "α_k", "A_k", "τ_sim(K)", "speedup", "τ(K) formula", *[f"τ_{profiles[i]} est" for i in what_if]),
        rows=tuple(
            (k_label(report, k), num(o.value.alpha[k - 1]), num(o.value.accept_rate[k - 1]),
             cell(o, "tau_sim", k - 1), cell(o, "speedup", k - 1), cell(o, "tau", k - 1),
             *[num(o.value.tau_profile[i, k - 1]) for i in what_if])
            for k in range(1, K + 1)
        ),
        caption=f"{k_caption(report)}. α_k = accepted(k) / accepted(k-1); A_k = accepted(k) / evaluable(k); τ_sim = the simulated "
                "decode of the recorded trajectory (the verdict's τ); speedup = τ_sim / (1 + K·c + v(K)); τ(K) formula = "
                "1 + Σ A_k over every anchor, vLLM's mean-acceptance-length formula per position (bonus token included; not "
                "what an engine counts, which is the mean acceptance length of the table below; higher than "
                "τ_sim when acceptance comes in bursts); τ_S est = what-if estimate under sampling profile S "
                "(the walk with S's acceptance probabilities)",
    )
    return by_k


def _recording_table(rec) -> TextTable:
    """The recording-sampler check: each candidate's support, calibration and z, the one that fits marked."""
    return TextTable(
        title=f"recording sampler ({rec.tokens:,} scored tokens): {rec.label}",
        columns=("candidate", "support", "calibration", "z", "log-lik/token", "fits"),
        rows=tuple((("→ " if c.name == rec.name else "") + c.name, num(c.support), "" if c.greedy else num(c.calibration),
                    "" if c.greedy else num(c.z, 1, signed=True), num(c.log_likelihood), "yes" if c.fits else "no")
                   for c in rec.candidates),
        caption=f"support = recorded tokens the sampler can emit; calibration = Σ q(x) / Σ Σ q² (1 on the sampler's "
                f"own traffic, > 1 on greedy traffic, < 1 on foreign text); z its standard score. Fits: support >= "
                f"{rec.min_support:g} and calibration within {CALIBRATION_TOLERANCE:g} of 1 or |z| <= {Z_MAX:g}; "
                "→ the recording sampler: declared, else the likeliest that fits",
    )


def engine_table(report: Report) -> TextTable:
    """vLLM's names for the numbers, counted as the engine counts them (over the simulated decode's steps),
    beside the all-anchor rates."""
    o, K = report.overall, report.k
    v = o.value
    return TextTable(
        title="as the engine counts them (vLLM's spec-decode metrics on this traffic, over the decode's steps)",
        columns=("K", "mean acceptance length", "draft acceptance rate", "per-position acceptance 1..K",
                 "A_1..A_K all anchors", "τ(K) all anchors"),
        rows=tuple(
            (k_label(report, k), cell(o, "mean_acceptance_length", k - 1),
             num(v.draft_acceptance_rate[k - 1]), " ".join(num(x, 2) for x in v.per_position_acceptance[k - 1, :k]),
             " ".join(num(x, 2) for x in v.accept_rate[:k]), num(v.tau[k - 1]))
            for k in range(1, K + 1)
        ),
        caption="what vLLM's /metrics will show after enabling MTP at K on this traffic: mean acceptance length = "
                "1 + num_accepted_tokens / num_drafts, draft acceptance rate = num_accepted_tokens / num_draft_tokens, "
                "per-position acceptance = num_accepted_tokens_per_pos / num_drafts, counted over the steps the "
                "simulated decode makes (a step after a rejection starts right after it), every step drafting K; the "
                "all-anchor A_k and τ(K) average over every position instead and are not what an engine counts. "
                "`mtp-observe export --engine ...` writes these numbers for the engines; `mtp-observe compare "
                "--engine-metrics` checks the engine's own against them",
    )


def drafter_tables(report: Report) -> list[TextTable]:
    """Every drafter on the same anchors (a run of more than one): the ranking, speedup by K and drafter, and each
    drafter by segment and by context length. Empty for a run of one drafter."""
    if len(report.drafters) < 2:
        return []
    by_name = {d.name: d for d in report.drafters}
    ranking = TextTable(
        title="which drafter, at which K, on this traffic (each at its best K, best first)",
        columns=("rank", "drafter", "K", "speedup", "τ_sim(K)", "c", "behind the best"),
        rows=tuple((str(i), r.drafter + (" (judged)" if r.drafter == report.drafter else ""), str(r.k),
                    with_interval(r.speedup, r.lo, r.hi), num(r.tau_sim), num(by_name[r.drafter].cost.c, 4),
                    "—" if i == 1 else with_interval(r.behind, r.behind_lo, r.behind_hi))
                   for i, r in enumerate(report.ranking, start=1)),
        caption="speedup = τ_sim(K) / (1 + K·c + v(K)) with each drafter's own c: the head's for mtp and the hybrids "
                "(they run the head at every step), 0 for ngram and suffix (CPU-side, no GPU draft step); the same v(K) "
                "for all. behind the best: the best drafter's speedup minus this one's, its interval paired over the "
                "same resampled sessions",
    )
    names = [d.name for d in report.drafters]
    by_k = []
    for k in range(1, report.k + 1):
        values = [float(d.overall.value.speedup[k - 1]) for d in report.drafters]
        finite = [v for v in values if math.isfinite(v)]
        top = max(finite) if finite else None
        by_k.append((str(k), *[num(v) + (" ★" if top is not None and v == top else "") for v in values]))
    speedups = TextTable(
        title="speedup by K and drafter (★ the best drafter at each K)",
        columns=("K", *names), rows=tuple(by_k),
        caption="suffix and the hybrids: the draft made for each K (it is not the Kmax draft cut at K); mtp and ngram: "
                "the Kmax draft's first K tokens, which is what they draft at K",
    )
    segment_rows, context_rows = [], []
    for d in report.drafters:
        kb = d.best_k
        for x in d.segments:
            segment_rows.append((x.name, d.name, str(x.anchors), " ".join(num(a, 2) for a in x.value.alpha),
                                 num(x.value.tau[kb - 1])))
        for x in d.context:
            context_rows.append((x.name, d.name, str(x.anchors), num(x.value.alpha[0]), cell(x, "tau_sim", kb - 1),
                                 cell(x, "speedup", kb - 1)))
    order = {name: i for i, name in enumerate(SEGMENT_ORDER)}
    segment_rows.sort(key=lambda r: (order.get(r[0], len(order)), names.index(r[1])))
    context_rows.sort(key=lambda r: ([n for _, _, n in CONTEXT_BINS].index(r[0]), names.index(r[1])))
    return [ranking, speedups,
            TextTable(title="drafters by segment of the drafted token (at each drafter's best K)",
                      columns=("segment", "drafter", "anchors", "α_1..α_K", "τ(K) formula"), rows=tuple(segment_rows),
                      caption="no τ_sim by segment: a decode walk crosses segments"),
            TextTable(title="drafters by context length at the anchor (at each drafter's best K)",
                      columns=("context", "drafter", "anchors", "α_1", "τ_sim(K)", "speedup"), rows=tuple(context_rows))]


def whatif_tables(report: Report) -> list[TextTable]:
    """The what-ifs of a run written with --head-precision / --draft-p-min (docs/whatifs.md): the head at each precision
    and each threshold against the head as served, and the best rule by batch size and by segment. Empty without."""
    w = report.whatifs
    if w is None or (not w.precisions and not w.thresholds):
        return []
    o, ks = report.overall, w.served_k
    at = "" if w.batch == 1 else f" at batch {w.batch}"
    tables = []
    if w.precisions:
        served = ("as served", " ".join(num(a, 2) for a in o.value.alpha), str(ks), cell(o, "tau_sim", ks - 1),
                  num(report.cost.c, 4), cell(o, "speedup", ks - 1), "—", "1.000")
        tables.append(TextTable(
            title=f"what-if: the head at other precisions, the target unchanged (each at its best K{at})",
            columns=("head", "α_1..α_K", "K", "τ_sim(K)", "c", "speedup", "vs served", "drafts = served's"),
            rows=(served,) + tuple(
                (r.precision, " ".join(num(a, 2) for a in r.alpha), str(r.k),
                 with_interval(r.tau_sim, r.tau_sim_lo, r.tau_sim_hi), num(r.c, 4),
                 with_interval(r.speedup, r.speedup_lo, r.speedup_hi), with_interval(r.gain, r.gain_lo, r.gain_hi, signed=True),
                 num(r.drafts_equal)) for r in w.precisions),
            caption="the head's weights quantised and dequantised as each format defines (the embedding and lm_head as "
                    "its usual recipe keeps them; docs/whatifs.md), re-run on the same anchors; c from its bytes on the "
                    "roofline; vs served: speedup minus the served head's at its best K, interval paired over the same "
                    "resamples. What-ifs: the verdict is about the head as served",
        ))
    if w.thresholds:
        fixed = ("fixed K", str(ks), cell(o, "tau_sim", ks - 1), cell(o, "speedup", ks - 1), "—", num(ks, 2), num(ks, 2),
                 cell(o, "mean_acceptance_length", ks - 1), cell(o, "draft_acceptance_rate", ks - 1))
        tables.append(TextTable(
            title=f"what-if: drafting that stops when the head is unsure (--draft-p-min, each at its best K{at})",
            columns=("p_min", "K", "τ_sim(K)", "speedup", "vs served", "drafts / step", "draft steps / step",
                     "mean acceptance length", "draft acceptance rate"),
            rows=(fixed,) + tuple(
                (f"{r.threshold:g}", str(r.k), with_interval(r.tau_sim, r.tau_sim_lo, r.tau_sim_hi),
                 with_interval(r.speedup, r.speedup_lo, r.speedup_hi), with_interval(r.gain, r.gain_lo, r.gain_hi, signed=True),
                 num(r.drafted_per_step, 2), num(r.draft_steps_per_step, 2), num(r.mean_acceptance_length),
                 num(r.draft_acceptance_rate)) for r in w.thresholds),
            caption="llama.cpp's rule: stop at the first draft whose probability (the head's softmax over its top 10 "
                    "logits) is below p_min, and drop it; K is the most it drafts (n_max). speedup = τ_sim / (1 + draft "
                    "steps·c + v(drafts)); the engine-counted numbers count the steps that drafted at least one token",
        ))

        def rule_rows(items):
            return tuple((x.name, str(x.tokens), str(x.fixed_k), num(x.fixed_speedup),
                          "—" if x.threshold is None else f"{x.threshold:g}", str(x.threshold_k), num(x.threshold_speedup),
                          "p_min" if x.threshold_speedup > max(x.fixed_speedup, 1.0) else "fixed K" if x.fixed_k else "none")
                         for x in items)

        columns = ("tokens", "best fixed K", "speedup", "best p_min", "K", "speedup", "pays best")
        tables.append(TextTable(title="what-if: the best fixed K and the best p_min by batch size",
                                columns=("B",) + columns, rows=rule_rows(w.by_batch),
                                caption="best fixed K 0: no K beats 1 (its speedup at the argmax K shown)"))
        tables.append(TextTable(title=f"what-if: the best fixed K and the best p_min by segment{at}",
                                columns=("segment",) + columns, rows=rule_rows(w.by_segment),
                                caption="a step counts in the segment of the first token it emits; point estimates"))
    return tables


def batch_words(report: Report) -> str:
    b = report.batch
    return "" if b is None or (len(b.times.batch) == 1 and b.binding == 1) else f" at batch {b.binding}"


def batch_lines(report: Report) -> list[str]:
    """The cost table's source and vLLM's schedule, one line each."""
    b = report.batch
    if b is None:
        return []
    gated = ", ".join(map(str, b.gated))
    config = b.speculative_config
    lines = [f"speedup by batch size: {b.times.detail}; the gate is judged at batch {gated}"
             + (f" (the binding one: {b.binding})" if len(b.gated) > 1 else "")]
    if config is None:
        lines.append("vLLM schedule: no K pays at any batch size in the table "
                     f"(num_speculative_tokens_per_batch_size {b.schedule_text}): serve without --speculative-config")
    elif not report.verdict.serves:
        lines.append(f"vLLM schedule (num_speculative_tokens_per_batch_size {b.schedule_text}): not recommended, the "
                     f"verdict is {report.verdict.status} and its K to run is 0")
    else:
        lines.append(f"vLLM schedule: --speculative-config '{json_text(config)}'")
    return lines


def json_text(data) -> str:
    import json

    return json.dumps(data, separators=(", ", ": "))


def batch_table(report: Report) -> TextTable:
    """speedup(K, B) with intervals, the best K and the break-even τ_sim per batch size."""
    b, K = report.batch, report.k
    t = b.times
    c = t.draft_cost()

    def speed(i: int, k: int) -> str:
        text = with_interval(b.value[i, k - 1], None if b.lo is None else b.lo[i, k - 1], None if b.hi is None else b.hi[i, k - 1])
        return f"{text} ★" if b.best_k[i] == k else text

    step = "ms" if t.unit == "s" else "decode steps"
    scale = 1e3 if t.unit == "s" else 1.0
    rows = []
    for i, B in enumerate(t.batch):
        bound = ""
        if t.bound is not None:
            bound = f"{t.bound[i, 0][0]}/{t.bound[i, min(K, t.q_max - 1)][0]}/{t.draft_bound[i][0]}"
        rows.append((f"{B}" + (" ◆" if B == b.binding else ""), f"{t.target[i, 0] * scale:.4g}", num(c[i], 3),
                     *[speed(i, k) for k in range(1, K + 1)], str(b.best_k[i]),
                     " / ".join(num(x, 2) for x in b.break_even[i]), *([bound] if bound else [])))
    columns = ("B", f"decode ({step})", "c_B", *[f"K={k}" for k in range(1, K + 1)], "best K", "break-even τ_sim K=1..")
    columns += ("bound",) if t.bound is not None else ()
    return TextTable(
        title=f"speedup by batch size ({t.source}; τ_sim's {report.level:.0%} intervals)",
        columns=columns, rows=tuple(rows),
        caption=("speedup(K, B) = τ_sim(K) · t_target(B,1) / (t_target(B,K+1) + K · t_draft(B)); ★ best K at B (0: no K "
                 "beats 1); ◆ where the gate is judged; c_B = t_draft(B) / t_target(B,1); break-even τ_sim = "
                 "1 + K·c_B + v_B(K), the τ_sim(K) at which speculation pays nothing"
                 + ("; bound: decode / verify of Kmax+1 tokens / draft step on the roofline, m memory-bound, c compute-bound"
                    if t.bound is not None else "")
                 + ". vLLM num_speculative_tokens_per_batch_size"
                 + ("" if report.verdict.serves else f" (not recommended: the verdict is {report.verdict.status}, its K "
                                                      "to run 0)") + f": {b.schedule_text}"),
    )


def _sort_key(x: float) -> float:
    return float(x) if math.isfinite(float(x)) else math.inf


def delta_tables(report: Report, comparison: Comparison) -> list[TextTable]:
    """The same tables as differences current - baseline, flagged where the difference's interval excludes 0."""
    d = comparison.overall
    K = comparison.k
    kb = min(report.best_k, K)
    shown = {c.name for c in report.recording.candidates} if report.recording is not None else set(comparison.profiles)
    what_if = [i for i, p in enumerate(comparison.profiles) if p in shown]
    by_k = TextTable(
        title="Δ by K (current - baseline, token-weighted)",
        columns=("K", "Δα_k", "ΔA_k", "Δτ_sim(K)", "Δspeedup", "Δτ(K) formula", *[f"Δτ_{comparison.profiles[i]} est" for i in what_if]),
        rows=tuple(
            (str(k), delta_cell(d, "alpha", k - 1, f"alpha@k={k}"), delta_cell(d, "accept_rate", k - 1, f"accept_rate@k={k}"),
             delta_cell(d, "tau_sim", k - 1, f"tau_sim@K={k}"), delta_cell(d, "speedup", k - 1, f"speedup@K={k}"),
             delta_cell(d, "tau", k - 1, f"tau@K={k}"),
             *[delta_cell(d, "tau_profile", (i, k - 1), f"tau_profile[{i}]@K={k}") for i in what_if])
            for k in range(1, K + 1)
        ),
        caption=f"Δon-policy {delta_cell(d, 'on_policy', (), 'on_policy')}; "
                f"current speedup at K={kb}: {num(report.overall.value.speedup[kb - 1])}, baseline "
                f"{num(d.baseline.value.speedup[kb - 1])}",
    )
    segments = TextTable(
        title=f"Δ by segment (at K = {kb})",
        columns=("segment", "anchors (cur / base)", "Δα_1", "Δτ(K) formula", "Δon-policy"),
        rows=tuple((s.name, f"{s.current.anchors} / {s.baseline.anchors}", delta_cell(s, "alpha", 0, "alpha@k=1"),
                    delta_cell(s, "tau", kb - 1, f"tau@K={kb}"), delta_cell(s, "on_policy", (), "on_policy"))
                   for s in comparison.segments),
    )
    context = TextTable(
        title=f"Δ by context length (at K = {kb})",
        columns=("context", "anchors (cur / base)", "Δα_1", "Δτ_sim(K)", "Δspeedup"),
        rows=tuple((s.name, f"{s.current.anchors} / {s.baseline.anchors}", delta_cell(s, "alpha", 0, "alpha@k=1"),
                    delta_cell(s, "tau_sim", kb - 1, f"tau_sim@K={kb}"), delta_cell(s, "speedup", kb - 1, f"speedup@K={kb}"))
                   for s in comparison.context),
    )
    turns = TextTable(
        title=f"Δ by turn (at K = {kb}; point estimates, not flagged)",
        columns=("turn", "anchors (cur / base)", "Δα_1", "Δτ(K)", "Δτ_sim(K)", "Δon-policy"),
        rows=tuple((s.name, f"{s.current.anchors} / {s.baseline.anchors}", num(s.value.alpha[0], signed=True),
                    num(s.value.tau[kb - 1], signed=True), num(s.value.tau_sim[kb - 1], signed=True),
                    num(s.value.on_policy, signed=True)) for s in comparison.turns),
    )
    return [by_k, segments, context, turns]


# ---------------------------------------------------------------------------------------------
# Drawing the tables


def blocks(report: Report, comparison: Comparison | None = None, details: bool = False) -> list:
    """What the report prints, in order: lines (str) and tables (TextTable); the first screen, then with details
    every table and note."""
    out = first_screen(report, comparison)
    if details:
        out += detail_lines(report, comparison) + report_tables(report, comparison) + [f"note: {n}" for n in report.notes]
    return out


def print_table(t: TextTable, console) -> None:
    from rich.table import Table

    groups = column_groups(t.columns, t.rows, console.width)
    for n, group in enumerate(groups):
        last = n == len(groups) - 1
        title = t.title if n == 0 else f"{t.title} (continued)"
        caption = (t.caption or None) if last and len(groups) == 1 else None
        table = Table(title=literal(title), caption=literal(caption) if caption else None, title_justify="left")
        for i in group:
            table.add_column(literal(t.columns[i]), justify="left" if i == 0 else "right", no_wrap=True)
        for row in t.rows:
            table.add_row(*[literal(row[i]) for i in group])
        console.print(table)
    if len(groups) > 1 and t.caption:  # the whole width, not the last part's
        prose(console, t.caption, "dim")


STATUS_STYLE = {"GO": "bold green", "NO-GO": "bold red", "UNRELIABLE": "bold yellow"}


def print_rich(report: Report, comparison: Comparison | None, console, details: bool = False) -> None:
    colour = STATUS_STYLE[report.verdict.status]
    for i, item in enumerate(blocks(report, comparison, details)):
        if isinstance(item, TextTable):
            print_table(item, console)
        else:
            style = colour if i == 0 else ("yellow" if item.startswith("note: ") else None)
            prose(console, item, style)


def markdown(report: Report, comparison: Comparison | None = None, details: bool = False) -> str:
    """GitHub-flavoured Markdown, e.g. for $GITHUB_STEP_SUMMARY: the verdict as the heading, then the same lines
    and tables as the terminal's."""
    v = report.verdict
    md = markdown_literal
    # Titles, columns and captions are this module's own text; lines (paths, commands), notes and cells (session
    # ids) carry the user's.
    items = blocks(report, comparison, details)
    out = [f"## mtp-observe: **{v.status}** · K to run {v.run_k}", "", f"**{md(items[0])}**", ""]
    for item in items[1:]:
        if isinstance(item, TextTable):
            out += ["", f"### {item.title}", "", "| " + " | ".join(item.columns) + " |",
                    "|" + "|".join(":---" if i == 0 else "---:" for i in range(len(item.columns))) + "|"]
            out += ["| " + " | ".join(md(c) for c in row) + " |" for row in item.rows]
            if item.caption:
                out += ["", f"_{item.caption}_"]
            out.append("")
        elif item.startswith("serve ") and ": " in item:  # the serve line: its command as code
            lead, command = item.split(": ", 1)
            out.append(f"- {md(lead)}: `{visible(command)}`")
        elif item.startswith("  "):  # a next-step command, or a serve line's continuation: as code
            text = visible(item.strip())
            out.append(f"    - `{text}`" if "`" not in text else f"    - {md(text)}")
        else:
            out.append(f"- {md(item)}")
    return "\n".join(out) + "\n"
