"""What every importer shares: the input file, the meta shape, and the small pure helpers.

Contract: the pure converters raise only `Malformed` (with a location inside the record);
a format's `read` turns a malformed record into a `Rejected` item (the file goes on) and a
malformed file into an `InputError` (one line naming the file).
`Source` opens a file the way its format needs — a whole JSON or YAML document, or a stream
of JSON lines with their line numbers — and turns every decoding failure into one line.

The canonical session an importer yields (SESSIONS.md, OpenAI chat form):

    {"id": str, "messages": [...], "tools": [...]?, "meta": META}

META has the same six keys for every format (docs/sessions.md, "The `import` command"):

    "importer": {"format": "tau2-bench", "file": "<path as given>", "record": "simulations[3]"}
    "original": {...}     format-specific ids and labels of the record (task_id, trial, session_id, model, ...)
    "sampling": {...}     the sampling parameters the log states, under vLLM's SamplingParams names
    "missing":  [...]     what the agent saw that the log does not hold: "system_prompt", "tools",
                          "sampling" (the log states no sampling parameter), "content" (some model calls
                          of the conversation were logged without their messages)
    "supplied": {...}     what came from outside the log: {"system_prompt": PATH, "tools": PATH}
    "dropped":  {...}     what was left out and how often, e.g. {"user_tool_calls": 2}

`missing` is never filled by invention: a system prompt or tool schemas are in the output only
when the log holds them or the user supplied them (`supplied` says from where).

Sampling (`sampling_params`): the keys are vLLM's SamplingParams field names exactly —
temperature, top_p, top_k, min_p, presence_penalty, frequency_penalty, repetition_penalty, seed,
max_tokens — with plain JSON numbers (or null where the log states "none", e.g. vLLM's seed=None).
`max_completion_tokens` (Chat Completions) and `max_output_tokens` (Responses) are recorded as
max_tokens, as vLLM maps them; when a body has both, max_completion_tokens wins (vLLM's order).
top_k "off" is written 0 whichever spelling the log uses (vLLM treats 0 and -1 alike: "Set to 0 (or
-1) to consider all tokens", vllm/sampling_params.py). A parameter the log leaves unset (absent or
null in a request body) is left out: the server's default applied, and it is not in the log.
Out-of-range values (what vLLM would refuse) make the record malformed.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ...errors import InputError
from ..reading import GZIP_ERRORS, STDIN, input_name, open_binary

MISSING_KINDS = ("system_prompt", "tools", "sampling", "content")  # the order `missing` lists them in


class Malformed(ValueError):
    """A record does not have the shape its format promises; `where` locates it inside the record."""

    def __init__(self, where: str, what: str):
        self.where, self.what = where, what
        super().__init__(f"{where}: {what}" if where else what)


# ---------------------------------------------------------------------------------------------
# Reading the input file


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _check_text(obj, where: str) -> None:
    """Refuse lone surrogates (a JSON escape like \\ud800 that is not half of a pair): not Unicode."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        bad = e.object[e.start : e.end].encode("unicode_escape").decode("ascii")
        raise Malformed(where, f"a string holds a lone surrogate ({bad}), which is not Unicode text; fix that escape")
    except (TypeError, ValueError, RecursionError):
        pass  # other problems are the converters' to report, with a better location


