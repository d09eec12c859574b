"""OpenAI chat messages and conversations: what every OpenAI-shaped importer shares.

openai-chat, openai-batch, litellm, otel-genai and openhands all end in OpenAI Chat Completions
messages; this module turns one such message, tool list, response or SSE stream into the
canonical form (SESSIONS.md), and folds a conversation logged as growing requests into one.

Mapping decisions (each importer's docstring adds its own):
- Roles: `system` and `developer` (OpenAI's newer name for it) -> system; `user`, `assistant`,
  `tool`; the legacy `function` role -> a tool result paired with the nearest call.
- Content: a string, null, or parts. Text parts (`text`, `input_text`, `output_text`) are joined
  without a separator, as the reader joins them; image, audio and file parts are dropped and counted
  (`media_parts`), other parts too (`unsupported_parts`). A `refusal` string with no content
  becomes the content (it is what the model wrote).
- Reasoning: `reasoning_content` (DeepSeek, vLLM, z.ai), else `reasoning` (OpenRouter, Ollama,
  vLLM's newer field), else the texts of `reasoning_details` (OpenRouter) or `thinking_blocks`
  (LiteLLM), joined with a blank line -> `reasoning_content`.
- Tool calls: `[{id, type: "function", function: {name, arguments}}]`; `arguments` stay the JSON
  string (or object) the log holds — the reader parses and checks them; streaming `index` keys
  are dropped. The legacy `function_call {name, arguments}` becomes one call without an id.
  Calls of other types (`custom`) cannot be rendered: dropped and counted (`unsupported_tool_calls`).
- Tools: `[{type: "function", function: {...}}]` kept as given; the legacy `functions` list and
  the flat Responses / OTel form `{type: "function", name, description, parameters}` are wrapped
  in OpenAI's `function`; other tool types (web search, code interpreter) have no schema to render:
  dropped (`server_tools`).
- Consecutive system messages at the start (pydantic-ai sends its instructions as a second one) are
  joined with a blank line into one: Qwen's chat templates take a single leading system message and
  refuse a second (`dropped.merged_system_messages` counts the joined ones).
- A response is `choices[0].message` of a chat.completion (other choices are dropped and counted,
  `other_choices`), or a streamed body (`data: {...}` lines, SSE) reassembled: `delta.content`
  and the reasoning deltas concatenated, and `delta.tool_calls` concatenated per `index` (the id,
  type and name come on the first chunk of each index; `arguments` arrive in pieces).

Folding (`fold`): an agent resends the whole history with each request, so a conversation whose
messages are the start of the next conversation's is not a session of its own: the later one
holds it (`fold` compares neighbours in a stream; `fold_group`, for the calls of one trace, any
earlier open conversation). Messages compare by role, text, tool calls (id, name, arguments as parsed JSON) and
tool_call_id — not by reasoning, which clients often strip before resending; a folded turn keeps
the reasoning of whichever copy has it (the earlier response: what the model generated). The
session takes the tools of the latest request that sent any (an agent may add tools as it goes,
or send none once it only wants text); `original.tool_lists` counts the distinct tool lists when
the folded requests differ, and `original.requests` lists every request a session stands for.
Its sampling is the latest request's (`original.sampling_varies` when they differ).
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from .common import Malformed, as_dict, as_str, drop_orphan_results, join_text, kind, loads, meta, objects, session

TEXT_PARTS = ("text", "input_text", "output_text")
MEDIA_PARTS = ("image_url", "input_image", "image", "input_audio", "audio", "file", "input_file", "video_url")
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool", "function": "tool"}


def counts() -> Counter:
    """The dropped-and-counted kinds this module fills."""
    return Counter()


# ---------------------------------------------------------------------------------------------
# One message (pure)


def content_text(content, where: str, dropped: Counter) -> str:
    """A message's content (string, null or parts) as text; non-text parts dropped and counted."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for w, part in objects(content, where):
        kind_ = part.get("type")
        if kind_ in TEXT_PARTS:
            texts.append(as_str(part.get("text"), f"{w}.text"))
        elif kind_ == "refusal":
            texts.append(as_str(part.get("refusal"), f"{w}.refusal"))
        elif kind_ in MEDIA_PARTS:
            dropped["media_parts"] += 1
        else:
            dropped["unsupported_parts"] += 1
    return "".join(texts)


