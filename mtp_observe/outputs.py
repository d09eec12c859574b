"""Output files: where a command may write one, and the write itself (one mechanism for every command that writes).

Contract:
    check_output(path, option, inputs=(), kept=(), suffixes=())
        refuses (OptionError, one line, before any work) an output path that
        1. would destroy a run: run.json, requests.parquet, positions.parquet (or anything inside them), the lock
           or a run's temporaries, in any run directory (one holding run.json, a table or the lock);
        2. is one of the command's inputs: the same file (through a symbolic or hard link too), or anything inside
           an input directory the command reads whole (sessions, logs: run again, it would read its own output);
           or a file that exists in a `kept` directory (the checkpoint: config.json, weights, tokenizer files);
        3. is a directory, has the wrong suffix, or lies in a directory that does not exist or cannot be written.
    check_not_an_input(path, option, inputs)
        refuses an output (a file or a run directory) that is one of the inputs themselves (the same file or
        directory, links followed): replay --out INPUT, as check_output's rule 2 for a file
    non_finite_key(data) -> str | None
        where a JSON value to be written holds NaN or an infinity (which JSON cannot hold): run.json, the engines'
        configs and template variables are refused naming it, never written as a bare NaN
    write_atomic(path, write)
        write(temporary) beside the file, then a rename over it: a failure (a full disk, a size limit, EIO) leaves
        what was there and no temporary; the OSError is the caller's to word.

A path is judged where it leads (symbolic links followed), so `-o link-to-run.json` is refused like `-o run.json`,
and the write lands where the link points (the link stays).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Callable, Iterable, Optional

from .errors import OptionError

# A run directory's own entries. run/entries.py defines them (MANIFEST, REQUESTS, POSITIONS, LOCK and the temporaries'
# patterns); they are repeated here so that writing a file does not import pyarrow, and
# tests/test_output_paths.py checks that the two agree.
RUN_MANIFEST = "run.json"
RUN_TABLES = ("requests.parquet", "positions.parquet")
RUN_LOCK = ".mtp-observe.lock"
RUN_TEMPORARY = re.compile(r"\.(run\.json\.tmp-\d+|(requests|positions)\.parquet\.part-\d{8}(-r\d+)?\.parquet\.tmp-\d+)")


def _is_run_directory(directory: Path) -> bool:
    try:
        return any((directory / name).exists() for name in (RUN_MANIFEST, *RUN_TABLES, RUN_LOCK))
    except OSError:
        return False


def run_entry(path: Path) -> Optional[Path]:
    """The run directory whose own entry `path` is (or lies inside), else None. `path` is absolute, links resolved."""
    if path.parent != path and _is_run_directory(path.parent) and (
            path.name in (RUN_MANIFEST, *RUN_TABLES, RUN_LOCK) or RUN_TEMPORARY.fullmatch(path.name)):
        return path.parent
    for table in path.parents:  # RUN/requests.parquet/part-00000000.parquet, or deeper
        if table.name in RUN_TABLES and _is_run_directory(table.parent):
            return table.parent
    return None


def _below(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output(path: Optional[Path], option: str, inputs: Iterable = (), kept: Iterable = (),
                 suffixes: tuple[str, ...] = ()) -> None:
    """Refuse, before any work, an output path that would destroy a run or an input, or cannot be written (above)."""
    if path is None:
        return
    path = Path(path)
    if suffixes and path.suffix.lower() not in suffixes:
        raise OptionError(f"{option} {path}: expected a {' or '.join(suffixes)} file name (this option writes "
                          f"{suffixes[0].lstrip('.').upper()})")
    real = Path(os.path.realpath(path))
    beside = Path(os.path.realpath(path.parent)) / path.name  # the name itself unresolved (a hub snapshot's links)
    # 1. A run's own entries.
    run = run_entry(real) or run_entry(beside)
    if run is not None:
        entry = (real if run_entry(real) else beside).relative_to(run)
        raise OptionError(f"{option} {path}: is {entry} of the run directory {run}; writing it would destroy the run "
                          "(report, --resume and --overwrite would refuse it); choose a path outside the run's own entries")
    # 2. The command's inputs.
    for given in inputs:
        if given is None or str(given) == "-":
            continue
        source = Path(os.path.realpath(given))
        if source.is_dir():
            if _below(real, source) or _below(beside, source):
                raise OptionError(f"{option} {path}: lies inside {given}, an input directory this command reads whole "
                                  "(run again, it would read its own output); write it elsewhere")
        elif real == source or _same_file(real, source):
            raise OptionError(f"{option} {path} is one of the input files ({given}); write it elsewhere")
    for directory in kept:
        if directory is None:
            continue
        root = Path(os.path.realpath(directory))
        for candidate in (beside, real):
            if _below(candidate, root) and os.path.lexists(candidate) and not candidate.is_dir():
                raise OptionError(f"{option} {path}: is a file of {directory}, which this command reads; write it "
                                  "elsewhere")
    # 3. Something that can be written.
    if real.is_dir():
        raise OptionError(f"{option} {path}: is a directory; give a file name (e.g. {Path(path) / 'out'}"
                          f"{suffixes[0] if suffixes else ''})")
    if not real.parent.is_dir():
        raise OptionError(f"{option} {path}: the directory {path.parent} does not exist; create it or choose another path")
    if not os.access(real.parent, os.W_OK):
        raise OptionError(f"{option} {path}: cannot write in {path.parent} (not writable); choose another path")


def check_not_an_input(path: Optional[Path], option: str, inputs: Iterable = ()) -> None:
    """Refuse an output that is one of the inputs themselves (a run directory named like an input file or folder)."""
    if path is None:
        return
    real = Path(os.path.realpath(path))
    for given in inputs:
        if given is None or str(given) == "-":
            continue
        if real == Path(os.path.realpath(given)) or _same_file(real, Path(given)):
            raise OptionError(f"{option} {path} is one of the inputs ({given}); write it elsewhere")


def non_finite_key(data, where: str = "") -> str | None:
    """The first key (dotted, [i] for list items) whose value is a float NaN or infinity, else None."""
    if isinstance(data, float) and not math.isfinite(data):
        return where or "the value"
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, (list, tuple)) else ()
    for key, value in items:
        found = non_finite_key(value, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def temporary_beside(path: Path) -> Path:
    """`.NAME.tmp-PID.SUFFIX` in the directory the path leads to (the suffix kept: matplotlib reads the format
    from it)."""
    real = Path(os.path.realpath(path))
    return real.with_name(f".{real.stem}.tmp-{os.getpid()}{real.suffix}")


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """write(temporary), then rename it over `path` (where a symbolic link leads). Raises the OSError; the
    temporary is gone either way."""
    tmp = temporary_beside(path)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, os.path.realpath(path))
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
