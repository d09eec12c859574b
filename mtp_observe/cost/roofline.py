"""The roofline: what a draft step and a target step cost at a batch size on a named device, from bytes and FLOPs.

Contract: `roofline_times(geometry, device, batch, q_max, context)` -> speedup.StepTimes; `draft_times`,
`target_step`, `draft_step` for one step; `replica_memory` what one replica holds; `parse_device`. Pure numpy.
The tensors' bytes and parameters a step reads come from geometry.py.

The roofline (`roofline_times`), per batch size B, q new tokens per sequence (N = B·q tokens), at a
context of C tokens per sequence; the step takes max(bytes / bandwidth, FLOPs / peak):

    target bytes   weights every step reads whole (attention, Gated DeltaNet projections, norms, routers,
                   shared experts, dense MLPs, lm_head)
                 + N embedding rows (an untied embedding is gathered, not read whole; tied, it is the lm_head)
                 + routed experts: expert bytes × Σ over MoE layers of the distinct experts N tokens touch:
                   the expected E·(1-(1-k/E)^N) for top-k of E (each token picks k distinct experts,
                   independently and uniformly), or measured from the target's own router on the run
                   (`ExpertCounts`: B windows of q consecutive replayed tokens, mtp_observe/model/routing.py)
                 + KV cache: B·C tokens read and N written, 2 · nkv · d · KV_BYTES per token per
                   full-attention layer (MLA: (kv_lora_rank + qk_rope_head_dim) · KV_BYTES, the latent and the rope
                   key an engine's MLA cache holds: vLLM's MLA attention keeps kv_c and k_pe, one per token)
                 + Gated DeltaNet state per sequence and linear-attention layer: the recurrent state
                   (nv · dk · dv at the checkpoint's mamba_ssm_dtype) read once and written q times, and
                   the conv window (conv_dim · (kernel-1) read, conv_dim · q written, KV_BYTES each).
                   q writes because vLLM keeps one recurrent state per verified position: its GDN
                   backend gives a speculating request num_speculative_tokens + 1 state slots
                   (vllm-project/vllm@007d5005 vllm/v1/attention/backends/gdn_attn.py:
                   `spec_state_indices_tensor = m.block_table_tensor[:, : self.num_spec + 1]`), and the
                   recurrent kernel reads the state at slot num_accepted_tokens - 1 and stores the state
                   after every token in its own slot ("keep the states for multi-query tokens",
                   vllm-project/vllm@03c6dad8 vllm/model_executor/layers/fla/ops/fused_recurrent.py);
                   the conv state likewise holds conv_kernel - 1 + num_spec columns
                   (vllm-project/vllm@02d71083 vllm/model_executor/layers/mamba/mamba_utils.py
                   `gated_delta_net_state_shape`). A decode step (q = 1) writes one.
    target FLOPs   2 · active parameters · N (routed experts at top-k per token, lm_head included)
                 + attention: 4 · nh · d · (C + (q+1)/2) per token per full-attention layer (QKᵀ and PV); MLA
                   decodes with kv_b_proj absorbed into the query and the output (vLLM's MLA decode path):
                   2 · nh · (kv_lora_rank + qk_rope_head_dim + kv_lora_rank) per cached token
                 + Gated DeltaNet recurrence: 6 · nv · dk · dv per token per linear-attention layer
    draft bytes    the head's weights (its routed experts as above, expected for B tokens), the whole
                   lm_head, B embedding rows, the head's own KV: B·C rows read, B written
    draft FLOPs    2 · (head parameters + lm_head) · B (routed at top-k) + 4 · nh · d · (C + 1) · B

What the roofline leaves out (docs/cost.md, "Speedup by batch size"): scheduler and sampler overheads, kernel
launch latency and CUDA graphs (small models are latency-bound, not bandwidth-bound), the first draft
forward over the K+1 verified positions (vLLM's proposer runs the head over every accepted position;
counted here as one row per sequence), tree attention, tensor/expert parallelism, and the KV capacity
that bounds the batch a GPU can hold (the schedule is only as good as the batch sizes reached).

Constants, each with its source:
    KV_BYTES = 2           the KV cache and conv state in BF16 (vLLM's "auto" kv_cache_dtype for a BF16 or
                           FP8-weight model; `--kv-cache-dtype fp8` would halve the KV term)
    SSM_BYTES              4 when the text config says mamba_ssm_dtype "float32" (every released Qwen3.5
                           config.json's text_config, e.g. Qwen3.6-27B's), else 2
    DEVICES                HBM bandwidth and dense (not sparse) tensor-core peaks, from the vendors' tables:
      h100  3,350 GB/s,  989.4 BF16 / 1,978.9 FP8 TFLOP/s  NVIDIA H100 SXM5 table (hpctech.co.jp reproduction:
                         1,979 / 3,958 "shown with sparsity", halved), glennklockwood.com/garden/processors/h100
      h200  4,800 GB/s,  989.4 / 1,978.9                    same GH100 compute as H100 SXM; 4.8 TB/s HBM3e
                         (lzwjava.github.io H100-vs-H200 table; alpharomercoma/MI300X-vs-H200 METHODOLOGY.md)
      b200  8,000 GB/s,  2,250 / 4,500                       HGX B200 1,000 W (glennklockwood.com/garden/processors/B200;
                         other tables say 7.7 TB/s; the 1,200 W GB200 part is 2,500 / 5,000)
      a100  2,039 GB/s,  312 BF16, no FP8                    NVIDIA A100 80 GB SXM4 datasheet (via
                         glennklockwood.com/garden/processors/A100); FP8 weights run at the BF16 peak there
      l40s    864 GB/s,  362.05 / 733                        NVIDIA L40S datasheet (mullet.se reproduction)
      mi300x 5,300 GB/s, 1,307.4 / 2,614.9                   AMD MI300X figures (alpharomercoma/MI300X-vs-H200)
    The FP8 peak applies when the checkpoint's weights are block-FP8 (vLLM runs FP8 GEMMs with dynamic
    activation scales); otherwise the BF16 peak.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from ..errors import OptionError
from .geometry import KV_BYTES, Geometry
from .speedup import StepTimes

DEFAULT_DEVICE = "h100"


# ---------------------------------------------------------------------------------------------
# 1. The formula


# ---------------------------------------------------------------------------------------------
# 2. Step times


# ---------------------------------------------------------------------------------------------
# 3. Devices


@dataclass(frozen=True)
class Device:
    name: str
    bandwidth: float  # bytes / s (HBM)
    bf16: float  # dense BF16 tensor-core peak, FLOP/s
    fp8: float | None  # dense FP8 peak, FLOP/s (None: no FP8 tensor cores)
    description: str
    source: str

    def peak(self, fp8: bool) -> float:
        return self.fp8 if fp8 and self.fp8 is not None else self.bf16


DEVICES = {d.name: d for d in (
    Device("h100", 3350e9, 989.4e12, 1978.9e12, "NVIDIA H100 SXM5 80 GB",
           "NVIDIA H100 table (hpctech.co.jp reproduction, sparse figures halved); glennklockwood.com/garden/processors/h100"),
    Device("h200", 4800e9, 989.4e12, 1978.9e12, "NVIDIA H200 SXM 141 GB",
           "lzwjava.github.io H100/H200 table (4.8 TB/s; compute as H100 SXM); alpharomercoma/MI300X-vs-H200 METHODOLOGY.md"),
    Device("b200", 8000e9, 2250e12, 4500e12, "NVIDIA HGX B200 (1,000 W)",
           "glennklockwood.com/garden/processors/B200 (8 TB/s; some tables say 7.7 TB/s)"),
    Device("a100", 2039e9, 312e12, None, "NVIDIA A100 SXM4 80 GB",
           "NVIDIA A100 datasheet via glennklockwood.com/garden/processors/A100 (no FP8: the BF16 peak applies)"),
    Device("l40s", 864e9, 362.05e12, 733e12, "NVIDIA L40S 48 GB",
           "NVIDIA L40/L40S datasheet (mullet.se reproduction)"),
    Device("mi300x", 5300e9, 1307.4e12, 2614.9e12, "AMD Instinct MI300X 192 GB",
           "AMD figures via alpharomercoma/MI300X-vs-H200 METHODOLOGY.md"),
)}
_CUSTOM = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*,\s*([0-9]*\.?[0-9]+)\s*")


def parse_device(spec: str) -> Device:
    """'h200' -> the table's row; 'BW_GBps,TFLOPS' (e.g. '4800,989') -> a custom device (one peak for any dtype)."""
    key = spec.strip().lower()
    if key in DEVICES:
        return DEVICES[key]
    m = _CUSTOM.fullmatch(spec)
    if m is None or not all(0 < float(x) < math.inf for x in m.groups()):
        raise OptionError(f"--device-spec {spec!r}: expected one of {', '.join(DEVICES)} or BW_GBps,TFLOPS "
                          "(e.g. 4800,989 for 4.8 TB/s and 989 dense TFLOP/s)")
    bw, tflops = float(m.group(1)), float(m.group(2))
    return Device(f"{m.group(1)},{m.group(2)}", bw * 1e9, tflops * 1e12, tflops * 1e12,
                  f"custom: {bw:g} GB/s, {tflops:g} TFLOP/s", "--device-spec")


