"""N-gram: vLLM's prompt-lookup proposer (`method: "ngram"`), at every anchor of a request, as either of
vLLM's model runners proposes it (`NgramConfig.runner`, `replay --ngram-runner`).

vLLM 0.33 runs `method: "ngram"` on its V2 model runner by default on CUDA (vllm/config/vllm.py:730-767
`use_v2_model_runner`: V2 unless VLLM_USE_V2_MODEL_RUNNER=0, Triton is missing or a feature V2 lacks is on;
ngram is not among those, :3053-3087), which dispatches both "ngram" and "ngram_gpu" to one GPU speculator
(vllm/v1/worker/gpu/spec_decode/__init__.py:87-92). The V1 runner's CPU proposer is the other rule. Both are
modelled; "v2" is the default. Read in the vLLM 0.33.0 wheel (vllm/_version.py `__version__ = '0.33.0'`).

With context c = x_0..x_p (N = p + 1 tokens: at anchor p the drafter has seen x_p), K = num_speculative_tokens:

v2 (vllm/v1/worker/gpu/spec_decode/ngram/speculator.py: `_ngram_scan_kernel` :20-87, `_ngram_finalize_kernel`
    :90-148). For every n in [prompt_lookup_min, prompt_lookup_max] and every start pos <= N - n - 1 (the
    occurrence ends by c[N-2]; it may overlap the last n tokens) where c[pos:pos+n] == c[N-n:], the score
    n * (max_model_len + 1) + pos + 1; the largest wins ("longest-n, rightmost-pos", :82-84): the LONGEST n,
    then its MOST RECENT earlier occurrence. Slot k of the draft is c[pos + n + k] while that exists, else the
    last sampled token x_p (:138-147: "Invalid slots fall back to the last sampled token; they are verified as
    ordinary (rejectable) drafts"); with no match (or N < prompt_lookup_min: the row is not eligible, :42) all K
    slots are x_p. Always K tokens: every step is a K-token draft.
v1 (vllm/v1/spec_decode/ngram_proposer.py `_find_longest_matched_ngram_and_propose_tokens` :210-295):
    1. nothing if N < prompt_lookup_min;  k' = min(K, max_model_len - N), nothing if k' <= 0
    2. the longest n in [prompt_lookup_min, prompt_lookup_max] whose last n tokens c[N-n:] occur earlier in c
       (an occurrence ending at or before c[N-2]; it may overlap the last n tokens)
    3. of that n-gram's earlier occurrences, the EARLIEST one wins (its KMP over the reversed context keeps
       the last, i.e. leftmost, position on ties: `if prev_lps >= longest_ngram`, :263)
    4. propose the min(k', tokens left) tokens that followed it — fewer than K when the match sits near the end
       of the context, none without a match (a step with no draft)
Both: max_model_len (when set) bounds the draft to max_model_len - N tokens (v1's own bound; v2's scheduler trims
the scheduled drafts likewise, vllm/v1/core/sched/scheduler.py:850-857, 1010-1025).
Defaults (vllm/config/speculative.py:1297-1326): neither bound given -> 5 and 5; one given -> the other mirrors
it; both >= 1, min <= max. Proposals for a smaller K are the first K of these under either rule (the match does
not depend on K; v2's fill is the same token at every slot), so one pass at Kmax answers every K, as for the head.

Worked examples, c = [1, 2, 3, 4, 2, 3], min 2, max 3, K 4 (vLLM's own): [4, 2, 3] has no earlier occurrence;
[2, 3] occurs at c[1:3]; after it [4, 2, 3]: v1 proposes those three, v2 [4, 2, 3, 3] (the fourth slot is x_p).
Several matches, c = [5, 1, 5, 2, 5], min = max = 1: 5 occurs at 0 and 2; v1 takes the earliest -> [1, 5, 2, 5],
v2 the most recent -> [2, 5, 5, 5]. No match, c = [1, 2, 3], min = max = 2: v1 nothing, v2 [3, 3, 3, 3].

How (the same answers, computed for every anchor at once): an index numbers every n-gram (n <= max) of the
request: the n-gram ending at q is the pair (its (n-1)-gram ending at q-1, x_q), looked up in a hash map -> id.
v1's "earliest earlier occurrence of the n-gram ending at p" is that id's first occurrence, when it ends before
p (first_end[id]); v2's "most recent earlier occurrence" is the previous end of the same id before p, recorded
for every (q, n) as the index is built (prev_end[q, n-1] = the id's last end so far). An anchor then costs at
most max-min+1 lookups and a copy; building the index costs max n lookups per token, compiled (numba). The
index of one request is rolled back to the prefix the next one shares (each id's last end restored from
prev_end, newest position first) and extended, so a session costs its new tokens, not requests x context (vLLM
scans the whole context at every step; the answers are the same).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import OptionError
from . import NO_TOKEN, Proposals, anchors as anchors_of, hashmap, span_array
from .hashmap import compiled

DEFAULT_NGRAM = 5  # vLLM: both bounds unset -> prompt_lookup_min = prompt_lookup_max = 5
RUNNERS = ("v2", "v1")  # vLLM's model runners; v2 is vLLM 0.33's default on CUDA (module doc)
DEFAULT_RUNNER = "v2"


@dataclass(frozen=True)
class NgramConfig:
    prompt_lookup_min: int = DEFAULT_NGRAM
    prompt_lookup_max: int = DEFAULT_NGRAM
    max_model_len: int | None = None  # None: no limit beyond the request itself
    runner: str = DEFAULT_RUNNER  # "v2": the GPU speculator (K tokens, most recent match); "v1": the CPU proposer

    def __post_init__(self):
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo < 1 or hi < 1:
            raise OptionError(f"--ngram {lo},{hi}: both n-gram bounds must be >= 1 (vLLM's prompt_lookup_min/max)")
        if lo > hi:
            raise OptionError(f"--ngram {lo},{hi}: prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise OptionError(f"max_model_len={self.max_model_len} must be >= 1")
        if self.runner not in RUNNERS:
            raise OptionError(f"--ngram-runner {self.runner}: expected v2 (vLLM's default GPU speculator) or v1 "
                              "(its CPU proposer)")


def ngram_config(prompt_lookup_min: int | None = None, prompt_lookup_max: int | None = None,
                 max_model_len: int | None = None, runner: str = DEFAULT_RUNNER) -> NgramConfig:
    """vLLM's resolution of the two bounds: neither -> 5, 5; one -> the other mirrors it."""
    if prompt_lookup_min is None and prompt_lookup_max is None:
        prompt_lookup_min = prompt_lookup_max = DEFAULT_NGRAM
    elif prompt_lookup_min is None:
        prompt_lookup_min = prompt_lookup_max
    elif prompt_lookup_max is None:
        prompt_lookup_max = prompt_lookup_min
    return NgramConfig(prompt_lookup_min, prompt_lookup_max, max_model_len, runner)