def loads(text: str, where: str):
    """json.loads with one-line errors (Malformed) and no recursion crash or lone surrogate."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise Malformed(where, "JSON nested too deeply for the parser")
    except ValueError as e:
        msg = getattr(e, "msg", None)
        if msg is not None:
            raise Malformed(where, f"invalid JSON ({msg} at line {e.lineno} column {e.colno})")
        raise Malformed(where, f"invalid JSON ({str(e).splitlines()[0][:120]})")
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        _check_text(value, where)
    return value


@dataclass
class Source:
    """One input file (gzip-compressed or not; "-" is standard input, spooled by `sessions.resolve_inputs`).
    `document()` parses it whole (cached); `lines()` streams JSON lines; `text_lines()` streams text."""

    path: Path
    label: str | None = None  # what default ids start with instead of the stem (sessions.path_labels)
    _document: Any = field(default=None, repr=False)
    _parsed: bool = field(default=False, repr=False)

    @property
    def name(self) -> str:
        return input_name(self.path)

    @property
    def _plain_name(self) -> str:
        """The file name without a trailing .gz ("stdin" for standard input)."""
        if self.name == STDIN:
            return "stdin"
        name = self.path.name
        return name[:-3] if name.endswith(".gz") and len(name) > 3 else name

    @property
    def stem(self) -> str:
        if self.label is not None:
            return self.label
        name = self._plain_name
        for suffix in (".traj.json", ".jsonl", ".json", ".yaml", ".yml", ".log", ".txt"):
            if name.endswith(suffix) and len(name) > len(suffix):
                return name[: -len(suffix)]
        return Path(name).stem or name

    def error(self, what: str) -> InputError:
        return InputError(f"{self.name}: {what}")

    def check_file(self) -> None:
        if not self.path.is_file():
            raise self.error("no such file (or not a file); check the path")

    def _open(self):
        try:
            return open_binary(self.path)
        except InputError:
            raise self.error("cannot read it; check the path and its permissions") from None

    def _damaged(self, e: BaseException) -> InputError:
        return self.error(f"a damaged gzip file ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}); recompress or gunzip it")

    def read_bytes(self) -> bytes:
        try:
            with self._open() as f:
                return f.read()
        except GZIP_ERRORS as e:
            raise self._damaged(e)
        except OSError as e:
            raise self.error(f"cannot read ({e.strerror}); check the path and its permissions")

    def text(self) -> str:
        data = self.read_bytes()
        try:
            return data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            raise self.error(f"line {line}: not UTF-8 text ({e.reason}); re-encode the file as UTF-8")

    def is_yaml(self) -> bool:
        """A .yaml/.yml name (also .yaml.gz); standard input that starts like a VCR cassette."""
        if self._plain_name.lower().endswith((".yaml", ".yml")):
            return True
        if self.name == STDIN:
            head = next((line for _, line in self.head_lines(20) if line.strip() and not line.lstrip().startswith("#")), "")
            return head.startswith(("interactions:", "version:", "---"))
        return False

    def document(self):
        """The whole file as one JSON document (or YAML for .yaml/.yml), parsed once."""
        if not self._parsed:
            text = self.text()
            if self.is_yaml():
                self._document = _load_yaml(text, self)
            else:
                try:
                    self._document = loads(text, "")
                except Malformed as e:
                    hint = "; the file must be one JSON document" if e.what.startswith("invalid JSON") else ""
                    raise self.error(e.what + hint)
            self._parsed = True
        return self._document

    def _raw_lines(self) -> Iterator[bytes]:
        f = self._open()
        with f:
            try:
                yield from f
            except GZIP_ERRORS as e:
                raise self._damaged(e)
            except OSError as e:
                raise self.error(f"cannot read ({e.strerror}); check the path and its permissions")

    def is_json_lines(self) -> bool:
        """True when the first non-blank line is a whole JSON value and another non-blank line
        follows (JSON lines); False for one JSON document, however it is laid out."""
        raws = self._raw_lines()
        try:
            first = next((raw for raw in raws if raw.strip()), None)
            if first is None:
                return False
            try:
                loads(first.decode("utf-8-sig"), "")
            except (Malformed, UnicodeDecodeError):
                return False
            return any(raw.strip() for raw in raws)
        finally:
            raws.close()

    def head_lines(self, n: int) -> list[tuple[int, str]]:
        """The first n lines as text (undecodable bytes replaced): enough to tell a format by."""
        out = []
        raws = self._raw_lines()
        try:
            for k, raw in enumerate(raws, start=1):
                out.append((k, raw.decode("utf-8", "replace")))
                if k >= n:
                    break
        finally:
            raws.close()
        return out

    def text_lines(self) -> Iterator[tuple[int, str]]:
        """(line number, text) for every line, streamed; a line that is not UTF-8 is an InputError."""
        for n, raw in enumerate(self._raw_lines(), start=1):
            try:
                yield n, raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise self.error(f"line {n}: not UTF-8 text ({e.reason}); re-encode the file as UTF-8")

    def lines(self) -> Iterator[tuple[int, Any]]:
        """(line number, parsed JSON) for every non-blank line, streamed from disk."""
        for n, raw in enumerate(self._raw_lines(), start=1):
            try:
                text = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise self.error(f"line {n}: not UTF-8 text ({e.reason}); re-encode the file as UTF-8")
            if not text.strip():
                continue
            try:
                yield n, loads(text, "")
            except Malformed as e:
                hint = "; each line must be one JSON value" if e.what.startswith("invalid JSON") else ""
                raise self.error(f"line {n}: {e.what}{hint}")


# YAML aliases let a 1 KB file name a billion values (each alias is its anchor's whole value again): the document
# may hold at most YAML_EXPANSION times the values it writes out, plus YAML_SLACK (a dumper aliases a dict that two
# interactions share; a bomb multiplies).
YAML_EXPANSION = 10
YAML_SLACK = 10_000


def _yaml_children(node) -> list:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _check_expansion(root, source: Source) -> None:
    """Refuse a composed document whose aliases expand it past the bound, before anything is built from it. Counted
    over the node graph (each node once, iteratively); a node that contains itself counts once here (the value
    built from it is refused later: it contains itself)."""
    seen, stack = set(), [root]
    while stack:  # the nodes as written
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            stack.extend(_yaml_children(node))
    limit = YAML_EXPANSION * len(seen) + YAML_SLACK
    size: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack = [(root, False)]
    while stack:  # the nodes as the document means them: an alias is its anchor's whole subtree again
        node, closing = stack.pop()
        key = id(node)
        if closing:
            open_nodes.discard(key)
            size[key] = 1 + sum(size.get(id(child), 1) for child in _yaml_children(node))
            if size[key] > limit:
                raise source.error(f"YAML aliases expand it to more than {limit:,} values from {len(seen):,} written "
                                   "(an alias bomb?); write the file without aliases")
        elif key not in size and key not in open_nodes:
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in _yaml_children(node))


def _load_yaml(text: str, source: Source):
    import yaml

    try:
        loader = yaml.SafeLoader(text)  # yaml.safe_load, with the expansion checked between composing and building
        try:
            node = loader.get_single_node()
            if node is not None:
                _check_expansion(node, source)
            value = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        raise source.error(f"invalid YAML ({e.problem or e.context}{at}); fix the file")
    except yaml.YAMLError as e:
        raise source.error(f"invalid YAML ({str(e).splitlines()[0][:120]}); fix the file")
    except RecursionError:
        raise source.error("YAML nested too deeply; fix the file")
    except (ValueError, TypeError, OverflowError) as e:  # a scalar the YAML constructors cannot build (e.g. a bad date)
        raise source.error(f"invalid YAML value ({str(e).splitlines()[0][:120]}); fix the file")
    try:
        _check_text(value, "")
    except Malformed as e:
        raise source.error(e.what)
    return value


@dataclass(frozen=True)
class Rejected:
    """A record that could not be converted (the file goes on): what the error line says."""

    what: str  # "<location in the file>: <what is wrong>"


@dataclass(frozen=True)
class Dropped:
    """Records deliberately not converted, counted per file, not errors: a failed request, a model
    call logged without its messages, a batch request with no output line."""

    kind: str  # e.g. "failed_requests"; the import prints "N failed_requests dropped"
    n: int = 1


def each_record(records, convert_one) -> Iterator:
    """convert_one(index, record) for each record; a Malformed record becomes a Rejected item."""
    for i, record in enumerate(records):
        try:
            yield convert_one(i, record)
        except Malformed as e:
            yield Rejected(str(e))


# ---------------------------------------------------------------------------------------------
# VCR cassettes (vcrpy, pydantic-ai, OpenTelemetry's instrumentation tests)


def http_body(body, where: str, keep_text: bool = False):
    """A recorded HTTP body: already parsed, a JSON string, or vcrpy's {"string": JSON}. Text that is not
    JSON (a streamed `data: ...` body) is returned as it is when `keep_text`, else None."""
    if isinstance(body, dict) and isinstance(body.get("string"), (str, bytes)):
        body = body["string"]
    if isinstance(body, (str, bytes)):
        try:
            text = body.decode("utf-8") if isinstance(body, bytes) else body
        except UnicodeDecodeError:
            return None
        try:
            return loads(text, where)
        except Malformed:
            return text if keep_text else None
    return body


def interactions(document, strict: bool = True, keep_text: bool = False):
    """(label, uri, request body or None, response body or None) for each recorded interaction."""
    if strict:
        items = as_list(as_dict(document, "the file").get("interactions"), "interactions")
    else:
        items = document.get("interactions") if isinstance(document, dict) else None
        if not isinstance(items, list):
            return
    for i, item in enumerate(items):
        label = f"interactions[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("request"), dict):
            if strict:
                raise Malformed(label, "must be an object with a request")
            continue
        request, response = item["request"], item.get("response")
        uri = request.get("uri") if isinstance(request.get("uri"), str) else ""
        body = request.get("parsed_body") if "parsed_body" in request else http_body(request.get("body"), f"{label}.request.body")
        reply = None
        if isinstance(response, dict):
            reply = (response.get("parsed_body") if "parsed_body" in response
                     else http_body(response.get("body"), f"{label}.response.body", keep_text=keep_text))
        yield label, uri, body, reply


# ---------------------------------------------------------------------------------------------
# Small typed accessors: each failure is a Malformed naming the field


def kind(value) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def as_dict(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise Malformed(where, f"must be an object, not {kind(value)}")
    return value


def as_list(value, where: str) -> list:
    if not isinstance(value, list):
        raise Malformed(where, f"must be a list, not {kind(value)}")
    return value


def objects(value, where: str) -> Iterator[tuple[str, dict]]:
    """(where of the item, the item) for each item of a list that must hold objects."""
    for k, item in enumerate(as_list(value, where)):
        w = f"{where}[{k}]"
        yield w, as_dict(item, w)


def as_str(value, where: str, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise Malformed(where, f"must be a string, not {kind(value)}")
    return value


def scalar(value):
    """A JSON scalar kept for meta (provenance), or None for anything that is not one."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    return None


