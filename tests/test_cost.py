"""The cost model: the roofline by hand, measured tables in its place, monotonic sanity, the engine schedule."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mtp_observe.cost.geometry import Geometry, config_tensors, geometry_from_tensors, geometry_of_checkpoint
from mtp_observe.cost.roofline import DEVICES, ExpertCounts, expected_distinct, parse_device, roofline_times
from mtp_observe.cost.speedup import (
    batch_speedup,
    best_k,
    break_even,
    check_schedule,
    parse_batches,
    parse_gated,
    schedule,
    speedup,
)
from mtp_observe.errors import OptionError
from mtp_observe.model.checkpoint import read_checkpoint

from .handmade import hand_run_sessions, random_sessions, write_run
from .test_report import cli

# A dense geometry with round numbers: 1e9 parameters in BF16 read whole, a 1e8-parameter lm_head inside them,
# a 5e7-parameter head; two full-attention layers (8 heads, 2 KV heads, d = 128) and two Gated DeltaNet layers
# (2 key heads, 4 value heads, dk = dv = 64, kernel 4, float32 state).
DENSE = Geometry(
    precision="BF16", fp8=False, dense_bytes=2_000_000_000, embedding_row_bytes=0, expert_bytes=0, moe_layers=0,
    experts=0, top_k=0, dense_params=1_000_000_000, expert_params=0, lm_head_bytes=200_000_000,
    lm_head_params=100_000_000, head_dense_bytes=100_000_000, head_dense_params=50_000_000, head_expert_bytes=0,
    head_expert_params=0, head_experts=0, full_layers=2, num_heads=8, num_kv_heads=2, head_dim=128, linear_layers=2,
    linear_key_heads=2, linear_value_heads=4, linear_key_dim=64, linear_value_dim=64, conv_kernel=4, ssm_bytes=4,
)
# The same, with two MoE layers of E = 8 experts, top-2, 1e7 bytes (5e6 parameters) per expert, and a MoE head.
MOE = replace(DENSE, expert_bytes=10_000_000, moe_layers=2, experts=8, top_k=2, expert_params=5_000_000,
              head_expert_bytes=10_000_000, head_expert_params=5_000_000, head_experts=8)
DEVICE = parse_device("1000,100")  # 1e12 B/s, 1e14 FLOP/s


def hand(B: int, q: int, ctx: int, distinct: float = 0.0, moe: bool = False) -> float:
    """One target step of DENSE/MOE written out term by term (the module docstring's formulas, by hand)."""
    N = B * q
    weights = 2e9 + 10e6 * 2 * distinct                        # dense weights + experts x 2 MoE layers
    kv = (B * ctx + N) * (2 * 2 * 2 * 128 * 2)                   # 2 layers x K,V x 2 heads x 128 x BF16 = 2048 B/token
    state = B * 2 * ((4 * 64 * 64 * 4) * (1 + q) + 512 * 2 * (3 + q))  # 2 layers: 64 KiB state r+w q, conv 512 wide
    flops = 2 * (1e9 + (2 * 5e6 * 2 if moe else 0)) * N + N * 2 * 4 * 8 * 128 * (ctx + (q + 1) / 2) + N * 2 * 6 * 4 * 64 * 64
    return max((weights + kv + state) / 1e12, flops / 1e14)


def hand_draft(B: int, ctx: int, moe: bool) -> float:
    distinct = 8 * (1 - 0.75 ** B) if moe else 0
    weights = 1e8 + 2e8 + 10e6 * distinct
    kv = (B * ctx + B) * (2 * 2 * 128 * 2)
    flops = 2 * (5e7 + 1e8 + (2 * 5e6 if moe else 0)) * B + B * 4 * 8 * 128 * (ctx + 1)
    return max((weights + kv) / 1e12, flops / 1e14)


def test_the_dense_roofline_at_two_batch_and_k_points_is_the_hand_computation():
    t = roofline_times(DENSE, DEVICE, (1, 256), q_max=3, context=1000)
    # (B = 1, K = 2): memory-bound everywhere; 2.00232 ms decode, 2.00259 ms verify of 3, 0.301 ms draft.
    assert t.target[0, 0] == pytest.approx(hand(1, 1, 1000, 0), rel=1e-12) == pytest.approx(2.002320384e-3, rel=1e-12)
    assert t.target[0, 2] == pytest.approx(hand(1, 3, 1000, 0), rel=1e-12) == pytest.approx(2.00259072e-3, rel=1e-12)
    assert t.draft[0] == pytest.approx(hand_draft(1, 1000, False), rel=1e-12) == pytest.approx(3.01025024e-4, rel=1e-12)
    tau = np.array([1.8, 2.5])
    s = batch_speedup(tau, t)
    assert s[0, 1] == pytest.approx(2.5 * 2.002320384e-3 / (2.00259072e-3 + 2 * 3.01025024e-4), rel=1e-12)  # 1.9219
    # (B = 256, K = 1): compute-bound (2e9 FLOPs a token: 5.1 ms against 2.5 ms of bytes; the draft 0.85 against 0.33).
    assert [t.bound[1, 0], t.bound[1, 1], t.draft_bound[1]] == ["compute", "compute", "compute"]
    expected = 1.8 * hand(256, 1, 1000, 0) / (hand(256, 2, 1000, 0) + hand_draft(256, 1000, False))
    assert s[1, 0] == pytest.approx(expected, rel=1e-12)
    assert s[1, 0] < 1.0  # compute-bound, a verify of 2 tokens costs two decodes: K = 1 at τ 1.8 loses


def test_the_moe_roofline_charges_the_distinct_experts_of_b_times_q_tokens():
    t = roofline_times(MOE, DEVICE, (1, 4), q_max=2, context=500)
    # E = 8, k = 2: one token touches 2 experts, two tokens 8(1 - 0.75^2) = 3.5, eight tokens 8(1 - 0.75^8) = 7.20
    assert expected_distinct(8, 2, 1) == pytest.approx(2.0) and expected_distinct(8, 2, 2) == pytest.approx(3.5)
    assert t.target[0, 0] == pytest.approx(hand(1, 1, 500, 2.0, moe=True), rel=1e-12)
    assert t.target[0, 1] == pytest.approx(hand(1, 2, 500, 3.5, moe=True), rel=1e-12)
    assert t.target[1, 1] == pytest.approx(hand(4, 2, 500, 8 * (1 - 0.75 ** 8), moe=True), rel=1e-12)
    assert t.draft[1] == pytest.approx(hand_draft(4, 500, True), rel=1e-12)
    # (B = 1, K = 1) at τ = 1.7: the verify reads 1.5 more experts per layer than the decode
    assert batch_speedup(np.array([1.7]), t)[0, 0] == pytest.approx(
        1.7 * hand(1, 1, 500, 2.0, moe=True) / (hand(1, 2, 500, 3.5, moe=True) + hand_draft(1, 500, True)), rel=1e-12)


def test_measured_routing_replaces_the_formula_in_the_roofline():
    # one MoE layer measured concentrated: a window of 1 token touches 2 experts of 8, of 2 tokens 3 (not 3.5)
    counts = ExpertCounts(windows=np.array([10, 9]), hits=np.array([[[10, 10, 0, 0, 0, 0, 0, 0]], [[9, 9, 9, 0, 0, 0, 0, 0]]]))
    assert counts.distinct(1, 2) == pytest.approx(3.0)  # hits 9, 9, 9 of 9 windows
    t = roofline_times(MOE, DEVICE, (1,), q_max=2, context=500, experts=counts)
    assert t.target[0, 1] == pytest.approx(hand(1, 2, 500, 3.0, moe=True), rel=1e-12)
    assert "measured from the target's router" in t.detail


@pytest.mark.parametrize("geometry", [DENSE, MOE], ids=["dense", "moe"])
def test_at_fixed_tau_speedup_does_not_rise_with_batch_size_once_compute_bound(geometry):
    batch = tuple(2 ** i for i in range(15))  # 1 .. 16384
    t = roofline_times(geometry, DEVICE, batch, q_max=5, context=2000)
    s = batch_speedup(np.array([1.7, 2.3, 2.7, 3.0]), t)  # [NB, 4]
    compute = [i for i in range(len(batch)) if all(b == "compute" for b in t.bound[i]) and t.draft_bound[i] == "compute"]
    assert len(compute) >= 3, "the regime under test must exist on this device"
    for i, j in zip(compute, compute[1:]):
        assert np.all(s[j] <= s[i] * (1 + 1e-12)), (batch[i], batch[j], s[i], s[j])
    assert s[compute[0]].max() < s[0].max()  # and compute-bound is worse than batch 1, where verifying is ~free


def test_the_schedule_never_picks_a_k_whose_speedup_is_below_one():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 9)
        batch = tuple(sorted(rng.sample(range(1, 300), n)))
        speedups = np.array([[rng.uniform(0.5, 1.6) for _ in range(4)] for _ in batch])
        ks = [best_k(row) for row in speedups]
        ranges = schedule(batch, ks)
        check_schedule(ranges, max(ks))
        for b, row, k in zip(batch, speedups, ks):
            (chosen,) = [r[2] for r in ranges if r[0] <= b <= r[1]]
            assert chosen == k
            assert chosen == 0 or row[chosen - 1] > 1.0
            assert chosen == 0 or row[chosen - 1] == row.max()
            assert chosen != 0 or row.max() <= 1.0
    assert schedule((1, 2, 4, 8), [3, 3, 2, 0]) == [[1, 3, 3], [4, 7, 2], [8, 8, 0]]  # the docstring's example
    assert schedule((2, 16), [1, 1]) == [[1, 16, 1]]  # the first range starts at 1 whatever the smallest B


