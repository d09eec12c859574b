"""Trees and layer rules: the head's variants summarised by the chain's own functions, beside the chain.

Contract:
    run_trees(manifest) / run_layer_rules(manifest)
                                     run.json `trees` / `layer_rules` (version 3; () for older runs)
    tree_cost(table, tree, b) -> Cost
                                     a tree's cost at batch size b in the Cost the slices take: speedup(S) of the
                                     tree's rows = τ_sim(S) / (1 + S·c + v(S)) with S·c + v(S) = cost.tree_denominator - 1
    summarize_trees(report, run, table, **options) -> Report
                                     report.trees, report.configurations and report.layer_rules filled in

Each tree's rows (and the stepwise layer rule's) are read as a Run of their own (report.run.load_run's `variant`)
and summarised by summary.summarize with their own Cost: α_k at each depth of the accepted path, τ_sim, the
engine-counted numbers and the intervals come from the same lines as the chain's (STYLE.md 11).

Decisions, written down once:
- The verdict stays the chain's (PRODUCT.md, "Advice"; ACCEPTANCE.md, "What-ifs"): the chain is what vLLM and
  SGLang both serve from an MTP head, so the status, the K and the SGLang flags the verdict names
  (--speculative-num-steps K --speculative-eagle-topk 1 --speculative-num-draft-tokens K+1, engines.sglang_args) are
  the chain's. Trees are what-ifs: the report shows each configuration's speedup per batch size with its interval
  and its paired difference from the chain's best K at that batch size, and names the best configuration per batch
  size (`configurations`, labelled a what-if); `export --engine sglang --tree S,TOPK,T` writes a replayed tree's
  three flags and acceptance for a user who chooses it. A tree never changes the exit code.
- A tree's speedup at batch size B is cost.tree_speedup of its τ_sim(S) and of its bootstrap replicates (the
  interval is τ_sim's, the cost being fixed), as the chain's speedup by batch size.
- Paired with the chain: both Runs hold the same sessions and spans, so summarize resamples them with the same
  weights; the difference's interval is the percentile interval of the replicate differences. Where the chain's best
  K at B is 0 (nothing pays), the comparison is with serving without speculation (speedup 1).
- Best configuration per batch size: the largest point speedup among the chain at K = 1..Kmax and the trees;
  "none" when nothing beats 1.
- Fewer than the chain: the anchors where the tree accepts fewer drafts than the chain at K = S (min(a, S)), each
  explained by the tree_node (tables.py) at the depth where the tree's walk stops: the T-1 budget cut the node
  ("budget"), its parent left its level's K best ("frontier"), or the node was expanded but its TOPK children lack
  the token the chain drafted there ("attention": with SGLang's slot attention the node's drafts are computed over
  KV other nodes wrote; with true-ancestor attention the same path gives the chain's distribution, so this count is
  then rounding only). Never hidden: the counts are in the table and the JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..cost.speedup import batch_speedup, best_k, tree_denominator, tree_speedup
from .denominator import Cost, CostTable
from .metrics import percentile_interval
from .run import Run, load_run
from .summary import Report, summarize
from .tallies import Slice

STEPWISE = "mtp:stepwise"  # layer_rules.STEPWISE (the report imports no torch, so not from there)
LAYER_RULE_TEXT = {"layer0": "layer 0 at every step (vLLM 0.33 for Qwen3.5, SGLang NEXTN)",
                   "stepwise": "layer i at step i+1 (as trained; transformers' MtpModel)"}
TREE_NODE_WHY = {1: "budget", -1: "frontier", 0: "attention"}


def run_trees(manifest: dict) -> tuple[dict, ...]:
    return tuple(t for t in manifest.get("trees") or [] if isinstance(t, dict))


def run_layer_rules(manifest: dict) -> tuple[dict, ...]:
    return tuple(r for r in manifest.get("layer_rules") or [] if isinstance(r, dict))


def tree_cost(table: CostTable, tree: dict, b: int) -> Cost:
    """The tree's cost at batch size b as a Cost over K = 1..S: NaN below S (a shallower tree is another
    configuration), and at S the c and v with 1 + S·c + v(S) = cost.tree_denominator."""
    t = table.times
    i = t.index(b)
    S, K, T = int(tree["steps"]), int(tree["topk"]), int(tree["draft_tokens"])
    v = float(t.verify_extra(T - 1)[i, T - 2]) if T >= 2 else 0.0
    denominator = float(tree_denominator(t, S, K, T)[i])
    c = (denominator - 1.0 - v) / S
    verify = np.full(S, np.nan)
    verify[S - 1] = v
    source = t.draft_width_source(K)
    detail = (f"{t.detail}; tree {tree['name']} at batch {b}: a verify of {T} tokens and {S} draft steps, "
              f"{S - 1} of them over {K} tokens per sequence ({source})")
    return Cost(c=c, verify_extra=verify, source=t.source, detail=detail, notes=())


@dataclass(frozen=True)
class TreeSummary:
    """One tree configuration over the run, beside the chain."""

    name: str
    steps: int  # S
    topk: int  # TOPK
    draft_tokens: int  # T
    attention: str  # "slot" (SGLang) | "ancestors" (what-if)
    report: Report  # its rows summarised (Kmax = S) at its cost at the report's binding batch size
    batch: tuple[int, ...]  # [NB] the cost table's batch sizes
    by_batch: np.ndarray  # [NB] speedup
    by_batch_lo: np.ndarray | None  # [NB]
    by_batch_hi: np.ndarray | None
    vs_chain: np.ndarray  # [NB] speedup minus the chain's at its best K at B (1: no speculation where K = 0)
    vs_chain_lo: np.ndarray | None  # [NB] paired bootstrap interval
    vs_chain_hi: np.ndarray | None
    chain_k: tuple[int, ...]  # [NB] the chain's best K at each B
    anchors: int
    fewer: int  # anchors where it accepts fewer drafts than the chain at K = S
    more: int  # ... more
    fewer_why: dict  # {"budget", "frontier", "attention"} -> anchors (module docstring)
    draft_width: str  # how t_draft(B, TOPK) is known: measured | roofline | interpolated

    @property
    def overall(self) -> Slice:
        return self.report.overall

    @property
    def speedup(self) -> tuple[float, float | None, float | None]:
        """(speedup, lo, hi) at the report's binding batch size."""
        o, S = self.overall, self.steps
        return (float(o.value.speedup[S - 1]), float(o.lo.speedup[S - 1]) if o.lo is not None else None,
                float(o.hi.speedup[S - 1]) if o.hi is not None else None)

    @property
    def flags(self) -> str:
        return (f"--speculative-num-steps {self.steps} --speculative-eagle-topk {self.topk} "
                f"--speculative-num-draft-tokens {self.draft_tokens}")


