"""`mtp-observe probe`: the steps it times are the real ones, and the probe.json it writes is what the report reads."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mtp_observe.cost.inventory import take_inventory
from mtp_observe.cost.probe import (
    BatchTiming,
    Timing,
    batched_draft_step,
    batched_target_forward,
    expand_cache,
    fill_context,
    head_kv,
    target_forward,
    time_call,
)
from mtp_observe.model.checkpoint import read_checkpoint

from .handmade import hand_run_sessions, write_run

REPO = Path(__file__).resolve().parents[1]
CONTEXT = 40


@pytest.fixture(scope="module")
def context(tiny_model):
    return fill_context(tiny_model, CONTEXT, k=3)


def test_the_timed_decode_and_verify_continue_the_context(tiny_model, context):
    target = tiny_model.target
    whole = target(input_ids=context.ids[None, : CONTEXT + 4]).logits[0]  # one forward over context + 4 tokens
    for n in (1, 2, 4):  # the decode step, and the verify of K + 1 tokens for K = 1 and 3
        logits = target_forward(target, context, n, copy.deepcopy(context.cache))
        assert logits.shape == (n, target.config.vocab_size)
        assert (logits - whole[CONTEXT : CONTEXT + n]).abs().max() < 1e-4
    assert context.cache.get_seq_length() == CONTEXT  # the timed calls ran on copies


def test_without_a_fresh_cache_copy_a_repeated_decode_step_would_decode_something_else(tiny_model, context):
    # The negative control for copying outside the timer: a forward extends (and, in the linear-attention
    # layers, overwrites) the cache, so timing twice on one cache would time a different step.
    cache = copy.deepcopy(context.cache)
    first = target_forward(tiny_model.target, context, 1, cache)
    second = target_forward(tiny_model.target, context, 1, cache)
    assert cache.get_seq_length() == CONTEXT + 2
    assert (first - second).abs().max() > 1e-3


def test_the_timed_draft_step_is_the_heads_next_row(tiny_model, context):
    head = tiny_model.head
    # Row context-1 = (h_{context-1}, x_context) at position context-1, seeing rows 0..context-2: the row a
    # serving engine adds after the target emits x_context.
    states, ids, _ = head.decode_step(context.rows, CONTEXT - 1, context.hidden[CONTEXT - 1 :],
                                      context.ids[CONTEXT : CONTEXT + 1], torch.tensor([CONTEXT - 1]))
    reference = head.row_pass(context.hidden, context.ids[1 : CONTEXT + 1])
    assert (states[0] - reference.states[CONTEXT - 1]).abs().max() < 1e-5
    assert int(ids[0]) == int(head.logits(reference.states[CONTEXT - 1 :]).argmax(-1)[0])


def test_a_batched_draft_step_row_is_that_sequences_own_draft_step(tiny_model, context):
    head = tiny_model.head
    B = 3
    tokens = context.ids[CONTEXT : CONTEXT + 1].repeat(B)
    tokens[1] = (tokens[1] + 7) % head.geometry.vocab_size  # the sequences draft after different tokens
    hidden = context.hidden[CONTEXT - 1 :].expand(B, -1).contiguous()
    positions = torch.full((B,), CONTEXT - 1)
    states, ids, _ = batched_draft_step(head, head_kv(context.rows, CONTEXT - 1, B), hidden, tokens, positions)
    for b in range(B):
        one, one_id, _ = head.decode_step(context.rows, CONTEXT - 1, hidden[b : b + 1], tokens[b : b + 1], positions[b : b + 1])
        assert (states[b] - one[0]).abs().max() < 1e-5 and int(ids[b]) == int(one_id[0])
    assert (states[0] - states[1]).abs().max() > 1e-4  # each row saw its own token, not a shared one


def test_a_batched_verify_on_an_expanded_cache_is_each_sequences_own_verify(tiny_model, context):
    target = tiny_model.target
    new = torch.randint(0, 900, (3, 4), generator=torch.Generator().manual_seed(5))
    logits = batched_target_forward(target, new, expand_cache(context.cache, 3))
    assert logits.shape[:2] == (3, 4)
    for b in range(3):
        one = batched_target_forward(target, new[b : b + 1], copy.deepcopy(context.cache))[0]
        assert (logits[b] - one).abs().max() < 1e-4
    assert context.cache.get_seq_length() == CONTEXT


def test_a_verify_measured_faster_than_a_decode_is_flagged():
    def timing(ms):
        return Timing(median_s=ms / 1e3, samples_s=(ms / 1e3,))

    ok = BatchTiming(batch=4, draft_step=timing(1), target_decode=timing(10), verify=(timing(11), timing(12)))
    assert ok.flags() == []
    bad = BatchTiming(batch=4, draft_step=timing(1), target_decode=timing(10), verify=(timing(9.5), timing(12)))
    assert len(bad.flags()) == 1 and "faster than a decode of 1" in bad.flags()[0] and "batch 4" in bad.flags()[0]
    dips = BatchTiming(batch=8, draft_step=timing(1), target_decode=timing(10), verify=(timing(13), timing(12)))
    assert len(dips.flags()) == 1 and "faster than the verify of 2" in dips.flags()[0]


def test_time_call_warms_up_then_times_every_repeat_on_a_fresh_setup():
    calls, setups = [], []

    def setup():
        setups.append(len(setups))
        return setups[-1]

    timing = time_call(calls.append, setup, repeats=5, warmup=2, device="cpu")
    assert calls == list(range(7)) and len(setups) == 7  # each call got its own setup, warm-up first
    assert len(timing.samples_s) == 5 and all(s >= 0 for s in timing.samples_s)
    assert timing.median_s == sorted(timing.samples_s)[2]


PROBE_KEYS = {"probe_version", "tool", "created", "model", "device", "device_name", "cpu", "dtype", "context", "k",
              "batch", "repeats", "warmup", "timings_s", "samples_s", "verify", "draft_cost", "roofline", "versions",
              "notes", "batch_sizes", "batches"}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtp_observe", *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200"))


def test_probe_runs_on_cpu_and_writes_a_probe_json_the_report_reads(tiny_checkpoint, tmp_path):
    out = tmp_path / "probe.json"
    r = cli("probe", str(tiny_checkpoint), "--context", "48", "--k", "3", "--repeats", "3", "--device", "cpu", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "CPU figures do not stand for a GPU" in r.stdout and "draft step" in r.stdout
    probe = json.loads(out.read_text())
    assert set(probe) == PROBE_KEYS
    assert (probe["cpu"], probe["device"], probe["dtype"], probe["context"], probe["batch"]) == (True, "cpu", "float32", 48, 1)
    assert [(v["k"], v["tokens"], len(v["samples_s"])) for v in probe["verify"]] == [(1, 2, 3), (2, 3, 3), (3, 4, 3)]
    timings = probe["timings_s"]
    assert probe["draft_cost"] == pytest.approx(timings["draft_step"] / timings["target_decode"])
    for v in probe["verify"]:
        assert v["extra"] == pytest.approx(v["median_s"] / timings["target_decode"] - 1)
    # float32 roofline: 4 bytes a weight, so the stored (F32) ratio of the checkpoint's headers
    inventory = take_inventory(read_checkpoint(tiny_checkpoint))
    assert probe["roofline"]["precision"] == "F32"
    assert probe["roofline"]["draft_cost"] == pytest.approx(inventory.draft_cost("stored"))
    assert probe["model"]["config_sha256"] == read_checkpoint(tiny_checkpoint).config_sha256

    run = write_run(tmp_path / "run", hand_run_sessions(), k=2)
    r = cli("report", str(run), "--probe", str(out), "--format", "json")
    assert r.returncode == 0, r.stderr
    cost = json.loads(r.stdout)["cost"]
    assert cost["source"] == "probe" and cost["c"] == probe["draft_cost"]
    assert cost["verify_extra"] == pytest.approx([max(0.0, v["extra"]) for v in probe["verify"][:2]])
    assert any("do not stand for a GPU" in n for n in json.loads(r.stdout)["notes"])

    assert (probe["batch_sizes"], [b["batch"] for b in probe["batches"]]) == ([1], [1])
    assert probe["batches"][0]["target_decode"]["median_s"] == timings["target_decode"]

    page = (REPO / "docs" / "probe.md").read_text()
    section = page[page.index("`probe.json` (`probe_version` 2"):]
    for key in PROBE_KEYS:
        assert f"`{key}`" in section, f"docs/probe.md does not document probe.json's {key}"


def test_probe_option_mistakes_are_one_line(tiny_checkpoint):
    r = cli("probe", str(tiny_checkpoint), "--context", "1")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "--context 1" in r.stderr
    if not torch.cuda.is_available():
        r = cli("probe", str(tiny_checkpoint), "--device", "cuda")
        assert r.returncode == 2 and "no CUDA device" in r.stderr and r.stderr.strip().count("\n") == 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_probe_on_cuda_times_in_bfloat16_and_does_not_say_cpu(tiny_checkpoint):
    from mtp_observe.cost.probe import probe, probe_json

    data = probe_json(probe(tiny_checkpoint, context=256, k=2, device="cuda", repeats=5))
    assert (data["cpu"], data["dtype"], data["roofline"]["precision"]) == (False, "bfloat16", "BF16")
    assert data["timings_s"]["draft_step"] > 0 and data["timings_s"]["target_decode"] > 0
    assert not any("CPU" in n for n in data["notes"])


def test_a_probe_with_batch_sizes_is_the_report_s_table_in_place_of_the_roofline(tiny_checkpoint, tmp_path):
    out = tmp_path / "probe.json"
    r = cli("probe", str(tiny_checkpoint), "--context", "24", "--k", "2", "--repeats", "2", "--device", "cpu",
            "--batch", "2,4", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "by batch size" in r.stdout
    probe = json.loads(out.read_text())
    assert probe["probe_version"] == 2 and probe["batch_sizes"] == [1, 2, 4]  # batch 1 always
    # A run whose checkpoint is here: without --probe its table is the roofline at 1..128 ...
    run = write_run(tmp_path / "run", hand_run_sessions(), k=2, model_path=str(tiny_checkpoint))
    roof = json.loads(cli("report", str(run), "--format", "json").stdout)["batch"]
    assert roof["source"] == "roofline" and roof["batch_sizes"] == [1, 2, 4, 8, 16, 32, 64, 128]
    # ... and with it, the probe's measured steps: speedup = τ_sim(K) t(B,1) / (t(B,K+1) + K t_d(B)).
    r = cli("report", str(run), "--probe", str(out), "--format", "json", "--batch", "4")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    batch = data["batch"]
    assert batch["source"] == "probe" and batch["batch_sizes"] == [1, 2, 4] and batch["unit"] == "s"
    tau_sim = data["overall"]["value"]["tau_sim"]
    for i, b in enumerate(probe["batches"]):
        t1 = b["target_decode"]["median_s"]
        for K in (1, 2):
            tk = max(b["verify"][K - 1]["median_s"], t1)  # a verify measured faster than a decode is taken as one
            expected = tau_sim[K - 1] * t1 / (tk + K * b["draft_step"]["median_s"])
            assert batch["speedup"][i][K - 1] == pytest.approx(expected, rel=1e-9)
    # the gate and the slices are at batch 4; cost.c stays batch 1's
    assert data["verdict"]["batch"] == 4 and data["best"]["batch"] == 4
    assert data["cost"]["c"] == pytest.approx(probe["draft_cost"])
    assert data["cost"]["gated_c"] == pytest.approx(probe["batches"][2]["draft_cost"])
    assert data["overall"]["value"]["speedup"] == pytest.approx(batch["speedup"][2])
