"""The estimate's extra terms: what a replay runs beside the base replay, each priced on its own (issue 43 point 2).

    extra_terms(opts, model) -> [TermSpec]   THE ONE PLACE a replay option becomes a priced term: each what-if head
                                             (--head-precision, one term per precision), the thresholds (--draft-p-min),
                                             the trees (--tree) and the stepwise layer rule (a head of several layers).
                                             A new term (the grammar's, for one) is one more TermSpec appended here.
    calibrate_term(spec, timings) -> Term    its rates: the run's own replay_request timed with the term on, minus the
                                             same request without it timed beside it (estimate._calibrate_replay)
    term_seconds(term, work, rates)          the priced work of one term
    (estimate.breakdown_lines(estimate) prints them: `replay --dry-run`'s breakdown, the base and one line per term)

What each term costs, and in what unit (requests.replay_request runs them):

    what-if head P   a copy of the head at P runs its own row pass over every prefilled token and its own chain at
                     every anchor, and its Kmax rows join the target's reduction (the sampler statistics of every
                     profile): per request, per prefilled token, per draft row, and the head's attention pairs again.
                     Each precision is timed on its own (quantised formats dequantise differently).
    thresholds       every head chain (the served one and each what-if precision's) carries llama.cpp's confidence of
                     every draft; the thresholds share that one column (the report walks them, the replay does not),
                     so their cost is one confidence per draft row per chain, whatever the number of thresholds.
    trees            SGLang's tree at every anchor: S-1 draft forwards of TOPK slots (K + (S-1)K² candidates), the T-1
                     kept nodes verified by the target's reduction: per anchor, and the draft forwards' attention
                     pairs against the rows before their anchor ((S-1)·TOPK queries per anchor).
    stepwise rule    a head of several MTP layers: layer i at step i, its own rows per layer and its chain.
    grammar          --grammar tools: xgrammar's matcher over every scored tool-call token (a bitmask filled, the
                     allowed set counted, every drafter's drafts that land there checked), timed directly on a call
                     tokenized by the target's tokenizer (grammar_seconds): per tool-call token, and one compile
                     of the tools' grammar per session (a session's tool set; the compile cache only lowers it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class TermSpec:
    """One extra a replay's options ask for, before it is timed."""

    name: str  # the breakdown's label: "what-if head q4_k", "thresholds 0.3,0.5,0.8", "tree 3,4,8"
    what: str  # the work in words, for the breakdown: "its own row pass and chain"
    kwargs: Callable  # () -> replay_request keyword arguments that switch the term on (fresh each call)
    per: str = "draft"  # its row cost is per "draft" row (the base's K rows per anchor), per "anchor" or per
    #                     "tool_call" token (ReplayWork.tool_call_tokens)
    head_pairs: int = 0  # the head's attention pairs it repeats (a what-if head: 1)
    tree_queries: int = 0  # draft queries per anchor that attend to the rows before it (a tree: (S-1)·TOPK)
    scale: int = 1  # copies of the timed work the run does (thresholds: one confidence per chain)
    direct: Callable | None = None  # () -> seconds per row, or (per row, per session), timed on its own (a cost too
    #                                  small to show as a difference, or outside replay_request: the grammar)


@dataclass(frozen=True)
class Term:
    """One priced extra: seconds per unit of the base's work (estimate.ReplayWork)."""

    name: str
    what: str
    call_s: float = 0.0  # per request
    token_s: float = 0.0  # per prefilled token
    row_s: float = 0.0  # per draft row (per="draft") or per anchor (per="anchor")
    per: str = "draft"
    head_pairs: int = 0
    tree_queries: int = 0
    scale: int = 1
    session_s: float = 0.0  # per session (the grammar's compile)


def term_seconds(term: Term, work, rates) -> float:
    """The priced work of one term over a ReplayWork (rates: the base's estimate.Rates, for its pair price)."""
    rows = {"draft": work.drafts, "anchor": work.anchors, "tool_call": work.tool_call_tokens}[term.per]
    pairs = term.head_pairs * work.head_pairs + term.tree_queries * work.anchor_positions
    return term.scale * (work.requests * term.call_s + work.prefill * term.token_s + rows * term.row_s
                         + pairs * rates.heads * rates.pair_s + work.sessions * term.session_s)


def term_pairs(spec: TermSpec, work) -> int:
    """The attention pairs per head the term adds to a ReplayWork (what the calibration takes out of its timing)."""
    return spec.head_pairs * work.head_pairs + spec.tree_queries * work.anchor_positions


def calibrate_term(spec: TermSpec, timings: dict) -> Term:
    """A Term from the calibration's timings: timings[shape] = (seconds without the term, seconds with it, the shape's
    ReplayWork), shapes "long" (a 2-token scored span: its prefilled tokens, the request's fixed cost folded in) and
    "span" (the same request with a long span: per row). The differences are the term's; on a busy machine they can
    come out in any order, so each is at least zero."""

    def delta(shape):
        base, on, _ = timings[shape]
        return max(on - base, 0.0)

    (_, _, w_long), (_, _, w_span) = timings["long"], timings["span"]
    rows = (lambda w: w.drafts) if spec.per == "draft" else (lambda w: w.anchors)
    row_s = max(delta("span") - delta("long"), 0.0) / max(rows(w_span) - rows(w_long), 1)
    token_s = max(delta("long") - rows(w_long) * row_s, 0.0) / max(w_long.prefill, 1)
    return Term(spec.name, spec.what, 0.0, token_s, row_s, spec.per, spec.head_pairs, spec.tree_queries, spec.scale)


