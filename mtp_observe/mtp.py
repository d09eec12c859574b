"""The MTP draft head, run exactly as the serving engines run it.

Contract: given the target's post-final-norm hidden states h_0..h_{n-1} of one request and
its tokens, `row_pass` runs the head once over every row i = (h_i, x_{i+1}) at RoPE position
i and returns the head's post-norm states m_i together with its own KV cache; `chain` then
drafts d_1..d_K at many anchors at once. The head knows nothing about sessions, spans or
the target model; it holds its own tensors (15 for a dense head; with a MoE block the router,
the experts and the shared expert) and borrows the target's embedding and lm_head.

One row (all norms zero-centred RMSNorm, N(x; w) = x * rsqrt(mean(x^2) + eps) * (1 + w),
computed in fp32 and cast back):

    z   = fc( cat[ N(embed(x_{i+1}); pre_fc_norm_embedding), N(h_i; pre_fc_norm_hidden) ] )
    z   = z + o_proj( attention(N(z; input_layernorm)) * sigmoid(gate) )      # gated, GQA, partial RoPE
    z   = z + mlp( N(z; post_attention_layernorm) )
    m_i = N(z; norm)                       draft for x_{i+2} = argmax lm_head(m_i)

Drafting at anchor p (the target has just emitted x_p, so it holds h_{p-1}):
    step 1:     row p-1 = (h_{p-1}, x_p) at position p-1 (already computed by the row pass) -> d_1
    step s>=2:  (embed(d_{s-1}), m^{(s-1)}) at position p+s-2, attending to the true rows
                0..p-1 and the earlier chain rows of the same draft -> d_s
    Worked example, p=10, K=3: d_1 from row 9 (h_9, x_10) @ pos 9; d_2 from (d_1, m^(1)) @ pos 10
    seeing rows 0..9 + itself; d_3 from (d_2, m^(2)) @ pos 11 seeing rows 0..9, the d_2 row, itself.

Readings taken from the serving engines' code rather than from tensor shapes (vLLM
`qwen3_5_mtp.py` / `qwen3_next_mtp.py` / `v1/spec_decode/eagle.py`, SGLang
`qwen3_5_mtp.py` / `eagle_worker.py`):
  - the fc input is [embedding, hidden] in that order (shapes allow either);
  - each half has its own norm (pre_fc_norm_embedding, pre_fc_norm_hidden), not one over 2H;
  - the hidden is the target's post-final-norm state (the tensor its lm_head consumes);
  - row i pairs h_i with the *next* token x_{i+1};
  - the head runs over every position the target processes (prompt included) with its own
    KV cache, at the position of h_i;
  - a chain step feeds back the head's post-norm output m (after mtp.norm), re-normed by
    pre_fc_norm_hidden, at a position advanced by one per step, reusing layer
    `step % mtp_num_hidden_layers`;
  - drafts are argmax whatever the serving temperature.
Confidence (`chain(..., confidence=True)`, and the stop `p_min`): the probability llama.cpp compares with
--draft-p-min (common/speculative.cpp, draft-mtp and draft-simple alike: `cur_p->data[0].p < params.p_min`
after `common_sampler_sample` with the draft sampler `top_k = 10` and no temperature sampler,
common/sampling.cpp `common_sampler_init` -> top_k then dist): the head's softmax at temperature 1 over its
ten largest logits, at the argmax, 1 / Σ_{top 10} exp(l - l_max) — the head's own probability of its draft,
after llama.cpp's draft sampler (not the served sampler, which llama.cpp never applies to drafts, and not the
whole-vocabulary softmax, which is smaller). Computed in float64 (llama.cpp's float32 rounds it to 1.0 once
the other nine are ~17 nats below; here past ~37). The stop is current llama.cpp's (PR #22506, 2026-04-29):
the first draft below p_min is dropped and the anchor stops drafting; strict `<`, so p = p_min drafts on.
Readings that follow from Qwen3.5's own attention (transformers' Qwen3_5Attention): q_proj's
output is viewed [nh, 2d] and split per head into query and gate; q_norm/k_norm over d
before RoPE; partial rotary on the first rotary_dim dims with rotate-half pairing; text
M-RoPE streams are equal, so plain 1-D RoPE. Qwen3-Next's attention (Qwen3NextAttention) is
the same gated attention.

Rotary scaling: the head gets the target's rope_parameters, as the engines give it (vLLM
builds the MTP layer's attention with `get_rope(rope_parameters=config.rope_parameters)`):
"default", "linear" (frequencies / factor) and "yarn", whose scaled inverse frequencies and
attention factor on cos/sin follow transformers' `modeling_rope_utils._compute_yarn_parameters`
line for line (`rotary_frequencies`). checkpoint.py refuses any other rope type for the head.

The MLP is one of two variants, chosen by the geometry (a family is data, not a copy of the
head): `DenseMlp`, or `SparseMoeMlp` for Qwen3.5-MoE and Qwen3-Next, whose routing is what
transformers (Qwen3NextTopKRouter / Qwen3_5MoeTopKRouter), vLLM (`qwen3_next.py`
Qwen3NextSparseMoeBlock: FusedMoE with `renormalize=config.norm_topk_prob`, softmax scoring,
the shared expert with a sigmoid `shared_expert_gate`) and SGLang agree on:

    x     = N(z; post_attention_layernorm)                    [n, H]
    p     = softmax(x W_router^T) in fp32                      softmax THEN top-k
    w, e  = topk(p, k);  w = w / sum(w) if norm_topk_prob      (weights kept in fp32, as vLLM)
    mlp   = sum_j w_j down_{e_j}(silu(gate_{e_j} x) * up_{e_j} x) + sigmoid(x w_sg^T) down_s(silu(gate_s x) * up_s x)

accumulated in fp32. Rows are grouped by expert (sorted by expert id, one matmul per expert
over its contiguous slice of rows); no Python loop over tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .families import HeadGeometry, SparseMoe, expected_head_shapes

try:  # torch >= 2.3
    from torch.nn.attention.bias import CausalBias, causal_lower_right as _lower_right
except ImportError:  # pragma: no cover
    CausalBias, _lower_right = (), None

# Default bound on one attention score block (elements of [heads, queries, keys] in fp32).
ATTENTION_BUDGET = 1 << 26  # 64 Mi elements = 256 MiB
# Default bound on one lm_head logits block (elements of [rows, vocab] in fp32).
LOGITS_BUDGET = 1 << 26
# llama.cpp's draft sampler: top_k 10 and nothing else (common/speculative.cpp: sparams.top_k = 10; samplers = {TOP_K}).
DRAFT_TOP_K = 10


# ---------------------------------------------------------------------------------------------
# Pure helpers (shapes in comments)


def zero_centred_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """N(x; w) = x * rsqrt(mean(x^2) + eps) * (1 + w), in fp32, cast back.  x: [..., D], w: [D].

    Worked example: x = [3, 4], w = [0, 1], eps = 0: rms = sqrt(12.5) = 3.5355;
    N = [3/3.5355 * 1, 4/3.5355 * 2] = [0.8485, 2.2627].
    """
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (1.0 + weight.float())).to(x.dtype)


def rotary_inv_freq(rotary_dim: int, theta: float, device=None) -> Tensor:
    """[rotary_dim / 2] inverse frequencies, as transformers computes them for Qwen3.5."""
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim))


def rotary_frequencies(g: HeadGeometry, device=None) -> tuple[Tensor, float]:
    """([rotary_dim / 2] inverse frequencies, attention factor on cos/sin) for the geometry's rope_parameters.

    yarn, as transformers' _compute_yarn_parameters: interpolated frequencies 1 / (factor * theta^(2i/r))
    below the correction range, the plain ones above it, a linear ramp between; the range from
    beta_fast / beta_slow rotations at original_max_position_embeddings (floored / ceiled unless
    truncate is false); attention factor 0.1 * ln(factor) + 1 (or the mscale ratio, or as given).
    """
    rope, r, base = g.rope, g.rotary_dim, g.rope_theta
    inv_freq = rotary_inv_freq(r, base, device)
    if rope.rope_type == "default":
        return inv_freq, 1.0
    if rope.rope_type == "linear":
        return inv_freq / rope.factor, 1.0
    assert rope.rope_type == "yarn", rope.rope_type
    factor = rope.factor
    original = rope.original_max_position_embeddings
    if factor is None:
        factor = rope.max_position_embeddings / original

    def get_mscale(scale, mscale=1.0):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = float(get_mscale(factor, rope.mscale) / get_mscale(factor, rope.mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = rope.beta_fast or 32
    beta_slow = rope.beta_slow or 1

    def correction_dim(rotations):
        return (r * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, r - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(r // 2, dtype=torch.float32, device=device) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp  # 1: keep the plain frequency, 0: interpolate
    pos_freqs = base ** (torch.arange(0, r, 2, device=device).to(torch.float32) / r)
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv, attention_factor


def rotary_cos_sin(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype, scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """positions: [n] -> cos, sin: [n, rotary_dim], frequencies repeated as [f, f] (rotate-half layout),
    each times `scale` (yarn's attention factor; 1 otherwise)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def apply_partial_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the first rotary_dim dims of x with rotate-half pairing (i with i + r/2); pass the rest.

    x: [heads, n, d]; cos, sin: [n, r] with r <= d.
    """
    r = cos.shape[-1]
    x_rot, x_pass = x[..., :r], x[..., r:]
    x1, x2 = x_rot[..., : r // 2], x_rot[..., r // 2 :]
    rotated = torch.cat([-x2, x1], dim=-1)
    return torch.cat([x_rot * cos + rotated * sin, x_pass], dim=-1)


def causal_mask(q_positions: Tensor, k_positions: Tensor) -> Tensor:
    """[nq, nk] bool, True where query may attend key (key position <= query position).

    Explicit, because a default `is_causal` mask is top-left aligned and wrong as soon as
    the cache already holds keys (a query chunk after the first).
    """
    return k_positions[None, :] <= q_positions[:, None]


# ---------------------------------------------------------------------------------------------
# The head's MLP variants


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


# ---------------------------------------------------------------------------------------------
# Outputs


@dataclass(frozen=True)
class RowPass:
    """The head run over every row of one request."""

    states: Tensor  # [n, H]  m_i: the head's post-norm state of row i = (h_i, x_{i+1}) at position i
    keys: Tensor  # [nkv, n, d]  its KV cache after k_norm and RoPE
    values: Tensor  # [nkv, n, d]


@dataclass(frozen=True)
class Drafts:
    """The chain's drafts at a set of anchors."""

    anchors: Tensor  # [A] int64  anchor positions p (x_p just emitted)
    depths: Tensor  # [A] int64  how many depths were drafted at each anchor (1..K)
    tokens: Tensor  # [A, K] int64  d_1..d_K; -1 past depths[a]
    logprobs: Tensor  # [A, K] float32  log-softmax of the head's logits at d_k; nan past depths[a]
    states: Tensor | None = None  # [A, K, H]  m^(k), only when asked for (keep_states=True)
    confidence: Tensor | None = None  # [A, K] float64  llama.cpp's p of d_k (module doc); nan where not drafted
    drafted: Tensor | None = None  # [A] int64  drafts kept under p_min (its first draft below p_min dropped)


# ---------------------------------------------------------------------------------------------
# The head


class MtpHead(nn.Module):
    """Holds the head's tensors and the borrowed embedding / lm_head; `row_pass` and `chain` run it."""

    def __init__(self, geometry: HeadGeometry, tensors: dict[str, Tensor], embed_tokens: Tensor, lm_head: Tensor):
        super().__init__()
        g = geometry
        self.geometry = g
        shapes = expected_head_shapes(g)  # the fused expert form for a MoE head
        for name, shape in shapes.items():
            key = name[len("mtp."):]
            assert tuple(tensors[key].shape) == shape, f"{name}: {tuple(tensors[key].shape)} != {shape}"
        assert len(tensors) == len(shapes), sorted(set(tensors) - {n[len('mtp.'):] for n in shapes})
        assert embed_tokens.shape == lm_head.shape == (g.vocab_size, g.hidden_size)

        def p(key):
            return nn.Parameter(tensors[key], requires_grad=False)

        self.pre_fc_norm_embedding = p("pre_fc_norm_embedding.weight")
        self.pre_fc_norm_hidden = p("pre_fc_norm_hidden.weight")
        self.fc = p("fc.weight")  # [H, 2H]
        self.norm = p("norm.weight")
        L = "layers.0."
        self.input_layernorm = p(L + "input_layernorm.weight")
        self.post_attention_layernorm = p(L + "post_attention_layernorm.weight")
        self.q_proj = p(L + "self_attn.q_proj.weight")  # [2 nh d, H]
        self.k_proj = p(L + "self_attn.k_proj.weight")  # [nkv d, H]
        self.v_proj = p(L + "self_attn.v_proj.weight")
        self.o_proj = p(L + "self_attn.o_proj.weight")  # [H, nh d]
        self.q_norm = p(L + "self_attn.q_norm.weight")  # [d]
        self.k_norm = p(L + "self_attn.k_norm.weight")
        self.mlp = DenseMlp(tensors, L + "mlp.") if g.moe is None else SparseMoeMlp(g.moe, tensors, L + "mlp.")
        # Borrowed from the target, not copied: a draft step reads the whole lm_head.
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head
        inv_freq, self.attention_factor = rotary_frequencies(g, self.fc.device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def named_weights(self) -> dict[str, Tensor]:
        """The head's own tensors by checkpoint name without "mtp." (routed experts in the fused form)."""
        L = "layers.0."
        own = {
            "pre_fc_norm_embedding.weight": self.pre_fc_norm_embedding, "pre_fc_norm_hidden.weight": self.pre_fc_norm_hidden,
            "fc.weight": self.fc, "norm.weight": self.norm,
            L + "input_layernorm.weight": self.input_layernorm, L + "post_attention_layernorm.weight": self.post_attention_layernorm,
        }
        own |= {L + f"self_attn.{n}.weight": getattr(self, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")}
        return own | self.mlp.named_weights(L + "mlp.")

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.dtype

    @property
    def device(self) -> torch.device:
        return self.fc.device

    # -- the pieces of one row -------------------------------------------------------------

    def _norm(self, x: Tensor, w: Tensor) -> Tensor:
        return zero_centred_rms_norm(x, w, self.geometry.rms_norm_eps)

    def fc_input(self, hidden: Tensor, next_ids: Tensor) -> Tensor:
        """hidden: [n, H] (target post-norm h_i, or the head's own m in a chain step), next_ids: [n] -> z: [n, H]."""
        embedding = F.embedding(next_ids.to(self.embed_tokens.device), self.embed_tokens).to(self.device)
        embedding = self._norm(embedding, self.pre_fc_norm_embedding)
        hidden = self._norm(hidden.to(self.dtype), self.pre_fc_norm_hidden)
        return F.linear(torch.cat([embedding, hidden], dim=-1), self.fc)  # embedding first

    def attention_inputs(self, z: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """z: [n, H] residual stream, positions: [n] ->
        query [nh, n, d], gate [n, nh d], key [nkv, n, d], value [nkv, n, d] (query/key normed and rotated)."""
        g = self.geometry
        n = z.shape[0]
        x = self._norm(z, self.input_layernorm)
        query_and_gate = F.linear(x, self.q_proj).view(n, g.num_heads, 2 * g.head_dim)
        query, gate = query_and_gate.chunk(2, dim=-1)  # per head: [q_h | gate_h]
        gate = gate.reshape(n, g.num_heads * g.head_dim)
        query = self._norm(query, self.q_norm).transpose(0, 1)  # [nh, n, d]
        key = self._norm(F.linear(x, self.k_proj).view(n, g.num_kv_heads, g.head_dim), self.k_norm).transpose(0, 1)
        value = F.linear(x, self.v_proj).view(n, g.num_kv_heads, g.head_dim).transpose(0, 1)
        cos, sin = rotary_cos_sin(positions, self.inv_freq, self.dtype, self.attention_factor)
        return apply_partial_rotary(query, cos, sin), gate, apply_partial_rotary(key, cos, sin), value

    def finish_row(self, z: Tensor, attn: Tensor, gate: Tensor) -> Tensor:
        """z: [n, H] residual, attn: [nh, n, d], gate: [n, nh d] -> m: [n, H] (post-norm)."""
        n = z.shape[0]
        attn = attn.transpose(0, 1).reshape(n, -1)
        z = z + F.linear(attn * torch.sigmoid(gate), self.o_proj)
        z = z + self.mlp(self._norm(z, self.post_attention_layernorm))
        return self._norm(z, self.norm)

    def _row_mask(self, q_positions: Tensor, k_positions: Tensor):
        """The row pass's causal mask. On CUDA a lower-right CausalBias (the same mask when the chunk's
        queries are the last keys) lets SDPA pick a flash / memory-efficient kernel instead of
        materialising [q, k]; elsewhere the explicit boolean mask."""
        if self.device.type == "cuda" and _lower_right is not None:
            return _lower_right(q_positions.shape[0], k_positions.shape[0])
        return causal_mask(q_positions, k_positions)

    def _attend(self, query: Tensor, key: Tensor, value: Tensor, mask) -> Tensor:
        """query [nh, q, d], key/value [nkv, k, d], mask [q, k] bool (or a CausalBias) -> [nh, q, d]."""
        scale = self.geometry.head_dim ** -0.5
        if isinstance(mask, CausalBias):
            groups = self.geometry.num_heads // self.geometry.num_kv_heads  # CausalBias takes no enable_gqa
            key, value = key.repeat_interleave(groups, 0), value.repeat_interleave(groups, 0)
            return F.scaled_dot_product_attention(query[None], key[None], value[None], attn_mask=mask, scale=scale)[0]
        out = F.scaled_dot_product_attention(
            query[None], key[None], value[None], attn_mask=mask[None, None], enable_gqa=True, scale=scale,
        )
        return out[0]

    def logits(self, states: Tensor) -> Tensor:
        """states: [n, H] -> [n, V] fp32. Call on chunks: this is the vocabulary-sized tensor."""
        return F.linear(states.to(self.lm_head.device), self.lm_head).float()

    # -- the two passes ----------------------------------------------------------------------

    @torch.no_grad()
    def row_pass(self, hidden: Tensor, next_ids: Tensor, chunk_size: int = 2048, prefix: RowPass | None = None) -> RowPass:
        """Run every row i = (h_i, x_{i+1}) at position i, filling the head's KV cache chunk by chunk.

        hidden: [m, H] target post-final-norm states, next_ids: [m] the tokens after them. Without
        `prefix` these are rows 0..m-1; with it (rows 0..P-1 of the same request, computed before)
        they are rows P..P+m-1, attending to the prefix's KV, and the result holds all P+m rows.
        """
        g = self.geometry
        m = hidden.shape[0]
        assert next_ids.shape == (m,), (next_ids.shape, m)
        P = prefix.states.shape[0] if prefix is not None else 0
        n = P + m
        device = self.device
        keys = torch.empty(g.num_kv_heads, n, g.head_dim, dtype=self.dtype, device=device)
        values = torch.empty_like(keys)
        states = torch.empty(n, g.hidden_size, dtype=self.dtype, device=device)
        if prefix is not None:
            keys[:, :P], values[:, :P], states[:P] = prefix.keys, prefix.values, prefix.states
        all_positions = torch.arange(n, device=device)
        for c0 in range(P, n, chunk_size):
            c1 = min(n, c0 + chunk_size)
            positions = all_positions[c0:c1]
            z = self.fc_input(hidden[c0 - P : c1 - P].to(device), next_ids[c0 - P : c1 - P].to(device))
            query, gate, key, value = self.attention_inputs(z, positions)
            keys[:, c0:c1], values[:, c0:c1] = key, value
            attn = self._attend(query, keys[:, :c1], values[:, :c1], self._row_mask(positions, all_positions[:c1]))
            states[c0:c1] = self.finish_row(z, attn, gate)
        return RowPass(states=states, keys=keys, values=values)

    @staticmethod
    def rows_prefix(rows: RowPass, length: int) -> RowPass:
        """The first `length` rows (what a later request sharing those tokens can start from)."""
        return RowPass(states=rows.states[:length], keys=rows.keys[:, :length], values=rows.values[:, :length])

    @torch.no_grad()
    def chain(
        self,
        rows: RowPass,
        anchors: Tensor,
        depths: Tensor,
        attention_budget: int = ATTENTION_BUDGET,
        logits_budget: int = LOGITS_BUDGET,
        keep_states: bool = False,
        confidence: bool = False,
        p_min: float | None = None,
    ) -> Drafts:
        """Draft d_1..d_{depths[a]} at every anchor, batched over anchors (no Python loop over them).

        anchors: [A] positions p >= 1 with row p-1 in `rows`; depths: [A] in 1..K, non-increasing
        along no particular order. Step s >= 2 runs only at anchors with depths >= s. Its query
        attends to the true rows 0..p-1 (a prefix of the cache) and to its own earlier chain rows,
        expressed as one block-structured boolean mask over [prefix keys | chain keys of the block].

        confidence: also return llama.cpp's p of every draft (module doc). p_min (implies confidence):
        stop drafting at an anchor at the first step whose draft has p < p_min, dropping that draft
        (tokens -1 from there, `drafted` the drafts kept); p_min = 0 drafts exactly as without it.
        """
        confidence = confidence or p_min is not None
        g = self.geometry
        device = self.device
        anchors = anchors.to(device=device, dtype=torch.long)
        depths = depths.to(device=device, dtype=torch.long)
        A = anchors.shape[0]
        K = int(depths.max()) if A else 0
        assert A == 0 or int(anchors.min()) >= 1, "anchor p needs row p-1"
        assert A == 0 or int(anchors.max()) <= rows.states.shape[0], "anchor p needs row p-1 in the row pass"
        tokens = torch.full((A, max(K, 1)), -1, dtype=torch.long, device=device)
        logprobs = torch.full((A, max(K, 1)), float("nan"), dtype=torch.float32, device=device)
        kept = torch.zeros(A, max(K, 1), g.hidden_size, dtype=self.dtype, device=device) if keep_states else None
        sure = torch.full((A, max(K, 1)), float("nan"), dtype=torch.float64, device=device) if confidence else None
        stopped = torch.zeros(A, dtype=torch.bool, device=device)  # p_min: the anchor drafts no more

        def finish(drafts: Drafts) -> Drafts:
            if p_min is None:
                return drafts
            return replace(drafts, drafted=(drafts.tokens >= 0).long().cumprod(dim=1).sum(dim=1))

        if A == 0:
            return finish(Drafts(anchors, depths, tokens, logprobs, kept, sure))

        def stop_low(where: Tensor, step: int) -> None:  # p_min: drop the drafts below it, stop those anchors
            if p_min is None:
                return
            low = where[sure[where, step - 1] < p_min]
            tokens[low, step - 1] = -1
            stopped[low] = True

        # Step 1: the row pass already holds m_{p-1}.
        state = rows.states[anchors - 1]  # [A, H]
        if kept is not None:
            kept[:, 0] = state
        first = self._argmax_chunked(state, logits_budget, confidence)
        tokens[:, 0], logprobs[:, 0] = first[0], first[1]
        if confidence:
            sure[:, 0] = first[2]
            stop_low(torch.arange(A, device=device), 1)
        chain_keys = torch.empty(g.num_kv_heads, A, max(K - 1, 1), g.head_dim, dtype=self.dtype, device=device)
        chain_values = torch.empty_like(chain_keys)

        # Steps 2..K over the anchors still drafting.
        for step in range(2, K + 1):
            alive = torch.nonzero((depths >= step) & ~stopped).squeeze(1)  # [A_s] indices into anchors
            if alive.numel() == 0:
                break
            a_pos = anchors[alive]
            positions = a_pos + step - 2
            z = self.fc_input(state[alive], tokens[alive, step - 2])
            query, gate, key, value = self.attention_inputs(z, positions)  # query [nh, A_s, d]
            chain_keys[:, alive, step - 2] = key
            chain_values[:, alive, step - 2] = value
            attn = torch.empty_like(query)
            n_chain = step - 1
            block = self._anchor_block(int(a_pos.max()), n_chain, attention_budget)
            for b0 in range(0, alive.shape[0], block):
                b1 = min(alive.shape[0], b0 + block)
                idx = alive[b0:b1]
                p = anchors[idx]  # [B]
                prefix = int(p.max())  # true rows 0..max(p)-1
                B = b1 - b0
                # keys: [prefix rows | chain rows of these B anchors, n_chain each, anchor-major]
                ck = chain_keys[:, idx, :n_chain].reshape(g.num_kv_heads, B * n_chain, g.head_dim)
                cv = chain_values[:, idx, :n_chain].reshape(g.num_kv_heads, B * n_chain, g.head_dim)
                k_all = torch.cat([rows.keys[:, :prefix], ck], dim=1)
                v_all = torch.cat([rows.values[:, :prefix], cv], dim=1)
                mask_prefix = torch.arange(prefix, device=device)[None, :] < p[:, None]  # row j < p
                owner = torch.arange(B, device=device).repeat_interleave(n_chain)  # [B * n_chain]
                mask_chain = owner[None, :] == torch.arange(B, device=device)[:, None]
                mask = torch.cat([mask_prefix, mask_chain], dim=1)
                attn[:, b0:b1] = self._attend(query[:, b0:b1], k_all, v_all, mask)
            new_state = self.finish_row(z, attn, gate)
            state = state.clone()
            state[alive] = new_state
            drafted = self._argmax_chunked(new_state, logits_budget, confidence)
            tokens[alive, step - 1], logprobs[alive, step - 1] = drafted[0], drafted[1]
            if confidence:
                sure[alive, step - 1] = drafted[2]
                stop_low(alive, step)
            if kept is not None:
                kept[alive, step - 1] = new_state
        return finish(Drafts(anchors=anchors, depths=depths, tokens=tokens, logprobs=logprobs, states=kept,
                             confidence=sure))

    @torch.no_grad()
    def decode_step(self, rows: RowPass, prefix: int, hidden: Tensor, tokens: Tensor, positions: Tensor):
        """One serving-style draft step for B independent queries, each seeing rows 0..prefix-1 and itself.

        hidden: [B, H] (h or m), tokens: [B], positions: [B] ->
        (states [B, H], argmax ids [B], their log-softmax [B]). What `probe` times as one draft step.
        """
        B = hidden.shape[0]
        z = self.fc_input(hidden, tokens.to(self.device))
        query, gate, key, value = self.attention_inputs(z, positions.to(self.device))
        k_all = torch.cat([rows.keys[:, :prefix], key], dim=1)
        v_all = torch.cat([rows.values[:, :prefix], value], dim=1)
        own = torch.eye(B, dtype=torch.bool, device=self.device)
        mask = torch.cat([torch.ones(B, prefix, dtype=torch.bool, device=self.device), own], dim=1)
        states = self.finish_row(z, self._attend(query, k_all, v_all, mask), gate)
        ids, lps = self._argmax_chunked(states, LOGITS_BUDGET)
        return states, ids, lps

    def _anchor_block(self, max_prefix: int, n_chain: int, budget: int) -> int:
        """Anchors per attention block so that [nh, block, prefix + block * n_chain] stays within budget."""
        nh = self.geometry.num_heads
        block = max(1, budget // (nh * max(1, max_prefix)))
        while block > 1 and nh * block * (max_prefix + block * n_chain) > budget:
            block //= 2
        return block

    def _argmax_chunked(self, states: Tensor, budget: int, confidence: bool = False) -> tuple[Tensor, ...]:
        """states: [n, H] -> (argmax token [n] int64, its log-softmax [n] fp32[, llama.cpp's p [n] fp64 when
        confidence]), vocab chunked by rows."""
        n = states.shape[0]
        rows = max(1, budget // self.geometry.vocab_size)
        ids = torch.empty(n, dtype=torch.long, device=self.device)
        lps = torch.empty(n, dtype=torch.float32, device=self.device)
        sure = torch.empty(n, dtype=torch.float64, device=self.device) if confidence else None
        for r0 in range(0, n, rows):
            logits = self.logits(states[r0 : r0 + rows])
            best, idx = logits.max(dim=-1)
            ids[r0 : r0 + rows] = idx
            if sure is not None:
                sure[r0 : r0 + rows] = draft_confidence(logits)
            lps[r0 : r0 + rows] = -log_sum_exp_shifted_(logits, best)
        return (ids, lps) if sure is None else (ids, lps, sure)


def draft_confidence(logits: Tensor) -> Tensor:
    """logits [n, V] -> [n] float64: llama.cpp's probability of the argmax draft, the softmax at temperature 1
    over the DRAFT_TOP_K largest logits (module doc): 1 / Σ_{j < 10} exp(l_(j) - l_(0)).

    Worked example, logits (5, 4, 3) and 997 more at 0: the top ten are (5, 4, 3, 0 x 7), so
    p = 1 / (1 + e^-1 + e^-2 + 7 e^-5) = 0.645, where the whole vocabulary's softmax gives 0.122 — llama.cpp's
    sampler truncates before it normalises.
    """
    top = logits.topk(min(DRAFT_TOP_K, logits.shape[-1]), dim=-1).values.double()  # sorted, descending
    return 1.0 / torch.exp(top - top[:, :1]).sum(dim=-1)


def log_sum_exp_shifted_(logits: Tensor, rowmax: Tensor) -> Tensor:
    """log Σ exp(logits - rowmax) per row, computing in place (logits [n, V] is consumed, rowmax [n]
    its row maxima): logsumexp without another pass for the maxima or another [n, V] buffer."""
    return logits.sub_(rowmax[:, None]).exp_().sum(-1).log_()


def build_head(geometry: HeadGeometry, head_tensors: dict[str, Tensor], embed_tokens: Tensor, lm_head: Tensor) -> MtpHead:
    """The head on the device and dtype of the borrowed lm_head (the last device under a device map,
    where the target's final hidden states come out)."""
    dtype, device = lm_head.dtype, lm_head.device
    tensors = {k: v.to(device=device, dtype=dtype) for k, v in head_tensors.items()}
    return MtpHead(geometry, tensors, embed_tokens, lm_head).eval()
