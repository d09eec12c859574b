"""Which session is which: ids are unique within a run, default ids tell files apart, a repeated id is
refused naming both places (in sessions, replay and import alike), and inputs with nothing to score are
refused before any work instead of giving a run the report rejects."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from mtp_observe.errors import InputError
from mtp_observe.report import load_run, read_and_summarize
from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.pipeline import replay
from mtp_observe.sessions.importers import import_files
from mtp_observe.sessions.reading import Session, Skipped, read_sessions

from .test_importers import claude_code_events
from .test_replay import SESSION, run_cli, write_sessions

ANONYMOUS = {k: v for k, v in SESSION.items() if k != "id"}


def one_line(r) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


# --- default ids ------------------------------------------------------------------------------


def test_two_files_named_sessions_jsonl_in_different_folders_replay_and_report_as_two_sessions(tiny_checkpoint, tmp_path):
    files = []
    for folder in ("monday", "tuesday"):
        (tmp_path / folder).mkdir()
        files.append(write_sessions(tmp_path / folder / "sessions.jsonl", [ANONYMOUS]))
    run = replay(files, tiny_checkpoint, tmp_path / "run", ReplayOptions(k=2, device="cpu"))
    ids = list(dict.fromkeys(pd.read_parquet(run / "positions.parquet").session_id))
    assert ids == ["monday/sessions:1", "tuesday/sessions:1"]
    report = read_and_summarize(run, replicates=20).report
    assert [s.name for s in report.sessions] == ids and report.overall.sessions == 2
    r = run_cli("report", run, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert [s["name"] for s in json.loads(r.stdout)["slices"]["session"]] == ids


def test_default_ids_use_the_shortest_trailing_path_that_tells_the_inputs_apart(tmp_path):
    from mtp_observe.sessions.reading import path_labels

    paths = [tmp_path / "a" / "x" / "s.jsonl", tmp_path / "b" / "x" / "s.jsonl", tmp_path / "c" / "t.jsonl",
             tmp_path / "c" / "t.json"]
    labels = path_labels(paths)
    assert labels == {str(paths[0]): "a/x/s", str(paths[1]): "b/x/s", str(paths[2]): "t.jsonl", str(paths[3]): "t.json"}
    assert path_labels([tmp_path / "one" / "s.jsonl"]) == {str(tmp_path / "one" / "s.jsonl"): "s"}  # alone: the stem, as before
    assert path_labels(list(reversed(paths))) == labels  # the order of the inputs does not change a label


def test_message_per_line_files_with_the_same_name_get_distinct_ids(tmp_path):
    files = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        files.append(write_sessions(tmp_path / folder / "chat.jsonl", [{"role": "user", "content": "q"},
                                                                       {"role": "assistant", "content": "a"}]))
    assert [s.id for s in read_sessions(files)] == ["a/chat", "b/chat"]


# --- a repeated id ----------------------------------------------------------------------------


def test_the_same_explicit_id_in_two_files_is_refused_naming_both_places(tiny_checkpoint, tmp_path):
    a = write_sessions(tmp_path / "a.jsonl", [SESSION])
    b = write_sessions(tmp_path / "b.jsonl", [dict(SESSION, id="other"), SESSION])
    with pytest.raises(InputError) as e:
        list(read_sessions([a, b]))
    assert str(e.value).startswith(f"{b}:2: session demo: ") and f"{a}:1" in str(e.value), str(e.value)
    line = one_line(run_cli("sessions", a, b, "--model", tiny_checkpoint))
    assert f"{b}:2" in line and f"{a}:1" in line
    line = one_line(run_cli("replay", a, b, "--model", tiny_checkpoint, "--device", "cpu", "--out", tmp_path / "run"))
    assert f"{b}:2" in line and f"{a}:1" in line


def test_the_same_file_given_twice_is_refused_before_it_is_counted_twice(tiny_checkpoint, tmp_path):
    a = write_sessions(tmp_path / "a.jsonl", [ANONYMOUS])
    line = one_line(run_cli("replay", a, a, "--model", tiny_checkpoint, "--device", "cpu", "--out", tmp_path / "run"))
    assert f"{a}:1" in line and "repeats" in line and "given twice" in line, line


def test_under_skip_a_repeated_id_is_skipped_and_recorded(tiny_checkpoint, tmp_path):
    a = write_sessions(tmp_path / "a.jsonl", [SESSION, dict(SESSION, id="b"), SESSION])
    items = list(read_sessions([a], on_error="skip"))
    assert [type(i) for i in items] == [Session, Session, Skipped] and "a.jsonl:1" in items[2].message
    run = replay([a], tiny_checkpoint, tmp_path / "run", ReplayOptions(k=1, device="cpu", on_error="skip"))
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["counts"]["sessions_ok"] == 2 and manifest["counts"]["sessions_skipped"] == 1
    assert manifest["errors"][0]["line"] == 3 and "repeats" in manifest["errors"][0]["message"]


def test_import_applies_the_same_rule_to_a_repeated_id(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    files = [write_sessions(tmp_path / d / "t.jsonl", claude_code_events()) for d in ("a", "b")]
    with pytest.raises(InputError) as e:
        import_files("claude-code", files, tmp_path / "out.jsonl")
    assert str(files[1]) in str(e.value) and str(files[0]) in str(e.value) and "s-1" in str(e.value), str(e.value)
    assert not (tmp_path / "out.jsonl").exists()
    skipped = []
    import_files("claude-code", files, tmp_path / "out.jsonl", on_error="skip", warn=skipped.append)
    assert [s.id for s in read_sessions([tmp_path / "out.jsonl"])] == ["s-1"] and len(skipped) == 1


def test_import_default_ids_tell_two_files_of_the_same_name_apart(tmp_path):
    events = [{k: v for k, v in e.items() if k != "sessionId"} for e in claude_code_events()]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    files = [write_sessions(tmp_path / d / "t.jsonl", events) for d in ("a", "b")]
    import_files("claude-code", files, tmp_path / "out.jsonl")
    assert [s.id for s in read_sessions([tmp_path / "out.jsonl"])] == ["a/t", "b/t"]


def test_the_report_never_merges_two_sessions_that_share_an_id_in_different_parts(tiny_checkpoint, tmp_path):
    """A version-1 run (written before ids were unique) holds two sessions named 'sessions:1': two sessions, not a
    corrupt one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        files.append(write_sessions(tmp_path / folder / "sessions.jsonl", [ANONYMOUS]))
    run = replay(files, tiny_checkpoint, tmp_path / "run", ReplayOptions(k=2, device="cpu", part_sessions=1))  # as v1 wrote
    for table in ("positions.parquet", "requests.parquet"):
        for part in (run / table).glob("part-*.parquet"):
            t = pq.read_table(part)
            i = t.schema.get_field_index("session_id")
            pq.write_table(t.set_column(i, "session_id", pa.array(["sessions:1"] * t.num_rows, pa.string())), part)
    loaded = load_run(run)
    assert len(loaded.sessions) == 2 and len(set(loaded.sessions)) == 2 and loaded.sessions[0].startswith("sessions:1")
    assert any("sessions:1" in n and "part" in n for n in loaded.notes)


