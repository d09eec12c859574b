"""Fuzzing the readers, the importers and the checkpoint reader: strategies and the properties every input must keep.

Inputs are mostly real-looking records, written here by hand in each format's shape, then
mutated where it hurts — a key deleted, a value of the wrong type, a bad JSON string where
arguments go, unicode and lone surrogates, huge numbers, NaN, deep nesting — and serialised the
way the format is stored (a JSON document, JSON lines, YAML), sometimes with the bytes cut or
corrupted. A few inputs are plain random bytes.

Properties (in-process):
  * an importer either writes sessions that the canonical reader accepts, or raises a UserError
    whose message is one line naming the file; nothing else escapes;
  * the reader yields sessions or Skipped items, or raises a UserError; every session it yields
    renders or is refused with a UserError;
  * through the CLI, every run exits 0 or 2, and a refusal is exactly one line on stderr;
  * a checkpoint with one file mutated (config.json's values, a shard's safetensors header — its
    JSON mutated or its bytes cut or damaged, the shard index, generation_config.json,
    tokenizer_config.json) makes inspect, sessions and replay exit 0 or 2 with one line, never a
    traceback; an accepted inspect prints byte totals that add up.
`RUNS` counts the inputs each property has seen (the slow test reports the total).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
from collections import Counter
from pathlib import Path

import yaml
from hypothesis import strategies as st

from mtp_observe.cli import main
from mtp_observe.errors import UserError
from mtp_observe.sessions.importers import import_files
from mtp_observe.sessions.reading import Session, Skipped, read_sessions

from .strict_json import check_report_output

RUNS: Counter = Counter()
OUTCOMES: Counter = Counter()  # per property: "wrote sessions", "refused", ... (a fuzzer that only reaches refusals is weak)

# ---------------------------------------------------------------------------------------------
# Seeds: one small record per shape, in the format's own layout


def _tau_bench_seed():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_user", "arguments": "{\"user_id\": \"ana_1\"}"}}
    return [{"task_id": 0, "trial": 0, "reward": 1.0, "info": {"source": "user"}, "traj": [
        {"role": "system", "content": "You are an airline agent."},
        {"role": "user", "content": "Change my flight."},
        {"content": None, "role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_user", "content": "{\"name\": \"Ana\"}"},
        {"role": "assistant", "content": "Done, Ana.", "reasoning_content": "Checked."},
    ]}, {"task_id": 1, "trial": 2, "traj": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}]


def _tau2_seed():
    return {"info": {"environment_info": {"domain_name": "telecom", "policy": "Be kind.", "tool_defs": None}, "agent_info": {"llm": "m"}},
            "simulations": [{"id": "s1", "task_id": "3", "trial": 0, "reward_info": {"reward": 1.0}, "messages": [
                {"role": "assistant", "content": "Hi! How can I help you today?", "raw_data": None},
                {"role": "user", "content": "No signal."},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "check", "arguments": {"a": 1}, "requestor": "assistant"}],
                 "raw_data": {"message": {"reasoning_content": "Look it up."}}},
                {"role": "tool", "id": "c1", "content": "ok", "requestor": "assistant"},
                {"role": "user", "content": "", "tool_calls": [{"id": "u1", "name": "reboot", "arguments": {}, "requestor": "user"}]},
                {"role": "tool", "id": "u1", "content": "rebooted", "requestor": "user"},
                {"role": "tool", "tool_messages": [{"id": "c1", "role": "tool", "content": "again", "requestor": "assistant"}]},
                {"role": "assistant", "content": "Fixed.", "raw_data": {"choices": [{"message": {"reasoning": "Done."}}]}},
            ]}]}


def _mini_swe_seed():
    response = {"choices": [{"message": {"role": "assistant", "content": "x", "reasoning": "Think first.",
                                         "reasoning_details": [{"type": "reasoning.text", "text": "Think first."}]}}]}
    return {"trajectory_format": "mini-swe-agent-1", "instance_id": "repo__repo-1",
            "info": {"exit_status": "Submitted", "config": {"model": {"model_name": "g"}}},
            "messages": [
                {"role": "system", "content": "Use bash."},
                {"role": "user", "content": [{"type": "text", "text": "Fix the bug."}]},
                {"role": "assistant", "content": "THOUGHT: look.\n\n```bash\nls\n```", "extra": {"response": response}},
                {"role": "user", "content": "<returncode>0</returncode>"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "t", "function": {"name": "bash", "arguments": "{\"c\": 1}"}}]},
                {"role": "tool", "tool_call_id": "t", "content": "out"},
                {"role": "exit", "content": "Submitted"},
            ]}


def _claude_code_seed():
    base = {"isSidechain": False, "sessionId": "sess", "uuid": "u", "parentUuid": None, "version": "2.1"}
    return [
        {"type": "queue-operation", "operation": "dequeue", "sessionId": "sess"},
        {**base, "type": "user", "message": {"role": "user", "content": "Do it."}},
        {**base, "type": "assistant", "message": {"id": "m1", "role": "assistant", "model": "c", "content": [{"type": "thinking", "thinking": "Plan.", "signature": "s"}]}},
        {**base, "type": "assistant", "message": {"id": "m1", "role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]}},
        {**base, "type": "user", "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "a"}]}]}},
        {**base, "type": "assistant", "isSidechain": True, "message": {"id": "m2", "role": "assistant", "content": "side"}},
        {"type": "system", "subtype": "compact_boundary", "sessionId": "sess"},
        {**base, "type": "user", "message": {"role": "user", "content": [{"type": "text", "text": "Summary."}, {"type": "image", "source": {}}]}},
        {**base, "type": "assistant", "message": {"id": "m3", "role": "assistant", "content": [{"type": "text", "text": "Done."}, {"type": "redacted_thinking", "data": "x"}]}},
    ]


def _anthropic_body():
    return {"model": "claude", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief."}],
            "tools": [{"name": "get", "description": "Get.", "input_schema": {"type": "object", "properties": {}}}, {"type": "web_search", "name": "ws"}],
            "messages": [
                {"role": "user", "content": "Where?"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "Call.", "signature": "s"},
                                                  {"type": "tool_use", "id": "tu", "name": "get", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu", "content": "Paris"}, {"type": "text", "text": "Thanks"}]},
            ]}


def _anthropic_cassette():
    body = _anthropic_body()
    reply = {"id": "msg", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "Paris."}]}
    longer = dict(body, messages=body["messages"] + [{"role": "assistant", "content": reply["content"]}, {"role": "user", "content": "And?"}])
    return {"interactions": [
        {"request": {"uri": "https://api.anthropic.com/v1/messages", "method": "POST", "parsed_body": body}, "response": {"parsed_body": reply}},
        {"request": {"uri": "https://api.anthropic.com/v1/messages", "body": json.dumps(longer)}, "response": {"body": {"string": json.dumps(reply)}}},
    ], "version": 1}


def _openai_chat_body():
    return {"model": "gpt-4o-mini", "temperature": 0.2, "max_completion_tokens": 64,
            "tools": [{"type": "function", "function": {"name": "get", "parameters": {"type": "object", "properties": {}}}}],
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Where?"}]},
                         {"role": "assistant", "content": None, "reasoning_content": "Look.",
                          "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{\"q\": 1}"}}]},
                         {"role": "tool", "tool_call_id": "c1", "content": "Paris"}]}


def _openai_chat_lines():
    body = _openai_chat_body()
    reply = {"role": "assistant", "content": "Paris."}
    longer = dict(body, messages=body["messages"] + [reply, {"role": "user", "content": "And?"}])
    return [{"request": body, "response": {"id": "r1", "choices": [{"index": 0, "message": reply}]}}, longer]


def _openai_chat_cassette():
    body = _openai_chat_body()
    sse = "".join(f"data: {json.dumps(c)}\n\n" for c in [
        {"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": "Hm."}}]},
        {"id": "x", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c2", "type": "function", "function": {"name": "get", "arguments": "{\"q\""}}]}}]},
        {"id": "x", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 2}"}}]}}]},
        {"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}]) + "data: [DONE]\n\n"
    return {"interactions": [
        {"request": {"uri": "https://api.openai.com/v1/chat/completions", "body": json.dumps(body)}, "response": {"body": {"string": sse}}},
        {"request": {"uri": "https://api.openai.com/v1/chat/completions", "parsed_body": body},
         "response": {"parsed_body": {"choices": [{"message": {"role": "assistant", "content": "Paris."}}]}}}], "version": 1}


def _responses_cassette():
    body = {"model": "gpt-5", "instructions": "Narrate.", "temperature": 0.5, "max_output_tokens": 99,
            "input": [{"role": "user", "content": "Capital?"}],
            "tools": [{"type": "function", "name": "cap", "parameters": {"type": "object"}}, {"type": "web_search"}]}
    out = [{"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": "Think."}]},
           {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
           {"type": "function_call", "id": "fc", "call_id": "call_1", "name": "cap", "arguments": "{}"}]
    second = dict(body, input=body["input"] + out + [{"type": "function_call_output", "call_id": "call_1", "output": "P"}])
    return {"interactions": [
        {"request": {"uri": "https://api.openai.com/v1/responses", "parsed_body": body}, "response": {"parsed_body": {"id": "resp_1", "output": out, "top_p": 0.9}}},
        {"request": {"uri": "https://api.openai.com/v1/responses", "parsed_body": second},
         "response": {"parsed_body": {"id": "resp_2", "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "P."}]}]}}},
        {"request": {"uri": "https://api.openai.com/v1/responses", "parsed_body": {"model": "gpt-5", "previous_response_id": "resp_2", "input": "More?"}},
         "response": {"parsed_body": {"id": "resp_3", "output": [{"type": "message", "role": "assistant", "content": "No."}]}}}]}


BATCH_OUTPUT = [{"id": "b1", "custom_id": "r-1", "response": {"status_code": 200, "body": {"choices": [{"message": {"role": "assistant", "content": "Hi"}}]}}, "error": None},
                {"id": "b2", "custom_id": "r-2", "response": None, "error": {"code": "x", "message": "failed"}}]


def _batch_input():
    return [{"custom_id": "r-1", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "m", "max_tokens": 10, "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hello"}]}},
            {"custom_id": "r-2", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": [{"role": "user", "content": "x"}]}},
            {"custom_id": "r-3", "method": "POST", "url": "/v1/responses", "body": {"model": "m", "input": "y"}}]


def _otel_export(structured=False):
    def value(v):
        if isinstance(v, str):
            return {"stringValue": v}
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, int):
            return {"intValue": str(v)}
        if isinstance(v, float):
            return {"doubleValue": v}
        if not structured:
            return {"stringValue": json.dumps(v)}
        if isinstance(v, list):
            return {"arrayValue": {"values": [value(x) for x in v]}}
        return {"kvlistValue": {"values": [{"key": k, "value": value(x)} for k, x in v.items()]}}

    def span(sid, end, attrs, events=()):
        return {"traceId": "t1", "spanId": sid, "name": "chat m", "startTimeUnixNano": str(end - 5), "endTimeUnixNano": str(end),
                "attributes": [{"key": k, "value": value(v)} for k, v in attrs.items()], "events": list(events)}

    user = {"role": "user", "parts": [{"type": "text", "content": "Weather?"}]}
    call = {"role": "assistant", "parts": [{"type": "reasoning", "content": "Check."}, {"type": "tool_call", "id": "c", "name": "w", "arguments": {"city": "P"}}]}
    result = {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c", "response": {"t": 20}}]}
    return {"resourceSpans": [{"scopeSpans": [{"spans": [
        span("s1", 100, {"gen_ai.operation.name": "chat", "gen_ai.request.temperature": 0.3, "gen_ai.input.messages": [user], "gen_ai.output.messages": [call],
                         "gen_ai.tool.definitions": [{"type": "function", "name": "w", "parameters": {"type": "object"}}], "gen_ai.system_instructions": [{"type": "text", "content": "S"}]}),
        span("s2", 200, {"gen_ai.operation.name": "chat", "gen_ai.input.messages": [user, call, result],
                         "gen_ai.output.messages": [{"role": "assistant", "parts": [{"type": "text", "content": "20."}], "finish_reason": "stop"}]}),
        span("s3", 300, {"gen_ai.operation.name": "chat", "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "Hi",
                         "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": "Yo", "gen_ai.conversation.id": "c9"}),
        span("s4", 400, {"gen_ai.operation.name": "chat"}, [{"name": "gen_ai.user.message", "attributes": [{"key": "content", "value": {"stringValue": "Q"}}]},
                                                             {"name": "gen_ai.choice", "attributes": [{"key": "message", "value": {"stringValue": "{}"}}]}]),
        span("s5", 500, {"gen_ai.operation.name": "execute_tool"}),
    ]}]}]}


def _litellm_payloads():
    base = {"call_type": "completion", "status": "success", "model": "gpt-4o", "hidden_params": {"litellm_model_name": "gpt-4o"},
            "error_information": {"error_message": ""}, "trace_id": "tr", "model_parameters": {"temperature": 0.1, "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {}}}]}}
    q = [{"role": "user", "content": "Hi"}]
    a = {"role": "assistant", "content": "", "tool_calls": [{"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    return [dict(base, id="1", startTime=1.0, messages=q, response={"choices": [{"message": a}]}),
            dict(base, id="2", startTime="2025-01-24 09:20:46.8", messages=q + [a, {"role": "tool", "tool_call_id": "t", "content": "ok"}],
                 response={"choices": [{"message": {"role": "assistant", "content": "Done", "thinking_blocks": [{"type": "thinking", "thinking": "T"}]}}]}),
            dict(base, id="3", status="failure", messages=q, response={}, error_information={"error_message": "boom"})]


def _vllm_log():
    prompt, out = [1, 5, 9, 2, 1, 7], [11, 12, 2]
    return [
        "INFO 05-12 10:00:00 [api_server.py:1] non-default args: {'model': 'q', 'enable_log_requests': True}",
        f"DEBUG 05-12 10:00:01 [logger.py:43] Request r1 details: prompt: 'a\\nb', prompt_token_ids: {prompt}, prompt_embeds shape: None.",
        "INFO 05-12 10:00:01 [logger.py:43] Received request r1: params: SamplingParams(n=1, temperature=0.7, top_p=0.8, top_k=-1, seed=None, "
        "stop=['x, y'], structured_outputs=StructuredOutputsParams(json={'a': [1]}), max_tokens=None), lora_request: None.",
        "DEBUG 05-12 10:00:01 [logger.py:43] Request r1 JSON body: {\"model\": \"q\"}",
        f"DEBUG 05-12 10:00:02 [logger.py:43] Generated response r1 details: output_token_ids: {out}",
        "INFO 05-12 10:00:02 [logger.py:43] Generated response r1: output: 'ok', finish_reason: stop",
        f"INFO 05-12 10:00:03 [logger.py:43] Received request r2: prompt: 'c', params: SamplingParams(temperature=0.1), prompt_token_ids: {prompt + out + [4]}, lora_request: None.",
        "DEBUG 05-12 10:00:04 [logger.py:43] Generated response r2 (streaming delta) details: output_token_ids: [3]",
        "DEBUG 05-12 10:00:04 [logger.py:43] Generated response r2 (streaming delta) details: output_token_ids: [2]",
        "INFO 05-12 10:00:04 [logger.py:43] Generated response r2 (streaming complete): output: 'z', finish_reason: streaming_complete",
    ]


def _openhands_flat():
    return [{"instruction": "Fix it.", "issue": {"owner": "o", "repo": "r", "number": 1}, "success": True, "history": [
        {"content": "Fix it.", "action": "message", "images_urls": None},
        {"command": "ls", "thought": "Look.", "action": "run", "keep_prompt": True},
        {"content": "a b", "command": "ls", "exit_code": 0, "observation": "run"},
        {"code": "print(1)", "thought": "", "action": "run_ipython"},
        {"content": "1", "code": "print(1)", "observation": "run_ipython"},
        {"outputs": {}, "thought": "Done.", "action": "finish"}]}]


def _openhands_fc():
    response = {"id": "resp1", "choices": [{"message": {"role": "assistant", "content": "Run both.", "reasoning_content": "Two calls.", "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "execute_bash", "arguments": "{\"command\": \"ls\"}"}},
        {"id": "t2", "type": "function", "function": {"name": "execute_bash", "arguments": "{\"command\": \"pwd\"}"}}]}}]}
    meta = lambda tid: {"function_name": "execute_bash", "tool_call_id": tid, "model_response": response, "total_calls_in_response": 2}
    return [{"id": 0, "source": "agent", "action": "system", "args": {"content": "You are OpenHands.", "tools": [{"type": "function", "function": {"name": "execute_bash", "parameters": {}}}]}},
            {"id": 1, "source": "user", "action": "message", "args": {"content": "List."}},
            {"id": 2, "source": "agent", "action": "run", "args": {"command": "ls"}, "tool_call_metadata": meta("t1")},
            {"id": 3, "source": "agent", "action": "run", "args": {"command": "pwd"}, "tool_call_metadata": meta("t2")},
            {"id": 4, "source": "environment", "observation": "run", "content": "a", "extras": {}, "tool_call_metadata": meta("t1")},
            {"id": 5, "source": "environment", "observation": "run", "content": "/w", "extras": {}, "tool_call_metadata": meta("t2")},
            {"id": 6, "source": "environment", "observation": "agent_state_changed", "content": "", "extras": {}},
            {"id": 7, "source": "agent", "action": "message", "args": {"content": "Done."}}]


def _openhands_rows():
    return [{"instance_id": "x__y-1", "resolved": True, "tools": json.dumps([{"type": "function", "function": {"name": "bash", "parameters": {}}}]),
             "trajectory": [{"role": "system", "content": "S"}, {"role": "user", "content": "Fix"},
                            {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
                            {"role": "tool", "tool_call_id": "a", "content": "ok"}, {"role": "assistant", "content": "Fixed."}]}]


def _canonical_seed():
    return [
        {"id": "a", "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "q"}]},
                                 {"role": "assistant", "reasoning_content": "r", "content": "c",
                                  "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
                                 {"role": "tool", "tool_call_id": "1", "content": "out"}, {"role": "assistant", "thinking": "t", "content": "done"}],
         "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "meta": {"k": 1}},
        {"prompt_token_ids": [1, 2, 3], "completion_token_ids": [4, 5]},
        {"id": "r", "requests": [{"prompt_token_ids": [1], "completion_token_ids": [2]}]},
    ]


def _message_lines_seed():
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "tool_calls": [{"id": "x", "function": {"name": "g", "arguments": {}}}]},
            {"role": "tool", "tool_call_id": "x", "content": "r"}, {"role": "assistant", "content": "b"}]


# A Batch input file is written with its (unmutated) output file beside it, given to the import too.
BATCH_SUFFIX = ".batch.jsonl"

# (name, seed builder, layout, file suffix): layout "document" = one JSON value, "lines" = one per line, "yaml",
# "text" = one string per line (a server log)
SEEDS = {
    "tau-bench": [(_tau_bench_seed, "document", ".json")],
    "tau2-bench": [(_tau2_seed, "document", ".json")],
    "mini-swe-agent": [(_mini_swe_seed, "document", ".traj.json")],
    "claude-code": [(_claude_code_seed, "lines", ".jsonl")],
    "anthropic": [(_anthropic_body, "document", ".json"), (lambda: [_anthropic_body(), _anthropic_body()], "lines", ".jsonl"),
                  (_anthropic_cassette, "yaml", ".yaml")],
    "openai-chat": [(_openai_chat_body, "document", ".json"), (_openai_chat_lines, "lines", ".jsonl"), (_openai_chat_cassette, "yaml", ".yaml")],
    "openai-responses": [(_responses_cassette, "yaml", ".yaml"),
                         (lambda: {"request": _responses_cassette()["interactions"][1]["request"]["parsed_body"]}, "document", ".json")],
    "openai-batch": [(_batch_input, "lines", BATCH_SUFFIX)],
    "otel-genai": [(_otel_export, "document", ".json"), (lambda: [_otel_export(True), _otel_export()], "lines", ".jsonl")],
    "litellm": [(_litellm_payloads, "lines", ".jsonl"), (lambda: {"standard_logging_object": _litellm_payloads()[0]}, "document", ".json")],
    "vllm-log": [(_vllm_log, "text", ".log")],
    "openhands": [(_openhands_flat, "lines", ".jsonl"), (_openhands_fc, "document", ".json"), (_openhands_rows, "lines", ".jsonl")],
    "canonical": [(_canonical_seed, "lines", ".jsonl"), (_message_lines_seed, "lines", ".jsonl")],
}


# ---------------------------------------------------------------------------------------------
# Mutation

WEIRD_TEXT = ["", " ", "\n", "\u2028", "\x00", "\ud800", "a\udfffb", "\U0001f600", "é" * 3, "<|im_end|>", "{", "{oops",
              "[1, 2]", "5", "null", "\"quoted\"", "{\"a\": [", "x" * 300, "<tool_call>", "{domain_policy}", "\\u00"]
WEIRD_NUMBERS = [0, -1, 1, 2 ** 63, -(2 ** 64), 10 ** 40, 1e308, -0.0, 0.5, float("nan"), float("inf"), True, False]

scalars = st.one_of(st.none(), st.booleans(), st.sampled_from(WEIRD_NUMBERS), st.integers(), st.floats(allow_nan=True),
                    st.sampled_from(WEIRD_TEXT), st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.sampled_from(["role", "content", "type", "id", "text", "name", "messages", "x"]) | st.text(max_size=5), inner, max_size=4)),
                           max_leaves=12)


def _nodes(value, path=()):
    """Every (path, node) in a JSON tree down to depth 30, root first."""
    yield path, value
    if len(path) >= 30:
        return
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _nodes(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _nodes(v, path + (i,))


def _set(root, path, value):
    if not path:
        return value
    parent = root
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return root


def _delete(root, path):
    parent = root
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    return root


@st.composite
def mutated(draw, seed):
    """The seed with 0..4 mutations at random places."""
    value = copy.deepcopy(seed)
    for _ in range(draw(st.integers(0, 4))):
        nodes = list(_nodes(value))
        path, node = draw(st.sampled_from(nodes))
        op = draw(st.sampled_from(["replace", "replace", "delete", "retype", "text", "grow", "copy"]))
        if op == "delete" and path:
            value = _delete(value, path)
        elif op == "replace":
            value = _set(value, path, draw(json_values))
        elif op == "retype":
            retyped = {dict: lambda v: list(v.values()), list: lambda v: {str(i): x for i, x in enumerate(v)}, str: lambda v: [v],
                       type(None): lambda v: "", bool: lambda v: str(v), int: lambda v: str(v), float: lambda v: [v]}
            value = _set(value, path, retyped.get(type(node), lambda v: None)(node))
        elif op == "text":
            value = _set(value, path, draw(st.sampled_from(WEIRD_TEXT)) + (node if isinstance(node, str) and draw(st.booleans()) else ""))
        elif op == "grow":
            if isinstance(node, list):
                node.extend(copy.deepcopy(node[: draw(st.integers(0, 3))]))
            elif isinstance(node, dict):
                node[draw(st.sampled_from(["role", "content", "tool_calls", "requestor", "id", "type", "isSidechain", "raw_data", "extra"]))] = draw(json_values)
        elif op == "copy" and len(nodes) > 1:  # one part of the record where another belongs (ids, messages, blocks)
            _, other = draw(st.sampled_from(nodes[1:]))
            value = _set(value, path, copy.deepcopy(other))
    if draw(st.integers(0, 24)) == 0:  # deep nesting somewhere (last: nothing walks it afterwards)
        path, _ = draw(st.sampled_from(list(_nodes(value))))
        value = _set(value, path, _nested(draw(st.sampled_from([50, 300, 3000]))))
    return value


def _nested(depth):
    v: object = "bottom"
    for i in range(depth):
        v = [v] if i % 2 else {"content": v}
    return v


def serialise(value, layout: str, ascii_only: bool) -> bytes:
    try:
        if layout == "yaml":
            return yaml.safe_dump(value, allow_unicode=not ascii_only).encode("utf-8", "surrogatepass")
        if layout == "text":
            lines = value if isinstance(value, list) else [value]
            text = "".join((v if isinstance(v, str) else json.dumps(v, ensure_ascii=ascii_only)) + "\n" for v in lines)
            return text.encode("utf-8", "surrogatepass")
        if layout == "lines" and isinstance(value, list):
            text = "".join(json.dumps(v, ensure_ascii=ascii_only) + "\n" for v in value)
        else:
            text = json.dumps(value, ensure_ascii=ascii_only)
    except (RecursionError, ValueError):
        text = "[" * 5000  # too deep to serialise: the parser must refuse it just as cleanly
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate written raw is invalid UTF-8: good input too


@st.composite
def corrupted(draw, data: bytes):
    """Sometimes cut or damage the bytes (a truncated log, a flipped byte, a stray BOM)."""
    kind = draw(st.sampled_from(["none", "none", "none", "truncate", "flip", "insert", "bom"]))
    if not data or kind == "none":
        return data
    i = draw(st.integers(0, len(data) - 1))
    if kind == "truncate":
        return data[:i]
    if kind == "flip":
        return data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]
    if kind == "insert":
        return data[:i] + draw(st.binary(min_size=1, max_size=4)) + data[i:]
    return b"\xef\xbb\xbf" + data


@st.composite
def log_files(draw, fmt: str):
    """(bytes, suffix) of a file in format `fmt` ("canonical" for the reader), mostly mutated seeds."""
    build, layout, suffix = draw(st.sampled_from(SEEDS[fmt]))
    if draw(st.integers(0, 19)) == 0:
        return draw(st.binary(max_size=200)), suffix
    value = draw(mutated(build()))
    return draw(corrupted(serialise(value, layout, draw(st.booleans())))), suffix


# ---------------------------------------------------------------------------------------------
# Properties


def write_input(data: bytes, suffix: str, directory: Path) -> list[Path]:
    """The input file (and, for a Batch input, its output file beside it): the paths to import."""
    path = directory / f"input{suffix}"
    path.write_bytes(data)
    if suffix != BATCH_SUFFIX:
        return [path]
    output = directory / "input.output.jsonl"
    output.write_text("".join(json.dumps(line) + "\n" for line in BATCH_OUTPUT))
    return [path, output]


def check_import(fmt: str, data: bytes, suffix: str, directory: Path, on_error: str = "fail") -> None:
    """The importer writes only sessions the reader accepts, or refuses in one line naming the file."""
    RUNS[f"import {fmt}"] += 1
    paths = write_input(data, suffix, directory)
    out = directory / "out.jsonl"
    try:
        counts = import_files(fmt, paths, out, on_error=on_error)
    except UserError as e:
        message = str(e)
        assert "\n" not in message and any(str(p) in message for p in paths), message
        OUTCOMES[f"import {fmt}: refused"] += 1
        return
    items = list(read_sessions([out])) if out.stat().st_size else []  # raises if a written session is invalid
    assert all(isinstance(s, Session) for s in items)
    assert len(items) == sum(c.sessions for c in counts)
    OUTCOMES[f"import {fmt}: " + ("wrote sessions" if items else "wrote none")] += 1


def check_read(data: bytes, suffix: str, directory: Path, renderer, on_error: str) -> None:
    """The reader yields sessions or Skipped, or raises a UserError; its sessions render or are refused."""
    RUNS["read sessions"] += 1
    path = directory / f"input{suffix}"
    path.write_bytes(data)
    try:
        for item in read_sessions([path], on_error=on_error):
            assert isinstance(item, (Session, Skipped))
            OUTCOMES[f"read: {type(item).__name__}"] += 1
            if isinstance(item, Session) and renderer is not None:
                try:
                    renderer.render(item)
                    OUTCOMES["read: rendered"] += 1
                except UserError as e:
                    assert "\n" not in str(e)
    except UserError as e:
        assert "\n" not in str(e)
        OUTCOMES["read: refused"] += 1


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """main(argv) in this process: (exit code, stdout, stderr)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main(argv)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    check_report_output(argv, code, stdout.getvalue())  # every report JSON is strict JSON (tests/strict_json.py)
    return code, stdout.getvalue(), stderr.getvalue()


