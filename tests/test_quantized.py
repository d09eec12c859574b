"""Block-FP8 checkpoints replay exactly like the float checkpoint of their serving values q * scale; every
other quantisation is refused by name, never cast."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

from mtp_observe.cost.inventory import inventory_json, take_inventory
from mtp_observe.model import weights
from mtp_observe.model.checkpoint import read_checkpoint
from mtp_observe.model.loading import load_model
from mtp_observe.model.synthetic import quantize_fp8_blockwise, write_dequantised_copy, write_fp8_copy
from mtp_observe.model.weights import dequantize_blockwise
from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.pipeline import replay

from .fuzzing import run_cli as run_in_process
from .test_checkpoint import assert_one_line_exit_2, run_cli
from .test_replay import SESSION, write_sessions

# Dimensions over 128 in places, one not a multiple of 128: q_proj rows 2*4*32 = 256 (two whole blocks),
# dense MLP rows 200 and expert rows 160 (a whole block and a partial one), shared expert rows 136.
FAMILIES = {
    "dense": dict(intermediate_size=200),
    "qwen3_5_moe": dict(family="qwen3_5_moe", moe_intermediate_size=160, shared_expert_intermediate_size=136),
    "qwen3_next": dict(family="qwen3_next", layout="text", moe_intermediate_size=160, shared_expert_intermediate_size=136),
}


# --- the dequantisation, by value --------------------------------------------------------------


def test_block_dequantisation_scales_each_block_including_partial_ones_on_a_worked_example():
    q = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]).to(torch.float8_e4m3fn)
    scale = torch.tensor([[1.0, 10.0], [100.0, 1000.0]])
    got = dequantize_blockwise(q, scale, (2, 2))
    want = torch.tensor([[1.0, 2.0, 30.0], [4.0, 5.0, 60.0], [700.0, 800.0, 9000.0]])
    assert torch.equal(got, want)


@pytest.mark.parametrize("shape", [(200, 64), (256, 200), (3, 160, 64)])
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16])
def test_quantising_with_real_128_blocks_round_trips_within_e4m3_precision(shape, scale_dtype):
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    q, scale = quantize_fp8_blockwise(w, (128, 128), scale_dtype)
    assert q.dtype == torch.float8_e4m3fn and scale.dtype == scale_dtype
    assert scale.shape == (*shape[:-2], -(-shape[-2] // 128), -(-shape[-1] // 128))
    back = dequantize_blockwise(q, scale, (128, 128))
    assert ((back - w).abs() <= w.abs() * 2 ** -3 + 1e-2).all()  # e4m3 keeps 3 mantissa bits
    assert (back - w).abs().max() > 0  # and it is lossy: a cast would not be


def test_transformers_block_size_from_the_scale_grid_dequantises_a_200_row_weight_in_wrong_blocks():
    """Why the target is not loaded through transformers' FP8 dequantisation (checkpoint.py's module doc):
    200 rows over a 2-row scale grid read as 100-row blocks, so rows 100..127 take the second block's scale."""
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    w = torch.cat([torch.randn(128, 64), 10 * torch.randn(72, 64)])  # two blocks of very different scales
    q, scale = quantize_fp8_blockwise(w, (128, 128))
    ours = dequantize_blockwise(q, scale, (128, 128))
    theirs = Fp8Dequantize(None)._dequantize_one(q, scale, output_dtype=torch.float32)
    assert ((ours - w).abs() <= w.abs() * 2 ** -3 + 1e-2).all()
    assert torch.equal(theirs[:100], ours[:100]) and torch.equal(theirs[128:], ours[128:])
    assert theirs[100:128].abs().sum() / ours[100:128].abs().sum() > 5  # the wrong block's scale


# --- FP8 replays exactly like its serving values -------------------------------------------------


@pytest.fixture(scope="module")
def fp8_copies(make_checkpoint, tmp_path_factory):
    cache = {}

    def get(family: str, scale_dtype):
        key = (family, str(scale_dtype))
        if key not in cache:
            src = make_checkpoint(**FAMILIES[family])
            base = tmp_path_factory.mktemp(f"fp8-{family}")
            fp8 = write_fp8_copy(src, base / "fp8", scale_dtype)
            cache[key] = (src, fp8, write_dequantised_copy(fp8, base / "dequantised"))
        return cache[key]

    return get


