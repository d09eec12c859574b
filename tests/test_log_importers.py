"""The logs inference engineers keep — OpenAI wire formats, OpenTelemetry GenAI, LiteLLM, vLLM's request
log, OpenHands — imported to canonical sessions that validate, render and replay.

The public samples are read from ../shared/sessions-public (never copied here); what the corpus lacks
(an OTLP export, a Batch output file, a vLLM log) is built by tests/log_samples.py from the documented
formats; the constructed records below cover the cases the samples do not (streaming, chains,
traces, truncation, ...).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from mtp_observe.errors import InputError
from mtp_observe.model.loading import default_model_dir
from mtp_observe.sessions.importers import Options, detect, import_files
from mtp_observe.sessions.importers.common import MISSING_KINDS, SAMPLING_KEYS, Malformed, Source, sampling_params
from mtp_observe.sessions.reading import read_sessions
from mtp_observe.sessions.rendering import Renderer

from . import log_samples
from .conftest import SESSIONS_PUBLIC
from .test_sessions import assert_spans_are_the_rendered_turns

needs_public = pytest.mark.skipif(SESSIONS_PUBLIC is None, reason="../shared/sessions-public is absent on this machine")

LOG_FORMATS = ("openai-chat", "openai-responses", "openai-batch", "otel-genai", "litellm", "vllm-log", "openhands")
META_KEYS = ["importer", "original", "sampling", "missing", "supplied", "dropped"]
EXPECTED_SESSIONS = {"openai-chat": 2, "openai-responses": 2, "openai-batch": 2, "otel-genai": 8, "litellm": 1, "vllm-log": 1, "openhands": 2}


def run_import(fmt, files, out: Path, **options):
    counts = import_files(fmt, files, out, Options(**options))
    return list(read_sessions([out])), counts


def raw_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def bundled() -> Renderer:
    """The bundled model's tokenizer and template (a 4,096-token vocabulary)."""
    return Renderer.from_model_dir(default_model_dir(), vocab_size=4096)


@pytest.fixture(scope="module")
def samples(tmp_path_factory, bundled):
    """fmt -> the files of its sample: public ones, and what log_samples builds where the corpus has none."""
    root = SESSIONS_PUBLIC
    built = tmp_path_factory.mktemp("built")
    conversation = log_samples.bundled_conversation_ids(bundled.tokenizer)
    vllm = built / "vllm-server.log"
    vllm.write_text("\n".join(line for k, (pt, pi, oi, ot) in enumerate(conversation)
                              for line in log_samples.vllm_request_lines(f"chatcmpl-{k}", pt, pi, oi, ot, n=k)) + "\n")
    return {
        "openai-chat": [root / "openai-chat-completions" / "test_chat_completion_tool_calls_with_content.yaml",
                        root / "api-wire-formats" / "test_deepseek_deferred_capability_with_thinking.yaml"],
        "openai-responses": [root / "openai-responses" / "test_openai_responses_phase_live.yaml",
                             root / "api-wire-formats" / "test_openai_responses_thinking_with_tool_calls.yaml"],
        "openai-batch": [root / log_samples.BATCH_INPUT, log_samples.write_batch_output(built / "batch_output.jsonl")],
        # the same spans in two attribute encodings, so the same session ids: imported one file at a time
        "otel-genai": log_samples.write_otel_samples(built)[:1],
        "otel-genai structured": log_samples.write_otel_samples(built)[1:],
        "litellm": [root / "litellm-standard-logging-payload" / "standard_logging_payload.json"],
        "vllm-log": [vllm],
        "openhands": [root / "openhands" / "output.jsonl"],
    }


_imported: dict = {}


@pytest.fixture(scope="module")
def imported(samples, tmp_path_factory):
    """imported(fmt) -> (output file, sessions, counts) of the format's sample, imported once."""

    def get(fmt):
        if fmt not in _imported:
            out = tmp_path_factory.mktemp("imported") / f"{fmt}.jsonl"
            _imported[fmt] = (out, *run_import(fmt, samples[fmt], out))
        return _imported[fmt]

    return get


def session(sessions, sid):
    return next(s for s in sessions if s.id == sid)


# --- every sample imports, validates, renders -----------------------------------------------------


@needs_public
@pytest.mark.parametrize("fmt", LOG_FORMATS)
def test_every_log_sample_imports_validates_and_renders_with_the_bundled_model(imported, samples, bundled, fmt, tmp_path):
    out, sessions, _ = imported(fmt)
    assert len(sessions) == EXPECTED_SESSIONS[fmt]  # read_sessions re-validated every line
    for record in raw_lines(out):
        assert list(record["meta"]) == META_KEYS and record["meta"]["importer"]["format"] == fmt
        assert set(record["meta"]["missing"]) <= set(MISSING_KINDS)
        assert set(record["meta"]["sampling"]) <= set(SAMPLING_KEYS)
    for s in sessions:
        rendered = bundled.render(s)
        if s.is_token_level:
            assert [r.input_ids for r in rendered.requests] == [list(t.prompt_token_ids) + list(t.completion_token_ids) for t in s.token_requests]
        else:
            assert_spans_are_the_rendered_turns(bundled, s, rendered)
    # auto tells the format of every sample file (a Batch output file is joined with its input)
    auto_out = tmp_path / "auto.jsonl"
    auto_sessions, _ = run_import("auto", samples[fmt], auto_out)
    assert auto_out.read_text() == out.read_text()
    for path in samples[fmt]:
        assert detect(Source(path)) == fmt, path


# --- openai-chat --------------------------------------------------------------------------------------