def check_cli(argv: list[str], key: str) -> None:
    """Exit 0, or exit 2 with exactly one line on stderr and no traceback."""
    RUNS[key] += 1
    code, _, err = run_cli(argv)
    assert code in (0, 2), (code, err)
    OUTCOMES[f"{key}: exit {code}"] += 1
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err


# ---------------------------------------------------------------------------------------------
# Checkpoints: one file mutated at a time

CHECKPOINT_JSON = ("config.json", "model.safetensors.index.json", "generation_config.json", "tokenizer_config.json")


def checkpoint_files(directory: Path) -> dict[str, bytes]:
    """The files the mutations touch, as they are (to restore after each example)."""
    names = [n for n in CHECKPOINT_JSON if (directory / n).exists()] + sorted(p.name for p in directory.glob("*.safetensors"))
    return {n: (directory / n).read_bytes() for n in names}


@st.composite
def checkpoint_mutation(draw, pristine: dict[str, bytes]):
    """(file name, its new bytes): a JSON file with mutated values, or a shard whose header is mutated."""
    import struct

    name = draw(st.sampled_from(sorted(pristine)))
    data = pristine[name]
    if not name.endswith(".safetensors"):
        return name, draw(corrupted(serialise(draw(mutated(json.loads(data))), "document", draw(st.booleans()))))
    (n,) = struct.unpack("<Q", data[:8])
    header, rest = data[8:8 + n], data[8 + n:]
    kind = draw(st.sampled_from(["values", "values", "bytes", "length", "data"]))
    if kind == "values":
        header = serialise(draw(mutated(json.loads(header))), "document", True)
    elif kind == "bytes":
        header = draw(corrupted(header))
    elif kind == "data":
        rest = draw(corrupted(rest))
    length = len(header) if kind != "length" else draw(st.sampled_from([0, 1, len(header) - 1, len(header) + 1, 2 ** 40, 2 ** 64 - 1]))
    return name, struct.pack("<Q", length) + header + rest


