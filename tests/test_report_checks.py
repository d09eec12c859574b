"""`report` checks a complete run against its manifest and the value ranges of its columns, and refuses
option values that make no sense — one line each."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mtp_observe.errors import RunDirectoryError
from mtp_observe.report import load_run

from .handmade import hand_run_sessions, write_run
from .test_replay import run_cli


@pytest.fixture(scope="module")
def hand(tmp_path_factory) -> Path:
    sessions = hand_run_sessions()
    run = write_run(tmp_path_factory.mktemp("hand") / "run", sessions, k=2)
    manifest = json.loads((run / "run.json").read_text())
    # What replay writes: every count (2 sessions, 3 requests, 11 anchors, 19 rows; tokens from handmade's n_tokens).
    manifest["counts"] = {"sessions_ok": 2, "sessions_skipped": 0, "requests": 3, "tokens_replayed": 11 + 6 + 10,
                          "scored_tokens": 7 + 3 + 4, "anchors": 11, "rows": 19}
    (run / "run.json").write_text(json.dumps(manifest))
    return run


def damaged(hand: Path, tmp_path: Path, counts: dict | None = None, **manifest_changes) -> Path:
    run = tmp_path / "run"
    shutil.copytree(hand, run)
    manifest = json.loads((run / "run.json").read_text())
    manifest["counts"].update(counts or {})
    manifest.update(manifest_changes)
    (run / "run.json").write_text(json.dumps(manifest))
    return run


def set_column(run: Path, name: str, index: int, value) -> None:
    part = sorted((run / "positions.parquet").glob("part-*.parquet"))[0]
    t = pq.read_table(part)
    i = t.schema.get_field_index(name)
    values = t.column(i).to_pylist()
    values[index] = value
    pq.write_table(t.set_column(i, name, pa.array(values, t.schema.field(i).type)), part)


def test_a_complete_hand_run_with_every_count_agreeing_reads(hand):
    assert len(load_run(hand).rows.depth) == 19


@pytest.mark.parametrize("key, value, needle", [
    ("rows", 20, "counts.rows is 20 but positions.parquet holds 19 rows"),
    ("anchors", 10, "counts.anchors is 10 but positions.parquet holds 11 anchors"),
    ("requests", 4, "counts.requests is 4 but requests.parquet holds 3 requests"),
    ("sessions_ok", 3, "counts.sessions_ok is 3 but the run holds 2 sessions"),
    ("tokens_replayed", 1, "counts.tokens_replayed is 1"),
    ("scored_tokens", 1, "counts.scored_tokens is 1"),
])
def test_counts_that_disagree_with_the_tables_are_refused_in_one_line(hand, tmp_path, key, value, needle):
    run = damaged(hand, tmp_path, {key: value})
    with pytest.raises(RunDirectoryError, match=needle) as e:
        load_run(run)
    assert str(run / "run.json") in str(e.value) and "\n" not in str(e.value)


def test_a_missing_part_of_a_complete_run_is_refused(hand, tmp_path):
    run = damaged(hand, tmp_path)
    for table in ("positions.parquet", "requests.parquet"):
        (run / table / "part-00000001.parquet").unlink()
    with pytest.raises(RunDirectoryError, match="counts.sessions_ok is 2 but the run holds 1 session"):
        load_run(run)


def test_a_run_that_is_not_complete_is_read_without_the_count_check(hand, tmp_path):
    run = damaged(hand, tmp_path, {"rows": 999}, status="running")
    assert any("running" in n for n in load_run(run).notes)


@pytest.mark.parametrize("column, value, needle", [
    ("p_accept_thinking", 1.5, "p_accept_thinking"),
    ("p_accept_instruct", -0.2, "p_accept_instruct"),
    ("p_accept_thinking", float("nan"), "p_accept_thinking"),
    ("draft_logprob", 0.5, "draft_logprob"),
    ("target_logprob", float("nan"), "target_logprob"),
    ("actual_logprob", float("inf"), "actual_logprob"),
])
def test_probabilities_outside_0_1_and_log_probabilities_above_0_are_refused(hand, tmp_path, column, value, needle):
    run = damaged(hand, tmp_path)
    set_column(run, column, 3, value)
    with pytest.raises(RunDirectoryError, match=needle) as e:
        load_run(run)
    assert "outside" in str(e.value) and "\n" not in str(e.value)


def test_float_rounding_just_past_the_bounds_is_accepted(hand, tmp_path):
    run = damaged(hand, tmp_path)
    set_column(run, "target_logprob", 3, 5e-6)  # log-softmax of a near-certain token can round above 0
    set_column(run, "p_accept_thinking", 4, 1 + 5e-7)
    load_run(run)


@pytest.mark.parametrize("args, needle", [
    (["--seed", "-1"], "--seed -1"),
    (["--plot", "out.jpg"], "--plot out.jpg"),
    (["--heatmap", "A", "--html", "page.txt"], "--html page.txt"),
    (["--replicates", "0"], "--replicates 0"),
    (["--replicates", "100000000"], "--replicates 100000000"),
])
def test_report_option_values_that_make_no_sense_are_one_line(hand, tmp_path, args, needle):
    r = run_cli("report", hand, *args, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("error: ") and needle in line, line


@pytest.mark.parametrize("args, needle", [(["--k", "1000"], "--k 1000"), (["--chunk-size", "0"], "--chunk-size 0")])
def test_replay_option_values_that_make_no_sense_are_one_line(tiny_checkpoint, tmp_path, args, needle):
    s = tmp_path / "s.jsonl"
    s.write_text(json.dumps({"prompt_token_ids": [1, 2], "completion_token_ids": [3, 4]}) + "\n")
    r = run_cli("replay", s, "--model", tiny_checkpoint, "--device", "cpu", "--out", tmp_path / "run", *args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr
