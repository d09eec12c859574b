"""The head at other precisions: which format each tensor takes, the head rebuilt from the round trip, its bytes.

Contract: `recipe(precision, shapes, vocab_hidden, tied)` says, for one what-if precision (`PRECISIONS`), the
format (quantisers.FORMATS) of every head tensor and of the borrowed embedding and lm_head, or None where the
format's usual recipe keeps the tensor as loaded; a shape the format cannot store as its tools would is one
OptionError. `head_at(head, recipe)` is the same MtpHead class holding a copy of the head's tensors passed
through their round trips (the target untouched: the copy borrows the target's embedding and lm_head unless the
recipe quantises them, and then holds its own copies); `recipe_bytes(recipe, shapes, ...)` is what a draft step
reads at that precision, for the roofline (cost.py).

What each precision quantises, and why (the format's usual recipe for the head's own weights; the borrowed
embedding and lm_head as that recipe keeps them):

    bf16    every matrix cast to bfloat16, the embedding and lm_head too (a BF16 release: the identity for a BF16
            checkpoint); vectors kept as loaded (a release may keep norms in F32, as the bundled model keeps
            mtp.norm and mtp.pre_fc_norm_hidden)
    fp8     as the released block-FP8 checkpoints (Qwen *-FP8, DeepSeek-V3): the attention and MLP projections
            and the experts (each expert's gate, up and down its own 128 x 128 blocks) in fp8_block; mtp.fc,
            the router, the shared-expert gate, the norms, the embedding and lm_head kept (BF16 in the releases;
            synthetic.fp8_quantised is the same rule, so an FP8 copy written by synthetic.write_fp8_copy and read
            through checkpoint.py serves exactly this what-if's head)
    int8    every matrix of the head (fc included) in int8_channel but the router and the shared-expert gate
            (llm-compressor's MoE recipes ignore `re:.*mlp.gate$`); embedding and lm_head kept (its recipes'
            ignore=["lm_head"]; embeddings are not Linear layers)
    nvfp4   the same tensors in nvfp4 (ModelOpt's default_disabled_quantizers.yaml keeps `*lm_head*`, `*router*`,
            `*mlp.gate.*`, `*mlp.shared_expert_gate.*`, nn.Embedding; it also keeps `mtp.*`, so no ModelOpt
            release serves an NVFP4 head: a pure what-if). Modules serving engines fuse share one weight_scale_2,
            as ModelOpt's export sets it (`preprocess_linear_fusion`, the max of their amaxes): q/k/v, the dense
            MLP's gate/up, the shared expert's gate/up, and each routed expert's gate/up (its [2I, H] slice).
            The Qwen3.5 w4a16 recipe re-enables NVFP4 on lm_head; the default preset is followed here.
    q8_0, q6_k, q4_k
            GGUF as llama-quantize writes the model without an importance matrix (src/llama-quant.cpp): every
            matrix of the head in the type named (`tensor_allows_quantization`: 2-D and 3-D weights, not the
            norms, not `ffn_gate_inp` — the router — and a [1, H] shared-expert gate is 1-D to ggml), falling
            back where the rows do not fit the block (`tensor_type_fallback`: Q4_K -> Q5_0, Q6_K -> Q8_0, then
            F16 if a row is not a multiple of 32; Q8_0 has no fallback: llama-quantize refuses such a tensor and
            so does this); `output.weight` (lm_head) as `llama_tensor_get_type_impl` sets it for those mixes —
            Q8_0 stays Q8_0, other types become Q6_K, and Q8_0 when a row is not a multiple of the type's block
            (an untied `token_embd.weight` takes the file type, with the same fallbacks; a tied one is output's).
            The head's tensors take the named type throughout: llama-quantize's Q4_K_M mix raises attn_v and
            ffn_down of the last layers to Q6_K and Q4_K_S raises the first four attn_v to Q5_K; those per-layer
            bumps are not applied (q4_k here is every head matrix at Q4_K). Norms stay F32 (as loaded here).

Dequantised values are cast to the run's dtype (float32 on a CPU, bfloat16 on a GPU), as the head runs them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import OptionError
from . import quantisers
from .formats import PRECISIONS

MATRIX_FORMAT = {"bf16": "bf16", "fp8": "fp8_block", "int8": "int8_channel", "nvfp4": "nvfp4", "q8_0": "q8_0",
                 "q6_k": "q6_k", "q4_k": "q4_k"}
GGUF_FALLBACK = {"q4_k": "q5_0", "q6_k": "q8_0"}  # llama-quant.cpp tensor_type_fallback
KEPT_MATRICES = ("mlp.gate.weight", "shared_expert_gate.weight")  # the router and the shared-expert gate
# beside KEPT_MATRICES: the released FP8 checkpoints keep mtp.fc (a NextN layer's eh_proj) in BF16
# (synthetic.FP8_MODULES, the modules a block-FP8 release stores in F8_E4M3, names neither)
FP8_KEPT = ("fc.weight", "eh_proj.weight")
FUSED_GROUPS = (("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
                ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
                ("mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight"),
                ("mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"))  # NextN's name
EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def parse_precisions(text: str) -> tuple[str, ...]:
    """'bf16,fp8,Q4_K' -> ('bf16', 'fp8', 'q4_k'): known names, lower case, in the order given, once each."""
    names = [p.strip().lower() for p in text.split(",") if p.strip()]
    unknown = [p for p in names if p not in PRECISIONS]
    if unknown or not names:
        raise OptionError(f"--head-precision {text}: {'unknown ' + ', '.join(unknown) if unknown else 'no precision'}; "
                          f"expected a comma-separated list of {', '.join(PRECISIONS)}")
    if len(set(names)) != len(names):
        raise OptionError(f"--head-precision {text}: a precision repeats; give each once")
    return tuple(names)


@dataclass(frozen=True)
class Recipe:
    """One precision's format per tensor (None: kept as loaded)."""

    precision: str
    formats: dict  # head tensor name (without "mtp.", the fused expert form) -> format name or None
    embedding: str | None
    lm_head: str | None  # a tied checkpoint's lm_head is its embedding: the same format
    tied: bool
    fallbacks: tuple[str, ...]  # where a GGUF type fell back, in words

    def as_dict(self) -> dict:
        return {"formats": dict(self.formats), "embedding": self.embedding, "lm_head": self.lm_head,
                "fallbacks": list(self.fallbacks)}


