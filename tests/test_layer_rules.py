"""Every shipped MTP layer: a head with three layers, both layer rules pinned by value against a head computed layer
by layer, and replayed side by side into one run."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from mtp_observe.drafting.layer_rules import STEPWISE, layer_rows, stepwise_chain
from mtp_observe.model.loading import load_model
from mtp_observe.model.target import prefill_hidden
from mtp_observe.report import read_and_summarize, report_json
from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.pipeline import replay

from .head_checks import reference
from .test_replay import SESSION, write_sessions

LAYERS = 3
N = 60
ANCHORS = [1, 2, 3, 9, 30, 57]  # 1 and 2: layers 1 and 2 reach rows before the request's first


@pytest.fixture(scope="module")
def three_layers(make_checkpoint):
    return make_checkpoint(mtp_layers=LAYERS)


@pytest.fixture(scope="module")
def model(three_layers):
    return load_model(three_layers)


@pytest.fixture(scope="module")
def request_tokens(model):
    ids = torch.randint(0, model.info.geometry.vocab_size, (N,), generator=torch.Generator().manual_seed(5))
    return ids, prefill_hidden(model.target, ids, chunk_size=32)


def test_the_checkpoint_writer_makes_a_head_of_distinct_layers_that_loads(model):
    head = model.head
    assert model.info.geometry.num_layers == LAYERS and len(head.layers) == LAYERS
    w = head.named_weights()
    assert {f"layers.{i}.self_attn.q_proj.weight" for i in range(LAYERS)} <= set(w)
    assert not torch.equal(w["layers.0.self_attn.q_proj.weight"], w["layers.1.self_attn.q_proj.weight"])
    assert not torch.equal(w["layers.1.mlp.down_proj.weight"], w["layers.2.mlp.down_proj.weight"])
    assert "layers.1.fc.weight" not in w and "fc.weight" in w  # fc and the norms are shared (vLLM's Qwen3.5 MTP)


def test_layer_i_at_step_i_equals_a_head_computed_layer_by_layer(model, request_tokens):
    from .reference_tree import reference_stepwise

    ids, hidden = request_tokens
    head = model.head
    rows = head.row_pass(hidden[:-1], ids[1:], chunk_size=16)
    layers = layer_rows(head, rows, ids, chunk_size=16)
    anchors = torch.tensor(ANCHORS)
    drafts = stepwise_chain(head, layers, anchors, torch.full_like(anchors, LAYERS), attention_budget=2048)
    ref = reference(model)
    for a, p in enumerate(ANCHORS):
        assert drafts.tokens[a].tolist() == reference_stepwise(ref, hidden, ids, p, LAYERS), f"anchor {p}"


def test_layer_0_at_every_step_equals_the_reference_chain_and_differs_from_layer_i_at_step_i(model, request_tokens):
    ids, hidden = request_tokens
    head = model.head
    rows = head.row_pass(hidden[:-1], ids[1:])
    anchors = torch.arange(1, N - LAYERS)
    chain = head.chain(rows, anchors, torch.full_like(anchors, LAYERS))
    stepwise = stepwise_chain(head, layer_rows(head, rows, ids), anchors, torch.full_like(anchors, LAYERS))
    ref = reference(model)
    for a in range(0, len(anchors), 7):
        tokens, _ = ref.draft(hidden, ids, int(anchors[a]), LAYERS)  # layer 0 only
        assert chain.tokens[a].tolist() == tokens
    assert torch.equal(chain.tokens[:, 0], stepwise.tokens[:, 0])  # depth 1 is layer 0 under both rules
    assert (chain.tokens[:, 1:] != stepwise.tokens[:, 1:]).float().mean() > 0.5  # distinct layers draft otherwise


def test_a_replay_of_a_multi_layer_head_writes_both_rules_and_the_report_shows_them(three_layers, model, tmp_path):
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    run = replay([sessions], three_layers, tmp_path / "run", ReplayOptions(k=4, device="cpu"))
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["schema_version"] == 6 and manifest["trees"] == []
    assert [(r["rule"], r["drafter"], r["k"]) for r in manifest["layer_rules"]] == [
        ("layer0", "mtp", None), ("stepwise", STEPWISE, 3)]
    rows = pd.read_parquet(run / "positions.parquet")
    assert set(rows.drafter) == {"mtp", STEPWISE}
    step = rows[rows.drafter == STEPWISE]
    assert set(step.draft_k) == {3} and step.depth.max() == 3
    # the stepwise rows are stepwise_chain's drafts at the same anchors
    req = pd.read_parquet(run / "requests.parquet").iloc[0]
    ids = torch.tensor(list(req.input_ids))
    hidden = prefill_hidden(model.target, ids, chunk_size=2048)
    head = model.head
    r0 = head.row_pass(hidden[:-1], ids[1:])
    first = step[(step.request == req.request) & (step.depth == 1)].sort_values("pos")
    anchors = torch.tensor(first.pos.to_numpy())
    spans = [(int(s["start"]), int(s["end"])) for s in req.spans]
    depths = torch.tensor([min(3, next(e for s, e in spans if s <= p < e) - p) for p in anchors.tolist()])
    drafts = stepwise_chain(head, layer_rows(head, r0, ids), anchors, depths)
    got = step[step.request == req.request].sort_values(["pos", "depth"])
    want = [int(drafts.tokens[a, k]) for a in range(len(anchors)) for k in range(int(depths[a]))]
    assert got.draft_token.tolist() == want
    doc = report_json(read_and_summarize(run, replicates=50).report)
    rules = {r["rule"]: r for r in doc["layer_rules"]}
    assert set(rules) == {"layer0", "stepwise"} and len(rules["stepwise"]["alpha"]) == 3
    assert rules["layer0"]["alpha"] == doc["overall"]["value"]["alpha"]  # the chain's rows are layer 0's
    assert doc["trees"] == [] and doc["report_version"] == 3
