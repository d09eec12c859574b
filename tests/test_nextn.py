"""DeepSeek-V3 and GLM-4.5 NextN heads: pinned by value against transformers' own decoder layers, each reading
against a wrong one, the engines' readings where they differ, and the checkpoint's copies of the target's tensors."""

from __future__ import annotations

import json

import pytest
import torch

from mtp_observe.checkpoint import compare_copies, read_checkpoint
from mtp_observe.families import head_reading
from mtp_observe.mtp import apply_interleaved_rotary, rms_norm, route_grouped, softmax_scale
from mtp_observe.pipeline import load_model
from mtp_observe.target import prefill_hidden

from .head_checks import product_drafts
from .reference_nextn import CORRECT, PlainNextn, Reading, TransformersNextn

N_TOKENS = 200
K = 3
ANCHORS = [1, 2, 9, 33, 64, 99, 150, 198]  # 1 and 2 see row 0, whose embedding vLLM zeroes
DEEPSEEK = dict(family="deepseek_v3", layout="text")
GLM = dict(family="glm4_moe", layout="text")
GLM_AIR = dict(family="glm4_moe", layout="text", use_qk_norm=False, routed_scaling_factor=1.0, nextn_copies="absent")


@pytest.fixture(scope="module")
def models(make_checkpoint):
    cache = {}

    def get(engine: str = "vllm", **spec):
        key = json.dumps([engine, spec], sort_keys=True)
        if key not in cache:
            model = load_model(make_checkpoint(**spec), head_engine=engine)
            ids = torch.randint(0, model.info.geometry.vocab_size, (N_TOKENS,), generator=torch.Generator().manual_seed(7))
            cache[key] = (model, ids, prefill_hidden(model.target, ids, chunk_size=64))
        return cache[key]

    return get


def assert_equal_drafts(head, ids, hidden, reference, anchors, tol=1e-5):
    tokens, logits = product_drafts(head, ids, hidden, anchors, k=K)
    worst = 0.0
    for a, (p, (ref_tokens, ref_logits)) in enumerate(zip(anchors, reference.draft_many(hidden, ids, anchors, K))):
        assert tokens[a].tolist() == ref_tokens, f"anchor {p}"
        worst = max(worst, float((logits[a] - ref_logits).abs().max()))
    assert worst < tol, worst


def assert_differs(model, ids, hidden, right, wrong, anchors=ANCHORS):
    """The product equals `right`; `wrong` drafts other tokens with visibly other logits."""
    assert_equal_drafts(model.head, ids, hidden, right, anchors)
    gap, differ = 0.0, False
    for p in anchors:
        a_tokens, a_logits = right.draft(hidden, ids, p, K)
        b_tokens, b_logits = wrong.draft(hidden, ids, p, K)
        gap = max(gap, float((a_logits - b_logits).abs().max()))
        differ |= a_tokens != b_tokens
    assert gap > 0.05 and differ, f"the wrong reading is indistinguishable (max logit gap {gap})"


# --- pinned by value: transformers' own decoder layers at every anchor ----------------------------


@pytest.mark.parametrize("spec", [DEEPSEEK, GLM, GLM_AIR], ids=["deepseek_v3", "glm4_moe", "glm4_moe_air"])
def test_every_anchors_drafts_equal_a_head_built_from_transformers_own_decoder_layer(models, spec):
    model, ids, hidden = models(**spec)
    assert model.head.geometry.head == "nextn" and model.head.geometry.moe is not None
    assert_equal_drafts(model.head, ids, hidden, TransformersNextn(model), list(range(1, N_TOKENS)))


@pytest.mark.parametrize("spec", [DEEPSEEK, GLM], ids=["deepseek_v3", "glm4_moe"])
def test_under_sglangs_reading_the_drafts_equal_transformers_driven_as_sglang_drives_it(models, spec):
    model, ids, hidden = models("sglang", **spec)
    assert not model.head.reading.zero_position_0_embedding and model.head.reading.fed_back == "post_norm"
    assert_equal_drafts(model.head, ids, hidden, TransformersNextn(model), ANCHORS)


