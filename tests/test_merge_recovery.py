"""Merge refuses what it cannot vouch for, and damaged shards recover (issue 40): merge compares the run identity
--resume compares (one function), naming the key and both values; `merge -o` inside or around a shard is refused;
`replay --resume` of a complete run re-checks its parts and recomputes only the sessions it lost; `merge
--allow-partial` records the sessions of a lost part as missing (the verdict UNRELIABLE); a part is read back whole
(every column, page checksums), so a damaged page in any column is caught by merge and by --resume. Through the
command line where a user meets it; shards of the tiny checkpoint, one session a part."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from mtp_observe.errors import RunDirectoryError
from mtp_observe.run.manifest import IDENTITY_KEYS
from mtp_observe.run.merge import merge_runs

from .test_merge import report_of, same_tables
from .test_replay import SESSION, run_cli, write_sessions


def manifest(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def edit_manifest(run: Path, change) -> None:
    m = manifest(run)
    change(m)
    (run / "run.json").write_text(json.dumps(m))


@pytest.fixture(scope="module")
def job(tiny_checkpoint, tmp_path_factory):
    """One run of six sessions and its two shards, all written by the command line (one session a part)."""
    tmp = tmp_path_factory.mktemp("recovery")
    sessions = write_sessions(tmp / "s.jsonl", [dict(SESSION, id=f"s{i}") for i in range(6)])
    base = ["replay", sessions, "--model", tiny_checkpoint, "--k", "2", "--device", "cpu", "--part-sessions", "1"]
    for name, extra in (("one", []), ("s0", ["--shard", "0/2"]), ("s1", ["--shard", "1/2"])):
        r = run_cli(*base, *extra, "--out", tmp / name)
        assert r.returncode == 0, r.stderr
    assert manifest(tmp / "s0")["counts"]["sessions_ok"] >= 2 and manifest(tmp / "s1")["counts"]["sessions_ok"] >= 2
    return {"tmp": tmp, "base": base, "one": tmp / "one", "s0": tmp / "s0", "s1": tmp / "s1"}


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)  # copies (never links): damaging it leaves the fixture's shard whole
    return dst


def parts_of(run: Path, table: str = "positions.parquet") -> list[Path]:
    return sorted((run / table).glob("part-*.parquet"))


def cut(part: Path) -> None:
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])  # a copy cut short (a full disk, a killed rsync)


def corrupt_page(part: Path, column: str) -> None:
    """One byte of the last page of `column` flipped, in place: the file's footer and every other column intact."""
    meta = pq.ParquetFile(part).metadata
    j = meta.schema.to_arrow_schema().get_field_index(column)
    assert j >= 0, column
    chunk = meta.row_group(0).column(j)
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    at = start + chunk.total_compressed_size - 1  # the last byte of the chunk: its last page's data
    data = bytearray(part.read_bytes())
    data[at] ^= 0xFF
    part.write_bytes(bytes(data))


def sessions_in(part: Path) -> list[str]:
    return sorted(set(pd.read_parquet(part.parent.parent / "requests.parquet" / part.name).session_id))


# --- 2. one identity: merge compares what --resume compares -------------------------------------------------------


def _set(key, value):
    return lambda m: m.update({key: value})


def _within(key, inner, value):
    return lambda m: m[key].update({inner: value})


