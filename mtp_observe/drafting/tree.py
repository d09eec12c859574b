"""The tree: SGLang's EAGLE/NEXTN tree drafts (`--speculative-eagle-topk > 1`) grown by the MTP head at every anchor.

Contract:
    parse_tree(text) -> TreeConfig     '3,4,8' (S, TOPK, T) or '3,4,8,ancestors'; SGLang's bounds, one line if wrong
    grow(head, rows, anchors, topk, steps, attention) -> Grown
                                       every candidate SGLang generates at every anchor, batched over anchors
    expand(scores, child_probs) / select(grown, steps, draft_tokens)
                                       the pure bookkeeping: the best TOPK of a level's TOPK² children, the T-1 kept
Verification against the recorded continuation (greedy, sampled) is tree_acceptance.py.

Notation (sglang 0.5.23; S = --speculative-num-steps, K = --speculative-eagle-topk, T = --speculative-num-draft-tokens;
files under sglang/srt/speculative/ unless named). Anchor p: the target has just emitted x_p (the root, node 0,
counted in T, not drafted); the head holds rows 0..p-1 of its row pass (mtp.MtpHead.row_pass).

    level 1   the head's row p-1 (h_{p-1}, x_p), its state m_{p-1} and probabilities q = softmax(lm_head m_{p-1})
              at temperature 1 whatever the request's sampler (spec_utils.py:206-219 renorm_draft_probs; a tree
              never uses rejection sampling, arg_groups/speculative_hook.py:1221-1225): the K most likely tokens,
              scores = their probabilities (spec_utils.py:417-435 _select_top_k_tokens_first); every frontier slot
              is fed m_{p-1}
    forward i = 0..S-2 (eagle_worker_v2.py:808-899): the K frontier slots run through the head at RoPE position
              p + i, the same for every slot (eagle_worker_common.py:357-361, `positions.add_(1)` after each forward,
              eagle_worker_v2.py:888); slot k's token is its node's and its hidden is its *parent's* output state (the
              head's post-norm state, hidden_states[selected_input_index], spec_utils.py:438-471); it attends to
              rows 0..p-1 and to the KV that slot k itself wrote at forwards 0..i (cache_locs.py:160-310
              generate_draft_decode_kv_indices: `seq_len + topk_id * num_steps + [0, iters)`), which after a
              re-ranking need not be its ancestors' (sgl-project/sglang#7523). Each slot proposes its K most likely
              children; child score = parent score x child probability; the best K of the K² form the next
              frontier (`fast_topk(expand_scores.flatten(1), topk)`)
    final     the T-1 best scores among all K + (S-1)K² candidates, sorted by global id (eagle_utils.py:100-129
              organize_draft_results), each linked to its parent (eagle.cuh:71-104 build_tree_efficient)

Global node ids (SGLang's order: level-major, then parent slot, then child rank): level 1 nodes 0..K-1; the children
of the frontier slot q at forward i are K + K²·i + q·K + [0, K). A child's score never exceeds its parent's (a
probability is at most 1), so the kept set is ancestor-closed; ties are broken towards the lower id (a stable sort),
so a parent always outranks a child of equal score. torch.topk on a GPU breaks ties arbitrarily, which can make
SGLang print "invalid eagle tree" (eagle.cuh:89-94); here it cannot happen.

Worked example (K = 2, S = 2, T = 4): level-1 probabilities (0.7, 0.2) at ids 0, 1; slot 0 proposes children with
probabilities (0.5, 0.2), slot 1 (0.9, 0.05) -> level-2 scores (0.35, 0.14, 0.18, 0.01) at ids 2, 3, 4, 5 (frontier
for a third step: ids 2 and 4). The T-1 = 3 best of (0.7, 0.2, 0.35, 0.14, 0.18, 0.01) are ids 0, 2, 1: the tree is
root -> {0 -> {2}, 1}; node 4 (0.18, the best child of slot 1) loses to node 1 (0.2). Pinned in tests/test_tree.py.

Attention rules: "slot" is what SGLang does. "ancestors" (a what-if, `--tree S,K,T,ancestors`) gives each slot the KV
of its true ancestors instead (the history gathered by parent slot after every re-ranking): only the draft forwards'
attention context changes; the hidden fed back, the positions, the scoring and the verify mask are the same. For K = 1
both rules are the chain (one slot is always its own ancestor), and T = S + 1 keeps every node: the chain exactly
(SGLang forces T = S + 1 when topk is 1, arg_groups/speculative_hook.py:1255-1266).

vLLM's tree path (`speculative_token_tree`, removed in vLLM 0.21 by vllm-project/vllm#42121) never served MTP heads
(0.20.2 `propose_tree` unpacks two model outputs, which an MTP model does not return; its rejection sampler verifies
chains only), so it is not modelled: see docs/trees.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import OptionError

ATTENTION_RULES = ("slot", "ancestors")
MAX_STEPS = 16  # --speculative-num-steps; a draft deeper than the replay's rows reach says nothing more
MAX_TOPK = 16  # --speculative-eagle-topk; K² children per level and step
MAX_TREES = 16  # --tree configurations in one replay


@dataclass(frozen=True)
class TreeConfig:
    steps: int  # S, --speculative-num-steps: the tree's depth
    topk: int  # K, --speculative-eagle-topk: the frontier's width and each node's children
    draft_tokens: int  # T, --speculative-num-draft-tokens: the nodes verified, the root included
    attention: str = "slot"  # "slot" (SGLang) | "ancestors" (the true-ancestor what-if)

    @property
    def name(self) -> str:
        """The rows' `drafter` value in positions.parquet: 'tree:3,4,8' (or 'tree:3,4,8,ancestors')."""
        return f"tree:{self.steps},{self.topk},{self.draft_tokens}" + ("" if self.attention == "slot" else f",{self.attention}")

    @property
    def candidates(self) -> int:
        """Nodes SGLang generates: K + (S-1)K²."""
        return self.topk + (self.steps - 1) * self.topk ** 2

    def sglang_args(self) -> list[str]:
        return ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", str(self.steps),
                "--speculative-eagle-topk", str(self.topk), "--speculative-num-draft-tokens", str(self.draft_tokens)]

    def as_dict(self) -> dict:
        return {"name": self.name, "steps": self.steps, "topk": self.topk, "draft_tokens": self.draft_tokens,
                "attention": self.attention}


