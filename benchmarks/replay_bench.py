"""Replay cost against the bare target prefill, on one fixed workload, ratios in one run.

    python benchmarks/replay_bench.py [--sessions N] [--threads T] [--device cpu|cuda] [--dtype ...] [--json OUT]
                                      [--dims small|0.8b|27b] [--layers L] [--source auto|public|generated] [--vocab V]
                                      [--profiles default|two]

Workload: a Qwen3.5-shaped model with the real vocabulary (248,320) written with random weights
(`--dims small`, the default, has reduced depth and width so it runs on a laptop CPU; `0.8b` and
`27b` use the real Qwen3.5-0.8B / -27B widths for a GPU), replaying the first N tau-bench sessions
of ../shared/sessions-public (or, without that folder, the deterministic sessions of
sessions_bench.py). Reported in one run:

    replay      the pipeline's replay of every request (target prefill, head row pass and chain,
                lm_head reductions at the rows' positions, rows)
    prefill     the bare target prefill on the same requests (hidden states only, no lm_head)
    ratio       replay / prefill (wall time); replay_cpu_s / prefill_cpu_s: the process's CPU time, which a
                shared machine disturbs less than wall time
    FLOP floor  the same ratio computed from FLOPs alone (matmuls and attention; what the replay
                must do beyond the prefill: head rows, chain steps, lm_head at scored positions)
    tokens/s    replayed tokens per second; peak RSS (and peak GPU memory on CUDA)

Profiles: `default` scores what `replay` scores by default (the built-in profiles, the checkpoint's
generation_config and `recorded`, equal ones computed once); `two` scores the two penalty-free top-k
profiles the replay had before penalties (T 0.6/0.95/20 and 0.7/0.8/20), to compare like with like.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtp_observe.model.loading import load_model, resolve_device, resolve_dtype
from mtp_observe.model.synthetic import SyntheticSpec, write_synthetic_checkpoint  # noqa: E402
from mtp_observe.model.target import SamplingProfile, prefill  # noqa: E402
from mtp_observe.run.memory import maxrss_bytes  # noqa: E402
from mtp_observe.run.options import ReplayOptions, default_profiles, recorded_fallback
from mtp_observe.run.pipeline import RECORDED
from mtp_observe.run.requests import replay_session, shared_prefix
from mtp_observe.sessions.reading import read_sessions  # noqa: E402
from mtp_observe.sessions.rendering import Renderer  # noqa: E402

DIMS = {
    # reduced width and depth, real vocabulary, the real 3:1 linear/full layer pattern
    "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, full_attention_interval=4,
                  num_attention_heads=4, num_key_value_heads=1, head_dim=64, linear_num_key_heads=2,
                  linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64),
    "0.8b": dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, full_attention_interval=4,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                 linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128, tie_word_embeddings=True),
    "27b": dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=64, full_attention_interval=4,
                num_attention_heads=24, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
                linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128),
}


def sessions_file(work: Path, n: int, source: str) -> Path:
    shared = Path(__file__).resolve().parents[2] / "shared" / "sessions-public" / "tau-bench_gpt-4o-airline"
    out = work / "sessions.jsonl"
    if source == "public" or (source == "auto" and shared.is_dir()):
        tools = json.loads((shared / "tools_airline.openai.json").read_text())
        data = json.loads((shared / "gpt-4o-airline.json").read_text())[:n]
        out.write_text("".join(json.dumps({"id": f"{s['task_id']}-{s['trial']}", "messages": s["traj"], "tools": tools}) + "\n" for s in data))
    else:
        import random

        from sessions_bench import session

        rng = random.Random(0)
        out.write_text("".join(json.dumps(session(rng, i)) + "\n" for i in range(n)))
    return out


def starts(requests) -> list[int]:
    """Where each request's new tokens begin: after the prefix it shares with the request before it."""
    out = [0]
    for a, b in zip(requests, requests[1:]):
        out.append(min(shared_prefix(a.input_ids, b.input_ids), len(b.input_ids) - 1))
    return out


