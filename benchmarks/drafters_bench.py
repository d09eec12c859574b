"""The model-free drafters over a whole corpus: time, peak memory and what they would accept.

    python benchmarks/drafters_bench.py [--k 4] [--input FILE ...] [--drafters ngram,suffix,...] [--json OUT]

Workload: every sample in ../shared/sessions-public imported with `mtp-observe import auto` (or the
canonical session files given with --input), rendered with the bundled tokenizer, then each
drafter run over every request in input order, at every anchor, as the pipeline will feed it
(requests of a session share prefixes; the suffix drafter gets `keep`, the prefix the next request
shares, as pipeline.replay_session computes it). Each drafter runs in its own process, started
after rendering, so its peak resident memory is its own: the OS's peak for that process
(mtp_observe.run.memory: `os.wait4`), beside the same process doing nothing but load the tokens ("load").

    load             load the rendered tokens (the baseline every other line includes)
    ngram            vLLM's prompt lookup, 5,5 (vLLM's defaults), at K, as vLLM 0.33's default V2 runner proposes it
                     (the most recent match, always K tokens)
    ngram-v1         the same as the V1 runner's CPU proposer (the earliest match, short or no drafts)
    suffix           suffix decoding at vLLM's defaults, at K
    suffix-by-k      the same, with the draft at every K' <= K (by_k) — and how often it is not the
                     first K' tokens of the draft at K
    suffix-no-keep   suffix without `keep` (the request's tree journaled whole): the memory `keep` saves
    suffix-outputs   only the global tree fed every output (add_outputs): what a data-parallel rank
                     pays for the sessions other ranks replay

Reported per drafter: seconds (compiling or loading the compiled code excluded and shown apart),
anchors/s, peak RSS; the acceptance the drafts would get against the recorded tokens: the share of
anchors with a proposal, α₁ (d₁ matched), the mean accepted length, τ_sim(K') for K' <= K
(the simulated decode, metrics.simulate_decode), and at K the mean acceptance length vLLM's counters would
show (1 + accepted / steps with a draft, over the simulated decode's steps: metrics.decode_walk).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mtp_observe.run.memory import run_measured  # noqa: E402  (imports nothing heavy)

DRAFTERS = ("load", "ngram", "ngram-v1", "suffix", "suffix-by-k", "suffix-no-keep", "suffix-outputs")


def public_files() -> list[Path]:
    for shared in (ROOT.parent / "shared", Path("/work/shared")):
        folder = shared / "sessions-public"
        if folder.is_dir():
            return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl", ".yaml"))
    raise SystemExit("no ../shared/sessions-public here: pass --input FILE ...")


def render(files, out: Path) -> dict:
    """Sessions -> out (.npz): tokens of every request, their spans, the prefix each shares with the next."""
    from mtp_observe.model.loading import default_model_dir
    from mtp_observe.run.requests import shared_prefix
    from mtp_observe.sessions.reading import read_sessions
    from mtp_observe.sessions.rendering import Renderer

    renderer = Renderer.from_model_dir(default_model_dir())
    tokens, offsets, spans, span_request, keep, sessions = [], [0], [], [], [], 0
    for session in read_sessions([str(f) for f in files], on_error="skip"):
        if not hasattr(session, "messages"):
            continue
        requests = renderer.render(session).requests
        sessions += 1
        for r, request in enumerate(requests):
            after = requests[r + 1].input_ids if r + 1 < len(requests) else None
            keep.append(shared_prefix(request.input_ids, after) if after is not None else 0)
            tokens.append(np.asarray(request.input_ids, dtype=np.int32))
            offsets.append(offsets[-1] + len(request.input_ids))
            for sp in request.spans:
                spans.append((sp.start, sp.end))
                span_request.append(len(offsets) - 2)
    np.savez(out, tokens=np.concatenate(tokens), offsets=np.array(offsets, dtype=np.int64),
             spans=np.array(spans, dtype=np.int64).reshape(-1, 2), span_request=np.array(span_request, dtype=np.int64),
             keep=np.array(keep, dtype=np.int64))
    return {"sessions": sessions, "requests": len(tokens), "tokens": int(offsets[-1]), "spans": len(spans)}


def requests_of(data):
    tokens, offsets, spans, span_request, keep = (data[k] for k in ("tokens", "offsets", "spans", "span_request", "keep"))
    bounds = np.searchsorted(span_request, np.arange(len(offsets)))
    for r in range(len(offsets) - 1):
        yield tokens[offsets[r]: offsets[r + 1]], spans[bounds[r]: bounds[r + 1]], int(keep[r])


class Tally:
    """Accepted lengths per span, for τ_sim at every K' <= K."""

    def __init__(self, k: int):
        self.k = k
        self.anchors = self.proposed = self.first = 0
        self.accepted = 0
        self.steps = np.zeros(k, dtype=np.int64)
        self.emitted = 0
        self.drafted_steps = self.step_accepted = 0  # at K: steps with a draft, drafts those steps accepted

    def add(self, tokens, spans, drafts_by_k) -> None:
        """drafts_by_k(K') -> [A, K'] proposals drafted at K' (the first K' columns of one draft when
        the drafter's drafts are prefixes of each other)."""
        from mtp_observe.drafting.drafters import accepted_length, anchors, span_ends
        from mtp_observe.report.metrics import decode_walk, simulate_decode

        anchor, ends = anchors(spans), span_ends(spans)
        span_len = spans[:, 1] - np.maximum(spans[:, 0], 1)
        full = drafts_by_k(self.k)
        acc = accepted_length(tokens, anchor, ends, full)
        self.anchors += len(anchor)
        self.proposed += int((full[:, 0] >= 0).sum())
        self.first += int((acc >= 1).sum())
        self.accepted += int(acc.sum())
        self.emitted += int(span_len.sum())
        for kk in range(1, self.k + 1):
            acc_k = acc if kk == self.k else accepted_length(tokens, anchor, ends, drafts_by_k(kk))
            self.steps[kk - 1] += int(simulate_decode(acc_k, span_len, kk).sum())
        walk = decode_walk(acc, span_len, self.k, (full >= 0).sum(axis=1))
        self.drafted_steps += int(walk.step_drafted[:, 0].sum())
        self.step_accepted += int(walk.step_accepted.sum())

    def summary(self) -> dict:
        return {"anchors": self.anchors, "proposed": self.proposed / max(self.anchors, 1),
                "alpha_1": self.first / max(self.anchors, 1), "mean_accepted": self.accepted / max(self.anchors, 1),
                "tau_sim": [self.emitted / s if s else float("nan") for s in self.steps.tolist()],
                "engine_mean_acceptance_length": 1 + self.step_accepted / max(self.drafted_steps, 1),
                "drafted_steps": self.drafted_steps / max(int(self.steps[-1]), 1)}


