"""Sessions: recorded conversations read from JSONL, streamed and validated.

Contract: `read_sessions(paths, on_error)` yields one `Session` (or, under
on_error="skip", one `Skipped`) at a time; memory holds one session, never a whole file.
A session is validated and normalised here — roles, text-only content, reasoning under
`reasoning_content`, tool-call arguments parsed to objects, every tool result paired with
the nearest preceding call — so rendering can trust it. Nothing here knows about tokenizers.

Canonical input (SESSIONS.md), each line one of:
  1. a session       {"id"?, "messages": [...], "tools"?: [...], "meta"?: {...}}   id defaults to "<label>:<line>"
  2. a message       {"role": ...}   the whole file is then one session, id = <label>
  3. token-level     {"id"?, "prompt_token_ids": [...], "completion_token_ids": [...]}
                     or {"id"?, "requests": [{"prompt_token_ids", "completion_token_ids"}, ...]}
                     (at least one prompt token and two completion tokens per request: anchor p
                     drafts from the head's row p-1, and a one-token completion has nothing to draft)

Inputs (`resolve_inputs`): files, `.gz` files (read through gzip, told by their magic bytes),
directories (every `*.jsonl` / `*.jsonl.gz` below them, recursively, in sorted order) and `-`
for standard input (copied once to a temporary file, so a replay can hash and re-read it; it is
named `-` in every message and the manifest, and its default ids start with `stdin`).

Session identity: ids are unique within one read (a run). A file's <label> is the shortest
trailing part of its path, ending in its stem, that no other input shares (`path_labels`):
`sessions` alone, `monday/sessions` and `tuesday/sessions` for two files of that name. A
repeated id — the same explicit id in two records, or the same file given twice — is refused
naming both places (file:line and file:line), or skipped and recorded under on_error="skip";
`import` applies the same rule (`SessionIds`). Refusing rather than renaming: a repeat is most
often the same session given twice, and replaying it twice would count it twice in every rate.

An input with no sessions at all (empty, or only blank lines) is refused (`check_inputs`).
Every error is one line naming the file, the line, the session id and the fix.

A token-level record that `generate --speculative K` wrote carries meta.speculative (the loop's steps);
`speculative_steps` checks it against the record's requests for the replay to copy.
"""

from __future__ import annotations

import atexit
import gzip
import io
import json
import os
import re
import shutil
import sys
import tempfile
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from ..errors import InputError

ROLES = ("system", "user", "assistant", "tool")
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
ON_ERROR = ("fail", "skip")


@dataclass(frozen=True)
class TokenRequest:
    """One logged request: what a server saw and generated (token-level input)."""

    prompt_token_ids: tuple[int, ...]
    completion_token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Session:
    id: str
    path: str  # the file it came from
    line: int  # 1-based line of the record (the first line for a message-per-line file)
    index: int  # position in the input stream (0-based, counting skipped ones too)
    messages: tuple[dict, ...] = ()  # normalised OpenAI chat messages (empty for token-level)
    tools: tuple[dict, ...] | None = None
    meta: dict = field(default_factory=dict)
    token_requests: tuple[TokenRequest, ...] = ()  # token-level input (empty for chat sessions)

    @property
    def is_token_level(self) -> bool:
        return bool(self.token_requests)

    @property
    def assistant_turns(self) -> list[int]:
        return [i for i, m in enumerate(self.messages) if m["role"] == "assistant"]


@dataclass(frozen=True)
class Skipped:
    """A session that failed validation under on_error="skip"; the manifest records it."""

    path: str
    line: int
    session_id: str | None
    message: str  # the one-line error
    index: int
    error: object = field(default=None, compare=False, repr=False)  # the SessionError itself (inputs.py re-raises it)


class MessageError(ValueError):
    """A validation failure inside one message; `index` says which."""

    def __init__(self, index: int, what: str):
        self.index = index
        super().__init__(what)


