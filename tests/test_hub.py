"""A Hugging Face id resolves from the local cache in every command, never downloading; a miss names the command's option."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtp_observe.errors import CheckpointError
from mtp_observe.model.hub import resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_cache(tmp_path: Path, checkpoint: Path, repo: str = "example-org/tiny-qwen") -> Path:
    """The cache layout huggingface_hub writes: models--ORG--NAME/{refs/main, snapshots/<commit>/...}."""
    root = tmp_path / "hub"
    entry = root / f"models--{repo.replace('/', '--')}"
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(COMMIT)
    shutil.copytree(checkpoint, entry / "snapshots" / COMMIT)
    return root


def offline_env(cache: Path) -> dict:
    # A hub that cannot be reached: any download attempt would fail loudly instead of going out.
    return dict(os.environ, HF_HUB_CACHE=str(cache), HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_DISABLE_TELEMETRY="1")


def cli(*args, env):
    return subprocess.run([sys.executable, "-m", "mtp_observe", *map(str, args)], capture_output=True, text=True, env=env)


def test_an_id_in_the_cache_resolves_to_its_snapshot_and_a_local_directory_wins(tiny_checkpoint, tmp_path, monkeypatch):
    cache = fake_cache(tmp_path, tiny_checkpoint)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    snapshot = cache / "models--example-org--tiny-qwen" / "snapshots" / COMMIT
    assert resolve_model("example-org/tiny-qwen") == snapshot
    assert resolve_model(f"example-org/tiny-qwen@{COMMIT}") == snapshot
    assert resolve_model(tiny_checkpoint) == tiny_checkpoint
    with pytest.raises(CheckpointError, match=r"^MODEL other-org/absent: model directory not found, and not in the local Hugging "
                                              r"Face cache .*mtp-observe never downloads.*hf download other-org/absent.*"
                                              r"pass MODEL as a checkpoint directory"):
        resolve_model("other-org/absent", "MODEL")
    with pytest.raises(CheckpointError, match=r"^--model ./nowhere: model directory not found, and not a Hugging Face id .*pass --model DIR"):
        resolve_model("./nowhere", "--model")


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_every_command_reads_a_cached_id_offline(tiny_checkpoint, tmp_path):
    env = offline_env(fake_cache(tmp_path, tiny_checkpoint))
    inspected = cli("inspect", "example-org/tiny-qwen", "--json", env=env)
    assert inspected.returncode == 0, inspected.stderr
    assert json.loads(inspected.stdout)["model_type"]
    surveyed = cli("sessions", "sessions/support.jsonl", "--model", "example-org/tiny-qwen", env=env)
    assert surveyed.returncode == 0 and "sessions as the replay will score them" in surveyed.stdout, surveyed.stderr
    replayed = cli("replay", "sessions/support.jsonl", "--model", "example-org/tiny-qwen", "--k", "1", "--device", "cpu",
                   "--max-sessions", "1", "--out", tmp_path / "run", env=env)
    assert replayed.returncode == 0, replayed.stderr
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert manifest["model"]["path"].endswith(f"snapshots/{COMMIT}")
    probed = cli("probe", "example-org/tiny-qwen", "--context", "8", "--k", "1", "--repeats", "1", "--device", "cpu",
                 "-o", tmp_path / "probe.json", env=env)
    assert probed.returncode == 0, probed.stderr


@pytest.mark.parametrize("command, option", [(["inspect"], "MODEL"), (["probe"], "MODEL"),
                                             (["sessions", "sessions/support.jsonl", "--model"], "--model"),
                                             (["replay", "sessions/support.jsonl", "--model"], "--model"),
                                             (["generate", "sessions/support.jsonl", "-o", "own.jsonl", "--model"], "--model")])
def test_an_id_missing_from_the_cache_is_one_line_naming_the_commands_own_option(tmp_path, command, option):
    command = [str(tmp_path / c) if c == "own.jsonl" else c for c in command]
    proc = cli(*command, "Qwen/Qwen3.5-27B", env=offline_env(tmp_path / "empty-hub"))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {option} Qwen/Qwen3.5-27B: model directory not found, and not in the local Hugging Face cache")
    assert proc.stderr.count("\n") == 1 and "hf download Qwen/Qwen3.5-27B" in proc.stderr
    assert ("pass MODEL as a checkpoint directory" if option == "MODEL" else "pass --model DIR") in proc.stderr
