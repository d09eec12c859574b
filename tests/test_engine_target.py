"""replay --target-engine's own code (docs/engine-target.md): the self-test that the states an engine hands back are
the ones its lm_head reads, the local parts (embedding, final norm, lm_head; no layers), and the refusals. The run
through the real engine is tests/engine/test_engine_target.py.

The states fed to the self-test here are the bundled model's own, from transformers: the correct post-norm ones, the
un-normed ones a capture before the final norm gives, the previous layer's, and rows shifted by one. The engine's top-1
is the argmax of the target's logits (what the real engine's prompt_logprobs say, up to bf16: the engine test).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mtp_observe.model.checkpoint import read_checkpoint
from mtp_observe.model.engine_target import EngineTargetError, check_self_test, load_local_parts, self_test_mismatch
from mtp_observe.model.loading import default_model_dir
from mtp_observe.model.weights import load_target


@pytest.fixture(scope="module")
def states():
    """(post-norm [n, H], pre-norm [n, H], the previous layer's output normed [n, H], lm_head [V, H], top-1 [n],
    the target) on 96 tokens of the bundled model."""
    torch.manual_seed(0)
    info = read_checkpoint(default_model_dir())
    target = load_target(info, dtype=torch.float32)
    ids = torch.randint(0, info.geometry.vocab_size, (1, 96))
    seen = {}
    handle = target.model.norm.register_forward_hook(lambda m, args, out: seen.update(pre=args[0][0]))  # None: out kept
    with torch.no_grad():
        out = target.model(input_ids=ids, output_hidden_states=True)
    handle.remove()
    post = out.last_hidden_state[0]
    previous = target.model.norm(out.hidden_states[-2][0])  # layer L-1's output through the final norm
    top1 = (post @ target.lm_head.weight.T).argmax(-1).tolist()
    return post, seen["pre"], previous, target.lm_head.weight, top1, target


def test_the_self_test_passes_the_targets_own_post_norm_states(states):
    post, _, _, lm_head, top1, _ = states
    assert self_test_mismatch(post, lm_head, top1) is None
    assert self_test_mismatch(post.bfloat16(), lm_head.bfloat16(), top1) is None  # bf16 rounding is not a mismatch


def test_the_self_test_catches_a_capture_before_the_final_norm(states):
    post, pre, _, lm_head, top1, _ = states
    assert not torch.allclose(pre, post)
    found = self_test_mismatch(pre, lm_head, top1)
    assert found is not None
    row, ours, theirs = found
    assert theirs == top1[row] and ours == int((pre[row] @ lm_head.T).argmax()) and ours != theirs
    with pytest.raises(EngineTargetError) as e:
        check_self_test(pre, lm_head, top1, request=1)
    message = str(e.value)
    assert e.value.exit_code == 2 and "\n" not in message
    assert f"at position {row + 1} " in message and f"token {ours}," in message and f"top-1 is token {theirs};" in message
    assert "before the final norm" in message and "off-by-one layer" in message and "prefix caching" in message


def test_the_self_test_catches_an_off_by_one_layer_and_an_off_by_one_row(states):
    post, _, previous, lm_head, top1, _ = states
    assert self_test_mismatch(previous, lm_head, top1) is not None  # layer L-1 (an off-by-one layer index)
    shifted = torch.cat([post[1:], post[-1:]])  # row i holds position i + 1's state
    assert self_test_mismatch(shifted, lm_head, top1) is not None


def test_a_near_tie_within_bf16_is_not_a_mismatch_but_a_real_difference_is(states):
    post, _, _, lm_head, top1, _ = states
    logits = post @ lm_head.T
    second = logits[0].topk(2).indices[1].item()
    gap = (logits[0, top1[0]] - logits[0, second]).item()
    moved = list(top1)
    moved[0] = second
    found = self_test_mismatch(post, lm_head, moved)
    tie = gap <= 2.0 * max(1.0, abs(logits[0].max().item())) * 2.0 ** -7
    assert (found is None) == tie and (found is None or found[0] == 0)


def test_the_local_parts_hold_no_layers_and_norm_a_pre_norm_state_as_the_target_does(states):
    post, pre, _, lm_head, _, target = states
    parts = load_local_parts(read_checkpoint(default_model_dir()), torch.float32)
    assert len(parts.model.layers) == 0
    assert sum(p.numel() for p in parts.parameters()) < sum(p.numel() for p in target.parameters()) / 2
    assert torch.equal(parts.lm_head.weight, lm_head)
    assert torch.equal(parts.model.embed_tokens.weight, target.model.embed_tokens.weight)
    with torch.no_grad():
        assert torch.allclose(parts.model.norm(pre), post, atol=1e-5)


def test_an_unreachable_target_engine_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mtp_observe", "replay", "sessions", "--target-engine",
                           "http://127.0.0.1:9", "-o", str(tmp_path / "run")], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "cannot reach http://127.0.0.1:9/version" in done.stderr and "docs/engine-target.md" in done.stderr
    assert not (tmp_path / "run").exists()


def test_target_engine_refuses_what_it_cannot_go_with(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mtp_observe", "replay", "sessions", "--target-engine",
                           "http://127.0.0.1:9", "--drafters", "ngram", "-o", str(tmp_path / "run")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "does not go with --drafters without mtp" in done.stderr, done.stderr
