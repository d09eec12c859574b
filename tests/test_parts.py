"""Parts: sessions grouped into parts of bounded size, atomic (temporaries outside the table directories), resumable,
and read by pandas, pyarrow.dataset, polars and duckdb even with a killed process's temporary left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from mtp_observe.run import entries, parts, tables
from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.pipeline import replay

from .test_replay import SESSION, run_cli, write_sessions


def tiny_tables(i: int, rows: int = 3):
    positions = pa.table({"session_id": [f"s{i}"] * rows, "depth": pa.array([1] * rows, pa.int8())})
    requests = pa.table({"session_id": [f"s{i}"], "n_tokens": [rows + 1]})
    return positions, requests


def test_a_thousand_small_sessions_make_four_parts_per_table_not_a_thousand(tmp_path):
    writer = parts.PartWriter(tmp_path)
    for i in range(1000):
        writer.add(i, *tiny_tables(i))
    writer.flush()
    for table in (entries.POSITIONS, entries.REQUESTS):
        names = sorted(p.name for p in (tmp_path / table).iterdir())
        assert names == [tables.part_name(i) for i in (0, 256, 512, 768)]  # named by their first session
    assert pq.read_table(tmp_path / entries.REQUESTS).column("session_id").to_pylist() == [f"s{i}" for i in range(1000)]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_part_is_also_closed_by_its_rows_and_by_the_time_its_first_session_waited(tmp_path):
    now = [0.0]
    writer = parts.PartWriter(tmp_path, max_rows=10, max_seconds=5.0, clock=lambda: now[0])
    writer.add(0, *tiny_tables(0, rows=4))
    writer.add(1, *tiny_tables(1, rows=4))
    assert writer.pending == 2
    writer.add(2, *tiny_tables(2, rows=4))  # 12 rows >= 10: written
    assert writer.pending == 0
    writer.add(3, *tiny_tables(3, rows=1))
    now[0] = 5.0
    writer.add(4, *tiny_tables(4, rows=1))  # the first of these waited 5 s: written
    assert sorted(p.name for p in (tmp_path / entries.POSITIONS).iterdir()) == [tables.part_name(0), tables.part_name(3)]


def killed_run(tiny_checkpoint, tmp_path):
    """A grouped run, with a temporary left at its own place by a killed writer (half a Parquet file)."""
    sessions = write_sessions(tmp_path / "s.jsonl", [dict(SESSION, id=f"s{i}") for i in range(5)])
    run = replay([sessions], tiny_checkpoint, tmp_path / "run", ReplayOptions(k=2, device="cpu", part_sessions=2))
    whole = pq.read_table(run / entries.POSITIONS / tables.part_name(0)).to_pandas()
    for table in (entries.POSITIONS, entries.REQUESTS):
        data = (run / table / tables.part_name(0)).read_bytes()
        (run / parts.temporary_name(table, tables.part_name(6)).replace(str(os.getpid()), "4242")).write_bytes(data[: len(data) // 2])
    assert len(list(run.glob(".*.tmp-4242"))) == 2 and len(whole)
    return run


READERS = {
    "pandas": lambda d: len(pd.read_parquet(d)),
    "pyarrow.dataset": lambda d: pads.dataset(str(d), format="parquet").count_rows(),
    "polars": lambda d: __import__("polars").read_parquet(d).height,
    "polars scan": lambda d: __import__("polars").scan_parquet(d).collect().height,
    "duckdb glob": lambda d: __import__("duckdb").sql(f"select count(*) from read_parquet('{d}/*.parquet')").fetchall()[0][0],
    "duckdb recursive": lambda d: __import__("duckdb").sql(f"select count(*) from read_parquet('{d}/**')").fetchall()[0][0],
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_reads_a_run_a_killed_process_left_a_temporary_in(tiny_checkpoint, tmp_path, reader):
    # polars and duckdb are in the test extra (pip install -e '.[test]'): a machine without them fails here.
    run = killed_run(tiny_checkpoint, tmp_path)
    manifest = json.loads((run / entries.MANIFEST).read_text())
    assert READERS[reader](run / entries.POSITIONS) == manifest["counts"]["rows"]
    assert READERS[reader](run / entries.REQUESTS) == manifest["counts"]["requests"]


def test_overwrite_and_resume_clear_the_temporaries_of_both_layouts(tiny_checkpoint, tmp_path):
    run = killed_run(tiny_checkpoint, tmp_path)
    (run / entries.POSITIONS / ".part-00000009.parquet.tmp-77").write_bytes(b"half")  # as runs before grouping left them
    tables.prepare_run_directory(run, resume=False, overwrite=True)
    assert not run.exists() or list(run.iterdir()) == []


def test_a_grouped_run_killed_mid_way_resumes_to_the_same_rows(tiny_checkpoint, tmp_path):
    records = [dict(SESSION, id=f"s{i}") for i in range(8)]
    sessions = write_sessions(tmp_path / "s.jsonl", records)
    whole = replay([sessions], tiny_checkpoint, tmp_path / "whole", ReplayOptions(k=2, device="cpu"))
    assert len(list((whole / entries.POSITIONS).iterdir())) == 1  # 8 small sessions: one part
    out = tmp_path / "killed"
    args = ["replay", str(sessions), "--model", str(tiny_checkpoint), "--k", "2", "--device", "cpu", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "mtp_observe", *args, "--part-sessions", "3"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and not list((out / entries.REQUESTS).glob("part-*")):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = pq.read_table(out / entries.REQUESTS, columns=["session_id"]).column("session_id").to_pylist()
    assert 3 <= len(set(kept)) < 8, "the kill came too late to test anything"
    resumed = run_cli(*args, "--resume", "--part-sessions", "4")  # another grouping: the rows are the same
    assert resumed.returncode == 0, resumed.stderr
    key = ["session_id", "request", "pos", "depth"]
    a = pd.read_parquet(whole / entries.POSITIONS).sort_values(key).reset_index(drop=True)
    b = pd.read_parquet(out / entries.POSITIONS).sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)
    assert json.loads((out / entries.MANIFEST).read_text())["counts"] == json.loads((whole / entries.MANIFEST).read_text())["counts"]


def test_an_orphan_part_a_kill_left_in_one_table_is_removed_on_resume(tmp_path):
    writer = parts.PartWriter(tmp_path)
    for i in range(3):
        writer.add(i, *tiny_tables(i))
    writer.flush()
    orphan = tmp_path / entries.POSITIONS / tables.part_name(3)
    pq.write_table(tiny_tables(3)[0], orphan)  # killed between the two renames: positions only
    finished = parts.finished_sessions(tmp_path, k=1)
    assert not orphan.exists() and set(finished) == set()  # the tiny tables have no spans: not whole either


def test_a_ctrl_c_between_the_two_renames_leaves_the_group_for_the_next_flush_to_write_whole(tmp_path, monkeypatch):
    """The interrupt lands after the positions part is renamed and before the requests part is: the writer still
    holds the group, so the flush the replay makes on its way out writes both (no positions part left alone, and
    run.json's counts — of the parts in both tables — cover every row on disk)."""
    writer = parts.PartWriter(tmp_path)
    for i in range(3):
        writer.add(i, *tiny_tables(i))
    real = tables.write_part
    calls = []

    def interrupted(data, directory, name, temporary=None):
        calls.append(directory.name)
        if directory.name == entries.REQUESTS and calls.count(entries.REQUESTS) == 1:
            raise KeyboardInterrupt
        return real(data, directory, name, temporary)

    monkeypatch.setattr(tables, "write_part", interrupted)
    with pytest.raises(KeyboardInterrupt):
        writer.flush()
    assert writer.pending == 3  # not forgotten
    writer.flush()
    assert tables.done_parts(tmp_path) == {tables.part_name(0)}
    for table in (entries.POSITIONS, entries.REQUESTS):
        assert pq.read_table(tmp_path / table).column("session_id").unique().to_pylist() == ["s0", "s1", "s2"]
