"""The checkpoint: what a local model directory of a supported family holds, read from headers.

Contract: given a directory, `read_checkpoint` returns a `CheckpointInfo` built from
config.json and the safetensors *headers* only (no tensor data is read), validated far
enough that every later stage can trust it: a supported family, config values of the right
type and range, well-formed safetensors headers, an MTP head whose every tensor is present
with the shape the config implies, the borrowed embedding and lm_head located, and every
weight stored in a dtype this tool reads faithfully (float, or block-FP8 with its scales).
`load_head_tensors` then reads the head's tensors (`mtp.*`, or a NextN layer's `model.layers.{L}.*`) from only
the shards that hold them, in
the one in-memory form the head runs, and `load_target` builds the target through
transformers' own class for the family. Nothing here runs a model. Anything wrong is one
line naming the file and what is wrong (errors.CheckpointError, exit 2).

Families are data (families.py): which layout, which transformers class, whether the head's MLP is dense or a
sparse MoE block, which config key holds the head's depth; the head geometry is read there.

All put `lm_head.weight` (absent when tied) at the top level, single-file or sharded
(`model.safetensors.index.json`); the Qwen3.5 family keeps its head under `mtp.*`, DeepSeek-V3 and GLM-4.5 as the
layer after the target's last (`model.layers.{num_hidden_layers}.*`, docs/nextn.md), whose copies of the embedding
and lm_head (`embed_tokens.weight`, `shared_head.head.weight`, absent from GLM-4.6) are checked for shape and
never loaded: vLLM and SGLang run the target's own.

Routed experts come in two layouts (MTP_HEAD.md): fused, `mlp.experts.gate_up_proj`
[E, 2·I, H] (rows [0:I] gate, [I:] up: vLLM `qwen3_5_mtp.py` chunks it in two along dim -2
into w1 = gate and w3 = up) and `mlp.experts.down_proj` [E, H, I], both without `.weight`;
and per expert, `mlp.experts.{e}.{gate,up,down}_proj.weight`. `load_head_tensors` maps both
to the fused form, written expert by expert into one preallocated tensor (no second copy).
The target's experts are transformers' business: its conversion mapping (`qwen2_moe`:
MergeModulelist + Concatenate) fuses per-expert checkpoints into the same form on load.

Quantisation: only block-FP8 (`quantization_config.quant_method == "fp8"` with
`weight_block_size`, `fmt` e4m3) is read, and it is dequantised here, as vLLM's
`Fp8LinearMethod` reads the scales: the serving value of a weight is `q * weight_scale_inv`
per `weight_block_size` block, the scale grid [ceil(rows / br), ceil(cols / bc)] over the
last two dims, the last block of a dimension that is not a multiple of the block size
partial. The quantization_config is read from the top level (where VLM wrappers keep it)
and from text_config. transformers' own fine-grained FP8 path is not used: on a CPU it
dequantises with the block size derived from the scale grid (`Fp8Dequantize`:
rows // scale_rows), which is wrong for a dimension over 128 that is not a multiple of 128,
and on a GPU it would run W8A8 kernels this tool cannot check without one. So the target is
loaded from a state dict whose FP8 tensors are dequantised with `weight_block_size`
(`run.json`'s `model.numerics` says so). Every other method (GPTQ, AWQ, compressed-tensors,
NVFP4 / modelopt, bitsandbytes, ...) and every packed dtype (U8, I8, I32, ...) in a weight
the tool reads is refused by name, never cast.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError
from ..jsonfiles import read_json_file, reason
from .families import (
    FAMILIES,
    TEXT_PREFIX,
    VISION_PREFIX,
    Family,
    HeadGeometry,
    HeadNames,
    SparseMoe,
    _Config,
    _geometry,
    _grouped_moe,
    _is_int,
    _moe,
    expected_head_shapes,
    head_names,
)

SCALE_SUFFIX = "_scale_inv"


# safetensors dtype tag -> bytes per element
DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
SCALE_DTYPES = {"F32", "BF16"}
FP8_DTYPE = "F8_E4M3"
# Methods refused by name; anything else but "fp8" is refused too, with its own name.
KNOWN_METHODS = {
    "gptq": "GPTQ", "awq": "AWQ", "compressed-tensors": "compressed-tensors", "modelopt": "NVIDIA ModelOpt",
    "bitsandbytes": "bitsandbytes", "fbgemm_fp8": "FBGEMM FP8", "mxfp4": "MXFP4", "nvfp4": "NVFP4", "torchao": "torchao",
    "hqq": "HQQ", "quark": "Quark", "eetq": "EETQ", "aqlm": "AQLM", "gguf": "GGUF", "auto-round": "AutoRound",
}

MAX_HEADER = 100_000_000


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
class Quantization:
    """A block-FP8 quantization_config (the only method this tool reads)."""

    method: str  # "fp8"
    fmt: str  # "e4m3"
    block: tuple[int, int]  # weight_block_size [rows, cols]
    activation_scheme: str  # "dynamic" (activations are not quantised here: weights are dequantised)
    modules_to_not_convert: tuple[str, ...]

    def keeps(self, module: str) -> bool:
        """Whether modules_to_not_convert names this module (a dotted sub-path of it, as transformers matches)."""
        dotted = "." + module + "."
        return any(("." + m.strip(".") + ".") in dotted for m in self.modules_to_not_convert if m)


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
    family: Family | None = None
    expert_layout: str | None = None  # "fused" | "per_expert" for a MoE head, None for a dense one
    routing: SparseMoe | None = None  # the target's MoE numbers (its MoE layers'), None for a dense target
    quantization: Quantization | None = None

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
    def names(self) -> HeadNames:
        """Where the head's tensors are (families.head_names)."""
        return head_names(self.geometry)

    @property
    def head_prefix(self) -> str:
        return self.names.prefix

    @property
    def head_names(self) -> list[str]:
        """Every tensor of the head as stored (a NextN layer's copies of the embedding and lm_head included)."""
        return sorted(n for n in self.tensors if n.startswith(self.head_prefix))

    @property
    def head_copies(self) -> list[str]:
        """The NextN layer's copies of the target's embedding / lm_head present in the checkpoint (never run)."""
        return [self.head_prefix + c for c in self.names.copies if self.head_prefix + c in self.tensors]

    @property
    def head_weights(self) -> list[str]:
        """The head tensors a draft step reads (its copies of the target's tensors left out)."""
        copies = set(self.head_copies)
        return [n for n in self.head_names if n not in copies]

    @property
    def target_names(self) -> list[str]:
        """Every weight a target decode step reads: the text model and lm_head (not vision, not the head)."""
        return sorted(
            n for n in self.tensors if not n.startswith(self.head_prefix) and not n.startswith(VISION_PREFIX)
        )

    @property
    def config_sha256(self) -> str:
        return hashlib.sha256((self.path / "config.json").read_bytes()).hexdigest()

    def scale_of(self, name: str) -> str | None:
        """The block-scale tensor of an FP8 weight, or None."""
        scale = name + SCALE_SUFFIX
        return scale if scale in self.tensors else None

    def numerics(self, dtype) -> str:
        """What the run computes with, in words (recorded in run.json and probe.json)."""
        dtype = str(dtype).removeprefix("torch.")
        if self.quantization is not None:
            br, bc = self.quantization.block
            return f"fp8 {self.quantization.fmt} weights ({br}x{bc} blocks, q * weight_scale_inv) dequantised to {dtype}"
        stored = sorted({self.tensors[n].dtype for n in self.target_names + self.head_names})
        return f"{'/'.join(stored)} weights computed in {dtype}"


