"""The MTP head: pinned by value against a plain reference, and against each wrong reading."""

from __future__ import annotations

import pytest
import torch

from mtp_observe.model import mtp
from mtp_observe.model.mtp import zero_centred_rms_norm
from mtp_observe.model.target import prefill_hidden

from .head_checks import SAMPLE_ANCHORS, K, assert_wrong_reading_differs, product_drafts, reference
from .reference_head import Reading

N_TOKENS = 200


@pytest.fixture(scope="module")
def request_tokens(tiny_model):
    """A ~200-token request and the target's post-norm hidden states for it."""
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, tiny_model.info.geometry.vocab_size, (N_TOKENS,), generator=gen)
    hidden = prefill_hidden(tiny_model.target, ids, chunk_size=64)
    return ids, hidden


def test_the_zero_centred_norm_scales_by_one_plus_w_on_a_worked_example():
    x = torch.tensor([[3.0, 4.0]])
    w = torch.tensor([0.0, 1.0])
    got = zero_centred_rms_norm(x, w, eps=0.0)
    assert torch.allclose(got, torch.tensor([[0.8485, 2.2627]]), atol=1e-4)
    plain = x / x.pow(2).mean().sqrt() * w  # the x*w reading
    assert not torch.allclose(got, plain, atol=0.1)


