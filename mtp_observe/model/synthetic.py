"""Checkpoints written in the real Qwen3.5-family layouts: random ones for tests and benchmarks,
block-FP8 copies of them, and the saver the default-model training script uses.

Contract: `save_checkpoint` writes exactly what a released checkpoint holds — config.json
(VLM wrapper with `text_config` and `vision_config`, or text-only), `model.safetensors` or
shards with `model.safetensors.index.json`, text weights under `model.language_model.*` (or
`model.*`), vision under `model.visual.*`, `lm_head.weight` (absent when tied) and `mtp.*` at
the top level, generation_config.json, and tokenizer files with a chat template.
`write_synthetic_checkpoint` fills one with random weights (norm weights visibly non-zero,
so a `x * w` norm cannot pass for `x * (1 + w)`). Nothing is downloaded.

Families (SyntheticSpec.family), with the released configs' key sets:
  qwen3_5      dense, the default (and the bundled model's family)
  qwen3_5_moe  Qwen3.5-35B-A3B-style: VLM wrapper, text_config `qwen3_5_moe_text` with num_experts,
               num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size and no
               dense intermediate_size (and, as released, no norm_topk_prob: renormalised)
  qwen3_next   Qwen3-Next-80B-A3B-style: text-only, flat rope_theta / partial_rotary_factor,
               full_attention_interval instead of layer_types, decoder_sparse_step, mlp_only_layers,
               norm_topk_prob, a dense intermediate_size beside the MoE numbers, untied lm_head
  deepseek_v3  DeepSeek-V3-style: text-only, MLA (q_lora_rank, kv_lora_rank, qk_nope / qk_rope / v head dims),
               yarn rope_scaling as released (factor 40, mscale 1, mscale_all_dim 1), noaux_tc sigmoid routing in
               groups with routed_scaling_factor, first_k_dense_replace, and the NextN layer at
               `model.layers.{num_hidden_layers}` (enorm, hnorm, eh_proj, the decoder layer, shared_head.norm,
               the copies embed_tokens / shared_head.head as released, or absent, or distinct: nextn_copies)
  glm4_moe     GLM-4.5-style: text-only, GQA with q/k/v bias, qk-norm, partial_rotary_factor 0.5, the same router
               (one group) and the same NextN layout
Routed experts are written fused (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj`
[E, H, I], no `.weight`: the Qwen3.5-MoE BF16 releases) or per expert
(`experts.{e}.{gate,up,down}_proj.weight`: Qwen3-Next and the FP8 releases), for the target
and the head alike. Block-FP8 (`write_fp8_copy`, or SyntheticSpec.quantization = "fp8")
quantises the attention, MLP, expert and linear-attention projections per 128x128 block
(`quantize_fp8_blockwise`, F32 or BF16 `weight_scale_inv`), keeps embeddings, lm_head,
mtp.fc, routers, shared-expert gates, norms and the small linear-attention projections in
their float dtype and lists those modules in `modules_to_not_convert`, with the
quantization_config at the top level as the releases put it.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKUP_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def chat_template() -> str:
    """The ChatML template of this package (Qwen3.5-style tools, tool calls and reasoning)."""
    return (Path(__file__).parents[1] / "assets" / "chat_template.jinja").read_text()


@dataclass(frozen=True)
class ChatFormat:
    """A chat template in the shape of a released family's, with the tokens it needs (written by this project:
    mtp_observe/assets/chat_templates/, each file's header says what shape it reproduces)."""

    template: str | None  # file name under assets/chat_templates/; None: the package's ChatML (Qwen3.5 shape)
    added: tuple[str, ...]  # special and markup tokens the template uses, beyond SPECIAL_TOKENS and MARKUP_TOKENS
    eos_token: str  # tokenizer_config's eos_token
    bos_token: str | None
    end_tokens: tuple[str, ...]  # generation_config's eos_token_id, in the release's order


_DEEPSEEK_TOKENS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                    "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
                    "<｜tool▁output▁end｜>")
_DEEPSEEK = dict(added=_DEEPSEEK_TOKENS, eos_token="<｜end▁of▁sentence｜>", bos_token="<｜begin▁of▁sentence｜>",
                 end_tokens=("<｜end▁of▁sentence｜>",))
