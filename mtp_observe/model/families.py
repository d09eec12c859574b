"""The families: the Qwen3.5 family and the NextN families as data — layouts, transformers classes, config keys — and
the head geometry.

Contract: `geometry_from_config(model_type, text_config, where)` reads a family's text config into a `HeadGeometry`
(the numbers that fix every head tensor's shape), each value checked for type and range and refused in one line
naming the key (errors.CheckpointError); `expected_head_shapes(geometry, layout)` lists the head's tensors and
their shapes (MTP_HEAD.md's tables). A family is data (`FAMILIES`), not a copy of the head: which layout, which
transformers class, whether the head's MLP is dense or a sparse MoE block, which config key holds the head's depth.

  qwen3_5           dense, vision-language wrapper: text under `model.language_model.*`,
                    vision under `model.visual.*`, config in `text_config`
  qwen3_5_text      dense, text-only: `model.*`
  qwen3_5_moe       MoE (35B-A3B, 122B-A10B, 397B-A17B), VLM wrapper, text_config
                    `qwen3_5_moe_text`; no dense `intermediate_size`
  qwen3_5_moe_text  MoE, text-only
  qwen3_next        Qwen3-Next (80B-A3B): text-only, untied lm_head, head depth
                    `num_nextn_predict_layers`; its MTP layer is MoE exactly when vLLM's
                    Qwen3NextDecoderLayer says so for layer index 0 (`0 not in
                    mlp_only_layers and num_experts > 0 and 1 % decoder_sparse_step == 0`;
                    vLLM `qwen3_next_mtp.py` builds it with prefix `mtp.layers.0`)
  deepseek_v3       DeepSeek-V3 / R1 (671B-A37B): text-only, untied lm_head, MLA attention, MoE with grouped
                    sigmoid routing; the NextN head is the layer `model.layers.{num_hidden_layers}` (docs/nextn.md)
  glm4_moe          GLM-4.5 / 4.5-Air / 4.6 / 4.7 (355B-A32B, 106B-A12B): text-only, GQA with partial rotary,
                    q/k/v bias and an optional qk-norm; the same NextN head layout

A NextN head's MLP is MoE or dense by its own layer index L = num_hidden_layers, as vLLM builds it
(`deepseek_v2.py:1293-1297`: `L >= first_k_dense_replace and L % moe_layer_freq == 0`; `glm4_moe.py:353-356`:
`L >= first_k_dense_replace`); SGLang forces MoE (`is_nextn`), which `head_reading` says when they differ.
`HeadReading` is what differs between the engines for one family (docs/nextn.md, "Where the engines differ").

Nothing here reads a file: checkpoint.py reads config.json and the safetensors headers and checks them against
what this module says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CheckpointError

TEXT_PREFIX = {"vlm": "model.language_model.", "text": "model."}
VISION_PREFIX = "model.visual."
HEAD_PREFIX = "mtp."


@dataclass(frozen=True)
class Family:
    """One supported model family, as data: nothing here is code that runs the head."""

    model_type: str  # config.json's top-level model_type
    layout: str  # "vlm" (text under model.language_model.*) | "text" (model.*)
    text_model_type: str  # the language model's model_type
    causal_lm: str  # the transformers class that runs the target
    head_mlp: str  # "dense" | "moe" | "by_sparse_step" (Qwen3-Next) | "by_layer_index" (NextN: vLLM's rule at index L)
    depth_key: str  # config key of the head's depth (1 in every released checkpoint)
    head: str = "mtp"  # "mtp" (Qwen: `mtp.*`) | "nextn" (`model.layers.{L}.*`, L = num_hidden_layers)
    attention: str = "gated"  # "gated" (Qwen3.5 / Qwen3-Next) | "gqa" (GLM-4.5) | "mla" (DeepSeek-V3)
    norm: str = "zero_centred"  # "zero_centred" x·(1+w) (Qwen) | "plain" x·w (DeepSeek, GLM)
    first_k_dense_replace: int = 0  # NextN: transformers' (and so vLLM's) default when config.json has no such key


FAMILIES = {f.model_type: f for f in (
    Family("qwen3_5", "vlm", "qwen3_5_text", "Qwen3_5ForCausalLM", "dense", "mtp_num_hidden_layers"),
    Family("qwen3_5_text", "text", "qwen3_5_text", "Qwen3_5ForCausalLM", "dense", "mtp_num_hidden_layers"),
    Family("qwen3_5_moe", "vlm", "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", "moe", "mtp_num_hidden_layers"),
    Family("qwen3_5_moe_text", "text", "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", "moe", "mtp_num_hidden_layers"),
    Family("qwen3_next", "text", "qwen3_next", "Qwen3NextForCausalLM", "by_sparse_step", "num_nextn_predict_layers"),
    # first_k_dense_replace: transformers' DeepseekV3Config (3) and Glm4MoeConfig (1) defaults
    Family("deepseek_v3", "text", "deepseek_v3", "DeepseekV3ForCausalLM", "by_layer_index", "num_nextn_predict_layers",
           head="nextn", attention="mla", norm="plain", first_k_dense_replace=3),
    Family("glm4_moe", "text", "glm4_moe", "Glm4MoeForCausalLM", "by_layer_index", "num_nextn_predict_layers",
           head="nextn", attention="gqa", norm="plain", first_k_dense_replace=1),
)}
SUPPORTED_MODEL_TYPES = {t: f.layout for t, f in FAMILIES.items()}


# Bounds that no released or plausible checkpoint comes near; beyond them a value is a typo.
MAX_HIDDEN = 1 << 17
MAX_HEADS = 1 << 12
MAX_HEAD_DIM = 1 << 12
MAX_INTERMEDIATE = 1 << 20
MAX_VOCAB = 1 << 23
MAX_EXPERTS = 1 << 14
MAX_LAYERS = 1 << 12
MAX_POSITIONS = 1 << 30


@dataclass(frozen=True)
class SparseMoe:
    """The numbers of a sparse MoE block: a router, E routed experts, shared experts.

    Qwen (routing "softmax"): softmax over E then top-k, one shared expert scaled by the sigmoid of its gate.
    DeepSeek-V3 / GLM-4.5 (routing "sigmoid_grouped"): sigmoid scores, the e_score_correction_bias for the choice
    only, n_group groups scored by their top-2, topk_group of them kept, top-k within; weights the unbiased
    scores, renormalised when norm_topk_prob, times routed_scaling_factor; the shared experts added ungated.
    """

    num_experts: int  # E
    experts_per_token: int  # k (num_experts_per_tok)
    moe_intermediate_size: int  # I_moe, one routed expert
    shared_intermediate_size: int  # I_sh, the shared expert(s) (NextN: moe_intermediate_size * n_shared_experts)
    norm_topk_prob: bool  # renormalise the top-k weights to sum to 1
    routing: str = "softmax"  # "softmax" | "sigmoid_grouped"
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    shared_gate: bool = True  # Qwen's sigmoid shared_expert_gate; False: the shared experts are added as they are


@dataclass(frozen=True)
class RopeScaling:
    """The target's rope_parameters beyond theta and the partial rotary factor (the head applies the same)."""

    rope_type: str = "default"  # "default" | "linear" | "yarn"
    factor: float | None = None  # linear, yarn (None: max_position_embeddings / original, as transformers)
    original_max_position_embeddings: int | None = None  # yarn
    max_position_embeddings: int | None = None
    attention_factor: float | None = None  # yarn: None derives it from factor (and mscale / mscale_all_dim)
    beta_fast: float | None = None  # yarn, default 32
    beta_slow: float | None = None  # yarn, default 1
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True


