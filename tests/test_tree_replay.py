"""Trees through replay and report: TOPK = 1 rows are the chain's, the bundled model's own text verified by a real
tree loop agrees with the replay, depth-1 acceptance is the top-k share, anchors below the chain are counted and
explained, and the report, JSON and export carry the trees."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from mtp_observe.drafting.tree import parse_tree
from mtp_observe.model.loading import default_model_dir, load_model
from mtp_observe.model.target import BUILTIN_PROFILES, prefill_hidden
from mtp_observe.report import load_run, read_and_summarize, report_json
from mtp_observe.report.metrics import simulate_decode
from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.pipeline import replay

from .fuzzing import run_cli
from .test_replay import SESSION, write_sessions
from .tree_loop import tree_speculative

ROOT = Path(__file__).resolve().parents[1]
PROFILES = {p.name: p for p in BUILTIN_PROFILES}
TREES = ("3,1,4", "3,2,6", "2,3,5", "1,3,4", "2,2,2")


LOOP = (3, 2, 6)  # the tree the loop drafts with (one of TREES)
N_NEW = 40


def _prompts(n: int):
    from mtp_observe.sessions.reading import read_sessions
    from mtp_observe.sessions.rendering import Renderer

    renderer = Renderer.from_model_dir(default_model_dir())
    session = next(iter(read_sessions([ROOT / "sessions" / "coding.jsonl"])))
    request = renderer.render(session).requests[0]
    return [request.input_ids[: sp.start] for sp in request.spans][:n]


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """{sampler: (run, [(s, e, [(anchor, accepted)])] per turn)}: the bundled model's own text, written by a real tree
    draft-and-verify loop (tests/tree_loop.py, tree LOOP) under instruct_general and greedily, replayed with TREES."""
    work = tmp_path_factory.mktemp("own-trees")
    model = load_model(default_model_dir(), dtype=torch.float64)
    out = {}
    for sampler, seed in (("instruct_general", 3), ("greedy", 0)):
        gen = torch.Generator().manual_seed(seed)
        requests, loops = [], []
        for prompt in _prompts(2):
            tokens, steps = tree_speculative(model.target, model.head, prompt, PROFILES[sampler], *LOOP, N_NEW, gen)
            requests.append({"prompt_token_ids": prompt, "completion_token_ids": tokens[len(prompt):]})
            loops.append((len(prompt), len(tokens) - 1, steps))
        path = work / f"{sampler}.jsonl"
        path.write_text(json.dumps({"id": sampler, "requests": requests}) + "\n")
        run = replay([path], default_model_dir(), work / f"run-{sampler}", ReplayOptions(
            k=3, device="cpu", dtype="float64", trees=tuple(parse_tree(t) for t in TREES)))
        out[sampler] = (run, loops, model, requests)
    return out


@pytest.fixture(scope="module")
def ten_sessions(own, tmp_path_factory) -> Path:
    """Ten sessions (the own sampled turns cut at ten lengths), enough for intervals; float32, as replay runs on a CPU."""
    work = tmp_path_factory.mktemp("ten")
    requests = own["instruct_general"][3]
    records = [{"id": f"cut-{i}", "requests": [{**r, "completion_token_ids": r["completion_token_ids"][: 22 + 2 * i]}
                                              for r in requests]} for i in range(10)]
    path = work / "ten.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return replay([path], default_model_dir(), work / "run", ReplayOptions(
        k=3, device="cpu", trees=tuple(parse_tree(t) for t in TREES)))


@pytest.fixture(scope="module")
def tree_run(own) -> Path:
    return own["instruct_general"][0]


@pytest.fixture(scope="module")
def bundled(own):
    return own["instruct_general"][2]  # the bundled model in float64


def test_a_topk_1_tree_has_the_chains_rows_and_speedup_at_every_anchor(tree_run):
    rows = pd.read_parquet(tree_run / "positions.parquet")
    chain = rows[(rows.drafter == "mtp") & (rows.depth <= 3)].set_index(["session_id", "request", "pos", "depth"])
    tree = rows[rows.drafter == "tree:3,1,4"].set_index(["session_id", "request", "pos", "depth"])
    assert len(tree) == len(chain) > 100 and set(tree.draft_k) == {3}
    columns = ["accepted", "target_token", "actual_token", "segment", "turn"]
    pd.testing.assert_frame_equal(tree.loc[chain.index, columns], chain[columns])
    # where the chain is on the recorded path the tree's node is the chain's draft; past a rejection the tree has left
    # the recorded path (draft -1, p_accept 0) while the chain's row still shows its draft
    depth = chain.index.get_level_values("depth")
    before = chain.accepted.groupby(level=[0, 1, 2]).shift(1, fill_value=True)
    on_path = (depth == 1) | before.to_numpy()
    t = tree.loc[chain.index]
    assert (t.draft_token[on_path] == chain.draft_token[on_path]).all() and (t.draft_token[~on_path] == -1).all()
    assert (t.match[on_path] == chain.match[on_path]).all() and not t.match[~on_path].any()
    assert np.allclose(t.target_logprob[on_path], chain.target_logprob[on_path], atol=1e-6)
    for p in [c for c in rows.columns if c.startswith("p_accept_")]:
        assert np.allclose(t[p][on_path], chain[p][on_path], atol=1e-6)  # one candidate per node: the chain's draft
        assert (t[p][~on_path] == 0).all()
    report = read_and_summarize(tree_run, replicates=100).report
    t = next(t for t in report.trees if t.name == "tree:3,1,4")
    assert t.fewer == t.more == 0
    assert float(t.overall.value.tau_sim[2]) == pytest.approx(float(report.overall.value.tau_sim[2]), rel=1e-12)
    # the tree's cost at TOPK = 1, T = S + 1 is the chain's at K = S: the same speedup at every batch size
    assert np.allclose(t.by_batch, report.batch.value[:, 2], rtol=1e-12)
    assert t.speedup[0] == pytest.approx(float(report.overall.value.speedup[2]), rel=1e-12)


def test_tree_rows_follow_the_recorded_tokens_down_a_tree_grown_at_each_anchor(tree_run, bundled):
    from mtp_observe.drafting.tree import grow, select
    from mtp_observe.drafting.tree_acceptance import explicit_tree

    rows = pd.read_parquet(tree_run / "positions.parquet")
    head = bundled.head
    checked = 0
    for req in pd.read_parquet(tree_run / "requests.parquet").itertuples():
        ids = torch.tensor(list(req.input_ids))
        r = head.row_pass(prefill_hidden(bundled.target, ids, chunk_size=64)[:-1], ids[1:])
        got = rows[(rows.drafter == "tree:3,2,6") & (rows.session_id == req.session_id) & (rows.request == req.request)]
        anchors = [p for sp in req.spans for p in range(int(sp["start"]), int(sp["end"]), 3)]
        ends = [int(next(sp["end"] for sp in req.spans if sp["start"] <= p < sp["end"])) for p in anchors]
        for p, e in zip(anchors, ends):
            g = grow(head, r, torch.tensor([p]), 2, 3)
            tree = explicit_tree(g, select(g, 3, 6), 0, int(ids[p]))
            u, accepted = 0, 0  # follow x_{p+1}, x_{p+2}, .. down the tree, by hand
            for k in range(1, min(3, e - p) + 1):
                nxt = [v for v in tree.children(u) if tree.tokens[v] == int(ids[p + k])]
                row = got[(got.pos == p) & (got.depth == k)].iloc[0]
                assert bool(row.match) == bool(nxt), (p, k)
                if not nxt:
                    break
                u, accepted = nxt[0], k
                assert row.draft_token == ids[p + k] and row.tree_node == 2
            assert int(got[got.pos == p].accepted.sum()) == accepted
            checked += 1
    assert checked > 10


def test_depth_1_acceptance_at_topk_k_is_the_share_of_anchors_whose_recorded_token_is_in_the_heads_top_k(
        tree_run, bundled):
    rows = pd.read_parquet(tree_run / "positions.parquet")
    report = read_and_summarize(tree_run, replicates=50).report
    head = bundled.head
    hits = anchors = 0
    for req in pd.read_parquet(tree_run / "requests.parquet").itertuples():
        ids = torch.tensor(list(req.input_ids))
        states = head.row_pass(prefill_hidden(bundled.target, ids, chunk_size=64)[:-1], ids[1:]).states
        top3 = (states @ head.lm_head.T).topk(3, dim=-1).indices  # row p-1 -> the head's top 3 for x_{p+1}
        depth1 = rows[(rows.drafter == "tree:1,3,4") & (rows.session_id == req.session_id) &
                      (rows.request == req.request) & (rows.depth == 1)]
        for p, verified in zip(depth1.pos, depth1.actual_token):
            hits += int(verified in top3[p - 1].tolist())
            anchors += 1
    t = next(t for t in report.trees if t.name == "tree:1,3,4")
    # S = 1, T = K + 1: the tree is the head's top K at depth 1 (a deeper tree's budget can cut a depth-1 node in favour
    # of a better node's child: tree 2,3,5 below)
    assert float(t.overall.value.alpha[0]) == pytest.approx(hits / anchors, rel=1e-12) and anchors > 50
    assert float(t.overall.value.alpha[0]) > float(report.overall.value.alpha[0])  # top-3 catches more than top-1


def test_anchors_where_a_tree_accepts_fewer_than_the_chain_are_counted_and_explained(tree_run):
    report = read_and_summarize(tree_run, replicates=50).report
    chain = load_run(tree_run)
    doc = report_json(report)
    for t, j in zip(report.trees, doc["trees"]):
        tree = load_run(tree_run, variant=(t.name, t.steps))
        ours, theirs = tree.accepted_len, np.minimum(chain.accepted_len, t.steps)
        assert t.fewer == int((ours < theirs).sum()) and t.more == int((ours > theirs).sum())
        assert sum(t.fewer_why.values()) == t.fewer  # every one explained
        assert j["fewer_than_chain"] == t.fewer and j["fewer_than_chain_why"] == t.fewer_why
    # T = 2 keeps one node, the head's top token: wherever the chain accepts two drafts the budget cut its second,
    # which the tree grew (a child of the frontier's best node) and dropped
    small = next(t for t in report.trees if t.name == "tree:2,2,2")
    two = int((np.minimum(chain.accepted_len, 2) == 2).sum())
    assert small.fewer == two > 0 and small.fewer_why == {"budget": two, "frontier": 0, "attention": 0}
    assert small.more == 0


def test_the_report_json_and_tables_carry_every_tree_beside_the_chain(ten_sessions):
    reading = read_and_summarize(ten_sessions, replicates=100)
    doc = report_json(reading.report)
    assert doc["report_version"] == 3 and doc["run"]["schema_version"] == 6
    assert [t["name"] for t in doc["trees"]] == [f"tree:{x}" for x in TREES]
    for t, spec in zip(doc["trees"], TREES):
        S, K, T = map(int, spec.split(","))
        assert (t["steps"], t["topk"], t["draft_tokens"]) == (S, K, T) and len(t["alpha"]) == S
        assert t["speedup_lo"] <= t["speedup"] <= t["speedup_hi"] and t["tau_sim"] >= 1
        assert t["tau_sim_lo"] <= t["tau_sim"] <= t["tau_sim_hi"]
        b = t["by_batch"]
        assert len(b["speedup"]) == len(doc["batch"]["batch_sizes"]) and b["vs_chain_lo"][0] <= b["vs_chain"][0]
        assert t["speedup"] == pytest.approx(b["speedup"][0])  # the gated batch size is 1
    topk1 = doc["trees"][0]  # 3,1,4: the chain at K = 3, to the last digit, intervals too (the same resamples)
    assert topk1["speedup_lo"] == pytest.approx(doc["batch"]["speedup_lo"][0][2], rel=1e-12)
    assert [c["batch"] for c in doc["configurations"]] == doc["batch"]["batch_sizes"]
    assert doc["layer_rules"] == []  # a one-layer head
    assert doc["verdict"]["k"] == reading.report.verdict.k  # the verdict is the chain's
    from mtp_observe.report.presentation import report_tables

    titles = [t.title for t in report_tables(reading.report)]
    assert any(t.startswith("what-if: SGLang tree drafts") for t in titles)
    assert any(t.startswith("what-if: the best of the chain") for t in titles)


def test_export_for_sglang_writes_a_replayed_trees_three_flags_and_refuses_one_not_replayed(ten_sessions):
    tree_run = ten_sessions
    code, chain, err = run_cli(["export", str(tree_run), "--engine", "sglang", "--replicates", "50"])
    assert code == 0, err
    assert "--speculative-eagle-topk 1" in chain  # the verdict's configuration: the chain
    code, tree, err = run_cli(["export", str(tree_run), "--engine", "sglang", "--tree", "3,2,6", "--replicates", "50"])
    assert code == 0, err
    assert "--speculative-num-steps 3 --speculative-eagle-topk 2 --speculative-num-draft-tokens 6" in tree and "what-if" in tree
    length = float(next(line for line in tree.splitlines() if line.startswith("SGLANG_SIMULATE_ACC_LEN=")).split("=")[1])
    t = next(t for t in read_and_summarize(tree_run, replicates=50).report.trees if t.name == "tree:3,2,6")
    assert length == pytest.approx(float(t.overall.value.mean_acceptance_length[2]), abs=1e-6)
    code, _, err = run_cli(["export", str(tree_run), "--engine", "sglang", "--tree", "4,2,6", "--replicates", "20"])
    assert code == 2 and "the run replayed" in err and len(err.strip().splitlines()) == 1, err
    code, _, err = run_cli(["export", str(tree_run), "--engine", "vllm", "--tree", "3,2,6"])
    assert code == 2 and "SGLang" in err, err


def test_a_bad_tree_option_is_one_line_and_exit_2(tiny_checkpoint, tmp_path):
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    for args, said in ((["--tree", "3,1,3"], "pass 3,1,4"), (["--tree", "2,2,4", "--tree", "2,2,4"], "named twice"),
                       (["--tree", "2,2,4", "--drafters", "ngram"], "model-free")):
        code, _, err = run_cli(["replay", str(sessions), "--model", str(tiny_checkpoint), "--out", str(tmp_path / "r"), *args])
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "r").exists()  # refused before anything was written


# --- the bundled model's own text, drafted and verified by a real tree loop ---------------------------


@pytest.mark.parametrize("sampler", ["instruct_general", "greedy"])
def test_sampled_tree_acceptance_agrees_with_a_real_tree_draft_and_verify_loop_on_the_models_own_text(own, sampler):
    run, loops, model, _ = own[sampler]
    S, K, T = LOOP
    assert any(a >= 2 for *_, steps in loops for _, a in steps) and any(a == 0 for *_, steps in loops for _, a in steps)
    tree = load_run(run, variant=(f"tree:{S},{K},{T}", S))
    first_anchor = np.concatenate([[0], np.cumsum(tree.spans.end - tree.spans.start)[:-1]])
    tokens = steps_n = 0
    for n, (s, e, steps) in enumerate(loops):
        assert (tree.spans.start[n], tree.spans.end[n]) == (s, e)
        for p, a in steps:
            if p < e:
                assert tree.accepted_len[first_anchor[n] + p - s] == min(a, e - p), f"anchor {p}"
        tokens += e - s
        steps_n += sum(1 for p, _ in steps if p < e)
    walk = simulate_decode(tree.accepted_len, tree.spans.end - tree.spans.start, S)
    assert Fraction(tokens, steps_n) == Fraction(int((tree.spans.end - tree.spans.start).sum()), int(walk.sum()))
    report = read_and_summarize(run, replicates=50).report
    t = next(t for t in report.trees if t.name == f"tree:{S},{K},{T}")
    assert float(t.overall.value.tau_sim[S - 1]) == pytest.approx(tokens / steps_n, rel=1e-12)
    if sampler == "greedy":  # own greedy text: every recorded token is the target's argmax, the verified token
        assert float(report.overall.value.on_policy) == 1.0
        # depth-1 acceptance at TOPK = 3 (S = 1, T = 4: the head's top 3): the share of anchors whose verified token,
        # the target's argmax at p, is among the head's top 3, computed directly
        K = 3
        t = next(t for t in report.trees if t.name == "tree:1,3,4")
        rows = pd.read_parquet(run / "positions.parquet")
        first = rows[(rows.drafter == "tree:1,3,4") & (rows.depth == 1)]
        hits = 0
        for req in pd.read_parquet(run / "requests.parquet").itertuples():
            ids = torch.tensor(list(req.input_ids))
            h = prefill_hidden(model.target, ids, chunk_size=4096)
            states = model.head.row_pass(h[:-1], ids[1:]).states
            top = (states @ model.head.lm_head.T).topk(K, dim=-1).indices
            mine = first[first.request == req.request]
            hits += sum(int(v in top[p - 1].tolist()) for p, v in zip(mine.pos, mine.target_token))
        assert float(t.overall.value.alpha[0]) == pytest.approx(hits / len(first), rel=1e-12)


def test_a_resumed_run_with_trees_equals_an_uninterrupted_one_and_refuses_other_trees(tiny_checkpoint, tmp_path):
    import shutil

    from mtp_observe.errors import RunDirectoryError
    from mtp_observe.run.manifest import row_draft_ks
    from mtp_observe.run.parts import finished_sessions

    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION, {**SESSION, "id": "two"}])
    trees = (parse_tree("2,2,4"), parse_tree("2,1,3"))
    options = dict(k=2, device="cpu", trees=trees, part_sessions=1)
    whole = replay([sessions], tiny_checkpoint, tmp_path / "whole", ReplayOptions(**options))
    part = tmp_path / "part"  # the same run, killed after its first session: the second's parts never written
    shutil.copytree(whole, part)
    for table in ("positions.parquet", "requests.parquet"):
        (part / table / "part-00000001.parquet").unlink()
    manifest = json.loads((part / "run.json").read_text())
    (part / "run.json").write_text(json.dumps({**manifest, "status": "failed", "finished": None}))
    assert row_draft_ks(manifest) == [2, 2, 2]  # mtp, then each tree's S: what a finished part must hold
    assert set(finished_sessions(part, 2, row_draft_ks(manifest))) == {"demo"}  # its tree rows count as complete
    with pytest.raises(RunDirectoryError, match="trees differ"):
        replay([sessions], tiny_checkpoint, part, ReplayOptions(**{**options, "trees": trees[:1], "resume": True}))
    replay([sessions], tiny_checkpoint, part, ReplayOptions(**options, resume=True))
    a, b = (pd.read_parquet(r / "positions.parquet").sort_values(["session_id", "drafter", "request", "pos", "depth"])
            .reset_index(drop=True) for r in (whole, part))
    assert set(a.drafter.astype(str)) == {"mtp", "tree:2,2,4", "tree:2,1,3"} and a.tree_node.isna().sum() > 0
    pd.testing.assert_frame_equal(a, b)
    assert json.loads((part / "run.json").read_text())["counts"]["rows"] == len(a)


def test_a_version_2_run_reads_with_a_note_that_it_has_no_trees(tiny_checkpoint, tmp_path):
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    run = replay([sessions], tiny_checkpoint, tmp_path / "run", ReplayOptions(k=2, device="cpu"))
    manifest = json.loads((run / "run.json").read_text())
    for key in ("trees", "layer_rules"):
        manifest.pop(key)
    (run / "run.json").write_text(json.dumps({**manifest, "schema_version": 2}))
    doc = report_json(read_and_summarize(run, replicates=20).report)
    assert doc["trees"] == [] and doc["layer_rules"] == [] and doc["run"]["schema_version"] == 2
    assert any("schema_version 2 run: no tree drafts" in n for n in doc["notes"])
