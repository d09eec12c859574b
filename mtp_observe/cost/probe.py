"""The probe: the measured cost of one draft step, one target decode step and one verify of K+1 tokens,
at one or more batch sizes.

Contract: `probe(model_dir, ...)` loads the checkpoint (pipeline.load_model), fills the target's
cache and the head's KV to `context` tokens once, and for every batch size B (`--batch 1,2,4,...`;
batch 1 is always measured) times, with device-synchronised timers, `warmup` untimed runs and the
median of `repeats`:

    draft step      one head row for each of B sequences (fc, attention over that sequence's own copy of
                    the head's KV, MLP, norm) and the argmax over the whole lm_head (`batched_draft_step`):
                    what each of the K draft steps costs in serving
    target decode   one new token for each of B sequences through the target, on a transformers
                    DynamicCache holding B copies of the context, logits for every token
    verify(K)       K+1 new tokens for each of B sequences on the same cache, for K = 1..k
    with --tree S,TOPK,T (trees, tree.py): the verifies reach T tokens (k >= T - 1; a causal verify of T tokens:
                    tree attention reads the same weights and KV, and Qwen3.5's linear-attention layers cannot branch),
                    and `draft_width`: one draft step of B sequences with TOPK frontier tokens each, B·TOPK head rows
                    each over its own copy of the sequence's head KV (SGLang's FlashInfer / Triton draft kernels read
                    the prefix once per slot, sglang/kernels/ops/speculative/cache_locs.py:160-310)

The B sequences share the context's cache contents (copied B times: `expand_cache`, built once per B);
their new tokens differ (random, per sequence), so a MoE target routes them as different tokens. The
cache is deep-copied before every timed call, outside the timed region (a forward appends to it, and
Qwen3.5's linear-attention layers update their recurrent state in place); the head's KV copies are
written in place (the new row's slot), as a serving engine writes its cache.

Sanity checks (`flags`, per batch size): a verify of K+1 tokens measured faster than a decode of 1
(v(K) < 0), or faster than the verify of K tokens; the report takes such a v as 0 and says so (never
silently). The result is `ProbeResult`; `probe_json` writes probe.json, which `mtp-observe report
--probe` reads without torch (report.read_probe, cost.step_times_from_probe). Figures measured on a
CPU do not stand for a GPU's: batch-1 decode on a GPU is bound by memory bandwidth, on a CPU by compute
and caches; the file says so (`cpu`).

probe.json keys (probe_version 2; version 1 had no batch_sizes and batches, and the report still reads it):
    probe_version   2
    tool            {"name": "mtp-observe", "version"}
    created         ISO-8601 UTC
    model           {"path", "model_type", "config_sha256", "numerics"} (numerics: what the weights were computed
                    in, e.g. "fp8 e4m3 weights (128x128 blocks, ...) dequantised to bfloat16")
    device          "cuda:0" | "cpu" ...;  device_name: the GPU's name or the CPU's description
    cpu             true when measured on a CPU (the figures do not stand for a GPU)
    dtype           "bfloat16" | "float32"
    context         tokens in the target's cache and the head's KV before each timed step (per sequence)
    k               the largest K whose verify (K+1 tokens) was timed
    batch           1: the batch size of the top-level timings below (batch 1, as in version 1)
    repeats, warmup timed runs (their median is reported) and untimed warm-up runs
    timings_s       {"draft_step": median seconds, "target_decode": median seconds}            (batch 1)
    samples_s       {"draft_step": [seconds per repeat], "target_decode": [...]}               (batch 1)
    verify          [{"k": K, "tokens": K+1, "median_s", "samples_s": [...], "extra": v(K)}] for K = 1..k,
                    v(K) = verify(K+1 tokens) / target decode - 1 (the report clamps it at 0)   (batch 1)
    draft_cost      c = draft step / target decode                                             (batch 1)
    batch_sizes     [B, ...] every batch size measured, ascending (1 first)
    batches         [{"batch": B, "target_decode": {"median_s", "samples_s"}, "draft_step": {"median_s", "samples_s"},
                      "verify": [{"k", "tokens", "median_s", "samples_s", "extra"}], "draft_cost": c_B,
                      "flags": [str], "draft_width": [{"width", "median_s", "samples_s"}] (with --tree)}] one per batch
                    size (the sanity checks above)
    trees           [name] the --tree configurations the probe measured for (absent without --tree)
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
import torch.nn.functional as F

from .. import __version__
from ..errors import OptionError
from ..model.loading import load_model, resolve_device, resolve_dtype
from ..model.target import _cache_kwarg
from .inventory import take_inventory
from .speedup import PROBE_VERSION

CPU_NOTE = ("measured on a CPU: CPU figures do not stand for a GPU's (batch-1 decode on a GPU is bound by memory "
            "bandwidth, on a CPU by compute and caches); run the probe on the serving GPU for a cost to gate on")


@dataclass(frozen=True)
class Timing:
    median_s: float
    samples_s: tuple[float, ...]  # [repeats] seconds, in the order run


@dataclass(frozen=True)
class BatchTiming:
    """The three steps at one batch size."""

    batch: int
    draft_step: Timing
    target_decode: Timing
    verify: tuple[Timing, ...]  # [k] verify of K+1 tokens per sequence for K = 1..k
    draft_width: tuple[tuple[int, Timing], ...] = ()  # (w, one draft step of B sequences with w tokens each) for trees

    @property
    def draft_cost(self) -> float:
        """c_B = one draft step / one target decode step."""
        return self.draft_step.median_s / self.target_decode.median_s

    def verify_extra(self) -> list[float]:
        """v_B(K) = verify(K+1 tokens) / decode(1 token) - 1, K = 1..k (unclamped: the measurement as taken)."""
        return [t.median_s / self.target_decode.median_s - 1.0 for t in self.verify]

    def flags(self) -> list[str]:
        """The sanity checks that failed (module docstring)."""
        out = []
        previous = self.target_decode.median_s
        for K, (t, v) in enumerate(zip(self.verify, self.verify_extra()), start=1):
            if v < 0:
                out.append(f"batch {self.batch}: the verify of {K + 1} tokens ({t.median_s * 1e3:.3f} ms) measured faster "
                           f"than a decode of 1 ({self.target_decode.median_s * 1e3:.3f} ms): v({K}) = {v:+.3f}")
            elif K > 1 and t.median_s < previous:
                out.append(f"batch {self.batch}: the verify of {K + 1} tokens ({t.median_s * 1e3:.3f} ms) measured faster "
                           f"than the verify of {K} ({previous * 1e3:.3f} ms)")
            previous = t.median_s
        return out


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
    batches: tuple[BatchTiming, ...]  # [batch sizes] ascending, batch 1 first
    roofline: dict  # {"precision", "head_bytes", "lm_head_bytes", "target_bytes", "draft_cost"}
    notes: tuple[str, ...]
    trees: tuple[str, ...] = ()  # the --tree configurations measured for

    def __post_init__(self):
        assert self.batches and self.batches[0].batch == 1, "batch 1 is always measured"

    @property
    def draft_step(self) -> Timing:  # batch 1
        return self.batches[0].draft_step

    @property
    def target_decode(self) -> Timing:
        return self.batches[0].target_decode

    @property
    def verify(self) -> tuple[Timing, ...]:
        return self.batches[0].verify

    @property
    def draft_cost(self) -> float:
        """c = one draft step / one target decode step (batch 1)."""
        return self.batches[0].draft_cost

    def verify_extra(self) -> list[float]:
        """v(K) at batch 1 (unclamped)."""
        return self.batches[0].verify_extra()


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


def expand_cache(cache, batch: int):
    """A copy of a batch-1 transformers cache holding `batch` copies of it (KV and linear-attention states)."""
    out = copy.deepcopy(cache)
    if batch > 1:
        out.reorder_cache(torch.zeros(batch, dtype=torch.long, device=_cache_device(cache)))
    return out


def _cache_device(cache):
    for layer in cache.layers:
        for name in ("keys", "recurrent_states"):
            value = getattr(layer, name, None)
            value = next((v for v in value.values() if v is not None), None) if isinstance(value, dict) else value
            if isinstance(value, torch.Tensor):
                return value.device
    return "cpu"


@torch.no_grad()
def batched_target_forward(target, ids: torch.Tensor, cache) -> torch.Tensor:
    """ids: [B, n] new tokens of B sequences through the target on a batch-B `cache` -> logits [B, n, V]."""
    kw = _cache_kwarg(target.model)
    return target(input_ids=ids, use_cache=True, logits_to_keep=ids.shape[1], **{kw: cache}).logits


@dataclass(frozen=True)
class HeadKv:
    """The head's KV for B sequences, each its own copy of rows 0..P-1, with one free slot (P) for the new row."""

    keys: torch.Tensor  # [B, nkv, P + 1, dk]
    values: torch.Tensor  # [B, nkv, P + 1, dv]