MISMATCHES = {  # a key of the run identity: another experiment's value, and the refusal's words (O: its shard, S: s0)
    "trees": (_set("trees", [{"steps": 2, "topk": 2, "num_draft_tokens": 4}]),
              'trees differs ([{"num_draft_tokens": 4, "steps": 2, "topk": 2}] in O, [] in S)'),
    "layer_rules": (_set("layer_rules", [{"rule": "stepwise", "drafter": "mtp_stepwise", "layers": 1, "k": 2}]),
                    'layer rules differs ([{"drafter": "mtp_stepwise", "k": 2, "layers": 1, "rule":... in O, [] in S)'),
    "head precisions": (_set("whatifs", {"head_precision": ["fp8"], "draft_p_min": []}),
                        'whatifs differs ({"draft_p_min": [], "head_precision": ["fp8"]} in O, null in S)'),
    "thresholds": (_set("whatifs", {"head_precision": [], "draft_p_min": [0.5]}),
                   'whatifs differs ({"draft_p_min": [0.5], "head_precision": []} in O, null in S)'),
    "serving numerics": (_within("serving", "device", "a100"), "serving differs (serving.device a100 in O, h100 in S)"),
    "head reading": (_within("head_reading", "fed_back_state", "pre_norm"),
                     "head reading differs (head_reading.fed_back_state pre_norm in O, post_norm in S)"),
    "k": (_set("k", 3), "k differs (3 in O, 2 in S)"),
    "options": (_within("options", "chunk_size", 7), "options differs (options.chunk_size 7 in O, "),
}


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_merge_refuses_shards_of_two_experiments_naming_the_key_and_both_values(job, tmp_path, case):
    """bf66717 compared a fixed key list: trees, layer rules, precisions, thresholds, serving numerics and head
    readings were not in it, and the first shard's values were written into the merged run.json."""
    other = copy(job["s1"], tmp_path / "other")
    change, said = MISMATCHES[case]
    edit_manifest(other, change)
    with pytest.raises(RunDirectoryError) as refused:
        merge_runs([job["s0"], other], tmp_path / "merged")
    line = str(refused.value)
    assert line.startswith(f"{other}: not a shard of the same job as {job['s0']}: "), line
    assert said.replace(" in O", f" in {other}").replace(" in S", f" in {job['s0']}") in line, line
    assert not (tmp_path / "merged").exists()


def test_the_identity_merge_compares_is_every_key_resume_compares(job):
    """One function: manifest.resume_difference over manifest.IDENTITY_KEYS, the keys identity() writes."""
    m = manifest(job["s0"])
    for key in IDENTITY_KEYS:
        if key != "tool_version":
            assert key in m, key  # a run records every key of its identity
    assert {"trees", "layer_rules", "whatifs", "serving", "head_reading", "inputs", "options"} <= set(IDENTITY_KEYS)


def test_merge_from_the_command_line_refuses_a_shard_replayed_with_a_head_precision_in_one_line(job, tmp_path):
    r = run_cli(*job["base"], "--shard", "1/2", "--head-precision", "fp8", "--out", tmp_path / "fp8")
    assert r.returncode == 0, r.stderr
    r = run_cli("merge", job["s0"], tmp_path / "fp8", "-o", tmp_path / "merged")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert (f'whatifs differs ({{"draft_p_min": [], "head_precision": ["fp8"]}} in {tmp_path / "fp8"}, null in '
            f'{job["s0"]})') in r.stderr, r.stderr
    assert not (tmp_path / "merged").exists()


# --- 3. -o inside or around a shard ----------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["positions.parquet", "requests.parquet", "requests.parquet/deeper", ".", "..",
                                   "elsewhere-via-link"])
def test_merge_out_inside_or_around_a_shard_is_refused_in_one_line_and_the_shard_stays_readable(job, tmp_path, where):
    s0, s1 = copy(job["s0"], tmp_path / "job" / "s0"), copy(job["s1"], tmp_path / "job" / "s1")
    before = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "job").rglob("*"))
    if where == "elsewhere-via-link":  # a link elsewhere that points into the shard
        (tmp_path / "link").symlink_to(s0 / "positions.parquet")
        out = tmp_path / "link"
    else:
        out = Path(os.path.normpath(s0 / where))
    r = run_cli("merge", s0, s1, "-o", out)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"--out {out}" in r.stderr and str(s0) in r.stderr, r.stderr
    assert sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "job").rglob("*")) == before
    same_tables(s0, job["s0"])


# --- 4. recovery -----------------------------------------------------------------------------------------------------