CHAT_FORMATS = {
    "chatml": ChatFormat(None, (), "<|im_end|>", None, ("<|im_end|>", "<|endoftext|>")),
    "deepseek_v3": ChatFormat("deepseek_v3.jinja", **_DEEPSEEK),  # no thinking
    "deepseek_v31": ChatFormat("deepseek_v31.jinja", **_DEEPSEEK),  # `thinking` switch; history without reasoning
    "deepseek_r1": ChatFormat("deepseek_r1.jinja", **_DEEPSEEK),  # always thinking; reasoning stripped everywhere
    # GLM-4.5: implicit end of turn; eos_token_id [<|endoftext|>, <|user|>, <|observation|>] as released
    "glm4_5": ChatFormat("glm4_5.jinja", ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
                                          "<|observation|>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
                         "<|endoftext|>", None, ("<|endoftext|>", "<|user|>", "<|observation|>")),
}


def family_chat_template(chat_format: str) -> str:
    """The template text of a CHAT_FORMATS entry."""
    name = CHAT_FORMATS[chat_format].template
    if name is None:
        return chat_template()
    return (Path(__file__).parents[1] / "assets" / "chat_templates" / name).read_text()


# ---------------------------------------------------------------------------------------------
# Tokenizer


def _default_corpus() -> list[str]:
    """A fixed, varied text: prose, JSON, code and the template's own strings."""
    rng = random.Random(1234)
    words = (
        "the a to of and in is for on with that this it you be are as at by from or can will your "
        "order flight booking user account refund cancel status item price total customer support "
        "file line test error function return value import class def self path python bash run "
        "name arguments city date time amount id number reservation passenger payment please thank "
        "check update search read write edit create list get set find fix bug result output input"
    ).split()
    corpus = [chat_template()]
    for _ in range(400):
        n = rng.randint(5, 25)
        corpus.append(" ".join(rng.choice(words) for _ in range(n)).capitalize() + ".")
        key, val = rng.choice(words), rng.choice(words)
        corpus.append(json.dumps({"name": f"get_{key}", "arguments": {key: val, "id": rng.randint(0, 9999)}}))
        corpus.append(f"def {key}_{val}(x):\n    return x + {rng.randint(0, 99)}\n")
    return corpus