def check_checkpoint(directory: Path, pristine: dict[str, bytes], mutation: tuple[str, bytes], commands: list[list[str]]) -> None:
    """Each command exits 0 or 2 with one line (check_cli); an accepted inspect's totals add up."""
    name, data = mutation
    (directory / name).write_bytes(data)
    try:
        for argv in commands:
            key = f"cli {argv[0]} (checkpoint)"
            RUNS[key] += 1
            code, out, err = run_cli(argv)
            lines = [line for line in err.strip().splitlines() if not line.startswith("replaying ")]
            assert code in (0, 2) and "Traceback" not in err, (name, argv[0], code, err)
            OUTCOMES[f"{key}: exit {code}"] += 1
            if code == 2:
                assert len(lines) == 1 and lines[0].startswith("error: "), (name, err)
            elif argv[0] == "inspect":
                report = json.loads(out)
                assert report["head"]["bytes"] == sum(t["bytes"] for t in report["head"]["tensors"])
    finally:
        (directory / name).write_bytes(pristine[name])


# ---------------------------------------------------------------------------------------------
# compare's inputs: what an engine counted (vLLM /metrics text, vLLM per-request JSON, SGLang decode logs)

NUMBER_TEXT = ["nan", "NaN", "+Inf", "-Inf", "-1", "0", "1.5", "1e400", "1e18", "99999999999999999999", "0x10", "", "1_000",
               "-0", "3.0", "1e-300", "７"]
