"""Checkpoints written in the real Qwen3.5 layout: random ones for tests and benchmarks, and
the saver the default-model training script uses.

Contract: `save_checkpoint` writes exactly what a released checkpoint holds — config.json
(VLM wrapper with `text_config` and `vision_config`, or text-only), `model.safetensors` or
shards with `model.safetensors.index.json`, text weights under `model.language_model.*` (or
`model.*`), vision under `model.visual.*`, `lm_head.weight` (absent when tied) and `mtp.*` at
the top level, generation_config.json, and tokenizer files with a chat template.
`write_synthetic_checkpoint` fills one with random weights (norm weights visibly non-zero,
so a `x * w` norm cannot pass for `x * (1 + w)`). Nothing is downloaded.
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
    return (Path(__file__).parent / "assets" / "chat_template.jinja").read_text()


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


def train_tokenizer(corpus: list[str], vocab_size: int, isolate_newlines: bool = False):
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
        vocab_size=vocab_size - len(MARKUP_TOKENS), special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens(MARKUP_TOKENS)
    assert tok.get_vocab_size() <= vocab_size, (tok.get_vocab_size(), vocab_size)
    return tok


def write_tokenizer(directory: Path, tokenizer, template: str | None = None) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "TokenizersBackend",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 262144,
        "add_bos_token": False,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "chat_template.jinja").write_text(template if template is not None else chat_template())


# ---------------------------------------------------------------------------------------------
# Saving in the real layout


def save_checkpoint(
    directory: str | Path,
    *,
    text_config: dict,
    text_state: dict[str, Tensor],
    lm_head: Tensor | None,
    head_state: dict[str, Tensor],
    layout: str = "vlm",
    tie_word_embeddings: bool = False,
    vision: tuple[dict, dict[str, Tensor]] | None = None,
    shards: int = 1,
    eos_token_ids: list[int] | None = None,
) -> Path:
    """Write a checkpoint directory.

    text_state: the language model's weights named as in `Qwen3_5TextModel` ("embed_tokens.weight",
    "layers.0...", "norm.weight"); head_state: the head's weights without the "mtp." prefix;
    lm_head: [V, H] or None when tied; vision: (vision_config, weights named as in the vision
    model) for the VLM layout.
    """
    from safetensors.torch import save_file

    assert layout in ("vlm", "text"), layout
    assert (lm_head is None) == tie_word_embeddings, "an untied checkpoint stores lm_head.weight; a tied one does not"
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    prefix = "model.language_model." if layout == "vlm" else "model."
    tensors: dict[str, Tensor] = {prefix + k: v for k, v in text_state.items()}
    if lm_head is not None:
        tensors["lm_head.weight"] = lm_head
    tensors |= {"mtp." + k: v for k, v in head_state.items()}
    text_config = dict(text_config, tie_word_embeddings=tie_word_embeddings)
    if layout == "vlm":
        vision_config, vision_state = vision if vision is not None else _random_vision(text_config["hidden_size"])
        tensors |= {"model.visual." + k: v for k, v in vision_state.items()}
        config = {
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5",
            "text_config": dict(text_config, model_type="qwen3_5_text"),
            "vision_config": dict(vision_config, model_type="qwen3_5_vision"),
            "tie_word_embeddings": tie_word_embeddings,
            "image_token_id": 248056, "video_token_id": 248057,
            "vision_start_token_id": 248053, "vision_end_token_id": 248054,
        }
    else:
        config = dict(text_config, architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text")
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    generation = {"eos_token_id": eos_token_ids or [], "do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")

    # Shards in name order, balanced by bytes: lm_head, model.*, mtp.* (the head lands in the last).
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
    return out


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
    """A Qwen3.5-architecture model: linear- and full-attention layers, gated attention, an MTP head."""

    vocab_size: int = 1001  # deliberately not a multiple of 8
    hidden_size: int = 64
    intermediate_size: int = 96
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
    layout: str = "vlm"  # "vlm" | "text"
    shards: int = 2
    seed: int = 0
    dtype: str = "float32"
    tokenizer_vocab: int = 990  # the tokenizer may be smaller than the embedding, as in Qwen3.5
    extra: dict = field(default_factory=dict)  # extra text-config keys

    def text_config(self) -> dict:
        rotary = int(self.head_dim * self.partial_rotary_factor)
        half = rotary // 2
        mrope = [half - 2 * (half // 3), half // 3, half // 3]  # three equal streams for text; sums to rotary/2
        return {
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
            "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
            **self.extra,
        }


def random_head_state(spec: SyntheticSpec, generator: torch.Generator) -> dict[str, Tensor]:
    from .checkpoint import HeadGeometry, expected_head_shapes

    g = HeadGeometry(
        hidden_size=spec.hidden_size, num_heads=spec.num_attention_heads, num_kv_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim, intermediate_size=spec.intermediate_size, vocab_size=spec.vocab_size,
        rms_norm_eps=1e-6, rope_theta=spec.rope_theta,
        rotary_dim=int(spec.head_dim * spec.partial_rotary_factor), num_layers=1,
    )
    state = {}
    for name, shape in expected_head_shapes(g).items():
        if len(shape) == 1:  # norms: visibly non-zero, so (1 + w) and w differ
            t = torch.rand(shape, generator=generator) - 0.5
        else:
            t = torch.randn(shape, generator=generator) * (1.0 / shape[1] ** 0.5)
        state[name[len("mtp."):]] = t
    return state


def random_target(spec: SyntheticSpec):
    """A randomly initialised transformers Qwen3_5ForCausalLM with visibly non-zero norm weights."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = spec.text_config()
    cfg = {k: v for k, v in cfg.items() if not k.startswith("mtp_")}
    torch.manual_seed(spec.seed)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**cfg, tie_word_embeddings=spec.tie_word_embeddings))
    gen = torch.Generator().manual_seed(spec.seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                base = 1.0 if ".linear_attn.norm." in name else 0.0  # the gated norm is plain x * w
                p.copy_(base + torch.rand(p.shape, generator=gen) - 0.5)
    return model


def write_synthetic_checkpoint(directory: str | Path, spec: SyntheticSpec = SyntheticSpec()) -> Path:
    """A random checkpoint in the real layout, with tokenizer and chat template. Deterministic in spec."""
    dtype = getattr(torch, spec.dtype)
    model = random_target(spec)
    text_state = {k[len("model."):]: v.detach().to(dtype) for k, v in model.state_dict().items() if k.startswith("model.")}
    lm_head = None if spec.tie_word_embeddings else model.lm_head.weight.detach().to(dtype)
    head = {k: v.to(dtype) for k, v in random_head_state(spec, torch.Generator().manual_seed(spec.seed + 2)).items()}
    tok = train_tokenizer(_default_corpus(), spec.tokenizer_vocab)
    eos = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    text_config = dict(spec.text_config(), eos_token_id=eos[0], pad_token_id=eos[1])
    out = save_checkpoint(
        directory, text_config=text_config, text_state=text_state, lm_head=lm_head, head_state=head,
        layout=spec.layout, tie_word_embeddings=spec.tie_word_embeddings, shards=spec.shards, eos_token_ids=eos,
    )
    write_tokenizer(out, tok)
    (out / "synthetic_spec.json").write_text(json.dumps(asdict(spec), indent=2) + "\n")
    return out
