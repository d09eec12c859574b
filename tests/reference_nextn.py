"""Two independent NextN heads (DeepSeek-V3, GLM-4.5), for tests only; neither shares code with mtp_observe.model.mtp.

`TransformersNextn`: the head built from transformers' own classes — DeepseekV3DecoderLayer / Glm4MoeDecoderLayer
(their attention, MoE block and router) loaded with the checkpoint's tensors of the NextN layer, their RMSNorm for
enorm / hnorm / shared_head.norm, their rotary embedding — driven as the engines drive it (row i = (h_i, x_{i+1}) at
position i, embedding first; chain steps fed back as the engine reading says). It recomputes every row sequence from
scratch, no cache.

`PlainNextn`: the same head written from docs/nextn.md with a loop over heads and a dense MoE, where `Reading`
switches on one wrong reading at a time, so a test can show that the wrong reading drafts differently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def engine_switches(head) -> tuple[bool, str]:
    """(zero the embedding at position 0, the fed-back state) of a product head's engine reading."""
    return head.reading.zero_position_0_embedding, head.reading.fed_back


class _Base:
    """The row sequence, the chain and the logits, shared by both references (the row itself differs)."""

    def __init__(self, head, zero_pos0: bool, fed_back: str, lm_head):
        self.zero_pos0, self.fed_back = zero_pos0, fed_back
        self.embed = head.embed_tokens.detach().float()
        self.lm_head = lm_head.float()

    def embedding(self, tok, pos):
        e = self.embed[tok]
        if self.zero_pos0:
            e = torch.where(pos[:, None] == 0, 0.0, e)
        return e

    def draft(self, hidden, ids, anchor: int, K: int):
        """(tokens [K], logits [K, V]) at one anchor, recomputing everything at every chain step."""
        tok, hid, pos = ids[1 : anchor + 1], hidden[:anchor].float(), torch.arange(anchor)
        tokens, logits = [], []
        for s in range(1, K + 1):
            m, y = self.rows(tok, hid, pos)
            lg = m[-1] @ self.lm_head.T
            tokens.append(int(lg.argmax()))
            logits.append(lg)
            if s < K:
                fed = (y if self.fed_back == "pre_norm" else m)[-1]
                tok = torch.cat([tok, torch.tensor([tokens[-1]])])
                hid = torch.cat([hid, fed[None]])
                pos = torch.cat([pos, torch.tensor([self.chain_position(anchor, s + 1)])])
        return tokens, torch.stack(logits)

    def chain_position(self, anchor: int, step: int) -> int:
        return anchor + step - 2

    def draft_many(self, hidden, ids, anchors, K: int):
        """draft() at every anchor, step 1 of all of them from one pass over the whole request (causal: row p-1 of
        the whole equals row p-1 of the prefix) -> [(tokens [K], logits [K, V])]."""
        n = max(anchors)
        m_all, y_all = self.rows(ids[1 : n + 1], hidden[:n].float(), torch.arange(n))
        out = []
        for p in anchors:
            lg = m_all[p - 1] @ self.lm_head.T
            tokens, logits = [int(lg.argmax())], [lg]
            tok, hid, pos = ids[1 : p + 1], hidden[:p].float(), torch.arange(p)
            fed = (y_all if self.fed_back == "pre_norm" else m_all)[p - 1]
            for s in range(2, K + 1):
                tok = torch.cat([tok, torch.tensor([tokens[-1]])])
                hid = torch.cat([hid, fed[None]])
                pos = torch.cat([pos, torch.tensor([self.chain_position(p, s)])])
                m, y = self.rows(tok, hid, pos)
                lg = m[-1] @ self.lm_head.T
                tokens.append(int(lg.argmax()))
                logits.append(lg)
                fed = (y if self.fed_back == "pre_norm" else m)[-1]
            out.append((tokens, torch.stack(logits)))
        return out


# ---------------------------------------------------------------------------------------------
# transformers' own classes