class SessionError(InputError):
    def __init__(self, path: str, line: int, session_id: str | None, what: str):
        self.path, self.line, self.session_id, self.what = path, line, session_id, what
        sid = f" session {session_id}:" if session_id else ""
        super().__init__(f"{path}:{line}:{sid} {what}")


# ---------------------------------------------------------------------------------------------
# Normalisation of one session (pure)


def _text(content, where: str) -> str:
    """content: str | None | [{"type": "text", "text": ...}, ...] -> str."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"{where} has a non-text content part (type {kind!r}); mtp-observe scores text only — drop or replace that part")
        return "".join(parts)
    raise ValueError(f"{where} content must be a string, null or a list of text parts, not {type(content).__name__}")


def _json_type(value) -> str:
    return {list: "array", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def _tool_calls(calls, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise ValueError(f"{where} tool_calls must be a list")
    out = []
    for j, call in enumerate(calls):
        w = f"{where} tool call {j}"
        if not isinstance(call, dict):
            raise ValueError(f"{w} must be an object with a function")
        fn = call.get("function", call)
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise ValueError(f"{w} has no function name; give it function.name")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as e:
                raise ValueError(f"{w} ({name}) arguments are not valid JSON ({e.msg} at char {e.pos}); fix the arguments string")
        if not isinstance(args, dict):
            # Chat templates render arguments as name/value parameters: anything but an object would be
            # dropped from (or crash) the rendering, and no tool-calling API produces one.
            raise ValueError(f"{w} ({name}) arguments are a JSON {_json_type(args)}, not an object; "
                             'give the arguments as an object of parameters, e.g. {"query": "..."}')
        out.append({"id": call.get("id"), "type": "function", "function": {"name": name, "arguments": args}})
    return out


def normalise_messages(raw_messages) -> list[dict]:
    """Validate and normalise a message list; raises ValueError with the fix (no location)."""
    if not isinstance(raw_messages, list):
        raise ValueError("messages must be a list")
    if not raw_messages:
        raise ValueError("empty session (no messages); drop it or add its messages")
    messages: list[dict] = []
    calls_seen: list[dict] = []  # every tool call so far, in order (ids repeat in real logs)
    for i, m in enumerate(raw_messages):
        try:
            messages.append(_normalise_message(i, m, calls_seen))
        except MessageError:
            raise
        except ValueError as e:
            raise MessageError(i, str(e)) from None
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("no assistant turn to score; a session needs at least one assistant message")
    return messages


def _normalise_message(i: int, m, calls_seen: list[dict]) -> dict:
    where = f"message {i}"
    if not isinstance(m, dict):
        raise ValueError(f"{where} must be an object with a role")
    role = m.get("role")
    if role not in ROLES:
        raise ValueError(f"{where} has unknown role {role!r}; use one of {', '.join(ROLES)}")
    msg: dict = {"role": role, "content": _text(m.get("content"), where)}
    if role == "assistant":
        for key in REASONING_KEYS:
            if m.get(key) is not None:
                msg["reasoning_content"] = _text(m[key], f"{where} {key}")
                break
        if m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m["tool_calls"], where)
            calls_seen.extend(msg["tool_calls"])
    elif role == "tool":
        call_id = m.get("tool_call_id")
        matches = [c for c in calls_seen if call_id is None or c["id"] == call_id]
        if not matches:
            which = f" for tool_call_id {call_id!r}" if call_id is not None else ""
            raise ValueError(f"{where} is a tool result with no preceding call{which}; add the assistant tool call or drop the result")
        call = matches[-1]  # the nearest preceding call
        msg["tool_call_id"] = call_id if call_id is not None else call["id"]
        msg["name"] = m.get("name") or call["function"]["name"]
    return msg


def _token_ids(value, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise ValueError(f"{what} must be a list of non-negative integers")
    return tuple(value)


def _token_requests(record: dict) -> tuple[TokenRequest, ...]:
    items = record["requests"] if "requests" in record else [record]
    if not isinstance(items, list) or not items:
        raise ValueError("requests must be a non-empty list of {prompt_token_ids, completion_token_ids}")
    out = []
    for j, item in enumerate(items):
        w = f"request {j}" if "requests" in record else "record"
        if not isinstance(item, dict):
            raise ValueError(f"{w} must be an object")
        prompt = _token_ids(item.get("prompt_token_ids", []), f"{w} prompt_token_ids")
        completion = _token_ids(item.get("completion_token_ids"), f"{w} completion_token_ids")
        if not completion:
            raise ValueError(f"{w} has no completion tokens to score")
        if not prompt:
            raise ValueError(f"{w} has no prompt tokens: its first completion token has no position before it to be "
                             "drafted from (anchor p reads the head's row p-1); give the prompt, at least one token")
        if len(completion) == 1:
            raise ValueError(f"{w} has one completion token, which leaves nothing to draft (a draft is of the token "
                             "after an emitted one); give at least two completion tokens, or drop the record")
        out.append(TokenRequest(prompt, completion))
    return tuple(out)


def parse_record(record, *, path: str, line: int, index: int, stem: str) -> Session:
    """One session-per-line or token-level record -> Session. Raises SessionError."""
    sid = None
    try:
        if not isinstance(record, dict):
            raise ValueError(f"expected a JSON object, got {type(record).__name__}")
        sid = record.get("id")
        sid = str(sid) if sid is not None else f"{stem}:{line}"
        if "messages" in record:
            tools = record.get("tools")
            if tools is not None and not isinstance(tools, list):
                raise ValueError("tools must be a list of tool schemas")
            meta = record.get("meta") or {}
            if not isinstance(meta, dict):
                raise ValueError("meta must be an object")
            return Session(sid, path, line, index, tuple(normalise_messages(record["messages"])),
                           tuple(tools) if tools else None, meta)
        if "prompt_token_ids" in record or "completion_token_ids" in record or "requests" in record:
            return Session(sid, path, line, index, meta=record.get("meta") or {}, token_requests=_token_requests(record))
        if "role" in record:
            raise ValueError("a message line among session records; put each session on one line, or one session per file")
        raise ValueError("unknown record; expected an object with messages, prompt_token_ids or requests")
    except ValueError as e:
        raise SessionError(path, line, sid, str(e)) from None


# ---------------------------------------------------------------------------------------------
# Inputs: files, gzip, directories, standard input

STDIN = "-"
SESSION_SUFFIXES = (".jsonl", ".jsonl.gz")  # what a directory contributes to `sessions` and `replay`
GZIP_MAGIC = b"\x1f\x8b"
_spooled: dict[Path, str] = {}  # temporary copy of standard input -> the name messages use ("-")


def input_name(path: str | Path) -> str:
    """The name an input goes by in messages and manifests: "-" for standard input, else the path."""
    return _spooled.get(Path(path), str(path))


def input_stem(path: str | Path) -> str:
    """The file name without .gz and its format suffix ("stdin" for standard input): default ids start with it."""
    path = Path(path)
    if path in _spooled:
        return "stdin"
    name = path.name.removesuffix(".gz") if path.name.endswith(".gz") and len(path.name) > 3 else path.name
    return Path(name).stem or name


def _spool_stdin() -> Path:
    """Standard input copied (in blocks) to a temporary file, removed when the process exits."""
    fd, tmp = tempfile.mkstemp(prefix="mtp-observe-stdin-")
    path = Path(tmp)
    atexit.register(lambda: path.unlink(missing_ok=True))
    with os.fdopen(fd, "wb") as f:
        shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)
    _spooled[path] = STDIN
    return path


def resolve_inputs(paths: Iterable[str | Path], suffixes: tuple[str, ...] = SESSION_SUFFIXES, what: str = "JSONL session files") -> list[Path]:
    """Files as given, directories expanded (files ending in `suffixes`, recursively, sorted, hidden
    ones skipped), "-" spooled from standard input. A missing path is an InputError."""
    out: list[Path] = []
    stdin = None
    for p in paths:
        if str(p) == STDIN:
            stdin = stdin or _spool_stdin()  # "-" twice is the same input
            out.append(stdin)
            continue
        path = Path(p)
        if path.is_dir():
            found = sorted(f for f in path.rglob("*") if f.name.endswith(suffixes) and f.is_file()
                           and not any(part.startswith(".") for part in f.relative_to(path).parts))
            if not found:
                raise InputError(f"{path}: a directory with no {' or '.join(suffixes)} files in it; pass {what}")
            out.extend(found)
        elif path.is_file():
            out.append(path)
        else:
            raise InputError(f"{path}: no such file or directory; pass {what} (e.g. sessions/*.jsonl), a directory or - for standard input")
    return out


def open_binary(path: str | Path):
    """The file's bytes, decompressed when it starts with gzip's magic bytes (whatever its name)."""
    path = Path(path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise InputError(f"{input_name(path)}: cannot open ({e.strerror}); check the path")
    if f.peek(2)[:2] == GZIP_MAGIC if hasattr(f, "peek") else False:
        return gzip.GzipFile(fileobj=f, mode="rb")
    return f


GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)  # what reading a damaged .gz raises


# ---------------------------------------------------------------------------------------------
# Streaming


def _json_lines(path: Path) -> Iterator[tuple[int, object]]:
    """(line number, parsed JSON) for every non-blank line, streamed. Invalid JSON is a SessionError."""
    name = input_name(path)
    # Lines end at \n only (\r\n too: the \r is JSON whitespace); a raw \r is whitespace JSON allows
    # inside a value, so universal newlines would split a valid line in two.
    with io.TextIOWrapper(open_binary(path), encoding="utf-8", newline="\n") as f:
        n = 0
        while True:
            try:
                raw = f.readline()
            except UnicodeDecodeError as e:
                raise SessionError(name, n + 1, None, f"not UTF-8 text ({e.reason}); re-encode the file as UTF-8")
            except GZIP_ERRORS as e:
                raise SessionError(name, n + 1, None, f"a damaged gzip file ({type(e).__name__}: {str(e)[:80]}); recompress or gunzip it")
            if not raw:
                break
            n += 1
            if not raw.strip():
                continue
            try:
                value = json.loads(raw)
            except ValueError as e:
                msg = getattr(e, "msg", str(e))
                yield n, SessionError(name, n, None, f"invalid JSON ({msg}); fix or remove this line")
                continue
            except RecursionError:
                yield n, SessionError(name, n, None, "JSON nested too deeply to read; fix or remove this line")
                continue
            bad = _lone_surrogate(value) if _SURROGATE_ESCAPE.search(raw) else None
            if bad is not None:
                yield n, SessionError(name, n, None, f"a string holds a lone surrogate ({bad}), which is not Unicode text; fix that escape")
                continue
            yield n, value


# A \uD800-\uDFFF escape: half of a surrogate pair, or (alone) not Unicode at all, which the
# tokenizer and Parquet refuse later with a crash. Only lines holding one are checked.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _lone_surrogate(value) -> str | None:
    """The first lone surrogate in a parsed JSON value, escaped for a message; None if there is none."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        return e.object[e.start : e.end].encode("unicode_escape").decode("ascii")
    except RecursionError:
        return None  # too deep to check here; nothing this deep renders
    return None