@dataclass(frozen=True)
class Configuration:
    """The best configuration at one batch size (a what-if when it is a tree)."""

    batch: int
    name: str  # "chain" | a tree's name | "none"
    k: int  # the chain's K (0 for a tree or none)
    steps: int  # SGLang's three flags of it (the chain at K: K, 1, K+1); 0 for none
    topk: int
    draft_tokens: int
    speedup: float
    lo: float | None
    hi: float | None


@dataclass(frozen=True)
class LayerRule:
    """One layer rule of a head with several MTP layers, over the same anchors."""

    rule: str  # "layer0" | "stepwise"
    drafter: str  # its rows' drafter value
    text: str
    k: int  # depths it has rows at
    overall: Slice
    best_k: int


def _interval(replicates: np.ndarray | None, level: float):
    if replicates is None:
        return None, None
    return percentile_interval(replicates, level)


def summarize_trees(report: Report, run: Run, table: CostTable, **options) -> Report:
    """report with its trees, best configuration per batch size and layer rules (module docstring). run: the judged
    drafter's Run; the trees and rules compare with the chain's (mtp) rows."""
    trees, rules = run_trees(run.manifest), run_layer_rules(run.manifest)
    if not trees and not rules:
        return report
    chain_run = run if run.drafter == "mtp" else load_run(run.path, "mtp")
    chain = report if run.drafter == "mtp" else summarize(chain_run, table.cost_at(report.batch.binding if report.batch
                                                                                    else 1), **options)
    b = report.batch.binding if report.batch is not None else 1
    times = table.times
    level = report.level
    chain_value = batch_speedup(chain.overall.value.tau_sim, times)  # [NB, K]
    chain_rep = batch_speedup(chain.overall.replicates.tau_sim, times) if chain.overall.replicates is not None else None
    chain_k = tuple(best_k(row) for row in chain_value)  # report.batch.best_k when the chain is the judged drafter

    def chain_at(values: np.ndarray) -> np.ndarray:  # [..., NB, K] -> [..., NB] at the chain's best K (1 for K = 0)
        out = np.ones(values.shape[:-1])
        for i, k in enumerate(chain_k):
            if k > 0:
                out[..., i] = values[..., i, k - 1]
        return out

    summaries = []
    for tree in trees:
        name, S = tree["name"], int(tree["steps"])
        tree_run = load_run(run.path, variant=(name, S))
        assert tree_run.sessions == chain_run.sessions and len(tree_run.spans.start) == len(chain_run.spans.start)
        tree_report = summarize(tree_run, tree_cost(table, tree, b), **options)
        o = tree_report.overall
        value = tree_speedup(o.value.tau_sim[S - 1], times, S, int(tree["topk"]), int(tree["draft_tokens"]))
        rep = tree_speedup(o.replicates.tau_sim[:, S - 1], times, S, int(tree["topk"]), int(tree["draft_tokens"])) \
            if o.replicates is not None else None
        lo, hi = _interval(rep, level)
        diff = value - chain_at(chain_value)
        d_lo, d_hi = _interval(rep - chain_at(chain_rep) if rep is not None and chain_rep is not None else None, level)
        ours, theirs = tree_run.accepted_len, np.minimum(chain_run.accepted_len, S)
        fewer = np.flatnonzero(ours < theirs)
        why = _fewer_why(tree_run, fewer, ours)
        summaries.append(TreeSummary(
            name=name, steps=S, topk=int(tree["topk"]), draft_tokens=int(tree["draft_tokens"]),
            attention=str(tree.get("attention", "slot")), report=tree_report, batch=tuple(times.batch), by_batch=value,
            by_batch_lo=lo, by_batch_hi=hi, vs_chain=diff, vs_chain_lo=d_lo, vs_chain_hi=d_hi, chain_k=chain_k,
            anchors=int(len(ours)), fewer=int(fewer.size), more=int((ours > theirs).sum()), fewer_why=why,
            draft_width=times.draft_width_source(int(tree["topk"]))))

    configurations = _configurations(summaries, chain_value, chain_rep, times, level) if summaries else []
    layer_rules = _layer_rules(rules, chain, run, options)
    notes = list(report.notes) + (_cost_notes(summaries) if summaries else [])
    return replace(report, trees=tuple(summaries), configurations=tuple(configurations), layer_rules=tuple(layer_rules),
                   notes=tuple(notes))


