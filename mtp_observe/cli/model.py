"""The model commands: `inspect` (what the head is, from headers) and `probe` (its measured cost)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..literal import literal, visible
from ..wording import plural
from .common import (
    DEVICE_METAVAR,
    MODEL_HELP,
    Dtype,
    check_writable,
    human_bytes,
    out,
    say,
)


def inspect(
    model: Annotated[Path, typer.Argument(metavar="MODEL", help=MODEL_HELP)],
    as_json: Annotated[bool, typer.Option("--json", help="Emit the numbers as JSON.")] = False,
) -> None:
    """What the head is: tensors, shapes, bytes, borrowed weights, draft-cost roofline (headers only)."""
    from ..cost.geometry import PRECISIONS
    from ..cost.inventory import inventory_json, take_inventory
    from ..model.checkpoint import read_checkpoint
    from ..model.hub import resolve_model

    inv = take_inventory(read_checkpoint(resolve_model(model, "MODEL")))
    if as_json:
        print(json.dumps(inventory_json(inv), indent=2))
        return
    heading = literal(inv.model, "bold")
    heading.append(visible(f"  model_type={inv.model_type}  layout={inv.layout}"))
    out.print(heading, soft_wrap=True)
    cfg = Table(title="config", show_header=False)
    for k, v in inv.config.items():
        cfg.add_row(literal(k), literal(v))
    out.print(cfg)
    where = "MTP head" if inv.head_layer == "mtp" else f"NextN head ({inv.head_layer})"
    t = Table(title=f"{where}: {plural(len(inv.head), 'tensor')}")
    for c in ("tensor", "shape", "dtype", "bytes"):
        t.add_column(c, justify="right" if c == "bytes" else "left")
    for e in inv.head:
        t.add_row(literal(e.name), str(list(e.shape)), literal(e.dtype), f"{e.nbytes:,}")
    t.add_row(literal("total", "bold"), f"{sum(e.numel for e in inv.head):,} params", "", literal(f"{inv.head_bytes():,}", "bold"))
    out.print(t)
    b = Table(title="borrowed from the target (read by every draft step)")
    for c in ("tensor", "role", "shape", "dtype", "bytes"):
        b.add_column(c)
    roles = [(inv.embedding, "embedding + lm_head (tied)")] if inv.tied else [(inv.embedding, "embedding"), (inv.lm_head, "lm_head")]
    for e, role in roles:
        b.add_row(literal(e.name), role, str(list(e.shape)), literal(e.dtype), f"{e.nbytes:,}")
    out.print(b)
    if inv.copies:
        c = Table(title="the NextN layer's copies of the target's tensors (not read: vLLM and SGLang run the target's)")
        for col in ("tensor", "shape", "dtype", "bytes"):
            c.add_column(col)
        for e in inv.copies:
            c.add_row(literal(e.name), str(list(e.shape)), literal(e.dtype), f"{e.nbytes:,}")
        out.print(c)
    kv = inv.kv_cache
    out.print(f"KV cache per token ({kv['kind'].upper()}: {kv['elements_per_layer']:,} elements a layer, BF16): target "
              f"{human_bytes(kv['target_bytes_per_token'])} ({kv['layers']} layers), head "
              f"{human_bytes(kv['head_bytes_per_token'])}", markup=False, soft_wrap=True)
    data = inventory_json(inv)
    storage = data["head"]["storage"]
    out.print(f"head storage: {storage['precision']}; numerics: {inv.numerics}", markup=False, soft_wrap=True)
    if storage["fp8_tensors"]:
        q = Table(title="head quantisation coverage")
        for c in ("tensors", "count", "stored as"):
            q.add_column(c)
        for kind, groups in (("FP8 e4m3", storage["fp8_tensors"]), (f"scales ({storage['scale_dtype']})", storage["scale_tensors"]),
                             ("kept float", storage["float_tensors"])):
            for grp in groups:
                q.add_row(grp["name"], str(grp["count"]), kind)
        out.print(q)
    if data["experts"] is not None:
        x = data["experts"]
        e = Table(title=f"experts: {x['count']} routed ({x['routed_per_token']} per token) + {x['shared_per_token']} shared, "
                        f"layout {x['layout']}, norm_topk_prob {x['norm_topk_prob']}")
        for c in ("part", "MoE layers", "bytes per expert", "routed bytes", "active routed bytes", "shared bytes", "active params"):
            e.add_column(c, justify="right")
        for part in ("target", "head"):
            y = x[part]
            e.add_row(part, str(y["moe_layers"]), human_bytes(y["bytes_per_expert"]), human_bytes(y["routed_bytes"]),
                      human_bytes(y["active_routed_bytes"]), human_bytes(y["shared_bytes"]), f"{y['active_params']:,}")
        out.print(e)
    step = " (batch-1 step: routed experts at top-k / E)" if data["experts"] is not None else ""
    r = Table(title=f"roofline draft cost c = (head + lm_head bytes) / target bytes{step}")
    for c in ("precision", "head", "lm_head", "draft step", "target", "c"):
        r.add_column(c, justify="right")
    for p in ["stored", *PRECISIONS]:
        r.add_row(p, human_bytes(inv.head_step_bytes(p)), human_bytes(inv.lm_head_bytes(p)),
                  human_bytes(inv.head_step_bytes(p) + inv.lm_head_bytes(p)), human_bytes(inv.target_step_bytes(p)),
                  f"{inv.draft_cost(p):.4f}")
    out.print(r)


def probe(
    model: Annotated[Path, typer.Argument(metavar="MODEL", help=MODEL_HELP)],
    context: Annotated[int, typer.Option(help="Tokens in the caches before each timed step (per sequence).")] = 4096,
    k: Annotated[int, typer.Option("--k", help="Time the verify of K+1 tokens for K = 1..k.")] = 4,
    device: Annotated[str, typer.Option(metavar=DEVICE_METAVAR, help="Where the step runs (auto: cuda if available).")] = "auto",
    dtype: Annotated[Dtype, typer.Option(help="auto: bfloat16 on CUDA, float32 on CPU.")] = "auto",
    repeats: Annotated[int, typer.Option(help="Timed repeats; the median is reported.")] = 20,
    batch: Annotated[str, typer.Option("--batch", help="Batch sizes to time, e.g. 1,2,4,8 (batch 1 is always timed).")] = "1",
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write probe.json.")] = Path("probe.json"),
    tree: Annotated[Optional[list[str]], typer.Option("--tree", metavar="S,TOPK,T", help="Also time what this SGLang tree pays (repeatable): a verify of T tokens and a draft step over TOPK tokens per sequence.")] = None,
) -> None:
    """Measured cost of one draft step, one target decode step and one verify of K+1 tokens, per batch size."""
    from ..cost.probe import CPU_NOTE, probe as measure, probe_json
    from ..cost.speedup import parse_batches
    from ..drafting.tree import parse_tree
    from ..model.hub import resolve_model
    from ..run.tables import write_json_atomic

    sizes = parse_batches(batch, "--batch")
    trees = tuple(parse_tree(spec) for spec in tree or [])
    model_dir = resolve_model(model, "MODEL")
    check_writable(output, "--output", kept=[model_dir])
    result = measure(model_dir, context=context, k=k, device=device, dtype=dtype, repeats=repeats, batch=sizes,
                     trees=trees)
    k = result.k
    data = probe_json(result)
    write_json_atomic(output, data, hint="free space or choose another --output")
    ms = 1e3
    roof = result.roofline
    t = Table(title=literal(f"{model}: batch 1, context {context}, {result.device} ({result.device_name}) {result.dtype}, "
                            f"median of {repeats}"))
    for c in ("step", "measured", "per decode step", f"roofline at {roof['precision']}"):
        t.add_column(c, justify="left" if c == "step" else "right")
    t.add_row("target decode (1 token)", f"{result.target_decode.median_s * ms:.3f} ms", "1",
              f"1 ({human_bytes(roof['target_bytes'])} read)")
    t.add_row("draft step (c)", f"{result.draft_step.median_s * ms:.3f} ms", f"{result.draft_cost:.4f}",
              f"{roof['draft_cost']:.4f} ({human_bytes(roof['head_bytes'] + roof['lm_head_bytes'])} read)")
    for K, (timing, extra) in enumerate(zip(result.verify, result.verify_extra()), start=1):
        t.add_row(f"verify K={K} ({K + 1} tokens)", f"{timing.median_s * ms:.3f} ms", f"{1 + extra:.4f}  (v = {extra:+.4f})", "")
    for w, timing in result.batches[0].draft_width:
        t.add_row(f"draft step over {w} tokens (trees)", f"{timing.median_s * ms:.3f} ms",
                  f"{timing.median_s / result.target_decode.median_s:.4f}", "")
    out.print(t)
    if len(result.batches) > 1:
        by_batch = Table(title=literal(f"by batch size (B sequences, context {context} each): milliseconds per step, "
                                       "c_B = draft / decode, v_B(K) = verify / decode - 1"))
        for c in ("B", "decode", *[f"verify K={K}" for K in range(1, k + 1)], "draft", "c_B", "v_B(1..k)"):
            by_batch.add_column(c, justify="right")
        for b in result.batches:
            by_batch.add_row(str(b.batch), f"{b.target_decode.median_s * ms:.3f}",
                             *[f"{v.median_s * ms:.3f}" for v in b.verify], f"{b.draft_step.median_s * ms:.3f}",
                             f"{b.draft_cost:.4f}", " ".join(f"{v:+.3f}" for v in b.verify_extra()))
        out.print(by_batch)
    for b in result.batches:
        for flag in b.flags():
            say(out, f"flag: {flag}", style="yellow")
    for note in result.notes:
        say(out, f"note: {note}", style="yellow" if note == CPU_NOTE else None)
    say(out, f"wrote {output}; use it with: mtp-observe report --probe {output}")
