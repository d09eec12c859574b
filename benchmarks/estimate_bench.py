"""The estimate against the measured time, and the ETA's steadiness, on this machine in one run.

    OMP_NUM_THREADS=1 python benchmarks/estimate_bench.py [--corpus tau2-bench_grok] [--sessions 10] [--skip-generate]
                                                          [--skip-corpus] [--skip-demo] [--extras] [--every 30]
                                                          [--json OUT]

For each workload the estimate is made exactly as `replay --dry-run` / `generate --dry-run` make it (rendering,
a calibration of a few hundred tokens on the loaded model: pipeline.replay_estimate, generation.generate_estimate),
then the work is run and timed (pipeline.replay into a temporary run directory, generation.generate into a
temporary file), on the CPU with the threads torch is given (on a shared machine run it under OMP_NUM_THREADS=1:
OpenMP threads spinning for a busy core slow the bundled model several-fold, calibration and run alike):

    demo replay     the bundled model over sessions/*.jsonl (the quickstart's replay)
    demo generate   the bundled model completing the demo's 57 turns (--max-new-tokens 1024: its turns end by
                    themselves within about 40 tokens; the estimate's range runs from the recorded turns'
                    lengths to 1,024 each)
    demo extras     (--extras) the demo replay with seven --head-precision what-ifs and --draft-p-min 0.3,0.5,0.8
                    (issue 43's reproduction), and with --tree 3,4,8: the estimate prices each term
                    (estimate_terms.py) and prints its breakdown first
    corpus replay   the bundled model over the first --sessions sessions of a folder of ../shared/sessions-public
                    (imported with `import auto`)

Each row: the estimate's point (the priced work) and range, the measured wall seconds, measured / point, and
whether the range held it. During each replay the progress line's ETA (progress.ProgressCounter fed by the
replay's own events) is read every --every seconds and set against the time that was really left: the largest
change of that ratio between two consecutive readings (the issue: the ETA swung between 8:54 and 15:55 on
steady work), and the ETA at a third of the way.
A shared machine (other jobs on its cores) moves every figure; the calibration measures the machine as it is
when it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class Watch:
    """A replay observer that feeds a ProgressCounter and reads its ETA every `every` seconds on a timer."""

    def __init__(self, every: float):
        from mtp_observe.run.progress import ProgressCounter

        self.counter = ProgressCounter()
        self.every = every
        self.readings: list[tuple[float, float | None]] = []  # (seconds since start, ETA)
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()

    def _tick(self):
        while not self._stop.wait(self.every):
            if self.counter.begun:
                self.readings.append((time.monotonic() - self._t0, self.counter.snapshot().eta_s))

    def stop(self):
        self._stop.set()
        self._thread.join()

    def estimate(self, estimate):  # defined on the class: the replay gives an estimate only to an observer that takes one
        self.counter.estimate(estimate)

    def __getattr__(self, name):
        if name in ("warn", "note"):
            return lambda message: None
        return getattr(self.counter, name)


def eta_figures(readings, wall: float) -> dict:
    """The ETA against the time really left: the largest change of their ratio between two consecutive readings
    (1: the ETA moves as the time left does; over the readings with more than a minute left), the largest error,
    and the reading at a third of the way."""
    etas = [(t, e, wall - t) for t, e in readings if e is not None and wall - t > 60]
    ratios = [e / left for _, e, left in etas]
    steps = [max(a, b) / min(a, b) for a, b in zip(ratios, ratios[1:]) if min(a, b) > 0]
    third = next(((t, e) for t, e, _ in etas if t >= wall / 3), None)
    return {"readings": len(etas), "max_consecutive_ratio": max(steps) if steps else None,
            "max_error": max(abs(r - 1) for r in ratios) if ratios else None,
            "eta_at_a_third_s": third[1] if third else None, "left_at_a_third_s": wall - third[0] if third else None,
            "etas": [(round(t), round(e), round(left)) for t, e, left in etas]}


def row(name: str, estimate, wall: float, extra: dict | None = None) -> dict:
    from mtp_observe.run.estimate import estimate_line, work_fields

    lo, hi = estimate.seconds
    point = estimate.point_s
    out = {"workload": name, "line": estimate_line(estimate), "work": work_fields(estimate.work),
           "rates": {**work_fields(estimate.rates), "terms": [work_fields(t) for t in estimate.rates.terms]}, "point_s": point, "range_s": [lo, hi], "measured_s": wall,
           "measured_over_point": wall / point, "inside_range": lo <= wall <= hi}
    out.update(extra or {})
    return out


def replay_row(name: str, files, every: float, **options) -> dict:
    from mtp_observe.model.loading import default_model_dir
    from mtp_observe.run.estimate import breakdown_lines
    from mtp_observe.run.options import ReplayOptions
    from mtp_observe.run.pipeline import replay, replay_estimate

    opts = ReplayOptions(device="cpu", **options)
    started = time.perf_counter()
    estimate = replay_estimate(files, default_model_dir(), opts)
    estimate_s = time.perf_counter() - started
    for line in breakdown_lines(estimate):
        print(line, flush=True)
    watch = Watch(every)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        replay(files, default_model_dir(), Path(tmp) / "run", opts, bundled=True, observer=watch)
        wall = time.perf_counter() - started
    watch.stop()
    return row(name, estimate, wall, {"estimate_s": estimate_s, "eta": eta_figures(watch.readings, wall),
                                      "breakdown": breakdown_lines(estimate), "load_before": load_before,
                                      "load_after": os.getloadavg()})


def generate_row(name: str, files) -> dict:
    from mtp_observe.model.loading import default_model_dir
    from mtp_observe.run.generation import GenerateOptions, generate, generate_estimate

    opts = GenerateOptions(device="cpu")
    started = time.perf_counter()
    estimate = generate_estimate(files, default_model_dir(), opts)
    estimate_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        summary = generate(files, default_model_dir(), Path(tmp) / "own.jsonl", opts)
        wall = time.perf_counter() - started
    return row(name, estimate, wall, {"estimate_s": estimate_s, "generated": summary.tokens,
                                      "prompt_tokens": summary.prompt_tokens})


def corpus_sessions(folder: str, n: int, tmp: Path) -> Path:
    from mtp_observe.sessions.importers import import_files
    from tests.conftest import SESSIONS_PUBLIC

    if SESSIONS_PUBLIC is None:
        sys.exit("no public corpus (../shared/sessions-public)")
    every = tmp / "all.jsonl"
    import_files("auto", [SESSIONS_PUBLIC / folder], every, on_error="skip", warn=lambda message: None)
    first = tmp / f"{folder}-first-{n}.jsonl"
    first.write_text("".join(every.read_text().splitlines(keepends=True)[:n]))
    return first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default="tau2-bench_grok", help="a folder of ../shared/sessions-public")
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--every", type=float, default=30.0, help="seconds between two ETA readings")
    ap.add_argument("--skip-generate", action="store_true")
    ap.add_argument("--skip-corpus", action="store_true")
    ap.add_argument("--skip-demo", action="store_true", help="leave out the plain demo replay")
    ap.add_argument("--extras", action="store_true",
                    help="also the demo replay with issue 43's extras: seven what-if precisions and three --draft-p-min "
                         "thresholds; and with --tree 3,4,8")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    demo = sorted((ROOT / "sessions").glob("*.jsonl"))
    rows = []

    def done(r: dict) -> None:
        rows.append(r)
        say(r)
        if args.json:
            args.json.write_text(json.dumps({"rows": rows, "load_average": os.getloadavg()}, indent=1))

    if not args.skip_demo:
        done(replay_row("demo replay", demo, args.every))
    if args.extras:
        from mtp_observe.drafting.tree import parse_tree

        precisions = ("bf16", "fp8", "int8", "nvfp4", "q8_0", "q6_k", "q4_k")
        done(replay_row("demo replay, --head-precision (7) --draft-p-min 0.3,0.5,0.8", demo, args.every,
                        head_precisions=precisions, draft_p_min=(0.3, 0.5, 0.8)))
        done(replay_row("demo replay, --tree 3,4,8", demo, args.every, trees=(parse_tree("3,4,8"),)))
    if not args.skip_generate:
        done(generate_row("demo generate", demo))
    if not args.skip_corpus:
        with tempfile.TemporaryDirectory() as tmp:
            files = [corpus_sessions(args.corpus, args.sessions, Path(tmp))]
            done(replay_row(f"{args.corpus} replay, first {args.sessions} sessions", files, args.every))


def say(r: dict) -> None:
    """One workload's figures, printed as it ends."""
    eta = r.get("eta") or {}
    ratio = eta.get("max_consecutive_ratio")
    print(f"{r['workload']}: estimate {r['point_s']:.0f} s [{r['range_s'][0]:.0f}, {r['range_s'][1]:.0f}], measured "
          f"{r['measured_s']:.0f} s, measured/point {r['measured_over_point']:.2f}, "
          f"{'inside' if r['inside_range'] else 'OUTSIDE'} the range"
          + (f"; ETA/left: largest step between readings x{ratio:.2f}" if ratio else "")
          + (f", at a third {eta['eta_at_a_third_s']:.0f} s for {eta['left_at_a_third_s']:.0f} s left"
             if eta.get("eta_at_a_third_s") is not None else ""))
    print(f"  {r['line']}", flush=True)
    if "load_before" in r:
        print(f"  load average (1, 5, 15 min) before {tuple(round(x, 1) for x in r['load_before'])}, after "
              f"{tuple(round(x, 1) for x in r['load_after'])}", flush=True)


if __name__ == "__main__":
    main()
