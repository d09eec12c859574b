"""Hybrids of a model-free proposal and a model drafter's: Arctic's score threshold, and the longer one."""

from __future__ import annotations

import numpy as np

from mtp_observe.drafting.drafters import accepted_length, span_ends
from mtp_observe.drafting.drafters.hybrid import longer, score_threshold
from mtp_observe.drafting.drafters.ngram import NgramConfig, NgramDrafter
from mtp_observe.drafting.drafters.suffix import SuffixConfig, SuffixDecoding

from .drafting import real_sessions

N = -1
SUFFIX = np.array([[7, 8, 9], [7, 8, N], [N, N, N], [5, N, N]], dtype=np.int32)
SCORES = np.array([3.0, 2.0, 0.0, 0.5], dtype=np.float32)
MTP = np.array([[1, 2, 3], [1, 2, 3], [1, 2, 3], [N, N, N]], dtype=np.int32)


def test_the_suffix_draft_is_taken_where_its_score_reaches_the_threshold_else_the_model_draft():
    got = score_threshold(SUFFIX, SCORES, MTP, threshold=3)
    assert got.primary.tolist() == [True, False, False, False]
    assert got.tokens.tolist() == [[7, 8, 9], [1, 2, 3], [1, 2, 3], [N, N, N]]


def test_at_threshold_zero_any_suffix_draft_wins_and_an_empty_one_never_does():
    """Arctic's `s_tokens if s_tokens else a_tokens`: an empty suffix draft falls back even at score 0 >= 0."""
    got = score_threshold(SUFFIX, SCORES, MTP, threshold=0)
    assert got.primary.tolist() == [True, True, False, True]
    assert got.tokens.tolist() == [[7, 8, 9], [7, 8, N], [1, 2, 3], [5, N, N]]


def test_longer_takes_the_proposal_with_more_tokens_and_the_primary_on_ties():
    got = longer(SUFFIX, MTP)
    assert got.primary.tolist() == [True, False, False, True]
    assert got.tokens.tolist() == [[7, 8, 9], [1, 2, 3], [1, 2, 3], [5, N, N]]


def test_a_hybrids_accepted_length_is_its_chosen_drafters_on_real_sessions():
    """On real drafts (n-gram standing in for the model drafter), each anchor's accepted length under a
    hybrid is the accepted length of the proposal it chose — the rows need no new definitions."""
    suffix, ngram = SuffixDecoding(SuffixConfig(max_spec_tokens=24)), NgramDrafter(NgramConfig(2, 4))
    chosen_both_ways = 0
    for tokens, spans in [r for s in real_sessions()[:4] for r in s]:
        a, b = suffix.propose(tokens, spans, 4), ngram.propose(tokens, spans, 4)
        ends = span_ends(spans)
        acc_a = accepted_length(tokens, a.anchors, ends, a.tokens)
        acc_b = accepted_length(tokens, b.anchors, ends, b.tokens)
        for combined in (score_threshold(a.tokens, a.scores, b.tokens, 4), longer(a.tokens, b.tokens)):
            acc = accepted_length(tokens, a.anchors, ends, combined.tokens)
            assert np.array_equal(acc, np.where(combined.primary, acc_a, acc_b))
            chosen_both_ways += int(combined.primary.any() and not combined.primary.all())
    assert chosen_both_ways > 0
