"""Serving: what vLLM runs on the GPU a run describes (`replay --serve-device`), where that changes the numbers.

Contract: `serving_numerics(device, fp8_activations, quantized)` -> ServingNumerics, the run's choices recorded in
run.json `serving`; `linear_rule(numerics, model_type, out_features, in_features, block)` -> LinearRule, the kernel
vLLM 0.33 picks for one block-FP8 linear and what it does to its activations and weights (fp8.py emulates it). The
top-k tie rule of the rejection sampler follows the device too (target.py). Imports no torch.

Block-FP8 linears in vLLM 0.33.0 (read in its wheel; vllm/model_executor/layers/quantization/fp8.py:261-271: a
block checkpoint is always dynamic, activations quantised per token per group of weight_block_size[0] channels;
the kernels in priority order, the first whose gates pass, vllm/model_executor/kernels/linear/__init__.py:494-505):

  H100 / H200 (SM90)  N % 64 == 0 and K % 128 == 0 (vllm/utils/flashinfer.py:1205-1229, vllm/utils/deep_gemm.py:
                      1064-1083) and a bfloat16 output: FlashInferFp8DeepGEMMDynamicBlockScaledKernel
                      (scaled_mm/flashinfer.py:149-313). Its weights are re-quantised at load to power-of-two
                      (UE8M0) 128x128 block scales (process_weights_after_loading -> DeepGEMM's ->
                      quantization/utils/fp8_utils.py:1195-1253, 1096-1154 `requant_weight_ue8m0_inplace`,
                      VLLM_USE_DEEP_GEMM_E8M0 default 1). A forward of M < 32 tokens runs FlashInfer's
                      fp8_blockscale_gemm_sm90 on the bfloat16 input, which quantises it itself (TensorRT-LLM's
                      `scale_1x128_kernel`, flashinfer csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/
                      fp8_blockscale_gemm/fp8_blockscale_gemm_kernel.cuh at flashinfer commit 1a97f16b, not proven
                      to be the 0.7.2.post1 build vLLM pins: scale = 448 / amax, q = e4m3(x * scale), dequant scale
                      1 / scale, no power of two); M >= 32 runs DeepGEMM after per_token_group_quant_fp8 with
                      use_ue8m0 (power-of-two scales rounded up). MODELLED: the M < 32 branch — a decode or verify
                      step of fewer than 32 tokens (batch size B with B (K + 1) < 32: batch 1, where the gate is read
                      by default). NOT MODELLED: prefill chunks and batches of 32 or more tokens per forward
                      (power-of-two activation scales there). Other shapes: CUTLASS (below).
  B200 (SM100)        model_type qwen3_5_text / qwen3_5_moe_text: DeepGEMM is disabled for accuracy
                      (vllm/utils/deep_gemm.py:27-34), so CutlassFp8BlockScaledMMKernel (scaled_mm/cutlass.py:267-318):
                      per_token_group_quant_fp8 without UE8M0 (scale = amax / 448, fp32), the checkpoint's weights.
                      Other model types with the shapes above: DeepGEMM, UE8M0 activation scales and re-quantised
                      weights; otherwise CUTLASS.
  A100 / L40S / T4    (SM80, SM89, SM75) no block-FP8 W8A8 kernel passes its gates: MarlinFP8ScaledMMLinearKernel,
                      weight-only (activations stay bfloat16), the weight dequantised in-kernel with its scales cast
                      to the model dtype (quantization/utils/marlin_utils_fp8.py:146-148). MODELLED as weight-only
                      with the checkpoint's fp32 scales (the cast to bfloat16 scales is not modelled).
  MI300X, CPU         not modelled (ROCm's FP8 is e4m3fnuz, +-224): pass --fp8-activations yourself.

The per_token_group_quant_fp8 CUDA kernel (csrc/libtorch_stable/quantization/w8a8/fp8/per_token_group_quant.cu,
read at vllm commit 00aa9038, not proven to be the 0.33.0 build): amax = max(1e-10, max |x|) over the group in fp32,
scale = amax / 448 (UE8M0: 2^ceil(log2(scale))), q = e4m3(clamp(x / scale, -448, 448)), round to nearest even.
MoE experts run Fp8MoEMethod's kernels, which are not modelled: their activations are not quantised here.

Top-k in the rejection sampler's target distribution (vllm/v1/sample/ops/topk_topp_sampler.py:501-521): the Triton
kernel wherever Triton is (every GPU above): exactly k kept, ties at the k-th value broken by the lowest token id
(vllm/v1/sample/ops/topk_topp_triton.py:385-392, 851-875); the PyTorch fallback (vLLM without Triton: "cpu") keeps
every tie.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import OptionError

SERVE_DEVICES = ("h100", "h200", "b200", "a100", "l40s", "mi300x", "cpu")  # the report's --device-spec names, and cpu
DEFAULT_SERVE_DEVICE = "h100"  # cost.DEFAULT_DEVICE: the report's default --device-spec
FP8_ACTIVATIONS = ("dynamic", "none")
SM90, SM100, WEIGHT_ONLY = ("h100", "h200"), ("b200",), ("a100", "l40s")
DEEPGEMM_EXCLUDED_ON_BLACKWELL = ("qwen3_5_text", "qwen3_5_moe_text")  # vllm/utils/deep_gemm.py:27-34 (accuracy)
TIES = {"index": "exactly k kept, ties at the k-th value broken by the lowest token id (vLLM's Triton top-k)",
        "all": "every logit tied with the k-th kept (vLLM's PyTorch top-k, without Triton)"}

# Activation scale rules (fp8.quantise_activations) and weight rules (fp8.requantise_ue8m0), by name.
ACTIVATION_RULES = {
    "none": "not quantised (weight-only FP8)",
    "amax/448": "per token per group: scale = amax / 448 (fp32), q = e4m3(clamp(x / scale))  (vLLM per_token_group_quant_fp8)",
    "448/amax": "per token per group: scale = 448 / amax (fp32), q = e4m3(x * scale), dequant 1 / scale  (FlashInfer / "
                "TensorRT-LLM scale_1x128_kernel)",
    "ue8m0": "per token per group: scale = 2^ceil(log2(amax / 448)), q = e4m3(clamp(x / scale))  (DeepGEMM's UE8M0)",
}
WEIGHT_RULES = {
    "checkpoint": "the checkpoint's q * weight_scale_inv",
    "ue8m0": "re-quantised to power-of-two 128x128 block scales at load (vLLM's requant_weight_ue8m0_inplace)",
}


@dataclass(frozen=True)
class ServingNumerics:
    """What the run describes serving on: the device, whether block-FP8 activations are quantised, the top-k ties."""

    device: str  # one of SERVE_DEVICES
    fp8_activations: str | None  # "dynamic" | "none"; None: the checkpoint is not block-FP8
    top_k_ties: str  # "index" | "all"
    explicit_activations: bool = False  # --fp8-activations was given (not the device's default)

    def manifest(self) -> dict:
        """run.json `serving` (schema 3)."""
        return {"device": self.device, "fp8_activations": self.fp8_activations, "top_k_ties": self.top_k_ties}


@dataclass(frozen=True)
class LinearRule:
    """What one block-FP8 linear computes with: its kernel, the activation rule and the weight rule."""

    kernel: str
    activations: str  # a key of ACTIVATION_RULES
    weights: str  # a key of WEIGHT_RULES
    group: int  # activation group: weight_block_size[0]

    def describe(self) -> str:
        return f"{self.kernel}: activations {self.activations}, weights {self.weights}"


def serving_numerics(device: str = DEFAULT_SERVE_DEVICE, fp8_activations: str | None = None,
                     quantized: bool = False) -> ServingNumerics:
    """--serve-device and --fp8-activations resolved (the device's default when not given) for a checkpoint that is
    block-FP8 (`quantized`) or not. One line naming the option for what is unknown or not modelled."""
    device = str(device).strip().lower()
    if device not in SERVE_DEVICES:
        raise OptionError(f"--serve-device {device}: expected one of {', '.join(SERVE_DEVICES)}")
    if fp8_activations is not None and fp8_activations not in FP8_ACTIVATIONS:
        raise OptionError(f"--fp8-activations {fp8_activations}: expected dynamic (W8A8, per token per group) or none "
                          "(weight-only FP8)")
    ties = "all" if device == "cpu" else "index"
    if not quantized:
        return ServingNumerics(device, None, ties, fp8_activations is not None)
    if fp8_activations is None:
        if device in SM90 + SM100:
            fp8_activations = "dynamic"
        elif device in WEIGHT_ONLY:
            fp8_activations = "none"
        else:
            raise OptionError(f"--serve-device {device}: the block-FP8 numerics vLLM runs there are not modelled; "
                              "pass --fp8-activations dynamic or none")
        return ServingNumerics(device, fp8_activations, ties)
    return ServingNumerics(device, fp8_activations, ties, True)


def linear_rule(numerics: ServingNumerics, model_type: str | None, out_features: int, in_features: int,
                block: tuple[int, int]) -> LinearRule:
    """The kernel vLLM 0.33 picks on the device for one block-FP8 linear [out_features, in_features] (module doc),
    and what it does; with --fp8-activations none, weight-only whatever the device."""
    group = int(block[0])  # vLLM: GroupShape(1, weight_block_size[0]) (fp8.py:261-271)
    if numerics.fp8_activations != "dynamic":
        return LinearRule("weight-only (Marlin)" if numerics.device in WEIGHT_ONLY else "weight-only", "none",
                          "checkpoint", group)
    deep_gemm_shape = out_features % 64 == 0 and in_features % 128 == 0 and tuple(block) == (128, 128)
    if numerics.device in SM90 and deep_gemm_shape:
        return LinearRule("FlashInfer+DeepGEMM, M < 32 (FlashInfer)", "448/amax", "ue8m0", group)
    if numerics.device in SM100 and deep_gemm_shape and model_type not in DEEPGEMM_EXCLUDED_ON_BLACKWELL:
        return LinearRule("DeepGEMM (UE8M0)", "ue8m0", "ue8m0", group)
    if numerics.device in SM90 + SM100:
        return LinearRule("CUTLASS", "amax/448", "checkpoint", group)
    return LinearRule("dynamic (per_token_group_quant_fp8)", "amax/448", "checkpoint", group)  # asked for explicitly
