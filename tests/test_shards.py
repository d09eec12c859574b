"""Shards: a session's shard depends on its id alone (or, by tokens, on the input set), never on the file layout."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from mtp_observe.errors import OptionError
from mtp_observe.model.loading import default_model_dir
from mtp_observe.run.shards import Shard, balance, input_set, parse_shard, plan_shard, session_key, shard_of
from mtp_observe.sessions.reading import read_sessions
from mtp_observe.sessions.rendering import Renderer

ROOT = Path(__file__).resolve().parents[1]
DEMO = sorted((ROOT / "sessions").glob("*.jsonl"))


def _records() -> list[dict]:
    return [json.loads(line) for f in DEMO for line in f.read_text().splitlines() if line.strip()]


def _write(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_the_id_rule_is_the_first_eight_bytes_of_sha256_modulo_n_pinned_on_a_worked_example():
    assert hashlib.sha256(b"demo").hexdigest().startswith("2a97516c354b6884")
    assert shard_of("demo", 4) == 0x2A97516C354B6884 % 4 == 0
    assert shard_of("demo", 3) == 0x2A97516C354B6884 % 3 == 2
    assert shard_of("démo", 7) == int.from_bytes(hashlib.sha256("démo".encode()).digest()[:8], "big") % 7


def test_the_tokens_rule_gives_the_longest_session_first_to_the_least_loaded_shard():
    assert balance({"a": 9, "b": 5, "c": 4, "d": 3}, 2) == {"a": 0, "b": 1, "c": 1, "d": 0}  # the docstring's example
    assert balance({"x": 1, "y": 1}, 2) == {"x": 0, "y": 1}  # ties by id, then by the lowest shard
    sizes = {f"s{i}": (i * 7919) % 1000 + 1 for i in range(200)}
    loads = [0] * 5
    for key, shard in balance(sizes, 5).items():
        loads[shard] += sizes[key]
    assert max(loads) - sum(loads) / 5 <= max(sizes.values())  # no shard is one straggler past the longest session
    assert balance(dict(reversed(list(sizes.items()))), 5) == balance(sizes, 5)  # the order given does not matter


@pytest.mark.parametrize("text, needle", [
    ("3", "expected I/N"), ("a/4", "expected I/N"), ("4/4", "at most 3 for 4 shards"), ("1/0", "at least 1"),
    ("-1/4", "expected I/N"),
])
def test_a_bad_shard_is_one_line_naming_the_fix(text, needle):
    with pytest.raises(OptionError, match=needle):
        parse_shard(text)
    assert parse_shard(" 2/8 ", "tokens") == Shard(2, 8, "tokens")


def test_shard_membership_is_unchanged_when_the_input_is_split_into_other_files_or_reordered(tmp_path):
    """The same sessions (explicit ids) as two files, as five files in another order, as one file reversed: each
    shard holds the same sessions, by the id rule and by the tokens rule; only the input-set fingerprint (which
    names the files) tells the layouts apart."""
    records = _records()
    layouts = {
        "as given": DEMO,
        "five files, shuffled": [_write(tmp_path / f"part{i}.jsonl", records[i::5]) for i in (3, 0, 4, 1, 2)],
        "one file, reversed": [_write(tmp_path / "all.jsonl", records[::-1])],
    }
    renderer = Renderer.from_model_dir(default_model_dir(), vocab_size=4096)
    for by in ("id", "tokens"):
        members = {name: [set(plan_shard(files, Shard(i, 3, by), renderer).keys) for i in range(3)]
                   for name, files in layouts.items()}
        first = members["as given"]
        assert set().union(*first) == {r["id"] for r in records} and sum(map(len, first)) == len(records)
        for name, shards in members.items():
            assert shards == first, (by, name)
    assert len({input_set(files) for files in layouts.values()}) == 3
    assert input_set(DEMO) == input_set(list(DEMO))


def test_default_ids_name_a_place_so_splitting_their_file_moves_them(tmp_path):
    """The documented limit (shards.py): a session without an id is `<label>:<line>`, which a split changes."""
    records = [{k: v for k, v in r.items() if k != "id"} for r in _records()]
    whole = [session_key(s) for s in read_sessions([_write(tmp_path / "x.jsonl", records)])]
    split = [session_key(s) for s in read_sessions([_write(tmp_path / "x1.jsonl", records[:3]),
                                                    _write(tmp_path / "x2.jsonl", records[3:])])]
    assert whole[:2] == ["x:1", "x:2"] and split[3] == "x2:1" and set(whole).isdisjoint(split)


def test_the_tokens_rule_balances_the_demo_and_plans_what_it_owns_in_input_order():
    renderer = Renderer.from_model_dir(default_model_dir(), vocab_size=4096)
    plans = [plan_shard(DEMO, Shard(i, 2, "tokens"), renderer) for i in range(2)]
    ids = [s.id for s in read_sessions(DEMO)]
    for plan in plans:
        assert list(plan.keys) == [i for i in ids if i in plan.keys]  # input order
        assert list(plan.indices) == [ids.index(k) for k in plan.keys]
    sizes = {s.id: renderer.render(s).n_tokens for s in read_sessions(DEMO)}
    assert [p.tokens for p in plans] == [sum(sizes[k] for k in p.keys) for p in plans]
    assert abs(plans[0].tokens - plans[1].tokens) <= max(sizes.values())
    manifest = plans[0].manifest()
    assert manifest["by"] == "tokens" and manifest["session_ids"] == list(plans[0].keys) and manifest["count"] == 2


def test_generate_shards_together_are_the_whole_output_and_each_record_names_its_shard(tiny_checkpoint, tmp_path):
    from mtp_observe.run.generation import GenerateOptions, generate

    from .test_generation import SESSIONS

    sessions = _write(tmp_path / "s.jsonl", SESSIONS + [{**SESSIONS[0], "id": f"more{i}"} for i in range(3)])
    opts = GenerateOptions(sampling="thinking_general", max_new_tokens=6, device="cpu", seed=4)
    generate([sessions], tiny_checkpoint, tmp_path / "whole.jsonl", opts)
    whole = {r["id"]: r for r in map(json.loads, (tmp_path / "whole.jsonl").read_text().splitlines())}
    parts = {}
    for i in range(2):
        out = tmp_path / f"shard-{i}.jsonl"
        generate([sessions], tiny_checkpoint, out, GenerateOptions(**{**opts.__dict__, "shard": Shard(i, 2)}))
        records = list(map(json.loads, out.read_text().splitlines()))
        assert {r["id"] for r in records} == {sid for sid in whole if shard_of(sid, 2) == i} != set()
        for r in records:
            assert r["meta"]["generated"]["shard"]["index"] == i and r["meta"]["generated"]["shard"]["count"] == 2
            parts[r["id"]] = r
    assert parts.keys() == whole.keys()
    for sid, record in whole.items():  # the same tokens: a turn's draws depend on the seed, the session and the turn
        assert parts[sid]["requests"] == record["requests"]
