"""The cost: what a draft step and a target step cost at a batch size, and the speedup they buy.

Contract: the speedup's denominator, in one place (STYLE.md rule 8). Pure numpy; no torch, so the
report (which imports no torch) computes it.

    speedup(K, B) = τ_sim(K) · t_target(B, 1) / (t_target(B, K+1) + K · t_draft(B))      (ACCEPTANCE.md)
                  = τ_sim(K) / (1 + K · c_B + v_B(K)),
    c_B = t_draft(B) / t_target(B, 1),   v_B(K) = t_target(B, K+1) / t_target(B, 1) - 1

A tree (SGLang `--speculative-num-steps S --speculative-eagle-topk TOPK --speculative-num-draft-tokens T`, tree.py)
pays a verify of T tokens with tree attention and S draft steps, the first over one token per sequence (the head's
row at the last accepted position) and the other S - 1 over the TOPK frontier tokens of each sequence:

    speedup_tree(B) = τ_sim · t_target(B, 1) / (t_target(B, T) + t_draft(B) + (S-1) · t_draft(B, TOPK))

(`tree_denominator`; TOPK = 1, T = S + 1 is the chain's formula at K = S). t_draft(B, w) is a draft step of B
sequences with w tokens each (`StepTimes.draft_at`): measured by `probe --tree` (probe.json `draft_width`), the
roofline's draft step of B·w rows (every slot reads its sequence's KV, as SGLang's FlashInfer and Triton draft
kernels do; FA3's cascade reads the shared prefix once, so this is the upper end), else a probe's draft step
interpolated at batch B·w. The verify of T tokens is charged as T causal tokens: tree attention reads the same
weights and KV and attends to fewer keys (a node sees its ancestors only), so the FLOPs term is an upper bound.

`speedup` is that formula (metrics.rates calls it for every slice at the gated batch size);
`batch_speedup` evaluates it over batch sizes. `StepTimes` holds t_target(B, q) for q = 1..Q and
t_draft(B) at each batch size, from one of three sources:

    measured   probe.json version 2 (`mtp-observe probe --batch 1,2,4,...`): `step_times_from_probe`
    roofline   `roofline_times`: bytes and FLOPs of each step on a named device (below)
    batch 1    a probe of version 1, `--draft-cost C`, or run.json's bytes ratio, in decode steps

A drafter with another cost (a model-free drafter costs ~0 on the GPU) plugs in with
`StepTimes.with_draft`; the speedup is still computed here and only here.

Best K, break-even and the engine schedule (`best_k`, `break_even`, `schedule`):
    best K at B     the argmax over K of speedup(K, B); 0 (no speculation) when no K beats 1
    break-even τ    the τ_sim(K) at which speedup(K, B) = 1: 1 + K·c_B + v_B(K)
    schedule        vLLM's dynamic speculative decoding (`num_speculative_tokens_per_batch_size`,
                    vllm-project/vllm@002e77c1 vllm/config/speculative.py; validation in
                    vllm-project/vllm@a6f6bb1d vllm/v1/spec_decode/dynamic/utils.py
                    `validate_and_normalize_dynamic_sd_schedule`): a list of [start, end, K], inclusive
                    batch-size ranges, the first starting at 1, sorted, not overlapping, K >= 0; vLLM
                    fills a gap with the K before it, carries the last K up to max_num_seqs and caps
                    every K at num_speculative_tokens. Here each batch size of the table starts a
                    range that runs to the next one (vLLM's own gap rule), equal neighbours merged.
                    B counts the requests scheduled in a step, prefills included (vLLM issue #49548).

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
from dataclasses import MISSING, asdict, dataclass, fields, replace

import numpy as np

from ..errors import OptionError

KV_BYTES = 2
SSM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
DEFAULT_DEVICE = "h100"


# ---------------------------------------------------------------------------------------------
# 1. The formula


def speedup(tau: np.ndarray, c, verify_extra) -> np.ndarray:
    """speedup(K) = τ(K) / (1 + K·c + v(K)) for a τ per K; tau [..., K], c scalar or broadcastable to
    [..., K] (e.g. [NB, 1]), verify_extra broadcastable to [..., K].

    Worked example: τ_sim(2) = 2.2, c = 0.1, v(2) = 0 -> 2.2 / 1.2 = 1.833.
    """
    tau = np.asarray(tau, dtype=np.float64)
    k = np.arange(1, tau.shape[-1] + 1, dtype=np.float64)
    return tau / (1.0 + k * np.asarray(c, dtype=np.float64) + np.asarray(verify_extra, dtype=np.float64))


def speedup_per_step(tau: np.ndarray, drafts_per_step: np.ndarray, verify_per_step: np.ndarray, c) -> np.ndarray:
    """speedup when the draft length varies from step to step (a confidence stop):
    τ / (1 + n̄·c + v̄), n̄ the mean draft steps per target step and v̄ the mean extra verify cost v(L) of the
    steps (v(0) = 0: a step that drafted nothing is a plain decode). With every step drafting K, n̄ = K and
    v̄ = v(K), and this is `speedup` exactly. Arrays broadcast together.

    Worked example: τ_sim 2.0, half the steps drafting 1 token after 2 draft steps (the second draft below the
    threshold, dropped) and half 3 tokens after 3, c = 0.1, v = 0: n̄ = 2.5 -> 2.0 / 1.25 = 1.6.
    """
    return np.asarray(tau, dtype=np.float64) / (1.0 + np.asarray(drafts_per_step, dtype=np.float64) * np.asarray(c, dtype=np.float64)
                                                + np.asarray(verify_per_step, dtype=np.float64))


def break_even(times: "StepTimes", k_max: int) -> np.ndarray:
    """[NB, K] the τ_sim(K) at which speedup(K, B) = 1: 1 + K·c_B + v_B(K)."""
    k = np.arange(1, k_max + 1, dtype=np.float64)
    return 1.0 + k[None, :] * times.draft_cost()[:, None] + times.verify_extra(k_max)


def batch_speedup(tau: np.ndarray, times: "StepTimes") -> np.ndarray:
    """tau [..., K] -> [..., NB, K]: speedup(K, B) at every batch size of `times`."""
    tau = np.asarray(tau, dtype=np.float64)
    K = tau.shape[-1]
    return speedup(tau[..., None, :], times.draft_cost()[:, None], times.verify_extra(K))


def tree_denominator(times: "StepTimes", steps: int, topk: int, draft_tokens: int) -> np.ndarray:
    """[NB] (t_target(B, T) + t_draft(B) + (S-1)·t_draft(B, TOPK)) / t_target(B, 1), the tree's step cost in decode
    steps (module docstring). Worked example, batch 1 with c = 0.1 for one token and 0.12 for TOPK = 4, v(7) = 0.05:
    S = 3, T = 8 -> 1.05 + 0.1 + 2 · 0.12 = 1.39."""
    v = times.verify_extra(draft_tokens - 1)[:, draft_tokens - 2] if draft_tokens >= 2 else np.zeros(len(times.batch))
    wide = times.draft_at(topk)
    return 1.0 + v + (times.draft + (steps - 1) * wide) / times.target[:, 0]


def tree_speedup(tau: np.ndarray, times: "StepTimes", steps: int, topk: int, draft_tokens: int) -> np.ndarray:
    """tau [...] (a tree's τ_sim, or its replicates) -> [..., NB] its speedup at every batch size of `times`."""
    return np.asarray(tau, dtype=np.float64)[..., None] / tree_denominator(times, steps, topk, draft_tokens)


def best_k(speedups: np.ndarray) -> int:
    """The K (1-based) with the largest speedup, the smallest on ties; 0 (no speculation) when no K beats 1
    (or every value is NaN). speedups: [K]."""
    s = np.asarray(speedups, dtype=np.float64)
    if not np.any(np.isfinite(s)) or not np.nanmax(s) > 1.0:
        return 0
    return int(np.nanargmax(s)) + 1


def schedule(batch: tuple[int, ...], ks: list[int]) -> list[list[int]]:
    """vLLM's num_speculative_tokens_per_batch_size from the best K at each batch size of the table.

    Batch size b_i starts a range that runs to b_{i+1} - 1 (vLLM fills gaps with the K before them); the
    first range starts at 1 whatever the smallest b; the last ends at the largest b (vLLM carries it up to
    max_num_seqs); neighbours with the same K merge. Worked example: batch (1, 2, 4, 8), K (3, 3, 2, 0)
    -> [[1, 3, 3], [4, 7, 2], [8, 8, 0]].
    """
    assert len(batch) == len(ks) and len(batch) > 0, (batch, ks)
    assert list(batch) == sorted(set(batch)) and batch[0] >= 1, batch
    ranges: list[list[int]] = []
    for i, (b, k) in enumerate(zip(batch, ks)):
        start = 1 if i == 0 else b
        end = batch[i + 1] - 1 if i + 1 < len(batch) else b
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = end
        else:
            ranges.append([start, end, int(k)])
    return ranges


def check_schedule(ranges: list[list[int]], num_speculative_tokens: int) -> None:
    """vLLM's rules (validate_and_normalize_dynamic_sd_schedule), as asserts: 3 items, start >= 1, start <= end,
    K >= 0, sorted and not overlapping, the first at 1; every K <= num_speculative_tokens."""
    assert ranges and ranges[0][0] == 1, ranges
    for i, r in enumerate(ranges):
        assert len(r) == 3 and r[0] >= 1 and r[1] >= r[0] and 0 <= r[2] <= num_speculative_tokens, r
        assert i == 0 or r[0] > ranges[i - 1][1], ranges


# ---------------------------------------------------------------------------------------------
# 2. Step times


@dataclass(frozen=True)
class StepTimes:
    """One target step and one draft step at each batch size, in seconds (or in decode steps at batch 1)."""

    batch: tuple[int, ...]  # [NB] batch sizes, ascending
    target: np.ndarray  # [NB, Q] t_target(B, q) for q = 1..Q new tokens per sequence
    draft: np.ndarray  # [NB] t_draft(B)
    source: str  # "probe" | "roofline" | "draft-cost" | "run-roofline"
    detail: str  # where the numbers came from, for people
    unit: str = "s"  # "s", or "decode steps" for the batch-1 sources that give ratios only
    notes: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()  # measurements that failed a sanity check (and how they were taken)
    bound: np.ndarray | None = None  # [NB, Q] "memory" | "compute" (roofline only)
    draft_bound: np.ndarray | None = None  # [NB]
    breakdown: tuple[dict, ...] = ()  # roofline only: per batch size, bytes and FLOPs of the steps
    draft_width: dict | None = None  # {w: [NB] t_draft(B, w), a draft step over w tokens per sequence} (trees)

    def __post_init__(self):
        assert self.target.shape == (len(self.batch), self.target.shape[1]) and self.draft.shape == (len(self.batch),)
        assert list(self.batch) == sorted(set(self.batch)), self.batch

    @property
    def q_max(self) -> int:
        return self.target.shape[1]

    def draft_cost(self) -> np.ndarray:
        """[NB] c_B = t_draft(B) / t_target(B, 1)."""
        return self.draft / self.target[:, 0]

    def verify_extra(self, k_max: int) -> np.ndarray:
        """[NB, k_max] v_B(K) = t_target(B, K+1) / t_target(B, 1) - 1, clamped at 0; past the measured K,
        extended linearly from the last two (or from the last, through v(0) = 0)."""
        measured = self.target[:, 1:] / self.target[:, :1] - 1.0  # [NB, Q-1]
        top = measured.shape[1]
        out = np.zeros((len(self.batch), k_max))
        if top == 0:
            return out
        n = min(top, k_max)
        out[:, :n] = measured[:, :n]
        if k_max > top:
            slope = measured[:, -1] - measured[:, -2] if top >= 2 else measured[:, -1]
            for K in range(top + 1, k_max + 1):
                out[:, K - 1] = measured[:, -1] + (K - top) * slope
        return np.maximum(out, 0.0)

    def draft_at(self, width: int) -> np.ndarray:
        """[NB] t_draft(B, w): one draft step of B sequences, w tokens each (a tree's frontier): measured or the
        roofline's (draft_width), else the draft step at batch B·w interpolated over the measured batch sizes
        (linearly; past the largest, along the last two)."""
        if width == 1:
            return self.draft
        if self.draft_width and width in self.draft_width:
            return np.asarray(self.draft_width[width], dtype=np.float64)
        batch = np.asarray(self.batch, dtype=np.float64)
        want = batch * width
        if len(batch) == 1:  # one batch size: a step over w tokens costs at least one over 1 (memory-bound)
            return self.draft.copy()
        out = np.interp(want, batch, self.draft)
        past = want > batch[-1]
        slope = (self.draft[-1] - self.draft[-2]) / (batch[-1] - batch[-2])
        out[past] = self.draft[-1] + (want[past] - batch[-1]) * slope
        return np.maximum(out, self.draft)

    def draft_width_source(self, width: int) -> str:
        """How t_draft(B, w) is known: "measured" (probe), "roofline", "interpolated" (module docstring), or "one
        token" (a batch-1-only cost: a step over w tokens taken as a step over one, the memory-bound reading)."""
        if width == 1 or (self.draft_width and width in self.draft_width):
            return "roofline" if self.source == "roofline" else "measured"
        return "interpolated" if len(self.batch) > 1 else "one token"

    def index(self, b: int) -> int:
        if b not in self.batch:
            raise OptionError(f"--batch {b}: the cost table has batch sizes {', '.join(map(str, self.batch))} "
                              f"({self.source}); choose one of them")
        return self.batch.index(b)

    def with_draft(self, draft: np.ndarray, detail: str) -> "StepTimes":
        """The same target steps with another drafter's step time [NB] (e.g. ~0 for a model-free drafter)."""
        draft = np.broadcast_to(np.asarray(draft, dtype=np.float64), (len(self.batch),)).copy()
        return replace(self, draft=draft, draft_bound=None, detail=f"{self.detail}; draft: {detail}")

    def restrict(self, batch: tuple[int, ...]) -> "StepTimes":
        idx = [self.index(b) for b in batch]
        pick = (lambda a: None if a is None else a[idx])
        return replace(self, batch=tuple(batch), target=self.target[idx], draft=self.draft[idx],
                       bound=pick(self.bound), draft_bound=pick(self.draft_bound),
                       breakdown=tuple(self.breakdown[i] for i in idx) if self.breakdown else (),
                       draft_width={w: np.asarray(t)[idx] for w, t in self.draft_width.items()} if self.draft_width else None)


def batch1_times(c: float, verify_extra: np.ndarray, source: str, detail: str, notes=()) -> StepTimes:
    """A batch-1-only table in decode steps: t_target(1, q) = 1 + v(q-1), t_draft = c."""
    target = np.concatenate([[1.0], 1.0 + np.asarray(verify_extra, dtype=np.float64)])[None, :]
    return StepTimes(batch=(1,), target=target, draft=np.array([float(c)]), source=source, detail=detail,
                     unit="decode steps", notes=tuple(notes))


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


@dataclass(frozen=True)
class Geometry:
    """Bytes (at the serving precision) and parameters of the target and the head, by what a step reads.

    Built from the checkpoint's tensors (`geometry_from_tensors`) or from a config alone (`config_tensors`).
    Stored in run.json as `model.cost_geometry` (a dict of these fields), so a report needs no checkpoint.
    """

    precision: str  # "BF16", or "stored" for block-FP8 checkpoints (the bytes as in the files, scales included)
    fp8: bool  # weights in FP8: the FP8 peak applies
    dense_bytes: int  # target tensors a step reads whole (everything but routed experts and the embedding; lm_head in)
    embedding_row_bytes: int  # one row of an untied embedding table (gathered per token); 0 when tied
    expert_bytes: int  # one routed expert of one target MoE layer (gate, up, down; their scales)
    moe_layers: int  # target layers with routed experts (0: dense)
    experts: int  # E (0: dense)
    top_k: int  # k routed experts per token
    dense_params: int  # target parameters every token multiplies by, lm_head included, embedding and routed experts not
    expert_params: int  # one routed expert
    lm_head_bytes: int
    lm_head_params: int
    head_dense_bytes: int  # the head's tensors but its routed experts (lm_head and embedding are borrowed: not here)
    head_dense_params: int
    head_expert_bytes: int  # one routed expert of the head's MoE block; 0 for a dense head
    head_expert_params: int
    head_experts: int  # E of the head (0: dense head)
    full_layers: int  # target full-attention layers
    num_heads: int  # nh (target and head attention)
    num_kv_heads: int  # nkv
    head_dim: int  # d
    linear_layers: int  # target Gated DeltaNet layers
    linear_key_heads: int
    linear_value_heads: int
    linear_key_dim: int
    linear_value_dim: int
    conv_kernel: int
    ssm_bytes: int  # bytes per recurrent-state element (mamba_ssm_dtype)
    vocab_size: int = 0
    hidden_size: int = 0
    kv_width: int = 0  # elements one token caches per attention layer; 0: 2 · nkv · d (MLA: kv_lora_rank + qk_rope)
    attention_width: int = 0  # per head, the widths a cached token is multiplied by (QKᵀ and PV); 0: 2 · d

    # -- per sequence --------------------------------------------------------------------------

    @property
    def kv_elements(self) -> int:
        """One token's cache of one attention layer: 2 (K and V) · nkv · d, or the MLA latent and rope key."""
        return self.kv_width or 2 * self.num_kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """Target KV cache per token: kv_elements · KV_BYTES per full-attention layer."""
        return self.full_layers * self.kv_elements * KV_BYTES

    @property
    def head_kv_bytes_per_token(self) -> int:
        return self.kv_elements * KV_BYTES

    @property
    def attention_flops_per_key(self) -> float:
        """FLOPs one query spends on one cached token in one layer: 2 · nh · attention width (4 · nh · d for GQA)."""
        return 2.0 * self.num_heads * (self.attention_width or 2 * self.head_dim)

    @property
    def state_bytes(self) -> int:
        """One Gated DeltaNet layer's recurrent state of one sequence: nv · dk · dv · SSM bytes."""
        return self.linear_value_heads * self.linear_key_dim * self.linear_value_dim * self.ssm_bytes

    @property
    def conv_dim(self) -> int:
        return 2 * self.linear_key_heads * self.linear_key_dim + self.linear_value_heads * self.linear_value_dim

    @property
    def active_params(self) -> int:
        """Parameters one token multiplies by (routed experts at top-k)."""
        return self.dense_params + self.top_k * self.expert_params * self.moe_layers

    @property
    def weight_bytes(self) -> int:
        """Every weight the target and the head hold at this precision (the embedding whole; no copies)."""
        return (self.dense_bytes + self.embedding_row_bytes * self.vocab_size + self.expert_bytes * self.moe_layers * self.experts
                + self.head_dense_bytes + self.head_expert_bytes * self.head_experts)

    @property
    def total_params(self) -> int:
        """Parameters of the target (embedding and lm_head included) and the head."""
        embedding = self.hidden_size * self.vocab_size if self.embedding_row_bytes else 0
        return (self.dense_params + embedding + self.expert_params * self.moe_layers * self.experts + self.head_dense_params
                + self.head_expert_params * self.head_experts)

    def as_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "Geometry":
        """run.json's model.cost_geometry -> Geometry; ValueError naming what is missing."""
        required = [f.name for f in fields(Geometry) if f.default is MISSING]
        missing = [n for n in required if n not in d]
        if missing:
            raise ValueError(f"cost_geometry lacks {', '.join(missing)}")
        return Geometry(**{f.name: d[f.name] for f in fields(Geometry) if f.name in d})


def _is_routed(name: str) -> bool:
    return ".mlp.experts." in name


def geometry_from_tensors(text_config: dict, tensors: list, tied: bool, precision: str, fp8: bool,
                          head_prefix: str = "mtp.", skip: tuple[str, ...] = ()) -> Geometry:
    """The geometry from the checkpoint's tensor list (checkpoint.TensorEntry; names as stored) and its text config.

    Categories by name: names under `head_prefix` (`mtp.`, or a NextN layer's `model.layers.{L}.`) are the head
    (its `.mlp.experts.` routed, the rest dense; `skip`: its copies of the embedding and lm_head, which no step
    reads); of the target, `lm_head.weight` (absent when tied: the embedding), `embed_tokens.weight`, routed
    experts (`.mlp.experts.`), and everything else, read whole. Layers: `self_attn.o_proj` marks an attention
    layer, `linear_attn.out_proj` a Gated DeltaNet layer; `kv_a_proj_with_mqa` makes the attention MLA."""
    from .inventory import bytes_at

    def params(entries) -> int:
        return sum(e.numel for e in entries if not e.name.endswith("_scale_inv"))

    # A draft step runs one MTP layer (shared fc and norms, and layer 0 or layer i at step i): a head with several
    # layers is charged one layer's tensors per step (a NextN head has one layer).
    head = [e for e in tensors if e.name.startswith(head_prefix) and e.name not in skip
            and not re.match(r"mtp\.layers\.[1-9]\d*\.", e.name)]
    target = [e for e in tensors if not e.name.startswith(head_prefix) and not e.name.startswith("model.visual.")]
    embedding = [e for e in target if e.name.endswith("embed_tokens.weight")]
    assert len(embedding) == 1, [e.name for e in embedding]
    lm_head = embedding if tied else [e for e in target if e.name == "lm_head.weight"]
    assert len(lm_head) == 1, "an untied checkpoint has lm_head.weight"
    routed = [e for e in target if _is_routed(e.name)]
    dense = [e for e in target if not _is_routed(e.name) and e not in embedding and e not in lm_head]
    moe_layers = len({e.name.split(".mlp.experts.")[0] for e in routed if not e.name.endswith("_scale_inv")})
    experts = int(text_config.get("num_experts") or text_config.get("n_routed_experts") or 0)
    E = experts if moe_layers else 0
    k = int(text_config.get("num_experts_per_tok") or 0) if moe_layers else 0
    head_routed = [e for e in head if _is_routed(e.name)]
    head_dense = [e for e in head if not _is_routed(e.name)]
    head_E = experts if head_routed else 0
    layers = {"full": set(), "linear": set()}
    for e in target:
        m = re.search(r"layers\.(\d+)\.(self_attn\.o_proj|linear_attn\.out_proj)\.weight$", e.name)
        if m:
            layers["full" if m.group(2).startswith("self_attn") else "linear"].add(int(m.group(1)))
    mla = any(e.name.endswith("self_attn.kv_a_proj_with_mqa.weight") for e in target)
    kv_lora, rope = int(text_config.get("kv_lora_rank") or 0), int(text_config.get("qk_rope_head_dim") or 0)
    hidden = int(text_config["hidden_size"])
    heads = int(text_config["num_attention_heads"])
    vocab = int(embedding[0].shape[0])
    return Geometry(
        precision=precision, fp8=fp8,
        dense_bytes=bytes_at(dense + lm_head, precision),
        embedding_row_bytes=0 if tied else math.ceil(bytes_at(embedding, precision) / vocab),
        expert_bytes=round(bytes_at(routed, precision) / (moe_layers * E)) if moe_layers else 0,
        moe_layers=moe_layers, experts=E, top_k=k,
        dense_params=params(dense + lm_head),
        expert_params=round(params(routed) / (moe_layers * E)) if moe_layers else 0,
        lm_head_bytes=bytes_at(lm_head, precision), lm_head_params=params(lm_head),
        head_dense_bytes=bytes_at(head_dense, precision), head_dense_params=params(head_dense),
        head_expert_bytes=round(bytes_at(head_routed, precision) / head_E) if head_E else 0,
        head_expert_params=round(params(head_routed) / head_E) if head_E else 0,
        head_experts=head_E,
        full_layers=len(layers["full"]), num_heads=heads,
        num_kv_heads=int(text_config["num_key_value_heads"]),
        head_dim=(int(text_config["qk_nope_head_dim"]) + rope) if mla else int(text_config.get("head_dim") or hidden // heads),
        linear_layers=len(layers["linear"]),
        linear_key_heads=int(text_config.get("linear_num_key_heads") or 0),
        linear_value_heads=int(text_config.get("linear_num_value_heads") or 0),
        linear_key_dim=int(text_config.get("linear_key_head_dim") or 0),
        linear_value_dim=int(text_config.get("linear_value_head_dim") or 0),
        conv_kernel=int(text_config.get("linear_conv_kernel_dim") or 0),
        ssm_bytes=SSM_BYTES.get(str(text_config.get("mamba_ssm_dtype")), KV_BYTES),
        vocab_size=vocab, hidden_size=hidden,
        kv_width=kv_lora + rope if mla else 0, attention_width=2 * kv_lora + rope if mla else 0,
    )


def geometry_of_checkpoint(info) -> Geometry:
    """checkpoint.CheckpointInfo -> Geometry at its serving precision: the stored bytes for a block-FP8
    checkpoint, BF16 otherwise (whatever dtype the replay ran in)."""
    fp8 = info.quantization is not None
    return geometry_from_tensors(info.text_config, list(info.tensors.values()), info.tie_word_embeddings,
                                 "stored" if fp8 else "BF16", fp8, head_prefix=info.head_prefix,
                                 skip=tuple(info.head_copies))


def config_tensors(text_config: dict, family: str = "qwen3_5", tied: bool = False) -> list:
    """The tensors a Qwen3.5 (dense) or Qwen3.5-MoE checkpoint of this text config holds (names in the text
    layout, BF16), from the config alone: for worked examples at published dimensions (docs/cost.md) without
    downloading a checkpoint. tests/test_cost.py checks it against real headers of tiny checkpoints."""
    from ..model.checkpoint import TensorEntry
    from ..model.families import expected_head_shapes, geometry_from_config

    if family in ("deepseek_v3", "glm4_moe"):
        return nextn_config_tensors(text_config, family)
    c = text_config
    H, V = int(c["hidden_size"]), int(c["vocab_size"])
    nh, nkv = int(c["num_attention_heads"]), int(c["num_key_value_heads"])
    d = int(c.get("head_dim") or H // nh)
    nk, nv = int(c["linear_num_key_heads"]), int(c["linear_num_value_heads"])
    dk, dv, kernel = int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"]), int(c["linear_conv_kernel_dim"])
    L = int(c["num_hidden_layers"])
    types = c.get("layer_types") or ["full_attention" if (i + 1) % int(c.get("full_attention_interval", 4)) == 0
                                     else "linear_attention" for i in range(L)]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    if not tied:
        shapes["lm_head.weight"] = (V, H)
    for i, kind in enumerate(types):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,)}
        if kind == "full_attention":
            shapes |= {p + "self_attn.q_proj.weight": (2 * nh * d, H), p + "self_attn.k_proj.weight": (nkv * d, H),
                       p + "self_attn.v_proj.weight": (nkv * d, H), p + "self_attn.o_proj.weight": (H, nh * d),
                       p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)}
        else:
            conv_dim = 2 * nk * dk + nv * dv
            shapes |= {p + "linear_attn.in_proj_qkv.weight": (conv_dim, H), p + "linear_attn.in_proj_z.weight": (nv * dv, H),
                       p + "linear_attn.in_proj_b.weight": (nv, H), p + "linear_attn.in_proj_a.weight": (nv, H),
                       p + "linear_attn.conv1d.weight": (conv_dim, 1, kernel), p + "linear_attn.dt_bias": (nv,),
                       p + "linear_attn.A_log": (nv,), p + "linear_attn.norm.weight": (dv,),
                       p + "linear_attn.out_proj.weight": (H, nv * dv)}
        if family == "qwen3_5_moe":
            E, I, Ish = int(c["num_experts"]), int(c["moe_intermediate_size"]), int(c["shared_expert_intermediate_size"])
            shapes |= {p + "mlp.gate.weight": (E, H), p + "mlp.experts.gate_up_proj": (E, 2 * I, H),
                       p + "mlp.experts.down_proj": (E, H, I), p + "mlp.shared_expert.gate_proj.weight": (Ish, H),
                       p + "mlp.shared_expert.up_proj.weight": (Ish, H), p + "mlp.shared_expert.down_proj.weight": (H, Ish),
                       p + "mlp.shared_expert_gate.weight": (1, H)}
        else:
            I = int(c["intermediate_size"])
            shapes |= {p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I)}
    shapes |= expected_head_shapes(geometry_from_config(f"{family}_text", c))

    def entry(name, shape):
        n = math.prod(shape)
        return TensorEntry(name=name, dtype="BF16", shape=tuple(shape), nbytes=2 * n, file="")

    return [entry(n, s) for n, s in shapes.items()]


