"""The roofline at published Qwen3.5 dimensions: docs/cost.md's worked example ("Speedup by batch size").

    python benchmarks/cost_examples.py [--device h200] [--context 4096] [--tau 1.685,2.141,2.486,2.757]

Nothing is downloaded and nothing runs on a GPU: the geometries are built from config numbers alone
(cost.config_tensors, checked against real checkpoint headers in tests/test_cost.py), the steps are
cost.roofline_times, the speedup cost.batch_speedup. Where each number comes from:

  27B dense   the config.json of Qwen/Qwen3.6-27B (revision 6a9e13bd, a stored verbatim copy; the same
              Qwen3_5ForConditionalGeneration architecture and text dimensions as Qwen3.5-27B, whose head
              MTP_HEAD.md gives: H 5120, 24 heads, 4 KV heads, d 256, I 17408, vocab 248,320): 64 layers,
              every 4th full attention (16), Gated DeltaNet 16 key / 48 value heads of 128, conv kernel 4,
              mamba_ssm_dtype float32, untied lm_head, one MTP layer.
  35B-A3B     Qwen/Qwen3.5-35B-A3B: transformers' Qwen3_5MoeTextConfig defaults, documented against that
              checkpoint (@auto_docstring(checkpoint="Qwen/Qwen3.5-35B-A3B"), transformers 5.24.0): H 2048,
              40 layers (10 full attention), 16 heads, 2 KV heads, d 256, 256 experts of 512, top-8, a shared
              expert of 512, Gated DeltaNet 16 key / 32 value heads of 128, vocab 248,320, untied; the released
              config.json's DeltaNet and MoE fields agree (Qwen3.6-27B's config.json: text_config) and add
              mamba_ssm_dtype float32; the MTP layer's MLP is the same sparse MoE block (MTP_HEAD.md).
  the device  cost.DEVICES (sources in cost.py); BF16 weights and KV cache.
  τ_sim       by default the quickstart's (the bundled model on the demo sessions, README.md): a stand-in for
              your traffic's, which is what `mtp-observe report` puts there. The break-even τ does not
              depend on it.
"""

from __future__ import annotations

import argparse

import numpy as np

from mtp_observe.cost.geometry import config_tensors, geometry_from_tensors
from mtp_observe.cost.roofline import parse_device, roofline_times
from mtp_observe.cost.speedup import DEFAULT_BATCHES, batch_speedup, best_k, break_even, schedule

COMMON = dict(vocab_size=248320, head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128,
              linear_value_head_dim=128, linear_num_key_heads=16, mamba_ssm_dtype="float32", full_attention_interval=4,
              rms_norm_eps=1e-6, partial_rotary_factor=0.25,
              rope_parameters={"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
              mtp_num_hidden_layers=1, tie_word_embeddings=False)
MODELS = {
    "27B dense": ("qwen3_5", dict(COMMON, hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
                                  num_attention_heads=24, num_key_value_heads=4, linear_num_value_heads=48)),
    "35B-A3B MoE": ("qwen3_5_moe", dict(COMMON, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
                                        num_key_value_heads=2, linear_num_value_heads=32, num_experts=256,
                                        num_experts_per_tok=8, moe_intermediate_size=512,
                                        shared_expert_intermediate_size=512)),
}
QUICKSTART_TAU = (1.685, 2.141, 2.486, 2.757)


def geometry(name: str):
    family, config = MODELS[name]
    return geometry_from_tensors(config, config_tensors(config, family), False, "BF16", False)


def example(name: str, device: str = "h200", context: float = 4096, tau=QUICKSTART_TAU) -> dict:
    g = geometry(name)
    times = roofline_times(g, parse_device(device), DEFAULT_BATCHES, len(tau) + 1, context)
    s = batch_speedup(np.array(tau), times)
    ks = [best_k(row) for row in s]
    return {"geometry": g, "times": times, "speedup": s, "best_k": ks, "break_even": break_even(times, len(tau)),
            "schedule": schedule(times.batch, ks)}


def markdown(name: str, device: str = "h200", context: float = 4096, tau=QUICKSTART_TAU) -> str:
    """docs/cost.md's table for one model."""
    e = example(name, device, context, tau)
    t, K = e["times"], len(tau)
    lines = [f"| B | decode (ms) | verify of {K + 1} (ms) | draft (ms) | c_B | v_B({K}) | break-even τ_sim K=1..{K} | "
             f"speedup K=1..{K} | best K |",
             "|---:|---:|---:|---:|---:|---:|---|---|---:|"]
    for i, B in enumerate(t.batch):
        lines.append(f"| {B} | {t.target[i, 0] * 1e3:.2f} | {t.target[i, K] * 1e3:.2f} | {t.draft[i] * 1e3:.3f} | "
                     f"{t.draft_cost()[i]:.3f} | {t.verify_extra(K)[i, K - 1]:.2f} | "
                     f"{' / '.join(f'{x:.2f}' for x in e['break_even'][i])} | "
                     f"{' / '.join(f'{x:.2f}' for x in e['speedup'][i])} | {e['best_k'][i]} |")
    lines.append("")
    lines.append(f"num_speculative_tokens_per_batch_size: {e['schedule']}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="h200")
    ap.add_argument("--context", type=float, default=4096)
    ap.add_argument("--tau", default=",".join(map(str, QUICKSTART_TAU)), help="τ_sim(1..K), comma-separated")
    args = ap.parse_args()
    tau = tuple(float(x) for x in args.tau.split(","))
    for name in MODELS:
        g = geometry(name)
        print(f"### {name} on {args.device}, context {args.context:,.0f} tokens per sequence")
        print(f"(weights read whole {g.dense_bytes / 1e9:.2f} GB, {g.moe_layers} MoE layers x {g.experts} experts of "
              f"{g.expert_bytes / 1e6:.2f} MB, active parameters {g.active_params / 1e9:.2f} B, head "
              f"{(g.head_dense_bytes + g.head_expert_bytes * g.head_experts) / 1e9:.2f} GB + lm_head "
              f"{g.lm_head_bytes / 1e9:.2f} GB, KV {g.kv_bytes_per_token / 1024:.0f} KiB/token, Gated DeltaNet state "
              f"{g.linear_layers * g.state_bytes / 1e6:.0f} MB/sequence)")
        print()
        print(markdown(name, args.device, args.context, tau))
        print()


if __name__ == "__main__":
    main()
