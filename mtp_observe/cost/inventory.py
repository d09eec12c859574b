"""The inventory: what the head costs, from safetensors headers alone (`mtp-observe inspect`).

Contract: `take_inventory(CheckpointInfo)` returns counts (parameters and bytes) for the head,
the tensors it borrows (embedding, lm_head) and the whole target, at the stored dtype and at
the serving precisions below; `draft_cost` derives the roofline ratio

    c = (head step bytes + lm_head bytes) / (target step bytes)

— a batch-1 draft step reads the whole head and the whole lm_head, a batch-1 target decode step
reads every text weight. For a MoE model a step reads only the experts its token routes to:
the top-k of E routed experts plus the shared expert, in every MoE layer of the target and in the
head's MoE block, so routed-expert tensors are charged k/E of their bytes (for one token the
expected number of distinct experts is E·(1-(1-k/E)^1) = k). Everything else (attention,
linear attention, routers, shared experts, norms, embedding, lm_head) is charged in full.
Answers at once on a 60 GB checkpoint: no tensor data is read. A NextN head (DeepSeek-V3, GLM-4.5) is the layer
`model.layers.{L}.*`; its copies of the embedding and lm_head are listed apart (`copies`) and charged to no step:
the engines run the target's. The KV cache a token costs (`kv_cache`) is the roofline's (cost.Geometry): MLA caches
kv_lora_rank + qk_rope_head_dim per layer, GQA 2 · nkv · d.

Precision rule (written down once): matrices (ndim >= 2) are stored at the precision's bits
per weight; vectors (norms, biases, A_log, ...) stay at F32 in the GGUF k-quants and Q8_0, and
at BF16 otherwise — as llama.cpp and the FP8 checkpoints keep them. Under FP8, as the official
FP8 releases keep them, the embedding, lm_head, mtp.fc, the routers (`mlp.gate`) and the
shared-expert gates stay BF16 too (ACCEPTANCE.md's roofline paragraph); "stored" is the bytes
as they lie in the files (block scales included).
Worked example: the 27B head (15 tensors, 405M parameters) is 810 MB in BF16 and its
lm_head 248,320 x 5,120 another 2.54 GB, over a ~54 GB target: c = 0.062.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..model.checkpoint import FP8_DTYPE, SCALE_SUFFIX, CheckpointInfo, Quantization, TensorEntry
from ..model.families import SparseMoe
from .geometry import PRECISIONS, bytes_at, is_routed, step_bytes


@dataclass(frozen=True)
class Inventory:
    model: str
    model_type: str
    layout: str
    config: dict  # the readings inspect shows
    head: list[TensorEntry]
    embedding: TensorEntry
    lm_head: TensorEntry  # the embedding itself when tied
    target: list[TensorEntry]  # every text weight a decode step reads (lm_head included)
    routing: tuple[int, int] | None = None  # (E, k) of the MoE layers, None for a dense model
    moe: SparseMoe | None = None  # the head's MoE block, None for a dense head
    expert_layout: str | None = None  # "fused" | "per_expert"
    quantization: Quantization | None = None
    numerics: str = ""
    head_layer: str = "mtp"  # where the head lives: "mtp" or the NextN layer's "model.layers.{L}"
    copies: list[TensorEntry] = ()  # a NextN layer's copies of the embedding / lm_head (read by no step)
    kv_cache: dict | None = None  # bytes per token of the target's and the head's KV cache (cost.Geometry)

    @property
    def tied(self) -> bool:
        return self.embedding.name == self.lm_head.name

    @property
    def routed_fraction(self) -> float:
        """k / E: the share of routed-expert bytes a one-token step reads."""
        return self.routing[1] / self.routing[0] if self.routing else 1.0

    def head_bytes(self, precision: str = "stored") -> int:
        return bytes_at(self.head, precision)

    def lm_head_bytes(self, precision: str = "stored") -> int:
        return bytes_at([self.lm_head], precision)

    def target_bytes(self, precision: str = "stored") -> int:
        return bytes_at(self.target, precision)

    def head_step_bytes(self, precision: str = "stored") -> int:
        """One draft step's head bytes: one MTP layer's (a head with several runs one of them per step)."""
        import re

        one_layer = [e for e in self.head if not re.match(r"mtp\.layers\.[1-9]\d*\.", e.name)]
        return step_bytes(one_layer, precision, self.routed_fraction)

    def target_step_bytes(self, precision: str = "stored") -> int:
        return step_bytes(self.target, precision, self.routed_fraction)

    def draft_cost(self, precision: str = "stored") -> float:
        """Roofline c: bytes one draft step reads over bytes one target decode step reads (batch 1)."""
        return (self.head_step_bytes(precision) + self.lm_head_bytes(precision)) / self.target_step_bytes(precision)

    def roofline(self, precision: str) -> dict:
        """run.json's / probe.json's roofline keys at one precision (stored, a PRECISIONS key, or F32)."""
        return {
            "precision": precision, "head_bytes": self.head_bytes(precision), "lm_head_bytes": self.lm_head_bytes(precision),
            "target_bytes": self.target_bytes(precision), "head_step_bytes": self.head_step_bytes(precision),
            "target_step_bytes": self.target_step_bytes(precision), "draft_cost": self.draft_cost(precision),
        }

    def active_params(self, entries: list[TensorEntry]) -> int:
        return sum(e.numel for e in entries if not is_routed(e.name) and not e.name.endswith(SCALE_SUFFIX)) + round(
            sum(e.numel for e in entries if is_routed(e.name) and not e.name.endswith(SCALE_SUFFIX)) * self.routed_fraction)


def take_inventory(info: CheckpointInfo) -> Inventory:
    g = info.geometry
    readings = {
        "hidden_size": g.hidden_size,
        "num_attention_heads": g.num_heads,
        "num_key_value_heads": g.num_kv_heads,
        "head_dim": g.head_dim,
        "intermediate_size": g.intermediate_size,
        "mtp_num_hidden_layers": g.num_layers,
        "tie_word_embeddings": info.tie_word_embeddings,
        "vocab_size": g.vocab_size,
        "rotary_dim": g.rotary_dim,
        "rope_theta": g.rope_theta,
        "rope_type": g.rope.rope_type,
        "mlp": g.mlp,
    }
    routing = (info.routing.num_experts, info.routing.experts_per_token) if info.routing is not None else None
    if g.moe is not None:
        readings |= {
            "num_experts": g.moe.num_experts, "num_experts_per_tok": g.moe.experts_per_token,
            "moe_intermediate_size": g.moe.moe_intermediate_size,
            "shared_expert_intermediate_size": g.moe.shared_intermediate_size, "norm_topk_prob": g.moe.norm_topk_prob,
        }
    if g.head == "nextn":  # keys added for the NextN families (the Qwen ones read as before)
        readings |= {"head_layer": g.layer_index, "attention": g.attention}
        if g.mla is not None:
            readings |= {"q_lora_rank": g.mla.q_lora_rank, "kv_lora_rank": g.mla.kv_lora_rank,
                         "qk_nope_head_dim": g.mla.qk_nope_head_dim, "qk_rope_head_dim": g.mla.qk_rope_head_dim,
                         "v_head_dim": g.mla.v_head_dim}
        else:
            readings |= {"attention_bias": g.attention_bias, "use_qk_norm": g.qk_norm}
        moe = g.moe or info.routing
        readings |= {"routing": moe.routing, "n_group": moe.n_group, "topk_group": moe.topk_group,
                     "routed_scaling_factor": moe.routed_scaling_factor}
    from .geometry import geometry_of_checkpoint

    cost = geometry_of_checkpoint(info)
    kv_cache = {"kind": "mla" if g.mla is not None else "gqa", "layers": cost.full_layers,
                "elements_per_layer": cost.kv_elements, "target_bytes_per_token": cost.kv_bytes_per_token,
                "head_bytes_per_token": cost.head_kv_bytes_per_token}
    return Inventory(
        model=str(info.path), model_type=info.model_type, layout=info.layout, config=readings,
        head=[info.tensors[n] for n in info.head_weights],
        embedding=info.tensors[info.embed_name], lm_head=info.tensors[info.lm_head_name],
        target=[info.tensors[n] for n in info.target_names],
        routing=routing, moe=g.moe, expert_layout=info.expert_layout, quantization=info.quantization,
        numerics=info.numerics("the run's dtype"),
        head_layer="mtp" if g.head == "mtp" else info.head_prefix.rstrip("."),
        copies=[info.tensors[n] for n in info.head_copies], kv_cache=kv_cache,
    )


def name_groups(names: list[str]) -> list[dict]:
    """Names with expert indices folded: [{"name": "mtp.layers.0.mlp.experts.*.gate_proj.weight", "count": 256}, ...]."""
    groups: dict[str, int] = {}
    for n in names:
        key = re.sub(r"\.experts\.\d+\.", ".experts.*.", n)
        groups[key] = groups.get(key, 0) + 1
    return [{"name": k, "count": v} for k, v in groups.items()]


def experts_summary(inv: Inventory, entries: list[TensorEntry]) -> dict:
    """Routed and shared experts of one part (target or head): bytes as stored."""
    E, k = inv.routing
    routed = [e for e in entries if is_routed(e.name)]
    layers = {re.sub(r"\.mlp\.experts\..*$", "", e.name) for e in routed}
    shared = [e for e in entries if ".mlp.shared_expert." in e.name or ".mlp.shared_experts." in e.name]
    routed_bytes = sum(e.nbytes for e in routed)
    per_expert = routed_bytes / (E * len(layers)) if layers else 0
    return {
        "moe_layers": len(layers),
        "bytes_per_expert": round(per_expert),
        "routed_bytes": routed_bytes,
        "active_routed_bytes": round(routed_bytes * k / E),
        "shared_bytes": sum(e.nbytes for e in shared),
        "total_params": sum(e.numel for e in entries if not e.name.endswith(SCALE_SUFFIX)),
        "active_params": inv.active_params(entries),
    }


def head_storage(inv: Inventory) -> dict:
    """The head's storage precision and quantisation coverage: which head tensors are FP8, which float, which scales."""
    fp8 = [e.name for e in inv.head if e.dtype == FP8_DTYPE]
    scales = [e for e in inv.head if e.name.endswith(SCALE_SUFFIX)]
    kept = [e.name for e in inv.head if e.dtype != FP8_DTYPE and not e.name.endswith(SCALE_SUFFIX)]
    dtypes: dict[str, int] = {}
    for e in inv.head:
        dtypes[e.dtype] = dtypes.get(e.dtype, 0) + 1
    float_dtypes = sorted({e.dtype for e in inv.head if e.name in set(kept)})
    if fp8:
        br, bc = inv.quantization.block
        precision = f"block-FP8 e4m3 ({br}x{bc}), {'/'.join(float_dtypes)} elsewhere"
    else:
        precision = "/".join(float_dtypes)
    return {
        "precision": precision,
        "dtypes": dtypes,
        "fp8_tensors": name_groups(fp8),
        "float_tensors": name_groups(kept),
        "scale_tensors": name_groups([e.name for e in scales]),
        "scale_dtype": "/".join(sorted({e.dtype for e in scales})) or None,
    }