@pytest.mark.parametrize("spec", [DEEPSEEK, GLM], ids=["deepseek_v3", "glm4_moe"])
def test_the_moe_block_equals_transformers_own_with_its_grouped_router(models, spec):
    model, _, _ = models(**spec)
    if model.info.model_type == "deepseek_v3":
        from transformers import DeepseekV3Config as Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE as Block
    else:
        from transformers import Glm4MoeConfig as Config
        from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeMoE as Block
    cfg = Config(**{k: v for k, v in model.info.text_config.items() if k not in ("model_type", "architectures")})
    cfg._experts_implementation = "eager"
    block = Block(cfg).eval()
    block.load_state_dict({k.removeprefix("mlp."): v for k, v in model.head.named_weights().items() if k.startswith("mlp.")})
    x = torch.randn(300, model.head.geometry.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (model.head.mlp(x) - block(x[None])[0]).abs().max() < 1e-5


# --- worked examples ---------------------------------------------------------------------------


def test_grouped_routing_chooses_by_the_biased_scores_and_weighs_by_the_unbiased_on_a_worked_example():
    from mtp_observe.families import SparseMoe

    moe = SparseMoe(4, 2, 8, 8, True, routing="sigmoid_grouped", n_group=2, topk_group=1, routed_scaling_factor=2.5)
    logits = torch.logit(torch.tensor([[0.9, 0.8, 0.6, 0.5]]))
    w, e = route_grouped(logits, torch.tensor([0.0, 0.0, 0.2, 0.2]), moe)
    assert sorted(e[0].tolist()) == [0, 1]
    assert torch.allclose(w.sort(descending=True).values, torch.tensor([[0.9 / 1.7, 0.8 / 1.7]]) * 2.5, atol=1e-6)  # 0.529, 0.471
    w, e = route_grouped(logits, torch.tensor([0.0, 0.0, 0.5, 0.5]), moe)
    assert sorted(e[0].tolist()) == [2, 3]
    assert torch.allclose(w.sort(descending=True).values, torch.tensor([[0.6 / 1.1, 0.5 / 1.1]]) * 2.5, atol=1e-6)  # 0.545, 0.455


def test_the_plain_norm_scales_by_w_and_the_interleaved_rotary_rotates_neighbouring_pairs():
    assert torch.allclose(rms_norm(torch.tensor([[3.0, 4.0]]), torch.tensor([0.0, 1.0]), 0.0), torch.tensor([[0.0, 1.1314]]), atol=1e-4)
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])  # [heads, n, r]: pairs (1, 2) at frequency 0, (3, 4) at frequency 1
    cos, sin = torch.tensor([[0.0, 1.0, 0.0, 1.0]]), torch.tensor([[1.0, 0.0, 1.0, 0.0]])  # angles (pi/2, 0)
    assert apply_interleaved_rotary(x, cos, sin).tolist() == [[[-2.0, 3.0, 1.0, 4.0]]]  # de-interleaved: evens, odds


def test_deepseek_v3s_softmax_scale_carries_yarns_mscale_squared(make_checkpoint):
    from mtp_observe.families import geometry_from_config

    config = json.loads((make_checkpoint(**DEEPSEEK) / "config.json").read_text())
    real = dict(config, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)  # V3's: 192^-0.5 * 1.368888^2
    assert softmax_scale(geometry_from_config("deepseek_v3", real)) == pytest.approx(0.135234, abs=1e-6)


# --- each reading, against the wrong one ----------------------------------------------------------


@pytest.mark.parametrize("reading", [
    Reading(concat_reversed=True), Reading(norms_swapped=True), Reading(zero_centred_norms=True),
    Reading(pair_same_position=True), Reading(rope_split_reversed=True), Reading(rotate_half=True),
    Reading(no_mscale=True), Reading(no_correction_bias=True), Reading(biased_weights=True), Reading(no_groups=True),
    Reading(softmax_scores=True), Reading(no_routed_scaling=True), Reading(no_shared_experts=True),
], ids=lambda r: next(k for k, v in vars(r).items() if v))
def test_a_wrong_reading_of_the_deepseek_head_drafts_differently(models, reading):
    model, ids, hidden = models(**DEEPSEEK)
    assert_differs(model, ids, hidden, PlainNextn(model), PlainNextn(model, reading))


@pytest.mark.parametrize("reading", [
    Reading(rotate_all_dims=True), Reading(interleaved_rotary=True), Reading(no_attention_bias=True),
    Reading(no_qk_norm=True), Reading(no_renormalise=True),
], ids=lambda r: next(k for k, v in vars(r).items() if v))
def test_a_wrong_reading_of_the_glm_head_drafts_differently(models, reading):
    model, ids, hidden = models(**GLM)
    assert_differs(model, ids, hidden, PlainNextn(model), PlainNextn(model, reading))