ROPE_TYPES = ("default", "linear", "yarn")


@dataclass(frozen=True)
class Mla:
    """DeepSeek's multi-head latent attention: low-rank q and kv, a rope part and a no-rope part per head."""

    q_lora_rank: int | None  # None: one q_proj [nh·qk, H] (DeepSeek-V2-Lite style)
    kv_lora_rank: int  # the compressed kv (what an engine's MLA cache holds, with the rope key)
    qk_nope_head_dim: int
    qk_rope_head_dim: int  # the rope part of q and k (one rope key shared by all heads)
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class HeadGeometry:
    """The numbers that fix every head tensor's shape, read from the text config.

    The MLP is either dense (intermediate_size) or a sparse MoE block (moe); exactly one is set. For MLA,
    head_dim is the query/key width (qk_nope + qk_rope), num_kv_heads = num_heads (the head caches its keys and
    values expanded per head) and rotary_dim = qk_rope_head_dim.
    """

    hidden_size: int  # H
    num_heads: int  # nh
    num_kv_heads: int  # nkv
    head_dim: int  # d
    intermediate_size: int | None  # I of a dense MLP; None when the head's MLP is MoE
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rotary_dim: int  # the first rotary_dim of d are rotated (partial_rotary_factor * d)
    num_layers: int  # mtp_num_hidden_layers (1 in released checkpoints)
    moe: SparseMoe | None = None
    rope: RopeScaling = field(default_factory=RopeScaling)
    head: str = "mtp"  # "mtp" | "nextn" (Family.head)
    layer_index: int = 0  # NextN: L = num_hidden_layers, the head's layer index in the engines
    attention: str = "gated"  # "gated" | "gqa" | "mla" (Family.attention)
    norm: str = "zero_centred"  # "zero_centred" | "plain"
    attention_bias: bool = False  # q/k/v biases (GLM's attention_bias)
    qk_norm: bool = True  # RMSNorm of q and k over d before RoPE (Qwen always; GLM's use_qk_norm)
    rotary_interleaved: bool = False  # GPT-J pairs (2i, 2i+1) (DeepSeek's MLA); rotate-half otherwise
    mla: Mla | None = None

    def __post_init__(self):
        assert (self.intermediate_size is None) != (self.moe is None), "a head MLP is dense or MoE, not both"
        assert (self.mla is not None) == (self.attention == "mla"), self.attention

    @property
    def mlp(self) -> str:
        return "moe" if self.moe is not None else "dense"

    @property
    def value_dim(self) -> int:
        """The width of one head's value (MLA: v_head_dim; else head_dim)."""
        return self.mla.v_head_dim if self.mla is not None else self.head_dim


