"""A plain, slow MTP head written straight from MTP_HEAD.md, for tests only.

No cache, no batching, no chunking: every call rebuilds the whole row sequence and runs the
layer over all of it with a per-head loop. It shares no code with mtp_observe.mtp.
`Reading` switches on one wrong reading at a time (the pitfalls), so a test can show the
wrong reading gives a different answer.
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


CORRECT = Reading()


def norm(x, w, eps, reading: Reading):
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y * (w if reading.plain_norm else (1.0 + w))


def rope(x, pos, d, rotary_dim, theta, reading: Reading):
    """x: [n, d] one head; pos: [n]."""
    r = d if reading.rotate_all_dims else rotary_dim
    out = x.clone()
    for i in range(r // 2):
        inv = theta ** (-(2 * i) / r)
        ang = pos.to(x.dtype) * inv
        c, s = torch.cos(ang), torch.sin(ang)
        a, b = (2 * i, 2 * i + 1) if reading.interleaved_rotary else (i, i + r // 2)
        out[:, a] = x[:, a] * c - x[:, b] * s
        out[:, b] = x[:, b] * c + x[:, a] * s
    return out


class ReferenceHead:
    def __init__(self, W: dict, geometry, embed, lm_head, reading: Reading = CORRECT, dtype=torch.float32):
        self.dtype = dtype
        self.W = {k: v.to(dtype) for k, v in W.items()}
        self.g = geometry
        self.embed = embed.to(dtype)
        self.lm_head = lm_head.to(dtype)
        self.r = reading

    def layer(self, tok, hid, pos):
        """Run the head over a whole row sequence (causal in sequence order). tok [n], hid [n,H], pos [n] -> m [n,H]."""
        W, g, r = self.W, self.g, self.r
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
        a = norm(z, W["layers.0.input_layernorm.weight"], eps, r)
        qg = a @ W["layers.0.self_attn.q_proj.weight"].T  # [n, 2 nh d]
        if r.global_gate_split:
            q, gate = qg[:, : nh * d].reshape(n, nh, d), qg[:, nh * d :]
        else:
            qg = qg.reshape(n, nh, 2 * d)
            q, gate = qg[:, :, :d], qg[:, :, d:].reshape(n, nh * d)
        k = (a @ W["layers.0.self_attn.k_proj.weight"].T).reshape(n, nkv, d)
        v = (a @ W["layers.0.self_attn.v_proj.weight"].T).reshape(n, nkv, d)
        heads = []
        for h in range(nh):
            kv = h // (nh // nkv)
            qh = rope(norm(q[:, h], W["layers.0.self_attn.q_norm.weight"], eps, r), pos, d, g.rotary_dim, g.rope_theta, r)
            kh = rope(norm(k[:, kv], W["layers.0.self_attn.k_norm.weight"], eps, r), pos, d, g.rotary_dim, g.rope_theta, r)
            scores = qh @ kh.T / math.sqrt(d)
            scores = scores.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool)), float("-inf"))
            heads.append(torch.softmax(scores, -1) @ v[:, kv])
        attn = torch.cat(heads, -1)  # [n, nh d]
        z = z + (attn * torch.sigmoid(gate)) @ W["layers.0.self_attn.o_proj.weight"].T
        b = norm(z, W["layers.0.post_attention_layernorm.weight"], eps, r)
        mlp = torch.nn.functional.silu(b @ W["layers.0.mlp.gate_proj.weight"].T) * (b @ W["layers.0.mlp.up_proj.weight"].T)
        z = z + mlp @ W["layers.0.mlp.down_proj.weight"].T
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
