"""FP8 numerics as served: block-FP8 linears that quantise their activations (W8A8) the way vLLM's kernel for the
device does, and weights re-quantised to power-of-two block scales where vLLM does that at load.

Contract (the rules, their sources and what is not modelled are in serving.py's docstring):
    quantise_activations(x, rule, group) -> x_hat   [..., K] -> [..., K]: the value the FP8 GEMM multiplies, q * s
                                                    per token and group of `group` channels, exactly as the rule
                                                    (serving.ACTIVATION_RULES) computes q and s
    requantise_ue8m0(w, block) -> w_hat             a dequantised block-FP8 weight [..., R, C] re-quantised to
                                                    power-of-two scales per block (vLLM's DeepGEMM path at load)
    w8a8(weight, rule) -> Tensor                    the weight as a tensor whose F.linear quantises its input first
    wrap_linears(module, rules) -> int              the named nn.Linear weights of a module made w8a8

Why a tensor: the target's linears are transformers' nn.Linear and the head's are F.linear calls on its own
parameters; a weight that carries its rule makes both quantise their inputs without either module knowing
(one mechanism for both, no change to the head's code). The rule is a class attribute (one subclass per rule),
so it survives .to(), detach() and nn.Parameter; any other use of the weight is an ordinary tensor's.

The GEMM itself runs in the replay's dtype on the quantised values (in fp32 on a CPU: products of e4m3 values and
scales exact, fp32 accumulation in torch's order — the tensor cores' accumulation order and precision are not
modelled); the output is not rounded to bfloat16 as the kernels' is.

Worked example ("amax/448", group 4): x = [1.0, -2.0, 0.5, 3.0] -> amax 3, scale 3 / 448 = 0.0066964...;
x / scale = [149.33, -298.67, 74.67, 448] -> e4m3 (3 mantissa bits: steps of 8 in [64, 128), 16 in [128, 256),
32 in [256, 448]) [144, -288, 72, 448] -> x_hat = [0.9643, -1.9286, 0.4821, 3.0]. With "ue8m0" the scale is
2^ceil(log2(0.0066964)) = 2^-7 = 0.0078125: x / scale = [128, -256, 64, 384], all exact in e4m3 -> x_hat = x.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .serving import ACTIVATION_RULES, LinearRule

E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max (vLLM get_fp8_min_max on CUDA)
EPS = 1e-10  # per_token_group_quant_fp8's eps: the group's amax is at least this
SCALE_FLOOR = 1e-10  # the UE8M0 rounding's floor: exp2(ceil(log2(max(|s|, 1e-10))))
WEIGHT_AMAX_FLOOR = 1e-4  # per_block_cast_to_fp8: x_amax.clamp(1e-4)


def _e4m3(x: Tensor) -> Tensor:
    """Round fp32 to e4m3 (nearest even) and back: vLLM's c10::Float8_e4m3fn conversion after its clamp."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()


def _pow2_ceil(s: Tensor) -> Tensor:
    return torch.exp2(torch.ceil(torch.log2(s.abs().clamp(min=SCALE_FLOOR))))


def quantise_activations(x: Tensor, rule: str, group: int) -> Tensor:
    """x [..., K] -> x_hat [..., K] in x's dtype: per token (row) and group of `group` consecutive channels, the
    dequantised FP8 value q * s of `rule` (serving.ACTIVATION_RULES):
        "amax/448"  amax = max(eps, max |x|), s = amax / 448, q = e4m3(clamp(x / s))      vLLM per_token_group_quant_fp8
        "ue8m0"     s = 2^ceil(log2(amax / 448)), q = e4m3(clamp(x / s))                 its use_ue8m0 variant
        "448/amax"  amax = max |x|, q_scale = 448 / amax (1 when amax is 0), q = e4m3(x * q_scale), s = 1 / q_scale
                                                                                         FlashInfer's scale_1x128_kernel
        "none"      x unchanged
    A last group shorter than `group` (K not a multiple: vLLM's W8A8 kernels need K % 128 == 0 and fall back to
    others; see serving.py) is a group of its own."""
    assert rule in ACTIVATION_RULES, rule
    if rule == "none":
        return x
    K = x.shape[-1]
    rows = x.reshape(-1, K).float()
    pad = (-K) % group
    if pad:
        rows = F.pad(rows, (0, pad))  # zeros change no group's amax
    groups = rows.view(rows.shape[0], -1, group)
    amax = groups.abs().amax(dim=-1, keepdim=True)
    if rule == "448/amax":
        q_scale = torch.where(amax != 0, E4M3_MAX / amax.clamp(min=torch.finfo(torch.float32).tiny), torch.ones_like(amax))
        q = _e4m3(groups * q_scale)
        scale = 1.0 / q_scale
    else:
        scale = amax.clamp(min=EPS) / E4M3_MAX
        if rule == "ue8m0":
            scale = _pow2_ceil(scale)
        q = _e4m3(groups / scale)
    out = (q * scale).view(rows.shape[0], -1)[:, :K]
    return out.reshape(x.shape).to(x.dtype)


