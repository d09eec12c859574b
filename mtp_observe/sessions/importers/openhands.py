"""openhands: OpenHands trajectories (event streams) and OpenAI-form trajectory rows.

Input, any of (JSON lines, a JSON list, or one JSON document):
- an output line of OpenHands' resolver or evaluation harness, `{"instance_id"? | "issue"?,
  "instruction"?, "history": [EVENT], "metadata"?: {"llm_config": {...}}, ...}`;
- a saved trajectory: a list of EVENTs (or `{"history": [...]}` / `{"trajectory": [EVENT]}`);
- an OpenAI-form row as in public HF datasets (nebius/SWE-rebench-openhands-trajectories):
  `{"instance_id", "trajectory": [OpenAI messages] (or its JSON text), "tools"?: [...] (or JSON text)}`.

EVENTs come in two forms (OpenHands/OpenHands, openhands/events/serialization/event.py):
- the function-calling form: `{"id", "source": "agent"|"user"|"environment", "action", "args",
  "tool_call_metadata": {"function_name", "tool_call_id", "model_response", "total_calls_in_response"}}`
  and `{"observation", "content", "extras", "cause", "tool_call_metadata"}`;
- the old flat CodeAct form (the 2024 resolver sample): `{"action", "thought", "command" | "code" |
  "content", ...}` and `{"observation", "content", "command" | "code", "exit_code"}` — no source,
  args or metadata.

Mapping decisions:
- Function-calling form, as OpenHands' own ConversationMemory builds the prompt
  (openhands/memory/conversation_memory.py): the `system` action's `args.content` is the system
  message and its `args.tools` the tool schemas; a user `message` action is a user message; every
  agent action carrying `tool_call_metadata` stands for the LLM response in
  `model_response.choices[0].message` — one assistant message per response id (content, tool
  calls, reasoning_content), however many actions the response produced; an observation with
  `tool_call_metadata` is the `tool` message for its `tool_call_id`, its `content` as logged (the
  prefix/suffix lines OpenHands adds when it sends a command's output are not in the log); an
  agent `message` action without metadata is an assistant message (`args.content`). Other events
  (state changes, recalls, condensations, observations of no call) are not conversation turns:
  counted (`non_message_events`).
- Old flat form: the model's own messages were never recorded, only its parsed actions, so each
  action becomes a synthetic assistant turn — content = `thought`, one tool call: `run` ->
  `execute_bash {command}`, `run_ipython` -> `execute_ipython_cell {code}`, `finish` -> `finish`
  with its `outputs`, any other action -> a call named by the action with its fields — and the
  observation after it is that call's result. Call ids are made up (`call_<n>`). The first
  event's `content` is the user instruction; a later `message` action is the agent's text.
  These sessions are marked `original.reconstructed: true`: what they score is a rendering of
  the parsed actions, not the text the model produced.
- Rows: `trajectory` is already OpenAI chat (chat.py converts it), `tools` its schemas.
- System prompt and tools: what the log holds; otherwise recorded missing (`--tools FILE` supplies
  schemas). Sampling: `metadata.llm_config` (temperature, top_p, top_k, max_output_tokens ->
  max_tokens; vLLM's names, common.py) when the output line has it; the model from its `model`.
- id: `instance_id`, else `<owner>/<repo>#<number>` of a resolver `issue`, else `<file stem>:<n>`.
  `original` keeps instance_id, the issue, success / resolved and the model.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Iterator

from . import chat
from .common import (
    Malformed,
    Options,
    Rejected,
    Source,
    as_dict,
    as_list,
    as_str,
    loads,
    objects,
    originals,
    sampling_params,
)

FORMAT = "openhands"
FLAT_TOOLS = {"run": ("execute_bash", "command"), "run_ipython": ("execute_ipython_cell", "code")}
FLAT_SKIP = {"action", "thought", "keep_prompt", "is_confirmed", "action_risk", "security_risk", "kernel_init_code",
             "images_urls", "image_urls", "wait_for_response", "blocking", "timeout", "hidden", "confirmation_state"}
LLM_CONFIG_NAMES = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "max_output_tokens": "max_tokens",
                    "seed": "seed"}


# ---------------------------------------------------------------------------------------------
# Detection


def _is_event(e) -> bool:
    return isinstance(e, dict) and ("action" in e or "observation" in e)


def detect(obj) -> bool:
    if isinstance(obj, list):
        return bool(obj) and all(_is_event(e) for e in obj[:5]) and any("source" in e for e in obj[:5] if isinstance(e, dict))
    if not isinstance(obj, dict):
        return False
    if "instance_id" in obj and isinstance(obj.get("trajectory"), (list, str)) and "messages" not in obj:
        return True
    history = obj.get("history")
    return (isinstance(history, list) and bool(history) and all(_is_event(e) or "content" in e for e in history[:5] if isinstance(e, dict))
            and any(k in obj for k in ("instruction", "instance_id", "issue", "metadata", "git_patch", "test_result")))


# ---------------------------------------------------------------------------------------------
# Event streams (pure)


def _is_flat(events: list) -> bool:
    return not any(isinstance(e, dict) and ("source" in e or "args" in e or "tool_call_metadata" in e) for e in events)


def flat_events(events: list, where: str, dropped: Counter) -> list[dict]:
    """The old flat CodeAct form -> reconstructed messages (see the module docstring)."""
    messages: list[dict] = []
    pending: str | None = None  # the id of the call waiting for its observation
    n_calls = 0
    for k, (w, e) in enumerate(objects(events, where)):
        action, observation = e.get("action"), e.get("observation")
        if k == 0 and observation is None and action in (None, "message"):
            messages.append({"role": "user", "content": as_str(e.get("content"), f"{w}.content", optional=True) or ""})
            continue
        if action == "message":
            messages.append({"role": "assistant", "content": as_str(e.get("content"), f"{w}.content", optional=True) or ""})
            pending = None
        elif isinstance(action, str):
            n_calls += 1
            name, field = FLAT_TOOLS.get(action, (action, None))
            if field is not None:
                args = {field: e.get(field)}
            elif action == "finish":
                args = e.get("outputs") if isinstance(e.get("outputs"), dict) else {}
            else:
                args = {key: v for key, v in e.items() if key not in FLAT_SKIP}
            pending = f"call_{n_calls}"
            messages.append({"role": "assistant", "content": as_str(e.get("thought"), f"{w}.thought", optional=True) or "",
                             "tool_calls": [{"id": pending, "type": "function", "function": {"name": name, "arguments": args}}]})
        elif isinstance(observation, str):
            if pending is None:
                dropped["non_message_events"] += 1
                continue
            messages.append({"role": "tool", "tool_call_id": pending, "content": _observation_text(e.get("content"), w)})
            pending = None
        else:
            dropped["non_message_events"] += 1
    return messages


def _observation_text(content, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return json.dumps(content, ensure_ascii=False)


def fc_events(events: list, where: str, dropped: Counter) -> tuple[list[dict], list[dict] | None]:
    """The function-calling form -> (messages, tool schemas from the system action or None)."""
    messages: list[dict] = []
    tools = None
    seen_responses: set = set()
    for w, e in objects(events, where):
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        meta_ = e.get("tool_call_metadata")
        source = e.get("source")
        action = e.get("action")
        if action == "system":
            messages.append({"role": "system", "content": as_str(args.get("content"), f"{w}.args.content", optional=True) or ""})
            if args.get("tools") is not None:
                tools = chat.tools(args["tools"], f"{w}.args.tools", dropped)
        elif action is not None and isinstance(meta_, dict):
            response = as_dict(meta_.get("model_response"), f"{w}.tool_call_metadata.model_response")
            rid = response.get("id")
            key = rid if rid is not None else id(response)
            if key in seen_responses:
                continue  # another action of a response already in the conversation
            seen_responses.add(key)
            reply = chat.response_message(response, f"{w}.tool_call_metadata.model_response", dropped)
            if reply is None:
                raise Malformed(f"{w}.tool_call_metadata.model_response", "has no choices[0].message")
            messages.append(reply)
        elif action == "message":
            text = as_str(args.get("content", e.get("message")), f"{w}.args.content", optional=True) or ""
            messages.append({"role": "user" if source == "user" else "assistant", "content": text})
        elif e.get("observation") is not None and isinstance(meta_, dict):
            messages.append({"role": "tool", "tool_call_id": as_str(meta_.get("tool_call_id"), f"{w}.tool_call_metadata.tool_call_id"),
                             "content": _observation_text(e.get("content"), w)})
        else:
            dropped["non_message_events"] += 1
    return messages, tools


def _json_field(value, where: str):
    return loads(value, where) if isinstance(value, str) else value


def convert_record(label: str, number: int | None, record) -> tuple[chat.Conversation, dict]:
    """Pure: one output line, trajectory or row -> (its Conversation, ids for the session)."""
    dropped = chat.counts()
    reconstructed = False
    tools = None
    if isinstance(record, list):
        record = {"history": record}
    record = as_dict(record, label)
    if "trajectory" in record and "history" not in record and not (isinstance(record["trajectory"], list) and record["trajectory"]
                                                                   and _is_event(record["trajectory"][0])):
        history = chat.messages(as_list(_json_field(record["trajectory"], f"{label}.trajectory"), f"{label}.trajectory"), f"{label}.trajectory", dropped)
        if record.get("tools") is not None:
            tools = chat.tools(_json_field(record["tools"], f"{label}.tools"), f"{label}.tools", dropped)
    else:
        events = as_list(record.get("history", record.get("trajectory")), f"{label}.history")
        if _is_flat(events):
            history = flat_events(events, f"{label}.history", dropped)
            reconstructed = True
        else:
            history, tools = fc_events(events, f"{label}.history", dropped)
        if not history or history[0]["role"] not in ("system", "user"):
            instruction = record.get("instruction")
            if isinstance(instruction, str):
                history.insert(0, {"role": "user", "content": instruction})
    metadata = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    llm = metadata.get("llm_config") if isinstance(metadata.get("llm_config"), dict) else {}
    sampling = sampling_params(llm, f"{label}.metadata.llm_config", names=LLM_CONFIG_NAMES)
    issue = record.get("issue") if isinstance(record.get("issue"), dict) else {}
    issue_ref = (f"{issue['owner']}/{issue['repo']}#{issue['number']}"
                 if all(isinstance(issue.get(k), (str, int)) and not isinstance(issue.get(k), bool) for k in ("owner", "repo", "number")) else None)
    original = originals(instance_id=record.get("instance_id"), issue=issue_ref, success=record.get("success"),
                         resolved=record.get("resolved"), model=llm.get("model", record.get("model")))
    if reconstructed:
        original["reconstructed"] = True
    missing = set() if history and history[0]["role"] == "system" else {"system_prompt"}
    conv = chat.Conversation(label, history, tools or [], sampling, original, dropped, missing, number)
    return conv, {"instance_id": record.get("instance_id"), "issue": issue_ref}


def items_of(source: Source):
    if source.is_json_lines():
        yield from ((f"line {n}", n, obj) for n, obj in source.lines())
        return
    document = source.document()
    if isinstance(document, list) and document and all(_is_event(e) for e in document[:5]):
        yield ("the file", None, document)
    elif isinstance(document, list):
        yield from ((f"[{i}]", i, obj) for i, obj in enumerate(document))
    else:
        yield ("the file", None, document)


def read(source: Source, options: Options) -> Iterator:
    try:
        for label, number, record in items_of(source):
            try:
                conv, ids = convert_record(label, number, record)
            except Malformed as e:
                yield Rejected(str(e))
                continue
            sid = ids["instance_id"] if isinstance(ids["instance_id"], str) and ids["instance_id"] else ids["issue"]
            if not sid:
                sid = source.stem if number is None else f"{source.stem}:{number}"
            yield chat.to_session(conv, FORMAT, source, sid, options)
    except Malformed as e:
        raise source.error(f"{e}; expected OpenHands output lines {{\"history\": [events]}}, trajectories or rows {{\"instance_id\", \"trajectory\"}}")
