"""vllm-log: vLLM's own request log -> token-level sessions (the exact ids the model saw and wrote).

Input: a vLLM server log (text, streamed), written with `--enable-log-requests` and
`--enable-log-outputs` at `VLLM_LOGGING_LEVEL=DEBUG`. The lines, from RequestLogger
(vllm-project/vllm, vllm/entrypoints/serve/utils/request_logger.py; vllm/entrypoints/logger.py
before it), whatever prefix the logging config puts before them (`INFO 05-12 10:00:00
[logger.py:43]`, `(APIServer pid=1)`):

    Request <id> details: prompt: '<text>', prompt_token_ids: [151644, ...], prompt_embeds shape: None.
    Received request <id>: params: SamplingParams(n=1, ..., temperature=0.7, top_p=0.95, top_k=20, ...), lora_request: None.
    Request <id> JSON body: {...}
    Generated response <id>[ (streaming delta|streaming complete)] details: output_token_ids: [...]
    Generated response <id>[ (streaming ...)]: output: '<text>', finish_reason: stop

and the older single line `Received request <id>: prompt: '<text>', params: SamplingParams(...),
prompt_token_ids: [...], ...` (`sampling_params:` in v0.3).

Mapping decisions:
- Lines join on the request id. A request is `prompt_token_ids` (the exact context, template
  applied by the server) + `output_token_ids` of its `Generated response ... details` line (the
  sampled ids, the end-of-turn token included): a token-level record, scored as it was
  generated, no template. Several details lines for one id (n > 1) are several completions of
  that prompt. With streaming only `(streaming delta)` lines carry ids: they are concatenated,
  but vLLM logs a delta only when it has text (serving_chat.py), so a step that decoded to nothing
  (often the end-of-turn token) is missing — such requests are kept and marked
  `original.output_exact: false`.
- A request without prompt ids (INFO level only) or without output ids (`--enable-log-outputs`
  off, or an old vLLM that logged no outputs) cannot be replayed: refused, naming the flag.
- Truncation: `--max-log-len N` cuts the prompt text, both id lists and the body. It is known
  from the startup line holding `max_log_len` (vLLM's "non-default args" or the args Namespace),
  or from a `JSON body` line that no longer parses (cut at N characters), or from a prompt text
  exactly as long as its id list (both cut at N; 16 or more, so a tiny prompt is not taken for one). A request with an id list of length N is then
  refused: its ids are not the whole request.
- Sampling: the `SamplingParams(...)` repr (Python, not JSON) is split at its top-level commas
  and only the sampling fields — temperature, top_p, top_k, min_p, presence_penalty,
  frequency_penalty, repetition_penalty, seed, max_tokens — are read, each with
  `ast.literal_eval` (never eval); the others (stop, structured_outputs=..., enums) are not.
  They are the effective values, so seed=None and max_tokens=None are kept as null.
- Sessions: a request whose longer prompt starts with the history of an earlier request's prompt
  — its prompt up to the last occurrence of the end-of-turn token that request ended its output
  with, i.e. without the generation prompt, which templates render differently once the turn is
  history — joins that request's session as its next request (the agent resent that context);
  two samples of one prompt stay apart. The session's requests are what a serving engine's
  prefix cache would see. Every request of the
  log is held in memory (ids as 32-bit arrays) until the end of the file.
- id: the first request's id; `original` keeps every request id, the model (from the JSON body),
  and the finish reasons. Nothing is missing but what the log lacks (sampling without the
  params line).
"""

from __future__ import annotations

import ast
import json
import re
from array import array
from dataclasses import dataclass, field
from typing import Iterator

from .common import Malformed, Options, Rejected, Source, meta, sampling_params

FORMAT = "vllm-log"
RECEIVED = re.compile(r"Received request (?P<id>\S+?): (?P<rest>.*)$")
DETAILS = re.compile(r"Request (?P<id>\S+) details: (?P<rest>prompt: .*)$")
BODY = re.compile(r"Request (?P<id>\S+) JSON body: (?P<rest>.*)$")
OUTPUT_IDS = re.compile(r"Generated response (?P<id>\S+?)(?P<stream> \(streaming (?:delta|complete)\))? details: output_token_ids: (?P<rest>.*)$")
OUTPUT = re.compile(r"Generated response (?P<id>\S+?)(?P<stream> \(streaming (?:delta|complete)\))?: output: (?P<rest>.*)$")
MAX_LOG_LEN = re.compile(r"max_log_len['\"]?\s*[:=]\s*(\d+)")
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
                   "seed", "max_tokens")