def train_tokenizer(corpus: list[str], vocab_size: int, isolate_newlines: bool = False, extra_added: tuple[str, ...] = ()):
    """A byte-level BPE (`tokenizers`) with ChatML special tokens; encodes any text.

    isolate_newlines pre-splits every "\n" on its own, so a prompt ending in "\n" always
    tokenizes as a prefix of its continuation (no "\n\n" token can straddle the cut).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\n"), behavior="isolated"), byte_level])
        if isolate_newlines else byte_level
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(MARKUP_TOKENS) - len(extra_added), special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens(MARKUP_TOKENS)
    if extra_added:
        tok.add_special_tokens(list(extra_added))
    assert tok.get_vocab_size() <= vocab_size, (tok.get_vocab_size(), vocab_size)
    return tok


def write_tokenizer(directory: Path, tokenizer, template: str | None = None, fmt: ChatFormat = CHAT_FORMATS["chatml"]) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "TokenizersBackend",
        "bos_token": fmt.bos_token,
        "eos_token": fmt.eos_token,
        "pad_token": "<|endoftext|>",
        "model_max_length": 262144,
        "add_bos_token": False,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "chat_template.jinja").write_text(template if template is not None else chat_template())


# ---------------------------------------------------------------------------------------------
# Saving in the real layout


# The released architectures / wrapper names of each family (config.json's top level).
FAMILY_CONFIG = {
    "qwen3_5": {"vlm": ("qwen3_5", "Qwen3_5ForConditionalGeneration", "qwen3_5_text", "qwen3_5_vision"),
                "text": ("qwen3_5_text", "Qwen3_5ForCausalLM")},
    "qwen3_5_moe": {"vlm": ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe_text", "qwen3_5_moe_vision"),
                    "text": ("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM")},
    "qwen3_next": {"text": ("qwen3_next", "Qwen3NextForCausalLM")},
    "deepseek_v3": {"text": ("deepseek_v3", "DeepseekV3ForCausalLM")},
    "glm4_moe": {"text": ("glm4_moe", "Glm4MoeForCausalLM")},
}
NEXTN = ("deepseek_v3", "glm4_moe")
FP8_BLOCK = (128, 128)
FP8_MAX = 448.0  # largest finite float8_e4m3fn
# Modules a block-FP8 release quantises (attention, MLP, experts, shared expert, linear attention's big projections).
FP8_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "gate_up_proj",
               "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj",
               "in_proj_qkv", "in_proj_z", "in_proj_qkvz", "out_proj")


def split_experts(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Fused experts (`*.experts.gate_up_proj` [E, 2I, H], `*.experts.down_proj` [E, H, I]) -> per expert
    (`*.experts.{e}.{gate,up,down}_proj.weight`); other tensors unchanged."""
    out = {}
    for name, t in state.items():
        if name.endswith("experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :inter].clone()
                out[f"{base}{e}.up_proj.weight"] = t[e, inter:].clone()
        elif name.endswith("experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].clone()
        else:
            out[name] = t
    return out


def fp8_quantised(name: str, t: Tensor) -> bool:
    """Whether a block-FP8 release stores this tensor as F8_E4M3 (module doc)."""
    if name.startswith("model.visual.") or t.dim() < 2 or name.endswith("conv1d.weight"):
        return False
    module = name.removesuffix(".weight").rsplit(".", 1)[-1]
    return module in FP8_MODULES


def quantize_fp8_blockwise(w: Tensor, block: tuple[int, int] = FP8_BLOCK, scale_dtype=torch.float32) -> tuple[Tensor, Tensor]:
    """w: [..., R, C] -> (q [..., R, C] float8_e4m3fn, weight_scale_inv [..., ceil(R/br), ceil(C/bc)] scale_dtype).

    Per block: scale = amax / 448 (stored in scale_dtype, and that stored value is the one q is computed
    with), q = w / scale rounded to e4m3; the serving value is q * scale (weights.dequantize_blockwise).
    The last block of a dimension that is not a multiple of the block is partial (padded with zeros here).
    """
    br, bc = block
    *lead, R, C = w.shape
    Rb, Cb = -(-R // br), -(-C // bc)
    padded = torch.zeros(*lead, Rb * br, Cb * bc, dtype=torch.float32)
    padded[..., :R, :C] = w.float()
    blocks = padded.reshape(*lead, Rb, br, Cb, bc)
    amax = blocks.abs().amax(dim=(-3, -1))  # [..., Rb, Cb]
    scale = (amax / FP8_MAX).clamp(min=1e-12).to(scale_dtype)
    expanded = scale.float()[..., :, None, :, None]
    q = (blocks / expanded).clamp(-FP8_MAX, FP8_MAX).reshape(*lead, Rb * br, Cb * bc)[..., :R, :C]
    return q.to(torch.float8_e4m3fn).contiguous(), scale.contiguous()


def quantize_state(tensors: dict[str, Tensor], scale_dtype=torch.float32, block=FP8_BLOCK,
                   only_head: bool = False) -> tuple[dict[str, Tensor], list[str]]:
    """Block-FP8 the tensors a release quantises -> (tensors with their weight_scale_inv, modules_to_not_convert).
    only_head: the head's (`mtp.*`) alone, the target left as it is."""
    out, keep = {}, set()
    for name, t in tensors.items():
        if fp8_quantised(name, t) and (name.startswith("mtp.") or not only_head):
            out[name], out[name + "_scale_inv"] = quantize_fp8_blockwise(t, block, scale_dtype)
        else:
            out[name] = t
            if t.dim() >= 2 and not name.startswith("model.visual.") and name.endswith(".weight"):
                keep.add(name.removesuffix(".weight"))
    if any(n.startswith("model.visual.") for n in tensors):
        keep.add("model.visual")
    return out, sorted(keep)


def fp8_quantization_config(block=FP8_BLOCK, modules_to_not_convert=()) -> dict:
    """The quantization_config of the official FP8 releases (config.json's top level)."""
    return {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": list(block),
            "modules_to_not_convert": list(modules_to_not_convert)}


def save_checkpoint(
    directory: str | Path,
    *,
    text_config: dict,
    text_state: dict[str, Tensor],
    lm_head: Tensor | None,
    head_state: dict[str, Tensor],
    head_prefix: str = "mtp.",
    layout: str = "vlm",
    tie_word_embeddings: bool = False,
    vision: tuple[dict, dict[str, Tensor]] | None = None,
    shards: int = 1,
    eos_token_ids: list[int] | None = None,
    family: str = "qwen3_5",
    expert_layout: str = "fused",
    fp8_scale_dtype: torch.dtype | None = None,
) -> Path:
    """Write a checkpoint directory.

    text_state: the language model's weights named as in transformers' text model ("embed_tokens.weight",
    "layers.0...", "norm.weight"; experts fused); head_state: the head's weights without the "mtp." prefix
    (experts fused); lm_head: [V, H] or None when tied; vision: (vision_config, weights named as in the
    vision model) for the VLM layout; head_prefix: "mtp." or a NextN layer's "model.layers.{L}.". expert_layout "per_expert" splits the target's and the head's experts;
    fp8_scale_dtype (torch.float32 or torch.bfloat16) writes a block-FP8 checkpoint.
    """
    assert layout in FAMILY_CONFIG[family], (family, layout)
    assert expert_layout in ("fused", "per_expert"), expert_layout
    assert (lm_head is None) == tie_word_embeddings, "an untied checkpoint stores lm_head.weight; a tied one does not"
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    prefix = "model.language_model." if layout == "vlm" else "model."
    tensors: dict[str, Tensor] = {prefix + k: v for k, v in text_state.items()}
    if lm_head is not None:
        tensors["lm_head.weight"] = lm_head
    tensors |= {head_prefix + k: v for k, v in head_state.items()}
    if expert_layout == "per_expert":
        tensors = split_experts(tensors)
    text_config = dict(text_config, tie_word_embeddings=tie_word_embeddings)
    names = FAMILY_CONFIG[family][layout]
    if layout == "vlm":
        model_type, architecture, text_type, vision_type = names
        vision_config, vision_state = vision if vision is not None else _random_vision(text_config["hidden_size"])
        tensors |= {"model.visual." + k: v for k, v in vision_state.items()}
        config = {
            "architectures": [architecture],
            "model_type": model_type,
            "text_config": dict(text_config, model_type=text_type),
            "vision_config": dict(vision_config, model_type=vision_type),
            "tie_word_embeddings": tie_word_embeddings,
            "image_token_id": 248056, "video_token_id": 248057,
            "vision_start_token_id": 248053, "vision_end_token_id": 248054,
        }
    else:
        model_type, architecture = names
        config = dict(text_config, architectures=[architecture], model_type=model_type)
    if fp8_scale_dtype is not None:
        tensors, keep = quantize_state(tensors, fp8_scale_dtype)
        config["quantization_config"] = fp8_quantization_config(modules_to_not_convert=keep)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    generation = {"eos_token_id": eos_token_ids or [], "do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    write_shards(out, tensors, shards)
    return out


def write_shards(out: Path, tensors: dict[str, Tensor], shards: int) -> None:
    """Shards in name order, balanced by bytes: lm_head, model.*, mtp.* (the head lands in the last)."""
    from safetensors.torch import save_file

    tensors = {k: v.contiguous() for k, v in sorted(tensors.items())}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    groups: list[dict[str, Tensor]] = [{} for _ in range(shards)]
    acc, i = 0, 0
    for k, v in tensors.items():
        groups[i][k] = v
        acc += v.numel() * v.element_size()
        if acc >= total * (i + 1) / shards and i < shards - 1:
            i += 1
    groups = [g for g in groups if g]
    if len(groups) == 1:
        save_file(groups[0], str(out / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for j, g in enumerate(groups):
            name = f"model-{j + 1:05d}-of-{len(groups):05d}.safetensors"
            save_file(g, str(out / name), metadata={"format": "pt"})
            weight_map |= {k: name for k in g}
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def rewrite_checkpoint(src: str | Path, dst: str | Path, tensors_fn, config_fn) -> Path:
    """A copy of checkpoint `src` in `dst` with every tensor passed through tensors_fn(dict) -> dict and
    config.json through config_fn(dict) -> dict (tokenizer, chat template and generation config copied)."""
    import shutil

    from safetensors.torch import load_file

    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    shard_files = sorted(src.glob("*.safetensors"))
    tensors = {}
    for f in shard_files:
        tensors |= load_file(str(f))
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy2(f, dst / f.name)
    tensors = tensors_fn(tensors)  # before config_fn, which may depend on what it did
    config = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(config_fn(config), indent=2, sort_keys=True) + "\n")
    write_shards(dst, tensors, len(shard_files))
    return dst


def write_fp8_copy(src: str | Path, dst: str | Path, scale_dtype=torch.float32, only_head: bool = False) -> Path:
    """A block-FP8 copy of a float checkpoint, as an official FP8 release stores it (module doc); only_head: with the
    head's projections alone in FP8 (the what-if `--head-precision fp8` must serve exactly this head)."""
    kept: list[str] = []

    def tensors_fn(tensors):
        quantised, keep = quantize_state(tensors, scale_dtype, only_head=only_head)
        kept.extend(keep)
        return quantised

    return rewrite_checkpoint(src, dst, tensors_fn,
                              lambda c: dict(c, quantization_config=fp8_quantization_config(modules_to_not_convert=kept)))


def write_dequantised_copy(src: str | Path, dst: str | Path, dtype=torch.float32) -> Path:
    """A float checkpoint holding the serving values q * scale of a block-FP8 one (scales and
    quantization_config dropped): what the FP8 checkpoint must replay exactly like."""
    from .weights import dequantize_blockwise

    config = json.loads((Path(src) / "config.json").read_text())
    block = tuple(config["quantization_config"]["weight_block_size"])

    def tensors_fn(t):
        out = {}
        for name, v in t.items():
            if name.endswith("_scale_inv"):
                continue
            out[name] = dequantize_blockwise(v, t[name + "_scale_inv"], block).to(dtype) if v.dtype == torch.float8_e4m3fn else v
        return out

    return rewrite_checkpoint(src, dst, tensors_fn, lambda c: {k: v for k, v in c.items() if k != "quantization_config"})


def _random_vision(out_hidden_size: int, seed: int = 0) -> tuple[dict, dict[str, Tensor]]:
    """A one-block vision tower: present only so the loader must skip `model.visual.*`."""
    from transformers import Qwen3_5VisionConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

    cfg = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=out_hidden_size,
               num_position_embeddings=16, patch_size=4, temporal_patch_size=2, spatial_merge_size=2)
    torch.manual_seed(seed)
    model = Qwen3_5VisionModel(Qwen3_5VisionConfig(**cfg))
    return cfg, {k: v.detach().clone() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------------------------
# Random checkpoints


@dataclass(frozen=True)
class SyntheticSpec:
    """A Qwen3.5-family model: linear- and full-attention layers, gated attention, an MTP head; dense or MoE."""

    vocab_size: int = 1001  # deliberately not a multiple of 8
    hidden_size: int = 64
    intermediate_size: int = 96  # the dense MLP (Qwen3-Next also writes it; Qwen3.5-MoE configs have none)
    num_hidden_layers: int = 4
    full_attention_interval: int = 2  # linear, full, linear, full
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32  # rotary_dim = 8 at the default partial_rotary_factor 0.25
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 16
    linear_value_head_dim: int = 16
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.25
    initializer_range: float = 0.1
    tie_word_embeddings: bool = False
    layout: str = "vlm"  # "vlm" | "text" (qwen3_next is text-only: pass layout="text")
    shards: int = 2
    seed: int = 0
    dtype: str = "float32"
    tokenizer_vocab: int = 990  # the tokenizer may be smaller than the embedding, as in Qwen3.5
    extra: dict = field(default_factory=dict)  # extra text-config keys
    family: str = "qwen3_5"  # "qwen3_5" (dense) | "qwen3_5_moe" | "qwen3_next" | "deepseek_v3" | "glm4_moe"
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 48
    shared_expert_intermediate_size: int = 40
    norm_topk_prob: bool | None = None  # None: as released (absent for Qwen3.5-MoE, true for Qwen3-Next)
    expert_layout: str | None = None  # "fused" | "per_expert"; None: as released (fused for Qwen3.5-MoE, per expert for Qwen3-Next)
    mtp_layers: int = 1  # the head's MTP layers (mtp_num_hidden_layers; num_nextn_predict_layers for Qwen3-Next), each random
    quantization: str | None = None  # "fp8": block-FP8, 128x128 blocks
    scale_dtype: str = "float32"  # of weight_scale_inv: "float32" | "bfloat16"
    # NextN families (DeepSeek-V3, GLM-4.5); None: as released for the family
    q_lora_rank: int | None = 24
    kv_lora_rank: int = 16
    qk_nope_head_dim: int = 16
    qk_rope_head_dim: int = 8
    v_head_dim: int = 16
    n_group: int | None = None  # None: DeepSeek 4 (two experts a group), GLM 1
    topk_group: int | None = None  # None: DeepSeek 2, GLM 1
    routed_scaling_factor: float = 2.5
    first_k_dense_replace: int = 1
    n_shared_experts: int = 1
    use_qk_norm: bool = True  # GLM-4.5 (355B) true, GLM-4.5-Air false
    nextn_copies: str = "copy"  # the NextN layer's embed_tokens / shared_head.head: "copy" | "absent" | "distinct"
    chat_format: str = "chatml"  # the tokenizer's chat template: a CHAT_FORMATS key (deepseek_v3, deepseek_v31, deepseek_r1, glm4_5)

    @property
    def moe(self) -> bool:
        return self.family != "qwen3_5"

    @property
    def stored_expert_layout(self) -> str:
        per_expert = self.family in ("qwen3_next", *NEXTN) or self.quantization
        return self.expert_layout or ("per_expert" if per_expert else "fused")

    @property
    def model_type(self) -> str:
        return FAMILY_CONFIG[self.family][self.layout][0]

    @property
    def nextn(self) -> bool:
        return self.family in NEXTN

    def text_config(self) -> dict:
        if self.nextn:
            return self._nextn_text_config() | self.extra
        rotary = int(self.head_dim * self.partial_rotary_factor)
        half = rotary // 2
        mrope = [half - 2 * (half // 3), half // 3, half // 3]  # three equal streams for text; sums to rotary/2
        dims = {
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_hidden_layers,
            "layer_types": [
                "full_attention" if (i + 1) % self.full_attention_interval == 0 else "linear_attention"
                for i in range(self.num_hidden_layers)
            ],
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads, "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim, "linear_conv_kernel_dim": 4,
            "rope_parameters": {
                "rope_type": "default", "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
                "mrope_section": mrope, "mrope_interleaved": True,
            },
            "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "hidden_act": "silu",
            "initializer_range": self.initializer_range, "attention_bias": False, "dtype": self.dtype,
            "mtp_num_hidden_layers": self.mtp_layers, "mtp_use_dedicated_embeddings": False,
        }
        moe = {
            "num_experts": self.num_experts, "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
            "shared_expert_intermediate_size": self.shared_expert_intermediate_size,
            "router_aux_loss_coef": 0.001, "output_router_logits": False,
        }
        if self.family == "qwen3_5_moe":
            dims = {k: v for k, v in dims.items() if k != "intermediate_size"} | moe
            if self.norm_topk_prob is not None:
                dims["norm_topk_prob"] = self.norm_topk_prob
        elif self.family == "qwen3_next":
            drop = ("layer_types", "rope_parameters", "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings")
            dims = {k: v for k, v in dims.items() if k not in drop} | moe | {
                "full_attention_interval": self.full_attention_interval, "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor, "rope_scaling": None,
                "decoder_sparse_step": 1, "mlp_only_layers": [],
                "norm_topk_prob": True if self.norm_topk_prob is None else self.norm_topk_prob,
            } | ({"num_nextn_predict_layers": self.mtp_layers} if self.mtp_layers != 1 else {})
        return dims | self.extra


    def _nextn_text_config(self) -> dict:
        """The released DeepSeek-V3 / GLM-4.5 config.json's keys (docs/nextn.md), at this spec's sizes."""
        deepseek = self.family == "deepseek_v3"
        common = {
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "moe_intermediate_size": self.moe_intermediate_size, "num_hidden_layers": self.num_hidden_layers,
            "num_nextn_predict_layers": 1, "first_k_dense_replace": self.first_k_dense_replace,
            "n_routed_experts": self.num_experts, "num_experts_per_tok": self.num_experts_per_tok,
            "n_shared_experts": self.n_shared_experts,
            "n_group": self.n_group if self.n_group is not None else (4 if deepseek else 1),
            "topk_group": self.topk_group if self.topk_group is not None else (2 if deepseek else 1),
            "norm_topk_prob": True if self.norm_topk_prob is None else self.norm_topk_prob,
            "routed_scaling_factor": self.routed_scaling_factor, "num_attention_heads": self.num_attention_heads,
            "hidden_act": "silu", "initializer_range": self.initializer_range, "attention_dropout": 0.0,
            "use_cache": True, "dtype": self.dtype,
        }
        if deepseek:
            return common | {
                "num_key_value_heads": self.num_attention_heads, "q_lora_rank": self.q_lora_rank,
                "kv_lora_rank": self.kv_lora_rank, "qk_nope_head_dim": self.qk_nope_head_dim,
                "qk_rope_head_dim": self.qk_rope_head_dim, "v_head_dim": self.v_head_dim, "moe_layer_freq": 1,
                "topk_method": "noaux_tc", "scoring_func": "sigmoid", "attention_bias": False, "rms_norm_eps": 1e-6,
                "max_position_embeddings": 163840, "rope_theta": self.rope_theta, "ep_size": 1,
                "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                                 "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
            }
        return common | {
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim, "partial_rotary_factor": 0.5,
            "attention_bias": True, "use_qk_norm": self.use_qk_norm, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
            "rope_scaling": None, "max_position_embeddings": 131072,
        }


def random_head_state(spec: SyntheticSpec, generator: torch.Generator) -> dict[str, Tensor]:
    """The head's tensors (experts fused, names without the head's prefix), random: matrices ~ N(0, 1/fan_in),
    norms visibly away from their neutral value (0 for a zero-centred norm, 1 for a plain one), so (1 + w) and w
    differ; biases small, the correction bias big enough to move the experts chosen."""
    from .families import expected_head_shapes, geometry_from_config, head_names

    g = geometry_from_config(spec.model_type, spec.text_config())
    prefix = head_names(g).prefix
    base = 1.0 if g.norm == "plain" else 0.0
    state = {}
    for name, shape in expected_head_shapes(g).items():
        if name.endswith("e_score_correction_bias"):
            t = (torch.rand(shape, generator=generator) - 0.5) * 0.6
        elif name.endswith(".bias"):
            t = torch.randn(shape, generator=generator) * 0.1
        elif len(shape) == 1:  # norms
            t = base + torch.rand(shape, generator=generator) - 0.5
        else:
            t = torch.randn(shape, generator=generator) * (1.0 / shape[-1] ** 0.5)
        state[name[len(prefix):]] = t
    return state


TRANSFORMERS_CLASSES = {"qwen3_5": ("Qwen3_5ForCausalLM", "Qwen3_5TextConfig"),
                        "qwen3_5_moe": ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig"),
                        "qwen3_next": ("Qwen3NextForCausalLM", "Qwen3NextConfig"),
                        "deepseek_v3": ("DeepseekV3ForCausalLM", "DeepseekV3Config"),
                        "glm4_moe": ("Glm4MoeForCausalLM", "Glm4MoeConfig")}


def random_target(spec: SyntheticSpec):
    """A randomly initialised transformers causal LM of the spec's family with visibly non-zero norm weights
    (and, for the NextN families, a visibly non-zero correction bias in every router)."""
    import transformers

    model_class, config_class = (getattr(transformers, n) for n in TRANSFORMERS_CLASSES[spec.family])
    cfg = spec.text_config()
    cfg = {k: v for k, v in cfg.items() if not k.startswith("mtp_")}
    torch.manual_seed(spec.seed)
    model = model_class(config_class(**cfg, tie_word_embeddings=spec.tie_word_embeddings))
    gen = torch.Generator().manual_seed(spec.seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                plain = spec.nextn or ".linear_attn.norm." in name  # the gated norm is plain x * w
                p.copy_((1.0 if plain else 0.0) + torch.rand(p.shape, generator=gen) - 0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_((torch.rand(b.shape, generator=gen) - 0.5) * 0.6)
    return model


def nextn_copies(spec: SyntheticSpec, embedding: Tensor, lm_head: Tensor) -> dict[str, Tensor]:
    """The NextN layer's copies of the embedding and lm_head: as released (equal copies), absent (GLM-4.6), or
    distinct (a separately trained head, which the engines would still replace by the target's)."""
    if spec.nextn_copies == "absent":
        return {}
    if spec.nextn_copies == "copy":
        return {"embed_tokens.weight": embedding.clone(), "shared_head.head.weight": lm_head.clone()}
    assert spec.nextn_copies == "distinct", spec.nextn_copies
    gen = torch.Generator().manual_seed(spec.seed + 3)
    return {"embed_tokens.weight": torch.randn(embedding.shape, generator=gen).to(embedding.dtype) * embedding.std(),
            "shared_head.head.weight": torch.randn(lm_head.shape, generator=gen).to(lm_head.dtype) * lm_head.std()}


def write_synthetic_checkpoint(directory: str | Path, spec: SyntheticSpec = SyntheticSpec()) -> Path:
    """A random checkpoint in the real layout, with tokenizer and chat template. Deterministic in spec."""
    dtype = getattr(torch, spec.dtype)
    model = random_target(spec)
    text_state = {k[len("model."):]: v.detach().to(dtype) for k, v in model.state_dict().items() if k.startswith("model.")}
    lm_head = None if spec.tie_word_embeddings else model.lm_head.weight.detach().to(dtype)
    head = {k: v.to(dtype) for k, v in random_head_state(spec, torch.Generator().manual_seed(spec.seed + 2)).items()}
    head_prefix = "mtp."
    if spec.nextn:
        head_prefix = f"model.layers.{spec.num_hidden_layers}."
        head |= nextn_copies(spec, text_state["embed_tokens.weight"], lm_head)
    fmt = CHAT_FORMATS[spec.chat_format]
    if spec.chat_format == "chatml":
        tok = train_tokenizer(_default_corpus(), spec.tokenizer_vocab)
    else:
        tok = train_tokenizer(_default_corpus() + [family_chat_template(spec.chat_format)], spec.tokenizer_vocab,
                              extra_added=fmt.added)
    eos = [tok.token_to_id(t) for t in fmt.end_tokens]
    pad = tok.token_to_id("<|endoftext|>")
    config_eos = eos[0] if len(eos) == 1 or spec.chat_format == "chatml" else eos  # GLM-4.5's config lists them all
    text_config = dict(spec.text_config(), eos_token_id=config_eos, pad_token_id=pad)
    assert spec.quantization in (None, "fp8"), spec.quantization
    out = save_checkpoint(
        directory, text_config=text_config, text_state=text_state, lm_head=lm_head, head_state=head, head_prefix=head_prefix,
        layout=spec.layout, tie_word_embeddings=spec.tie_word_embeddings, shards=spec.shards, eos_token_ids=eos,
        family=spec.family, expert_layout=spec.stored_expert_layout,
        fp8_scale_dtype=getattr(torch, spec.scale_dtype) if spec.quantization == "fp8" else None,
    )
    write_tokenizer(out, tok, family_chat_template(spec.chat_format), fmt)
    (out / "synthetic_spec.json").write_text(json.dumps(asdict(spec), indent=2) + "\n")
    return out
