"""Importers: real agent logs to canonical session JSONL (SESSIONS.md).

Contract: `import_files(fmt, files, out, options)` converts every file, validates each session
with the canonical reader's own validator (`sessions.parse_record`: a session is written only
if `mtp-observe sessions` would accept it), and writes them atomically to one JSONL file, one
session per line. It raises only `UserError`s: one line naming the file, the record and the fix.

Each format is a module with the same two parts — a pure converter from the parsed input
(a document, or a stream of JSON lines) to canonical session dicts, whose docstring states
every mapping decision, and `read(source, options)` that opens the file the way the format
allows (JSON-lines formats are streamed; single-document formats are parsed whole):

    tau-bench       tau_bench.py        list of runs {task_id, trial, traj: [OpenAI messages]}
    tau2-bench      tau2_bench.py       {info, simulations: [{id, messages}]}
    mini-swe-agent  mini_swe_agent.py   {info, messages, trajectory_format}
    claude-code     claude_code.py      one Claude Code event per line
    anthropic       anthropic.py        Messages API request bodies (JSON, JSON lines, VCR cassette)

`auto` detects each file's format (`detect`) and refuses a file it does not recognise in one
line listing the formats. Every session carries the same `meta` shape (common.py):
importer {format, file, record}, original, missing, supplied, dropped.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from ..errors import InputError, OptionError
from ..sessions import SessionError, SessionIds, check_inputs, parse_record, path_labels
from . import anthropic, claude_code, mini_swe_agent, tau2_bench, tau_bench
from .common import Options, Rejected, Source

READERS = {
    "tau-bench": tau_bench.read,
    "tau2-bench": tau2_bench.read,
    "mini-swe-agent": mini_swe_agent.read,
    "claude-code": claude_code.read,
    "anthropic": anthropic.read,
}
FORMATS = tuple(READERS)
# Which user-supplied options each format reads (the CLI refuses an option no file can use).
OPTIONS_READ = {"tools": ("tau-bench", "tau2-bench", "claude-code"), "system_template": ("tau2-bench",)}


def known_formats() -> str:
    return ", ".join(FORMATS)


# ---------------------------------------------------------------------------------------------
# Detection


def detect(source: Source) -> str:
    """The format of one file, from its content; an unknown file is an InputError listing the formats."""
    source.check_file()
    try:
        fmt = _classify(source)
    except InputError as e:
        raise InputError(f"{e}; cannot tell its format (the formats are {known_formats()})") from None
    if fmt is None:
        raise source.error(f"not a log format mtp-observe imports; the formats are {known_formats()} "
                           "(name one: mtp-observe import FORMAT FILES)")
    return fmt


def _classify(source: Source) -> str | None:
    if source.is_yaml():
        return "anthropic" if anthropic.detect_cassette(source.document()) else None
    if source.is_json_lines():
        lines = source.lines()
        first = next(lines, (0, None))[1]
        lines.close()
        if claude_code.detect_event(first):
            return "claude-code"
        return "anthropic" if anthropic.detect_body(first) else None
    document = source.document()
    for name, test in (("tau-bench", tau_bench.detect), ("tau2-bench", tau2_bench.detect), ("mini-swe-agent", mini_swe_agent.detect)):
        if test(document):
            return name
    if anthropic.detect_body(document) or (isinstance(document, list) and document and all(anthropic.detect_body(b) for b in document)):
        return "anthropic"
    return "claude-code" if claude_code.detect_event(document) else None


# ---------------------------------------------------------------------------------------------
# Converting and writing


@dataclass(frozen=True)
class SkippedRecord:
    path: str
    message: str  # the one-line error


@dataclass
class FileCount:
    path: str
    format: str  # the format read ("?" when the file could not be read under on_error="skip")
    sessions: int = 0  # written
    skipped: list[SkippedRecord] = field(default_factory=list)


def sessions_of(source: Source, fmt: str, options: Options) -> Iterator[dict | SkippedRecord]:
    """Canonical, validated sessions of one file in `fmt` (a SkippedRecord for each record that is not).

    A session validates when the reader's `parse_record` accepts it; `line` in its messages
    is the record's position in the input, and the message names the record."""
    assert fmt in READERS, fmt
    index = 0
    try:
        for item in READERS[fmt](source, options):
            if isinstance(item, Rejected):
                yield SkippedRecord(source.name, f"{source.name}: {item.what}")
                continue
            try:
                parse_record(item, path=source.name, line=1, index=index, stem=source.stem)
            except SessionError as e:
                yield SkippedRecord(source.name, f"{source.name}: {item['meta']['importer']['record']}: session {item['id']}: {e.what}")
                continue
            index += 1
            yield item
    except RecursionError:
        raise source.error("data nested too deeply to convert; this is not an agent log")


