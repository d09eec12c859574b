"""Tree acceptance: a grown tree verified against the recorded continuation, as SGLang verifies it, into rows.

Contract:
    recorded_walk(grown, kept, steps, continuation) -> Walk
                                       the recorded tokens followed down the final tree (and the grown one, to say
                                       why a walk stops), batched over anchors
    tree_entries(walk, ...) / tree_columns(...)
                                       the target reductions a tree's rows need and the positions.parquet columns
    verify_greedy(...) / verify_sampled(...) / accept_length_distribution(...)
                                       SGLang's two rules on one explicit tree, and the sampled rule's closed form
                                       (the test loop's, tests/tree_loop.py, and the pinned cases')

SGLang's verification (sglang 0.5.23, sglang/kernels/jit/include/sgl_kernel/speculative/eagle.cuh and sampling.cuh;
eagle_utils.py:636-790 picks greedy for an all-greedy batch, else `tree_speculative_sampling_target_only`):
    greedy   from the root, accept the child whose token is the target's argmax at the current node (siblings are
             distinct tokens of one top-k, so at most one matches); stop when none does or at depth S; the bonus is
             the argmax at the last accepted node (VerifyTreeGreedy, eagle.cuh:214-256)
    sampled  at node u one coin c ~ U[0, 1); the children c_1, c_2, .. in ascending tree index (descending draft
             probability); accept the first with q_u(c_j) > 0 and c < q_u(c_1) + .. + q_u(c_j) (the default
             thresholds, 1 and 1: spec.py:109-116); a fresh coin at the next level; if none is accepted (or at depth
             S) the bonus ~ q_u with the rejected children removed, renormalised (sampling.cuh:39-175; SGLang passes
             zeros for the draft probabilities, so a rejected child x gets p_u(x) = q_u(x))
Both are "the target's next token, followed down the tree": the sampled rule accepts child c_j with probability
q_u(c_j) exactly and its bonus is never a child, so the committed tokens are a sample of q (lossless) and the
accepted length is how far that sample runs down the tree (derived; tests/test_tree.py checks it by Monte Carlo).
So, on traffic recorded from this target with its sampler (or greedily), the recorded continuation *is* a
trajectory of the tree decoder, and the accepted length at anchor p is the depth to which x_{p+1}, x_{p+2}, .. is a
root path of the tree (`recorded_walk`); ACCEPTANCE.md's observer argument for the chain, unchanged. For another
sampler S the chance of leaving node u on the recorded path is Σ over u's children of q_S(child), each row's
p_accept_<profile> (the report's what-if then walks it as for the chain). Closed form on one tree:
P(path reaches node w) = Π over its edges u -> x of q_u(x); E[accept_len] = 1 + Σ_{w ≠ root} P(reach w).

Row semantics (positions.parquet, a tree's rows: `drafter` = its name, draft_k = S; rows at depths 1..min(S, e-p)):
    draft_token     x_{p+k} when the final tree holds it under the on-path node at depth k-1; else that node's most
                    likely kept child; -1 once the recorded path has left the tree (or the node has no kept child)
    match/accepted  x_{p+k} is a kept child of the on-path node / x_{p+1..p+k} is a root path of the final tree
    draft_logprob   the head's log-probability of draft_token given its parent (NaN for -1)
    p_accept_<P>    Σ over the on-path node's kept children of the profile's probability at p+k-1 (0 off the path)
    tree_node       why the walk is where it is at depth k (WHY): 2 kept, 1 grown but cut by the T-1 budget, 0 the
                    grown node was expanded but its K children lack x_{p+k}, -1 the grown node at depth k-1 was not
                    in its level's frontier (never expanded), -2 the recorded path left the grown tree earlier
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

KEPT, PRUNED, NOT_PROPOSED, NOT_EXPANDED, OFF_PATH = 2, 1, 0, -1, -2
WHY = {KEPT: "kept", PRUNED: "cut by the T-1 budget", NOT_PROPOSED: "not among the node's top-K children",
       NOT_EXPANDED: "its parent left the frontier (the K best of a level)", OFF_PATH: "the path left the tree earlier"}


@dataclass(frozen=True)
class Walk:
    """The recorded continuation followed down one configuration's tree at every anchor. A anchors, S depths, K."""

    status: Tensor  # [A, S] int8  tree_node (module docstring)
    draft: Tensor  # [A, S] int64  global id of the row's draft node, -1: none
    candidates: Tensor  # [A, S, K] int64  global ids of the on-path node's kept children (rank order), -1 padding
    accepted: Tensor  # [A] int64  accepted length: leading KEPT depths


