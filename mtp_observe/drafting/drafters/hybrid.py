"""Hybrid: a model-free proposal and a model drafter's (MTP), combined anchor by anchor. Pure functions.

Arctic Inference's policy — snowflakedb/ArcticInference at commit 9d4643881608178f0f58a33d1b61919ca246997f,
`arctic_inference/vllm/model_runner.py` (`propose_draft_token_ids` and the asynchronous path):

    min_score = 0 if method == "suffix" else drafter.model.n_predict
    suffix    = result.token_ids if result.score >= min_score else []
    draft     = suffix if suffix else model_draft            # per request, every step

i.e. suffix decoding's draft when its score (the sum of its tokens' estimated probabilities — an
expected number of accepted tokens) reaches the model drafter's draft length, and it proposes
anything; the model drafter's draft otherwise. `docs/suffix-decoding.rst` describes it as weighing
"the speculation likelihood scores from suffix decoding against the speculation lengths of the
model-based speculation method". In that mode Arctic lets suffix draft up to its tree depth
(`arctic_inference/vllm/config.py`: suffix_speculative_tokens = suffix_cache_max_depth), so its
score can exceed the model's K: measure it with `SuffixConfig(max_spec_tokens=max_tree_depth)`.

The simplest alternative: the longer of the two proposals (the primary one on ties).

Worked example, K = 3, threshold 3:  suffix [7, 8, 9] score 3.0 -> suffix;  suffix [7, 8] score 2.0
-> MTP;  longer: suffix [7, 8, 9] vs MTP [1, 2, 3] -> suffix (tie, the primary), [7] vs [1, 2, 3] -> MTP.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import NO_TOKEN


@dataclass(frozen=True)
class Combined:
    tokens: np.ndarray  # [A, K] int32 the proposal chosen at each anchor
    primary: np.ndarray  # [A] bool  True where the primary (model-free) proposal was chosen


def _lengths(tokens: np.ndarray) -> np.ndarray:
    return (tokens != NO_TOKEN).sum(axis=1)


def score_threshold(primary: np.ndarray, primary_scores: np.ndarray, fallback: np.ndarray, threshold: float) -> Combined:
    """Arctic's hybrid: primary [A, K] (suffix) where primary_scores [A] >= threshold and it proposes
    something, else fallback [A, K] (the model drafter). threshold: the model drafter's draft length
    in Arctic (0: suffix whenever it has a draft)."""
    assert primary.shape == fallback.shape and primary_scores.shape == primary.shape[:1]
    take = (np.asarray(primary_scores, dtype=np.float64) >= threshold) & (_lengths(primary) > 0)
    return Combined(np.where(take[:, None], primary, fallback).astype(np.int32), take)


def longer(primary: np.ndarray, secondary: np.ndarray) -> Combined:
    """The proposal with more tokens at each anchor; the primary on ties."""
    assert primary.shape == secondary.shape
    take = _lengths(primary) >= _lengths(secondary)
    return Combined(np.where(take[:, None], primary, secondary).astype(np.int32), take)
