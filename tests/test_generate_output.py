"""generate's output file (#27 item 3): `-o` onto a directory is refused before any generation; a finished `-o` file
needs --resume (add sessions) or --overwrite (replace it), as replay's --out does; a write that fails (a full disk, a
file-size limit) is one line, exit 2, with what was written kept in the partial file, which --resume finishes to the
same bytes as an uninterrupted run."""

from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest

from .fuzzing import run_cli

SESSIONS = [{"id": f"s{i}", "messages": [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": "Answer."},
                                         {"role": "user", "content": "More?"}, {"role": "assistant", "content": "No."}]}
            for i in range(3)]


@pytest.fixture
def sessions(tmp_path) -> Path:
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in SESSIONS))
    return path


def generate_args(sessions: Path, checkpoint: Path, out: Path, *more) -> list[str]:
    return ["generate", str(sessions), "--model", str(checkpoint), "-o", str(out), "--max-new-tokens", "3",
            "--device", "cpu", "--sampling", "greedy", *map(str, more)]


@pytest.fixture
def no_model(monkeypatch):
    """Fails the test if the model is loaded: what is refused must be refused before any generation."""
    import mtp_observe.run.pipeline as pipeline

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before the output was checked")

    monkeypatch.setattr(pipeline, "load_model", never)


def _one_error(code: int, err: str, needle: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (code, err)
    return lines[0]


def test_an_output_that_is_a_directory_is_refused_before_any_generation(sessions, tiny_checkpoint, tmp_path, no_model):
    directory = tmp_path / "own"
    directory.mkdir()
    code, _, err = run_cli(generate_args(sessions, tiny_checkpoint, directory))
    _one_error(code, err, "is a directory")
    from mtp_observe.errors import OptionError
    from mtp_observe.run.generation import GenerateOptions, generate

    with pytest.raises(OptionError, match="is a directory"):  # the library refuses it too, before loading the model
        generate([sessions], tiny_checkpoint, directory, GenerateOptions(device="cpu"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["own", "s.jsonl"]  # no own.partial beside it


def test_a_finished_output_is_refused_unless_resume_or_overwrite(sessions, tiny_checkpoint, tmp_path):
    out = tmp_path / "own.jsonl"
    code, _, err = run_cli(generate_args(sessions, tiny_checkpoint, out))
    assert code == 0, err
    first = out.read_bytes()
    code, _, err = run_cli(generate_args(sessions, tiny_checkpoint, out, "--seed", "1"))
    _one_error(code, err, f"-o {out}: already exists; pass --resume to add sessions to it, --overwrite to replace it")
    assert out.read_bytes() == first
    code, _, err = run_cli(generate_args(sessions, tiny_checkpoint, out, "--resume", "--overwrite"))
    _one_error(code, err, "--resume and --overwrite contradict each other")
    code, stdout, err = run_cli(generate_args(sessions, tiny_checkpoint, out, "--overwrite", "--sampling", "thinking_general"))
    assert code == 0 and "wrote 3 sessions" in stdout, err
    assert {json.loads(line)["meta"]["generated"]["profile"] for line in out.read_text().splitlines()} == {"thinking_general"}
    code, stdout, err = run_cli(generate_args(sessions, tiny_checkpoint, out, "--resume", "--sampling", "thinking_general"))
    assert code == 0 and "3 kept from the resumed output" in stdout, err  # --resume on a whole output: nothing to redo


def _limited(argv: list[str], limit: int) -> tuple[int, str, str]:
    """The CLI in this process with files limited to `limit` bytes (RLIMIT_FSIZE's soft limit, restored after; Python
    ignores SIGXFSZ, so a write past the limit fails with EFBIG, as on a full disk)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        return run_cli(argv)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_write_that_fails_is_one_line_and_resume_finishes_the_partial_file_to_the_same_bytes(sessions, tiny_checkpoint,
                                                                                             tmp_path):
    whole = tmp_path / "whole.jsonl"
    code, _, err = run_cli(generate_args(sessions, tiny_checkpoint, whole))
    assert code == 0, err
    lines = whole.read_bytes().splitlines(keepends=True)
    out = tmp_path / "own.jsonl"
    limit = len(lines[0]) + len(lines[1]) // 2  # the second record meets the "full disk"
    code, _, err = _limited(generate_args(sessions, tiny_checkpoint, out), limit)
    partial = out.with_name("own.jsonl.partial")
    assert code == 2 and "Traceback" not in err, err
    assert err.strip().splitlines() == [
        f"error: {partial}: cannot write (File too large); the sessions written before are kept: free space, then "
        "continue with the same command and --resume"]
    assert not out.exists() and partial.read_bytes().startswith(lines[0])
    code, stdout, err = run_cli(generate_args(sessions, tiny_checkpoint, out, "--resume"))
    assert code == 0 and "1 kept from the resumed output" in stdout, err
    assert out.read_bytes() == whole.read_bytes() and not partial.exists()
