"""The head's RMSNorms: zero-centred (Qwen3.5, Qwen3-Next) and plain (DeepSeek-V3, GLM-4.5), each in fp32, cast back."""

from __future__ import annotations

import torch
from torch import Tensor


def zero_centred_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """N(x; w) = x * rsqrt(mean(x^2) + eps) * (1 + w), in fp32, cast back.  x: [..., D], w: [D].

    Worked example: x = [3, 4], w = [0, 1], eps = 0: rms = sqrt(12.5) = 3.5355;
    N = [3/3.5355 * 1, 4/3.5355 * 2] = [0.8485, 2.2627].
    """
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (1.0 + weight.float())).to(x.dtype)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """N(x; w) = w * (x * rsqrt(mean(x^2) + eps)), normalised in fp32 and cast back before the weight, as
    transformers' DeepseekV3RMSNorm / Glm4MoeRMSNorm and vLLM's RMSNorm.forward_native do.  x: [..., D], w: [D].

    Worked example: x = [3, 4], w = [0, 1], eps = 0: [0, 4/3.5355] = [0, 1.1314].
    """
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


NORMS = {"zero_centred": zero_centred_rms_norm, "plain": rms_norm}