def originals(**values) -> dict:
    """meta.original: the scalar values given, without the ones that are absent or not scalars."""
    return {k: v for k, v in ((k, scalar(v)) for k, v in values.items()) if v is not None}


def join_text(parts: list[str]) -> str:
    """Several text blocks of one message become one string, blocks separated by a blank line."""
    return "\n\n".join(p for p in parts if p)


# ---------------------------------------------------------------------------------------------
# Tool schemas and tool results


MEDIA = ("image", "document")  # Anthropic content blocks that carry no text


def result_text(content, where: str, dropped: dict) -> str:
    """An Anthropic tool_result's content (a string or text/media blocks) as text; media and other
    blocks are left out and counted in `dropped` (media_blocks, unsupported_blocks)."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for w, block in objects(content, where):
        if block.get("type") == "text":
            texts.append(as_str(block.get("text"), f"{w}.text"))
        elif block.get("type") in MEDIA:
            dropped["media_blocks"] += 1
        else:
            dropped["unsupported_blocks"] += 1
    return join_text(texts)


def user_messages(content, where: str, dropped: dict) -> list[dict]:
    """An Anthropic user turn's content (a string or blocks) as messages, in order: each run of text
    blocks one `user` message, each tool_result a `tool` message; media and other blocks are left out
    and counted in `dropped`. Empty content gives no message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out, texts = [], []
    for w, block in objects(content, f"{where}.content"):
        kind = block.get("type")
        if kind == "text":
            texts.append(as_str(block.get("text"), f"{w}.text"))
        elif kind == "tool_result":
            if texts:
                out.append({"role": "user", "content": join_text(texts)})
                texts = []
            out.append({"role": "tool", "tool_call_id": as_str(block.get("tool_use_id"), f"{w}.tool_use_id"),
                        "content": result_text(block.get("content"), f"{w}.content", dropped)})
        elif kind in MEDIA:
            dropped["media_blocks"] += 1
        else:
            dropped["unsupported_blocks"] += 1
    if texts:
        out.append({"role": "user", "content": join_text(texts)})
    return out