# ---------------------------------------------------------------------------------------------
# The index (compiled)


@compiled
def _extend(tokens, start, stop, max_n, level_id, prev_end, ids_before, first_end, last_end, key_of, keys, values,
            n_ids):
    """Index positions start..stop-1 (the caller made room for max_n new ids per token) -> n_ids."""
    for q in range(start, stop):
        ids_before[q] = n_ids
        token = np.int64(tokens[q])
        parent_code = np.int64(0)  # the 1-gram's "parent": none
        for level in range(max_n):  # n = level + 1
            if level > q:
                level_id[q, level] = -1
                prev_end[q, level] = -1
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
                prev_end[q, level] = -1
                n_ids += 1
            else:
                level_id[q, level] = values[i]
                prev_end[q, level] = last_end[values[i]]
            last_end[level_id[q, level]] = q
    ids_before[stop] = n_ids
    return n_ids


@compiled
def _forget(shared, stop, max_n, level_id, prev_end, last_end, first_id, n_ids, key_of, keys, values):
    """Roll positions shared..stop-1 back: each id's last end as it was before them (newest position first),
    then drop the ids first_id..n_ids-1 (the n-grams first seen there)."""
    for q in range(stop - 1, shared - 1, -1):
        for level in range(max_n):
            if level_id[q, level] >= 0:
                last_end[level_id[q, level]] = prev_end[q, level]
    for i in range(n_ids - 1, first_id - 1, -1):
        hashmap.erase(keys, values, key_of[i])


@compiled
def _propose_v1(tokens, anchor, k, min_n, max_n, max_model_len, level_id, first_end, out):
    """out[a, :] = vLLM V1's proposal at anchor[a] (out pre-filled with NO_TOKEN)."""
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