def path_labels(paths: Iterable[str | Path], stem=lambda p: p.stem) -> dict[str, str]:
    """{path as given: label}: the shortest trailing part of each input's path, ending in its stem, that no
    other input's path ends in; with the file name (suffix kept) instead of the stem where stems alone cannot
    tell two files apart. Depends on the set of inputs only, not on their order. Paths naming the same file
    (however written) share a label, so its sessions repeat their ids. Worked example:
        a/x/s.jsonl, b/x/s.jsonl, c/t.jsonl, c/t.json  ->  a/x/s, b/x/s, t.jsonl, t.json
        sessions/day1.jsonl alone                        ->  day1
    """
    given = list(dict.fromkeys(str(p) for p in paths))
    same_file: dict[str, str] = {}  # given -> the first given path of its file
    first_of: dict[str, str] = {}
    for g in given:
        try:
            key = str(Path(g).resolve())
        except (OSError, RuntimeError):
            key = os.path.abspath(g)
        same_file[g] = first_of.setdefault(key, g)
    files = list(dict.fromkeys(same_file.values()))
    parts = {f: Path(os.path.abspath(f)).parts for f in files}

    def label(f: str, depth: int, last: str) -> str:
        return "/".join(parts[f][-depth - 1 : -1] + (last,))

    chosen: dict[str, str] = {}
    for mode in ("stem", "name"):
        pending = [f for f in files if f not in chosen]
        last = {f: stem(Path(f)) if mode == "stem" else Path(f).name for f in pending}
        for depth in range(0, max((len(parts[f]) for f in pending), default=0)):
            candidates = {f: label(f, depth, last[f]) for f in pending if f not in chosen and depth < len(parts[f])}
            counts = Counter(label(f, depth, last[f]) for f in pending if depth < len(parts[f]))
            for f, text in candidates.items():
                if counts[text] == 1:
                    chosen[f] = text
    for f in files:  # two names for one file that resolve apart only by the filesystem (a hard link): the path
        chosen.setdefault(f, os.path.abspath(f))
    repeated = Counter(chosen.values())
    for f in files:
        if repeated[chosen[f]] > 1:
            chosen[f] = os.path.abspath(f)
    return {g: chosen[same_file[g]] for g in given}


