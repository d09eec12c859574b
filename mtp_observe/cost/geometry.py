"""The geometry: the bytes and parameters a target step and a draft step read, from tensors or a config alone.

Contract: `geometry_of_checkpoint(info)` and `geometry_from_tensors(...)` -> Geometry (stored in run.json as
`model.cost_geometry`, so a report needs no checkpoint); `config_tensors` / `nextn_config_tensors` list a family's
tensors from its config (no checkpoint needed: benchmarks/replica_memory.py); `bytes_at(entries, precision)` and
`step_bytes` count tensors' bytes at a serving precision (`PRECISIONS`: bits per matrix weight and per vector
element; block scales belong to their format's bits). Pure Python; no torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, asdict, dataclass, fields, replace

from ..model.checkpoint import SCALE_SUFFIX, TensorEntry

KV_BYTES = 2


SSM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Geometry:
    """Bytes (at the serving precision) and parameters of the target and the head, by what a step reads.

    Built from the checkpoint's tensors (`geometry_from_tensors`) or from a config alone (`config_tensors`).
    Stored in run.json as `model.cost_geometry` (a dict of these fields), so a report needs no checkpoint.
    """

    precision: str  # "BF16", or "stored" for block-FP8 checkpoints (the bytes as in the files, scales included)
    fp8: bool  # weights in FP8: the FP8 peak applies
    dense_bytes: int  # target tensors a step reads whole (everything but routed experts and the embedding; lm_head in)
    embedding_row_bytes: int  # one row of an untied embedding table (gathered per token); 0 when tied
    expert_bytes: int  # one routed expert of one target MoE layer (gate, up, down; their scales)
    moe_layers: int  # target layers with routed experts (0: dense)
    experts: int  # E (0: dense)
    top_k: int  # k routed experts per token
    dense_params: int  # target parameters every token multiplies by, lm_head included, embedding and routed experts not
    expert_params: int  # one routed expert
    lm_head_bytes: int
    lm_head_params: int
    head_dense_bytes: int  # the head's tensors but its routed experts (lm_head and embedding are borrowed: not here)
    head_dense_params: int
    head_expert_bytes: int  # one routed expert of the head's MoE block; 0 for a dense head
    head_expert_params: int
    head_experts: int  # E of the head (0: dense head)
    full_layers: int  # target full-attention layers
    num_heads: int  # nh (target and head attention)
    num_kv_heads: int  # nkv
    head_dim: int  # d
    linear_layers: int  # target Gated DeltaNet layers
    linear_key_heads: int
    linear_value_heads: int
    linear_key_dim: int
    linear_value_dim: int
    conv_kernel: int
    ssm_bytes: int  # bytes per recurrent-state element (mamba_ssm_dtype)
    vocab_size: int = 0
    hidden_size: int = 0
    kv_width: int = 0  # elements one token caches per attention layer; 0: 2 · nkv · d (MLA: kv_lora_rank + qk_rope)
    attention_width: int = 0  # per head, the widths a cached token is multiplied by (QKᵀ and PV); 0: 2 · d

    # -- per sequence --------------------------------------------------------------------------

    @property
    def kv_elements(self) -> int:
        """One token's cache of one attention layer: 2 (K and V) · nkv · d, or the MLA latent and rope key."""
        return self.kv_width or 2 * self.num_kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """Target KV cache per token: kv_elements · KV_BYTES per full-attention layer."""
        return self.full_layers * self.kv_elements * KV_BYTES

    @property
    def head_kv_bytes_per_token(self) -> int:
        return self.kv_elements * KV_BYTES

    @property
    def attention_flops_per_key(self) -> float:
        """FLOPs one query spends on one cached token in one layer: 2 · nh · attention width (4 · nh · d for GQA)."""
        return 2.0 * self.num_heads * (self.attention_width or 2 * self.head_dim)

    @property
    def state_bytes(self) -> int:
        """One Gated DeltaNet layer's recurrent state of one sequence: nv · dk · dv · SSM bytes."""
        return self.linear_value_heads * self.linear_key_dim * self.linear_value_dim * self.ssm_bytes

    @property
    def conv_dim(self) -> int:
        return 2 * self.linear_key_heads * self.linear_key_dim + self.linear_value_heads * self.linear_value_dim

    @property
    def active_params(self) -> int:
        """Parameters one token multiplies by (routed experts at top-k)."""
        return self.dense_params + self.top_k * self.expert_params * self.moe_layers

    @property
    def weight_bytes(self) -> int:
        """Every weight the target and the head hold at this precision (the embedding whole; no copies)."""
        return (self.dense_bytes + self.embedding_row_bytes * self.vocab_size + self.expert_bytes * self.moe_layers * self.experts
                + self.head_dense_bytes + self.head_expert_bytes * self.head_experts)

    @property
    def total_params(self) -> int:
        """Parameters of the target (embedding and lm_head included) and the head."""
        embedding = self.hidden_size * self.vocab_size if self.embedding_row_bytes else 0
        return (self.dense_params + embedding + self.expert_params * self.moe_layers * self.experts + self.head_dense_params
                + self.head_expert_params * self.head_experts)

    def as_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "Geometry":
        """run.json's model.cost_geometry -> Geometry; ValueError naming what is missing."""
        required = [f.name for f in fields(Geometry) if f.default is MISSING]
        missing = [n for n in required if n not in d]
        if missing:
            raise ValueError(f"cost_geometry lacks {', '.join(missing)}")
        return Geometry(**{f.name: d[f.name] for f in fields(Geometry) if f.name in d})