_TREE = re.compile(r"\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*(?:,\s*([a-z]+)\s*)?")


def parse_tree(text: str) -> TreeConfig:
    """'S,TOPK,T[,ancestors]' -> TreeConfig, refused in one line naming the bound it breaks."""
    m = _TREE.fullmatch(str(text))
    if m is None or (m.group(4) is not None and m.group(4) not in ATTENTION_RULES):
        raise OptionError(f"--tree {text}: expected S,TOPK,T (SGLang's --speculative-num-steps, --speculative-eagle-topk, "
                          "--speculative-num-draft-tokens), e.g. 3,4,8; add ,ancestors for the true-ancestor what-if")
    S, K, T = int(m.group(1)), int(m.group(2)), int(m.group(3))
    config = TreeConfig(S, K, T, m.group(4) or "slot")
    if not 1 <= S <= MAX_STEPS:
        raise OptionError(f"--tree {text}: S = {S} draft steps; expected 1 to {MAX_STEPS}")
    if not 1 <= K <= MAX_TOPK:
        raise OptionError(f"--tree {text}: TOPK = {K}; expected 1 to {MAX_TOPK}")
    if K == 1 and T != S + 1:
        raise OptionError(f"--tree {text}: with TOPK 1 SGLang sets T to S + 1 = {S + 1} (a chain; "
                          f"arg_groups/speculative_hook.py:1255-1266); pass {S},1,{S + 1}")
    if not 2 <= T <= 1 + config.candidates:
        raise OptionError(f"--tree {text}: T = {T} verified tokens (the root included); expected 2 to 1 + K + (S-1)K² = "
                          f"{1 + config.candidates} (SGLang keeps the T-1 best of the {config.candidates} it generates)")
    return config


