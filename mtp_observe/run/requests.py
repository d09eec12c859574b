"""Requests: one rendered request replayed — the target's reductions, the head's drafts, every drafter's rows — and
a session's requests into its tables.

Contract: `replay_request(model, request, ...)` -> (columns, fit, carry): the positions columns of one request
(acceptance.request_rows), the recording-sampler sums of its spans and what it leaves for the next request sharing
its prefix (`Carry`); `model_free_request` the same from the model-free drafters alone; `replay_session` every
request of a session in order; `session_parts(...)` -> (positions table, requests table, counts) of one session, what
each process of a replay and each replica of a Ray job does with a session it owns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..drafting.acceptance import NonFiniteOutput, check_finite, rows_of
from ..drafting.whatif_heads import HeadWhatIfs, reduce_with, with_whatif_rows
from ..errors import CheckpointError
from ..model.loading import LoadedModel, non_finite_advice
from ..model.target import RECORDED
from .options import Observer, ReplayOptions


@dataclass(frozen=True)
class RequestResult:
    index: int
    columns: dict  # positions.parquet columns of this request (numpy), see acceptance.request_rows
    fit: dict  # {"tokens": [N], "<stat>_<profile>": [N]} numpy, the recording-sampler sums of its N spans


@dataclass(frozen=True)
class Carry:
    """What one request leaves for the next when they share their first `length` tokens."""

    target: object  # target.TargetPrefix after tokens [0, length)
    rows: object  # mtp.RowPass, rows 0..length-2 (row i needs x_{i+1}, also shared)
    whatif_rows: dict | None = None  # precision -> that head's RowPass over the same rows (HeadWhatIfs)

    @property
    def length(self) -> int:
        return self.target.length


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def replay_request(model: LoadedModel, request, k_max: int, profiles, chunk_size: int,
                   carry: Carry | None = None, keep_at: int | None = None, drafters=None,
                   keep: int | None = None, recorder=None, on_tokens=None, variants=None,
                   on_reused=None, whatifs: HeadWhatIfs | None = None) -> tuple[dict, dict, Carry | None]:
    """One request through the target and the head: the columns of its rows, the recording-sampler sums
    of its spans (RequestResult.fit), and what the next request reuses.

    1. target: chunked prefill -> post-norm hidden h at every position (after `carry`'s shared prefix)
    2. head: one row pass over every position (its KV covers the prompt; rows of the prefix are
       reused), then the chain at every anchor of every span, depths batched over anchors
    3. target again, lm_head only at the rows' positions p+k-1 and at s-1..e-1 of every span -> argmax,
       log-probs, sampler probs, the fit sums (the penalties read each turn's prompt and output so far)
    4. rows
    Rows depend only on the tokens (causal attention), so reusing a prefix changes nothing measured
    beyond floating-point rounding of where chunk boundaries fall. on_tokens(n), if given, hears each
    prefill chunk's tokens as they are done, on_reused(n) the reused prefix's: the progress line.

    drafters (a drafters.roster.Roster): every drafter of the roster drafts at the same anchors (fed the
    head's drafts for the hybrids; keep: the prefix the next request shares, a hint for suffix decoding)
    and its rows come out with `drafter`/`draft_k` columns (`drafter_columns`); None: the head's rows only.
    variants (head_variants.Variants, with drafters): the trees and the stepwise layer rule, their rows after the
    roster's, reduced by the target in the same call.

    whatifs (HeadWhatIfs): each precision's head runs its own row pass (its KV cache is its own) and chain at the
    same anchors; its rows join the same target reduction (the target's logits once per position) and come out
    after the served head's with `head_precision` set (null on the served rows); with confidence every head row
    carries `draft_confidence` (NaN on other drafters' rows).
    """
    from ..drafting.acceptance import anchor_plan, request_rows, row_index
    from ..model.target import Turns, prefill, reduce_logits

    ids = torch.tensor(request.input_ids, dtype=torch.long)
    n = ids.shape[0]
    if carry is not None and not (carry.length < n and carry.length >= 2):
        carry = None
    if keep_at is not None and not (keep_at >= 2 and keep_at >= (carry.length if carry else 0)):
        keep_at = None
    segments = segment_codes(request, n)
    plan = anchor_plan(request.spans, k_max)
    index = row_index(plan, k_max)
    if recorder is not None:  # routing.RouterRecorder: the MoE routers' picks during this prefill
        recorder.begin_request()
    if on_reused is not None and carry is not None:
        on_reused(carry.length)
    hidden, kept = prefill(model.target, ids, chunk_size, prefix=carry.target if carry else None, keep_at=keep_at,
                           on_chunk=on_tokens)  # 1
    if recorder is not None:
        recorder.end_request(carry.length if carry else 0, [(sp.start, sp.end) for sp in request.spans])
    P = carry.length - 1 if carry else 0  # rows 0..P-1 come from the previous request
    confident = whatifs is not None and whatifs.confidence
    rows = model.head.row_pass(hidden[P:-1], ids[P + 1 :].to(hidden.device), chunk_size=chunk_size,
                               prefix=carry.rows if carry else None)  # 2
    drafts = model.head.chain(rows, plan.anchors, plan.depths, confidence=confident)
    head_past = _head_past_end_tokens(model.head, rows, plan, k_max)
    blocks = []
    if variants:
        from ..drafting.head_variants import variant_blocks

        blocks = variant_blocks(model.head, variants, rows, ids, segments, request.spans, chunk_size)
    other, other_rows = ({}, {}) if whatifs is None else whatifs.draft(  # precision -> Drafts, rows kept
        hidden[P:-1], ids[P + 1 :].to(hidden.device), chunk_size, carry.whatif_rows if carry else None, plan,
        keep_at - 1 if kept is not None else None)
    following = Carry(kept, model.head.rows_prefix(rows, keep_at - 1), other_rows) if kept is not None else None
    del rows
    a, k = index.anchor_index, index.depth
    turns = Turns(ids, torch.tensor([sp.start for sp in request.spans], dtype=torch.long),
                  torch.tensor([sp.end for sp in request.spans], dtype=torch.long))

    def reduce(positions, tokens, actuals, no_min_p=None, grammar_masks=None):
        return reduce_logits(model.target.lm_head.weight, hidden, positions, tokens, actuals, tuple(profiles), turns=turns,
                             top_k_ties=model.top_k_ties, no_min_p=no_min_p, grammar_masks=grammar_masks)

    past_end = _past_end_reader(model.target.lm_head.weight, hidden)
    # The what-if heads' rows (the Kmax plan's) ride in the same reduction as the served rows, after them.
    extra_tokens = [d.tokens.cpu()[a, k - 1] for d in other.values()]
    served_reduce, whatif_reductions = reduce_with(reduce, index.target_position, ids[index.actual_position], extra_tokens)
    if drafters is not None:
        head_tokens, head_logprobs = _head_drafts(drafts, k_max)
        groups = drafters.draft(ids.numpy(), request.spans, keep=keep, mtp=head_tokens.numpy())
        columns, reductions = drafter_columns(ids, segments, request.spans, groups, head_logprobs, served_reduce,
                                              blocks, len(groups), past_end, head_past)  # 3, 4
    else:
        reductions = served_reduce(index.target_position, drafts.tokens.cpu()[a, k - 1], ids[index.actual_position])  # 3
        columns = request_rows(ids, segments, plan, index, drafts.tokens, drafts.logprobs, reductions, k_max,
                               past_end(plan, head_past, k_max))  # 4
        check_finite(columns)
    if whatifs is not None:
        columns = with_whatif_rows(columns, whatifs, drafts, other, whatif_reductions(), ids, segments, plan, index, k_max,
                                    drafters)
    return columns, _fit(reductions), following


def _past_end_reader(lm_head: torch.Tensor, hidden: torch.Tensor):
    """past_end(plan, tokens [A, K'], K') -> [A] int8 accepted_past_end (acceptance.py): the target's argmax after
    each span's end-of-turn token (its row e of `hidden`, as reduce_logits's target_token) against the draft there."""
    from ..drafting.acceptance import accepted_past_end, past_end_entries

    def past_end(plan, tokens: torch.Tensor, kk: int) -> torch.Tensor:
        past = past_end_entries(plan, tokens, kk)
        rows = hidden[past.target_position.to(hidden.device)].to(lm_head.device)
        argmax = torch.nn.functional.linear(rows, lm_head).float().argmax(-1)
        return accepted_past_end(past, argmax, plan.anchors.shape[0])

    return past_end


def _head_past_end_tokens(head, rows, plan, k_max: int) -> torch.Tensor:
    """[A, Kmax] the head's chain at every anchor whose draft reaches past the end of its turn (e - p < Kmax), run
    on to depth e - p + 1 (the engine drafts K there too; acceptance.past_end_entries reads the token past x_e);
    -1 elsewhere. A chain of its own over those few anchors, so the rows' drafts are the chain's as before."""
    short = torch.nonzero(plan.depths < k_max, as_tuple=True)[0]
    tokens = torch.full((plan.anchors.shape[0], k_max), -1, dtype=torch.long)
    if short.numel():
        longer = head.chain(rows, plan.anchors[short], plan.depths[short] + 1)
        tokens[short, : longer.tokens.shape[1]] = longer.tokens.cpu().long()
    return tokens


def segment_codes(request, n: int):
    """[n] int8: each scored token's segment code (rendering.SEGMENTS), -1 elsewhere."""
    segments = torch.full((n,), -1, dtype=torch.int8)
    for sp in request.spans:
        segments[sp.start : sp.end + 1] = torch.frombuffer(bytearray(sp.segments), dtype=torch.int8)
    return segments


def _head_drafts(drafts, k_max: int):
    """The head's drafts as the roster takes them, [A, Kmax]: a request whose every span is shorter than Kmax + 1 has
    a chain of fewer columns (chain's K is the deepest anchor's), padded here with no-draft (-1) / NaN."""
    head_tokens, head_logprobs = drafts.tokens.cpu(), drafts.logprobs.cpu()
    short = k_max - head_tokens.shape[1]
    if short > 0:
        head_tokens = torch.nn.functional.pad(head_tokens, (0, short), value=-1)
        head_logprobs = torch.nn.functional.pad(head_logprobs, (0, short), value=float("nan"))
    return head_tokens, head_logprobs


def _fit(reductions) -> dict:
    """{"tokens": [N], "<stat>_<profile>": [N]} numpy: the recording-sampler sums of a request's N spans."""
    fit = {"tokens": reductions.fit_tokens.cpu().numpy()}
    for name, sums in reductions.fit.items():
        for stat in ("support", "q", "q2", "var", "ll"):
            fit[f"{stat}_{name}"] = getattr(sums, stat).cpu().numpy()
    return fit


def _grammar_masks(groups) -> dict:
    """reduce's grammar_masks keyword under --grammar (the request's constrained positions and their packed allowed
    sets, drafting/grammar.py RequestGrammar), {} without a grammar or with nothing it constrains."""
    grammar = next((g.grammar for g in groups if g.grammar is not None), None)
    if grammar is None or not len(grammar.mask_positions):
        return {}
    return {"grammar_masks": (torch.from_numpy(grammar.mask_positions), torch.from_numpy(grammar.masks))}


def _refused_never_accepted(cols: dict) -> None:
    """A draft the grammar refuses (draft_allowed false: itself, or an earlier draft of its chain) is never accepted
    by a sampler under the mask: its p_accept_<profile> is 0 (the masked distribution already gives it 0 on the
    recorded path; off it, an earlier refused draft ended the chain)."""
    import numpy as np

    for name in [n for n in cols if n.startswith("p_accept_")]:
        cols[name] = np.where(cols["draft_allowed"], cols[name], 0).astype(cols[name].dtype)


def drafter_columns(ids: torch.Tensor, segments: torch.Tensor, spans, groups, head_logprobs: torch.Tensor | None,
                    reduce=None, extra=(), first_code: int = 0, past_end=None,
                    head_past: torch.Tensor | None = None) -> tuple[dict, object]:
    """positions.parquet columns of every drafter's rows for one request, and the target's Reductions (None
    without a target).

    groups: [drafters.roster.Drafts] (roster order; `drafter` is the index into it); head_logprobs [A, K]: the
    head's log-probs of its drafts (where a hybrid took the head's draft its draft_logprob is the head's; a
    model-free draft's is NaN); reduce(positions, drafts, actuals, no_min_p) -> target.Reductions (None: no target;
    no_min_p [R] bool marks the rows of drafters vLLM's V1 runner serves: its rejection sampler applies no min-p).
      1. per drafter and draft length K' it drafted for: the anchor plan at K' (depths min(K', e - p)) and rows
      2. the target once over every drafter's rows (its logits are computed once per position, whoever drafted),
         a NO_TOKEN draft gathered at token 0 and masked after: target_logprob NaN, p_accept 0 (nothing
         proposed is nothing accepted) — -1 would silently index the last vocabulary entry
      3. the columns, with `drafter`, `draft_k` and `draft_len` (what vLLM counts as the step's draft tokens)
    past_end(plan, tokens [A, K'], K') -> [A] int8 accepted_past_end (with the target; acceptance.py), read from the
    drafter's own tokens, the head's from head_past [A, Kmax] (its chain run on past the end of the turn).
    extra: head_variants.Block's (trees, the stepwise layer rule): their entries reduced in the same call after the
    drafters' rows, their columns coded first_code, first_code + 1, ... (after the roster's drafters).
    """
    import numpy as np

    from ..drafting.acceptance import anchor_plan, request_rows, row_index

    parts = []  # (drafter index, K', plan, index, draft tokens [A, K'], draft log-probs [A, K'] or None)
    g_v = {}  # (drafter index, K') -> its variant
    for code, g in enumerate(groups):  # 1
        for v, kk in enumerate(g.draft_ks):
            g_v[(code, kk)] = v
            plan = anchor_plan(spans, kk)
            tokens = torch.from_numpy(np.ascontiguousarray(g.tokens[:, v, :kk]))
            logprobs = None
            if g.from_model is not None:
                assert head_logprobs is not None, "a drafter that takes the head's drafts needs its log-probs"
                take = torch.from_numpy(g.from_model[:, v])[:, None]
                logprobs = torch.where(take, head_logprobs[:, :kk], torch.tensor(float("nan")))
            parts.append((code, kk, plan, row_index(plan, kk), tokens, logprobs))
    reductions = None
    if reduce is not None:  # 2
        drafted = torch.cat([tok[ix.anchor_index, ix.depth - 1] for *_, ix, tok, _ in parts]
                            + [b.tokens for b in extra]).long()
        positions = torch.cat([ix.target_position for *_, ix, _, _ in parts] + [b.positions for b in extra])
        actuals = torch.cat([ids[ix.actual_position] for *_, ix, _, _ in parts] + [b.actuals for b in extra])
        v1 = torch.cat([torch.full((ix.depth.shape[0],), groups[code].runner == "v1") for code, _, _, ix, _, _ in parts]
                       + [torch.zeros(b.positions.shape[0], dtype=torch.bool) for b in extra])  # the head's variants: V2
        none = drafted < 0
        reductions = reduce(positions, drafted.clamp(min=0), actuals, no_min_p=v1 if bool(v1.any()) else None,
                            **_grammar_masks(groups))  # --grammar: sampled acceptance under the mask
        if bool(none.any()):
            reductions.target_logprob[none.to(reductions.target_logprob.device)] = float("nan")
            for values in reductions.p_accept.values():
                values[none.to(values.device)] = 0.0
    out, at = [], 0
    for code, kk, plan, ix, tokens, logprobs in parts:  # 3
        R = ix.depth.shape[0]
        sub = rows_of(reductions, at, at + R) if reductions is not None else None
        past = None
        if past_end is not None and sub is not None:
            past = past_end(plan, head_past if groups[code].name == "mtp" and head_past is not None else tokens, kk)
        cols = request_rows(ids, segments, plan, ix, tokens, logprobs, sub, kk, past)
        cols["drafter"] = np.full(R, code, dtype=np.int8)
        cols["draft_k"] = np.full(R, kk, dtype=np.int8)
        # the tokens the anchor's draft holds, past the end of the turn too (a draft is a chain that stops)
        cols["draft_len"] = (tokens >= 0).sum(dim=1).numpy().astype(np.int8)[ix.anchor_index.numpy()]
        if groups[code].allowed is not None:  # d_k allowed by the grammar given x_0..x_p and d_1..d_{k-1}
            cols["draft_allowed"] = groups[code].allowed[ix.anchor_index.numpy(), g_v[(code, kk)], ix.depth.numpy() - 1]
            _refused_never_accepted(cols)
        from_model = groups[code].from_model
        check_finite(cols, head=from_model[:, g_v[(code, kk)]][ix.anchor_index.numpy()] if from_model is not None
                     else np.zeros(R, dtype=bool))
        out.append(cols)
        at += R
    for code, block in enumerate(extra, start=first_code):
        E = block.positions.shape[0]
        cols = block.finish(rows_of(reductions, at, at + E) if reductions is not None else None)
        R = len(cols["pos"])
        cols["drafter"] = np.full(R, code, dtype=np.int8)
        cols["draft_k"] = np.full(R, block.draft_k, dtype=np.int8)
        cols["draft_len"] = np.full(R, block.draft_k, dtype=np.int8)  # the head drafts its S (or k) steps every time
        check_finite(cols, head=cols["draft_token"] >= 0)
        out.append(cols)
        at += E
    _fill_shared_columns(out, groups)
    columns = {name: np.concatenate([c[name] for c in out]) for name in out[0]} if out else {}
    return columns, reductions


def _fill_shared_columns(out: list[dict], groups) -> None:
    """The columns every row of a request carries once any drafter's rows have them (drafter_columns): the grammar's
    (--grammar: the recorded token forced, the allowed-set size), the trees' node (null on other rows) and
    accepted_past_end (0 on a tree's or layer rule's rows: nothing counted past the end)."""
    import numpy as np

    grammar = next((g.grammar for g in groups if g.grammar is not None), None)
    if grammar is not None:  # --grammar: the recorded token forced, the allowed-set size; every row, whoever drafted
        for c in out:
            at = c["pos"].astype(np.int64) + c["depth"].astype(np.int64)
            c["forced"] = grammar.forced[at]
            c["allowed"] = grammar.allowed[at]
            c.setdefault("draft_allowed", np.ones(len(at), dtype=bool))
    if any("tree_node" in c for c in out):  # the trees' column: null on every other row
        from ..drafting.columns import NOT_A_TREE

        for c in out:
            c.setdefault("tree_node", np.full(len(c["pos"]), NOT_A_TREE, dtype=np.int8))
    if any("accepted_past_end" in c for c in out):  # a tree's or layer rule's rows: nothing counted past the end
        for c in out:
            c.setdefault("accepted_past_end", np.zeros(len(c["pos"]), dtype=np.int8))


def model_free_request(request, k_max: int, drafters, keep: int | None = None) -> tuple[dict, dict]:
    """One request's rows from the model-free drafters alone (no weights): the target's columns left out, and
    the fit holds only each span's scored-token count (no sampler sums without the target)."""
    import numpy as np

    ids = torch.tensor(request.input_ids, dtype=torch.long)
    segments = segment_codes(request, ids.shape[0])
    groups = drafters.draft(ids.numpy(), request.spans, keep=keep)
    columns, _ = drafter_columns(ids, segments, request.spans, groups, None, None)
    fit = {"tokens": np.array([sp.end - max(sp.start, 1) + 1 for sp in request.spans], dtype=np.int64)}
    return columns, fit


def replay_session(model: LoadedModel | None, requests, k_max: int, profiles, chunk_size: int,
                   drafters=None, recorder=None, observer: Observer | None = None, variants=None,
                   whatifs: HeadWhatIfs | None = None) -> list[RequestResult]:
    """Every request of one session, in order, each starting from the prefix it shares with the one before.
    model None: the model-free drafters of `drafters` alone (no weights, no target). recorder
    (routing.RouterRecorder) accumulates the session's router window sums. observer: hears each request start
    and its tokens as they are done (Observer.request, .tokens). whatifs: replay_request's."""
    out, carry = [], None
    for r, request in enumerate(requests):
        if observer is not None:
            observer.request(r)
        after = requests[r + 1].input_ids if r + 1 < len(requests) else None
        shared = shared_prefix(request.input_ids, after) if after is not None else 0
        if model is None:
            columns, fit = model_free_request(request, k_max, drafters, keep=shared)
            out.append(RequestResult(request.index, columns, fit))
            if observer is not None:
                observer.tokens(len(request.input_ids))
            continue
        keep_at = shared if after is not None else None
        if keep_at is not None and keep_at >= len(request.input_ids):
            keep_at = len(request.input_ids) - 1  # the next request extends this one: keep all but the last token
        columns, fit, carry = replay_request(model, request, k_max, profiles, chunk_size, carry=carry, keep_at=keep_at,
                                             drafters=drafters, keep=shared, recorder=recorder,
                                             on_tokens=observer.tokens if observer is not None else None,
                                             variants=variants, whatifs=whatifs,
                                             on_reused=observer.reused if observer is not None else None)
        out.append(RequestResult(request.index, columns, fit))
    return out


def session_parts(model: LoadedModel | None, session_id: str, index: int, requests, opts: ReplayOptions, roster,
                  recorded=None, source: str | None = None, speculative=None, recorder=None,
                  observer: Observer | None = None, where: str = "", variants=None,
                  whatifs: HeadWhatIfs | None = None) -> tuple:
    """(positions table, requests table, counts) of one rendered session: what each process of a replay — and each
    replica of a Ray job (cluster.py) — does with a session it owns. index: its input index (requests.parquet
    `session_index`); recorded, source: its `recorded` sampler and where that came from (session_sampler; None
    without a target); speculative: generate --speculative's steps (sessions.speculative_steps); where: its
    file:line, for the one-line error of a non-finite output; variants: head_variants.Variants (trees, the stepwise
    layer rule) replayed beside the chain; whatifs: the head at other precisions and the confidence column
    (`head_whatifs`, built once per process or replica)."""
    from ..drafting.head_variants import Variants
    from . import tables

    variants = variants if variants is not None else Variants()
    # an mtp-only run without variants is written as before (no drafter columns)
    with_drafters = tuple(roster.names) != ("mtp",) or bool(variants) or roster.grammar is not None
    names = [p.name for p in opts.profiles] + [RECORDED] if model is not None else []
    profiles = tuple(opts.profiles) + (recorded,) if model is not None else ()
    try:
        per_request = replay_session(model, requests, opts.k, profiles, opts.chunk_size,
                                     drafters=roster if with_drafters else None, recorder=recorder, observer=observer,
                                     variants=variants, whatifs=whatifs)
    except NonFiniteOutput as e:
        raise CheckpointError(f"{model.info.path}: {e} in session {session_id} ({where}); "
                              f"{non_finite_advice(model.dtype)}") from None
    positions = tables.positions_table(session_id, [(r.index, r.columns) for r in per_request], names,
                                       drafters=list(roster.names) + variants.names if with_drafters else None,
                                       target=model is not None,
                                       precisions=list(whatifs.names) if whatifs is not None else None,
                                       confidence=whatifs is not None and whatifs.confidence,
                                       grammar=roster.grammar is not None)
    table = tables.requests_table(session_id, requests, [r.fit for r in per_request], names,
                                  {"source": source, **recorded.as_dict()} if model is not None else None,
                                  speculative, routing=recorder.take() if recorder is not None else None,
                                  session_index=index)
    counts = {"requests": len(requests), "tokens_replayed": sum(len(r.input_ids) for r in requests),
              "scored_tokens": sum(sp.end - sp.start + 1 for r in requests for sp in r.spans), "rows": positions.num_rows,
              "anchors": sum(max(sp.end - max(sp.start, 1), 0) for r in requests for sp in r.spans),
              "max_request_tokens": max((len(r.input_ids) for r in requests), default=0)}
    return positions, table, counts
