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
    openai-chat     openai_chat.py      Chat Completions request bodies + responses (JSON, JSON lines, cassette)
    openai-responses openai_responses.py Responses API request bodies + responses
    openai-batch    openai_batch.py     Batch input JSONL joined with its output JSONL by custom_id
    otel-genai      otel_genai.py       OpenTelemetry GenAI spans (OTLP JSON)
    litellm         litellm.py          LiteLLM StandardLoggingPayload records
    vllm-log        vllm_log.py         vLLM's request log (token ids: token-level records)
    openhands       openhands.py        OpenHands event streams and OpenAI-form trajectory rows

(chat.py holds what the OpenAI-shaped ones share: messages, tools, responses, folding.)

`auto` detects each file's format (`detect`) and refuses a file it does not recognise in one
line listing the formats. Inputs may be gzip-compressed (read through gzip whatever their name),
directories (every .json/.jsonl/.yaml/.yml/.log file below, .gz too, recursively, in sorted
order; under `auto` a file there that is no log format, or that cannot be read as one (an OpenAI
Batch input without its output file), is reported, counted and skipped, unless strict: an explicit
`--on-error fail`) or "-" for
standard input. Every session carries the same `meta` shape (common.py): importer {format,
file, record}, original, sampling, missing, supplied, dropped. Records a format drops on purpose
(failed requests, calls logged without content) are counted per file (`FileCount.dropped`).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

from ...errors import InputError, OptionError
from ..reading import SessionError, SessionIds, check_inputs, parse_record, path_labels, resolve_inputs
from . import (
    anthropic,
    claude_code,
    litellm,
    mini_swe_agent,
    openai_batch,
    openai_chat,
    openai_responses,
    openhands,
    otel_genai,
    tau2_bench,
    tau_bench,
    vllm_log,
)
from .common import Dropped, Options, Rejected, Source

READERS = {
    "tau-bench": tau_bench.read,
    "tau2-bench": tau2_bench.read,
    "mini-swe-agent": mini_swe_agent.read,
    "claude-code": claude_code.read,
    "anthropic": anthropic.read,
    "openai-chat": openai_chat.read,
    "openai-responses": openai_responses.read,
    "openai-batch": openai_batch.read,
    "otel-genai": otel_genai.read,
    "litellm": litellm.read,
    "vllm-log": vllm_log.read,
    "openhands": openhands.read,
}
FORMATS = tuple(READERS)
# Which user-supplied options each format reads (the CLI refuses an option no file can use).
OPTIONS_READ = {"tools": ("tau-bench", "tau2-bench", "claude-code", "openai-chat", "openai-responses", "openai-batch", "otel-genai",
                          "litellm", "openhands"),
                "system_template": ("tau2-bench",)}
IMPORT_SUFFIXES = tuple(s + gz for s in (".json", ".jsonl", ".yaml", ".yml", ".log") for gz in ("", ".gz"))


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
        document = source.document()
        for name, test in (("openai-responses", openai_responses.detect_cassette), ("openai-chat", openai_chat.detect_cassette),
                           ("anthropic", anthropic.detect_cassette)):
            if test(document):
                return name
        return None
    head = source.head_lines(200)
    first_text = next((t.lstrip("\ufeff").lstrip() for _, t in head if t.strip()), "")
    if first_text[:1] not in ("{", "["):
        return "vllm-log" if vllm_log.detect_lines(head) else None
    if source.is_json_lines():
        lines = source.lines()
        first = next(lines, (0, None))[1]
        lines.close()
        return _classify_record(first, lines=True)
    return _classify_record(source.document(), lines=False)


def _classify_record(obj, lines: bool) -> str | None:
    """The format of one JSON line (lines) or of a whole JSON document."""
    if not lines:
        for name, test in (("tau-bench", tau_bench.detect), ("tau2-bench", tau2_bench.detect), ("mini-swe-agent", mini_swe_agent.detect)):
            if test(obj):
                return name
    items = obj if isinstance(obj, list) and not lines else [obj]
    sample = items[0] if items else None
    if lines and claude_code.detect_event(obj):
        return "claude-code"
    if openai_batch.is_input_line(sample) or openai_batch.is_output_line(sample):
        return "openai-batch"
    if litellm.detect(sample):
        return "litellm"
    if isinstance(sample, dict) and ("resourceSpans" in sample or ("spans" in sample and isinstance(sample["spans"], list))):
        return "otel-genai"
    if openhands.detect(obj if not lines or isinstance(obj, dict) else None) or (isinstance(obj, list) and openhands.detect(sample)):
        return "openhands"
    if openai_responses.detect_body(sample):
        return "openai-responses"
    if openai_chat.detect_body(sample):
        return "openai-chat"
    if anthropic.detect_body(sample) and (lines or not isinstance(obj, list) or all(anthropic.detect_body(b) for b in obj)):
        return "anthropic"
    if openai_chat.detect_body(sample, strong=False):
        return "openai-chat"
    return "claude-code" if not lines and claude_code.detect_event(obj) else None