# ---------------------------------------------------------------------------------------------
# 4. The geometry: what each step reads and computes


# ---------------------------------------------------------------------------------------------
# 5. Routed experts: how many distinct ones a step's tokens touch


def expected_distinct(experts: int, top_k: int, tokens: float) -> float:
    """E·(1 - (1 - k/E)^N): distinct experts N tokens touch when each picks k distinct of E uniformly and
    independently. Worked example: E = 256, k = 8, N = 1 -> 8; N = 4 -> 30.6; N = 64 -> 222.5."""
    if experts == 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


@dataclass(frozen=True)
class ExpertCounts:
    """The target's own routing on the replayed traffic (run sums, mtp_observe/model/routing.py).

    windows[q-1] windows of q consecutive replayed tokens were counted; hits[q-1, l, e] of them routed at least
    one token to expert e in MoE layer l. p = hits / windows is the chance that one sequence's q tokens touch
    e, so B sequences (independent draws of a window) touch, in layer l, Σ_e 1 - (1 - p)^B distinct experts
    in expectation (`distinct`). With B = 1 that is the mean distinct count over the windows themselves.
    """

    windows: np.ndarray  # [Q] int64
    hits: np.ndarray  # [Q, L, E] int64
    sessions: int = 0  # sessions the sums cover

    @property
    def q_max(self) -> int:
        return int(self.windows.shape[0])

    def distinct(self, batch: int, q: int) -> float | None:
        """Mean over MoE layers of the expected distinct experts for `batch` sequences of q tokens; None past
        the recorded q or without windows."""
        if q > self.q_max or self.windows[q - 1] <= 0:
            return None
        p = self.hits[q - 1] / float(self.windows[q - 1])  # [L, E]
        return float((1.0 - (1.0 - p) ** batch).sum(axis=-1).mean())


