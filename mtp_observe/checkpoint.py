"""The checkpoint: what a local Qwen3.5-family model directory holds, read from headers.

Contract: given a directory, `read_checkpoint` returns a `CheckpointInfo` built from
config.json and the safetensors *headers* only (no tensor data is read), validated far
enough that every later stage can trust it: a supported `model_type`, an MTP head whose
every tensor is present with the shape the config implies, and the borrowed embedding and
lm_head located. `load_head_tensors` then reads the `mtp.*` tensors from only the shards
that hold them, and `load_target` builds the target through transformers' own Qwen3.5
classes. Nothing here runs a model.

Two layouts exist (MTP_HEAD.md): released checkpoints are vision-language wrappers
(`model_type` "qwen3_5", text weights under `model.language_model.*`, vision under
`model.visual.*`); text-only configs ("qwen3_5_text") keep text weights under `model.*`.
Both put `lm_head.weight` and `mtp.*` at the top level, single-file or sharded
(`model.safetensors.index.json`).
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError

# model_type -> layout. The MoE variants (qwen3_5_moe, qwen3_next) put a sparse MoE block in
# the head's MLP; they are recognised so the error can say so, but not run yet.
SUPPORTED_MODEL_TYPES = {"qwen3_5": "vlm", "qwen3_5_text": "text"}
RECOGNISED_UNSUPPORTED = {
    "qwen3_5_moe": "its MTP head has a sparse MoE block",
    "qwen3_5_moe_text": "its MTP head has a sparse MoE block",
    "qwen3_next": "its MTP head has a sparse MoE block",
}
TEXT_PREFIX = {"vlm": "model.language_model.", "text": "model."}
VISION_PREFIX = "model.visual."
HEAD_PREFIX = "mtp."

# safetensors dtype tag -> bytes per element
DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
}


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str  # safetensors tag, e.g. "BF16"
    shape: tuple[int, ...]
    nbytes: int  # as stored
    file: str  # shard file name, relative to the checkpoint directory

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class HeadGeometry:
    """The numbers that fix every head tensor's shape, read from the text config."""

    hidden_size: int  # H
    num_heads: int  # nh
    num_kv_heads: int  # nkv
    head_dim: int  # d
    intermediate_size: int  # I
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rotary_dim: int  # the first rotary_dim of d are rotated (partial_rotary_factor * d)
    num_layers: int  # mtp_num_hidden_layers (1 in released checkpoints)


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    config: dict  # config.json as stored
    text_config: dict  # the language model's config (config["text_config"] for VLM wrappers)
    model_type: str
    layout: str  # "vlm" | "text"
    tie_word_embeddings: bool
    geometry: HeadGeometry
    tensors: dict[str, TensorEntry]  # every tensor of every shard, from the headers

    @property
    def text_prefix(self) -> str:
        return TEXT_PREFIX[self.layout]

    @property
    def embed_name(self) -> str:
        return self.text_prefix + "embed_tokens.weight"

    @property
    def lm_head_name(self) -> str:
        """The tensor the lm_head reads: the embedding when tied."""
        return self.embed_name if self.tie_word_embeddings else "lm_head.weight"

    @property
    def head_names(self) -> list[str]:
        return sorted(n for n in self.tensors if n.startswith(HEAD_PREFIX))

    @property
    def target_names(self) -> list[str]:
        """Every weight a target decode step reads: the text model and lm_head (not vision, not mtp)."""
        return sorted(
            n for n in self.tensors if not n.startswith(HEAD_PREFIX) and not n.startswith(VISION_PREFIX)
        )

    @property
    def config_sha256(self) -> str:
        return hashlib.sha256((self.path / "config.json").read_bytes()).hexdigest()


def expected_head_shapes(g: HeadGeometry) -> dict[str, tuple[int, ...]]:
    """The dense head's 15 tensors and their shapes (MTP_HEAD.md's table)."""
    H, nh, nkv, d, inter = g.hidden_size, g.num_heads, g.num_kv_heads, g.head_dim, g.intermediate_size
    shapes = {
        "mtp.pre_fc_norm_embedding.weight": (H,),
        "mtp.pre_fc_norm_hidden.weight": (H,),
        "mtp.fc.weight": (H, 2 * H),
        "mtp.norm.weight": (H,),
    }
    for i in range(g.num_layers):
        p = f"mtp.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (H,),
            p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (2 * nh * d, H),  # query and output gate, interleaved per head
            p + "self_attn.k_proj.weight": (nkv * d, H),
            p + "self_attn.v_proj.weight": (nkv * d, H),
            p + "self_attn.o_proj.weight": (H, nh * d),
            p + "self_attn.q_norm.weight": (d,),
            p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": (inter, H),
            p + "mlp.up_proj.weight": (inter, H),
            p + "mlp.down_proj.weight": (H, inter),
        }
    return shapes