def test_chain_positions_advance_by_one_per_step(models):
    model, ids, hidden = models(**DEEPSEEK)
    assert_differs(model, ids, hidden, PlainNextn(model), PlainNextn(model, Reading(chain_positions_fixed=True)),
                   list(range(1, N_TOKENS, 6)))


# --- where the engines differ --------------------------------------------------------------------


@pytest.mark.parametrize("spec", [DEEPSEEK, GLM], ids=["deepseek_v3", "glm4_moe"])
def test_vllm_zeroes_the_embedding_at_position_0_and_sglang_does_not(models, spec):
    model, ids, hidden = models(**spec)
    assert model.head.reading.zero_position_0_embedding  # vLLM 0.33, the default
    assert_differs(model, ids, hidden, PlainNextn(model), PlainNextn(model, zero_pos0=False), [1, 2, 3, 5, 9])
    sglang, _, _ = models("sglang", **spec)
    assert_equal_drafts(sglang.head, ids, hidden, PlainNextn(sglang, zero_pos0=False), [1, 2, 9])


@pytest.mark.parametrize("spec, vllm_fed_back", [(DEEPSEEK, "post_norm"), (GLM, "pre_norm")], ids=["deepseek_v3", "glm4_moe"])
def test_the_state_fed_back_is_vllms_per_family_and_sglangs_post_norm_for_both(models, spec, vllm_fed_back):
    model, ids, hidden = models(**spec)
    assert model.head.reading.fed_back == vllm_fed_back == head_reading(model.info.model_type).fed_back
    other = "pre_norm" if vllm_fed_back == "post_norm" else "post_norm"
    assert_differs(model, ids, hidden, PlainNextn(model), PlainNextn(model, fed_back=other))
    sglang, _, _ = models("sglang", **spec)
    assert sglang.head.reading.fed_back == "post_norm"
    assert_equal_drafts(sglang.head, ids, hidden, PlainNextn(sglang, fed_back="post_norm"), ANCHORS)


def test_the_head_drafts_from_the_targets_post_final_norm_hidden_state(models):
    model, ids, hidden = models(**DEEPSEEK)
    target = model.target
    captured = []
    hook = target.model.layers[-1].register_forward_hook(lambda mod, args, output: captured.append(output))
    with torch.no_grad():
        out = target(input_ids=ids[None])
    hook.remove()
    assert (target.lm_head(hidden) - out.logits[0]).abs().max() < 1e-4  # the state the lm_head consumes ...
    pre_norm = (captured[0][0] if isinstance(captured[0], tuple) else captured[0])[0]
    right, _ = product_drafts(model.head, ids, hidden, ANCHORS, k=K)
    wrong, _ = product_drafts(model.head, ids, pre_norm, ANCHORS, k=K)  # ... not the last layer's output
    assert not torch.equal(right, wrong)


def test_a_distinct_shared_head_is_replaced_by_the_targets_lm_head_as_the_engines_do(models):
    model, ids, hidden = models(**DEEPSEEK, nextn_copies="distinct")
    assert compare_copies(model.info) == {"embed_tokens.weight": "differs", "shared_head.head.weight": "differs"}
    from safetensors import safe_open

    info = model.info
    name = info.head_prefix + "shared_head.head.weight"
    with safe_open(str(info.path / info.tensors[name].file), "pt") as f:
        shared_head = f.get_tensor(name)
    assert_differs(model, ids, hidden, PlainNextn(model), PlainNextn(model, lm_head=shared_head))


def test_released_copies_compare_equal_and_an_absent_pair_is_said_so(make_checkpoint):
    assert compare_copies(read_checkpoint(make_checkpoint(**GLM))) == {"embed_tokens.weight": "equal",
                                                                      "shared_head.head.weight": "equal"}
    absent = read_checkpoint(make_checkpoint(**GLM_AIR))
    assert compare_copies(absent) == {"embed_tokens.weight": "absent", "shared_head.head.weight": "absent"}
    assert absent.head_copies == [] and compare_copies(read_checkpoint(make_checkpoint())) is None


def test_the_correct_plain_reference_is_transformers_head(models):
    """The plain reference the wrong readings are measured against is itself the transformers head."""
    model, ids, hidden = models(**DEEPSEEK)
    plain, theirs = PlainNextn(model, CORRECT), TransformersNextn(model)
    for p in ANCHORS[:4]:
        a, la = plain.draft(hidden, ids, p, K)
        b, lb = theirs.draft(hidden, ids, p, K)
        assert a == b and (la - lb).abs().max() < 1e-5