def _gguf_type(name: str, columns: int, wanted: str, fallbacks: list[str], precision: str | None = None) -> str:
    """The type llama-quantize stores a matrix of rows of `columns` values in, asked for `wanted` in a file of
    `precision` (default: wanted; the lm_head's type is chosen from the file's). llama-quant.cpp's
    llama_tensor_get_type: a type without a fallback (Q8_0 among them) throws "Unsupported tensor size
    encountered", so the refusal names the precision the user asked for, and the type its rows did not fit."""
    fmt = wanted
    precision = precision or wanted
    if columns % quantisers.FORMATS[fmt].block:
        if fmt not in GGUF_FALLBACK:
            stored = "" if precision == wanted else (
                f" (a {precision.upper()} file stores {name} as {wanted.upper()}, its rows not being a multiple of "
                f"{quantisers.FORMATS[MATRIX_FORMAT[precision]].block})")
            raise OptionError(f"--head-precision {precision}: {name} has rows of {columns} values, not a multiple of "
                              f"{quantisers.FORMATS[fmt].block}{stored}; llama-quantize has no fallback for "
                              f"{wanted.upper()} and refuses it, so there is no such file to simulate: drop it from "
                              "--head-precision")
        fmt = GGUF_FALLBACK[fmt]
        if columns % quantisers.FORMATS[fmt].block:
            fmt = "f16"
        fallbacks.append(f"{name}: rows of {columns} values, {wanted.upper()} needs a multiple of "
                         f"{quantisers.FORMATS[wanted].block}: {fmt.upper()} (llama-quantize's fallback)")
    return fmt