def read_safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...], int]]:
    """name -> (dtype, shape, nbytes), from the JSON header alone (8-byte length + JSON)."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100_000_000:
                raise ValueError("header too long")
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e}); re-download or re-save this shard")
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        out[name] = (meta["dtype"], tuple(meta["shape"]), end - begin)
    return out


def _read_config(path: Path) -> dict:
    if not path.exists():
        raise CheckpointError(f"{path}: model directory not found; pass --model DIR with a local checkpoint directory")
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory; pass the checkpoint directory, not a file inside it")
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise CheckpointError(
            f"{path}: no config.json; point at a checkpoint directory (config.json, *.safetensors, tokenizer files)"
        )
    try:
        return json.loads(cfg_path.read_text())
    except ValueError as e:
        raise CheckpointError(f"{cfg_path}: invalid JSON ({e}); restore the checkpoint's config.json")


def _shard_files(path: Path) -> list[str]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"{index}: unreadable index ({e}); restore model.safetensors.index.json")
        files = sorted(set(weight_map.values()))
        for f in files:
            if not (path / f).exists():
                raise CheckpointError(f"{path / f}: shard listed in model.safetensors.index.json is missing; download it")
        return files
    if (path / "model.safetensors").exists():
        return ["model.safetensors"]
    found = sorted(p.name for p in path.glob("*.safetensors"))
    if not found:
        raise CheckpointError(f"{path}: no *.safetensors weights; this tool reads safetensors checkpoints only")
    return found


def _rope(text_config: dict) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor), from rope_parameters (transformers 5) or the older flat keys."""
    rp = text_config.get("rope_parameters") or text_config.get("rope_scaling") or {}
    theta = rp.get("rope_theta", text_config.get("rope_theta", 10000.0))
    factor = rp.get("partial_rotary_factor", text_config.get("partial_rotary_factor", 0.25))
    return float(theta), float(factor)


