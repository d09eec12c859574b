"""The MTP draft head, run exactly as the serving engines run it.

Contract: given the target's post-final-norm hidden states h_0..h_{n-1} of one request and
its tokens, `row_pass` runs the head once over every row i = (h_i, x_{i+1}) at RoPE position
i and returns the head's post-norm states m_i together with its own KV cache; `chain` then
drafts d_1..d_K at many anchors at once. The head knows nothing about sessions, spans or
the target model; it holds its own tensors (15 for a dense Qwen head; with a MoE block the
router, the experts and the shared expert(s)) and borrows the target's embedding and lm_head.

One row (N: the family's RMSNorm, computed in fp32 and cast back: zero-centred
x * rsqrt(mean(x^2) + eps) * (1 + w) for Qwen3.5 / Qwen3-Next, plain x * rsqrt(...) * w for
DeepSeek-V3 / GLM-4.5 — mtp/norms.py):

    z   = fc( cat[ N(embed(x_{i+1}); embedding norm), N(h_i; hidden norm) ] )   # embedding first
    y   = z + attention(N(z; input_layernorm))                                   # mtp/attention.py
    y   = y + mlp( N(y; post_attention_layernorm) )                              # mtp/mlp.py
    m_i = N(y; final norm)                 draft for x_{i+2} = argmax lm_head(m_i)

with the family's names (families.HeadNames): Qwen `mtp.pre_fc_norm_embedding`, `pre_fc_norm_hidden`, `fc`,
`layers.0.*`, `norm`; NextN `model.layers.{L}.enorm`, `hnorm`, `eh_proj`, the layer's own tensors,
`shared_head.norm` (docs/nextn.md).

Drafting at anchor p (the target has just emitted x_p, so it holds h_{p-1}):
    step 1:     row p-1 = (h_{p-1}, x_p) at position p-1 (already computed by the row pass) -> d_1
    step s>=2:  (embed(d_{s-1}), state^{(s-1)}) at position p+s-2, attending to the true rows
                0..p-1 and the earlier chain rows of the same draft -> d_s
    Worked example, p=10, K=3: d_1 from row 9 (h_9, x_10) @ pos 9; d_2 from (d_1, m^(1)) @ pos 10
    seeing rows 0..9 + itself; d_3 from (d_2, m^(2)) @ pos 11 seeing rows 0..9, the d_2 row, itself.
The state fed back is the post-norm m, or for a reading that says so (vLLM 0.33's GLM-4.5) the pre-norm y;
the logits are always lm_head(m). Where the engines differ the head follows a `families.HeadReading`.

Hooks for the what-ifs that run the head in other shapes (tree.py's trees, layer_rules.py's layer i at step i; both
for the Qwen heads only, pipeline.head_variants refuses --tree for a NextN head): `draft_inputs` (one row's fc input,
query, gate, key and value, through any layer), `attend_own` (queries that each see a prefix of the row pass's KV
and their own list of earlier keys) and `topk_chunked` (the top k of the temperature-1 softmax, vocabulary chunked).
`chain` is built from the first two.

Readings taken from the serving engines' code rather than from tensor shapes (vLLM
`qwen3_5_mtp.py` / `qwen3_next_mtp.py` / `v1/spec_decode/eagle.py`, SGLang
`qwen3_5_mtp.py` / `eagle_worker.py`; NextN: docs/nextn.md, vLLM 0.33 `deepseek_mtp.py` /
`glm4_moe_mtp.py` / `v1/spec_decode/llm_base_proposer.py`, SGLang 0.5.23 `deepseek_nextn.py` /
`glm4_moe_nextn.py` / `speculative/eagle_worker_v2.py`):
  - the fc input is [embedding, hidden] in that order (shapes allow either; NextN: deepseek_mtp.py:127-129,
    glm4_moe_mtp.py:120-122, deepseek_nextn.py:212-218, glm4_moe_nextn.py:97-105);
  - each half has its own norm, not one over 2H;
  - the hidden is the target's post-final-norm state (the tensor its lm_head consumes);
  - row i pairs h_i with the *next* token x_{i+1}, at the position of h_i (NextN: the proposer shifts the ids
    and keeps the target's positions, llm_base_proposer.py:840-851);
  - the head runs over every position the target processes (prompt included) with its own
    KV cache;
  - a chain step feeds back the head's state (post-norm m, or y per the reading), re-normed by the hidden
    norm, at a position advanced by one per step (llm_base_proposer.py:699-706, 775-800), through MTP layer 0
    at every step: vLLM never passes spec_step_idx (llm_base_proposer.py:731-737), and `Qwen3_5MTP.forward`
    drops it, so `spec_step_idx % num_mtp_layers` is 0 (vllm/model_executor/models/qwen3_5_mtp.py:281-293);
    SGLang's NEXTN builds one layer (sglang/srt/models/qwen3_5_mtp.py:135-137). A Qwen head with several layers
    (mtp_num_hidden_layers > 1) shares fc, the pre-fc norms and the final norm, as vLLM's
    Qwen3_5MultiTokenPredictor does (one fc, one norm, `layers[idx]`); layer_rules.py runs the other rule,
    layer i at step i, as the layers were trained and as transformers' MtpModel runs them. A NextN head is one
    layer (checkpoint.py refuses num_nextn_predict_layers != 1);
  - NextN, vLLM only: the embedding of the row at position 0 is zeroed before its norm
    (deepseek_mtp.py:122-123, glm4_moe_mtp.py:115-116);
  - the logits use the target's lm_head and embedding, also where the NextN layer ships copies
    (llm_base_proposer.py:1500-1503, 1560-1576; SGLang skips the copies, deepseek_weight_loader.py:319-335);
  - drafts are argmax whatever the serving temperature.
Confidence (`chain(..., confidence=True)`, and the stop `p_min`): the probability llama.cpp compares with
--draft-p-min (common/speculative.cpp, draft-mtp and draft-simple alike: `cur_p->data[0].p < params.p_min`
after `common_sampler_sample` with the draft sampler `top_k = 10` and no temperature sampler,
common/sampling.cpp `common_sampler_init` -> top_k then dist): the head's softmax at temperature 1 over its
ten largest logits, at the argmax, 1 / Σ_{top 10} exp(l - l_max) — the head's own probability of its draft,
after llama.cpp's draft sampler (not the served sampler, which llama.cpp never applies to drafts, and not the
whole-vocabulary softmax, which is smaller). Computed in float64 (llama.cpp's float32 rounds it to 1.0 once
the other nine are ~17 nats below; here past ~37). The stop is current llama.cpp's (PR #22506, 2026-04-29):
the first draft below p_min is dropped and the anchor stops drafting; strict `<`, so p = p_min drafts on.
The chain computes it for the Qwen heads and the NextN heads alike (the logits are lm_head(m) for both).
Readings that follow from the families' own attention are in mtp/attention.py, the routing in mtp/mlp.py, the
rotary (and its scaling) in mtp/rope.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..families import HeadGeometry, HeadReading, expected_head_shapes, head_names
from .attention import build_attention, causal_mask
from .mlp import build_mlp
from .norms import NORMS
from .rope import rotary_cos_sin, rotary_frequencies

try:  # torch >= 2.3
    from torch.nn.attention.bias import CausalBias, causal_lower_right as _lower_right
except ImportError:  # pragma: no cover
    CausalBias, _lower_right = (), None

# Default bound on one attention score block (elements of [heads, queries, keys] in fp32).
ATTENTION_BUDGET = 1 << 26  # 64 Mi elements = 256 MiB
# Default bound on one lm_head logits block (elements of [rows, vocab] in fp32).
LOGITS_BUDGET = 1 << 26
# llama.cpp's draft sampler: top_k 10 and nothing else (common/speculative.cpp: sparams.top_k = 10; samplers = {TOP_K}).
DRAFT_TOP_K = 10
# The Qwen heads' reading, which both engines share (families.head_reading).
QWEN_READING = HeadReading("vllm", "any", zero_position_0_embedding=False, fed_back="post_norm")


# ---------------------------------------------------------------------------------------------
# Outputs


@dataclass(frozen=True)
class RowPass:
    """The head run over every row of one request."""

    states: Tensor  # [n, H]  m_i: the head's post-norm state of row i = (h_i, x_{i+1}) at position i
    keys: Tensor  # [nkv, n, dk]  its KV cache after the qk-norm and RoPE (MLA: per head, nkv = nh)
    values: Tensor  # [nkv, n, dv]
    fed_back: Tensor | None = None  # [n, H]  y_i, the pre-norm state, kept only when the reading feeds it back


@dataclass(frozen=True)
class Drafts:
    """The chain's drafts at a set of anchors."""

    anchors: Tensor  # [A] int64  anchor positions p (x_p just emitted)
    depths: Tensor  # [A] int64  how many depths were drafted at each anchor (1..K)
    tokens: Tensor  # [A, K] int64  d_1..d_K; -1 past depths[a]
    logprobs: Tensor  # [A, K] float32  log-softmax of the head's logits at d_k; nan past depths[a]
    states: Tensor | None = None  # [A, K, H]  m^(k) (the logits' state), only when asked for (keep_states=True)
    confidence: Tensor | None = None  # [A, K] float64  llama.cpp's p of d_k (module doc); nan where not drafted
    drafted: Tensor | None = None  # [A] int64  drafts kept under p_min (its first draft below p_min dropped)


