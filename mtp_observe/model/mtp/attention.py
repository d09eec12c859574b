"""The head's attention variants, chosen by the geometry (a family is data, not a copy of the head).

Each turns the normed residual x [n, H] at given cos/sin into (query [nh, n, dk], gate or None, key [nkv, n, dk],
value [nkv, n, dv]) — the keys and values the head's own cache keeps — and an attention output [nh, n, dv] back
into the residual stream [n, H]. The softmax itself (causal mask, chunking, the chain's block mask) is the head's.

  GatedAttention  Qwen3.5 / Qwen3-Next (transformers' Qwen3_5Attention, Qwen3NextAttention): q_proj's output
                  viewed [nh, 2d] and split per head into query and output gate; q_norm / k_norm over d before
                  RoPE; partial rotate-half rotary; o_proj(attn * sigmoid(gate))
  GqaAttention    GLM-4.5 (vLLM glm4_moe.py:223-318 Glm4MoeAttention; transformers Glm4MoeAttention,
                  modeling_glm4_moe.py:174-250): q/k/v with bias when attention_bias, plain-RMSNorm q_norm / k_norm
                  over d before RoPE when use_qk_norm (glm4_moe.py:296-315), rotate-half on the first
                  partial_rotary_factor · d dims (neox style, the get_rope default), no output gate
  MlaAttention    DeepSeek-V3 (vLLM deepseek_v2.py:1000-1246 DeepseekV2MLAAttention; transformers
                  DeepseekV3Attention, modeling_deepseek_v3.py:349-483):
                      q          = q_b_proj(N(q_a_proj(x); q_a_layernorm))     [n, nh, nope + rope]
                      c, k_rot   = kv_a_proj_with_mqa(x) split [kv_lora_rank | rope]; c = N(c; kv_a_layernorm)
                      k_nope, v  = kv_b_proj(c) viewed [n, nh, nope + v] split
                      q_rot, k_rot rotated in GPT-J pairs (one k_rot shared by every head)
                      key        = cat[k_nope, k_rot]; query = cat[q_nope, q_rot]  (the no-rope part first)
                  the softmax scaled by qk_head_dim^-0.5 · mscale² (rope.softmax_scale). The head caches the keys
                  and values expanded per head (transformers' expand_kv); vLLM caches the latent c and k_rot and
                  absorbs kv_b_proj into the query, the same products in another order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..families import HeadGeometry
from .norms import NORMS
from .rope import apply_interleaved_rotary, apply_partial_rotary, softmax_scale


def causal_mask(q_positions: Tensor, k_positions: Tensor) -> Tensor:
    """[nq, nk] bool, True where query may attend key (key position <= query position).

    Explicit, because a default `is_causal` mask is top-left aligned and wrong as soon as
    the cache already holds keys (a query chunk after the first).
    """
    return k_positions[None, :] <= q_positions[:, None]


def _param(t: Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


class _Attention(nn.Module):
    """What every variant exposes: its cache's shape and its softmax scale."""

    kv_heads: int  # heads of the cached keys and values
    key_dim: int
    value_dim: int
    scale: float
    names: tuple[str, ...]  # the checkpoint names (under self_attn.) of its tensors, attribute = name with "." -> "_"

    def _take(self, tensors: dict[str, Tensor], prefix: str, names) -> None:
        self.names = tuple(names)
        for name in self.names:
            setattr(self, name.removesuffix(".weight").replace(".", "_"), _param(tensors[prefix + name]))

    def named_weights(self, prefix: str) -> dict[str, Tensor]:
        return {prefix + n: getattr(self, n.removesuffix(".weight").replace(".", "_")) for n in self.names}


class GatedAttention(_Attention):
    """Qwen3.5's gated full attention (module doc)."""

    def __init__(self, g: HeadGeometry, tensors: dict[str, Tensor], prefix: str):
        super().__init__()
        self.g, self.norm = g, NORMS[g.norm]
        self._take(tensors, prefix, [f"{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")])
        self.kv_heads, self.key_dim, self.value_dim, self.scale = g.num_kv_heads, g.head_dim, g.head_dim, g.head_dim ** -0.5

    def project(self, x: Tensor, cos: Tensor, sin: Tensor):
        """x: [n, H] normed -> query [nh, n, d], gate [n, nh d], key [nkv, n, d], value [nkv, n, d]."""
        g, n, eps = self.g, x.shape[0], self.g.rms_norm_eps
        query_and_gate = F.linear(x, self.q_proj).view(n, g.num_heads, 2 * g.head_dim)
        query, gate = query_and_gate.chunk(2, dim=-1)  # per head: [q_h | gate_h]
        gate = gate.reshape(n, g.num_heads * g.head_dim)
        query = self.norm(query, self.q_norm, eps).transpose(0, 1)  # [nh, n, d]
        key = self.norm(F.linear(x, self.k_proj).view(n, g.num_kv_heads, g.head_dim), self.k_norm, eps).transpose(0, 1)
        value = F.linear(x, self.v_proj).view(n, g.num_kv_heads, g.head_dim).transpose(0, 1)
        return apply_partial_rotary(query, cos, sin), gate, apply_partial_rotary(key, cos, sin), value

    def output(self, attn: Tensor, gate: Tensor | None) -> Tensor:
        """attn: [nh, n, d] -> [n, H]."""
        attn = attn.transpose(0, 1).reshape(attn.shape[1], -1)
        return F.linear(attn * torch.sigmoid(gate), self.o_proj)