def _geometry(text_config: dict, where: Path) -> HeadGeometry:
    try:
        H = int(text_config["hidden_size"])
        nh = int(text_config["num_attention_heads"])
        nkv = int(text_config["num_key_value_heads"])
        d = int(text_config.get("head_dim") or H // nh)
        inter = int(text_config["intermediate_size"])
        vocab = int(text_config["vocab_size"])
    except KeyError as e:
        raise CheckpointError(f"{where / 'config.json'}: text config has no {e.args[0]}; restore the checkpoint's config.json")
    theta, factor = _rope(text_config)
    # Config keys transformers' config class does not declare: read with a default.
    layers = int(text_config.get("mtp_num_hidden_layers", text_config.get("num_nextn_predict_layers", 1)))
    return HeadGeometry(
        hidden_size=H, num_heads=nh, num_kv_heads=nkv, head_dim=d, intermediate_size=inter, vocab_size=vocab,
        rms_norm_eps=float(text_config.get("rms_norm_eps", 1e-6)), rope_theta=theta,
        rotary_dim=int(d * factor), num_layers=layers,
    )


def _fmt(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def read_checkpoint(model_dir: str | Path) -> CheckpointInfo:
    """Read and validate a checkpoint directory from config.json and safetensors headers."""
    path = Path(model_dir).expanduser()
    config = _read_config(path)

    # 1. Which family member, which layout.
    model_type = config.get("model_type")
    if model_type in RECOGNISED_UNSUPPORTED:
        raise CheckpointError(
            f"{path}: model_type {model_type!r} is not supported yet ({RECOGNISED_UNSUPPORTED[model_type]}); "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise CheckpointError(
            f"{path}: unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    layout = SUPPORTED_MODEL_TYPES[model_type]
    text_config = (config.get("text_config") or {}) if layout == "vlm" else config
    if layout == "vlm" and not text_config:
        raise CheckpointError(f"{path / 'config.json'}: a {model_type!r} config needs a text_config; restore config.json")

    # 2. Tying: VLM wrappers carry it at the top level; text_config must agree when it says.
    tie = bool(config.get("tie_word_embeddings", False))
    if layout == "vlm" and "tie_word_embeddings" in text_config and bool(text_config["tie_word_embeddings"]) != tie:
        raise CheckpointError(
            f"{path / 'config.json'}: tie_word_embeddings is {tie} at the top level but "
            f"{bool(text_config['tie_word_embeddings'])} in text_config; make them agree"
        )
    geometry = _geometry(text_config, path)
    if geometry.num_layers != 1:
        raise CheckpointError(
            f"{path / 'config.json'}: mtp_num_hidden_layers is {geometry.num_layers}; only 1 (every released "
            "checkpoint) is supported"
        )

    # 3. Every tensor, from the headers.
    tensors: dict[str, TensorEntry] = {}
    for f in _shard_files(path):
        for name, (dtype, shape, nbytes) in read_safetensors_header(path / f).items():
            tensors[name] = TensorEntry(name, dtype, shape, nbytes, f)

    # 4. The head: present, dense, every tensor at the shape the config implies.
    head = [n for n in tensors if n.startswith(HEAD_PREFIX)]
    if not head:
        raise CheckpointError(
            f"{path}: this checkpoint ships no MTP head (no mtp.* tensors); use a checkpoint saved with its mtp.* weights"
        )
    if any(".mlp.experts." in n or n.endswith(".mlp.gate.weight") for n in head):
        raise CheckpointError(f"{path}: the MTP head has a sparse MoE block, which is not supported yet")
    expected = expected_head_shapes(geometry)
    for name, shape in expected.items():
        if name not in tensors:
            raise CheckpointError(f"{path}: head tensor {name} is missing (expected shape {_fmt(shape)}); the checkpoint is incomplete")
        if tensors[name].shape != shape:
            raise CheckpointError(
                f"{path}: head tensor {name} has shape {_fmt(tensors[name].shape)}, expected {_fmt(shape)} "
                "from config.json; config and weights do not match"
            )

    # 5. The borrowed tensors.
    info = CheckpointInfo(
        path=path, config=config, text_config=dict(text_config), model_type=model_type, layout=layout,
        tie_word_embeddings=tie, geometry=geometry, tensors=tensors,
    )
    H, V = geometry.hidden_size, geometry.vocab_size
    for name, what in ((info.embed_name, "embedding"), (info.lm_head_name, "lm_head")):
        if name not in tensors:
            hint = " (tie_word_embeddings is false)" if what == "lm_head" else ""
            raise CheckpointError(f"{path}: {what} tensor {name} is missing{hint}; the checkpoint is incomplete")
        if tensors[name].shape != (V, H):
            raise CheckpointError(
                f"{path}: {what} tensor {name} has shape {_fmt(tensors[name].shape)}, expected {_fmt((V, H))}"
            )
    return info


def load_tensors(info: CheckpointInfo, names: list[str], device: str = "cpu", dtype=None) -> dict:
    """Read the named tensors with safe_open from only the shards that hold them."""
    from safetensors import safe_open

    by_file: dict[str, list[str]] = {}
    for n in names:
        by_file.setdefault(info.tensors[n].file, []).append(n)
    out = {}
    for f, file_names in sorted(by_file.items()):
        with safe_open(str(info.path / f), framework="pt", device="cpu") as sf:
            for n in file_names:
                t = sf.get_tensor(n)
                out[n] = t.to(device=device, dtype=dtype if dtype is not None else t.dtype)
    return out


def load_head_tensors(info: CheckpointInfo, device: str = "cpu", dtype=None) -> dict:
    """The mtp.* tensors, keyed without the "mtp." prefix."""
    return {n[len(HEAD_PREFIX):]: t for n, t in load_tensors(info, info.head_names, device, dtype).items()}


def load_target(info: CheckpointInfo, device: str = "cpu", dtype=None, device_map=None):
    """The target as transformers' Qwen3_5ForCausalLM (vision tower and mtp.* are not loaded).

    transformers maps `model.language_model.*` onto the causal LM's `model.*` itself; every
    text weight must load (a missing one would silently stay at its random init).
    """
    import torch
    from transformers import AutoConfig, Qwen3_5ForCausalLM
    from transformers.utils import logging as hf_logging

    config = AutoConfig.from_pretrained(info.path)
    text_config = config.text_config if info.layout == "vlm" else config
    text_config.tie_word_embeddings = info.tie_word_embeddings
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        model, loading = Qwen3_5ForCausalLM.from_pretrained(
            info.path, config=text_config, dtype=dtype or torch.float32,
            device_map=device_map if device_map is not None else None, output_loading_info=True,
        )
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    missing = [k for k in loading.get("missing_keys", []) if not (info.tie_word_embeddings and k == "lm_head.weight")]
    if missing or loading.get("mismatched_keys"):
        bad = (missing or [m[0] if isinstance(m, tuple) else m for m in loading["mismatched_keys"]])[0]
        raise CheckpointError(f"{info.path}: target weight {bad} is missing or misshapen; the checkpoint is incomplete")
    if device_map is None:
        model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


def tokenizer_sha256(path: Path) -> str:
    """sha256 over the tokenizer files present (tokenizer.json, tokenizer_config.json, chat template)."""
    h = hashlib.sha256()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
                 "special_tokens_map.json", "vocab.json", "merges.txt"):
        p = Path(path) / name
        if p.exists():
            h.update(name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# The weights fingerprint: what `replay --resume` compares (config and headers are not enough:
# a fine-tune, or a retrained head, keeps both byte-identical)

WHOLE_FILE_LIMIT = 256 * 2**20  # checkpoints up to this many bytes are hashed whole
FINGERPRINT_BLOCK = 4096  # bytes per sampled block
BLOCKS_PER_TENSOR = 16  # sampled blocks per tensor: the first, the last and 14 evenly spaced between


def weights_fingerprint(info: CheckpointInfo, whole_file_limit: int = WHOLE_FILE_LIMIT) -> dict:
    """A content fingerprint of every weight file of the checkpoint.

    Up to `whole_file_limit` bytes in all: sha256 of every file whole. Larger: sha256 of every file's
    name, size and whole safetensors header, and of BLOCKS_PER_TENSOR blocks of FINGERPRINT_BLOCK bytes
    spread evenly over the data region of every tensor of every shard (a tensor smaller than that is
    read whole), so that new values in any tensor — a fine-tune, a retrained head alone — change it. It
    reads about tensors x 64 kB (a Qwen3.5-27B checkpoint: ~60 MB of its 55 GB; README, "Resume").
    A change confined to a few bytes no sampled block covers is not seen: that is the price of not
    reading 60 GB at every start.
    """
    files = sorted({info.path / t.file for t in info.tensors.values()})
    try:
        total = sum(f.stat().st_size for f in files)
    except OSError as e:
        raise CheckpointError(f"{info.path}: cannot read its weight files ({e.strerror}); check the checkpoint")
    if total <= whole_file_limit:
        return whole_fingerprint_of_files(files)
    return sampled_fingerprint_of_files(files)


def whole_fingerprint_of_files(files: list[Path]) -> dict:
    h = hashlib.sha256()
    total = 0
    for f in files:
        try:
            with open(f, "rb") as fh:
                h.update(f.name.encode() + b"\0")
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
                    total += len(block)
        except OSError as e:
            raise CheckpointError(f"{f}: cannot read ({e.strerror}); check the checkpoint")
    return {"method": "whole files", "sha256": h.hexdigest(), "bytes": total, "files": len(files)}


def _sample_offsets(begin: int, end: int, block: int, blocks: int) -> list[int]:
    """Start offsets of the sampled blocks of data region [begin, end): every block when the region is at most
    `blocks` blocks long, else `blocks` evenly spaced starts from `begin` to `end - block`."""
    length = end - begin
    if length <= block * blocks:
        return list(range(begin, end, block))
    return [begin + (i * (length - block)) // (blocks - 1) for i in range(blocks)]


def sampled_fingerprint_of_files(files: list[Path], block: int = FINGERPRINT_BLOCK,
                                 blocks: int = BLOCKS_PER_TENSOR) -> dict:
    import os

    h = hashlib.sha256()
    total = sampled = 0
    for f in files:
        try:
            with open(f, "rb") as fh:
                fd = fh.fileno()
                size = os.fstat(fd).st_size
                (length,) = struct.unpack("<Q", os.pread(fd, 8, 0))
                header_bytes = os.pread(fd, length, 8) if length <= 100_000_000 else b""
                header = json.loads(header_bytes)
                regions = sorted(tuple(m["data_offsets"]) for n, m in header.items() if n != "__metadata__")
                h.update(f.name.encode() + b"\0" + str(size).encode() + b"\0" + header_bytes)
                for begin, end in regions:
                    for offset in _sample_offsets(int(begin), int(end), block, blocks):
                        data = os.pread(fd, min(block, int(end) - offset), 8 + length + offset)
                        h.update(data)
                        sampled += len(data)
        except OSError as e:
            raise CheckpointError(f"{f}: cannot read ({e.strerror}); check the checkpoint")
        except (ValueError, TypeError, KeyError, struct.error) as e:
            raise CheckpointError(f"{f}: not a readable safetensors file ({e}); re-download or re-save this shard")
        total += size
    return {"method": "sampled blocks", "sha256": h.hexdigest(), "bytes": total, "files": len(files),
            "sampled_bytes": sampled, "block_bytes": block, "blocks_per_tensor": blocks}
