"""N-gram: vLLM's prompt-lookup proposer (`method: "ngram"`), at every anchor of a request.

Followed: vllm-project/vllm `vllm/v1/spec_decode/ngram_proposer.py` at commit
adce4e9a528d7f79328075e195c855d28732ef13 (`_find_longest_matched_ngram_and_propose_tokens`,
`NgramProposer`), and the defaults in `vllm/config/speculative.py` at
002e77c1f0ef9b19cff8b9e21cfbd6feb3d6b443 (`SpeculativeConfig.__post_init__`).

vLLM's rule, with context c = x_0..x_p (N = p + 1 tokens: at anchor p the drafter has seen x_p):
    1. nothing if N < prompt_lookup_min;  k' = min(num_speculative_tokens, max_model_len - N),
       nothing if k' <= 0
    2. the longest n in [prompt_lookup_min, prompt_lookup_max] whose last n tokens c[N-n:] occur
       earlier in c (an occurrence ending at or before c[N-2]; it may overlap the last n tokens)
    3. of that n-gram's earlier occurrences, the EARLIEST one wins (vLLM's KMP over the reversed
       context keeps the last, i.e. leftmost, position on ties: `if prev_lps >= longest_ngram`)
    4. propose the min(k', tokens left) tokens that followed it — fewer than k when the match sits
       near the end of the context (at least one always follows: the occurrence ends by c[N-2])
Defaults: neither bound given -> 5 and 5; one given -> the other mirrors it; both >= 1, min <= max.
num_speculative_tokens is the run's K. Proposals for a smaller K are the first K of these (the
match does not depend on k), so one pass at Kmax answers every K, as for the MTP head.

Worked example (vLLM's own), c = [1, 2, 3, 4, 2, 3], min 2, max 3, k 4: [4, 2, 3] has no earlier
occurrence; [2, 3] occurs at c[1:3]; the tokens after it are [4, 2, 3] — three, not four.
Ties: c = [7, 1, 7, 2, 7], min = max = 1: 7 occurs at 0 and 2, the earliest wins -> [1, 7, 2, 7][:k].
Per anchor: x = [1, 2, 3, 4, 2, 3, 4, 9], min = max = 2, K = 2: at p = 5 the last 2-gram [2, 3]
first occurs at x_1..x_2 -> [x_3, x_4] = [4, 2] (x_6, x_7 = 4, 9: accepted length 1); at p = 6,
[3, 4] first occurs at x_2..x_3 -> [2, 3] (x_7 = 9: accepted length 0).

How (the same answers, computed for every anchor at once): "the earliest earlier occurrence of the
n-gram ending at p" is the first occurrence of that n-gram in the whole request, when it ends
before p. An index numbers every n-gram (n <= max) by its first occurrence: the n-gram ending at q
is the pair (its (n-1)-gram ending at q-1, x_q), looked up in a hash map -> id, first_end[id]. An
anchor then costs at most max-min+1 lookups and a copy; building the index costs max n lookups
per token, compiled (numba). The index of one request is rolled back to the prefix the next one
shares and extended, so a session costs its new tokens, not requests x context (vLLM scans the
whole context at every step; the answers are the same).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import OptionError
from . import NO_TOKEN, Proposals, anchors as anchors_of, hashmap, span_array
from .hashmap import compiled

DEFAULT_NGRAM = 5  # vLLM: both bounds unset -> prompt_lookup_min = prompt_lookup_max = 5


@dataclass(frozen=True)
class NgramConfig:
    prompt_lookup_min: int = DEFAULT_NGRAM
    prompt_lookup_max: int = DEFAULT_NGRAM
    max_model_len: int | None = None  # None: no limit beyond the request itself

    def __post_init__(self):
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo < 1 or hi < 1:
            raise OptionError(f"--ngram {lo},{hi}: both n-gram bounds must be >= 1 (vLLM's prompt_lookup_min/max)")
        if lo > hi:
            raise OptionError(f"--ngram {lo},{hi}: prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise OptionError(f"max_model_len={self.max_model_len} must be >= 1")


def ngram_config(prompt_lookup_min: int | None = None, prompt_lookup_max: int | None = None,
                 max_model_len: int | None = None) -> NgramConfig:
    """vLLM's resolution of the two bounds: neither -> 5, 5; one -> the other mirrors it."""
    if prompt_lookup_min is None and prompt_lookup_max is None:
        prompt_lookup_min = prompt_lookup_max = DEFAULT_NGRAM
    elif prompt_lookup_min is None:
        prompt_lookup_min = prompt_lookup_max
    elif prompt_lookup_max is None:
        prompt_lookup_max = prompt_lookup_min
    return NgramConfig(prompt_lookup_min, prompt_lookup_max, max_model_len)


