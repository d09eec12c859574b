"""The probe: the measured cost of one draft step, one target decode step and one verify of K+1 tokens.

Contract: `probe(model_dir, ...)` loads the checkpoint (pipeline.load_model), fills the target's
cache and the head's KV to `context` tokens, and times at batch 1, with device-synchronised
timers, `warmup` untimed runs and the median of `repeats`:

    draft step      MtpHead.decode_step: one head row (fc, attention over the context's head KV,
                    MLP, norm) and the argmax over the whole lm_head — what each of the K draft
                    steps costs in serving
    target decode   one token through the target with a transformers DynamicCache holding the
                    context, logits for that token
    verify(K)       K+1 tokens through the target on the same cache, logits for all of them,
                    for K = 1..k

The cache is deep-copied before every timed call, outside the timed region (a forward appends to
it, and Qwen3.5's linear-attention layers update their recurrent state in place). The result is
`ProbeResult`; `probe_json` writes probe.json, which `mtp-observe report --probe` reads without
torch (report.read_probe). Figures measured on a CPU do not stand for a GPU's: batch-1 decode on a
GPU is bound by memory bandwidth, on a CPU by compute and caches; the file says so (`cpu`).

probe.json keys (probe_version 1):
    probe_version   1
    tool            {"name": "mtp-observe", "version"}
    created         ISO-8601 UTC
    model           {"path", "model_type", "config_sha256", "numerics"} (numerics: what the weights were computed
                    in, e.g. "fp8 e4m3 weights (128x128 blocks, ...) dequantised to bfloat16")
    device          "cuda:0" | "cpu" ...;  device_name: the GPU's name or the CPU's description
    cpu             true when measured on a CPU (the figures do not stand for a GPU)
    dtype           "bfloat16" | "float32"
    context         tokens in the target's cache and the head's KV before each timed step
    k               the largest K whose verify (K+1 tokens) was timed
    batch           1
    repeats, warmup timed runs (their median is reported) and untimed warm-up runs
    timings_s       {"draft_step": median seconds, "target_decode": median seconds}
    samples_s       {"draft_step": [seconds per repeat], "target_decode": [...]}
    verify          [{"k": K, "tokens": K+1, "median_s", "samples_s": [...], "extra": v(K)}] for K = 1..k,
                    v(K) = verify(K+1 tokens) / target decode - 1 (the report clamps it at 0)
    draft_cost      c = draft step / target decode
    roofline        {"precision", "head_bytes", "lm_head_bytes", "target_bytes", "head_step_bytes",
                    "target_step_bytes", "draft_cost"} at the probe's dtype (inventory.py: bytes a batch-1 draft
                    step reads over bytes a decode step reads; *_step_bytes charge routed experts at top-k / E)
    versions        {"python", "torch", "transformers"}
    notes           [str]
"""

from __future__ import annotations

import copy
import importlib.util
import platform
import statistics
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from . import __version__
from .errors import OptionError
from .inventory import take_inventory
from .pipeline import load_model, resolve_device, resolve_dtype
from .report import PROBE_VERSION
from .target import _cache_kwarg

CPU_NOTE = ("measured on a CPU: CPU figures do not stand for a GPU's (batch-1 decode on a GPU is bound by memory "
            "bandwidth, on a CPU by compute and caches); run the probe on the serving GPU for a cost to gate on")


@dataclass(frozen=True)
class Timing:
    median_s: float
    samples_s: tuple[float, ...]  # [repeats] seconds, in the order run


