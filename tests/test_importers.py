"""Importers: real agent logs in the first five formats to canonical sessions that validate and render
(the log formats inference engineers keep — OpenAI wire formats, OTel, LiteLLM, vLLM, OpenHands —
are tested in test_log_importers.py).

The public samples are read from ../shared/sessions-public (never copied here); the constructed
logs below are written by hand in each format's shape, for the cases the samples lack
(repeated ids, thinking split across lines, the simulated user's own tool calls, ...).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mtp_observe.errors import InputError
from mtp_observe.sessions.importers import Options, detect, import_files
from mtp_observe.sessions.importers.common import MISSING_KINDS, Source
from mtp_observe.sessions.reading import Session, read_sessions
from mtp_observe.sessions.rendering import Renderer

from .conftest import SESSIONS_PUBLIC
from .test_sessions import assert_spans_are_the_rendered_turns

needs_public = pytest.mark.skipif(SESSIONS_PUBLIC is None, reason="../shared/sessions-public is absent on this machine")

META_KEYS = ["importer", "original", "sampling", "missing", "supplied", "dropped"]
FORMATS = ("tau-bench", "tau2-bench", "mini-swe-agent", "claude-code", "anthropic")  # the agent-log formats tested here


def samples(fmt: str) -> list[Path]:
    root = SESSIONS_PUBLIC
    return {
        "tau-bench": [root / "tau-bench_gpt-4o-airline" / "gpt-4o-airline.json"],
        "tau2-bench": [root / "tau2-bench_grok" / "airline_grok-3-mini.json"],
        "mini-swe-agent": sorted((root / "mini-swe-agent_gemini-3-pro").glob("*.traj.json")),
        "claude-code": sorted((root / "claude-code").glob("*.jsonl")),
        "anthropic": sorted((root / "api-wire-formats").glob("*anthropic*")),
    }[fmt]


def run_import(fmt, files, out: Path, **options) -> list[Session]:
    """Import, then read the output back with the canonical reader (which validates every line)."""
    import_files(fmt, files, out, Options(**options))
    return list(read_sessions([out]))


def raw_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "mtp_observe", "import", *map(str, args)], capture_output=True, text=True, env=env)


_imported: dict[str, tuple[Path, list[Session]]] = {}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """imported(fmt) -> (output file, sessions): every public sample of the format, imported once."""

    def get(fmt):
        if fmt not in _imported:
            out = tmp_path_factory.mktemp("imported") / f"{fmt}.jsonl"
            _imported[fmt] = (out, run_import(fmt, samples(fmt), out))
        return _imported[fmt]

    return get


# --- the public samples -----------------------------------------------------------------------

EXPECTED_SESSIONS = {"tau-bench": 160, "tau2-bench": 12, "mini-swe-agent": 16, "claude-code": 5, "anthropic": 1}


@needs_public
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_public_sample_imports_and_every_session_validates(imported, fmt):
    out, sessions = imported(fmt)
    files = samples(fmt)
    assert len(files) >= 1
    assert len(sessions) == EXPECTED_SESSIONS[fmt]  # read_sessions re-validated every line
    assert len({s.id for s in sessions}) == len(sessions)
    for record in raw_lines(out):
        assert list(record["meta"]) == META_KEYS
        assert record["meta"]["importer"]["format"] == fmt
        assert record["meta"]["importer"]["file"] in map(str, files)
        assert set(record["meta"]["missing"]) <= set(MISSING_KINDS)


@needs_public
@pytest.mark.parametrize("fmt", FORMATS)
def test_auto_detects_the_format_of_every_public_sample(fmt):
    for path in samples(fmt):
        assert detect(Source(path)) == fmt, path


@needs_public
def test_auto_refuses_files_that_are_no_log_in_one_line_listing_the_formats(tmp_path):
    from mtp_observe.sessions.importers import FORMATS as ALL

    schema = SESSIONS_PUBLIC / "otel-genai" / "gen-ai-input-messages.json"  # a JSON schema, not a log
    notes = tmp_path / "notes.txt"
    notes.write_text("hello, not a log\n")
    for path in (schema, notes):
        r = cli("auto", path, "-o", tmp_path / "out.jsonl")
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert str(path) in lines[0] and all(f in lines[0] for f in ALL), lines[0]
        assert not (tmp_path / "out.jsonl").exists()


@pytest.fixture(scope="module")
def renderer(tiny_checkpoint) -> Renderer:
    return Renderer.from_model_dir(tiny_checkpoint, vocab_size=1001)


@needs_public
@pytest.mark.parametrize("fmt,take", [("tau-bench", [0, 57]), ("tau2-bench", [0, 5, 11]), ("mini-swe-agent", []),
                                      ("claude-code", [0, 1, 3, 4]), ("anthropic", [0])])
def test_imported_public_sessions_render_each_assistant_turn_with_the_tiny_checkpoint_template(imported, renderer, fmt, take):
    _, sessions = imported(fmt)
    if fmt == "mini-swe-agent":  # the shortest trajectory: each observation starts a new request, so these are slow
        take = [min(range(len(sessions)), key=lambda i: len(sessions[i].messages))]
    for i in take:
        assert_spans_are_the_rendered_turns(renderer, sessions[i], renderer.render(sessions[i]))


# --- tool results pair with their calls -------------------------------------------------------


def pairs(session: Session) -> list[tuple[str, str]]:
    """(tool result's name, name of the nearest preceding call with its id) for every result."""
    out, calls = [], []
    for m in session.messages:
        calls.extend(m.get("tool_calls") or [])
        if m["role"] == "tool":
            nearest = [c for c in calls if c["id"] == m["tool_call_id"]][-1]
            out.append((m["name"], nearest["function"]["name"]))
    return out


@needs_public
def test_tool_results_pair_with_the_nearest_preceding_call_in_tau_bench_runs_where_ids_repeat(imported):
    """gpt-4o reuses call ids within a run; the environment's own record of which tool answered
    (the result's `name`) must be the nearest preceding call's, not the first one's."""
    _, sessions = imported("tau-bench")
    repeated = 0
    for s in sessions:
        for name, nearest in pairs(s):
            assert name == nearest, s.id
        ids = [c["id"] for m in s.messages for c in m.get("tool_calls") or []]
        first_names = {}
        for m in s.messages:
            for c in m.get("tool_calls") or []:
                first_names.setdefault(c["id"], c["function"]["name"])
            if m["role"] == "tool" and first_names[m["tool_call_id"]] != m["name"]:
                repeated += 1  # here first-match pairing would be wrong
        assert len(ids) >= len(set(ids))
    assert repeated >= 10  # the control: repeated ids with different tools do occur


def claude_code_events() -> list[dict]:
    """A hand-written Claude Code transcript: one response split over lines, repeated ids, noise."""
    base = {"isSidechain": False, "sessionId": "s-1", "version": "2.1.0", "cwd": "/w"}

    def user(content, **extra):
        return {**base, "type": "user", "message": {"role": "user", "content": content}, **extra}

    def assistant(mid, *blocks, model="claude-test", **extra):
        return [{**base, "type": "assistant", "message": {"id": mid, "role": "assistant", "model": model, "content": [b]}, **extra}
                for b in blocks]

    def result(tid, text):
        return user([{"type": "tool_result", "tool_use_id": tid, "content": text}])

    return [
        {"type": "queue-operation", "operation": "dequeue", "sessionId": "s-1"},
        user("List the files, then count them."),
        *assistant("m1", {"type": "thinking", "thinking": "I should list first.", "signature": "sig"},
                   {"type": "text", "text": "Listing."},
                   {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
                   {"type": "tool_use", "id": "t2", "name": "Glob", "input": {"pattern": "*"}}),
        result("t1", "a\nb"),
        user([{"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "a"}, {"type": "image", "source": {}}]}]),
        {**base, "type": "assistant", "isSidechain": True, "message": {"id": "side", "role": "assistant", "content": [{"type": "text", "text": "sub-agent"}]}},
        {"type": "summary", "summary": "Listing files", "leafUuid": "u9"},
        *assistant("m2", {"type": "tool_use", "id": "dup", "name": "Grep", "input": {"pattern": "x"}}),
        result("dup", "grep output"),
        *assistant("m3", {"type": "tool_use", "id": "dup", "name": "Read", "input": {"file_path": "a"}}),
        result("dup", "read output"),
        result("ghost", "a result with no call"),
        *assistant("m4", {"type": "text", "text": "API Error: overloaded"}, model="<synthetic>"),
        *assistant("m5", {"type": "redacted_thinking", "data": "xx"}, {"type": "text", "text": "There are 2 files."}),
    ]


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_claude_code_lines_sharing_a_message_id_merge_into_one_turn_with_thinking_as_reasoning(tmp_path):
    src = write_jsonl(tmp_path / "t.jsonl", claude_code_events())
    [s] = run_import("claude-code", [src], tmp_path / "out.jsonl")
    roles = [m["role"] for m in s.messages]
    assert roles == ["user", "assistant", "tool", "tool", "assistant", "tool", "assistant", "tool", "assistant"]
    first = s.messages[1]
    assert first["reasoning_content"] == "I should list first."
    assert first["content"] == "Listing."
    assert [c["function"]["name"] for c in first["tool_calls"]] == ["Bash", "Glob"]
    assert first["tool_calls"][0]["function"]["arguments"] == {"command": "ls"}
    assert s.messages[3]["content"] == "a"  # the image block of the result is dropped
    assert s.messages[-1] == {"role": "assistant", "content": "There are 2 files."}
    assert "sub-agent" not in json.dumps(s.messages) and "API Error" not in json.dumps(s.messages)
    [record] = raw_lines(tmp_path / "out.jsonl")
    assert record["meta"]["dropped"] == {"sidechain_events": 1, "non_message_events": 2, "synthetic_messages": 1,
                                         "redacted_thinking_blocks": 1, "media_blocks": 1, "orphan_tool_results": 1}
    assert record["meta"]["missing"] == ["system_prompt", "tools", "sampling"] and "tools" not in record
    assert record["meta"]["sampling"] == {}
    assert record["id"] == "s-1" and record["meta"]["original"]["model"] == "claude-test"


def test_tool_results_with_repeated_ids_pair_with_the_nearest_preceding_call(tmp_path):
    src = write_jsonl(tmp_path / "t.jsonl", claude_code_events())
    [s] = run_import("claude-code", [src], tmp_path / "out.jsonl")
    assert pairs(s) == [("Bash", "Bash"), ("Glob", "Glob"), ("Grep", "Grep"), ("Read", "Read")]
    # The control: pairing with the first call of that id would name the last result Grep.
    dup_results = [m for m in s.messages if m.get("tool_call_id") == "dup"]
    assert [m["name"] for m in dup_results] == ["Grep", "Read"]


def test_a_claude_code_compaction_boundary_starts_a_new_session(tmp_path):
    events = claude_code_events()[:7] + [{"type": "system", "subtype": "compact_boundary", "sessionId": "s-1"},
                                         {"type": "user", "sessionId": "s-1", "isCompactSummary": True,
                                          "message": {"role": "user", "content": "Summary: files listed."}},
                                         {"type": "assistant", "sessionId": "s-1", "message": {"id": "m9", "role": "assistant", "content": [{"type": "text", "text": "Done."}]}}]
    sessions = run_import("claude-code", [write_jsonl(tmp_path / "t.jsonl", events)], tmp_path / "out.jsonl")
    assert [s.id for s in sessions] == ["s-1#1", "s-1#2"]
    assert [m["role"] for m in sessions[1].messages] == ["user", "assistant"]


# --- reasoning lands in reasoning_content -----------------------------------------------------


@needs_public
def test_tau2_reasoning_comes_from_raw_data_of_each_assistant_turn(imported):
    _, sessions = imported("tau2-bench")
    raw = json.loads(samples("tau2-bench")[0].read_text())
    for sim, s in zip(raw["simulations"], sessions):
        expected = [((m.get("raw_data") or {}).get("message") or {}).get("reasoning_content") for m in sim["messages"] if m["role"] == "assistant"]
        got = [m.get("reasoning_content") for m in s.messages if m["role"] == "assistant"]
        assert got == expected, s.id
    assert sum(1 for s in sessions for m in s.messages if m.get("reasoning_content")) == 40  # the 12 greetings have none


@needs_public
def test_mini_swe_agent_reasoning_of_the_first_turn_comes_from_the_raw_response(imported):
    _, sessions = imported("mini-swe-agent")
    with_reasoning = 0
    for path, s in zip(samples("mini-swe-agent"), sessions):
        raw = json.loads(path.read_text())
        expected = [m["extra"]["response"]["choices"][0]["message"].get("reasoning") for m in raw["messages"] if m["role"] == "assistant"]
        got = [m.get("reasoning_content") for m in s.messages if m["role"] == "assistant"]
        assert got == expected, s.id
        with_reasoning += bool(got[0])
        assert s.messages[2]["content"] == raw["messages"][2]["content"]  # the action stays a bash block in the text
    assert with_reasoning >= 12


@needs_public
def test_anthropic_thinking_becomes_reasoning_and_the_cassette_is_one_conversation(imported):
    out, [s] = imported("anthropic")
    cassette = yaml.safe_load(samples("anthropic")[0].read_text())
    first_reply = cassette["interactions"][0]["response"]["parsed_body"]["content"]
    thinking = next(b["thinking"] for b in first_reply if b["type"] == "thinking")
    assert [m["role"] for m in s.messages] == ["user", "assistant", "tool", "assistant"]
    assert s.messages[1]["reasoning_content"] == thinking
    assert s.messages[1]["tool_calls"][0]["function"] == {"name": "get_user_country", "arguments": {}}
    assert s.messages[2] == {"role": "tool", "content": "Mexico", "tool_call_id": s.messages[1]["tool_calls"][0]["id"], "name": "get_user_country"}
    final = cassette["interactions"][1]["response"]["parsed_body"]["content"][0]["text"]
    assert s.messages[3]["content"] == final
    [record] = raw_lines(out)
    assert record["meta"]["original"]["requests"] == ["interactions[0]", "interactions[1]"]
    assert record["tools"] == [{"type": "function", "function": {"name": "get_user_country", "description": "",
                                                                 "parameters": cassette["interactions"][0]["request"]["parsed_body"]["tools"][0]["input_schema"]}}]
    assert record["meta"]["missing"] == []
    assert record["meta"]["sampling"] == {"max_tokens": cassette["interactions"][1]["request"]["parsed_body"]["max_tokens"]}


def test_anthropic_request_bodies_fold_only_when_the_next_request_resends_the_history(tmp_path):
    def body(*messages, system="Be brief."):
        return {"model": "m", "max_tokens": 100, "system": system, "messages": list(messages)}

    q = {"role": "user", "content": "Hi?"}
    a = {"role": "assistant", "content": [{"type": "thinking", "thinking": "greet", "signature": "s"}, {"type": "text", "text": "Hello."}]}
    q2 = {"role": "user", "content": [{"type": "text", "text": "And?"}]}
    a2 = {"role": "assistant", "content": "Bye."}
    lines = [body(q, a), body(q, a, q2, a2), body(q, a, system="Other."), {"request": body({"role": "user", "content": "Again"}),
                                                                            "response": {"id": "r1", "role": "assistant", "content": [{"type": "text", "text": "Sure."}]}}]
    sessions = run_import("anthropic", [write_jsonl(tmp_path / "bodies.jsonl", lines)], tmp_path / "out.jsonl")
    assert [s.id for s in sessions] == ["bodies:2", "bodies:3", "bodies:4"]
    assert [m["role"] for m in sessions[0].messages] == ["system", "user", "assistant", "user", "assistant"]
    assert sessions[0].messages[2]["reasoning_content"] == "greet"
    assert sessions[2].messages[-1] == {"role": "assistant", "content": "Sure."}
    assert [r["meta"]["original"]["requests"] for r in raw_lines(tmp_path / "out.jsonl")] == [["line 1", "line 2"], ["line 3"], ["line 4"]]


# --- missing system prompts and tool schemas are recorded, never invented -----------------------


@needs_public
def test_tau2_takes_the_system_prompt_from_the_template_beside_it_with_the_policy_filled_in(imported, tmp_path):
    _, sessions = imported("tau2-bench")
    raw = json.loads(samples("tau2-bench")[0].read_text())
    template = (SESSIONS_PUBLIC / "tau2-bench_grok" / "agent_system_prompt_template.txt").read_text()
    system = template.replace("{domain_policy}", raw["info"]["environment_info"]["policy"])
    assert all(s.messages[0] == {"role": "system", "content": system} for s in sessions)
    assert all(s.meta["missing"] == ["tools"] and s.tools is None for s in sessions)  # tool_defs is null in these files
    assert all(s.meta["sampling"] == {"temperature": 0.0} for s in sessions)  # the agent's llm_args
    alone = tmp_path / "airline.json"  # without the template beside it
    shutil.copy(samples("tau2-bench")[0], alone)
    bare = run_import("tau2-bench", [alone], tmp_path / "out.jsonl")
    assert all(s.meta["missing"] == ["system_prompt", "tools"] and s.messages[0]["role"] != "system" for s in bare)  # sampling: llm_args
    given = run_import("tau2-bench", [alone], tmp_path / "out2.jsonl", system_template=SESSIONS_PUBLIC / "tau2-bench_grok" / "agent_system_prompt_template.txt")
    assert all(s.messages[0]["content"] == system and s.meta["supplied"]["system_prompt"].endswith("agent_system_prompt_template.txt") for s in given)


@needs_public
def test_tau_bench_tools_come_from_the_file_beside_it_or_the_option_else_are_recorded_missing(imported, tmp_path):
    _, sessions = imported("tau-bench")
    tools_file = SESSIONS_PUBLIC / "tau-bench_gpt-4o-airline" / "tools_airline.openai.json"
    tools = json.loads(tools_file.read_text())
    assert all(list(s.tools) == tools and s.meta["missing"] == ["sampling"] and s.meta["supplied"] == {"tools": str(tools_file)} for s in sessions)
    data = json.loads(samples("tau-bench")[0].read_text())[:3]
    alone = write_jsonl(tmp_path / "gpt-4o-airline.json", [])
    alone.write_text(json.dumps(data))
    bare = run_import("tau-bench", [alone], tmp_path / "out.jsonl")
    assert all(s.tools is None and s.meta["missing"] == ["tools", "sampling"] for s in bare)
    given = run_import("tau-bench", [alone], tmp_path / "out2.jsonl", tools=tools_file)
    assert all(list(s.tools) == tools for s in given)
    no_system = [dict(run, traj=run["traj"][1:]) for run in data]
    alone.write_text(json.dumps(no_system))
    assert all(s.meta["missing"] == ["system_prompt", "tools", "sampling"] and s.messages[0]["role"] == "user"
               for s in run_import("tau-bench", [alone], tmp_path / "out3.jsonl"))


@needs_public
def test_claude_code_records_its_missing_system_prompt_and_tools(imported):
    _, sessions = imported("claude-code")
    for s in sessions:
        assert s.meta["missing"] == ["system_prompt", "tools", "sampling"]
        assert s.tools is None and all(m["role"] != "system" for m in s.messages)


@needs_public
def test_mini_swe_agent_has_its_system_prompt_and_no_tool_schemas_to_miss(imported, tmp_path):
    _, sessions = imported("mini-swe-agent")
    assert all(s.meta["missing"] == [] and s.messages[0]["role"] == "system" and s.tools is None for s in sessions)
    assert all(s.meta["sampling"] == {"temperature": 0.0} for s in sessions)  # info.config.model.model_kwargs
    raw = json.loads(samples("mini-swe-agent")[0].read_text())
    raw["messages"] = raw["messages"][1:]
    path = tmp_path / "x.traj.json"
    path.write_text(json.dumps(raw))
    [s] = run_import("mini-swe-agent", [path], tmp_path / "out.jsonl")
    assert s.meta["missing"] == ["system_prompt"] and s.messages[0]["role"] == "user"


# --- tau2: the simulated user's own tool calls are dropped ------------------------------------


def tau2_dual_control() -> dict:
    """A telecom-like simulation written by hand: the user simulator runs tools on their phone."""
    def call(cid, name, requestor):
        return {"id": cid, "name": name, "arguments": {"x": 1}, "requestor": requestor}

    def reasoning(text):
        return {"message": {"role": "assistant", "content": "", "reasoning_content": text}}

    return {
        "info": {"environment_info": {"domain_name": "telecom", "policy": "Fix phones.", "tool_defs": None},
                 "agent_info": {"llm": "some-model"}},
        "simulations": [{"id": "sim-1", "task_id": "t1", "trial": 0, "messages": [
            {"role": "assistant", "content": "Hi! How can I help you today?", "raw_data": None},
            {"role": "user", "content": "My data is off.", "raw_data": reasoning("user's own thoughts")},
            {"role": "assistant", "content": "", "tool_calls": [call("a1", "get_line", "assistant")], "raw_data": reasoning("Check the line.")},
            {"role": "tool", "id": "a1", "content": "line ok", "requestor": "assistant"},
            {"role": "assistant", "content": "Please toggle airplane mode.", "raw_data": reasoning("Ask the user.")},
            {"role": "user", "content": "", "tool_calls": [call("u1", "toggle_airplane_mode", "user")]},
            {"role": "tool", "id": "u1", "content": "airplane mode off", "requestor": "user"},
            {"role": "user", "content": "Done, it works.", "tool_calls": [call("u2", "check_status", "user")]},
            {"role": "tool", "tool_messages": [{"id": "u2", "role": "tool", "content": "ok", "requestor": "user"}]},
            {"role": "assistant", "content": "Great.", "raw_data": reasoning("Solved.")},
        ]}],
    }


def test_tau2_drops_the_simulated_users_own_tool_calls_and_their_results(tmp_path):
    path = tmp_path / "telecom.json"
    path.write_text(json.dumps(tau2_dual_control()))
    [s] = run_import("tau2-bench", [path], tmp_path / "out.jsonl")
    assert [(m["role"], m["content"]) for m in s.messages] == [
        ("assistant", "Hi! How can I help you today?"), ("user", "My data is off."), ("assistant", ""), ("tool", "line ok"),
        ("assistant", "Please toggle airplane mode."), ("user", "Done, it works."), ("assistant", "Great.")]
    names = [c["function"]["name"] for m in s.messages for c in m.get("tool_calls") or []]
    assert names == ["get_line"]
    assert [m.get("reasoning_content") for m in s.messages if m["role"] == "assistant"] == [None, "Check the line.", "Ask the user.", "Solved."]
    [record] = raw_lines(tmp_path / "out.jsonl")
    assert record["meta"]["dropped"] == {"user_tool_calls": 2, "user_tool_results": 2, "user_tool_call_messages": 1}
    assert record["meta"]["missing"] == ["system_prompt", "tools", "sampling"]
    assert record["meta"]["original"] == {"simulation_id": "sim-1", "task_id": "t1", "trial": 0, "agent_llm": "some-model"}


# --- the command ------------------------------------------------------------------------------


@needs_public
def test_the_import_command_prints_sessions_per_file_and_writes_what_the_sessions_command_reads(tmp_path, tiny_checkpoint):
    files = samples("claude-code")[:2] + samples("anthropic")
    out = tmp_path / "imported.jsonl"
    r = cli("auto", *files, "-o", out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"{files[0]}: 1 session (claude-code)", f"{files[1]}: 1 session (claude-code)",
                                     f"{files[2]}: 1 session (anthropic)", f"wrote 3 sessions to {out}"]
    shown = subprocess.run([sys.executable, "-m", "mtp_observe", "sessions", str(out), "--model", str(tiny_checkpoint)],
                           capture_output=True, text=True, env={"COLUMNS": "250", "PATH": ""})
    assert shown.returncode == 0, shown.stderr


def test_bad_input_is_one_line_naming_the_file_and_record_and_nothing_is_written(tmp_path):
    path = tmp_path / "runs-airline.json"
    good = {"task_id": 1, "trial": 0, "traj": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    path.write_text(json.dumps([good, {"task_id": 2, "trial": 0, "traj": "oops"}]))
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    r = cli("tau-bench", path, "-o", out, "--overwrite")  # a file to replace: a failed import leaves it as it was
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines == [f"error: {path}: [1].traj: must be a list, not a string"], r.stderr
    assert out.read_text() == "previous\n"  # atomic: the old output stands
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "runs-airline.json"]
    r = cli("tau-bench", path, "-o", out, "--on-error", "skip", "--overwrite")
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip().splitlines() == [f"skipped: {path}: [1].traj: must be a list, not a string"]
    assert r.stdout.splitlines()[0] == f"{path}: 1 session (tau-bench, 1 skipped)"
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["runs-airline:1:0"]


def test_a_converted_session_the_reader_would_refuse_names_the_record_and_the_fix(tmp_path):
    path = tmp_path / "runs-airline.json"
    bad_args = {"task_id": 3, "trial": 1, "traj": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}
    path.write_text(json.dumps([bad_args]))
    with pytest.raises(InputError, match=r"runs-airline.json: \[0\]: session runs-airline:3:1: message 1 tool call 0 \(f\) arguments are not valid JSON"):
        import_files("tau-bench", [path], tmp_path / "out.jsonl")


def test_options_a_format_does_not_read_are_refused(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", claude_code_events())
    r = cli("mini-swe-agent", path, "-o", tmp_path / "o.jsonl", "--system-template", path)
    assert r.returncode == 2 and r.stderr.startswith("error: --system-template applies to tau2-bench")
    body = tmp_path / "anthropic.json"
    body.write_text(json.dumps({"model": "m", "max_tokens": 5, "system": "s", "messages": [{"role": "user", "content": "q"},
                                                                                            {"role": "assistant", "content": "a"}]}))
    r = cli("auto", body, "-o", tmp_path / "o.jsonl", "--tools", path)  # under auto, no file reads --tools
    assert r.returncode == 2 and "--tools applies to" in r.stderr and "none of the files" in r.stderr, r.stderr
    assert not (tmp_path / "o.jsonl").exists()
    r = cli("claude-code", path, "-o", path)
    assert r.returncode == 2 and "is one of the input files" in r.stderr


def test_an_output_path_that_cannot_be_written_is_one_line_and_leaves_nothing_behind(tmp_path):
    src = write_jsonl(tmp_path / "t.jsonl", claude_code_events())
    (tmp_path / "taken").mkdir()
    r = cli("claude-code", src, "-o", tmp_path / "taken")
    # refused by the one check every writing command makes, before anything is read (#27 item 1)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: --output {tmp_path / 'taken'}: is a directory; give a file name (e.g. {tmp_path / 'taken' / 'out'})"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl", "taken"]


def test_an_import_that_finds_no_session_is_refused_in_one_line_and_writes_nothing(tmp_path):
    """`import auto` on a directory of files none of which is a log (each skipped), or on a log whose every record is
    skipped, used to write an empty file with exit 0; docs/errors.md says such an input is refused (#27 item 7)."""
    from .fuzzing import run_cli

    directory = tmp_path / "logs"
    directory.mkdir()
    (directory / "notes.json").write_text('{"x": 1}')
    (directory / "other.jsonl").write_text('{"y": 2}\n{"y": 3}\n')
    bad = tmp_path / "runs-airline.json"
    bad.write_text(json.dumps([{"task_id": 1, "trial": 0, "traj": "oops"}]))
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    for argv, said in ((["auto", str(directory)], "no session found in 2 files (2 not a log format)"),
                       (["tau-bench", str(bad), "--on-error", "skip"], "no session found in 1 file (1 record skipped)"),
                       (["auto", str(bad), "--on-error", "skip"], "no session found in 1 file (1 record skipped)")):
        code, stdout, err = run_cli(["import", *argv, "-o", str(out), "--overwrite"])
        assert code == 2 and len(err.strip().splitlines()) == 1 and said in err and "nothing was written" in err, err
        assert out.read_text() == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs", "out.jsonl", "runs-airline.json"]


@needs_public
def test_auto_over_a_folder_of_mixed_logs_skips_and_names_an_input_it_cannot_read_unless_on_error_fail(tmp_path):
    """A folder holding an OpenAI Batch input whose output file is absent, beside a log auto reads: the Batch file is
    skipped, counted and named (as files that are no log are); `--on-error fail` stops on it and writes nothing."""
    batch = SESSIONS_PUBLIC / "openai-batch"
    litellm = SESSIONS_PUBLIC / "litellm-standard-logging-payload"
    out = tmp_path / "mixed.jsonl"
    r = cli("auto", batch, litellm, "-o", out)
    assert r.returncode == 0, r.stderr
    [unread] = [line for line in r.stdout.splitlines() if "batch_job_results_furniture.jsonl" in line]
    assert unread.endswith(": 0 sessions (openai-batch, cannot be read as a log, skipped)"), unread
    assert r.stdout.splitlines()[-1] == f"wrote 1 session to {out}; 1 file skipped"
    assert "skipped: " in r.stderr and "a Batch input file with no output file" in r.stderr
    assert len([s for s in read_sessions([out]) if isinstance(s, Session)]) == 1
    strict = cli("auto", batch, litellm, "-o", tmp_path / "strict.jsonl", "--on-error", "fail")
    assert strict.returncode == 2 and strict.stderr.count("\n") == 1 and "no output file" in strict.stderr
    assert not (tmp_path / "strict.jsonl").exists()
    alone = cli("auto", batch, "-o", tmp_path / "alone.jsonl")  # nothing readable at all: refused, as before
    assert alone.returncode == 2 and "no session found in 1 file (1 not a log format)" in alone.stderr, alone.stderr


@needs_public
def test_import_refuses_an_existing_output_without_overwrite_and_an_output_that_is_one_of_its_inputs(tmp_path):
    log = SESSIONS_PUBLIC / "litellm-standard-logging-payload"
    out = tmp_path / "mine.jsonl"
    assert cli("auto", log, "-o", out).returncode == 0
    before = out.read_text()
    out.write_text("kept\n")
    again = cli("auto", log, "-o", out)
    assert again.returncode == 2 and again.stderr == f"error: --output {out}: exists; pass --overwrite to replace it, or choose another path\n"
    assert out.read_text() == "kept\n"
    replaced = cli("auto", log, "-o", out, "--overwrite")
    assert replaced.returncode == 0 and out.read_text() == before
    own = tmp_path / "own.jsonl"
    shutil.copy(out, own)
    over_input = cli("auto", own, "-o", own, "--overwrite")  # canonical sessions are no log, but the input is kept whole
    assert over_input.returncode == 2 and "is one of the input files" in over_input.stderr and own.read_text() == before