@needs_public
def test_the_otel_contrib_cassette_is_one_conversation_with_parallel_calls_paired_with_their_results(imported):
    _, sessions, _ = imported("openai-chat")
    s = session(sessions, "test_chat_completion_tool_calls_with_content:1")
    calls = [("call_JpNb8OiAkbIbHzDggfpdDHpi", {"location": "Seattle, WA"}), ("call_vaFQc3zK6hHTRZKXRI5Eo2cJ", {"location": "San Francisco, CA"})]
    assert list(s.messages) == [
        {"role": "system", "content": "You're a helpful assistant."},
        {"role": "user", "content": "What's the weather in Seattle and San Francisco today?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": cid, "type": "function", "function": {"name": "get_current_weather", "arguments": args}}
                                                            for cid, args in calls]},
        {"role": "tool", "content": "50 degrees and raining", "tool_call_id": calls[0][0], "name": "get_current_weather"},
        {"role": "tool", "content": "70 degrees and sunny", "tool_call_id": calls[1][0], "name": "get_current_weather"},
        {"role": "assistant", "content": "Today, the weather in Seattle is 50 degrees and raining, while in San Francisco, it's 70 degrees and sunny."},
    ]
    assert [t["function"]["name"] for t in s.tools] == ["get_current_weather"]  # sent with the first request only
    assert s.meta["original"] == {"model": "gpt-4o-mini", "response_id": "chatcmpl-ASYMVzdmBGDbUoHFmt6R16tdtZUzR",
                                  "response_model": "gpt-4o-mini-2024-07-18", "requests": ["interactions[0]", "interactions[1]"]}
    assert s.meta["sampling"] == {} and s.meta["missing"] == ["sampling"]  # the requests set no sampling parameter


@needs_public
def test_deepseek_reasoning_content_lands_on_each_assistant_turn_and_its_two_system_messages_become_one(imported):
    _, sessions, _ = imported("openai-chat")
    s = session(sessions, "test_deepseek_deferred_capability_with_thinking:2")
    cassette = yaml.safe_load((SESSIONS_PUBLIC / "api-wire-formats" / "test_deepseek_deferred_capability_with_thinking.yaml").read_text())
    replies = [i["response"]["parsed_body"]["choices"][0]["message"] for i in cassette["interactions"]]
    system = cassette["interactions"][0]["request"]["parsed_body"]["messages"][:2]
    assert s.messages[0] == {"role": "system", "content": system[0]["content"] + "\n\n" + system[1]["content"]}
    assistants = [m for m in s.messages if m["role"] == "assistant"]
    # the three responses, and pydantic-ai's own search_tools call (sent in the history, reasoning "")
    assert [m.get("reasoning_content") for m in assistants] == [replies[0]["reasoning_content"], "", replies[1]["reasoning_content"],
                                                                replies[2]["reasoning_content"]]
    assert assistants[-1]["content"] == replies[2]["content"]
    assert [c["function"]["name"] for c in assistants[2]["tool_calls"]] == ["get_player_name", "roll_dice"]
    assert [m["name"] for m in s.messages if m["role"] == "tool"] == ["load_capability", "search_tools", "get_player_name", "roll_dice"]
    assert s.meta["original"]["tool_lists"] == 2 and len(s.tools) == 4  # the agent added tools as it went; the last list
    assert s.meta["dropped"] == {"merged_system_messages": 1}


def chat_body(messages, **extra):
    return {"model": "qwen", "messages": messages, **extra}


def test_a_chat_conversation_logged_as_growing_requests_is_one_session_with_one_turn_per_request(tmp_path):
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count to four."}]
    lines = []
    for k in range(1, 5):
        reply = {"role": "assistant", "content": str(k), "reasoning_content": f"say {k}"}
        lines.append({"request": chat_body(list(history), temperature=0.6, top_k=-1, max_completion_tokens=8),
                      "response": {"id": f"r{k}", "choices": [{"index": 0, "message": reply}]}})
        history += [{"role": "assistant", "content": str(k)}, {"role": "user", "content": "next"}]  # the client strips reasoning
    lines.append(chat_body([{"role": "user", "content": "Unrelated."}, {"role": "assistant", "content": "Yes."}]))
    [s, other], _ = run_import("openai-chat", [write_jsonl(tmp_path / "gateway.jsonl", lines)], tmp_path / "out.jsonl")
    assert [m["content"] for m in s.messages if m["role"] == "assistant"] == ["1", "2", "3", "4"]
    assert [m["reasoning_content"] for m in s.messages if m["role"] == "assistant"] == ["say 1", "say 2", "say 3", "say 4"]
    assert s.id == "gateway:4" and s.meta["original"]["requests"] == ["line 1", "line 2", "line 3", "line 4"]
    assert s.meta["sampling"] == {"temperature": 0.6, "top_k": 0, "max_tokens": 8}
    assert other.id == "gateway:5" and len(other.messages) == 2