def inventory_json(inv: Inventory) -> dict:
    """The same numbers as the table, for machines. Byte counts are integers (keys in docs/inspect.md)."""
    def tensor(e: TensorEntry, role: str | None = None) -> dict:
        d = {"name": e.name, "shape": list(e.shape), "dtype": e.dtype, "params": e.numel, "bytes": e.nbytes}
        return d | ({"role": role} if role else {})

    borrowed = (
        [tensor(inv.embedding, "embedding+lm_head")] if inv.tied
        else [tensor(inv.embedding, "embedding"), tensor(inv.lm_head, "lm_head")]
    )
    precisions = {}
    for p in ["stored", *PRECISIONS]:
        precisions[p] = {
            "head_bytes": inv.head_bytes(p),
            "lm_head_bytes": inv.lm_head_bytes(p),
            "draft_step_bytes": inv.head_step_bytes(p) + inv.lm_head_bytes(p),
            "target_bytes": inv.target_bytes(p),
            "head_step_bytes": inv.head_step_bytes(p),
            "target_step_bytes": inv.target_step_bytes(p),
            "draft_cost": inv.draft_cost(p),
        }
    experts = None
    if inv.routing is not None:
        E, k = inv.routing
        experts = {
            "count": E, "routed_per_token": k, "shared_per_token": 1, "layout": inv.expert_layout,
            "moe_intermediate_size": inv.config.get("moe_intermediate_size"),
            "shared_expert_intermediate_size": inv.config.get("shared_expert_intermediate_size"),
            "norm_topk_prob": inv.config.get("norm_topk_prob"),
            "target": experts_summary(inv, inv.target), "head": experts_summary(inv, inv.head),
        }
    q = inv.quantization
    quantization = None if q is None else {
        "method": q.method, "fmt": q.fmt, "weight_block_size": list(q.block), "activation_scheme": q.activation_scheme,
        "modules_to_not_convert": list(q.modules_to_not_convert),
    }
    return {
        "model": inv.model,
        "model_type": inv.model_type,
        "layout": inv.layout,
        "config": inv.config,
        "head": {
            "tensors": [tensor(e) for e in inv.head],
            "count": len(inv.head),
            "params": sum(e.numel for e in inv.head),
            "bytes": inv.head_bytes(),
            "step_bytes": inv.head_step_bytes(),
            "storage": head_storage(inv),
        },
        "borrowed": borrowed,
        "head_layer": inv.head_layer,
        "copies": [tensor(e, "not read: the engines run the target's") for e in inv.copies],
        "kv_cache": inv.kv_cache,
        "target": {"tensors": len(inv.target), "params": sum(e.numel for e in inv.target), "bytes": inv.target_bytes(),
                   "step_bytes": inv.target_step_bytes(), "active_params": inv.active_params(inv.target)},
        "experts": experts,
        "quantization": quantization,
        "numerics": inv.numerics,
        "precisions": precisions,
    }
