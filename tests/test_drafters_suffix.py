"""Suffix decoding: the port of Arctic Inference's tree against a brute-force trie, drafts against
SuffixDecodingCache's protocol re-done by brute force, and (where installed) the real package."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mtp_observe.drafting.drafters import NO_TOKEN, anchors, suffix_tree as tree
from mtp_observe.drafting.drafters.suffix import SuffixConfig, SuffixDecoding
from mtp_observe.errors import OptionError

from .brute_suffix import BruteCache, BruteTree
from .drafting import real_sessions


def trie_view(t) -> tuple[dict, dict]:
    """The compressed tree read as the uncompressed trie: count and ordered children of every string."""
    node, buf = t[0], t[4]
    count, kids = {}, {}

    def visit(n, before: tuple):
        s = before
        for j in range(node[n, tree.LENGTH] if n != tree.ROOT else 0):
            token = int(buf[node[n, tree.REF] + j])
            if j > 0:
                kids[s] = [s + (token,)]
            s = s + (token,)
            count[s] = int(node[n, tree.COUNT])
        if n == tree.ROOT:
            count[s] = int(node[n, tree.COUNT])
        children, c = [], node[n, tree.HEAD]
        while c != -1:
            assert node[c, tree.PARENT] == n
            children.append(c)
            c = node[c, tree.NEXT]
        assert len(children) == node[n, tree.NCHILD]
        kids[s] = [s + (int(buf[node[c, tree.REF]]),) for c in children]
        for c in children:
            visit(c, s)

    visit(tree.ROOT, ())
    return count, kids


def fed(depth: int, sequences, journal=False):
    """A port tree and a brute tree fed the same sequences, one after another."""
    t = tree.new_tree(depth, journal=journal, nodes=4, tokens=4)
    brute = BruteTree(depth)
    for i, seq in enumerate(sequences):
        tree.start_sequence(t)
        for token in seq:
            t = tree.grown(t, 1)
            tree.append(t, token)
            brute.append(i, token)
    return t, brute


def draft_rows(out) -> list[list[int]]:
    return [[int(x) for x in row if x != NO_TOKEN] for row in out]


# --- the tree ----------------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(seqs=st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=40), min_size=1, max_size=5),
       depth=st.integers(1, 8))
def test_the_tree_holds_the_counts_and_sibling_order_of_a_brute_force_trie(seqs, depth):
    """Counts of every string and the order of every node's children, after every sequence appended."""
    t, brute = fed(depth, seqs)
    count, kids = trie_view(t)
    assert count == brute.count
    assert kids == brute.kids


@settings(max_examples=300, deadline=None)
@given(seqs=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=30), min_size=2, max_size=6),
       depth=st.integers(1, 6), order=st.randoms(use_true_random=False))
def test_removing_sequences_leaves_the_brute_force_tries_counts_and_order(seqs, depth, order):
    """Eviction: sequences removed in any order, the tree still equals the brute trie (its counts,
    its sibling order after the decrements, pruned subtrees, merged nodes)."""
    t, brute = fed(depth, seqs)
    for i in order.sample(range(len(seqs)), len(seqs) - 1):
        start = sum(len(s) for s in seqs[:i])
        t = tree.grown(t, len(seqs[i]))  # removing may split groups
        tree.remove(t, start, len(seqs[i]))
        brute.remove(i)
        count, kids = trie_view(t)
        assert count == brute.count
        assert kids == brute.kids


@settings(max_examples=300, deadline=None)
@given(seq=st.lists(st.integers(0, 3), min_size=1, max_size=60), depth=st.integers(1, 8), data=st.data())
def test_rolling_the_journaled_tree_back_equals_the_tree_of_the_shorter_sequence(seq, depth, data):
    t = tree.new_tree(depth, journal=True, nodes=4, tokens=4)
    tree.start_sequence(t)
    marks = []
    for token in seq:
        t = tree.grown(t, 1)
        marks.append(int(t[2][tree.M_JOURNAL]))
        tree.append(t, token)
    keep = data.draw(st.integers(0, len(seq)))
    if keep < len(seq):
        tree.undo(t, marks[keep])
    _, brute = fed(depth, [seq[:keep]])
    count, kids = trie_view(t)
    assert count == brute.count and kids == brute.kids
    assert int(t[2][tree.M_SEQ_LEN]) == keep
    for token in seq[keep:][::-1]:  # and it extends as a fresh tree does
        t = tree.grown(t, 1)
        tree.append(t, token)
        brute.append(0, token)
    count, kids = trie_view(t)
    assert count == brute.count and kids == brute.kids