def sse(chunks) -> str:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def test_a_streamed_chat_response_is_reassembled_with_tool_call_arguments_joined_per_index(tmp_path):
    def delta(d, finish=None):
        return {"id": "chatcmpl-s", "model": "qwen", "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}

    chunks = [delta({"role": "assistant", "content": ""}), delta({"reasoning_content": "Two "}), delta({"reasoning_content": "cities."}),
              delta({"content": "Checking"}), delta({"content": " both."}),
              delta({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "weather", "arguments": ""}}]}),
              delta({"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "weather", "arguments": "{\"ci"}}]}),
              delta({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": "}}]}),
              delta({"tool_calls": [{"index": 1, "function": {"arguments": "ty\": \"Oslo\"}"}}]}),
              delta({"tool_calls": [{"index": 0, "function": {"arguments": "\"Rome\"}"}}]}),
              delta({}, finish="tool_calls"), {"id": "chatcmpl-s", "choices": [], "usage": {"completion_tokens": 9}}]
    cassette = {"interactions": [{"request": {"uri": "http://localhost:8000/v1/chat/completions", "method": "POST",
                                              "body": json.dumps(chat_body([{"role": "user", "content": "Rome and Oslo?"}], stream=True))},
                                  "response": {"status": {"code": 200}, "body": {"string": sse(chunks)}}}], "version": 1}
    path = tmp_path / "stream.yaml"
    path.write_text(yaml.safe_dump(cassette))
    [s], _ = run_import("auto", [path], tmp_path / "out.jsonl")
    assert s.messages[1] == {"role": "assistant", "content": "Checking both.", "reasoning_content": "Two cities.", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": {"city": "Rome"}}},
        {"id": "call_b", "type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}]}
    assert s.meta["missing"] == ["tools", "sampling"]  # calls, but the request sent no tool schemas


def test_tools_a_chat_log_lacks_come_from_the_option_and_are_recorded_supplied(tmp_path):
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    path = write_jsonl(tmp_path / "bodies.jsonl", [chat_body([{"role": "user", "content": "q"}, call, {"role": "tool", "tool_call_id": "c", "content": "r"}]),
                                                   chat_body([{"role": "user", "content": "q2"}, {"role": "assistant", "content": "a"}])])
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]))
    sessions, _ = run_import("auto", [path], tmp_path / "out.jsonl", tools=tools)
    assert all(list(s.tools) == json.loads(tools.read_text()) and s.meta["supplied"] == {"tools": str(tools)} for s in sessions)
    bare, _ = run_import("openai-chat", [path], tmp_path / "out2.jsonl")
    assert bare[0].tools is None and "tools" in bare[0].meta["missing"] and "tools" not in bare[1].meta["missing"]


# --- openai-responses ---------------------------------------------------------------------------------


