"""Shards and merge: shards 0/2 and 1/2 merged equal one run — tables, counts, report JSON with its bootstrap — and
merge refuses, in one line, shards that are not one job's, given twice, missing or holding a session twice."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from mtp_observe.errors import RunDirectoryError
from mtp_observe.report import read_and_summarize, report_json
from mtp_observe.run.merge import merge_runs
from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.parts import counts_on_disk
from mtp_observe.run.pipeline import replay
from mtp_observe.run.shards import Shard

from .test_drafters_replay import tokenizer_only  # noqa: F401 (a fixture)
from .test_replay import SESSION, write_sessions

ROOT = Path(__file__).resolve().parents[1]
DEMO = sorted((ROOT / "sessions").glob("*.jsonl"))
POSITION_KEYS = ["session_id", "request", "drafter", "draft_k", "pos", "depth"]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "mtp_observe", *map(str, args)], capture_output=True, text=True)


def rows(run: Path, table: str, keys: list[str]) -> pd.DataFrame:
    frame = pd.read_parquet(run / table)
    return frame.sort_values([k for k in keys if k in frame.columns]).reset_index(drop=True)


def same_tables(a: Path, b: Path) -> None:
    pd.testing.assert_frame_equal(rows(a, "positions.parquet", POSITION_KEYS), rows(b, "positions.parquet", POSITION_KEYS))
    pd.testing.assert_frame_equal(rows(a, "requests.parquet", ["session_id", "request"]),
                                  rows(b, "requests.parquet", ["session_id", "request"]))


def report_of(run: Path, drafter: str | None = None) -> dict:
    """report --format json, less what names the directory itself (its path, when it was created)."""
    reading = read_and_summarize(run, replicates=200, seed=0, drafter=drafter)
    document = report_json(reading.report, reading.comparison)
    del document["run"]["path"], document["run"]["created"]
    # the verdict's next steps are commands naming the run's own directory
    return json.loads(json.dumps(document).replace(json.dumps(str(run))[1:-1], "RUN"))


def manifest(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


# --- model-free shards: suffix decoding's global tree sees every earlier session -----------------------------------


@pytest.fixture(scope="module")
def model_free(tokenizer_only, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("model-free-shards")
    opts = ReplayOptions(k=3, drafters=("ngram", "suffix"))
    one = replay(DEMO, tokenizer_only, tmp / "one", opts)
    s0 = replay(DEMO, tokenizer_only, tmp / "s0", ReplayOptions(**{**opts.__dict__, "shard": Shard(0, 2)}))
    s1 = replay(DEMO, tokenizer_only, tmp / "s1", ReplayOptions(**{**opts.__dict__, "shard": Shard(1, 2),
                                                                     "part_sessions": 1}))
    return tmp, one, s0, s1


def test_model_free_shards_merged_equal_one_run_suffix_rows_and_report_json_included(model_free):
    tmp, one, s0, s1 = model_free
    m0, m1 = manifest(s0), manifest(s1)
    assert m0["shard"]["input_set"] == m1["shard"]["input_set"] and m0["shard"]["count"] == 2
    assert sorted(m0["shard"]["session_ids"] + m1["shard"]["session_ids"]) == sorted(
        pd.read_parquet(one / "requests.parquet").session_id.unique())
    assert m0["counts"]["sessions_ok"] > 0 and m1["counts"]["sessions_ok"] > 0
    summary = merge_runs([s1, s0], tmp / "merged")  # in any order
    merged = tmp / "merged"
    assert summary.status == "complete" and summary.sessions == manifest(one)["counts"]["sessions_ok"]
    same_tables(merged, one)
    assert manifest(merged)["counts"] == manifest(one)["counts"] and manifest(merged)["errors"] == []
    for drafter in ("ngram", "suffix"):
        assert report_of(merged, drafter) == report_of(one, drafter)
    # cheap: the parts are the shards' own files, linked
    for part in (merged / "positions.parquet").iterdir():
        source = [s / "positions.parquet" / part.name for s in (s0, s1) if (s / "positions.parquet" / part.name).exists()]
        assert len(source) == 1 and os.stat(source[0]).st_ino == os.stat(part).st_ino
    assert summary.linked == 2 * len(list((merged / "positions.parquet").iterdir())) and summary.copied == 0
    # control: a shard alone drafts its suffix rows with the other shard's sessions in the tree; without them the
    # same sessions draft otherwise (what makes the shards equal one run is the tree, not luck)
    alone = tmp / "alone.jsonl"
    ids = set(m1["shard"]["session_ids"])
    alone.write_text("".join(line + "\n" for f in DEMO for line in f.read_text().splitlines()
                             if line.strip() and json.loads(line)["id"] in ids))
    lonely = rows(replay([alone], Path(manifest(one)["model"]["path"]), tmp / "lonely", ReplayOptions(
        k=3, drafters=("ngram", "suffix"))), "positions.parquet", POSITION_KEYS)
    mine = rows(s1, "positions.parquet", POSITION_KEYS)
    suffix = (mine.drafter == "suffix")
    assert len(mine) == len(lonely) and (mine[suffix].draft_token.values != lonely[suffix].draft_token.values).any()


def test_merge_refuses_a_duplicated_or_missing_shard_and_an_unfinished_one_in_one_line(model_free, tmp_path):
    tmp, one, s0, s1 = model_free
    with pytest.raises(RunDirectoryError, match="shard 0/2 is given twice"):
        merge_runs([s0, s0], tmp_path / "twice")
    copy = tmp_path / "copy-of-s0"
    shutil.copytree(s0, copy)
    with pytest.raises(RunDirectoryError, match=f"{copy}: shard 0/2 is given twice"):
        merge_runs([s0, copy, s1], tmp_path / "twice")
    r = cli("merge", s0, "-o", tmp_path / "half")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "shard 1/2 is missing" in r.stderr and "--allow-partial" in r.stderr and not (tmp_path / "half").exists()
    with pytest.raises(RunDirectoryError, match="not a shard"):
        merge_runs([one, s0], tmp_path / "x")
    failed = tmp_path / "failed"
    shutil.copytree(s1, failed)
    (failed / "run.json").write_text(json.dumps({**manifest(s1), "status": "failed"}))
    with pytest.raises(RunDirectoryError, match="shard 1/2 is not complete.*--resume"):
        merge_runs([s0, failed], tmp_path / "x")


def test_allow_partial_merges_what_there_is_records_the_missing_and_makes_the_verdict_unreliable(model_free, tmp_path):
    tmp, one, s0, s1 = model_free
    summary = merge_runs([s0], tmp_path / "half", allow_partial=True)
    m = manifest(tmp_path / "half")
    assert summary.status == m["status"] == "partial" and m["merged"]["missing"] == {"shards": [1], "sessions": [],
                                                                                     "unknown": []}
    assert m["counts"]["sessions_ok"] == manifest(s0)["counts"]["sessions_ok"]
    verdict = report_of(tmp_path / "half")["verdict"]
    assert verdict["status"] == "UNRELIABLE" and "partial" in verdict["reason"] and "merge" in verdict["reason"]


def test_merge_refuses_a_missing_session_and_a_session_in_two_shards_naming_it(model_free, tmp_path):
    tmp, one, s0, s1 = model_free
    cut = tmp_path / "cut"
    shutil.copytree(s1, cut)  # a part per session: delete one and make the counts agree with what is left
    part = sorted((cut / "positions.parquet").iterdir())[0]
    lost = pd.read_parquet(part).session_id.iloc[0]
    for table in ("positions.parquet", "requests.parquet"):
        (cut / table / part.name).unlink()
    m = manifest(cut)
    m["counts"].update(counts_on_disk(cut, m["k"], [kk for d in m["drafters"].values() for kk in d["draft_k"]]))
    (cut / "run.json").write_text(json.dumps(m))
    with pytest.raises(RunDirectoryError, match=f"session {lost} of shard 1/2 is in neither its parts nor its errors"):
        merge_runs([s0, cut], tmp_path / "x")
    merge_runs([s0, cut], tmp_path / "partial", allow_partial=True)
    assert manifest(tmp_path / "partial")["merged"]["missing"]["sessions"] == [lost]
    twin = tmp_path / "twin"  # shard 0's sessions claiming to be shard 1: one assignment cannot give that
    shutil.copytree(s0, twin)
    m = manifest(s0)
    m["shard"]["index"] = 1
    (twin / "run.json").write_text(json.dumps(m))
    first = pd.read_parquet(s0 / "requests.parquet").session_id.iloc[0]
    with pytest.raises(RunDirectoryError, match=f"session {first} is in shard 0/2 .* and in shard 1/2"):
        merge_runs([s0, twin], tmp_path / "x")


def test_merge_refuses_shards_of_another_model_and_resume_refuses_another_shard(model_free, tmp_path):
    tmp, one, s0, s1 = model_free
    other = tmp_path / "other-model"
    shutil.copytree(Path(manifest(s0)["model"]["path"]), other)
    config = json.loads((other / "generation_config.json").read_text())
    (other / "generation_config.json").write_text(json.dumps({**config, "temperature": 0.3}))
    foreign = replay(DEMO, other, tmp_path / "foreign", ReplayOptions(k=3, drafters=("ngram", "suffix"), shard=Shard(1, 2)))
    r = cli("merge", s0, foreign, "--out", tmp_path / "x")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"{foreign}: not a shard of the same job as {s0}" in r.stderr and "generation_config.json differs" in r.stderr
    again = tmp_path / "again"
    shutil.copytree(s0, again)
    (again / "run.json").write_text(json.dumps({**manifest(s0), "status": "running"}))
    with pytest.raises(RunDirectoryError, match="cannot resume, shard differs"):
        replay(DEMO, Path(manifest(s0)["model"]["path"]), again,
               ReplayOptions(k=3, drafters=("ngram", "suffix"), shard=Shard(1, 2), resume=True))


# --- with the target: sampler sums, skipped sessions, the verdict -------------------------------------------------------


def test_target_shards_merged_equal_one_run_with_a_skipped_session_recorded_once(tiny_checkpoint, tmp_path):
    bad = {"id": "bad", "messages": [{"role": "user", "content": "q"}]}  # no assistant turn: skipped
    records = [dict(SESSION, id=f"s{i}") for i in range(4)]
    path = write_sessions(tmp_path / "s.jsonl", records[:2] + [bad] + records[2:])
    opts = ReplayOptions(k=2, device="cpu", on_error="skip")
    one = replay([path], tiny_checkpoint, tmp_path / "one", opts)
    shards = [replay([path], tiny_checkpoint, tmp_path / f"s{i}", ReplayOptions(**{**opts.__dict__, "shard": Shard(i, 2)}))
              for i in range(2)]
    assert {manifest(s)["counts"]["sessions_skipped"] for s in shards} == {0, 1}  # the bad line is one shard's
    merge_runs(shards, tmp_path / "merged")
    merged = tmp_path / "merged"
    same_tables(merged, one)
    assert manifest(merged)["counts"] == manifest(one)["counts"] and manifest(merged)["errors"] == manifest(one)["errors"]
    assert report_of(merged) == report_of(one)
