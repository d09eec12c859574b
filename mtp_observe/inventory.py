"""The inventory: what the head costs, from safetensors headers alone (`mtp-observe inspect`).

Contract: `take_inventory(CheckpointInfo)` returns counts (parameters and bytes) for the head,
the tensors it borrows (embedding, lm_head) and the whole target, at the stored dtype and at
the serving precisions below; `draft_cost` derives the roofline ratio
c = (head bytes + lm_head bytes) / (target bytes) — a draft step reads the whole head and the
whole lm_head, a target decode step reads every text weight. Answers at once on a 60 GB
checkpoint: no tensor data is read.

Precision rule (written down once): matrices (ndim >= 2) are stored at the precision's bits
per weight; vectors (norms, biases, A_log, ...) stay at F32 in the GGUF k-quants and Q8_0, and
at BF16 otherwise — as llama.cpp and the FP8 checkpoints keep them.
Worked example: the 27B head (15 tensors, 405M parameters) is 810 MB in BF16 and its
lm_head 248,320 x 5,120 another 2.54 GB, over a ~54 GB target: c = 0.062.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .checkpoint import CheckpointInfo, TensorEntry

# name -> (bits per matrix weight, bits per vector element)
PRECISIONS: dict[str, tuple[float, float]] = {
    "BF16": (16.0, 16.0),
    "FP8": (8.0, 16.0),
    "Q8_0": (8.5, 32.0),
    "Q6_K": (6.5625, 32.0),
    "Q4_K": (4.5, 32.0),
}


def bytes_at(entries: list[TensorEntry], precision: str) -> int:
    """Bytes of these tensors at a precision ("stored" = as in the checkpoint)."""
    if precision == "stored":
        return sum(e.nbytes for e in entries)
    matrix_bits, vector_bits = PRECISIONS[precision]
    bits = sum(e.numel * (matrix_bits if len(e.shape) >= 2 else vector_bits) for e in entries)
    return math.ceil(bits / 8)


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

    @property
    def tied(self) -> bool:
        return self.embedding.name == self.lm_head.name

    def head_bytes(self, precision: str = "stored") -> int:
        return bytes_at(self.head, precision)

    def lm_head_bytes(self, precision: str = "stored") -> int:
        return bytes_at([self.lm_head], precision)

    def target_bytes(self, precision: str = "stored") -> int:
        return bytes_at(self.target, precision)

    def draft_cost(self, precision: str = "stored") -> float:
        """Roofline c: bytes one draft step reads over bytes one target decode step reads."""
        return (self.head_bytes(precision) + self.lm_head_bytes(precision)) / self.target_bytes(precision)


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
    }
    return Inventory(
        model=str(info.path), model_type=info.model_type, layout=info.layout, config=readings,
        head=[info.tensors[n] for n in info.head_names],
        embedding=info.tensors[info.embed_name], lm_head=info.tensors[info.lm_head_name],
        target=[info.tensors[n] for n in info.target_names],
    )


def inventory_json(inv: Inventory) -> dict:
    """The same numbers as the table, for machines. Byte counts are integers."""
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
            "draft_step_bytes": inv.head_bytes(p) + inv.lm_head_bytes(p),
            "target_bytes": inv.target_bytes(p),
            "draft_cost": inv.draft_cost(p),
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
        },
        "borrowed": borrowed,
        "target": {"tensors": len(inv.target), "params": sum(e.numel for e in inv.target), "bytes": inv.target_bytes()},
        "precisions": precisions,
    }