@dataclass(frozen=True)
class _ChainOut:
    """What MtpHead.chain fills in, step by step, at A anchors of up to K drafts (K at least 1 here)."""

    tokens: Tensor  # [A, K] int64  -1 where not drafted
    logprobs: Tensor  # [A, K] float32  nan where not drafted
    kept: Tensor | None  # [A, K, H]  the states, with keep_states
    sure: Tensor | None  # [A, K] float64  llama.cpp's p, with confidence
    stopped: Tensor  # [A] bool  p_min: the anchor drafts no more
    p_min: float | None

    @staticmethod
    def empty(A: int, K: int, hidden: int, dtype, device, keep_states: bool, confidence: bool,
              p_min: float | None) -> "_ChainOut":
        return _ChainOut(
            tokens=torch.full((A, max(K, 1)), -1, dtype=torch.long, device=device),
            logprobs=torch.full((A, max(K, 1)), float("nan"), dtype=torch.float32, device=device),
            kept=torch.zeros(A, max(K, 1), hidden, dtype=dtype, device=device) if keep_states else None,
            sure=torch.full((A, max(K, 1)), float("nan"), dtype=torch.float64, device=device) if confidence else None,
            stopped=torch.zeros(A, dtype=torch.bool, device=device),
            p_min=p_min,
        )

    def stop_low(self, where: Tensor, step: int) -> None:
        """p_min: drop the drafts below it at `step`, and stop those anchors."""
        if self.p_min is None:
            return
        low = where[self.sure[where, step - 1] < self.p_min]
        self.tokens[low, step - 1] = -1
        self.stopped[low] = True

    def drafts(self, anchors: Tensor, depths: Tensor) -> Drafts:
        drafts = Drafts(anchors=anchors, depths=depths, tokens=self.tokens, logprobs=self.logprobs, states=self.kept,
                        confidence=self.sure)
        if self.p_min is None:
            return drafts
        return replace(drafts, drafted=(drafts.tokens >= 0).long().cumprod(dim=1).sum(dim=1))


