"""`replay --ray` through the command line (python -m mtp_observe replay ... --ray local): the CLI's progress display
takes the job's tokens, a run with a tree and a head precision ends complete (its parts checked with the rows a
tree and a precision add), a replica killed mid-run is replaced, Ctrl-C stops the driver with the finished sessions
kept and --resume completes the run; rows equal the single-process run's. `ray://` without the Ray client is one
line naming the extra that brings it. Each command starts its own local Ray cluster (tens of seconds on a 2-core
machine): the default suite runs one; Ctrl-C then --resume (two more) is marked slow."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mtp_observe.drafting.tree import parse_tree
from mtp_observe.model.loading import default_model_dir
from mtp_observe.run.cluster import FAULT_ENV
from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.pipeline import replay

from .conftest import interruptible
from .test_merge import report_of, same_tables

ROOT = Path(__file__).resolve().parents[1]
CODING = ROOT / "sessions" / "coding.jsonl"
OPTIONS = ["--k", "2", "--device", "cpu", "--tree", "2,2,4", "--head-precision", "fp8", "--part-sessions", "1"]

ray = pytest.importorskip("ray", reason="the ray extra: pip install 'mtp-observe[ray]' (the test extra has it)")


def manifest(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def single(tmp: Path, sessions: int) -> Path:
    """The same options in one process (the library), the rows the Ray runs must give."""
    return replay([CODING], default_model_dir(), tmp / "single",
                  ReplayOptions(k=2, device="cpu", trees=(parse_tree("2,2,4"),), head_precisions=("fp8",),
                                max_sessions=sessions, part_sessions=1), bundled=True)  # as the CLI runs it


def ray_cli(*args, env=None, **kwargs):
    return subprocess.run([sys.executable, "-m", "mtp_observe", "replay", str(CODING), *OPTIONS, "--ray", "local",
                           *map(str, args)], capture_output=True, text=True, env=env, timeout=600, **kwargs)


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_ray_from_the_command_line_with_a_tree_a_head_precision_and_a_killed_replica_ends_complete(tmp_path):
    """bf66717: the CLI's progress display refused `tokens=` (a TypeError after the replicas loaded); then the final
    check expected the chain's rows only and called the run damaged."""
    import os

    env = {**os.environ, FAULT_ENV: json.dumps({"once": ["coding-demo-0001"], "markers": str(tmp_path)})}
    run = tmp_path / "ray"
    r = ray_cli("--replicas", "1", "--max-sessions", "2", "--out", run, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "killed-coding-demo-0001").exists()  # the replica replaying it did die, once
    m = manifest(run)
    assert m["status"] == "complete" and "failure" not in m
    assert m["cluster"]["replaced"] == 1 and m["cluster"]["retried"] == 1 and m["cluster"]["replicas"] == 1
    one = single(tmp_path, 2)
    assert m["counts"] == manifest(one)["counts"] and m["trees"] == manifest(one)["trees"]
    assert m["whatifs"] == manifest(one)["whatifs"]
    same_tables(run, one)  # the tree's rows and the fp8 head's rows included, none twice
    assert report_of(run) == report_of(one)


@pytest.mark.slow
def test_ctrl_c_stops_a_ray_run_from_the_command_line_and_resume_completes_it(tmp_path):
    run = tmp_path / "ray"
    p = subprocess.Popen([sys.executable, "-m", "mtp_observe", "replay", str(CODING), *OPTIONS, "--ray", "local",
                          "--replicas", "1", "--out", str(run)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=interruptible)
    started = time.monotonic()
    while p.poll() is None and time.monotonic() - started < 300:
        if (run / "requests.parquet").is_dir() and any((run / "requests.parquet").glob("part-*.parquet")):
            break
        time.sleep(0.05)
    assert p.poll() is None, "the run ended before the first part was written and Ctrl-C could stop it"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 130, err[-2000:]
    assert "interrupted:" in err and "--resume" in err
    m = manifest(run)
    assert m["status"] == "failed" and 1 <= m["counts"]["sessions_ok"] < 4
    r = ray_cli("--replicas", "2", "--out", run, "--resume")
    assert r.returncode == 0, r.stderr[-2000:]
    m = manifest(run)
    assert m["status"] == "complete" and len(m["resumed"]) == 1
    one = single(tmp_path, None)
    assert m["counts"] == manifest(one)["counts"]
    same_tables(run, one)


def test_a_ray_client_address_without_the_ray_client_is_one_line_naming_the_extra_that_brings_it(tmp_path):
    """Ray's minimal install has no client (grpcio): bf66717 said "cannot connect ... check the address"."""
    code = ("import sys\nsys.modules['grpc'] = None  # the minimal Ray install: no client\n"
            "from mtp_observe.cli import main\nmain(sys.argv[1:])\n")
    r = subprocess.run([sys.executable, "-c", code, "replay", str(CODING), "--k", "2", "--device", "cpu",
                        "--max-sessions", "1", "--ray", "ray://127.0.0.1:1", "--out", str(tmp_path / "x")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "ray://127.0.0.1:1" in r.stderr and "pip install 'mtp-observe[ray]'" in r.stderr and "ray[client]" in r.stderr


def test_the_ray_extra_brings_the_ray_client():
    import re

    [extra] = re.findall(r"^ray = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), flags=re.M)  # [project.optional-dependencies]
    assert any(req.strip().strip('"').startswith("ray[client]") for req in extra.split(",")), extra