_LABELS = 'engine="0",model_name="Qwen/Qwen3.5-0.8B"'


def _scrape_lines(drafts=100, draft_tokens=400, accepted=250, per_pos=(90, 70, 50, 40), stamp=""):
    lines = ["# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.", "# TYPE vllm:spec_decode_num_drafts counter"]
    for name, value in (("num_drafts", drafts), ("num_draft_tokens", draft_tokens), ("num_accepted_tokens", accepted)):
        lines += [f"vllm:spec_decode_{name}_total{{{_LABELS}}} {value}{stamp}", f"vllm:spec_decode_{name}_created{{{_LABELS}}} 1.7e9"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{_LABELS},position="{p}"}} {v}{stamp}'
              for p, v in enumerate(per_pos)]
    return lines


@st.composite
def prometheus_text(draw) -> str:
    """One or two /metrics scrapes (with or without timestamps), then line-level mutations: a number replaced by
    one that cannot be a count, a line deleted, duplicated or cut, a label changed, a position renumbered."""
    lines = _scrape_lines()
    if draw(st.booleans()):  # a second scrape, later, larger (or not)
        stamp = draw(st.sampled_from(["", " 1764583200000", " 1764583260000"]))
        lines = _scrape_lines(stamp=" 1764583200000") + _scrape_lines(200, 800, 500, (180, 140, 100, 80), stamp)
    for _ in range(draw(st.integers(0, 5))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["number", "number", "number", "delete", "duplicate", "cut", "label", "position", "junk"]))
        line = lines[i]
        if op == "number" and " " in line:
            head, sep, tail = line.partition("} ") if "} " in line else line.partition(" ")
            parts = tail.split(" ")
            parts[0] = draw(st.sampled_from(NUMBER_TEXT))
            lines[i] = head + sep + " ".join(parts)
        elif op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, line)
        elif op == "cut":
            lines[i] = line[: draw(st.integers(0, len(line)))]
        elif op == "label":
            lines[i] = line.replace(draw(st.sampled_from(['engine="0"', 'model_name="Qwen/Qwen3.5-0.8B"', "{"])),
                                    draw(st.sampled_from(['engine="1"', 'model_name="other"', "", '{x="\\"', "{{"])))
        elif op == "position":
            lines[i] = line.replace('position="', f'position="{draw(st.sampled_from(["-", "9", "1e3", "x", "99999999999"]))}')
        else:
            lines.insert(i, draw(st.sampled_from(["vllm:spec_decode_num_drafts", "vllm:spec_decode_", "# TYPE x counter", "\x00"])))
    return "\n".join(lines) + "\n"


