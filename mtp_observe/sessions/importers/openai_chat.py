"""openai-chat: OpenAI Chat Completions request bodies with their responses (what vLLM and SGLang serve).

Input, any of:
- a VCR cassette (`.yaml`/`.yml`): `interactions[]` with the request body as JSON text
  (`request.body`, OpenTelemetry's instrumentation tests) or parsed (`request.parsed_body`,
  pydantic-ai), and the response as JSON text (`response.body.string`), a streamed body
  (`data: {chunk}` lines) or parsed (`response.parsed_body`); interactions that are not chat
  requests (no `messages`) are skipped;
- a JSON document: one request body, or a list of them;
- JSON lines: one request body per line, streamed.
A body may be wrapped as `{"request": BODY, "response": CHAT_COMPLETION}` (a gateway's log).

Mapping decisions (message, tool and response conversion: chat.py):
- One request (+ its response) is one conversation: the request's `messages`, then the
  response's `choices[0].message` — what the model generated for it. Without a response only
  the assistant turns already in the history are scored.
- A request whose messages the next request resends (the agent loop: each request carries the
  whole history) is folded into the next one (chat.fold): a conversation logged as N growing
  requests is one session with N assistant turns. `original.requests` lists them. Only neighbours
  fold (the file is streamed, as for `anthropic`): interleaved conversations stay apart.
- Tool calls keep their JSON-string `arguments` (the reader parses them); tool results are
  `tool` messages with their `tool_call_id`; parallel calls and their results stay as logged.
- Reasoning: `reasoning_content` / `reasoning` (and `reasoning_details`) on assistant messages and
  in the response, streamed or not -> `reasoning_content`.
- Tools: the request's `tools` (or legacy `functions`); tool calls in a conversation whose
  requests sent none record `tools` missing (`--tools FILE` supplies them).
- Sampling: the body's temperature, top_p, top_k, min_p, presence/frequency/repetition
  penalties, seed and max_tokens / max_completion_tokens -> meta.sampling (common.py: vLLM's
  names). A request without a system message had no system prompt: nothing is missing.
- id: `<file stem>:<n>` where n is the interaction, list index or line of the (last) request;
  the file stem alone for a single body. `original` keeps the request model, the response id
  and the response's model when it differs.
"""

from __future__ import annotations

from typing import Iterator

from . import chat
from .common import Malformed, Options, Rejected, Source, interactions

FORMAT = "openai-chat"
OPENAI_KEYS = ("max_completion_tokens", "frequency_penalty", "presence_penalty", "response_format", "stream_options",
               "logprobs", "top_logprobs", "seed", "reasoning_effort", "parallel_tool_calls", "functions", "n", "logit_bias")


def _unwrap(obj):
    """(body, response) of a logged request: a bare body, or {"request": BODY, "response": COMPLETION}."""
    if isinstance(obj, dict) and isinstance(obj.get("request"), dict) and "messages" not in obj:
        return obj["request"], obj.get("response")
    return obj, None


def detect_body(obj, strong: bool = True) -> bool:
    """An OpenAI chat request: `model` and `messages` of role-carrying objects; `strong` wants a
    sign no Anthropic body has (a system/developer/tool role, tool_calls, a choices response,
    an OpenAI-only parameter, tools with a `function`)."""
    body, response = _unwrap(obj)
    if not isinstance(body, dict) or not isinstance(body.get("model"), str) or not isinstance(body.get("messages"), list) or not body["messages"]:
        return False
    messages = body["messages"]
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        return False
    if not strong:
        return True
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    return (any(m["role"] in ("system", "developer", "tool", "function") or "tool_calls" in m for m in messages)
            or any(k in body for k in OPENAI_KEYS)
            or any(isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools)
            or (isinstance(response, dict) and "choices" in response))


def detect_cassette(document) -> bool:
    for _, uri, body, _ in interactions(document, strict=False):
        if "/chat/completions" in uri and isinstance(body, dict) and "messages" in body:
            return True
        if body is not None and detect_body(body):
            return True
    return False


def conversations(items) -> Iterator:
    """Pure: (label, number, body, response) in file order -> folded Conversations (or Rejected)."""

    def each():
        for label, number, body, response in items:
            try:
                if not isinstance(body, dict):
                    raise Malformed(label, f"must be a request body (an object with messages), not {type(body).__name__}")
                yield chat.request(body, response, label, number)
            except Malformed as e:
                yield Rejected(str(e))

    return chat.fold(each())


def _cassette_items(document):
    for i, (label, uri, body, reply) in enumerate(interactions(document, keep_text=True)):
        if not isinstance(body, dict) or "messages" not in body:
            continue  # not a chat request (a models list, an embedding, a Responses call)
        yield label, i, body, reply


def _record(obj, label: str, number: int | None):
    body, response = _unwrap(obj)
    return label, number, body, response


def items_of(source: Source) -> Iterator[tuple[str, int | None, object, object]]:
    """(label, number, body, response) of every request in the file, in order."""
    if source.is_yaml():
        found = list(_cassette_items(source.document()))
        if not found:
            raise Malformed("interactions", "no Chat Completions request with messages in this cassette")
        yield from found
    elif source.is_json_lines():
        yield from (_record(obj, f"line {n}", n) for n, obj in source.lines())
    else:
        document = source.document()
        if isinstance(document, list):
            yield from (_record(obj, f"[{i}]", i) for i, obj in enumerate(document))
        else:
            yield _record(document, "the file", None)


def read(source: Source, options: Options) -> Iterator:
    yield from chat.read_sessions(conversations(items_of(source)), FORMAT, source, options,
                                  'Chat Completions request bodies {"model", "messages", "tools"?} (with their responses)')
