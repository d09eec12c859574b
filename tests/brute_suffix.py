"""A brute-force suffix-decoding reference: an uncompressed suffix trie and SuffixDecodingCache's protocol.

Written from the definitions, not from the port: a node per distinct string of length <= depth
(no path compression, no groups, no journal), each holding its count (occurrences of the string
in the tree's sequences) and its children as a plain Python list in sibling order. The order rule
is Arctic Inference's, stated on the list:
  * a new child goes last;
  * a child gaining a count, when the sibling before it has a count no more than one above its
    own, moves in front of the first sibling with that sibling's count;
  * a child losing a count, when the sibling after it has its count, moves behind the last
    sibling with that count;
  * a child whose count would reach 0 leaves with its subtree.
The draft follows the first child from the match; its probability is multiplied by the count
ratio at every step (a ratio of exactly 1 inside what the real tree compresses, so the float32
products are the same).
"""

from __future__ import annotations

from collections import deque

import numpy as np

F32 = np.float32


class BruteTree:
    def __init__(self, depth: int):
        self.depth = depth
        self.count = {(): 0}
        self.kids: dict[tuple, list[tuple]] = {(): []}
        self.seqs: dict[int, list[int]] = {}

    def append(self, seq_id: int, token: int) -> None:
        seq = self.seqs.setdefault(seq_id, [])
        seq.append(int(token))
        n = len(seq)
        self.count[()] += 1
        for start in range(max(0, n - self.depth), n):  # oldest suffix first, as the active nodes are kept
            parent = tuple(seq[start:n - 1])
            child = parent + (int(token),)
            if child not in self.count:
                self.count[child] = 1
                self.kids[child] = []
                self.kids[parent].append(child)
            else:
                self._increment(parent, child)

    def _increment(self, parent, child) -> None:
        siblings = self.kids[parent]
        i = siblings.index(child)
        c = self.count[child]
        if i > 0 and self.count[siblings[i - 1]] <= c + 1:
            target = self.count[siblings[i - 1]]
            j = next(j for j, x in enumerate(siblings) if self.count[x] == target)
            siblings.pop(i)
            siblings.insert(j, child)
        self.count[child] = c + 1

    def _decrement(self, parent, child) -> None:
        siblings = self.kids[parent]
        i = siblings.index(child)
        c = self.count[child]
        if i + 1 < len(siblings) and self.count[siblings[i + 1]] == c:
            siblings.pop(i)
            j = next((j for j, x in enumerate(siblings) if self.count[x] < c), len(siblings))
            siblings.insert(j, child)
        self.count[child] = c - 1

    def remove(self, seq_id: int) -> None:
        seq = self.seqs.pop(seq_id)
        for start in range(len(seq)):
            self.count[()] -= 1
            parent: tuple = ()
            for d in range(start, min(len(seq), start + self.depth)):
                child = parent + (seq[d],)
                if self.count[child] > 1:
                    self._decrement(parent, child)
                else:
                    self.kids[parent].remove(child)
                    self._drop(child)
                    break
                parent = child

    def _drop(self, s) -> None:
        for c in self.kids.pop(s):
            self._drop(c)
        del self.count[s]

    def speculate(self, pattern: list[int], max_spec: int, factor, offset, min_prob):
        """SuffixTree::speculate from its definition -> (tokens, score, match_len)."""
        best = ([], F32(0.0), 0)
        for m in range(1, len(pattern)):
            node = tuple(pattern[len(pattern) - m:])
            if node not in self.count:
                break
            limit = int(float(F32(F32(m) * F32(factor)) + F32(offset)) + 1e-6)
            budget = max(min(max_spec, limit), 0)
            tokens, score, prob = [], F32(0.0), F32(1.0)
            while len(tokens) < budget and self.kids[node]:
                child = self.kids[node][0]
                step = prob * (F32(self.count[child]) / F32(self.count[node]))
                if step < F32(min_prob):
                    break
                prob, node = step, child
                tokens.append(child[-1])
                score = score + prob
            if score >= best[1]:
                best = (tokens, score, m)
        return best


class BruteCache:
    """SuffixDecodingCache as vLLM drives it, one vLLM request per scored span, requests in order."""

    def __init__(self, depth=24, max_cached=10000, factor=1.0, offset=0.0, min_prob=0.1, max_model_len=None,
                 max_spec_tokens=None):
        self.depth, self.max_cached = depth, max_cached
        self.factor, self.offset, self.min_prob = factor, offset, min_prob
        self.max_model_len, self.max_spec_tokens = max_model_len, max_spec_tokens
        self.global_tree = BruteTree(depth)
        self.cached: deque[int] = deque()
        self.next_id = 0

    def _start_output(self):
        if self.max_cached == 0:
            return None
        seq_id, self.next_id = self.next_id, self.next_id + 1
        self.cached.append(seq_id)
        while self.max_cached > 0 and len(self.cached) > self.max_cached:
            self.global_tree.remove(self.cached.popleft())
        return seq_id

    def add_outputs(self, tokens, spans) -> None:
        for s, e in spans:
            seq_id = self._start_output()
            if seq_id is not None:
                for q in range(s, e + 1):
                    self.global_tree.append(seq_id, int(tokens[q]))

    def request(self, tokens, spans, k: int) -> list[tuple[list[int], np.float32, int, int]]:
        """[(draft, score, match_len, source)] at every anchor. The request's tree is built fresh from
        the request's first token (a later span's fresh prompt tree would hold the same appends)."""
        tokens = [int(t) for t in tokens]
        local = BruteTree(self.depth)
        out, done = [], 0
        for s, e in spans:
            for q in range(done, s):
                local.append(0, tokens[q])
            seq_id = self._start_output()
            for q in range(s, e + 1):
                local.append(0, tokens[q])
                if seq_id is not None:
                    self.global_tree.append(seq_id, tokens[q])
                if not max(s, 1) <= q <= e - 1:
                    continue
                n_ctx = q + 1
                if self.max_model_len is not None and n_ctx >= self.max_model_len:
                    out.append(([], F32(0.0), 0, -1))
                    continue
                budget = k if self.max_spec_tokens is None else self.max_spec_tokens
                if self.max_model_len is not None:
                    budget = min(budget, self.max_model_len - n_ctx - 1)
                pattern = tokens[max(0, n_ctx - self.depth): n_ctx]
                args = (pattern, budget, self.factor, self.offset, self.min_prob)
                d_local = local.speculate(*args)
                d_global = self.global_tree.speculate(*args) if seq_id is not None else ([], F32(0.0), 0)
                if d_local[1] >= d_global[1]:
                    out.append((d_local[0][:k], d_local[1], d_local[2], 0))
                else:
                    out.append((d_global[0][:k], d_global[1], d_global[2], 1))
            done = e + 1
        return out