# ---------------------------------------------------------------------------------------------
# Converting and writing


UNREADABLE = "cannot be read as a log, skipped"  # FileCount.note of a file in a directory its reader refused


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
    dropped: Counter = field(default_factory=Counter)  # records the format drops on purpose: kind -> how many
    note: str = ""  # e.g. "output joined with its input" for an OpenAI Batch output file


def sessions_of(source: Source, fmt: str, options: Options) -> Iterator[dict | SkippedRecord | Dropped]:
    """Canonical, validated sessions of one file in `fmt` (a SkippedRecord for each record that is
    not, a Dropped for records the format leaves out on purpose).

    A session validates when the reader's `parse_record` accepts it; `line` in its messages
    is the record's position in the input, and the message names the record."""
    assert fmt in READERS, fmt
    index = 0
    try:
        for item in READERS[fmt](source, options):
            if isinstance(item, Rejected):
                yield SkippedRecord(source.name, f"{source.name}: {item.what}")
                continue
            if isinstance(item, Dropped):
                yield item
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
                 warn: Callable[[str], None] | None = None, strict: bool = False) -> list[FileCount]:
    """Convert `files` (format `fmt`, or "auto" per file) into `out`, atomically (all or nothing).

    `files` may name directories (their log files, recursively, sorted) and "-" (standard input).
    on_error "fail": the first bad record raises its InputError and nothing is written;
    "skip": it is reported through `warn`, counted, and the import goes on (a file that cannot be
    read at all is skipped whole). Under auto, a file found in a directory that cannot be read as a log (its
    reader refuses it before any session) is skipped whole and named, whatever on_error says, unless strict
    (`--on-error fail` given). Session ids follow the reader's rule (sessions.py): ids made
    from a file's name use its `path_labels` label, so two files of one name give distinct ids,
    and a repeated id is a bad record naming both places. An input with no sessions (empty, only
    blank lines, or nothing to convert) is refused whatever on_error says."""
    assert fmt == "auto" or fmt in READERS, fmt
    assert on_error in ("fail", "skip"), on_error
    check_inputs(files, missing_ok=True)  # before any work: an empty input
    counts: list[FileCount] = []
    _write_atomically(out, _lines(fmt, files, options, on_error, warn, counts, strict))
    return counts


def expand(files) -> list[tuple[Path, bool]]:
    """(file, found in a directory) for every input: directories walked for IMPORT_SUFFIXES, "-" spooled."""
    out = []
    for p in files:
        within = str(p) != "-" and Path(p).is_dir()
        out.extend((f, within) for f in resolve_inputs([p], IMPORT_SUFFIXES, what="log files"))
    return out


def _batch_outputs(fmt: str, inputs: list[tuple[Path, bool]]) -> tuple[list[tuple[Path, bool]], list[Path]]:
    """Split OpenAI Batch output files (told by their first line) from the files to convert."""
    if fmt not in ("auto", "openai-batch"):
        return inputs, []
    rest, outputs = [], []
    for path, within in inputs:
        source = Source(path)
        try:
            if source.is_yaml():
                rest.append((path, within))
                continue
            first = next(source.lines(), (0, None))[1] if source.is_json_lines() else None
        except InputError:
            first = None  # unreadable: the conversion below reports it
        (outputs.append(path) if openai_batch.is_output_line(first) else rest.append((path, within)))
    return rest, outputs