def recipe(precision: str, shapes: dict, vocab_hidden: tuple[int, int], tied: bool) -> Recipe:
    """shapes: the head's tensors (names without "mtp.", experts fused: families.expected_head_shapes)."""
    assert precision in PRECISIONS, precision
    matrix = MATRIX_FORMAT[precision]
    fallbacks: list[str] = []
    formats = {}
    for name, shape in shapes.items():
        if len(shape) < 2:
            formats[name] = None  # norms: every format keeps them (BF16 or F32 in the releases, F32 in GGUF files)
        elif precision == "bf16":
            formats[name] = "bf16"
        elif name.endswith(KEPT_MATRICES) or (precision == "fp8" and name in FP8_KEPT):
            formats[name] = None
        elif matrix in quantisers.GGUF:
            formats[name] = _gguf_type(name, shape[-1], matrix, fallbacks, precision)
        else:
            formats[name] = matrix
    _, H = vocab_hidden
    embedding = lm_head = None
    if precision == "bf16":
        embedding = lm_head = "bf16"
    elif matrix in quantisers.GGUF:
        # llama_tensor_get_type_impl: output.weight (and a tied token_embd) -> Q8_0 when the file type is Q8_0 or
        # a row does not fit the type's block, else Q6_K; an untied token_embd takes the file type.
        lm_head = "q8_0" if matrix == "q8_0" or H % quantisers.FORMATS[matrix].block else "q6_k"
        lm_head = _gguf_type("lm_head.weight", H, lm_head, fallbacks, precision)
        embedding = lm_head if tied else _gguf_type("embed_tokens.weight", H, matrix, fallbacks, precision)
    return Recipe(precision, formats, embedding, lm_head, tied, tuple(fallbacks))


def head_recipes(info, precisions) -> dict:
    """{precision: Recipe} for a checkpoint (checkpoint.CheckpointInfo); OptionError where a format refuses a shape."""
    g = info.geometry
    shapes = head_shapes(g)
    return {p: recipe(p, shapes, (g.vocab_size, g.hidden_size), info.tie_word_embeddings) for p in precisions}


def head_shapes(geometry) -> dict:
    """The head's tensor shapes keyed as MtpHead.named_weights (fused experts, without the family's prefix: a Qwen
    head's "mtp.", every layer of it; a NextN head's "model.layers.{L}.")."""
    from .families import expected_head_shapes, head_names

    prefix = head_names(geometry).prefix
    return {name[len(prefix):]: shape for name, shape in expected_head_shapes(geometry).items()}


# ---------------------------------------------------------------------------------------------
# The head at a precision


def _round(t: torch.Tensor, fmt: str | None, global_amax=None) -> torch.Tensor:
    """t through the round trip of fmt, back in t's dtype and device; t itself where that changes nothing (fmt None,
    or a BF16 weight through bf16): no copy, and the same memory the served head computes with."""
    if fmt is None:
        return t
    out = quantisers.round_trip(t.detach(), fmt, global_amax=global_amax).to(t.dtype)
    return t if torch.equal(out, t) else out


def _fp8_served(t: torch.Tensor, rule) -> torch.Tensor:
    """A block-FP8 matrix as the run's serve device serves it (serving.LinearRule, as weights.load_head_tensors
    serves a block-FP8 checkpoint's): the round trip's value, re-quantised to UE8M0 block scales where vLLM does that
    at load (fp8.requantise_ue8m0), and a weight whose F.linear quantises its input under W8A8 (fp8.w8a8)."""
    from .fp8 import requantise_ue8m0, w8a8

    out = quantisers.round_trip(t.detach(), "fp8_block")
    if rule.weights == "ue8m0":
        out = requantise_ue8m0(out, quantisers.FP8_BLOCK)
    return w8a8(out.to(t.dtype), rule)


def fp8_rules(r: Recipe, shapes: dict, serving, model_type: str | None) -> dict:
    """{head tensor: serving.LinearRule} for the fp8 what-if's block-FP8 matrices (not the routed experts: vLLM's
    Fp8MoEMethod kernels are not modelled, as for a served FP8 checkpoint) under `serving` (serving.ServingNumerics
    resolved for a block-FP8 checkpoint on the run's --serve-device); {} for another precision or without serving
    (weight-only: the round trip alone)."""
    if r.precision != "fp8" or serving is None:
        return {}
    from .serving import linear_rule

    return {n: linear_rule(serving, model_type, shapes[n][0], shapes[n][1], quantisers.FP8_BLOCK)
            for n, f in r.formats.items() if f == "fp8_block" and len(shapes[n]) == 2 and not n.endswith(EXPERTS)}


def quantised_tensors(tensors: dict, r: Recipe, rules: dict | None = None) -> dict:
    """The head's tensors (MtpHead.named_weights) through the recipe's round trips (rules: fp8_rules, the fp8
    matrices as the serve device serves them)."""
    rules = rules or {}
    out = {}
    shared_amax = {}  # nvfp4: one weight_scale_2 for the modules serving fuses (module doc)
    if r.precision == "nvfp4":
        for group in FUSED_GROUPS:
            members = [n for n in tensors if n.endswith(group) and r.formats.get(n) == "nvfp4"]
            if len(members) > 1:
                amax = torch.stack([tensors[n].detach().abs().amax().float() for n in members]).amax()
                shared_amax |= dict.fromkeys(members, amax)
    for name, t in tensors.items():
        fmt = r.formats[name]
        if fmt is not None and name.endswith(EXPERTS):
            out[name] = _experts(name, t, fmt)
        elif name in rules:
            out[name] = _fp8_served(t, rules[name])
        else:
            out[name] = _round(t, fmt, shared_amax.get(name))
    return out


