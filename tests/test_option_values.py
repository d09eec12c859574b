"""Option values that are no number (#27 item 4): NaN and infinite floats are refused for every float option of every
command (one line, exit 2, before the command runs), and run.json is always valid JSON (`allow_nan=False` where it is
written; a run.json holding NaN is refused when read)."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from mtp_observe.cli import app
from mtp_observe.errors import UserError

from .fuzzing import run_cli
from .handmade import random_sessions, write_run
from .test_replay import SESSION

# What each command needs to parse at all (the refusal comes before any of it is read).
REQUIRED = {"replay": ["s.jsonl"], "generate": ["s.jsonl", "-o", "own.jsonl"], "compare": ["--engine-metrics", "m.txt"],
            "report": [], "export": [], "sessions": ["s.jsonl"], "probe": ["model"], "inspect": ["model"],
            "import": ["auto", "log.json", "-o", "out.jsonl"]}


def float_options() -> list[tuple[str, str]]:
    """(command, --flag) for every float-valued option of every command, read from the commands' own signatures."""
    found = []
    for info in app.registered_commands:
        function = getattr(info.callback, "__wrapped__", info.callback)
        name = info.name or function.__name__.rstrip("_")
        for parameter, hint in typing.get_type_hints(function, include_extras=True).items():
            base, *extras = typing.get_args(hint) if typing.get_origin(hint) is typing.Annotated else (hint,)
            if float in (base, *typing.get_args(base)):
                decls = [d for x in extras if hasattr(x, "param_decls")
                         for d in ([x.default] if isinstance(x.default, str) else []) + list(x.param_decls or ())]
                found.append((name, next((d for d in decls if d.startswith("--")), "--" + parameter.replace("_", "-"))))
    return found


def test_every_command_has_its_float_options_found():
    names = set(float_options())
    assert {("replay", "--suffix-max-spec-factor"), ("report", "--draft-cost"), ("report", "--min-support"),
            ("report", "--context"), ("compare", "--draft-cost"), ("generate", "--progress-every")} <= names, names


@pytest.mark.parametrize("command,flag", float_options())
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", "NaN"])
def test_a_float_option_that_is_nan_or_infinite_is_refused_in_one_line(command, flag, value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli([command, *REQUIRED[command], flag, value])
    shown = {"nan": "nan", "NaN": "nan", "inf": "inf", "1e400": "inf", "-inf": "-inf"}[value]
    assert code == 2 and err.strip().splitlines() == [f"error: {flag} {shown}: expected a finite number"], (code, out, err)


def test_a_nan_suffix_factor_no_longer_reaches_run_json_or_the_vllm_config(tiny_checkpoint, tmp_path):
    """`replay --drafters suffix --suffix-max-spec-factor nan` used to write a bare NaN into run.json (and from there
    into export's vLLM config)."""
    sessions = tmp_path / "s.jsonl"
    sessions.write_text(json.dumps(SESSION) + "\n")
    out = tmp_path / "run"
    code, _, err = run_cli(["replay", str(sessions), "--model", str(tiny_checkpoint), "--drafters", "suffix",
                            "--suffix-max-spec-factor", "nan", "--out", str(out)])
    assert code == 2 and err.strip() == "error: --suffix-max-spec-factor nan: expected a finite number", err
    assert not out.exists()


def test_gate_and_device_spec_numbers_are_finite(tmp_path):
    from mtp_observe.cost.roofline import parse_device

    run = write_run(tmp_path / "run", random_sessions(10, 2, 0.7, seed=1), k=2)
    code, _, err = run_cli(["report", str(run), "--gate", "speedup>=1e400"])
    assert code == 2 and err.strip() == ("error: --gate 'speedup>=1e400': the threshold 1e400 is not a finite number "
                                         "(e.g. --gate 'speedup>=1.2')"), err
    with pytest.raises(UserError, match="--device-spec"):
        parse_device("9" * 400 + ",989")  # 1e400 GB/s


def _strict(text: str):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_run_json_is_always_valid_json(tmp_path):
    from mtp_observe.run.tables import read_manifest, write_json_atomic

    path = tmp_path / "run.json"
    path.write_text('{"kept": true}\n')
    with pytest.raises(UserError, match=r"drafters\.suffix\.max_spec_factor is nan, which JSON cannot hold"):
        write_json_atomic(path, {"drafters": {"suffix": {"max_spec_factor": float("nan")}}, "k": 4})
    assert _strict(path.read_text()) == {"kept": True} and list(tmp_path.iterdir()) == [path]  # nothing else was written
    run = write_run(tmp_path / "old", random_sessions(10, 2, 0.7, seed=1), k=2)
    manifest = json.loads((run / "run.json").read_text())
    manifest["drafters"] = {"mtp": {"draft_k": [2]}, "x": float("nan")}
    (run / "run.json").write_text(json.dumps(manifest))  # what the old replay wrote: not JSON
    with pytest.raises(UserError, match="holds NaN, which is not JSON"):
        read_manifest(Path(run))