def test_best_k_is_zero_when_nothing_beats_one():
    assert best_k(np.array([0.9, 0.99, 1.0])) == 0
    assert best_k(np.array([np.nan, np.nan])) == 0
    assert best_k(np.array([0.9, 1.01, 1.01])) == 2  # the smallest K on ties


def test_the_break_even_tau_is_where_speedup_is_one():
    t = roofline_times(MOE, DEVICE, (1, 8, 64), q_max=4, context=300)
    tau_star = break_even(t, 3)  # [NB, 3]
    for i in range(3):
        for K in range(1, 4):
            tau = np.full(3, 2.0)
            tau[K - 1] = tau_star[i, K - 1]
            assert batch_speedup(tau, t)[i, K - 1] == pytest.approx(1.0, rel=1e-12)


def test_a_drafter_with_its_own_cost_plugs_in_and_the_formula_stays_the_same():
    t = roofline_times(DENSE, DEVICE, (1, 4), q_max=3, context=100)
    free = t.with_draft(np.zeros(2), "model-free drafter (no GPU work)")
    tau = np.array([1.5, 1.9])
    assert batch_speedup(tau, free) == pytest.approx(tau[None, :] / (1 + t.verify_extra(2)))
    assert speedup(np.array([2.2, 2.2]), 0.1, np.zeros(2))[1] == pytest.approx(2.2 / 1.2)  # the docstring's example


