"""A shard that owns no session is a success: `replay --shard` and `generate --shard` exit 0 with a note, the replay's
run directory is complete and `merge` joins it like any other shard, and generate writes no file (an empty one would
be refused as a replay input), so a scheduler's `afterok` merge runs and an indexed job does not retry forever."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtp_observe.run.shards import shard_of

from .test_replay import SESSION, run_cli, write_sessions

IDS = [f"s{i}" for i in range(6)]
N = 8


def six_sessions(tmp_path: Path) -> Path:
    return write_sessions(tmp_path / "six.jsonl", [{**SESSION, "id": sid} for sid in IDS])


def owners() -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for sid in IDS:
        out.setdefault(shard_of(sid, N), []).append(sid)
    return out


def test_the_ids_leave_shard_1_of_8_empty():  # pinned: the tests below rely on it
    assert sorted(owners()) == [0, 2, 3, 4, 7] and 1 not in owners()


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_an_empty_shard_is_a_success_and_merge_joins_it_like_any_other(tiny_checkpoint, tmp_path):
    sessions = six_sessions(tmp_path)
    base = ["--model", tiny_checkpoint, "--device", "cpu", "--k", "2"]
    runs = []
    for i in range(N):
        out = tmp_path / f"shard-{i}"
        r = run_cli("replay", sessions, *base, "--shard", f"{i}/{N}", "--out", out)
        assert r.returncode == 0, (i, r.stderr)
        runs.append(out)
        m = json.loads((out / "run.json").read_text())
        assert m["status"] == "complete" and m["shard"]["session_ids"] == owners().get(i, [])
        if i not in owners():
            assert f"note: shard {i}/{N} owns none of the 6 sessions" in r.stderr, r.stderr
            assert m["counts"]["sessions_ok"] == 0 and m["errors"] == []
            assert "a shard that owns none" in r.stdout and "Traceback" not in r.stderr
            again = run_cli("replay", sessions, *base, "--shard", f"{i}/{N}", "--out", out, "--resume")
            assert again.returncode == 0, again.stderr  # a requeued task: nothing to resume, still a success
            alone = run_cli("report", out)  # nothing to report alone: it says to merge it
            assert alone.returncode == 2 and "merge it with the job's other shards" in alone.stderr, alone.stderr
    without = run_cli("merge", *runs[:1], *runs[2:], "-o", tmp_path / "without")  # it is one of the job's shards
    assert without.returncode == 2 and f"shard 1/{N} is missing" in without.stderr, without.stderr
    merged = tmp_path / "merged"
    r = run_cli("merge", runs[1], runs[0], *runs[2:], "-o", merged)  # an empty shard first: its run.json is the base
    assert r.returncode == 0, r.stderr
    assert f"merged {N} of {N} shards: 6 sessions" in r.stdout, r.stdout
    one = tmp_path / "one"
    assert run_cli("replay", sessions, *base, "--out", one).returncode == 0
    counts = json.loads((merged / "run.json").read_text())["counts"]
    assert counts == json.loads((one / "run.json").read_text())["counts"]
    assert run_cli("report", merged, "--format", "json").returncode == 0


def test_generate_of_an_empty_shard_exits_0_with_a_note_and_writes_no_file(tiny_checkpoint, tmp_path):
    sessions = six_sessions(tmp_path)
    base = ["--model", tiny_checkpoint, "--device", "cpu", "--max-new-tokens", "3"]
    own = tmp_path / "own-1.jsonl"
    r = run_cli("generate", sessions, *base, "--shard", f"1/{N}", "-o", own)
    assert r.returncode == 0, r.stderr
    assert f"note: shard 1/{N} owns none of the 6 sessions" in r.stderr and f"-o {own} is not written" in r.stderr
    assert not own.exists() and not own.with_name(own.name + ".partial").exists() and r.stdout.strip() == ""
    # a stale output of an earlier job, replaced with --overwrite: removed, so a glob of the outputs reads no old
    # sessions (an empty file would be refused by replay as an input with no sessions)
    own.write_text(json.dumps(SESSION) + "\n")
    r = run_cli("generate", sessions, *base, "--shard", f"1/{N}", "-o", own, "--overwrite")
    assert r.returncode == 0 and "removed" in r.stderr and not own.exists(), r.stderr
    # a shard that owns sessions still writes them, and the outputs together are a replay's input
    own0 = tmp_path / "own-0.jsonl"
    assert run_cli("generate", sessions, *base, "--shard", f"0/{N}", "-o", own0).returncode == 0
    assert [json.loads(line)["id"] for line in own0.read_text().splitlines()] == owners()[0]