class SessionIds:
    """The session ids of one run so far, and where each came from: a repeat is refused naming both places."""

    def __init__(self):
        self.first: dict[str, str] = {}  # id -> "file:line" of its first session

    def repeat(self, session_id: str, where: str) -> str | None:
        """None for a new id (now recorded); for a repeated one, the message naming the first place."""
        first = self.first.get(session_id)
        if first is None:
            self.first[session_id] = where
            return None
        return (f"repeats the id of the session at {first} (ids are unique within a run: is a file given twice?); "
                "give the sessions distinct ids, or pass each file once")


def check_inputs(paths: Iterable[str | Path], missing_ok: bool = False) -> None:
    """Every input is a file with at least one non-blank line, before any work is done on any of them
    (missing_ok: a path that is not a file is left for the caller to report)."""
    for p in paths:
        path = Path(p)
        if str(p) == STDIN or path.is_dir():
            continue  # standard input and directories are checked as they are read (resolve_inputs, read_sessions)
        if not path.is_file():
            if missing_ok:
                continue
            raise InputError(f"{path}: no such file; pass JSONL session files (e.g. sessions/*.jsonl)")
        if not _has_a_record(path):
            raise InputError(f"{input_name(path)}: holds no sessions (the file is empty or only blank lines); remove it from the inputs")