# ---------------------------------------------------------------------------------------------
# The index (compiled)


@compiled
def _extend(tokens, start, stop, max_n, level_id, ids_before, first_end, key_of, keys, values, n_ids):
    """Index positions start..stop-1 (the caller made room for max_n new ids per token) -> n_ids."""
    for q in range(start, stop):
        ids_before[q] = n_ids
        token = np.int64(tokens[q])
        parent_code = np.int64(0)  # the 1-gram's "parent": none
        for level in range(max_n):  # n = level + 1
            if level > q:
                level_id[q, level] = -1
                continue
            if level > 0:
                parent_code = np.int64(level_id[q - 1, level - 1]) + 1
            key = (parent_code << np.int64(31)) | token
            i = hashmap.slot(keys, key)
            if keys[i] == hashmap.EMPTY:
                keys[i] = key
                values[i] = n_ids
                first_end[n_ids] = q
                key_of[n_ids] = key
                level_id[q, level] = n_ids
                n_ids += 1
            else:
                level_id[q, level] = values[i]
    ids_before[stop] = n_ids
    return n_ids


@compiled
def _forget(first_id, n_ids, key_of, keys, values):
    """Drop the ids first_id..n_ids-1 (the n-grams first seen at the positions rolled back)."""
    for i in range(n_ids - 1, first_id - 1, -1):
        hashmap.erase(keys, values, key_of[i])


@compiled
def _propose(tokens, anchor, k, min_n, max_n, max_model_len, level_id, first_end, out):
    """out[a, :] = vLLM's proposal at anchor[a] (out pre-filled with NO_TOKEN)."""
    for a in range(anchor.shape[0]):
        p = anchor[a]
        n_ctx = p + 1
        if n_ctx < min_n:
            continue
        kk = k if max_model_len <= 0 else min(k, max_model_len - n_ctx)
        if kk <= 0:
            continue
        for n in range(min(max_n, n_ctx), min_n - 1, -1):
            first = first_end[level_id[p, n - 1]]
            if first < p:  # an earlier occurrence, ending at `first`; the earliest one
                begin = first + 1
                count = min(kk, n_ctx - begin)
                for j in range(count):
                    out[a, j] = tokens[begin + j]
                break