@dataclass(frozen=True)
class ProbeResult:
    model: dict  # {"path", "model_type", "config_sha256", "numerics"}
    device: str
    device_name: str
    dtype: str  # "bfloat16" | "float32"
    context: int
    k: int
    repeats: int
    warmup: int
    draft_step: Timing
    target_decode: Timing
    verify: tuple[Timing, ...]  # [k] verify of K+1 tokens for K = 1..k
    roofline: dict  # {"precision", "head_bytes", "lm_head_bytes", "target_bytes", "draft_cost"}
    notes: tuple[str, ...]

    @property
    def draft_cost(self) -> float:
        """c = one draft step / one target decode step."""
        return self.draft_step.median_s / self.target_decode.median_s

    def verify_extra(self) -> list[float]:
        """v(K) = verify(K+1 tokens) / decode(1 token) - 1, K = 1..k (unclamped: the measurement as taken)."""
        return [t.median_s / self.target_decode.median_s - 1.0 for t in self.verify]


def time_call(fn, setup, *, repeats: int, warmup: int, device: str) -> Timing:
    """Median seconds of fn(setup()) over `repeats` runs after `warmup` untimed ones.

    setup() runs outside the timed region (a fresh cache copy); on CUDA the device is synchronised
    before the timer starts and before it stops, so queued kernels are counted where they run.
    """
    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        fn(setup())
    sync()
    samples = []
    for _ in range(repeats):
        arg = setup()
        sync()
        t0 = time.perf_counter()
        fn(arg)
        sync()
        samples.append(time.perf_counter() - t0)
    return Timing(median_s=statistics.median(samples), samples_s=tuple(samples))


def roofline_at(inventory, dtype: torch.dtype) -> dict:
    """The roofline draft cost at the probe's dtype: BF16 as inventory.py counts it; float32 = 4 bytes a weight
    (batch-1 steps: routed experts charged at top-k / E)."""
    return inventory.roofline("BF16" if dtype == torch.bfloat16 else "F32")


@dataclass(frozen=True)
class Context:
    """The state before the timed calls: `context` tokens in the target's cache and the head's KV."""

    ids: torch.Tensor  # [context + k + 1] random token ids; x_context .. x_{context+k} are the timed inputs
    cache: object  # transformers DynamicCache holding x_0 .. x_{context-1} (deep-copied before each timed call)
    hidden: torch.Tensor  # [context, H] the target's post-norm h_0 .. h_{context-1}
    rows: object  # mtp.RowPass over rows 0 .. context-2, i.e. (h_i, x_{i+1})


@torch.no_grad()
def fill_context(loaded, context: int, k: int, seed: int = 0, chunk_size: int = 2048) -> Context:
    """Random tokens through the target (chunked, into its own cache) and the head's row pass."""
    from transformers import DynamicCache

    target = loaded.target
    device = loaded.device
    kw = _cache_kwarg(target.model)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, loaded.info.geometry.vocab_size, (context + k + 1,), generator=generator).to(device)
    cache = DynamicCache(config=target.config)
    hidden = torch.empty(context, target.config.hidden_size, dtype=loaded.dtype, device=device)
    for c0 in range(0, context, chunk_size):
        c1 = min(context, c0 + chunk_size)
        hidden[c0:c1] = target.model(input_ids=ids[None, c0:c1], use_cache=True, **{kw: cache}).last_hidden_state[0]
    rows = loaded.head.row_pass(hidden[: context - 1], ids[1:context])
    return Context(ids=ids, cache=cache, hidden=hidden, rows=rows)


@torch.no_grad()
def target_forward(target, ctx: Context, n: int, cache) -> torch.Tensor:
    """n tokens x_context .. x_{context+n-1} through the target on `cache` (which it extends) -> logits [n, V].
    n = 1 is a decode step; n = K+1 is the verify of K drafts."""
    context = ctx.hidden.shape[0]
    kw = _cache_kwarg(target.model)
    out = target(input_ids=ctx.ids[None, context : context + n], use_cache=True, logits_to_keep=n, **{kw: cache})
    return out.logits[0]