def _fewer_why(tree_run: Run, fewer: np.ndarray, ours: np.ndarray) -> dict[str, int]:
    """Why the tree accepted fewer tokens than the chain at the anchors `fewer`: the tree_node at the depth where the
    tree's walk stops (accepted + 1), counted by TREE_NODE_WHY's reasons."""
    why = dict.fromkeys(TREE_NODE_WHY.values(), 0)
    if fewer.size and tree_run.rows.tree_node is not None:
        r = tree_run.rows
        first_row = np.flatnonzero(r.depth == 1)  # rows of an anchor are contiguous, depth 1 first
        at = first_row[fewer] + ours[fewer]  # the row at depth accepted + 1, where the walk stops
        for status in r.tree_node[at]:
            key = TREE_NODE_WHY.get(int(status))
            if key is not None:
                why[key] += 1
    return why


def _configurations(summaries: list, chain_value: np.ndarray, chain_rep: np.ndarray | None, times, level: float) -> list:
    """The best configuration per batch size (the chain at each K, or a tree), "none" when nothing beats 1.0."""
    configurations = []
    chain_lo, chain_hi = _interval(chain_rep, level)
    for i, B in enumerate(times.batch):
        best = [("chain", k, k, 1, k + 1, float(chain_value[i, k - 1]),
                 None if chain_lo is None else float(chain_lo[i, k - 1]),
                 None if chain_hi is None else float(chain_hi[i, k - 1])) for k in range(1, chain_value.shape[1] + 1)]
        best += [(t.name, 0, t.steps, t.topk, t.draft_tokens, float(t.by_batch[i]),
                  None if t.by_batch_lo is None else float(t.by_batch_lo[i]),
                  None if t.by_batch_hi is None else float(t.by_batch_hi[i])) for t in summaries]
        finite = [x for x in best if np.isfinite(x[5])]
        top = max(finite, key=lambda x: x[5]) if finite else None
        if top is None or not top[5] > 1.0:
            configurations.append(Configuration(B, "none", 0, 0, 0, 0, 1.0, None, None))
        else:
            configurations.append(Configuration(B, *top))
    return configurations


