"""Sessions are read and rendered once per command (STYLE.md 14, sessions/inputs.py): the shard plan, the manifest,
the estimate and the replay take one Inputs; a shard never renders another shard's sessions unless a drafter with
state across sessions (suffix decoding) needs their outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtp_observe.run.options import Observer, ReplayOptions
from mtp_observe.run.pipeline import replay, replay_estimate
from mtp_observe.run.shards import Shard, plan_shard
from mtp_observe.sessions.inputs import Inputs
from mtp_observe.sessions.rendering import Renderer

from .test_drafters_replay import tokenizer_only  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]
DEMO = sorted((ROOT / "sessions").glob("*.jsonl"))


class Estimating(Observer):
    """An observer that takes the estimate (so the replay makes one, and renders for it)."""

    def estimate(self, estimate) -> None:
        self.seen = estimate


def demo_sessions() -> int:
    return sum(1 for f in DEMO for line in f.read_text().splitlines() if line.strip())


def test_a_replay_reads_its_files_once_and_renders_each_session_once(tokenizer_only, tmp_path):  # noqa: F811
    inputs = Inputs(DEMO)
    observer = Estimating()
    replay(inputs, tokenizer_only, tmp_path / "run", ReplayOptions(drafters=("ngram",), k=3), observer=observer)
    assert observer.seen.work.tokens > 0  # the estimate rendered every session ...
    assert inputs.reads == 1  # ... and the files were parsed once, for the estimate, the manifest and the replay
    assert inputs.renders == demo_sessions()  # ... and the replay took the estimate's renderings
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert manifest["counts"]["sessions_ok"] == demo_sessions()


def test_a_shard_renders_only_its_own_sessions_without_a_drafter_that_spans_sessions(tokenizer_only, tmp_path):  # noqa: F811
    inputs = Inputs(DEMO)
    opts = ReplayOptions(drafters=("ngram",), k=3, shard=Shard(0, 2, "id"))
    replay(inputs, tokenizer_only, tmp_path / "s0", opts, observer=Estimating())
    owned = json.loads((tmp_path / "s0" / "run.json").read_text())["shard"]["sessions"]
    assert 0 < owned < demo_sessions()
    assert inputs.reads == 1 and inputs.renders == owned


def test_suffix_decoding_renders_the_other_shards_sessions_once_for_its_global_tree(tokenizer_only, tmp_path):  # noqa: F811
    inputs = Inputs(DEMO)
    opts = ReplayOptions(drafters=("suffix",), k=3, shard=Shard(0, 2, "id"))
    replay(inputs, tokenizer_only, tmp_path / "s0", opts, observer=Estimating())
    assert inputs.reads == 1 and inputs.renders == demo_sessions()  # every session once: its own, then the others'


def test_the_tokens_rule_renders_every_session_once_and_the_replay_reuses_the_shards_own(tokenizer_only, tmp_path):  # noqa: F811
    inputs = Inputs(DEMO)
    opts = ReplayOptions(drafters=("ngram",), k=3, shard=Shard(1, 2, "tokens"))
    replay(inputs, tokenizer_only, tmp_path / "s1", opts, observer=Estimating())
    assert inputs.reads == 1 and inputs.renders == demo_sessions()


def test_a_dry_run_under_a_shard_estimates_the_shards_sessions_only(tokenizer_only):  # noqa: F811
    whole = replay_estimate(DEMO, tokenizer_only, ReplayOptions(drafters=("ngram",), k=3))
    halves = [replay_estimate(DEMO, tokenizer_only, ReplayOptions(drafters=("ngram",), k=3, shard=Shard(i, 2, "id")))
              for i in range(2)]
    renderer = Renderer.from_model_dir(tokenizer_only)
    plans = [plan_shard(DEMO, Shard(i, 2, "id"), renderer) for i in range(2)]
    assert [len(p.keys) for p in plans] != [demo_sessions(), 0]
    assert sum(h.work.tokens for h in halves) == whole.work.tokens
    assert all(0 < h.work.tokens < whole.work.tokens for h in halves)


def test_a_bad_session_fails_a_replay_where_it_stands_though_the_files_were_read_once(tokenizer_only, tmp_path):  # noqa: F811
    bad = tmp_path / "bad.jsonl"
    bad.write_text(DEMO[0].read_text().splitlines()[0] + "\n" + '{"id": "x", "messages": [{"role": "nobody"}]}\n')
    inputs = Inputs([bad])
    with pytest.raises(Exception) as caught:
        replay(inputs, tokenizer_only, tmp_path / "run", ReplayOptions(drafters=("ngram",), k=3), observer=Estimating())
    assert "bad.jsonl:2" in str(caught.value) and "session x" in str(caught.value)
    assert inputs.reads == 1