# --- inputs with nothing to score -------------------------------------------------------------


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_an_input_with_no_sessions_is_refused_before_any_work_in_sessions_replay_and_import(tiny_checkpoint, tmp_path, content):
    good = write_sessions(tmp_path / "good.jsonl", [SESSION])
    empty = tmp_path / "empty.jsonl"
    empty.write_text(content)
    out = tmp_path / "run"
    for argv in (["sessions", good, empty, "--model", tiny_checkpoint],
                 ["replay", good, empty, "--model", tiny_checkpoint, "--device", "cpu", "--out", out],
                 ["import", "claude-code", empty, "-o", tmp_path / "o.jsonl"],
                 ["import", "auto", empty, "-o", tmp_path / "o.jsonl"]):
        line = one_line(run_cli(*argv))
        assert line == f"error: {empty}: holds no sessions (the file is empty or only blank lines); remove it from the inputs", line
    assert not out.exists() and not (tmp_path / "o.jsonl").exists()  # refused before any work


def test_an_import_that_finds_no_session_in_a_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "runs.json"
    path.write_text("[]")
    with pytest.raises(InputError, match=r"runs.json: holds no sessions"):
        import_files("tau-bench", [path], tmp_path / "o.jsonl")
    assert not (tmp_path / "o.jsonl").exists()