@needs_public
def test_one_responses_output_is_one_assistant_turn_and_the_echoed_sampling_is_recorded(imported):
    _, sessions, _ = imported("openai-responses")
    s = session(sessions, "test_openai_responses_phase_live:1")
    assert list(s.messages) == [
        {"role": "system", "content": "Briefly narrate what you are about to do before calling each tool."},
        {"role": "user", "content": "What is the capital of PotatoLand?"},
        {"role": "assistant", "content": "I'll check the capital lookup tool for \"PotatoLand.\"", "tool_calls": [
            {"id": "call_ALAJMWK9buNN7RXxxXbECcHa", "type": "function", "function": {"name": "get_capital", "arguments": {"country": "PotatoLand"}}}]},
        {"role": "tool", "content": "Potato City", "tool_call_id": "call_ALAJMWK9buNN7RXxxXbECcHa", "name": "get_capital"},
        {"role": "assistant", "content": "The capital of PotatoLand is **Potato City**."},
    ]
    assert s.tools == ({"type": "function", "function": {"name": "get_capital", "parameters": {
        "additionalProperties": False, "properties": {"country": {"type": "string"}}, "required": ["country"], "type": "object"}}},)
    assert s.meta["sampling"] == {"temperature": 1.0, "top_p": 0.98, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    assert s.meta["dropped"] == {"unreadable_reasoning": 1}  # summary [] and only encrypted_content: nothing to read
    assert s.meta["original"]["requests"] == ["interactions[0]", "interactions[1]"]


@needs_public
def test_responses_reasoning_summaries_become_the_reasoning_of_the_turn_they_belong_to(imported):
    _, sessions, _ = imported("openai-responses")
    s = session(sessions, "test_openai_responses_thinking_with_tool_calls:1")
    cassette = yaml.safe_load((SESSIONS_PUBLIC / "api-wire-formats" / "test_openai_responses_thinking_with_tool_calls.yaml").read_text())
    output = cassette["interactions"][0]["response"]["parsed_body"]["output"]
    summary = "\n\n".join(p["text"] for item in output if item["type"] == "reasoning" for p in item["summary"])
    first = s.messages[2]
    assert first["reasoning_content"] == summary and first["content"] == ""
    assert first["tool_calls"][0]["id"] == next(i["call_id"] for i in output if i["type"] == "function_call")
    assert s.messages[3]["role"] == "tool" and s.messages[3]["content"] == "plan updated"
    assert s.meta["original"]["reasoning_effort"] == "low"


def test_a_previous_response_id_chain_rebuilds_the_history_from_the_earlier_responses(tmp_path):
    def response(rid, text):
        return {"id": rid, "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]}

    lines = [{"request": {"model": "m", "instructions": "Count.", "input": "one", "max_output_tokens": 5}, "response": response("resp_1", "1")},
             {"request": {"model": "m", "instructions": "Count.", "previous_response_id": "resp_1", "input": [{"role": "user", "content": "two"}]},
              "response": response("resp_2", "2")},
             {"request": {"model": "m", "instructions": "Count.", "previous_response_id": "resp_2", "input": "three"}, "response": response("resp_3", "3")},
             {"request": {"model": "m", "previous_response_id": "resp_gone", "input": "four"}, "response": response("resp_4", "4")}]
    [s, orphan], _ = run_import("openai-responses", [write_jsonl(tmp_path / "chain.jsonl", lines)], tmp_path / "out.jsonl")
    assert [(m["role"], m["content"]) for m in s.messages] == [("system", "Count."), ("user", "one"), ("assistant", "1"), ("user", "two"),
                                                               ("assistant", "2"), ("user", "three"), ("assistant", "3")]
    assert s.meta["original"]["requests"] == ["line 1", "line 2", "line 3"] and s.meta["sampling"] == {}  # the last request's
    assert orphan.meta["missing"] == ["sampling", "content"] and orphan.meta["original"]["previous_response_id"] == "resp_gone"


# --- openai-batch -------------------------------------------------------------------------------------


@needs_public
def test_batch_inputs_join_their_outputs_by_custom_id_whatever_the_completion_order(imported, samples):
    out, sessions, counts = imported("openai-batch")
    inputs = [json.loads(line) for line in (SESSIONS_PUBLIC / log_samples.BATCH_INPUT).read_text().splitlines() if line.strip()]
    assert [s.id for s in sessions] == ["request-1", "request-2"]  # input order; the output file is reversed
    for s, line in zip(sessions, inputs):
        assert list(s.messages) == line["body"]["messages"] + [{"role": "assistant", "content": log_samples.batch_answer(line["custom_id"])}]
        assert s.meta["sampling"] == {"max_tokens": 10}
        assert s.meta["original"] == {"model": "gpt-4o-mini", "response_id": f"chatcmpl-{line['custom_id']}", "response_model": "gpt-4o-mini-2024-07-18",
                                      "custom_id": line["custom_id"], "batch_request_id": f"batch_req_{line['custom_id']}",
                                      "request_id": f"req_{line['custom_id']}", "requests": [s.meta["importer"]["record"]]}
    assert [(Path(c.path).name, c.sessions, c.note) for c in counts] == [("batch_output.jsonl", 0, "output, joined with its input"),
                                                                       ("batch_job_results_furniture.jsonl", 2, "")]


@needs_public
def test_failed_batch_lines_are_dropped_and_counted_and_an_input_alone_is_refused(tmp_path):
    output = log_samples.write_batch_output(tmp_path / "out_file.jsonl", failed=("request-2",))
    sessions, counts = run_import("openai-batch", [SESSIONS_PUBLIC / log_samples.BATCH_INPUT, output], tmp_path / "out.jsonl")
    assert [s.id for s in sessions] == ["request-1"] and dict(counts[1].dropped) == {"failed_requests": 1}
    with pytest.raises(InputError, match="a Batch input file with no output file; give the output file too"):
        import_files("openai-batch", [SESSIONS_PUBLIC / log_samples.BATCH_INPUT], tmp_path / "x.jsonl")
    with pytest.raises(InputError, match="an OpenAI Batch output file without its input file"):
        import_files("auto", [output], tmp_path / "x.jsonl")


# --- otel-genai ---------------------------------------------------------------------------------------


@needs_public
def test_the_otel_spec_examples_become_sessions_alike_in_both_attribute_encodings(imported, samples, tmp_path):
    _, text, counts = imported("otel-genai")
    structured, structured_counts = run_import("otel-genai", samples["otel-genai structured"], tmp_path / "structured.jsonl")
    assert len(text) == 8 and [(s.id, s.messages) for s in text] == [(s.id, s.messages) for s in structured]
    assert [dict(c.dropped) for c in counts + structured_counts] == [{"calls_without_content": 3}] * 2  # content capture off: 1 + 2 calls
    calls = {c["section"]: c for c in log_samples.spec_calls()}
    tools = next(c for c in log_samples.spec_calls() if "gen_ai.tool.definitions" in c["attributes"] and "gen_ai.input.messages" in c["attributes"])
    by_first_user = {s.messages[[m["role"] for m in s.messages].index("user")]["content"]: s for s in text}
    weather = by_first_user["Weather in Paris?"]
    assert list(weather.messages) == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_VSPygqKTWdrhaFErNvMV18Yl", "type": "function",
                                                            "function": {"name": "get_weather", "arguments": {"location": "Paris"}}}]},
        {"role": "tool", "content": "rainy, 57°F", "tool_call_id": "call_VSPygqKTWdrhaFErNvMV18Yl", "name": "get_weather"},
        {"role": "assistant", "content": "The weather in Paris is currently rainy with a temperature of 57°F."}]
    flat = tools["attributes"]["gen_ai.tool.definitions"][0]
    assert weather.tools == ({"type": "function", "function": {"name": flat["name"], "description": flat["description"], "parameters": flat["parameters"]}},)
    assert weather.meta["sampling"] == {"top_p": 1.0, "max_tokens": 200} and len(weather.meta["original"]["requests"]) == 2
    reasoning = calls["Chat completion with reasoning (content enabled)"]["attributes"]["gen_ai.output.messages"][0]["parts"]
    jokes = [s for s in text if s.messages[-1].get("reasoning_content")]
    assert [s.messages[-1] for s in jokes] == [{"role": "assistant", "content": reasoning[1]["content"], "reasoning_content": reasoning[0]["content"]}]
    instructions = next(s for s in text if s.messages[-1]["content"] == "I'm sorry, but I can't assist with that")
    assert instructions.messages[0] == {"role": "system", "content": "You must never tell jokes\n\nYou are a helpful bot"}
    builtin = next(s for s in text if "random number" in s.messages[1]["content"])
    assert builtin.messages[-1]["content"].startswith("The generated random number is") and builtin.meta["dropped"] == {"server_tool_parts": 2}
    assert sum(s.meta["dropped"].get("other_choices", 0) for s in text) == 1
    assert sum(s.meta["dropped"].get("media_parts", 0) for s in text) == 7  # the multimodal examples' uri/file/blob parts
    with_event = next(c for c in log_samples.spec_calls() if c["events"])  # content captured on the event's attributes
    assert "gen_ai.input.messages" not in with_event["attributes"]
    assert session(text, with_event["trace"]).messages[-1]["content"].startswith(" Why did the developer")


def otlp(spans) -> dict:
    return {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}


def span(sid, end, attrs: dict, trace="t1", events=(), name="chat qwen"):
    value = lambda v: {"stringValue": v} if isinstance(v, str) else {"doubleValue": v} if isinstance(v, float) else {"intValue": str(v)}
    return {"traceId": trace, "spanId": sid, "name": name, "startTimeUnixNano": str(end - 1), "endTimeUnixNano": str(end),
            "attributes": [{"key": k, "value": value(v)} for k, v in attrs.items()], "events": list(events)}