def worker(name: str, data_path: Path, k: int) -> dict:
    """One drafter over every request; prints nothing, returns its figures."""
    from mtp_observe.drafting.drafters.ngram import NgramDrafter
    from mtp_observe.drafting.drafters.suffix import SuffixDecoding

    data = np.load(data_path)
    data = {key: data[key] for key in data.files}
    out: dict = {"drafter": name}
    if name == "load":
        return out
    warm = time.perf_counter()
    tiny = (np.arange(64, dtype=np.int32) % 7, np.array([[30, 60]]))
    (NgramDrafter() if name.startswith("ngram") else SuffixDecoding()).propose(
        *tiny, k, **({"by_k": True} if name == "suffix-by-k" else {}))
    out["compile_or_load_s"] = time.perf_counter() - warm
    tally, truncated = Tally(k), Tally(k)
    differs = np.zeros(k, dtype=np.int64)
    start = time.perf_counter()
    drafting = 0.0
    if name.startswith("ngram"):
        from mtp_observe.drafting.drafters.ngram import NgramConfig

        drafter = NgramDrafter(NgramConfig(runner="v1" if name == "ngram-v1" else "v2"))
        for tokens, spans, _ in requests_of(data):
            t0 = time.perf_counter()
            got = drafter.propose(tokens, spans, k)
            drafting += time.perf_counter() - t0
            tally.add(tokens, spans, lambda kk, d=got.tokens: d[:, :kk])
    elif name == "suffix-outputs":
        drafter = SuffixDecoding()
        for tokens, spans, _ in requests_of(data):
            drafter.add_outputs(tokens, spans)
        drafting = time.perf_counter() - start
    else:
        drafter = SuffixDecoding()
        by_k = name == "suffix-by-k"
        for tokens, spans, keep in requests_of(data):
            t0 = time.perf_counter()
            got = drafter.propose(tokens, spans, k, by_k=by_k, keep=None if name == "suffix-no-keep" else keep)
            drafting += time.perf_counter() - t0
            if by_k:
                tally.add(tokens, spans, lambda kk, d=got.tokens_by_k: d[:, kk - 1, :kk])
                truncated.add(tokens, spans, lambda kk, d=got.tokens: d[:, :kk])
                for kk in range(1, k + 1):
                    differs[kk - 1] += int(np.any(got.tokens_by_k[:, kk - 1, :kk] != got.tokens[:, :kk], axis=1).sum())
            else:
                tally.add(tokens, spans, lambda kk, d=got.tokens: d[:, :kk])
    out["drafting_s"] = drafting
    out["wall_s"] = time.perf_counter() - start
    if name != "suffix-outputs":
        out.update(tally.summary())
        out["anchors_per_s"] = out["anchors"] / drafting
    if name == "suffix-by-k":
        out["tau_sim_truncated"] = truncated.summary()["tau_sim"]
        out["not_a_prefix"] = (differs / max(tally.anchors, 1)).tolist()
    return out


