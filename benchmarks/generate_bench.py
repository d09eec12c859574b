"""What `mtp-observe generate` costs: measured tokens/s on this machine, and the roofline GPU cost per 1M tokens.

    python benchmarks/generate_bench.py [--turns 16] [--max-new-tokens 32] [--batches 1,4,16] [--threads 1]
                                        [--device cpu] [--json OUT] [--dims bundled,27b] [--context 16384]
                                        [--roofline-batches 1,8,32,64] [--hbm-gbps 4800] [--tflops 989.4]

1. Measured, in one run, on the bundled model over the first --turns assistant turns of the demo sessions
   (each turn's prompt is its recorded context, as generate renders it): greedy generation at every batch
   size of --batches, sampled generation (instruct_general: T 0.7, top-p 0.8, top-k 20, presence 1.5) at the
   largest, and the speculative loop (--speculative 3, greedy, one turn at a time). Each line: generated
   tokens, prompt tokens prefilled, wall seconds, generated tokens/s (the wall includes every turn's
   prefill) and the ratio to batch 1; then the prefill alone (one token generated per turn, batch 1).
2. Roofline, per --dims geometry: `bundled` (the bundled model's config) and `27b` (Qwen3.5-27B's widths, as
   benchmarks/replay_bench.py DIMS["27b"] writes them: 64 layers, 16 of them full attention, hidden 5120,
   24 heads / 4 KV heads of 256, linear attention 16 key / 48 value heads of 128, vocabulary 248,320).
   Parameters are counted on transformers' own module built on the meta device (no memory). A decode step
   at batch B and context C reads every weight except the embedding (BF16, 2 bytes), each sequence's KV
   cache (2 x full layers x KV heads x head_dim x C x 2 bytes) and reads and writes its linear-attention
   state (recurrent state in fp32, conv state in BF16); it takes the larger of bytes / bandwidth and
   FLOPs / peak (2 x parameters x B, plus attention 4 x full layers x heads x head_dim x C x B). A prefill
   of P prompt tokens is compute-bound: 2 x parameters x P plus attention over half the context on average.
   Device numbers are arguments (default H200 SXM: 4,800 GB/s HBM, 989.4 BF16 dense TFLOP/s, as listed in
   mtp_observe/cost/roofline.py's device table with its sources); this script keeps no device table of its own.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mtp_observe.model.loading import default_model_dir, load_model  # noqa: E402
from mtp_observe.model.target import BUILTIN_PROFILES  # noqa: E402
from mtp_observe.run.decoding import Settings, generate_batch, speculative_turn, turn_prompts  # noqa: E402
from mtp_observe.sessions.reading import read_sessions  # noqa: E402
from mtp_observe.sessions.rendering import Renderer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROFILES = {p.name: p for p in BUILTIN_PROFILES}


def measure(args) -> list[dict]:
    model_dir = default_model_dir()
    model = load_model(model_dir, device=args.device)
    renderer = Renderer.from_model_dir(model_dir)
    prompts = [p for s in read_sessions(sorted((ROOT / "sessions").glob("*.jsonl"))) for p in turn_prompts(renderer.render(s))]
    prompts = prompts[: args.turns]
    batches = [int(b) for b in args.batches.split(",")]

    def settings(profile: str, speculative=None, max_new_tokens=None) -> Settings:
        return Settings(profile=PROFILES[profile], max_new_tokens=max_new_tokens or args.max_new_tokens, seed=0,
                        eos_ids=renderer.eos_ids, speculative=speculative)

    def timed(label: str, batch: int | None, run) -> dict:
        started = time.perf_counter()
        completions = run()
        wall = time.perf_counter() - started
        tokens = sum(len(c.tokens) for c in completions)
        return {"run": label, "batch": batch, "turns": len(completions), "tokens": tokens,
                "prompt_tokens": sum(len(p.prompt) for p in prompts), "wall_s": wall, "tokens_per_s": tokens / wall}

    def batched(profile: str, batch: int):
        ordered = sorted(prompts, key=lambda p: len(p.prompt))  # as generate batches: similar lengths together
        return [c for b0 in range(0, len(ordered), batch) for c in generate_batch(model, ordered[b0 : b0 + batch], settings(profile))]

    generate_batch(model, prompts[:1], settings("greedy"))  # warm-up
    out = [timed("greedy", b, lambda b=b: batched("greedy", b)) for b in batches]
    prefill = timed("prefill only", 1, lambda: [generate_batch(model, [p], settings("greedy", max_new_tokens=1))[0] for p in prompts])
    out.append(timed("instruct_general", max(batches), lambda: batched("instruct_general", max(batches))))
    out.append(timed("speculative K=3, greedy", 1, lambda: [speculative_turn(model, p, settings("greedy", 3)) for p in prompts]))
    base = out[0]["tokens_per_s"]
    for row in out:
        row["ratio_to_batch_1"] = row["tokens_per_s"] / base
    prefill["prompt_tokens_per_s"] = prefill["prompt_tokens"] / prefill["wall_s"]
    return out + [prefill]


def geometry(name: str) -> dict:
    """A text config: the bundled model's, or Qwen3.5-27B's widths (replay_bench.DIMS)."""
    if name == "bundled":
        from mtp_observe.model.checkpoint import read_checkpoint

        return dict(read_checkpoint(default_model_dir()).text_config)
    from replay_bench import DIMS

    from mtp_observe.model.synthetic import SyntheticSpec

    return SyntheticSpec(**DIMS[name], vocab_size=248320).text_config()


def parameters(text_config: dict) -> tuple[int, int]:
    """(parameters a decode step reads: all but the embedding, unless tied; the embedding's), counted on
    transformers' Qwen3_5ForCausalLM built on the meta device."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    keys = {k: v for k, v in text_config.items() if k not in ("model_type", "architectures")}
    with torch.device("meta"):
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**keys))
    embedding = model.model.embed_tokens.weight.numel()
    total = sum(p.numel() for p in model.parameters())
    tied = bool(text_config.get("tie_word_embeddings", False))
    return (total if tied else total - embedding), embedding