def reasoning_of(m: dict, where: str) -> str | None:
    """The reasoning a message carries, under any of the names providers use (None: none)."""
    for key in ("reasoning_content", "reasoning"):
        value = m.get(key)
        if isinstance(value, str):
            return value
        if value is not None and not (key == "reasoning" and isinstance(value, dict)):  # {"effort": ...} is a setting
            raise Malformed(f"{where}.{key}", f"must be a string, not {kind(value)}")
    for key, field_ in (("reasoning_details", "text"), ("thinking_blocks", "thinking")):
        if isinstance(m.get(key), list):
            texts = [b.get(field_) for b in m[key] if isinstance(b, dict) and isinstance(b.get(field_), str)]
            if texts:
                return join_text(texts)
    return None


def tool_calls(calls, where: str, dropped: Counter) -> list[dict]:
    out = []
    for w, call in objects(calls, where):
        if call.get("type", "function") != "function":
            dropped["unsupported_tool_calls"] += 1
            continue
        fn = as_dict(call.get("function"), f"{w}.function")
        args = fn.get("arguments")
        if args is not None and not isinstance(args, (str, dict)):
            raise Malformed(f"{w}.function.arguments", f"must be a JSON string or an object, not {kind(args)}")
        out.append({"id": call.get("id"), "type": "function",
                    "function": {"name": as_str(fn.get("name"), f"{w}.function.name"), "arguments": args if args is not None else "{}"}})
    return out


def message(m, where: str, dropped: Counter) -> dict:
    """One OpenAI chat message -> canonical form (see the module docstring)."""
    m = as_dict(m, where)
    role = ROLES.get(m.get("role")) if isinstance(m.get("role"), str) else None
    if role is None:
        raise Malformed(f"{where}.role", f"must be system, developer, user, assistant or tool, not {m.get('role')!r}")
    text = content_text(m.get("content"), f"{where}.content", dropped)
    if role == "assistant" and not text and isinstance(m.get("refusal"), str):
        text = m["refusal"]
    out: dict = {"role": role, "content": text}
    if role == "assistant":
        reasoning = reasoning_of(m, where)
        if reasoning is not None:
            out["reasoning_content"] = reasoning
        calls = tool_calls(m["tool_calls"], f"{where}.tool_calls", dropped) if m.get("tool_calls") else []
        if not calls and isinstance(m.get("function_call"), dict):
            calls = tool_calls([{"id": None, "type": "function", "function": m["function_call"]}], f"{where}.function_call", dropped)
        if calls:
            out["tool_calls"] = calls
    elif role == "tool":
        call_id = m.get("tool_call_id")
        if call_id is not None:
            out["tool_call_id"] = call_id
    return out


def messages(raw, where: str, dropped: Counter) -> list[dict]:
    return [message(m, w, dropped) for w, m in objects(raw, where)]


# ---------------------------------------------------------------------------------------------
# Tools (pure)


def tools(raw, where: str, dropped: Counter, legacy_functions=None) -> list[dict]:
    """Tool schemas in OpenAI's shape, from the chat, flat (Responses, OTel) or legacy `functions` form."""
    out = []
    if raw is not None:
        for w, tool in objects(raw, where):
            if tool.get("type", "function") != "function":
                dropped["server_tools"] += 1
                continue
            if "function" in tool:
                fn = as_dict(tool["function"], f"{w}.function")
                as_str(fn.get("name"), f"{w}.function.name")
                out.append({"type": "function", "function": fn})
            else:
                out.append(flat_tool(tool, w))
    if legacy_functions is not None:
        for w, fn in objects(legacy_functions, "functions"):
            out.append(flat_tool(fn, w))
    return out