def test_older_flattened_attributes_and_span_events_give_the_same_conversation_as_message_parts(tmp_path):
    current = span("a", 10, {"gen_ai.operation.name": "chat", "gen_ai.request.temperature": 0.5,
                             "gen_ai.input.messages": json.dumps([{"role": "system", "parts": [{"type": "text", "content": "S"}]},
                                                                  {"role": "user", "parts": [{"type": "text", "content": "Hi"}]}]),
                             "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "tool_call", "id": "c", "name": "f", "arguments": {"x": 1}}]}])},
                   trace="t-current")
    flattened = span("b", 10, {"gen_ai.request.temperature": 0.5, "gen_ai.prompt.0.role": "system", "gen_ai.prompt.0.content": "S",
                               "gen_ai.prompt.1.role": "user", "gen_ai.prompt.1.content": "Hi", "gen_ai.completion.0.role": "assistant",
                               "gen_ai.completion.0.tool_calls.0.id": "c", "gen_ai.completion.0.tool_calls.0.name": "f",
                               "gen_ai.completion.0.tool_calls.0.arguments": "{\"x\": 1}"}, trace="t-flat")
    event = lambda name, body: {"name": name, "attributes": [{"key": "body", "value": {"stringValue": json.dumps(body)}}]}
    events = span("c", 10, {"gen_ai.operation.name": "chat", "gen_ai.request.temperature": 0.5}, trace="t-events", events=[
        event("gen_ai.system.message", {"content": "S"}), event("gen_ai.user.message", {"content": "Hi"}),
        event("gen_ai.choice", {"index": 0, "message": {"tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]}})])
    path = tmp_path / "spans.json"
    path.write_text(json.dumps(otlp([current, flattened, events])))
    sessions, _ = run_import("auto", [path], tmp_path / "out.jsonl")
    assert [s.id for s in sessions] == ["t-current", "t-flat", "t-events"]
    assert sessions[0].messages == sessions[1].messages == sessions[2].messages
    assert sessions[0].messages[-1]["tool_calls"][0]["function"] == {"name": "f", "arguments": {"x": 1}}
    assert all(s.meta["sampling"] == {"temperature": 0.5} and s.meta["missing"] == ["tools"] for s in sessions)


def test_otel_calls_group_by_conversation_id_then_trace_and_content_capture_off_is_recorded_missing(tmp_path):
    def call(sid, end, messages, reply, **attrs):
        return span(sid, end, {"gen_ai.operation.name": "chat", **attrs, "gen_ai.input.messages": json.dumps(messages),
                               "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": reply}]}])},
                    trace=attrs.pop("trace", "t1"))

    user = lambda text: {"role": "user", "parts": [{"type": "text", "content": text}]}
    said = lambda text: {"role": "assistant", "parts": [{"type": "text", "content": text}]}
    spans = [call("s2", 20, [user("a"), said("A"), user("b")], "B", trace="t2", **{"gen_ai.conversation.id": "conv"}),  # out of order, other trace
             call("s1", 10, [user("a")], "A", trace="t1", **{"gen_ai.conversation.id": "conv"}),
             call("s3", 15, [user("sub-task")], "done", trace="t1", **{"gen_ai.conversation.id": "conv"}),  # a sub-agent: not a resend
             span("s4", 30, {"gen_ai.operation.name": "chat", "gen_ai.conversation.id": "conv"}),  # content capture off
             span("s5", 5, {"gen_ai.operation.name": "chat"}, trace="t-off"),
             span("s6", 6, {"gen_ai.operation.name": "execute_tool"}, trace="t-tool", name="execute_tool f")]
    path = tmp_path / "spans.json"
    path.write_text(json.dumps(otlp(spans)))
    sessions, counts = run_import("otel-genai", [path], tmp_path / "out.jsonl")
    assert [(s.id, [m["content"] for m in s.messages]) for s in sessions] == [("conv", ["a", "A", "b", "B"]), ("conv#2", ["sub-task", "done"])]
    assert all(s.meta["missing"] == ["sampling", "content"] and s.meta["dropped"] == {"calls_without_content": 1} for s in sessions)
    assert sessions[0].meta["original"]["requests"] == ["span s1", "span s2"]
    assert dict(counts[0].dropped) == {"calls_without_content": 1}  # trace t-off: nothing to invent a session from


# --- litellm ------------------------------------------------------------------------------------------


@needs_public
def test_the_litellm_payload_is_its_messages_then_its_response(imported):
    _, [s], _ = imported("litellm")
    assert list(s.messages) == [{"role": "user", "content": "Hello, world!"}, {"role": "assistant", "content": "hi"}]
    assert s.id == "chatcmpl-2299b6a2-82a3-465a-b47c-04e685a2227f"
    assert s.meta["original"] == {"model": "gpt-4o", "response_id": s.id, "call_id": s.id, "litellm_model_name": "gpt-4o",
                                  "custom_llm_provider": "openai", "requests": ["the file"]}
    assert s.meta["sampling"] == {} and s.meta["missing"] == ["sampling"]  # model_parameters is empty


@needs_public
def test_a_litellm_trace_of_growing_calls_is_one_session_in_start_time_order_and_failures_are_counted(tmp_path):
    base = json.loads((SESSIONS_PUBLIC / "litellm-standard-logging-payload" / "standard_logging_payload.json").read_text())
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]}
    first = dict(copy.deepcopy(base), id="c1", trace_id="run-7", startTime="2025-01-24 09:20:46.847371",
                 model_parameters={"temperature": 0.2, "tools": tools}, messages=[{"role": "user", "content": "Find it."}])
    first["response"]["choices"][0]["message"] = call
    second = dict(copy.deepcopy(base), id="c2", trace_id="run-7", startTime="2025-01-24 09:21:00",
                  model_parameters={"temperature": 0.2, "tools": tools},
                  messages=[{"role": "user", "content": "Find it."}, call, {"role": "tool", "tool_call_id": "t1", "content": "here"}])
    second["response"]["choices"][0]["message"] = {"role": "assistant", "content": "Found.", "thinking_blocks": [{"type": "thinking", "thinking": "Easy."}]}
    failed = dict(copy.deepcopy(base), id="c3", trace_id="run-7", status="failure", response={},
                  error_information={"error_message": "RateLimitError"})
    path = write_jsonl(tmp_path / "payloads.jsonl", [second, failed, first])  # logged out of order
    [s], counts = run_import("auto", [path], tmp_path / "out.jsonl")
    assert [(m["role"], m["content"]) for m in s.messages] == [("user", "Find it."), ("assistant", ""), ("tool", "here"), ("assistant", "Found.")]
    assert s.messages[-1]["reasoning_content"] == "Easy." and list(s.tools) == tools
    assert s.id == "run-7" and s.meta["original"]["requests"] == ["line 3", "line 1"] and s.meta["sampling"] == {"temperature": 0.2}
    assert dict(counts[0].dropped) == {"failed_calls": 1}