def file_beside(path: Path, names) -> Path | None:
    """The first of `names` that is a file in `path`'s folder (names built from data may be unusable)."""
    for name in names:
        candidate = path.parent / name
        try:
            if candidate.is_file():
                return candidate
        except (OSError, ValueError):  # a name too long or holding a NUL is not there
            continue
    return None


def tools_beside(path: Path, domain) -> Path | None:
    """`tools_<domain>.openai.json` or `tools_<domain>.json` beside the input, if there."""
    if not isinstance(domain, str) or not domain or any(c in domain for c in "/\\\0"):
        return None
    return file_beside(path, (f"tools_{domain}.openai.json", f"tools_{domain}.json"))


def check_tools(tools, where: str) -> list[dict]:
    """OpenAI tool schemas: [{"type": "function", "function": {"name": str, ...}}, ...]."""
    for w, tool in objects(tools, where):
        fn = as_dict(tool.get("function"), f"{w}.function")
        if tool.get("type", "function") != "function":
            raise Malformed(f"{w}.type", f"must be \"function\", not {tool.get('type')!r}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise Malformed(f"{w}.function.name", "must be a non-empty string")
    return tools


def load_tools_file(path: Path) -> list[dict]:
    """A JSON file of OpenAI tool schemas (what --tools and a tau-bench tools file hold)."""
    source = Source(path)
    source.check_file()
    try:
        return check_tools(source.document(), "")
    except Malformed as e:
        raise source.error(f"not a list of OpenAI tool schemas ({e}); give a JSON list of {{\"type\": \"function\", \"function\": {{\"name\", \"parameters\"}}}}")


def drop_orphan_results(messages: list[dict]) -> tuple[list[dict], int]:
    """Keep tool results that follow a call with their id (the nearest preceding one pairs with
    them, as SESSIONS.md says: ids repeat); drop the others and count them. A result without
    an id pairs with the nearest call of any id, as the reader does.

    Worked example: [assistant calls a; tool a; tool b; assistant calls a; tool a] keeps both
    results for a (each pairs with the call just before it) and drops the result for b.
    """
    seen: set = set()
    kept, dropped = [], 0
    for m in messages:
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and isinstance(calls, list):  # other shapes are the reader's to refuse
            for call in calls:
                if isinstance(call, dict):
                    seen.add(_id_key(call.get("id")))
        elif m.get("role") == "tool":
            call_id = m.get("tool_call_id")
            if not (seen if call_id is None else _id_key(call_id) in seen):
                dropped += 1
                continue
        kept.append(m)
    return kept, dropped


def _id_key(value):
    """Ids compare as themselves when they are JSON scalars; any other value pairs with nothing."""
    return value if isinstance(value, (str, int, float, bool)) or value is None else object()


def meta(fmt: str, source: Source, record: str, *, original: dict, missing, supplied: dict, dropped: dict,
         sampling: dict | None = None) -> dict:
    """The six meta keys; "sampling" is recorded missing when the log states no sampling parameter."""
    sampling = sampling or {}
    missing = set(missing) | ({"sampling"} if not sampling else set())
    return {
        "importer": {"format": fmt, "file": source.name, "record": record},
        "original": original,
        "sampling": sampling,
        "missing": [k for k in MISSING_KINDS if k in missing],
        "supplied": {k: str(v) for k, v in supplied.items()},
        "dropped": {k: v for k, v in dropped.items() if v},
    }


# ---------------------------------------------------------------------------------------------
# Sampling parameters (meta.sampling)

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "seed", "max_tokens")  # vLLM SamplingParams field names
INTEGER_KEYS = ("top_k", "seed", "max_tokens")
# What vLLM accepts (SamplingParams._verify_args); a log holding anything else is malformed.
_RANGES = {
    "temperature": (lambda v: v >= 0, ">= 0"),
    "top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "top_k": (lambda v: v >= -1, ">= -1 (0 and -1 mean off)"),
    "min_p": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "presence_penalty": (lambda v: -2 <= v <= 2, "in [-2, 2]"),
    "frequency_penalty": (lambda v: -2 <= v <= 2, "in [-2, 2]"),
    "repetition_penalty": (lambda v: v > 0, "> 0"),
    "seed": (lambda v: True, ""),
    "max_tokens": (lambda v: v >= 1, ">= 1"),
}
# Other spellings of max_tokens, in the order vLLM prefers them (first present wins).
MAX_TOKENS_ALIASES = ("max_completion_tokens", "max_output_tokens", "max_tokens")