def _line(session: dict, source: Source) -> str | SkippedRecord:
    """One JSONL line; a value JSON cannot hold (NaN, a lone surrogate, YAML's dates) names the record."""
    try:
        text = json.dumps(session, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")
    except UnicodeEncodeError:
        why = "a lone surrogate, which is not Unicode text"
    except ValueError as e:
        why = "NaN or Infinity, which JSON cannot hold" if "Out of range" in str(e) else "a value that contains itself (a YAML alias)"
    except TypeError:
        why = "a value JSON cannot hold (a YAML date, binary or set, or a non-string key)"
    except RecursionError:
        why = "data nested too deeply"
    else:
        return text
    return SkippedRecord(source.name, f"{source.name}: {session['meta']['importer']['record']}: session {session['id']}: holds {why}; fix the record")


def import_files(fmt: str, files, out: Path, options: Options = Options(), on_error: str = "fail",
                 warn: Callable[[str], None] | None = None) -> list[FileCount]:
    """Convert `files` (format `fmt`, or "auto" per file) into `out`, atomically (all or nothing).

    on_error "fail": the first bad record raises its InputError and nothing is written;
    "skip": it is reported through `warn`, counted, and the import goes on (a file that cannot be
    read at all is skipped whole). Session ids follow the reader's rule (sessions.py): ids made
    from a file's name use its `path_labels` label, so two files of one name give distinct ids,
    and a repeated id is a bad record naming both places. An input with no sessions (empty, only
    blank lines, or nothing to convert) is refused whatever on_error says."""
    assert fmt == "auto" or fmt in READERS, fmt
    assert on_error in ("fail", "skip"), on_error
    check_inputs(files, missing_ok=True)  # before any work: an empty input
    counts: list[FileCount] = []
    _write_atomically(out, _lines(fmt, files, options, on_error, warn, counts))
    return counts


def _lines(fmt, files, options, on_error, warn, counts: list[FileCount]) -> Iterator[str]:
    """The output's lines, file after file; appends one FileCount per file to `counts`."""
    ids = SessionIds()
    labels = path_labels(files, stem=lambda p: Source(p).stem)

    def skip(count: FileCount, message: str) -> None:
        if on_error == "fail":
            raise InputError(message)
        count.skipped.append(SkippedRecord(count.path, message))
        if warn is not None:
            warn(message)

    for p in files:
        source = Source(Path(p), label=labels[str(p)])
        count = FileCount(str(p), "?")
        counts.append(count)
        try:
            count.format = detect(source) if fmt == "auto" else fmt
            source.check_file()
            for item in sessions_of(source, count.format, options):
                line = item if isinstance(item, SkippedRecord) else _line(item, source)
                if not isinstance(line, SkippedRecord):  # an id is taken only by a session that is written
                    line = _repeated(item, ids, source) or line
                if isinstance(line, SkippedRecord):
                    skip(count, line.message)
                    continue
                count.sessions += 1
                yield line
        except InputError as e:
            if on_error == "fail":
                raise
            skip(count, str(e))  # the rest of this file cannot be read; the next file can
        if count.sessions == 0 and not count.skipped:
            raise source.error(f"holds no sessions (a {count.format} file with nothing to convert); remove it from the inputs")


def _write_atomically(out: Path, lines: Iterator[str]) -> None:
    """Write to a temporary file beside `out`, fsync, rename; on any error remove it and keep `out`."""
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")

    def cannot(e: OSError) -> OptionError:
        return OptionError(f"{out}: cannot write ({e.strerror or e}); choose another output path")

    try:
        try:
            f = open(tmp, "w", encoding="utf-8")
        except OSError as e:
            raise cannot(e) from None
        with f:
            for line in lines:  # reading errors are InputErrors raised from here
                try:
                    f.write(line + "\n")
                except OSError as e:
                    raise cannot(e) from None
            try:
                f.flush()
                os.fsync(f.fileno())
            except OSError as e:
                raise cannot(e) from None
        try:
            os.replace(tmp, out)
        except OSError as e:
            raise cannot(e) from None
    finally:
        if tmp.exists():
            tmp.unlink()


def _repeated(session: dict, ids: SessionIds, source: Source) -> SkippedRecord | None:
    """A SkippedRecord when the session's id repeats one already written (the reader's rule), else None."""
    record = session["meta"]["importer"]["record"]
    message = ids.repeat(session["id"], f"{source.name} ({record})")
    if message is None:
        return None
    return SkippedRecord(source.name, f"{source.name}: {record}: session {session['id']}: {message}")
