"""How much bf16 moves the drafts and the engine-counted numbers, against fp32, on one replay each.

    python benchmarks/bf16_drafting.py [--model DIR] [--k 4] [--max-sessions N] [--json OUT] [SESSIONS.jsonl ...]

`compare --traffic same` holds the engine's counters to the run's on the very tokens the engine produced. What
may still differ is numerics: a serving engine drafts in bf16 (its kernels, its order of summation), the run in
whatever dtype it replayed at. This script replays the same sessions through the same checkpoint twice, float32
and bfloat16 (the target and the head both, as a bf16 engine runs them; CPU), and compares them row by row by
(session, request, pos, depth):

    drafts_flipped        share of rows whose draft token differs (every depth)
    drafts_flipped_depth1 the same at depth 1
    matches_flipped       share of rows whose match (draft == recorded token) differs: what can move a count
    per K (engine-counted, over the steps of the simulated decode, as vLLM counts):
        mean acceptance length and per-position acceptance of each run, and their differences

The figure mtp_observe/engines/check.py keeps as BF16_DRAFT_FLIP_SHARE is `drafts_flipped` of the bundled model on
the demo sessions (the defaults here).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mtp_observe.engines.numbers import engine_numbers  # noqa: E402
from mtp_observe.model.loading import default_model_dir
from mtp_observe.report import load_run, resolve_cost, summarize  # noqa: E402
from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.pipeline import replay  # noqa: E402


def rows(run: Path):
    import pandas as pd

    df = pd.read_parquet(run / "positions.parquet", columns=["session_id", "request", "pos", "depth", "draft_token", "match"])
    return df.sort_values(["session_id", "request", "pos", "depth"]).reset_index(drop=True)


def counted(run: Path, k_max: int) -> dict:
    loaded = load_run(run)
    report = summarize(loaded, resolve_cost(loaded), replicates=1)
    out = {}
    for k in range(1, k_max + 1):
        n = engine_numbers(report, k)
        out[k] = {"steps": n.steps, "mean_acceptance_length": n.mean_acceptance_length,
                  "per_position": [float(x) for x in n.per_position]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sessions", nargs="*", type=Path)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--max-sessions", type=int, default=None)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = args.model or default_model_dir()
    sessions = args.sessions or sorted((ROOT / "sessions").glob("*.jsonl"))
    timing = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        runs = {}
        for dtype in ("float32", "bfloat16"):
            start = time.perf_counter()
            runs[dtype] = replay(sessions, model, tmp / dtype, ReplayOptions(k=args.k, device="cpu", dtype=dtype,
                                                                           max_sessions=args.max_sessions))
            timing[dtype] = time.perf_counter() - start
        a, b = rows(runs["float32"]), rows(runs["bfloat16"])
        ca, cb = counted(runs["float32"], args.k), counted(runs["bfloat16"], args.k)
    keys = ["session_id", "request", "pos", "depth"]
    assert len(a) == len(b) and (a[keys] == b[keys]).all().all(), "the two replays scored different rows"
    depth1 = a.depth == 1
    by_k = {}
    for k in range(1, args.k + 1):
        by_k[k] = {
            "float32": ca[k], "bfloat16": cb[k],
            "d_mean_acceptance_length": cb[k]["mean_acceptance_length"] - ca[k]["mean_acceptance_length"],
            "d_per_position": [y - x for x, y in zip(ca[k]["per_position"], cb[k]["per_position"])],
        }
    result = {
        "model": str(model), "sessions": [str(s) for s in sessions], "rows": len(a), "anchors": int(depth1.sum()),
        "drafts_flipped": float((a.draft_token != b.draft_token).mean()),
        "drafts_flipped_depth1": float((a.draft_token != b.draft_token)[depth1].mean()),
        "matches_flipped": float((a.match != b.match).mean()),
        "by_k": by_k, "replay_s": timing,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