def sampling_params(values: dict, where: str, names: dict | None = None, keep_null: bool = False) -> dict:
    """meta.sampling from a log's parameters (pure). `values` maps the log's keys to its values;
    `names` renames them to vLLM's (e.g. {"gen_ai.request.temperature": "temperature"}), else the
    keys are taken as vLLM's or as an alias of max_tokens. A null value is "unset" and left out, unless
    `keep_null` (the log states the effective value, as vLLM's SamplingParams repr does).

    Worked example: {"temperature": 0.7, "top_k": -1, "max_completion_tokens": 64, "stop": ["x"]}
    -> {"temperature": 0.7, "top_k": 0, "max_tokens": 64}."""
    renamed: dict = {}
    for key, value in values.items():
        name = names.get(key) if names is not None else key
        if name in MAX_TOKENS_ALIASES:
            rank = MAX_TOKENS_ALIASES.index(name)
            if value is None and not keep_null:
                continue
            if "max_tokens" in renamed and renamed["max_tokens"][0] <= rank:
                continue
            renamed["max_tokens"] = (rank, key, value)
        elif name in SAMPLING_KEYS:
            if value is None and not keep_null:
                continue
            renamed[name] = (0, key, value)
    out = {}
    for name in SAMPLING_KEYS:  # a stable key order
        if name not in renamed:
            continue
        _, key, value = renamed[name]
        w = f"{where}.{key}" if where else key
        if value is None:
            out[name] = None
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise Malformed(w, f"must be a number, not {kind(value) if not isinstance(value, float) else value}")
        if name in INTEGER_KEYS:
            if value != int(value):
                raise Malformed(w, f"must be a whole number, not {value}")
            value = int(value)
        ok, rule = _RANGES[name]
        if not ok(value):
            raise Malformed(w, f"{value} is out of range (vLLM accepts {rule})")
        out[name] = 0 if name == "top_k" and value < 0 else value
    return out


def session(sid: str, messages: list[dict], tools: list[dict] | None, meta_: dict) -> dict:
    out = {"id": sid, "messages": messages}
    if tools:
        out["tools"] = tools
    out["meta"] = meta_
    return out


@dataclass(frozen=True)
class Options:
    """What the user may supply that a log lacks (each format says which it reads)."""

    tools: Path | None = None  # OpenAI tool schemas (JSON list)
    system_template: Path | None = None  # tau2's agent system prompt template with {domain_policy}
    batch_outputs: tuple[Path, ...] = ()  # OpenAI Batch output files given beside the inputs (import_files finds them)
