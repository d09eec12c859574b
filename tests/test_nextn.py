"""DeepSeek-V3 and GLM-4.5 NextN heads: pinned by value against transformers' own decoder layers, each reading
against a wrong one, the engines' readings where they differ, and the checkpoint's copies of the target's tensors."""

from __future__ import annotations

import json

import pytest
import torch

from mtp_observe.model.checkpoint import read_checkpoint
from mtp_observe.model.families import head_reading
from mtp_observe.model.loading import load_model
from mtp_observe.model.mtp import apply_interleaved_rotary, rms_norm, route_grouped, softmax_scale
from mtp_observe.model.target import prefill_hidden
from mtp_observe.model.weights import compare_copies

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
    from mtp_observe.model.families import SparseMoe

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
    from mtp_observe.model.families import geometry_from_config

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


# --- the layer's MLP by its index, and what SGLang cannot load -----------------------------------


def test_a_nextn_layer_below_first_k_dense_replace_is_dense_as_vllm_builds_it_and_sglang_refuses_it(make_checkpoint, models):
    spec = dict(GLM, num_hidden_layers=2, first_k_dense_replace=3)  # layer 2 < 3: dense in vLLM, MoE in SGLang
    model, ids, hidden = models(**spec)
    assert model.head.geometry.moe is None and model.info.routing.num_experts == 8  # a dense head over a MoE target
    assert_equal_drafts(model.head, ids, hidden, TransformersNextn(model), ANCHORS)
    from .test_replay import SESSION, write_sessions

    d = make_checkpoint(**spec)
    sessions = write_sessions(d.parent / "dense-nextn.jsonl", [SESSION])
    one_line(run_in_process("replay", sessions, "--model", d, "--head-reading", "sglang", "--device", "cpu", "--out",
                            d.parent / "dense-run"), "dense MLP", "SGLang builds it as MoE", "--head-reading vllm")


# --- FP8 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec, scale_dtype", [(dict(DEEPSEEK, moe_intermediate_size=160, q_lora_rank=136), torch.float32),
                                               (dict(GLM, moe_intermediate_size=160), torch.bfloat16)],
                         ids=["deepseek_v3 F32 scales", "glm4_moe BF16 scales"])
