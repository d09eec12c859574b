"""Suffix: suffix decoding (`method: "suffix"`) as Arctic Inference implements it and vLLM runs it.

Followed (Apache-2.0 code, read, not vendored): snowflakedb/ArcticInference at commit
9d4643881608178f0f58a33d1b61919ca246997f — `arctic_inference/suffix_decoding/cache.py`
(`SuffixDecodingCache`: start_request, add_active_response, speculate, the FIFO eviction) and
`csrc/suffix_decoding/suffix_tree.{h,cc}` (ported in `suffix_tree.py`); vllm-project/vllm
`vllm/v1/spec_decode/suffix_decoding.py` at 044ac3a07ab371cdbfac2203b0cd12d877f9038f (what vLLM
passes) and the defaults in `vllm/config/speculative.py` at 002e77c1f0ef9b19cff8b9e21cfbd6feb3d6b443.

The state, as vLLM keeps it, with one vLLM request per scored span [s, e] (one model call; a
rendered request holding several turns is several vLLM requests with growing prompts):
  * the request's tree: its prompt x_0..x_{s-1} and its output so far, one sequence — at anchor p
    it holds x_0..x_p;
  * the global tree: the outputs x_s..x_e of earlier spans of the run, in input order, one
    sequence each, at most max_cached_requests of them (the oldest evicted first), and the current
    span's output so far x_s..x_p (vLLM appends every sampled token to both trees before it
    speculates; the end-of-turn token is sampled, so a finished output ends with it).
At anchor p, with pattern = the last min(p+1, max_tree_depth) tokens and num_speculative_tokens K:
    for each tree, for match_len = 1 .. len(pattern)-1 (the tree's own loop; it stops at the first
    suffix of the pattern the tree does not hold): follow the most frequent child from the match
    for at most min(K, (int)(match_len * max_spec_factor + max_spec_offset + 1e-6)) tokens while
    the running probability (product of count ratios) stays >= min_token_prob; score = Σ probs;
    keep the best score, the LONGER match on ties (>=);
    the request's tree's draft wins over the global tree's on ties (>=);
    nothing when p + 1 >= max_model_len; K is capped at max_model_len - (p + 1) - 1.
This is chain speculation (vLLM leaves use_tree_spec false): one path, the best-scoring one.
vLLM's defaults: max_tree_depth 24, max_cached_requests 10000, max_spec_factor 1.0,
min_token_prob 0.1, and max_spec_offset 0 (vLLM does not pass it; the cache's default);
num_speculative_tokens, when unset, defaults to the tree depth.

K matters beyond truncation: the best match is chosen by score, and the score depends on how many
tokens K lets each candidate draft, so the draft vLLM makes at K is NOT in general the first K
tokens of its draft at a larger K (unlike the MTP head's and the n-gram's). `propose(..., by_k=True)`
returns the draft at every K' <= K from one pass (walks at K, scores and choices per K').
`max_spec_tokens` fixes the budget instead (Arctic's hybrid lets suffix speculate up to the tree
depth and compares its score with the model drafter's length): then the first K tokens of that
one draft are what is measured at K.

Worked example, depth 24, factor 1, min prob 0.1, K = 4, one request, no earlier outputs,
x = a b c d a b c (prompt a b c d, output a b c), anchor p = 6 (pattern a b c):
    match "c": its occurrences in the request's tree: positions 2 and 6; x_3 = d follows one of
    them, so count(c d) / count(c) = 1/2 -> prob 0.5; one token allowed (match_len 1) -> [d], 0.5
    match "b c": count 2, "b c d" 1 -> [d] at 0.5, up to 2 tokens, then "a" after d at 0.5 -> [d, a], 1.0
    match "a b c": [d, a, b] at 0.5 each -> score 1.5 (3 tokens allowed) — the best; the global tree
    (holding only "a b c") has no continuation. Proposal [d, a, b].
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from ...errors import OptionError
from . import NO_TOKEN, Proposals, anchors as anchors_of, span_array, suffix_tree as st
from .hashmap import compiled

NO_SOURCE, REQUEST_TREE, GLOBAL_TREE = -1, 0, 1  # which tree a draft came from


@dataclass(frozen=True)
class SuffixConfig:
    """vLLM's suffix_decoding_* options (names without the prefix) and their defaults."""

    max_tree_depth: int = 24
    max_cached_requests: int = 10000  # 0: no global tree; negative: no limit (Arctic's cache allows it)
    max_spec_factor: float = 1.0
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1
    max_spec_tokens: int | None = None  # None: the measured K, as vLLM passes num_speculative_tokens
    max_model_len: int | None = None  # None: no limit beyond the request itself

    def __post_init__(self):
        if self.max_tree_depth < 1:
            raise OptionError(f"suffix max_tree_depth={self.max_tree_depth} must be >= 1")
        if self.max_spec_factor < 0:
            raise OptionError(f"suffix max_spec_factor={self.max_spec_factor} must be >= 0")
        if not 0.0 <= self.min_token_prob <= 1.0:
            raise OptionError(f"suffix min_token_prob={self.min_token_prob} must be in [0, 1]")
        if self.max_spec_tokens is not None and self.max_spec_tokens < 1:
            raise OptionError(f"suffix max_spec_tokens={self.max_spec_tokens} must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise OptionError(f"max_model_len={self.max_model_len} must be >= 1")


@dataclass(frozen=True)
class SuffixProposals(Proposals):
    scores: np.ndarray  # [A] float32 the draft's score (Σ of its token probabilities; 0 for none)
    match_len: np.ndarray  # [A] int32 the length of the context match it came from (0: none)
    source: np.ndarray  # [A] int8 REQUEST_TREE, GLOBAL_TREE or NO_SOURCE
    tokens_by_k: np.ndarray | None = None  # [A, K, K] int32 [:, K'-1, :K'] the draft at K' (by_k)
    scores_by_k: np.ndarray | None = None  # [A, K] float32 its score


# ---------------------------------------------------------------------------------------------
# Compiled: feed tokens, speculate at anchors


@compiled
def _best_of_tree(t, on_request_tree, tokens, lo, hi, budgets, walk, factor, offset, min_prob,
                  best_tok, best_score, best_m, path_tok, path_prob, cum):
    """SuffixTree::speculate for every budget: best_tok[v, :] (NO_TOKEN-padded), best_score[v], best_m[v]."""
    V = budgets.shape[0]
    width = best_tok.shape[1]
    for v in range(V):
        best_score[v] = np.float32(0.0)
        best_m[v] = 0
        best_tok[v, :] = -1
    for m in range(1, hi - lo):
        if on_request_tree:  # the pattern's suffixes are the sequence's own active suffixes
            n, i = st.active_match(t, m)
        else:
            n, i = st.match_context(t, tokens, hi - m, hi)
            if n == -1:
                break
        limit = st.length_limit(m, factor, offset)
        count = st.speculate_path(t, n, i, max(min(walk, limit), 0), min_prob, path_tok, path_prob)
        total = np.float32(0.0)
        for j in range(count):
            total = total + path_prob[j]
            cum[j + 1] = total
        cum[0] = np.float32(0.0)
        for v in range(V):
            c = min(max(min(budgets[v], limit), 0), count)
            if cum[c] >= best_score[v]:
                best_score[v] = cum[c]
                best_m[v] = m
                for j in range(width):
                    best_tok[v, j] = path_tok[j] if j < c else -1


def _scratch(variants: int, width: int, walk: int):
    """_feed's working arrays (it is compiled without reference counts, so it allocates nothing)."""
    walk = max(walk, 1)
    return (np.full((variants, width), -1, dtype=np.int32), np.full((variants, width), -1, dtype=np.int32),
            np.zeros(variants, dtype=np.float32), np.zeros(variants, dtype=np.float32),
            np.zeros(variants, dtype=np.int32), np.zeros(variants, dtype=np.int32),
            np.zeros(walk, dtype=np.int32), np.zeros(walk, dtype=np.float32), np.zeros(walk + 1, dtype=np.float32),
            np.zeros(variants, dtype=np.int64))


@compiled
def _feed(loc, glo, to_global, tokens, q0, q1, a_lo, a_hi, a_base, marks, mark_base,
          budgets, walk, factor, offset, min_prob, max_model_len, out_tok, out_score, out_m, out_src, scratch):
    """Append tokens[q0:q1] to the request's tree (and, when to_global, to the global tree's current
    sequence); at each anchor q in [a_lo, a_hi] speculate into row a_base + q - a_lo of the outputs.
    Returns the position reached: q1, or earlier when a tree needs growing."""
    V = budgets.shape[0]
    depth = loc[2][st.M_DEPTH]
    tok_l, tok_g, score_l, score_g, m_l, m_g, path_tok, path_prob, cum, eff = scratch
    for q in range(q0, q1):
        if not st.room(loc) or (to_global and not st.room(glo)):
            return q
        if q >= mark_base:
            marks[q - mark_base] = loc[2][st.M_JOURNAL]
        st.append(loc, tokens[q])
        if to_global:
            st.append(glo, tokens[q])
        if q < a_lo or q > a_hi:
            continue
        a = a_base + q - a_lo
        n_ctx = q + 1  # vLLM's num_tokens: the context x_0..x_q
        if max_model_len > 0 and n_ctx >= max_model_len:
            continue  # vLLM drafts nothing for a request at its length limit
        e_walk = walk
        for v in range(V):
            eff[v] = budgets[v] if max_model_len <= 0 else min(budgets[v], max_model_len - n_ctx - 1)
        if max_model_len > 0:
            e_walk = min(walk, max_model_len - n_ctx - 1)
        lo = max(0, n_ctx - depth)
        _best_of_tree(loc, True, tokens, lo, n_ctx, eff, e_walk, factor, offset, min_prob,
                      tok_l, score_l, m_l, path_tok, path_prob, cum)
        if to_global:
            _best_of_tree(glo, False, tokens, lo, n_ctx, eff, e_walk, factor, offset, min_prob,
                          tok_g, score_g, m_g, path_tok, path_prob, cum)
        for v in range(V):
            local = not to_global or score_l[v] >= score_g[v]  # the request's tree wins ties
            for j in range(out_tok.shape[2]):
                out_tok[a, v, j] = tok_l[v, j] if local else tok_g[v, j]
            out_score[a, v] = score_l[v] if local else score_g[v]
            out_m[a, v] = m_l[v] if local else m_g[v]
            out_src[a, v] = 0 if local else 1
    return q1


@compiled
def _feed_global(glo, tokens, q0, q1):
    for q in range(q0, q1):
        if not st.room(glo):
            return q
        st.append(glo, tokens[q])
    return q1


# ---------------------------------------------------------------------------------------------
# The drafter


class SuffixDecoding:
    """Suffix decoding over a run's requests, fed in input order (request by request, each once).

    propose(tokens, spans, k) drafts at every anchor of the request and leaves its outputs in the
    global tree; add_outputs(tokens, spans) only adds them (a session another rank replays, or one
    a resumed run already has), so the global tree is the same whichever process drafts what.
    The request's tree is rolled back to the prefix the next request shares with it and extended
    (through a journal of its writes past `keep`, or past the point this request started to differ
    from the one before; a request sharing less than that is drafted on a tree rebuilt from its
    first token) — the answers are those of a fresh tree either way.
    """

    name = "suffix"

    def __init__(self, config: SuffixConfig = SuffixConfig()):
        self.config = config
        self._request_tree = st.new_tree(config.max_tree_depth, journal=True)
        self._marks = np.zeros(1024, dtype=np.int64)  # journal length before the token at mark_base + i
        self._mark_base = 0
        self._global_tree = st.new_tree(config.max_tree_depth, journal=False)
        self._cached: deque[list[int]] = deque()  # [buffer start, length] of each cached output, oldest first

    # -- the global tree ----------------------------------------------------------------------

    @property
    def cached_outputs(self) -> int:
        return len(self._cached)

    def _start_output(self) -> bool:
        """A new span's output enters the global tree (FIFO eviction as SuffixDecodingCache does)."""
        limit = self.config.max_cached_requests
        if limit == 0:
            return False
        st.start_sequence(self._global_tree)
        self._cached.append([int(self._global_tree[2][st.M_BUF]), 0])
        while limit > 0 and len(self._cached) > limit:
            start, length = self._cached.popleft()
            self._global_tree = st.grown(self._global_tree, length)
            st.remove(self._global_tree, start, length)
        return True

    def add_outputs(self, tokens: np.ndarray, spans) -> None:
        """The global tree gains this request's outputs x_s..x_e, without drafting anything."""
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        for s, e in span_array(spans):
            if not self._start_output():
                continue
            q = int(s)
            while q <= e:
                self._global_tree = st.grown(self._global_tree, min(int(e) + 1 - q, 64))
                q = _feed_global(self._global_tree, tokens, q, int(e) + 1)
            self._cached[-1][1] = int(e - s + 1)

    # -- drafting -----------------------------------------------------------------------------

    def propose(self, tokens: np.ndarray, spans, k: int, by_k: bool = False, keep: int | None = None) -> SuffixProposals:
        """Drafts at every anchor of this request (acceptance.anchor_plan's order); its outputs then
        join the global tree. by_k: also the draft vLLM makes at every K' <= k (see the module; not
        with a fixed max_spec_tokens, where the drafts at K' are the first K' of the one draft).
        keep: how many leading tokens the next request shares with this one, when the caller knows
        (pipeline.replay_session does): only the request's tree's writes past them are journaled.
        Without it the whole request is; a next request sharing less gets a fresh tree — the same
        drafts either way, only time and memory differ."""
        assert k >= 1
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        assert tokens.ndim == 1 and (tokens.size == 0 or int(tokens.min()) >= 0), "token ids are >= 0"
        sp = span_array(spans)
        anchor = anchors_of(sp)
        cfg = self.config
        if cfg.max_spec_tokens is None:
            budgets = np.arange(1, k + 1, dtype=np.int64) if by_k else np.array([k], dtype=np.int64)
        else:
            budgets = np.array([cfg.max_spec_tokens], dtype=np.int64)
        V = len(budgets)
        out_tok = np.full((len(anchor), V, k), NO_TOKEN, dtype=np.int32)
        out_score = np.zeros((len(anchor), V), dtype=np.float32)
        out_m = np.zeros((len(anchor), V), dtype=np.int32)
        out_src = np.full((len(anchor), V), NO_SOURCE, dtype=np.int8)
        walk = int(budgets.max())
        params = (budgets, walk, np.float32(cfg.max_spec_factor), np.float32(cfg.max_spec_offset),
                  np.float32(cfg.min_token_prob), int(cfg.max_model_len or 0), out_tok, out_score, out_m, out_src,
                  _scratch(V, k, walk))

        q = self._restart(tokens, int(sp[0, 0]) if len(sp) else len(tokens))
        self._mark_base = q if keep is None else max(q, min(int(keep), len(tokens)))
        first_anchor = 0
        for s, e in sp:
            s, e = int(s), int(e)
            q = self._run(tokens, q, s, False, 0, -1, 0, params)  # prompt: the request's tree only
            to_global = self._start_output()
            a_lo = max(s, 1)
            q = self._run(tokens, q, e + 1, to_global, a_lo, e - 1, first_anchor, params)
            if to_global:
                self._cached[-1][1] = e - s + 1
            first_anchor += max(e - a_lo, 0)
        self._run(tokens, q, len(tokens), False, 0, -1, 0, params)
        main = V - 1  # the draft at k (or at the fixed budget)
        return SuffixProposals(
            anchors=anchor, tokens=out_tok[:, main, :].copy(), scores=out_score[:, main].copy(),
            match_len=out_m[:, main].copy(), source=out_src[:, main].copy(),
            tokens_by_k=out_tok if V > 1 else None, scores_by_k=out_score if V > 1 else None,
        )

    def _restart(self, tokens: np.ndarray, first_span: int) -> int:
        """Roll the request's tree back to the prefix it shares with `tokens` (no further than the
        first span's start) -> its length; the journal restarts there."""
        tree = self._request_tree
        length = int(tree[2][st.M_SEQ_LEN])
        held = tree[4][:length]
        m = min(length, len(tokens), first_span)
        differ = np.flatnonzero(held[:m] != tokens[:m])
        shared = int(differ[0]) if differ.size else m
        if shared < length:
            if shared >= self._mark_base:
                st.undo(tree, int(self._marks[shared - self._mark_base]))
            else:  # shares less than the journal reaches back: a fresh tree
                tree = self._request_tree = st.new_tree(self.config.max_tree_depth, journal=True)
                shared = 0
        assert int(tree[2][st.M_SEQ_LEN]) == shared
        tree[2][st.M_JOURNAL] = 0
        return shared

    def _run(self, tokens, q, stop, to_global, a_lo, a_hi, a_base, params) -> int:
        if q < self._mark_base < stop:  # no journal before the kept prefix's end, a journal after it
            q = self._run(tokens, q, self._mark_base, to_global, a_lo, a_hi, a_base, params)
        self._request_tree[2][st.M_JOURNAL_ON] = int(q >= self._mark_base)
        while q < stop:
            need = stop - self._mark_base + 1
            if need > len(self._marks):
                self._marks = np.concatenate([self._marks, np.zeros(max(need, len(self._marks)), dtype=np.int64)])
            batch = min(stop - q, 64)  # the worst case of 64 appends; arrays double, so regrowing is rare
            self._request_tree = st.grown(self._request_tree, batch)
            if to_global:
                self._global_tree = st.grown(self._global_tree, batch)
            q = _feed(self._request_tree, self._global_tree, to_global, tokens, q, stop, a_lo, a_hi, a_base,
                      self._marks, self._mark_base, *params)
        return q