@dataclass(frozen=True)
class HeadNames:
    """Where a family keeps the head's tensors, and what each role is called there.

    Roles: the embedding's norm, the hidden state's norm, the projection of their concatenation (2H -> H), the
    final norm whose output the lm_head reads, and the decoder layer's tensors under `layer`.
    """

    prefix: str  # "mtp." | "model.layers.{L}."
    layer: str  # the decoder layer's tensors under prefix + layer: "layers.0." | ""
    embedding_norm: str  # "pre_fc_norm_embedding.weight" | "enorm.weight"
    hidden_norm: str  # "pre_fc_norm_hidden.weight" | "hnorm.weight"
    fc: str  # "fc.weight" | "eh_proj.weight"
    final_norm: str  # "norm.weight" | "shared_head.norm.weight"
    copies: tuple[str, ...] = ()  # copies of the target's tensors the layer may ship; the engines use the target's


# The NextN layer's copies of the target's embedding and lm_head (DeepSeek-V3 and GLM-4.5 ship them, GLM-4.6 does not):
# vLLM loads them, then replaces both by the target's (`v1/spec_decode/llm_base_proposer.py:1500-1503, 1560-1576`);
# SGLang skips them at load (`models/deepseek_common/deepseek_weight_loader.py:319-335`) and sets the target's.
NEXTN_COPIES = ("embed_tokens.weight", "shared_head.head.weight")


def head_names(g: HeadGeometry) -> HeadNames:
    if g.head == "mtp":
        return HeadNames(HEAD_PREFIX, "layers.0.", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight",
                         "fc.weight", "norm.weight")
    return HeadNames(f"model.layers.{g.layer_index}.", "", "enorm.weight", "hnorm.weight", "eh_proj.weight",
                     "shared_head.norm.weight", copies=NEXTN_COPIES)


@dataclass(frozen=True)
class HeadReading:
    """How one engine runs a family's head where the engines differ (docs/nextn.md, "Where the engines differ").

    Recorded in run.json (`head_reading`); the default engine is vLLM 0.33, whose serve line the report prints.
    """

    engine: str  # "vllm" | "sglang"
    version: str  # the engine version these readings were read from
    zero_position_0_embedding: bool  # the embedding of the row at position 0 zeroed before its norm
    fed_back: str  # chain step s >= 2 is fed "post_norm" (after the final norm, m) or "pre_norm" (the layer's output y)
    nextn_mlp: str | None = None  # NextN only: "by_layer_index" (vLLM) | "moe" (SGLang forces it)

    def as_dict(self) -> dict:
        return {"engine": self.engine, "engine_version": self.version,
                "zero_position_0_embedding": self.zero_position_0_embedding, "fed_back_state": self.fed_back,
                "nextn_mlp": self.nextn_mlp}


ENGINE_VERSIONS = {"vllm": "0.33.0", "sglang": "0.5.23"}
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}
HEAD_ENGINES = tuple(ENGINE_VERSIONS)


def head_reading(model_type: str, engine: str = "vllm") -> HeadReading:
    """What `engine` does with this family's head (docs/nextn.md has the table; file:line there and below).

    Qwen heads: both engines alike (no zeroing; the post-norm state fed back). NextN heads:
      vLLM 0.33     zeroes the embedding at position 0 (deepseek_mtp.py:122-123, glm4_moe_mtp.py:115-116); feeds
                    back the post-norm state for DeepSeek (its layer returns (y, m), deepseek_mtp.py:136-144, and
                    the proposer recycles the second, v1/spec_decode/llm_base_proposer.py:599-604, 720, 1001-1014)
                    but the pre-norm y for GLM-4.5 (glm4_moe_mtp.py:127-128 returns y alone: Glm4MoeMTPModel is not
                    in model_returns_tuple's set); builds the layer's MLP by its index L
      SGLang 0.5.23 no zeroing; feeds back the post-norm state for both (deepseek_nextn.py:234-238,
                    glm4_moe_nextn.py:111-115, speculative/eagle_worker_v2.py:866-899); forces the MLP to MoE
                    (is_nextn: models/deepseek_v2.py:2784-2792, models/glm4_moe.py:827-834)
    """
    assert engine in ENGINE_VERSIONS, engine
    family = FAMILIES[model_type]
    version = ENGINE_VERSIONS[engine]
    if family.head == "mtp":
        return HeadReading(engine, version, False, "post_norm")
    if engine == "sglang":
        return HeadReading(engine, version, False, "post_norm", "moe")
    return HeadReading(engine, version, True, "pre_norm" if model_type == "glm4_moe" else "post_norm", "by_layer_index")