# ---------------------------------------------------------------------------------------------
# The bookkeeping (pure)


def stable_topk(values: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest along the last axis, largest first, ties to the lower index. values [..., n] -> ([..., k], [..., k])."""
    order = torch.sort(values, dim=-1, descending=True, stable=True).indices[..., :k]
    return values.gather(-1, order), order


def expand(scores: Tensor, child_probs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """One level of SGLang's `_select_top_k_tokens_later` (spec_utils.py:438-471).

    scores [A, K] of the frontier, child_probs [A, K, K] (slot q's K children, most likely first) ->
    (level scores [A, K²] = scores[q] * child_probs[q, c] at index q·K + c, kept [A, K] the next frontier's indices
    into the level (best first), their scores [A, K])."""
    A, K = scores.shape
    level = (scores[:, :, None] * child_probs).reshape(A, K * K)
    best, chosen = stable_topk(level, K)
    return level, chosen, best


@dataclass(frozen=True)
class Grown:
    """Every candidate of the tree at every anchor, by global node id (module docstring). A anchors, N = K + (S-1)K²."""

    topk: int  # K
    steps: int  # S grown (a config with fewer steps reads the first K + (s-1)K² ids)
    attention: str  # "slot" | "ancestors"
    scores: Tensor  # [A, N] fp32  the running product of draft probabilities from the root
    tokens: Tensor  # [A, N] int64
    logprobs: Tensor  # [A, N] fp32  log of the head's probability of the token given its parent's path
    parent: Tensor  # [A, N] int64  the parent's global id; -1: the root
    first_child: Tensor  # [A, N] int64  global id of its first child (K children follow); -1: never expanded

    @property
    def nodes(self) -> int:
        return self.scores.shape[1]


def level_of(ids: Tensor, topk: int) -> Tensor:
    """Global node ids -> their level (depth below the root, 1..S)."""
    return torch.where(ids < topk, 1, 2 + (ids - topk).div(topk * topk, rounding_mode="floor"))


def select(grown: Grown, steps: int, draft_tokens: int) -> Tensor:
    """The final tree of a config with `steps` <= grown.steps and T = draft_tokens: [A, N_S] bool, the T-1 best
    scores among the first N_S = K + (steps-1)K² candidates (organize_draft_results' `topk(score_list, T-1)`)."""
    K = grown.topk
    n = K + (steps - 1) * K * K
    assert steps <= grown.steps and 1 <= draft_tokens - 1 <= n, (steps, grown.steps, draft_tokens, n)
    _, best = stable_topk(grown.scores[:, :n], draft_tokens - 1)
    kept = torch.zeros(grown.scores.shape[0], n, dtype=torch.bool, device=grown.scores.device)
    kept.scatter_(1, best, True)
    parent = grown.parent[:, :n]
    has_parent = parent >= 0
    assert bool((~kept | ~has_parent | kept.gather(1, parent.clamp(min=0))).all()), "the kept set is ancestor-closed"
    return kept


# ---------------------------------------------------------------------------------------------
# Growing it with the head


@torch.no_grad()
def grow(head, rows, anchors: Tensor, topk: int, steps: int, attention: str = "slot",
         attention_budget: int | None = None, logits_budget: int | None = None) -> Grown:
    """Every candidate SGLang generates at every anchor (module docstring), batched over anchors and slots: S - 1 draft
    forwards of A·K queries through the head (mtp.MtpHead's draft_inputs / attend_own / finish_row / topk_chunked).

    rows: the head's mtp.RowPass of the request; anchors [A] positions p >= 1 with row p-1 in rows."""
    from ..model.mtp import ATTENTION_BUDGET, LOGITS_BUDGET

    assert attention in ATTENTION_RULES, attention
    attention_budget = attention_budget or ATTENTION_BUDGET
    logits_budget = logits_budget or LOGITS_BUDGET
    g, device, K, S = head.geometry, head.device, topk, steps
    anchors = anchors.to(device=device, dtype=torch.long)
    A = anchors.shape[0]
    N = K + (S - 1) * K * K
    scores = torch.zeros(A, N, dtype=torch.float32, device=device)
    tokens = torch.zeros(A, N, dtype=torch.long, device=device)
    logprobs = torch.zeros(A, N, dtype=torch.float32, device=device)
    parent = torch.full((A, N), -1, dtype=torch.long, device=device)
    first_child = torch.full((A, N), -1, dtype=torch.long, device=device)
    if A == 0:
        return Grown(K, S, attention, scores, tokens, logprobs, parent, first_child)
    every = torch.arange(A, device=device)[:, None]
    slots = torch.arange(K, device=device)

    # Level 1: the row pass's state m_{p-1}, its K most likely tokens.
    root = rows.states[anchors - 1]  # [A, H]
    ids, probs, lps = head.topk_chunked(root, K, logits_budget)
    scores[:, :K], tokens[:, :K], logprobs[:, :K] = probs, ids, lps
    front_ids = slots[None, :].expand(A, K)  # [A, K] global id of the node in each frontier slot
    front_tokens, front_scores = ids, probs
    front_hidden = root[:, None, :].expand(A, K, g.hidden_size)
    at = head.attention  # the cache's shape (kv_heads, key_dim, value_dim): the family's attention's
    history_k = torch.empty(at.kv_heads, A, K, max(S - 1, 1), at.key_dim, dtype=head.dtype, device=device)
    history_v = torch.empty(at.kv_heads, A, K, max(S - 1, 1), at.value_dim, dtype=head.dtype, device=device)

    for i in range(S - 1):  # forward i: the frontier (level i+1) proposes level i+2
        base = K + K * K * i
        first_child[every, front_ids] = base + slots[None, :] * K
        Q = A * K
        z, query, gate, key, value = head.draft_inputs(
            front_hidden.reshape(Q, g.hidden_size), front_tokens.reshape(Q), (anchors + i).repeat_interleave(K))
        history_k[:, :, :, i] = key.view(at.kv_heads, A, K, at.key_dim)
        history_v[:, :, :, i] = value.view(at.kv_heads, A, K, at.value_dim)
        own_k = history_k[:, :, :, : i + 1].reshape(at.kv_heads, Q, i + 1, at.key_dim)
        own_v = history_v[:, :, :, : i + 1].reshape(at.kv_heads, Q, i + 1, at.value_dim)
        attn = head.attend_own(rows, anchors.repeat_interleave(K), query, own_k, own_v, budget=attention_budget)
        out = head.finish_row(z, attn, gate)  # [Q, H] each slot's output state
        child_ids, child_probs, child_lps = head.topk_chunked(out, K, logits_budget)  # [Q, K]
        level, chosen, best = expand(front_scores, child_probs.view(A, K, K))
        scores[:, base : base + K * K] = level
        tokens[:, base : base + K * K] = child_ids.view(A, K * K)
        logprobs[:, base : base + K * K] = child_lps.view(A, K * K)
        parent[:, base : base + K * K] = front_ids.repeat_interleave(K, dim=1)
        parent_slot = chosen.div(K, rounding_mode="floor")  # [A, K] the new frontier's parents' slots
        front_ids = base + chosen
        front_tokens = child_ids.view(A, K * K).gather(1, chosen)
        front_scores = best
        front_hidden = out.view(A, K, g.hidden_size)[every, parent_slot]  # the parent's output state
        if attention == "ancestors":  # each slot carries its true ancestors' KV from now on
            history_k = history_k[:, every, parent_slot]
            history_v = history_v[:, every, parent_slot]
    return Grown(K, S, attention, scores, tokens, logprobs, parent, first_child)
