"""The speedup: what a draft step and a target step cost at a batch size buy, and the K to run.

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
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from ..errors import OptionError

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)


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


PROBE_VERSION = 2  # the "probe_version" probe.json carries (written by probe.py; 2 added batch_sizes and batches)
