"""The CPU cost of `replay --grammar tools`, and what the grammar measures on tool-call spans (docs/grammar.md).

    python benchmarks/grammar_bench.py SESSIONS.jsonl [--max-sessions N] [--out DIR]

Replays the same sessions three times with the bundled model, one after the other in fresh processes: plain
(--drafters mtp), with the grammar (--drafters mtp --grammar tools: the same rows, the grammar's columns added) and
with the grammar drafters (--drafters mtp,grammar,grammar+mtp --grammar tools: three drafters' rows, each verified by
the target). Prints one JSON object: wall and CPU seconds (user + system of the child, less sensitive to a shared
machine than wall time), `ratio` = grammar / plain in CPU seconds (the target is <= 1.3x) and `ratio_with_drafters`,
the grammar's own seconds (compile, scan) from run.json, and on the tool-call rows of the last run:
forced share, alpha_k per drafter (mtp with and without the mask), tokens per step on tool calls
(mtp_observe.report.grammar.grammar_summary, what `report` shows for the run).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from mtp_observe.report.grammar import grammar_summary


def _replay(files, out: Path, extra: list[str], max_sessions: int | None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child: user + system) of one replay in a fresh process."""
    import resource

    cmd = [sys.executable, "-m", "mtp_observe", "replay", *map(str, files), "--out", str(out), "--overwrite",
           "--progress-every", "0", *extra] + (["--max-sessions", str(max_sessions)] if max_sessions else [])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return time.perf_counter() - t0, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--max-sessions", type=int, default=None)
    ap.add_argument("--out", type=Path, default=Path("/tmp/grammar-bench"))
    a = ap.parse_args()
    plain = _replay(a.files, a.out / "plain", ["--drafters", "mtp"], a.max_sessions)
    masked = _replay(a.files, a.out / "masked", ["--drafters", "mtp", "--grammar", "tools"], a.max_sessions)
    drafters = _replay(a.files, a.out / "grammar", ["--drafters", "mtp,grammar,grammar+mtp", "--grammar", "tools"],
                       a.max_sessions)
    seconds = json.loads((a.out / "grammar" / "run.json").read_text())["grammar_tally"]["seconds"]
    print(json.dumps({"wall_s": {"plain": round(plain[0], 1), "grammar": round(masked[0], 1),
                                 "grammar_drafters": round(drafters[0], 1)},
                      "cpu_s": {"plain": round(plain[1], 1), "grammar": round(masked[1], 1),
                                "grammar_drafters": round(drafters[1], 1)},
                      "ratio": round(masked[1] / plain[1], 3), "ratio_with_drafters": round(drafters[1] / plain[1], 3),
                      "grammar_seconds": seconds, **grammar_summary(a.out / "grammar")}, indent=1))


if __name__ == "__main__":
    main()