def nextn_config_tensors(text_config: dict, family: str) -> list:
    """The tensors a DeepSeek-V3 or GLM-4.5 checkpoint of this config holds (BF16, experts fused, untied; the NextN
    layer without its copies of the embedding and lm_head), from the config alone: every target layer is the
    NextN layer's decoder layer at its own index (dense MLP below first_k_dense_replace), less enorm / hnorm /
    eh_proj / shared_head.norm. tests/test_cost.py checks it against real headers of tiny checkpoints."""
    from dataclasses import replace

    from ..model.checkpoint import TensorEntry
    from ..model.families import FAMILIES, geometry_from_config, nextn_head_shapes

    c = text_config
    g = geometry_from_config(family, c)
    H, V, L = g.hidden_size, g.vocab_size, g.layer_index
    first = c.get("first_k_dense_replace", FAMILIES[family].first_k_dense_replace)
    moe = g.moe if g.moe is not None else geometry_from_config(family, dict(c, first_k_dense_replace=0)).moe
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H)}
    only_head = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")
    for i in range(L):
        dense = i < first
        layer = replace(g, layer_index=i, moe=None if dense else moe, intermediate_size=int(c["intermediate_size"]) if dense else None)
        p = f"model.layers.{i}."
        shapes |= {n: s for n, s in nextn_head_shapes(layer, "fused").items() if n[len(p):] not in only_head}
    shapes |= nextn_head_shapes(g, "fused")

    def entry(name, shape):
        n = math.prod(shape)
        return TensorEntry(name=name, dtype="BF16", shape=tuple(shape), nbytes=2 * n, file="")

    return [entry(n, s) for n, s in shapes.items()]


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