def flat_tool(tool: dict, where: str) -> dict:
    """{type?, name, description?, parameters?} -> {"type": "function", "function": {name, description?, parameters?}}."""
    fn = {"name": as_str(tool.get("name"), f"{where}.name")}
    if tool.get("description") is not None:
        fn["description"] = as_str(tool["description"], f"{where}.description")
    if tool.get("parameters") is not None:
        fn["parameters"] = as_dict(tool["parameters"], f"{where}.parameters")
    return {"type": "function", "function": fn}


# ---------------------------------------------------------------------------------------------
# Responses (pure)


def sse_completion(text: str, where: str) -> dict:
    """A streamed Chat Completions body (`data: {chunk}` lines, `data: [DONE]`) -> one chat.completion.

    Worked example: chunks delta {role, tool_calls: [{index 0, id "c1", function {name "f", arguments ""}}]},
    then delta {tool_calls: [{index 0, function {arguments "{\\"a\\":"}}]}, then {... arguments "1}"} ->
    message {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", ..., "arguments": "{\\"a\\":1}"}]}."""
    content, reasoning, calls = [], [], {}
    head: dict = {}
    finish = None
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]" or not data:
            continue
        chunk = as_dict(loads(data, f"{where} line {n}"), f"{where} line {n}")
        for key in ("id", "model", "system_fingerprint"):
            if chunk.get(key) is not None and key not in head:
                head[key] = chunk[key]
        for w, choice in objects(chunk.get("choices") or [], f"{where} line {n}.choices"):
            if choice.get("index", 0) != 0:
                continue
            finish = choice.get("finish_reason") or finish
            delta = as_dict(choice.get("delta") or {}, f"{w}.delta")
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            for key in ("reasoning_content", "reasoning"):
                if isinstance(delta.get(key), str):
                    reasoning.append(delta[key])
                    break
            for wc, call in objects(delta.get("tool_calls") or [], f"{w}.delta.tool_calls"):
                index = call.get("index", len(calls))
                if isinstance(index, bool) or not isinstance(index, int):
                    raise Malformed(f"{wc}.index", f"must be a number, not {kind(index)}")
                slot = calls.setdefault(index, {"id": None, "type": "function", "name": None, "arguments": []})
                for key in ("id", "type"):
                    if call.get(key) is not None:
                        slot[key] = call[key]
                fn = as_dict(call.get("function") or {}, f"{wc}.function")
                if fn.get("name") is not None:
                    slot["name"] = as_str(fn["name"], f"{wc}.function.name")
                if fn.get("arguments") is not None:
                    slot["arguments"].append(as_str(fn["arguments"], f"{wc}.function.arguments"))
    msg: dict = {"role": "assistant", "content": "".join(content)}
    if reasoning:
        msg["reasoning_content"] = "".join(reasoning)
    if calls:
        msg["tool_calls"] = [{"id": c["id"], "type": c["type"], "function": {"name": c["name"], "arguments": "".join(c["arguments"])}}
                             for _, c in sorted(calls.items())]
    return {**head, "object": "chat.completion", "choices": [{"index": 0, "message": msg, "finish_reason": finish}]}


def response_message(response, where: str, dropped: Counter) -> dict | None:
    """The assistant message of a chat.completion (or of a streamed body); None when there is none."""
    if isinstance(response, str):
        if "data:" not in response:
            return None
        response = sse_completion(response, where)
    if not isinstance(response, dict) or not isinstance(response.get("choices"), list) or not response["choices"]:
        return None
    choices = response["choices"]
    dropped["other_choices"] += len(choices) - 1
    first = min(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) and isinstance(c.get("index"), int) else 0)
    choice = as_dict(first, f"{where}.choices[0]")
    if choice.get("message") is None:
        return None
    m = as_dict(choice["message"], f"{where}.choices[0].message")
    return message({**m, "role": m.get("role") or "assistant"}, f"{where}.choices[0].message", dropped)