def _response_seed():
    return [{"id": "r1", "choices": [], "metrics": {"speculative_decoding": {
        "acceptance_histogram": [10, 20, 30, 20, 20], "num_spec_tokens": 4, "num_spec_steps": 100,
        "num_accepted_draft_tokens": 210, "num_draft_tokens": 400}}},
        {"id": "r2", "choices": [], "metrics": {"speculative_decoding": {"acceptance_histogram": [5, 5, 5, 5, 5],
                                                                         "num_spec_tokens": 4}}}]


@st.composite
def per_request_text(draw) -> str:
    value = draw(mutated(_response_seed()))
    layout = draw(st.sampled_from(["json", "lines", "sse"]))
    if layout == "sse" and isinstance(value, list):
        try:
            return "".join(f"data: {json.dumps(v)}\n\n" for v in value) + "data: [DONE]\n"
        except (RecursionError, ValueError):
            return "data: " + "[" * 5000 + "\n"
    data = serialise(value, "lines" if layout == "lines" else "json", draw(st.booleans()))
    return draw(corrupted(data)).decode("utf-8", "replace")


@st.composite
def sglang_text(draw) -> str:
    values = draw(st.lists(st.sampled_from(["1.00", "2.31", "3.9", "5.0", "0.50", "nan", "inf", "-1", "1e400", "x", "", "2.5e0"]),
                           min_size=0, max_size=5))
    lines = [f"[2026-12-01 10:00:0{i}] Decode batch. #running-req: 3, #token: 900, token usage: 0.01, accept len: {v}, "
             "gen throughput (token/s): 120.0, #queue-req: 0" for i, v in enumerate(values)]
    if draw(st.booleans()):
        lines.insert(0, "[2026-12-01 10:00:00] Prefill batch. #new-seq: 1, #new-token: 512")
    return "\n".join(lines) + "\n"


