"""Drafters: the model-free proposers (n-gram, suffix decoding) and their hybrids with a model drafter.

Contract: a drafter sees one request's tokens and its scored spans and proposes, at every anchor
of ACCEPTANCE.md ("Anchors and depths"), up to K tokens from the context x_0..x_p alone — never a
later token — for positions p+1..p+K:

    anchors(spans) -> [A] int64                   the anchors, in `acceptance.anchor_plan`'s order
    drafter.propose(tokens, spans, k) -> Proposals
        tokens  [n] int32 (the request), spans [S, 2] int64 rows (s, e), e inclusive
        Proposals.tokens [A, K] int32: d_1..d_K at each anchor; -1 where the drafter proposes
        nothing (then at every later depth too: a proposal is a chain that stops)

so a proposal row compares with x_{p+1}..x_{p+K} exactly as the MTP head's drafts do (match,
accepted, the simulated decode). Nothing here imports torch or reads a model: these drafters
draft from the tokens alone, and the pipeline can run them without loading weights.

The pipeline feeds a drafter every request of the run in input order (sessions in order, each
session's requests in order) — the `Drafter` protocol; a request whose rows another rank (or an
earlier run being resumed) writes goes to `add_outputs` instead, so state that spans requests is
the same whoever drafts what.

The drafters, one module each:
    ngram.py    vLLM's prompt-lookup proposer ("ngram"); stateless per request (its index is reused
                across requests that share a prefix, which changes nothing measured)
    suffix.py   suffix decoding as Arctic Inference implements it and vLLM runs it ("suffix"):
                state spans requests (a global tree over earlier outputs), fed in input order
    hybrid.py   combining a model-free proposal with a model drafter's (pure functions)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

NO_TOKEN = -1  # in a proposal row: nothing proposed at this depth


@dataclass(frozen=True)
class Proposals:
    anchors: np.ndarray  # [A] int64 anchor positions p (acceptance.anchor_plan's order)
    tokens: np.ndarray  # [A, K] int32 d_1..d_K at each anchor; NO_TOKEN where nothing is proposed

    @property
    def lengths(self) -> np.ndarray:
        """[A] int64: how many tokens each anchor's proposal holds."""
        return (self.tokens != NO_TOKEN).sum(axis=1).astype(np.int64)


class Drafter(Protocol):
    name: str  # the `drafter` value of its rows

    def propose(self, tokens: np.ndarray, spans, k: int, keep: int | None = None) -> Proposals:
        """Proposals at every anchor of one request. tokens [n] int; spans [S, 2] or rendering.Spans;
        keep: how many leading tokens the next request shares with this one (a hint; None: unknown)."""

    def add_outputs(self, tokens: np.ndarray, spans) -> None:
        """Take in a request without drafting (its rows are written elsewhere)."""


def span_array(spans) -> np.ndarray:
    """[S, 2] int64 (s, e) from an array or from objects with .start/.end (rendering.Span)."""
    if isinstance(spans, np.ndarray):
        out = spans.astype(np.int64, copy=False).reshape(-1, 2)
    else:
        out = np.array([(sp.start, sp.end) for sp in spans], dtype=np.int64).reshape(-1, 2)
    assert bool(np.all(out[:, 0] <= out[:, 1])), "a span starts at or before its end-of-turn token"
    assert bool(np.all(out[1:, 0] > out[:-1, 1])), "spans are in order and disjoint"
    return out


def anchors(spans) -> np.ndarray:
    """[A] int64: p = max(s, 1) .. e-1 for every span, spans in order (acceptance.anchor_plan)."""
    sp = span_array(spans)
    first = np.maximum(sp[:, 0], 1)
    count = np.maximum(sp[:, 1] - first, 0)
    if count.sum() == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    return np.repeat(first, count) + offsets


def span_ends(spans) -> np.ndarray:
    """[A] int64: the end-of-turn position e of each anchor's span (aligned with `anchors`)."""
    sp = span_array(spans)
    first = np.maximum(sp[:, 0], 1)
    return np.repeat(sp[:, 1], np.maximum(sp[:, 1] - first, 0))


def accepted_length(tokens: np.ndarray, anchor: np.ndarray, end: np.ndarray, proposals: np.ndarray) -> np.ndarray:
    """[A] int64: the accepted length at each anchor (ACCEPTANCE.md): the number of leading depths
    k <= min(K, e - p) with d_k == x_{p+k}. This is `accepted` of the rows at the deepest depth
    accepted; metrics.simulate_decode walks the spans with it.

    tokens: [n]; anchor, end: [A]; proposals: [A, K] int32 (NO_TOKEN never equals a token).
    Worked example: x = [5, 6, 7, 8, 9], p = 1, e = 4, proposal [7, 8, 0]: depths 1, 2 match,
    depth 3 (x_4 = 9) does not -> 2.
    """
    tokens = np.asarray(tokens)
    A, K = proposals.shape
    if A == 0:
        return np.zeros(0, dtype=np.int64)
    k = np.arange(1, K + 1)
    position = anchor[:, None] + k[None, :]  # [A, K] p + k
    evaluable = k[None, :] <= (end - anchor)[:, None]
    actual = tokens[np.minimum(position, len(tokens) - 1)]
    match = evaluable & (proposals == actual)
    return np.cumprod(match, axis=1).sum(axis=1).astype(np.int64)
