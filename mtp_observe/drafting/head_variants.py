"""The head's variants: tree drafts (`replay --tree`) and the stepwise layer rule, replayed beside the chain.

Contract:
    Variants(trees, stepwise)          what a replay runs besides the chain: SGLang tree configurations (tree.py) and,
                                       for a head with several MTP layers, layer i at step i (layer_rules.py; the
                                       chain's `mtp` rows are layer 0 at every step)
    variants_for(trees, geometry, k)   the run's variants
    variant_blocks(head, variants, rows, ids, segments, spans) -> [Block]
                                       one block of rows per variant for one request, with the target reductions
                                       its rows need (pipeline.drafter_columns reduces them with every other row)

Every variant's rows sit in positions.parquet beside the chain's, with the chain's columns and definitions
(`drafter` = the variant's name, `draft_k` = its depth; tables.py, version 3), so the report computes their numbers
with the same functions (report/trees.py). The head's extra work grows with the trees, not the target's: the target
runs once per request; each (TOPK, attention rule) grows one tree to the deepest S asked for (a shallower
configuration with the same TOPK reads its first levels: the frontier of a level does not depend on S), and its
rows add target reductions at the chain's own positions (logits computed once per position, tokens gathered).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .layer_rules import STEPWISE, layer_rows, stepwise_chain
from .tree import TreeConfig, grow, select
from .tree_acceptance import recorded_walk, tree_columns, tree_rows


@dataclass(frozen=True)
class Variants:
    trees: tuple[TreeConfig, ...] = ()
    stepwise: int = 0  # depth of the stepwise rule's rows (min(Kmax, layers)); 0: a one-layer head, no such rows

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.trees] + ([STEPWISE] if self.stepwise else [])

    @property
    def draft_ks(self) -> list[int]:
        """The depth of each variant's rows (parts.py counts rows by them)."""
        return [t.steps for t in self.trees] + ([self.stepwise] if self.stepwise else [])

    def __bool__(self) -> bool:
        return bool(self.trees) or self.stepwise > 0

    def manifest(self, layers: int) -> dict:
        """run.json `trees` and `layer_rules` (tables.py, version 3)."""
        rules = []
        if self.stepwise:
            rules = [{"rule": "layer0", "drafter": "mtp", "layers": layers, "k": None},
                     {"rule": "stepwise", "drafter": STEPWISE, "layers": layers, "k": self.stepwise}]
        return {"trees": [t.as_dict() for t in self.trees], "layer_rules": rules}


def variants_for(trees: tuple[TreeConfig, ...], layers: int, k: int) -> Variants:
    return Variants(trees=tuple(trees), stepwise=min(k, layers) if layers > 1 else 0)


@dataclass(frozen=True)
class Block:
    """One variant's rows of one request: the reductions its rows need, and how its columns are made from them."""

    name: str
    draft_k: int
    positions: torch.Tensor  # [E] where the target's logits are read
    tokens: torch.Tensor  # [E] the tokens whose log-probability and sampler probability the rows need
    actuals: torch.Tensor  # [E] the recorded token after each position
    finish: Callable  # (target.Reductions of the E entries, or None) -> positions.parquet columns (numpy)


def variant_blocks(head, variants: Variants, rows, ids: torch.Tensor, segments: torch.Tensor, spans,
                   chunk_size: int = 2048) -> list[Block]:
    """Every variant's block of one request (order: variants.names). rows: the head's row pass over the request."""
    from .acceptance import anchor_plan, request_rows, row_index

    blocks = []
    n = ids.shape[0]
    by_rule: dict[tuple[int, str], int] = {}
    for t in variants.trees:  # one grown tree per (TOPK, rule), as deep as its deepest configuration
        key = (t.topk, t.attention)
        by_rule[key] = max(by_rule.get(key, 0), t.steps)
    deepest = max((t.steps for t in variants.trees), default=0)
    plan_all = anchor_plan(spans, max(deepest, 1))
    grown = {key: grow(head, rows, plan_all.anchors, key[0], S, key[1]) for key, S in by_rule.items()}
    for t in variants.trees:
        plan = anchor_plan(spans, t.steps)
        index = row_index(plan, t.steps)
        g = grown[(t.topk, t.attention)]
        kept = select(g, t.steps, t.draft_tokens)
        offsets = plan.anchors[:, None] + torch.arange(1, t.steps + 1)[None, :]  # x_{p+1..p+S}
        continuation = torch.where(offsets < n, ids[offsets.clamp(max=n - 1)], -1).to(kept.device)
        walk = recorded_walk(g, kept, t.steps, continuation)
        tr = tree_rows(g, walk, plan, index)

        def finish(reductions, tr=tr, plan=plan, S=t.steps):
            return tree_columns(ids, segments, plan, tr, reductions, S)

        blocks.append(Block(t.name, t.steps, tr.positions, tr.entry_token, ids[tr.actual_positions], finish))
    if variants.stepwise:
        K = variants.stepwise
        layers = layer_rows(head, rows, ids, chunk_size)  # a depth-(i+1) row exists only where layer i has rows
        plan = anchor_plan(spans, K)
        index = row_index(plan, K)
        drafts = stepwise_chain(head, layers, plan.anchors, plan.depths)
        tokens, logprobs = drafts.tokens.cpu(), drafts.logprobs.cpu()
        a, k = index.anchor_index, index.depth

        def finish_stepwise(reductions, plan=plan, index=index, tokens=tokens, logprobs=logprobs, K=K):
            return request_rows(ids, segments, plan, index, tokens, logprobs, reductions, K)

        blocks.append(Block(STEPWISE, variants.stepwise, index.target_position, tokens[a, k - 1],
                            ids[index.actual_position], finish_stepwise))
    return blocks
