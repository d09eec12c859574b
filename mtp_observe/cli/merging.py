"""The `merge` command: the shard runs of one job checked and joined into one run directory (merge.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..wording import plural
from .common import err, out, say


def merge(
    shards: Annotated[list[Path], typer.Argument(metavar="SHARD...", help="The run directories of a job's shards (replay --shard I/N), every one of them.")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="The merged run directory to write.")],
    allow_partial: Annotated[bool, typer.Option("--allow-partial", help="Merge even with a shard missing or unfinished: what is missing is recorded in run.json and the verdict is UNRELIABLE.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the run in --out.")] = False,
) -> None:
    """Check the shard runs of one job (same model, options and inputs; every shard and session once) and join them into one run; parts are linked, not rewritten."""
    from ..run.merge import merge_runs

    summary = merge_runs(shards, out_dir, allow_partial=allow_partial, overwrite=overwrite)
    parts = f"{summary.linked:,} part files linked" + (f", {summary.copied:,} copied" if summary.copied else "")
    say(out, f"merged {summary.shards} of {plural(summary.count, 'shard')}: {plural(summary.sessions, 'session')} "
             f"({summary.skipped:,} skipped), {parts} in {summary.seconds:.1f} s into {summary.out}")
    for part, why in summary.left_out:
        say(err, f"left out {part}: {why}; its sessions are recorded as missing")
    if summary.status != "complete":
        m = summary.missing or {}
        say(err, f"partial: {len(m.get('shards', []))} shard(s) and {len(m.get('sessions', []))} session(s) missing "
                 f"(run.json merged.missing); the report's verdict is UNRELIABLE until every shard is merged")
    say(out, f"next: mtp-observe report {summary.out}")
