"""The head's MLP variants, chosen by the geometry: `DenseMlp`, `SparseMoeMlp` (Qwen3.5-MoE, Qwen3-Next) and
`GroupedMoeMlp` (DeepSeek-V3, GLM-4.5). Routed experts are held as fused stacks (gate_up [E, 2I, H], gate rows
first; down [E, H, I]) whatever the checkpoint's layout; rows are grouped by expert (sorted by expert id, one matmul
per expert over its contiguous slice of rows), accumulated in fp32; no Python loop over tokens.

Qwen routing (`route`), what transformers (Qwen3NextTopKRouter / Qwen3_5MoeTopKRouter), vLLM (`qwen3_next.py`
Qwen3NextSparseMoeBlock: FusedMoE with `renormalize=config.norm_topk_prob`, softmax scoring, the shared expert with a
sigmoid `shared_expert_gate`) and SGLang agree on:

    x     = N(z; post_attention_layernorm)                    [n, H]
    p     = softmax(x W_router^T) in fp32                      softmax THEN top-k
    w, e  = topk(p, k);  w = w / sum(w) if norm_topk_prob      (weights kept in fp32, as vLLM)
    mlp   = sum_j w_j down_{e_j}(silu(gate_{e_j} x) * up_{e_j} x) + sigmoid(x w_sg^T) down_s(silu(gate_s x) * up_s x)

DeepSeek-V3 / GLM-4.5 routing (`route_grouped`), vLLM's grouped_topk (model_executor/layers/fused_moe/router/
grouped_topk_router.py:81-162, called with use_grouped_topk=True, scoring_func sigmoid and the correction bias: deepseek_v2.py:374-401,
glm4_moe.py:183-209) and transformers' DeepseekV3TopkRouter / Glm4MoeTopkRouter (the same body):

    s      = sigmoid(x W_router^T) in fp32               [n, E]   (the router and the bias kept in fp32)
    c      = s + e_score_correction_bias                  the bias chooses ...
    groups = top-topk_group of the n_group groups by the sum of each group's top-2 c
    e      = top-k of c within those groups
    w      = s[e] (... the unbiased scores weigh); w = w / sum(w) if norm_topk_prob; w = w * routed_scaling_factor
    mlp    = sum_j w_j expert_{e_j}(x) + shared_experts(x)      (moe_intermediate_size * n_shared_experts, no gate)

vLLM renormalises without transformers' 1e-20 in the denominator; in fp32 the two differ by nothing measurable.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..families import HeadGeometry, SparseMoe


def route(router_logits: Tensor, k: int, norm_topk_prob: bool) -> tuple[Tensor, Tensor]:
    """router_logits: [n, E] -> (weights [n, k] fp32, experts [n, k] int64): softmax in fp32 over all E,
    THEN the top k, renormalised to sum to 1 when norm_topk_prob.

    Worked example, logits (2, 1, 0, -1), k = 2: p = (0.644, 0.237, 0.087, 0.032); top 2 = experts (0, 1)
    with (0.644, 0.237), renormalised (0.731, 0.269). Top-k before the softmax would give (0.731, 0.269)
    too, which is why only norm_topk_prob = false tells the two orders apart: (0.644, 0.237) there.
    """
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, experts = torch.topk(probs, k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def route_grouped(router_logits: Tensor, bias: Tensor, moe: SparseMoe) -> tuple[Tensor, Tensor]:
    """router_logits: [n, E] fp32, bias: [E] e_score_correction_bias -> (weights [n, k] fp32, experts [n, k] int64):
    DeepSeek-V3's noaux_tc grouped top-k (module doc).

    Worked example, E = 4 in 2 groups, topk_group 1, k = 2, scores s = (0.9, 0.8, 0.6, 0.5): with bias
    (0, 0, 0.2, 0.2), c = (0.9, 0.8, 0.8, 0.7), group scores (top-2 sums) (1.7, 1.5) -> group 0, experts (0, 1),
    weights (0.9, 0.8) renormalised (0.529, 0.471), then times routed_scaling_factor. With bias (0, 0, 0.5, 0.5),
    c = (0.9, 0.8, 1.1, 1.0): group 1 wins (2.1 > 1.7), experts (2, 3) weighed by the unbiased (0.6, 0.5) ->
    (0.545, 0.455).
    """
    n, E = router_logits.shape
    scores = router_logits.float().sigmoid()
    choice = scores + bias.float()
    G = moe.n_group
    group_scores = choice.view(n, G, E // G).topk(min(2, E // G), dim=-1).values.sum(-1)  # [n, G]
    keep = group_scores.topk(moe.topk_group, dim=-1).indices
    allowed = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
    choice = choice.masked_fill(~allowed.repeat_interleave(E // G, dim=1), float("-inf"))
    experts = choice.topk(moe.experts_per_token, dim=-1).indices
    weights = scores.gather(1, experts)
    if moe.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * moe.routed_scaling_factor, experts


def routed_experts(x: Tensor, weights: Tensor, experts: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    """sum_j weights[i, j] * expert_{experts[i, j]}(x_i), grouped by expert; fp32 accumulation.

    x: [n, H]; weights, experts: [n, k]; gate_up: [E, 2I, H] (rows [0:I] gate, [I:] up); down: [E, H, I]
    -> [n, H] fp32. The n*k assignments are sorted by expert id, so each expert with rows runs one
    matmul over a contiguous slice (the loop is over the experts that have rows, never over tokens).
    """
    n, k = experts.shape
    flat = experts.reshape(-1)  # [n k]
    order = torch.argsort(flat, stable=True)
    tokens = order // k  # the row of each sorted assignment
    w = weights.reshape(-1)[order]
    counts = torch.bincount(flat, minlength=gate_up.shape[0])
    ends = counts.cumsum(0)
    out = torch.zeros(n, x.shape[-1], dtype=torch.float32, device=x.device)
    for e in torch.nonzero(counts).squeeze(1).tolist():
        end = int(ends[e])
        start = end - int(counts[e])
        rows = tokens[start:end]
        gate, up = F.linear(x[rows], gate_up[e]).chunk(2, dim=-1)  # gate first
        y = F.linear(F.silu(gate) * up, down[e])
        out.index_add_(0, rows, y.float() * w[start:end, None])
    return out


class DenseMlp(nn.Module):
    """down(silu(gate x) * up x): the dense head's MLP."""

    def __init__(self, tensors: dict[str, Tensor], prefix: str):
        super().__init__()
        self.gate_proj = nn.Parameter(tensors[prefix + "gate_proj.weight"], requires_grad=False)  # [I, H]
        self.up_proj = nn.Parameter(tensors[prefix + "up_proj.weight"], requires_grad=False)  # [I, H]
        self.down_proj = nn.Parameter(tensors[prefix + "down_proj.weight"], requires_grad=False)  # [H, I]

    def forward(self, x: Tensor) -> Tensor:
        """x: [n, H] -> [n, H]."""
        return F.linear(F.silu(F.linear(x, self.gate_proj)) * F.linear(x, self.up_proj), self.down_proj)

    def named_weights(self, prefix: str) -> dict[str, Tensor]:
        return {prefix + n + ".weight": getattr(self, n) for n in ("gate_proj", "up_proj", "down_proj")}


