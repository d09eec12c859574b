"""Runs in the engine's own virtualenv with MTP_OBSERVE_VLLM_FIXES=none (the engine as shipped), never imported by
the project's tests:

    <engine-python> defects_driver.py OUT.json

Each check calls vLLM's own code twice, as installed and with mtp-observe's fix, on the same inputs, and records
what came back; tests/engine/test_engine_defects.py judges it. A defect that vLLM fixes shows up there as an
"as installed" result that is already right: the fix can go.
"""

import json
import math
import sys


def _reference_gated_delta(q, k, v, g, beta, state, cu):
    """The gated delta rule in float64, one token at a time, per sequence and head (q, k l2-normalised, q·S scaled by
    D^-1/2): S <- S·exp(g); S <- S + k ⊗ beta·(v - kᵀS); o = q·S / sqrt(D). q, k: [T, H, D]; v: [T, H, Dv];
    state: [N, H, D, Dv] (the sequences' own rows). Returns (o [T, H, Dv], state after)."""
    import torch

    q = torch.nn.functional.normalize(q.double(), dim=-1, eps=1e-6)
    k = torch.nn.functional.normalize(k.double(), dim=-1, eps=1e-6)
    v, g, beta, state = v.double(), g.double(), beta.double(), state.double().clone()
    out = torch.zeros_like(v)
    for n in range(len(cu) - 1):
        s = state[n]
        for t in range(cu[n], cu[n + 1]):
            s = s * torch.exp(g[t])[:, None, None]
            u = beta[t][:, None] * (v[t] - torch.einsum("hk,hkv->hv", k[t], s))
            s = s + torch.einsum("hk,hv->hkv", k[t], u)
            out[t] = torch.einsum("hk,hkv->hv", q[t], s) / math.sqrt(q.size(-1))
        state[n] = s
    return out, state


