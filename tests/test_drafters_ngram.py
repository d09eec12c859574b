"""The n-gram drafter: vLLM's prompt-lookup proposer, at every anchor, against plain re-implementations of both
of vLLM's rules (the V1 CPU proposer and the V2 GPU speculator, transcribed from its Triton kernels)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mtp_observe.drafting import acceptance
from mtp_observe.drafting.drafters import NO_TOKEN, accepted_length, anchors, span_ends
from mtp_observe.drafting.drafters.ngram import NgramConfig, NgramDrafter, ngram_config, propose
from mtp_observe.errors import OptionError
from mtp_observe.report.metrics import simulate_decode
from mtp_observe.sessions.rendering import Span

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


def v2_speculator(context: list[int], k: int, lo: int, hi: int, max_model_len: int = 1 << 20) -> list[int]:
    """vLLM 0.33's V2 GPU speculator, transcribed from vllm/v1/worker/gpu/spec_decode/ngram/speculator.py:
    `_ngram_scan_kernel` (:20-87) scores every (n, pos) match as n * (L + 1) + pos + 1 and keeps the largest;
    `_ngram_finalize_kernel` (:90-148) gathers K slots from best_pos + best_n, each slot past the sequence (and
    every slot of a row with no match) the last sampled token. Blocks of BLOCK_L positions change nothing (the
    max is taken over all of them), so the scan is written over all positions at once. num_sampled > 0: at an
    anchor the request has sampled its last token."""
    L = max_model_len  # the kernels' L (packing stride and gather clamp)
    seq_len = len(context)
    eligible_row = seq_len >= lo
    suffix = [context[seq_len - hi + j] if seq_len - hi + j >= 0 else -1 for j in range(hi)]
    score = 0
    if eligible_row:
        for pos in range(seq_len):
            best = 0
            for n_iter in range(lo, hi + 1):
                match = 0 <= pos <= seq_len - n_iter - 1
                for j in range(n_iter):
                    match = match and context[pos + j] == suffix[(hi - n_iter) + j]
                if match:
                    best = n_iter * (L + 1) + pos + 1
            score = max(score, best)
    last_tok = context[-1]
    has_match = score > 0
    best_n = (score - 1) // (L + 1) if has_match else 0
    best_pos = (score - 1) - best_n * (L + 1) if has_match else 0
    draft_start = best_pos + best_n if has_match else 0
    tokens_avail = max(seq_len - draft_start, 0)
    out = []
    for slot in range(k):
        gather_idx = min(draft_start + slot, L - 1)
        valid = slot < tokens_avail and has_match
        out.append(context[gather_idx] if valid else last_tok)
    return out


def match_starts(context: np.ndarray, n: int) -> np.ndarray:
    """Every start j of an n-gram ending by N-2 (j + n <= N - 1) equal to the context's last n tokens, ascending:
    the windows of context[:N-1] compared with the suffix, one token at a time on the starts still matching (the
    same brute-force scan as comparing every window whole, without an [N, n] array per call)."""
    N = len(context)
    suffix = context[N - n:]
    starts = np.flatnonzero(context[: N - n] == suffix[0])
    for i in range(1, n):
        starts = starts[context[starts + i] == suffix[i]]
    return starts


def fast_plain_ngram(context: np.ndarray, k: int, lo: int, hi: int) -> list[int]:
    """plain_ngram with the scan of each n done by numpy (the same rule, for long real contexts)."""
    N = len(context)
    if N < lo:
        return []
    for n in range(min(hi, N - 1), lo - 1, -1):
        hits = match_starts(context, n)
        if hits.size:
            j = int(hits[0])
            return context[j + n: j + n + k].tolist()
    return []


def rows(out: np.ndarray) -> list[list[int]]:
    return [[int(t) for t in row if t != NO_TOKEN] for row in out]


def propose_v1(tokens, anchor, k, lo=5, hi=5, max_model_len=None):
    return propose(tokens, anchor, k, lo, hi, max_model_len, runner="v1")


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
    got = rows(propose_v1(x, every, k, lo, hi, limit))
    assert got == [plain_ngram(tokens[: p + 1], k, lo, hi, limit) for p in every]


@settings(max_examples=3000, deadline=None)
@given(tokens=st.lists(st.integers(0, 3), min_size=1, max_size=40), lo=st.integers(1, 4), extra=st.integers(0, 3),
       k=st.integers(1, 6))
def test_v2_ngram_proposals_equal_the_transcribed_gpu_speculator_on_random_sequences(tokens, lo, extra, k):
    """Four token values make several earlier occurrences of most n-grams, whose continuations differ."""
    hi = lo + extra
    x = np.array(tokens, dtype=np.int32)
    every = np.arange(len(x))
    got = propose(x, every, k, lo, hi).tolist()
    assert got == [v2_speculator(tokens[: p + 1], k, lo, hi) for p in every]


def test_ngram_proposals_equal_the_plain_rule_on_real_sessions():
    """Every anchor of rendered demo (and public) sessions, at vLLM's default 5,5 and at 1,3 and 2,8."""
    checked = 0
    for tokens, spans in real_requests():
        anchor = anchors(spans)
        for lo, hi in ((5, 5), (1, 3), (2, 8)):
            got = rows(propose_v1(tokens, anchor, 4, lo, hi))
            got_v2 = propose(tokens, anchor, 4, lo, hi).tolist()
            step = max(1, len(anchor) // 40)  # a spread of anchors per request keeps this fast
            for a in range(0, len(anchor), step):
                context = tokens[: anchor[a] + 1]
                assert got[a] == fast_plain_ngram(context, 4, lo, hi), (lo, hi, int(anchor[a]))
                assert got_v2[a] == fast_v2_speculator(context, 4, lo, hi), (lo, hi, int(anchor[a]))
                checked += 1
    assert checked > 2000


def fast_v2_speculator(context: np.ndarray, k: int, lo: int, hi: int) -> list[int]:
    """v2_speculator with each n's scan done by numpy: the longest n with a match, its last start pos."""
    N = len(context)
    start = None
    if N >= lo:
        for n in range(min(hi, N - 1), lo - 1, -1):
            hits = match_starts(context, n)  # starts pos <= N - n - 1
            if hits.size:
                start = int(hits[-1]) + n
                break
    return [int(context[start + j]) if start is not None and start + j < N else int(context[-1]) for j in range(k)]


def test_the_numpy_scans_are_the_plain_rules():
    """fast_plain_ngram and fast_v2_speculator (used on long real contexts) agree with the plain ones on random
    short contexts."""
    rng = random.Random(1)
    for _ in range(2000):
        x = [rng.randrange(3) for _ in range(rng.randint(1, 30))]
        lo = rng.randint(1, 4)
        hi = lo + rng.randint(0, 3)
        assert fast_plain_ngram(np.array(x), 3, lo, hi) == plain_ngram(x, 3, lo, hi)
        assert fast_v2_speculator(np.array(x), 3, lo, hi) == v2_speculator(x, 3, lo, hi)


def test_the_earliest_occurrence_wins_and_a_match_near_the_end_proposes_fewer_tokens_under_v1():
    """vLLM's worked example and its V1 tie rule, pinned."""
    assert rows(propose_v1(np.array([1, 2, 3, 4, 2, 3]), np.array([5]), 4, 2, 3)) == [[4, 2, 3]]
    assert rows(propose_v1(np.array([7, 1, 7, 2, 7]), np.array([4]), 4, 1, 1)) == [[1, 7, 2, 7]]
    assert rows(propose_v1(np.array([1, 2, 3, 4, 2, 3, 4, 9]), np.array([5, 6]), 2, 2, 2)) == [[4, 2], [2, 3]]
    # a longer n-gram beats an earlier shorter one: [3, 1] (n=2) at 3..4 wins over 1 (n=1) at 0
    assert rows(propose_v1(np.array([1, 5, 6, 3, 1, 8, 3, 1]), np.array([7]), 2, 1, 2)) == [[8, 3]]
    # a context shorter than prompt_lookup_min, and max_model_len reached: nothing
    assert rows(propose_v1(np.array([1, 1, 1]), np.array([1, 2]), 2, 3, 3)) == [[], []]
    assert rows(propose_v1(np.array([1, 2, 1, 2, 1]), np.array([3, 4]), 3, 1, 2, max_model_len=5)) == [[1], []]


def test_the_most_recent_occurrence_wins_and_every_slot_is_filled_under_v2():
    """The V2 speculator on the same sequences (several matches continuing differently), pinned by value."""
    # vLLM's worked example: [2, 3] at c[1:3]; three tokens follow, the fourth slot is the last token
    assert propose(np.array([1, 2, 3, 4, 2, 3]), np.array([5]), 4, 2, 3).tolist() == [[4, 2, 3, 3]]
    # 7 occurs at 0 and 2: v1 continues from the first ([1, 7, 2, 7]), v2 from the most recent
    assert propose(np.array([7, 1, 7, 2, 7]), np.array([4]), 4, 1, 1).tolist() == [[2, 7, 7, 7]]
    # [1, 2] occurs at 0 and 3, followed by 3 and by 4: v1 says 3, v2 says 4
    x = np.array([1, 2, 3, 1, 2, 4, 9, 1, 2])
    assert propose_v1(x, np.array([8]), 3, 2, 2).tolist() == [[3, 1, 2]]
    assert propose(x, np.array([8]), 3, 2, 2).tolist() == [[4, 9, 1]]
    # the longest n still beats a more recent shorter one: [3, 1] (n=2) at 3..4 over 1 (n=1) at 4
    assert propose(np.array([1, 5, 6, 3, 1, 8, 3, 1]), np.array([7]), 2, 1, 2).tolist() == [[8, 3]]
    # no match (and a context shorter than prompt_lookup_min): K copies of the last token
    assert propose(np.array([1, 2, 3]), np.array([2]), 4, 2, 2).tolist() == [[3, 3, 3, 3]]
    assert propose(np.array([1, 1, 1]), np.array([1]), 2, 3, 3).tolist() == [[1, 1]]
    # max_model_len bounds the slots as v1's does
    assert propose(np.array([1, 2, 1, 2, 1]), np.array([3, 4]), 3, 1, 2, max_model_len=5).tolist() == \
        [[1, NO_TOKEN, NO_TOKEN], [NO_TOKEN] * 3]


def test_proposals_for_a_smaller_k_are_the_first_k_of_proposals_for_kmax():
    tokens, spans = max(real_requests(), key=lambda r: len(r[0]))
    anchor = anchors(spans)
    for runner in ("v1", "v2"):
        full = propose(tokens, anchor, 8, 2, 4, runner=runner)
        for k in (1, 3, 5):
            assert np.array_equal(propose(tokens, anchor, k, 2, 4, runner=runner), full[:, :k])


def test_an_index_reused_across_requests_answers_as_a_fresh_one():
    """Requests sharing prefixes (a session's own, then shorter, diverging and unrelated ones) fed to
    one drafter: each answer equals a fresh index's."""
    rng = np.random.default_rng(3)
    requests = [r for r in real_requests()[:12]]
    tokens, spans = requests[0]
    requests += [(tokens[: len(tokens) // 2], spans[:0]), (np.concatenate([tokens[:100], rng.integers(0, 50, 300).astype(np.int32)]), spans[:0]),
                 (rng.integers(0, 5, 2000).astype(np.int32), np.array([[10, 1999]])), requests[1]]
    for runner in ("v1", "v2"):
        drafter = NgramDrafter(NgramConfig(2, 6, runner=runner))
        for tokens, spans in requests:
            got = drafter.propose(tokens, spans, 4)
            assert np.array_equal(got.anchors, anchors(spans))
            assert np.array_equal(got.tokens, propose(tokens, got.anchors, 4, 2, 6, runner=runner))


def test_ngram_bounds_resolve_as_vllms_config_does():
    assert ngram_config() == NgramConfig(5, 5)
    assert ngram_config(prompt_lookup_max=3) == NgramConfig(3, 3)
    assert ngram_config(prompt_lookup_min=2) == NgramConfig(2, 2)
    assert ngram_config(2, 7, 4096) == NgramConfig(2, 7, 4096)
    assert ngram_config().runner == "v2"  # vLLM 0.33's default model runner on CUDA
    for lo, hi in ((0, 3), (4, 2)):
        with pytest.raises(OptionError, match="--ngram"):
            NgramConfig(lo, hi)
    with pytest.raises(OptionError, match="--ngram-runner v3"):
        NgramConfig(runner="v3")


# --- the anchors and the acceptance helpers ----------------------------------------------------


def test_anchors_and_accepted_lengths_are_the_acceptance_stages():
    """drafters.anchors is acceptance.anchor_plan's anchors; accepted_length is `accepted` at the deepest depth."""
    import torch

    for tokens, spans in real_requests()[:6]:
        spans_obj = [Span(int(s), int(e), i, b"") for i, (s, e) in enumerate(spans)]
        plan = acceptance.anchor_plan(spans_obj, 4)
        assert np.array_equal(anchors(spans), plan.anchors.numpy())
        drafts = propose_v1(tokens, plan.anchors.numpy(), 4, 1, 3)
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