@compiled
def _propose_v2(tokens, anchor, k, min_n, max_n, max_model_len, level_id, prev_end, out):
    """out[a, :] = vLLM V2's proposal at anchor[a]: K tokens, x_p where the match runs out or none is found
    (out pre-filled with NO_TOKEN, left so only past max_model_len)."""
    for a in range(anchor.shape[0]):
        p = anchor[a]
        n_ctx = p + 1
        kk = k if max_model_len <= 0 else min(k, max_model_len - n_ctx)
        if kk <= 0:
            continue
        begin = n_ctx  # no match: every slot falls back to x_p
        if n_ctx >= min_n:
            for n in range(min(max_n, n_ctx), min_n - 1, -1):
                before = prev_end[p, n - 1]
                if before >= 0:  # the most recent earlier occurrence, ending at `before` (< p)
                    begin = before + 1
                    break
        for j in range(kk):
            out[a, j] = tokens[begin + j] if begin + j <= p else tokens[p]


class NgramIndex:
    """Every n-gram (n <= max_n) of a token sequence, by first occurrence; extended and rolled back
    as consecutive requests share prefixes. State only: the answers depend on the tokens alone."""

    def __init__(self, max_n: int):
        self.max_n = max_n
        self.tokens = np.zeros(0, dtype=np.int32)  # [n] the sequence indexed
        self._cap = 0
        self._level_id = np.zeros((0, max_n), dtype=np.int32)  # [cap, max_n] id of the (level+1)-gram ending at q
        self._prev_end = np.zeros((0, max_n), dtype=np.int32)  # [cap, max_n] its previous end before q (-1: none)
        self._ids_before = np.zeros(1, dtype=np.int64)  # [cap + 1] ids allocated before position q
        self._first_end = np.zeros(0, dtype=np.int32)  # [ids] end position of each n-gram's first occurrence
        self._last_end = np.zeros(0, dtype=np.int32)  # [ids] end position of its latest occurrence indexed
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
            _forget(shared, len(self.tokens), self.max_n, self._level_id, self._prev_end, self._last_end, first_id,
                    self._n_ids, self._key_of, self._keys, self._values)
            self._n_ids = first_id
        n = len(tokens)
        self._reserve(n, (n - shared) * self.max_n)
        self._n_ids = _extend(tokens, shared, n, self.max_n, self._level_id, self._prev_end, self._ids_before,
                              self._first_end, self._last_end, self._key_of, self._keys, self._values, self._n_ids)
        self.tokens = tokens

    def propose(self, anchor: np.ndarray, k: int, min_n: int, max_model_len: int | None,
                runner: str = DEFAULT_RUNNER) -> np.ndarray:
        """[A, k] int32 vLLM proposals (the `runner`'s rule) at anchor positions of the indexed sequence."""
        anchor = np.ascontiguousarray(anchor, dtype=np.int64)
        assert anchor.size == 0 or (int(anchor.min()) >= 0 and int(anchor.max()) < len(self.tokens)), "anchors lie inside the sequence"
        assert 1 <= min_n <= self.max_n and k >= 1 and runner in RUNNERS
        out = np.full((anchor.shape[0], k), NO_TOKEN, dtype=np.int32)
        if runner == "v1":
            _propose_v1(self.tokens, anchor, k, min_n, self.max_n, max_model_len or 0, self._level_id, self._first_end, out)
        else:
            _propose_v2(self.tokens, anchor, k, min_n, self.max_n, max_model_len or 0, self._level_id, self._prev_end, out)
        return out

    def _reserve(self, n: int, more_ids: int) -> None:
        if n > self._cap:
            cap = max(n, 2 * self._cap, 1024)
            self._level_id = _resized(self._level_id, cap)
            self._prev_end = _resized(self._prev_end, cap)
            self._ids_before = _resized(self._ids_before, cap + 1)
            self._cap = cap
        need = self._n_ids + more_ids
        if need > self._first_end.shape[0]:
            size = max(need, 2 * self._first_end.shape[0], 1024)
            self._first_end = _resized(self._first_end, size)
            self._last_end = _resized(self._last_end, size)
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
            prompt_lookup_max: int = DEFAULT_NGRAM, max_model_len: int | None = None,
            runner: str = DEFAULT_RUNNER) -> np.ndarray:
    """[A, k] int32: vLLM's n-gram proposal (the runner's rule) at each anchor p of `tokens` (context x_0..x_p),
    NO_TOKEN-padded."""
    config = NgramConfig(prompt_lookup_min, prompt_lookup_max, max_model_len, runner)
    index = NgramIndex(config.prompt_lookup_max)
    index.index(tokens)
    return index.propose(anchor, k, config.prompt_lookup_min, config.max_model_len, config.runner)


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
        out = self._index.propose(anchor, k, self.config.prompt_lookup_min, self.config.max_model_len, self.config.runner)
        return Proposals(anchor, out)

    def add_outputs(self, tokens: np.ndarray, spans) -> None:
        pass