def gdn_prefill_case(d: int, seed: int = 0):
    """Inputs shaped as vLLM's prefill call (gdn_attention.py:339): two sequences in one varlen batch, their states
    at slots 2 and 0 of a pool of 3 (slot 1 must stay untouched), float32 state as vLLM's CPU GDN runs it."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    t, h = 9, 4
    q, k, v = (torch.randn(1, t, h, d, generator=gen).bfloat16() for _ in range(3))
    g = -torch.rand(1, t, h, generator=gen)
    beta = torch.rand(1, t, h, generator=gen).bfloat16()
    pool = torch.randn(3, h, d, d, generator=gen) * 0.1
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    slots = torch.tensor([2, 0], dtype=torch.int32)
    return q, k, v, g, beta, pool, cu, slots


def check_gdn_prefill() -> dict:
    import vllm._custom_ops as ops
    from mtp_observe_vllm_fixes.gdn_prefill import make_padded

    shipped = ops.chunk_gated_delta_rule_cpu
    fixed = make_padded(shipped)
    result = {}
    q, k, v, g, beta, pool, cu, slots = gdn_prefill_case(32)
    try:
        shipped(q, k, v, g, beta, pool.clone(), True, cu, False, True, slots)
        result["shipped_d32"] = "ran"
    except RuntimeError as e:
        result["shipped_d32"] = f"error: {e}"
    state = pool.clone()
    out, _ = fixed(q, k, v, g, beta, state, True, cu, False, True, slots)
    ref_out, ref_state = _reference_gated_delta(q[0], k[0], v[0], g[0], beta[0], pool[slots.long()], [0, 4, 9])
    result["fixed_d32_out_err"] = float((out[0].double() - ref_out).abs().max())
    result["fixed_d32_out_scale"] = float(ref_out.abs().max())
    result["fixed_d32_state_err"] = float((state[slots.long()].double() - ref_state).abs().max())
    result["fixed_d32_state_scale"] = float(ref_state.abs().max())
    result["fixed_d32_untouched_slot_err"] = float((state[1] - pool[1]).abs().max())
    # The same padding from 64 (dispatched natively) to 128, against the kernel's own D = 64: the padding is exact.
    q, k, v, g, beta, pool, cu, slots = gdn_prefill_case(64, seed=1)
    native_state, padded_state = pool.clone(), pool.clone()
    native, _ = shipped(q, k, v, g, beta, native_state, True, cu, False, True, slots)
    padded_kernel = make_padded(shipped)
    import mtp_observe_vllm_fixes.gdn_prefill as gp
    saved = gp.DISPATCHED
    gp.DISPATCHED = (128,)  # make the wrapper pad 64 to 128
    try:
        padded, _ = padded_kernel(q, k, v, g, beta, padded_state, True, cu, False, True, slots)
    finally:
        gp.DISPATCHED = saved
    ref_out, ref_state = _reference_gated_delta(q[0], k[0], v[0], g[0], beta[0], pool[slots.long()], [0, 4, 9])
    result["native_d64_out_err"] = float((native[0].double() - ref_out).abs().max())
    result["native_d64_out_scale"] = float(ref_out.abs().max())
    result["native_d64_state_err"] = float((native_state[slots.long()].double() - ref_state).abs().max())
    result["native_d64_state_scale"] = float(ref_state.abs().max())
    result["pad64to128_out_err"] = float((padded.float() - native.float()).abs().max())
    result["pad64to128_out_scale"] = float(native.float().abs().max())
    result["pad64to128_out_differing"] = int((padded != native).sum())
    result["pad64to128_out_size"] = native.numel()
    result["pad64to128_state_err"] = float((padded_state - native_state).abs().max())
    result["pad64to128_state_scale"] = float(native_state.abs().max())
    return result


def check_expand() -> dict:
    import torch
    from mtp_observe_vllm_fixes.expand import expand_into
    from vllm.utils import cpu_triton_utils

    shipped = cpu_triton_utils._expand_kernel_impl
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    result = {"expected_temperature": [0.6, 0.6, 1.0, 1.0, 1.0, 0.9], "expected_top_k": [20, 20, 50, 50, 50, 1]}
    for name, impl in (("shipped", shipped), ("fixed", expand_into)):
        temperature = torch.full((6,), float("nan"))
        impl(temperature, torch.tensor([0.6, 0.0, 0.9]), cu, 0, 1)  # greedy (0) is replaced by 1, as the sampler asks
        top_k = torch.full((6,), -7, dtype=torch.int32)
        impl(top_k, torch.tensor([20, 50, 1], dtype=torch.int32), cu, 0, 0)
        result[f"{name}_temperature"] = [None if math.isnan(x) else round(x, 6) for x in temperature.tolist()]
        result[f"{name}_top_k"] = top_k.tolist()
    # the fix through vLLM's own path: the CPU platform's overrides, then the sampler's expand_batch_to_tokens
    import mtp_observe_vllm_fixes.expand as fix
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler as rs

    fix.apply()
    current_platform.register_triton_kernel_overrides()
    got = rs.expand_batch_to_tokens(torch.tensor([0.6, 0.0, 0.9]), cu, 6, replace_from=rs.GREEDY_TEMPERATURE,
                                    replace_to=1)
    result["fixed_through_sampler"] = [round(x, 6) for x in got.tolist()]
    return result


class _Captured(Exception):
    pass


def _spec_step(spec_forward, buffer, x, num_accepted, weight, bias):
    """One speculative step of one sequence through a `_spec_forward`, on a stand-in layer whose rearrange hook
    captures the conv output and stops before the recurrent kernel (the conv is what (c) is about)."""
    from types import SimpleNamespace

    import torch

    captured = {}

    def rearrange(conv_out):
        captured["out"] = conv_out.clone()
        raise _Captured

    layer = SimpleNamespace(conv1d=SimpleNamespace(weight=weight.unsqueeze(1), bias=bias), activation="silu",
                            rearrange_mixed_qkv=rearrange)
    q = x.size(0)
    meta = SimpleNamespace(num_spec_decodes=1, spec_query_start_loc=torch.tensor([0, q], dtype=torch.int32),
                           spec_state_indices_tensor=torch.tensor([[0, 1, 2, 3]], dtype=torch.int32),
                           num_accepted_tokens=torch.tensor([num_accepted], dtype=torch.int32))
    width, state_len = weight.size(1), buffer.size(-1)
    try:
        spec_forward(layer, meta, x, None, None, buffer.unsqueeze(0), None, width, state_len)
    except _Captured:
        return captured["out"]


def check_spec_conv() -> dict:
    """A sequence drafting fewer than K tokens (n-gram, suffix): step 1 verifies 2 tokens (x0, x1) and accepts both,
    step 2 verifies 2 more (y0, y1), step 3 verifies 1. The reference is the causal conv over the true input stream
    h1 h2 h3 x0 x1 y0 y1 ... The torch fallback is forced (no AMX), the path this machine and most x86 take."""
    import torch
    import torch.nn.functional as F
    from mtp_observe_vllm_fixes.spec_conv import make_spec_forward
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as gdn

    torch.cpu._is_amx_tile_supported = lambda: False
    gen = torch.Generator().manual_seed(0)
    dim, width, k = 8, 4, 3
    weight, bias = torch.randn(dim, width, generator=gen), torch.randn(dim, generator=gen)
    history = torch.randn(dim, width - 1, generator=gen)
    xs, ys, zs = (torch.randn(n, dim, generator=gen) for n in (2, 2, 1))
    stream = torch.cat([history, xs.T, ys.T, zs.T], dim=-1)
    reference = F.silu(F.conv1d(stream.unsqueeze(0), weight.unsqueeze(1), bias, groups=dim)[0]).T  # [tokens, dim]
    result = {"amx_forced_off": True}
    for name, forward in (("shipped", gdn._spec_forward), ("fixed", make_spec_forward(gdn._spec_forward, gdn))):
        buffer = torch.randn(dim, (width - 1) + k, generator=gen) * 100  # stale columns: loud when read
        buffer[:, : width - 1] = history  # after the prefill: the history in the first width - 1 columns
        step1 = _spec_step(forward, buffer, xs, 1, weight, bias)
        step2 = _spec_step(forward, buffer, ys, 2, weight, bias)  # step 1 accepted x0 and x1
        result[f"{name}_step1_err"] = float((step1 - reference[0:2]).abs().max())
        result[f"{name}_step2_err"] = float((step2 - reference[2:4]).abs().max())
        try:
            step3 = _spec_step(forward, buffer, zs, 2, weight, bias)  # step 2 accepted y0 and y1
            result[f"{name}_step3_err"] = float((step3 - reference[4:5]).abs().max())
        except RuntimeError as e:
            result[f"{name}_step3_err"] = f"error: {e}"
    # MTP's shape, K + 1 tokens every step, accepting 1, 3 and 4 of them: both right (the fix changes nothing there)
    steps = [torch.randn(k + 1, dim, generator=gen) for _ in range(3)]
    accepted = [1, 3, 4]  # num_accepted going into each step: the previous step's accepted tokens + the bonus
    for name, forward in (("shipped", gdn._spec_forward), ("fixed", make_spec_forward(gdn._spec_forward, gdn))):
        buffer = torch.randn(dim, (width - 1) + k, generator=gen) * 100
        buffer[:, : width - 1] = history
        stream, errors = history, []  # the true input stream: the history, then each step's accepted tokens
        for i, (x, a) in enumerate(zip(steps, accepted)):
            out = _spec_step(forward, buffer, x, a, weight, bias)
            full = F.silu(F.conv1d(torch.cat([stream, x.T], -1).unsqueeze(0), weight.unsqueeze(1), bias,
                                   groups=dim)[0]).T
            errors.append(float((out - full[-x.size(0):]).abs().max()))
            if i + 1 < len(steps):
                stream = torch.cat([stream, x[: accepted[i + 1]].T], -1)
        result[f"{name}_mtp_shaped_err"] = max(errors)
    return result


if __name__ == "__main__":
    import vllm  # noqa: F401  (loads vLLM's CPU ops)

    out = {"gdn_prefill": check_gdn_prefill(), "expand": check_expand(), "spec_conv": check_spec_conv()}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