def flops(model, sessions, k: int) -> tuple[float, float]:
    """(bare prefill FLOPs, replay FLOPs): 2 x weights per new token plus attention over the context.

    A request's tokens shared with the request before it are computed once (prefix reuse), in the
    prefill as in the replay."""
    cfg = model.target.config
    g = model.head.geometry
    H, V = g.hidden_size, g.vocab_size
    trunk = sum(p.numel() for n, p in model.target.model.named_parameters() if "embed_tokens" not in n)
    head = sum(t.numel() for t in model.head.named_weights().values() if t.dim() >= 2)  # a dense head's matrices
    full_layers = sum(t == "full_attention" for t in cfg.layer_types)

    def attention(queries: float, keys: float, heads: int, d: int) -> float:
        return 4.0 * queries * keys * heads * d  # QK^T and PV

    prefill = replay = 0.0
    for requests in sessions:
        for r, s0 in zip(requests, starts(requests)):
            n = len(r.input_ids)
            new = n - s0
            pre = 2.0 * trunk * new + full_layers * attention(new, (n + s0) / 2, cfg.num_attention_heads, cfg.head_dim)
            positions = set()
            anchors = rows = chain = 0.0
            for sp in r.spans:
                for p in range(max(sp.start, 1), sp.end):
                    depth = min(k, sp.end - p)
                    anchors += 1
                    rows += depth
                    chain += (depth - 1) * (2.0 * head + attention(1, p + depth, g.num_heads, g.head_dim))
                    positions.update(range(p, p + depth))
            head_rows = 2.0 * head * new + attention(new, (n + s0) / 2, g.num_heads, g.head_dim)
            lm = 2.0 * V * H * (len(positions) + rows)  # target at each distinct position, head at each (anchor, depth)
            prefill += pre
            replay += pre + head_rows + chain + lm
    return prefill, replay


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--dims", default="small", choices=sorted(DIMS))
    ap.add_argument("--layers", type=int, default=None, help="override the number of target layers")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--source", default="auto", choices=("auto", "public", "generated"),
                    help="tau-bench sessions of ../shared/sessions-public (auto: when present) or generated ones")
    ap.add_argument("--vocab", type=int, default=248_320, help="vocabulary size (the real one by default; smaller for a smoke test)")
    ap.add_argument("--chunk-size", type=int, default=2048)
    ap.add_argument("--profiles", default="default", choices=("default", "two"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--keep-model", type=Path, default=None, help="write the checkpoint here and keep it (e.g. for probe)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    work = Path(tempfile.mkdtemp(prefix="replay-bench-"))
    dims = dict(DIMS[args.dims])
    if args.layers:
        dims["num_hidden_layers"] = args.layers
    spec = SyntheticSpec(vocab_size=args.vocab, shards=1, dtype="bfloat16" if dtype == torch.bfloat16 else "float32", **dims)
    t0 = time.time()
    model_dir = write_synthetic_checkpoint(args.keep_model or work / "model", spec)
    print(f"model written in {time.time() - t0:.0f} s: {args.dims} dims, vocab {args.vocab:,}, {spec.num_hidden_layers} layers")
    model = load_model(model_dir, device=device, dtype=dtype)
    if args.profiles == "two":
        profiles = (SamplingProfile("thinking", 0.6, 0.95, 20), SamplingProfile("instruct", 0.7, 0.8, 20))
    else:
        defaults = default_profiles(model_dir)
        fallback, _ = recorded_fallback(ReplayOptions(profiles=defaults), model_dir)
        profiles = defaults + (fallback.renamed(RECORDED),)
    renderer = Renderer.from_model_dir(model_dir)
    sessions = [renderer.render(s).requests for s in read_sessions([sessions_file(work, args.sessions, args.source)])]
    requests = [r for s in sessions for r in s]
    tokens = sum(len(r.input_ids) for r in requests)
    unique = sum(len(r.input_ids) - s0 for s in sessions for r, s0 in zip(s, starts(s)))
    scored = sum(sp.end - sp.start + 1 for r in requests for sp in r.spans)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    # Warm-up on the smallest request, then each measurement over every request.
    smallest = min(requests, key=lambda r: len(r.input_ids))
    replay_session(model, [smallest], args.k, profiles, args.chunk_size)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    sync()
    t0, c0 = time.perf_counter(), time.process_time()
    for s in sessions:  # the bare target over the same new tokens: the same prefix reuse, no head, no lm_head
        carry = None
        for r, after in zip(s, [*s[1:], None]):
            keep = min(shared_prefix(r.input_ids, after.input_ids), len(r.input_ids) - 1) if after else None
            keep = keep if keep is not None and keep >= 2 and keep >= (carry.length if carry else 0) else None
            carry = carry if carry is not None and 2 <= carry.length < len(r.input_ids) else None
            _, carry = prefill(model.target, torch.tensor(r.input_ids), args.chunk_size, prefix=carry, keep_at=keep)
    sync()
    prefill_s, prefill_cpu = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    for s in sessions:
        replay_session(model, s, args.k, profiles, args.chunk_size)
    sync()
    replay_s, replay_cpu = time.perf_counter() - t0, time.process_time() - c0
    f_prefill, f_replay = flops(model, sessions, args.k)
    result = {
        "dims": args.dims, "vocab": args.vocab, "sessions": len(sessions), "layers": spec.num_hidden_layers, "device": device, "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(), "k": args.k, "profiles": [p.name for p in profiles], "requests": len(requests), "tokens": tokens, "new_tokens": unique, "scored_tokens": scored,
        "replay_s": round(replay_s, 2), "prefill_s": round(prefill_s, 2), "ratio": round(replay_s / prefill_s, 2),
        "replay_cpu_s": round(replay_cpu, 2), "prefill_cpu_s": round(prefill_cpu, 2),
        "flop_floor_ratio": round(f_replay / f_prefill, 2), "tokens_per_s": round(tokens / replay_s, 1),
        "new_tokens_per_s": round(unique / replay_s, 1),
        "peak_rss_gb": round(maxrss_bytes(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1e9, 2),
    }
    if device.startswith("cuda"):
        result["peak_gpu_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)
        result["mfu"] = round(f_replay / replay_s / 989e12, 4)  # vs dense bf16 peak of an H100/H200
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