class NgramIndex:
    """Every n-gram (n <= max_n) of a token sequence, by first occurrence; extended and rolled back
    as consecutive requests share prefixes. State only: the answers depend on the tokens alone."""

    def __init__(self, max_n: int):
        self.max_n = max_n
        self.tokens = np.zeros(0, dtype=np.int32)  # [n] the sequence indexed
        self._cap = 0
        self._level_id = np.zeros((0, max_n), dtype=np.int32)  # [cap, max_n] id of the (level+1)-gram ending at q
        self._ids_before = np.zeros(1, dtype=np.int64)  # [cap + 1] ids allocated before position q
        self._first_end = np.zeros(0, dtype=np.int32)  # [ids] end position of each n-gram's first occurrence
        self._key_of = np.zeros(0, dtype=np.int64)  # [ids] its hash-map key
        self._keys, self._values = hashmap.empty()
        self._n_ids = 0

    def index(self, tokens: np.ndarray) -> None:
        """Make the index cover exactly `tokens`: roll back to the shared prefix, extend by the rest."""
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        assert tokens.ndim == 1 and (tokens.size == 0 or int(tokens.min()) >= 0), "token ids are >= 0"
        shared = _shared_prefix(self.tokens, tokens)
        if shared < len(self.tokens):
            first_id = int(self._ids_before[shared])
            _forget(first_id, self._n_ids, self._key_of, self._keys, self._values)
            self._n_ids = first_id
        n = len(tokens)
        self._reserve(n, (n - shared) * self.max_n)
        self._n_ids = _extend(tokens, shared, n, self.max_n, self._level_id, self._ids_before, self._first_end,
                              self._key_of, self._keys, self._values, self._n_ids)
        self.tokens = tokens

    def propose(self, anchor: np.ndarray, k: int, min_n: int, max_model_len: int | None) -> np.ndarray:
        """[A, k] int32 vLLM proposals at anchor positions of the indexed sequence."""
        anchor = np.ascontiguousarray(anchor, dtype=np.int64)
        assert anchor.size == 0 or (int(anchor.min()) >= 0 and int(anchor.max()) < len(self.tokens)), "anchors lie inside the sequence"
        assert 1 <= min_n <= self.max_n and k >= 1
        out = np.full((anchor.shape[0], k), NO_TOKEN, dtype=np.int32)
        _propose(self.tokens, anchor, k, min_n, self.max_n, max_model_len or 0, self._level_id, self._first_end, out)
        return out

    def _reserve(self, n: int, more_ids: int) -> None:
        if n > self._cap:
            cap = max(n, 2 * self._cap, 1024)
            self._level_id = _resized(self._level_id, cap)
            self._ids_before = _resized(self._ids_before, cap + 1)
            self._cap = cap
        need = self._n_ids + more_ids
        if need > self._first_end.shape[0]:
            size = max(need, 2 * self._first_end.shape[0], 1024)
            self._first_end = _resized(self._first_end, size)
            self._key_of = _resized(self._key_of, size)
        self._keys, self._values = hashmap.grown(self._keys, self._values, self._n_ids, more_ids)


def _resized(a: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros((n,) + a.shape[1:], dtype=a.dtype)
    m = min(n, a.shape[0])
    out[:m] = a[:m]
    return out


def _shared_prefix(a: np.ndarray, b: np.ndarray) -> int:
    m = min(len(a), len(b))
    differ = np.flatnonzero(a[:m] != b[:m])
    return int(differ[0]) if differ.size else m


# ---------------------------------------------------------------------------------------------
# The drafter


def propose(tokens: np.ndarray, anchor: np.ndarray, k: int, prompt_lookup_min: int = DEFAULT_NGRAM,
            prompt_lookup_max: int = DEFAULT_NGRAM, max_model_len: int | None = None) -> np.ndarray:
    """[A, k] int32: vLLM's n-gram proposal at each anchor p of `tokens` (context x_0..x_p), NO_TOKEN-padded."""
    config = NgramConfig(prompt_lookup_min, prompt_lookup_max, max_model_len)
    index = NgramIndex(config.prompt_lookup_max)
    index.index(tokens)
    return index.propose(anchor, k, config.prompt_lookup_min, config.max_model_len)


class NgramDrafter:
    """The `Drafter` for the pipeline; reuses its index across requests sharing a prefix. Its drafts
    depend on the request alone: `keep` is not needed (the index rolls back to any prefix) and
    `add_outputs` has nothing to do."""

    name = "ngram"

    def __init__(self, config: NgramConfig = NgramConfig()):
        self.config = config
        self._index = NgramIndex(config.prompt_lookup_max)

    def propose(self, tokens: np.ndarray, spans, k: int, keep: int | None = None) -> Proposals:
        anchor = anchors_of(span_array(spans))
        self._index.index(tokens)
        out = self._index.propose(anchor, k, self.config.prompt_lookup_min, self.config.max_model_len)
        return Proposals(anchor, out)

    def add_outputs(self, tokens: np.ndarray, spans) -> None:
        pass
