"""The bundled default model and its sample sessions: they load, render, and measure what they claim.

The slow part (training) is never run here; these tests check the committed artefacts: the
checkpoint in mtp_observe/default_model/, the demo sessions in sessions/, and the generator in
scripts/ that wrote them.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from mtp_observe.model.checkpoint import read_checkpoint

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / "mtp_observe" / "default_model"
SESSIONS = ROOT / "sessions"
DEMO_FILES = sorted(SESSIONS.glob("*.jsonl"))


def _script(name: str):
    """Import scripts/<name>.py as a module (scripts/ is not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generator():
    return _script("generate_sessions")


@pytest.fixture(scope="module")
def trainer():
    return _script("train_default_model")


@pytest.fixture(scope="module")
def demo_sessions():
    return [json.loads(line) for f in DEMO_FILES for line in f.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def tokenizer(trainer):
    return trainer.load_tokenizer(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def default_model():
    from mtp_observe.model.loading import load_model

    return load_model(DEFAULT_MODEL)


# ---------------------------------------------------------------------------------------------
# The checkpoint


def test_the_bundled_checkpoint_reads_as_a_qwen3_5_vlm_checkpoint_with_its_mtp_head():
    info = read_checkpoint(DEFAULT_MODEL)
    assert info.model_type == "qwen3_5" and info.layout == "vlm"
    assert info.config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert len(info.head_names) == 15, info.head_names
    assert any(n.startswith("model.language_model.") for n in info.tensors)
    assert any(n.startswith("model.visual.") for n in info.tensors)
    layer_types = info.text_config["layer_types"]
    assert {"linear_attention", "full_attention"} <= set(layer_types), layer_types
    assert info.text_config["rope_parameters"]["partial_rotary_factor"] == 0.25
    assert info.geometry.rotary_dim == info.geometry.head_dim // 4
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (DEFAULT_MODEL / name).is_file(), name


def test_the_bundled_checkpoint_stays_small_enough_to_ship_in_the_package():
    total = sum(f.stat().st_size for f in DEFAULT_MODEL.iterdir())
    assert total < 12e6, f"{total / 1e6:.1f} MB"


def test_the_bundled_chat_template_is_the_packages(tokenizer):
    from mtp_observe.model.synthetic import chat_template

    assert (DEFAULT_MODEL / "chat_template.jinja").read_text() == chat_template()
    assert tokenizer.chat_template == chat_template()


def test_the_bundled_tokenizer_has_the_chatml_and_markup_tokens_as_single_tokens(tokenizer):
    from mtp_observe.model.synthetic import MARKUP_TOKENS, SPECIAL_TOKENS

    for token in SPECIAL_TOKENS + MARKUP_TOKENS:
        ids = tokenizer(token, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tokenizer.convert_ids_to_tokens(ids[0]) == token, (token, ids)
    assert tokenizer.eos_token == "<|im_end|>"
    assert len(tokenizer) <= read_checkpoint(DEFAULT_MODEL).geometry.vocab_size


# ---------------------------------------------------------------------------------------------
# Rendering the demo sessions


def test_every_demo_turn_renders_as_an_exact_token_extension_of_its_prompt(trainer, tokenizer, demo_sessions):
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    turns = 0
    for session in demo_sessions:
        requests = trainer.session_requests(tokenizer, session)  # asserts the extension turn by turn
        n_assistant = sum(m["role"] == "assistant" for m in session["messages"])
        assert sum(len(q.spans) for q in requests) == n_assistant
        for q in requests:
            for s, e in q.spans:
                assert q.ids[e] == end_id and end_id not in q.ids[s:e]
            turns += len(q.spans)
    assert turns >= 40


def test_rendered_demo_sessions_show_tools_tool_calls_and_reasoning(trainer, tokenizer, demo_sessions):
    text = "".join(tokenizer.decode(q.ids) for s in demo_sessions for q in trainer.session_requests(tokenizer, s))
    for marker in ("<tools>", "<tool_call>\n<function=", "<parameter=", "<tool_response>", "<think>\nThe "):
        assert marker in text, marker


def test_a_tool_call_argument_reaches_the_rendering_as_a_parameter(trainer, tokenizer, demo_sessions):
    session = next(s for s in demo_sessions if s["meta"]["domain"] == "support")
    call = next(m["tool_calls"][0] for m in session["messages"] if m.get("tool_calls"))
    args = json.loads(call["function"]["arguments"])
    key, value = next(iter(args.items()))
    text = tokenizer.decode(trainer.session_requests(tokenizer, session)[0].ids)
    assert f"<function={call['function']['name']}>\n<parameter={key}>\n{value}\n</parameter>" in text


# ---------------------------------------------------------------------------------------------
# The generator and the demo files


def test_the_generator_gives_identical_bytes_for_the_same_seed(generator):
    a = generator.to_jsonl(generator.generate("coding", 5, 3, "x") + generator.generate("support", 5, 3, "x"))
    b = generator.to_jsonl(generator.generate("coding", 5, 3, "x") + generator.generate("support", 5, 3, "x"))
    assert a == b
    assert a != generator.to_jsonl(generator.generate("coding", 6, 3, "x") + generator.generate("support", 6, 3, "x"))


def test_the_committed_demo_sessions_are_what_the_generator_writes(generator):
    for domain, sessions in generator.demo_sessions().items():
        assert (SESSIONS / f"{domain}.jsonl").read_text() == generator.to_jsonl(sessions), domain


def test_the_demo_sessions_are_held_out_from_the_training_sessions(generator, demo_sessions):
    assert generator.DEMO_SEED != generator.TRAIN_SEED
    key = lambda s: json.dumps(s["messages"][1:3])  # noqa: E731  first user message and first reply
    train = {key(s) for s in generator.training_sessions(600)}
    assert not any(key(s) in train for s in demo_sessions)


def test_the_demo_sessions_are_valid_canonical_sessions(demo_sessions):
    assert {s["meta"]["domain"] for s in demo_sessions} == {"support", "coding"}
    assert len({s["id"] for s in demo_sessions}) == len(demo_sessions)
    for s in demo_sessions:
        assert set(s) == {"id", "messages", "tools", "meta"}
        names = {t["function"]["name"] for t in s["tools"]}
        assert all(t["type"] == "function" and t["function"]["parameters"]["type"] == "object" for t in s["tools"])
        messages = s["messages"]
        assert messages[0]["role"] == "system" and messages[1]["role"] == "user"
        open_calls: dict[str, str] = {}
        for m in messages:
            assert m["role"] in ("system", "user", "assistant", "tool"), m["role"]
            if m["role"] == "assistant":
                assert open_calls == {}, f"{s['id']}: calls {open_calls} have no result before the next turn"
                assert m.get("content") or m.get("tool_calls")
                for call in m.get("tool_calls") or []:
                    assert call["type"] == "function" and call["function"]["name"] in names
                    args = json.loads(call["function"]["arguments"])  # a JSON string that parses
                    assert isinstance(args, dict) and args
                    required = next(t for t in s["tools"] if t["function"]["name"] == call["function"]["name"])
                    assert set(required["function"]["parameters"]["required"]) <= set(args)
                    open_calls[call["id"]] = call["function"]["name"]
            elif m["role"] == "tool":
                assert m["tool_call_id"] in open_calls, f"{s['id']}: a tool result with no preceding call"
                del open_calls[m["tool_call_id"]]
                assert isinstance(m["content"], str) and m["content"]
            else:
                assert isinstance(m["content"], str) and m["content"]
        assert messages[-1]["role"] == "assistant" and not open_calls
    reasoning = [m for s in demo_sessions for m in s["messages"] if m.get("reasoning_content")]
    user_turns = [sum(m["role"] == "user" for m in s["messages"]) for s in demo_sessions]
    assert reasoning and min(user_turns) >= 2


# ---------------------------------------------------------------------------------------------
# What the bundled head measures (one session of each domain, to stay fast)


@pytest.fixture(scope="module")
def small_demo_scores(trainer, default_model, tokenizer, demo_sessions):
    picked = [next(s for s in demo_sessions if s["meta"]["domain"] == d) for d in ("support", "coding")]
    counts = trainer.Counts()
    reversed_head = trainer.reversed_concat_head(default_model.head)
    for session in picked:
        for request in trainer.session_requests(tokenizer, session):
            trainer.score_request(default_model, request, counts, True, reversed_head)
    return counts.rates()


def test_the_bundled_head_drafts_well_on_demo_sessions(small_demo_scores):
    assert small_demo_scores["alpha_1"] >= 0.5, small_demo_scores
    assert small_demo_scores["tau_sim_3"] >= 1.8, small_demo_scores


@pytest.mark.parametrize("control", ["reversed_concat", "pre_norm_hidden", "pair_h_i_with_x_i", "hidden_delayed_one"])
def test_each_wrong_reading_at_least_halves_depth_1_acceptance(small_demo_scores, control):
    alpha = small_demo_scores["alpha_1"]
    wrong = small_demo_scores["controls_alpha_1"][control]
    assert wrong <= alpha / 2, f"{control}: {wrong} vs {alpha}"


def test_the_bundled_checkpoints_sign_flip_changes_no_output(trainer, default_model, tokenizer, demo_sessions):
    """The saved checkpoint negates the final hidden space (trainer.flip_channel_signs): undoing the flip
    gives the same target logits and the same drafts, and it is what sets the pre-norm state against
    what the head reads."""
    from mtp_observe.model.mtp import MtpHead
    from mtp_observe.model.target import prefill_hidden

    request = trainer.session_requests(tokenizer, demo_sessions[0])[0]
    ids = torch.tensor(request.ids)
    target, head = default_model.target, default_model.head
    assert float((1 + target.model.norm.weight.float()).max()) < 0  # every channel flipped
    post, pre = trainer.prefill_with_pre_norm(target, ids)
    assert float(torch.nn.functional.cosine_similarity(pre, post, dim=-1).max()) < -0.9

    def drafts(h, hd):
        rows = hd.row_pass(h[:-1], ids[1:])
        anchors = torch.arange(1, len(ids))
        return hd.chain(rows, anchors, torch.full_like(anchors, 3)).tokens

    flipped_logits, flipped_drafts = target.lm_head(post), drafts(post, head)
    # Undo: negate (1 + w) of the three norms and the lm_head back.
    unflip = lambda w: -2.0 - w  # noqa: E731
    lm_head = -target.lm_head.weight
    tensors = {k: v.detach().clone() for k, v in head.named_weights().items()}
    tensors["pre_fc_norm_hidden.weight"] = unflip(tensors["pre_fc_norm_hidden.weight"])
    tensors["norm.weight"] = unflip(tensors["norm.weight"])
    plain_head = MtpHead(head.geometry, tensors, head.embed_tokens, lm_head)
    with torch.no_grad():
        norm = target.model.norm.weight.clone()
        target.model.norm.weight.copy_(unflip(norm))
        try:
            plain_post = prefill_hidden(target, ids)
        finally:
            target.model.norm.weight.copy_(norm)
        assert torch.allclose(plain_post, -post, atol=1e-5)
        assert (plain_post @ lm_head.T - flipped_logits).abs().max() < 1e-4
    assert torch.equal(drafts(plain_post, plain_head), flipped_drafts)


def test_tau_sim_walks_a_span_as_in_the_worked_example(trainer):
    assert trainer.simulate([(10, 14)], {10: 2, 13: 0}, 3) == (4, 2)
    assert trainer.simulate([(0, 3)], {0: 3}, 3) == (3, 1)  # never emits past the end of the turn
    assert trainer.simulate([(0, 3)], {0: 0, 1: 0, 2: 0}, 3) == (3, 3)


# ---------------------------------------------------------------------------------------------
# The training-time head is the served head


def test_the_training_chain_step_equals_mtp_head_chain_on_the_drafted_path(trainer, tiny_model):
    """Teacher-forced with the chain's own drafts, the training script's chain steps give the states
    `MtpHead.chain` computes: the trained depth-2/3 losses see exactly what serving runs."""
    from mtp_observe.model.target import prefill_hidden

    head = tiny_model.head
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, head.geometry.vocab_size, (120,), generator=gen)
    hidden = prefill_hidden(tiny_model.target, ids)
    rows = head.row_pass(hidden[:-1], ids[1:])
    anchors = torch.tensor([5, 17, 60, 118])
    drafts = head.chain(rows, anchors, torch.full_like(anchors, 3), keep_states=True)
    r = anchors - 1
    with torch.no_grad():
        m2, kv2 = trainer.chain_step(head, rows.keys, rows.values, rows.states[r], drafts.tokens[:, 0], r, 2, [])
        m3, _ = trainer.chain_step(head, rows.keys, rows.values, m2, drafts.tokens[:, 1], r, 3, [kv2])
    torch.testing.assert_close(m2, drafts.states[:, 1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m3, drafts.states[:, 2], rtol=1e-4, atol=1e-5)


def test_the_training_depth_1_loss_reads_the_row_pass(trainer, tiny_model):
    """head_losses' depth-1 cross-entropy equals the one computed from `MtpHead.row_pass` states."""
    from mtp_observe.model.target import prefill_hidden

    head = tiny_model.head
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(0, head.geometry.vocab_size, (90,), generator=gen)
    hidden = prefill_hidden(tiny_model.target, ids)
    scored = torch.zeros(90, dtype=torch.bool)
    scored[40:70] = True  # one span [39, 69]
    with torch.no_grad():
        (loss, count), *_ = trainer.head_losses(head, hidden, ids, scored, 1)
    rows = head.row_pass(hidden[:-1], ids[1:])
    r = torch.arange(38, 68)  # anchors p = 39..68: x_{p+1} in 40..69
    expected = torch.nn.functional.cross_entropy(head.logits(rows.states[r]), ids[r + 2], reduction="sum")
    assert count == 30
    torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-4)
