"""A failing command leaves one line on stderr, not buried under progress bars and library warnings, and a
replay whose model outputs NaN or inf stops with one line instead of completing full of NaN."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .test_replay import SESSION, run_cli, write_sessions


def test_a_replay_that_fails_after_the_model_ran_leaves_exactly_the_error_line_on_stderr(tiny_checkpoint, tmp_path):
    """The first session runs the target on CPU (transformers warns that its fast kernels are missing) and draws the
    progress bar; the second is bad. stderr is the error line and nothing else."""
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(SESSION) + "\n" + json.dumps({"id": "bad", "messages": [{"role": "robot"}]}) + "\n")
    r = run_cli("replay", path, "--model", tiny_checkpoint, "--k", "1", "--device", "cpu", "--out", tmp_path / "run")
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
    assert json.loads((out / "run.json").read_text())["status"] == "failed"
    assert not list(out.glob("positions.parquet/part-*"))  # nothing of the NaN session was written