def test_the_config_alone_gives_the_geometry_a_real_checkpoint_has(make_checkpoint):
    for spec in ({}, {"family": "qwen3_5_moe"}):
        info = read_checkpoint(make_checkpoint(**spec))
        real = geometry_of_checkpoint(info)
        family = spec.get("family", "qwen3_5")
        built = geometry_from_tensors(info.text_config, config_tensors(info.text_config, family), False, "BF16", False)
        assert built == real
        assert real.full_layers == 2 and real.linear_layers == 2
        assert (real.moe_layers, real.experts, real.top_k) == ((4, 8, 2) if spec else (0, 0, 0))


def test_device_specs_name_a_row_or_bandwidth_and_peak():
    assert (parse_device("H200").bandwidth, parse_device("h200").bf16) == (4800e9, 989.4e12)
    assert set(DEVICES) == {"h100", "h200", "b200", "a100", "l40s", "mi300x"}
    custom = parse_device("4800,989")
    assert (custom.bandwidth, custom.peak(True), custom.peak(False)) == (4800e9, 989e12, 989e12)
    assert DEVICES["a100"].peak(fp8=True) == 312e12  # no FP8 tensor cores: the BF16 peak
    for bad in ("h300", "4800", "0,1", "a,b"):
        with pytest.raises(OptionError, match="--device-spec"):
            parse_device(bad)
    assert parse_batches("8,1,4,4") == (1, 4, 8) and parse_gated("1-16") == (1, 16) and parse_gated("4") == (4, 4)
    for bad in ("0", "8-4", "x"):
        with pytest.raises(OptionError, match="--batch"):
            parse_gated(bad)


# ---------------------------------------------------------------------------------------------
# In the report