# ---------------------------------------------------------------------------------------------
# The head


class DecoderWeights(nn.Module):
    """One decoder layer's own tensors (its norms, the family's attention, its MLP), under `prefix`: a Qwen head's
    `layers.{i}.`, a NextN head's "" (the layer's tensors sit beside enorm / hnorm / eh_proj)."""

    def __init__(self, g: HeadGeometry, tensors: dict[str, Tensor], prefix: str):
        super().__init__()
        self.input_layernorm = nn.Parameter(tensors[prefix + "input_layernorm.weight"], requires_grad=False)
        self.post_attention_layernorm = nn.Parameter(tensors[prefix + "post_attention_layernorm.weight"], requires_grad=False)
        self.attention = build_attention(g, tensors, prefix + "self_attn.")
        self.mlp = build_mlp(g, tensors, prefix + "mlp.")

    def named_weights(self, prefix: str) -> dict[str, Tensor]:
        own = {prefix + "input_layernorm.weight": self.input_layernorm,
               prefix + "post_attention_layernorm.weight": self.post_attention_layernorm}
        return own | self.attention.named_weights(prefix + "self_attn.") | self.mlp.named_weights(prefix + "mlp.")


def anchor_block(num_heads: int, max_prefix: int, n_chain: int, budget: int) -> int:
    """Anchors per chain attention block so that [nh, block, prefix + block * n_chain] stays within budget
    (MtpHead.chain; estimate.chain_pairs counts the same blocks)."""
    block = max(1, budget // (num_heads * max(1, max_prefix)))
    while block > 1 and num_heads * block * (max_prefix + block * n_chain) > budget:
        block //= 2
    return block


def layer_prefixes(g: HeadGeometry) -> list[str]:
    """The decoder layers' prefixes under the head's: Qwen `layers.0.`, `layers.1.`, ...; NextN the one layer ""."""
    return [f"layers.{i}." for i in range(g.num_layers)] if g.head == "mtp" else [head_names(g).layer]


class MtpHead(nn.Module):
    """Holds the head's tensors and the borrowed embedding / lm_head; `row_pass` and `chain` run it.

    Attribute names are the roles (families.HeadNames): pre_fc_norm_embedding / pre_fc_norm_hidden / fc / norm hold
    a NextN head's enorm / hnorm / eh_proj / shared_head.norm. `layers[i]` is MTP layer i (one in every released
    checkpoint; a NextN head has exactly one); fc, the pre-fc norms and the final norm are shared by every layer.
    Layer 0's `input_layernorm`, `post_attention_layernorm`, `attention` and `mlp` are also reachable on the head."""

    def __init__(self, geometry: HeadGeometry, tensors: dict[str, Tensor], embed_tokens: Tensor, lm_head: Tensor,
                 reading: HeadReading | None = None):
        super().__init__()
        g = geometry
        self.geometry = g
        assert reading is not None or g.head == "mtp", "a NextN head runs as one engine reads it: pass its HeadReading"
        self.reading = reading or QWEN_READING
        names = self.names = head_names(g)
        shapes = expected_head_shapes(g)  # the fused expert form for a MoE head
        for name, shape in shapes.items():
            key = name[len(names.prefix):]
            assert tuple(tensors[key].shape) == shape, f"{name}: {tuple(tensors[key].shape)} != {shape}"
        assert len(tensors) == len(shapes), sorted(set(tensors) - {n[len(names.prefix):] for n in shapes})
        assert embed_tokens.shape == lm_head.shape == (g.vocab_size, g.hidden_size)

        def p(key):
            return nn.Parameter(tensors[key], requires_grad=False)

        self.pre_fc_norm_embedding = p(names.embedding_norm)
        self.pre_fc_norm_hidden = p(names.hidden_norm)
        self.fc = p(names.fc)  # [H, 2H]
        self.norm = p(names.final_norm)
        self.layer_prefixes = layer_prefixes(g)
        self.layers = nn.ModuleList(DecoderWeights(g, tensors, L) for L in self.layer_prefixes)
        self._norm_fn = NORMS[g.norm]
        # Borrowed from the target, not copied: a draft step reads the whole lm_head.
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head
        inv_freq, self.attention_factor = rotary_frequencies(g, self.fc.device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    # Layer 0's tensors under the names the head had before it held several layers.
    input_layernorm = property(lambda self: self.layers[0].input_layernorm)
    post_attention_layernorm = property(lambda self: self.layers[0].post_attention_layernorm)
    attention = property(lambda self: self.layers[0].attention)
    mlp = property(lambda self: self.layers[0].mlp)

    def named_weights(self) -> dict[str, Tensor]:
        """The head's own tensors by checkpoint name without the head's prefix (routed experts in the fused form)."""
        names = self.names
        own = {
            names.embedding_norm: self.pre_fc_norm_embedding, names.hidden_norm: self.pre_fc_norm_hidden,
            names.fc: self.fc, names.final_norm: self.norm,
        }
        for L, layer in zip(self.layer_prefixes, self.layers):
            own |= layer.named_weights(L)
        return own

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.dtype

    @property
    def device(self) -> torch.device:
        return self.fc.device

    # -- the pieces of one row -------------------------------------------------------------

    def _norm(self, x: Tensor, w: Tensor) -> Tensor:
        return self._norm_fn(x, w, self.geometry.rms_norm_eps)

    def fc_input(self, hidden: Tensor, next_ids: Tensor, positions: Tensor | None = None) -> Tensor:
        """hidden: [n, H] (target post-norm h_i, or the head's fed-back state in a chain step), next_ids: [n],
        positions: [n] (the rows' positions: a reading that zeroes position 0's embedding needs them) -> z: [n, H]."""
        embedding = F.embedding(next_ids.to(self.embed_tokens.device), self.embed_tokens).to(self.device)
        if self.reading.zero_position_0_embedding and positions is not None:
            embedding = torch.where(positions.to(self.device)[:, None] == 0, 0, embedding)  # vLLM deepseek_mtp.py:123
        embedding = self._norm(embedding, self.pre_fc_norm_embedding)
        hidden = self._norm(hidden.to(self.dtype), self.pre_fc_norm_hidden)
        return F.linear(torch.cat([embedding, hidden], dim=-1), self.fc)  # embedding first

    def attention_inputs(self, z: Tensor, positions: Tensor, layer: int = 0) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
        """z: [n, H] residual stream, positions: [n] -> query [nh, n, dk], gate [n, nh d] or None,
        key [nkv, n, dk], value [nkv, n, dv] (query/key normed and rotated as the family's attention does), through
        decoder layer `layer`."""
        w = self.layers[layer]
        cos, sin = rotary_cos_sin(positions, self.inv_freq, self.dtype, self.attention_factor)
        return w.attention.project(self._norm(z, w.input_layernorm), cos, sin)

    def finish_row_states(self, z: Tensor, attn: Tensor, gate: Tensor | None, layer: int = 0) -> tuple[Tensor, Tensor]:
        """z: [n, H] residual, attn: [nh, n, dv], gate: [n, nh d] or None -> (m [n, H] post-norm, y [n, H] pre-norm)."""
        w = self.layers[layer]
        y = z + w.attention.output(attn, gate)
        y = y + w.mlp(self._norm(y, w.post_attention_layernorm))
        return self._norm(y, self.norm), y

    def finish_row(self, z: Tensor, attn: Tensor, gate: Tensor | None, layer: int = 0) -> Tensor:
        """-> m: [n, H] (post-norm): the state the logits read."""
        return self.finish_row_states(z, attn, gate, layer)[0]

    def draft_inputs(self, hidden: Tensor, tokens: Tensor, positions: Tensor, layer: int = 0):
        """One draft row through `layer` up to its attention: hidden [Q, H] (h or the fed-back state), tokens [Q],
        positions [Q] -> (z [Q, H], query [nh, Q, dk], gate [Q, nh d] or None, key [nkv, Q, dk], value [nkv, Q, dv])."""
        z = self.fc_input(hidden, tokens, positions)
        return (z, *self.attention_inputs(z, positions, layer))

    def attend_own(self, rows: RowPass, prefix: Tensor, query: Tensor, own_keys: Tensor, own_values: Tensor,
                   own_valid: Tensor | None = None, budget: int = ATTENTION_BUDGET) -> Tensor:
        """Attention of Q draft queries, each over rows 0..prefix[q]-1 of `rows` (the row pass's KV of the layer the
        queries run through) and over its own list of keys, batched in blocks of queries.

        query [nh, Q, dk]; prefix [Q] (0 allowed); own_keys [nkv, Q, n, dk] / own_values [nkv, Q, n, dv]: query q's
        own n keys (the chain's earlier steps and itself; a tree slot's history; a layer's rows of one anchor);
        own_valid [Q, n] bool (None: all) -> [nh, Q, dv]. One block-structured boolean mask over
        [prefix keys | own keys of the block]."""
        at = self.attention
        device = self.device
        Q, n = own_keys.shape[1], own_keys.shape[2]
        attn = query.new_empty(query.shape[0], Q, at.value_dim)
        if Q == 0:
            return attn
        prefix = prefix.to(device=device, dtype=torch.long).clamp(min=0)
        block = self._anchor_block(int(prefix.max()), n, budget)
        for b0 in range(0, Q, block):
            b1 = min(Q, b0 + block)
            p = prefix[b0:b1]  # [B]
            top = int(p.max())  # rows 0..max(p)-1 of the row pass
            B = b1 - b0
            # keys: [prefix rows | own keys of these B queries, n each, query-major]
            ck = own_keys[:, b0:b1].reshape(at.kv_heads, B * n, at.key_dim)
            cv = own_values[:, b0:b1].reshape(at.kv_heads, B * n, at.value_dim)
            k_all = torch.cat([rows.keys[:, :top], ck], dim=1)
            v_all = torch.cat([rows.values[:, :top], cv], dim=1)
            mask_prefix = torch.arange(top, device=device)[None, :] < p[:, None]  # row j < p
            owner = torch.arange(B, device=device).repeat_interleave(n)  # [B * n]
            mask_own = owner[None, :] == torch.arange(B, device=device)[:, None]
            if own_valid is not None:
                mask_own = mask_own & own_valid[b0:b1].to(device).reshape(-1)[None, :]
            attn[:, b0:b1] = self._attend(query[:, b0:b1], k_all, v_all, torch.cat([mask_prefix, mask_own], dim=1))
        return attn

    def _row_mask(self, q_positions: Tensor, k_positions: Tensor):
        """The row pass's causal mask. On CUDA a lower-right CausalBias (the same mask when the chunk's
        queries are the last keys) lets SDPA pick a flash / memory-efficient kernel instead of
        materialising [q, k]; elsewhere (and for MLA, whose values are narrower than its keys, which the flash
        kernels do not take) the explicit boolean mask."""
        same_widths = self.attention.key_dim == self.attention.value_dim
        if self.device.type == "cuda" and _lower_right is not None and same_widths:
            return _lower_right(q_positions.shape[0], k_positions.shape[0])
        return causal_mask(q_positions, k_positions)

    def _attend(self, query: Tensor, key: Tensor, value: Tensor, mask) -> Tensor:
        """query [nh, q, dk], key [nkv, k, dk], value [nkv, k, dv], mask [q, k] bool (or a CausalBias) -> [nh, q, dv]."""
        scale = self.attention.scale
        if isinstance(mask, CausalBias):
            groups = self.geometry.num_heads // self.attention.kv_heads  # CausalBias takes no enable_gqa
            key, value = key.repeat_interleave(groups, 0), value.repeat_interleave(groups, 0)
            return F.scaled_dot_product_attention(query[None], key[None], value[None], attn_mask=mask, scale=scale)[0]
        out = F.scaled_dot_product_attention(
            query[None], key[None], value[None], attn_mask=mask[None, None], enable_gqa=True, scale=scale,
        )
        return out[0]

    def logits(self, states: Tensor) -> Tensor:
        """states: [n, H] -> [n, V] fp32. Call on chunks: this is the vocabulary-sized tensor."""
        return F.linear(states.to(self.lm_head.device), self.lm_head).float()

    # -- the two passes ----------------------------------------------------------------------

    @property
    def feeds_back_pre_norm(self) -> bool:
        return self.reading.fed_back == "pre_norm"

    @torch.no_grad()
    def row_pass(self, hidden: Tensor, next_ids: Tensor, chunk_size: int = 2048, prefix: RowPass | None = None,
                 layer: int = 0) -> RowPass:
        """Run every row i = (h_i, x_{i+1}) at position i, filling the head's KV cache chunk by chunk.

        hidden: [m, H] target post-final-norm states, next_ids: [m] the tokens after them. Without
        `prefix` these are rows 0..m-1; with it (rows 0..P-1 of the same request, computed before)
        they are rows P..P+m-1, attending to the prefix's KV, and the result holds all P+m rows.

        layer i > 0 (layer_rules.py, a Qwen head with several layers): the rows of MTP layer i, row j = (layer i-1's
        state at row j, x_{j+i+1}) at position j + i (transformers' MtpModel shifts each layer's positions by one,
        MtpCache.get_query_offset); the caller passes those states and tokens.
        """
        g, a = self.geometry, self.attention
        m = hidden.shape[0]
        assert next_ids.shape == (m,), (next_ids.shape, m)
        P = prefix.states.shape[0] if prefix is not None else 0
        n = P + m
        device = self.device
        keys = torch.empty(a.kv_heads, n, a.key_dim, dtype=self.dtype, device=device)
        values = torch.empty(a.kv_heads, n, a.value_dim, dtype=self.dtype, device=device)
        states = torch.empty(n, g.hidden_size, dtype=self.dtype, device=device)
        fed_back = torch.empty_like(states) if self.feeds_back_pre_norm else None
        if prefix is not None:
            keys[:, :P], values[:, :P], states[:P] = prefix.keys, prefix.values, prefix.states
            if fed_back is not None:
                fed_back[:P] = prefix.fed_back
        all_positions = torch.arange(n, device=device) + layer
        for c0 in range(P, n, chunk_size):
            c1 = min(n, c0 + chunk_size)
            positions = all_positions[c0:c1]
            z = self.fc_input(hidden[c0 - P : c1 - P].to(device), next_ids[c0 - P : c1 - P].to(device), positions)
            query, gate, key, value = self.attention_inputs(z, positions, layer)
            keys[:, c0:c1], values[:, c0:c1] = key, value
            attn = self._attend(query, keys[:, :c1], values[:, :c1], self._row_mask(positions, all_positions[:c1]))
            states[c0:c1], y = self.finish_row_states(z, attn, gate, layer)
            if fed_back is not None:
                fed_back[c0:c1] = y
        return RowPass(states=states, keys=keys, values=values, fed_back=fed_back)

    @staticmethod
    def rows_prefix(rows: RowPass, length: int) -> RowPass:
        """The first `length` rows (what a later request sharing those tokens can start from)."""
        return RowPass(states=rows.states[:length], keys=rows.keys[:, :length], values=rows.values[:, :length],
                       fed_back=rows.fed_back[:length] if rows.fed_back is not None else None)

    @torch.no_grad()
    def chain(
        self,
        rows: RowPass,
        anchors: Tensor,
        depths: Tensor,
        attention_budget: int = ATTENTION_BUDGET,
        logits_budget: int = LOGITS_BUDGET,
        keep_states: bool = False,
        confidence: bool = False,
        p_min: float | None = None,
    ) -> Drafts:
        """Draft d_1..d_{depths[a]} at every anchor, batched over anchors (no Python loop over them).

        anchors: [A] positions p >= 1 with row p-1 in `rows`; depths: [A] in 1..K, non-increasing
        along no particular order. Step s >= 2 runs only at anchors with depths >= s. Its query
        attends to the true rows 0..p-1 (a prefix of the cache) and to its own earlier chain rows,
        expressed as one block-structured boolean mask over [prefix keys | chain keys of the block].

        confidence: also return llama.cpp's p of every draft (module doc). p_min (implies confidence):
        stop drafting at an anchor at the first step whose draft has p < p_min, dropping that draft
        (tokens -1 from there, `drafted` the drafts kept); p_min = 0 drafts exactly as without it.
        """
        confidence = confidence or p_min is not None
        g = self.geometry
        device = self.device
        anchors = anchors.to(device=device, dtype=torch.long)
        depths = depths.to(device=device, dtype=torch.long)
        A = anchors.shape[0]
        K = int(depths.max()) if A else 0
        assert A == 0 or int(anchors.min()) >= 1, "anchor p needs row p-1"
        assert A == 0 or int(anchors.max()) <= rows.states.shape[0], "anchor p needs row p-1 in the row pass"
        out = _ChainOut.empty(A, K, g.hidden_size, self.dtype, device, keep_states, confidence, p_min)
        tokens, logprobs, kept, sure, stopped = out.tokens, out.logprobs, out.kept, out.sure, out.stopped
        if A == 0:
            return out.drafts(anchors, depths)

        # Step 1: the row pass already holds m_{p-1} (and y_{p-1} when the reading feeds y back).
        m = rows.states[anchors - 1]  # [A, H]
        state = rows.fed_back[anchors - 1] if self.feeds_back_pre_norm else m  # what step 2 is fed
        if kept is not None:
            kept[:, 0] = m
        first = self._argmax_chunked(m, logits_budget, confidence)
        tokens[:, 0], logprobs[:, 0] = first[0], first[1]
        if confidence:
            sure[:, 0] = first[2]
            out.stop_low(torch.arange(A, device=device), 1)
        at = self.attention
        chain_keys = torch.empty(at.kv_heads, A, max(K - 1, 1), at.key_dim, dtype=self.dtype, device=device)
        chain_values = torch.empty(at.kv_heads, A, max(K - 1, 1), at.value_dim, dtype=self.dtype, device=device)

        # Steps 2..K over the anchors still drafting: each query sees rows 0..p-1 and its own chain rows.
        for step in range(2, K + 1):
            alive = torch.nonzero((depths >= step) & ~stopped).squeeze(1)  # [A_s] indices into anchors
            if alive.numel() == 0:
                break
            a_pos = anchors[alive]
            z, query, gate, key, value = self.draft_inputs(state[alive], tokens[alive, step - 2], a_pos + step - 2)
            chain_keys[:, alive, step - 2] = key
            chain_values[:, alive, step - 2] = value
            attn = self.attend_own(rows, a_pos, query, chain_keys[:, alive, : step - 1], chain_values[:, alive, : step - 1],
                                   budget=attention_budget)
            new_m, new_y = self.finish_row_states(z, attn, gate)
            state = state.clone()
            state[alive] = new_y if self.feeds_back_pre_norm else new_m
            drafted = self._argmax_chunked(new_m, logits_budget, confidence)
            tokens[alive, step - 1], logprobs[alive, step - 1] = drafted[0], drafted[1]
            if confidence:
                sure[alive, step - 1] = drafted[2]
                out.stop_low(alive, step)
            if kept is not None:
                kept[alive, step - 1] = new_m
        return out.drafts(anchors, depths)

    @torch.no_grad()
    def decode_step(self, rows: RowPass, prefix: int, hidden: Tensor, tokens: Tensor, positions: Tensor):
        """One serving-style draft step for B independent queries, each seeing rows 0..prefix-1 and itself.

        hidden: [B, H] (h, or the fed-back state), tokens: [B], positions: [B] ->
        (states [B, H] post-norm m, argmax ids [B], their log-softmax [B]). What `probe` times as one draft step.
        """
        B = hidden.shape[0]
        z = self.fc_input(hidden, tokens.to(self.device), positions)
        query, gate, key, value = self.attention_inputs(z, positions.to(self.device))
        k_all = torch.cat([rows.keys[:, :prefix], key], dim=1)
        v_all = torch.cat([rows.values[:, :prefix], value], dim=1)
        own = torch.eye(B, dtype=torch.bool, device=self.device)
        mask = torch.cat([torch.ones(B, prefix, dtype=torch.bool, device=self.device), own], dim=1)
        states = self.finish_row(z, self._attend(query, k_all, v_all, mask), gate)
        ids, lps = self._argmax_chunked(states, LOGITS_BUDGET)
        return states, ids, lps

    def _anchor_block(self, max_prefix: int, n_chain: int, budget: int) -> int:
        return anchor_block(self.geometry.num_heads, max_prefix, n_chain, budget)

    def topk_chunked(self, states: Tensor, k: int, budget: int = LOGITS_BUDGET) -> tuple[Tensor, Tensor, Tensor]:
        """states: [n, H] -> (ids [n, k] int64, probabilities [n, k] fp32, log-probabilities [n, k] fp32): the k most
        likely tokens of the temperature-1 softmax of the head's logits, most likely first (SGLang's tree scores:
        `fast_topk(softmax(logits), topk)`, sglang/srt/speculative/eagle_worker_v2.py:881-888), vocabulary chunked."""
        n = states.shape[0]
        rows = max(1, budget // self.geometry.vocab_size)
        ids = torch.empty(n, k, dtype=torch.long, device=self.device)
        lps = torch.empty(n, k, dtype=torch.float32, device=self.device)
        for r0 in range(0, n, rows):
            logits = self.logits(states[r0 : r0 + rows])
            top, idx = logits.topk(k, dim=-1)
            ids[r0 : r0 + rows] = idx
            lps[r0 : r0 + rows] = top - torch.logsumexp(logits, dim=-1, keepdim=True)
        return ids, lps.exp(), lps

    def _argmax_chunked(self, states: Tensor, budget: int, confidence: bool = False) -> tuple[Tensor, ...]:
        """states: [n, H] -> (argmax token [n] int64, its log-softmax [n] fp32[, llama.cpp's p [n] fp64 when
        confidence]), vocab chunked by rows."""
        n = states.shape[0]
        rows = max(1, budget // self.geometry.vocab_size)
        ids = torch.empty(n, dtype=torch.long, device=self.device)
        lps = torch.empty(n, dtype=torch.float32, device=self.device)
        sure = torch.empty(n, dtype=torch.float64, device=self.device) if confidence else None
        for r0 in range(0, n, rows):
            logits = self.logits(states[r0 : r0 + rows])
            best, idx = logits.max(dim=-1)
            ids[r0 : r0 + rows] = idx
            if sure is not None:
                sure[r0 : r0 + rows] = draft_confidence(logits)
            lps[r0 : r0 + rows] = -log_sum_exp_shifted_(logits, best)
        return (ids, lps) if sure is None else (ids, lps, sure)


def draft_confidence(logits: Tensor) -> Tensor:
    """logits [n, V] -> [n] float64: llama.cpp's probability of the argmax draft, the softmax at temperature 1
    over the DRAFT_TOP_K largest logits (module doc): 1 / Σ_{j < 10} exp(l_(j) - l_(0)).

    Worked example, logits (5, 4, 3) and 997 more at 0: the top ten are (5, 4, 3, 0 x 7), so
    p = 1 / (1 + e^-1 + e^-2 + 7 e^-5) = 0.645, where the whole vocabulary's softmax gives 0.122 — llama.cpp's
    sampler truncates before it normalises.
    """
    top = logits.topk(min(DRAFT_TOP_K, logits.shape[-1]), dim=-1).values.double()  # sorted, descending
    return 1.0 / torch.exp(top - top[:, :1]).sum(dim=-1)


def log_sum_exp_shifted_(logits: Tensor, rowmax: Tensor) -> Tensor:
    """log Σ exp(logits - rowmax) per row, computing in place (logits [n, V] is consumed, rowmax [n]
    its row maxima): logsumexp without another pass for the maxima or another [n, V] buffer."""
    return logits.sub_(rowmax[:, None]).exp_().sum(-1).log_()


# Kept in fp32 whatever the run's dtype, as transformers keeps them (`_keep_in_fp32_modules_strict`,
# modeling_deepseek_v3.py:551) and vLLM's GLM gate is fp32 (glm4_moe.py:141-150): the grouped router's weight and bias.
FP32_SUFFIXES = (".gate.e_score_correction_bias",)


def build_head(geometry: HeadGeometry, head_tensors: dict[str, Tensor], embed_tokens: Tensor, lm_head: Tensor,
               reading: HeadReading | None = None) -> MtpHead:
    """The head on the device and dtype of the borrowed lm_head (the last device under a device map,
    where the target's final hidden states come out); a NextN head as `reading` says its engine runs it."""
    dtype, device = lm_head.dtype, lm_head.device
    grouped = geometry.moe is not None and geometry.moe.routing == "sigmoid_grouped"
    keep = FP32_SUFFIXES + ((".gate.weight",) if grouped else ())
    tensors = {k: v.to(device=device, dtype=torch.float32 if ("." + k).endswith(keep) else dtype)
               for k, v in head_tensors.items()}
    return MtpHead(geometry, tensors, embed_tokens, lm_head, reading).eval()
