"""A generated corpus of malformed checkpoints through inspect, sessions, replay and probe: every one is
refused with exit 2 and one line naming the file and what is wrong, or accepted and answered correctly.
No tracebacks (issue #12, item 6).

Each kind is a mutation of a copy of the tiny checkpoint (2 shards, VLM layout). `fails` names the
commands that must refuse it; the others must accept it (inspect then prints exactly the pristine
checkpoint's numbers).
"""

from __future__ import annotations

import json
import math
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from .fuzzing import run_cli
from .test_replay import SESSION, write_sessions

CHECKPOINT = ("inspect", "sessions", "replay", "probe")  # refused by every command that reads the checkpoint
TOKENIZER = ("sessions", "replay")  # refused by the commands that render sessions


@dataclass(frozen=True)
class Kind:
    edit: object  # edit(directory) mutates the copy in place
    needles: tuple[str, ...]  # in the one error line (the first names the file)
    fails: tuple[str, ...] = CHECKPOINT
    model: str = ""  # the model path relative to the copy ("" = the copy itself)


def config(edit):
    def apply(d: Path):
        cfg = json.loads((d / "config.json").read_text())
        edit(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    return apply


def text_config(**values):
    def edit(cfg):
        for key, value in values.items():
            if value is _DELETE:
                cfg["text_config"].pop(key)
            else:
                cfg["text_config"][key] = value
    return config(edit)


def rope(**values):
    return config(lambda cfg: cfg["text_config"]["rope_parameters"].update(values))


def write(name: str, data: bytes | str):
    def apply(d: Path):
        (d / name).write_bytes(data.encode() if isinstance(data, str) else data)
    return apply


def remove(name: str):
    return lambda d: (d / name).unlink()


_DELETE = object()
HEAD_SHARD = "model-00002-of-00002.safetensors"
FIRST_SHARD = "model-00001-of-00002.safetensors"


def header(shard: str, edit):
    """Rewrite a shard's JSON header (edit(header dict) -> header dict, or bytes for the raw header)."""
    def apply(d: Path):
        raw = (d / shard).read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        new = edit(json.loads(raw[8:8 + n]))
        blob = new if isinstance(new, bytes) else json.dumps(new).encode()
        (d / shard).write_bytes(struct.pack("<Q", len(blob)) + blob + raw[8 + n:])
    return apply


def entry(name: str, **values):
    def edit(h):
        h[name].update(values)
        return h
    return edit


def raw_bytes(shard: str, fn):
    def apply(d: Path):
        (d / shard).write_bytes(fn((d / shard).read_bytes()))
    return apply


def tensors(shard: str, fn):
    def apply(d: Path):
        t = load_file(str(d / shard))
        fn(t)
        save_file(t, str(d / shard), metadata={"format": "pt"})
    return apply


def index(edit):
    def apply(d: Path):
        p = d / "model.safetensors.index.json"
        idx = json.loads(p.read_text())
        out = edit(idx)
        p.write_text(out if isinstance(out, str) else json.dumps(idx))
    return apply


def duplicate_into_head_shard(d: Path):
    first, head = load_file(str(d / FIRST_SHARD)), load_file(str(d / HEAD_SHARD))
    head["lm_head.weight"] = first["lm_head.weight"]
    save_file(head, str(d / HEAD_SHARD), metadata={"format": "pt"})


def grow_tokenizer(d: Path, words=("order status", "has shipped")):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    # 990 tokens (markup included), 11 more, then words the session uses: ids 1001.. >= vocab_size 1001
    tok.add_tokens([f"<extra_{i}>" for i in range(11)] + list(words))
    tok.save(str(d / "tokenizer.json"))


def template(text: str, prepend: bool = False):
    def apply(d: Path):
        p = d / "chat_template.jinja"
        p.write_text(text + (p.read_text() if prepend else ""))
    return apply


def yarn_without_factor(cfg):
    cfg["text_config"]["rope_parameters"] |= {"rope_type": "yarn", "original_max_position_embeddings": 32}


KINDS: dict[str, Kind] = {
    # config.json
    "config is not JSON": Kind(write("config.json", "{not json"), ("config.json", "not readable as JSON")),
    "config is not UTF-8": Kind(write("config.json", b"\xff\xfe{\x00"), ("config.json", "not readable as JSON")),
    "config is a list": Kind(write("config.json", "[1, 2]"), ("config.json", "expected a JSON object")),
    "model_type missing": Kind(config(lambda c: c.pop("model_type")), ("config.json", "unsupported model_type None")),
    "model_type a list": Kind(config(lambda c: c.__setitem__("model_type", ["qwen3_5"])), ("config.json", "unsupported model_type")),
    "text_config a string": Kind(config(lambda c: c.__setitem__("text_config", "x")), ("config.json", "text_config object")),
    "text_config model_type of another family": Kind(text_config(model_type="llama"), ("config.json", "text_config.model_type")),
    "hidden_size a string": Kind(text_config(hidden_size="64"), ("config.json", "hidden_size", "expected an integer")),
    "hidden_size zero": Kind(text_config(hidden_size=0), ("config.json", "hidden_size is 0")),
    "hidden_size negative": Kind(text_config(hidden_size=-64), ("config.json", "hidden_size is -64")),
    "hidden_size absurd": Kind(text_config(hidden_size=10 ** 12), ("config.json", "hidden_size is 1,000,000,000,000")),
    "hidden_size missing": Kind(text_config(hidden_size=_DELETE), ("config.json", "no hidden_size")),
    "heads a float": Kind(text_config(num_attention_heads=4.5), ("config.json", "num_attention_heads", "expected an integer")),
    "kv heads do not divide heads": Kind(text_config(num_key_value_heads=3), ("config.json", "does not divide")),
    "vocab_size a boolean": Kind(text_config(vocab_size=True), ("config.json", "vocab_size", "expected an integer")),
    "eps NaN": Kind(text_config(rms_norm_eps=math.nan), ("config.json", "rms_norm_eps is nan")),
    "eps negative": Kind(text_config(rms_norm_eps=-1e-6), ("config.json", "rms_norm_eps", "positive")),
    "eps a string": Kind(text_config(rms_norm_eps="1e-6"), ("config.json", "rms_norm_eps", "expected a number")),
    "theta NaN": Kind(rope(rope_theta=math.nan), ("config.json", "rope_theta is nan")),
    "theta zero": Kind(rope(rope_theta=0), ("config.json", "rope_theta", "positive")),
    "partial rotary factor over 1": Kind(rope(partial_rotary_factor=2.0), ("config.json", "partial_rotary_factor", "at most 1")),
    "partial rotary factor too small": Kind(rope(partial_rotary_factor=0.01), ("config.json", "partial_rotary_factor", "rotary dims")),
    "rope_parameters a list": Kind(text_config(rope_parameters=[1]), ("config.json", "rope_parameters", "expected an object")),
    "rope type the head lacks": Kind(rope(rope_type="longrope"), ("config.json", "rope_type 'longrope'", "not implemented")),
    "yarn without factor": Kind(config(yarn_without_factor), ("config.json", "factor", "missing")),
    "tie_word_embeddings a string": Kind(config(lambda c: c.__setitem__("tie_word_embeddings", "yes")), ("config.json", "tie_word_embeddings", "true or false")),
    "two MTP layers, the weights of one": Kind(text_config(mtp_num_hidden_layers=2), ("mtp.layers.1.", "is missing")),
    "zero MTP layers": Kind(text_config(mtp_num_hidden_layers=0), ("config.json", "mtp_num_hidden_layers is 0")),
    "layer_types too short": Kind(text_config(layer_types=["full_attention"]), ("config.json", "layer_types", "one type per layer")),
    "layer_types entry unknown": Kind(text_config(layer_types=["linear_attention", "full_attention", "sliding", "full_attention"]), ("config.json", "layer_types[2]", "'sliding'")),
    "hidden_act not silu": Kind(text_config(hidden_act="gelu"), ("config.json", "hidden_act is 'gelu'")),
    "num_hidden_layers zero": Kind(text_config(num_hidden_layers=0), ("config.json", "num_hidden_layers is 0")),
    "max_position_embeddings negative": Kind(text_config(max_position_embeddings=-1), ("config.json", "max_position_embeddings is -1")),
    "intermediate_size missing": Kind(text_config(intermediate_size=_DELETE), ("config.json", "no intermediate_size")),
    "intermediate_size disagrees with the weights": Kind(text_config(intermediate_size=97), ("mtp.layers.0.mlp.gate_proj.weight", "expected [97, 64]")),
    "quantization GPTQ": Kind(config(lambda c: c.__setitem__("quantization_config", {"quant_method": "gptq", "bits": 4})), ("config.json", "'gptq'")),
    "quantization_config a string": Kind(config(lambda c: c.__setitem__("quantization_config", "fp8")), ("config.json", "quantization_config", "expected an object")),
    # safetensors headers
    "shard of three bytes": Kind(write(HEAD_SHARD, b"abc"), (HEAD_SHARD, "3 bytes")),
    "header length absurd": Kind(raw_bytes(HEAD_SHARD, lambda b: struct.pack("<Q", 2 ** 60) + b[8:]), (HEAD_SHARD, "header length", "absurd")),
    "header length past the end": Kind(raw_bytes(HEAD_SHARD, lambda b: struct.pack("<Q", len(b)) + b[8:]), (HEAD_SHARD, "runs past the end")),
    "header not JSON": Kind(header(HEAD_SHARD, lambda h: b"{oops" + b" " * 100), (HEAD_SHARD, "header is not JSON")),
    "header a list": Kind(header(HEAD_SHARD, lambda h: b"[1]"), (HEAD_SHARD, "not an object")),
    "dtype unknown": Kind(header(HEAD_SHARD, entry("mtp.fc.weight", dtype="Q4_K")), (HEAD_SHARD, "mtp.fc.weight", "unknown dtype 'Q4_K'")),
    "shape negative": Kind(header(HEAD_SHARD, entry("mtp.norm.weight", shape=[-64])), (HEAD_SHARD, "mtp.norm.weight", "shape")),
    "shape a string": Kind(header(HEAD_SHARD, entry("mtp.norm.weight", shape="64")), (HEAD_SHARD, "mtp.norm.weight", "shape")),
    "offsets past the end (truncated shard)": Kind(raw_bytes(HEAD_SHARD, lambda b: b[:-1000]), (HEAD_SHARD, "truncated")),
    "offsets disagree with the shape": Kind(header(HEAD_SHARD, entry("mtp.norm.weight", shape=[65])), (HEAD_SHARD, "mtp.norm.weight", "needs 260")),
    "offsets leave a gap": Kind(raw_bytes(HEAD_SHARD, lambda b: b + b"\0" * 8), (HEAD_SHARD, "cover")),
    "metadata not strings": Kind(header(HEAD_SHARD, lambda h: h | {"__metadata__": {"format": 1}}), (HEAD_SHARD, "__metadata__")),
    "integer norm": Kind(header(HEAD_SHARD, entry("mtp.norm.weight", dtype="I32")), (HEAD_SHARD, "mtp.norm.weight", "stored as I32")),
    "boolean attention weight": Kind(tensors(HEAD_SHARD, lambda t: t.__setitem__("mtp.layers.0.self_attn.v_proj.weight", t["mtp.layers.0.self_attn.v_proj.weight"] > 0)),
                                     (HEAD_SHARD, "v_proj.weight", "stored as BOOL")),
    "routed experts in a dense model": Kind(tensors(FIRST_SHARD, lambda t: t.__setitem__(
        "model.language_model.layers.0.mlp.experts.gate_up_proj", t["model.language_model.layers.0.mlp.gate_proj.weight"][None].clone())),
        ("experts.gate_up_proj", "routed expert", "dense")),
    "tensor in two shards": Kind(duplicate_into_head_shard, ("lm_head.weight", "also in")),
    # the index
    "index names a missing shard": Kind(remove(FIRST_SHARD), (FIRST_SHARD, "missing")),
    "index not JSON": Kind(write("model.safetensors.index.json", "{"), ("model.safetensors.index.json", "not readable as JSON")),
    "index weight_map a list": Kind(index(lambda i: i.__setitem__("weight_map", [1])), ("model.safetensors.index.json", "weight_map")),
    "index puts a tensor in the wrong shard": Kind(index(lambda i: i["weight_map"].__setitem__("mtp.fc.weight", FIRST_SHARD)),
                                                   ("model.safetensors.index.json", "mtp.fc.weight")),
    "index names a path outside the checkpoint": Kind(index(lambda i: i["weight_map"].__setitem__("mtp.fc.weight", "../x.safetensors")),
                                                      ("model.safetensors.index.json", "not a shard file name")),
    # generation config, tokenizer, template: only what renders sessions reads them
    "generation_config not JSON": Kind(write("generation_config.json", "{"), ("generation_config.json", "not readable as JSON"), TOKENIZER),
    "generation_config eos a string": Kind(write("generation_config.json", json.dumps({"eos_token_id": "</s>"})), ("generation_config.json", "eos_token_id"), TOKENIZER),
    "config eos a list of strings": Kind(text_config(eos_token_id=["x"]), ("config.json", "eos_token_id"), TOKENIZER),
    "tokenizer.json not JSON": Kind(write("tokenizer.json", "{"), ("tokenizer", "cannot load"), TOKENIZER),
    "tokenizer.json missing": Kind(remove("tokenizer.json"), ("tokenizer.json", "missing"), TOKENIZER),
    "tokenizer_config not JSON": Kind(write("tokenizer_config.json", "{"), ("tokenizer_config.json", "not readable as JSON"), TOKENIZER),
    "tokenizer renders ids past the vocabulary": Kind(grow_tokenizer, ("s.jsonl", ">= the model's vocabulary (1001)", "do not belong together"), TOKENIZER),
    "tokenizer larger than the vocabulary, ids in range": Kind(lambda d: grow_tokenizer(d, words=()), ("",), fails=()),
    "template raises with a message": Kind(template("{{ raise_exception('templates are off today') }}"), ("s.jsonl", "templates are off today"), TOKENIZER),
    "template raises without a message": Kind(template("{{ raise_exception('') }}"), ("s.jsonl", "cannot render", "no message"), TOKENIZER),
    "template does not parse": Kind(template("{% if %}"), ("s.jsonl", "cannot render"), TOKENIZER),
    "template raises only without tool calls": Kind(template(
        "{%- for m in messages %}{%- if m.role == 'assistant' and m.content == 'Checking.' and not m.tool_calls %}"
        "{{ raise_exception('') }}{%- endif %}{%- endfor %}", prepend=True), ("s.jsonl", "without its tool calls"), TOKENIZER),
    # the model path itself
    "model path is a file": Kind(lambda d: None, ("config.json", "not a directory"), model="config.json"),
    "model path missing": Kind(lambda d: None, ("nowhere", "not found"), model="nowhere"),
    "no config.json": Kind(remove("config.json"), ("no config.json",)),
    "no safetensors": Kind(lambda d: [f.unlink() for f in d.glob("*.safetensors*")], ("no *.safetensors",)),
}


@pytest.fixture(scope="module")
def pristine(tiny_checkpoint):
    code, out, err = run_cli(["inspect", str(tiny_checkpoint), "--json"])
    assert code == 0, err
    report = json.loads(out)
    report.pop("model")
    return report


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_malformed_checkpoint_is_one_line_and_exit_2_or_accepted_and_correct(tiny_checkpoint, tmp_path, pristine, kind):
    k = KINDS[kind]
    d = tmp_path / "checkpoint"
    shutil.copytree(tiny_checkpoint, d)
    k.edit(d)
    model = str(d / k.model) if k.model else str(d)
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    commands = {
        "inspect": ["inspect", model, "--json"],
        "sessions": ["sessions", str(sessions), "--model", model],
        "replay": ["replay", str(sessions), "--model", model, "--out", str(tmp_path / "run"), "--device", "cpu"],
        "probe": ["probe", model, "--context", "8", "--k", "1", "--repeats", "1", "--device", "cpu", "-o", str(tmp_path / "p.json")],
    }
    lines = {}
    for name, argv in commands.items():
        if name == "probe" and name not in k.fails:
            continue  # probe reads no tokenizer: it would accept and measure, which test_probe covers
        code, out, err = run_cli(argv)
        assert "Traceback" not in err, f"{name}: {err}"
        if name in k.fails:
            got = err.strip().splitlines()
            if name == "replay":  # the progress bar's last frame may precede the error (hardening's item 10)
                got = [line for line in got if not line.startswith("replaying ")]
            assert code == 2 and len(got) == 1 and got[0].startswith("error: "), f"{name}: exit {code}: {err}"
            for needle in k.needles:
                assert needle in got[0], f"{name}: {needle!r} not in {got[0]}"
            lines[name] = got[0]
        else:
            assert code == 0, f"{name} should accept it: {err}"
            if name == "inspect":
                report = json.loads(out)
                report.pop("model")
                assert report == pristine
    # The commands that read the same thing say the same thing about it.
    checkpoint_lines = {lines[c] for c in ("inspect", "probe") if c in lines}
    assert len(checkpoint_lines) <= 1, checkpoint_lines


def test_the_corpus_holds_at_least_thirty_kinds():
    assert len(KINDS) >= 30
    assert len({k.needles[0] for k in KINDS.values()}) >= 10  # many different files named


# --- the NextN families' config keys and layer (DeepSeek-V3 and GLM-4.5 tiny checkpoints) -------------------------

NEXTN_LAYER = "model.layers.4."


def nextn_config(**values):
    def edit(cfg):
        for key, value in values.items():
            if value is _DELETE:
                cfg.pop(key)
            else:
                cfg[key] = value
    return config(edit)


def merged_tensors(fn):
    """Every shard's tensors in one model.safetensors, edited by fn(tensors)."""
    def apply(d: Path):
        t = {}
        for f in sorted(d.glob("*.safetensors")):
            t |= load_file(str(f))
            f.unlink()
        (d / "model.safetensors.index.json").unlink(missing_ok=True)
        fn(t)
        save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    return apply


def drop_layer(t):
    for name in [n for n in t if n.startswith(NEXTN_LAYER)]:
        t.pop(name)


NEXTN_KINDS: dict[str, tuple[str, object, tuple[str, ...]]] = {  # family, edit, needles
    "scoring_func softmax": ("deepseek_v3", nextn_config(scoring_func="softmax"), ("config.json", "scoring_func is 'softmax'", "not 'sigmoid'")),
    "topk_method missing": ("deepseek_v3", nextn_config(topk_method=_DELETE), ("config.json", "topk_method is None", "noaux_tc")),
    "moe_layer_freq 2": ("deepseek_v3", nextn_config(moe_layer_freq=2), ("config.json", "moe_layer_freq is 2", "vLLM honours it")),
    "n_group does not divide the experts": ("deepseek_v3", nextn_config(n_group=3), ("config.json", "n_group (3) does not divide n_routed_experts (8)")),
    "topk_group over n_group": ("deepseek_v3", nextn_config(topk_group=5), ("config.json", "topk_group is 5, more than n_group (4)")),
    "more experts per token than the kept groups hold": ("deepseek_v3", nextn_config(num_experts_per_tok=5), ("config.json", "num_experts_per_tok is 5", "4 experts")),
    "rope_interleave false": ("deepseek_v3", nextn_config(rope_interleave=False), ("config.json", "rope_interleave is false")),
    "MLA with attention_bias": ("deepseek_v3", nextn_config(attention_bias=True), ("config.json", "attention_bias is true", "no bias")),
    "routed_scaling_factor missing": ("deepseek_v3", nextn_config(routed_scaling_factor=_DELETE), ("config.json", "routed_scaling_factor is absent", "1.0", "2.5")),
    "linear rope scaling": ("deepseek_v3", nextn_config(rope_scaling={"type": "linear", "factor": 2.0}), ("config.json", "'linear'", "deepseek_yarn")),
    "yarn attention_factor": ("deepseek_v3", config(lambda c: c["rope_scaling"].update(attention_factor=1.0)), ("config.json", "attention_factor")),
    "two NextN layers": ("deepseek_v3", nextn_config(num_nextn_predict_layers=2), ("config.json", "num_nextn_predict_layers is 2")),
    "no shared experts": ("glm4_moe", nextn_config(n_shared_experts=0), ("config.json", "n_shared_experts is 0")),
    "kv_lora_rank disagrees with the weights": ("deepseek_v3", nextn_config(kv_lora_rank=12), ("kv_a_proj_with_mqa.weight", "expected [20, 64]")),
    "GLM head_dim disagrees with the weights": ("glm4_moe", nextn_config(head_dim=16), ("self_attn.q_proj.weight", "expected [64, 64]")),
    "no NextN layer": ("deepseek_v3", merged_tensors(drop_layer), ("no NextN layer", "model.layers.4.", "quantized without including")),
    "correction bias missing": ("glm4_moe", merged_tensors(lambda t: t.pop(NEXTN_LAYER + "mlp.gate.e_score_correction_bias")),
                                ("mlp.gate.e_score_correction_bias", "missing", "expected shape [8]")),
    "misshapen shared_head.head copy": ("deepseek_v3", merged_tensors(lambda t: t.__setitem__(
        NEXTN_LAYER + "shared_head.head.weight", t[NEXTN_LAYER + "shared_head.head.weight"][:1000].clone())),
        ("shared_head.head.weight", "[1000, 64]", "a copy of the target's")),
    "a second NextN layer's tensor": ("glm4_moe", merged_tensors(lambda t: t.__setitem__("model.layers.5.enorm.weight", t[NEXTN_LAYER + "enorm.weight"].clone())),
                                      ("model.layers.5.enorm.weight", "second NextN layer")),
    "a tensor no NextN layer has": ("glm4_moe", merged_tensors(lambda t: t.__setitem__(NEXTN_LAYER + "mlp.shared_expert_gate.weight", t[NEXTN_LAYER + "enorm.weight"][None].clone())),
                                    ("mlp.shared_expert_gate.weight", "not part of a moe glm4_moe NextN layer")),
}


@pytest.mark.parametrize("kind", list(NEXTN_KINDS))
def test_a_malformed_nextn_checkpoint_is_one_line_and_exit_2(make_checkpoint, tmp_path, kind):
    family, edit, needles = NEXTN_KINDS[kind]
    d = tmp_path / "checkpoint"
    shutil.copytree(make_checkpoint(family=family, layout="text"), d)
    edit(d)
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    lines = set()
    for argv in (["inspect", str(d), "--json"],
                 ["replay", str(sessions), "--model", str(d), "--out", str(tmp_path / "run"), "--device", "cpu"]):
        code, _, err = run_cli(argv)
        got = [line for line in err.strip().splitlines() if not line.startswith("replaying ")]
        assert code == 2 and len(got) == 1 and got[0].startswith("error: ") and "Traceback" not in err, f"{argv[0]}: {err}"
        for needle in needles:
            assert needle in got[0], f"{argv[0]}: {needle!r} not in {got[0]}"
        lines.add(got[0])
    assert len(lines) == 1, lines