def geometry_from_tensors(text_config: dict, tensors: list, tied: bool, precision: str, fp8: bool,
                          head_prefix: str = "mtp.", skip: tuple[str, ...] = ()) -> Geometry:
    """The geometry from the checkpoint's tensor list (checkpoint.TensorEntry; names as stored) and its text config.

    Categories by name: names under `head_prefix` (`mtp.`, or a NextN layer's `model.layers.{L}.`) are the head
    (its `.mlp.experts.` routed, the rest dense; `skip`: its copies of the embedding and lm_head, which no step
    reads); of the target, `lm_head.weight` (absent when tied: the embedding), `embed_tokens.weight`, routed
    experts (`.mlp.experts.`), and everything else, read whole. Layers: `self_attn.o_proj` marks an attention
    layer, `linear_attn.out_proj` a Gated DeltaNet layer; `kv_a_proj_with_mqa` makes the attention MLA."""
    from .geometry import bytes_at

    def params(entries) -> int:
        return sum(e.numel for e in entries if not e.name.endswith("_scale_inv"))

    # A draft step runs one MTP layer (shared fc and norms, and layer 0 or layer i at step i): a head with several
    # layers is charged one layer's tensors per step (a NextN head has one layer).
    head = [e for e in tensors if e.name.startswith(head_prefix) and e.name not in skip
            and not re.match(r"mtp\.layers\.[1-9]\d*\.", e.name)]
    target = [e for e in tensors if not e.name.startswith(head_prefix) and not e.name.startswith("model.visual.")]
    embedding = [e for e in target if e.name.endswith("embed_tokens.weight")]
    assert len(embedding) == 1, [e.name for e in embedding]
    lm_head = embedding if tied else [e for e in target if e.name == "lm_head.weight"]
    assert len(lm_head) == 1, "an untied checkpoint has lm_head.weight"
    routed = [e for e in target if is_routed(e.name)]
    dense = [e for e in target if not is_routed(e.name) and e not in embedding and e not in lm_head]
    moe_layers = len({e.name.split(".mlp.experts.")[0] for e in routed if not e.name.endswith("_scale_inv")})
    experts = int(text_config.get("num_experts") or text_config.get("n_routed_experts") or 0)
    E = experts if moe_layers else 0
    k = int(text_config.get("num_experts_per_tok") or 0) if moe_layers else 0
    head_routed = [e for e in head if is_routed(e.name)]
    head_dense = [e for e in head if not is_routed(e.name)]
    head_E = experts if head_routed else 0
    layers = {"full": set(), "linear": set()}
    for e in target:
        m = re.search(r"layers\.(\d+)\.(self_attn\.o_proj|linear_attn\.out_proj)\.weight$", e.name)
        if m:
            layers["full" if m.group(2).startswith("self_attn") else "linear"].add(int(m.group(1)))
    mla = any(e.name.endswith("self_attn.kv_a_proj_with_mqa.weight") for e in target)
    kv_lora, rope = int(text_config.get("kv_lora_rank") or 0), int(text_config.get("qk_rope_head_dim") or 0)
    hidden = int(text_config["hidden_size"])
    heads = int(text_config["num_attention_heads"])
    vocab = int(embedding[0].shape[0])
    return Geometry(
        precision=precision, fp8=fp8,
        dense_bytes=bytes_at(dense + lm_head, precision),
        embedding_row_bytes=0 if tied else math.ceil(bytes_at(embedding, precision) / vocab),
        expert_bytes=round(bytes_at(routed, precision) / (moe_layers * E)) if moe_layers else 0,
        moe_layers=moe_layers, experts=E, top_k=k,
        dense_params=params(dense + lm_head),
        expert_params=round(params(routed) / (moe_layers * E)) if moe_layers else 0,
        lm_head_bytes=bytes_at(lm_head, precision), lm_head_params=params(lm_head),
        head_dense_bytes=bytes_at(head_dense, precision), head_dense_params=params(head_dense),
        head_expert_bytes=round(bytes_at(head_routed, precision) / head_E) if head_E else 0,
        head_expert_params=round(params(head_routed) / head_E) if head_E else 0,
        head_experts=head_E,
        full_layers=len(layers["full"]), num_heads=heads,
        num_kv_heads=int(text_config["num_key_value_heads"]),
        head_dim=(int(text_config["qk_nope_head_dim"]) + rope) if mla else int(text_config.get("head_dim") or hidden // heads),
        linear_layers=len(layers["linear"]),
        linear_key_heads=int(text_config.get("linear_num_key_heads") or 0),
        linear_value_heads=int(text_config.get("linear_num_value_heads") or 0),
        linear_key_dim=int(text_config.get("linear_key_head_dim") or 0),
        linear_value_dim=int(text_config.get("linear_value_head_dim") or 0),
        conv_kernel=int(text_config.get("linear_conv_kernel_dim") or 0),
        ssm_bytes=SSM_BYTES.get(str(text_config.get("mamba_ssm_dtype")), KV_BYTES),
        vocab_size=vocab, hidden_size=hidden,
        kv_width=kv_lora + rope if mla else 0, attention_width=2 * kv_lora + rope if mla else 0,
    )


def geometry_of_checkpoint(info) -> Geometry:
    """checkpoint.CheckpointInfo -> Geometry at its serving precision: the stored bytes for a block-FP8
    checkpoint, BF16 otherwise (whatever dtype the replay ran in)."""
    fp8 = info.quantization is not None
    return geometry_from_tensors(info.text_config, list(info.tensors.values()), info.tie_word_embeddings,
                                 "stored" if fp8 else "BF16", fp8, head_prefix=info.head_prefix,
                                 skip=tuple(info.head_copies))


def config_tensors(text_config: dict, family: str = "qwen3_5", tied: bool = False) -> list:
    """The tensors a Qwen3.5 (dense) or Qwen3.5-MoE checkpoint of this text config holds (names in the text
    layout, BF16), from the config alone: for worked examples at published dimensions (docs/cost.md) without
    downloading a checkpoint. tests/test_cost.py checks it against real headers of tiny checkpoints."""
    from ..model.checkpoint import TensorEntry
    from ..model.families import expected_head_shapes, geometry_from_config

    if family in ("deepseek_v3", "glm4_moe"):
        return nextn_config_tensors(text_config, family)
    c = text_config
    H, V = int(c["hidden_size"]), int(c["vocab_size"])
    nh, nkv = int(c["num_attention_heads"]), int(c["num_key_value_heads"])
    d = int(c.get("head_dim") or H // nh)
    nk, nv = int(c["linear_num_key_heads"]), int(c["linear_num_value_heads"])
    dk, dv, kernel = int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"]), int(c["linear_conv_kernel_dim"])
    L = int(c["num_hidden_layers"])
    types = c.get("layer_types") or ["full_attention" if (i + 1) % int(c.get("full_attention_interval", 4)) == 0
                                     else "linear_attention" for i in range(L)]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    if not tied:
        shapes["lm_head.weight"] = (V, H)
    for i, kind in enumerate(types):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,)}
        if kind == "full_attention":
            shapes |= {p + "self_attn.q_proj.weight": (2 * nh * d, H), p + "self_attn.k_proj.weight": (nkv * d, H),
                       p + "self_attn.v_proj.weight": (nkv * d, H), p + "self_attn.o_proj.weight": (H, nh * d),
                       p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)}
        else:
            conv_dim = 2 * nk * dk + nv * dv
            shapes |= {p + "linear_attn.in_proj_qkv.weight": (conv_dim, H), p + "linear_attn.in_proj_z.weight": (nv * dv, H),
                       p + "linear_attn.in_proj_b.weight": (nv, H), p + "linear_attn.in_proj_a.weight": (nv, H),
                       p + "linear_attn.conv1d.weight": (conv_dim, 1, kernel), p + "linear_attn.dt_bias": (nv,),
                       p + "linear_attn.A_log": (nv,), p + "linear_attn.norm.weight": (dv,),
                       p + "linear_attn.out_proj.weight": (H, nv * dv)}
        if family == "qwen3_5_moe":
            E, I, Ish = int(c["num_experts"]), int(c["moe_intermediate_size"]), int(c["shared_expert_intermediate_size"])
            shapes |= {p + "mlp.gate.weight": (E, H), p + "mlp.experts.gate_up_proj": (E, 2 * I, H),
                       p + "mlp.experts.down_proj": (E, H, I), p + "mlp.shared_expert.gate_proj.weight": (Ish, H),
                       p + "mlp.shared_expert.up_proj.weight": (Ish, H), p + "mlp.shared_expert.down_proj.weight": (H, Ish),
                       p + "mlp.shared_expert_gate.weight": (1, H)}
        else:
            I = int(c["intermediate_size"])
            shapes |= {p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I)}
    shapes |= expected_head_shapes(geometry_from_config(f"{family}_text", c))

    def entry(name, shape):
        n = math.prod(shape)
        return TensorEntry(name=name, dtype="BF16", shape=tuple(shape), nbytes=2 * n, file="")

    return [entry(n, s) for n, s in shapes.items()]


