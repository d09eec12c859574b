"""The commands that read a run: `report` (tables, plots, the gate), `export` (engines' inputs) and `compare` (an engine's own counters)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..errors import OptionError
from ..literal import literal
from ..report.advice import DEFAULT_MIN_SESSIONS
from .common import (
    REPORT_FORMATS,
    ReportFormat,
    Traffic,
    check_writable,
    err,
    out,
    say,
    write_output,
)


def report(
    run: Annotated[Optional[Path], typer.Argument(metavar="RUN", help="Run directory (default: the newest under reports/).")] = None,
    gate: Annotated[Optional[str], typer.Option(help="Go/no-go gate, METRIC>=X with METRIC speedup, tau_sim or alpha1; "
                                                     "judged on the 95% lower bound at the best K.")] = None,
    recorded_with: Annotated[Optional[str], typer.Option("--recorded-with", help="The profile the sessions were recorded with "
                                                         "(overrides run.json; default: the best-fitting candidate).")] = None,
    min_support: Annotated[float, typer.Option("--min-support", "--min-on-policy", help="A sampler fits the traffic only if at "
                                               "least this share of the recorded tokens is in its support.")] = 0.95,
    min_sessions: Annotated[int, typer.Option("--min-sessions", help="A verdict needs at least this many sessions "
                                              "(fewer: UNRELIABLE, the numbers shown within these sessions only).")] = DEFAULT_MIN_SESSIONS,
    fmt: Annotated[Optional[ReportFormat], typer.Option("--format", help="How the report is printed (default: table).")] = None,
    details: Annotated[bool, typer.Option("--details", help="Every table after the first screen: all τ variants, slices, "
                                          "sampler candidates, batch sizes, drafters, notes (JSON always has them).")] = False,
    plot: Annotated[Optional[Path], typer.Option(help="Write acceptance by depth and speedup vs K to this PNG.")] = None,
    baseline: Annotated[Optional[Path], typer.Option(help="Another run: show the tables as differences from it.")] = None,
    probe: Annotated[Optional[Path], typer.Option(help="probe.json from `mtp-observe probe`: measured c and v(K).")] = None,
    draft_cost: Annotated[Optional[float], typer.Option(help="c = draft step / target decode step (default: roofline).")] = None,
    heatmap: Annotated[Optional[str], typer.Option(help="Show this session's text coloured by accepted length (alone: only that; "
                                                        "with --format/--gate/--plot/--baseline/--probe/--draft-cost: after the report).")] = None,
    html: Annotated[Optional[Path], typer.Option(help="Write the --heatmap session as a standalone HTML page.")] = None,
    replicates: Annotated[int, typer.Option(help="Bootstrap resamples of sessions.")] = 1000,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
    drafter: Annotated[Optional[str], typer.Option("--drafter", help="The drafter the tables, the gate and --baseline judge "
                                                   "(default: mtp when the run has it, else its first); every drafter is ranked.")] = None,
    batch: Annotated[str, typer.Option("--batch", help="Batch size B (or a range LO-HI) where the gate is judged: "
                                                       "the verdict, best K and slices are at it.")] = "1",
    batch_sizes: Annotated[Optional[str], typer.Option("--batch-sizes", help="The speedup table's batch sizes "
                                                       "(roofline; default 1,2,4,8,16,32,64,128).")] = None,
    device_spec: Annotated[Optional[str], typer.Option("--device-spec", help="The roofline's device: h100, h200, b200, "
                                                       "a100, l40s, mi300x, or BW_GBps,TFLOPS (default h100).")] = None,
    context: Annotated[Optional[float], typer.Option("--context", help="Tokens of context per sequence for the "
                                                     "roofline (default: the run's mean anchor position).")] = None,
) -> None:
    """Acceptance, projected speedup and a go/no-go verdict for a run directory (imports no torch)."""
    from ..cost.speedup import parse_batches
    from ..report import parse_gate, read_and_summarize, report_json
    from ..report.document import dumps
    from ..report.plotting import plot as draw
    from ..report.presentation import markdown, print_rich

    report_too = heatmap is None or fmt is not None or any(x is not None for x in (gate, plot, baseline, probe, draft_cost))
    fmt = fmt or "table"
    if fmt not in REPORT_FORMATS:
        raise OptionError(f"--format {fmt}: expected one of {', '.join(REPORT_FORMATS)}")
    if html is not None and heatmap is None:
        raise OptionError("--html FILE draws the --heatmap session: add --heatmap SESSION_ID")
    check_writable(plot, "--plot", (".png",), inputs=[probe])
    check_writable(html, "--html", (".html", ".htm"), inputs=[probe])
    if heatmap is not None and html is None and fmt != "table":
        raise OptionError(f"--heatmap prints to the terminal, which --format {fmt} keeps for the report: add --html FILE")
    loaded, view = None, None
    if heatmap is not None:  # the id is checked before any computing, and the heatmap alone is all that is shown
        from ..report import load_run, newest_run
        from ..report.heatmap import session_view

        loaded = load_run(run if run is not None else newest_run("reports"), drafter)
        view = session_view(loaded, heatmap)
        if not report_too:
            _show_heatmap(view, html)
            return
    reading = read_and_summarize(run, drafter=drafter, baseline=baseline, probe=probe, draft_cost=draft_cost,
                                 gate=parse_gate(gate) if gate is not None else None, min_support=min_support,
                                 recorded_with=recorded_with, replicates=replicates, seed=seed, batch=batch,
                                 batch_sizes=parse_batches(batch_sizes) if batch_sizes is not None else None,
                                 device_spec=device_spec, context=context, loaded=loaded, min_sessions=min_sessions)
    result, comparison = reading.report, reading.comparison
    if fmt == "json":
        print(dumps(report_json(result, comparison)))
    elif fmt == "markdown":
        print(markdown(result, comparison, details), end="")
    else:
        print_rich(result, comparison, out, details)
    sys.stdout.flush()
    if plot is not None:
        write_output(plot, "--plot", lambda p: draw(result, p, comparison))
    if view is not None:
        _show_heatmap(view, html)
    raise typer.Exit(code=result.verdict.exit_code)


def _show_heatmap(view, html: Optional[Path]) -> None:
    """The --heatmap session on the terminal, or as the --html page."""
    from ..report.heatmap import html_page, print_terminal

    if html is not None:
        write_output(html, "--html", lambda p: p.write_text(html_page(view), encoding="utf-8"))
    else:
        print_terminal(view, out)


def export(
    run: Annotated[Optional[Path], typer.Argument(metavar="RUN", help="Run directory (default: the newest under reports/).")] = None,
    engine: Annotated[str, typer.Option(help="vllm, sglang, trtllm, speculation-profile or aiconfigurator.")] = "vllm",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write here (default: standard output).")] = None,
    k: Annotated[Optional[int], typer.Option("--k", help="Draft length to export (default: the verdict's K to run).")] = None,
    drafter: Annotated[Optional[str], typer.Option("--drafter", help="The drafter to export (default: the winner of the "
                                                   "report's drafter ranking that the engine can run; a run of one "
                                                   "drafter: that one).")] = None,
    gate: Annotated[Optional[str], typer.Option(help="The gate the verdict is judged on, as report --gate.")] = None,
    min_sessions: Annotated[int, typer.Option("--min-sessions", help="Sessions a verdict needs, as report --min-sessions.")]
    = DEFAULT_MIN_SESSIONS,
    recorded_with: Annotated[Optional[str], typer.Option("--recorded-with", help="The profile the sessions were recorded "
                                                         "with, as report --recorded-with.")] = None,
    min_support: Annotated[float, typer.Option("--min-support", "--min-on-policy", help="As report --min-support.")] = 0.95,
    batch: Annotated[str, typer.Option("--batch", help="Batch size B (or LO-HI) where the verdict is judged, as report --batch.")] = "1",
    device_spec: Annotated[Optional[str], typer.Option("--device-spec", help="The roofline's device, as report --device-spec.")] = None,
    batch_sizes: Annotated[Optional[str], typer.Option("--batch-sizes", help="The roofline's batch sizes, as report --batch-sizes.")] = None,
    context: Annotated[Optional[float], typer.Option("--context", help="Tokens of context for the roofline, as report --context.")] = None,
    probe: Annotated[Optional[Path], typer.Option(help="probe.json: measured c and v(K) (they choose the best K).")] = None,
    draft_cost: Annotated[Optional[float], typer.Option(help="c = draft step / target decode step (default: roofline).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Write even when the verdict is not GO at a K that pays "
                                        "(said on stderr: not recommended).")] = False,
    replicates: Annotated[int, typer.Option(help="Bootstrap resamples of sessions (the intervals written beside the values).")] = 1000,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
    tree: Annotated[Optional[str], typer.Option("--tree", metavar="S,TOPK,T", help="With --engine sglang: a tree the run "
                                                "replayed (replay --tree), its three flags and acceptance (a what-if).")] = None,
) -> None:
    """The run's acceptance as an engine's or planner's input: vLLM's speculative config (synthetic acceptance),
    SGLang's and TensorRT-LLM's simulated acceptance, Model-Optimizer's speculation_profile.json, AIConfigurator's
    nextn. It follows the verdict (said on stderr): a run that is not GO at a K that pays is refused with exit 1
    unless --force (imports no torch)."""
    from ..cost.speedup import parse_batches
    from ..engines.exports import ENGINES, export as render, export_plan
    from ..report import parse_gate, read_and_summarize
    from ..report.flags import VLLM_DRAFTERS

    if engine not in ENGINES:
        raise OptionError(f"--engine {engine}: expected one of {', '.join(ENGINES)}")
    check_writable(output, "--output", inputs=[probe])
    if tree is not None and (engine != "sglang" or k is not None):
        raise OptionError(f"--tree {tree}: a tree draft is SGLang's (--speculative-eagle-topk > 1; vLLM serves no MTP "
                          "trees): use it with --engine sglang and without --k")
    options = dict(probe=probe, draft_cost=draft_cost, replicates=replicates, seed=seed, min_sessions=min_sessions,
                   gate=parse_gate(gate) if gate is not None else None, recorded_with=recorded_with, batch=batch,
                   device_spec=device_spec, min_support=min_support, context=context,
                   batch_sizes=parse_batches(batch_sizes) if batch_sizes is not None else None)
    reading = read_and_summarize(run, drafter=drafter, **options)
    chosen = None
    if drafter is None and tree is None and len(reading.report.ranking) > 1:
        # Several drafters on the same anchors: export the ranking's winner (each at its own best K, its own cost),
        # skipping those the engine cannot run (vLLM serves mtp, ngram and suffix, not the hybrids).
        servable = [r.drafter for r in reading.report.ranking if engine != "vllm" or r.drafter in VLLM_DRAFTERS]
        best = servable[0] if servable else reading.report.drafter
        if best != reading.report.drafter:
            reading = read_and_summarize(run, drafter=best, **options)
        winner = reading.report.ranking[0].drafter
        said = "the best drafter of the run's ranking" if best == winner else \
            f"the best drafter of the run's ranking that {engine} runs ({winner} ranks first)"
        chosen = f"exporting {best}: {said}; --drafter NAME exports another"
    plan = export_plan(reading.report, k, force, tree)
    if not plan.writes:  # one line, why
        say(err, plan.lines[0])
        raise typer.Exit(code=plan.exit_code)
    text = render(reading, engine, k, tree)  # a refusal of the options is its one line, before the verdict's
    if output is not None:  # written first: a write the OS refuses is the failure's one line
        write_output(output, "--output", lambda p: p.write_text(text, encoding="utf-8"), announce=False)
    for line in ([chosen] if chosen else []) + list(plan.lines):  # the verdict first, as every output says it
        say(err, line)
    if output is None:
        sys.stdout.write(text)
    else:
        say(err, f"wrote {output}")


def compare(
    engine_metrics: Annotated[Path, typer.Option("--engine-metrics", help="What the engine measured: vLLM /metrics text, "
                                                 "vLLM responses with metrics.speculative_decoding (JSON or JSON lines), "
                                                 "or an SGLang log.")],
    run: Annotated[Optional[Path], typer.Argument(metavar="RUN", help="Run directory (default: the newest under reports/).")] = None,
    traffic: Annotated[Traffic, typer.Option("--traffic", help="same: the counters are of the very requests the run "
                                             "replayed (judged within numerics and counting noise); other: another "
                                             "sample or other traffic (a two-sample band).")] = "same",
    k: Annotated[Optional[int], typer.Option("--k", help="The engine's draft length where its file does not say "
                                             "(SGLang logs; default: the report's best K).")] = None,
    drafter: Annotated[Optional[str], typer.Option("--drafter", help="The drafter the engine ran (default: mtp when the "
                                                   "run has it, else its first).")] = None,
    min_sessions: Annotated[int, typer.Option("--min-sessions", help="Sessions the run's verdict needs, as report "
                                              "--min-sessions.")] = DEFAULT_MIN_SESSIONS,
    gate: Annotated[Optional[str], typer.Option(help="The gate the run's verdict is judged on, as report --gate.")] = None,
    recorded_with: Annotated[Optional[str], typer.Option("--recorded-with", help="The profile the sessions were recorded "
                                                         "with, as report --recorded-with.")] = None,
    min_support: Annotated[float, typer.Option("--min-support", "--min-on-policy", help="As report --min-support.")] = 0.95,
    batch: Annotated[str, typer.Option("--batch", help="Batch size B (or LO-HI) where the verdict is judged, as report --batch.")] = "1",
    device_spec: Annotated[Optional[str], typer.Option("--device-spec", help="The roofline's device, as report --device-spec.")] = None,
    batch_sizes: Annotated[Optional[str], typer.Option("--batch-sizes", help="The roofline's batch sizes, as report --batch-sizes.")] = None,
    context: Annotated[Optional[float], typer.Option("--context", help="Tokens of context for the roofline, as report --context.")] = None,
    probe: Annotated[Optional[Path], typer.Option(help="probe.json: measured c and v(K) (they choose the best K).")] = None,
    draft_cost: Annotated[Optional[float], typer.Option(help="c = draft step / target decode step (default: roofline).")] = None,
    replicates: Annotated[int, typer.Option(help="Bootstrap resamples of sessions.")] = 1000,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
) -> None:
    """The engine's own acceptance counters against the run: exit 0 when they agree, 1 when not. It opens with the
    run's verdict, judged with the options that shape it (as report's)."""
    from ..cost.speedup import parse_batches
    from ..engines.check import check
    from ..engines.exports import read_engine_metrics
    from ..errors import EngineMetricsError
    from ..report import parse_gate, read_and_summarize

    try:
        text = engine_metrics.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise EngineMetricsError(f"--engine-metrics {engine_metrics}: cannot read ({e.strerror or e})") from None
    measured = read_engine_metrics(text, str(engine_metrics))
    reading = read_and_summarize(run, drafter=drafter, probe=probe, draft_cost=draft_cost, replicates=replicates,
                                 seed=seed, min_sessions=min_sessions, gate=parse_gate(gate) if gate is not None else None,
                                 recorded_with=recorded_with, min_support=min_support, batch=batch,
                                 device_spec=device_spec, context=context,
                                 batch_sizes=parse_batches(batch_sizes) if batch_sizes is not None else None)
    result = check(reading.report, measured, k, traffic)
    v = reading.report.verdict
    say(out, f"run verdict: {v.headline}: {v.reason}")
    for line in result.warnings:
        say(err, f"warning: {line}")
    t = Table(title=literal(f"engine ({measured.detail}) against run {reading.report.path} at K={result.k}, "
                            f"--traffic {result.traffic}"))
    for c in ("number", "engine", "run", "agrees within ±", "agrees"):
        t.add_column(c, justify="left" if c == "number" else "right")
    for r in result.rows:
        t.add_row(r.name, f"{r.engine:.3f}", f"{r.run:.3f}", f"{r.half_width:.3f}", "yes" if r.within else "NO")
    out.print(t)
    if result.traffic == "other":
        say(out, f"detectable ({result.level:.0%}): {result.detectable}")
    say(out, ("AGREES: " if result.agrees else "DISAGREES: ") + result.reason)
    if result.agrees and result.note is not None:
        say(out, f"note: {result.note}")
    raise typer.Exit(code=result.exit_code)