# --- openhands ----------------------------------------------------------------------------------------


@needs_public
def test_the_openhands_resolver_output_is_reconstructed_from_its_parsed_actions(imported):
    _, sessions, _ = imported("openhands")
    raw = [json.loads(line) for line in (SESSIONS_PUBLIC / "openhands" / "output.jsonl").read_text().splitlines()]
    s, history = sessions[0], raw[0]["history"]
    assert s.id == "neubig/pr-viewer#5" and s.meta["original"] == {"issue": "neubig/pr-viewer#5", "success": True, "reconstructed": True,
                                                                   "requests": ["line 1"]}
    assert s.meta["missing"] == ["system_prompt", "tools", "sampling"]

    def call(n, name, args):
        return [{"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": args}}]

    assert list(s.messages) == [
        {"role": "user", "content": history[0]["content"]},
        {"role": "assistant", "content": history[1]["thought"], "tool_calls": call(1, "execute_bash", {"command": "touch LICENSE"})},
        {"role": "tool", "content": history[2]["content"], "tool_call_id": "call_1", "name": "execute_bash"},
        {"role": "assistant", "content": history[3]["thought"], "tool_calls": call(2, "execute_ipython_cell", {"code": history[3]["code"]})},
        {"role": "tool", "content": history[4]["content"], "tool_call_id": "call_2", "name": "execute_ipython_cell"},
        {"role": "assistant", "content": history[5]["thought"], "tool_calls": call(3, "execute_bash", {"command": "cat LICENSE"})},
        {"role": "tool", "content": history[6]["content"], "tool_call_id": "call_3", "name": "execute_bash"},
        {"role": "assistant", "content": history[7]["thought"], "tool_calls": call(4, "finish", {})},
    ]
    assert len(sessions[1].messages) == 44 and sessions[1].id == "neubig/pr-viewer#1"


def fc_trajectory():
    response = {"id": "resp-1", "choices": [{"message": {"role": "assistant", "content": "Both at once.", "reasoning_content": "ls and pwd.", "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "execute_bash", "arguments": "{\"command\": \"ls\"}"}},
        {"id": "t2", "type": "function", "function": {"name": "execute_bash", "arguments": "{\"command\": \"pwd\"}"}}]}}]}
    meta = lambda tid: {"function_name": "execute_bash", "tool_call_id": tid, "model_response": response, "total_calls_in_response": 2}
    tools = [{"type": "function", "function": {"name": "execute_bash", "description": "Run.", "parameters": {"type": "object"}}}]
    return tools, [
        {"id": 0, "source": "agent", "action": "system", "args": {"content": "You are OpenHands agent.", "tools": tools, "agent_class": "CodeActAgent"}},
        {"id": 1, "source": "user", "action": "message", "args": {"content": "Where am I?", "image_urls": None}},
        {"id": 2, "source": "user", "action": "recall", "args": {"query": "Where am I?"}},
        {"id": 3, "source": "agent", "action": "run", "args": {"command": "ls"}, "tool_call_metadata": meta("t1")},
        {"id": 4, "source": "agent", "action": "run", "args": {"command": "pwd"}, "tool_call_metadata": meta("t2")},
        {"id": 5, "source": "environment", "observation": "run", "content": "a.txt", "extras": {"command": "ls"}, "cause": 3, "tool_call_metadata": meta("t1")},
        {"id": 6, "source": "environment", "observation": "run", "content": "/workspace", "extras": {}, "cause": 4, "tool_call_metadata": meta("t2")},
        {"id": 7, "source": "agent", "action": "message", "args": {"content": "In /workspace, with a.txt.", "wait_for_response": True}},
        {"id": 8, "source": "environment", "observation": "agent_state_changed", "content": "", "extras": {"agent_state": "awaiting_user_input"}},
    ]


