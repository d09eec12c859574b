"""The quantisers: each weight format's quantise and dequantise, as the format's own tools define them.

Contract: pure functions on tensors, no model. `round_trip(w, fmt)` returns the serving value (float32) of a
weight stored in format `fmt`: quantised, then dequantised as the engine reads it; `stored_bytes(shape, fmt)`
is what the format stores for a tensor of that shape (codes and scales), the roofline's bytes. Blocks run
along the last dimension (a Hugging Face weight [out, in] is blocked along `in`, which is ggml's ne[0]);
block-FP8 blocks the last two. Everything is computed in float32 with plain elementwise operations (no fused
multiply-adds) and explicit sequential sums where the reference sums sequentially, so the GGUF codes are the
C reference's bit for bit on a CPU (tests/test_quantisers.py pins them); divisors are tensors, never Python
scalars (CUDA turns `t / 127.0` into `t * (1 / 127.0)`), but a GPU's bits are not checked.

Formats (the names `precisions.py` uses):

    bf16, f16      a cast (round to nearest even) and back; f32 is the identity
    fp8_block      block-FP8 as the released FP8 checkpoints store it (DeepSeek-V3 / Qwen *-FP8): e4m3 codes,
                   one float32 `weight_scale_inv` per 128 x 128 block (partial blocks at the edges), scale =
                   block amax / 448, code = e4m3(w / scale) (round to nearest even, clamped to +-448);
                   served value code * scale (DeepSeek-V3 inference/kernel.py `weight_dequant_kernel`,
                   weights.dequantize_blockwise). An all-zero block: codes 0, served 0 (DeepSeek's
                   `weight_quant_kernel` and ModelOpt divide 0 / 0 there; vLLM's `per_block_cast_to_fp8`
                   clamps amax at 1e-4; every one serves zeros).
    int8_channel   INT8, symmetric, one scale per output channel (row), as compressed-tensors computes it for
                   llm-compressor's W8A8 / W8A16 schemes (src/compressed_tensors/quantization/utils/helpers.py
                   `calculate_qparams`: scale = amax / ((127 - (-128)) / 2) = amax / 127.5, a zero scale
                   replaced by eps; quant_args.py `round_to_quantized_type_args`: round(clamp(w / scale,
                   -128, 127)), half to even; served code * scale). compressed-tensors computes in the weight's
                   dtype (bf16 for a bf16 model, which moves a few codes by one); here in float32.
    nvfp4          NVFP4 as NVIDIA Model-Optimizer exports it (modelopt/torch/quantization/qtensor/
                   nvfp4_tensor.py, NVFP4QTensor): a float32 per-tensor `weight_scale_2` = amax / (6 * 448)
                   (`get_weights_scaling_factor_2`), per 16 values an e4m3 `weight_scale` = e4m3(clamp(
                   amax16 / (6 * weight_scale_2), 2^-9, 448)) with an all-zero block's scale 1
                   (`get_weights_scaling_factor`, `_cast_per_block_scale_to_fp8`), E2M1 codes of
                   w / (weight_scale * weight_scale_2) rounded to nearest with ties to the even code
                   (`_cast_fp4`: searchsorted over [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5], ties at 0.75 /
                   1.75 / 3.5 up), two per byte, the even element in the low nibble; served value
                   e2m1[code] * (weight_scale * weight_scale_2) (`dequantize`). A last dimension not a
                   multiple of 16 is padded with zeros (`reduce_block_padding`). `global_amax` lets modules
                   that serving fuses share one weight_scale_2 (ModelOpt's `preprocess_linear_fusion`: the
                   max of their amaxes). An all-zero tensor (ModelOpt: 0 / 0, NaN scales) serves zeros here.
    q8_0, q5_0, q6_k, q4_k
                   GGUF blocks as llama.cpp packs them without an importance matrix — llama-quantize's path
                   (src/llama-quant.cpp `llama_tensor_quantize_impl` -> ggml `quantize_q*` -> the `_ref`
                   functions). Transcribed from ggml-org/ggml@d99724f2 src/ggml-quants.c:
                   `quantize_row_q8_0_ref` / `dequantize_row_q8_0` (32 values: fp16 d = amax / 127, codes
                   roundf(x * (1 / d)), half away from zero), `quantize_row_q5_0_ref` / `dequantize_row_q5_0`
                   (32 values: fp16 d = max / -16, codes min(31, trunc(x / d + 16.5)), 5 bits split into
                   nibbles and a 32-bit high-bit word), `quantize_row_q6_K_ref` with `make_qx_quants`
                   (rmse_type 1) / `dequantize_row_q6_K` (256 values: 16 sub-blocks of 16, 6-bit codes,
                   int8 sub-block scales, fp16 d), `quantize_row_q4_K_ref` with `make_qkx2_quants` and
                   `get_scale_min_k4` / `dequantize_row_q4_K` (256 values: 8 sub-blocks of 32, 4-bit codes,
                   6-bit scales and mins packed in 12 bytes, fp16 d and dmin); `nearest_int` is round half to
                   even. Block structs: ggml-common.h (`block_q8_0` 34 bytes, `block_q5_0` 22, `block_q6_K`
                   210 with d last, `block_q4_K` 144). A row whose length is not a multiple of the block is
                   refused here: llama-quantize falls back to another type first (precisions.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

F32 = torch.float32


@dataclass(frozen=True)
class Format:
    name: str
    block: int  # values per block along the last dimension (1: elementwise; fp8_block: 128 x 128)
    block_bytes: float  # bytes per block (codes and the block's own scales)
    about: str


FORMATS = {f.name: f for f in (
    Format("f32", 1, 4, "float32"),
    Format("bf16", 1, 2, "bfloat16"),
    Format("f16", 1, 2, "float16"),
    Format("fp8_block", 128 * 128, 128 * 128 + 4, "e4m3, a float32 scale per 128x128 block"),
    Format("int8_channel", 1, 1, "int8, a bf16 scale per output channel"),
    Format("nvfp4", 16, 8 + 1, "E2M1 codes, an e4m3 scale per 16 values, a float32 scale per tensor"),
    Format("q8_0", 32, 34, "GGUF Q8_0"),
    Format("q5_0", 32, 22, "GGUF Q5_0"),
    Format("q6_k", 256, 210, "GGUF Q6_K"),
    Format("q4_k", 256, 144, "GGUF Q4_K"),
)}
GGUF = ("q8_0", "q5_0", "q6_k", "q4_k")
QK8_0 = QK5_0 = 32
QK_K = 256
GROUP_MAX_EPS = 1e-15  # ggml-quants.c: a (sub-)block whose largest |x| is below this is all zero
FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_BLOCK = (128, 128)
E2M1_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # nvfp4_tensor.py e2m1_bounds
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)  # code 8 (minus zero) serves +0, as ModelOpt's table
NVFP4_BLOCK = 16
CHUNK = 1 << 20  # GGUF values quantised at once (a multiple of every block): bounds the temporaries


def stored_bytes(shape: tuple[int, ...], fmt: str) -> int:
    """Bytes a tensor of `shape` occupies in `fmt` (codes and scales; ragged edges as the format pads them)."""
    f = FORMATS[fmt]
    n = math.prod(shape)
    if fmt == "fp8_block":
        *lead, R, C = shape if len(shape) >= 2 else (1, *shape)
        blocks = math.prod(lead) * -(-R // FP8_BLOCK[0]) * -(-C // FP8_BLOCK[1])
        return n + 4 * blocks
    if fmt == "int8_channel":
        return n + 2 * (n // shape[-1])  # a bf16 scale per row
    if fmt == "nvfp4":
        rows, C = n // shape[-1], shape[-1]
        padded = -(-C // NVFP4_BLOCK) * NVFP4_BLOCK
        return rows * (padded // 2 + padded // NVFP4_BLOCK) + 4  # codes, e4m3 scales, weight_scale_2
    assert n % f.block == 0, (shape, fmt)
    return int(n // f.block * f.block_bytes)


def round_trip(w: Tensor, fmt: str, global_amax: Tensor | None = None) -> Tensor:
    """The serving value (float32, w's shape) of w stored in `fmt` (module doc). global_amax: nvfp4 only."""
    x = w.to(F32)
    if fmt == "f32":
        return x.clone()
    if fmt in ("bf16", "f16"):
        return x.to(torch.bfloat16 if fmt == "bf16" else torch.float16).to(F32)
    if fmt == "fp8_block":
        return fp8_block_dequantise(*fp8_block_quantise(x))
    if fmt == "int8_channel":
        return int8_channel_dequantise(*int8_channel_quantise(x))
    if fmt == "nvfp4":
        return nvfp4_dequantise(*nvfp4_quantise(x, global_amax), columns=x.shape[-1])
    if fmt in GGUF:
        return gguf_dequantise(gguf_quantise(x, fmt), fmt).reshape(x.shape)
    raise ValueError(f"unknown format {fmt!r}")


def _t(value: float, like: Tensor) -> Tensor:
    """A float32 0-dim tensor on like's device (a tensor divisor divides; a Python one may be a reciprocal)."""
    return torch.tensor(value, dtype=F32, device=like.device)


# ---------------------------------------------------------------------------------------------
# Block-FP8 (128 x 128, float32 scales)


def fp8_block_quantise(w: Tensor, block: tuple[int, int] = FP8_BLOCK) -> tuple[Tensor, Tensor]:
    """w [..., R, C] -> (codes [..., R, C] float8_e4m3fn, weight_scale_inv [..., ceil(R/br), ceil(C/bc)] float32).

    Worked example, one 2 x 2 block [[1, -2], [0.5, 448]] (block (2, 2)): amax 448, scale 1, codes the values;
    [[0, 0], [0, 0]]: scale 0, codes 0."""
    br, bc = block
    x = w.to(F32)
    *lead, R, C = x.shape
    Rb, Cb = -(-R // br), -(-C // bc)
    padded = torch.zeros(*lead, Rb * br, Cb * bc, dtype=F32, device=x.device)
    padded[..., :R, :C] = x
    blocks = padded.reshape(*lead, Rb, br, Cb, bc)
    amax = blocks.abs().amax(dim=(-3, -1))  # [..., Rb, Cb]
    scale = amax / _t(FP8_MAX, amax)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    scaled = torch.where(scale[..., :, None, :, None] > 0, blocks / safe[..., :, None, :, None], torch.zeros_like(blocks))
    codes = scaled.clamp(-FP8_MAX, FP8_MAX).reshape(*lead, Rb * br, Cb * bc)[..., :R, :C]
    return codes.to(torch.float8_e4m3fn).contiguous(), scale.contiguous()


def fp8_block_dequantise(codes: Tensor, scale: Tensor, block: tuple[int, int] = FP8_BLOCK) -> Tensor:
    """codes [..., R, C] e4m3, scale [..., ceil(R/br), ceil(C/bc)] -> [..., R, C] float32: codes * their block's scale
    (weights.dequantize_blockwise's arithmetic: one product per value)."""
    br, bc = block
    R, C = codes.shape[-2:]
    expanded = scale.to(F32).repeat_interleave(br, dim=-2)[..., :R, :].repeat_interleave(bc, dim=-1)[..., :C]
    return codes.to(F32) * expanded


# ---------------------------------------------------------------------------------------------
# INT8 per output channel (compressed-tensors' symmetric rule)


def int8_channel_quantise(w: Tensor) -> tuple[Tensor, Tensor]:
    """w [..., C] -> (codes [..., C] int8, scale [..., 1] float32): scale = max |w_row| / 127.5 (eps where 0),
    code = round(clamp(w / scale, -128, 127)). Worked example, a row [1.275, -2.55, 0]: scale 0.02, codes
    [64 (63.75 rounds up), -128 (-127.5 half to even), 0]."""
    x = w.to(F32)
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = amax / _t(127.5, amax)
    scale = torch.where(scale == 0, _t(torch.finfo(F32).eps, scale), scale)
    codes = torch.round(torch.clamp(x / scale, -128.0, 127.0))
    return codes.to(torch.int8), scale


def int8_channel_dequantise(codes: Tensor, scale: Tensor) -> Tensor:
    return codes.to(F32) * scale


# ---------------------------------------------------------------------------------------------
# NVFP4 (ModelOpt export)


def nvfp4_quantise(w: Tensor, global_amax: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """w [..., C] -> (packed [..., ceil(C/16)*8] uint8, weight_scale [..., ceil(C/16)] e4m3, weight_scale_2 []
    float32). global_amax: the amax weight_scale_2 is computed from (default: this tensor's own)."""
    x = w.to(F32)
    C = x.shape[-1]
    padded_c = -(-C // NVFP4_BLOCK) * NVFP4_BLOCK
    if padded_c != C:
        x = torch.nn.functional.pad(x, (0, padded_c - C))
    amax = x.abs().amax() if global_amax is None else global_amax.to(device=x.device, dtype=F32)
    scale_2 = amax / _t(6.0 * FP8_MAX, amax)  # get_weights_scaling_factor_2: amax / (E2M1_MAX * E4M3_MAX)
    blocks = x.reshape(*x.shape[:-1], padded_c // NVFP4_BLOCK, NVFP4_BLOCK)
    block_amax = blocks.abs().amax(dim=-1)
    if float(amax) == 0.0:  # ModelOpt divides 0 / 0 here; an all-zero tensor serves zeros
        scale = torch.ones_like(block_amax)
        scale_2 = torch.ones_like(scale_2)
    else:
        scale = block_amax / (_t(6.0, amax) * scale_2)
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    scale = scale.clamp(min=2.0 ** -9, max=FP8_MAX).to(torch.float8_e4m3fn)
    scaled = blocks / (scale.to(F32) * scale_2)[..., None]
    codes = _e2m1_codes(scaled).reshape(*x.shape)
    packed = (codes[..., 1::2] << 4) | codes[..., 0::2]
    return packed.contiguous(), scale.contiguous(), scale_2


def _e2m1_codes(x: Tensor) -> Tensor:
    """float32 -> uint8 E2M1 codes (sign << 3 | magnitude index), nvfp4_tensor.py `_cast_fp4`: the index is the
    number of bounds below |x| (a value equal to a bound counts it as above), plus one at the odd bounds
    0.75, 1.75, 3.5, so every tie goes to the even magnitude code."""
    sign = (x < 0).to(torch.uint8)
    a = x.abs()
    bounds = torch.tensor(E2M1_BOUNDS, dtype=F32, device=x.device)
    index = torch.searchsorted(bounds, a.contiguous(), out_int32=True).to(torch.uint8)
    odd = (a[..., None] == bounds[[1, 3, 5]]).any(dim=-1).to(torch.uint8)
    return (sign << 3) + index + odd


def nvfp4_dequantise(packed: Tensor, scale: Tensor, scale_2: Tensor, columns: int | None = None) -> Tensor:
    """-> [..., C] float32: e2m1[code] * (float(weight_scale) * weight_scale_2), cropped to `columns`."""
    codes = torch.empty(*packed.shape[:-1], packed.shape[-1] * 2, dtype=torch.long, device=packed.device)
    codes[..., 0::2] = (packed & 0x0F).long()
    codes[..., 1::2] = (packed >> 4).long()
    values = torch.tensor(E2M1_VALUES, dtype=F32, device=packed.device)[codes]
    per_block = scale.to(F32) * scale_2
    blocks = values.reshape(*values.shape[:-1], -1, NVFP4_BLOCK) * per_block[..., None]
    out = blocks.reshape(values.shape)
    return out if columns is None else out[..., :columns]


# ---------------------------------------------------------------------------------------------
# GGUF (ggml-quants.c reference quantisers)


def gguf_quantise(x: Tensor, fmt: str) -> Tensor:
    """x: any shape, its values read row-major (blocks along the last dimension, which the block divides) ->
    uint8 [n_blocks, block bytes], the C structs' bytes. Chunked: each block is independent."""
    f = FORMATS[fmt]
    flat = x.to(F32).reshape(-1)
    if x.dim() and x.shape[-1] % f.block:
        raise ValueError(f"{fmt}: rows of {x.shape[-1]} values are not a multiple of its block of {f.block}")
    quantise = {"q8_0": quantize_q8_0, "q5_0": quantize_q5_0, "q6_k": quantize_q6_k, "q4_k": quantize_q4_k}[fmt]
    parts = [quantise(flat[i : i + CHUNK]) for i in range(0, flat.numel(), CHUNK)]
    return torch.cat(parts) if parts else torch.empty(0, int(f.block_bytes), dtype=torch.uint8, device=x.device)


def gguf_dequantise(blocks: Tensor, fmt: str) -> Tensor:
    """uint8 [n_blocks, block bytes] -> [n_blocks * block] float32 (the `dequantize_row_*` functions)."""
    dequantise = {"q8_0": dequantize_q8_0, "q5_0": dequantize_q5_0, "q6_k": dequantize_q6_k, "q4_k": dequantize_q4_k}[fmt]
    rows = CHUNK // FORMATS[fmt].block
    parts = [dequantise(blocks[i : i + rows]) for i in range(0, blocks.shape[0], rows)]
    return torch.cat(parts) if parts else torch.empty(0, dtype=F32, device=blocks.device)


def nearest_int(x: Tensor) -> Tensor:
    """ggml's nearest_int: x + 1.5 * 2^23 read back as an integer = round half to even (|x| < 2^22)."""
    return torch.round(x).to(torch.int32)


def _roundf(x: Tensor) -> Tensor:
    """C roundf: half away from zero, exactly (a - floor(a) is exact below 2^23)."""
    a = x.abs()
    whole = torch.floor(a)
    return torch.sign(x) * (whole + (a - whole >= 0.5).to(F32))


def _fp16_bytes(x: Tensor) -> Tensor:
    """[n] float32 -> [n, 2] uint8: GGML_FP32_TO_FP16 (round to nearest even), little endian."""
    return x.to(torch.float16).view(torch.int16).view(torch.uint8).reshape(-1, 2)


def _fp16_value(b: Tensor) -> Tensor:
    """[n, 2] uint8 -> [n] float32: GGML_FP16_TO_FP32."""
    return b.contiguous().view(torch.int16).view(torch.float16).reshape(-1).to(F32)


def _safe_inverse(d: Tensor) -> Tensor:
    """d ? 1 / d : 0, elementwise."""
    return torch.where(d != 0, _t(1.0, d) / torch.where(d != 0, d, torch.ones_like(d)), torch.zeros_like(d))


def _first_abs_max(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [B, n] -> (amax [B], the signed value of the first element reaching it [B]): the C loops'
    `if (ax > amax) { amax = ax; max = x[i]; }` from amax = 0."""
    amax = torch.zeros(x.shape[0], dtype=F32, device=x.device)
    signed = torch.zeros_like(amax)
    for i in range(x.shape[1]):
        ax = x[:, i].abs()
        bigger = ax > amax
        amax = torch.where(bigger, ax, amax)
        signed = torch.where(bigger, x[:, i], signed)
    return amax, signed


# -- q8_0 -----------------------------------------------------------------------------------


def quantize_q8_0(x: Tensor) -> Tensor:
    """quantize_row_q8_0_ref: x [n * 32] -> [n, 34] uint8 (fp16 d, int8 qs[32])."""
    x = x.reshape(-1, QK8_0)
    amax = x.abs().amax(dim=1)
    d = amax / _t(127.0, amax)
    q = _roundf(x * _safe_inverse(d)[:, None]).to(torch.int8)
    return torch.cat([_fp16_bytes(d), q.view(torch.uint8)], dim=1)


def dequantize_q8_0(b: Tensor) -> Tensor:
    d = _fp16_value(b[:, :2])
    return (b[:, 2:].contiguous().view(torch.int8).to(F32) * d[:, None]).reshape(-1)


# -- q5_0 (llama-quantize's fallback for a Q4_K tensor whose rows are not a multiple of 256) --------------------


def quantize_q5_0(x: Tensor) -> Tensor:
    """quantize_row_q5_0_ref: x [n * 32] -> [n, 22] uint8 (fp16 d, uint32 qh little endian, qs[16])."""
    x = x.reshape(-1, QK5_0)
    _, signed = _first_abs_max(x)
    d = signed / _t(-16.0, signed)
    shifted = x * _safe_inverse(d)[:, None] + _t(16.5, x)
    codes = torch.clamp(torch.trunc(shifted), max=31).to(torch.int32)  # MIN(31, (int8_t)(x0 + 16.5f))
    low, high = codes[:, :16], codes[:, 16:]
    qs = ((low & 0x0F) | ((high & 0x0F) << 4)).to(torch.uint8)
    bit = (torch.arange(32, device=x.device, dtype=torch.int64))
    qh = (((codes & 0x10) >> 4).to(torch.int64) << bit).sum(dim=1)  # bit j: element j's fifth bit (disjoint bits)
    qh_bytes = torch.stack([(qh >> (8 * i)) & 0xFF for i in range(4)], dim=1).to(torch.uint8)
    return torch.cat([_fp16_bytes(d), qh_bytes, qs], dim=1)


def dequantize_q5_0(b: Tensor) -> Tensor:
    d = _fp16_value(b[:, :2])
    qh = sum(b[:, 2 + i].to(torch.int64) << (8 * i) for i in range(4))  # [n]
    qs = b[:, 6:].to(torch.int64)
    j = torch.arange(16, device=b.device)
    high_0 = ((qh[:, None] >> j) << 4) & 0x10
    high_1 = (qh[:, None] >> (j + 12)) & 0x10
    x0 = ((qs & 0x0F) | high_0) - 16
    x1 = ((qs >> 4) | high_1) - 16
    return (torch.cat([x0, x1], dim=1).to(F32) * d[:, None]).reshape(-1)


# -- q6_K -----------------------------------------------------------------------------------


def make_qx_quants(x: Tensor, nmax: int) -> tuple[Tensor, Tensor]:
    """make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL) over B groups at once: x [B, n] ->
    (scale [B] float32, L [B, n] int32 in 0..2 nmax - 1). Sums run over i in order, as in C (element-major inside:
    row i of the transposed groups is contiguous)."""
    B, n = x.shape
    amax, signed = _first_abs_max(x)
    zero = amax < GROUP_MAX_EPS
    top = torch.where(zero, torch.ones_like(signed), signed)
    xt = x.t().contiguous()  # [n, B]
    weight = xt * xt  # rmse_type 1: w = x * x
    wx = weight * xt

    def trial(iscale: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        levels = nearest_int(iscale[None, :] * xt).clamp(-nmax, nmax - 1)  # [n, B]
        lf = levels.to(F32)
        lx, l2 = wx * lf, (weight * lf) * lf
        sumlx = torch.zeros(B, dtype=F32, device=x.device)
        suml2 = torch.zeros(B, dtype=F32, device=x.device)
        for i in range(n):
            sumlx = sumlx + lx[i]
            suml2 = suml2 + l2[i]
        return sumlx, suml2, levels + nmax

    sumlx, suml2, L = trial(_t(-float(nmax), x) / top)
    scale = torch.where(suml2 != 0, sumlx / torch.where(suml2 != 0, suml2, torch.ones_like(suml2)), torch.zeros_like(suml2))
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(_t(float(nmax), x) + _t(0.1, x) * _t(float(step), x)) / top
        sumlx, suml2, trial_L = trial(iscale)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        L = torch.where(better[None, :], trial_L, L)
        scale = torch.where(better, sumlx / torch.where(suml2 != 0, suml2, torch.ones_like(suml2)), scale)
        best = torch.where(better, scale * sumlx, best)
    L = L.t().contiguous()
    return torch.where(zero, torch.zeros_like(scale), scale), torch.where(zero[:, None], torch.zeros_like(L), L)


def quantize_q6_k(x: Tensor) -> Tensor:
    """quantize_row_q6_K_ref: x [n * 256] -> [n, 210] uint8 (ql[128], qh[64], int8 scales[16], fp16 d)."""
    x = x.reshape(-1, QK_K)
    nb = x.shape[0]
    sub = x.reshape(nb * 16, 16)
    scales, L = make_qx_quants(sub, 32)
    scales, L = scales.reshape(nb, 16), L.reshape(nb, 16, 16)
    max_abs = torch.zeros(nb, dtype=F32, device=x.device)
    max_scale = torch.zeros(nb, dtype=F32, device=x.device)
    for ib in range(16):  # the first sub-block scale of largest |scale|, strict '>'
        a = scales[:, ib].abs()
        bigger = a > max_abs
        max_abs = torch.where(bigger, a, max_abs)
        max_scale = torch.where(bigger, scales[:, ib], max_scale)
    empty = max_abs < GROUP_MAX_EPS
    iscale = _t(-128.0, x) / torch.where(empty, torch.ones_like(max_scale), max_scale)
    d_value = _t(1.0, x) / iscale
    d_bytes = _fp16_bytes(d_value)
    d_read = _fp16_value(d_bytes)
    sc = torch.clamp(nearest_int(iscale[:, None] * scales), max=127)  # int8 in [-128, 127]
    d_sub = d_read[:, None] * sc.to(F32)  # [nb, 16]
    requant = torch.clamp(nearest_int(sub.reshape(nb, 16, 16) / torch.where(d_sub != 0, d_sub, torch.ones_like(d_sub))[..., None]),
                          -32, 31) + 32
    L = torch.where((d_sub != 0)[..., None], requant, L).reshape(nb, QK_K)
    ql = torch.empty(nb, 128, dtype=torch.int32, device=x.device)
    qh = torch.empty(nb, 64, dtype=torch.int32, device=x.device)
    for half, j in enumerate((0, 128)):
        q1, q2, q3, q4 = (L[:, j + o : j + o + 32] for o in (0, 32, 64, 96))
        ql[:, 64 * half : 64 * half + 32] = (q1 & 0xF) | ((q3 & 0xF) << 4)
        ql[:, 64 * half + 32 : 64 * half + 64] = (q2 & 0xF) | ((q4 & 0xF) << 4)
        qh[:, 32 * half : 32 * half + 32] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)
    out = torch.cat([ql.to(torch.uint8), qh.to(torch.uint8), sc.to(torch.int8).view(torch.uint8), d_bytes], dim=1)
    return torch.where(empty[:, None], torch.zeros_like(out), out)  # memset(&y[i], 0, ...): d = fp16(0) is 0 bytes


def dequantize_q6_k(b: Tensor) -> Tensor:
    nb = b.shape[0]
    ql, qh = b[:, :128].to(torch.int32), b[:, 128:192].to(torch.int32)
    sc = b[:, 192:208].contiguous().view(torch.int8).to(F32)
    d = _fp16_value(b[:, 208:210])
    out = torch.empty(nb, QK_K, dtype=F32, device=b.device)
    for half in range(2):
        lo, hi = ql[:, 64 * half : 64 * half + 64], qh[:, 32 * half : 32 * half + 32]
        s = sc[:, 8 * half : 8 * half + 8]
        q = [(lo[:, :32] & 0xF) | (((hi >> 0) & 3) << 4), (lo[:, 32:] & 0xF) | (((hi >> 2) & 3) << 4),
             (lo[:, :32] >> 4) | (((hi >> 4) & 3) << 4), (lo[:, 32:] >> 4) | (((hi >> 6) & 3) << 4)]
        for part in range(4):
            for is_ in range(2):  # l / 16
                cols = slice(128 * half + 32 * part + 16 * is_, 128 * half + 32 * part + 16 * is_ + 16)
                codes = (q[part][:, 16 * is_ : 16 * is_ + 16] - 32).to(F32)
                out[:, cols] = (d * s[:, is_ + 2 * part])[:, None] * codes
    return out.reshape(-1)


# -- q4_K -----------------------------------------------------------------------------------


def make_qkx2_quants(x: Tensor, weights: Tensor, nmax: int = 15, rmin: float = -1.0, rdelta: float = 0.1,
                     nstep: int = 20) -> tuple[Tensor, Tensor, Tensor]:
    """make_qkx2_quants(n, nmax, x, weights, L, &the_min, Laux, rmin, rdelta, nstep, use_mad=false) over B groups:
    x, weights [B, n] -> (scale [B], the_min [B] (= -min >= 0), L [B, n] int32). `min` is the running one: a
    trial that wins moves it, and later trials measure from it, as in C. Element-major inside."""
    B, n = x.shape
    xt, wt = x.t().contiguous(), weights.t().contiguous()  # [n, B]
    low, high = xt[0].clone(), xt[0].clone()
    sum_w = wt[0].clone()
    sum_x = sum_w * xt[0]
    for i in range(1, n):
        low = torch.where(xt[i] < low, xt[i], low)
        high = torch.where(xt[i] > high, xt[i], high)
        sum_w = sum_w + wt[i]
        sum_x = sum_x + wt[i] * xt[i]
    low = torch.where(low > 0, torch.zeros_like(low), low)
    flat = high == low

    def span() -> Tensor:
        return torch.where(flat, torch.ones_like(high), high - low)

    def error_of(scale: Tensor, levels: Tensor, minimum: Tensor) -> Tensor:  # Σ_i w (scale L + min - x)^2, in order
        diff = scale[None, :] * levels.to(F32) + minimum[None, :] - xt
        terms = wt * (diff * diff)
        total = torch.zeros(B, dtype=F32, device=x.device)
        for i in range(n):
            total = total + terms[i]
        return total

    iscale = _t(float(nmax), x) / span()
    scale = _t(1.0, x) / iscale
    L = nearest_int(iscale[None, :] * (xt - low[None, :])).clamp(0, nmax)
    best_error = error_of(scale, L, low)
    for step in range(nstep + 1):
        iscale = (_t(rmin, x) + _t(rdelta, x) * _t(float(step), x) + _t(float(nmax), x)) / span()
        aux = nearest_int(iscale[None, :] * (xt - low[None, :])).clamp(0, nmax)
        lf = aux.to(F32)
        wl = wt * lf
        wl2, wlx = wl * lf, wl * xt
        sum_l = torch.zeros(B, dtype=F32, device=x.device)
        sum_l2 = torch.zeros_like(sum_l)
        sum_xl = torch.zeros_like(sum_l)
        for i in range(n):
            sum_l = sum_l + wl[i]
            sum_l2 = sum_l2 + wl2[i]
            sum_xl = sum_xl + wlx[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        solvable = D > 0
        safe_D = torch.where(solvable, D, torch.ones_like(D))
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / safe_D
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / safe_D
        positive = this_min > 0
        this_scale = torch.where(positive, sum_xl / torch.where(sum_l2 != 0, sum_l2, torch.ones_like(sum_l2)), this_scale)
        this_min = torch.where(positive, torch.zeros_like(this_min), this_min)
        error = error_of(this_scale, aux, this_min)
        better = solvable & (error < best_error) & ~flat
        L = torch.where(better[None, :], aux, L)
        best_error = torch.where(better, error, best_error)
        scale = torch.where(better, this_scale, scale)
        low = torch.where(better, this_min, low)
    L = L.t().contiguous()
    scale = torch.where(flat, torch.zeros_like(scale), scale)
    return scale, -low, torch.where(flat[:, None], torch.zeros_like(L), L)


def quantize_q4_k(x: Tensor) -> Tensor:
    """quantize_row_q4_K_ref: x [n * 256] -> [n, 144] uint8 (fp16 d, fp16 dmin, scales[12], qs[128])."""
    x = x.reshape(-1, QK_K)
    nb = x.shape[0]
    sub = x.reshape(nb * 8, 32)
    sum_x2 = torch.zeros(nb * 8, dtype=F32, device=x.device)
    for i in range(32):
        sum_x2 = sum_x2 + sub[:, i] * sub[:, i]
    av_x = torch.sqrt((sum_x2 / _t(32.0, sum_x2)).double()).to(F32)  # sqrtf, correctly rounded
    weights = av_x[:, None] + sub.abs()
    scales, mins, L = make_qkx2_quants(sub, weights)
    scales, mins, L = scales.reshape(nb, 8), mins.reshape(nb, 8), L.reshape(nb, 8, 32)
    max_scale = torch.zeros(nb, dtype=F32, device=x.device)
    max_min = torch.zeros(nb, dtype=F32, device=x.device)
    for j in range(8):
        max_scale = torch.where(scales[:, j] > max_scale, scales[:, j], max_scale)
        max_min = torch.where(mins[:, j] > max_min, mins[:, j], max_min)
    inv_scale = torch.where(max_scale > 0, _t(63.0, x) / torch.where(max_scale > 0, max_scale, torch.ones_like(max_scale)),
                            torch.zeros_like(max_scale))
    inv_min = torch.where(max_min > 0, _t(63.0, x) / torch.where(max_min > 0, max_min, torch.ones_like(max_min)),
                          torch.zeros_like(max_min))
    ls = torch.clamp(nearest_int(inv_scale[:, None] * scales) & 0xFF, max=63)  # uint8 then MIN(63, .)
    lm = torch.clamp(nearest_int(inv_min[:, None] * mins) & 0xFF, max=63)
    packed = torch.zeros(nb, 12, dtype=torch.int32, device=x.device)
    packed[:, 0:4] = ls[:, 0:4]
    packed[:, 4:8] = lm[:, 0:4]
    packed[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    packed[:, 0:4] |= (ls[:, 4:8] >> 4) << 6
    packed[:, 4:8] |= (lm[:, 4:8] >> 4) << 6
    d_bytes, dmin_bytes = _fp16_bytes(max_scale / _t(63.0, x)), _fp16_bytes(max_min / _t(63.0, x))
    sc, m = _scale_min_k4(packed)  # [nb, 8] each
    d = _fp16_value(d_bytes)[:, None] * sc.to(F32)
    dm = _fp16_value(dmin_bytes)[:, None] * m.to(F32)
    requant = torch.clamp(nearest_int((sub.reshape(nb, 8, 32) + dm[..., None]) / torch.where(d != 0, d, torch.ones_like(d))[..., None]),
                          0, 15)
    L = torch.where((d != 0)[..., None], requant, L).reshape(nb, QK_K)
    qs = torch.cat([L[:, j : j + 32] | (L[:, j + 32 : j + 64] << 4) for j in range(0, QK_K, 64)], dim=1)
    return torch.cat([d_bytes, dmin_bytes, packed.to(torch.uint8), qs.to(torch.uint8)], dim=1)


def _scale_min_k4(q: Tensor) -> tuple[Tensor, Tensor]:
    """get_scale_min_k4 for j = 0..7: q [nb, 12] -> (6-bit scales [nb, 8], 6-bit mins [nb, 8])."""
    q = q.to(torch.int32)
    sc = torch.cat([q[:, 0:4] & 63, (q[:, 8:12] & 0xF) | ((q[:, 0:4] >> 6) << 4)], dim=1)
    m = torch.cat([q[:, 4:8] & 63, (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)], dim=1)
    return sc, m


def dequantize_q4_k(b: Tensor) -> Tensor:
    nb = b.shape[0]
    d, dmin = _fp16_value(b[:, 0:2]), _fp16_value(b[:, 2:4])
    sc, m = _scale_min_k4(b[:, 4:16])
    qs = b[:, 16:144].to(torch.int32)
    out = torch.empty(nb, QK_K, dtype=F32, device=b.device)
    for chunk in range(4):
        q = qs[:, 32 * chunk : 32 * chunk + 32]
        for part, codes in enumerate((q & 0xF, q >> 4)):
            j = 2 * chunk + part
            d1, m1 = d * sc[:, j].to(F32), dmin * m[:, j].to(F32)
            out[:, 64 * chunk + 32 * part : 64 * chunk + 32 * part + 32] = d1[:, None] * codes.to(F32) - m1[:, None]
    return out.reshape(-1)
