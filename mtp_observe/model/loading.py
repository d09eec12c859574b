"""Loading: a checkpoint directory turned into the target (transformers) and the head (ours, borrowing the target's
embedding and lm_head), on one device and dtype.

Contract: `load_model(model_dir, device, dtype, ...)` -> LoadedModel; `resolve_device`/`resolve_dtype` turn `auto`
into this machine's choice (bf16 on CUDA, fp32 on CPU: PRODUCT.md's performance rules); `default_model_dir()` is the
bundled model; `non_finite_advice(dtype)` says what a NaN output means at a dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import OptionError
from .checkpoint import CheckpointInfo, read_checkpoint, reading_for
from .mtp import MtpHead, build_head
from .weights import load_head_tensors, load_target

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def default_model_dir() -> Path:
    """The small trained Qwen3.5-architecture checkpoint shipped inside the package."""
    path = Path(__file__).parents[1] / "default_model"
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
    serving: object = None  # serving.ServingNumerics the model was loaded for (None: weight-only, PyTorch top-k)

    @property
    def top_k_ties(self) -> str:
        return self.serving.top_k_ties if self.serving is not None else "all"


def load_model(model_dir: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32,
               device_map: str | None = None, head_engine: str = "vllm", serving=None) -> LoadedModel:
    """device_map ("auto", accelerate) spreads a target too large for one device over all visible ones;
    the head then sits with the lm_head on the last device. head_engine: whose reading of the head to run where
    the engines differ (families.head_reading; NextN heads only): "vllm" (0.33) or "sglang" (0.5.23). serving
    (serving.ServingNumerics): a block-FP8 checkpoint's linears as that device serves them (W8A8, re-quantised
    weights: fp8.py); None: weight-only."""
    info = read_checkpoint(model_dir)
    reading = reading_for(info, head_engine)
    if device_map is not None:
        try:
            import accelerate  # noqa: F401
        except ImportError:
            raise OptionError("--device-map needs accelerate: pip install 'mtp-observe[scale]' (or pip install accelerate)")
    target = load_target(info, device=device, dtype=dtype, device_map=device_map, serving=serving)
    head = build_head(
        info.geometry, load_head_tensors(info, device=str(target.lm_head.weight.device), dtype=dtype, serving=serving),
        embed_tokens=target.model.embed_tokens.weight, lm_head=target.lm_head.weight, reading=reading,
    )
    return LoadedModel(info=info, target=target, head=head, device=device, dtype=dtype, serving=serving)


def non_finite_advice(dtype) -> str:
    """What a NaN or inf output means and what to do: in bfloat16 (or float16) it may be an overflow, which float32
    avoids; in float32 it is the weights (--dtype float32 would change nothing, so it is not advised)."""
    name = str(dtype).removeprefix("torch.")
    if name == "float32":
        return "the weights hold NaN/inf (the run is already float32, where these weights do not overflow): check the checkpoint"
    return f"the weights hold NaN/inf or overflow in {name}: check the checkpoint, or try --dtype float32"
