"""A plain, slow MTP head written straight from MTP_HEAD.md, for tests only.

No cache, no batching, no chunking: every call rebuilds the whole row sequence and runs the
layer over all of it with a per-head loop. It shares no code with mtp_observe.model.mtp.
`Reading` switches on one wrong reading at a time (the pitfalls), so a test can show the
wrong reading gives a different answer.

A MoE head's MLP is computed densely: every expert over every row, combined with an [n, E]
routing-weight matrix that is zero where a row did not route (the product groups rows by
expert instead). Its rotary frequencies come from transformers' own rope functions
(ROPE_INIT_FUNCTIONS) when the geometry's rope type is not the default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Reading:
    concat_reversed: bool = False  # fc input [hidden, embedding]
    one_norm_over_2h: bool = False  # a single norm over the joined 2H
    plain_norm: bool = False  # x * w instead of x * (1 + w)
    pair_same_position: bool = False  # h_i with x_i instead of x_{i+1}
    global_gate_split: bool = False  # q_proj output split [all queries | all gates]
    rotate_all_dims: bool = False  # rotary over all d dims
    interleaved_rotary: bool = False  # GPT-J pairing (2i, 2i+1)
    chain_positions_fixed: bool = False  # chain rows not advanced (all at p-1)
    # MoE readings
    no_renormalise: bool = False  # top-k weights not renormalised although norm_topk_prob is true
    topk_before_softmax: bool = False  # softmax over the k largest logits only
    up_gate_swapped: bool = False  # gate_up_proj read as [up | gate]
    no_shared_sigmoid: bool = False  # the shared expert scaled by the raw gate logit
    no_shared_expert: bool = False  # the shared expert dropped


CORRECT = Reading()


def norm(x, w, eps, reading: Reading):
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y * (w if reading.plain_norm else (1.0 + w))


def rope(x, pos, d, rotary_dim, theta, reading: Reading, inv_freq=None, scale: float = 1.0):
    """x: [n, d] one head; pos: [n]; inv_freq: [rotary_dim / 2] overrides theta's plain frequencies."""
    r = d if reading.rotate_all_dims else rotary_dim
    out = x.clone()
    for i in range(r // 2):
        inv = float(inv_freq[i]) if inv_freq is not None and not reading.rotate_all_dims else theta ** (-(2 * i) / r)
        ang = pos.to(x.dtype) * inv
        c, s = torch.cos(ang) * scale, torch.sin(ang) * scale
        a, b = (2 * i, 2 * i + 1) if reading.interleaved_rotary else (i, i + r // 2)
        out[:, a] = x[:, a] * c - x[:, b] * s
        out[:, b] = x[:, b] * c + x[:, a] * s
    return out


def transformers_rope(geometry, text_config: dict):
    """(inv_freq, attention factor) from transformers' own ROPE_INIT_FUNCTIONS for a scaled rope, else (None, 1)."""
    if geometry.rope.rope_type == "default":
        return None, 1.0
    from transformers import Qwen3_5TextConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    keep = {k: v for k, v in text_config.items() if not k.startswith("mtp_") and k not in ("model_type",)}
    cfg = Qwen3_5TextConfig(**{k: v for k, v in keep.items() if k in Qwen3_5TextConfig.__dataclass_fields__ or k.startswith("rope")})
    return ROPE_INIT_FUNCTIONS[geometry.rope.rope_type](cfg)


def moe_mlp(b, W, moe, r: Reading, layer: int = 0):
    """The sparse MoE block, densely: b [n, H] -> [n, H]."""
    p = f"layers.{layer}.mlp."
    logits = b @ W[p + "gate.weight"].T  # [n, E]
    n, E = logits.shape
    k = moe.experts_per_token
    if r.topk_before_softmax:
        top, idx = torch.topk(logits, k, dim=-1)
        weights = torch.softmax(top, dim=-1)
    else:
        probs = torch.softmax(logits, dim=-1)
        weights, idx = torch.topk(probs, k, dim=-1)
        if moe.norm_topk_prob and not r.no_renormalise:
            weights = weights / weights.sum(-1, keepdim=True)
    dense = torch.zeros(n, E, dtype=b.dtype).scatter(1, idx, weights)  # 0 where a row did not route
    gate_up, down = W[p + "experts.gate_up_proj"], W[p + "experts.down_proj"]
    inter = down.shape[-1]
    out = torch.zeros_like(b)
    for e in range(E):
        gate, up = b @ gate_up[e, :inter].T, b @ gate_up[e, inter:].T
        if r.up_gate_swapped:
            gate, up = up, gate
        out = out + dense[:, e:e + 1] * ((torch.nn.functional.silu(gate) * up) @ down[e].T)
    if not r.no_shared_expert:
        shared = (torch.nn.functional.silu(b @ W[p + "shared_expert.gate_proj.weight"].T)
                  * (b @ W[p + "shared_expert.up_proj.weight"].T)) @ W[p + "shared_expert.down_proj.weight"].T
        g = b @ W[p + "shared_expert_gate.weight"].T  # [n, 1]
        out = out + (g if r.no_shared_sigmoid else torch.sigmoid(g)) * shared
    return out


class ReferenceHead:
    def __init__(self, W: dict, geometry, embed, lm_head, reading: Reading = CORRECT, dtype=torch.float32, text_config=None):
        self.dtype = dtype
        self.W = {k: v.to(dtype) for k, v in W.items()}
        self.g = geometry
        self.embed = embed.to(dtype)
        self.lm_head = lm_head.to(dtype)
        self.r = reading
        self.inv_freq, self.rope_scale = transformers_rope(geometry, text_config or {})

    def layer(self, tok, hid, pos, index: int = 0):
        """Run the head over a whole row sequence (causal in sequence order) through MTP layer `index` (fc and the
        norms are shared by every layer). tok [n], hid [n,H], pos [n] -> m [n,H]."""
        W, g, r = self.W, self.g, self.r
        L = f"layers.{index}."
        eps = g.rms_norm_eps
        e = self.embed[tok]
        if r.one_norm_over_2h:
            joined = torch.cat([e, hid.to(self.dtype)], -1)
            w = torch.cat([W["pre_fc_norm_embedding.weight"], W["pre_fc_norm_hidden.weight"]])
            x = norm(joined, w, eps, r)
            if r.concat_reversed:
                x = torch.cat([x[:, g.hidden_size:], x[:, : g.hidden_size]], -1)
        else:
            en = norm(e, W["pre_fc_norm_embedding.weight"], eps, r)
            hn = norm(hid.to(self.dtype), W["pre_fc_norm_hidden.weight"], eps, r)
            x = torch.cat([hn, en] if r.concat_reversed else [en, hn], -1)
        z = x @ W["fc.weight"].T
        n, d, nh, nkv = z.shape[0], g.head_dim, g.num_heads, g.num_kv_heads
        a = norm(z, W[L + "input_layernorm.weight"], eps, r)
        qg = a @ W[L + "self_attn.q_proj.weight"].T  # [n, 2 nh d]
        if r.global_gate_split:
            q, gate = qg[:, : nh * d].reshape(n, nh, d), qg[:, nh * d :]
        else:
            qg = qg.reshape(n, nh, 2 * d)
            q, gate = qg[:, :, :d], qg[:, :, d:].reshape(n, nh * d)
        k = (a @ W[L + "self_attn.k_proj.weight"].T).reshape(n, nkv, d)
        v = (a @ W[L + "self_attn.v_proj.weight"].T).reshape(n, nkv, d)
        heads = []
        for h in range(nh):
            kv = h // (nh // nkv)
            rot = dict(inv_freq=self.inv_freq, scale=self.rope_scale)
            qh = rope(norm(q[:, h], W[L + "self_attn.q_norm.weight"], eps, r), pos, d, g.rotary_dim, g.rope_theta, r, **rot)
            kh = rope(norm(k[:, kv], W[L + "self_attn.k_norm.weight"], eps, r), pos, d, g.rotary_dim, g.rope_theta, r, **rot)
            scores = qh @ kh.T / math.sqrt(d)
            scores = scores.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool)), float("-inf"))
            heads.append(torch.softmax(scores, -1) @ v[:, kv])
        attn = torch.cat(heads, -1)  # [n, nh d]
        z = z + (attn * torch.sigmoid(gate)) @ W[L + "self_attn.o_proj.weight"].T
        b = norm(z, W[L + "post_attention_layernorm.weight"], eps, r)
        if g.moe is not None:
            z = z + moe_mlp(b, W, g.moe, r, index)
        else:
            mlp = torch.nn.functional.silu(b @ W[L + "mlp.gate_proj.weight"].T) * (b @ W[L + "mlp.up_proj.weight"].T)
            z = z + mlp @ W[L + "mlp.down_proj.weight"].T
        return norm(z, W["norm.weight"], eps, r)

    def draft(self, hidden, ids, anchor: int, K: int):
        """Drafts at one anchor, recomputing everything from scratch at every chain step.

        hidden: [n, H] target post-norm states, ids: [n] the tokens. Returns (tokens [K], logits [K, V]).
        """
        p = anchor
        tok_rows = ids[:p] if self.r.pair_same_position else ids[1 : p + 1]  # row j pairs h_j with x_{j+1}
        hid_rows = hidden[:p].to(self.dtype)
        pos = torch.arange(p)
        tokens, logits = [], []
        m = None
        for s in range(1, K + 1):
            if s > 1:
                chain_pos = p - 1 if self.r.chain_positions_fixed else p + s - 2
                tok_rows = torch.cat([tok_rows, torch.tensor([tokens[-1]])])
                hid_rows = torch.cat([hid_rows, m[None]])
                pos = torch.cat([pos, torch.tensor([chain_pos])])
            out = self.layer(tok_rows, hid_rows, pos)
            m = out[-1]
            lg = m @ self.lm_head.T
            logits.append(lg)
            tokens.append(int(lg.argmax()))
        return tokens, torch.stack(logits)
