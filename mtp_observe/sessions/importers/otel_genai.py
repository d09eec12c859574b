"""otel-genai: OpenTelemetry GenAI spans (OTLP JSON) to conversations.

Input: OTLP JSON — `{"resourceSpans": [{"scopeSpans": [{"spans": [SPAN]}]}]}` as a document or
one export per line (the collector's file exporter) — or spans as a list or `{"spans": [...]}`.
A SPAN is OTLP's `{"traceId", "spanId", "name", "startTimeUnixNano", "endTimeUnixNano",
"attributes": [{"key", "value": ANY}], "events": [{"name", "timeUnixNano", "attributes"}]}` or the
SDK's `span.to_json()` form (`context.trace_id`, `start_time`, attributes as a plain object).
ANY is OTLP's AnyValue: stringValue, intValue (a string), doubleValue, boolValue, arrayValue,
kvlistValue. Semantic conventions: open-telemetry/semantic-conventions @953276ff,
docs/gen-ai/gen-ai-spans.md, gen-ai-events.md, non-normative/examples-llm-calls.md and the JSON
schemas gen-ai-input-messages.json / gen-ai-output-messages.json.

Mapping decisions:
- A model call is a span whose `gen_ai.operation.name` is chat, text_completion or
  generate_content (or, without it, one named "chat ..." or holding gen_ai content); other spans
  (execute_tool, invoke_agent, embeddings, HTTP) are not model calls and are skipped —
  execute_tool spans only repeat the tool results the next call's input holds.
- Its messages, first found wins:
  1. `gen_ai.input.messages` + `gen_ai.output.messages` (the current conventions) on the span,
     or on one of its events (content captured "on event attributes"); the value is a JSON string
     (`stringValue`) or the structured arrayValue / kvlistValue — both are read.
     `gen_ai.system_instructions` (a list of parts, or plain text) is a system message before the
     input (joined with a system message the input starts with: one system message, chat.py).
  2. The flattened form older instrumentations write (OpenLLMetry): `gen_ai.prompt.{i}.role` /
     `.content` / `.tool_calls.{j}.id|name|arguments` / `.tool_call_id`, and
     `gen_ai.completion.{i}.*` likewise.
  3. Span events of semconv <= 1.36: `gen_ai.system.message`, `gen_ai.user.message`,
     `gen_ai.assistant.message`, `gen_ai.tool.message`, then `gen_ai.choice`; each event's
     content in its `body` / `gen_ai.event.content` attribute (JSON) or its own attributes.
  A call with none of them was recorded with content capture off: it is not invented. A
  conversation none of whose calls has content is dropped and counted (`calls_without_content`);
  one with some such calls records `content` missing.
- Parts: `text` -> content; `reasoning` -> reasoning_content; `tool_call {id, name, arguments}`
  -> a tool call whose arguments object is serialised to a JSON string; `tool_call_response {id,
  response}` -> a `tool` message (wherever it sits: the spec puts it in role "tool", some SDKs in
  "user"), a non-string response serialised as JSON; `blob`, `file`, `uri` are dropped and counted
  (`media_parts`), `server_tool_call` / `server_tool_call_response` (built-in tools the provider
  ran) too (`server_tool_parts`), other part types (`unsupported_parts`). Several output messages
  (choices) -> the first; the others are counted (`other_choices`).
- Tools: `gen_ai.tool.definitions` — flat `{type, name, description, parameters}` (converted to
  OpenAI's `function` wrapper) or already OpenAI-shaped — else OpenLLMetry's
  `llm.request.functions.{i}.name|description|parameters`.
- Sampling: `gen_ai.request.temperature`, `.top_p`, `.top_k`, `.presence_penalty`,
  `.frequency_penalty`, `.max_tokens`, `.seed` -> meta.sampling (vLLM's names, common.py).
- Conversations: calls sharing `gen_ai.conversation.id` (else the trace) are one run; in order of
  end time, a call whose messages a later call's input resends folds into it (chat.fold_group): the run
  logged as N growing calls is one session, and calls of the trace that are not part of it (a
  sub-agent, even interleaved with it) stay sessions of their own. Every span of a file is held in memory to group them.
- id: the conversation id, else the trace id; `original` keeps both, the span ids of the calls
  folded in (`requests`), the model, response id and response model.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from typing import Iterator

from . import chat
from .common import Dropped, Malformed, Options, Rejected, Source, as_dict, as_list, as_str, join_text, loads, objects

FORMAT = "otel-genai"
MODEL_CALLS = ("chat", "text_completion", "generate_content")
MEDIA = ("blob", "file", "uri", "image", "audio", "video")
SERVER_TOOL_PARTS = ("server_tool_call", "server_tool_call_response")
SAMPLING_NAMES = {f"gen_ai.request.{k}": k for k in ("temperature", "top_p", "top_k", "presence_penalty", "frequency_penalty",
                                                      "max_tokens", "seed")}
OLD_EVENTS = {"gen_ai.system.message": "system", "gen_ai.user.message": "user", "gen_ai.assistant.message": "assistant",
              "gen_ai.tool.message": "tool", "gen_ai.choice": "assistant"}


# ---------------------------------------------------------------------------------------------
# OTLP values and spans (pure)


def any_value(value, where: str):
    """An OTLP AnyValue as a Python value (a plain value passes through: the SDK's to_json form)."""
    if not isinstance(value, dict):
        return value
    if "stringValue" in value:
        return as_str(value["stringValue"], f"{where}.stringValue")
    if "boolValue" in value:
        return value["boolValue"]
    if "intValue" in value:
        raw = value["intValue"]
        try:
            return int(raw)
        except (TypeError, ValueError):
            raise Malformed(f"{where}.intValue", f"must be an integer, not {raw!r}")
    if "doubleValue" in value:
        raw = value["doubleValue"]
        if isinstance(raw, str):  # OTLP JSON writes NaN and Infinity as strings
            try:
                return float(raw)
            except ValueError:
                raise Malformed(f"{where}.doubleValue", f"must be a number, not {raw!r}")
        return raw
    if "arrayValue" in value:
        values = as_dict(value["arrayValue"], f"{where}.arrayValue").get("values") or []
        return [any_value(v, f"{where}.arrayValue.values[{k}]") for k, v in enumerate(as_list(values, f"{where}.arrayValue.values"))]
    if "kvlistValue" in value:
        values = as_dict(value["kvlistValue"], f"{where}.kvlistValue").get("values") or []
        return attributes(values, f"{where}.kvlistValue.values")
    if "bytesValue" in value:
        try:
            return base64.b64decode(as_str(value["bytesValue"], f"{where}.bytesValue")).decode("utf-8", "replace")
        except ValueError:
            raise Malformed(f"{where}.bytesValue", "must be base64")
    if not value:
        return None  # an empty AnyValue
    return value  # a plain object (the to_json form's structured value)


def attributes(raw, where: str) -> dict:
    """OTLP's [{key, value}] (or a plain {key: value} object) -> {key: value}."""
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return raw
    out = {}
    for w, kv in objects(raw, where):
        out[as_str(kv.get("key"), f"{w}.key")] = any_value(kv.get("value"), f"{w}.value")
    return out


def _time(span: dict, *keys) -> int:
    for key in keys:
        value = span.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value)
        if isinstance(value, str):
            if value.isdigit():
                return int(value)
            return _iso_nanos(value)
    return 0


