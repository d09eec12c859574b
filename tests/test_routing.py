"""The router measurement: window sums recorded during replay equal a brute-force count over the same windows."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
import torch

from mtp_observe.cost.roofline import ExpertCounts
from mtp_observe.model.loading import load_model
from mtp_observe.model.routing import RouterRecorder, window_hits
from mtp_observe.model.target import prefill
from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.pipeline import replay

from .test_replay import SESSION, write_sessions

MOE = dict(family="qwen3_5_moe")


def brute_force(per_token: list[list[set[int]]], spans: list[tuple[int, int]], experts: int, q_max: int):
    """per_token[l][t] the experts of token t in layer l -> (windows [q_max], hits [q_max, L, E]) by enumerating windows."""
    L = len(per_token)
    windows = np.zeros(q_max, dtype=np.int64)
    hits = np.zeros((q_max, L, experts), dtype=np.int64)
    for s, e in spans:
        for q in range(1, q_max + 1):
            for t in range(s, e - q + 2):  # tokens t..t+q-1, all inside [s, e]
                windows[q - 1] += 1
                for layer in range(L):
                    for x in set().union(*per_token[layer][t : t + q]):
                        hits[q - 1, layer, x] += 1
    return windows, hits


def router_experts(target, ids: torch.Tensor) -> list[list[set[int]]]:
    """Each token's top-k experts per MoE layer, from transformers' own router logits (no hook involved)."""
    with torch.no_grad():
        out = target.model(input_ids=ids[None], output_router_logits=True)
    k = target.config.num_experts_per_tok
    return [[set(row.tolist()) for row in torch.topk(torch.softmax(logits.float(), -1), k, dim=-1).indices]
            for logits in out.router_logits]


def test_window_hits_counts_the_docstring_example():
    windows, hits = window_hits(torch.tensor([[0], [0], [1], [3]]), experts=4, q_max=3)
    assert windows.tolist() == [4, 3, 2]
    assert hits.tolist() == [[2, 1, 0, 1], [2, 2, 0, 1], [2, 2, 0, 1]]  # q=3: {0,1}, {0,1,3}


def test_recorded_expert_windows_equal_a_brute_force_count_over_the_same_windows(make_checkpoint):
    model = load_model(make_checkpoint(**MOE))
    ids = torch.randint(0, 900, (40,), generator=torch.Generator().manual_seed(3))
    spans = [(5, 17), (22, 39)]
    q_max = 4
    recorder = RouterRecorder(model.target, q_max)
    try:
        assert recorder.active and len(recorder.routers) == 4 and recorder.experts == 8
        # The request as replay runs it: a prefix carried from an earlier request (positions 0..9), the rest
        # prefilled in chunks of 7; only positions >= 10 are this request's, so span (5, 17) counts from 10.
        first, kept = prefill(model.target, ids, chunk_size=7, keep_at=10)
        recorder.begin_request()
        prefill(model.target, ids, chunk_size=7, prefix=kept)
        recorder.end_request(10, spans)
        got = recorder.take()
    finally:
        recorder.close()
    windows, hits = brute_force(router_experts(model.target, ids), [(10, 17), (22, 39)], 8, q_max)
    assert got["windows"] == windows.tolist()
    assert np.array_equal(np.array(got["hits"]).reshape(q_max, 4, 8), hits)
    assert hits[0].sum() == windows[0] * 4 * 2  # q = 1: each token routes to k = 2 experts in each of 4 layers


def test_the_expected_distinct_experts_of_two_sequences_equal_an_enumeration_of_window_pairs():
    """ExpertCounts.distinct(B, q) = E over B windows drawn independently (with replacement) of |union of their experts|."""
    rng = np.random.default_rng(0)
    E, L, T, q = 6, 2, 12, 3
    per_token = [[set(rng.choice(E, 2, replace=False).tolist()) for _ in range(T)] for _ in range(L)]
    windows, hits = brute_force(per_token, [(0, T - 1)], E, q)
    counts = ExpertCounts(windows=windows, hits=hits)
    sets = [[set().union(*per_token[layer][t : t + q]) for t in range(T - q + 1)] for layer in range(L)]
    for B in (1, 2, 3):
        union = np.mean([np.mean([len(set().union(*combo)) for combo in itertools.product(sets[layer], repeat=B)])
                         for layer in range(L)])
        assert counts.distinct(B, q) == pytest.approx(union, rel=1e-12)
    assert counts.distinct(1, q + 1) is None  # past the recorded q


def test_a_moe_replay_stores_the_sessions_router_sums_and_a_dense_one_none(make_checkpoint, tmp_path):
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    run = replay([sessions], make_checkpoint(**MOE), tmp_path / "moe", ReplayOptions(k=2, device="cpu"))
    requests = pd.read_parquet(run / "requests.parquet").sort_values("request")
    routing = requests.routing.tolist()
    assert all(r is None for r in routing[:-1]) and routing[-1] is not None
    sums = routing[-1]
    assert (sums["q_max"], sums["layers"], sums["experts"]) == (3, 4, 8)
    # Brute force over the whole session: every request recomputed from scratch, windows of its spans.
    model = load_model(make_checkpoint(**MOE))
    windows, hits = np.zeros(3, dtype=np.int64), np.zeros((3, 4, 8), dtype=np.int64)
    for _, req in requests.iterrows():
        ids = torch.tensor(list(req.input_ids))
        w, h = brute_force(router_experts(model.target, ids), [(int(s["start"]), int(s["end"])) for s in req.spans], 8, 3)
        windows, hits = windows + w, hits + h
    assert list(sums["windows"]) == windows.tolist()
    assert np.array_equal(np.array(sums["hits"]).reshape(3, 4, 8), hits)
    dense = replay([sessions], make_checkpoint(), tmp_path / "dense", ReplayOptions(k=2, device="cpu"))
    assert "routing" not in pd.read_parquet(dense / "requests.parquet").columns


def test_a_moe_runs_report_reads_its_geometry_from_run_json_and_its_experts_from_the_router(make_checkpoint, tmp_path):
    import json
    import shutil

    from .test_report import cli

    checkpoint = make_checkpoint(**MOE)
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    run = replay([sessions], checkpoint, tmp_path / "moe", ReplayOptions(k=2, device="cpu"))
    shutil.rmtree(checkpoint)  # the report needs run.json's model.cost_geometry, not the checkpoint
    r = cli("report", str(run), "--format", "json", "--batch-sizes", "1,4")
    assert r.returncode in (0, 1), r.stderr
    batch = json.loads(r.stdout)["batch"]
    assert batch["source"] == "roofline" and batch["batch_sizes"] == [1, 4]
    experts = batch["experts"]
    assert (experts["source"], experts["experts"], experts["top_k"], experts["sessions"]) == ("router", 8, 2, 1)
    # one token routes to exactly k = 2 distinct experts in every layer; more tokens touch more, at most E = 8
    assert experts["measured"][0][0] == pytest.approx(2.0)
    flat = [x for row in experts["measured"] for x in row]
    assert all(2.0 <= x <= 8.0 for x in flat) and experts["measured"][1][2] > experts["measured"][0][0]
    assert "measured from the target's router" in batch["detail"]