# --- the drafts --------------------------------------------------------------------------------


def assert_same_drafts(ours, reference, where=""):
    assert draft_rows(ours.tokens) == [d for d, _, _, _ in reference], where
    assert ours.scores.tolist() == [float(s) for _, s, _, _ in reference], where  # float32, bit for bit
    assert ours.match_len.tolist() == [m for _, _, m, _ in reference], where
    assert ours.source.tolist() == [src for _, _, _, src in reference], where


@st.composite
def runs(draw):
    """Requests of a run: each shares a prefix with the one before (or not) and has spans after it."""
    requests, previous = [], []
    for _ in range(draw(st.integers(1, 5))):
        keep = draw(st.integers(0, len(previous)))
        tokens = previous[:keep] + draw(st.lists(st.integers(0, 3), min_size=1, max_size=40))
        spans, s = [], keep
        while s < len(tokens) and draw(st.booleans()):
            s = draw(st.integers(s, len(tokens) - 1))
            e = draw(st.integers(s, min(len(tokens) - 1, s + 15)))
            spans.append((s, e))
            s = e + 1
        requests.append((np.array(tokens, dtype=np.int32), np.array(spans, dtype=np.int64).reshape(-1, 2)))
        previous = tokens
    return requests


@settings(max_examples=500, deadline=None)
@given(requests=runs(), depth=st.integers(1, 8), max_cached=st.sampled_from([-1, 0, 1, 2, 10000]),
       factor=st.sampled_from([0.5, 1.0, 1.5, 3.0]), offset=st.sampled_from([-1.0, 0.0, 0.7, 2.0]),
       min_prob=st.sampled_from([0.0, 0.1, 0.3, 0.5, 1.0]), k=st.integers(1, 6),
       max_model_len=st.sampled_from([None, 20, 45]), fixed=st.sampled_from([None, 3, 9]),
       shared=st.booleans(), hint=st.sampled_from([None, "exact", "too long"]))
def test_suffix_drafts_equal_the_brute_force_cache_on_random_runs(requests, depth, max_cached, factor, offset,
                                                                  min_prob, k, max_model_len, fixed, shared, hint):
    """Every draft, its float32 score, match length and tree, over runs of requests that share
    prefixes (the request's tree rolled back and extended; `keep` right, absent, or promising more
    than the next request shares), with eviction, the global tree off, every parameter away from its
    default, and outputs added without drafting (shared=False)."""
    config = SuffixConfig(depth, max_cached, factor, offset, min_prob, fixed, max_model_len)
    ours = SuffixDecoding(config)
    brute = BruteCache(depth, max_cached, factor, offset, min_prob, max_model_len, fixed)
    for r, (tokens, spans) in enumerate(requests):
        if not shared and r % 2 == 1:
            ours.add_outputs(tokens, spans)
            brute.add_outputs(tokens, spans)
            continue
        keep = None
        if hint is not None and r + 1 < len(requests):
            after = requests[r + 1][0]
            m = min(len(after), len(tokens))
            keep = int(np.argmin(np.append(after[:m] == tokens[:m], False)))  # the shared prefix
            keep += 5 if hint == "too long" else 0
        got = ours.propose(tokens, spans, k, keep=keep)
        assert np.array_equal(got.anchors, anchors(spans))
        assert_same_drafts(got, brute.request(tokens, spans, k), f"request {r}")


def test_suffix_drafts_equal_the_brute_force_cache_on_real_sessions():
    """The demo (and public) sessions as one run at vLLM's defaults, then with a small cache and a
    shallow tree: every anchor's draft, score, match length and tree."""
    sessions = real_sessions()[:4]  # the demo sessions: ~3,000 anchors; the brute trie is slow
    for config in (SuffixConfig(), SuffixConfig(max_tree_depth=8, max_cached_requests=3, min_token_prob=0.0)):
        ours = SuffixDecoding(config)
        brute = BruteCache(config.max_tree_depth, config.max_cached_requests, config.max_spec_factor,
                           config.max_spec_offset, config.min_token_prob)
        checked = 0
        for session in sessions:
            for tokens, spans in session:
                got = ours.propose(tokens, spans, 5)
                assert_same_drafts(got, brute.request(tokens, spans, 5))
                checked += len(got.anchors)
        assert checked > 1000


