"""The CPU cost of `replay --grammar tools`, and what the grammar measures on tool-call spans (docs/grammar.md).

    python benchmarks/grammar_bench.py SESSIONS.jsonl [--max-sessions N] [--out DIR]

Replays the same sessions twice with the bundled model — a plain replay (--drafters mtp) and one with the grammar
(--grammar tools --drafters mtp,grammar,grammar+mtp) — one after the other in fresh processes, and prints one JSON
object: both wall times and their ratio (the target is <= 1.3x), the grammar's own seconds (compile, scan) from
run.json, and on the tool-call rows of the grammar run:
    forced_share       forced tokens / tool-call tokens (run.json grammar_tally)
    alpha_k            per drafter, at depth k: the share of tool-call anchors whose draft is accepted through k
                       (Kmax rows; mtp also "mtp_masked": accepted and allowed by the grammar at every depth)
    mean_accepted      per drafter, 1 + the mean accepted length at tool-call anchors at K = Kmax
Rows are read with pyarrow; nothing here imports the report.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def _replay(files, out: Path, extra: list[str], max_sessions: int | None) -> float:
    cmd = [sys.executable, "-m", "mtp_observe", "replay", *map(str, files), "--out", str(out), "--overwrite",
           "--progress-every", "0", *extra] + (["--max-sessions", str(max_sessions)] if max_sessions else [])
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def tool_call_numbers(run: Path) -> dict:
    """forced share, alpha_k and mean accepted length per drafter on the tool-call anchors of a --grammar run."""
    import numpy as np
    import pyarrow.parquet as pq

    manifest = json.loads((run / "run.json").read_text())
    k = int(manifest["k"])
    t = pq.read_table(run / "positions.parquet",
                      columns=["segment", "drafter", "draft_k", "depth", "accepted", "draft_allowed", "forced"])
    seg = np.asarray(t["segment"].to_pandas().astype(str))
    drafter = np.asarray(t["drafter"].to_pandas().astype(str))
    depth = t["depth"].to_numpy()
    draft_k = t["draft_k"].to_numpy()
    accepted = t["accepted"].to_numpy(zero_copy_only=False)
    allowed = t["draft_allowed"].to_numpy(zero_copy_only=False)
    forced = t["forced"].to_numpy(zero_copy_only=False)
    tally = manifest.get("grammar_tally", {})
    out = {"forced_share": round(tally.get("forced_tokens", 0) / max(tally.get("tool_call_tokens", 0), 1), 4),
           "forced_share_rows": None, "tally": {key: v for key, v in tally.items() if key != "flagged"},
           "alpha_k": {}, "mean_accepted": {}}
    tool = (seg == "tool_call") & (draft_k == k)
    first = tool & (depth == 1)
    out["forced_share_rows"] = round(float(forced[first & (drafter == "mtp")].mean()), 4) if first.any() else None
    for name in sorted(set(drafter)):
        rows = tool & (drafter == name)
        anchors = int((rows & (depth == 1)).sum())
        if not anchors:
            continue
        out["alpha_k"][name] = [round(float((rows & (depth == d) & accepted).sum() / anchors), 4) for d in range(1, k + 1)]
        out["mean_accepted"][name] = round(1 + float((rows & accepted).sum()) / anchors, 4)
        if name == "mtp":
            # masked: the chain survives while every draft is accepted and allowed (a refused draft ends it)
            ok = accepted & allowed
            out["alpha_k"]["mtp_masked"] = [round(float((rows & (depth == d) & ok).sum() / anchors), 4)
                                            for d in range(1, k + 1)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--max-sessions", type=int, default=None)
    ap.add_argument("--out", type=Path, default=Path("/tmp/grammar-bench"))
    a = ap.parse_args()
    plain = _replay(a.files, a.out / "plain", ["--drafters", "mtp"], a.max_sessions)
    grammar = _replay(a.files, a.out / "grammar", ["--drafters", "mtp,grammar,grammar+mtp", "--grammar", "tools"],
                      a.max_sessions)
    seconds = json.loads((a.out / "grammar" / "run.json").read_text())["grammar_tally"]["seconds"]
    print(json.dumps({"plain_s": round(plain, 1), "grammar_s": round(grammar, 1), "ratio": round(grammar / plain, 3),
                      "grammar_seconds": seconds, **tool_call_numbers(a.out / "grammar")}, indent=1))


if __name__ == "__main__":
    main()
