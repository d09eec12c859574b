"""vLLM's penalties (repetition, frequency, presence) as the target's sampler applies them to a chunk of logits.

Contract: `PenaltyState` is what the penalties read at each position (the tokens of its prompt, the counts of its
output so far), built from token lists (`PenaltyState.from_tokens`, what `generate` has) or from a request's turns
(`turn_penalty_state`, the recorded path the replay scores); `penalised(logits, penalties, state)` applies them in
place and undoes them on exit (`penalised_values` on a few values); `penalised_ranking` takes the penalised top
values from a ranking of the raw logits. target.py's sampler (sampler_distribution, reduce_logits) reads them; the
rules and their vLLM sources are listed above target.SamplingProfile.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

NO_PENALTIES = (1.0, 0.0, 0.0)  # (repetition, frequency, presence)


@dataclass(frozen=True)
class PenaltyState:
    """What vLLM's penalties read at each of c positions, on the u vocabulary columns that occur at all.

    Repetition reads the prompt and the output; frequency and presence the output: the tokens
    generated so far in the turn (in serving: the committed ones and the drafts before this one in
    the same step; on the recorded path those drafts are the recorded tokens).
    """

    tokens: Tensor  # [u] int64  vocabulary ids occurring in some row's prompt or output, ascending
    in_prompt: Tensor  # [c, u] bool  tokens[i] occurs in the row's prompt
    output_counts: Tensor  # [c, u] int32  occurrences of tokens[i] among the row's output tokens

    @classmethod
    def from_tokens(cls, prompts, outputs, device=None) -> "PenaltyState":
        """prompts, outputs: c sequences of token ids each (e.g. one per sequence being generated)."""
        prompts = [torch.as_tensor(list(p), dtype=torch.long) for p in prompts]
        outputs = [torch.as_tensor(list(o), dtype=torch.long) for o in outputs]
        assert len(prompts) == len(outputs), (len(prompts), len(outputs))
        tokens = torch.unique(torch.cat(prompts + outputs + [torch.empty(0, dtype=torch.long)]))
        c, u = len(prompts), tokens.shape[0]
        in_prompt = torch.zeros(c, u, dtype=torch.bool)
        counts = torch.zeros(c, u, dtype=torch.int32)
        for i, (p, o) in enumerate(zip(prompts, outputs)):
            in_prompt[i, torch.searchsorted(tokens, p)] = True
            counts[i].index_add_(0, torch.searchsorted(tokens, o), torch.ones(o.shape[0], dtype=torch.int32))
        return cls(tokens.to(device), in_prompt.to(device), counts.to(device))


def turn_penalty_state(input_ids: Tensor, starts: Tensor, positions: Tensor, with_prompt: bool) -> PenaltyState:
    """The penalty state on a recorded request: the row at position j (whose logits emit x_{j+1}) of the
    turn starting at s has prompt x_0..x_{s-1} and output x_s..x_j (none at j = s-1).

    input_ids: [n]; starts, positions: [c] (s <= j + 1). Linear in the tokens, not in c x turn length:
    rows of a turn are counted cumulatively (each row adds the tokens since the row before it).
    Worked example: x = [7, 8, 9, 9], one turn s = 2, rows j = 1, 2, 3: outputs [], [9], [9, 9].
    """
    device = input_ids.device
    c = positions.shape[0]
    n = input_ids.shape[0]
    order = torch.argsort(starts * (n + 1) + positions)
    s, j = starts[order], positions[order]
    first = torch.ones(c, dtype=torch.bool, device=device)
    first[1:] = s[1:] != s[:-1]
    previous = torch.where(first, s - 1, torch.cat([j[:1], j[:-1]]))  # the last position already counted
    length = (j - previous).clamp(min=0)  # the row adds x_{previous+1} .. x_j
    row_of = torch.repeat_interleave(torch.arange(c, device=device), length)
    begin = torch.repeat_interleave(previous + 1, length)
    offset = torch.arange(row_of.shape[0], device=device) - torch.repeat_interleave(torch.cumsum(length, 0) - length, length)
    added = input_ids[begin + offset]
    prompt_ids = input_ids[: int(s.max()) if c and with_prompt else 0]  # every row's prompt is a prefix of this
    tokens = torch.unique(torch.cat([added, prompt_ids]))
    u = tokens.shape[0]
    increments = torch.zeros(c, u, dtype=torch.int32, device=device)
    increments.index_put_((row_of, torch.searchsorted(tokens, added)), torch.ones_like(added, dtype=torch.int32),
                          accumulate=True)
    counts = increments.cumsum(0)
    group = torch.cumsum(first.long(), 0) - 1
    starts_at = torch.nonzero(first).squeeze(1)
    base = torch.where((starts_at > 0)[:, None], counts[(starts_at - 1).clamp(min=0)], torch.zeros_like(counts[:1]))
    counts = (counts - base[group]).to(torch.int32)
    if with_prompt and prompt_ids.numel():
        first_seen = torch.full((u,), n, dtype=torch.long, device=device)
        first_seen.scatter_reduce_(0, torch.searchsorted(tokens, prompt_ids), torch.arange(prompt_ids.shape[0], device=device),
                                   "amin")
        in_prompt = first_seen[None, :] < s[:, None]
    else:
        in_prompt = torch.zeros(c, u, dtype=torch.bool, device=device)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(c, device=device)
    return PenaltyState(tokens, in_prompt[inverse], counts[inverse])


def penalised_values(values: Tensor, penalties: tuple[float, float, float], state: PenaltyState) -> Tensor:
    """vLLM's apply_penalties on the state's columns: values [c, u] (the logits at state.tokens) -> [c, u]."""
    repetition, frequency, presence = penalties
    counts = state.output_counts
    if repetition != 1.0:
        seen = state.in_prompt | (counts > 0)
        values = values * torch.where(seen, torch.where(values > 0, 1.0 / repetition, repetition), 1.0)  # as vLLM: x * (1/r) or x * r
    if frequency != 0.0:
        values = values - frequency * counts.to(values.dtype)
    if presence != 0.0:
        values = values - presence * (counts > 0).to(values.dtype)
    return values


@contextmanager
def penalised(logits: Tensor, penalties: tuple[float, float, float], state: PenaltyState | None):
    """Within the block, logits [c, V] carry the penalties (written on the state's columns in place and
    restored on exit: a [c, u] copy instead of a [c, V] one)."""
    if penalties == NO_PENALTIES:
        yield logits
        return
    assert state is not None, "a penalised sampler needs the penalty state (the prompt and the output so far)"
    if state.tokens.numel() == 0:
        yield logits
        return
    columns = state.tokens.to(logits.device)
    saved = logits[:, columns]
    logits[:, columns] = penalised_values(saved, penalties, state)
    try:
        yield logits
    finally:
        logits[:, columns] = saved


def penalised_ranking(raw: tuple[Tensor, Tensor], logits: Tensor, state: PenaltyState | None, width: int) -> tuple[Tensor, Tensor]:
    """The top `width` of the penalised logits, from the raw logits' ranking and the penalised columns, with no
    pass over the vocabulary. raw: the unpenalised logits' topk(m), m >= width; logits: [c, V] carrying the
    penalties (written on the state's columns); -> (values [c, width] descending, index [c, width]).

    The candidates are the raw top m with the penalised tokens' new values in place of theirs, plus every
    penalised token. A token among neither is unpenalised and at most the raw m-th value, so wherever that
    value is below the width-th candidate the candidates' top is the top; other rows (many ranked tokens
    pushed down at once) are ranked again on the penalised logits.
    """
    values, index = raw
    if state is None or state.tokens.numel() == 0:
        return values[:, :width], index[:, :width]
    columns = state.tokens.to(logits.device)
    c = logits.shape[0]
    candidate_values = torch.cat([values.masked_fill(torch.isin(index, columns), float("-inf")), logits[:, columns]], 1)
    candidate_index = torch.cat([index, columns.expand(c, -1)], 1)
    top, where = candidate_values.topk(width, dim=-1)
    top_index = candidate_index.gather(1, where)
    unsure = values[:, -1] >= top[:, -1]  # an unseen token could reach the top
    if bool(unsure.any()):
        rows = torch.nonzero(unsure).squeeze(1)
        again = logits[rows].topk(width, dim=-1)
        top, top_index = top.clone(), top_index.clone()
        top[rows], top_index[rows] = again
    return top, top_index