def test_drafts_at_every_k_come_from_one_pass_and_are_not_all_prefixes():
    """by_k: row K'-1 is what a run at K' drafts; on real sessions some are not the first K' tokens
    of the draft at K (the score picks another match) — which is why by_k exists."""
    sessions = real_sessions()
    k = 6
    one = SuffixDecoding()
    each = {kk: SuffixDecoding() for kk in range(1, k + 1)}
    differ = 0
    for session in sessions[:4]:
        for tokens, spans in session:
            got = one.propose(tokens, spans, k, by_k=True)
            assert np.array_equal(got.tokens_by_k[:, k - 1, :], got.tokens)
            for kk, drafter in each.items():
                alone = drafter.propose(tokens, spans, kk)
                assert np.array_equal(got.tokens_by_k[:, kk - 1, :kk], alone.tokens)
                assert np.all(got.tokens_by_k[:, kk - 1, kk:] == NO_TOKEN)
                assert np.array_equal(got.scores_by_k[:, kk - 1], alone.scores)
                differ += int(np.any(alone.tokens != got.tokens[:, :kk], axis=1).sum())
    assert differ > 0


def test_the_worked_example_of_the_module():
    x = np.array([0, 1, 2, 3, 0, 1, 2, 5], dtype=np.int32)  # a b c d | a b c <end>
    got = SuffixDecoding().propose(x, np.array([[4, 7]]), 4)
    assert draft_rows(got.tokens) == [[1], [2, 3], [3, 0, 1]]
    assert got.scores.tolist() == [0.5, 1.0, 1.5]
    assert got.match_len.tolist() == [1, 2, 3]


def test_earlier_outputs_draft_through_the_global_tree():
    """A reply seen as an earlier output is drafted from the global tree when the prompt lacks it."""
    reply = np.arange(100, 140, dtype=np.int32)
    first = np.concatenate([np.arange(10, dtype=np.int32), reply])
    second = np.concatenate([np.arange(50, 60, dtype=np.int32), reply])  # a new prompt, the same reply
    drafter = SuffixDecoding()
    drafter.propose(first, np.array([[10, 49]]), 4)
    got = drafter.propose(second, np.array([[10, 49]]), 4)
    assert (got.source[3:] == 1).all()
    assert draft_rows(got.tokens[3:4]) == [reply[4:8].tolist()]
    off = SuffixDecoding(SuffixConfig(max_cached_requests=0))
    off.propose(first, np.array([[10, 49]]), 4)
    assert off.cached_outputs == 0 and (off.propose(second, np.array([[10, 49]]), 4).source == 0).all()


def test_suffix_options_are_checked():
    for bad in (dict(max_tree_depth=0), dict(min_token_prob=1.5), dict(max_spec_factor=-1), dict(max_spec_tokens=0)):
        with pytest.raises(OptionError):
            SuffixConfig(**bad)


def test_the_package_itself_drafts_the_same_where_it_is_installed():
    """Cross-check with arctic-inference (`pip install 'mtp-observe[suffix]'`, a CUDA build): the
    same protocol vLLM drives, one request per span. The brute-force tests above always run."""
    cache_module = pytest.importorskip("arctic_inference.suffix_decoding", reason="arctic-inference is not installed")
    cache = cache_module.SuffixDecodingCache(max_tree_depth=24, max_cached_requests=10000)
    ours = SuffixDecoding()
    for r, (tokens, spans) in enumerate(request for session in real_sessions()[:4] for request in session):
        got = ours.propose(tokens, spans, 5)
        expected = []
        for j, (s, e) in enumerate(spans):
            req = f"{r}:{j}"
            cache.start_request(req, tokens[:s].astype(np.int32))
            for q in range(s, e):
                cache.add_active_response(req, [int(tokens[q])])
                if q >= max(s, 1):
                    pattern = tokens[max(0, q + 1 - 24): q + 1].astype(np.int32)
                    expected.append(cache.speculate(req, pattern, max_spec_tokens=5, max_spec_factor=1.0, min_token_prob=0.1))
            cache.add_active_response(req, [int(tokens[e])])
            cache.stop_request(req)
        assert draft_rows(got.tokens) == [list(d.token_ids) for d in expected]
        assert got.scores.tolist() == [float(np.float32(d.score)) for d in expected]