# ---------------------------------------------------------------------------------------------
# Conversations and folding


@dataclass
class Conversation:
    """One logged request (and its response): what the model saw, and what it generated."""

    label: str  # where it is in the file: "interactions[1]", "line 3", "spans[2]"
    messages: list[dict]
    tools: list[dict] = field(default_factory=list)
    sampling: dict = field(default_factory=dict)
    original: dict = field(default_factory=dict)
    dropped: Counter = field(default_factory=Counter)
    missing: set = field(default_factory=set)
    number: int | None = None  # the record number its session id is built from (None: the file's only record)
    requests: list[str] = field(default_factory=list)  # labels of the requests folded into it, oldest first
    tool_lists: int = 1
    sampling_varies: bool = False


def _args_key(args):
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return ("raw", args)
    try:
        return ("json", json.dumps(args, sort_keys=True, ensure_ascii=False))
    except (TypeError, ValueError, RecursionError):
        return ("raw", repr(args))


def message_key(m: dict) -> tuple:
    """What must be equal for two copies of a message to be the same turn (reasoning aside)."""
    calls = tuple((c.get("id"), c["function"]["name"], _args_key(c["function"].get("arguments"))) for c in m.get("tool_calls") or [])
    return (m["role"], m.get("content") or "", calls, m.get("tool_call_id"))


def resends(earlier: Conversation, later: Conversation) -> bool:
    """later's messages start with all of earlier's: the later request resent that history."""
    n = len(earlier.messages)
    return 0 < n <= len(later.messages) and all(message_key(a) == message_key(b) for a, b in zip(earlier.messages, later.messages))


def absorb(earlier: Conversation, later: Conversation) -> Conversation:
    """later, holding earlier's turns, with earlier's reasoning where later's copy lost it."""
    for a, b in zip(earlier.messages, later.messages):
        if "reasoning_content" in a and "reasoning_content" not in b:
            b["reasoning_content"] = a["reasoning_content"]
    if not later.tools and earlier.tools:
        later.tools = earlier.tools
    later.tool_lists = earlier.tool_lists + (1 if earlier.tools and later.tools != earlier.tools else 0)
    later.sampling_varies = earlier.sampling_varies or earlier.sampling != later.sampling
    later.requests = earlier.requests + [earlier.label] + later.requests
    for k, v in earlier.dropped.items():
        later.dropped[k] = max(later.dropped[k], v)
    later.missing |= earlier.missing
    return later


def fold(items: Iterable) -> Iterator:
    """Conversations in log order -> the conversations that are not resent by the next one, each
    holding the ones folded into it. Items that are not Conversations (Rejected, Dropped) pass
    through and end the run of folding (only neighbours fold: interleaved conversations stay apart)."""
    pending: Conversation | None = None
    for item in items:
        if not isinstance(item, Conversation):
            if pending is not None:
                yield pending
                pending = None
            yield item
            continue
        if pending is not None and resends(pending, item):
            item = absorb(pending, item)
        elif pending is not None:
            yield pending
        pending = item
    if pending is not None:
        yield pending


def fold_group(conversations: list[Conversation]) -> list[Conversation]:
    """The calls of one run (a trace, a conversation id) in time order -> its conversations: each call
    joins the open conversation it resends (the longest such), else opens one; in order of their first
    call. Unlike `fold`, interleaved conversations of the run (an agent and its sub-agent) both fold."""
    open_: list[Conversation] = []
    for conv in conversations:
        best = max((k for k, c in enumerate(open_) if resends(c, conv)), key=lambda k: len(open_[k].messages), default=None)
        if best is None:
            open_.append(conv)
        else:
            open_[best] = absorb(open_[best], conv)
    return open_