# ---------------------------------------------------------------------------------------------
# 6. The roofline


def target_step(g: Geometry, batch: int, q: int, context: float, distinct: float) -> tuple[float, float]:
    """(bytes, FLOPs) of one target step: `batch` sequences, q new tokens each, `context` tokens of cache
    each; `distinct` experts touched per MoE layer (module docstring)."""
    N = batch * q
    weights = g.dense_bytes + N * g.embedding_row_bytes + g.expert_bytes * g.moe_layers * distinct
    kv = (batch * context + N) * g.kv_bytes_per_token
    conv = g.conv_dim * KV_BYTES * (max(g.conv_kernel - 1, 0) + q)
    state = batch * g.linear_layers * (g.state_bytes * (1 + q) + conv)
    flops = (2.0 * g.active_params * N
             + N * g.full_layers * g.attention_flops_per_key * (context + (q + 1) / 2)
             + N * g.linear_layers * 6.0 * g.linear_value_heads * g.linear_key_dim * g.linear_value_dim)
    return weights + kv + state, flops


def draft_times(g: Geometry, device: Device, batch: tuple[int, ...], context: float) -> tuple[np.ndarray, np.ndarray]:
    """([NB] t_draft(B) = max(bytes / bandwidth, FLOPs / peak) of `draft_step`, [NB] "memory" | "compute")."""
    peak = device.peak(g.fp8)
    seconds, bound = np.zeros(len(batch)), np.empty(len(batch), dtype=object)
    for i, B in enumerate(batch):
        nbytes, flops = draft_step(g, B, context)
        seconds[i] = max(nbytes / device.bandwidth, flops / peak)
        bound[i] = "memory" if nbytes / device.bandwidth >= flops / peak else "compute"
    return seconds, bound