def detect_lines(lines: list[tuple[int, str]]) -> bool:
    return any(RECEIVED.search(t) or DETAILS.search(t) or OUTPUT_IDS.search(t) for _, t in lines)


# ---------------------------------------------------------------------------------------------
# Pieces of a line (pure)


def _string_end(text: str, start: int) -> int:
    """Index just after the Python string literal (or None) starting at text[start]."""
    if text.startswith("None", start):
        return start + 4
    q = text[start : start + 1]
    if q not in ("'", '"'):
        raise Malformed("", f"expected a quoted string at column {start + 1}")
    k = start + 1
    while k < len(text):
        c = text[k]
        if c == "\\":
            k += 2
            continue
        if c == q:
            return k + 1
        k += 1
    raise Malformed("", "a quoted string that does not end on its line (a cut log line?)")


def _bracket_end(text: str, start: int) -> int:
    """Index just after the bracketed / parenthesised expression at text[start], strings skipped."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = []
    k = start
    while k < len(text):
        c = text[k]
        if c in ("'", '"'):
            k = _string_end(text, k)
            continue
        if c in pairs:
            stack.append(pairs[c])
        elif stack and c == stack[-1]:
            stack.pop()
            if not stack:
                return k + 1
        k += 1
    raise Malformed("", "brackets that do not close on their line (a cut log line?)")


def _token_ids(text: str, start: int, what: str) -> tuple[list[int] | None, int]:
    """The `[1, 2, 3]` (or None) at text[start] and the index after it."""
    if text.startswith("None", start):
        return None, start + 4
    if text[start : start + 1] != "[":
        raise Malformed("", f"{what} must be a list of token ids")
    end = text.index("]", start) + 1 if "]" in text[start:] else -1
    if end < 0:
        raise Malformed("", f"{what} does not end on its line (a cut log line?)")
    try:
        ids = json.loads(text[start:end])
    except ValueError:
        raise Malformed("", f"{what} is not a list of integers")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2 ** 32 for t in ids):
        raise Malformed("", f"{what} holds something other than token ids")
    return ids, end


def prompt_fields(rest: str) -> tuple[int, list[int] | None]:
    """`prompt: '<text>', prompt_token_ids: [...]` -> (length of the prompt text, the ids)."""
    assert rest.startswith("prompt: ")
    start = len("prompt: ")
    end = _string_end(rest, start)
    literal = rest[start:end]
    text_len = len(ast.literal_eval(literal)) if literal != "None" else 0
    k = rest.find("prompt_token_ids: ", end)
    if k < 0:
        return text_len, None
    ids, _ = _token_ids(rest, k + len("prompt_token_ids: "), "prompt_token_ids")
    return text_len, ids


def sampling_repr(text: str, where: str) -> dict:
    """The sampling fields of a `SamplingParams(...)` repr, each read with ast.literal_eval.

    Worked example: "SamplingParams(n=1, temperature=0.7, top_k=-1, seed=None, stop=['\\n'],
    structured_outputs=StructuredOutputsParams(json=...))" -> {"temperature": 0.7, "top_k": 0, "seed": None}."""
    start = text.find("SamplingParams(")
    if start < 0:
        return {}
    open_ = start + len("SamplingParams")
    inner = text[open_ + 1 : _bracket_end(text, open_) - 1]
    values: dict = {}
    k = 0
    while k < len(inner):
        # one top-level piece "key=value", up to the next comma outside brackets and strings
        j = k
        while j < len(inner) and inner[j] != ",":
            if inner[j] in ("'", '"'):
                j = _string_end(inner, j)
            elif inner[j] in "([{":
                j = _bracket_end(inner, j)
            else:
                j += 1
        key, eq, value = inner[k:j].partition("=")
        key = key.strip()
        if eq and key in SAMPLING_FIELDS:
            try:
                values[key] = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError):
                raise Malformed(f"{where}.{key}", f"{value.strip()[:40]!r} is not a literal value")
        k = j + 1
    return sampling_params(values, where, keep_null=True)


