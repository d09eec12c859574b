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

Past the end of the turn (`past_end_entries`, `accepted_past_end`): an engine verifies a draft that runs past the
end-of-turn token like any other and counts what it accepts before it trims the tokens past the stop token
(vllm/v1/core/sched/scheduler.py:2116-2135 count len(generated_token_ids) - 1; the trim, :2166 and :2493-2511).
The target's prediction after x_e is its argmax at e, which the forward has: an anchor p with e - p < K whose draft
holds d_{e-p+1} gets accepted_past_end = 1 when d_{e-p+1} is that argmax (0 otherwise), on every row of the anchor.
Deeper drafts past the end would need the target's forward over its own continuation; they count as rejected.
Worked example, span s=10, e=13, K=4, target argmax at 13 = 7: anchor 11 drafting [x_12, x_13, 7, 9] has
accepted_past_end 1; anchor 12 drafting [x_13, 8] has 0.
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


@dataclass(frozen=True)
class PastEnd:
    """The anchors whose draft holds a token just past the end of their turn: where to read the target."""

    anchor_index: Tensor  # [B] int64 index into plan.anchors (e - p < K and d_{e-p+1} proposed)
    target_position: Tensor  # [B] int64 e, the end-of-turn token's index: the target's logits after it
    token: Tensor  # [B] int64 the draft d_{e-p+1}


def past_end_entries(plan: AnchorPlan, draft_tokens: Tensor, k_max: int) -> PastEnd:
    """draft_tokens [A, K'] (NO_TOKEN -1 where nothing is proposed; K' may be below k_max) -> PastEnd."""
    tokens = draft_tokens.cpu()
    short = plan.depths < min(k_max, tokens.shape[1])  # e - p < K: the draft reaches past x_e
    a = torch.nonzero(short, as_tuple=True)[0]
    m = plan.depths[a]
    token = tokens[a, m].long() if a.numel() else torch.empty(0, dtype=torch.long)
    proposed = token >= 0
    a, m, token = a[proposed], m[proposed], token[proposed]
    return PastEnd(a, plan.anchors[a] + m, token)


def accepted_past_end(past: PastEnd, target_token: Tensor, n_anchors: int) -> Tensor:
    """[A] int8: 1 where the draft's first token past x_e is the target's argmax after x_e (target_token [B])."""
    out = torch.zeros(n_anchors, dtype=torch.int8)
    out[past.anchor_index] = (target_token.cpu().long() == past.token).to(torch.int8)
    return out


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
    past_end: Tensor | None = None,
) -> dict[str, np.ndarray]:
    """Columns of positions.parquet for one request (without session_id/request), as numpy arrays.

    input_ids: [n]; segments_by_position: [n] int8 segment code of each token (-1 outside spans);
    draft_tokens/draft_logprobs: [A, K] from the chain, or any drafter's drafts (NO_TOKEN = -1 where it
    proposes nothing: such a row never matches); draft_logprobs None: NaN (a model-free drafter has none);
    reductions: target.Reductions over the rows, or None when no target was run (the target's columns are
    then left out). past_end: [A] int8 accepted_past_end of each anchor (None: 0; written with the target's columns).
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
    cols["accepted_past_end"] = (past_end[a].numpy() if past_end is not None
                                 else np.zeros(len(a), dtype=np.int8)).astype(np.int8)
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
