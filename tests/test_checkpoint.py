"""Checkpoint loading: both layouts, sharding, tying, and the errors a user can cause."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mtp_observe.model.checkpoint import read_checkpoint
from mtp_observe.model.loading import load_model
from mtp_observe.model.synthetic import SyntheticSpec, random_head_state, random_target, save_checkpoint
from mtp_observe.model.target import prefill_hidden
from mtp_observe.model.weights import load_head_tensors


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "mtp_observe", *map(str, args)], capture_output=True, text=True, env=env)


def drafts_of(model_dir: Path, ids: torch.Tensor):
    m = load_model(model_dir)
    hidden = prefill_hidden(m.target, ids, chunk_size=32)
    rows = m.head.row_pass(hidden[:-1], ids[1:])
    anchors = torch.arange(1, len(ids))
    d = m.head.chain(rows, anchors, torch.full_like(anchors, 3))
    return d.tokens, d.logprobs


def test_one_checkpoint_saved_in_every_layout_gives_identical_drafts(tmp_path):
    spec = SyntheticSpec(tie_word_embeddings=True)
    target = random_target(spec)
    text_state = {k.removeprefix("model."): v.detach().clone() for k, v in target.state_dict().items() if k.startswith("model.")}
    head = random_head_state(spec, torch.Generator().manual_seed(3))
    embed = text_state["embed_tokens.weight"]
    text_config = spec.text_config()
    ids = torch.randint(0, spec.vocab_size, (60,), generator=torch.Generator().manual_seed(0))
    results = {}
    for layout in ("vlm", "text"):
        for shards in (1, 3):
            for tied in (True, False):
                d = save_checkpoint(
                    tmp_path / f"{layout}-{shards}-{tied}", text_config=text_config, text_state=text_state,
                    lm_head=None if tied else embed.clone(), head_state=head, layout=layout,
                    tie_word_embeddings=tied, shards=shards,
                )
                info = read_checkpoint(d)
                assert info.layout == layout and info.tie_word_embeddings == tied
                assert (d / "model.safetensors.index.json").exists() == (shards > 1)
                results[(layout, shards, tied)] = drafts_of(d, ids)
    first_tokens, first_logprobs = next(iter(results.values()))
    for key, (tokens, logprobs) in results.items():
        assert torch.equal(tokens, first_tokens), key
        assert torch.allclose(logprobs, first_logprobs, atol=1e-6), key


def test_the_target_loads_every_text_weight_and_skips_vision_and_head(tiny_checkpoint):
    m = load_model(tiny_checkpoint)
    info = m.info
    stored = {}
    for f in sorted({e.file for e in info.tensors.values()}):
        stored |= load_file(str(info.path / f))
    loaded = m.target.state_dict()
    for name, value in stored.items():
        if name.startswith(("mtp.", "model.visual.")):
            continue
        ours = name.replace("model.language_model.", "model.")
        assert torch.equal(loaded[ours], value), name
    assert not any(k.startswith(("mtp", "model.visual")) for k in loaded)


def test_the_head_is_read_from_only_the_shards_that_hold_it(make_checkpoint, monkeypatch):
    import safetensors

    path = make_checkpoint(shards=3)
    info = read_checkpoint(path)
    head_files = {info.tensors[n].file for n in info.head_names}
    assert len({e.file for e in info.tensors.values()}) == 3 and len(head_files) < 3
    opened = []
    real = safetensors.safe_open

    def spy(filename, *args, **kwargs):
        opened.append(Path(filename).name)
        return real(filename, *args, **kwargs)

    monkeypatch.setattr(safetensors, "safe_open", spy)
    tensors = load_head_tensors(info)
    assert set(opened) == head_files
    assert len(tensors) == 15 and all(not k.startswith("mtp.") for k in tensors)


# --- errors a user can cause: one line, the fix, exit 2 ------------------------------------------


def single_file_copy(src: Path, dst: Path, edit=None) -> Path:
    """Copy a checkpoint into one model.safetensors, optionally editing its tensor dict."""
    shutil.copytree(src, dst)
    tensors = {}
    for f in sorted(dst.glob("*.safetensors")):
        tensors |= load_file(str(f))
        f.unlink()
    (dst / "model.safetensors.index.json").unlink(missing_ok=True)
    if edit:
        edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def assert_one_line_exit_2(result, *needles):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_a_missing_model_directory_is_one_line_and_exit_2(tmp_path):
    assert_one_line_exit_2(run_cli("inspect", tmp_path / "nope"), "nope", "not found")


def test_a_directory_without_config_json_is_one_line_and_exit_2(tmp_path):
    assert_one_line_exit_2(run_cli("inspect", tmp_path), "no config.json")


def test_an_unsupported_model_type_lists_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert_one_line_exit_2(run_cli("inspect", tmp_path), "'llama'", "qwen3_5", "qwen3_5_text")


def test_a_checkpoint_without_mtp_tensors_says_it_ships_no_head(tiny_checkpoint, tmp_path):
    d = single_file_copy(tiny_checkpoint, tmp_path / "c", lambda t: [t.pop(k) for k in list(t) if k.startswith("mtp.")])
    assert_one_line_exit_2(run_cli("inspect", d), "ships no MTP head")


def test_a_missing_head_tensor_is_named(tiny_checkpoint, tmp_path):
    d = single_file_copy(tiny_checkpoint, tmp_path / "c", lambda t: t.pop("mtp.layers.0.self_attn.k_norm.weight"))
    assert_one_line_exit_2(run_cli("inspect", d), "mtp.layers.0.self_attn.k_norm.weight", "missing")


def test_a_misshapen_head_tensor_is_named_with_expected_and_found_shapes(tiny_checkpoint, tmp_path):
    def shrink(t):
        t["mtp.fc.weight"] = t["mtp.fc.weight"][:, :100].contiguous()

    d = single_file_copy(tiny_checkpoint, tmp_path / "c", shrink)
    assert_one_line_exit_2(run_cli("inspect", d), "mtp.fc.weight", "[64, 100]", "expected [64, 128]")


def test_a_vlm_config_whose_text_config_disagrees_on_tying_is_refused(tiny_checkpoint, tmp_path):
    d = tmp_path / "c"
    shutil.copytree(tiny_checkpoint, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["text_config"]["tie_word_embeddings"] = True
    (d / "config.json").write_text(json.dumps(cfg))
    assert_one_line_exit_2(run_cli("inspect", d), "tie_word_embeddings")


def test_the_debug_variable_shows_the_traceback(tmp_path):
    import os

    result = run_cli("inspect", tmp_path / "nope", env=dict(os.environ, MTP_OBSERVE_DEBUG="1"))
    assert result.returncode != 0 and "Traceback" in result.stderr


@pytest.mark.parametrize("layout", ["vlm", "text"])
def test_both_layouts_read_the_same_geometry(make_checkpoint, layout):
    info = read_checkpoint(make_checkpoint(layout=layout, shards=1))
    assert info.layout == layout
    assert info.geometry.hidden_size == 64 and info.geometry.rotary_dim == 8
    assert info.text_prefix == ("model.language_model." if layout == "vlm" else "model.")