@torch.no_grad()
def probe(
    model_dir: str | Path,
    *,
    context: int = 4096,
    k: int = 4,
    device: str = "auto",
    dtype: str = "auto",
    repeats: int = 20,
    warmup: int = 3,
    seed: int = 0,
) -> ProbeResult:
    if context < 2:
        raise OptionError(f"--context {context}: expected at least 2 tokens")
    if k < 1:
        raise OptionError(f"--k {k}: expected at least 1")
    if repeats < 1:
        raise OptionError(f"--repeats {repeats}: expected at least 1")
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    loaded = load_model(model_dir, device=device, dtype=torch_dtype)
    info, target, head = loaded.info, loaded.target, loaded.head

    # 1. `context` random tokens into the target's cache and the head's KV.
    ctx = fill_context(loaded, context, k, seed)
    ids, cache, hidden, rows = ctx.ids, ctx.cache, ctx.hidden, ctx.rows

    # 2. One draft step: row context-1 = (h_{context-1}, x_context) at position context-1, seeing rows
    #    0..context-2 and itself, then the argmax over the lm_head.
    draft_inputs = (hidden[context - 1 : context], ids[context : context + 1],
                    torch.tensor([context - 1], device=device))
    draft = time_call(lambda _: head.decode_step(rows, context - 1, *draft_inputs), lambda: None,
                      repeats=repeats, warmup=warmup, device=device)

    # 3. One target decode step and one verify of K+1 tokens, each on a fresh copy of the context's cache.
    def fresh_cache():
        return copy.deepcopy(cache)

    decode = time_call(lambda c: target_forward(target, ctx, 1, c), fresh_cache, repeats=repeats, warmup=warmup,
                       device=device)
    verify = tuple(time_call(lambda c, n=K + 1: target_forward(target, ctx, n, c), fresh_cache, repeats=repeats,
                             warmup=warmup, device=device)
                   for K in range(1, k + 1))

    notes = []
    if device == "cpu":
        notes.append(CPU_NOTE)
    else:
        missing = [m for m in ("fla", "causal_conv1d") if importlib.util.find_spec(m) is None]
        if missing:
            notes.append(f"{' and '.join(missing)} not installed: the target's linear-attention layers ran transformers' "
                         "reference kernels, so the decode step may be slower than in serving and c too small")
    notes.append("the draft step concatenates the head's KV (as MtpHead.decode_step does); a serving engine writes "
                 "it in place, so the measured draft step may run slightly long at large contexts")
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else (platform.processor() or platform.machine())
    return ProbeResult(
        model={"path": str(info.path), "model_type": info.model_type, "config_sha256": info.config_sha256,
               "numerics": info.numerics(torch_dtype)},
        device=device, device_name=name, dtype=str(torch_dtype).removeprefix("torch."), context=context, k=k,
        repeats=repeats, warmup=warmup, draft_step=draft, target_decode=decode, verify=verify,
        roofline=roofline_at(take_inventory(info), torch_dtype), notes=tuple(notes),
    )


def probe_json(result: ProbeResult) -> dict:
    """probe.json (keys in the module docstring)."""

    import transformers

    return {
        "probe_version": PROBE_VERSION,
        "tool": {"name": "mtp-observe", "version": __version__},
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "model": result.model,
        "device": result.device,
        "device_name": result.device_name,
        "cpu": result.device == "cpu",
        "dtype": result.dtype,
        "context": result.context,
        "k": result.k,
        "batch": 1,
        "repeats": result.repeats,
        "warmup": result.warmup,
        "timings_s": {"draft_step": result.draft_step.median_s, "target_decode": result.target_decode.median_s},
        "samples_s": {"draft_step": list(result.draft_step.samples_s), "target_decode": list(result.target_decode.samples_s)},
        "verify": [
            {"k": K, "tokens": K + 1, "median_s": t.median_s, "samples_s": list(t.samples_s), "extra": extra}
            for K, (t, extra) in enumerate(zip(result.verify, result.verify_extra()), start=1)
        ],
        "draft_cost": result.draft_cost,
        "roofline": result.roofline,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "notes": list(result.notes),
    }