def _iso_nanos(text: str) -> int:
    import datetime

    try:
        return int(datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1e9)
    except ValueError:
        return 0


def spans_of(document, where: str = "") -> Iterator[tuple[str, dict]]:
    """(location, span) of every span in an OTLP export, a {"spans"} object, a list of spans or one span."""
    if isinstance(document, list):
        for k, item in enumerate(document):
            yield from spans_of(item, f"{where}[{k}]")
        return
    document = as_dict(document, where or "the file")
    if "resourceSpans" in document:
        for w, rs in objects(document["resourceSpans"], f"{where}resourceSpans"):
            for w2, ss in objects(rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or [], f"{w}.scopeSpans"):
                for w3, span in objects(ss.get("spans") or [], f"{w2}.spans"):
                    yield w3, span
    elif "spans" in document and isinstance(document["spans"], list):
        for w, span in objects(document["spans"], f"{where}spans"):
            yield w, span
    else:
        yield where or "the file", document


# ---------------------------------------------------------------------------------------------
# One span -> one model call (pure)


def _json_value(value, where: str):
    """An attribute holding JSON: a JSON string (stringValue) or the structured value itself."""
    if isinstance(value, str):
        return loads(value, where)
    return value


def _args_text(args, where: str) -> str:
    if args is None:
        return "{}"
    if isinstance(args, str):
        return args
    try:
        return json.dumps(args, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        raise Malformed(where, "arguments are not JSON")


def _response_text(response) -> str:
    if response is None:
        return ""
    if isinstance(response, str):
        return response
    try:
        return json.dumps(response, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return str(response)


def parts_message(m, where: str, dropped: Counter) -> list[dict]:
    """One semconv message {role, parts} -> canonical messages: an assistant message, a system or
    user message, and a `tool` message per tool_call_response part (in their order)."""
    m = as_dict(m, where)
    role = chat.ROLES.get(m.get("role")) if isinstance(m.get("role"), str) else None
    if role is None:
        raise Malformed(f"{where}.role", f"must be system, user, assistant or tool, not {m.get('role')!r}")
    parts = m.get("parts")
    if parts is None and "content" in m:  # some SDKs write {role, content}
        parts = [{"type": "text", "content": m["content"]}] if isinstance(m["content"], str) or m["content"] is None else m["content"]
    texts, reasoning, calls, out = [], [], [], []
    text_role = "user" if role == "tool" else role  # text beside tool results in a tool message: the user's

    for w, part in objects(parts if parts is not None else [], f"{where}.parts"):
        kind_ = part.get("type")
        if kind_ == "text":
            texts.append(as_str(part.get("content", part.get("text")), f"{w}.content") or "")
        elif kind_ in ("reasoning", "thinking"):
            reasoning.append(as_str(part.get("content", part.get("text")), f"{w}.content") or "")
        elif kind_ == "tool_call":
            calls.append({"id": part.get("id"), "type": "function",
                          "function": {"name": as_str(part.get("name"), f"{w}.name"), "arguments": _args_text(part.get("arguments"), f"{w}.arguments")}})
        elif kind_ == "tool_call_response":
            if texts and role != "assistant":
                out.append({"role": text_role, "content": "".join(texts)})
                texts = []
            out.append({"role": "tool", "tool_call_id": part.get("id"), "content": _response_text(part.get("response", part.get("result")))})
        elif kind_ in MEDIA:
            dropped["media_parts"] += 1
        elif kind_ in SERVER_TOOL_PARTS:
            dropped["server_tool_parts"] += 1
        else:
            dropped["unsupported_parts"] += 1
    if role == "assistant":
        msg: dict = {"role": "assistant", "content": "".join(texts)}
        if reasoning:
            msg["reasoning_content"] = join_text(reasoning)
        if calls:
            msg["tool_calls"] = calls
        return [msg]
    if role == "tool":
        if texts and not out:  # a tool message of text parts: the result of its call
            return [{"role": "tool", "tool_call_id": m.get("tool_call_id", m.get("id")), "content": "".join(texts)}]
        return out + ([{"role": "user", "content": "".join(texts)}] if texts else [])
    if texts or not out:
        out.append({"role": text_role, "content": "".join(texts)})
    return out


def _semconv_messages(attrs: dict, where: str, dropped: Counter) -> list[dict] | None:
    if "gen_ai.input.messages" not in attrs and "gen_ai.output.messages" not in attrs:
        return None
    history = []
    if attrs.get("gen_ai.system_instructions") is not None:
        raw = attrs["gen_ai.system_instructions"]
        try:
            parts = _json_value(raw, f"{where}.gen_ai.system_instructions")
        except Malformed:  # some SDKs write the instructions as plain text
            parts = raw
        if isinstance(parts, str):
            parts = [{"type": "text", "content": parts}]
        history += parts_message({"role": "system", "parts": parts}, f"{where}.gen_ai.system_instructions", dropped)
    inputs = _json_value(attrs.get("gen_ai.input.messages") or [], f"{where}.gen_ai.input.messages")
    for w, m in objects(inputs, f"{where}.gen_ai.input.messages"):
        history += parts_message(m, w, dropped)
    outputs = _json_value(attrs.get("gen_ai.output.messages") or [], f"{where}.gen_ai.output.messages")
    outputs = as_list(outputs, f"{where}.gen_ai.output.messages")
    if outputs:
        dropped["other_choices"] += len(outputs) - 1
        history += parts_message(outputs[0], f"{where}.gen_ai.output.messages[0]", dropped)
    return history


def _indexed(attrs: dict, prefix: str) -> dict[int, dict]:
    """{"gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.tool_calls.1.name": "f"} -> {0: {"role": "user", "tool_calls.1.name": "f"}}."""
    out: dict[int, dict] = {}
    for key, value in attrs.items():
        if key.startswith(prefix):
            head, _, rest = key[len(prefix):].partition(".")
            if head.isdigit() and rest:
                out.setdefault(int(head), {})[rest] = value
    return out


def _flat_message(fields: dict, where: str) -> dict:
    calls = _indexed({f"x.{k}": v for k, v in fields.items()}, "x.tool_calls.")
    m: dict = {"role": fields.get("role", "assistant"), "content": fields.get("content")}
    if calls:
        m["tool_calls"] = [{"id": c.get("id"), "type": "function", "function": {"name": c.get("name"), "arguments": c.get("arguments") or "{}"}}
                           for _, c in sorted(calls.items())]
    if fields.get("tool_call_id") is not None:
        m["tool_call_id"] = fields["tool_call_id"]
    if isinstance(fields.get("reasoning_content"), str):
        m["reasoning_content"] = fields["reasoning_content"]
    return m


def _flattened_messages(attrs: dict, where: str, dropped: Counter) -> list[dict] | None:
    prompts, completions = _indexed(attrs, "gen_ai.prompt."), _indexed(attrs, "gen_ai.completion.")
    if not prompts and not completions:
        return None
    history = [chat.message(_flat_message(f, f"{where}.gen_ai.prompt.{i}"), f"{where}.gen_ai.prompt.{i}", dropped)
               for i, f in sorted(prompts.items())]
    if completions:
        first = min(completions)
        dropped["other_choices"] += len(completions) - 1
        history.append(chat.message(_flat_message(completions[first], f"{where}.gen_ai.completion.{first}"),
                                    f"{where}.gen_ai.completion.{first}", dropped))
    return history


def _event_messages(events: list[tuple[str, dict]], where: str, dropped: Counter) -> list[dict] | None:
    """The per-message events of semconv <= 1.36, in their order."""
    found = [(name, attrs) for name, attrs in events if name in OLD_EVENTS]
    if not found:
        return None
    history, choices = [], 0
    for k, (name, attrs) in enumerate(found):
        w = f"{where}.events[{name}]"
        body = attrs.get("body", attrs.get("gen_ai.event.content"))
        body = _json_value(body, w) if body is not None else attrs
        body = as_dict(body, w)
        if name == "gen_ai.choice":
            choices += 1
            if choices > 1:
                dropped["other_choices"] += 1
                continue
            body = body.get("message") if isinstance(body.get("message"), dict) else body
        m = {"role": OLD_EVENTS[name], **{k2: v for k2, v in body.items() if k2 in ("content", "tool_calls", "reasoning_content")}}
        if name == "gen_ai.tool.message":
            m["tool_call_id"] = body.get("id", body.get("tool_call_id"))
        history.append(chat.message(m, w, dropped))
    return history


def _tools(attrs: dict, where: str, dropped: Counter) -> list[dict]:
    if attrs.get("gen_ai.tool.definitions") is not None:
        defs = _json_value(attrs["gen_ai.tool.definitions"], f"{where}.gen_ai.tool.definitions")
        return chat.tools(defs, f"{where}.gen_ai.tool.definitions", dropped)
    functions = _indexed(attrs, "llm.request.functions.")
    out = []
    for i, f in sorted(functions.items()):
        fn = {"name": f.get("name"), "description": f.get("description")}
        if f.get("parameters") is not None:
            fn["parameters"] = _json_value(f["parameters"], f"{where}.llm.request.functions.{i}.parameters")
        out.append(chat.flat_tool(fn, f"{where}.llm.request.functions.{i}"))
    return out


def is_model_call(name: str, attrs: dict, events: list) -> bool:
    operation = attrs.get("gen_ai.operation.name")
    if isinstance(operation, str):
        return operation in MODEL_CALLS
    return (name.startswith("chat ") or any(k.startswith(("gen_ai.input.", "gen_ai.output.", "gen_ai.prompt.", "gen_ai.completion."))
                                             for k in attrs)
            or any(n in OLD_EVENTS for n, _ in events))


def model_call(where: str, span: dict) -> tuple[dict, chat.Conversation | None] | None:
    """Pure: one span -> (its grouping fields, its Conversation or None when captured without content);
    None for a span that is not a model call."""
    attrs = attributes(span.get("attributes"), f"{where}.attributes")
    name = span.get("name") if isinstance(span.get("name"), str) else ""
    events = []
    for w, event in objects(span.get("events") or [], f"{where}.events"):
        events.append((event.get("name") if isinstance(event.get("name"), str) else "", attributes(event.get("attributes"), f"{w}.attributes")))
    if not is_model_call(name, attrs, events):
        return None
    context = span.get("context") if isinstance(span.get("context"), dict) else {}
    ids = {"trace_id": span.get("traceId", context.get("trace_id")), "span_id": span.get("spanId", context.get("span_id")),
           "conversation_id": attrs.get("gen_ai.conversation.id"),
           "end": _time(span, "endTimeUnixNano", "end_time"), "start": _time(span, "startTimeUnixNano", "start_time")}
    dropped = chat.counts()
    history = _semconv_messages(attrs, where, dropped)
    if history is None:
        for _, event_attrs in events:  # content captured on event attributes
            history = _semconv_messages(event_attrs, f"{where}.events", dropped)
            if history is not None:
                attrs = {**event_attrs, **attrs}
                break
    if history is None:
        history = _flattened_messages(attrs, where, dropped)
    if history is None:
        history = _event_messages(events, where, dropped)
    if history is None:
        return ids, None
    original = {}
    for key, attr in (("model", "gen_ai.request.model"), ("response_id", "gen_ai.response.id"), ("response_model", "gen_ai.response.model"),
                      ("provider", "gen_ai.provider.name")):
        if isinstance(attrs.get(attr), str):
            original[key] = attrs[attr]
    if "provider" not in original and isinstance(attrs.get("gen_ai.system"), str):
        original["provider"] = attrs["gen_ai.system"]
    from .common import sampling_params

    sampling = sampling_params(attrs, where, names=SAMPLING_NAMES)
    label = f"span {ids['span_id']}" if isinstance(ids["span_id"], str) and ids["span_id"] else where
    return ids, chat.Conversation(label, history, _tools(attrs, where, dropped), sampling, original, dropped)


# ---------------------------------------------------------------------------------------------
# Spans -> conversations


def conversations(spans) -> Iterator:
    """(location, span) -> folded Conversations per conversation id / trace, Dropped and Rejected."""
    groups: dict = {}
    order = []
    for where, span in spans:
        try:
            found = model_call(where, as_dict(span, where))
        except Malformed as e:
            yield Rejected(str(e))
            continue
        if found is None:
            continue
        ids, conv = found
        key = ids["conversation_id"] if isinstance(ids["conversation_id"], str) else ("trace", ids["trace_id"] if isinstance(ids["trace_id"], str) else where)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append((ids, conv))
    for key in order:
        calls = sorted(groups[key], key=lambda t: (t[0]["end"], t[0]["start"]))
        with_content = [conv for _, conv in calls if conv is not None]
        without = len(calls) - len(with_content)
        if not with_content:
            yield Dropped("calls_without_content", without)
            continue
        ids = calls[-1][0]
        for conv in chat.fold_group(with_content):
            conv.original = {**conv.original, **({"conversation_id": ids["conversation_id"]} if isinstance(ids["conversation_id"], str) else {}),
                             **({"trace_id": ids["trace_id"]} if isinstance(ids["trace_id"], str) else {})}
            if without:
                conv.missing.add("content")
                conv.dropped["calls_without_content"] = without
            yield conv


def read(source: Source, options: Options) -> Iterator:
    try:
        if source.is_json_lines():
            spans = ((f"line {n}: {w}" if w != "the file" else f"line {n}", span) for n, obj in source.lines() for w, span in spans_of(obj))
        else:
            spans = spans_of(source.document())
        for item in conversations(spans):
            if isinstance(item, chat.Conversation):
                sid = item.original.get("conversation_id") or item.original.get("trace_id") or f"{source.stem}:{item.label}"
                yield chat.to_session(item, FORMAT, source, sid, options)
            else:
                yield item
    except Malformed as e:
        raise source.error(f"{e}; expected OpenTelemetry spans in OTLP JSON {{\"resourceSpans\": [...]}} with gen_ai attributes")