class TransformersNextn(_Base):
    def __init__(self, model, zero_pos0: bool | None = None, fed_back: str | None = None):
        head, info = model.head, model.info
        z0, fb = engine_switches(head)
        super().__init__(head, z0 if zero_pos0 is None else zero_pos0, fb if fed_back is None else fed_back, head.lm_head)
        cfg, Layer, Norm, Rotary = _transformers_classes(info)
        self.cfg = cfg
        W = {k: v.detach().float() for k, v in head.named_weights().items()}
        top = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")
        # MoE at index 0: transformers' own MtpModel does the same (get_mtp_config sets first_k_dense_replace 0)
        self.layer = Layer(cfg, 0).eval()
        self.layer.load_state_dict({k: v for k, v in W.items() if k not in top})
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.enorm, self.hnorm, self.final = Norm(H, eps), Norm(H, eps), Norm(H, eps)
        for norm, name in ((self.enorm, "enorm.weight"), (self.hnorm, "hnorm.weight"), (self.final, "shared_head.norm.weight")):
            norm.weight.data = W[name]
        self.eh_proj = torch.nn.Linear(2 * H, H, bias=False)
        self.eh_proj.weight.data = W["eh_proj.weight"]
        self.rotary = Rotary(cfg)

    @torch.no_grad()
    def rows(self, tok, hid, pos):
        """The NextN layer over a row sequence (causal in sequence order) -> (m [n, H], y [n, H])."""
        z = self.eh_proj(torch.cat([self.enorm(self.embedding(tok, pos)), self.hnorm(hid)], -1))[None]
        n = z.shape[1]
        causal = torch.full((n, n), float("-inf")).triu(1)[None, None]
        y = self.layer(z, attention_mask=causal, position_ids=pos[None], position_embeddings=self.rotary(z, pos[None]))
        y = y[0] if isinstance(y, tuple) else y
        return self.final(y[0]), y[0]


def _transformers_classes(info):
    """(config with one MoE layer, decoder layer class, RMSNorm class, rotary class) for the checkpoint's family."""
    text = {k: v for k, v in info.text_config.items() if k not in ("model_type", "architectures", "quantization_config")}
    text = dict(text, num_hidden_layers=1, first_k_dense_replace=0)
    if info.model_type == "deepseek_v3":
        from transformers import DeepseekV3Config as Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
            DeepseekV3DecoderLayer as Layer,
            DeepseekV3RMSNorm as Norm,
            DeepseekV3RotaryEmbedding as Rotary,
        )
    else:
        from transformers import Glm4MoeConfig as Config
        from transformers.models.glm4_moe.modeling_glm4_moe import (
            Glm4MoeDecoderLayer as Layer,
            Glm4MoeRMSNorm as Norm,
            Glm4MoeRotaryEmbedding as Rotary,
        )
    cfg = Config(**text)
    cfg._attn_implementation = cfg._experts_implementation = "eager"
    if info.geometry.moe is None:  # a dense NextN layer (its index below first_k_dense_replace)
        cfg.first_k_dense_replace = 1
    return cfg, Layer, Norm, Rotary


# ---------------------------------------------------------------------------------------------
# Plain, with wrong readings


@dataclass(frozen=True)
class Reading:
    # the head around the layer
    concat_reversed: bool = False  # eh_proj input [hnorm(h), enorm(e)]
    norms_swapped: bool = False  # enorm applied to the hidden state, hnorm to the embedding
    zero_centred_norms: bool = False  # x * (1 + w) (Qwen's norm) for enorm, hnorm and shared_head.norm
    pair_same_position: bool = False  # h_i with x_i
    chain_positions_fixed: bool = False  # chain rows at p-1
    # MLA
    rope_split_reversed: bool = False  # the rope part taken first, the no-rope part after
    rotate_half: bool = False  # rotate-half pairs (i, i + r/2) instead of DeepSeek's GPT-J pairs
    no_mscale: bool = False  # softmax scaled by qk_head_dim^-0.5 without yarn's mscale^2
    # GQA (GLM)
    rotate_all_dims: bool = False  # rotary over all d dims, not the first partial_rotary_factor · d
    interleaved_rotary: bool = False  # GPT-J pairs instead of rotate-half
    no_attention_bias: bool = False
    no_qk_norm: bool = False
    # routing
    no_correction_bias: bool = False  # experts chosen by the raw sigmoid scores
    biased_weights: bool = False  # experts weighed by the biased scores
    no_groups: bool = False  # top-k over every expert, the groups ignored
    softmax_scores: bool = False  # softmax over the experts instead of sigmoid (vLLM's default scoring_func)
    no_routed_scaling: bool = False
    no_renormalise: bool = False
    no_shared_experts: bool = False


CORRECT = Reading()


def rms(x, w, eps, zero_centred=False):
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y * ((1.0 + w) if zero_centred else w)