class SparseMoeMlp(nn.Module):
    """Router, E routed experts (fused stacks), one shared expert with a sigmoid gate (module doc)."""

    def __init__(self, moe: SparseMoe, tensors: dict[str, Tensor], prefix: str):
        super().__init__()
        self.moe = moe

        def p(name):
            return nn.Parameter(tensors[prefix + name], requires_grad=False)

        self.router = p("gate.weight")  # [E, H]
        self.gate_up = p("experts.gate_up_proj")  # [E, 2 I, H]
        self.down = p("experts.down_proj")  # [E, H, I]
        self.shared_gate_proj = p("shared_expert.gate_proj.weight")  # [I_sh, H]
        self.shared_up_proj = p("shared_expert.up_proj.weight")
        self.shared_down_proj = p("shared_expert.down_proj.weight")  # [H, I_sh]
        self.shared_expert_gate = p("shared_expert_gate.weight")  # [1, H]

    def forward(self, x: Tensor) -> Tensor:
        """x: [n, H] -> [n, H]."""
        weights, experts = route(F.linear(x, self.router), self.moe.experts_per_token, self.moe.norm_topk_prob)
        routed = routed_experts(x, weights, experts, self.gate_up, self.down)
        shared = F.linear(F.silu(F.linear(x, self.shared_gate_proj)) * F.linear(x, self.shared_up_proj), self.shared_down_proj)
        shared = torch.sigmoid(F.linear(x, self.shared_expert_gate)) * shared
        return (routed + shared.float()).to(x.dtype)

    def named_weights(self, prefix: str) -> dict[str, Tensor]:
        return {
            prefix + "gate.weight": self.router,
            prefix + "experts.gate_up_proj": self.gate_up,
            prefix + "experts.down_proj": self.down,
            prefix + "shared_expert.gate_proj.weight": self.shared_gate_proj,
            prefix + "shared_expert.up_proj.weight": self.shared_up_proj,
            prefix + "shared_expert.down_proj.weight": self.shared_down_proj,
            prefix + "shared_expert_gate.weight": self.shared_expert_gate,
        }


class GroupedMoeMlp(nn.Module):
    """DeepSeek-V3 / GLM-4.5's MoE block: the grouped sigmoid router with its correction bias, E routed experts
    (fused stacks), the shared experts added ungated (module doc)."""

    def __init__(self, moe: SparseMoe, tensors: dict[str, Tensor], prefix: str):
        super().__init__()
        self.moe = moe

        def p(name):
            return nn.Parameter(tensors[prefix + name], requires_grad=False)

        self.router = p("gate.weight")  # [E, H], kept fp32 (build_head)
        self.bias = p("gate.e_score_correction_bias")  # [E] fp32
        self.gate_up = p("experts.gate_up_proj")  # [E, 2 I, H]
        self.down = p("experts.down_proj")  # [E, H, I]
        self.shared = DenseMlp(tensors, prefix + "shared_experts.")

    def forward(self, x: Tensor) -> Tensor:
        """x: [n, H] -> [n, H]."""
        weights, experts = route_grouped(F.linear(x.float(), self.router.float()), self.bias, self.moe)
        routed = routed_experts(x, weights, experts, self.gate_up, self.down)
        return (routed + self.shared(x).float()).to(x.dtype)

    def named_weights(self, prefix: str) -> dict[str, Tensor]:
        return {prefix + "gate.weight": self.router, prefix + "gate.e_score_correction_bias": self.bias,
                prefix + "experts.gate_up_proj": self.gate_up, prefix + "experts.down_proj": self.down,
                **self.shared.named_weights(prefix + "shared_experts.")}


def build_mlp(g: HeadGeometry, tensors: dict[str, Tensor], prefix: str) -> nn.Module:
    """The variant the geometry names; `prefix` ends in "mlp."."""
    if g.moe is None:
        return DenseMlp(tensors, prefix)
    return GroupedMoeMlp(g.moe, tensors, prefix) if g.moe.routing == "sigmoid_grouped" else SparseMoeMlp(g.moe, tensors, prefix)
