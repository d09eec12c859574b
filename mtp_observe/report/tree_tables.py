"""Presenting the trees and layer rules of a report: plain-text tables beside the chain's (presentation.TextTable).

Contract: `what_if_tables(report)` -> the tree configurations, the best configuration per batch size and the layer
rules, each a TextTable (none for a run without them); presentation.report_tables draws them after the chain's
tables. Nothing is computed here: every number comes from report/trees.py.
"""

from __future__ import annotations

from . import Report
from .layout import TextTable, num, with_interval


def tree_table(report: Report) -> TextTable | None:
    if not report.trees:
        return None
    at = report.batch.binding if report.batch is not None else 1
    rows = []
    for t in report.trees:
        o, S = t.overall, t.steps
        speedup, lo, hi = t.speedup
        i = t.batch.index(at) if at in t.batch else 0
        chain_k = t.chain_k[i]
        vs = with_interval(float(t.vs_chain[i]), None if t.vs_chain_lo is None else float(t.vs_chain_lo[i]),
                           None if t.vs_chain_hi is None else float(t.vs_chain_hi[i]), signed=True)
        why = ", ".join(f"{n} {k}" for k, n in t.fewer_why.items() if n)
        rows.append((
            f"{t.steps},{t.topk},{t.draft_tokens}" + ("" if t.attention == "slot" else f" {t.attention}"),
            " ".join(num(a, 2) for a in o.value.alpha),
            with_interval(float(o.value.tau_sim[S - 1]), None if o.lo is None else float(o.lo.tau_sim[S - 1]),
                          None if o.hi is None else float(o.hi.tau_sim[S - 1])),
            num(float(o.value.mean_acceptance_length[S - 1])),
            with_interval(speedup, lo, hi),
            f"{vs} (K={chain_k})" if chain_k else f"{vs} (no spec.)",
            f"{t.fewer}" + (f" ({why})" if why else "") + f" / {t.more}",
        ))
    return TextTable(
        title=f"what-if: SGLang tree drafts (S, TOPK, T), at batch {at}",
        columns=("S,TOPK,T", "α_1..α_S", "τ_sim", "accept length", "speedup", "vs chain", "anchors fewer / more than chain"),
        rows=tuple(rows),
        caption="S = --speculative-num-steps, TOPK = --speculative-eagle-topk, T = --speculative-num-draft-tokens "
                "(the root included); grown and verified as SGLang 0.5.23 does (slot attention; 'ancestors': the "
                "true-ancestor what-if). α_k: acceptance at depth k of the accepted path; τ_sim: the simulated decode "
                "with the tree; accept length: SGLang's (1 + accepted per verify step); speedup: τ_sim / (verify of T "
                "tokens + S draft steps, S-1 of them over TOPK tokens per sequence); vs chain: minus the chain's "
                "speedup at its best K at this batch size, paired interval; fewer / more: anchors where the tree "
                "accepts fewer (why: budget = cut by T-1, frontier = left the K best of a level, attention = the "
                "node's drafts differ under slot attention) or more drafts than the chain at K = S. A what-if: the "
                "verdict is the chain's; `mtp-observe export --engine sglang --tree S,TOPK,T` writes one",
    )


def configuration_table(report: Report) -> TextTable | None:
    if not report.configurations:
        return None
    rows = []
    for c in report.configurations:
        if c.name == "none":
            rows.append((str(c.batch), "no speculation", "", num(1.0)))
            continue
        what = f"chain K={c.k}" if c.name == "chain" else f"tree {c.steps},{c.topk},{c.draft_tokens}"
        rows.append((str(c.batch), what, f"{c.steps} / {c.topk} / {c.draft_tokens}", with_interval(c.speedup, c.lo, c.hi)))
    return TextTable(
        title="what-if: the best of the chain and the replayed trees by batch size",
        columns=("batch", "configuration", "SGLang steps / topk / draft tokens", "speedup"),
        rows=tuple(rows),
        caption="the largest point speedup among the chain at K = 1..Kmax and every replayed tree; the verdict stays "
                "the chain's (the configuration both vLLM and SGLang serve); a tree is SGLang-only",
    )


def layer_rule_table(report: Report) -> TextTable | None:
    if not report.layer_rules:
        return None
    k = max(r.k for r in report.layer_rules)
    rows = []
    for r in report.layer_rules:
        v = r.overall.value
        rows.append((r.text, *[num(float(v.alpha[i]), 3) if i < r.k else "" for i in range(k)],
                     *[num(float(v.tau_sim[i]), 3) if i < r.k else "" for i in range(k)]))
    return TextTable(
        title="every shipped MTP layer: which layer drafts at each step",
        columns=("rule", *[f"α_{i + 1}" for i in range(k)], *[f"τ_sim({i + 1})" for i in range(k)]),
        rows=tuple(rows),
        caption="the same anchors; layer i at step i+1 drafts as many tokens as the head has layers; the chain's rows "
                "(the verdict's) are layer 0 at every step, what vLLM 0.33 runs for Qwen3.5 and SGLang's NEXTN builds",
    )


def what_if_tables(report: Report) -> list[TextTable]:
    return [t for t in (tree_table(report), configuration_table(report), layer_rule_table(report)) if t is not None]