def test_the_head_layer_equals_transformers_qwen3_5_decoder_layer_built_as_full_attention(tiny_model, request_tokens):
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5TextRotaryEmbedding

    ids, hidden = request_tokens
    head = tiny_model.head
    text = dict(tiny_model.info.text_config)
    text = {k: v for k, v in text.items() if not k.startswith("mtp_") and k != "model_type"}
    # layer_types indexes the target's layers; the head's layer is full attention whatever its index.
    cfg = Qwen3_5TextConfig(**dict(text, num_hidden_layers=1, layer_types=["full_attention"]))
    cfg._attn_implementation = "eager"
    layer = Qwen3_5DecoderLayer(cfg, 0).eval()
    state = {k.removeprefix("layers.0."): v for k, v in head.named_weights().items() if k.startswith("layers.0.")}
    layer.load_state_dict(state)
    n = N_TOKENS - 1
    z = head.fc_input(hidden[:-1], ids[1:])
    positions = torch.arange(n)[None]
    cos_sin = Qwen3_5TextRotaryEmbedding(cfg)(z[None], positions)
    causal = torch.full((n, n), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        theirs = layer(z[None], position_embeddings=cos_sin, attention_mask=causal, position_ids=positions)[0]
    theirs = zero_centred_rms_norm(theirs, head.norm, head.geometry.rms_norm_eps)
    ours = head.row_pass(hidden[:-1], ids[1:], chunk_size=50).states
    assert (ours - theirs).abs().max() < 1e-5


def test_the_cached_row_pass_and_chain_equal_a_plain_recomputation_at_every_anchor(tiny_model, request_tokens):
    ids, hidden = request_tokens
    anchors = list(range(1, N_TOKENS))  # every anchor p whose row p-1 exists
    tokens, logits = product_drafts(tiny_model.head, ids, hidden, anchors)
    ref = reference(tiny_model)
    worst = 0.0
    for a, p in enumerate(anchors):
        ref_tokens, ref_logits = ref.draft(hidden, ids, p, K)
        assert tokens[a].tolist() == ref_tokens, f"anchor {p}"
        worst = max(worst, float((logits[a] - ref_logits).abs().max()))
    assert worst < 1e-5, worst


def test_the_fc_input_is_embedding_then_hidden(tiny_model, request_tokens):
    assert_wrong_reading_differs(tiny_model, *request_tokens, Reading(concat_reversed=True))


def test_each_half_of_the_fc_input_has_its_own_norm(tiny_model, request_tokens):
    assert_wrong_reading_differs(tiny_model, *request_tokens, Reading(one_norm_over_2h=True))


def test_every_norm_scales_by_one_plus_w_not_w(tiny_model, request_tokens):
    assert_wrong_reading_differs(tiny_model, *request_tokens, Reading(plain_norm=True))


def test_row_i_pairs_h_i_with_the_next_token(tiny_model, request_tokens):
    assert_wrong_reading_differs(tiny_model, *request_tokens, Reading(pair_same_position=True))


def test_query_and_gate_are_split_per_head(tiny_model, request_tokens):
    assert_wrong_reading_differs(tiny_model, *request_tokens, Reading(global_gate_split=True))


def test_rotary_covers_only_the_first_quarter_of_the_head_dim(tiny_model, request_tokens):
    assert tiny_model.head.geometry.rotary_dim == tiny_model.head.geometry.head_dim // 4
    assert_wrong_reading_differs(tiny_model, *request_tokens, Reading(rotate_all_dims=True))


def test_rotary_pairs_dims_by_rotate_half_not_interleaved(tiny_model, request_tokens):
    assert_wrong_reading_differs(tiny_model, *request_tokens, Reading(interleaved_rotary=True))


def test_chain_positions_advance_by_one_per_step(tiny_model, request_tokens):
    # A one- or two-position shift moves few argmaxes on a random head: look at every anchor.
    every_anchor = list(range(1, N_TOKENS))
    assert_wrong_reading_differs(tiny_model, *request_tokens, Reading(chain_positions_fixed=True), every_anchor)


def test_the_head_drafts_from_the_targets_post_final_norm_hidden_state(tiny_model, request_tokens):
    ids, hidden = request_tokens
    target = tiny_model.target
    captured = []
    hook = target.model.layers[-1].register_forward_hook(lambda mod, args, output: captured.append(output))
    with torch.no_grad():
        out = target(input_ids=ids[None])
    hook.remove()
    # The state we pair is the one the lm_head consumes ...
    assert (target.lm_head(hidden) - out.logits[0]).abs().max() < 1e-4
    last_layer = captured[0][0] if isinstance(captured[0], tuple) else captured[0]
    pre_norm = last_layer[0]  # the last decoder layer's output, before the final norm
    assert (pre_norm - hidden).abs().max() > 0.1
    # ... and the pre-norm reading drafts differently.
    right, _ = product_drafts(tiny_model.head, ids, hidden, SAMPLE_ANCHORS)
    wrong, _ = product_drafts(tiny_model.head, ids, pre_norm, SAMPLE_ANCHORS)
    assert not torch.equal(right, wrong)


def test_a_chunked_row_pass_needs_an_explicit_mask_once_the_cache_is_not_empty(tiny_model, request_tokens, monkeypatch):
    ids, hidden = request_tokens
    head = tiny_model.head
    whole = head.row_pass(hidden[:-1], ids[1:], chunk_size=10_000).states
    chunked = head.row_pass(hidden[:-1], ids[1:], chunk_size=37).states
    assert (whole - chunked).abs().max() < 1e-5

    def top_left_mask(q_positions, k_positions):  # what is_causal=True builds for q_len < kv_len
        return torch.ones(len(q_positions), len(k_positions), dtype=torch.bool).tril()

    monkeypatch.setattr(mtp.head, "causal_mask", top_left_mask)  # where the row pass looks it up
    wrong = head.row_pass(hidden[:-1], ids[1:], chunk_size=37).states
    assert (wrong[:37] - whole[:37]).abs().max() < 1e-5  # the first chunk has an empty cache: no difference
    assert (wrong[37:] - whole[37:]).abs().max() > 0.05


def test_the_head_runs_over_every_row_not_only_the_last(tiny_model, request_tokens):
    ids, hidden = request_tokens
    head = tiny_model.head
    p = 150
    full, _ = product_drafts(head, ids, hidden, [p])
    # Only the last row: the head attends to nothing but itself (an empty KV cache).
    alone_rows = head.row_pass(hidden[p - 1 : p], ids[p : p + 1])
    alone = alone_rows.states[0] @ head.lm_head.T
    with_prefix = head.row_pass(hidden[:p], ids[1 : p + 1]).states[-1] @ head.lm_head.T
    assert int(with_prefix.argmax()) == int(full[0, 0])
    assert (alone - with_prefix).abs().max() > 0.05


def test_depths_shrink_per_anchor_without_changing_the_drafts_that_remain(tiny_model, request_tokens):
    ids, hidden = request_tokens
    head = tiny_model.head
    rows = head.row_pass(hidden[:-1], ids[1:])
    anchors = torch.arange(100, 140)
    full = head.chain(rows, anchors, torch.full_like(anchors, 4))
    depths = torch.randint(1, 5, anchors.shape, generator=torch.Generator().manual_seed(1))
    partial = head.chain(rows, anchors, depths, attention_budget=4096)  # tiny blocks: batching is invisible
    for a in range(len(anchors)):
        d = int(depths[a])
        assert partial.tokens[a, :d].tolist() == full.tokens[a, :d].tolist()
        assert (partial.tokens[a, d:] == -1).all()
        assert torch.allclose(partial.logprobs[a, :d], full.logprobs[a, :d], atol=1e-5)


def test_a_decode_step_equals_the_chains_second_step(tiny_model, request_tokens):
    ids, hidden = request_tokens
    head = tiny_model.head
    rows = head.row_pass(hidden[:-1], ids[1:])
    p = 120
    chain = head.chain(rows, torch.tensor([p]), torch.tensor([2]), keep_states=True)
    states, step_ids, _ = head.decode_step(rows, p, chain.states[:, 0], chain.tokens[:, 0], torch.tensor([p]))
    assert int(step_ids[0]) == int(chain.tokens[0, 1])
    assert (states - chain.states[:, 1]).abs().max() < 1e-5


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA-only path: needs a CUDA device")
def test_the_cuda_row_pass_with_a_lower_right_causal_bias_equals_the_cpu_one(tiny_checkpoint, request_tokens):
    from mtp_observe.model.loading import load_model

    ids, hidden = request_tokens
    cpu = load_model(tiny_checkpoint)
    gpu = load_model(tiny_checkpoint, device="cuda")
    a = cpu.head.row_pass(hidden[:-1], ids[1:], chunk_size=37)
    b = gpu.head.row_pass(hidden[:-1].cuda(), ids[1:].cuda(), chunk_size=37)
    assert (a.states - b.states.cpu()).abs().max() < 1e-4
    anchors = torch.arange(1, N_TOKENS)
    da = cpu.head.chain(a, anchors, torch.full_like(anchors, 3))
    db = gpu.head.chain(b, anchors.cuda(), torch.full_like(anchors, 3).cuda())
    assert (da.tokens == db.tokens.cpu()).float().mean() > 0.99


def test_the_lower_right_causal_bias_used_on_cuda_is_the_explicit_mask(tiny_model, request_tokens, monkeypatch):
    """The CUDA row pass hands SDPA a lower-right CausalBias; on CPU it must give the explicit mask's answer."""
    ids, hidden = request_tokens
    head = tiny_model.head
    explicit = head.row_pass(hidden[:-1], ids[1:], chunk_size=37).states
    monkeypatch.setattr(head, "_row_mask", lambda q, k: mtp._lower_right(q.shape[0], k.shape[0]))
    biased = head.row_pass(hidden[:-1], ids[1:], chunk_size=37).states
    assert (explicit - biased).abs().max() < 1e-6


def test_a_row_pass_continued_from_a_prefix_equals_the_whole_row_pass(tiny_model, request_tokens):
    ids, hidden = request_tokens
    head = tiny_model.head
    whole = head.row_pass(hidden[:-1], ids[1:], chunk_size=64)
    prefix = head.rows_prefix(head.row_pass(hidden[:120], ids[1:121], chunk_size=50), 120)
    continued = head.row_pass(hidden[120:-1], ids[121:], chunk_size=33, prefix=prefix)
    assert continued.states.shape == whole.states.shape
    assert (continued.states - whole.states).abs().max() < 1e-5
    assert (continued.keys - whole.keys).abs().max() < 1e-5
