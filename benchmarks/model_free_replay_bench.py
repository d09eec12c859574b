"""The model-free replay end to end: `mtp-observe replay --drafters ngram,suffix` over the whole public corpus, then
`mtp-observe report` of it — wall time and the OS's peak memory of each command.

    python benchmarks/model_free_replay_bench.py [--k 4] [--drafters ngram,suffix] [--input FILE ...] [--json OUT]

Workload: every folder of ../shared/sessions-public imported with `mtp-observe import auto FOLDER --on-error
skip`, one output file per folder (a folder whose records are no sessions, e.g. the OpenTelemetry semantic
conventions' bare example messages, yields none and is left out; a session id another folder already holds
would be refused by replay, so such a file is left out and said), or the canonical session files given with
--input. The model directory is a tokenizer-only copy of the bundled model (tokenizer files, chat template,
generation_config.json; no config.json, no weights): the replay loads no weights because it needs none.

Each command runs as a child process of this one, which imports nothing heavy; its peak resident memory is the
OS's own count for that process (`os.wait4`, ru_maxrss), its time the wall clock around it and its CPU time
(ru_utime + ru_stime: what to compare on a shared machine).
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
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja")


def timed(cmd: list[str], stdout=subprocess.DEVNULL) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds — user + system —, peak RSS MB) of a child process; it must succeed. On a machine
    shared with other jobs the CPU time is the figure to compare, the wall time an upper bound."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, f"{' '.join(cmd[:4])} failed: {err[-2000:]}"
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024  # KiB on Linux


def corpus_root() -> Path:
    for shared in (ROOT.parent / "shared", Path("/work/shared")):
        if (shared / "sessions-public").is_dir():
            return shared / "sessions-public"
    raise SystemExit("no ../shared/sessions-public here: pass --input FILE ...")


def import_corpus(work: Path) -> tuple[list[Path], list[str]]:
    """One canonical file per folder of the corpus; (the files, what was left out and why)."""
    files, left_out, seen = [], [], {}
    for folder in sorted(p for p in corpus_root().iterdir() if p.is_dir()):
        out = work / f"{folder.name}.jsonl"
        subprocess.run([sys.executable, "-m", "mtp_observe", "import", "auto", str(folder), "-o", str(out),
                        "--on-error", "skip"], check=True, capture_output=True, text=True)
        ids = [json.loads(line)["id"] for line in out.read_text().splitlines() if line.strip()]
        if not ids:
            left_out.append(f"{folder.name}: no sessions")
            continue
        repeated = [i for i in ids if i in seen]
        if repeated:
            left_out.append(f"{folder.name}: session id {repeated[0]!r} is also in {seen[repeated[0]]}")
            continue
        seen.update({i: folder.name for i in ids})
        files.append(out)
    return files, left_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--drafters", default="ngram,suffix")
    ap.add_argument("--input", nargs="*", type=Path, help="canonical session files (default: import the public corpus)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = work / "tokenizer-only"
        model.mkdir()
        bundled = ROOT / "mtp_observe" / "default_model"
        for name in TOKENIZER_FILES:
            if (bundled / name).is_file():
                shutil.copy(bundled / name, model / name)
        t0 = time.perf_counter()
        files, left_out = (list(args.input), []) if args.input else import_corpus(work)
        import_s = time.perf_counter() - t0
        run = work / "run"
        replay_s, replay_cpu_s, replay_mb = timed([sys.executable, "-m", "mtp_observe", "replay", *map(str, files), "--model", str(model),
                                     "--drafters", args.drafters, "--k", str(args.k), "--out", str(run)])
        report_json = work / "report.json"
        with open(report_json, "w") as f:
            report_s, report_cpu_s, report_mb = timed([sys.executable, "-m", "mtp_observe", "report", str(run), "--format", "json"], stdout=f)
        manifest = json.loads((run / "run.json").read_text())
        report = json.loads(report_json.read_text())
    counts = manifest["counts"]
    result = {
        "k": args.k, "drafters": args.drafters.split(","), "files": len(files), "left_out": left_out,
        "sessions": counts["sessions_ok"], "skipped": counts["sessions_skipped"], "requests": counts["requests"],
        "tokens": counts["tokens_replayed"], "anchors": counts["anchors"], "rows": counts["rows"],
        "import_s": import_s, "replay_s": replay_s, "replay_cpu_s": replay_cpu_s, "replay_peak_rss_mb": replay_mb,
        "report_s": report_s, "report_cpu_s": report_cpu_s, "report_peak_rss_mb": report_mb,
        "load_average": os.getloadavg()[0],
        "drafting": manifest["timing"].get("drafting", {}),
        "tau_sim": {name: d["overall"]["value"]["tau_sim"] for name, d in report["drafters"]["by_drafter"].items()},
        "alpha_1": {name: d["overall"]["value"]["alpha"][0] for name, d in report["drafters"]["by_drafter"].items()},
    }
    print(f"{result['sessions']} sessions ({result['skipped']} skipped), {result['requests']} requests, "
          f"{result['tokens']:,} tokens, {result['anchors']:,} anchors, {result['rows']:,} rows; K = {args.k}"
          + (f"; left out: {'; '.join(left_out)}" if left_out else ""))
    print(f"import {import_s:.1f} s · replay {replay_s:.1f} s ({replay_cpu_s:.1f} s CPU), peak RSS {replay_mb:.0f} MB · "
          f"report {report_s:.1f} s ({report_cpu_s:.1f} s CPU), peak RSS {report_mb:.0f} MB · load {result['load_average']:.1f}")
    for part, t in result["drafting"].items():
        print(f"  drafting {part:14} {t['seconds']:8.2f} s  {1e6 * t['seconds'] / max(t['anchors'], 1):8.1f} µs/anchor")
    for name, tau in result["tau_sim"].items():
        print(f"  {name:8} alpha_1 {result['alpha_1'][name]:.3f}  tau_sim(1..K) " + " ".join(f"{x:.3f}" for x in tau))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
