"""The n-gram drafter: vLLM's prompt-lookup proposer, at every anchor, against a plain re-implementation."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mtp_observe import acceptance
from mtp_observe.drafters import NO_TOKEN, accepted_length, anchors, span_ends
from mtp_observe.drafters.ngram import NgramConfig, NgramDrafter, ngram_config, propose
from mtp_observe.errors import OptionError
from mtp_observe.metrics import simulate_decode
from mtp_observe.rendering import Span

from .drafting import real_requests, render


def plain_ngram(context: list[int], k: int, lo: int, hi: int, max_model_len: int | None = None) -> list[int]:
    """vLLM's rule read off its docstring, as plainly as it can be written: the longest n in [lo, hi]
    whose last n tokens occur earlier (ending before the last token), its earliest occurrence, the
    (at most k) tokens after it; nothing for a context shorter than lo or past max_model_len."""
    N = len(context)
    if N < lo:
        return []
    if max_model_len is not None:
        k = min(k, max_model_len - N)
    if k <= 0:
        return []
    for n in range(hi, lo - 1, -1):
        last = context[N - n:]
        for j in range(0, N - n):  # occurrences context[j:j+n] ending at j+n-1 <= N-2
            if context[j:j + n] == last:
                return context[j + n: j + n + k]
    return []


def fast_plain_ngram(context: np.ndarray, k: int, lo: int, hi: int) -> list[int]:
    """plain_ngram with the scan of each n done by numpy (the same rule, for long real contexts)."""
    N = len(context)
    if N < lo:
        return []
    for n in range(min(hi, N - 1), lo - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(context[: N - 1], n)  # those ending by N-2
        hits = np.flatnonzero((windows == context[N - n:]).all(axis=1))
        if hits.size:
            j = int(hits[0])
            return context[j + n: j + n + k].tolist()
    return []


def rows(out: np.ndarray) -> list[list[int]]:
    return [[int(t) for t in row if t != NO_TOKEN] for row in out]


# --- equal to the plain rule -------------------------------------------------------------------


@settings(max_examples=3000, deadline=None)
@given(tokens=st.lists(st.integers(0, 3), min_size=1, max_size=40), lo=st.integers(1, 4), extra=st.integers(0, 3),
       k=st.integers(1, 6), limit=st.one_of(st.none(), st.integers(1, 45)))
def test_ngram_proposals_equal_the_plain_rule_on_random_sequences(tokens, lo, extra, k, limit):
    """Four token values force ties between occurrences, overlapping matches and every n boundary;
    every position is an anchor, so contexts of every length are checked."""
    hi = lo + extra
    x = np.array(tokens, dtype=np.int32)
    every = np.arange(len(x))
    got = rows(propose(x, every, k, lo, hi, limit))
    assert got == [plain_ngram(tokens[: p + 1], k, lo, hi, limit) for p in every]


def test_ngram_proposals_equal_the_plain_rule_on_real_sessions():
    """Every anchor of rendered demo (and public) sessions, at vLLM's default 5,5 and at 1,3 and 2,8."""
    checked = 0
    for tokens, spans in real_requests():
        anchor = anchors(spans)
        for lo, hi in ((5, 5), (1, 3), (2, 8)):
            got = rows(propose(tokens, anchor, 4, lo, hi))
            step = max(1, len(anchor) // 40)  # a spread of anchors per request keeps this fast
            for a in range(0, len(anchor), step):
                assert got[a] == fast_plain_ngram(tokens[: anchor[a] + 1], 4, lo, hi), (lo, hi, int(anchor[a]))
                checked += 1
    assert checked > 2000


def test_the_numpy_scan_is_the_plain_rule():
    """fast_plain_ngram (used on long real contexts) agrees with plain_ngram on random short ones."""
    rng = random.Random(1)
    for _ in range(2000):
        x = [rng.randrange(3) for _ in range(rng.randint(1, 30))]
        lo = rng.randint(1, 4)
        hi = lo + rng.randint(0, 3)
        assert fast_plain_ngram(np.array(x), 3, lo, hi) == plain_ngram(x, 3, lo, hi)


def test_the_earliest_occurrence_wins_and_a_match_near_the_end_proposes_fewer_tokens():
    """vLLM's worked example and its tie rule, pinned."""
    assert rows(propose(np.array([1, 2, 3, 4, 2, 3]), np.array([5]), 4, 2, 3)) == [[4, 2, 3]]
    assert rows(propose(np.array([7, 1, 7, 2, 7]), np.array([4]), 4, 1, 1)) == [[1, 7, 2, 7]]
    assert rows(propose(np.array([1, 2, 3, 4, 2, 3, 4, 9]), np.array([5, 6]), 2, 2, 2)) == [[4, 2], [2, 3]]
    # a longer n-gram beats an earlier shorter one: [3, 1] (n=2) at 3..4 wins over 1 (n=1) at 0
    assert rows(propose(np.array([1, 5, 6, 3, 1, 8, 3, 1]), np.array([7]), 2, 1, 2)) == [[8, 3]]
    # a context shorter than prompt_lookup_min, and max_model_len reached: nothing
    assert rows(propose(np.array([1, 1, 1]), np.array([1, 2]), 2, 3, 3)) == [[], []]
    assert rows(propose(np.array([1, 2, 1, 2, 1]), np.array([3, 4]), 3, 1, 2, max_model_len=5)) == [[1], []]


def test_proposals_for_a_smaller_k_are_the_first_k_of_proposals_for_kmax():
    tokens, spans = max(real_requests(), key=lambda r: len(r[0]))
    anchor = anchors(spans)
    full = propose(tokens, anchor, 8, 2, 4)
    for k in (1, 3, 5):
        assert np.array_equal(propose(tokens, anchor, k, 2, 4), full[:, :k])


def test_an_index_reused_across_requests_answers_as_a_fresh_one():
    """Requests sharing prefixes (a session's own, then shorter, diverging and unrelated ones) fed to
    one drafter: each answer equals a fresh index's."""
    rng = np.random.default_rng(3)
    drafter = NgramDrafter(NgramConfig(2, 6))
    requests = [r for r in real_requests()[:12]]
    tokens, spans = requests[0]
    requests += [(tokens[: len(tokens) // 2], spans[:0]), (np.concatenate([tokens[:100], rng.integers(0, 50, 300).astype(np.int32)]), spans[:0]),
                 (rng.integers(0, 5, 2000).astype(np.int32), np.array([[10, 1999]])), requests[1]]
    for tokens, spans in requests:
        got = drafter.propose(tokens, spans, 4)
        assert np.array_equal(got.anchors, anchors(spans))
        assert np.array_equal(got.tokens, propose(tokens, got.anchors, 4, 2, 6))


def test_ngram_bounds_resolve_as_vllms_config_does():
    assert ngram_config() == NgramConfig(5, 5)
    assert ngram_config(prompt_lookup_max=3) == NgramConfig(3, 3)
    assert ngram_config(prompt_lookup_min=2) == NgramConfig(2, 2)
    assert ngram_config(2, 7, 4096) == NgramConfig(2, 7, 4096)
    for lo, hi in ((0, 3), (4, 2)):
        with pytest.raises(OptionError, match="--ngram"):
            NgramConfig(lo, hi)


# --- the anchors and the acceptance helpers ----------------------------------------------------


def test_anchors_and_accepted_lengths_are_the_acceptance_stages():
    """drafters.anchors is acceptance.anchor_plan's anchors; accepted_length is `accepted` at the deepest depth."""
    import torch

    for tokens, spans in real_requests()[:6]:
        spans_obj = [Span(int(s), int(e), i, b"") for i, (s, e) in enumerate(spans)]
        plan = acceptance.anchor_plan(spans_obj, 4)
        assert np.array_equal(anchors(spans), plan.anchors.numpy())
        drafts = propose(tokens, plan.anchors.numpy(), 4, 1, 3)
        index = acceptance.row_index(plan, 4)
        a, k = index.anchor_index, index.depth
        match = torch.from_numpy(drafts)[a, k - 1] == torch.from_numpy(tokens.astype(np.int64))[index.actual_position]
        accepted = acceptance.accepted_from_match(match, a, k, len(plan.anchors), 4)
        deepest = torch.zeros(len(plan.anchors), dtype=torch.long).index_reduce_(0, a, torch.where(accepted, k, 0), "amax")
        got = accepted_length(tokens, plan.anchors.numpy(), span_ends(spans), drafts)
        assert np.array_equal(got, deepest.numpy())


# --- what the drafter is for -------------------------------------------------------------------

SYLLABLES = ["ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "vu", "we", "xo", "yi", "za", "bre", "cla", "dro",
             "fli", "gra", "ho", "ju", "ke", "li", "mo", "ne", "pu", "qui", "ru", "sta", "tre", "vo"]


def _prose(rng: random.Random, words: int) -> str:
    return " ".join("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))) for _ in range(words)) + "."


def _tau_sim(sessions, k: int, drafter) -> float:
    steps = emitted = 0
    for session in sessions:
        for tokens, spans in session:
            got = drafter.propose(tokens, spans, k)
            acc = accepted_length(tokens, got.anchors, span_ends(spans), got.tokens)
            span_len = spans[:, 1] - np.maximum(spans[:, 0], 1)  # anchors of a span: max(s, 1)..e-1
            steps += int(simulate_decode(acc, span_len, k).sum())
            emitted += int(span_len.sum())
    return emitted / steps


def test_verbatim_repeats_give_ngram_tau_near_k_plus_1_and_fresh_prose_near_1(tmp_path):
    """Assistant turns that copy a passage from the user's message: n-gram τ_sim near K + 1. Assistant
    turns of new made-up prose: near 1 (nothing to look up)."""
    rng = random.Random(7)
    k = 4

    def session(name, reply_of):
        messages = [{"role": "system", "content": "You are a careful assistant."}]
        for _ in range(3):
            passage = _prose(rng, 120)
            messages += [{"role": "user", "content": f"Please repeat exactly:\n{passage}"},
                         {"role": "assistant", "content": reply_of(passage)}]
        return {"id": name, "messages": messages}

    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(session("repeats", lambda passage: passage)) + "\n"
                    + json.dumps(session("prose", lambda passage: _prose(rng, 120))) + "\n")
    repeats, prose = render([path])
    drafter = NgramDrafter()  # vLLM's defaults: 5, 5
    tau_repeats, tau_prose = _tau_sim([repeats], k, drafter), _tau_sim([prose], k, drafter)
    assert tau_repeats > 0.9 * (k + 1), tau_repeats
    assert tau_prose < 1.05, tau_prose
