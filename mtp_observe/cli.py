"""The command line: each command checks its options, calls the library once, and prints.

Errors a user can cause (`errors.UserError`) become one line on stderr and exit code 2;
the traceback only with MTP_OBSERVE_DEBUG=1. Usage errors (unknown option, missing
argument) are one line too.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from .errors import OptionError, UserError

app = typer.Typer(
    name="mtp-observe",
    help="Measure how often a Qwen3.5 checkpoint's MTP draft head would be accepted on recorded sessions.",
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


@app.callback()
def _root() -> None:
    """mtp-observe: MTP draft-head acceptance on recorded sessions, as tables and a go/no-go gate."""


def human_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


@app.command()
def inspect(
    model: Annotated[Path, typer.Argument(help="Local checkpoint directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Emit the numbers as JSON.")] = False,
) -> None:
    """What the head is: tensors, shapes, bytes, borrowed weights, draft-cost roofline (headers only)."""
    from .checkpoint import read_checkpoint
    from .inventory import PRECISIONS, inventory_json, take_inventory

    inv = take_inventory(read_checkpoint(model))
    if as_json:
        print(json.dumps(inventory_json(inv), indent=2))
        return
    out.print(f"[bold]{inv.model}[/]  model_type={inv.model_type}  layout={inv.layout}")
    cfg = Table(title="config", show_header=False)
    for k, v in inv.config.items():
        cfg.add_row(k, str(v))
    out.print(cfg)
    t = Table(title=f"MTP head: {len(inv.head)} tensors")
    for c in ("tensor", "shape", "dtype", "bytes"):
        t.add_column(c, justify="right" if c == "bytes" else "left")
    for e in inv.head:
        t.add_row(e.name, str(list(e.shape)), e.dtype, f"{e.nbytes:,}")
    t.add_row("[bold]total[/]", f"{sum(e.numel for e in inv.head):,} params", "", f"[bold]{inv.head_bytes():,}[/]")
    out.print(t)
    b = Table(title="borrowed from the target (read by every draft step)")
    for c in ("tensor", "role", "shape", "dtype", "bytes"):
        b.add_column(c)
    roles = [(inv.embedding, "embedding + lm_head (tied)")] if inv.tied else [(inv.embedding, "embedding"), (inv.lm_head, "lm_head")]
    for e, role in roles:
        b.add_row(e.name, role, str(list(e.shape)), e.dtype, f"{e.nbytes:,}")
    out.print(b)
    r = Table(title="roofline draft cost c = (head + lm_head bytes) / target bytes")
    for c in ("precision", "head", "lm_head", "draft step", "target", "c"):
        r.add_column(c, justify="right")
    for p in ["stored", *PRECISIONS]:
        r.add_row(p, human_bytes(inv.head_bytes(p)), human_bytes(inv.lm_head_bytes(p)),
                  human_bytes(inv.head_bytes(p) + inv.lm_head_bytes(p)), human_bytes(inv.target_bytes(p)),
                  f"{inv.draft_cost(p):.4f}")
    out.print(r)


REPORT_FORMATS = ("table", "markdown", "json")


def check_writable(path: Optional[Path], option: str) -> None:
    """Refuse before the work, not after it, an output file whose directory does not exist."""
    if path is not None and not path.resolve().parent.is_dir():
        raise OptionError(f"{option} {path}: the directory {path.parent} does not exist; create it or choose another path")


@app.command()
def report(
    run: Annotated[Optional[Path], typer.Argument(help="Run directory (default: the newest under reports/).")] = None,
    gate: Annotated[Optional[str], typer.Option(help="Go/no-go gate, METRIC>=X with METRIC speedup, tau, tau_sim or alpha1; "
                                                     "judged on the 95% lower bound at the best K.")] = None,
    min_on_policy: Annotated[float, typer.Option(help="Below this on-policy rate the verdict is UNRELIABLE.")] = 0.9,
    fmt: Annotated[str, typer.Option("--format", help="table, markdown or json.")] = "table",
    plot: Annotated[Optional[Path], typer.Option(help="Write acceptance by depth and speedup vs K to this PNG.")] = None,
    baseline: Annotated[Optional[Path], typer.Option(help="Another run: show the tables as differences from it.")] = None,
    probe: Annotated[Optional[Path], typer.Option(help="probe.json from `mtp-observe probe`: measured c and v(K).")] = None,
    draft_cost: Annotated[Optional[float], typer.Option(help="c = draft step / target decode step (default: roofline).")] = None,
    heatmap: Annotated[Optional[str], typer.Option(help="Show this session's text coloured by accepted length.")] = None,
    html: Annotated[Optional[Path], typer.Option(help="Write the --heatmap session as a standalone HTML page.")] = None,
    replicates: Annotated[int, typer.Option(help="Bootstrap resamples of sessions.")] = 1000,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
) -> None:
    """Acceptance, projected speedup and a go/no-go verdict for a run directory (imports no torch)."""
    from .report import parse_gate, read_and_summarize, report_json
    from .render import markdown, plot as draw, print_rich

    if fmt not in REPORT_FORMATS:
        raise OptionError(f"--format {fmt}: expected one of {', '.join(REPORT_FORMATS)}")
    if html is not None and heatmap is None:
        raise OptionError("--html FILE draws the --heatmap session: add --heatmap SESSION_ID")
    check_writable(plot, "--plot")
    check_writable(html, "--html")
    if heatmap is not None and html is None and fmt != "table":
        raise OptionError(f"--heatmap prints to the terminal, which --format {fmt} keeps for the report: add --html FILE")
    reading = read_and_summarize(run, baseline=baseline, probe=probe, draft_cost=draft_cost,
                                 gate=parse_gate(gate) if gate is not None else None, min_on_policy=min_on_policy,
                                 replicates=replicates, seed=seed)
    result, comparison = reading.report, reading.comparison
    if fmt == "json":
        print(json.dumps(report_json(result, comparison), indent=2))
    elif fmt == "markdown":
        print(markdown(result, comparison), end="")
    else:
        # Piped without COLUMNS, rich would assume 80 columns and fold the intervals; a log is wider.
        wide = out if out.is_terminal or "COLUMNS" in os.environ else Console(highlight=False, width=160)
        print_rich(result, comparison, wide)
    sys.stdout.flush()
    if plot is not None:
        err.print(f"wrote {draw(result, plot, comparison)}", markup=False, soft_wrap=True)
    if heatmap is not None:
        from .heatmap import html_page, print_terminal, session_view

        view = session_view(reading.run, heatmap)
        if html is not None:
            html.write_text(html_page(view), encoding="utf-8")
            err.print(f"wrote {html}", markup=False, soft_wrap=True)
        else:
            print_terminal(view, out)
    raise typer.Exit(code=result.verdict.exit_code)


@app.command()
def probe(
    model: Annotated[Path, typer.Argument(help="Local checkpoint directory.")],
    context: Annotated[int, typer.Option(help="Tokens in the caches before each timed step.")] = 4096,
    k: Annotated[int, typer.Option("--k", help="Time the verify of K+1 tokens for K = 1..k.")] = 4,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto (bfloat16 on CUDA, float32 on CPU), float32 or bfloat16.")] = "auto",
    repeats: Annotated[int, typer.Option(help="Timed repeats; the median is reported.")] = 20,
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write probe.json.")] = Path("probe.json"),
) -> None:
    """Measured cost of one draft step, one target decode step and one verify of K+1 tokens (batch 1)."""
    from .probe import CPU_NOTE, probe as measure, probe_json
    from .tables import write_json_atomic

    check_writable(output, "--output")
    result = measure(model, context=context, k=k, device=device, dtype=dtype, repeats=repeats)
    data = probe_json(result)
    write_json_atomic(output, data)
    ms = 1e3
    roof = result.roofline
    t = Table(title=f"{model}: batch 1, context {context}, {result.device} ({result.device_name}) {result.dtype}, "
                    f"median of {repeats}")
    for c in ("step", "measured", "per decode step", f"roofline at {roof['precision']}"):
        t.add_column(c, justify="left" if c == "step" else "right")
    t.add_row("target decode (1 token)", f"{result.target_decode.median_s * ms:.3f} ms", "1",
              f"1 ({human_bytes(roof['target_bytes'])} read)")
    t.add_row("draft step (c)", f"{result.draft_step.median_s * ms:.3f} ms", f"{result.draft_cost:.4f}",
              f"{roof['draft_cost']:.4f} ({human_bytes(roof['head_bytes'] + roof['lm_head_bytes'])} read)")
    for K, (timing, extra) in enumerate(zip(result.verify, result.verify_extra()), start=1):
        t.add_row(f"verify K={K} ({K + 1} tokens)", f"{timing.median_s * ms:.3f} ms", f"{1 + extra:.4f}  (v = {extra:+.4f})", "")
    out.print(t)
    for note in result.notes:
        out.print(f"note: {note}", markup=False, soft_wrap=True, style="yellow" if note == CPU_NOTE else None)
    out.print(f"wrote {output}; use it with: mtp-observe report --probe {output}", markup=False, soft_wrap=True)


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: run the app, turning user errors into one line and exit code 2."""
    debug = os.environ.get("MTP_OBSERVE_DEBUG") == "1"
    try:
        # Without standalone mode click returns a command's typer.Exit code instead of exiting.
        code = app(args=argv, standalone_mode=False, prog_name="mtp-observe")
    except UserError as e:
        if debug:
            raise
        err.print(f"error: {e}", markup=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except Exception as e:
        # Click's own exceptions (typer may vendor click, so match by shape, not by class).
        kind = type(e).__name__
        if kind == "NoArgsIsHelpError":
            out.print(e.format_message(), markup=False, soft_wrap=True)
            sys.exit(0)
        if kind == "Exit":
            sys.exit(getattr(e, "exit_code", 0))
        if kind == "Abort":
            err.print("aborted", soft_wrap=True)
            sys.exit(130)
        if hasattr(e, "format_message") and hasattr(e, "exit_code") and not debug:
            ctx = getattr(e, "ctx", None)
            hint = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
            err.print(f"error: {e.format_message()}{hint}", markup=False, soft_wrap=True)
            sys.exit(2)
        raise
    sys.exit(code if isinstance(code, int) else 0)
