"""The head at other precisions and the confidence column, replayed beside the served head (`replay --head-precision`,
`--draft-p-min`; docs/whatifs.md).

    HeadWhatIfs(heads, confidence)      the what-if heads (precisions.head_at: the served head's family, layers and
                                        reading, its tensors through each format's round trip) and whether the head's
                                        rows carry llama.cpp's confidence (mtp/head.py `chain(confidence=True)`)
    head_whatifs(opts, model)           the run's, built once per process or Ray replica (cluster.py); None without
    reduce_with(reduce, ...)            the target's reduction over the served rows and every precision's, one call
    with_whatif_rows(columns, ...)      the served rows with `head_precision` / `draft_confidence`, then each
                                        precision's rows (tables.py, version 3)

pipeline.replay_request runs them: a copy of the head per precision runs its own row pass (its KV cache is its own)
and chain at the same anchors of every request; its rows join the served head's in the one target reduction (the
target's logits once per position) and are written after them with `head_precision` set. The thresholds need only
every head draft's confidence; the report walks them (report/whatifs.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class HeadWhatIfs:
    """What a replay runs beside the served head (docs/whatifs.md): the head at other precisions on the same anchors,
    and llama.cpp's confidence of every head draft (the confidence-stopped what-if, computed by the report)."""

    heads: dict  # precision -> MtpHead (precisions.head_at), in --head-precision order
    confidence: bool  # --draft-p-min: the rows carry draft_confidence

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.heads)

    def draft(self, hidden, next_ids, chunk_size: int, prefix: dict | None, plan, keep: int | None):
        """Each precision's head over one request's rows (hidden [m, H], next_ids [m]: the rows after `prefix`, its
        own RowPass per precision from the request before) and its chain at the plan's anchors -> ({precision:
        mtp.Drafts}, {precision: its first `keep` rows, for the next request} or {} when keep is None)."""
        drafts, kept = {}, {}
        for name, head in self.heads.items():
            own = head.row_pass(hidden, next_ids, chunk_size=chunk_size, prefix=prefix[name] if prefix else None)
            drafts[name] = head.chain(own, plan.anchors, plan.depths, confidence=self.confidence)
            if keep is not None:
                kept[name] = head.rows_prefix(own, keep)
            del own
        return drafts, kept


def reduce_with(reduce, positions: torch.Tensor, actuals: torch.Tensor, extra_tokens: list):
    """(a reduce that also reduces len(extra_tokens) more blocks of rows — each the Kmax plan's positions with other
    drafts — in the same call, and a function giving their Reductions once it has run). Without extra rows: reduce."""
    if not extra_tokens:
        return reduce, lambda: []
    from ..model.target import Reductions
    from .acceptance import rows_of

    held = {}

    def served(p, t, x, no_min_p=None, **grammar):  # grammar: reduce_logits' grammar_masks (replay --grammar)
        n = p.shape[0]
        if no_min_p is not None:  # the what-if heads' rows are the head's: V2, min-p applies
            no_min_p = torch.cat([no_min_p, torch.zeros(positions.shape[0] * len(extra_tokens), dtype=torch.bool)])
        r = reduce(torch.cat([p] + [positions] * len(extra_tokens)), torch.cat([t] + extra_tokens),
                   torch.cat([x] + [actuals] * len(extra_tokens)), no_min_p=no_min_p, **grammar)
        R = positions.shape[0]
        held["extra"] = [rows_of(r, n + i * R, n + (i + 1) * R) for i in range(len(extra_tokens))]
        head = rows_of(r, 0, n)
        return Reductions(head.target_token, head.target_logprob, head.actual_logprob, head.p_accept,
                          fit_tokens=r.fit_tokens, fit=r.fit)

    return served, lambda: held["extra"]


def with_whatif_rows(columns: dict, whatifs: HeadWhatIfs, drafts, other: dict, reductions: list, ids, segments, plan,
                      index, k_max: int, drafters) -> dict:
    """The served rows with `head_precision` (-1: served) and, with confidence, `draft_confidence` (the head's rows;
    NaN elsewhere), followed by every what-if precision's rows (drafter mtp, draft_k Kmax in a run of drafters)."""
    import numpy as np

    from .acceptance import check_finite, request_rows

    a, k = index.anchor_index, index.depth
    R = len(columns["pos"])
    columns = dict(columns, head_precision=np.full(R, -1, dtype=np.int8))
    head_rows = np.ones(R, dtype=bool)
    if drafters is not None:
        head_rows = columns["drafter"] == list(drafters.names).index("mtp")
    if whatifs.confidence:
        confidence = np.full(R, np.nan)
        confidence[head_rows] = drafts.confidence.cpu()[a, k - 1].numpy()
        columns["draft_confidence"] = confidence
    out = [columns]
    for code, (name, d) in enumerate(other.items()):
        cols = request_rows(ids, segments, plan, index, d.tokens, d.logprobs, reductions[code], k_max)
        check_finite(cols)
        cols["head_precision"] = np.full(len(cols["pos"]), code, dtype=np.int8)
        if whatifs.confidence:
            cols["draft_confidence"] = d.confidence.cpu()[a, k - 1].numpy()
        if drafters is not None:
            cols["drafter"] = np.full(len(cols["pos"]), list(drafters.names).index("mtp"), dtype=np.int8)
            cols["draft_k"] = np.full(len(cols["pos"]), k_max, dtype=np.int8)
            # as drafter_columns counts the served head's: the tokens its anchor's draft holds
            cols["draft_len"] = (d.tokens >= 0).sum(dim=1).cpu().numpy().astype(np.int8)[a.numpy()]
        if "tree_node" in columns:  # a run with --tree too: null on these rows, as on every chain row
            from .columns import NOT_A_TREE

            cols["tree_node"] = np.full(len(cols["pos"]), NOT_A_TREE, dtype=np.int8)
        out.append(cols)
    return {name: np.concatenate([c[name] for c in out]) for name in columns}


def head_whatifs(opts, model) -> HeadWhatIfs | None:
    """The run's HeadWhatIfs (--head-precision, --draft-p-min): a copy of the loaded head per precision, of the same
    family, layers and reading (precisions.head_at), built once by each process or Ray replica; None without them or
    without a model."""
    if model is None or not (opts.head_precisions or opts.draft_p_min):
        return None
    from ..model.precisions import head_at, head_recipes

    recipes = head_recipes(model.info, opts.head_precisions)
    serving = fp8_serving(opts) if "fp8" in opts.head_precisions else None
    model_type = model.info.text_config.get("model_type")
    return HeadWhatIfs({p: head_at(model.head, recipes[p], serving, model_type) for p in opts.head_precisions},
                       bool(opts.draft_p_min))


def fp8_serving(opts):
    """The numerics the fp8 what-if's head is served with: a block-FP8 checkpoint's on --serve-device, with
    --fp8-activations where given (serving.serving_numerics); None (weight-only) on a device whose block-FP8 numerics
    are not modelled (cpu, mi300x without --fp8-activations)."""
    from ..errors import OptionError
    from ..model.serving import serving_numerics

    try:
        return serving_numerics(opts.serve_device, opts.fp8_activations, quantized=True)
    except OptionError:
        return None
