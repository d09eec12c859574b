"""Ray (`replay --ray`): replicas on a local cluster give the single-process run, a replica killed mid-run is replaced
and nothing is lost or counted twice, a session that kills every replica is recorded and skipped; the core never
imports ray. One local cluster (2 CPUs, a small object store) serves the module and is shut down after it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from mtp_observe.model.loading import default_model_dir
from mtp_observe.run.options import Observer, ReplayOptions
from mtp_observe.run.pipeline import replay
from mtp_observe.run.progress import ProgressCounter

from .test_drafters_replay import tokenizer_only  # noqa: F401 (a fixture)
from .test_merge import report_of, same_tables
from .test_replay import SESSION, write_sessions

ray = pytest.importorskip("ray", reason="the ray extra: pip install 'mtp-observe[ray]' (the test extra has it)")

from mtp_observe.run.cluster import Fault, RayOptions, Task, dispatch_order  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster for the module; the replays join it (ray.is_initialized) and leave it running."""
    import logging

    ray.init(num_cpus=2, object_store_memory=80 * 1024 * 1024, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR)
    try:
        yield
    finally:
        ray.shutdown()
    assert not ray.is_initialized()


@pytest.fixture(scope="module")
def sessions(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("ray-sessions")
    long = dict(SESSION, messages=SESSION["messages"] + SESSION["messages"][1:])  # the longest: replayed first
    return write_sessions(tmp / "s.jsonl", [dict(SESSION, id="s0"), dict(long, id="s1"), dict(SESSION, id="s2"),
                                            dict(SESSION, id="s3")])


@pytest.fixture(scope="module")
def single(sessions, tokenizer_only, tmp_path_factory) -> dict:  # noqa: F811
    """The single-process runs the Ray runs must equal: the head on the bundled model, and the model-free drafters
    (suffix decoding's global tree spans sessions) on its tokenizer alone — whose replicas start without weights."""
    tmp = tmp_path_factory.mktemp("ray-single")
    return {"mtp": replay([sessions], default_model_dir(), tmp / "mtp", ReplayOptions(k=2, device="cpu")),
            "model-free": replay([sessions], tokenizer_only, tmp / "model-free",
                                 ReplayOptions(k=2, drafters=("ngram", "suffix"), on_error="skip"))}


class Recording(Observer):
    """The progress events, folded as the CLI's progress line folds them."""

    def __init__(self):
        self.counter = ProgressCounter()
        self.replayed_ids: list[str] = []

    def start(self, sessions, tokens=None):
        self.counter.start(sessions, tokens)

    def session(self, session_id, tokens, skipped):
        self.counter.session(session_id, tokens, skipped)

    def replayed(self, session_id, tokens, requests):
        self.replayed_ids.append(session_id)
        self.counter.replayed(session_id, tokens, requests)


def manifest(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_two_replicas_on_the_bundled_model_equal_the_single_process_run_with_progress_across_the_job(
        cluster, sessions, single, tmp_path):
    observer = Recording()
    run = replay([sessions], default_model_dir(), tmp_path / "ray",
                 ReplayOptions(k=2, device="cpu", ray=RayOptions("local", replicas=2)), observer=observer)
    one = single["mtp"]
    same_tables(run, one)
    assert manifest(run)["counts"] == manifest(one)["counts"] and manifest(run)["status"] == "complete"
    assert manifest(run)["cluster"] == {"engine": "ray", "address": "local", "replicas": 2, "gpus_per_replica": 0.0,
                                        "max_attempts": 3, "replaced": 0, "retried": 0}
    assert report_of(run) == report_of(one)  # whatever order the replicas finished in
    # the progress counts every replica's tokens in one line
    assert sorted(observer.replayed_ids) == ["s0", "s1", "s2", "s3"]
    state = observer.counter.snapshot()  # the state as of now (its rate over the window)
    assert state.total_tokens == (manifest(one)["counts"]["tokens_replayed"], True)
    assert state.tokens_done == state.fresh_tokens == manifest(one)["counts"]["tokens_replayed"]
    assert state.sessions_done == state.sessions == 4 and state.rate is not None


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_a_killed_replica_is_replaced_and_a_session_that_kills_every_replica_is_recorded_and_skipped(
        cluster, sessions, single, tmp_path):
    """s1 kills its replica once (then replays on the replacement); s2 kills every replica it reaches (so, after
    max_attempts, it is skipped under --on-error skip). Suffix decoding's tree spans sessions: the replacement
    replicas first read every earlier session's outputs, so the other sessions' rows equal the single-process run's,
    none twice."""
    fault = Fault(once=("s1",), always=("s2",), markers=str(tmp_path))
    one = single["model-free"]
    run = replay([sessions], Path(manifest(one)["model"]["path"]), tmp_path / "ray",
                 ReplayOptions(k=2, drafters=("ngram", "suffix"), on_error="skip",
                               ray=RayOptions("local", replicas=2, max_attempts=2, fault=fault)))
    assert (tmp_path / "killed-s1").exists()  # the replica replaying s1 did die
    m = manifest(run)
    assert m["status"] == "complete" and m["cluster"]["replaced"] == 3 and m["cluster"]["retried"] == 2
    [error] = m["errors"]
    assert error["session_id"] == "s2" and error["index"] == 2 and "died 2 times" in error["message"]
    expected = manifest(one)["counts"]
    assert m["counts"]["sessions_ok"] == 3 and m["counts"]["sessions_skipped"] == 1
    assert m["counts"]["requests"] == expected["requests"] - 2  # s2's two requests, and nothing counted twice
    keys = ["session_id", "request", "drafter", "draft_k", "pos", "depth"]
    for table, by in (("positions.parquet", keys), ("requests.parquet", ["session_id", "request"])):
        kept = pd.read_parquet(run / table)
        theirs = pd.read_parquet(one / table)
        pd.testing.assert_frame_equal(kept.sort_values(by).reset_index(drop=True),
                                      theirs[theirs.session_id != "s2"].sort_values(by).reset_index(drop=True))


def test_sessions_go_longest_first_and_in_input_order_when_a_drafter_keeps_state_across_sessions():
    tasks = [Task(index=i, session_id=f"s{i}", where=f"s.jsonl:{i + 1}", requests=(), tokens=n)
             for i, n in enumerate([5, 9, 5, 7])]
    assert [t.session_id for t in dispatch_order(tasks, stateful=False)] == ["s1", "s3", "s0", "s2"]
    assert [t.session_id for t in dispatch_order(tasks, stateful=True)] == ["s0", "s1", "s2", "s3"]


def test_the_core_and_the_other_commands_never_import_ray_and_without_it_ray_is_one_line(sessions, tmp_path):
    code = ("import sys\n"
            "import mtp_observe.run.pipeline, mtp_observe.run.merge, mtp_observe.run.cluster, mtp_observe.cli\n"
            "from mtp_observe.cli import main\n"
            "for command in ('replay', 'merge', 'report', 'generate', 'sessions', 'export', 'compare', 'inspect', 'probe',"
            " 'import'):\n"
            "    try:\n"
            "        main([command, '--help'])\n"
            "    except SystemExit:\n"
            "        pass\n"
            "assert 'ray' not in sys.modules, 'ray was imported'\n"
            "sys.modules['ray'] = None  # as without the extra\n"
            f"main(['replay', {str(sessions)!r}, '--out', {str(tmp_path / 'run')!r}, '--ray', 'local'])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
        "error: --ray needs Ray, an optional extra: pip install 'mtp-observe[ray]' (or pip install ray)"), r.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, needle", [
    (["--replicas", "2"], "--replicas applies to a replay on Ray"),
    (["--gpus-per-replica", "1"], "--gpus-per-replica applies to a replay on Ray"),
    (["--ray", "somewhere"], "--ray somewhere: expected local"),
    (["--shard-by", "tokens"], "--shard-by tokens: without --shard"),
    (["--shard", "2/2"], "--shard 2/2: the index I counts from 0"),
])
def test_ray_and_shard_options_are_checked_in_one_line_before_any_work(sessions, tmp_path, capsys, args, needle):
    from mtp_observe.cli import main

    with pytest.raises(SystemExit) as exit:
        main(["replay", str(sessions), "--out", str(tmp_path / "run"), *args])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "run").exists()


def test_more_replicas_than_the_clusters_cpus_is_refused_naming_them_instead_of_a_silent_wait(cluster, sessions,
                                                                                              tmp_path):
    """Each replica is an actor of one CPU: bf66717 queued the third of --replicas 3 on a 2-CPU cluster forever."""
    from mtp_observe.errors import OptionError

    with pytest.raises(OptionError, match=r"^--replicas 3: the Ray cluster has 2 CPU\(s\) and each replica takes one, "
                                          r"so 1 would wait forever; pass --replicas 2 or fewer"):
        replay([sessions], default_model_dir(), tmp_path / "run",
               ReplayOptions(k=2, device="cpu", ray=RayOptions("local", replicas=3)))
    assert not (tmp_path / "run").exists()