def requantise_ue8m0(w: Tensor, block: tuple[int, int]) -> Tensor:
    """A dequantised block-FP8 weight w [..., R, C] (fp32) -> its value after vLLM's requant_weight_ue8m0_inplace
    (quantization/utils/fp8_utils.py:1096-1154 with vllm/utils/deep_gemm.py:1027-1046 per_block_cast_to_fp8): per
    block, amax = max(1e-4, max |w|), s = 2^ceil(log2(amax / 448)), q = e4m3(w * (1 / s)); returns q * s (fp32).
    Partial last blocks are blocks of their own (vLLM pads with zeros)."""
    br, bc = block
    *lead, R, C = w.shape
    w = w.float().reshape(-1, R, C)
    pr, pc = (-R) % br, (-C) % bc
    padded = F.pad(w, (0, pc, 0, pr))
    n, Rp, Cp = padded.shape
    view = padded.view(n, Rp // br, br, Cp // bc, bc)
    amax = view.abs().amax(dim=(2, 4), keepdim=True).clamp(min=WEIGHT_AMAX_FLOOR)
    scale = _pow2_ceil(amax / E4M3_MAX)
    q = (view * (1.0 / scale)).to(torch.float8_e4m3fn).float()  # |w| / s <= 448 by construction: no clamp
    return (q * scale).view(n, Rp, Cp)[:, :R, :C].reshape(*lead, R, C)


class W8A8Weight(torch.Tensor):
    """A block-FP8 linear's weight (its serving value) whose F.linear quantises the input by `rule` first."""

    rule: LinearRule  # set on the subclass made for each rule (w8a8)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and len(args) >= 2 and isinstance(args[1], W8A8Weight):
            x, weight, rest = args[0], args[1], args[2:]
            rule = type(weight).rule
            with torch._C.DisableTorchFunctionSubclass():
                return F.linear(quantise_activations(x, rule.activations, rule.group), weight, *rest, **kwargs)
        return super().__torch_function__(func, types, args, kwargs)


_SUBCLASSES: dict[LinearRule, type] = {}


def w8a8(weight: Tensor, rule: LinearRule) -> Tensor:
    """The weight (sharing its storage) as a W8A8Weight of `rule`; unchanged when the rule quantises nothing."""
    if rule.activations == "none":
        return weight
    if rule not in _SUBCLASSES:
        _SUBCLASSES[rule] = type(f"W8A8Weight[{rule.activations}]", (W8A8Weight,), {"rule": rule})
    plain = weight.as_subclass(torch.Tensor) if isinstance(weight, W8A8Weight) else weight
    return plain.as_subclass(_SUBCLASSES[rule])


def rule_of(weight: Tensor) -> LinearRule | None:
    return type(weight).rule if isinstance(weight, W8A8Weight) else None


def wrap_linears(module: torch.nn.Module, rules: dict[str, LinearRule]) -> int:
    """Make the weight of every nn.Linear named in `rules` (its qualified module name) a w8a8 weight; -> how many.
    Every name must be an nn.Linear of the module (else the checkpoint's names and the module's disagree: an
    internal error, asserted)."""
    modules = dict(module.named_modules())
    wrapped = 0
    for name, rule in rules.items():
        linear = modules.get(name)
        assert isinstance(linear, torch.nn.Linear), f"{name}: a block-FP8 weight without an nn.Linear in the target"
        if rule.activations == "none":
            continue
        linear.weight = torch.nn.Parameter(w8a8(linear.weight.data, rule), requires_grad=False)
        wrapped += 1
    return wrapped
