"""The run directory's own entries: their names, the temporaries' patterns, and what `--overwrite` may remove.

Contract (tables.py's docstring, "What this tool writes"): MANIFEST, REQUESTS, POSITIONS and LOCK are the entries
a run writes; `is_manifest` recognises run.json as this tool's; `overwrite_plan(run_dir)` checks every entry and
returns what --overwrite unlinks and removes (refusing, naming it, anything a run never writes, before anything is
deleted); `remove_temporaries` removes a killed run's half-written parts. outputs.py repeats the names so that
writing a file does not import pyarrow (tests/test_output_paths.py checks they agree).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ..errors import RunDirectoryError

MANIFEST = "run.json"
REQUESTS = "requests.parquet"
POSITIONS = "positions.parquet"
LOCK = ".mtp-observe.lock"
_PART = re.compile(r"part-\d{8}(-r\d+)?\.parquet")
_PART_TEMPORARY = re.compile(r"\.part-\d{8}(-r\d+)?\.parquet\.tmp-\d+")
_MANIFEST_TEMPORARY = re.compile(r"\.run\.json\.tmp-\d+")
_GROUP_TEMPORARY = re.compile(r"\.(requests|positions)\.parquet\.part-\d{8}(-r\d+)?\.parquet\.tmp-\d+")  # parts.py


def is_manifest(data) -> bool:
    """run.json as this tool writes it: an object with tool.name "mtp-observe" and an integer schema_version."""
    if not isinstance(data, dict):
        return False
    tool, version = data.get("tool"), data.get("schema_version")
    return (isinstance(tool, dict) and tool.get("name") == "mtp-observe" and isinstance(version, int)
            and not isinstance(version, bool))


def _refuse(run_dir: Path, path: Path, what: str) -> RunDirectoryError:
    return RunDirectoryError(f"{path}: {what}; refusing to overwrite {run_dir} (nothing was deleted) — "
                             "move it away or choose another --out")


def overwrite_plan(run_dir: Path) -> tuple[list[Path], list[Path]]:
    """(files to unlink, directories to remove after them): the run's own entries, every one checked first."""
    files: list[Path] = []
    directories: list[Path] = []
    for entry in sorted(os.scandir(run_dir), key=lambda e: e.name):
        path = Path(entry.path)
        if entry.name == LOCK:
            continue  # ours, held: released when the replay ends
        if entry.is_symlink():
            raise _refuse(run_dir, path, "is a symbolic link, which a run never writes")
        if entry.name in (REQUESTS, POSITIONS) and entry.is_dir(follow_symlinks=False):
            for part in sorted(os.scandir(path), key=lambda e: e.name):
                if part.is_symlink():
                    raise _refuse(run_dir, Path(part.path), "is a symbolic link, which a run never writes")
                if not (part.is_file(follow_symlinks=False) and (_PART.fullmatch(part.name) or _PART_TEMPORARY.fullmatch(part.name))):
                    raise _refuse(run_dir, Path(part.path), "is not a part this tool writes")
                files.append(Path(part.path))
            directories.append(path)
        elif entry.is_file(follow_symlinks=False) and (entry.name == MANIFEST or _MANIFEST_TEMPORARY.fullmatch(entry.name)
                                                       or _GROUP_TEMPORARY.fullmatch(entry.name)):
            files.append(path)
        else:
            raise _refuse(run_dir, path, "is not something a run writes")
    try:
        manifest = json.loads((run_dir / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        manifest = None
    if not is_manifest(manifest):
        raise _refuse(run_dir, run_dir / MANIFEST, "is missing or not an mtp-observe manifest (tool.name "
                                                   "'mtp-observe', an integer schema_version)")
    return files, directories


def remove_temporaries(run_dir: Path) -> None:
    """Half-written parts of a killed run (dot-prefixed temporary names, in the run directory and, from runs
    written before grouping, in the table directories; a link is unlinked, never followed)."""
    for p in Path(run_dir).iterdir():
        if _GROUP_TEMPORARY.fullmatch(p.name):
            p.unlink()
    for table in (REQUESTS, POSITIONS):
        d = Path(run_dir) / table
        if d.is_dir():
            for p in d.iterdir():
                if _PART_TEMPORARY.fullmatch(p.name):
                    p.unlink()
