"""The layer rules: which MTP layer drafts at which step, for a head that ships several (mtp_num_hidden_layers > 1).

Contract:
    RULES                              ("layer0", "stepwise"): the two rules a replay of a multi-layer head writes
    layer_rows(head, rows0, ids) -> [RowPass]
                                       the row pass of every MTP layer over the request's true rows
    stepwise_chain(head, layers, anchors, depths) -> mtp.Drafts
                                       the chain with layer i at step i+1, batched over anchors

The rules (docs/trees.md, "Every shipped MTP layer"):
    layer0     MTP layer 0 at every step: mtp.MtpHead.chain, the `mtp` rows. What vLLM 0.33 runs for Qwen3.5: the
               model picks `layers[spec_step_idx % num_mtp_layers]`, but `Qwen3_5MTP.forward` does not pass the
               index on (vllm/model_executor/models/qwen3_5_mtp.py:146-191, 281-293), and the MTP proposer it uses
               (`MTPSpeculator`, not `MultiModuleMTPSpeculator`, which is chosen only when the draft config's
               `num_nextn_predict_layers` > 1, vllm/config/speculative.py:2188-2194) never passes it
               (vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py:415-430); SGLang's NEXTN builds one
               layer (sglang/srt/models/qwen3_5_mtp.py:135-137).
    stepwise   layer i at step i+1 (depth i+1), as the layers were trained and as transformers 5.24's MtpModel runs
               them (transformers/modeling_layers.py:502-573): layer i's sequence is row j = (layer i-1's state at
               row j, x_{j+i+1}) at position j + i, causal over its own rows (layer -1 = the target's h). At anchor p
               (x_p just emitted) its rows j <= p-1-i hold true tokens only (the row pass, `layer_rows`), and its
               rows j = p-i .. p-1 hold the drafts d_1..d_i: the "triangle" this step computes, each row attending to
               the true rows and the triangle rows before it; d_{i+1} = argmax lm_head(layer i's state at row p-1).
               transformers keeps the true rows in each layer's cache and re-runs the rows with drafts every round
               (generation/candidate_generator.py:1362-1491, MTPCandidateGenerator crops the cache by
               num_mtp_layers and recomputes); this is the same computation, without a cache. It drafts as many
               tokens as there are layers: rows at depths 1..min(Kmax, layers). vLLM's MultiModuleMTPSpeculator
               (DeepSeek-style heads with num_nextn_predict_layers > 1) runs the same window shift.
Worked example, p = 10, three layers: d_1 from layer 0's row 9 (h_9, x_10) at position 9; d_2 from layer 1's row 9
(m⁰_9, d_1) at position 10, over layer 1's true rows 0..8; d_3 from layer 2's rows 8 (m¹_8, d_1) at position 10 and 9
(m¹ of the d_2 row, d_2) at position 11, over layer 2's true rows 0..7.
"""

from __future__ import annotations

import torch
from torch import Tensor

RULES = ("layer0", "stepwise")
STEPWISE = "mtp:stepwise"  # the stepwise rows' `drafter` value in positions.parquet (the layer-0 rows are `mtp`)
RULE_TEXT = {
    "layer0": "layer 0 at every step (vLLM 0.33 for Qwen3.5, SGLang NEXTN)",
    "stepwise": "layer i at step i+1 (as trained; transformers' MtpModel)",
}


def stepwise_depth(head, k: int) -> int:
    """The deepest draft the stepwise rule makes: one per layer, at most Kmax."""
    return min(k, head.geometry.num_layers)


@torch.no_grad()
def layer_rows(head, rows0, ids: Tensor, chunk_size: int = 2048) -> list:
    """[RowPass of layer 0 (rows0), of layer 1, ...]: layer i's rows j = 0..n-2-i from layer i-1's states and x_{j+i+1}.

    rows0: layer 0's row pass over rows 0..n-2 (row j = (h_j, x_{j+1})); ids [n] the request's tokens."""
    out = [rows0]
    ids = ids.to(head.device)
    for i in range(1, head.geometry.num_layers):
        prev = out[-1]
        m = prev.states.shape[0] - 1
        if m <= 0:
            break
        out.append(head.row_pass(prev.states[:m], ids[i + 1 : i + 1 + m], chunk_size=chunk_size, layer=i))
    return out