@torch.no_grad()
def recorded_walk(grown, kept: Tensor, steps: int, continuation: Tensor) -> Walk:
    """grown: tree.Grown; kept: tree.select's [A, N_S]; continuation [A, S] x_{p+1..p+S} (-1 past the request)."""
    K = grown.topk
    A = kept.shape[0]
    device = kept.device
    n = kept.shape[1]
    first_child = torch.where(grown.first_child[:, :n] < n, grown.first_child[:, :n], -1)  # deeper than S: not here
    slots = torch.arange(K, device=device)
    cur = torch.full((A,), -1, dtype=torch.long, device=device)  # -1: the root
    on_grown = torch.ones(A, dtype=torch.bool, device=device)  # the recorded path is still in the grown tree
    intact = torch.ones(A, dtype=torch.bool, device=device)  # ... and in the final (kept) tree
    status = torch.empty(A, steps, dtype=torch.int8, device=device)
    draft = torch.full((A, steps), -1, dtype=torch.long, device=device)
    candidates = torch.full((A, steps, K), -1, dtype=torch.long, device=device)
    for k in range(steps):
        at_root = cur < 0
        base = torch.where(at_root, 0, first_child.gather(1, cur.clamp(min=0)[:, None])[:, 0])
        expanded = at_root | (base >= 0)
        children = base.clamp(min=0)[:, None] + slots[None, :]  # [A, K]
        children = children.clamp(max=n - 1)
        usable = (expanded & on_grown)[:, None]
        hit = usable & (grown.tokens[:, :n].gather(1, children) == continuation[:, k : k + 1])
        found = hit.any(1)
        hit_id = children.gather(1, hit.int().argmax(1, keepdim=True))[:, 0]
        hit_kept = found & kept.gather(1, hit_id[:, None])[:, 0]
        status[:, k] = torch.where(~on_grown, OFF_PATH, torch.where(~expanded, NOT_EXPANDED, torch.where(
            ~found, NOT_PROPOSED, torch.where(hit_kept, KEPT, PRUNED)))).to(torch.int8)
        kept_children = (expanded & intact)[:, None] & kept.gather(1, children)  # [A, K] in rank order
        ranked = torch.sort((~kept_children).int(), dim=1, stable=True).indices  # kept ones first, rank kept
        cand = torch.where(kept_children.gather(1, ranked), children.gather(1, ranked), -1)
        candidates[:, k] = cand
        draft[:, k] = torch.where(intact & hit_kept, hit_id, cand[:, 0])
        intact = intact & hit_kept
        on_grown = on_grown & found
        cur = torch.where(found, hit_id, cur)
    accepted = torch.cumprod((status == KEPT).long(), dim=1).sum(1)
    return Walk(status=status, draft=draft, candidates=candidates, accepted=accepted)


@dataclass(frozen=True)
class TreeRows:
    """One tree configuration's rows of one request, and the target reductions they need (E entries, one per
    (row, kept candidate), the row's draft first; a row without candidates has one entry at token 0, masked)."""

    index: object  # acceptance.RowIndex of the rows (depths 1..min(S, e-p))
    draft_token: Tensor  # [R] int64, -1: none
    draft_logprob: Tensor  # [R] fp32, NaN for -1
    status: Tensor  # [R] int8
    entry_row: Tensor  # [E] int64  the row each entry belongs to
    entry_token: Tensor  # [E] int64
    entry_real: Tensor  # [E] bool  a kept candidate (False: the placeholder of a row without any)
    entry_first: Tensor  # [R] int64  each row's first entry (its draft's)

    @property
    def positions(self) -> Tensor:
        return self.index.target_position[self.entry_row]

    @property
    def actual_positions(self) -> Tensor:
        return self.index.actual_position[self.entry_row]