def test_an_fp8_nextn_checkpoint_replays_with_exactly_the_rows_of_its_dequantised_copy(make_checkpoint, tmp_path, spec, scale_dtype):
    from mtp_observe.model.synthetic import write_dequantised_copy, write_fp8_copy

    from .test_quantized import assert_same_rows, replay_rows

    fp8 = write_fp8_copy(make_checkpoint(**spec), tmp_path / "fp8", scale_dtype)
    info = read_checkpoint(fp8)
    fp8_head = {n.removeprefix(info.head_prefix) for n in info.head_names if info.tensors[n].dtype == "F8_E4M3"}
    attention = {"self_attn.q_a_proj.weight", "self_attn.q_b_proj.weight", "self_attn.kv_a_proj_with_mqa.weight",
                 "self_attn.kv_b_proj.weight", "self_attn.o_proj.weight"} if info.geometry.mla else \
        {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight"}
    assert attention <= fp8_head and "mlp.experts.0.gate_proj.weight" in fp8_head and "mlp.shared_experts.down_proj.weight" in fp8_head
    assert not fp8_head & {"eh_proj.weight", "mlp.gate.weight", "shared_head.head.weight", "embed_tokens.weight"}
    rows, manifest = replay_rows(fp8, tmp_path / "fp8run" / "run")
    float_rows, _ = replay_rows(write_dequantised_copy(fp8, tmp_path / "dequantised"), tmp_path / "floatrun" / "run")
    assert_same_rows(rows, float_rows)
    assert manifest["model"]["numerics"].startswith("fp8 e4m3 weights (128x128 blocks")


# --- the stages: routing recorded, inspect, the geometry from the config -------------------------


def test_the_grouped_routers_of_the_target_are_recorded(models):
    from mtp_observe.model.routing import RouterRecorder
    from mtp_observe.model.target import prefill

    model, ids, _ = models(**DEEPSEEK)
    recorder = RouterRecorder(model.target, 2)
    try:
        assert recorder.active and recorder.experts == 8 and len(recorder.routers) == 3  # layers 1-3 (first_k_dense_replace 1)
        recorder.begin_request()
        prefill(model.target, ids, 64)
        recorder.end_request(0, [(10, 60)])
        sums = recorder.take()
    finally:
        recorder.close()
    hits = torch.tensor(sums["hits"]).reshape(2, 3, 8)
    assert sums["windows"][0] == 51 and (hits[0].sum(-1) == 51 * 2).all()  # every token: 2 distinct experts a layer


def test_inspect_shows_the_nextn_layer_its_copies_and_the_mla_cache(make_checkpoint):
    from mtp_observe.cost.inventory import inventory_json, take_inventory

    info = read_checkpoint(make_checkpoint(**DEEPSEEK))
    data = inventory_json(take_inventory(info))
    assert data["head_layer"] == "model.layers.4" and data["head"]["count"] == 42
    assert [c["name"] for c in data["copies"]] == ["model.layers.4.embed_tokens.weight", "model.layers.4.shared_head.head.weight"]
    assert data["kv_cache"] == {"kind": "mla", "layers": 4, "elements_per_layer": 16 + 8, "target_bytes_per_token": 4 * 24 * 2,
                                "head_bytes_per_token": 24 * 2}
    assert data["config"]["n_group"] == 4 and data["config"]["routing"] == "sigmoid_grouped"
    glm = inventory_json(take_inventory(read_checkpoint(make_checkpoint(**GLM))))
    assert glm["kv_cache"]["elements_per_layer"] == 2 * 2 * 32 and glm["experts"]["head"]["shared_bytes"] > 0


@pytest.mark.parametrize("spec", [DEEPSEEK, GLM], ids=["deepseek_v3", "glm4_moe"])
def test_the_config_alone_gives_the_geometry_a_real_nextn_checkpoint_has(make_checkpoint, spec):
    from mtp_observe.cost.geometry import config_tensors, geometry_from_tensors, geometry_of_checkpoint

    info = read_checkpoint(make_checkpoint(**spec))
    real = geometry_of_checkpoint(info)
    built = geometry_from_tensors(info.text_config, config_tensors(info.text_config, info.model_type), False, "BF16", False,
                                  head_prefix=info.head_prefix)
    assert built == real
    assert (real.moe_layers, real.experts, real.top_k, real.full_layers, real.head_experts) == (3, 8, 2, 4, 8)


# --- replay records the reading ------------------------------------------------------------------


def run_in_process(*argv) -> tuple[int, str, str]:
    from .fuzzing import run_cli

    return run_cli([str(a) for a in argv])


def one_line(result, *needles):
    code, _, err = result
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_replay_records_the_reading_and_a_resume_under_another_is_refused(make_checkpoint, tmp_path):
    from .test_replay import SESSION, write_sessions

    d = make_checkpoint(**GLM)
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    run = tmp_path / "run"
    code, _, err = run_in_process("replay", sessions, "--model", d, "--head-reading", "sglang", "--k", "2", "--device", "cpu",
                                  "--out", run)
    assert code == 0, err
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["schema_version"] == 6
    assert manifest["head_reading"] == {"engine": "sglang", "engine_version": "0.5.23", "zero_position_0_embedding": False,
                                        "fed_back_state": "post_norm", "nextn_mlp": "moe"}
    assert manifest["model"]["head_copies"] == {"embed_tokens.weight": "equal", "shared_head.head.weight": "equal"}
    code, report, _ = run_in_process("report", run, "--replicates", "50", "--details")  # the notes are in the details
    assert "head replayed as SGLang 0.5.23" in report
    # where the other engine reads the head otherwise: said beside a serve line (none here: the verdict is UNRELIABLE)
    from mtp_observe.report import read_and_summarize
    from mtp_observe.report.flags import reading_note

    note = reading_note(read_and_summarize(run, replicates=50).report, "vllm")
    assert "vLLM 0.33.0 zeroes the embedding at position 0 and feeds the pre-norm state back" in note
    (run / "run.json").write_text(json.dumps(manifest | {"status": "running"}))  # an interrupted run, resumed under vLLM's
    one_line(run_in_process("replay", sessions, "--model", d, "--k", "2", "--device", "cpu", "--out", run, "--resume"),
             "cannot resume", "head reading differs")
    one_line(run_in_process("replay", sessions, "--model", d, "--head-reading", "trtllm", "--out", tmp_path / "x"),
             "--head-reading trtllm", "vllm, sglang")


@pytest.mark.parametrize("spec", [DEEPSEEK, GLM], ids=["deepseek_v3-mla", "glm4_moe-gqa"])
def test_a_tree_replay_of_a_nextn_head_is_refused_in_one_line_before_any_work_and_probe_times_its_tree(
        make_checkpoint, tmp_path, spec):
    from .test_replay import SESSION, write_sessions

    d = make_checkpoint(**spec)
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    run = tmp_path / "run"
    one_line(run_in_process("replay", sessions, "--model", d, "--k", "2", "--device", "cpu", "--out", run,
                            "--tree", "2,2,3"),
             "--tree 2,2,3", "Qwen3.5-family MTP heads only", f"{spec['family']}'s NextN head", "drop --tree")
    assert not run.exists()
    # probe --tree times what the tree would pay (a draft step over TOPK tokens, a verify of T): no replay of it
    code, _, err = run_in_process("probe", d, "--context", "16", "--k", "1", "--repeats", "1", "--device", "cpu",
                                  "--tree", "2,2,3", "-o", tmp_path / "probe.json")
    assert code == 0, err
    probe = json.loads((tmp_path / "probe.json").read_text())
    assert probe["trees"] == ["tree:2,2,3"] and [w["width"] for w in probe["batches"][0]["draft_width"]] == [2]