def replay_rows(model_dir, out, fp8_activations="none"):
    """The rows of one replay; an FP8 checkpoint weight-only by default (the W8A8 path: tests/test_fp8_activations.py)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = write_sessions(out.parent / "s.jsonl", [SESSION])
    fp8 = read_checkpoint(model_dir).quantization is not None
    run = replay([path], model_dir, out, ReplayOptions(k=3, device="cpu", fp8_activations=fp8_activations if fp8 else None))
    return pd.read_parquet(run / "positions.parquet"), json.loads((run / "run.json").read_text())


def assert_same_rows(a: pd.DataFrame, b: pd.DataFrame, tol=1e-5):
    assert len(a) == len(b) > 100
    for column in a.columns:
        if a[column].dtype.kind == "f":
            assert (a[column] - b[column]).abs().max() <= tol, column
        else:
            assert (a[column] == b[column]).all(), column


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16], ids=["F32 scales", "BF16 scales"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_fp8_checkpoint_replays_with_exactly_the_rows_of_its_dequantised_float_copy(fp8_copies, tmp_path, family, scale_dtype):
    src, fp8, dequantised = fp8_copies(family, scale_dtype)
    info = read_checkpoint(fp8)
    assert info.quantization is not None and info.quantization.block == (128, 128)
    head_fp8 = [n for n in info.head_names if info.tensors[n].dtype == "F8_E4M3"]
    assert "mtp.layers.0.self_attn.q_proj.weight" in head_fp8 and "mtp.fc.weight" not in head_fp8
    assert any(".mlp." in n for n in head_fp8)  # the MLP or the experts are quantised too
    assert {info.tensors[n + "_scale_inv"].dtype for n in head_fp8} == {"F32" if scale_dtype == torch.float32 else "BF16"}
    rows, manifest = replay_rows(fp8, tmp_path / "fp8" / "run")
    float_rows, _ = replay_rows(dequantised, tmp_path / "float" / "run")
    assert_same_rows(rows, float_rows)
    assert manifest["model"]["numerics"].startswith("fp8 e4m3 weights (128x128 blocks")
    assert manifest["model"]["numerics"].endswith("dequantised to float32")
    # The FP8 rows are not the unquantised original's (e4m3 is lossy); how far, on a random tiny model
    # (-s prints it) and on the trained bundled model (benchmarks/fp8_distance.py), is in docs/inspect.md ("Quantised checkpoints").
    original, _ = replay_rows(src, tmp_path / "original" / "run")
    gap = (rows.target_logprob - original.target_logprob).abs().max()
    print(f"\n{family} {scale_dtype}: vs the unquantised original, target tokens equal "
          f"{(rows.target_token == original.target_token).mean():.3f}, drafts equal "
          f"{(rows.draft_token == original.draft_token).mean():.3f}, max |d target_logprob| {gap:.4f}")
    assert gap > 1e-4


def test_casting_fp8_codes_to_weights_fails_that_equality(fp8_copies, tmp_path, monkeypatch):
    """Today's failure mode (before block-FP8 was read): codes cast to weights, block scales dropped."""
    src, fp8, dequantised = fp8_copies("qwen3_5_moe", torch.float32)
    float_rows, _ = replay_rows(dequantised, tmp_path / "float" / "run")
    monkeypatch.setattr(weights, "dequantize_blockwise", lambda q, scale, block: q.float())
    rows, _ = replay_rows(fp8, tmp_path / "cast" / "run")
    with pytest.raises(AssertionError):
        assert_same_rows(rows, float_rows)
    assert (rows.target_token == float_rows.target_token).mean() < 0.5


def test_the_fp8_targets_weights_are_the_dequantised_ones_and_its_experts_are_fused_once(fp8_copies):
    _, fp8, dequantised = fp8_copies("qwen3_next", torch.bfloat16)
    a, b = load_model(fp8), load_model(dequantised)
    sa, sb = a.target.state_dict(), b.target.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in sa)
    assert not any("scale_inv" in k for k in sa)


def test_inspect_shows_the_heads_quantisation_coverage_and_scales(fp8_copies):
    _, fp8, _ = fp8_copies("qwen3_5_moe", torch.bfloat16)
    report = inventory_json(take_inventory(read_checkpoint(fp8)))
    storage = report["head"]["storage"]
    fp8_names = {g["name"] for g in storage["fp8_tensors"]}
    kept = {g["name"] for g in storage["float_tensors"]}
    assert "mtp.layers.0.mlp.experts.gate_up_proj" in fp8_names and "mtp.layers.0.self_attn.o_proj.weight" in fp8_names
    assert {"mtp.fc.weight", "mtp.layers.0.mlp.gate.weight", "mtp.layers.0.mlp.shared_expert_gate.weight", "mtp.norm.weight"} <= kept
    assert storage["scale_dtype"] == "BF16" and len(storage["scale_tensors"]) == len(storage["fp8_tensors"])
    assert storage["precision"].startswith("block-FP8 e4m3 (128x128)")
    assert report["quantization"]["method"] == "fp8" and "mtp.fc" in report["quantization"]["modules_to_not_convert"]
    assert "dequantised" in report["numerics"]