def tree_rows(grown, walk: Walk, plan, index) -> TreeRows:
    """The rows of one configuration (its plan at S: acceptance.anchor_plan(spans, S), row_index(plan, S))."""
    a, k = index.anchor_index, index.depth - 1
    draft = walk.draft.cpu()[a, k]
    ids = draft.clamp(min=0)
    tokens = grown.tokens.cpu()[a, ids]
    draft_token = torch.where(draft >= 0, tokens, -1)
    draft_logprob = torch.where(draft >= 0, grown.logprobs.cpu()[a, ids], torch.tensor(float("nan")))
    cand = walk.candidates.cpu()[a, k]  # [R, K]
    # The draft first, then the other kept candidates; a row without any gets one placeholder entry.
    others = (cand >= 0) & (cand != draft[:, None])
    count = 1 + others.sum(1)
    R = a.shape[0]
    entry_row = torch.repeat_interleave(torch.arange(R), count)
    entry_first = torch.cumsum(count, 0) - count
    first_token = torch.where(draft_token >= 0, draft_token, 0)
    other_tokens = grown.tokens.cpu()[a[:, None].expand_as(cand), cand.clamp(min=0)]
    entry_token = torch.empty(int(count.sum()), dtype=torch.long)
    entry_real = torch.ones(int(count.sum()), dtype=torch.bool)
    entry_token[entry_first] = first_token
    entry_real[entry_first] = draft_token >= 0
    rest = torch.ones_like(entry_real)
    rest[entry_first] = False
    entry_token[rest] = other_tokens[others]
    return TreeRows(index=index, draft_token=draft_token, draft_logprob=draft_logprob.float(),
                    status=walk.status.cpu()[a, k], entry_row=entry_row, entry_token=entry_token, entry_real=entry_real,
                    entry_first=entry_first)


def tree_columns(ids: Tensor, segments: Tensor, plan, rows: TreeRows, reductions, k_max: int) -> dict[str, np.ndarray]:
    """positions.parquet columns of one tree's rows (acceptance.request_rows' columns, plus tree_node), from the
    target's Reductions over its entries (None: no target)."""
    from .acceptance import accepted_from_match

    index = rows.index
    a, k = index.anchor_index, index.depth
    actual = ids[index.actual_position]
    match = rows.status == KEPT
    match = match & (rows.draft_token == actual)
    accepted = accepted_from_match(match, a, k, plan.anchors.shape[0], k_max)
    segment = segments[index.actual_position]
    assert bool((segment >= 0).all()), "every drafted token lies inside a scored span"
    cols = {
        "turn": plan.turns[a].numpy().astype(np.int32),
        "pos": index.pos.numpy().astype(np.int32),
        "depth": k.numpy().astype(np.int8),
        "segment": segment.numpy().astype(np.int8),
        "draft_token": rows.draft_token.numpy().astype(np.int32),
        "actual_token": actual.numpy().astype(np.int32),
        "match": match.numpy(),
        "accepted": accepted.numpy(),
        "draft_logprob": rows.draft_logprob.numpy().astype(np.float32),
        "tree_node": rows.status.numpy().astype(np.int8),
    }
    if reductions is None:
        return cols
    first = rows.entry_first
    cols["target_token"] = reductions.target_token.cpu()[first].numpy().astype(np.int32)
    target_logprob = reductions.target_logprob.cpu()[first].clone()
    target_logprob[rows.draft_token < 0] = float("nan")
    cols["target_logprob"] = target_logprob.numpy().astype(np.float32)
    cols["actual_logprob"] = reductions.actual_logprob.cpu()[first].numpy().astype(np.float32)
    R = first.shape[0]
    for name, values in reductions.p_accept.items():
        real = torch.where(rows.entry_real, values.cpu().double(), 0.0)
        total = torch.zeros(R, dtype=torch.float64).index_add_(0, rows.entry_row, real)
        cols[f"p_accept_{name}"] = total.clamp(max=1.0).numpy().astype(np.float32)
    return cols


# ---------------------------------------------------------------------------------------------
# SGLang's two rules on one explicit tree (the test loop's; a replay needs neither: module docstring)