# ---------------------------------------------------------------------------------------------
# The head's tensors and their shapes


def routed_expert_shapes(g: HeadGeometry, prefix: str, layout: str) -> dict[str, tuple[int, ...]]:
    """The routed experts of one MoE block under `prefix` ("mtp.layers.0.mlp."), as stored in `layout`."""
    H, m = g.hidden_size, g.moe
    E, inter = m.num_experts, m.moe_intermediate_size
    if layout == "fused":  # no .weight suffix (transformers' Qwen3_5MoeExperts parameters)
        return {prefix + "experts.gate_up_proj": (E, 2 * inter, H), prefix + "experts.down_proj": (E, H, inter)}
    shapes = {}
    for e in range(E):
        shapes |= {
            prefix + f"experts.{e}.gate_proj.weight": (inter, H),
            prefix + f"experts.{e}.up_proj.weight": (inter, H),
            prefix + f"experts.{e}.down_proj.weight": (H, inter),
        }
    return shapes


def expected_head_shapes(g: HeadGeometry, expert_layout: str = "fused") -> dict[str, tuple[int, ...]]:
    """The head's tensors and their shapes (MTP_HEAD.md's tables): 15 for a dense head; for a MoE head
    the router, the routed experts in `expert_layout` (the fused form is the one the head holds), the
    shared expert and its gate. A NextN head: `nextn_head_shapes`."""
    if g.head == "nextn":
        return nextn_head_shapes(g, expert_layout)
    H, nh, nkv, d = g.hidden_size, g.num_heads, g.num_kv_heads, g.head_dim
    shapes = {
        "mtp.pre_fc_norm_embedding.weight": (H,),
        "mtp.pre_fc_norm_hidden.weight": (H,),
        "mtp.fc.weight": (H, 2 * H),
        "mtp.norm.weight": (H,),
    }
    for i in range(g.num_layers):
        p = f"mtp.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (H,),
            p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (2 * nh * d, H),  # query and output gate, interleaved per head
            p + "self_attn.k_proj.weight": (nkv * d, H),
            p + "self_attn.v_proj.weight": (nkv * d, H),
            p + "self_attn.o_proj.weight": (H, nh * d),
            p + "self_attn.q_norm.weight": (d,),
            p + "self_attn.k_norm.weight": (d,),
        }
        if g.moe is None:
            inter = g.intermediate_size
            shapes |= {
                p + "mlp.gate_proj.weight": (inter, H),
                p + "mlp.up_proj.weight": (inter, H),
                p + "mlp.down_proj.weight": (H, inter),
            }
        else:
            sh = g.moe.shared_intermediate_size
            shapes[p + "mlp.gate.weight"] = (g.moe.num_experts, H)  # the router
            shapes |= routed_expert_shapes(g, p + "mlp.", expert_layout)
            shapes |= {
                p + "mlp.shared_expert.gate_proj.weight": (sh, H),
                p + "mlp.shared_expert.up_proj.weight": (sh, H),
                p + "mlp.shared_expert.down_proj.weight": (H, sh),
                p + "mlp.shared_expert_gate.weight": (1, H),
            }
    return shapes


