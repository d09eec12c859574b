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

from .errors import UserError

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


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: run the app, turning user errors into one line and exit code 2."""
    debug = os.environ.get("MTP_OBSERVE_DEBUG") == "1"
    try:
        app(args=argv, standalone_mode=False, prog_name="mtp-observe")
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
    sys.exit(0)
