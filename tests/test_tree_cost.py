"""The cost of a tree: a verify of T tokens and S draft steps, S-1 of them over TOPK tokens per sequence — in the
roofline, in probe.json, and in the Cost the report's tree rows are summarised with."""

from __future__ import annotations

import numpy as np
import pytest

from mtp_observe.cost.geometry import geometry_of_checkpoint
from mtp_observe.cost.roofline import DEVICES, draft_step, roofline_times
from mtp_observe.cost.speedup import StepTimes, batch1_times, step_times_from_probe, tree_denominator, tree_speedup
from mtp_observe.report import tree_cost
from mtp_observe.report.denominator import CostTable


@pytest.fixture(scope="module")
def geometry(tiny_checkpoint):
    from mtp_observe.model.checkpoint import read_checkpoint

    return geometry_of_checkpoint(read_checkpoint(tiny_checkpoint))


def test_a_topk_1_tree_with_s_plus_1_tokens_costs_what_the_chain_costs_at_k_equal_s(geometry):
    times = roofline_times(geometry, DEVICES["h200"], (1, 4, 64), 6, 2048.0, widths=(2, 4))
    for S in (1, 3, 5):
        chain = 1 + S * times.draft_cost() + times.verify_extra(S)[:, S - 1]
        assert np.allclose(tree_denominator(times, S, 1, S + 1), chain, rtol=1e-12)


def test_the_worked_example_of_tree_denominator():
    times = batch1_times(0.1, np.array([0.0] * 6 + [0.05]), "draft-cost", "test")
    times = StepTimes(**{**times.__dict__, "draft_width": {4: np.array([0.12])}})
    assert tree_denominator(times, 3, 4, 8)[0] == pytest.approx(1.05 + 0.1 + 2 * 0.12)
    assert tree_speedup(np.array([2.78]), times, 3, 4, 8)[0, 0] == pytest.approx(2.78 / 1.39)


def test_the_roofline_charges_a_frontier_step_as_b_times_topk_rows_and_a_longer_verify_for_more_tokens(geometry):
    device = DEVICES["h100"]
    times = roofline_times(geometry, device, (1, 8), 9, 4096.0, widths=(4,))
    for i, B in enumerate((1, 8)):
        nbytes, flops = draft_step(geometry, 4 * B, 4096.0)
        assert times.draft_at(4)[i] == pytest.approx(max(nbytes / device.bandwidth, flops / device.peak(geometry.fp8)))
        assert times.draft_at(4)[i] > times.draft[i]  # each slot reads its sequence's KV
    assert (tree_denominator(times, 3, 4, 9) > tree_denominator(times, 3, 4, 5)).all()
    assert times.draft_width_source(4) == "roofline" and times.draft_width_source(3) == "interpolated"


def test_without_a_measured_frontier_step_it_is_interpolated_at_batch_b_times_topk():
    times = StepTimes(batch=(1, 2, 4), target=np.ones((3, 4)), draft=np.array([0.2, 0.3, 0.5]), source="probe", detail="")
    assert times.draft_at(2).tolist() == pytest.approx([0.3, 0.5, 0.9])  # batch 2, 4, and 8 along the last two
    assert times.draft_width_source(2) == "interpolated"


def test_a_probe_with_trees_times_a_verify_of_t_tokens_and_a_frontier_step_and_the_report_charges_them(tiny_checkpoint):
    from mtp_observe.cost.probe import probe, probe_json
    from mtp_observe.drafting.tree import parse_tree

    data = probe_json(probe(tiny_checkpoint, context=24, k=2, device="cpu", repeats=2, warmup=1, batch=(2,),
                            trees=(parse_tree("3,2,6"),)))
    assert data["trees"] == ["tree:3,2,6"] and data["k"] == 5  # the verify reaches T = 6 tokens
    for b in data["batches"]:
        assert [v["tokens"] for v in b["verify"]] == [2, 3, 4, 5, 6]
        assert [w["width"] for w in b["draft_width"]] == [2] and b["draft_width"][0]["median_s"] > 0
    times = step_times_from_probe(data, "probe.json")
    assert times.draft_width_source(2) == "measured"
    table = CostTable(times=times, legacy=None, context=None, experts=None, k_max=3)
    tree = {"name": "tree:3,2,6", "steps": 3, "topk": 2, "draft_tokens": 6}
    for i, B in enumerate(times.batch):
        row = data["batches"][i]
        t1 = row["target_decode"]["median_s"]
        want = (max(row["verify"][4]["median_s"], t1) + row["draft_step"]["median_s"]
                + 2 * row["draft_width"][0]["median_s"]) / t1
        cost = tree_cost(table, tree, B)
        assert 1 + 3 * cost.c + cost.verify_extra[2] == pytest.approx(want, rel=1e-9)
        assert np.isnan(cost.verify_extra[:2]).all()  # a tree at fewer steps is another configuration


def test_a_head_of_several_layers_is_charged_one_layer_per_draft_step(make_checkpoint):
    from mtp_observe.cost.inventory import take_inventory
    from mtp_observe.model.checkpoint import read_checkpoint

    one, three = (read_checkpoint(make_checkpoint(mtp_layers=n)) for n in (1, 3))
    assert geometry_of_checkpoint(three).head_dense_bytes == geometry_of_checkpoint(one).head_dense_bytes
    assert take_inventory(three).head_step_bytes() == take_inventory(one).head_step_bytes()
    assert take_inventory(three).head_bytes() > take_inventory(one).head_bytes()  # the file holds all three
