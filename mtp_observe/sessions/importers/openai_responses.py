"""openai-responses: OpenAI Responses API request bodies with their responses.

Input: a VCR cassette (`.yaml`, interactions with `/responses` requests, bodies parsed or as JSON
text), a JSON request body or a list of them, or JSON lines; a body may be wrapped as
`{"request": BODY, "response": RESPONSE}`. A body is `{"model", "instructions"?, "input": str |
[items], "tools"?, "previous_response_id"?, ...}`; a response `{"id", "output": [items], ...}`.

Mapping decisions:
- `instructions` (a string; null or absent: none) is the system message, first. A string
  `input` is one user message.
- Items: `{role, content}` and `{type: "message", role, content}` are messages, their content a
  string or parts whose `input_text` / `output_text` / `text` are joined (image and file parts
  dropped and counted, `media_parts`); role `developer` or `system` -> system.
  `{type: "function_call", call_id, name, arguments}` -> a tool call whose id is `call_id` (not
  the item's `fc_...` id: results refer to call_id); `{type: "function_call_output", call_id,
  output}` -> a `tool` message. `{type: "reasoning", summary: [{text}], content?: [{text}]}` ->
  reasoning of the assistant message it belongs to: the `content` texts when present (vLLM puts
  the raw reasoning there), else the summary texts, joined with a blank line; a reasoning item
  with neither (`summary: []`, only `encrypted_content`) has no readable reasoning and is
  counted (`dropped.unreadable_reasoning`). Other items (built-in tool calls, item_reference,
  ...) are dropped and counted (`unsupported_items`).
- Consecutive assistant-side items — reasoning, assistant messages, function calls — are one
  assistant message (one response's `output` is one model turn: phase_live returns reasoning,
  a message and a function_call together); several messages' texts are joined with a blank line.
- One request + its response is one conversation: the request's history, then the response's
  `output` as the assistant turn. Requests resending the previous one's history fold into it
  (chat.fold). With `previous_response_id` the request holds only the new items: its history is
  the earlier response's conversation (request and output) from the same file, minus that
  request's instructions (the API does not carry instructions over), plus this one's. An earlier
  response the file does not hold leaves the history's start unknown: `content` is recorded
  missing and `original.previous_response_id` names it.
- Tools are flat (`{type: "function", name, description, parameters, strict}`) -> OpenAI's
  `function` wrapper; built-in tools (web_search, file_search, ...) have no schema: dropped
  (`server_tools`).
- Sampling: the request's temperature, top_p, top_k, max_output_tokens (-> max_tokens) and
  penalties; a key the request leaves unset is taken from the response, which echoes the values
  the server applied (phase_live's response: temperature 1.0, top_p 0.98, penalties 0.0).
  `reasoning.effort` and `text.verbosity` are not sampling parameters: kept in `original`.
- id: `<file stem>:<n>` (interaction, list index or line), or the stem for a single body;
  `original` keeps the model, the response id and model, and the previous_response_id.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterator

from . import chat
from .common import (
    SAMPLING_KEYS,
    Malformed,
    Options,
    Rejected,
    Source,
    as_dict,
    as_str,
    interactions,
    join_text,
    kind,
    objects,
    sampling_params,
)

FORMAT = "openai-responses"
ASSISTANT_SIDE = ("reasoning", "function_call")
ECHOED = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "max_output_tokens", "top_k")


def _unwrap(obj):
    if isinstance(obj, dict) and isinstance(obj.get("request"), dict) and "input" not in obj:
        return obj["request"], obj.get("response")
    return obj, None


def detect_body(obj) -> bool:
    body, response = _unwrap(obj)
    return (isinstance(body, dict) and isinstance(body.get("model"), str) and "input" in body and "messages" not in body
            and isinstance(body["input"], (str, list)))


def detect_cassette(document) -> bool:
    return any(("/responses" in uri and isinstance(body, dict)) or (body is not None and detect_body(body))
               for _, uri, body, _ in interactions(document, strict=False))


# ---------------------------------------------------------------------------------------------
# Items -> messages (pure)


def _text_parts(content, where: str, dropped: Counter) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return chat.content_text(content, where, dropped)


def _reasoning_text(item: dict, where: str, dropped: Counter) -> str | None:
    for key in ("content", "summary"):
        parts = item.get(key)
        if parts:
            texts = [as_str(p.get("text"), f"{w}.text") for w, p in objects(parts, f"{where}.{key}")]
            if any(texts):
                return join_text(texts)
    dropped["unreadable_reasoning"] += 1
    return None


class _Turns:
    """Builds messages from items, keeping consecutive assistant-side items in one assistant message."""

    def __init__(self, dropped: Counter):
        self.messages: list[dict] = []
        self.dropped = dropped
        self.open: dict | None = None  # the assistant message items are being added to

    def assistant(self) -> dict:
        if self.open is None:
            self.open = {"role": "assistant", "content": "", "_texts": [], "_reasoning": [], "tool_calls": []}
            self.messages.append(self.open)
        return self.open

    def close(self) -> None:
        if self.open is not None:
            m = self.open
            m["content"] = join_text(m.pop("_texts"))
            reasoning = m.pop("_reasoning")
            if reasoning:
                m["reasoning_content"] = join_text(reasoning)
            if not m["tool_calls"]:
                del m["tool_calls"]
            self.open = None

    def add(self, item, where: str) -> None:
        if isinstance(item, str):  # a bare string in an input list is user text
            item = {"role": "user", "content": item}
        item = as_dict(item, where)
        kind_ = item.get("type", "message" if "role" in item else None)
        if kind_ == "message":
            role = chat.ROLES.get(item.get("role")) if isinstance(item.get("role"), str) else None
            if role not in ("system", "user", "assistant"):
                raise Malformed(f"{where}.role", f"must be system, developer, user or assistant, not {item.get('role')!r}")
            text = _text_parts(item.get("content"), f"{where}.content", self.dropped)
            if role == "assistant":
                self.assistant()["_texts"].append(text)
                return
            self.close()
            self.messages.append({"role": role, "content": text})
        elif kind_ == "reasoning":
            text = _reasoning_text(item, where, self.dropped)
            if text is not None:
                self.assistant()["_reasoning"].append(text)
        elif kind_ == "function_call":
            args = item.get("arguments")
            if args is not None and not isinstance(args, (str, dict)):
                raise Malformed(f"{where}.arguments", f"must be a JSON string, not {kind(args)}")
            self.assistant()["tool_calls"].append({
                "id": as_str(item.get("call_id"), f"{where}.call_id"), "type": "function",
                "function": {"name": as_str(item.get("name"), f"{where}.name"), "arguments": args if args is not None else "{}"}})
        elif kind_ == "function_call_output":
            self.close()
            output = item.get("output")
            text = output if isinstance(output, str) else _text_parts(output, f"{where}.output", self.dropped)
            self.messages.append({"role": "tool", "tool_call_id": as_str(item.get("call_id"), f"{where}.call_id"), "content": text})
        else:
            self.dropped["unsupported_items"] += 1

    def finish(self) -> list[dict]:
        self.close()
        return self.messages


def items_to_messages(items, where: str, dropped: Counter) -> list[dict]:
    turns = _Turns(dropped)
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    for w, item in ((f"{where}[{k}]", it) for k, it in enumerate(_as_items(items, where))):
        turns.add(item, w)
    return turns.finish()


def _as_items(items, where: str) -> list:
    if not isinstance(items, list):
        raise Malformed(where, f"must be a string or a list of items, not {kind(items)}")
    return items


def _output(response, where: str, dropped: Counter) -> list[dict]:
    """The response's output items as one assistant message (none when the response failed)."""
    if not isinstance(response, dict) or not isinstance(response.get("output"), list):
        return []
    out = items_to_messages(response["output"], f"{where}.output", dropped)
    return [m for m in out if m["role"] == "assistant"] if out else []


