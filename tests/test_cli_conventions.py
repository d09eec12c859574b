"""The command line's conventions: --version, -h, choices listed in help and completed by the shell, -o for every
output path, one-line refusals of a value outside the choices, counts in the singular for one."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from mtp_observe import __version__

COMMANDS = ("inspect", "sessions", "replay", "report", "probe", "import")


def cli(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "mtp_observe", *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ, COLUMNS="200"), **kwargs)


def test_version_prints_the_package_version():
    r = cli("--version")
    assert r.returncode == 0 and r.stdout == f"mtp-observe {__version__}\n" and r.stderr == ""


@pytest.mark.parametrize("args", [["-h"], *([c, "-h"] for c in COMMANDS)])
def test_dash_h_is_help_everywhere(args):
    r = cli(*args)
    assert r.returncode == 0 and r.stdout.startswith("Usage: mtp-observe") and "-h, --help" in r.stdout


@pytest.mark.parametrize("command, shown", [
    ("report", ["--format <table|markdown|json>"]),
    ("replay", ["--on-error <fail|skip>", "--dtype <auto|float32|bfloat16>", "--device <auto|cpu|cuda|cuda:N>"]),
    ("sessions", ["--on-error <fail|skip>"]),
    ("probe", ["--dtype <auto|float32|bfloat16>", "--device <auto|cpu|cuda|cuda:N>"]),
    ("import", ["--on-error <fail|skip>"]),
])
def test_help_lists_the_choices_of_every_option_with_a_fixed_set(command, shown):
    r = cli(command, "-h")
    for text in shown:
        assert text in r.stdout, r.stdout


@pytest.mark.parametrize("command, option", [("replay", "--out"), ("probe", "--output"), ("import", "--output")])
def test_every_output_path_has_the_short_form_dash_o(command, option):
    assert re.search(rf"^\s+{option}, -o\b|^\s+-o, {option}\b", cli(command, "-h").stdout, re.M)


@pytest.mark.parametrize("args, line", [
    (["report", "nowhere", "--format", "yaml"], "error: --format yaml: expected one of table, markdown, json"),
    (["replay", "x.jsonl", "--on-error", "ignore"], "error: --on-error ignore: expected one of fail, skip"),
    (["probe", "m", "--dtype", "int8"], "error: --dtype int8: expected one of auto, float32, bfloat16"),
])
def test_a_value_outside_the_choices_is_one_line_and_exit_2(args, line):
    r = cli(*args)
    assert r.returncode == 2 and r.stderr.splitlines() == [line]


def test_the_shell_completes_the_commands_and_the_choices():
    def complete(words):
        env = dict(os.environ, _MTP_OBSERVE_COMPLETE="complete_bash", COMP_WORDS=words, COMP_CWORD=str(len(words.split(" ")) - 1))
        return subprocess.run([sys.executable, "-m", "mtp_observe"], capture_output=True, text=True, env=env).stdout.split()

    assert set(COMMANDS) <= set(complete("mtp-observe "))
    assert complete("mtp-observe report --format ") == ["table", "markdown", "json"]
    assert cli("--show-completion", "bash").stdout.startswith("_mtp_observe_completion()")


def test_one_session_is_said_in_the_singular(tiny_checkpoint, tmp_path):
    from .test_replay import SESSION, write_sessions

    path = write_sessions(tmp_path / "one.jsonl", [SESSION])
    r = cli("replay", path, "--model", tiny_checkpoint, "--k", "1", "--device", "cpu", "-o", tmp_path / "run")
    assert r.returncode == 0, r.stderr
    assert "replay: 1 session (0 skipped)" in r.stdout and "1 sessions" not in r.stdout
    assert json.loads((tmp_path / "run" / "run.json").read_text())["counts"]["sessions_ok"] == 1
    rep = cli("report", tmp_path / "run")
    assert "1 session," in rep.stdout and "1 sessions" not in rep.stdout, rep.stdout
