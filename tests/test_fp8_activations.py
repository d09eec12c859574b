"""Block-FP8 as served: activations quantised per token per group (W8A8) by the rule of the kernel vLLM picks on the
serve device, weights re-quantised to power-of-two scales where vLLM does it at load — pinned by value, and in a
replay (the target's and the head's linears both)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from mtp_observe.errors import OptionError
from mtp_observe.model.checkpoint import linear_rules, read_checkpoint
from mtp_observe.model.fp8 import W8A8Weight, quantise_activations, requantise_ue8m0, rule_of, w8a8
from mtp_observe.model.loading import load_model
from mtp_observe.model.serving import LinearRule, linear_rule, serving_numerics
from mtp_observe.model.synthetic import write_fp8_copy
from mtp_observe.model.target import prefill_hidden
from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.pipeline import replay

from .test_replay import SESSION, write_sessions

X = torch.tensor([[1.0, -2.0, 0.5, 3.0]])


def test_amax_over_448_scales_each_group_and_rounds_to_e4m3_by_value():
    # module doc of fp8.py: amax 3, scale 3/448; x/scale = [149.33, -298.67, 74.67, 448] -> e4m3 [144, -288, 72, 448]
    got = quantise_activations(X, "amax/448", 4)
    assert torch.allclose(got, torch.tensor([[144.0, -288.0, 72.0, 448.0]]) * (3.0 / 448.0), rtol=0, atol=1e-7)
    # groups of 2: [1, -2] has amax 2 (1 / (2/448) = 224 and -448 are exact), [0.5, 3] amax 3 (74.67 -> 72)
    got = quantise_activations(X, "amax/448", 2)
    assert torch.allclose(got, torch.tensor([[1.0, -2.0, 72 * 3 / 448, 3.0]]), rtol=0, atol=1e-7)
    # per token: a second row is its own group
    two = quantise_activations(torch.cat([X, 10 * X]), "amax/448", 4)
    assert torch.allclose(two[1], 10 * two[0], rtol=1e-6)


def test_ue8m0_rounds_the_scale_up_to_a_power_of_two():
    # 3/448 = 0.0067 -> 2^-7: x / s = [128, -256, 64, 384], all e4m3 values: x comes back exactly
    assert torch.equal(quantise_activations(X, "ue8m0", 4), X)
    # 1.1 / 2^-7 = 140.8 -> 144 (steps of 16 in [128, 256)) -> 1.125; with amax/448: 164.3 -> 160 -> 1.0714
    x = torch.tensor([[1.1, 3.0]])
    assert quantise_activations(x, "ue8m0", 2)[0, 0].item() == 1.125
    assert quantise_activations(x, "amax/448", 2)[0, 0].item() == pytest.approx(160 * 3 / 448, abs=1e-7)


def test_the_two_fp32_rules_differ_where_the_eps_floor_applies_and_a_zero_group_stays_zero():
    # vLLM's per_token_group_quant_fp8 floors amax at 1e-10: 1e-12 / (1e-10 / 448) = 4.48 -> 4.5 (steps of 0.5)
    tiny = torch.tensor([[1e-12, 0.0]], dtype=torch.float32)
    assert quantise_activations(tiny, "amax/448", 2)[0, 0].item() == pytest.approx(4.5e-10 / 448, rel=1e-6)
    # FlashInfer's 448 / amax has no floor: the largest value maps to 448 exactly and comes back
    assert quantise_activations(tiny, "448/amax", 2)[0, 0].item() == pytest.approx(1e-12, rel=1e-6)
    zeros = torch.zeros(1, 4)
    for rule in ("amax/448", "448/amax", "ue8m0"):
        assert torch.equal(quantise_activations(zeros, rule, 4), zeros)
    assert torch.equal(quantise_activations(X, "none", 4), X)


def test_a_group_past_the_last_multiple_is_a_group_of_its_own_and_the_dtype_is_kept():
    x = torch.tensor([[1.0, -2.0, 0.5, 3.0, 0.1, 0.2]], dtype=torch.float64)
    got = quantise_activations(x, "amax/448", 4)
    assert got.dtype == torch.float64
    assert torch.allclose(got[:, :4], quantise_activations(X, "amax/448", 4).double())
    # [0.1, 0.2]: amax 0.2 -> 0.2 maps to 448, 0.1 to 224: both exact
    assert torch.allclose(got[0, 4:], torch.tensor([0.1, 0.2], dtype=torch.float64), rtol=1e-6)


def test_weights_requantised_to_power_of_two_block_scales_by_value():
    # one 2x2 block, amax 3 -> s = 2^-7: 1.1 -> 1.125, 3 -> 3, -0.3 / 2^-7 = -38.4 -> -40 (steps of 4 in [32, 64))
    w = torch.tensor([[1.1, 3.0], [-0.3, 0.0]])
    assert torch.allclose(requantise_ue8m0(w, (2, 2)), torch.tensor([[1.125, 3.0], [-40 / 128, 0.0]]))
    # blocks are independent; the amax floor is 1e-4 (a tiny block keeps scale 2^-22 >= 1e-4 / 448)
    w = torch.tensor([[1.1, 3.0, 1e-6, 0.0]])
    got = requantise_ue8m0(w, (1, 2))
    assert got[0, 0].item() == 1.125 and got[0, 2].item() == pytest.approx(round(1e-6 * 2 ** 22) / 2 ** 22, rel=1e-6)


def test_a_w8a8_weight_quantises_its_linears_input_and_keeps_its_rule_through_to_and_parameter():
    torch.manual_seed(0)
    x, w = torch.randn(5, 256), torch.randn(64, 256)
    rule = LinearRule("test", "amax/448", "checkpoint", 128)
    qw = w8a8(w, rule)
    expected = F.linear(quantise_activations(x, "amax/448", 128), w)
    assert torch.equal(F.linear(x, qw), expected) and not torch.equal(F.linear(x, w), expected)
    moved = torch.nn.Parameter(qw.to(torch.float64), requires_grad=False)
    assert isinstance(moved, W8A8Weight) and rule_of(moved) == rule
    linear = torch.nn.Linear(256, 64, bias=False)
    linear.weight = torch.nn.Parameter(qw, requires_grad=False)
    assert torch.equal(linear(x), expected)
    assert w8a8(w, LinearRule("weight-only", "none", "checkpoint", 128)) is w


def test_the_serve_device_picks_the_rule_vllm_runs_there():
    h100 = serving_numerics("h100", None, quantized=True)
    assert (h100.fp8_activations, h100.top_k_ties) == ("dynamic", "index")
    assert linear_rule(h100, "qwen3_5_text", 256, 256, (128, 128)) == \
        LinearRule("FlashInfer+DeepGEMM, M < 32 (FlashInfer)", "448/amax", "ue8m0", 128)
    assert linear_rule(h100, "qwen3_5_text", 256, 192, (128, 128)).kernel == "CUTLASS"  # K % 128 != 0
    b200 = serving_numerics("b200", None, quantized=True)
    assert linear_rule(b200, "qwen3_5_text", 256, 256, (128, 128)).activations == "amax/448"  # DeepGEMM off for Qwen3.5
    assert linear_rule(b200, "deepseek_v3", 256, 256, (128, 128)) == LinearRule("DeepGEMM (UE8M0)", "ue8m0", "ue8m0", 128)
    a100 = serving_numerics("a100", None, quantized=True)
    assert a100.fp8_activations == "none" and linear_rule(a100, None, 256, 256, (128, 128)).activations == "none"
    assert serving_numerics("cpu", "dynamic", quantized=True).top_k_ties == "all"
    assert serving_numerics("h100").fp8_activations is None  # not a block-FP8 checkpoint
    with pytest.raises(OptionError, match="--serve-device mi300x"):
        serving_numerics("mi300x", None, quantized=True)
    with pytest.raises(OptionError, match="--serve-device tpu"):
        serving_numerics("tpu")
    with pytest.raises(OptionError, match="--fp8-activations static"):
        serving_numerics("h100", "static", quantized=True)


@pytest.fixture(scope="module")
def fp8_checkpoint(make_checkpoint, tmp_path_factory):
    """A tiny checkpoint with hidden 128 (so vLLM's DeepGEMM shapes apply to some linears) in block-FP8."""
    src = make_checkpoint(hidden_size=128, intermediate_size=256)
    return write_fp8_copy(src, tmp_path_factory.mktemp("fp8-w8a8") / "fp8")


def test_the_target_and_the_head_quantise_every_fp8_linears_input_as_forward_hooks_would(fp8_checkpoint):
    """The loaded W8A8 model equals the weight-only one with each block-FP8 linear's input quantised by a hook
    (and its weights re-quantised where the rule says): every FP8 linear of the target and of the head is covered."""
    info = read_checkpoint(fp8_checkpoint)
    serving = serving_numerics("h100", None, quantized=True)
    rules = linear_rules(info, serving)
    assert {r.weights for r in rules.values()} == {"ue8m0", "checkpoint"}  # both shapes occur
    served = load_model(fp8_checkpoint, serving=serving)
    assert sum(isinstance(p, W8A8Weight) for p in served.target.parameters()) + \
        sum(isinstance(p, W8A8Weight) for p in served.head.parameters()) == len(rules)
    ids = torch.randint(0, 1000, (40,))
    plain = load_model(fp8_checkpoint)  # weight-only
    hooks = []
    for name, module in plain.target.named_modules():
        key = next((n for n in rules if not n.startswith("mtp.") and n.endswith(name.removeprefix("model.") + ".weight")),
                   None)
        if isinstance(module, torch.nn.Linear) and key is not None:
            rule = rules[key]
            if rule.weights == "ue8m0":
                module.weight.data = requantise_ue8m0(module.weight.data, (128, 128))
            hooks.append(module.register_forward_pre_hook(
                lambda m, args, rule=rule: (quantise_activations(args[0], rule.activations, rule.group),)))
    assert len(hooks) == sum(1 for n in rules if not n.startswith("mtp."))
    assert torch.equal(prefill_hidden(served.target, ids), prefill_hidden(plain.target, ids))
    assert not torch.equal(prefill_hidden(served.target, ids), prefill_hidden(load_model(fp8_checkpoint).target, ids))
    hidden = prefill_hidden(served.target, ids)
    rows = served.head.row_pass(hidden[:-1], ids[1:])
    unquantised = plain.head.row_pass(hidden[:-1], ids[1:])
    assert not torch.equal(rows.states, unquantised.states)  # the head's linears quantise too


def test_a_replay_records_the_serving_numerics_and_w8a8_moves_the_rows(fp8_checkpoint, tmp_path):
    path = write_sessions(tmp_path / "s.jsonl", [SESSION])
    served = replay([path], fp8_checkpoint, tmp_path / "w8a8", ReplayOptions(k=2, device="cpu"))
    weight_only = replay([path], fp8_checkpoint, tmp_path / "weight-only",
                         ReplayOptions(k=2, device="cpu", fp8_activations="none"))
    serving = json.loads((served / "run.json").read_text())["serving"]
    assert serving["device"] == "h100" and serving["fp8_activations"] == "dynamic" and serving["top_k_ties"] == "index"
    assert serving["linears"]["FlashInfer+DeepGEMM, M < 32 (FlashInfer): activations 448/amax, weights ue8m0"] > 0
    assert json.loads((weight_only / "run.json").read_text())["serving"]["fp8_activations"] == "none"
    a, b = (pd.read_parquet(r / "positions.parquet") for r in (served, weight_only))
    assert len(a) == len(b) and (a.target_logprob - b.target_logprob).abs().max() > 1e-4
    assert (a.draft_logprob - b.draft_logprob).abs().max() > 1e-4


def test_fp8_activations_on_a_checkpoint_that_is_not_fp8_is_refused_in_one_line(tiny_checkpoint, tmp_path):
    path = write_sessions(tmp_path / "s.jsonl", [SESSION])
    with pytest.raises(OptionError, match="--fp8-activations dynamic: the checkpoint is not block-FP8") as refused:
        replay([path], tiny_checkpoint, tmp_path / "r", ReplayOptions(k=1, device="cpu", fp8_activations="dynamic"))
    assert "\n" not in str(refused.value)
