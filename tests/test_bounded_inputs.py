"""Templates and importers at a bounded cost (#27 item 5): --template-kwargs nested 5,000 levels deep is one line, not a
RecursionError; a 1 KB YAML alias bomb in an Anthropic cassette is refused before anything is built from it, not a
hang; a chat template whose rendering runs past 4x its input (plus 1 MB) stops with one line instead of rendering
gigabytes. The cases that took the machine's memory run with 2 GB more address space allowed and an alarm, so that
the code before this change fails them instead of taking the machine with it (no timing assertion)."""

from __future__ import annotations

import json
import os
import resource
import signal

import pytest

from mtp_observe.errors import UserError
from mtp_observe.sessions.importers import import_files

from .fuzzing import run_cli
from .test_replay import SESSION


def bounded_cli(argv: list[str], memory: int = 2 * 2 ** 30, seconds: int = 120) -> tuple[int, str, str]:
    """The CLI in this process with at most `memory` more bytes of address space (RLIMIT_AS's soft limit, restored
    after) and an alarm after `seconds`: the code before this change took minutes and gigabytes, or forever, on these
    inputs; under the limits it fails the test (a MemoryError, the alarm) instead of taking the machine with it."""
    def expired(signum, frame):
        raise AssertionError(f"still running after {seconds} s")

    page = os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/statm") as f:
        used = int(f.read().split()[0]) * page
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (used + memory if hard == resource.RLIM_INFINITY else min(used + memory, hard), hard))
    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        return run_cli([str(a) for a in argv])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.fixture
def sessions(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(SESSION) + "\n")
    return path


def _one_line(code: int, err: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, (code, err)
    return lines[0]


def nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def test_template_kwargs_nested_5000_levels_deep_is_one_line(sessions, tiny_checkpoint):
    text = nested(5000)
    assert 10_000 < len(text) < 40_000
    code, _, err = run_cli(["sessions", str(sessions), "--model", str(tiny_checkpoint), "--template-kwargs", text])
    assert "nested more than 64 levels deep" in _one_line(code, err)
    for value, said in (('{"x": 1e400}', "x is not a finite number"), ('{"x": NaN}', "NaN is not a JSON number")):
        code, _, err = run_cli(["sessions", str(sessions), "--model", str(tiny_checkpoint), "--template-kwargs", value])
        assert said in _one_line(code, err)
    code, _, err = run_cli(["sessions", str(sessions), "--model", str(tiny_checkpoint), "--template-kwargs", nested(63)])
    assert code == 0, err  # deep, but not past the bound: rendered


CASSETTE_HEAD = ["interactions:", "- request:", "    uri: https://api.anthropic.com/v1/messages", "    parsed_body:",
                 "      max_tokens: 5"]


def alias_bomb(levels: int = 9) -> str:
    """A cassette of about 1 KB whose user message means 10^levels strings (each level names the last ten times)."""
    lines = CASSETTE_HEAD + ["      l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"      l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join(lines + ["      messages:", "      - role: user", f"        content: *l{levels - 1}"]) + "\n"


def test_a_yaml_alias_bomb_in_a_cassette_is_refused_quickly(tmp_path):
    path = tmp_path / "cassette.yaml"
    path.write_text(alias_bomb())
    assert len(path.read_bytes()) < 1100
    for fmt in ("anthropic", "auto"):
        code, _, err = bounded_cli(["import", fmt, path, "-o", tmp_path / "out.jsonl"], seconds=120)
        message = _one_line(code, err)
        assert message.startswith(f"error: {path}: YAML aliases expand it to more than") and "alias bomb" in message
    with pytest.raises(UserError, match="an alias bomb"):  # the library refuses it too
        import_files("anthropic", [path], tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def test_a_cassette_whose_aliases_share_a_value_still_imports(tmp_path):
    """PyYAML's dumper writes an anchor and an alias for an object two interactions share: that is no bomb."""
    import yaml

    system = [{"type": "text", "text": "Be brief."}]
    first = {"model": "claude", "max_tokens": 5, "system": system, "messages": [{"role": "user", "content": "Where?"}]}
    second = dict(first, messages=first["messages"] + [{"role": "assistant", "content": "Paris."},
                                                       {"role": "user", "content": "And?"}])
    uri = "https://api.anthropic.com/v1/messages"
    text = yaml.safe_dump({"interactions": [{"request": {"uri": uri, "parsed_body": first}},
                                            {"request": {"uri": uri, "parsed_body": second}}]})
    assert "&id001" in text and "*id001" in text
    path = tmp_path / "cassette.yaml"
    path.write_text(text)
    counts = import_files("anthropic", [path], tmp_path / "out.jsonl")
    [session] = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sum(c.sessions for c in counts) == 1 and session["messages"][0] == {"role": "system", "content": "Be brief."}


LOOPING_TEMPLATE = """{%- for m in messages %}{% for i in range(100000) %}{% for j in range(100000) %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% endfor %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def test_a_chat_template_that_renders_past_its_bound_stops_with_one_line(sessions, tiny_checkpoint, tmp_path):
    """Rendered whole, this template would be terabytes; within 2 GB of address space it stops with one line."""
    template = tmp_path / "looping.jinja"
    template.write_text(LOOPING_TEMPLATE)
    code, _, err = bounded_cli(["sessions", sessions, "--model", tiny_checkpoint, "--chat-template", template])
    line = _one_line(code, err)
    assert f"{sessions}:1: session demo: the chat template cannot render assistant message" in line
    assert "it renders more than" in line and "a template that loops" in line, line