def _experts(name: str, stack: torch.Tensor, fmt: str) -> torch.Tensor:
    """A fused expert stack ([E, 2I, H] gate rows then up rows, or [E, H, I]) the way a release stores its experts:
    one matrix per expert (fp8_block: gate and up their own blocks; nvfp4: each expert's gate/up sharing one
    weight_scale_2, its down its own); row-wise formats are the same either way."""
    out = torch.empty_like(stack)
    inter = stack.shape[1] // 2
    for e in range(stack.shape[0]):
        if fmt == "fp8_block" and name.endswith("gate_up_proj"):
            out[e, :inter] = _round(stack[e, :inter], fmt)
            out[e, inter:] = _round(stack[e, inter:], fmt)
        else:
            out[e] = _round(stack[e], fmt)
    return out


def head_at(head, r: Recipe, serving=None, model_type: str | None = None):
    """The head's class rebuilt from a copy of its tensors through the recipe; the embedding and lm_head are the
    target's own unless the recipe quantises them (a tied pair stays one tensor). serving (fp8 only; a
    serving.ServingNumerics for a block-FP8 checkpoint): its matrices as that device serves them (fp8_rules), so the
    fp8 what-if is the FP8 release's head as the run's --serve-device runs it; None: weight-only."""
    tensors = quantised_tensors(head.named_weights(), r,
                                fp8_rules(r, head_shapes(head.geometry), serving, model_type))
    lm_head = _round(head.lm_head, r.lm_head)
    embed = lm_head if r.tied and head.embed_tokens is head.lm_head else _round(head.embed_tokens, r.embedding)
    # the same family, layers and reading (a NextN head as its engine runs it: MtpHead.reading)
    return type(head)(head.geometry, {k: v.detach() for k, v in tensors.items()}, embed, lm_head, head.reading).eval()


# ---------------------------------------------------------------------------------------------
# Bytes, for the roofline


def _bytes(name: str, shape: tuple[int, ...], fmt: str | None, gguf: bool) -> int:
    """A tensor's bytes: in its format (an expert stack one matrix per expert, fp8_block's gate and up apart), or
    kept (BF16; a GGUF file's vectors are F32)."""
    if fmt is None:
        return math.prod(shape) * (4 if gguf and len(shape) < 2 else 2)
    if len(shape) == 3:
        E, R, C = shape
        if fmt == "fp8_block" and name.endswith("gate_up_proj"):
            return E * 2 * quantisers.stored_bytes((R // 2, C), fmt)
        return E * quantisers.stored_bytes((R, C), fmt)
    return quantisers.stored_bytes(shape, fmt)


def recipe_bytes(r: Recipe, shapes: dict, vocab_hidden: tuple[int, int], experts: int) -> dict:
    """What a draft step reads at this precision, split as cost.Geometry splits it: head_dense_bytes (every head
    tensor but the routed experts), head_expert_bytes (one routed expert: its gate, up and down), lm_head_bytes,
    embedding_row_bytes (one row of an untied embedding; 0 when tied, as cost.Geometry counts it)."""
    gguf = MATRIX_FORMAT[r.precision] in quantisers.GGUF
    dense = sum(_bytes(n, s, r.formats[n], gguf) for n, s in shapes.items() if not n.endswith(EXPERTS))
    routed = sum(_bytes(n, s, r.formats[n], gguf) for n, s in shapes.items() if n.endswith(EXPERTS))
    V, H = vocab_hidden
    lm_head = _bytes("lm_head.weight", (V, H), r.lm_head, gguf)
    row = 0 if r.tied else math.ceil(_bytes("embed_tokens.weight", (V, H), r.embedding, gguf) / V)
    return {"head_dense_bytes": int(dense), "head_expert_bytes": int(round(routed / experts)) if experts else 0,
            "lm_head_bytes": int(lm_head), "embedding_row_bytes": int(row)}