@torch.no_grad()
def stepwise_chain(head, layers: list, anchors: Tensor, depths: Tensor, attention_budget: int | None = None,
                   logits_budget: int | None = None):
    """Drafts d_1..d_{depths[a]} with layer i at depth i+1 (module docstring), batched over anchors.

    layers: layer_rows' list; anchors [A] (p >= 1); depths [A] in 1..len(layers) -> mtp.Drafts."""
    from ..model.mtp import ATTENTION_BUDGET, LOGITS_BUDGET, Drafts

    attention_budget = attention_budget or ATTENTION_BUDGET
    logits_budget = logits_budget or LOGITS_BUDGET
    g, device = head.geometry, head.device
    anchors = anchors.to(device=device, dtype=torch.long)
    depths = depths.to(device=device, dtype=torch.long)
    A = anchors.shape[0]
    K = int(depths.max()) if A else 0
    assert K <= len(layers), (K, len(layers))
    tokens = torch.full((A, max(K, 1)), -1, dtype=torch.long, device=device)
    logprobs = torch.full((A, max(K, 1)), float("nan"), dtype=torch.float32, device=device)
    if A == 0:
        return Drafts(anchors, depths, tokens, logprobs)
    rows0 = layers[0]
    tokens[:, 0], logprobs[:, 0] = head._argmax_chunked(rows0.states[anchors - 1], logits_budget)
    triangle = torch.empty(A, 0, g.hidden_size, dtype=head.dtype, device=device)  # layer i-1's rows p-i+1..p-1
    for i in range(1, K):  # layer i drafts depth i+1
        alive = torch.nonzero(depths >= i + 1).squeeze(1)
        p = anchors[alive]
        Aa = alive.shape[0]
        t = torch.arange(i, device=device)
        j = p[:, None] - i + t[None, :]  # [Aa, i] the triangle's rows p-i .. p-1
        valid = j >= 0  # rows before the request's first are not there (p < i)
        below = layers[i - 1]
        true_row = below.states[(p - i).clamp(min=0)]  # layer i-1's true row p-i (h for i = 1)
        hidden = torch.cat([true_row[:, None], triangle[alive]], dim=1)  # [Aa, i, H]
        drafts = tokens[alive, :i]  # d_1..d_i: the tokens of rows p-i..p-1 of layer i
        positions = p[:, None] + t[None, :]  # row j at position j + i
        Q = Aa * i
        z, query, gate, key, value = head.draft_inputs(hidden.reshape(Q, -1), drafts.reshape(Q), positions.reshape(Q), i)
        nkv, d = g.num_kv_heads, g.head_dim
        own_k = key.view(nkv, Aa, 1, i, d).expand(nkv, Aa, i, i, d).reshape(nkv, Q, i, d)  # each row: its anchor's rows
        own_v = value.view(nkv, Aa, 1, i, d).expand(nkv, Aa, i, i, d).reshape(nkv, Q, i, d)
        causal = t[None, :] <= t[:, None]  # [i (query), i (key)]
        own_valid = (causal[None] & (valid[:, None, :] | (t[None, :] == t[:, None])[None])).reshape(Q, i)
        prefix = (p - i).clamp(min=0).repeat_interleave(i)  # layer i's true rows 0..p-i-1
        attn = head.attend_own(layers[i], prefix, query, own_k, own_v, own_valid, attention_budget)
        states = head.finish_row(z, attn, gate, i).view(Aa, i, g.hidden_size)
        tokens[alive, i], logprobs[alive, i] = head._argmax_chunked(states[:, -1], logits_budget)
        full = torch.zeros(A, i, g.hidden_size, dtype=head.dtype, device=device)
        full[alive] = states
        triangle = full
    return Drafts(anchors=anchors, depths=depths, tokens=tokens, logprobs=logprobs)
