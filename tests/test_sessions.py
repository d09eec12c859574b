"""Recorded sessions to scored token spans: reading, validation, rendering, segments, the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from itertools import islice
from pathlib import Path

import pytest

from mtp_observe.sessions.importers import Options, tau2_bench, tau_bench
from mtp_observe.sessions.importers.common import Source
from mtp_observe.sessions.reading import Session, Skipped, read_sessions
from mtp_observe.sessions.rendering import SEGMENTS, Renderer

from .conftest import SESSIONS_PUBLIC

EOT = "<|im_end|>"


@pytest.fixture(scope="module")
def renderer(tiny_checkpoint) -> Renderer:
    return Renderer.from_model_dir(tiny_checkpoint, vocab_size=1001)


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def render_one(renderer, record, tmp_path, name="s.jsonl"):
    [session] = list(read_sessions([write_jsonl(tmp_path / name, [record])]))
    return renderer.render(session)


def decode(renderer, ids) -> str:
    return renderer.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def assert_spans_are_the_rendered_turns(renderer, session: Session, rendered):
    """Every scored span decodes to its assistant message as the template renders it, through the end-of-turn token."""
    tok = renderer.tokenizer
    assert rendered.requests
    turns = []
    for req in rendered.requests:
        for sp in req.spans:
            i = sp.turn
            assert session.messages[i]["role"] == "assistant"
            prompt = tok.apply_chat_template(list(session.messages[:i]), tools=session.tools, tokenize=False, add_generation_prompt=True)
            full = tok.apply_chat_template(list(session.messages[: i + 1]), tools=session.tools, tokenize=False)
            expected = full[len(prompt):].split(EOT)[0] + EOT
            assert decode(renderer, req.input_ids[sp.start : sp.end + 1]) == expected, (session.id, i)
            assert decode(renderer, req.input_ids[: sp.start]) == prompt, (session.id, i)
            assert req.input_ids[sp.end] in renderer.eos_ids
            assert len(sp.segments) == sp.end - sp.start + 1
            turns.append(i)
    assert turns == session.assistant_turns


# --- real sessions ----------------------------------------------------------------------------

needs_public = pytest.mark.skipif(SESSIONS_PUBLIC is None, reason="../shared/sessions-public is absent on this machine")


def tau_bench_sessions(limit: int):
    """The first `limit` runs of the public tau-bench sample, imported (tool schemas from the file beside it)."""
    source = Source(SESSIONS_PUBLIC / "tau-bench_gpt-4o-airline" / "gpt-4o-airline.json")
    return list(islice(tau_bench.read(source, Options()), limit))


def tau2_sessions(limit: int):
    """The first `limit` public tau2 simulations, imported: reasoning from raw_data, user tool calls dropped."""
    source = Source(SESSIONS_PUBLIC / "tau2-bench_grok" / "airline_grok-3-mini.json")
    return list(islice(tau2_bench.read(source, Options()), limit))


@needs_public
def test_every_scored_span_of_real_tau_bench_sessions_is_its_rendered_assistant_message(renderer, tmp_path):
    path = write_jsonl(tmp_path / "tau.jsonl", tau_bench_sessions(8))
    n = 0
    for session in read_sessions([path]):
        assert_spans_are_the_rendered_turns(renderer, session, renderer.render(session))
        n += 1
    assert n == 8


@needs_public
def test_every_scored_span_of_real_tau2_sessions_with_reasoning_is_its_rendered_assistant_message(renderer, tmp_path):
    path = write_jsonl(tmp_path / "tau2.jsonl", tau2_sessions(4))
    reasoning = 0
    for session in read_sessions([path]):
        rendered = renderer.render(session)
        assert_spans_are_the_rendered_turns(renderer, session, rendered)
        reasoning += sum(sp.segments.count(0) for r in rendered.requests for sp in r.spans)
    assert reasoning > 100  # the grok sessions carry reasoning on every generated turn


# --- requests: merging only where prefix-stable ------------------------------------------------

# A ChatML template that keeps every turn's reasoning: prefix-stable, so turns merge.
KEEPING = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + (m.reasoning_content or '') + '\\n</think>\\n\\n' + (m.content or '') + '<|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n<think>\\n' -}}{%- endif -%}"
)
# The same, but reasoning is dropped from assistant turns before the last user message (as Qwen3.5 does).
DROPPING = KEEPING.replace(
    "{%- for m in messages -%}",
    "{%- set ns = namespace(last=-1) -%}{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}",
).replace(
    "'<|im_start|>assistant\\n<think>\\n' + (m.reasoning_content or '') + '\\n</think>\\n\\n' + (m.content or '')",
    "('<|im_start|>assistant\\n<think>\\n' + (m.reasoning_content or '') + '\\n</think>\\n\\n' if loop.index0 > ns.last else '<|im_start|>assistant\\n') + (m.content or '')",
    1,
)


def renderer_with_template(checkpoint: Path, tmp_path: Path, template: str) -> Renderer:
    d = tmp_path / "tok"
    d.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json"):
        shutil.copy(checkpoint / name, d / name)
    (d / "chat_template.jinja").write_text(template)
    return Renderer.from_model_dir(d)


MULTI_USER = {
    "id": "multi",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "First question?"},
        {"role": "assistant", "reasoning_content": "Think one.", "content": "Answer one."},
        {"role": "user", "content": "Second question?"},
        {"role": "assistant", "reasoning_content": "Think two.", "content": "Answer two."},
        {"role": "assistant", "reasoning_content": "Think more.", "content": "Answer two, continued."},
        {"role": "user", "content": "Third?"},
        {"role": "assistant", "reasoning_content": "Think three.", "content": "Answer three."},
    ],
}


def span_context(req, sp):
    return req.input_ids[: sp.end + 1], sp.start, sp.end, sp.segments


def assert_each_turn_equals_scoring_it_alone(renderer, record, rendered, tmp_path):
    for req in rendered.requests:
        for sp in req.spans:
            alone_record = dict(record, messages=record["messages"][: sp.turn + 1], id=f"alone{sp.turn}")
            alone = render_one(renderer, alone_record, tmp_path, f"alone{sp.turn}.jsonl")
            last_req = alone.requests[-1]
            assert span_context(last_req, last_req.spans[-1]) == span_context(req, sp), sp.turn


def test_a_template_that_drops_earlier_reasoning_starts_a_new_request_per_user_message(tiny_checkpoint, tmp_path):
    renderer = renderer_with_template(tiny_checkpoint, tmp_path, DROPPING)
    rendered = render_one(renderer, MULTI_USER, tmp_path)
    assert [[sp.turn for sp in r.spans] for r in rendered.requests] == [[2], [4, 5], [7]]
    assert_each_turn_equals_scoring_it_alone(renderer, MULTI_USER, rendered, tmp_path)


def test_a_prefix_stable_template_merges_every_turn_into_one_request(tiny_checkpoint, tmp_path):
    renderer = renderer_with_template(tiny_checkpoint, tmp_path, KEEPING)
    rendered = render_one(renderer, MULTI_USER, tmp_path)
    assert [[sp.turn for sp in r.spans] for r in rendered.requests] == [[2, 4, 5, 7]]
    assert_each_turn_equals_scoring_it_alone(renderer, MULTI_USER, rendered, tmp_path)


def test_the_package_template_drops_reasoning_like_qwen3_5_and_merges_tool_steps(renderer, tmp_path):
    rendered = render_one(renderer, dict(MULTI_USER, messages=MULTI_USER["messages"]), tmp_path)
    assert [[sp.turn for sp in r.spans] for r in rendered.requests] == [[2], [4, 5], [7]]
    assert_spans_are_the_rendered_turns(renderer, list(read_sessions([tmp_path / "s.jsonl"]))[0], rendered)


# --- segments ---------------------------------------------------------------------------------

TOOL_SESSION = {
    "id": "tools",
    "tools": [{"type": "function", "function": {"name": "get_order", "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}}],
    "messages": [
        {"role": "user", "content": "Where are orders 123 and 124?"},
        {
            "role": "assistant",
            "reasoning_content": "Need both orders.",
            "content": "Let me check both.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_order", "arguments": "{\"id\": \"123\"}"}},
                {"id": "c2", "type": "function", "function": {"name": "get_order", "arguments": {"id": "124"}}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "shipped"},
        {"role": "tool", "tool_call_id": "c2", "content": "pending"},
        {"role": "assistant", "content": "123 shipped, 124 pending."},
    ],
}


def segment_texts(renderer, req, sp) -> list[tuple[str, str]]:
    """[(segment, decoded text)] for runs of equal labels."""
    runs: list[tuple[str, list[int]]] = []
    for k in range(sp.start, sp.end + 1):
        seg = SEGMENTS[sp.segments[k - sp.start]]
        if runs and runs[-1][0] == seg:
            runs[-1][1].append(req.input_ids[k])
        else:
            runs.append((seg, [req.input_ids[k]]))
    return [(seg, decode(renderer, ids)) for seg, ids in runs]


def test_segment_labels_are_exact_on_a_message_with_reasoning_text_and_two_tool_calls(renderer, tmp_path):
    rendered = render_one(renderer, TOOL_SESSION, tmp_path)
    [req] = rendered.requests
    first, second = req.spans
    assert segment_texts(renderer, req, first) == [
        ("reasoning", "Need both orders.\n</think>\n\n"),
        ("text", "Let me check both."),
        ("tool_call", "\n\n<tool_call>\n<function=get_order>\n<parameter=id>\n123\n</parameter>\n</function>\n</tool_call>"
                      "\n<tool_call>\n<function=get_order>\n<parameter=id>\n124\n</parameter>\n</function>\n</tool_call>"),
        ("end", EOT),
    ]
    assert segment_texts(renderer, req, second) == [
        ("reasoning", "\n</think>\n\n"),
        ("text", "123 shipped, 124 pending."),
        ("end", EOT),
    ]


def test_a_message_with_only_tool_calls_has_no_text_segment(renderer, tmp_path):
    record = json.loads(json.dumps(TOOL_SESSION))
    record["messages"][1]["content"] = None
    record["messages"][1].pop("reasoning_content")
    rendered = render_one(renderer, record, tmp_path)
    segs = [s for s, _ in segment_texts(renderer, rendered.requests[0], rendered.requests[0].spans[0])]
    assert segs == ["reasoning", "tool_call", "end"]


def test_reasoning_and_thinking_are_aliases_of_reasoning_content(tmp_path):
    for key in ("reasoning", "thinking", "reasoning_content"):
        rec = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", key: "why", "content": "a"}]}
        [s] = list(read_sessions([write_jsonl(tmp_path / f"{key}.jsonl", [rec])]))
        assert s.messages[1]["reasoning_content"] == "why"


# --- formats ----------------------------------------------------------------------------------


def test_a_file_of_message_lines_is_one_session_named_after_the_file(renderer, tmp_path):
    path = write_jsonl(tmp_path / "chat-42.jsonl", MULTI_USER["messages"])
    [s] = list(read_sessions([path]))
    assert s.id == "chat-42" and len(s.messages) == len(MULTI_USER["messages"])
    assert len(renderer.render(s).requests) == 3


def test_a_session_without_id_is_named_by_file_stem_and_line(tmp_path):
    rec = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    path = tmp_path / "log.jsonl"
    path.write_text("\n" + json.dumps(rec) + "\n" + json.dumps(rec) + "\n")
    assert [s.id for s in read_sessions([path])] == ["log:2", "log:3"]


def test_token_level_records_score_the_completion_with_text_and_end(renderer, tmp_path):
    eot = next(iter(renderer.eos_ids))
    recs = [
        {"id": "t1", "prompt_token_ids": [5, 6, 7], "completion_token_ids": [8, 9, eot]},
        {"id": "t2", "requests": [{"prompt_token_ids": [1, 2], "completion_token_ids": [3, 4]},
                                  {"prompt_token_ids": [1, 2, 3, 4], "completion_token_ids": [5, 6]}]},
    ]
    out = [renderer.render(s) for s in read_sessions([write_jsonl(tmp_path / "tok.jsonl", recs)])]
    [r] = out[0].requests
    assert r.input_ids == [5, 6, 7, 8, 9, eot]
    assert (r.spans[0].start, r.spans[0].end) == (3, 5)
    assert [SEGMENTS[c] for c in r.spans[0].segments] == ["text", "text", "end"]
    assert [(q.spans[0].start, q.spans[0].end, q.spans[0].turn) for q in out[1].requests] == [(2, 3, 0), (4, 5, 1)]


def test_reading_is_streamed_one_session_at_a_time(tmp_path):
    rec = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    path = tmp_path / "stream.jsonl"
    path.write_text(json.dumps(rec) + "\n{broken\n")
    stream = read_sessions([path])
    assert next(stream).id == "stream:1"  # yielded before the bad line is read
    with pytest.raises(Exception, match=r"stream.jsonl:2"):
        next(stream)


# --- bad input: one line naming the file and line, exit 2 -------------------------------------

GOOD = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
BAD_CASES = {
    "invalid JSON": ("{not json", "invalid JSON"),
    "unknown role": ({"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "a"}]}, "unknown role 'robot'"),
    "tool result without a call": ({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "tool_call_id": "x", "content": "r"}, {"role": "assistant", "content": "a"}]}, "no preceding call"),
    "arguments not JSON": ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}, "not valid JSON"),
    "arguments not an object": ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}]}]}, "arguments are a JSON array, not an object"),
    "empty session": ({"messages": []}, "empty session"),
    "no assistant turn": ({"messages": [{"role": "user", "content": "q"}]}, "no assistant turn to score"),
    "non-text part": ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, {"role": "assistant", "content": "a"}]}, "non-text content part"),
    "unknown record": ({"hello": 1}, "unknown record"),
    "no completion": ({"prompt_token_ids": [1], "completion_token_ids": []}, "no completion tokens"),
    "token beyond vocabulary": ({"prompt_token_ids": [1], "completion_token_ids": [5000, 6]}, ">= the model's vocabulary"),
}


def run_sessions_cli(*args):
    return subprocess.run([sys.executable, "-m", "mtp_observe", "sessions", *map(str, args)], capture_output=True, text=True)


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_each_bad_input_is_exit_2_with_one_line_naming_the_file_and_line(tiny_checkpoint, tmp_path, case):
    bad, needle = BAD_CASES[case]
    path = tmp_path / "input.jsonl"
    path.write_text(json.dumps(dict(GOOD, id="ok")) + "\n" + (bad if isinstance(bad, str) else json.dumps(dict(bad, id="bad"))) + "\n")
    r = run_sessions_cli(path, "--model", tiny_checkpoint)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{path}:2:" in lines[0] and needle in lines[0], lines[0]
    if not isinstance(bad, str):
        assert "session bad" in lines[0]


def test_windows_line_endings_and_a_raw_carriage_return_inside_a_line_read_as_one_session_per_line(tmp_path):
    path = tmp_path / "crlf.jsonl"
    first = json.dumps(dict(GOOD, id="a"))
    second = json.dumps(dict(GOOD, id="b")).replace('"messages":', '"messages":\r', 1)  # \r is JSON whitespace
    path.write_bytes((first + "\r\n" + second + "\r\n" + "{bad\r\n").encode())
    items = list(read_sessions([path], on_error="skip"))
    assert [getattr(i, "id", None) for i in items[:2]] == ["a", "b"]
    assert isinstance(items[2], Skipped) and items[2].line == 3


def test_a_bad_line_in_a_message_file_names_that_line(tiny_checkpoint, tmp_path):
    path = tmp_path / "msgs.jsonl"
    lines = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "wizard", "content": "x"}]
    write_jsonl(path, lines)
    r = run_sessions_cli(path, "--model", tiny_checkpoint)
    assert r.returncode == 2 and f"{path}:3: session msgs: message 2 has unknown role 'wizard'" in r.stderr


def test_a_missing_file_is_exit_2(tiny_checkpoint, tmp_path):
    r = run_sessions_cli(tmp_path / "nope.jsonl", "--model", tiny_checkpoint)
    assert r.returncode == 2 and "nope.jsonl: no such file" in r.stderr


def test_on_error_skip_counts_the_bad_session_and_goes_on(tiny_checkpoint, tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps(GOOD) + "\n{bad\n" + json.dumps(GOOD) + "\n")
    items = list(read_sessions([path], on_error="skip"))
    assert [type(i) for i in items] == [Session, Skipped, Session]
    assert items[1].line == 2 and "invalid JSON" in items[1].message
    r = run_sessions_cli(path, "--model", tiny_checkpoint, "--on-error", "skip")
    assert r.returncode == 0, r.stderr
    assert "skipped:" in r.stderr and "mixed.jsonl:2" in r.stderr


def test_the_sessions_command_summarises_and_shows_one_session(tiny_checkpoint, tmp_path):
    path = write_jsonl(tmp_path / "tools.jsonl", [TOOL_SESSION, MULTI_USER])
    r = subprocess.run([sys.executable, "-m", "mtp_observe", "sessions", str(path), "--model", str(tiny_checkpoint)],
                       capture_output=True, text=True, env={"COLUMNS": "250", "PATH": ""})
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if "tools.jsonl" in line)
    cells = [c.strip() for c in row.split("│") if c.strip()]
    assert cells[1:5] == ["2", "0", "6", "4"]  # sessions, skipped, assistant turns, requests
    shown = run_sessions_cli(path, "--model", tiny_checkpoint, "--show", "tools")
    assert shown.returncode == 0 and "get_order" in shown.stdout and "legend" in shown.stdout
    missing = run_sessions_cli(path, "--model", tiny_checkpoint, "--show", "nope")
    assert missing.returncode == 2 and "--show nope" in missing.stderr


def test_an_80_column_terminal_gets_the_summary_with_a_file_per_column_and_nothing_truncated(tiny_checkpoint, tmp_path):
    path = write_jsonl(tmp_path / "tools.jsonl", [TOOL_SESSION, MULTI_USER])
    wide, narrow = (subprocess.run([sys.executable, "-m", "mtp_observe", "sessions", str(path), "--model", str(tiny_checkpoint)],
                                   capture_output=True, text=True, env={"COLUMNS": cols, "PATH": ""}) for cols in ("250", "80"))
    assert wide.returncode == narrow.returncode == 0, narrow.stderr
    assert max(map(len, narrow.stdout.splitlines())) <= 80 and "…" not in narrow.stdout
    row = next(line for line in wide.stdout.splitlines() if "tools.jsonl" in line)
    values = [c.strip() for c in row.split("│") if c.strip()][1:]
    column = [[c.strip() for c in line.split("│") if c.strip()] for line in narrow.stdout.splitlines() if line.startswith("│")]
    assert [r[0] for r in column] == ["sessions", "skipped", "turns", "requests", "prompt", *SEGMENTS, "scored"]
    assert [r[1] for r in column] == values  # the same numbers as the wide table, transposed


@needs_public
def test_incremental_tokenization_equals_encoding_every_text_whole(tiny_checkpoint, tmp_path):
    path = write_jsonl(tmp_path / "tau.jsonl", tau_bench_sessions(3) + tau2_sessions(2))
    fast = Renderer.from_model_dir(tiny_checkpoint)
    exact = Renderer.from_model_dir(tiny_checkpoint)
    exact.incremental = False
    for session in read_sessions([path]):
        assert fast.render(session).requests == exact.render(session).requests
    assert fast.incremental and fast._self_checked
