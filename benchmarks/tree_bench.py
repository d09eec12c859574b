"""Tree drafts in a replay: CPU time and peak memory with three tree configurations against the chain alone, where
the extra time goes, and the demo's table of configurations.

    python benchmarks/tree_bench.py [--input FILE ...] [--tree 3,2,6 --tree 3,4,8 --tree 5,4,16] [--k 4]
                                    [--max-sessions N] [--json OUT]

Workload: the demo sessions (sessions/*.jsonl) on the bundled model, CPU, float32, unless --input says otherwise.

1. End to end: `mtp-observe replay` twice in its own process (mtp_observe.run.memory.run_measured: the OS's own peak RSS
   and CPU time of the process, user + system), the chain alone and the chain with the trees.
2. Where the time goes (CPU seconds of this process, time.process_time: robust to a shared machine's load),
   request by request, as pipeline.replay_request runs the stages: the
   target's prefill, the head's row pass and chain, each (TOPK, rule)'s tree growth (tree.grow, with the nodes it
   generates), the trees' walks and rows, and the target's reductions for the chain's rows alone and for the chain's
   and the trees' together (one call: logits once per position). The claim under test: the head's extra work grows
   with the trees (nodes generated), the target's does not (its prefill is the same; its reductions gather a few more
   tokens at the same positions).
3. The report of the run with trees: the tree table and the best configuration per batch size (markdown, for
   docs/trees.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mtp_observe.run.memory import run_measured  # noqa: E402  (imports nothing heavy)

DEFAULT_TREES = ("3,2,6", "3,4,8", "5,4,16")


def end_to_end(files, trees, k: int, max_sessions: int | None, work: Path) -> dict:
    out = {}
    for name, extra in (("chain", []), ("trees", [a for t in trees for a in ("--tree", t)])):
        run = work / f"run-{name}"
        argv = [sys.executable, "-m", "mtp_observe", "replay", *map(str, files), "--k", str(k), "--device", "cpu",
                "--out", str(run), "--progress-every", "0", *extra]
        if max_sessions:
            argv += ["--max-sessions", str(max_sessions)]
        t0 = time.perf_counter()
        measured = run_measured(argv, cwd=ROOT)
        wall = time.perf_counter() - t0
        if measured.returncode != 0:
            raise SystemExit(f"replay ({name}) failed: {measured.stderr.strip().splitlines()[-1:]}")
        manifest = json.loads((run / "run.json").read_text())
        out[name] = {"cpu_s": round(measured.cpu_s, 2), "wall_s": round(wall, 2),
                     "peak_rss_mb": round(measured.peak_rss / 2**20, 1), "rows": manifest["counts"]["rows"],
                     "anchors": manifest["counts"]["anchors"], "tokens": manifest["counts"]["tokens_replayed"],
                     "run": str(run)}
    out["cpu_ratio"] = round(out["trees"]["cpu_s"] / out["chain"]["cpu_s"], 3)
    out["rss_ratio"] = round(out["trees"]["peak_rss_mb"] / out["chain"]["peak_rss_mb"], 3)
    return out


def breakdown(files, trees, k: int, max_sessions: int | None) -> dict:
    import torch

    from mtp_observe.drafting.acceptance import anchor_plan, row_index
    from mtp_observe.drafting.tree import grow, parse_tree, select
    from mtp_observe.drafting.tree_acceptance import recorded_walk, tree_rows
    from mtp_observe.model.loading import default_model_dir, load_model
    from mtp_observe.model.target import Turns, prefill, reduce_logits
    from mtp_observe.run.options import default_profiles
    from mtp_observe.sessions.reading import read_sessions
    from mtp_observe.sessions.rendering import Renderer

    model = load_model(default_model_dir())
    head, target = model.head, model.target
    profiles = default_profiles(default_model_dir())
    configs = [parse_tree(t) for t in trees]
    groups = {}
    for t in configs:
        groups[(t.topk, t.attention)] = max(groups.get((t.topk, t.attention), 0), t.steps)
    renderer = Renderer.from_model_dir(default_model_dir())
    seconds = {"prefill": 0.0, "head_row_pass_and_chain": 0.0, "trees_walk_and_rows": 0.0,
               "target_reduce_chain_rows": 0.0, "target_reduce_chain_and_tree_rows": 0.0}
    grow_s = {f"topk {K}, steps {S}": 0.0 for (K, _), S in groups.items()}
    nodes = {f"topk {K}, steps {S}": 0 for (K, _), S in groups.items()}
    entries = {"chain": 0, "trees": 0}
    anchors_total = 0
    for n, session in enumerate(read_sessions([str(f) for f in files])):
        if max_sessions and n >= max_sessions:
            break
        for request in renderer.render(session).requests:
            ids = torch.tensor(request.input_ids, dtype=torch.long)
            t0 = time.process_time()
            hidden, _ = prefill(target, ids, 2048)
            t1 = time.process_time()
            rows = head.row_pass(hidden[:-1], ids[1:])
            plan = anchor_plan(request.spans, k)
            drafts = head.chain(rows, plan.anchors, plan.depths)
            t2 = time.process_time()
            seconds["prefill"] += t1 - t0
            seconds["head_row_pass_and_chain"] += t2 - t1
            anchors_total += int(plan.anchors.shape[0])
            deepest = anchor_plan(request.spans, max(t.steps for t in configs))
            grown = {}
            for (K, rule), S in groups.items():
                g0 = time.process_time()
                grown[(K, rule)] = grow(head, rows, deepest.anchors, K, S, rule)
                key = f"topk {K}, steps {S}"
                grow_s[key] += time.process_time() - g0
                nodes[key] += int(deepest.anchors.shape[0]) * (K + (S - 1) * K * K)
            w0 = time.process_time()
            blocks = []
            for t in configs:
                tp = anchor_plan(request.spans, t.steps)
                g = grown[(t.topk, t.attention)]
                kept = select(g, t.steps, t.draft_tokens)
                offsets = tp.anchors[:, None] + torch.arange(1, t.steps + 1)[None, :]
                continuation = torch.where(offsets < ids.shape[0], ids[offsets.clamp(max=ids.shape[0] - 1)], -1)
                blocks.append(tree_rows(g, recorded_walk(g, kept, t.steps, continuation), tp, row_index(tp, t.steps)))
            seconds["trees_walk_and_rows"] += time.process_time() - w0
            index = row_index(plan, k)
            turns = Turns(ids, torch.tensor([sp.start for sp in request.spans]), torch.tensor([sp.end for sp in request.spans]))
            chain_pos = index.target_position
            chain_tok = drafts.tokens[index.anchor_index, index.depth - 1]
            chain_act = ids[index.actual_position]
            r0 = time.process_time()
            reduce_logits(target.lm_head.weight, hidden, chain_pos, chain_tok, chain_act, tuple(profiles), turns=turns)
            r1 = time.process_time()
            reduce_logits(target.lm_head.weight, hidden, torch.cat([chain_pos] + [b.positions for b in blocks]),
                          torch.cat([chain_tok] + [b.entry_token for b in blocks]),
                          torch.cat([chain_act] + [ids[b.actual_positions] for b in blocks]), tuple(profiles), turns=turns)
            r2 = time.process_time()
            seconds["target_reduce_chain_rows"] += r1 - r0
            seconds["target_reduce_chain_and_tree_rows"] += r2 - r1
            entries["chain"] += int(chain_pos.shape[0])
            entries["trees"] += sum(int(b.positions.shape[0]) for b in blocks)
    per_node = {key: round(grow_s[key] / max(nodes[key], 1) * 1e6, 2) for key in grow_s}
    return {"anchors": anchors_total, "seconds": {k_: round(v, 3) for k_, v in seconds.items()},
            "tree_growth_s": {k_: round(v, 3) for k_, v in grow_s.items()}, "nodes_generated": nodes,
            "growth_us_per_node": per_node, "reduce_entries": entries}


def demo_tables(run: Path) -> str:
    from mtp_observe.report import read_and_summarize
    from mtp_observe.report.presentation import markdown

    report = read_and_summarize(run, replicates=1000).report
    text = markdown(report)
    keep, on = [], False
    for line in text.splitlines():
        if line.startswith("### "):
            on = line.startswith("### what-if")
        if on:
            keep.append(line)
    return "\n".join(keep)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", nargs="*", type=Path, default=sorted((ROOT / "sessions").glob("*.jsonl")))
    parser.add_argument("--tree", action="append", default=None)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-sessions", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    trees = tuple(args.tree or DEFAULT_TREES)
    with tempfile.TemporaryDirectory() as tmp:
        e2e = end_to_end(args.input, trees, args.k, args.max_sessions, Path(tmp))
        parts = breakdown(args.input, trees, args.k, args.max_sessions)
        tables = demo_tables(Path(e2e["trees"]["run"]))
    result = {"inputs": [str(p) for p in args.input], "trees": list(trees), "k": args.k, "end_to_end": e2e,
              "breakdown": parts}
    c, t = e2e["chain"], e2e["trees"]
    print(f"replay, chain alone:      {c['cpu_s']:8.2f} s CPU  {c['wall_s']:8.2f} s wall  {c['peak_rss_mb']:8.1f} MB peak RSS  "
          f"{c['rows']:,} rows")
    print(f"replay, chain + {len(trees)} trees: {t['cpu_s']:8.2f} s CPU  {t['wall_s']:8.2f} s wall  "
          f"{t['peak_rss_mb']:8.1f} MB peak RSS  {t['rows']:,} rows  (CPU x{e2e['cpu_ratio']}, RSS x{e2e['rss_ratio']})")
    print("where the time goes (s):", json.dumps(parts["seconds"]))
    print("tree growth (s):", json.dumps(parts["tree_growth_s"]), " µs per generated node:", json.dumps(parts["growth_us_per_node"]))
    print("target reduction entries:", json.dumps(parts["reduce_entries"]))
    print()
    print(tables)
    if args.json:
        args.json.write_text(json.dumps({**result, "tables": tables}, indent=2) + "\n")


if __name__ == "__main__":
    main()