def rotate(x, pos, inv_freq, scale, pairs: str):
    """x: [n, r] one head's rotary part; pairs "gptj" (2i, 2i+1) with the output de-interleaved as transformers
    does, or "half" (i, i + r/2)."""
    r = x.shape[-1]
    out = torch.empty_like(x)
    for i in range(r // 2):
        ang = pos.float() * float(inv_freq[i])
        c, s = torch.cos(ang) * scale, torch.sin(ang) * scale
        if pairs == "gptj":
            a, b = x[:, 2 * i], x[:, 2 * i + 1]
            out[:, i], out[:, r // 2 + i] = a * c - b * s, b * c + a * s
        else:
            a, b = x[:, i], x[:, i + r // 2]
            out[:, i], out[:, i + r // 2] = a * c - b * s, b * c + a * s
    return out


class PlainNextn(_Base):
    def __init__(self, model, reading: Reading = CORRECT, zero_pos0: bool | None = None, fed_back: str | None = None,
                 lm_head=None):
        head, info = model.head, model.info
        z0, fb = engine_switches(head)
        super().__init__(head, z0 if zero_pos0 is None else zero_pos0, fb if fed_back is None else fed_back,
                         head.lm_head if lm_head is None else lm_head)
        self.W = {k: v.detach().float() for k, v in head.named_weights().items()}
        self.g, self.r, self.c = head.geometry, reading, info.text_config
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        cfg = _transformers_classes(info)[0]
        rope_type = cfg.rope_parameters.get("rope_type", "default")
        if rope_type == "default":
            dim = self.g.rotary_dim
            self.inv_freq = 1.0 / (cfg.rope_parameters["rope_theta"] ** (torch.arange(0, dim, 2).float() / dim))
            self.rope_scale = 1.0
        else:
            self.inv_freq, self.rope_scale = ROPE_INIT_FUNCTIONS[rope_type](cfg)

    def chain_position(self, anchor: int, step: int) -> int:
        return anchor - 1 if self.r.chain_positions_fixed else anchor + step - 2

    def draft(self, hidden, ids, anchor: int, K: int):
        if not self.r.pair_same_position:
            return super().draft(hidden, ids, anchor, K)
        shifted = torch.cat([ids[:1], ids[:-1]])  # row j then pairs h_j with x_j
        return super().draft(hidden, shifted, anchor, K)

    def rows(self, tok, hid, pos):
        W, g, r = self.W, self.g, self.r
        eps = g.rms_norm_eps
        e = self.embedding(tok, pos)
        en_w, hn_w = (W["hnorm.weight"], W["enorm.weight"]) if r.norms_swapped else (W["enorm.weight"], W["hnorm.weight"])
        en, hn = rms(e, en_w, eps, r.zero_centred_norms), rms(hid, hn_w, eps, r.zero_centred_norms)
        z = torch.cat([hn, en] if r.concat_reversed else [en, hn], -1) @ W["eh_proj.weight"].T
        a = rms(z, W["input_layernorm.weight"], eps)
        z = z + (self.mla(a, pos) if g.mla is not None else self.gqa(a, pos))
        b = rms(z, W["post_attention_layernorm.weight"], eps)
        y = z + (self.moe(b) if g.moe is not None else self.dense(b, "mlp."))
        return rms(y, W["shared_head.norm.weight"], eps, r.zero_centred_norms), y

    def _attend(self, q, k, v, scale):
        """q, k: [n, dk], v: [n, dv] one head -> [n, dv], causal."""
        n = q.shape[0]
        scores = (q @ k.T) * scale
        scores = scores.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool)), float("-inf"))
        return torch.softmax(scores, -1) @ v

    def mla(self, a, pos):
        W, g, r, m = self.W, self.g, self.r, self.g.mla
        eps, n, nh = g.rms_norm_eps, a.shape[0], g.num_heads
        if m.q_lora_rank is None:
            q = a @ W["self_attn.q_proj.weight"].T
        else:
            q = rms(a @ W["self_attn.q_a_proj.weight"].T, W["self_attn.q_a_layernorm.weight"], eps) @ W["self_attn.q_b_proj.weight"].T
        q = q.reshape(n, nh, m.qk_head_dim)
        ckv = a @ W["self_attn.kv_a_proj_with_mqa.weight"].T
        c, k_rot = ckv[:, : m.kv_lora_rank], ckv[:, m.kv_lora_rank :]
        kv = (rms(c, W["self_attn.kv_a_layernorm.weight"], eps) @ W["self_attn.kv_b_proj.weight"].T).reshape(n, nh, -1)
        pairs = "half" if r.rotate_half else "gptj"
        k_rot = rotate(k_rot, pos, self.inv_freq, self.rope_scale, pairs)
        scale = m.qk_head_dim ** -0.5
        if not r.no_mscale and g.rope.rope_type == "yarn":
            factor, all_dim = self.c["rope_scaling"]["factor"], self.c["rope_scaling"]["mscale_all_dim"]
            scale *= (0.1 * all_dim * math.log(factor) + 1.0) ** 2
        heads = []
        for h in range(nh):
            qh = q[:, h]
            if r.rope_split_reversed:
                q_rot, q_nope = qh[:, : m.qk_rope_head_dim], qh[:, m.qk_rope_head_dim :]
            else:
                q_nope, q_rot = qh[:, : m.qk_nope_head_dim], qh[:, m.qk_nope_head_dim :]
            k_nope, v = kv[:, h, : m.qk_nope_head_dim], kv[:, h, m.qk_nope_head_dim :]
            qh = torch.cat([q_nope, rotate(q_rot, pos, self.inv_freq, self.rope_scale, pairs)], -1)
            kh = torch.cat([k_nope, k_rot], -1)
            heads.append(self._attend(qh, kh, v, scale))
        return torch.cat(heads, -1) @ W["self_attn.o_proj.weight"].T

    def gqa(self, a, pos):
        W, g, r = self.W, self.g, self.r
        eps, n, nh, nkv, d = g.rms_norm_eps, a.shape[0], g.num_heads, g.num_kv_heads, g.head_dim

        def proj(name):
            out = a @ W[f"self_attn.{name}.weight"].T
            if g.attention_bias and not r.no_attention_bias:
                out = out + W[f"self_attn.{name}.bias"]
            return out

        q, k, v = proj("q_proj").reshape(n, nh, d), proj("k_proj").reshape(n, nkv, d), proj("v_proj").reshape(n, nkv, d)
        rdim = d if r.rotate_all_dims else g.rotary_dim
        inv_freq = 1.0 / (g.rope_theta ** (torch.arange(0, rdim, 2).float() / rdim)) if r.rotate_all_dims else self.inv_freq

        def prep(x, norm):
            if g.qk_norm and not r.no_qk_norm:
                x = rms(x, W[f"self_attn.{norm}.weight"], eps)
            rot = rotate(x[:, :rdim], pos, inv_freq, self.rope_scale, "gptj" if r.interleaved_rotary else "half")
            return torch.cat([rot, x[:, rdim:]], -1)

        heads = []
        for h in range(nh):
            kv = h // (nh // nkv)
            heads.append(self._attend(prep(q[:, h], "q_norm"), prep(k[:, kv], "k_norm"), v[:, kv], d ** -0.5))
        return torch.cat(heads, -1) @ W["self_attn.o_proj.weight"].T

    def dense(self, b, p):
        W = self.W
        return (F.silu(b @ W[p + "gate_proj.weight"].T) * (b @ W[p + "up_proj.weight"].T)) @ W[p + "down_proj.weight"].T

    def moe(self, b):
        W, moe, r = self.W, self.g.moe, self.r
        logits = b @ W["mlp.gate.weight"].T  # [n, E]
        n, E = logits.shape
        scores = torch.softmax(logits, -1) if r.softmax_scores else torch.sigmoid(logits)
        bias = 0.0 if r.no_correction_bias else W["mlp.gate.e_score_correction_bias"]
        choice = scores + bias
        G = 1 if r.no_groups else moe.n_group
        if G > 1:
            group_scores = choice.reshape(n, G, E // G).topk(2, -1).values.sum(-1)
            keep = group_scores.topk(moe.topk_group, -1).indices
            allowed = torch.zeros(n, G, dtype=torch.bool).scatter(1, keep, True).repeat_interleave(E // G, 1)
            choice = choice.masked_fill(~allowed, float("-inf"))
        idx = choice.topk(moe.experts_per_token, -1).indices
        weights = (scores + bias if r.biased_weights else scores).gather(1, idx)
        if moe.norm_topk_prob and not r.no_renormalise:
            weights = weights / weights.sum(-1, keepdim=True)
        if not r.no_routed_scaling:
            weights = weights * moe.routed_scaling_factor
        dense = torch.zeros(n, E).scatter(1, idx, weights)  # 0 where a row did not route
        gate_up, down = W["mlp.experts.gate_up_proj"], W["mlp.experts.down_proj"]
        inter = down.shape[-1]
        out = torch.zeros_like(b)
        for e in range(E):
            h = F.silu(b @ gate_up[e, :inter].T) * (b @ gate_up[e, inter:].T)
            out = out + dense[:, e : e + 1] * (h @ down[e].T)
        if not r.no_shared_experts:
            out = out + self.dense(b, "mlp.shared_experts.")
        return out