def _has_a_record(path: Path) -> bool:
    try:
        with open_binary(path) as f:
            return any(line.strip() for line in f)
    except GZIP_ERRORS:
        return True  # a damaged .gz: read_sessions says what is wrong with it, at its line
    except OSError as e:
        raise InputError(f"{path}: cannot open ({e.strerror}); check the path")


def read_sessions(paths: Iterable[str | Path], on_error: str = "fail") -> Iterator[Session | Skipped]:
    """Stream sessions from JSONL files in order (`resolve_inputs`: .gz, directories and "-" too).
    on_error: "fail" raises; "skip" yields Skipped and goes on."""
    assert on_error in ON_ERROR, on_error
    paths = resolve_inputs(paths)
    labels = path_labels(paths, stem=input_stem)
    ids = SessionIds()
    index = 0
    for path in paths:
        lines = _json_lines(path)
        first = next(lines, None)
        if first is None:
            raise InputError(f"{input_name(path)}: holds no sessions (the file is empty or only blank lines); remove it from the inputs")
        label = labels[str(path)]
        message_file = isinstance(first[1], dict) and "role" in first[1] and "messages" not in first[1]
        stream = (_message_file(path, first, lines, index, label) if message_file
                  else _record_file(path, first, lines, index, label))
        for item in stream:
            if isinstance(item, Session):
                repeated = ids.repeat(item.id, f"{item.path}:{item.line}")
                if repeated is not None:
                    item = SessionError(item.path, item.line, item.id, repeated)
            if isinstance(item, SessionError):
                if on_error == "fail":
                    raise item
                item = Skipped(item.path, item.line, item.session_id, str(item), index, item)
            index += 1
            yield item