def draft_step(g: Geometry, batch: int, context: float) -> tuple[float, float]:
    """(bytes, FLOPs) of one draft step for `batch` sequences (one head row each, then the whole lm_head)."""
    distinct = expected_distinct(g.head_experts, g.top_k, batch) if g.head_experts else 0.0
    weights = g.head_dense_bytes + g.lm_head_bytes + batch * g.embedding_row_bytes + g.head_expert_bytes * distinct
    kv = (batch * context + batch) * g.head_kv_bytes_per_token
    active = g.head_dense_params + g.lm_head_params + (g.top_k * g.head_expert_params if g.head_experts else 0)
    flops = 2.0 * active * batch + batch * g.attention_flops_per_key * (context + 1)
    return weights + kv, flops


def roofline_times(g: Geometry, device: Device, batch: tuple[int, ...], q_max: int, context: float,
                   experts: ExpertCounts | None = None, widths: tuple[int, ...] = ()) -> StepTimes:
    """t_target(B, q), q = 1..q_max, and t_draft(B) on `device`: max(bytes / bandwidth, FLOPs / peak); with widths,
    t_draft(B, w) for each (a draft step of B·w rows: the trees' frontier steps)."""
    peak = device.peak(g.fp8)
    NB = len(batch)
    target, bound = np.zeros((NB, q_max)), np.empty((NB, q_max), dtype=object)
    draft, draft_bound = np.zeros(NB), np.empty(NB, dtype=object)
    breakdown = []
    measured_used = False
    for i, B in enumerate(batch):
        row = {"batch": B, "target": [], "draft": None}
        for q in range(1, q_max + 1):
            distinct = expected_distinct(g.experts, g.top_k, B * q)
            if experts is not None and g.moe_layers:
                measured = experts.distinct(B, q)
                if measured is not None:
                    distinct, measured_used = measured, True
            nbytes, flops = target_step(g, B, q, context, distinct)
            target[i, q - 1] = max(nbytes / device.bandwidth, flops / peak)
            bound[i, q - 1] = "memory" if nbytes / device.bandwidth >= flops / peak else "compute"
            row["target"].append({"q": q, "bytes": nbytes, "flops": flops, "distinct_experts": distinct,
                                  "seconds": target[i, q - 1], "bound": bound[i, q - 1]})
        nbytes, flops = draft_step(g, B, context)
        draft[i] = max(nbytes / device.bandwidth, flops / peak)
        draft_bound[i] = "memory" if nbytes / device.bandwidth >= flops / peak else "compute"
        row["draft"] = {"bytes": nbytes, "flops": flops, "seconds": draft[i], "bound": draft_bound[i]}
        breakdown.append(row)
    peak_name = "FP8" if g.fp8 and device.fp8 is not None else "BF16"
    experts_text = ""
    if g.moe_layers:
        experts_text = ("; routed experts: measured from the target's router on the run" if measured_used
                        else "; routed experts: expected E(1-(1-k/E)^N)")
    notes = []
    if g.fp8 and device.fp8 is None:
        notes.append(f"{device.name} has no FP8 tensor cores: the FP8 checkpoint's GEMMs are charged at the BF16 peak")
    detail = (f"roofline on {device.description} ({device.bandwidth / 1e9:,.0f} GB/s, {peak / 1e12:,.1f} {peak_name} "
              f"TFLOP/s dense), weights at {g.precision}, context {context:,.0f} tokens{experts_text}")
    wide = {}
    for w in sorted(set(widths) - {1}):
        wide[w] = np.array([max(x / device.bandwidth, f / peak) for x, f in (draft_step(g, B * w, context) for B in batch)])
    return StepTimes(batch=tuple(batch), target=target, draft=draft, source="roofline", detail=detail, unit="s",
                     notes=tuple(notes), bound=bound, draft_bound=draft_bound, breakdown=tuple(breakdown),
                     draft_width=wide or None)


