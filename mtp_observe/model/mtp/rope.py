"""The head's rotary embedding: the target's rope_parameters (default, linear, yarn), rotate-half pairs on the first
rotary_dim dims (Qwen3.5, Qwen3-Next, GLM-4.5), or GPT-J interleaved pairs (DeepSeek's MLA rope part).

Rotary scaling: the head gets the target's rope_parameters, as the engines give it (vLLM builds the MTP layer's
attention with `get_rope(rope_parameters=config.rope_parameters)`): "default", "linear" (frequencies / factor) and
"yarn", whose scaled inverse frequencies and attention factor on cos/sin follow transformers'
`modeling_rope_utils._compute_yarn_parameters` line for line (`rotary_frequencies`). checkpoint.py refuses any other
rope type for the head. DeepSeek's MLA also scales its softmax by mscale(factor, mscale_all_dim)^2 (`softmax_scale`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..families import HeadGeometry


def rotary_inv_freq(rotary_dim: int, theta: float, device=None) -> Tensor:
    """[rotary_dim / 2] inverse frequencies, as transformers computes them for Qwen3.5."""
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim))


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """0.1 * mscale * ln(scale) + 1 (1 for scale <= 1): transformers' get_mscale / yarn_get_mscale, vLLM's
    yarn_get_mscale (deepseek_v2.py:437-442)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


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

    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = float(yarn_mscale(factor, rope.mscale) / yarn_mscale(factor, rope.mscale_all_dim))
        else:
            attention_factor = yarn_mscale(factor)
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


def softmax_scale(g: HeadGeometry) -> float:
    """The attention's softmax scale: d^-0.5; DeepSeek's MLA with a scaled rope multiplies qk_head_dim^-0.5 by
    mscale(factor, mscale_all_dim)^2 (vLLM deepseek_v2.py:1044, 1129-1136; transformers yarn_apply_mscale,
    modeling_deepseek_v3.py:268-274, 405). Worked example, DeepSeek-V3 (192, factor 40, mscale_all_dim 1):
    192^-0.5 * 1.368888^2 = 0.135234."""
    scale = g.head_dim ** -0.5
    if g.mla is not None and g.rope.rope_type != "default" and g.rope.mscale_all_dim:
        factor = g.rope.factor if g.rope.factor is not None else \
            g.rope.max_position_embeddings / g.rope.original_max_position_embeddings
        scale *= yarn_mscale(factor, g.rope.mscale_all_dim) ** 2
    return scale


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


def apply_interleaved_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the pairs (x[2i], x[2i+1]) by frequency i (GPT-J pairing) and return them de-interleaved,
    cat[x_even·cos - x_odd·sin, x_odd·cos + x_even·sin], as transformers' apply_rotary_pos_emb_interleave
    (modeling_deepseek_v3.py:310-346). vLLM's is_neox_style=False rotation keeps the pairs interleaved; q and k
    are permuted alike, so every q·k is the same.

    x: [heads, n, r]; cos, sin: [n, r] in the [f, f] layout (rotary_cos_sin).
    Worked example, r = 2, angle a: (x0, x1) -> (x0 cos a - x1 sin a, x1 cos a + x0 sin a).
    """
    half = cos.shape[-1] // 2
    c, s = cos[..., :half], sin[..., :half]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.cat([even * c - odd * s, odd * c + even * s], dim=-1)