def _lines(fmt, files, options, on_error, warn, counts: list[FileCount], strict: bool = False) -> Iterator[str]:
    """The output's lines, file after file; appends one FileCount per file to `counts`."""
    ids = SessionIds()

    def skip(count: FileCount, message: str) -> None:
        if on_error == "fail":
            raise InputError(message)
        count.skipped.append(SkippedRecord(count.path, message))
        if warn is not None:
            warn(message)

    inputs, outputs = _batch_outputs(fmt, expand(files))
    if outputs:
        options = replace(options, batch_outputs=tuple(outputs))
    for p in outputs:
        counts.append(FileCount(Source(p).name, "openai-batch", note="output, joined with its input"))
    labels = path_labels([p for p, _ in inputs], stem=lambda p: Source(p).stem)
    for p, within in inputs:
        source = Source(Path(p), label=labels[str(p)])
        count = FileCount(source.name, "?")
        in_file: set[str] = set()
        counts.append(count)
        try:
            if fmt == "auto" and within:
                try:
                    count.format = detect(source)
                except InputError as e:
                    count.note = "not a log, skipped"
                    if warn is not None:
                        warn(f"{e} (found in a directory: skipped)")
                    continue
            else:
                count.format = detect(source) if fmt == "auto" else fmt
            source.check_file()
            for item in sessions_of(source, count.format, options):
                if isinstance(item, Dropped):
                    count.dropped[item.kind] += item.n
                    continue
                if not isinstance(item, SkippedRecord):
                    item = _distinct_within_file(item, in_file)
                line = item if isinstance(item, SkippedRecord) else _line(item, source)
                if not isinstance(line, SkippedRecord):  # an id is taken only by a session that is written
                    line = _repeated(item, ids, source) or line
                if isinstance(line, SkippedRecord):
                    skip(count, line.message)
                    continue
                count.sessions += 1
                yield line
        except InputError as e:
            if fmt == "auto" and within and not strict and count.sessions == 0 and not count.skipped:
                count.note = UNREADABLE  # a folder of mixed logs: this one cannot be read as a log; the others can
                if warn is not None:
                    warn(f"{e} (found in a directory: skipped)")
                continue
            if on_error == "fail":
                raise
            skip(count, str(e))  # the rest of this file cannot be read; the next file can
        if count.sessions == 0 and not count.skipped:
            message = f"holds no sessions (a {count.format} file with nothing to convert)"
            if not within:
                raise source.error(f"{message}; remove it from the inputs")
            if warn is not None:
                warn(f"{source.name}: {message} (found in a directory: skipped)")
    formats = {c.format for c in counts}
    if outputs and not any(c.format == "openai-batch" and not c.note for c in counts):
        raise InputError(f"{Source(outputs[0]).name}: an OpenAI Batch output file without its input file; give the input "
                         "file too (mtp-observe import openai-batch INPUT.jsonl OUTPUT.jsonl): the prompts are only there")
    for option, readers in OPTIONS_READ.items():  # under auto an option must meet a file that reads it
        if getattr(options, option) is not None and not formats & set(readers):
            raise OptionError(f"--{option.replace('_', '-')} applies to {', '.join(readers)}; none of the files is in such a format "
                              f"({', '.join(sorted(formats - {'?'})) or 'none read'})")
    _refuse_nothing_found(counts, files)  # after the Batch pairing's own refusal, which names the cause


def _refuse_nothing_found(counts: list[FileCount], files) -> None:
    """An import that found no session anywhere writes nothing and says why (whatever --on-error says): files that
    are no log (under auto, in a directory), records all skipped, or logs with nothing to convert."""
    if any(c.sessions for c in counts):
        return
    read = [c for c in counts if not c.note.startswith("output")]  # an OpenAI Batch output is read with its input
    not_logs = sum(c.note in ("not a log, skipped", UNREADABLE) for c in read)
    skipped = sum(len(c.skipped) for c in read)
    dropped = sum(sum(c.dropped.values()) for c in read)
    parts = [f"{not_logs} not a log format" if not_logs else "", f"{skipped} record{'s' if skipped != 1 else ''} skipped"
             if skipped else "", f"{dropped} dropped on purpose" if dropped else ""]
    detail = "; ".join(p for p in parts if p) or "nothing to convert"
    names = [c.path for c in read] or [str(f) for f in files]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    raise InputError(f"{shown}: no session found in {len(names)} file{'s' if len(names) != 1 else ''} ({detail}); "
                     "nothing was written: check FORMAT (auto detects each file's) and the files")


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


def _distinct_within_file(session: dict, seen: set[str]) -> dict:
    """Sessions an importer tells apart inside one file but whose log gives them one id (an OTel conversation
    id shared by a sub-agent's calls, a trace holding two conversations) get `#2`, `#3`, ... in the order
    the file yields them. Only within a file: the same id from two inputs is a repeat (`_repeated`), as
    the session reader has it."""
    sid, n = session["id"], 1
    while sid in seen:
        n += 1
        sid = f"{session['id']}#{n}"
    seen.add(sid)
    return session if sid == session["id"] else dict(session, id=sid)


def _repeated(session: dict, ids: SessionIds, source: Source) -> SkippedRecord | None:
    """A SkippedRecord when the session's id repeats one already written (the reader's rule), else None."""
    record = session["meta"]["importer"]["record"]
    message = ids.repeat(session["id"], f"{source.name} ({record})")
    if message is None:
        return None
    return SkippedRecord(source.name, f"{source.name}: {record}: session {session['id']}: {message}")
