"""The routing: which routed experts the target's own router picks on the replayed traffic.

Contract: `RouterRecorder(target, q_max)` hooks every MoE router of a transformers target
(Qwen3_5MoeTopKRouter, Qwen3NextTopKRouter, DeepseekV3TopkRouter, Glm4MoeTopkRouter: modules returning (logits,
weights, indices)) and, per
request, keeps the top-k expert indices of the positions the prefill computed. `end_request(start,
spans)` adds that request's window sums; `take()` returns one session's sums and starts the next:

    windows[q-1]        windows of q consecutive tokens (q = 1..q_max) lying inside a scored span
                        [s, e] (both ends inclusive) and computed by this request's prefill (t >= start)
    hits[q-1, l, e]     of those windows, how many routed at least one of their tokens to expert e in
                        the l-th MoE layer (layers in module order)

`window_hits` is the counting, a pure function. A window of q consecutive tokens is what one sequence
puts into a verify step of K = q-1 drafts (its last token and the drafts, taken as the recorded
tokens); B such windows drawn independently are a batch of B sequences (cost.ExpertCounts turns the
sums into the expected distinct experts). Only scored tokens count: decode and verify steps process
generated text, not prompts. The sums are small (q_max · layers · experts integers per session) and
go into requests.parquet's `routing` column (tables.py). Worked example, one layer, E = 4, top-1,
span tokens routed to experts [0, 0, 1, 3]: q = 1: 4 windows, hits [2, 1, 0, 1]; q = 2: 3 windows
({0}, {0,1}, {1,3}), hits [2, 2, 0, 1].
"""

from __future__ import annotations

import torch
from torch import Tensor


def is_router(module) -> bool:
    """A transformers MoE top-k router (returns router logits, routing weights, expert indices): Qwen's `...TopKRouter`,
    DeepSeek-V3's and GLM-4.5's `...TopkRouter` (modeling_deepseek_v3.py:120-158, modeling_glm4_moe.py:269-307)."""
    name = type(module).__name__
    return name.lower().endswith("topkrouter") and hasattr(module, "top_k") and hasattr(module, "num_experts")


def window_hits(indices: Tensor, experts: int, q_max: int) -> tuple[Tensor, Tensor]:
    """indices: [T, k] expert ids of T consecutive tokens -> (windows [q_max] int64, hits [q_max, experts] int64).

    windows[q-1] = max(T - q + 1, 0); hits[q-1, e] = windows of q tokens with e among their tokens' experts.
    """
    T = indices.shape[0]
    windows = torch.tensor([max(T - q + 1, 0) for q in range(1, q_max + 1)], dtype=torch.int64)
    hits = torch.zeros(q_max, experts, dtype=torch.int64)
    if T == 0:
        return windows, hits
    onehot = torch.zeros(T, experts, dtype=torch.int32, device=indices.device)
    onehot.scatter_(1, indices.long(), 1)
    cumulative = torch.zeros(T + 1, experts, dtype=torch.int32, device=indices.device)
    cumulative[1:] = onehot.cumsum(0)
    for q in range(1, min(q_max, T) + 1):
        in_window = cumulative[q:] - cumulative[:-q]  # [T - q + 1, E] tokens of window t routed to e
        hits[q - 1] = (in_window > 0).sum(0).to(torch.int64).cpu()
    return windows, hits


class RouterRecorder:
    """Forward hooks on the target's MoE routers; one session's window sums at a time."""

    def __init__(self, target, q_max: int):
        self.q_max = q_max
        self.routers = [m for _, m in target.named_modules() if is_router(m)]
        self.experts = int(self.routers[0].num_experts) if self.routers else 0
        self._indices: list[list[Tensor]] = [[] for _ in self.routers]
        self._hooks = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(self.routers)]
        self._reset()

    @property
    def active(self) -> bool:
        return bool(self.routers)

    def _hook(self, layer: int):
        def record(module, inputs, output):
            self._indices[layer].append(output[2].detach().reshape(-1, output[2].shape[-1]))
        return record

    def _reset(self) -> None:
        L = len(self.routers)
        self.windows = torch.zeros(self.q_max, dtype=torch.int64)
        self.hits = torch.zeros(self.q_max, L, self.experts, dtype=torch.int64)

    def begin_request(self) -> None:
        for buffer in self._indices:
            buffer.clear()

    def end_request(self, start: int, spans: list[tuple[int, int]]) -> None:
        """Add the windows of this request's spans: its prefill computed positions start, start+1, ... in order."""
        per_layer = [torch.cat(buffer) if buffer else None for buffer in self._indices]
        self.begin_request()
        if not per_layer or per_layer[0] is None:
            return
        n = start + per_layer[0].shape[0]
        for s, e in spans:
            lo, hi = max(s, start), min(e, n - 1)  # positions the prefill computed, inclusive
            if hi < lo:
                continue
            for layer, indices in enumerate(per_layer):
                windows, hits = window_hits(indices[lo - start : hi - start + 1], self.experts, self.q_max)
                self.hits[:, layer] += hits
            self.windows += windows

    def take(self) -> dict | None:
        """This session's sums as requests.parquet's `routing` struct (tables.py), or None without routers."""
        if not self.active:
            return None
        out = {"q_max": self.q_max, "layers": len(self.routers), "experts": self.experts,
               "windows": self.windows.tolist(), "hits": self.hits.reshape(-1).tolist()}
        self._reset()
        return out

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
