"""anthropic: Anthropic Messages API request bodies (with their responses when logged).

Input, any of:
- a VCR cassette (`.yaml`/`.yml`, as vcrpy and pydantic-ai record them): `interactions[]` with
  `request.parsed_body` (or a JSON `request.body`) and `response.parsed_body` (or a JSON
  `response.body.string`); requests that are not conversations (no `messages`, or the
  `count_tokens` endpoint) are skipped;
- a JSON document: one request body, or a list of them;
- JSON lines: one request body per line, streamed.
A body may also be wrapped as `{"request": BODY, "response": MESSAGE}`.
A body is `{"model", "max_tokens", "system"?, "messages": [{"role": "user"|"assistant",
"content": str | [blocks]}], "tools"?: [{"name", "description", "input_schema"}]}`.

Mapping decisions:
- One request (+ its response) is one conversation: the request's messages, then the
  response's assistant message — what the model generated for it. Without a response only the
  assistant turns already in the history are scored. A response that continues an assistant
  prefill (the request ends with an assistant message) is appended to that message's text.
- An agent resends the whole history with every request, so a conversation that is a prefix of
  the next one in the file (same system and tools) is dropped: the later request holds it, and
  `original.requests` lists every request a session stands for. Only neighbours are compared;
  interleaved conversations stay separate sessions.
- `system` (a string or text blocks) becomes the system message. A body without `system` had
  no system prompt: nothing is missing.
- Blocks: `text` -> content; `thinking` -> `reasoning_content` (the signature is dropped);
  `tool_use` -> an OpenAI tool call with `input` as the arguments object; `tool_result` (in user
  messages) -> a `tool` message with `tool_call_id` = `tool_use_id` and its text; user text after
  the results -> a user message. Several text blocks are joined with a blank line.
- Tools: `{"name", "description", "input_schema"}` -> `{"type": "function", "function": {"name",
  "description", "parameters": input_schema}}`. Server tools (no `input_schema`, e.g. web
  search) have no schema to render: dropped (`dropped.server_tools`) and `tools` is recorded
  missing. Tool calls in a body without `tools` also record `tools` missing.
- Dropped and counted: `redacted_thinking_blocks`, `media_blocks` (image, document),
  `unsupported_blocks` (server tool blocks and other types), `orphan_tool_results`.
- Sampling: `temperature`, `top_p`, `top_k` and `max_tokens` of the body go to meta.sampling
  (common.py: vLLM's names; the folded session takes its last request's).
- id: `<file stem>:<n>` where n is the interaction, list index or line of the (last) request;
  the file stem alone for a single body. `original` keeps the model and the response id.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from .common import (
    Malformed,
    Options,
    Rejected,
    Source,
    as_dict,
    as_list,
    as_str,
    drop_orphan_results,
    interactions,
    join_text,
    meta,
    objects,
    originals,
    sampling_params,
    session,
    user_messages,
)

FORMAT = "anthropic"
ANTHROPIC_BLOCKS = ("tool_use", "tool_result", "thinking", "redacted_thinking")


# ---------------------------------------------------------------------------------------------
# Detection


def _unwrap(obj):
    if isinstance(obj, dict) and isinstance(obj.get("request"), dict) and "messages" not in obj:
        return obj["request"]
    return obj


def detect_body(obj) -> bool:
    """An Anthropic Messages request (not an OpenAI chat request, not a canonical session)."""
    body = _unwrap(obj)
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        return False
    messages = [m for m in body["messages"] if isinstance(m, dict)]
    if any(m.get("role") not in ("user", "assistant") or "tool_calls" in m for m in messages):
        return False
    blocks = [b for m in messages if isinstance(m.get("content"), list) for b in m["content"] if isinstance(b, dict)]
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    return ("system" in body or "max_tokens" in body or "anthropic_version" in body
            or any(b.get("type") in ANTHROPIC_BLOCKS for b in blocks)
            or any(isinstance(t, dict) and "input_schema" in t for t in tools))


def detect_cassette(document) -> bool:
    return any(body is not None and (detect_body(body) or "anthropic" in uri) for _, uri, body, _ in interactions(document, strict=False))


# ---------------------------------------------------------------------------------------------
# One request body -> one conversation (pure)


class _Counts(dict):
    def __init__(self):
        super().__init__(redacted_thinking_blocks=0, media_blocks=0, unsupported_blocks=0, server_tools=0)


def _blocks(content, where: str) -> list:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return as_list(content, where)


def _assistant(content, where: str, counts: _Counts) -> dict:
    texts, thinking, calls = [], [], []
    for w, block in objects(_blocks(content, f"{where}.content"), f"{where}.content"):
        kind = block.get("type")
        if kind == "text":
            texts.append(as_str(block.get("text"), f"{w}.text"))
        elif kind == "thinking":
            thinking.append(as_str(block.get("thinking"), f"{w}.thinking"))
        elif kind == "redacted_thinking":
            counts["redacted_thinking_blocks"] += 1
        elif kind == "tool_use":
            args = block.get("input", {})
            if not isinstance(args, dict):
                raise Malformed(f"{w}.input", f"must be an object, not {type(args).__name__}")
            calls.append({"id": as_str(block.get("id"), f"{w}.id"), "type": "function",
                          "function": {"name": as_str(block.get("name"), f"{w}.name"), "arguments": args}})
        else:
            counts["unsupported_blocks"] += 1
    msg = {"role": "assistant", "content": join_text(texts)}
    if thinking:
        msg["reasoning_content"] = join_text(thinking)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _user(content, where: str, counts: _Counts) -> list[dict]:
    return user_messages(content, where, counts) or [{"role": "user", "content": ""}]


def _system(system, where: str) -> str | None:
    if system is None or isinstance(system, str):
        return system
    texts = []
    for w, block in objects(system, where):
        texts.append(as_str(block.get("text"), f"{w}.text"))
    return join_text(texts)


def _tools(tools, where: str, counts: _Counts) -> list[dict]:
    out = []
    for w, tool in objects(tools, where):
        if "input_schema" not in tool:
            counts["server_tools"] += 1
            continue
        fn = {"name": as_str(tool.get("name"), f"{w}.name")}
        if tool.get("description") is not None:
            fn["description"] = as_str(tool["description"], f"{w}.description")
        fn["parameters"] = as_dict(tool["input_schema"], f"{w}.input_schema")
        out.append({"type": "function", "function": fn})
    return out


def conversation(body, response, where: str) -> dict:
    """Pure: one request body (and its response message, or None) -> a conversation:
    {"system", "messages", "tools", "counts", "original"}."""
    body = as_dict(body, where)
    counts = _Counts()
    messages: list[dict] = []
    system = _system(body.get("system"), f"{where}.system")
    if system is not None:
        messages.append({"role": "system", "content": system})
    raw = as_list(body.get("messages"), f"{where}.messages")
    for j, m in enumerate(raw):
        w = f"{where}.messages[{j}]"
        m = as_dict(m, w)
        role = m.get("role")
        if role == "assistant":
            messages.append(_assistant(m.get("content"), w, counts))
        elif role == "user":
            messages.extend(_user(m.get("content"), w, counts))
        else:
            raise Malformed(f"{w}.role", f"must be user or assistant, not {role!r}")
    response_id = None
    if isinstance(response, dict) and response.get("role") == "assistant" and "content" in response:
        reply = _assistant(response["content"], f"{where} response", counts)
        response_id = response.get("id")
        if raw and messages and messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls"):
            prefill = messages.pop()  # the model continued this text
            reply["content"] = prefill["content"] + reply["content"]
        messages.append(reply)
    tools = _tools(body["tools"], f"{where}.tools", counts) if body.get("tools") is not None else []
    return {"messages": messages, "tools": tools, "counts": counts, "sampling": sampling_params(body, where),
            "original": originals(model=body.get("model"), response_id=response_id)}


def _is_prefix(a: dict, b: dict) -> bool:
    """a's conversation is the start of b's (same tools): b's request resent a's history."""
    n = len(a["messages"])
    return a["tools"] == b["tools"] and n <= len(b["messages"]) and b["messages"][:n] == a["messages"]


def convert(items: Iterable[tuple[str, int | None, object, object]], source: Source) -> Iterator[dict]:
    """Pure: (record label, record number, body, response) in file order -> canonical sessions;
    a conversation that the next request resends whole is folded into it. Record number None:
    the file holds a single body, and the session is named after the file."""
    pending, pending_label, pending_number = None, "", None
    labels: list[str] = []
    for label, number, body, response in items:
        try:
            conv = conversation(body, response, label)
        except Malformed as e:
            if pending is not None:
                yield _session(pending, pending_label, pending_number, labels, source)
            pending, labels = None, []
            yield Rejected(str(e))
            continue
        if pending is not None and _is_prefix(pending, conv):
            labels.append(pending_label)
            for k, v in pending["counts"].items():
                conv["counts"][k] = max(conv["counts"][k], v)
        elif pending is not None:
            yield _session(pending, pending_label, pending_number, labels, source)
            labels = []
        pending, pending_label, pending_number = conv, label, number
    if pending is not None:
        yield _session(pending, pending_label, pending_number, labels, source)


def _session(conv: dict, label: str, number: int | None, folded: list[str], source: Source) -> dict:
    messages, orphans = drop_orphan_results(conv["messages"])
    has_calls = any(m.get("tool_calls") for m in messages if m["role"] == "assistant")
    missing = ["tools"] if conv["counts"]["server_tools"] or (has_calls and not conv["tools"]) else []
    sid = source.stem if number is None else f"{source.stem}:{number}"
    original = dict(conv["original"], requests=[*folded, label])
    return session(sid, messages, conv["tools"] or None, meta(
        FORMAT, source, label, original=original, missing=missing, supplied={},
        dropped={**conv["counts"], "orphan_tool_results": orphans}, sampling=conv["sampling"]))


# ---------------------------------------------------------------------------------------------
# Files


def _cassette_items(document):
    for i, (label, uri, body, reply) in enumerate(interactions(document)):
        if not isinstance(body, dict) or "messages" not in body or "count_tokens" in uri:
            continue  # not a conversation request
        yield label, i, body, reply


def _record(obj, label: str, number: int | None):
    if isinstance(obj, dict) and isinstance(obj.get("request"), dict) and "messages" not in obj:
        return label, number, obj["request"], obj.get("response")
    return label, number, obj, None


def read(source: Source, options: Options) -> Iterator[dict]:
    try:
        if source.is_yaml():
            items = list(_cassette_items(source.document()))
            if not items:
                raise Malformed("interactions", "no Messages API request with messages in this cassette")
            yield from convert(items, source)
        elif source.is_json_lines():
            yield from convert((_record(obj, f"line {n}", n) for n, obj in source.lines()), source)
        else:
            document = source.document()
            if isinstance(document, list):
                yield from convert((_record(obj, f"[{i}]", i) for i, obj in enumerate(document)), source)
            else:
                yield from convert([_record(document, "the file", None)], source)
    except Malformed as e:
        raise source.error(f"{e}; expected Anthropic Messages API request bodies {{\"system\"?, \"messages\", \"tools\"?}}")

