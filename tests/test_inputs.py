"""Inputs and rendering options: .gz files, directories and standard input for import, sessions and
replay; --chat-template and --template-kwargs on sessions and replay, recorded in run.json."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtp_observe.errors import InputError, OptionError
from mtp_observe.model.loading import default_model_dir
from mtp_observe.sessions.importers import import_files
from mtp_observe.sessions.reading import read_sessions
from mtp_observe.sessions.rendering import Renderer, survey
from mtp_observe.sessions.templates import template_overrides

from .conftest import SESSIONS_PUBLIC
from .fuzzing import run_cli

needs_public = pytest.mark.skipif(SESSIONS_PUBLIC is None, reason="../shared/sessions-public is absent on this machine")

SESSION = {"id": "s", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"},
                                   {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet back."}]}


def session_line(sid: str, text: str = "Hello.") -> str:
    return json.dumps({**SESSION, "id": sid, "messages": SESSION["messages"][:2] + [{**SESSION["messages"][2], "content": text}]}) + "\n"


def with_stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


# --- the canonical reader -----------------------------------------------------------------------------


def test_the_reader_takes_gzip_files_directories_in_sorted_order_and_standard_input(tmp_path, monkeypatch):
    (tmp_path / "d" / "b").mkdir(parents=True)
    (tmp_path / "d" / "b" / "2.jsonl").write_text(session_line("two"))
    with gzip.open(tmp_path / "d" / "1.jsonl.gz", "wt") as f:
        f.write(session_line("one"))
    (tmp_path / "d" / "notes.txt").write_text("not sessions")
    (tmp_path / "d" / ".hidden.jsonl").write_text(session_line("hidden"))
    squeezed = tmp_path / "plain-name.jsonl"  # compressed, whatever the name says
    squeezed.write_bytes(gzip.compress(session_line("three").encode()))
    with_stdin(monkeypatch, session_line("four").encode() + b"\n{\"messages\": []}\n")
    items = list(read_sessions([tmp_path / "d", squeezed, "-"], on_error="skip"))
    assert [getattr(i, "id", None) for i in items] == ["one", "two", "three", "four", None]
    assert items[3].path == "-" and items[4].path == "-" and items[4].line == 3  # standard input is named "-"
    with_stdin(monkeypatch, b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n')
    [unnamed] = read_sessions(["-"])
    assert unnamed.id == "stdin:1"  # default ids start with "stdin"
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="a directory with no .jsonl or .jsonl.gz files in it"):
        list(read_sessions([tmp_path / "empty"]))
    with pytest.raises(InputError, match="nope.jsonl: no such file or directory"):
        list(read_sessions([tmp_path / "nope.jsonl"]))


def test_a_damaged_gzip_file_is_one_line_naming_it(tmp_path):
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(gzip.compress("".join(session_line(f"x{i}") for i in range(50)).encode())[:-30])
    with pytest.raises(InputError, match=r"cut.jsonl.gz:\d+: a damaged gzip file"):
        list(read_sessions([path]))
    with pytest.raises(InputError, match=r"cut.jsonl.gz: a damaged gzip file"):
        import_files("auto", [path], tmp_path / "out.jsonl")


# --- import -------------------------------------------------------------------------------------------


@needs_public
def test_gzipped_logs_import_exactly_like_the_plain_ones(tmp_path):
    for name in ("openai-chat-completions/test_chat_completion_tool_calls_with_content.yaml", "openhands/output.jsonl",
                 "litellm-standard-logging-payload/standard_logging_payload.json"):
        plain = SESSIONS_PUBLIC / name
        packed = tmp_path / (plain.name + ".gz")
        packed.write_bytes(gzip.compress(plain.read_bytes()))
        import_files("auto", [plain], tmp_path / "plain.jsonl")
        import_files("auto", [packed], tmp_path / "packed.jsonl")
        strip = lambda p: [{**r, "meta": {**r["meta"], "importer": {**r["meta"]["importer"], "file": None}}} for r in map(json.loads, p.read_text().splitlines())]
        assert strip(tmp_path / "plain.jsonl") == strip(tmp_path / "packed.jsonl"), name


@needs_public
def test_a_directory_imports_its_logs_recursively_in_sorted_order_and_skips_what_is_no_log(tmp_path):
    logs = tmp_path / "logs"
    shutil.copytree(SESSIONS_PUBLIC / "openai-responses", logs / "b-responses")
    shutil.copytree(SESSIONS_PUBLIC / "otel-genai", logs / "a-otel")  # only schemas and markdown: no log
    (logs / "c").mkdir()
    shutil.copy(SESSIONS_PUBLIC / "openhands" / "output.jsonl", logs / "c" / "output.jsonl")
    warnings = []
    counts = import_files("auto", [logs], tmp_path / "out.jsonl", warn=warnings.append)
    assert [(Path(c.path).relative_to(logs).as_posix(), c.format, c.sessions) for c in counts] == [
        ("a-otel/gen-ai-input-messages.json", "?", 0), ("a-otel/gen-ai-output-messages.json", "?", 0),
        ("b-responses/test_openai_responses_phase_live.yaml", "openai-responses", 1), ("c/output.jsonl", "openhands", 2)]
    assert len(warnings) == 2 and all("not a log format" in w and "found in a directory: skipped" in w for w in warnings)
    with pytest.raises(InputError, match="not a log format"):  # named on the command line, the same file is an error
        import_files("auto", [logs / "a-otel" / "gen-ai-input-messages.json"], tmp_path / "out.jsonl")


@needs_public
def test_standard_input_imports_under_auto_and_is_named_dash(tmp_path):
    data = (SESSIONS_PUBLIC / "openai-responses" / "test_openai_responses_phase_live.yaml").read_bytes()
    r = subprocess.run([sys.executable, "-m", "mtp_observe", "import", "auto", "-", "-o", str(tmp_path / "out.jsonl")],
                       input=data, capture_output=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().splitlines() == ["-: 1 session (openai-responses)", f"wrote 1 session to {tmp_path / 'out.jsonl'}"]
    [record] = map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())
    assert record["id"] == "stdin:1" and record["meta"]["importer"]["file"] == "-"


# --- rendering overrides ------------------------------------------------------------------------------


def bundled_template() -> str:
    return (default_model_dir() / "chat_template.jinja").read_text()


def test_template_overrides_are_checked_once_with_one_line_errors(tmp_path):
    template = tmp_path / "server.jinja"
    template.write_text(bundled_template())
    got = template_overrides(template, '{"enable_thinking": false}')
    assert got.chat_template == bundled_template() and got.kwargs == {"enable_thinking": False}
    assert got.manifest() == {"chat_template": {"path": str(template), "sha256": got.chat_template_sha256}, "template_kwargs": {"enable_thinking": False}}
    assert template_overrides().manifest() is None
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content }")
    for args, needle in (((broken, None), "broken.jinja: line 1:"), ((tmp_path / "none.jinja", None), "cannot read it"),
                         ((None, "{enable_thinking: false}"), "not JSON"), ((None, "[1]"), "must be a JSON object"),
                         ((None, '{"add_generation_prompt": true}'), "add_generation_prompt is not a template variable")):
        with pytest.raises(OptionError, match=needle):
            template_overrides(*args)


def test_sessions_renders_with_the_chat_template_and_template_kwargs_given(tmp_path):
    path = tmp_path / "s.jsonl"  # no reasoning: a turn a server with thinking off could have generated
    path.write_text(json.dumps({"id": "s", "messages": SESSION["messages"][:2] + [{"role": "assistant", "content": "Hello."}]}) + "\n")
    plain = Renderer.from_model_dir(default_model_dir(), vocab_size=4096)
    no_think = Renderer.from_model_dir(default_model_dir(), vocab_size=4096, overrides=template_overrides(None, '{"enable_thinking": false}'))
    server = tmp_path / "server.jinja"  # a server template that puts a note before every system prompt
    server.write_text(bundled_template().replace("'<|im_start|>system\\n' + system_text", "'<|im_start|>system\\nServer note.\\n' + system_text"))
    assert server.read_text() != bundled_template()
    noted = Renderer.from_model_dir(default_model_dir(), vocab_size=4096, overrides=template_overrides(server))
    totals = [survey([path], r)[1] for r in (plain, no_think, noted)]
    assert totals[0].scored["reasoning"] > 0 and totals[1].scored["reasoning"] == 0  # enable_thinking false: the prompt closes <think>
    assert totals[1].scored_tokens < totals[0].scored_tokens and totals[1].tokens == totals[0].tokens
    assert totals[2].prompt_tokens > totals[0].prompt_tokens and totals[2].scored == totals[0].scored
    code, _, err = run_cli(["sessions", str(path), "--template-kwargs", "{bad", "--model", str(default_model_dir())])
    assert code == 2 and err.strip().splitlines() == ["error: --template-kwargs {bad: not JSON (Expecting property name enclosed in double quotes); "
                                                      "give an object, e.g. '{\"enable_thinking\": false}'"]
    code, out, err = run_cli(["sessions", str(path), "--chat-template", str(server), "--model", str(default_model_dir())])
    assert code == 0, err


def test_replay_reads_standard_input_and_records_the_template_overrides_that_resume_must_repeat(tmp_path, monkeypatch):
    run = tmp_path / "run"
    turn = lambda sid, text: json.dumps({"id": sid, "messages": SESSION["messages"][:2] + [{"role": "assistant", "content": text}]}) + "\n"
    data = (turn("a", "Hello.") + turn("b", "Hi there.")).encode()
    args = ["replay", "-", "--out", str(run), "--k", "1", "--device", "cpu", "--template-kwargs", '{"enable_thinking": false}']
    with_stdin(monkeypatch, data)
    code, _, err = run_cli(args)
    assert code == 0, err
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["rendering"] == {"chat_template": None, "template_kwargs": {"enable_thinking": False}}
    assert manifest["inputs"] == [{"path": "-", "sha256": manifest["inputs"][0]["sha256"], "sessions": 2}]
    manifest["status"] = "failed"  # as if interrupted: --resume must meet the same identity
    (run / "run.json").write_text(json.dumps(manifest))
    with_stdin(monkeypatch, data)
    code, _, err = run_cli(args[:-1] + ['{"enable_thinking": true}', "--resume"])
    assert code == 2 and "cannot resume, rendering differs" in err, err
    with_stdin(monkeypatch, data)
    code, _, err = run_cli(args + ["--resume"])
    assert code == 0, err