def _layer_rules(rules: tuple, chain: Report, run: Run, options: dict) -> list:
    """Each layer rule summarised: layer0 is the chain's own rows; stepwise its block of rows at its k."""
    layer_rules = []
    for rule in rules:
        if rule["rule"] == "layer0":
            layer_rules.append(LayerRule("layer0", "mtp", LAYER_RULE_TEXT["layer0"], chain.k, chain.overall,
                                         chain.best_k))
        else:
            k = int(rule["k"])
            cost = chain.cost
            stepwise = summarize(load_run(run.path, variant=(rule.get("drafter", STEPWISE), k)),
                                 replace(cost, verify_extra=np.asarray(cost.verify_extra)[:k]), **options)
            layer_rules.append(LayerRule(rule["rule"], rule.get("drafter", STEPWISE),
                                         LAYER_RULE_TEXT.get(rule["rule"], rule["rule"]), k, stepwise.overall,
                                         stepwise.best_k))
    return layer_rules


def _cost_notes(summaries: list) -> list[str]:
    """What the trees' draft-step cost was taken from, where the cost table did not measure it."""
    notes = []
    interpolated = sorted({t.topk for t in summaries if t.draft_width == "interpolated"})
    if interpolated:
        notes.append(f"trees: the draft step over {', '.join(map(str, interpolated))} tokens per sequence is the "
                     "cost table's draft step at batch B·TOPK, interpolated; `mtp-observe probe --tree S,TOPK,T` "
                     "measures it")
    one = sorted({t.topk for t in summaries if t.draft_width == "one token"})
    if one:
        notes.append(f"trees: the cost has batch 1 only, so a draft step over {', '.join(map(str, one))} tokens per "
                     "sequence is taken as one over a single token (memory-bound); `mtp-observe probe --tree "
                     "S,TOPK,T` measures it")
    return notes


def best_tree_line(report: Report) -> str | None:
    """The one line the plain report prints for a run with trees (--tree): the tree with the largest speedup at the
    batch size the verdict binds at, against the chain at its best K there (paired interval); None without trees."""
    if not report.trees:
        return None
    at = report.batch.binding if report.batch is not None else 1

    def index(t: TreeSummary) -> int:
        return t.batch.index(at) if at in t.batch else 0

    finite = [t for t in report.trees if np.isfinite(float(t.by_batch[index(t)]))]
    if not finite:
        return None
    t = max(finite, key=lambda x: float(x.by_batch[index(x)]))
    i = index(t)
    sp, lo, hi = float(t.by_batch[i]), t.by_batch_lo, t.by_batch_hi
    gain, g_lo, g_hi = float(t.vs_chain[i]), t.vs_chain_lo, t.vs_chain_hi
    interval = "" if lo is None or hi is None else f" [{float(lo[i]):.2f}, {float(hi[i]):.2f}]"
    g_interval = "" if g_lo is None or g_hi is None else f" [{float(g_lo[i]):+.2f}, {float(g_hi[i]):+.2f}]"
    chain = f"the chain at K={t.chain_k[i]}" if t.chain_k[i] else "no speculation"
    spec = f"{t.steps},{t.topk},{t.draft_tokens}"
    verb = "pays most" if gain > 0 else f"is the best tree but pays no more than {chain}"
    where = "" if at == 1 else f" at batch {at}"
    of = f" of {len(report.trees)}" if len(report.trees) > 1 else ""
    return (f"tree: {spec} (S,TOPK,T){of} {verb}{where}: speedup {sp:.3f}{interval}, {gain:+.3f}{g_interval} against "
            f"{chain}; a what-if, not the verdict")