def nextn_config_tensors(text_config: dict, family: str) -> list:
    """The tensors a DeepSeek-V3 or GLM-4.5 checkpoint of this config holds (BF16, experts fused, untied; the NextN
    layer without its copies of the embedding and lm_head), from the config alone: every target layer is the
    NextN layer's decoder layer at its own index (dense MLP below first_k_dense_replace), less enorm / hnorm /
    eh_proj / shared_head.norm. tests/test_cost.py checks it against real headers of tiny checkpoints."""

    from ..model.checkpoint import TensorEntry
    from ..model.families import FAMILIES, geometry_from_config, nextn_head_shapes

    c = text_config
    g = geometry_from_config(family, c)
    H, V, L = g.hidden_size, g.vocab_size, g.layer_index
    first = c.get("first_k_dense_replace", FAMILIES[family].first_k_dense_replace)
    moe = g.moe if g.moe is not None else geometry_from_config(family, dict(c, first_k_dense_replace=0)).moe
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H)}
    only_head = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")
    for i in range(L):
        dense = i < first
        layer = replace(g, layer_index=i, moe=None if dense else moe, intermediate_size=int(c["intermediate_size"]) if dense else None)
        p = f"model.layers.{i}."
        shapes |= {n: s for n, s in nextn_head_shapes(layer, "fused").items() if n[len(p):] not in only_head}
    shapes |= nextn_head_shapes(g, "fused")

    def entry(name, shape):
        n = math.prod(shape)
        return TensorEntry(name=name, dtype="BF16", shape=tuple(shape), nbytes=2 * n, file="")

    return [entry(n, s) for n, s in shapes.items()]