def extra_terms(opts, model, renderer=None) -> list[TermSpec]:
    """The terms a replay with these options runs beside the base replay (options.ReplayOptions, the loaded model):
    the one place a new term is added. Each kwargs() builds what the run builds (whatif_heads.head_whatifs'
    heads, head_variants' trees, a fresh roster of the run's drafters, whose suffix tree must not learn the
    calibration's tokens); renderer: the run's (its tokenizer), for the grammar's term."""
    from ..drafting.head_variants import Variants
    from ..drafting.whatif_heads import HeadWhatIfs, head_whatifs
    from .options import ReplayOptions, drafter_roster, head_variants

    if model is None:
        return []
    specs = []
    heads = head_whatifs(ReplayOptions(**{**opts.__dict__, "draft_p_min": ()}), model) if opts.head_precisions else None
    for precision in opts.head_precisions:
        head = heads.heads[precision]
        specs.append(TermSpec(f"what-if head {precision}", "its own row pass and chain, its rows reduced",
                              lambda head=head, p=precision: {"whatifs": HeadWhatIfs({p: head}, False)}, head_pairs=1))
    if opts.draft_p_min:
        chains = 1 + len(opts.head_precisions)
        specs.append(TermSpec("thresholds " + ",".join(f"{t:g}" for t in opts.draft_p_min),
                              f"one confidence column shared by all {len(opts.draft_p_min)}, over {chains} "
                              f"chain{'s' if chains > 1 else ''}", lambda: {"whatifs": HeadWhatIfs({}, True)},
                              scale=chains, direct=lambda: confidence_row_seconds(model.head)))
    variants = head_variants(opts, model.info)
    if variants.trees:
        trees = variants.trees
        nodes = ", ".join(f"{t.steps},{t.topk},{t.draft_tokens}: {t.candidates} drafted + {t.draft_tokens - 1} verified"
                          for t in trees)
        by_rule: dict = {}  # head_variants.variant_blocks grows one tree per (TOPK, rule), as deep as its deepest
        for t in trees:
            by_rule[(t.topk, t.attention)] = max(by_rule.get((t.topk, t.attention), 0), t.steps)
        queries = sum((steps - 1) * topk for (topk, _), steps in by_rule.items())
        specs.append(TermSpec(("tree " if len(trees) == 1 else "trees ") + " ".join(t.name.removeprefix("tree:") for t in trees),
                              f"nodes per anchor ({nodes})", lambda: {"drafters": drafter_roster(opts),
                                                                      "variants": Variants(trees=trees)},
                              per="anchor", tree_queries=queries))
    if variants.stepwise:
        specs.append(TermSpec("stepwise layer rule", f"layer i at step i, {variants.stepwise} layers' rows",
                              lambda: {"drafters": drafter_roster(opts), "variants": Variants(stepwise=variants.stepwise)}))
    if opts.grammar is not None and renderer is not None:
        groups = len(opts.drafters)
        specs.append(TermSpec(f"grammar {opts.grammar}", f"xgrammar per tool-call token ({groups} "
                              f"{'drafters' if groups > 1 else 'drafter'}{chr(39)}{'' if groups > 1 else 's'} drafts), "
                              "a compile per session", lambda: {},
                              per="tool_call", direct=lambda: grammar_seconds(renderer, opts.k, groups)))
    return specs


GRAMMAR_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}}
GRAMMAR_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
                "</parameter>\n</function>\n</tool_call>")


def grammar_seconds(renderer, k: int, groups: int) -> tuple[float, float]:
    """(seconds per tool-call token, seconds per session) of --grammar tools on this tokenizer: GRAMMAR_CALL (the
    qwen_3_5 form) scanned with `groups` drafters' K drafts at every anchor (each the recorded continuation: on the
    grammar's path, so every one is checked), the best of three; and a compile of GRAMMAR_TOOL's grammar."""
    import time

    import numpy as np

    from ..drafting.grammar import ToolGrammar, tokenizer_info

    tok = renderer.tokenizer
    eos = sorted(renderer.eos_ids)
    tokens = np.array(tok.encode(GRAMMAR_CALL, add_special_tokens=False) + eos[:1], dtype=np.int64)
    grammar = ToolGrammar(tokenizer_info(tok, renderer.vocab_size or len(tok), eos))
    t0 = time.perf_counter()
    compiled = grammar.compiled([GRAMMAR_TOOL], "qwen_3_5")
    compile_s = time.perf_counter() - t0
    n = len(tokens)
    anchors = np.arange(n - 1)
    ahead = anchors[:, None] + np.arange(1, k + 1)[None, :]
    drafts = np.where(ahead < n, tokens[np.minimum(ahead, n - 1)], -1)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        grammar.scan(compiled, tokens, 0, n - 1, [drafts] * groups, anchors)
        best = min(best, time.perf_counter() - t0)
    return best / n, compile_s


CONFIDENCE_ROWS = 512  # draft rows whose confidence confidence_row_seconds times


def confidence_row_seconds(head) -> float:
    """Seconds per draft row of llama.cpp's confidence (mtp.draft_confidence: a top-10 over the draft step's logits,
    which the chain computes anyway), timed on CONFIDENCE_ROWS rows of the head's own logits, the best of three: a
    cost too small beside a whole replay_request to show as a difference of two timings on a busy machine."""
    import time

    import torch

    from ..model.mtp.head import draft_confidence

    states = torch.randn(CONFIDENCE_ROWS, head.geometry.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = head.logits(states.to(device=head.device, dtype=head.dtype))
        draft_confidence(logits)  # warm-up
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            draft_confidence(logits)
            best = min(best, time.perf_counter() - t0)
    return best / CONFIDENCE_ROWS