@dataclass(frozen=True)
class ExplicitTree:
    """One tree in SGLang's verify layout: node 0 the root, nodes 1..T-1 in ascending global id."""

    tokens: tuple[int, ...]  # [T] node tokens (the root's is the last committed token)
    parent: tuple[int, ...]  # [T] parent node, -1 for the root
    depth: tuple[int, ...]  # [T]

    def children(self, u: int) -> list[int]:
        """u's children in ascending node index (= descending draft probability among siblings)."""
        return [v for v in range(1, len(self.tokens)) if self.parent[v] == u]

    def path(self, v: int) -> list[int]:
        """The tokens of the nodes root -> v, the root excluded."""
        out = []
        while v > 0:
            out.append(self.tokens[v])
            v = self.parent[v]
        return out[::-1]


def explicit_tree(grown, kept: Tensor, anchor: int, root_token: int) -> ExplicitTree:
    """The final tree at one anchor (row `anchor` of grown / kept) in SGLang's node order (build_tree_efficient)."""
    ids = torch.nonzero(kept[anchor]).squeeze(1).tolist()  # ascending global id
    node = {g: t + 1 for t, g in enumerate(ids)}
    parent = [-1] + [0 if int(grown.parent[anchor, g]) < 0 else node[int(grown.parent[anchor, g])] for g in ids]
    depth = [0] * (len(ids) + 1)
    for t in range(1, len(ids) + 1):
        depth[t] = depth[parent[t]] + 1
    return ExplicitTree(tokens=(root_token, *[int(grown.tokens[anchor, g]) for g in ids]), parent=tuple(parent),
                        depth=tuple(depth))


def verify_greedy(tree: ExplicitTree, target_argmax: list[int], steps: int) -> tuple[list[int], int]:
    """VerifyTreeGreedy: target_argmax[u] is the target's argmax after the path root -> u. -> (accepted nodes, bonus)."""
    accepted, u = [], 0
    for _ in range(steps):
        nxt = next((v for v in tree.children(u) if tree.tokens[v] == target_argmax[u]), None)
        if nxt is None:
            break
        accepted.append(nxt)
        u = nxt
    return accepted, target_argmax[u]


def verify_sampled(tree: ExplicitTree, q: list[np.ndarray], steps: int, coins, final_coin: float,
                   threshold_single: float = 1.0, threshold_acc: float = 1.0) -> tuple[list[int], int]:
    """TreeSpeculativeSamplingTargetOnly (sampling.cuh:64-173): q[u] the target sampler's distribution [V] after the
    path root -> u; coins(u) the coin drawn at node u. -> (accepted nodes, bonus token)."""
    accepted, u = [], 0
    coin, acc = coins(0), 0.0
    rejected: list[int] = []
    for _ in range(steps):
        chosen = None
        for v in tree.children(u):
            p = float(q[u][tree.tokens[v]])
            acc += p
            if p > 0 and (coin < acc / max(threshold_acc, 1e-9) or p >= threshold_single):
                chosen = v
                break
            rejected.append(tree.tokens[v])
        if chosen is None:
            break
        accepted.append(chosen)
        u, acc, rejected = chosen, 0.0, []
        coin = coins(chosen)
    residual = np.asarray(q[u], dtype=np.float64).copy()
    if len(accepted) < steps:  # "there is no draft_probs for the bonus token" at full depth
        residual[rejected] = 0.0
    residual = np.maximum(residual, 0.0)
    cdf = np.cumsum(residual)
    index = int(np.searchsorted(cdf, final_coin * cdf[-1], side="right"))
    return accepted, min(index, len(residual) - 1)


def accept_length_distribution(tree: ExplicitTree, q: list[np.ndarray], steps: int) -> np.ndarray:
    """[S+1] P(accepted drafts = a), a = 0..S, of the sampled rule at the default thresholds: the chance of reaching
    node w is Π over its edges u -> x of q_u(x), P(A >= d) = Σ over depth-d nodes of it (module docstring)."""
    reach = [1.0] + [0.0] * (len(tree.tokens) - 1)
    for v in range(1, len(tree.tokens)):  # parents come first (ascending node index)
        reach[v] = reach[tree.parent[v]] * float(q[tree.parent[v]][tree.tokens[v]])
    at_least = np.zeros(steps + 2)
    for v, r in enumerate(reach):
        if tree.depth[v] <= steps:
            at_least[tree.depth[v]] += r
    return at_least[:-1] - at_least[1:]