# ---------------------------------------------------------------------------------------------
# The log -> requests -> sessions


@dataclass
class Request:
    id: str
    first_line: int
    prompt: array | None = None  # uint32 token ids
    prompt_text_len: int | None = None
    outputs: list = field(default_factory=list)  # [array] one per completion (non-streaming details lines)
    deltas: array | None = None  # streaming delta ids, concatenated
    sampling: dict | None = None
    model: str | None = None
    body_cut: int | None = None  # length of a JSON body line that does not parse (cut at --max-log-len)
    finish_reasons: list = field(default_factory=list)
    problem: str | None = None  # a Malformed piece of one of its lines


PATTERNS = (("output_ids", OUTPUT_IDS), ("output", OUTPUT), ("details", DETAILS), ("received", RECEIVED), ("body", BODY))


def _message(line: str):
    """(kind, match) of the request-log message on this line — the earliest one, so text quoted
    inside a prompt (a log pasted into a chat) is never taken for a message — or (None, None)."""
    found = [(m.start(), kind, m) for kind, pattern in PATTERNS if (m := pattern.search(line))]
    if not found:
        return None, None
    _, kind, m = min(found, key=lambda t: t[0])
    return kind, m


def scan(lines) -> tuple[dict[str, Request], int | None]:
    """Every request of the log (by id, in order of appearance) and the --max-log-len the startup line states."""
    requests: dict[str, Request] = {}
    max_log_len = None

    def get(rid: str, n: int) -> Request:
        if rid not in requests:
            requests[rid] = Request(rid, n)
        return requests[rid]

    for n, line in lines:
        line = line.rstrip("\r\n")
        kind, m = _message(line) if "equest" in line or "esponse" in line else (None, None)
        if kind is None:
            if max_log_len is None and "max_log_len" in line:
                found = MAX_LOG_LEN.search(line)
                if found:
                    max_log_len = int(found.group(1))
            continue
        r = get(m.group("id"), n)
        rest = m.group("rest")
        try:
            if kind == "output_ids":
                ids, _ = _token_ids(rest, 0, "output_token_ids")
                if ids is None:
                    continue  # (streaming complete) logs no ids
                if m.group("stream") and "delta" in m.group("stream"):
                    r.deltas = (r.deltas or array("I")) + array("I", ids)
                else:
                    r.outputs.append(array("I", ids))
            elif kind == "output":
                fin = re.search(r"finish_reason: (\S+)$", rest)
                if fin and not m.group("stream"):
                    r.finish_reasons.append(fin.group(1))
            elif kind == "details":
                r.prompt_text_len, ids = prompt_fields(rest)
                r.prompt = array("I", ids) if ids is not None else None
            elif kind == "received":
                after = 0
                if rest.startswith("prompt: "):  # the older single line holds the prompt and its ids too
                    r.prompt_text_len, ids = prompt_fields(rest)
                    if ids is not None:
                        r.prompt = array("I", ids)
                    after = _string_end(rest, len("prompt: "))
                r.sampling = sampling_repr(rest[after:], f"line {n}: SamplingParams")
            else:  # the JSON body
                try:
                    body = json.loads(rest)
                    if isinstance(body, dict) and isinstance(body.get("model"), str):
                        r.model = body["model"]
                except ValueError:
                    r.body_cut = len(rest)
        except Malformed as e:
            r.problem = f"request {r.id}: {e}" if e.where else f"line {n}: request {r.id}: {e.what}"
    return requests, max_log_len


def _cut_at(r: Request, max_log_len: int | None) -> int | None:
    """The --max-log-len that cut this request's lists, if one did."""
    limits = {x for x in (max_log_len, r.body_cut) if x}
    if r.prompt is not None and r.prompt_text_len and r.prompt_text_len == len(r.prompt) and len(r.prompt) >= 16:
        limits.add(len(r.prompt))
    lists = [len(r.prompt)] if r.prompt is not None else []
    lists += [len(o) for o in r.outputs]
    return next((n for n in sorted(limits) if n in lists), None)