def _record_file(path: Path, first, lines, start_index: int, label: str):
    index = start_index
    for n, record in _chain(first, lines):
        if isinstance(record, SessionError):
            yield record
        else:
            try:
                yield parse_record(record, path=input_name(path), line=n, index=index, stem=label)
            except SessionError as e:
                yield e
        index += 1


def _message_file(path: Path, first, lines, index: int, label: str):
    """A file of message lines is one session (id = the file's label); any bad line invalidates it."""
    raw: list = []
    line_of: list[int] = []
    for n, record in _chain(first, lines):
        if isinstance(record, SessionError):
            yield SessionError(record.path, record.line, label, record.what)
            return
        if not isinstance(record, dict) or "role" not in record:
            yield SessionError(input_name(path), n, label, "a non-message line in a message-per-line file; one message per line, each with a role")
            return
        raw.append(record)
        line_of.append(n)
    try:
        messages = normalise_messages(raw)
    except MessageError as e:
        yield SessionError(input_name(path), line_of[e.index], label, str(e))
        return
    except ValueError as e:
        yield SessionError(input_name(path), first[0], label, str(e))
        return
    yield Session(label, input_name(path), first[0], index, tuple(messages))


def _chain(first, rest):
    yield first
    yield from rest


# ---------------------------------------------------------------------------------------------
# What `generate --speculative K` records beside its tokens (the report compares it with the replay)

MAX_SPECULATIVE_K = 32  # as replay's --k


def speculative_steps(session) -> list[dict] | None:
    """A token-level session's meta.speculative, checked against its requests: one {"k", "anchors",
    "accepted"} per request, or None without it. Raises SessionError naming what is wrong.

    Anchors lie in the completion's [s, e-1] (s = the prompt's length, e the last token's index), strictly
    increasing; accepted lengths are 0..k."""
    meta = session.meta if isinstance(session.meta, dict) else {}
    spec = meta.get("speculative")
    if spec is None:
        return None

    def bad(what: str):
        return SessionError(session.path, session.line, session.id, f"meta.speculative {what}; fix it or drop meta.speculative")

    if not session.is_token_level:
        raise bad("belongs to token-level records (generate writes it), not to a chat session")
    if not isinstance(spec, dict):
        raise bad("must be an object")
    k = spec.get("k")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_K:
        raise bad(f"k is {k!r}, expected an integer 1..{MAX_SPECULATIVE_K}")
    out = []
    for key in ("anchors", "accepted"):
        if not isinstance(spec.get(key), list) or len(spec[key]) != len(session.token_requests):
            raise bad(f"{key} must hold one list per request ({len(session.token_requests)})")
    for j, (request, anchors, accepted) in enumerate(zip(session.token_requests, spec["anchors"], spec["accepted"])):
        s = len(request.prompt_token_ids)
        e = s + len(request.completion_token_ids) - 1
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in list(anchors) + list(accepted)) \
            if isinstance(anchors, list) and isinstance(accepted, list) else False
        if not ints or len(anchors) != len(accepted):
            raise bad(f"request {j}: anchors and accepted must be lists of integers of one length")
        if any(not s <= p < e for p in anchors) or any(b <= a for a, b in zip(anchors, anchors[1:])):
            raise bad(f"request {j}: anchors must increase within the completion's positions {s}..{e - 1}")
        if any(not 0 <= a <= k for a in accepted):
            raise bad(f"request {j}: accepted lengths must lie in 0..{k}")
        out.append({"k": k, "anchors": list(anchors), "accepted": list(accepted)})
    return out