class GqaAttention(_Attention):
    """GLM-4.5's attention (module doc)."""

    def __init__(self, g: HeadGeometry, tensors: dict[str, Tensor], prefix: str):
        super().__init__()
        self.g, self.norm = g, NORMS[g.norm]
        names = [f"{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        names += [f"{n}.bias" for n in ("q_proj", "k_proj", "v_proj")] if g.attention_bias else []
        names += ["q_norm.weight", "k_norm.weight"] if g.qk_norm else []
        self._take(tensors, prefix, names)
        self.kv_heads, self.key_dim, self.value_dim, self.scale = g.num_kv_heads, g.head_dim, g.head_dim, g.head_dim ** -0.5

    def _linear(self, x: Tensor, name: str) -> Tensor:
        return F.linear(x, getattr(self, name), getattr(self, name + "_bias") if self.g.attention_bias else None)

    def project(self, x: Tensor, cos: Tensor, sin: Tensor):
        """x: [n, H] normed -> query [nh, n, d], None, key [nkv, n, d], value [nkv, n, d]."""
        g, n, eps = self.g, x.shape[0], self.g.rms_norm_eps
        query = self._linear(x, "q_proj").view(n, g.num_heads, g.head_dim)
        key = self._linear(x, "k_proj").view(n, g.num_kv_heads, g.head_dim)
        value = self._linear(x, "v_proj").view(n, g.num_kv_heads, g.head_dim).transpose(0, 1)
        if g.qk_norm:  # before RoPE
            query, key = self.norm(query, self.q_norm, eps), self.norm(key, self.k_norm, eps)
        query, key = query.transpose(0, 1), key.transpose(0, 1)
        return apply_partial_rotary(query, cos, sin), None, apply_partial_rotary(key, cos, sin), value

    def output(self, attn: Tensor, gate: Tensor | None) -> Tensor:
        return F.linear(attn.transpose(0, 1).reshape(attn.shape[1], -1), self.o_proj)


class MlaAttention(_Attention):
    """DeepSeek-V3's multi-head latent attention (module doc)."""

    def __init__(self, g: HeadGeometry, tensors: dict[str, Tensor], prefix: str):
        super().__init__()
        self.g, self.m, self.norm = g, g.mla, NORMS[g.norm]
        q = ["q_proj.weight"] if self.m.q_lora_rank is None else ["q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight"]
        self._take(tensors, prefix, q + ["kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight",
                                         "o_proj.weight"])
        self.kv_heads, self.key_dim, self.value_dim = g.num_heads, self.m.qk_head_dim, self.m.v_head_dim
        self.scale = softmax_scale(g)

    def project(self, x: Tensor, cos: Tensor, sin: Tensor):
        """x: [n, H] normed -> query [nh, n, nope + rope], None, key [nh, n, nope + rope], value [nh, n, v]."""
        g, m, n, eps = self.g, self.m, x.shape[0], self.g.rms_norm_eps
        if m.q_lora_rank is None:
            q = F.linear(x, self.q_proj)
        else:  # the low-rank layernorms take rms_norm_eps, as vLLM builds them (deepseek_v2.py:1082, 1098)
            q = F.linear(self.norm(F.linear(x, self.q_a_proj), self.q_a_layernorm, eps), self.q_b_proj)
        q = q.view(n, g.num_heads, m.qk_head_dim).transpose(0, 1)  # [nh, n, qk]
        q_nope, q_rot = q.split([m.qk_nope_head_dim, m.qk_rope_head_dim], dim=-1)
        compressed, k_rot = F.linear(x, self.kv_a_proj_with_mqa).split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        kv = F.linear(self.norm(compressed, self.kv_a_layernorm, eps), self.kv_b_proj)
        kv = kv.view(n, g.num_heads, m.qk_nope_head_dim + m.v_head_dim).transpose(0, 1)
        k_nope, value = kv.split([m.qk_nope_head_dim, m.v_head_dim], dim=-1)
        q_rot = apply_interleaved_rotary(q_rot, cos, sin)
        k_rot = apply_interleaved_rotary(k_rot[None], cos, sin).expand(g.num_heads, -1, -1)  # one rope key for all heads
        return torch.cat([q_nope, q_rot], -1), None, torch.cat([k_nope, k_rot], -1), value.contiguous()

    def output(self, attn: Tensor, gate: Tensor | None) -> Tensor:
        return F.linear(attn.transpose(0, 1).reshape(attn.shape[1], -1), self.o_proj)


def build_attention(g: HeadGeometry, tensors: dict[str, Tensor], prefix: str) -> _Attention:
    """The variant the geometry names; `prefix` ends in "self_attn."."""
    return {"gated": GatedAttention, "gqa": GqaAttention, "mla": MlaAttention}[g.attention](g, tensors, prefix)