def check(r: Request, max_log_len: int | None) -> str | None:
    """Why this request cannot be replayed exactly (None: it can)."""
    if r.problem:
        return r.problem
    if r.prompt is None:
        return (f"request {r.id}: no prompt_token_ids (they are logged at DEBUG level: run vLLM with "
                "VLLM_LOGGING_LEVEL=DEBUG and --enable-log-requests)")
    if not r.outputs and not r.deltas:
        return (f"request {r.id}: no output_token_ids (run vLLM with --enable-log-outputs at VLLM_LOGGING_LEVEL=DEBUG; "
                "vLLM before 0.10 logs no outputs)")
    if not any(len(o) for o in r.outputs) and not r.deltas:
        return f"request {r.id}: generated no tokens; nothing to score"
    cut = _cut_at(r, max_log_len)
    if cut is not None:
        return (f"request {r.id}: the log is cut at --max-log-len {cut} (a token id list of exactly {cut} ids); "
                "restart vLLM without --max-log-len to log whole requests")
    return None


def history_length(r: Request) -> int:
    """How much of r's prompt is conversation history, which a later request of the same conversation
    resends: up to the last occurrence of the end-of-turn token r ended its output with (the
    generation prompt after it — "<|im_start|>assistant\n<think>\n" — is re-rendered differently
    once the turn is history). The whole prompt when r did not end on a token its prompt holds in
    its second half (a length cut, an unknown end)."""
    outputs = [o for o in r.outputs if len(o)] or ([r.deltas] if r.deltas else [])
    if not outputs or (r.finish_reasons and r.finish_reasons[0] == "length"):
        return len(r.prompt)
    end = outputs[0][-1]
    for k in range(len(r.prompt) - 1, len(r.prompt) // 2 - 1, -1):
        if r.prompt[k] == end:
            return k + 1
    return len(r.prompt)


def sessions(requests: dict[str, Request], max_log_len: int | None) -> Iterator:
    """Requests -> groups of requests (a later, longer prompt resending an earlier one's history joins
    its session), or Rejected."""
    groups: list[tuple[list[Request], int]] = []  # (requests, history length of the latest)
    for r in requests.values():
        why = check(r, max_log_len)
        if why is not None:
            yield Rejected(why)
            continue
        best = None
        for k, (g, cut) in enumerate(groups):  # the session whose latest request's history this one resends (the longest)
            last = g[-1].prompt
            if len(r.prompt) > len(last) and r.prompt[:cut] == last[:cut] and (best is None or cut > groups[best][1]):
                best = k
        if best is not None:
            groups[best][0].append(r)
            groups[best] = (groups[best][0], history_length(r))
        else:
            groups.append(([r], history_length(r)))
    for g, _ in groups:
        yield g


def to_session(group: list[Request], source: Source) -> dict:
    records, exact = [], True
    for r in group:
        completions = [o for o in r.outputs if len(o)] or [r.deltas]
        exact = exact and bool(r.outputs)
        for c in completions:
            records.append({"prompt_token_ids": list(r.prompt), "completion_token_ids": list(c)})
    last = group[-1]
    samplings = [r.sampling for r in group if r.sampling]
    original = {"request_ids": [r.id for r in group]}
    if any(r.model for r in group):
        original["model"] = next(r.model for r in reversed(group) if r.model)
    reasons = [f for r in group for f in r.finish_reasons]
    if reasons:
        original["finish_reasons"] = reasons
    if not exact:
        original["output_exact"] = False
    if len({json.dumps(s, sort_keys=True) for s in samplings}) > 1:
        original["sampling_varies"] = True
    record = f"lines {group[0].first_line}-{max(r.first_line for r in group)}" if len(group) > 1 else f"line {last.first_line}"
    return {"id": group[0].id, "requests": records,
            "meta": meta(FORMAT, source, record, original=original, missing=[], supplied={}, dropped={},
                         sampling=samplings[-1] if samplings else {})}


def read(source: Source, options: Options) -> Iterator:
    requests, max_log_len = scan(source.text_lines())
    if not requests:
        raise source.error("no vLLM request log lines (\"Received request ...\", \"Request ... details\"); "
                           "run vLLM with --enable-log-requests --enable-log-outputs at VLLM_LOGGING_LEVEL=DEBUG")
    for item in sessions(requests, max_log_len):
        yield item if isinstance(item, Rejected) else to_session(item, source)