def request(body: dict, response, label: str, number: int | None, history: dict) -> chat.Conversation:
    """Pure but for `history` (response id -> the messages of its conversation, without instructions):
    one request + response -> a Conversation; its own messages are added to `history`."""
    dropped = chat.counts()
    instructions = body.get("instructions")
    system = []
    if isinstance(instructions, str):
        system = [{"role": "system", "content": instructions}]
    elif instructions is not None:
        system = [m for m in items_to_messages(instructions, f"{label}.instructions", dropped) if m["role"] == "system"]
    missing = set()
    original = {}
    before: list[dict] = []
    previous = body.get("previous_response_id")
    if previous is not None:
        original["previous_response_id"] = as_str(previous, f"{label}.previous_response_id")
        if previous in history:
            before = [dict(m) for m in history[previous]]
        else:
            missing.add("content")
    new = items_to_messages(body.get("input", []), f"{label}.input", dropped)
    reply = _output(response, f"{label} response", dropped)
    conversation = before + new + reply
    response = response if isinstance(response, dict) else {}
    if isinstance(response.get("id"), str):
        history[response["id"]] = conversation
    sampling = sampling_params(body, label)
    echoed = sampling_params({k: response.get(k) for k in ECHOED if k in response}, f"{label} response")
    sampling = {**echoed, **sampling}
    sampling = {k: sampling[k] for k in SAMPLING_KEYS if k in sampling}
    for k, v in (("model", body.get("model")), ("response_id", response.get("id")), ("response_model", response.get("model"))):
        if isinstance(v, str):
            original[k] = v
    if original.get("response_model") == original.get("model"):
        original.pop("response_model", None)
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
        original["reasoning_effort"] = reasoning["effort"]
    text = body.get("text")
    if isinstance(text, dict) and isinstance(text.get("verbosity"), str):
        original["verbosity"] = text["verbosity"]
    tools = chat.tools(body.get("tools"), f"{label}.tools", dropped)
    return chat.Conversation(label, system + conversation, tools, sampling, original, dropped, missing, number)


def conversations(items) -> Iterator:
    history: dict = {}

    def each():
        for label, number, body, response in items:
            try:
                if not isinstance(body, dict):
                    raise Malformed(label, f"must be a request body (an object with input), not {type(body).__name__}")
                yield request(body, response, label, number, history)
            except Malformed as e:
                yield Rejected(str(e))

    return chat.fold(each())


def items_of(source: Source):
    if source.is_yaml():
        found = [(label, i, body, reply) for i, (label, uri, body, reply) in enumerate(interactions(source.document()))
                 if isinstance(body, dict) and "input" in body and "messages" not in body]
        if not found:
            raise Malformed("interactions", "no Responses API request with input in this cassette")
        yield from found
    elif source.is_json_lines():
        yield from ((f"line {n}", n, *_unwrap(obj)) for n, obj in source.lines())
    else:
        document = source.document()
        if isinstance(document, list):
            yield from ((f"[{i}]", i, *_unwrap(obj)) for i, obj in enumerate(document))
        else:
            yield ("the file", None, *_unwrap(document))


def read(source: Source, options: Options) -> Iterator:
    yield from chat.read_sessions(conversations(items_of(source)), FORMAT, source, options,
                                  'Responses API request bodies {"model", "input", "instructions"?} (with their responses)')