# --- what is refused, by name ----------------------------------------------------------------


def with_config(src, dst, edit):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("qc, needles", [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, ["'gptq'", "GPTQ"]),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, ["'modelopt'", "NVFP4"]),
    ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}, ["'compressed-tensors'", "nvfp4-pack-quantized"]),
    ({"quant_method": "awq", "bits": 4}, ["'awq'", "AWQ"]),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, ["'bitsandbytes'"]),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, ["per-tensor FP8", "weight_block_size"]),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "fmt": "e5m2"}, ["fmt", "e5m2"]),
])
def test_an_unsupported_quantisation_is_exit_2_in_one_line_naming_the_method(tiny_checkpoint, tmp_path, qc, needles):
    d = with_config(tiny_checkpoint, tmp_path / "c", lambda c: c.__setitem__("quantization_config", qc))
    path = write_sessions(tmp_path / "s.jsonl", [SESSION])
    for args in (("inspect", d), ("replay", path, "--model", d, "--out", tmp_path / "run"), ("probe", d, "--context", "8")):
        code, _, err = run_in_process([str(a) for a in args])
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
        assert all(n in lines[0] for n in ("config.json", *needles)), lines[0]


def test_an_nvfp4_modelopt_checkpoint_is_refused_by_its_hf_quant_config(tiny_checkpoint, tmp_path):
    d = tmp_path / "c"
    shutil.copytree(tiny_checkpoint, d)
    (d / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4"}}))
    assert_one_line_exit_2(run_cli("inspect", d), "hf_quant_config.json", "NVFP4")


def single_file(src, dst, edit):
    shutil.copytree(src, dst)
    tensors = {}
    for f in sorted(dst.glob("*.safetensors")):
        tensors |= load_file(str(f))
        f.unlink()
    (dst / "model.safetensors.index.json").unlink(missing_ok=True)
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


@pytest.mark.parametrize("name, dtype", [
    ("mtp.layers.0.self_attn.q_proj.weight", torch.uint8),
    ("model.language_model.layers.1.self_attn.o_proj.weight", torch.int32),
    ("mtp.layers.0.mlp.down_proj.weight", torch.int8),
])
def test_packed_integer_weights_are_refused_by_name_never_cast(tiny_checkpoint, tmp_path, name, dtype):
    d = single_file(tiny_checkpoint, tmp_path / "c", lambda t: t.__setitem__(name, t[name].to(dtype)))
    tag = {torch.uint8: "U8", torch.int32: "I32", torch.int8: "I8"}[dtype]
    assert_one_line_exit_2(run_cli("inspect", d), name, f"stored as {tag}", "never casts")


def test_fp8_tensors_without_a_quantization_config_are_refused(tiny_checkpoint, tmp_path):
    name = "mtp.layers.0.self_attn.k_proj.weight"
    d = single_file(tiny_checkpoint, tmp_path / "c", lambda t: t.__setitem__(name, t[name].to(torch.float8_e4m3fn)))
    assert_one_line_exit_2(run_cli("inspect", d), name, "F8_E4M3", "no quantization_config")


def test_a_missing_or_misshapen_block_scale_is_named(fp8_copies, tmp_path):
    _, fp8, _ = fp8_copies("dense", torch.float32)
    scale = "mtp.layers.0.mlp.gate_proj.weight_scale_inv"
    missing = single_file(fp8, tmp_path / "missing", lambda t: t.pop(scale))
    assert_one_line_exit_2(run_cli("inspect", missing), scale, "missing", "[2, 1]")
    wrong = single_file(fp8, tmp_path / "wrong", lambda t: t.__setitem__(scale, torch.ones(1, 1)))
    assert_one_line_exit_2(run_cli("inspect", wrong), scale, "[1, 1]", "expected [2, 1]")


def test_an_fp8_tensor_of_a_module_kept_unquantised_is_refused(fp8_copies, tmp_path):
    _, fp8, _ = fp8_copies("dense", torch.float32)
    d = with_config(fp8, tmp_path / "c", lambda c: c["quantization_config"]["modules_to_not_convert"].append("mtp.layers.0.self_attn"))
    assert_one_line_exit_2(run_cli("inspect", d), "mtp.layers.0.self_attn", "modules_to_not_convert")