def test_openhands_function_calling_events_give_one_assistant_turn_per_llm_response(tmp_path):
    tools, events = fc_trajectory()
    path = tmp_path / "traj.json"
    path.write_text(json.dumps(events))
    [s], _ = run_import("auto", [path], tmp_path / "out.jsonl")
    assert list(s.messages) == [
        {"role": "system", "content": "You are OpenHands agent."},
        {"role": "user", "content": "Where am I?"},
        {"role": "assistant", "content": "Both at once.", "reasoning_content": "ls and pwd.", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "execute_bash", "arguments": {"command": "ls"}}},
            {"id": "t2", "type": "function", "function": {"name": "execute_bash", "arguments": {"command": "pwd"}}}]},
        {"role": "tool", "content": "a.txt", "tool_call_id": "t1", "name": "execute_bash"},
        {"role": "tool", "content": "/workspace", "tool_call_id": "t2", "name": "execute_bash"},
        {"role": "assistant", "content": "In /workspace, with a.txt."}]
    assert list(s.tools) == tools and s.meta["missing"] == ["sampling"] and s.meta["dropped"] == {"non_message_events": 2}
    assert "reconstructed" not in s.meta["original"]
    run = write_jsonl(tmp_path / "output.jsonl", [{"instance_id": "repo__x-1", "instruction": "Where am I?", "history": events,
                                                   "metadata": {"llm_config": {"model": "openai/qwen3", "temperature": 0.0, "top_p": 1.0,
                                                                               "max_output_tokens": 4096}}}])
    [r], _ = run_import("openhands", [run], tmp_path / "out2.jsonl")
    assert r.id == "repo__x-1" and r.messages == s.messages
    assert r.meta["sampling"] == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 4096} and r.meta["original"]["model"] == "openai/qwen3"


def test_openhands_openai_form_rows_import_with_their_tools(tmp_path):
    tools = [{"type": "function", "function": {"name": "str_replace_editor", "parameters": {"type": "object"}}}]
    trajectory = [{"role": "system", "content": "S"}, {"role": "user", "content": "Fix the bug."},
                  {"role": "assistant", "content": "Looking.", "tool_calls": [{"id": "a", "type": "function", "function": {"name": "str_replace_editor", "arguments": "{\"path\": \"x\"}"}}]},
                  {"role": "tool", "tool_call_id": "a", "content": "file"}, {"role": "assistant", "content": "Fixed."}]
    path = write_jsonl(tmp_path / "rows.jsonl", [{"instance_id": "a__b-1", "trajectory": trajectory, "tools": json.dumps(tools), "resolved": True},
                                                 {"instance_id": "a__b-2", "trajectory": json.dumps(trajectory[:2] + trajectory[-1:])}])
    [s, t], _ = run_import("auto", [path], tmp_path / "out.jsonl")
    assert [m["role"] for m in s.messages] == ["system", "user", "assistant", "tool", "assistant"] and list(s.tools) == tools
    assert s.meta["original"] == {"instance_id": "a__b-1", "resolved": True, "requests": ["line 1"]} and s.meta["missing"] == ["sampling"]
    assert t.id == "a__b-2" and t.tools is None and t.meta["missing"] == ["sampling"]  # no calls: no schema is missing


# --- vllm-log -----------------------------------------------------------------------------------------


@needs_public
def test_a_vllm_request_log_gives_the_exact_token_ids_of_each_request_and_its_sampling_params(imported, bundled):
    out, [s], _ = imported("vllm-log")
    conversation = log_samples.bundled_conversation_ids(bundled.tokenizer)
    assert [(list(r.prompt_token_ids), list(r.completion_token_ids)) for r in s.token_requests] == [(p, o) for _, p, o, _ in conversation]
    [record] = raw_lines(out)
    assert record["id"] == "chatcmpl-0" and record["meta"]["original"] == {"request_ids": ["chatcmpl-0", "chatcmpl-1"], "model": "Qwen/Qwen3.5-27B",
                                                                           "finish_reasons": ["stop", "stop"]}
    assert record["meta"]["sampling"] == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "presence_penalty": 0.0,
                                          "frequency_penalty": 0.0, "repetition_penalty": 1.05, "seed": None, "max_tokens": 512}
    assert record["meta"]["missing"] == [] and record["meta"]["importer"]["record"] == "lines 1-6"


def vllm_log(tmp_path, *requests, head=()) -> Path:
    path = tmp_path / "server.log"
    path.write_text("\n".join([*head, *(line for k, r in enumerate(requests) for line in log_samples.vllm_request_lines(*r, n=k % 10))]) + "\n")
    return path


def test_vllm_requests_of_one_conversation_form_one_session_and_two_samples_of_a_prompt_stay_apart(tmp_path):
    p1, o1 = [1, 10, 11, 2, 1, 12], [20, 21, 2]
    p2 = [1, 10, 11, 2, 1, 13, 20, 21, 2, 1, 14, 2, 1, 12]  # the history resent, the generation prompt after it again
    path = vllm_log(tmp_path, ("a", "x", p1, o1, "t"), ("b", "x", p1, [30, 2], "u"), ("c", "x", p2, [40, 2], "v"),
                    ("d", "x", [1, 99, 2, 1, 12], [5, 2], "w"))
    sessions, _ = run_import("vllm-log", [path], tmp_path / "out.jsonl")
    assert [(s.id, [len(r.prompt_token_ids) for r in s.token_requests]) for s in sessions] == [("a", [6, 14]), ("b", [6]), ("d", [5])]


def test_a_vllm_log_cut_by_max_log_len_is_refused_and_one_without_output_ids_names_the_flag(tmp_path):
    prompt, out = list(range(1, 9)), [3, 4, 2]
    head = ["INFO 05-12 10:00:00 [api_server.py:1] non-default args: {'model': 'q', 'enable_log_requests': True, 'max_log_len': 8}"]
    path = vllm_log(tmp_path, ("cut", "abc", prompt, out, "z"), ("whole", "abc", prompt[:5], out, "z"), head=head)
    with pytest.raises(InputError, match=r"request cut: the log is cut at --max-log-len 8 \(a token id list of exactly 8 ids\); restart vLLM without --max-log-len"):
        import_files("vllm-log", [path], tmp_path / "out.jsonl")
    counts = import_files("vllm-log", [path], tmp_path / "out.jsonl", on_error="skip")
    assert counts[0].sessions == 1 and len(counts[0].skipped) == 1
    # the same cut told by the prompt text: 8 characters and 8 ids, no startup line
    cut_text = vllm_log(tmp_path, ("cut", "a" * 16, list(range(1, 17)), out, "z"))
    with pytest.raises(InputError, match="cut at --max-log-len 16"):
        import_files("vllm-log", [cut_text], tmp_path / "out.jsonl")
    info_only = tmp_path / "info.log"
    info_only.write_text("INFO 05-12 [logger.py:43] Received request r9: params: SamplingParams(temperature=0.7), lora_request: None.\n")
    with pytest.raises(InputError, match="request r9: no prompt_token_ids .* VLLM_LOGGING_LEVEL=DEBUG"):
        import_files("auto", [info_only], tmp_path / "out.jsonl")


