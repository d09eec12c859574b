"""A plain, slow SGLang tree builder and a plain layer-by-layer multi-layer head, for tests only.

Written from the research notes (/work/notes/tree.md §1 and §5, a NumPy transcription of sglang 0.5.23's
eagle_worker_v2.py / spec_utils.py / eagle_utils.py), over tests/reference_head.py's ReferenceHead: every draft
forward rebuilds the slot's whole row sequence (the request's true rows, then the rows the slot holds, then itself)
and runs the layer over all of it. No batching, no cache; it shares no code with mtp_observe.drafting.tree.

`TreeReading` switches on one wrong rule at a time, so a test can show that the wrong rule changes the tree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class TreeReading:
    fed_back: str = "parent"  # "parent": the parent's output state | "root": m_{p-1} for every slot, always
    positions: str = "step"  # "step": p + i at forward i for every slot | "depth_plus_one": p + i + 1
    attention: str = "slot"  # "slot": the KV the slot wrote | "ancestors": its true ancestors' | "none": prefix only
    frontier: str = "product"  # "product": parent score x child prob | "child": the child's probability alone
    prune: str = "score"  # "score": the T-1 best scores | "first": the first T-1 global ids (breadth first)


CORRECT_TREE = TreeReading()


def _topk_desc(x: np.ndarray, k: int):
    idx = np.argsort(-x, kind="stable")[:k]
    return x[idx], idx


def reference_grow(ref, hidden: torch.Tensor, ids: torch.Tensor, p: int, K: int, S: int,
                   reading: TreeReading = CORRECT_TREE):
    """The candidates at anchor p: (scores [N], tokens [N], parents [N] global ids, -1 the root), N = K + (S-1)K²."""
    true_tok, true_hid, true_pos = ids[1 : p + 1], hidden[:p].to(ref.dtype), torch.arange(p)

    def run(rows):  # rows: [(token, hidden, position)] after the true rows -> the last row's state
        tok = torch.cat([true_tok, torch.tensor([r[0] for r in rows])])
        hid = torch.cat([true_hid, torch.stack([r[1] for r in rows])])
        pos = torch.cat([true_pos, torch.tensor([r[2] for r in rows])])
        return ref.layer(tok, hid, pos)[-1]

    def probs(m):
        return torch.softmax((m @ ref.lm_head.T).double(), -1).numpy()

    root = ref.layer(true_tok, true_hid, true_pos)[-1]
    p0, i0 = _topk_desc(probs(root), K)
    scores, tokens, parents = [p0], [i0], [np.full(K, -1)]
    front_scores, front_tokens, front_ids = p0, i0, np.arange(K)
    front_hidden = [root] * K
    history = [[] for _ in range(K)]  # per slot: the rows (token, hidden, position) it holds
    for i in range(S - 1):
        pos = p + i + (1 if reading.positions == "depth_plus_one" else 0)
        outs, level_p, level_t = [], np.zeros((K, K)), np.zeros((K, K), dtype=np.int64)
        rows_now = []
        for k in range(K):
            hid = root if reading.fed_back == "root" else front_hidden[k]
            row = (int(front_tokens[k]), hid, pos)
            seen = [] if reading.attention == "none" else history[k]
            m = run(seen + [row])
            outs.append(m)
            rows_now.append(row)
            level_p[k], level_t[k] = _topk_desc(probs(m), K)
        expand = (front_scores[:, None] * level_p) if reading.frontier == "product" else level_p
        real = (front_scores[:, None] * level_p).ravel()
        _, chosen = _topk_desc(expand.ravel(), K)
        base = K + K * K * i
        scores.append(real)
        tokens.append(level_t.ravel())
        parents.append(np.repeat(front_ids, K))
        parent_slot = chosen // K
        if reading.attention == "ancestors":
            history = [history[q] + [rows_now[q]] for q in parent_slot]
        else:
            history = [history[k] + [rows_now[k]] for k in range(K)]
        front_hidden = [outs[q] for q in parent_slot]
        front_tokens, front_scores, front_ids = level_t.ravel()[chosen], real[chosen], base + chosen
    return np.concatenate(scores), np.concatenate(tokens), np.concatenate(parents)


def reference_select(scores: np.ndarray, T: int, reading: TreeReading = CORRECT_TREE) -> np.ndarray:
    """The kept global ids, ascending (organize_draft_results: topk(T-1) of every score, sorted by id)."""
    if reading.prune == "first":
        return np.arange(T - 1)
    return np.sort(_topk_desc(scores, T - 1)[1])


def reference_stepwise(ref, hidden: torch.Tensor, ids: torch.Tensor, p: int, K: int) -> list[int]:
    """d_1..d_K with MTP layer i at step i+1, as transformers' MtpModel.forward runs a prefill window: layer i's rows
    j = 0..p-1 pair layer i-1's state at row j with x_{j+i+1} (a draft once j+i+1 > p), at position j + i."""
    drafts: list[int] = []
    states = hidden[:p].to(ref.dtype)  # layer -1: the target's h_0..h_{p-1}
    for i in range(K):
        tok = torch.tensor([int(ids[j + i + 1]) if j + i + 1 <= p else drafts[j + i - p] for j in range(p)])
        states = ref.layer(tok, states, torch.arange(p) + i, index=i)
        drafts.append(int((states[-1] @ ref.lm_head.T).argmax()))
    return drafts
