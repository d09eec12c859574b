"""A failing command leaves one line on stderr, not buried under progress bars and library warnings."""

from __future__ import annotations

import json
from .test_replay import SESSION, run_cli


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