def test_sampling_params_are_read_as_literals_and_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    evil = f"SamplingParams(n=1, temperature=__import__('os').system('touch {marker}'), top_p=0.9)"
    path = vllm_log(tmp_path, ("r1", "x", [1, 2, 3], [4, 2], "y", evil))
    with pytest.raises(InputError, match=r"request r1: line 2: SamplingParams.temperature: .* is not a literal value"):
        import_files("vllm-log", [path], tmp_path / "out.jsonl")
    assert not marker.exists()
    from mtp_observe.sessions.importers.vllm_log import sampling_repr

    assert sampling_repr("SamplingParams(n=1, best_of=None, temperature=0.0, top_p=1.0, top_k=-1,use_beam_search=False, stop=['a, b'], "
                         "structured_outputs=StructuredOutputsParams(json={'x': (1, 2)}), output_kind=RequestOutputKind.FINAL_ONLY, max_tokens=16)", "") == \
        {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 16}  # top_k -1 is "off", written 0


def test_streamed_vllm_deltas_are_joined_and_marked_inexact_and_the_older_single_line_is_read(tmp_path):
    lines = [
        "INFO 03-01 10:00:00 logger.py:39] Received request cmpl-7-0: prompt: 'Hi, prompt_token_ids: [9]', params: SamplingParams(n=1, "
        "temperature=0.8, top_p=1.0, top_k=-1, max_tokens=64), prompt_token_ids: [1, 5, 6, 2, 1], lora_request: None, prompt_adapter_request: None.",
        "DEBUG 03-01 10:00:01 [logger.py:80] Generated response cmpl-7-0 (streaming delta) details: output_token_ids: [7]",
        "DEBUG 03-01 10:00:01 [logger.py:80] Generated response cmpl-7-0 (streaming delta) details: output_token_ids: [8, 2]",
        "DEBUG 03-01 10:00:01 [logger.py:80] Generated response cmpl-7-0 (streaming complete) details: output_token_ids: None",
        "INFO 03-01 10:00:01 [logger.py:90] Generated response cmpl-7-0 (streaming complete): output: 'Hello', finish_reason: streaming_complete",
    ]
    path = tmp_path / "old.log"
    path.write_text("\n".join(lines) + "\n")
    [s], _ = run_import("auto", [path], tmp_path / "out.jsonl")
    assert [(list(r.prompt_token_ids), list(r.completion_token_ids)) for r in s.token_requests] == [([1, 5, 6, 2, 1], [7, 8, 2])]
    assert s.meta["original"]["output_exact"] is False
    assert s.meta["sampling"] == {"temperature": 0.8, "top_p": 1.0, "top_k": 0, "max_tokens": 64}


def test_vllm_log_records_replay_with_exactly_the_logged_token_ids(tmp_path, bundled):
    import pyarrow.dataset as ds

    from mtp_observe.run.options import ReplayOptions
    from mtp_observe.run.pipeline import replay

    conversation = log_samples.bundled_conversation_ids(bundled.tokenizer)
    path = vllm_log(tmp_path, *((f"req-{k}", pt, pi, oi, ot) for k, (pt, pi, oi, ot) in enumerate(conversation)))
    import_files("auto", [path], tmp_path / "sessions.jsonl")
    run = replay([tmp_path / "sessions.jsonl"], default_model_dir(), tmp_path / "run", ReplayOptions(k=2, device="cpu", dtype="float32"), bundled=True)
    table = ds.dataset(run / "requests.parquet").to_table().to_pandas()
    assert [list(ids) for ids in table.input_ids] == [p + o for _, p, o, _ in conversation]
    assert [[(sp["start"], sp["end"]) for sp in spans] for spans in table.spans] == [[(len(p), len(p) + len(o) - 1)] for _, p, o, _ in conversation]


# --- sampling parameters ------------------------------------------------------------------------------


def test_sampling_parameters_keep_vllm_names_and_map_the_other_max_token_spellings():
    assert sampling_params({"temperature": 0.7, "top_k": -1, "max_completion_tokens": 64, "max_tokens": 32, "stop": ["x"], "n": 2,
                            "seed": None, "top_p": None}, "body") == {"temperature": 0.7, "top_k": 0, "max_tokens": 64}
    assert sampling_params({"max_output_tokens": 9}, "") == {"max_tokens": 9}
    assert sampling_params({"seed": None, "max_tokens": None}, "", keep_null=True) == {"seed": None, "max_tokens": None}
    assert sampling_params({"gen_ai.request.top_k": 20.0}, "", names={"gen_ai.request.top_k": "top_k"}) == {"top_k": 20}
    for bad, what in (({"temperature": -0.1}, "out of range"), ({"top_p": 0}, "out of range"), ({"top_k": 2.5}, "whole number"),
                      ({"temperature": "0.7"}, "must be a number"), ({"temperature": True}, "must be a number"), ({"min_p": float("nan")}, "must be a number")):
        with pytest.raises(Malformed, match=what):
            sampling_params(bad, "body")