TOKEN_CASES = {
    "no prompt": ({"prompt_token_ids": [], "completion_token_ids": [5, 6, 7, 8]}, "no prompt tokens"),
    "prompt missing": ({"completion_token_ids": [5, 6, 7, 8]}, "no prompt tokens"),
    "a one-token completion": ({"prompt_token_ids": [3, 4, 5], "completion_token_ids": [9]}, "one completion token"),
    "one of several requests": ({"requests": [{"prompt_token_ids": [3, 4], "completion_token_ids": [5, 6, 7]},
                                              {"prompt_token_ids": [], "completion_token_ids": [5, 6]}]}, "request 1 has no prompt tokens"),
}


@pytest.mark.parametrize("case", list(TOKEN_CASES))
def test_a_token_level_record_with_nothing_to_draft_from_is_refused_or_skipped_and_recorded(tiny_checkpoint, tmp_path, case):
    bad, needle = TOKEN_CASES[case]
    good = {"id": "good", "prompt_token_ids": [3, 4, 5], "completion_token_ids": [6, 7, 8, 9]}
    path = write_sessions(tmp_path / "tokens.jsonl", [good, dict(bad, id="bad")])
    with pytest.raises(InputError) as e:
        list(read_sessions([path]))
    assert str(e.value).startswith(f"{path}:2: session bad: ") and needle in str(e.value), str(e.value)
    run = replay([path], tiny_checkpoint, tmp_path / "skip", ReplayOptions(k=2, device="cpu", on_error="skip"))
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["counts"]["sessions_ok"] == 1 and [e["session_id"] for e in manifest["errors"]] == ["bad"]
    assert load_run(run).sessions == ("good",)  # the run the replay wrote is one the report reads


def test_a_token_level_record_with_no_prompt_is_one_line_through_the_cli(tiny_checkpoint, tmp_path):
    path = write_sessions(tmp_path / "tokens.jsonl", [{"id": "bad", "completion_token_ids": [5, 6, 7]}])
    line = one_line(run_cli("replay", path, "--model", tiny_checkpoint, "--device", "cpu", "--out", tmp_path / "run"))
    assert f"{path}:1: session bad: record has no prompt tokens" in line, line


def test_a_token_level_record_with_a_one_token_prompt_is_scored_from_its_first_completion_token(tiny_checkpoint, tmp_path):
    path = write_sessions(tmp_path / "t.jsonl", [{"id": "t", "prompt_token_ids": [3], "completion_token_ids": [5, 6, 7, 8]}])
    run = replay([path], tiny_checkpoint, tmp_path / "run", ReplayOptions(k=2, device="cpu"))
    rows = pd.read_parquet(run / "positions.parquet")
    assert sorted(set(rows.pos)) == [1, 2, 3] and len(load_run(run).accepted_len) == 3


def test_a_run_where_every_session_was_skipped_says_so_in_one_line(tiny_checkpoint, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("{oops\n")
    r = run_cli("replay", path, "--model", tiny_checkpoint, "--device", "cpu", "--out", tmp_path / "run", "--on-error", "skip")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]  # after the warning that skipped it
    assert line.startswith("error: ") and "no session" in line and "1 skipped" in line and "run.json" in line, line
