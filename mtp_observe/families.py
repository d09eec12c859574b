"""The families: the Qwen3.5 family as data — layouts, transformers classes, config keys — and the head geometry.

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

Nothing here reads a file: checkpoint.py reads config.json and the safetensors headers and checks them against
what this module says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from .errors import CheckpointError

TEXT_PREFIX = {"vlm": "model.language_model.", "text": "model."}
VISION_PREFIX = "model.visual."
HEAD_PREFIX = "mtp."


@dataclass(frozen=True)
class Family:
    """One member of the Qwen3.5 family, as data: nothing here is code that runs the head."""

    model_type: str  # config.json's top-level model_type
    layout: str  # "vlm" (text under model.language_model.*) | "text" (model.*)
    text_model_type: str  # the language model's model_type
    causal_lm: str  # the transformers class that runs the target
    head_mlp: str  # "dense" | "moe" | "by_sparse_step" (Qwen3-Next: decoder_sparse_step / mlp_only_layers)
    depth_key: str  # config key of the head's depth (1 in every released checkpoint)


FAMILIES = {f.model_type: f for f in (
    Family("qwen3_5", "vlm", "qwen3_5_text", "Qwen3_5ForCausalLM", "dense", "mtp_num_hidden_layers"),
    Family("qwen3_5_text", "text", "qwen3_5_text", "Qwen3_5ForCausalLM", "dense", "mtp_num_hidden_layers"),
    Family("qwen3_5_moe", "vlm", "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", "moe", "mtp_num_hidden_layers"),
    Family("qwen3_5_moe_text", "text", "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", "moe", "mtp_num_hidden_layers"),
    Family("qwen3_next", "text", "qwen3_next", "Qwen3NextForCausalLM", "by_sparse_step", "num_nextn_predict_layers"),
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
    """The numbers of a sparse MoE block (router, E routed experts, one gated shared expert)."""

    num_experts: int  # E
    experts_per_token: int  # k (num_experts_per_tok)
    moe_intermediate_size: int  # I_moe, one routed expert
    shared_intermediate_size: int  # I_sh, the shared expert
    norm_topk_prob: bool  # renormalise the top-k probabilities to sum to 1


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
class HeadGeometry:
    """The numbers that fix every head tensor's shape, read from the text config.

    The MLP is either dense (intermediate_size) or a sparse MoE block (moe); exactly one is set.
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

    def __post_init__(self):
        assert (self.intermediate_size is None) != (self.moe is None), "a head MLP is dense or MoE, not both"

    @property
    def mlp(self) -> str:
        return "moe" if self.moe is not None else "dense"


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
    shared expert and its gate."""
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


def _rope(cfg: _Config, head_dim: int) -> tuple[float, int, RopeScaling]:
    """(rope_theta, rotary_dim, the scaling), from rope_parameters (transformers 5), the older rope_scaling,
    and the flat keys, the way transformers' standardize_rope_params merges them."""
    tc = cfg.values
    rp = tc.get("rope_parameters")
    if rp is None:
        rp = tc.get("rope_scaling")
    if rp is None:
        rp = {}
    if not isinstance(rp, dict):
        raise cfg.fail("rope_parameters", f"is {type(rp).__name__}, expected an object")
    if any(isinstance(v, dict) for v in rp.values()):
        raise cfg.fail("rope_parameters", "are nested per layer type, which the Qwen3.5 family does not use")
    merged = {"rope_theta": tc.get("rope_theta", 10000.0), "partial_rotary_factor": tc.get("partial_rotary_factor", 0.25)}
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


def _geometry(family: Family, text_config: dict, where: Path) -> HeadGeometry:
    cfg = _Config(text_config, where / "config.json", "text_config." if family.layout == "vlm" else "")
    H = cfg.int("hidden_size", 1, MAX_HIDDEN)
    nh = cfg.int("num_attention_heads", 1, MAX_HEADS)
    nkv = cfg.int("num_key_value_heads", 1, MAX_HEADS)
    if nh % nkv:
        raise cfg.fail("num_key_value_heads", f"({nkv}) does not divide num_attention_heads ({nh})")
    d = cfg.int("head_dim", 1, MAX_HEAD_DIM, required=False)
    if d is None:
        if H % nh:
            raise cfg.fail("head_dim", f"is absent and hidden_size ({H}) is not a multiple of num_attention_heads ({nh})")
        d = H // nh
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