def step_times_from_probe(probe: dict, where: str) -> StepTimes:
    """probe.json `batches` (version 2) -> StepTimes in seconds, with the probe's own sanity flags and one more
    check here: a verify of K+1 tokens measured faster than a decode of 1 (v < 0) is flagged and taken as 0
    (StepTimes.verify_extra clamps), never used silently."""
    rows = sorted(probe["batches"], key=lambda r: int(r["batch"]))
    Q = 1 + min(len(r["verify"]) for r in rows)
    batch = tuple(int(r["batch"]) for r in rows)
    target = np.array([[float(r["target_decode"]["median_s"])] + [float(v["median_s"]) for v in
                        sorted(r["verify"], key=lambda v: int(v["k"]))[: Q - 1]] for r in rows])
    draft = np.array([float(r["draft_step"]["median_s"]) for r in rows])
    flags = []
    for i, B in enumerate(batch):
        for K in range(1, Q):
            v = target[i, K] / target[i, 0] - 1.0
            if v < 0:
                flags.append(f"batch {B}: the verify of {K + 1} tokens measured {-v:.1%} faster than a decode of 1 "
                             f"(v = {v:+.3f}); taken as 0 (a verify never costs less than a decode)")
    notes = ["the probe ran on a CPU: CPU figures do not stand for a GPU's"] if probe.get("cpu") else []
    widths = sorted({int(w["width"]) for r in rows for w in r.get("draft_width") or []})
    wide = {}
    for w in widths:  # probe --tree: a draft step over w tokens per sequence, at every batch size
        values = [next((float(x["median_s"]) for x in r.get("draft_width") or [] if int(x["width"]) == w), None) for r in rows]
        if all(v is not None for v in values):
            wide[w] = np.array(values)
    detail = (f"probe {where}: {probe.get('device', '?')} ({probe.get('device_name', '?')}) {probe.get('dtype', '?')}, "
              f"context {probe.get('context', '?')}, batch sizes {', '.join(map(str, batch))}")
    return StepTimes(batch=batch, target=target, draft=draft, source="probe", detail=detail, unit="s",
                     notes=tuple(notes), flags=tuple(flags), draft_width=wide or None)


def parse_batches(text: str, option: str = "--batch-sizes") -> tuple[int, ...]:
    """'1,2,4,8' -> (1, 2, 4, 8): distinct positive integers, sorted."""
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise OptionError(f"{option} {text!r}: expected positive batch sizes separated by commas, e.g. 1,2,4,8")
    return tuple(values)


def parse_gated(text: str) -> tuple[int, int]:
    """--batch 'B' or 'LO-HI' -> (lo, hi) inclusive."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if m is None or int(m.group(1)) < 1 or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
        raise OptionError(f"--batch {text!r}: expected a batch size B or a range LO-HI (e.g. 1 or 1-16)")
    lo = int(m.group(1))
    return lo, int(m.group(2)) if m.group(2) is not None else lo

