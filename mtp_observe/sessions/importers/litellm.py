"""litellm: LiteLLM StandardLoggingPayload records (what LiteLLM's logging callbacks receive).

Input: one payload (JSON), a list of them, JSON lines of them, or callback kwargs holding one at
`standard_logging_object`. A payload is `{"id", "trace_id", "call_type", "status", "startTime",
"model", "messages", "response", "model_parameters", "hidden_params", "error_information", ...}`
(docs/my-website/docs/proxy/logging_spec.md and litellm/types/utils.py in BerriAI/litellm).

Mapping decisions:
- `messages` are the request as the client sent it, in OpenAI form for every provider;
  `response` is an OpenAI chat.completion: its `choices[0].message` (content, tool_calls,
  reasoning_content / thinking_blocks) is the assistant turn (chat.py converts both).
- Failures (`status` "failure", an empty `response`, or `error_information.error_message` set)
  and calls that are not chat (`messages` a string or object: embeddings, text completion,
  images) are dropped and counted (`failed_calls`, `non_chat_calls`), not errors.
- Tools are not top-level: `model_parameters.tools` (or `functions`) when the caller passed them;
  else tool calls record `tools` missing (`--tools FILE` supplies them). Sampling comes from
  `model_parameters` (temperature, top_p, max_tokens, seed, ...; vLLM's names, common.py).
- Grouping: payloads sharing a `trace_id` are one agent run; sorted by `startTime` (a float epoch
  or a "YYYY-MM-DD hh:mm:ss" string), a call whose messages a later call resends folds into it
  (chat.fold_group: interleaved sub-agent calls stay apart), so a run logged as N growing calls is
  one session. Payloads without a trace_id fold the same way among a run of untraced neighbours. All payloads of a file are held in memory to group them.
- id: the trace_id (a trace that stays several conversations gets #2, #3 from the importer), else
  the payload `id` (the response id), else `<file stem>:<n>`. `original` keeps trace_id, the
  last call's id, the model, `hidden_params.litellm_model_name` and `custom_llm_provider`.
"""

from __future__ import annotations

import datetime
from typing import Iterator

from . import chat
from .common import Dropped, Malformed, Options, Rejected, Source, as_dict, originals

FORMAT = "litellm"
PAYLOAD_KEYS = ("call_type", "model_parameters", "hidden_params", "standard_built_in_tools_params", "model_map_information",
                "response_cost", "error_information")


def _unwrap(obj):
    if isinstance(obj, dict) and isinstance(obj.get("standard_logging_object"), dict):
        return obj["standard_logging_object"]
    return obj


def detect(obj) -> bool:
    payload = _unwrap(obj)
    return isinstance(payload, dict) and "messages" in payload and sum(k in payload for k in PAYLOAD_KEYS) >= 2


def _failed(payload: dict) -> bool:
    error = payload.get("error_information")
    message = error.get("error_message") if isinstance(error, dict) else None
    return payload.get("status") == "failure" or not payload.get("response") or bool(message)


def _start(payload: dict) -> float:
    value = payload.get("startTime")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    return 0.0


def convert_payload(label: str, number: int | None, payload) -> chat.Conversation | Dropped:
    """Pure: one payload -> a Conversation (or why it is not one)."""
    payload = as_dict(_unwrap(payload), label)
    if _failed(payload):
        return Dropped("failed_calls")
    if not isinstance(payload.get("messages"), list):
        return Dropped("non_chat_calls")
    params = payload.get("model_parameters") or {}
    params = as_dict(params, f"{label}.model_parameters")
    body = {**params, "messages": payload["messages"], "model": payload.get("model")}
    conv = chat.request(body, payload["response"], label, number)
    hidden = payload.get("hidden_params") if isinstance(payload.get("hidden_params"), dict) else {}
    conv.original = {**conv.original, **originals(trace_id=payload.get("trace_id"), call_id=payload.get("id"),
                                                  litellm_model_name=hidden.get("litellm_model_name"),
                                                  custom_llm_provider=payload.get("custom_llm_provider"))}
    return conv


def conversations(items) -> Iterator:
    """(label, number, payload) in file order -> folded Conversations per trace, Dropped and Rejected."""
    traces: dict = {}  # trace_id (or a running key for payloads without one) -> [(start, order, conversation)]
    order = []
    untraced_run = 0
    for k, (label, number, payload) in enumerate(items):
        try:
            item = convert_payload(label, number, payload)
        except Malformed as e:
            yield Rejected(str(e))
            continue
        if isinstance(item, Dropped):
            yield item
            continue
        trace = item.original.get("trace_id")
        key = ("trace", trace) if trace is not None else ("untraced", untraced_run)
        if trace is not None:
            untraced_run += 1  # untraced payloads fold only with untraced neighbours
        if key not in traces:
            traces[key] = []
            order.append(key)
        traces[key].append((_start(_unwrap(payload)) if trace is not None else 0.0, k, item))
    for key in order:
        group = [conv for _, _, conv in sorted(traces[key], key=lambda t: (t[0], t[1]))]
        yield from chat.fold_group(group)


def items_of(source: Source):
    if source.is_json_lines():
        yield from ((f"line {n}", n, obj) for n, obj in source.lines())
        return
    document = source.document()
    if isinstance(document, list):
        yield from ((f"[{i}]", i, obj) for i, obj in enumerate(document))
    else:
        yield ("the file", None, document)


def read(source: Source, options: Options) -> Iterator:
    yield from chat.read_sessions(conversations(items_of(source)), FORMAT, source, options,
                                  'LiteLLM StandardLoggingPayload records {"messages", "response", "model_parameters"}',
                                  session_id=lambda c: c.original.get("trace_id") or c.original.get("call_id"))