@st.composite
def engine_files(draw) -> str:
    """compare's --engine-metrics file: any of the three formats, mostly mutated, sometimes random text."""
    if draw(st.integers(0, 19)) == 0:
        return draw(st.text(max_size=200))
    return draw(st.one_of(prometheus_text(), per_request_text(), sglang_text()))


def check_engine_file(text: str, k: int = 4) -> None:
    """read_engine_metrics (and the K check) either give a measurement whose numbers are sane, or refuse it with
    one EngineMetricsError line; peak Python memory stays within 64 MB of the input (bounded by the file)."""
    import math
    import tracemalloc

    from mtp_observe.engines.counters import check_acceptance_length, read_engine_metrics
    from mtp_observe.errors import EngineMetricsError

    RUNS["engine metrics"] += 1
    tracemalloc.start()
    try:
        measured = read_engine_metrics(text, "m.txt")
        check_acceptance_length(measured, measured.k if measured.k is not None else k)
    except EngineMetricsError as e:
        assert "\n" not in str(e) and str(e).startswith("m.txt"), str(e)
        OUTCOMES["engine metrics: refused"] += 1
        return
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 64 * 2**20 + 20 * len(text), peak
    OUTCOMES[f"engine metrics: read ({measured.source})"] += 1
    top = (measured.k if measured.k is not None else k) + 1
    assert math.isfinite(measured.mean_acceptance_length) and 1 <= measured.mean_acceptance_length <= top, measured
    if measured.per_position is not None:
        rates = list(measured.per_position)
        assert all(0 <= r <= 1 for r in rates) and all(a >= b for a, b in zip(rates, rates[1:])), rates
    if measured.steps is not None:
        assert math.isfinite(measured.steps) and measured.steps > 0, measured


