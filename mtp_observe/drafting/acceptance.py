"""Acceptance: drafts and target reductions to rows, one per (anchor, depth) — ACCEPTANCE.md.

Contract: `anchor_plan` says which anchors and depths a request's spans evaluate;
`request_rows` turns the head's drafts and the target's reductions into the columns of
positions.parquet for one request. Pure array work; no model, no files.

Per span [s, e] (x_s the first generated token, x_e the end-of-turn token):
    anchors p = s..e-1 (p >= 1: anchor p needs the head's row p-1)
    depth k evaluable at p iff p + k <= e           -> depths(p) = min(K, e - p)
Per row (p, k):
    actual_token  x_{p+k};   target_token  argmax of the target at p+k-1
    match         d_k == x_{p+k}
    accepted      match at every depth 1..k (the chain survives to depth k)
Worked example, span s=10, e=13, K=4: anchors 10, 11, 12 with depths 3, 2, 1 — six rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True)
class AnchorPlan:
    anchors: Tensor  # [A] int64  anchor positions p, ascending
    depths: Tensor  # [A] int64  evaluable depths at each anchor, 1..K
    turns: Tensor  # [A] int64  the span's turn (assistant message index)
    span_starts: Tensor  # [A] int64  s of the anchor's span


def anchor_plan(spans, k_max: int) -> AnchorPlan:
    """spans: sequence of objects with start, end, turn."""
    anchors, depths, turns, starts = [], [], [], []
    for sp in spans:
        p = torch.arange(max(sp.start, 1), sp.end)
        anchors.append(p)
        depths.append(torch.clamp(sp.end - p, max=k_max))
        turns.append(torch.full_like(p, sp.turn))
        starts.append(torch.full_like(p, sp.start))
    cat = (lambda xs: torch.cat(xs) if xs else torch.empty(0, dtype=torch.long))
    return AnchorPlan(cat(anchors), cat(depths), cat(turns), cat(starts))


@dataclass(frozen=True)
class RowIndex:
    """The (anchor, depth) rows of a plan, anchor-major (so sorted by pos, then depth)."""

    anchor_index: Tensor  # [R] int64 index into plan.anchors
    depth: Tensor  # [R] int64 1..K
    pos: Tensor  # [R] int64 anchor position p
    target_position: Tensor  # [R] int64 p + k - 1, where the target's logits are read
    actual_position: Tensor  # [R] int64 p + k, the recorded token's index


def row_index(plan: AnchorPlan, k_max: int) -> RowIndex:
    A = plan.anchors.shape[0]
    k = torch.arange(1, k_max + 1)
    valid = k[None, :] <= plan.depths[:, None]  # [A, K]
    a_idx, k_idx = torch.nonzero(valid, as_tuple=True)  # row-major: anchor-major order
    depth = k[k_idx] if A else torch.empty(0, dtype=torch.long)
    pos = plan.anchors[a_idx]
    return RowIndex(a_idx, depth, pos, pos + depth - 1, pos + depth)


def accepted_from_match(match: Tensor, anchor_index: Tensor, depth: Tensor, n_anchors: int, k_max: int) -> Tensor:
    """accepted[r] = match at every depth 1..k of row r's anchor. match: [R] bool -> [R] bool."""
    grid = torch.zeros(n_anchors, k_max, dtype=torch.bool)
    grid[anchor_index, depth - 1] = match
    survived = torch.cumprod(grid.to(torch.int8), dim=1).bool()
    return survived[anchor_index, depth - 1]


def request_rows(
    input_ids: Tensor,
    segments_by_position: Tensor,
    plan: AnchorPlan,
    index: RowIndex,
    draft_tokens: Tensor,
    draft_logprobs: Tensor,
    reductions,
    k_max: int,
) -> dict[str, np.ndarray]:
    """Columns of positions.parquet for one request (without session_id/request), as numpy arrays.

    input_ids: [n]; segments_by_position: [n] int8 segment code of each token (-1 outside spans);
    draft_tokens/draft_logprobs: [A, K] from the chain, or any drafter's drafts (NO_TOKEN = -1 where it
    proposes nothing: such a row never matches); draft_logprobs None: NaN (a model-free drafter has none);
    reductions: target.Reductions over the rows, or None when no target was run (the target's columns are
    then left out).
    """
    a, k = index.anchor_index, index.depth
    draft = draft_tokens.cpu()[a, k - 1]
    actual = input_ids[index.actual_position]
    match = draft == actual
    accepted = accepted_from_match(match, a, k, plan.anchors.shape[0], k_max)
    segment = segments_by_position[index.actual_position]
    assert bool((segment >= 0).all()), "every drafted token lies inside a scored span"
    cols = {
        "turn": plan.turns[a].numpy().astype(np.int32),
        "pos": index.pos.numpy().astype(np.int32),
        "depth": k.numpy().astype(np.int8),
        "segment": segment.numpy().astype(np.int8),
        "draft_token": draft.numpy().astype(np.int32),
        "actual_token": actual.numpy().astype(np.int32),
        "match": match.numpy(),
        "accepted": accepted.numpy(),
        "draft_logprob": (draft_logprobs.cpu()[a, k - 1].numpy().astype(np.float32) if draft_logprobs is not None
                          else np.full(len(a), np.nan, dtype=np.float32)),
    }
    if reductions is None:
        return cols
    cols["target_token"] = reductions.target_token.cpu().numpy().astype(np.int32)
    cols["target_logprob"] = reductions.target_logprob.cpu().numpy().astype(np.float32)
    cols["actual_logprob"] = reductions.actual_logprob.cpu().numpy().astype(np.float32)
    for name, values in reductions.p_accept.items():
        cols[f"p_accept_{name}"] = values.cpu().numpy().astype(np.float32)
    return cols


def rows_of(reductions, lo: int, hi: int):
    """The Reductions of rows lo..hi-1 (the fit sums stay with the whole request)."""
    from ..model.target import Reductions

    return Reductions(target_token=reductions.target_token[lo:hi], target_logprob=reductions.target_logprob[lo:hi],
                      actual_logprob=reductions.actual_logprob[lo:hi],
                      p_accept={name: values[lo:hi] for name, values in reductions.p_accept.items()})


class NonFiniteOutput(ValueError):
    """The target's or the head's outputs hold NaN or inf (the pipeline adds the session and model)."""


def check_finite(columns: dict, head=None) -> None:
    """Raise NonFiniteOutput when a float column of a request's rows is not finite. The columns are numpy
    arrays already on the host (request_rows brought them there), so this adds no device sync.

    Where a drafter proposed nothing (draft_token -1) target_logprob is NaN by definition; draft_logprob is
    checked on the rows `head` marks ([R] bool: the head drafted them; None: every row)."""
    import numpy as np

    proposed = columns["draft_token"] >= 0
    target = [c for c in ["target_logprob", "actual_logprob"] + sorted(c for c in columns if c.startswith("p_accept_"))
              if c in columns]
    head = np.ones(len(proposed), dtype=bool) if head is None else head
    for who, names in (("the target's", target), ("the MTP head's", ["draft_logprob"])):
        for name in names:
            values = columns[name]
            if name == "target_logprob":
                values = values[proposed]
            elif name == "draft_logprob":
                values = values[head & proposed]
            if not np.isfinite(values).all():
                bad = int((~np.isfinite(values)).sum())
                raise NonFiniteOutput(f"{who} outputs are not finite ({bad} of {len(values)} {name} values NaN or inf)")
