"""The memory one replay replica needs for Qwen3.5-27B, -35B-A3B, -122B-A10B and -397B-A17B (docs/scale.md's table).

    python benchmarks/replica_memory.py [--context 131072] [--gpu 141]

Nothing is downloaded and nothing runs on a GPU: every tensor of each target (text tower and MTP head; the vision
tower is not loaded by replay) comes from its config numbers through cost.config_tensors — the function
tests/test_cost.py checks against real checkpoint headers —, summed as stored. Where each config comes from:

  27B, 35B-A3B   benchmarks/cost_examples.py (sources there: Qwen3.6-27B's config.json, the Qwen3.5-27B architecture;
                 transformers' Qwen3_5MoeTextConfig documented against Qwen/Qwen3.5-35B-A3B)
  122B-A10B      H 3072, 48 layers (every 4th full attention), 32 query / 2 KV heads of 256, 256 experts of 1024
                 (top-8) and a shared expert of 1024, vocab 248,320 (the published architecture, as apxml.com/models/
                 qwen35-122b-a10b lists it); Gated DeltaNet 16 key / 64 value heads of 128. The value-head count is the
                 one that gives the published total: 122.11B text parameters with 64 (120.74B with 32)
  397B-A17B      H 4096, 60 layers, 32 / 2 heads of 256, 512 experts of 1024 (top-10) and a shared expert of 1024,
                 vocab 248,320 (THUDM/slime scripts/models/qwen3.5-397B-A17B.sh); Gated DeltaNet 16 key / 64 value
                 heads of 128 (the mlx-community Qwen3.5-397B-A17B profile in extract_weights.py; 396.3B text
                 parameters, the published 397B with the vision tower)

What a replica holds (mtp_observe/model/checkpoint.py, target.py, mtp.py):
  weights   every parameter in bfloat16 (the GPU default). A block-FP8 release is dequantised to bfloat16 when it is
            loaded (weights.dequantize_blockwise: replay computes the serving values, it runs no FP8 GEMMs), so the
            FP8 release needs the same memory as the BF16 one; what FP8 halves is the download and the disk
  KV        the full-attention layers' keys and values for the longest request (bfloat16), up to twice: the prefix
            the next request of the session shares is kept while it runs (pipeline.Carry)
  hidden    the target's final hidden states and the head's rows over the request, bfloat16
  logits    lm_head in position chunks of at most 2^26 logits (target.reduce_logits' budget), fp32, a few copies
            while sorting: about 1 GB whatever the context
  DeltaNet  the linear-attention states (fp32, mamba_ssm_dtype), fixed size, twice (the carried prefix)
An estimate from the layout, not a measured GPU peak; allocator slack and CUDA context (a few GB) come on top.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cost_examples import COMMON, MODELS  # noqa: E402

from mtp_observe.cost.geometry import config_tensors  # noqa: E402

CONFIGS = {
    "Qwen3.5-27B": MODELS["27B dense"],
    "Qwen3.5-35B-A3B": MODELS["35B-A3B MoE"],
    "Qwen3.5-122B-A10B": ("qwen3_5_moe", dict(COMMON, hidden_size=3072, num_hidden_layers=48, num_attention_heads=32,
                                              num_key_value_heads=2, linear_num_value_heads=64, num_experts=256,
                                              num_experts_per_tok=8, moe_intermediate_size=1024,
                                              shared_expert_intermediate_size=1024)),
    "Qwen3.5-397B-A17B": ("qwen3_5_moe", dict(COMMON, hidden_size=4096, num_hidden_layers=60, num_attention_heads=32,
                                              num_key_value_heads=2, linear_num_value_heads=64, num_experts=512,
                                              num_experts_per_tok=10, moe_intermediate_size=1024,
                                              shared_expert_intermediate_size=1024)),
}
BF16, FP8 = 2, 1
BLOCK = 128
FP8_KEEPS = ("embed_tokens", "lm_head", "mtp.fc", "mlp.gate.weight", "shared_expert_gate", "norm", "conv1d", "A_log",
             "dt_bias", "in_proj_a", "in_proj_b")  # kept in BF16 by the FP8 releases (ACCEPTANCE.md: lm_head,
#                                                    embeddings, mtp.fc, norms and routers; the DeltaNet's small tensors)


def files_bytes(tensors, fp8: bool) -> int:
    """The checkpoint's bytes on disk: BF16, or block-FP8 (1 byte a weight and an F32 scale per 128x128 block) for
    every matrix the FP8 releases quantise."""
    total = 0
    for t in tensors:
        n = math.prod(t.shape)
        if fp8 and len(t.shape) >= 2 and not any(k in t.name for k in FP8_KEEPS):
            rows, cols = math.prod(t.shape[:-1]), t.shape[-1]
            total += n * FP8 + 4 * math.ceil(rows / BLOCK) * math.ceil(cols / BLOCK)
        else:
            total += n * BF16
    return total


def replica(name: str, context: int) -> dict:
    family, c = CONFIGS[name]
    tensors = config_tensors(c, family)
    params = sum(math.prod(t.shape) for t in tensors)
    head = sum(math.prod(t.shape) for t in tensors if t.name.startswith("mtp."))
    L, H = c["num_hidden_layers"], c["hidden_size"]
    full = sum(1 for i in range(L) if (i + 1) % c["full_attention_interval"] == 0)
    kv_token = (full + 1) * 2 * c["num_key_value_heads"] * c["head_dim"] * BF16  # + the head's own attention layer
    deltanet = (L - full) * (c["linear_num_value_heads"] * c["linear_key_head_dim"] * c["linear_value_head_dim"] * 4
                             + (2 * c["linear_num_key_heads"] * c["linear_key_head_dim"]
                                + c["linear_num_value_heads"] * c["linear_value_head_dim"]) * c["linear_conv_kernel_dim"] * BF16)
    weights = params * BF16
    working = 2 * kv_token * context + 2 * H * BF16 * context + 2 * deltanet + 2 ** 26 * 4 * 4
    return {"name": name, "params": params, "head": head, "text_params": params - head, "weights": weights,
            "files_bf16": files_bytes(tensors, False), "files_fp8": files_bytes(tensors, True),
            "kv_per_token": kv_token, "working": working, "total": weights + working}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=131072, help="tokens of the longest request (default 131,072)")
    ap.add_argument("--gpu", type=float, default=141.0, help="GB of one GPU (default 141: an H200; an H100 is 80)")
    args = ap.parse_args(argv)
    print(f"| target | parameters (text + MTP head) | weights in the replica (BF16 and FP8 releases) | files: BF16 / FP8 "
          f"| KV per token | working memory at {args.context:,} tokens | total | GPUs of {args.gpu:g} GB (90% used) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in CONFIGS:
        r = replica(name, args.context)
        gpus = math.ceil(r["total"] / (args.gpu * 1e9 * 0.9))  # 90% of each GPU usable
        fits = f"{gpus}" if gpus <= 8 else f"{gpus}: more than a node of 8, which one replica cannot span"
        print(f"| {name} | {r['text_params'] / 1e9:.2f}B + {r['head'] / 1e9:.2f}B | {r['weights'] / 1e9:.1f} GB | "
              f"{r['files_bf16'] / 1e9:.0f} / {r['files_fp8'] / 1e9:.0f} GB | {r['kv_per_token'] / 1024:.0f} KiB | "
              f"{r['working'] / 1e9:.1f} GB | {r['total'] / 1e9:.0f} GB | {fits} |")


if __name__ == "__main__":
    main()
