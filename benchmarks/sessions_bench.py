"""Stream a large generated JSONL through `mtp-observe sessions` and report time and peak RSS.

    python benchmarks/sessions_bench.py [--gb 1.0] [--keep DIR]

Generates deterministic chat sessions (system prompt, tool schemas, tool calls with JSON
arguments, multi-kilobyte tool results, reasoning on some turns) until the file reaches the
requested size, writes a tiny synthetic checkpoint for its tokenizer and chat template, then
runs the real CLI in a subprocess and reads its peak resident memory from the OS (mtp_observe.run.memory:
wait4's high-water mark, not sampled). The point is that memory does not grow with the file: reading
is streamed one session at a time.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from mtp_observe.run.memory import run_measured

WORDS = "order refund flight booking status account the a to of and for with please check update cancel item price".split()


def session(rng: random.Random, i: int) -> dict:
    def sentence(n):
        return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."

    tools = [{"type": "function", "function": {"name": f"tool_{k}", "description": sentence(8),
                                               "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}}
             for k in range(3)]
    messages = [{"role": "system", "content": sentence(40)}, {"role": "user", "content": sentence(20)}]
    for turn in range(rng.randint(1, 3)):
        call_id = f"c{i}_{turn}"
        messages.append({"role": "assistant", "content": sentence(10),
                         **({"reasoning_content": sentence(30)} if rng.random() < 0.5 else {}),
                         "tool_calls": [{"id": call_id, "type": "function",
                                         "function": {"name": f"tool_{turn % 3}", "arguments": json.dumps({"id": str(rng.randint(0, 10**6))})}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps({"rows": [sentence(12) for _ in range(rng.randint(5, 40))]})})
    messages.append({"role": "assistant", "content": sentence(30)})
    return {"id": f"bench-{i}", "messages": messages, "tools": tools}


def generate(path: Path, size: int) -> int:
    rng = random.Random(0)
    n = written = 0
    with open(path, "w") as f:
        while written < size:
            line = json.dumps(session(rng, n)) + "\n"
            f.write(line)
            written += len(line)
            n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--keep", type=Path, default=None)
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="sessions-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "big.jsonl"
    t0 = time.time()
    n = generate(data, int(args.gb * 1e9))
    print(f"generated {n:,} sessions, {data.stat().st_size / 1e9:.2f} GB in {time.time() - t0:.0f} s")
    from mtp_observe.model.synthetic import SyntheticSpec, write_synthetic_checkpoint

    model = write_synthetic_checkpoint(work / "model", SyntheticSpec(shards=1))
    t0 = time.time()
    measured = run_measured([sys.executable, "-m", "mtp_observe", "sessions", str(data), "--model", str(model)])
    wall = time.time() - t0
    print(measured.stdout)
    if measured.returncode != 0:
        print(measured.stderr)
        raise SystemExit(measured.returncode)
    peak = measured.peak_rss
    size = data.stat().st_size
    print(f"sessions over {size / 1e9:.2f} GB: {wall:.0f} s wall, {size / 1e6 / wall:.1f} MB/s, peak RSS {peak / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