def run_worker(name: str, data: Path, k: int, work: Path, inputs=()) -> dict:
    """`name` in a process of its own -> its figures and the OS's peak RSS of that process
    (memory.run_measured: the child's own wait4 high-water mark, not this parent's)."""
    result = work / f"{name}.json"
    measured = run_measured([sys.executable, __file__, "--worker", name, "--data", str(data), "--k", str(k),
                             "--json", str(result), *(["--input", *map(str, inputs)] if inputs else [])])
    sys.stdout.write(measured.stdout)
    assert measured.returncode == 0, f"{name} failed: {measured.stderr[-2000:]}"
    out = json.loads(result.read_text())
    out["peak_rss_mb"] = measured.peak_rss / 2**20
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--input", nargs="*", type=Path, help="canonical session JSONL files (default: import ../shared/sessions-public)")
    ap.add_argument("--drafters", default=",".join(DRAFTERS))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "render":
        args.json.write_text(json.dumps(render(args.input, args.data)))
        return
    if args.worker:
        args.json.write_text(json.dumps(worker(args.worker, args.data, args.k)))
        return

    names = [n for n in args.drafters.split(",") if n]
    assert all(n in DRAFTERS for n in names), f"--drafters: choose from {','.join(DRAFTERS)}"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        files = args.input
        if not files:
            sessions = work / "public.jsonl"
            cmd = [sys.executable, "-m", "mtp_observe", "import", "auto", *map(str, public_files()), "-o", str(sessions), "--on-error", "skip"]
            subprocess.run(cmd, check=True, capture_output=True, text=True)
            files = [sessions]
        t1 = time.perf_counter()
        corpus = run_worker("render", work / "tokens.npz", args.k, work, inputs=files)
        t2 = time.perf_counter()
        result = {"k": args.k, **{key: corpus[key] for key in ("sessions", "requests", "tokens", "spans")},
                  "import_s": t1 - t0, "render_s": t2 - t1, "render_peak_rss_mb": corpus["peak_rss_mb"],
                  "drafters": [run_worker(n, work / "tokens.npz", args.k, work) for n in names]}
    print(f"{result['sessions']} sessions, {result['requests']} requests, {result['tokens']:,} tokens replayed, "
          f"{result['spans']} scored spans; import {result['import_s']:.1f} s, render {result['render_s']:.1f} s; K = {args.k}")
    print(f"{'drafter':16} {'seconds':>8} {'compile':>8} {'anchors/s':>10} {'peak RSS':>9} {'proposed':>8} {'alpha_1':>7} "
          f"{'mean acc':>8} {'vLLM MAL':>8}  tau_sim(1..K)")
    for d in result["drafters"]:
        tau = " ".join(f"{t:.3f}" for t in d.get("tau_sim", []))
        print(f"{d['drafter']:16} {d.get('drafting_s', 0):8.2f} {d.get('compile_or_load_s', 0):8.2f} "
              f"{d.get('anchors_per_s', 0):10,.0f} {d['peak_rss_mb']:7.0f}MB {d.get('proposed', 0):8.3f} "
              f"{d.get('alpha_1', 0):7.3f} {d.get('mean_accepted', 0):8.3f} {d.get('engine_mean_acceptance_length', 0):8.3f}"
              f"  {tau}")
        if "not_a_prefix" in d:
            print(f"{'':16} draft at K' is not the first K' of the draft at K: "
                  + " ".join(f"{x:.3f}" for x in d["not_a_prefix"])
                  + "; tau_sim from truncated drafts: " + " ".join(f"{t:.3f}" for t in d["tau_sim_truncated"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
