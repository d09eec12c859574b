"""What the plain report shows (docs/report.md "The first screen"): the verdict's K and, one line each, the best tree
and the best what-if when the run asked for them (their tables under --details), in the terminal and in Markdown; a
shard's run (run.json `shard`, not merged) is labelled as one shard of N, with `mtp-observe merge` as its next step."""

from __future__ import annotations

import pytest

from mtp_observe.drafting.tree import parse_tree
from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.pipeline import replay
from mtp_observe.run.shards import Shard

from .fuzzing import run_cli
from .test_replay import SESSION, write_sessions


@pytest.fixture(scope="module")
def runs(tiny_checkpoint, tmp_path_factory):
    base = tmp_path_factory.mktemp("plain-report")
    files = [write_sessions(base / "s.jsonl", [dict(SESSION, id=f"demo-{i}") for i in range(3)])]
    plain = replay(files, tiny_checkpoint, base / "plain", ReplayOptions(k=2, device="cpu"))
    asked = replay(files, tiny_checkpoint, base / "asked", ReplayOptions(
        k=2, device="cpu", trees=(parse_tree("2,2,4"), parse_tree("2,1,3")), head_precisions=("q4_k",),
        draft_p_min=(0.3,)))
    shard = replay(files, tiny_checkpoint, base / "shard0", ReplayOptions(k=2, device="cpu", shard=Shard(0, 2)))
    return {"plain": plain, "asked": asked, "shard": shard}


def report(run, *extra) -> str:
    code, out, err = run_cli(["report", str(run), "--replicates", "50", *extra])
    assert code == 0, err
    return out


def test_the_plain_report_shows_the_best_tree_and_the_best_what_if_in_one_line_each(runs):
    out = report(runs["asked"])
    head = out.split("by K (")[0]  # the lines above the one table
    trees = [line for line in head.splitlines() if line.startswith("tree: ")]
    whatifs = [line for line in head.splitlines() if line.startswith("what-if: ")]
    assert len(trees) == 1 and "(S,TOPK,T) of 2" in trees[0] and "a what-if, not the verdict" in trees[0], head
    assert len(whatifs) == 1 and "against the head as served" in whatifs[0], head
    assert "what-if: SGLang tree drafts" not in out and "what-if: the head at other precisions" not in out  # tables: details
    details = report(runs["asked"], "--details")
    assert "what-if: SGLang tree drafts" in details and "what-if: the head at other precisions" in details
    assert details.count(whatifs[0].split(":")[1]) >= 1 and sum(line.startswith("tree: ") for line in details.splitlines()) == 1
    md = report(runs["asked"], "--format", "markdown")
    assert "- tree\\: " in md and "- what-if\\: " in md and "### what-if: SGLang tree drafts" not in md


def test_a_run_that_asked_for_no_what_if_prints_no_what_if_line(runs):
    out = report(runs["plain"])
    assert not any(line.startswith(("tree: ", "what-if: ")) for line in out.splitlines())


def test_a_shards_run_is_labelled_one_shard_of_n_with_merge_as_its_next_step(runs):
    out = report(runs["shard"])
    lines = out.splitlines()
    assert lines[1].startswith("one shard: shard 0/2 (one of 2 shards"), lines[:3]
    steps = [line.strip() for line in lines[lines.index("next:") + 1:] if not line.strip().startswith("#")]
    assert steps[0].startswith(f"mtp-observe merge {runs['shard']} OTHER_SHARD -o MERGED_RUN"), steps[:2]
    md = report(runs["shard"], "--format", "markdown")
    assert "- one shard\\: shard 0/2" in md and "`mtp-observe merge " in md
    control = report(runs["plain"])  # a whole run: no shard line, no merge step
    assert "one shard" not in control and "mtp-observe merge" not in control


def test_a_shards_run_says_which_shard_it_is_in_the_report_json_too(runs):
    import json

    code, out, err = run_cli(["report", str(runs["shard"]), "--replicates", "50", "--format", "json"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["run"]["shard"] == {"index": 0, "count": 2} and doc["report_version"] == 3  # an added key: no bump
    code, out, err = run_cli(["report", str(runs["plain"]), "--replicates", "50", "--format", "json"])
    assert code == 0, err
    assert json.loads(out)["run"]["shard"] is None