def request(body: dict, response, label: str, number: int | None, where: str = "") -> Conversation:
    """Pure: one Chat Completions request body (and its response or None) -> a Conversation.
    Sampling comes from the body; `original` keeps the model and the response's id and model."""
    from .common import sampling_params

    where = where or label
    dropped = counts()
    history = messages(body.get("messages"), f"{where}.messages", dropped)
    reply = response_message(response, f"{where} response", dropped) if response is not None else None
    if reply is not None:
        history.append(reply)
    sampling = sampling_params(body, where)
    response = response if isinstance(response, dict) else {}
    original = {k: v for k, v in (("model", body.get("model")), ("response_id", response.get("id")),
                                  ("response_model", response.get("model"))) if isinstance(v, str)}
    if original.get("response_model") == original.get("model"):
        original.pop("response_model", None)
    return Conversation(label, history, tools(body.get("tools"), f"{where}.tools", dropped, body.get("functions")),
                        sampling, original, dropped, number=number)


def to_session(conv: Conversation, fmt: str, source, sid: str, options=None, extra_original: dict | None = None) -> dict:
    """The canonical session of a (folded) conversation; --tools fills tools the log lacks."""
    history, orphans = drop_orphan_results(conv.messages)
    history, merged = merge_leading_system(history)
    supplied: dict = {}
    tools_ = conv.tools
    if not tools_ and options is not None and options.tools is not None:
        tools_ = supplied_tools(options.tools)
        supplied["tools"] = options.tools
    has_calls = any(m.get("tool_calls") for m in history if m["role"] == "assistant")
    missing = set(conv.missing) | ({"tools"} if (has_calls or conv.dropped["server_tools"]) and not tools_ else set())
    original = {**conv.original, **(extra_original or {}), "requests": [*conv.requests, conv.label]}
    if conv.tool_lists > 1:
        original["tool_lists"] = conv.tool_lists
    if conv.sampling_varies:
        original["sampling_varies"] = True
    return session(sid, history, tools_ or None, meta(
        fmt, source, conv.label, original=original, missing=missing, supplied=supplied,
        dropped={**conv.dropped, "orphan_tool_results": orphans, "merged_system_messages": merged}, sampling=conv.sampling))


def read_sessions(items: Iterable, fmt: str, source, options, expected: str, session_id=None) -> Iterator:
    """Folded items (Conversations, Dropped, Rejected) -> sessions, the others passed through. A session's id is
    session_id(conversation) when that gives a non-empty string, else the file's stem (":number" for one of
    several). A Malformed input is one line naming the file and `expected` (what the format's records hold)."""
    try:
        for item in items:
            if not isinstance(item, Conversation):
                yield item
                continue
            sid = session_id(item) if session_id is not None else None
            if not isinstance(sid, str) or not sid:
                sid = source.stem if item.number is None else f"{source.stem}:{item.number}"
            yield to_session(item, fmt, source, sid, options)
    except Malformed as e:
        raise source.error(f"{e}; expected {expected}")


def supplied_tools(path) -> list[dict]:
    """--tools, read once per file (and version of it) however many sessions need it."""
    from pathlib import Path

    from .common import load_tools_file

    try:
        st = Path(path).stat()
    except OSError:
        return load_tools_file(Path(path))  # its one-line error
    return list(_tools_file(str(path), st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=8)
def _tools_file(path: str, mtime_ns: int, size: int) -> tuple:
    from pathlib import Path

    from .common import load_tools_file

    return tuple(load_tools_file(Path(path)))


def merge_leading_system(history: list[dict]) -> tuple[list[dict], int]:
    """Consecutive system messages at the start joined into one (blank line between): Qwen's chat
    templates take one system message, first, and refuse a second. Returns (messages, how many joined)."""
    n = 0
    while n < len(history) and history[n]["role"] == "system":
        n += 1
    if n < 2:
        return history, 0
    system = {"role": "system", "content": join_text([m["content"] for m in history[:n]])}
    return [system, *history[n:]], n - 1
