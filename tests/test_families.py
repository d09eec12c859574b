"""The MoE family and Qwen3-Next: the head's sparse MoE MLP pinned by value, both expert layouts, routing
readings that must fail, rope scaling, and the checkpoint refusals particular to these families."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from mtp_observe.model.checkpoint import read_checkpoint
from mtp_observe.model.loading import load_model
from mtp_observe.model.mtp import rotary_frequencies, route, routed_experts, zero_centred_rms_norm
from mtp_observe.model.target import prefill_hidden

from .head_checks import SAMPLE_ANCHORS, K, assert_wrong_reading_differs, product_drafts, reference
from .reference_head import Reading
from .test_checkpoint import assert_one_line_exit_2, run_cli

N_TOKENS = 200
MOE = dict(family="qwen3_5_moe")  # Qwen3.5-35B-A3B-like: VLM wrapper, fused experts, renormalised routing
MOE_PER_EXPERT = dict(family="qwen3_5_moe", expert_layout="per_expert")
NEXT = dict(family="qwen3_next", layout="text")  # Qwen3-Next-80B-A3B-like: text-only, per-expert, norm_topk_prob true
NEXT_UNNORMALISED = dict(family="qwen3_next", layout="text", norm_topk_prob=False)


@pytest.fixture(scope="module")
def models(make_checkpoint):
    cache = {}

    def get(**spec):
        key = json.dumps(spec, sort_keys=True)
        if key not in cache:
            model = load_model(make_checkpoint(**spec))
            ids = torch.randint(0, model.info.geometry.vocab_size, (N_TOKENS,), generator=torch.Generator().manual_seed(7))
            cache[key] = (model, ids, prefill_hidden(model.target, ids, chunk_size=64))
        return cache[key]

    return get


# --- routing, pinned by value ----------------------------------------------------------------


def test_routing_is_softmax_in_fp32_then_top_k_then_renormalised_on_a_worked_example():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    w, e = route(logits, 2, norm_topk_prob=True)
    assert e.tolist() == [[0, 1]] and torch.allclose(w, torch.tensor([[0.7311, 0.2689]]), atol=1e-4)
    w, e = route(logits, 2, norm_topk_prob=False)
    assert torch.allclose(w, torch.tensor([[0.6439, 0.2369]]), atol=1e-4)  # not (0.731, 0.269): top-k after softmax
    w, _ = route(logits.bfloat16(), 2, norm_topk_prob=False)
    assert w.dtype == torch.float32


def test_rows_grouped_by_expert_equal_a_per_row_loop():
    gen = torch.Generator().manual_seed(0)
    E, H, inter, n, k = 6, 16, 12, 37, 3
    x = torch.randn(n, H, generator=gen)
    gate_up, down = torch.randn(E, 2 * inter, H, generator=gen), torch.randn(E, H, inter, generator=gen)
    weights, experts = route(torch.randn(n, E, generator=gen), k, True)
    got = routed_experts(x, weights, experts, gate_up, down)
    for i in range(n):
        want = sum(float(weights[i, j]) * (torch.nn.functional.silu(gate_up[e, :inter] @ x[i]) * (gate_up[e, inter:] @ x[i])) @ down[e].T
                   for j, e in enumerate(experts[i].tolist()))
        assert torch.allclose(got[i], want, atol=1e-4), i


@pytest.mark.parametrize("spec", [MOE, NEXT_UNNORMALISED], ids=["qwen3_5_moe", "qwen3_next_unnormalised"])
def test_the_head_moe_mlp_equals_transformers_own_sparse_moe_block(models, spec):
    model, _, _ = models(**spec)
    head = model.head
    if model.info.family.model_type == "qwen3_next":
        from transformers import Qwen3NextConfig as Config
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextSparseMoeBlock as Block
    else:
        from transformers import Qwen3_5MoeTextConfig as Config
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeSparseMoeBlock as Block
    text = {k: v for k, v in model.info.text_config.items() if not k.startswith("mtp_") and k != "model_type"}
    block = Block(Config(**text)).eval()
    block.load_state_dict({k.removeprefix("layers.0.mlp."): v for k, v in head.named_weights().items() if ".mlp." in k})
    x = torch.randn(300, head.geometry.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = block(x[None])[0]
    ours = head.mlp(x)
    assert (ours - theirs).abs().max() < 1e-5


def transformers_head_layer(model):
    """transformers' own decoder layer for the family, built as full attention with the head's weights, and its rotary."""
    text = {k: v for k, v in model.info.text_config.items() if not k.startswith("mtp_") and k != "model_type"}
    text = dict(text, num_hidden_layers=1, layer_types=["full_attention"])
    if model.info.family.model_type == "qwen3_next":
        from transformers import Qwen3NextConfig as Config
        from transformers.models.qwen3_next.modeling_qwen3_next import (
            Qwen3NextDecoderLayer as Layer,
            Qwen3NextRotaryEmbedding as Rotary,
        )
        text.pop("full_attention_interval", None)
    elif model.info.family.model_type.startswith("qwen3_5_moe"):
        from transformers import Qwen3_5MoeTextConfig as Config
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (
            Qwen3_5MoeDecoderLayer as Layer,
            Qwen3_5MoeTextRotaryEmbedding as Rotary,
        )
    else:
        from transformers import Qwen3_5TextConfig as Config
        from transformers.models.qwen3_5.modeling_qwen3_5 import (
            Qwen3_5DecoderLayer as Layer,
            Qwen3_5TextRotaryEmbedding as Rotary,
        )
    cfg = Config(**text)
    cfg._attn_implementation = "eager"
    layer = Layer(cfg, 0).eval()
    layer.load_state_dict({k.removeprefix("layers.0."): v for k, v in model.head.named_weights().items() if k.startswith("layers.0.")})
    return layer, Rotary(cfg)


def assert_head_layer_equals_transformers(model, ids, hidden):
    head = model.head
    layer, rotary = transformers_head_layer(model)
    n = ids.shape[0] - 1
    z = head.fc_input(hidden[:-1], ids[1:])
    positions = torch.arange(n)[None]
    cos_sin = rotary(z[None], positions)
    causal = torch.full((n, n), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        out = layer(z[None], position_embeddings=cos_sin, attention_mask=causal, position_ids=positions)
        theirs = zero_centred_rms_norm(out[0] if isinstance(out, tuple) else out[0], head.norm, head.geometry.rms_norm_eps)
    ours = head.row_pass(hidden[:-1], ids[1:], chunk_size=50).states
    assert (ours - theirs).abs().max() < 1e-5
    ours_logits, theirs_logits = head.logits(ours), head.logits(theirs)
    assert torch.equal(ours_logits.argmax(-1), theirs_logits.argmax(-1))
    assert (ours_logits - theirs_logits).abs().max() < 1e-5


@pytest.mark.parametrize("spec", [MOE, NEXT], ids=["qwen3_5_moe", "qwen3_next"])
def test_the_moe_head_layer_equals_transformers_decoder_layer_built_as_full_attention(models, spec):
    assert_head_layer_equals_transformers(*models(**spec))


@pytest.mark.parametrize("spec", [MOE, NEXT], ids=["qwen3_5_moe", "qwen3_next"])
def test_the_cached_moe_head_equals_a_plain_recomputation_at_every_anchor(models, spec):
    model, ids, hidden = models(**spec)
    anchors = list(range(1, N_TOKENS))
    tokens, logits = product_drafts(model.head, ids, hidden, anchors)
    ref = reference(model, text_config=model.info.text_config)
    worst = 0.0
    for a, p in enumerate(anchors):
        ref_tokens, ref_logits = ref.draft(hidden, ids, p, K)
        assert tokens[a].tolist() == ref_tokens, f"anchor {p}"
        worst = max(worst, float((logits[a] - ref_logits).abs().max()))
    assert worst < 1e-5, worst


def assert_moe_reading_differs(model, ids, hidden, reading: Reading):
    assert_wrong_reading_differs(model, ids, hidden, reading, text_config=model.info.text_config)


def test_top_k_weights_are_renormalised_when_norm_topk_prob_is_true(models):
    model = models(**MOE)
    assert model[0].head.geometry.moe.norm_topk_prob
    assert_moe_reading_differs(*model, Reading(no_renormalise=True))


def test_without_renormalisation_the_softmax_comes_before_the_top_k(models):
    model = models(**NEXT_UNNORMALISED)
    assert not model[0].head.geometry.moe.norm_topk_prob
    assert_moe_reading_differs(*model, Reading(topk_before_softmax=True))


def test_gate_up_proj_holds_the_gate_rows_first(models):
    assert_moe_reading_differs(*models(**MOE), Reading(up_gate_swapped=True))


def test_the_shared_expert_is_scaled_by_the_sigmoid_of_its_gate(models):
    assert_moe_reading_differs(*models(**MOE), Reading(no_shared_sigmoid=True))


def test_the_shared_expert_is_added(models):
    assert_moe_reading_differs(*models(**NEXT), Reading(no_shared_expert=True))


# --- both expert layouts ---------------------------------------------------------------------


def test_fused_and_per_expert_layouts_give_identical_drafts_and_target_states(models):
    fused, ids, hidden = models(**MOE)
    split, ids2, hidden2 = models(**MOE_PER_EXPERT)
    assert fused.info.expert_layout == "fused" and split.info.expert_layout == "per_expert"
    assert any(".experts.0.gate_proj.weight" in n for n in split.info.tensors)
    target_a, target_b = fused.target.state_dict(), split.target.state_dict()
    assert target_a.keys() == target_b.keys() and all(torch.equal(target_a[k], target_b[k]) for k in target_a)
    head_a, head_b = fused.head.named_weights(), split.head.named_weights()
    assert head_a.keys() == head_b.keys() and all(torch.equal(head_a[k], head_b[k]) for k in head_a)
    # Equal weights, but not the same memory: CPU kernels may round a last bit differently.
    assert torch.equal(ids, ids2) and (hidden - hidden2).abs().max() < 1e-5
    a, la = product_drafts(fused.head, ids, hidden, list(range(1, N_TOKENS)))
    b, lb = product_drafts(split.head, ids, hidden2, list(range(1, N_TOKENS)))
    assert torch.equal(a, b) and (la - lb).abs().max() < 1e-4


def test_neither_the_head_nor_the_target_holds_its_experts_twice(models):
    model, _, _ = models(**MOE_PER_EXPERT)
    info = model.info
    storages = {}
    for t in [*model.target.parameters(), *model.target.buffers(), *model.head.parameters(), *model.head.buffers()]:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    loaded = {n: e for n, e in info.tensors.items() if not n.startswith("model.visual.")}
    weights = 4 * sum(e.numel for e in loaded.values())  # float32, every text and head tensor once
    buffers = sum(b.numel() * b.element_size() for b in [*model.target.buffers(), *model.head.buffers()])
    assert weights <= sum(storages.values()) <= weights + buffers
    g = info.geometry.moe
    assert model.head.mlp.gate_up.untyped_storage().nbytes() == 4 * g.num_experts * 2 * g.moe_intermediate_size * info.geometry.hidden_size


# --- which head is MoE, and what the geometry needs ----------------------------------------------


def test_a_moe_text_config_needs_no_dense_intermediate_size(make_checkpoint):
    info = read_checkpoint(make_checkpoint(**MOE))
    assert "intermediate_size" not in info.text_config
    assert info.geometry.intermediate_size is None and info.geometry.moe.num_experts == 8
    assert info.model_type == "qwen3_5_moe" and info.layout == "vlm"


@pytest.mark.parametrize("extra, moe", [({}, True), ({"mlp_only_layers": [0]}, False), ({"decoder_sparse_step": 2}, False),
                                        ({"mlp_only_layers": [1, 2]}, True)])
def test_the_qwen3_next_head_is_moe_exactly_when_vllm_builds_layer_0_as_moe(extra, moe):
    from mtp_observe.model.families import geometry_from_config
    from mtp_observe.model.synthetic import SyntheticSpec

    g = geometry_from_config("qwen3_next", SyntheticSpec(**NEXT, extra=extra).text_config())
    assert (g.moe is not None) == moe and (g.intermediate_size is None) == moe


def test_a_qwen3_5_moe_config_that_turns_renormalisation_off_is_refused(make_checkpoint, tmp_path):
    d = tmp_path / "c"
    shutil.copytree(make_checkpoint(**MOE), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["text_config"]["norm_topk_prob"] = False
    (d / "config.json").write_text(json.dumps(cfg))
    assert_one_line_exit_2(run_cli("inspect", d), "config.json", "norm_topk_prob", "always renormalises")


def edited(src, dst, edit):
    shutil.copytree(src, dst)
    tensors = {}
    for f in sorted(dst.glob("*.safetensors")):
        tensors |= load_file(str(f))
        f.unlink()
    (dst / "model.safetensors.index.json").unlink(missing_ok=True)
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


@pytest.mark.parametrize("spec, name, shape, expected", [
    (MOE, "mtp.layers.0.mlp.experts.gate_up_proj", (8, 48, 64), "[8, 96, 64]"),
    (MOE, "mtp.layers.0.mlp.experts.down_proj", (8, 64, 40), "[8, 64, 48]"),
    (MOE_PER_EXPERT, "mtp.layers.0.mlp.experts.3.up_proj.weight", (40, 64), "[48, 64]"),
    (MOE, "mtp.layers.0.mlp.gate.weight", (7, 64), "[8, 64]"),
    (NEXT, "mtp.layers.0.mlp.shared_expert_gate.weight", (2, 64), "[1, 64]"),
])
def test_a_misshapen_expert_tensor_is_one_line_naming_it_with_expected_and_found(make_checkpoint, tmp_path, spec, name, shape, expected):
    d = edited(make_checkpoint(**spec), tmp_path / "c", lambda t: t.__setitem__(name, torch.zeros(shape)))
    found = "[" + ", ".join(map(str, shape)) + "]"
    assert_one_line_exit_2(run_cli("inspect", d), name, found, f"expected {expected}")


@pytest.mark.parametrize("spec, name", [
    (MOE, "mtp.layers.0.mlp.experts.down_proj"),
    (MOE_PER_EXPERT, "mtp.layers.0.mlp.experts.7.down_proj.weight"),
    (NEXT, "mtp.layers.0.mlp.shared_expert.up_proj.weight"),
])
def test_a_missing_expert_tensor_is_one_line_naming_it(make_checkpoint, tmp_path, spec, name):
    d = edited(make_checkpoint(**spec), tmp_path / "c", lambda t: t.pop(name))
    assert_one_line_exit_2(run_cli("inspect", d), name, "missing", "expected shape")


def test_experts_stored_in_both_layouts_at_once_are_refused(make_checkpoint, tmp_path):
    def both(t):
        t["mtp.layers.0.mlp.experts.0.gate_proj.weight"] = torch.zeros(48, 64)

    d = edited(make_checkpoint(**MOE), tmp_path / "c", both)
    assert_one_line_exit_2(run_cli("inspect", d), "both fused", "per expert")


# --- rope scaling ------------------------------------------------------------------------------

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}


@pytest.mark.parametrize("params", [
    YARN,
    dict(YARN, beta_fast=16, beta_slow=2, truncate=False),
    dict(YARN, attention_factor=1.3),
    dict(YARN, mscale=0.9, mscale_all_dim=0.7),
    dict(YARN, factor=None),
    {"rope_type": "linear", "factor": 2.5},
])
def test_the_heads_rope_frequencies_equal_transformers_own(params):
    from transformers import Qwen3_5TextConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from mtp_observe.model.families import geometry_from_config
    from mtp_observe.model.synthetic import SyntheticSpec

    tc = SyntheticSpec(head_dim=64, rope_theta=1e6).text_config()
    tc["max_position_embeddings"] = 512
    tc["rope_parameters"] = dict(tc["rope_parameters"], **params)
    ours, ours_scale = rotary_frequencies(geometry_from_config("qwen3_5", tc))
    cfg = Qwen3_5TextConfig(**{k: v for k, v in tc.items() if not k.startswith("mtp_")})
    theirs, theirs_scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg)
    assert ours.shape == theirs.shape == (8,)
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=0) and abs(ours_scale - theirs_scale) < 1e-12
    plain, _ = rotary_frequencies(geometry_from_config("qwen3_5", SyntheticSpec(head_dim=64, rope_theta=1e6).text_config()))
    assert not torch.allclose(ours, plain)  # the scaling changes something this test can see


def test_a_yarn_head_layer_equals_transformers_decoder_layer_with_yarn_rotary(make_checkpoint):
    spec = dict(extra={"max_position_embeddings": 4096, "rope_parameters": {
        "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32, "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1], "mrope_interleaved": True}})
    model = load_model(make_checkpoint(**spec))
    assert model.head.geometry.rope.rope_type == "yarn" and model.head.attention_factor > 1
    ids = torch.randint(0, 990, (N_TOKENS,), generator=torch.Generator().manual_seed(7))
    hidden = prefill_hidden(model.target, ids, chunk_size=64)
    assert_head_layer_equals_transformers(model, ids, hidden)
    # ... and the reference head, fed transformers' yarn frequencies, agrees at sampled anchors
    tokens, logits = product_drafts(model.head, ids, hidden, SAMPLE_ANCHORS)
    ref = reference(model, text_config=model.info.text_config)
    for a, p in enumerate(SAMPLE_ANCHORS):
        ref_tokens, ref_logits = ref.draft(hidden, ids, p, K)
        assert tokens[a].tolist() == ref_tokens and (logits[a] - ref_logits).abs().max() < 1e-5


def test_a_rope_type_the_head_does_not_implement_is_refused_in_one_line(make_checkpoint, tmp_path):
    d = tmp_path / "c"
    shutil.copytree(make_checkpoint(), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["text_config"]["rope_parameters"] |= {"rope_type": "dynamic", "factor": 2.0}
    (d / "config.json").write_text(json.dumps(cfg))
    assert_one_line_exit_2(run_cli("inspect", d), "config.json", "rope_type 'dynamic'", "not implemented for the MTP head")