def nextn_head_shapes(g: HeadGeometry, expert_layout: str = "per_expert") -> dict[str, tuple[int, ...]]:
    """The NextN layer `model.layers.{L}.*` (docs/nextn.md's table): enorm, hnorm, eh_proj, shared_head.norm, one
    decoder layer (MLA or GQA attention; MoE with the correction bias and shared experts, or dense, by the layer's
    index). Not listed: the layer's optional copies of the embedding and lm_head (NEXTN_COPIES)."""
    H, nh, nkv, d = g.hidden_size, g.num_heads, g.num_kv_heads, g.head_dim
    p = head_names(g).prefix
    shapes = {p + "enorm.weight": (H,), p + "hnorm.weight": (H,), p + "eh_proj.weight": (H, 2 * H),
              p + "shared_head.norm.weight": (H,),
              p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,)}
    a = p + "self_attn."
    if g.mla is not None:
        m = g.mla
        if m.q_lora_rank is None:
            shapes[a + "q_proj.weight"] = (nh * m.qk_head_dim, H)
        else:
            shapes |= {a + "q_a_proj.weight": (m.q_lora_rank, H), a + "q_a_layernorm.weight": (m.q_lora_rank,),
                       a + "q_b_proj.weight": (nh * m.qk_head_dim, m.q_lora_rank)}
        shapes |= {a + "kv_a_proj_with_mqa.weight": (m.kv_lora_rank + m.qk_rope_head_dim, H),
                   a + "kv_a_layernorm.weight": (m.kv_lora_rank,),
                   a + "kv_b_proj.weight": (nh * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
                   a + "o_proj.weight": (H, nh * m.v_head_dim)}
    else:
        shapes |= {a + "q_proj.weight": (nh * d, H), a + "k_proj.weight": (nkv * d, H), a + "v_proj.weight": (nkv * d, H),
                   a + "o_proj.weight": (H, nh * d)}
        if g.attention_bias:
            shapes |= {a + "q_proj.bias": (nh * d,), a + "k_proj.bias": (nkv * d,), a + "v_proj.bias": (nkv * d,)}
        if g.qk_norm:
            shapes |= {a + "q_norm.weight": (d,), a + "k_norm.weight": (d,)}
    if g.moe is None:
        inter = g.intermediate_size
        shapes |= {p + "mlp.gate_proj.weight": (inter, H), p + "mlp.up_proj.weight": (inter, H),
                   p + "mlp.down_proj.weight": (H, inter)}
    else:
        sh = g.moe.shared_intermediate_size
        shapes |= {p + "mlp.gate.weight": (g.moe.num_experts, H), p + "mlp.gate.e_score_correction_bias": (g.moe.num_experts,)}
        shapes |= routed_expert_shapes(g, p + "mlp.", expert_layout)
        shapes |= {p + "mlp.shared_experts.gate_proj.weight": (sh, H), p + "mlp.shared_experts.up_proj.weight": (sh, H),
                   p + "mlp.shared_experts.down_proj.weight": (H, sh)}
    return shapes


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# ---------------------------------------------------------------------------------------------
# Config values: the right type, in range (one line naming the key otherwise)


class _Config:
    """Typed reads of one config dict, each refusing a wrong value in one line naming the key."""

    def __init__(self, values: dict, where: Path, scope: str = ""):
        self.values, self.where, self.scope = values, where, scope

    def fail(self, key: str, what: str) -> CheckpointError:
        return CheckpointError(f"{self.where}: {self.scope}{key} {what}; restore the checkpoint's config.json")

    def int(self, key: str, lo: int = 1, hi: int = MAX_HIDDEN, default=None, required: bool = True):
        v = self.values.get(key, default)
        if v is None:
            if required:
                raise CheckpointError(f"{self.where}: text config has no {key}; restore the checkpoint's config.json")
            return None
        if not _is_int(v):
            raise self.fail(key, f"is {v!r} ({type(v).__name__}), expected an integer")
        if not lo <= v <= hi:
            raise self.fail(key, f"is {v:,}, expected {lo:,}..{hi:,}")
        return v

    def number(self, key: str, default=None, positive: bool = True, below: float | None = None, required=True):
        v = self.values.get(key, default)
        if v is None:
            if required:
                raise CheckpointError(f"{self.where}: text config has no {key}; restore the checkpoint's config.json")
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.fail(key, f"is {v!r} ({type(v).__name__}), expected a number")
        if not math.isfinite(v):
            raise self.fail(key, f"is {v}, expected a finite number")
        if positive and v <= 0:
            raise self.fail(key, f"is {v}, expected a positive number")
        if below is not None and v >= below:
            raise self.fail(key, f"is {v}, expected less than {below}")
        return float(v)

    def bool(self, key: str, default: bool) -> bool:
        v = self.values.get(key, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.fail(key, f"is {v!r}, expected true or false")
        return v


def _rope(cfg: _Config, head_dim: int, partial: float = 0.25) -> tuple[float, int, RopeScaling]:
    """(rope_theta, rotary_dim, the scaling), from rope_parameters (transformers 5), the older rope_scaling,
    and the flat keys, the way transformers' standardize_rope_params merges them; `partial`: the family's
    partial_rotary_factor when the config has none (Qwen3.5 0.25, GLM-4.5 0.5, DeepSeek's rope part 1.0)."""
    tc = cfg.values
    rp = tc.get("rope_parameters")
    if rp is None:
        rp = tc.get("rope_scaling")
    if rp is None:
        rp = {}
    if not isinstance(rp, dict):
        raise cfg.fail("rope_parameters", f"is {type(rp).__name__}, expected an object")
    if any(isinstance(v, dict) for v in rp.values()):
        raise cfg.fail("rope_parameters", "are nested per layer type, which none of the supported families uses")
    merged = {"rope_theta": tc.get("rope_theta", 10000.0), "partial_rotary_factor": tc.get("partial_rotary_factor", partial)}
    merged |= {k: v for k, v in rp.items() if v is not None}
    r = _Config(merged, cfg.where, cfg.scope + "rope_parameters.")
    theta = r.number("rope_theta")
    factor = r.number("partial_rotary_factor")
    if factor > 1:
        raise r.fail("partial_rotary_factor", f"is {factor}, expected at most 1")
    rotary_dim = int(head_dim * factor)
    if rotary_dim < 2 or rotary_dim % 2:
        raise r.fail("partial_rotary_factor", f"{factor} gives {rotary_dim} rotary dims of head_dim {head_dim}; "
                                              "expected an even number of at least 2")
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if not isinstance(rope_type, str):
        raise r.fail("rope_type", f"is {rope_type!r}, expected a string")
    if rope_type not in ROPE_TYPES:
        raise CheckpointError(
            f"{cfg.where}: rope_type {rope_type!r} is not implemented for the MTP head (it implements "
            f"{', '.join(ROPE_TYPES)}); the head would not see the positions the target sees"
        )
    max_pos = _Config(tc, cfg.where, cfg.scope).int("max_position_embeddings", 1, MAX_POSITIONS, required=False)
    scaling = RopeScaling()
    if rope_type == "linear":
        scaling = RopeScaling("linear", factor=r.number("factor"))
    elif rope_type == "yarn":
        if "factor" not in rp:
            raise r.fail("factor", "is missing (yarn needs it)")
        original = r.int("original_max_position_embeddings", 1, MAX_POSITIONS, default=max_pos)
        scaling = RopeScaling(
            "yarn", factor=r.number("factor", required=False), original_max_position_embeddings=original,
            max_position_embeddings=max_pos, attention_factor=r.number("attention_factor", required=False),
            beta_fast=r.number("beta_fast", required=False), beta_slow=r.number("beta_slow", required=False),
            mscale=r.number("mscale", required=False, positive=False),
            mscale_all_dim=r.number("mscale_all_dim", required=False, positive=False),
            truncate=r.bool("truncate", True),
        )
        if scaling.factor is None and max_pos is None:
            raise r.fail("factor", "is null and there is no max_position_embeddings to derive it from")
    return theta, rotary_dim, scaling


def _moe(cfg: _Config) -> SparseMoe:
    E = cfg.int("num_experts", 1, MAX_EXPERTS)
    k = cfg.int("num_experts_per_tok", 1, MAX_EXPERTS)
    if k > E:
        raise cfg.fail("num_experts_per_tok", f"is {k}, more than num_experts ({E})")
    return SparseMoe(
        num_experts=E, experts_per_token=k,
        moe_intermediate_size=cfg.int("moe_intermediate_size", 1, MAX_INTERMEDIATE),
        shared_intermediate_size=cfg.int("shared_expert_intermediate_size", 1, MAX_INTERMEDIATE),
        norm_topk_prob=cfg.bool("norm_topk_prob", True),
    )


def _head_is_moe(family: Family, cfg: _Config) -> bool:
    if family.head_mlp != "by_sparse_step":
        return family.head_mlp == "moe"
    # vLLM Qwen3NextDecoderLayer with layer_idx = extract_layer_index("mtp.layers.0") = 0
    only = cfg.values.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(_is_int(i) for i in only):
        raise cfg.fail("mlp_only_layers", f"is {only!r}, expected a list of layer indices")
    step = cfg.int("decoder_sparse_step", 1, MAX_LAYERS, default=1)
    experts = cfg.values.get("num_experts", 0)
    return 0 not in only and _is_int(experts) and experts > 0 and 1 % step == 0


def _check_layers(cfg: _Config) -> None:
    """The target's layer pattern, which transformers would otherwise trip over with a traceback."""
    n = cfg.int("num_hidden_layers", 1, MAX_LAYERS)
    types = cfg.values.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n:
            raise cfg.fail("layer_types", f"must list one type per layer ({n}), found {types!r:.80}")
        for i, t in enumerate(types):
            if t not in ("linear_attention", "full_attention"):
                raise cfg.fail(f"layer_types[{i}]", f"is {t!r}, expected linear_attention or full_attention")
    else:
        cfg.int("full_attention_interval", 1, MAX_LAYERS, default=4)
    for key in ("linear_num_key_heads", "linear_num_value_heads"):
        cfg.int(key, 1, MAX_HEADS, required=False)
    for key in ("linear_key_head_dim", "linear_value_head_dim"):
        cfg.int(key, 1, MAX_HEAD_DIM, required=False)
    cfg.int("linear_conv_kernel_dim", 1, 64, required=False)


def _kv_heads_and_head_dim(cfg: _Config, H: int, nh: int) -> tuple[int, int]:
    """(num_key_value_heads, head_dim) of a grouped-query attention; head_dim defaults to hidden_size / heads."""
    nkv = cfg.int("num_key_value_heads", 1, MAX_HEADS)
    if nh % nkv:
        raise cfg.fail("num_key_value_heads", f"({nkv}) does not divide num_attention_heads ({nh})")
    d = cfg.int("head_dim", 1, MAX_HEAD_DIM, required=False)
    if d is None:
        if H % nh:
            raise cfg.fail("head_dim", f"is absent and hidden_size ({H}) is not a multiple of num_attention_heads ({nh})")
        d = H // nh
    return nkv, d


def _geometry(family: Family, text_config: dict, where: Path) -> HeadGeometry:
    if family.head == "nextn":
        return _nextn_geometry(family, text_config, where)
    cfg = _Config(text_config, where / "config.json", "text_config." if family.layout == "vlm" else "")
    H = cfg.int("hidden_size", 1, MAX_HIDDEN)
    nh = cfg.int("num_attention_heads", 1, MAX_HEADS)
    nkv, d = _kv_heads_and_head_dim(cfg, H, nh)
    vocab = cfg.int("vocab_size", 1, MAX_VOCAB)
    eps = cfg.number("rms_norm_eps", default=1e-6, below=1.0)
    act = text_config.get("hidden_act", "silu")
    if act != "silu":  # the head's MLP and experts are SwiGLU, as every Qwen3.5-family checkpoint
        raise cfg.fail("hidden_act", f"is {act!r:.40}; the Qwen3.5 family (and its MTP head) uses silu")
    theta, rotary_dim, scaling = _rope(cfg, d)
    _check_layers(cfg)
    moe = _moe(cfg) if _head_is_moe(family, cfg) else None
    inter = cfg.int("intermediate_size", 1, MAX_INTERMEDIATE) if moe is None else None
    if family.head_mlp == "by_sparse_step":  # the target's dense layers, if any, read it
        cfg.int("intermediate_size", 1, MAX_INTERMEDIATE, required=False)
    if moe is not None and family.model_type.startswith("qwen3_5_moe") and not moe.norm_topk_prob:
        raise cfg.fail("norm_topk_prob", "is false, but transformers' Qwen3_5Moe router always renormalises while vLLM "
                                         "honours the key: the target would not route as it serves")
    # Config keys transformers' config class does not declare: read with a default.
    layers = cfg.int(family.depth_key, 0, MAX_LAYERS, default=1)
    return HeadGeometry(
        hidden_size=H, num_heads=nh, num_kv_heads=nkv, head_dim=d, intermediate_size=inter, vocab_size=vocab,
        rms_norm_eps=eps, rope_theta=theta, rotary_dim=rotary_dim, num_layers=layers, moe=moe, rope=scaling,
    )


def geometry_from_config(model_type: str, text_config: dict, where: Path = Path(".")) -> HeadGeometry:
    """The head geometry a family's text config implies (what read_checkpoint validates a checkpoint against)."""
    return _geometry(FAMILIES[model_type], text_config, Path(where))


# ---------------------------------------------------------------------------------------------
# NextN families (DeepSeek-V3, GLM-4.5): config values as vLLM and transformers both read them


def _grouped_moe(family: Family, cfg: _Config) -> SparseMoe:
    """The MoE numbers of a DeepSeek-V3 / GLM-4.5 layer, refused where transformers' router (always sigmoid with the
    correction bias: DeepseekV3TopkRouter, Glm4MoeTopkRouter) would not route as vLLM serves."""
    E = cfg.int("n_routed_experts", 1, MAX_EXPERTS)
    k = cfg.int("num_experts_per_tok", 1, MAX_EXPERTS)
    groups = cfg.int("n_group", 1, MAX_EXPERTS, default=1)
    keep = cfg.int("topk_group", 1, MAX_EXPERTS, default=1)
    if E % groups:
        raise cfg.fail("n_group", f"({groups}) does not divide n_routed_experts ({E})")
    if groups > 1 and E // groups < 2:
        raise cfg.fail("n_group", f"({groups}) leaves {E // groups} expert per group; a group is scored by its top 2")
    if keep > groups:
        raise cfg.fail("topk_group", f"is {keep}, more than n_group ({groups})")
    if k > keep * (E // groups):
        raise cfg.fail("num_experts_per_tok", f"is {k}, more than the {keep * (E // groups)} experts of topk_group "
                                              f"{keep} groups of {E // groups}")
    shared = cfg.int("n_shared_experts", 1, MAX_EXPERTS)
    inter = cfg.int("moe_intermediate_size", 1, MAX_INTERMEDIATE)
    if family.model_type == "deepseek_v3":
        # vLLM DeepseekV2MoE reads the bias only for noaux_tc and scores with config.scoring_func, softmax when
        # absent (deepseek_v2.py:327-332, 387); transformers' DeepseekV3TopkRouter always adds the bias to sigmoid
        # scores (modeling_deepseek_v3.py:133-158). Anything else would route the target unlike vLLM.
        for key, want in (("topk_method", "noaux_tc"), ("scoring_func", "sigmoid")):
            if cfg.values.get(key) != want:
                raise cfg.fail(key, f"is {cfg.values.get(key)!r}, not {want!r}: transformers' DeepseekV3 router always "
                                    f"routes as noaux_tc with sigmoid scores, vLLM follows the key; the target would "
                                    "not route as it serves")
        if "routed_scaling_factor" not in cfg.values:  # vLLM getattr(..., 1.0) (deepseek_v2.py:305); transformers 2.5
            raise cfg.fail("routed_scaling_factor", "is absent: vLLM takes 1.0 and transformers' DeepseekV3Config 2.5")
    return SparseMoe(
        num_experts=E, experts_per_token=k, moe_intermediate_size=inter, shared_intermediate_size=inter * shared,
        norm_topk_prob=cfg.bool("norm_topk_prob", True), routing="sigmoid_grouped", n_group=groups, topk_group=keep,
        routed_scaling_factor=cfg.number("routed_scaling_factor", default=1.0), shared_gate=False,
    )


def _nextn_geometry(family: Family, text_config: dict, where: Path) -> HeadGeometry:
    cfg = _Config(text_config, where / "config.json")
    H = cfg.int("hidden_size", 1, MAX_HIDDEN)
    nh = cfg.int("num_attention_heads", 1, MAX_HEADS)
    L = cfg.int("num_hidden_layers", 1, MAX_LAYERS)
    vocab = cfg.int("vocab_size", 1, MAX_VOCAB)
    eps = cfg.number("rms_norm_eps", default=1e-6 if family.model_type == "deepseek_v3" else 1e-5, below=1.0)
    act = text_config.get("hidden_act", "silu")
    if act != "silu":  # vLLM refuses any other (deepseek_v2.py DeepseekV2MoE, glm4_moe.py Glm4MoE)
        raise cfg.fail("hidden_act", f"is {act!r:.40}; vLLM serves {family.model_type} with silu only")
    first = cfg.int("first_k_dense_replace", 0, MAX_LAYERS, default=family.first_k_dense_replace)
    if family.model_type == "deepseek_v3":
        freq = cfg.int("moe_layer_freq", 1, MAX_LAYERS, default=1)
        if freq != 1:  # transformers' DeepseekV3DecoderLayer has no such key: MoE at every layer >= first_k_dense_replace
            raise cfg.fail("moe_layer_freq", f"is {freq}; transformers' DeepseekV3 ignores it (MoE at every layer from "
                                             "first_k_dense_replace on) while vLLM honours it")
    moe = _grouped_moe(family, cfg)
    head_moe = L >= first
    inter = cfg.int("intermediate_size", 1, MAX_INTERMEDIATE, required=first > 0)
    common = dict(hidden_size=H, num_heads=nh, intermediate_size=None if head_moe else inter, vocab_size=vocab,
                  rms_norm_eps=eps, num_layers=cfg.int(family.depth_key, 0, MAX_LAYERS, default=1),
                  moe=moe if head_moe else None, head="nextn", layer_index=L, norm="plain")
    if family.attention == "mla":
        q_lora = cfg.int("q_lora_rank", 1, MAX_HIDDEN, required=False)
        mla = Mla(q_lora_rank=q_lora, kv_lora_rank=cfg.int("kv_lora_rank", 1, MAX_HIDDEN),
                  qk_nope_head_dim=cfg.int("qk_nope_head_dim", 1, MAX_HEAD_DIM),
                  qk_rope_head_dim=cfg.int("qk_rope_head_dim", 2, MAX_HEAD_DIM), v_head_dim=cfg.int("v_head_dim", 1, MAX_HEAD_DIM))
        if cfg.bool("attention_bias", False):  # vLLM's MLA projections have no bias (deepseek_v2.py:1051-1110)
            raise cfg.fail("attention_bias", "is true; vLLM's MLA projections carry no bias while transformers' would")
        if not cfg.bool("rope_interleave", True):  # vLLM: get_rope(..., is_neox_style=False) always (deepseek_v2.py:1122-1127)
            raise cfg.fail("rope_interleave", "is false; vLLM rotates DeepSeek's rope dims in interleaved pairs always")
        rp = text_config.get("rope_parameters") or text_config.get("rope_scaling") or {}
        if isinstance(rp, dict) and rp.get("attention_factor") is not None:
            # vLLM reads an explicit attention_factor 1.0 as deepseek_llama_scaling (deepseek_v2.py:1115-1120)
            raise cfg.fail("rope_scaling.attention_factor", "is set; only DeepSeek's yarn without it is implemented")
        theta, rotary_dim, scaling = _rope(cfg, mla.qk_rope_head_dim, partial=1.0)
        if scaling.rope_type not in ("default", "yarn"):  # vLLM turns any scaled rope into deepseek_yarn (:1115-1120)
            raise cfg.fail("rope_scaling", f"is of type {scaling.rope_type!r}; vLLM runs DeepSeek's scaled rope as "
                                           "deepseek_yarn whatever the type, so only default and yarn are read")
        if rotary_dim != mla.qk_rope_head_dim:
            raise cfg.fail("partial_rotary_factor", "is set; DeepSeek rotates the whole qk_rope_head_dim")
        return HeadGeometry(num_kv_heads=nh, head_dim=mla.qk_head_dim, rope_theta=theta, rotary_dim=rotary_dim, rope=scaling,
                            attention="mla", qk_norm=False, rotary_interleaved=True, mla=mla, **common)
    nkv, d = _kv_heads_and_head_dim(cfg, H, nh)
    theta, rotary_dim, scaling = _rope(cfg, d, partial=0.5)
    return HeadGeometry(num_kv_heads=nkv, head_dim=d, rope_theta=theta, rotary_dim=rotary_dim, rope=scaling, attention="gqa",
                        attention_bias=cfg.bool("attention_bias", False), qk_norm=cfg.bool("use_qk_norm", False), **common)
