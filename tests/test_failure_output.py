"""A failing command leaves one line on stderr, not buried under progress bars and library warnings, and a
replay whose model outputs NaN or inf stops with one line instead of completing full of NaN (advising --dtype float32
only to a run that is not float32 already). transformers' kernel-fallback warnings are said once, in this tool's
words, by a replay that finishes, whatever TRANSFORMERS_VERBOSITY says; `replay --resume` of a complete run has
nothing to do and exits 0 (#27 item 6)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from .test_replay import SESSION, run_cli, write_sessions

LOUD = {**os.environ, "TRANSFORMERS_VERBOSITY": "warning"}  # a user's environment that asks the library to talk


def test_a_replay_that_fails_after_the_model_ran_leaves_exactly_the_error_line_on_stderr(tiny_checkpoint, tmp_path):
    """The first session runs the target on CPU (transformers warns that its fast kernels are missing) and draws the
    progress bar; the second is bad. stderr is the error line and nothing else, even where the user's environment
    asks transformers to talk (TRANSFORMERS_VERBOSITY=warning)."""
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(SESSION) + "\n" + json.dumps({"id": "bad", "messages": [{"role": "robot"}]}) + "\n")
    r = run_cli("replay", path, "--model", tiny_checkpoint, "--k", "1", "--device", "cpu", "--out", tmp_path / "run",
                env=LOUD)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [f"error: {path}:2: session bad: message 0 has unknown role 'robot'; "
                                     "use one of system, user, assistant, tool"], r.stderr


def test_sessions_that_fail_leave_exactly_the_error_line_on_stderr(tiny_checkpoint, tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(SESSION) + "\n{oops\n")
    r = run_cli("sessions", path, "--model", tiny_checkpoint)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and r.stderr.startswith(f"error: {path}:2:"), r.stderr


def nan_checkpoint(src: Path, dst: Path, tensor: str) -> Path:
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    index = json.loads((dst / "model.safetensors.index.json").read_text())["weight_map"]
    shard = dst / index[tensor]
    tensors = load_file(shard)
    tensors[tensor] = torch.full_like(tensors[tensor], float("nan"))
    save_file(tensors, shard, metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("tensor, who", [
    ("mtp.fc.weight", "the MTP head's"),
    ("model.language_model.norm.weight", "the target's"),
])
def test_a_model_that_outputs_nan_stops_the_run_with_one_line(tiny_checkpoint, tmp_path, tensor, who):
    model = nan_checkpoint(tiny_checkpoint, tmp_path / "nan", tensor)
    path = write_sessions(tmp_path / "s.jsonl", [SESSION])
    out = tmp_path / "run"
    r = run_cli("replay", path, "--model", model, "--k", "2", "--device", "cpu", "--out", out)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    [line] = r.stderr.splitlines()
    assert "session demo" in line and f"{who} outputs are not finite" in line and str(model) in line, line
    assert "try --dtype float32" not in line and "already float32" in line, line  # the run is float32 (CPU)
    assert json.loads((out / "run.json").read_text())["status"] == "failed"
    assert not list(out.glob("positions.parquet/part-*"))  # nothing of the NaN session was written


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_a_replay_that_finishes_says_the_kernel_fallbacks_once_in_its_own_words(tiny_checkpoint, tmp_path):
    path = write_sessions(tmp_path / "s.jsonl", [SESSION])
    r = run_cli("replay", path, "--model", tiny_checkpoint, "--k", "1", "--device", "cpu", "--out", tmp_path / "run",
                env=LOUD)
    assert r.returncode == 0, r.stderr
    assert "transformers" not in r.stderr and "falling back" not in r.stderr, r.stderr
    notes = [line for line in r.stdout.splitlines() if "reference PyTorch kernels" in line]
    assert len(notes) == 1 and notes[0].startswith("note: the target ran transformers' reference PyTorch kernels for "), r.stdout
    assert "causal_conv1d_fn" in notes[0] and "flash-linear-attention" in notes[0], notes


def test_resume_of_a_complete_run_has_nothing_to_do_and_exits_0(tiny_checkpoint, tmp_path):
    """A nightly job can run `replay --resume` every night: a complete run of the same inputs is left as it is."""
    from .fuzzing import run_cli as run_here

    path = write_sessions(tmp_path / "s.jsonl", [SESSION])
    out = tmp_path / "run"
    command = ["replay", str(path), "--model", str(tiny_checkpoint), "--drafters", "ngram", "--k", "2", "--out", str(out)]
    code, _, err = run_here(command)
    assert code == 0, err
    manifest = (out / "run.json").read_bytes()
    code, stdout, err = run_here([*command, "--resume"])
    assert code == 0, err
    assert f"note: {out}: this run is already complete (1 session of these inputs); nothing to resume" in err.splitlines()
    assert f"run directory: {out}" in stdout and (out / "run.json").read_bytes() == manifest
    assert not (out / ".mtp-observe.lock").exists()
    other = write_sessions(tmp_path / "other.jsonl", [dict(SESSION, id="other")])
    code, _, err = run_here(["replay", str(other), *command[2:], "--resume"])  # another night's inputs: not this run
    assert code == 2 and "cannot resume, inputs differ" in err and len(err.strip().splitlines()) == 1, err


def test_the_non_finite_advice_names_float32_only_where_it_would_change_something():
    import torch

    from mtp_observe.model.loading import non_finite_advice

    assert non_finite_advice(torch.bfloat16).endswith("check the checkpoint, or try --dtype float32")
    assert "--dtype" not in non_finite_advice(torch.float32) and "already float32" in non_finite_advice(torch.float32)