GENERATE_VALUES = {
    "--max-new-tokens": ["-1", "0", "1", "2", "10**9", "1e3", "99999999999999999999", "x", ""],
    "--seed": ["-1", "0", "2**70", "99999999999999999999", "nan", "x"],
    "--speculative": ["-1", "0", "1", "2", "1000000", "nan", "x"],
    "--batch-size": ["-5", "0", "1", "3", "100000000000", "x"],
    "--chunk-size": ["-1", "0", "1", "7", "99999999999999999999"],
    "--sampling": ["greedy", "generation_config", "thinking_general", "nope", "a=nan,1,0", "a=0.7,2,5", "a=-1,0.9,0",
                   "a=0.7,0.9,-3", "a=inf,0.9,0", "a=0.7,0.9,20,0,0,0,2", "=", "a=1,1,1,1,1,1,1,1"],
    "--progress-every": ["-1", "0", "nan", "inf", "1e308", "0.5"],
    "--dtype": ["auto", "float32", "float16", "int8"],
    "--device": ["cpu", "auto", "cuda:7", "tpu", ""],
    "--template-kwargs": ['{"enable_thinking": false}', "{", "[]", '{"a": NaN}', "1e400", '{"a": ' * 80 + "1" + "}" * 80],
    "--on-error": ["fail", "skip", "ignore"],
}


@st.composite
def generate_argv(draw) -> list[str]:
    """generate's options, a few at a time, each from values that are valid, at a bound, or impossible."""
    names = draw(st.lists(st.sampled_from(sorted(GENERATE_VALUES)), min_size=1, max_size=4, unique=True))
    argv = []
    for name in names:
        argv += [name, draw(st.sampled_from(GENERATE_VALUES[name]))]
    if "--max-new-tokens" not in names:
        argv += ["--max-new-tokens", "2"]  # keep the accepted runs short
    return argv