# ---------------------------------------------------------------------------------------------
# Reading files


def read_safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...], int]]:
    """name -> (dtype, shape, nbytes), from the JSON header alone (8-byte length + JSON), validated as
    safetensors validates it: known dtypes, non-negative integer shapes, data offsets that tile the data
    region exactly (a shard cut short or padded is refused here, before any tensor is read)."""
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{path}: {what}; re-download or re-save this shard")

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise bad(f"not a safetensors file ({size} bytes, shorter than the 8-byte header length)")
            (length,) = struct.unpack("<Q", raw)
            if length > MAX_HEADER:
                raise bad(f"header length {length:,} bytes is absurd (at most {MAX_HEADER:,})")
            if 8 + length > size:
                raise bad(f"header length {length:,} bytes runs past the end of the {size:,}-byte file")
            text = f.read(length)
    except OSError as e:
        raise bad(f"not readable ({reason(e)})")
    try:
        header = json.loads(text.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise bad(f"header is not JSON ({reason(e)})")
    if not isinstance(header, dict):
        raise bad(f"header is a JSON {type(header).__name__}, not an object")
    data_size = size - 8 - length
    out, spans = {}, []
    for name, meta in header.items():
        if name == "__metadata__":
            if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
                raise bad("header __metadata__ must map strings to strings")
            continue
        if not isinstance(meta, dict):
            raise bad(f"tensor {name}: header entry is not an object")
        dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
            raise bad(f"tensor {name}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
            raise bad(f"tensor {name}: shape {shape!r} is not a list of non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) and o >= 0 for o in offsets)):
            raise bad(f"tensor {name}: data_offsets {offsets!r} are not two non-negative integers")
        begin, end = offsets
        numel = math.prod(shape)
        if end < begin or end - begin != numel * DTYPE_BYTES[dtype]:
            raise bad(f"tensor {name}: data_offsets [{begin}, {end}] hold {end - begin} bytes, "
                      f"but {dtype} {shape} needs {numel * DTYPE_BYTES[dtype]}")
        if end > data_size:
            raise bad(f"tensor {name}: data_offsets end at byte {end:,} of the data, past its end "
                      f"({data_size:,} bytes): the file is truncated")
        out[name] = (dtype, tuple(shape), end - begin)
        spans.append((begin, end, name))
    covered = 0
    for begin, end, name in sorted(spans):
        if begin != covered:
            raise bad(f"tensor {name}: data_offsets start at byte {begin:,}, expected {covered:,} "
                      "(tensors overlap or leave a gap)")
        covered = end
    if covered != data_size:
        raise bad(f"the header's tensors cover {covered:,} bytes of data, the file holds {data_size:,}")
    return out


def _read_config(path: Path) -> dict:
    if not path.exists():
        raise CheckpointError(f"{path}: model directory not found; pass a local checkpoint directory")
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory; pass the checkpoint directory, not a file inside it")
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(
            f"{path}: no config.json; point at a checkpoint directory (config.json, *.safetensors, tokenizer files)"
        )
    return read_json_file(cfg_path, "the checkpoint's config.json")


def _shard_files(path: Path) -> tuple[list[str], dict[str, str] | None]:
    """The shard files, and the index's weight map (None without an index)."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        data = read_json_file(index, "model.safetensors.index.json")
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: no weight_map object; restore model.safetensors.index.json")
        for name, f in weight_map.items():
            if not isinstance(f, str) or not f or "/" in f or "\\" in f or f in (".", ".."):
                raise CheckpointError(f"{index}: weight_map[{name!r}] is {f!r}, not a shard file name in this directory")
        files = sorted(set(weight_map.values()))
        for f in files:
            if not (path / f).is_file():
                raise CheckpointError(f"{path / f}: shard listed in model.safetensors.index.json is missing; download it")
        return files, weight_map
    if (path / "model.safetensors").exists():
        return ["model.safetensors"], None
    found = sorted(p.name for p in path.glob("*.safetensors"))
    if not found:
        raise CheckpointError(f"{path}: no *.safetensors weights; this tool reads safetensors checkpoints only")
    return found, None


def _quantization(config: dict, text_config: dict, path: Path) -> Quantization | None:
    """The block-FP8 config, from the top level (VLM wrappers) or text_config; any other method refused."""
    where = path / "config.json"
    found = [c.get("quantization_config") for c in (config, text_config) if c.get("quantization_config") is not None]
    if (path / "hf_quant_config.json").exists():
        raise CheckpointError(f"{path / 'hf_quant_config.json'}: an NVIDIA ModelOpt checkpoint (NVFP4 / FP8 by ModelOpt) "
                              "is not supported; only block-FP8 (quant_method fp8) and unquantised checkpoints are read")
    if not found:
        return None
    q = found[0]
    if not isinstance(q, dict):
        raise CheckpointError(f"{where}: quantization_config is {type(q).__name__}, expected an object")
    method = q.get("quant_method")
    if method != "fp8":
        algo = q.get("quant_algo") or q.get("format") or ""
        name = KNOWN_METHODS.get(str(method).lower(), None) if isinstance(method, str) else None
        label = f"{method!r}" + (f" ({name})" if name and name != method else "") + \
            (f", {algo}" if isinstance(algo, str) and algo else "")
        raise CheckpointError(
            f"{where}: quantization method {label} is not supported; only block-FP8 (quant_method 'fp8' with "
            "weight_block_size) is dequantised faithfully, nothing is ever cast: use the BF16 or the FP8 release"
        )
    cfg = _Config(q, where, "quantization_config.")
    fmt = q.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise cfg.fail("fmt", f"is {fmt!r}; only e4m3 FP8 is read")
    scheme = q.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise cfg.fail("activation_scheme", f"is {scheme!r}; only dynamic (weights-only scales) is read")
    block = q.get("weight_block_size")
    if block is None:
        raise CheckpointError(f"{where}: quant_method 'fp8' without weight_block_size (per-tensor FP8) is not supported; "
                              "only block-FP8 (weight_block_size [128, 128]) is read")
    if not (isinstance(block, list) and len(block) == 2 and all(_is_int(b) and 0 < b <= 1 << 16 for b in block)):
        raise cfg.fail("weight_block_size", f"is {block!r}, expected two positive integers")
    skip = q.get("modules_to_not_convert") or []
    if not isinstance(skip, list) or not all(isinstance(m, str) for m in skip):
        raise cfg.fail("modules_to_not_convert", "must be a list of module names")
    return Quantization("fp8", fmt, (block[0], block[1]), scheme, tuple(skip))


def _fmt(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _module(name: str) -> str:
    return name.removesuffix(".weight")


def _check_storage(path: Path, tensors: dict[str, TensorEntry], names: list[str], q: Quantization | None) -> None:
    """Every weight a stage reads is a float, or block-FP8 with its scales; refuse the rest by name."""
    for name in names:
        e = tensors[name]
        where = f"{path / e.file}: tensor {name}"
        if name.endswith(SCALE_SUFFIX):
            weight = name[: -len(SCALE_SUFFIX)]
            if weight not in tensors or tensors[weight].dtype != FP8_DTYPE:
                raise CheckpointError(f"{where} is a block scale without an {FP8_DTYPE} weight {weight}; the checkpoint is inconsistent")
            if e.dtype not in SCALE_DTYPES:
                raise CheckpointError(f"{where} is stored as {e.dtype}; block scales are F32 or BF16")
            continue
        if e.dtype in FLOAT_DTYPES:
            continue
        if e.dtype == FP8_DTYPE:
            if q is None:
                raise CheckpointError(f"{where} is stored as {e.dtype} but config.json has no quantization_config "
                                      "(quant_method fp8, weight_block_size): refused rather than cast to weights")
            if len(e.shape) < 2:
                raise CheckpointError(f"{where} is stored as {e.dtype} with shape {_fmt(e.shape)}; only matrices are block-FP8")
            if q.keeps(_module(name)):
                raise CheckpointError(f"{where} is stored as {e.dtype}, but quantization_config.modules_to_not_convert "
                                      "keeps that module unquantised; the checkpoint is inconsistent")
            scale = name + SCALE_SUFFIX
            br, bc = q.block
            want = (*e.shape[:-2], -(-e.shape[-2] // br), -(-e.shape[-1] // bc))
            if scale not in tensors:
                raise CheckpointError(f"{where} is {e.dtype} but its block scale {scale} is missing (expected shape "
                                      f"{_fmt(want)}); the checkpoint is incomplete")
            if tensors[scale].shape != want:
                raise CheckpointError(f"{path / tensors[scale].file}: tensor {scale} has shape {_fmt(tensors[scale].shape)}, "
                                      f"expected {_fmt(want)} ({br}x{bc} blocks of {name} {_fmt(e.shape)})")
            continue
        what = "an integer" if e.dtype[0] in "IU" else "a boolean" if e.dtype == "BOOL" else "an FP8 format other than e4m3"
        method = "block-FP8" if q is not None else "none declared"
        raise CheckpointError(
            f"{where} is stored as {e.dtype} ({what} dtype: packed or quantised weights, quantisation {method}); "
            "this tool reads float and block-FP8 weights only and never casts codes to weights"
        )


def _expert_layout(path: Path, head: list[str], prefix: str) -> str:
    fused = any(n.startswith(prefix + "experts.gate_up_proj") or n.startswith(prefix + "experts.down_proj") for n in head)
    per_expert = any(n.startswith(prefix + "experts.") and n[len(prefix + "experts."):].split(".")[0].isdigit() for n in head)
    if fused and per_expert:
        raise CheckpointError(f"{path}: the head's experts are stored both fused ({prefix}experts.gate_up_proj) and per "
                              f"expert ({prefix}experts.N.*); keep one layout")
    return "per_expert" if per_expert else "fused"


def read_checkpoint(model_dir: str | Path) -> CheckpointInfo:
    """Read and validate a checkpoint directory from config.json and safetensors headers."""
    path = Path(model_dir).expanduser()
    config = _read_config(path)
    where = path / "config.json"

    # 1. Which family member, which layout.
    model_type, family, text_config = _family_of(config, where)
    layout = family.layout

    # 2. Tying: VLM wrappers carry it at the top level; text_config must agree when it says.
    tie = _tying(config, text_config, layout, where)
    geometry = _geometry(family, text_config, path)
    if geometry.num_layers < 1:
        raise CheckpointError(f"{where}: {family.depth_key} is {geometry.num_layers}; an MTP head has at least one layer")
    if family.head == "nextn" and geometry.num_layers != 1:  # the engines build one NextN layer, model.layers.{L}
        raise CheckpointError(f"{where}: {family.depth_key} is {geometry.num_layers}; a NextN head is one layer "
                              f"(model.layers.{geometry.layer_index}): only 1 (every released checkpoint) is supported")
    quantization = _quantization(config, text_config if layout == "vlm" else {}, path)

    routing = geometry.moe
    if routing is None and family.head_mlp == "by_sparse_step" and text_config.get("num_experts"):
        routing = _moe(_Config(text_config, where))  # a dense MTP layer over a MoE target
    if routing is None and family.head == "nextn":
        routing = _grouped_moe(family, _Config(text_config, where))  # a dense NextN layer over a MoE target

    # 3. Every tensor, from the headers.
    tensors = _header_tensors(path)

    # 4. The head: present, every tensor at the shape the config implies, stored as it can be read.
    expert_layout = _check_head(path, model_type, family, geometry, tensors)

    # 5. The borrowed tensors.
    info = CheckpointInfo(
        path=path, config=config, text_config=dict(text_config), model_type=model_type, layout=layout,
        tie_word_embeddings=tie, geometry=geometry, tensors=tensors, family=family, expert_layout=expert_layout,
        quantization=quantization, routing=routing,
    )
    _check_borrowed(info)
    return info


def _family_of(config: dict, where: Path) -> tuple[str, Family, dict]:
    """(model_type, its family, the text config: config.json's text_config for a VLM wrapper, else config.json)."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        shown = model_type if isinstance(model_type, str) or model_type is None else f"{model_type!r:.40}"
        raise CheckpointError(
            f"{where}: unsupported model_type {shown!r}; supported: {', '.join(FAMILIES)}"
        )
    family = FAMILIES[model_type]
    layout = family.layout
    text_config = config.get("text_config") if layout == "vlm" else config
    if layout == "vlm" and not isinstance(text_config, dict):
        found = "none" if text_config is None else type(text_config).__name__
        raise CheckpointError(f"{where}: a {model_type!r} config needs a text_config object (found {found}); restore config.json")
    if layout == "vlm" and not text_config:
        raise CheckpointError(f"{where}: a {model_type!r} config needs a text_config; restore config.json")
    if layout == "vlm" and text_config.get("model_type", family.text_model_type) != family.text_model_type:
        raise CheckpointError(f"{where}: text_config.model_type is {text_config.get('model_type')!r}, expected "
                              f"{family.text_model_type!r} for a {model_type!r} checkpoint")

    return model_type, family, text_config


def _tying(config: dict, text_config: dict, layout: str, where: Path) -> bool:
    """tie_word_embeddings (a VLM wrapper carries it at the top level; text_config must agree when it says)."""
    tie = _Config(config, where).bool("tie_word_embeddings", False)
    if layout == "vlm" and "tie_word_embeddings" in text_config:
        inner = _Config(text_config, where, "text_config.").bool("tie_word_embeddings", False)
        if inner != tie:
            raise CheckpointError(
                f"{where}: tie_word_embeddings is {tie} at the top level but {inner} in text_config; make them agree"
            )
    return tie


def _header_tensors(path: Path) -> dict[str, TensorEntry]:
    """Every tensor of the checkpoint, from its safetensors headers (each in one shard, where the index says)."""
    files, weight_map = _shard_files(path)
    tensors: dict[str, TensorEntry] = {}
    for f in files:
        for name, (dtype, shape, nbytes) in read_safetensors_header(path / f).items():
            if name in tensors:
                raise CheckpointError(f"{path / f}: tensor {name} is also in {path / tensors[name].file}; "
                                      "a tensor must live in one shard")
            tensors[name] = TensorEntry(name, dtype, shape, nbytes, f)
    if weight_map is not None:
        for name, f in weight_map.items():
            if name not in tensors or tensors[name].file != f:
                raise CheckpointError(f"{path / 'model.safetensors.index.json'}: weight_map puts {name} in {f}, whose "
                                      "header does not hold it; restore the index or the shard")

    return tensors


def _check_head(path: Path, model_type: str, family: Family, geometry: HeadGeometry,
                tensors: dict[str, TensorEntry]) -> str | None:
    """The head present, every tensor at the shape the config implies and none beyond it; returns its experts'
    layout (None for a dense head)."""
    names = head_names(geometry)
    head = [n for n in tensors if n.startswith(names.prefix)]
    if not head and family.head == "nextn":
        raise CheckpointError(
            f"{path}: this checkpoint ships no NextN layer (no {names.prefix}* tensors for num_hidden_layers "
            f"{geometry.layer_index}); vLLM refuses it too (deepseek_mtp.py:520-537: 'quantized without including the "
            "MTP layers'): use a checkpoint saved with its MTP layer"
        )
    if not head:
        raise CheckpointError(
            f"{path}: this checkpoint ships no MTP head (no mtp.* tensors); use a checkpoint saved with its mtp.* weights"
        )
    mlp_prefix = names.prefix + names.layer + "mlp."
    expert_layout = _expert_layout(path, head, mlp_prefix) if geometry.moe is not None else None
    if geometry.moe is None and any(".mlp.experts." in n or n.endswith(".mlp.gate.weight") for n in head):
        raise CheckpointError(f"{path}: the MTP head has a sparse MoE block but config.json describes a dense MLP "
                              f"(model_type {model_type!r}); config and weights do not match")
    expected = expected_head_shapes(geometry, expert_layout or "fused")
    for name, shape in expected.items():
        if name not in tensors:
            raise CheckpointError(f"{path}: head tensor {name} is missing (expected shape {_fmt(shape)}); the checkpoint is incomplete")
        if tensors[name].shape != shape:
            raise CheckpointError(
                f"{path}: head tensor {name} has shape {_fmt(tensors[name].shape)}, expected {_fmt(shape)} "
                "from config.json; config and weights do not match"
            )
    copies = {names.prefix + c for c in names.copies}
    for name in head:
        if name in copies:
            if tensors[name].shape != (geometry.vocab_size, geometry.hidden_size):
                raise CheckpointError(f"{path}: head tensor {name} has shape {_fmt(tensors[name].shape)}, expected "
                                      f"{_fmt((geometry.vocab_size, geometry.hidden_size))} (a copy of the target's)")
            continue
        if name not in expected and not (name.endswith(SCALE_SUFFIX) and name[: -len(SCALE_SUFFIX)] in expected):
            what = f"{model_type} NextN layer" if family.head == "nextn" else "Qwen3.5-family head"
            raise CheckpointError(f"{path}: head tensor {name} is not part of a {geometry.mlp} {what} "
                                  f"({len(expected)} tensors); config and weights do not match")
    if family.head == "nextn":
        beyond = next((n for n in tensors if n.startswith(f"model.layers.{geometry.layer_index + 1}.")), None)
        if beyond is not None:  # num_nextn_predict_layers is 1 (checked above): no second NextN layer
            raise CheckpointError(f"{path}: tensor {beyond} belongs to a second NextN layer, but "
                                  f"num_nextn_predict_layers is 1; config and weights do not match")

    return expert_layout


def _check_borrowed(info: CheckpointInfo) -> None:
    """The tensors the head borrows from the target (embedding, lm_head), the target's routed experts against the
    config, and every tensor stored as it can be read."""
    path, tensors, geometry, routing = info.path, info.tensors, info.geometry, info.routing
    model_type, quantization = info.model_type, info.quantization
    if routing is None:
        routed = next((n for n in info.target_names if ".mlp.experts." in n), None)
        if routed is not None:
            raise CheckpointError(f"{path}: target tensor {routed} is a routed expert but config.json describes a dense "
                                  f"{model_type!r} model; config and weights do not match")
    H, V = geometry.hidden_size, geometry.vocab_size
    for name, what in ((info.embed_name, "embedding"), (info.lm_head_name, "lm_head")):
        if name not in tensors:
            hint = " (tie_word_embeddings is false)" if what == "lm_head" else ""
            raise CheckpointError(f"{path}: {what} tensor {name} is missing{hint}; the checkpoint is incomplete")
        if tensors[name].shape != (V, H):
            raise CheckpointError(
                f"{path}: {what} tensor {name} has shape {_fmt(tensors[name].shape)}, expected {_fmt((V, H))}"
            )
    _check_storage(path, tensors, info.target_names + info.head_names, quantization)
    for name in info.head_copies:
        if tensors[name].dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"{path / tensors[name].file}: tensor {name} is stored as {tensors[name].dtype}; "
                                  "a copy of the embedding or lm_head is a float matrix")
    for name in info.head_weights + [info.embed_name, info.lm_head_name]:
        e = tensors[name]
        if len(e.shape) == 1 and e.dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"{path / e.file}: tensor {name} is stored as {e.dtype}; a norm is a float vector")


# ---------------------------------------------------------------------------------------------
# Tensor data


def linear_rules(info: CheckpointInfo, serving) -> dict:
    """{checkpoint name: serving.LinearRule} for every block-FP8 linear weight (a matrix, not a routed expert's: vLLM's
    Fp8MoEMethod kernels are not modelled) under `serving` (serving.ServingNumerics; None, or a checkpoint that is
    not block-FP8: {})."""
    if serving is None or info.quantization is None:
        return {}
    from .serving import linear_rule

    model_type = info.text_config.get("model_type")
    return {name: linear_rule(serving, model_type, e.shape[0], e.shape[1], info.quantization.block)
            for name, e in info.tensors.items()
            if e.dtype == FP8_DTYPE and len(e.shape) == 2 and ".experts." not in name}


def describe_rules(rules: dict) -> dict[str, int]:
    """{what a rule does: how many linears follow it} (run.json serving.linears)."""
    out: dict[str, int] = {}
    for rule in rules.values():
        out[rule.describe()] = out.get(rule.describe(), 0) + 1
    return dict(sorted(out.items()))


# ---------------------------------------------------------------------------------------------
# The weights fingerprint: what `replay --resume` compares (config and headers are not enough:
# a fine-tune, or a retrained head, keeps both byte-identical)


# ---------------------------------------------------------------------------------------------
# The head as an engine runs it, and the NextN layer's copies of the target's tensors


def reading_for(info: CheckpointInfo, engine: str = "vllm"):
    """families.HeadReading of `engine` for this checkpoint's head, refused in one line where that engine could not
    load the checkpoint: SGLang builds a NextN layer as MoE whatever its index (models/deepseek_v2.py:2784-2792,
    models/glm4_moe.py:827-834), so it has no place for a dense one."""
    from ..errors import OptionError
    from .families import HEAD_ENGINES, head_reading

    if engine not in HEAD_ENGINES:
        raise OptionError(f"--head-reading {engine}: expected one of {', '.join(HEAD_ENGINES)}")
    reading = head_reading(info.model_type, engine)
    if reading.nextn_mlp == "moe" and info.geometry.moe is None:
        raise CheckpointError(f"{info.path}: the NextN layer {info.head_prefix.rstrip('.')} has a dense MLP (its index is "
                              f"below first_k_dense_replace), but SGLang builds it as MoE (is_nextn) and cannot load it; "
                              "replay with --head-reading vllm")
    return reading


