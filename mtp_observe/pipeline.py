"""The pipeline: the one place that ties the stages together.

Contract: `load_model` turns a checkpoint directory into the target (transformers) and the
head (ours, borrowing the target's embedding and lm_head), on one device and dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoint import CheckpointInfo, load_head_tensors, load_target, read_checkpoint
from .errors import OptionError
from .mtp import MtpHead, build_head

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def default_model_dir() -> Path:
    """The small trained Qwen3.5-architecture checkpoint shipped inside the package."""
    path = Path(__file__).parent / "default_model"
    if not (path / "config.json").exists():
        raise OptionError(f"no --model given and the bundled default model is missing at {path}; pass --model DIR")
    return path


def resolve_device(device: str) -> str:
    """auto -> cuda when available, else cpu; cuda[:i] must exist."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise OptionError(f"--device {device}: no CUDA device is visible; use --device cpu (or auto)")
        index = device.partition(":")[2]
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            raise OptionError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return device
    raise OptionError(f"--device {device}: expected auto, cpu, cuda or cuda:N")


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """auto -> bfloat16 on CUDA, float32 on CPU (PRODUCT.md's performance rules)."""
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in DTYPES:
        raise OptionError(f"--dtype {dtype}: expected auto, float32 or bfloat16")
    return DTYPES[dtype]


@dataclass(frozen=True)
class LoadedModel:
    info: CheckpointInfo
    target: object  # transformers Qwen3_5ForCausalLM, eval mode
    head: MtpHead
    device: str
    dtype: torch.dtype


def load_model(model_dir: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> LoadedModel:
    info = read_checkpoint(model_dir)
    target = load_target(info, device=device, dtype=dtype)
    head = build_head(
        info.geometry, load_head_tensors(info, device=device, dtype=dtype),
        embed_tokens=target.model.embed_tokens.weight, lm_head=target.lm_head.weight,
    )
    return LoadedModel(info=info, target=target, head=head, device=device, dtype=dtype)
