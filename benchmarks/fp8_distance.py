"""How far a block-FP8 copy's rows are from the unquantised original's, weight-only and W8A8 as vLLM serves it.

    python benchmarks/fp8_distance.py [--model DIR] [--scale-dtype float32|bfloat16] [--max-sessions N] [--json OUT]
                                      [--devices h100,b200] [SESSIONS.jsonl ...]

Writes a block-FP8 copy of the checkpoint (synthetic.write_fp8_copy: attention, MLP / expert and
linear-attention projections quantised per 128x128 block, as the official FP8 releases; embeddings,
lm_head, mtp.fc, routers and norms kept), replays the same sessions through the original and through the
copy (CPU, float32) weight-only (`--fp8-activations none`) and as each --devices GPU serves it (W8A8: the
activations of every block-FP8 linear quantised per token per group by the rule of the kernel vLLM picks there,
weights re-quantised to power-of-two scales where it does; serving.py), and compares each with the original by
(session, request, pos, depth):

    target_tokens_equal   fraction of rows whose target argmax is the same
    drafts_equal          fraction of rows whose draft token is the same
    matches_equal         fraction of rows whose match (draft == recorded token) is the same
    max/mean |d target_logprob|, |d draft_logprob|
    alpha_1, tau_sim_3    depth-1 acceptance and the simulated decode's tokens per step at K = 3 of each run

Defaults: the bundled model (trained; its hidden size 192 is not a multiple of 128, so partial blocks are
exercised, and on an H100 only the linears whose input is a multiple of 128 take the FlashInfer/DeepGEMM rule,
the others CUTLASS's) and the demo sessions in sessions/.
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

from mtp_observe.model.loading import default_model_dir
from mtp_observe.model.synthetic import write_fp8_copy  # noqa: E402
from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.pipeline import replay  # noqa: E402


def rows(run: Path):
    import pandas as pd

    df = pd.read_parquet(run / "positions.parquet")
    return df.sort_values(["session_id", "request", "pos", "depth"]).reset_index(drop=True)


def compare(a, b, run: Path) -> dict:
    """b's rows against the original's (a), and b's own α1 and τ_sim(3) from its report."""
    from mtp_observe.report import read_and_summarize

    assert len(a) == len(b) and (a[["session_id", "request", "pos", "depth"]] == b[["session_id", "request", "pos", "depth"]]).all().all()
    report = read_and_summarize(run, replicates=20).report
    manifest = json.loads((run / "run.json").read_text())
    return {
        "serving": manifest.get("serving"),
        "target_tokens_equal": float((a.target_token == b.target_token).mean()),
        "drafts_equal": float((a.draft_token == b.draft_token).mean()),
        "matches_equal": float((a.match == b.match).mean()),
        "max_abs_d_target_logprob": float((a.target_logprob - b.target_logprob).abs().max()),
        "mean_abs_d_target_logprob": float((a.target_logprob - b.target_logprob).abs().mean()),
        "max_abs_d_draft_logprob": float((a.draft_logprob - b.draft_logprob).abs().max()),
        "mean_abs_d_draft_logprob": float((a.draft_logprob - b.draft_logprob).abs().mean()),
        # depth-1 matches the copy gains and loses against the original (α1 moves by their difference)
        "depth1_matches_gained": int(((a.depth == 1) & b.match & ~a.match).sum()),
        "depth1_matches_lost": int(((a.depth == 1) & a.match & ~b.match).sum()),
        "alpha_1": float(report.overall.value.alpha[0]),
        "tau_sim_3": float(report.overall.value.tau_sim[2]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sessions", nargs="*", type=Path)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--scale-dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--max-sessions", type=int, default=None)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--devices", default="h100,b200", help="serve devices whose W8A8 numerics to replay")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = args.model or default_model_dir()
    sessions = args.sessions or sorted((ROOT / "sessions").glob("*.jsonl"))
    variants = [("fp8 weight-only", {"fp8_activations": "none"})] + \
        [(f"fp8 W8A8 {d}", {"serve_device": d}) for d in args.devices.split(",") if d]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        fp8 = write_fp8_copy(model, tmp / "fp8", getattr(torch, args.scale_dtype))
        base = dict(k=args.k, device="cpu", dtype="float32", max_sessions=args.max_sessions)
        original_run = replay(sessions, model, tmp / "original", ReplayOptions(**base))
        a = rows(original_run)
        from mtp_observe.report import read_and_summarize

        report = read_and_summarize(original_run, replicates=20).report
        result = {"model": str(model), "scale_dtype": args.scale_dtype, "rows": len(a), "anchors": int((a.depth == 1).sum()),
                  "original": {"alpha_1": float(report.overall.value.alpha[0]),
                               "tau_sim_3": float(report.overall.value.tau_sim[2])},
                  "variants": {}}
        for name, options in variants:
            run = replay(sessions, fp8, tmp / name.replace(" ", "-"), ReplayOptions(**base, **options))
            result["variants"][name] = compare(a, rows(run), run)
    print(json.dumps(result, indent=2))
    print(f"\n| replay | target argmax = original | drafts = original | α1 | τ_sim(3) |\n|---|---|---|---|---|\n"
          f"| original ({model.name}) | | | {result['original']['alpha_1']:.4f} | {result['original']['tau_sim_3']:.4f} |")
    for name, v in result["variants"].items():
        print(f"| {name} | {v['target_tokens_equal']:.2%} | {v['drafts_equal']:.2%} | {v['alpha_1']:.4f} | "
              f"{v['tau_sim_3']:.4f} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