# ---------------------------------------------------------------------------------------------
# 6b. A replay replica's memory (how many GPUs one replay of one session at a time needs)


@dataclass(frozen=True)
class ReplicaMemory:
    """What one replay process holds for one session of `context` tokens, in bytes (an estimate: every term below).

    weights       the target's and the head's weights at the replay's precision (a block-FP8 checkpoint is dequantised
                  to the run's dtype today: checkpoint.py; "weights at FP8" is what keeping them FP8 would hold)
    target_kv     the target's cache for the session: transformers' DynamicCache keeps MLA's latent and rope key
                  (kv_lora_rank + qk_rope_head_dim per layer), GQA's keys and values (2 · nkv · d), at KV_BYTES
    head_kv       the head's own cache: keys and values per head as mtp/head.py keeps them (MLA expanded:
                  nh · (qk_head_dim + v_head_dim); GQA 2 · nkv · d), at KV_BYTES
    transient     the largest short-lived tensor: transformers' MLA expands the whole cache of one layer to keys and
                  values at every prefill chunk (nh · (qk_nope + v) per token, modeling_deepseek_v3.py:407-424),
                  plus the head's and the target's vocabulary-sized blocks (mtp/head.py LOGITS_BUDGET, target.py's
                  reduce_logits budget: 256 MiB of fp32 each) and one attention score block (ATTENTION_BUDGET)
    """

    weights: float
    target_kv: float
    head_kv: float
    transient: float

    @property
    def total(self) -> float:
        return self.weights + self.target_kv + self.head_kv + self.transient

    def gpus(self, gpu_bytes: float, usable: float = 0.9) -> int:
        """GPUs of `gpu_bytes` one replica spans (`device_map auto` places whole layers; `usable` of each is left
        after the CUDA context, allocator slack and the layers' uneven split)."""
        return max(1, math.ceil(self.total / (gpu_bytes * usable)))


def replica_memory(g: Geometry, context: float, head_kv_elements: int, expanded_kv_elements: int = 0,
                   weight_bytes: float | None = None) -> ReplicaMemory:
    """ReplicaMemory for a session of `context` tokens: head_kv_elements the head's cached elements per token (see
    ReplicaMemory.head_kv), expanded_kv_elements the per-token keys and values transformers' MLA expands one layer's
    cache into (0 for GQA); weight_bytes overrides g.weight_bytes (the weights at another precision)."""
    budgets = 3 * (1 << 26) * 4  # logits blocks of the head and the target, one attention block, fp32
    return ReplicaMemory(weights=float(g.weight_bytes if weight_bytes is None else weight_bytes),
                         target_kv=context * g.kv_bytes_per_token, head_kv=context * head_kv_elements * KV_BYTES,
                         transient=context * expanded_kv_elements * KV_BYTES + budgets)


# ---------------------------------------------------------------------------------------------
# 7. Measured: probe.json version 2


