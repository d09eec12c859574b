"""How far a block-FP8 copy's rows are from the unquantised original's, on one replay each.

    python benchmarks/fp8_distance.py [--model DIR] [--scale-dtype float32|bfloat16] [--max-sessions N] [--json OUT]
                                      [SESSIONS.jsonl ...]

Writes a block-FP8 copy of the checkpoint (synthetic.write_fp8_copy: attention, MLP / expert and
linear-attention projections quantised per 128x128 block, as the official FP8 releases; embeddings,
lm_head, mtp.fc, routers and norms kept), replays the same sessions through both (CPU, float32) and
compares the rows by (session, request, pos, depth):

    target_tokens_equal   fraction of rows whose target argmax is the same
    drafts_equal          fraction of rows whose draft token is the same
    matches_equal         fraction of rows whose match (draft == recorded token) is the same
    max/mean |d target_logprob|, |d draft_logprob|
    alpha_1               depth-1 acceptance of each run (the number the FP8 copy would report)

Defaults: the bundled model (trained; its hidden size 192 is not a multiple of 128, so partial blocks are
exercised) and the demo sessions in sessions/.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mtp_observe.pipeline import ReplayOptions, default_model_dir, replay  # noqa: E402
from mtp_observe.synthetic import write_fp8_copy  # noqa: E402


def rows(run: Path):
    import pandas as pd

    df = pd.read_parquet(run / "positions.parquet")
    return df.sort_values(["session_id", "request", "pos", "depth"]).reset_index(drop=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sessions", nargs="*", type=Path)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--scale-dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--max-sessions", type=int, default=None)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = args.model or default_model_dir()
    sessions = args.sessions or sorted((ROOT / "sessions").glob("*.jsonl"))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        fp8 = write_fp8_copy(model, tmp / "fp8", getattr(torch, args.scale_dtype))
        opts = ReplayOptions(k=args.k, device="cpu", dtype="float32", max_sessions=args.max_sessions)
        a = rows(replay(sessions, model, tmp / "original", opts))
        b = rows(replay(sessions, fp8, tmp / "fp8-run", opts))
    assert len(a) == len(b) and (a[["session_id", "request", "pos", "depth"]] == b[["session_id", "request", "pos", "depth"]]).all().all()
    depth1 = a.depth == 1
    result = {
        "model": str(model), "scale_dtype": args.scale_dtype, "rows": len(a), "anchors": int(depth1.sum()),
        "target_tokens_equal": float((a.target_token == b.target_token).mean()),
        "drafts_equal": float((a.draft_token == b.draft_token).mean()),
        "matches_equal": float((a.match == b.match).mean()),
        "max_abs_d_target_logprob": float((a.target_logprob - b.target_logprob).abs().max()),
        "mean_abs_d_target_logprob": float((a.target_logprob - b.target_logprob).abs().mean()),
        "max_abs_d_draft_logprob": float((a.draft_logprob - b.draft_logprob).abs().max()),
        "mean_abs_d_draft_logprob": float((a.draft_logprob - b.draft_logprob).abs().mean()),
        "alpha_1_original": float(a.match[depth1].mean()),
        "alpha_1_fp8": float(b.match[depth1].mean()),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
