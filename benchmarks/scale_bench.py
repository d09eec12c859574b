"""Past one process, measured: shards + merge against one run, and `--ray local` against one process.

    python benchmarks/scale_bench.py [--shards 4] [--k 4] [--input FILE ...] [--skip-ray] [--skip-shards] [--json OUT]

1. Shards (model-free, no weights): the public corpus (../shared/sessions-public, imported as
   benchmarks/model_free_replay_bench.py does; or --input) replayed with `--drafters ngram,suffix` once, and as
   --shards shards (`replay --shard I/N`, one after the other, each a child process) merged with `mtp-observe merge`.
   Equal results: the merged run's positions and requests tables equal the single run's row for row, its counts
   and errors too, and `report --format json` of both is the same document but for the run's path and creation
   time (bootstrap included). Figures: the single run's CPU time, the shards' summed CPU time (each shard reads
   and renders the whole input — suffix decoding's global tree needs every earlier session's outputs — and drafts
   its own sessions), the slowest shard's wall time (what an array job waits for), and merge's wall time.
2. Ray: the demo sessions on the bundled model, `replay` in one process and `replay --ray local --replicas 2`
   (which starts a local Ray cluster and two replicas, each loading the model): equal tables and counts, and the
   wall-time difference — Ray's start-up, the replicas' model loads and the dispatch, on this machine.

Child processes' CPU time is the OS's (os.wait4: ru_utime + ru_stime; with Ray the replicas are the cluster's
processes, not children of the command, so only wall times are compared there). On a machine shared with other
jobs the CPU times are the figures to compare; the wall times are upper bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from model_free_replay_bench import TOKENIZER_FILES, import_corpus, timed  # noqa: E402

MTP = [sys.executable, "-m", "mtp_observe"]
POSITION_KEYS = ["session_id", "request", "drafter", "draft_k", "pos", "depth"]


def same_tables(a: Path, b: Path) -> bool:
    import pandas as pd

    for table, keys in (("positions.parquet", POSITION_KEYS), ("requests.parquet", ["session_id", "request"])):
        x, y = pd.read_parquet(a / table), pd.read_parquet(b / table)
        keys = [k for k in keys if k in x.columns]
        x, y = x.sort_values(keys).reset_index(drop=True), y.sort_values(keys).reset_index(drop=True)
        if not x.equals(y):
            return False
    return True


def report(run: Path, drafter: str | None = None) -> dict:
    r = subprocess.run(MTP + ["report", str(run), "--format", "json"] + (["--drafter", drafter] if drafter else []),
                       capture_output=True, text=True, check=True)
    document = json.loads(r.stdout)
    del document["run"]["path"], document["run"]["created"]
    return document


def manifest(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def shards_benchmark(work: Path, files: list[Path], shards: int, k: int, drafters: str = "ngram,suffix") -> dict:
    model = work / "tokenizer-only"
    model.mkdir()
    for name in TOKENIZER_FILES:
        if (ROOT / "mtp_observe" / "default_model" / name).is_file():
            shutil.copy(ROOT / "mtp_observe" / "default_model" / name, model / name)
    base = MTP + ["replay", *map(str, files), "--model", str(model), "--drafters", drafters, "--k", str(k)]
    one_wall, one_cpu, _ = timed(base + ["--out", str(work / "one")])
    walls, cpus = [], []
    for i in range(shards):
        wall, cpu, _ = timed(base + ["--shard", f"{i}/{shards}", "--out", str(work / f"shard-{i}")])
        walls.append(wall)
        cpus.append(cpu)
    merge_wall, merge_cpu, _ = timed(MTP + ["merge", *[str(work / f"shard-{i}") for i in range(shards)],
                                            "--out", str(work / "merged")])
    one, merged = work / "one", work / "merged"
    equal = {"tables": same_tables(one, merged), "counts": manifest(one)["counts"] == manifest(merged)["counts"],
             "errors": manifest(one)["errors"] == manifest(merged)["errors"],
             "report_json": all(report(one, d) == report(merged, d) for d in drafters.split(","))}
    counts = manifest(one)["counts"]
    return {"drafters": drafters, "sessions": counts["sessions_ok"], "skipped": counts["sessions_skipped"], "tokens": counts["tokens_replayed"],
            "rows": counts["rows"], "shards": shards, "one_wall_s": one_wall, "one_cpu_s": one_cpu,
            "shard_wall_s": walls, "shard_cpu_s": cpus, "shards_cpu_s": sum(cpus), "slowest_shard_wall_s": max(walls),
            "shard_sessions": [manifest(work / f"shard-{i}")["counts"]["sessions_ok"] for i in range(shards)],
            "merge_wall_s": merge_wall, "merge_cpu_s": merge_cpu,
            "linked": manifest(merged)["merged"]["linked"], "copied": manifest(merged)["merged"]["copied"], "equal": equal}


def ray_benchmark(work: Path, replicas: int) -> dict:
    demo = sorted(str(p) for p in (ROOT / "sessions").glob("*.jsonl"))
    base = MTP + ["replay", *demo, "--k", "4", "--device", "cpu"]
    env = dict(os.environ)
    t0 = time.perf_counter()
    subprocess.run(base + ["--out", str(work / "single")], capture_output=True, text=True, check=True, env=env)
    single_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    r = subprocess.run(base + ["--ray", "local", "--replicas", str(replicas), "--out", str(work / "ray")],
                       capture_output=True, text=True, env=env)
    ray_s = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    single, ray = work / "single", work / "ray"
    return {"replicas": replicas, "sessions": manifest(single)["counts"]["sessions_ok"],
            "tokens": manifest(single)["counts"]["tokens_replayed"], "single_wall_s": single_s, "ray_wall_s": ray_s,
            "overhead_s": ray_s - single_s, "cluster": manifest(ray)["cluster"],
            "stderr_lines": [line for line in r.stderr.splitlines() if line.strip()][:5],
            "equal": {"tables": same_tables(single, ray), "counts": manifest(single)["counts"] == manifest(ray)["counts"],
                      "report_json": report(single) == report(ray)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--input", nargs="*", type=Path, help="canonical session files (default: import the public corpus)")
    ap.add_argument("--drafters", default="ngram,suffix", help="the model-free drafters replayed (suffix decoding's "
                    "global tree makes every shard render every session once; ngram alone renders only the shard's)")
    ap.add_argument("--skip-shards", action="store_true")
    ap.add_argument("--skip-ray", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    result = {"load_average_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if not args.skip_shards:
            files, left_out = (list(args.input), []) if args.input else import_corpus(work)
            s = result["shards"] = shards_benchmark(work, files, args.shards, args.k, args.drafters) | {"left_out": left_out}
            print(f"shards: {s['sessions']} sessions ({s['skipped']} skipped), {s['tokens']:,} tokens, {s['rows']:,} rows, "
                  f"K = {args.k}; equal: {s['equal']}")
            print(f"  one run      {s['one_wall_s']:7.1f} s wall  {s['one_cpu_s']:7.1f} s CPU")
            print(f"  {s['shards']} shards     {s['slowest_shard_wall_s']:7.1f} s wall (slowest)  {s['shards_cpu_s']:7.1f} s CPU "
                  f"(summed; {', '.join(f'{c:.1f}' for c in s['shard_cpu_s'])}; sessions {s['shard_sessions']})")
            print(f"  merge        {s['merge_wall_s']:7.2f} s wall  {s['merge_cpu_s']:7.2f} s CPU  "
                  f"({s['linked']} part files linked, {s['copied']} copied)")
        if not args.skip_ray:
            r = result["ray"] = ray_benchmark(work, args.replicas)
            print(f"ray: the demo ({r['sessions']} sessions, {r['tokens']:,} tokens) on the bundled model; equal: {r['equal']}")
            print(f"  one process  {r['single_wall_s']:7.1f} s wall")
            print(f"  --ray local  {r['ray_wall_s']:7.1f} s wall ({r['replicas']} replicas): overhead {r['overhead_s']:+.1f} s")
    result["load_average_end"] = os.getloadavg()[0]
    print(f"load average {result['load_average_start']:.1f} at the start, {result['load_average_end']:.1f} at the end")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