def head_kv(rows, prefix: int, batch: int) -> HeadKv:
    keys = rows.keys[:, :prefix]  # [nkv, P, dk]
    nkv, _, dk = keys.shape
    dv = rows.values.shape[-1]
    out = HeadKv(keys=keys.new_zeros(batch, nkv, prefix + 1, dk), values=keys.new_zeros(batch, nkv, prefix + 1, dv))
    out.keys[:, :, :prefix] = keys[None]
    out.values[:, :, :prefix] = rows.values[None, :, :prefix]
    return out


@torch.no_grad()
def batched_draft_step(head, kv: HeadKv, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor):
    """One draft step for B sequences: row (hidden[b], tokens[b]) at positions[b], attending to sequence b's
    rows 0..P-1 and itself (its key and value written into slot P of kv, in place).

    hidden: [B, H], tokens: [B], positions: [B] -> (states [B, H], argmax ids [B], their log-softmax [B]);
    row b equals MtpHead.decode_step of that row alone (tests/test_probe.py)."""
    from ..model.mtp import LOGITS_BUDGET

    P = kv.keys.shape[2] - 1
    z = head.fc_input(hidden, tokens.to(head.device), positions.to(head.device))
    query, gate, key, value = head.attention_inputs(z, positions.to(head.device))  # query [nh, B, dk], key [nkv, B, dk]
    kv.keys[:, :, P] = key.transpose(0, 1)
    kv.values[:, :, P] = value.transpose(0, 1)
    attn = F.scaled_dot_product_attention(query.transpose(0, 1)[:, :, None], kv.keys, kv.values, enable_gqa=True,
                                          scale=head.attention.scale)  # [B, nh, 1, dv]
    states = head.finish_row(z, attn[:, :, 0].transpose(0, 1), gate)
    ids, lps = head._argmax_chunked(states, LOGITS_BUDGET)
    return states, ids, lps


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
    batch: tuple[int, ...] = (1,),
    trees: tuple = (),
) -> ProbeResult:
    """trees: tree.TreeConfig's (--tree): verifies up to their T tokens and draft steps over their TOPK tokens."""
    _check_options(context, k, repeats, batch)
    batch = tuple(sorted(set(batch) | {1}))
    k = max([k] + [t.draft_tokens - 1 for t in trees])  # a tree's verify of T tokens is the verify at K = T - 1
    widths = sorted({t.topk for t in trees} - {1})
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    loaded = load_model(model_dir, device=device, dtype=torch_dtype)
    info, target, head = loaded.info, loaded.target, loaded.head

    # 1. `context` random tokens into the target's cache and the head's KV (once).
    ctx = fill_context(loaded, context, k, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    vocab = info.geometry.vocab_size

    def at(B: int) -> BatchTiming:
        # 2. B copies of the context, built outside every timed region; different new tokens per sequence.
        cache = expand_cache(ctx.cache, B)
        new_ids = torch.randint(0, vocab, (B, k + 1), generator=generator).to(device)
        kv = head_kv(ctx.rows, context - 1, B)
        hidden = ctx.hidden[context - 1 :].expand(B, -1).contiguous()
        positions = torch.full((B,), context - 1, device=device)

        # 3. One draft step: row context-1 = (h_{context-1}, x_context) of each sequence at position context-1,
        #    seeing its rows 0..context-2 and itself, then the argmax over the lm_head.
        draft = time_call(lambda _, kv=kv: batched_draft_step(head, kv, hidden, new_ids[:, 0], positions), lambda: None,
                          repeats=repeats, warmup=warmup, device=device)

        # 4. One target decode step and one verify of K+1 tokens per sequence, each on a fresh copy of the cache.
        def fresh(cache=cache):
            return copy.deepcopy(cache)

        decode = time_call(lambda c: batched_target_forward(target, new_ids[:, :1], c), fresh, repeats=repeats,
                           warmup=warmup, device=device)
        verify = tuple(time_call(lambda c, n=K + 1: batched_target_forward(target, new_ids[:, :n], c), fresh,
                                 repeats=repeats, warmup=warmup, device=device) for K in range(1, k + 1))
        del cache, kv
        # 5. Trees: one draft step of B sequences with w frontier tokens each (B·w rows, each its own KV copy).
        wide = []
        for w in widths:
            kv_w = head_kv(ctx.rows, context - 1, B * w)
            hidden_w = ctx.hidden[context - 1 :].expand(B * w, -1).contiguous()
            tokens_w = new_ids[:, :1].repeat_interleave(w, 0)[:, 0]
            positions_w = torch.full((B * w,), context - 1, device=device)
            wide.append((w, time_call(lambda _, kv=kv_w, h=hidden_w, t=tokens_w, q=positions_w:
                                      batched_draft_step(head, kv, h, t, q), lambda: None,
                                      repeats=repeats, warmup=warmup, device=device)))
            del kv_w
        return BatchTiming(batch=B, draft_step=draft, target_decode=decode, verify=verify, draft_width=tuple(wide))

    batches = tuple(at(B) for B in batch)
    notes = _probe_notes(device)
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else (platform.processor() or platform.machine())
    return ProbeResult(
        model={"path": str(info.path), "model_type": info.model_type, "config_sha256": info.config_sha256,
               "numerics": info.numerics(torch_dtype)},
        device=device, device_name=name, dtype=str(torch_dtype).removeprefix("torch."), context=context, k=k,
        repeats=repeats, warmup=warmup, batches=batches,
        roofline=roofline_at(take_inventory(info), torch_dtype), notes=tuple(notes), trees=tuple(t.name for t in trees),
    )


def _check_options(context: int, k: int, repeats: int, batch: tuple[int, ...]) -> None:
    """probe's options a user gives, each refused in one line."""
    if context < 2:
        raise OptionError(f"--context {context}: expected at least 2 tokens")
    if k < 1:
        raise OptionError(f"--k {k}: expected at least 1")
    if repeats < 1:
        raise OptionError(f"--repeats {repeats}: expected at least 1")
    if not batch or min(batch) < 1:
        raise OptionError(f"--batch {','.join(map(str, batch))}: expected batch sizes >= 1")


def _probe_notes(device: str) -> list[str]:
    """What the measured steps are, on this device and with these kernels, against a serving engine's."""
    notes = []
    if device == "cpu":
        notes.append(CPU_NOTE)
    else:
        missing = [m for m in ("fla", "causal_conv1d") if importlib.util.find_spec(m) is None]
        if missing:
            notes.append(f"{' and '.join(missing)} not installed: the target's linear-attention layers ran transformers' "
                         "reference kernels, so the decode step may be slower than in serving and c too small")
    notes.append("the target runs transformers' eager attention and a DynamicCache (no paged KV, no CUDA graphs): "
                 "a serving engine's steps are faster, the small-batch ones most")
    return notes


def _timing_json(t: Timing) -> dict:
    return {"median_s": t.median_s, "samples_s": list(t.samples_s)}


def _verify_json(b: BatchTiming) -> list[dict]:
    return [{"k": K, "tokens": K + 1, "median_s": t.median_s, "samples_s": list(t.samples_s), "extra": extra}
            for K, (t, extra) in enumerate(zip(b.verify, b.verify_extra()), start=1)]


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
        "verify": _verify_json(result.batches[0]),
        "draft_cost": result.draft_cost,
        "batch_sizes": [b.batch for b in result.batches],
        "batches": [{"batch": b.batch, "target_decode": _timing_json(b.target_decode), "draft_step": _timing_json(b.draft_step),
                     "verify": _verify_json(b), "draft_cost": b.draft_cost, "flags": b.flags(),
                     **({"draft_width": [{"width": w, **_timing_json(t)} for w, t in b.draft_width]} if b.draft_width else {})}
                    for b in result.batches],
        **({"trees": list(result.trees)} if result.trees else {}),
        "roofline": result.roofline,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "notes": list(result.notes),
    }