def roofline(text_config: dict, batch: int, context: int, hbm_gbps: float, tflops: float) -> dict:
    step_params, _ = parameters(text_config)
    layers = text_config["layer_types"]
    full, linear = layers.count("full_attention"), layers.count("linear_attention")
    kv, d = text_config["num_key_value_heads"], text_config["head_dim"]
    heads = text_config["num_attention_heads"]
    nk, nv = text_config["linear_num_key_heads"], text_config["linear_num_value_heads"]
    dk, dv = text_config["linear_key_head_dim"], text_config["linear_value_head_dim"]
    kernel = text_config.get("linear_conv_kernel_dim", 4)
    kv_bytes = 2 * full * kv * d * 2 * context
    state_bytes = linear * (nv * dk * dv * 4 + (2 * nk * dk + nv * dv) * kernel * 2)
    step_bytes = step_params * 2 + batch * (kv_bytes + 2 * state_bytes)
    step_flops = batch * (2.0 * step_params + 4.0 * full * heads * d * context)
    step_s = max(step_bytes / (hbm_gbps * 1e9), step_flops / (tflops * 1e12))
    prefill_flops = 1e6 * (2.0 * step_params + 2.0 * full * heads * d * context)  # 1M prompt tokens, half the context on average
    return {"batch": batch, "context": context, "step_params": step_params, "step_bytes": step_bytes,
            "step_s": step_s, "bound": "memory" if step_bytes / (hbm_gbps * 1e9) >= step_flops / (tflops * 1e12) else "compute",
            "gpu_s_per_1m_generated": 1e6 / batch * step_s, "gpu_s_per_1m_prompt": prefill_flops / (tflops * 1e12)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dims", default="bundled,27b")
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--roofline-batches", default="1,8,32,64")
    ap.add_argument("--hbm-gbps", type=float, default=4800.0, help="HBM bandwidth, GB/s (H200 SXM: 4,800)")
    ap.add_argument("--tflops", type=float, default=989.4, help="dense BF16 peak, TFLOP/s (H200 SXM: 989.4)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    measured = measure(args)
    print(f"measured on {args.device} ({args.threads} thread(s)), the bundled model, {args.turns} demo turns, "
          f"max {args.max_new_tokens} new tokens each:")
    for r in measured[:-1]:
        print(f"  {r['run']:<24} batch {str(r['batch']):>3}: {r['tokens']:>5} tokens ({r['prompt_tokens']:,} prompt tokens "
              f"prefilled) in {r['wall_s']:6.2f} s = {r['tokens_per_s']:7.1f} tok/s  (x{r['ratio_to_batch_1']:.2f} batch 1)")
    p = measured[-1]
    print(f"  {p['run']:<24} batch   1: {p['prompt_tokens']:,} prompt tokens (one token generated per turn) in {p['wall_s']:.2f} s "
          f"= {p['prompt_tokens_per_s']:,.0f} prompt tok/s: what every line above also spends on its prompts")
    rooflines = {}
    for name in args.dims.split(","):
        config = geometry(name)
        rows = [roofline(config, int(b), args.context, args.hbm_gbps, args.tflops) for b in args.roofline_batches.split(",")]
        rooflines[name] = rows
        print(f"roofline, {name} geometry ({rows[0]['step_params'] / 1e9:.3f} B parameters per decode step, BF16), context "
              f"{args.context:,}, {args.hbm_gbps:,.0f} GB/s, {args.tflops:,} TFLOP/s:")
        for r in rows:
            print(f"  batch {r['batch']:>3}: step {r['step_bytes'] / 1e9:8.3f} GB, {r['step_s'] * 1e3:8.3f} ms ({r['bound']}-bound); "
                  f"{r['gpu_s_per_1m_generated']:9.1f} GPU-s per 1M generated tokens; "
                  f"{r['gpu_s_per_1m_prompt']:7.1f} GPU-s per 1M prompt tokens prefilled")
    if args.json:
        args.json.write_text(json.dumps({"measured": measured, "roofline": rooflines, "context": args.context,
                                         "hbm_gbps": args.hbm_gbps, "tflops": args.tflops}, indent=2) + "\n")


if __name__ == "__main__":
    main()