def report_json(*args) -> dict:
    r = cli("report", *map(str, args), "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def test_the_report_tables_speedup_by_batch_size_from_the_roofline_with_tau_sims_intervals(make_checkpoint, tmp_path):
    run = write_run(tmp_path / "run", random_sessions(12, 3, 0.75, seed=2), k=3, model_path=str(make_checkpoint()))
    data = report_json(run, "--device-spec", "h200", "--context", "2000")
    b = data["batch"]
    assert b["source"] == "roofline" and "H200" in b["detail"] and b["context"] == 2000
    assert b["batch_sizes"] == [1, 2, 4, 8, 16, 32, 64, 128] and len(b["speedup"]) == 8 and len(b["speedup"][0]) == 3
    tau, lo, hi = data["overall"]["value"]["tau_sim"], data["overall"]["lo"]["tau_sim"], data["overall"]["hi"]["tau_sim"]
    for i in range(8):
        for K in range(1, 4):
            den = 1 + K * b["draft_cost"][i] + b["verify_extra"][i][K - 1]
            assert b["speedup"][i][K - 1] == pytest.approx(tau[K - 1] / den, rel=1e-9)
            # a monotone map of τ_sim: its percentiles are τ_sim's percentiles mapped
            assert b["speedup_lo"][i][K - 1] == pytest.approx(lo[K - 1] / den, rel=1e-6)
            assert b["speedup_hi"][i][K - 1] == pytest.approx(hi[K - 1] / den, rel=1e-6)
            assert b["break_even_tau"][i][K - 1] == pytest.approx(den, rel=1e-12)
        assert b["best_k"][i] == best_k(np.array(b["speedup"][i]))
    assert b["num_speculative_tokens_per_batch_size"] == schedule(tuple(b["batch_sizes"]), b["best_k"])
    config = b["speculative_config"]
    assert config["method"] == "mtp" and config["num_speculative_tokens"] == max(b["best_k"])
    assert data["cost"]["c"] == pytest.approx(b["draft_cost"][0])  # batch 1's c, as before batch sizes
    assert data["verdict"]["serves"]  # the schedule's config is written only for a verdict that serves
    md = cli("report", str(run), "--device-spec", "h200", "--format", "markdown", "--details").stdout
    assert "### speedup by batch size" in md and "num_speculative_tokens_per_batch_size" in md


def test_the_gate_over_a_batch_range_is_judged_at_each_size_and_binds_at_the_worst(make_checkpoint, tmp_path):
    run = write_run(tmp_path / "run", random_sessions(12, 3, 0.7, seed=3), k=3, model_path=str(make_checkpoint()))
    data = report_json(run, "--device-spec", "4800,2", "--batch", "2-32", "--gate", "speedup>=1")
    verdicts = data["verdict"]["batches"]
    assert [v["batch"] for v in verdicts] == [2, 4, 8, 16, 32]
    lowest = min(verdicts, key=lambda v: ({"UNRELIABLE": 0, "NO-GO": 1, "GO": 2}[v["status"]], v["lower"]))
    assert data["verdict"]["batch"] == lowest["batch"] == data["best"]["batch"]
    assert data["verdict"]["status"] == lowest["status"] and data["verdict"]["lower"] == pytest.approx(lowest["lower"])
    i = data["batch"]["batch_sizes"].index(lowest["batch"])
    assert data["overall"]["value"]["speedup"] == pytest.approx(data["batch"]["speedup"][i])  # the slices are there
    assert all(v["reason"].startswith(f"at batch {v['batch']}:") for v in verdicts)
    # a batch size the table lacks is one line
    r = cli("report", str(run), "--draft-cost", "0.1", "--batch", "4")
    assert r.returncode == 2 and "batch sizes 1" in r.stderr and r.stderr.count("\n") == 1


def test_when_no_k_beats_one_the_best_k_is_zero_and_the_schedule_says_so(tmp_path):
    run = write_run(tmp_path / "run", hand_run_sessions(), k=2, draft_cost=3.0)
    data = report_json(run)
    assert data["verdict"]["run_k"] == 0 and data["best"]["k"] == 1 and data["best"]["speedup"] < 1
    assert data["batch"]["best_k"] == [0]
    assert data["batch"]["num_speculative_tokens_per_batch_size"] == [[1, 1, 0]]
    assert data["batch"]["speculative_config"] is None
    text = cli("report", str(run), "--details").stdout
    assert "K to run: 0" in text.splitlines()[0] and "serve without --speculative-config" in text


def test_a_run_without_geometry_or_checkpoint_has_a_batch_one_table_and_says_why(tmp_path):
    run = write_run(tmp_path / "run", hand_run_sessions(), k=2)
    data = report_json(run)
    assert data["batch"]["batch_sizes"] == [1] and data["batch"]["unit"] == "decode steps"
    assert any("no model.cost_geometry" in n for n in data["batch"]["notes"])
    assert data["cost"]["c"] == 0.1  # run.json's bytes ratio, as before


def test_a_device_spec_with_a_measured_cost_is_refused(tmp_path):
    run = write_run(tmp_path / "run", hand_run_sessions(), k=2)
    r = cli("report", str(run), "--draft-cost", "0.1", "--device-spec", "h100")
    assert r.returncode == 2 and "pass one of them" in r.stderr


def test_the_cost_pages_worked_example_is_what_the_example_script_computes():
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("cost_examples", root / "benchmarks" / "cost_examples.py")
    examples = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(examples)
    page = (root / "docs" / "cost.md").read_text()
    section = page[page.index("## Worked example: 27B dense and 35B-A3B MoE on an H200"):]
    for name in examples.MODELS:
        assert examples.markdown(name) in section, f"docs/cost.md's {name} table is not the script's output"
    # the published numbers the geometries come from
    dense, moe = examples.geometry("27B dense"), examples.geometry("35B-A3B MoE")
    assert (dense.full_layers, dense.linear_layers, dense.num_kv_heads, dense.head_dim) == (16, 48, 4, 256)
    assert (moe.moe_layers, moe.experts, moe.top_k, moe.full_layers) == (40, 256, 8, 10)
    assert 26.8e9 < dense.dense_params + dense.vocab_size * dense.hidden_size < 27.0e9  # 26.9 B with the embedding
    assert 2.9e9 < moe.active_params < 3.0e9  # "A3B"


def test_the_plot_gains_a_speedup_by_batch_size_panel_when_the_table_has_batch_sizes(make_checkpoint, tmp_path):
    import struct

    def width(png: Path) -> int:
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        return struct.unpack(">I", data[16:20])[0]  # IHDR width

    by_batch = write_run(tmp_path / "roof", random_sessions(12, 3, 0.75, seed=2), k=3, model_path=str(make_checkpoint()))
    batch_one = write_run(tmp_path / "one", random_sessions(12, 3, 0.75, seed=2), k=3)
    for run, name in ((by_batch, "three.png"), (batch_one, "two.png")):
        r = cli("report", str(run), "--plot", str(tmp_path / name), "--format", "json")
        assert r.returncode == 0, r.stderr
    # four panels (acceptance, tokens per step, speedup, speedup by batch size) against three: 20 in against 15 in at
    # 110 dpi
    assert width(tmp_path / "three.png") == 2200 and width(tmp_path / "two.png") == 1650


def test_the_cost_pages_cpu_probe_table_is_flagged_as_cpu_and_its_schedule_is_its_best_ks():
    readme = (Path(__file__).resolve().parents[1] / "docs" / "cost.md").read_text()
    heading = "## Measured: the bundled model on this CPU (flagged: CPU figures, not a GPU's)"
    section = readme[readme.index(heading):].split("\n## ", 1)[0]
    assert "--device cpu" in section and "do not stand for a GPU's" in section
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| ") and line[2].isdigit()]
    batch, ks = tuple(int(r[0]) for r in rows), [int(r[-2]) for r in rows]
    for r, k in zip(rows, ks):  # the best K is the row's largest speedup above 1, else 0
        speedups = np.array([float(cell.split("[")[0]) for cell in r[3:-2]])
        assert k == best_k(speedups)
    line = next(x for x in section.splitlines() if x.startswith("num_speculative_tokens_per_batch_size:"))
    assert json.loads(line.split(":", 1)[1]) == schedule(batch, ks)


def test_the_roofline_charges_mlas_latent_cache_and_its_absorbed_attention(make_checkpoint):
    from mtp_observe.cost.roofline import draft_step, target_step

    info = read_checkpoint(make_checkpoint(family="deepseek_v3", layout="text"))
    g = geometry_of_checkpoint(info)
    kv_lora, rope, nh, layers = 16, 8, 4, 4
    assert (g.kv_width, g.attention_width, g.full_layers) == (kv_lora + rope, 2 * kv_lora + rope, layers)
    b0, f0 = target_step(g, 2, 3, 0, 2.0)
    b1, f1 = target_step(g, 2, 3, 1000, 2.0)
    assert b1 - b0 == 2 * 1000 * layers * (kv_lora + rope) * 2  # B·C cached tokens read, BF16 latent + rope key
    assert f1 - f0 == pytest.approx(2 * 3 * layers * 2 * nh * (2 * kv_lora + rope) * 1000)  # N tokens × C keys
    d0, _ = draft_step(g, 1, 0)
    d1, _ = draft_step(g, 1, 1000)
    assert d1 - d0 == 1000 * (kv_lora + rope) * 2  # the head's one layer