# name -> (bits per matrix weight, bits per vector element)
PRECISIONS: dict[str, tuple[float, float]] = {
    "BF16": (16.0, 16.0),
    "FP8": (8.0, 16.0),
    "Q8_0": (8.5, 32.0),
    "Q6_K": (6.5625, 32.0),
    "Q4_K": (4.5, 32.0),
}


F32 = (32.0, 32.0)  # what a float32 run reads (probe's roofline on CPU)


# Matrices an FP8 release keeps in BF16.
FP8_KEEPS_BF16 = ("embed_tokens.weight", "lm_head.weight", "mtp.fc.weight", ".mlp.gate.weight", ".shared_expert_gate.weight",
                  ".eh_proj.weight", ".shared_head.head.weight")  # NextN: DeepSeek-V3's FP8 release keeps eh_proj BF16


def is_routed(name: str) -> bool:
    """A routed expert's tensor (fused stack or one expert's; their block scales too)."""
    return ".mlp.experts." in name


def _bits(e: TensorEntry, precision: str) -> float:
    if precision == "F32":
        return e.numel * F32[0]
    matrix_bits, vector_bits = PRECISIONS[precision]
    if len(e.shape) < 2:
        return e.numel * vector_bits
    if precision == "FP8" and e.name.endswith(FP8_KEEPS_BF16):
        return e.numel * 16.0
    return e.numel * matrix_bits


def bytes_at(entries: list[TensorEntry], precision: str) -> int:
    """Bytes of these tensors at a precision ("stored" = as in the checkpoint). Block scales
    (`*_scale_inv`) are counted only as stored: at a serving precision they belong to its bits."""
    if precision == "stored":
        return sum(e.nbytes for e in entries)
    return math.ceil(sum(_bits(e, precision) for e in entries if not e.name.endswith(SCALE_SUFFIX)) / 8)


def step_bytes(entries: list[TensorEntry], precision: str, routed_fraction: float) -> int:
    """Bytes a batch-1 step reads of these tensors: routed experts at routed_fraction (k/E), the rest in full."""
    routed = [e for e in entries if is_routed(e.name)]
    rest = [e for e in entries if not is_routed(e.name)]
    return bytes_at(rest, precision) + round(bytes_at(routed, precision) * routed_fraction)