def test_resume_of_a_complete_run_with_a_cut_part_and_a_deleted_part_recomputes_only_their_sessions(job, tmp_path):
    """bf66717 said "already complete, nothing to resume" and left the run damaged."""
    run = copy(job["one"], tmp_path / "run")
    positions = parts_of(run)
    cut(positions[1])
    for table in ("positions.parquet", "requests.parquet"):
        (run / table / positions[3].name).unlink()
    kept = {p.name: os.stat(p).st_ino for p in parts_of(run) if p.name != positions[1].name}
    r = run_cli(*job["base"], "--out", run, "--resume")
    assert r.returncode == 0, r.stderr
    assert "the run was complete but" in r.stderr and positions[1].name in r.stderr, r.stderr
    m = manifest(run)
    assert m["status"] == "complete" and len(m["resumed"]) == 1 and m["counts"] == manifest(job["one"])["counts"]
    for table in ("positions.parquet", "requests.parquet"):
        for p in parts_of(job["one"], table):
            assert (run / table / p.name).read_bytes() == p.read_bytes(), p.name
    assert {p.name: os.stat(p).st_ino for p in parts_of(run) if p.name in kept} == kept  # the whole ones untouched
    again = run_cli(*job["base"], "--out", run, "--resume")  # whole now: nothing to do
    assert again.returncode == 0 and "already complete" in again.stderr and "recomputing" not in again.stderr


def test_merge_of_a_complete_shard_with_a_cut_part_says_resume_and_resume_mends_it(job, tmp_path):
    s1 = copy(job["s1"], tmp_path / "s1")
    cut(parts_of(s1)[0])
    r = run_cli("merge", job["s0"], s1, "-o", tmp_path / "merged")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"--out {s1} --resume" in r.stderr and "damaged" in r.stderr, r.stderr
    r = run_cli(*job["base"], "--shard", "1/2", "--out", s1, "--resume")
    assert r.returncode == 0, r.stderr
    r = run_cli("merge", job["s0"], s1, "-o", tmp_path / "merged")
    assert r.returncode == 0, r.stderr
    same_tables(tmp_path / "merged", job["one"])
    assert manifest(tmp_path / "merged")["counts"] == manifest(job["one"])["counts"]


def test_allow_partial_records_the_sessions_of_a_lost_part_as_missing_and_the_verdict_is_unreliable(job, tmp_path):
    """bf66717 refused the shard ("resume it") even under --allow-partial, which docs/scale.md says merges it."""
    s1 = copy(job["s1"], tmp_path / "s1")
    damaged = parts_of(s1)[0]
    lost = sessions_in(damaged)
    cut(damaged)
    r = run_cli("merge", job["s0"], s1, "-o", tmp_path / "merged", "--allow-partial")
    assert r.returncode == 0, r.stderr
    assert f"left out {damaged}" in r.stderr and "partial: 0 shard(s) and 1 session(s) missing" in r.stderr, r.stderr
    m = manifest(tmp_path / "merged")
    assert m["status"] == "partial" and m["merged"]["missing"] == {"shards": [], "sessions": lost, "unknown": []}
    assert m["counts"]["sessions_ok"] == manifest(job["one"])["counts"]["sessions_ok"] - len(lost)
    assert not (tmp_path / "merged" / "positions.parquet" / damaged.name).exists()
    assert report_of(tmp_path / "merged")["verdict"]["status"] == "UNRELIABLE"


# --- 6. every column read back -------------------------------------------------------------------------------------


@pytest.mark.parametrize("table, column", [("positions.parquet", "draft_token"), ("positions.parquet", "target_logprob"),
                                           ("requests.parquet", "input_ids")])
def test_a_damaged_page_in_any_column_is_caught_by_merge_and_recomputed_by_resume(job, tmp_path, table, column):
    """bf66717 decoded four columns: a damaged page elsewhere merged with exit 0 (and the report then refused it)."""
    s1 = copy(job["s1"], tmp_path / "s1")
    part = parts_of(s1, table)[0]
    corrupt_page(part, column)
    r = run_cli("merge", job["s0"], s1, "-o", tmp_path / "merged")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert part.name in r.stderr and "cannot be read back" in r.stderr and "--resume" in r.stderr, r.stderr
    r = run_cli(*job["base"], "--shard", "1/2", "--out", s1, "--resume")
    assert r.returncode == 0, r.stderr
    assert "cannot be read back" in r.stderr and "recomputing" in r.stderr, r.stderr
    same_tables(s1, job["s1"])
    assert merge_runs([job["s0"], s1], tmp_path / "merged").status == "complete"
