"""The MTP draft head (Qwen3.5-family `mtp.*` and DeepSeek-V3 / GLM-4.5 NextN layers), run exactly as the serving
engines run it. The package's files, in the order a row flows through them: `norms` (the two RMSNorms), `rope`
(rotary and its scaling), `attention` (gated GQA, GLM's GQA, DeepSeek's MLA), `mlp` (dense, Qwen's MoE, the
grouped sigmoid MoE), and `head` (the row pass over a request, the chain over anchors, their outputs; its
docstring is the contract and lists the readings taken from the engines)."""

from .attention import GatedAttention, GqaAttention, MlaAttention, build_attention, causal_mask
from .head import (
    ATTENTION_BUDGET,
    DRAFT_TOP_K,
    LOGITS_BUDGET,
    QWEN_READING,
    CausalBias,
    Drafts,
    MtpHead,
    RowPass,
    _lower_right,
    anchor_block,
    build_head,
    draft_confidence,
    log_sum_exp_shifted_,
)
from .mlp import DenseMlp, GroupedMoeMlp, SparseMoeMlp, build_mlp, route, route_grouped, routed_experts
from .norms import rms_norm, zero_centred_rms_norm
from .rope import (
    apply_interleaved_rotary,
    apply_partial_rotary,
    rotary_cos_sin,
    rotary_frequencies,
    rotary_inv_freq,
    softmax_scale,
    yarn_mscale,
)

__all__ = [
    "ATTENTION_BUDGET", "DRAFT_TOP_K", "LOGITS_BUDGET", "QWEN_READING", "CausalBias", "DenseMlp", "Drafts", "GatedAttention",
    "GqaAttention", "GroupedMoeMlp", "MlaAttention", "MtpHead", "RowPass", "SparseMoeMlp", "_lower_right",
    "anchor_block", "apply_interleaved_rotary", "apply_partial_rotary", "build_attention", "build_head", "build_mlp", "causal_mask", "draft_confidence",
    "log_sum_exp_shifted_", "rms_norm", "rotary_cos_sin", "rotary_frequencies", "rotary_inv_freq", "route",
    "route_grouped", "routed_experts", "softmax_scale", "yarn_mscale", "zero_centred_rms_norm",
]
