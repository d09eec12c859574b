"""What the what-ifs cost a replay: all seven head precisions and the confidence column against the plain run, in one run.

    python benchmarks/whatifs_bench.py [--model DIR] [--sessions N] [--k 4] [--threads 1] [--json OUT]
                                       [--precisions bf16,fp8,int8,nvfp4,q8_0,q6_k,q4_k] [--draft-p-min 0.3,0.5,0.8]
                                       [--per-precision]

Workload: the bundled model (default) replaying the demo sessions (sessions/*.jsonl), each session twice in turn —
plain, then with the what-ifs (`replay --head-precision ... --draft-p-min ...`'s HeadWhatIfs) — so both see the
same load on a shared machine. Reported:

    plain_cpu_s, whatif_cpu_s   the process's CPU time of replay_session over every session, each way (wall too)
    ratio                       whatif / plain CPU time
    per_precision_cpu_s         with --per-precision: the extra CPU time of a replay with one precision, each
    build_s                     building the what-if heads once (every round trip: the quantisers), CPU seconds
    target_forwards             the target's forward calls, each way: equal (the what-ifs re-run the head only; the
                                target's logits at the rows' positions are reduced once for every head)
    thresholds                  the --draft-p-min thresholds cost the replay nothing beyond the confidence column
                                (the report walks them): the report's CPU time with and without them
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtp_observe.drafting.whatif_heads import HeadWhatIfs
from mtp_observe.model.loading import default_model_dir, load_model
from mtp_observe.model.precisions import PRECISIONS, head_at, head_recipes  # noqa: E402
from mtp_observe.model.target import RECORDED
from mtp_observe.run.options import ReplayOptions, default_profiles, recorded_fallback
from mtp_observe.run.pipeline import replay
from mtp_observe.run.requests import replay_session
from mtp_observe.sessions.reading import read_sessions  # noqa: E402
from mtp_observe.sessions.rendering import Renderer  # noqa: E402


def cpu() -> float:
    return time.process_time()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--sessions", type=int, default=7)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--draft-p-min", default="0.3,0.5,0.8")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--per-precision", action="store_true", help="also time a replay with each precision alone")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = args.model or default_model_dir()
    names = tuple(p.strip() for p in args.precisions.split(",") if p.strip())
    thresholds = tuple(float(t) for t in args.draft_p_min.split(",") if t.strip())
    root = Path(__file__).resolve().parents[1]
    files = sorted((root / "sessions").glob("*.jsonl"))
    model = load_model(model_dir)
    renderer = Renderer.from_model_dir(model_dir, vocab_size=model.info.geometry.vocab_size)
    fallback, _ = recorded_fallback(ReplayOptions(), model_dir)
    profiles = tuple(default_profiles(model_dir)) + (fallback.renamed(RECORDED),)
    sessions = [s for s in read_sessions(files)][: args.sessions]
    rendered = [renderer.render(s).requests for s in sessions]

    t0 = cpu()
    recipes = head_recipes(model.info, names)
    heads = {p: head_at(model.head, recipes[p]) for p in names}
    build_s = cpu() - t0

    calls = {"n": 0}
    forward = model.target.model.forward

    def counting(*a, **kw):
        calls["n"] += 1
        return forward(*a, **kw)

    model.target.model.forward = counting

    def timed(whatifs) -> tuple[float, float, int]:
        calls["n"] = 0
        c0, w0 = cpu(), time.perf_counter()
        for requests in rendered:
            replay_session(model, requests, args.k, profiles, 2048, whatifs=whatifs)
        return cpu() - c0, time.perf_counter() - w0, calls["n"]

    timed(None)  # warm-up
    plain = timed(None)
    everything = timed(HeadWhatIfs(heads, confidence=bool(thresholds)))
    per_precision = {}
    for p in names if args.per_precision else ():
        alone = timed(HeadWhatIfs({p: heads[p]}, confidence=False))
        per_precision[p] = round(alone[0] - plain[0], 3)
    confidence_only = timed(HeadWhatIfs({}, confidence=True))

    # The thresholds: the report's CPU time on a run with the confidence column, with and without them.
    from mtp_observe.report import read_and_summarize

    with __import__("tempfile").TemporaryDirectory() as tmp:
        out = replay(files, model_dir, Path(tmp) / "run", ReplayOptions(k=args.k, device="cpu", draft_p_min=thresholds,
                                                                        max_sessions=args.sessions))
        c0 = cpu()
        read_and_summarize(out, replicates=1000)
        report_with = cpu() - c0
        manifest = json.loads((out / "run.json").read_text())
        manifest["whatifs"] = None
        (out / "run.json").write_text(json.dumps(manifest))
        c0 = cpu()
        read_and_summarize(out, replicates=1000)
        report_without = cpu() - c0

    result = {
        "model": str(model_dir), "sessions": len(rendered), "requests": sum(len(r) for r in rendered),
        "tokens": sum(len(q.input_ids) for r in rendered for q in r), "k": args.k, "threads": args.threads,
        "precisions": list(names), "draft_p_min": list(thresholds),
        "plain_cpu_s": round(plain[0], 3), "plain_wall_s": round(plain[1], 3),
        "whatif_cpu_s": round(everything[0], 3), "whatif_wall_s": round(everything[1], 3),
        "ratio": round(everything[0] / plain[0], 3), "confidence_only_cpu_s": round(confidence_only[0], 3),
        "per_precision_cpu_s": per_precision, "build_s": round(build_s, 3),
        "target_forwards": {"plain": plain[2], "whatif": everything[2]},
        "report_cpu_s": {"with_thresholds": round(report_with, 3), "without": round(report_without, 3)},
    }
    print(f"{result['sessions']} sessions, {result['requests']} requests, {result['tokens']:,} tokens, K={args.k}, "
          f"{args.threads} thread(s)")
    print(f"plain replay            {plain[0]:8.2f} s CPU  ({plain[1]:.2f} s wall), target forwards {plain[2]}")
    print(f"+ {len(names)} precisions, confidence {everything[0]:8.2f} s CPU  ({everything[1]:.2f} s wall), target forwards "
          f"{everything[2]}: x{result['ratio']:.2f}")
    print(f"confidence column alone {confidence_only[0]:8.2f} s CPU")
    if per_precision:
        print("extra CPU per precision: " + ", ".join(f"{p} {s:+.2f} s" for p, s in per_precision.items()))
    print(f"building the {len(names)} what-if heads (every round trip): {build_s:.2f} s CPU")
    print(f"report, {len(thresholds)} thresholds walked: {report_with:.2f} s CPU; without them {report_without:.2f} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
