"""The run read back and checked: a run directory as arrays the report's stages read.

Contract:
    load_run(path, drafter=None, variant=None, precision=None) -> Run
                                     reads a run directory of schema_version 1 to 4 (tables.py) and refuses anything
                                     else in one line (RunDirectoryError): a complete run must agree with its
                                     manifest's counts, probabilities must lie in [0, 1] and log-probabilities at or
                                     below 0 (float slack: PROB_SLACK, LOGPROB_SLACK); a session is one (part file,
                                     session_id), so two sessions that share an id are never merged; a version-1 run
                                     is read with a note per thing it lacks
    newest_run(root) -> Path         the run `mtp-observe report` reads when given none

Drafters (a run of several, tables.py): `load_run(path, drafter)` reads one drafter's rows (`judged_drafter`:
--drafter, default mtp when the run has it, else its first), so every later stage computes each drafter's
numbers by the same lines. Variants (version 3: a tree's rows, the stepwise layer rule's): `load_run(path,
variant=(name, depth))` reads that block as a Run of Kmax = its depth, with the tree's `tree_node` when it has one
(report/trees.py).
numbers by the same lines. What-ifs (version 3, `replay --head-precision`): `load_run(path, "mtp", precision)`
reads the rows of the head at that precision the same way; without `precision`, the served head's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads

from ..errors import OptionError, RunDirectoryError
from ..run.readers import PART, _run_error, count_rows, has_column, read_dataset
from ..run.tables import SEGMENTS, read_manifest
from .manifest import check_whatifs, judged_drafter, run_draft_ks, run_drafters, run_notes, run_precisions

FIT_STATS = ("support", "q", "q2", "var", "ll")
# Rounding the replay can leave in a correct value: a float32 log-softmax of a near-certain token is
# logit - logsumexp with both ~|50| (relative error 6e-8 each); sampler probabilities are float32 softmaxes.
LOGPROB_SLACK = 1e-4
PROB_SLACK = 1e-5


@dataclass(frozen=True)
class Rows:
    """positions.parquet as arrays, sorted by (session, request, pos, depth). R rows, P profiles."""

    session: np.ndarray  # [R] int64  index into Run.sessions
    request: np.ndarray  # [R] int64
    pos: np.ndarray  # [R] int64  the anchor p
    depth: np.ndarray  # [R] int64  k, 1..K
    segment: np.ndarray  # [R] int64  index into Run.segments (segment of the drafted token x_{p+k})
    turn: np.ndarray  # [R] int64  turn of the row's scored span
    accepted: np.ndarray  # [R] bool  match at every depth 1..k
    on_path: np.ndarray  # [R] bool  the same anchor's row at depth k-1 is accepted (True at k = 1)
    on_policy: np.ndarray  # [R] float64  1.0 where actual_token == target_token, else 0.0 (NaN: no target ran)
    p_accept: np.ndarray  # [R, P] float64  p_accept_<profile>
    draft_token: np.ndarray  # [R] int64
    anchor: np.ndarray  # [R] int64  index of the row's anchor (into Run.accepted_len)
    tree_node: np.ndarray | None = None  # [R] int64  a tree's rows only (tables.py, version 3); None otherwise
    confidence: np.ndarray | None = None  # [R] float64  llama.cpp's p of the draft (draft_confidence; None without)


@dataclass(frozen=True)
class Spans:
    """Scored spans [s, e] of requests.parquet, sorted by (session, request, start). N spans, P profiles."""

    session: np.ndarray  # [N] int64
    request: np.ndarray  # [N] int64
    start: np.ndarray  # [N] int64  s, the first generated token
    end: np.ndarray  # [N] int64  e, the end-of-turn token (inclusive)
    turn: np.ndarray  # [N] int64
    fit_tokens: np.ndarray  # [N] int64  scored tokens the fit sums cover (0 in a version-1 run)
    fit: np.ndarray  # [N, 5, P] float64  support, q, q2, var, ll per profile (FIT_STATS; zeros in a version-1 run)


@dataclass(frozen=True)
class LoopSteps:
    """The verify steps of `generate --speculative K`'s own loop, for the requests that carry them."""

    k: np.ndarray  # [M] int64  the loop's K, per request with a loop
    span: np.ndarray  # [M] int64  the request's scored span (an index into Run.spans; a token-level request has one)
    owner: np.ndarray  # [T] int64  each step's request (an index into k)
    anchor: np.ndarray  # [T] int64  the step's anchor p
    accepted: np.ndarray  # [T] int64  the drafts it kept


@dataclass(frozen=True)
class Run:
    """A run directory read back and checked. A anchors (one per depth-1 row)."""

    path: Path
    manifest: dict  # run.json as stored
    k: int  # Kmax replayed
    profiles: tuple[str, ...]  # sampling profiles, run.json order (p_accept_<profile>)
    sessions: tuple[str, ...]  # session ids with scored rows, in input order
    segments: tuple[str, ...]  # segment names; Rows.segment indexes this
    session_keys: tuple[tuple[str, str], ...]  # (part file name, or "" for a single-file table; session_id) per session
    rows: Rows
    spans: Spans
    accepted_len: np.ndarray  # [A] int64  accepted length at each anchor, in row order (= span order)
    notes: tuple[str, ...]  # what the reader noticed (partial run, sessions left out, what a version-1 run lacks)
    version: int = 3  # schema_version
    own_sampler: np.ndarray | None = None  # [S] bool  the session's `recorded` profile is its own meta.sampling
    longest: np.ndarray | None = None  # [S] int64  tokens of each session's longest request
    loop: "LoopSteps | None" = None  # what `generate --speculative K` recorded (requests.parquet `speculative`), or None
    drafter: str = "mtp"  # the drafter whose rows these are
    drafters: tuple[str, ...] = ("mtp",)  # every drafter of the run (run.json drafters)
    target_ran: bool = True  # False: a model-free replay (no target columns, no fit sums)
    accepted_len_by_k: np.ndarray | None = None  # [A, K] accepted length of the draft made for K' = 1..K (per-K
    #                                              drafters: suffix, the hybrids); None: the Kmax draft's, cut at K'
    draft_len: np.ndarray | None = None  # [A] int64  tokens each anchor's (Kmax) draft holds, past the end of the
    #                                      turn too (vLLM's num_draft_tokens of a step there); None: always K (mtp)
    draft_len_by_k: np.ndarray | None = None  # [A, K] the same for the draft made for K' = 1..K (per-K drafters)
    past_end: np.ndarray | None = None  # [A] int64  accepted_past_end of each anchor's (Kmax) draft (schema 5; None: 0)
    past_end_by_k: np.ndarray | None = None  # [A, K] the same for the draft made for K' = 1..K (per-K drafters)
    precision: str | None = None  # the what-if precision of the head these rows are of (None: the head as served)

    @property
    def has_fit(self) -> bool:
        return self.version >= 2 and self.target_ran


@dataclass(frozen=True)
class _Plan:
    """What load_run reads, decided from run.json and the tables' columns before a row is read."""

    path: Path
    manifest: dict  # run.json as stored
    k: int  # Kmax read: the run's, or the variant's depth
    target_ran: bool
    profiles: tuple[str, ...]  # () without a target
    status: str
    version: int  # schema_version
    counts: dict  # run.json counts ({} when it holds none)
    drafters: tuple[str, ...]  # every drafter of the run
    chosen: str  # the drafter (or variant) whose rows are read
    with_drafters: bool  # positions.parquet holds rows in blocks (a `drafter` column)
    draft_ks: tuple[int, ...]  # the K' the chosen drafter's rows were drafted for
    tree_rows: bool  # a tree's rows, with their tree_node
    precision: str | None  # the what-if precision read (None: the head as served)


def _plan(path: Path, drafter: str | None, variant: tuple[str, int] | None, precision: str | None) -> _Plan:
    """run.json read and checked, and what load_run reads of the tables (an unknown --drafter or precision refused)."""
    manifest = read_manifest(path)
    check_whatifs(path / "run.json", manifest)
    precisions = run_precisions(manifest)
    if precision is not None and precision not in precisions:
        raise OptionError(f"the run has no rows of the head at {precision}; it has {', '.join(precisions) or 'none'} "
                          "(replay --head-precision)")
    K = manifest["k"] if variant is None else int(variant[1])
    target_ran = manifest.get("target_ran", True) is not False
    version = int(manifest["schema_version"])
    drafters = run_drafters(manifest)
    chosen = judged_drafter(manifest, drafter) if variant is None else variant[0]
    positions_path = path / "positions.parquet"
    return _Plan(
        path=path, manifest=manifest, k=K, target_ran=target_ran,
        profiles=tuple(manifest.get("sampling", {})) if target_ran else (),
        status=str(manifest.get("status", "unknown")), version=version,
        counts=manifest.get("counts") if isinstance(manifest.get("counts"), dict) else {},
        drafters=drafters, chosen=chosen,
        # rows in blocks (drafters, or the head's variants beside mtp alone); a run of mtp alone without them has no column
        with_drafters=drafters != ("mtp",) or (version >= 3 and has_column(positions_path, "drafter")),
        draft_ks=run_draft_ks(manifest, chosen, K) if variant is None else (K,),
        tree_rows=variant is not None and has_column(positions_path, "tree_node") and chosen.startswith("tree:"),
        precision=precision,
    )


@dataclass(frozen=True)
class _Positions:
    """positions.parquet's rows of the plan's drafter, sorted by (session, request, pos, depth). R rows, P profiles."""

    sessions: tuple[str, ...]  # what each session is called (_session_names)
    session_keys: tuple[tuple[str, str], ...]  # (part, session_id) per session, in input order
    segments: tuple[str, ...]  # segment names; segment indexes this
    session: np.ndarray  # [R] int64
    request: np.ndarray  # [R] int64
    pos: np.ndarray  # [R] int64
    depth: np.ndarray  # [R] int64
    segment: np.ndarray  # [R] int64
    match: np.ndarray  # [R] bool
    accepted: np.ndarray  # [R] bool
    draft_token: np.ndarray  # [R] int64
    draft_len_rows: np.ndarray | None  # [R] int64  the rows' draft_len (None without the column, or for mtp)
    confidence: np.ndarray | None  # [R] float64  draft_confidence (None without it)
    on_policy: np.ndarray  # [R] float64
    p_accept: np.ndarray  # [R, P] float64
    tree_node: np.ndarray | None  # [R] int64  a tree's rows only
    with_draft_len: bool  # the rows carry draft_len
    past_end_rows: np.ndarray | None = None  # [R] int64  accepted_past_end (None without the column)


def _read_positions(plan: _Plan, notes: list[str]) -> _Positions:
    """1. positions.parquet -> arrays, sorted by (session, request, pos, depth); a session is (part, session_id). With
    drafters: this drafter's rows drafted for Kmax (those for K' < Kmax give accepted lengths only, step 2)."""
    path, chosen, K, target_ran, profiles = plan.path, plan.chosen, plan.k, plan.target_ran, plan.profiles
    positions_path = path / "positions.parquet"
    with_draft_len = plan.with_drafters and chosen != "mtp" and has_column(positions_path, "draft_len")
    with_past_end = target_ran and has_column(positions_path, "accepted_past_end")
    columns = ["session_id", "request", "pos", "depth", "segment", "draft_token", "actual_token", "match", "accepted",
               "draft_logprob"] + (["target_token", "target_logprob", "actual_logprob"] if target_ran else []) + \
              [f"p_accept_{p}" for p in profiles] + (["draft_len"] if with_draft_len else []) + \
              (["accepted_past_end"] if with_past_end else []) + \
              (["tree_node"] if plan.tree_rows else []) + [PART]
    confident = has_column(positions_path, "draft_confidence")
    columns += ["draft_confidence"] if confident else []
    rows_filter = _variant(chosen, K) if plan.with_drafters else None
    if has_column(positions_path, "head_precision"):  # the served head's rows, or one what-if precision's
        which = (pads.field("head_precision").is_null() if plan.precision is None
                 else pads.field("head_precision") == plan.precision)
        rows_filter = which if rows_filter is None else rows_filter & which
    table = read_dataset(positions_path, columns, plan.status, filter=rows_filter)
    if table.num_rows == 0:
        raise _run_error(positions_path, "has no rows" + (f" of drafter {chosen}" if plan.with_drafters else "") +
                         ": the run scored no assistant tokens, so there is nothing to report")
    session_codes, session_keys = _session_keys(table)
    session_codes, session_keys = _canonical_order(session_codes, session_keys, path, plan.status, plan.version,
                                                   plan.manifest, notes)
    sessions = _session_names(session_keys, notes)
    _check_ranges(table, profiles, positions_path, model_free=chosen != "mtp")
    segment_col = table.column("segment").to_pandas().astype("category")
    names = list(segment_col.cat.categories.astype(str))
    segments = tuple(SEGMENTS + sorted(n for n in names if n not in SEGMENTS))
    segment_codes = np.array([segments.index(n) for n in names] + [-1], dtype=np.int64)[segment_col.cat.codes.to_numpy()]

    def col(name, dtype=np.int64, table=table):
        return table.column(name).to_numpy(zero_copy_only=False).astype(dtype)

    session, request, pos, depth = session_codes, col("request"), col("pos"), col("depth")
    order = np.lexsort((depth, pos, request, session))
    session, request, pos, depth = session[order], request[order], pos[order], depth[order]
    segment = segment_codes[order]
    del segment_col, segment_codes, session_codes
    read = _Positions(
        sessions=sessions, session_keys=session_keys, segments=segments, session=session, request=request, pos=pos,
        depth=depth, segment=segment, match=col("match", bool)[order], accepted=col("accepted", bool)[order],
        draft_token=col("draft_token")[order],
        draft_len_rows=col("draft_len")[order] if with_draft_len else None,
        confidence=col("draft_confidence", np.float64)[order] if confident else None,
        on_policy=((col("actual_token")[order] == col("target_token")[order]).astype(np.float64) if target_ran
                   else np.full(len(order), np.nan)),
        p_accept=np.stack([col(f"p_accept_{p}", np.float64)[order] for p in profiles], axis=1) if profiles
        else np.zeros((len(order), 0)),
        tree_node=table.column("tree_node").fill_null(-3).to_numpy(zero_copy_only=False).astype(np.int64)[order]
        if plan.tree_rows else None,
        with_draft_len=with_draft_len,
        past_end_rows=col("accepted_past_end")[order] if with_past_end else None,
    )
    del table, order, col  # the arrays hold what the report reads: the Arrow buffers can go
    pa.default_memory_pool().release_unused()
    if (segment < 0).any():
        bad = int(np.flatnonzero(segment < 0)[0])
        raise _run_error(positions_path, f"session {sessions[session[bad]]} request {request[bad]} pos {pos[bad]} depth "
                         f"{depth[bad]} has no segment; the file is corrupt, re-run replay")
    return read


def _by_k(plan: _Plan, rows: _Positions, spans: "Spans", accepted_len: np.ndarray, draft_len: np.ndarray | None,
          past_end: np.ndarray | None, requests_path: Path) -> tuple[np.ndarray | None, ...]:
    """([A, K] accepted lengths, [A, K] draft lengths, [A, K] accepted_past_end or None) of the drafts made for every
    K' = 1..K by a per-K drafter (suffix, the hybrids; the same anchors), or Nones for a drafter whose draft at K' is
    its Kmax draft cut."""
    K, chosen, draft_ks = plan.k, plan.chosen, plan.draft_ks
    if len(draft_ks) <= 1:
        return None, None, None
    if sorted(draft_ks) != list(range(1, K + 1)):
        raise _run_error(plan.path / "run.json", f"drafters.{chosen}.draft_k is {list(draft_ks)}, expected [1, .., {K}] "
                                                 f"or [{K}]; the run directory is inconsistent")
    by_k = [(accepted_len, draft_len, past_end) if kk == K else _accepted_at(
        plan.path / "positions.parquet", plan.status, chosen, kk, rows.session_keys, spans, rows.sessions, requests_path,
        rows.with_draft_len, past_end is not None)
        for kk in range(1, K + 1)]
    return (np.stack([a for a, _, _ in by_k], axis=1), np.stack([d for _, d, _ in by_k], axis=1),
            np.stack([e for _, _, e in by_k], axis=1) if past_end is not None else None)


def load_run(path: str | Path, drafter: str | None = None, variant: tuple[str, int] | None = None,
             precision: str | None = None) -> Run:
    """Read and check a run directory (the rows of one drafter: `judged_drafter`; or of one variant, (name, depth):
    a tree's or the stepwise layer rule's block, version 3; with precision, the head's rows at that what-if
    precision, version 3). Every inconsistency a reader would trip on is one RunDirectoryError."""
    plan = _plan(Path(path), drafter, variant, precision)
    path, K, chosen, version, status = plan.path, plan.k, plan.chosen, plan.version, plan.status
    notes = run_notes(path, plan.manifest, variant)
    rows = _read_positions(plan, notes)
    positions_path = path / "positions.parquet"

    # 2. per draft length K' (one, Kmax, for mtp): the rows of one anchor are depths 1..m, contiguous;
    #    accepted(k) = match(k) and accepted(k-1); every anchor in exactly one span with rows at depths 1..min(K', e-p)
    requests_path = path / "requests.parquet"
    with_loop = version >= 2 and has_column(requests_path, "speculative")
    req = read_dataset(requests_path, ["session_id", "request", "n_tokens", "spans", PART]
                       + (["fit", "recorded_sampling"] if version >= 2 else []) + (["speculative"] if with_loop else []), status)
    spans = _flatten_spans(req, rows.session_keys, rows.sessions, requests_path, notes, plan.profiles,
                           read_fit=version >= 2 and plan.target_ran)
    on_path, anchor, accepted_len, span_index = _chains(K, rows.session, rows.request, rows.pos, rows.depth, rows.match,
                                                        rows.accepted, spans, rows.sessions, positions_path, requests_path)
    if status == "complete" and precision is None:
        _check_counts(path / "run.json", plan.counts, req, int((rows.depth == 1).sum()), count_rows(positions_path),
                      requests_path, positions_path)
    draft_len = None if chosen == "mtp" else _draft_lengths(rows.draft_len_rows, rows.depth, anchor, rows.draft_token, K,
                                                            positions_path)
    if chosen != "mtp" and not rows.with_draft_len:
        notes.append(f"{chosen}'s drafts have no recorded lengths (a run written before schema_version 3): a draft is "
                     "taken to end at the end of its turn, so the engine-counted draft tokens at a turn's last steps are "
                     "a lower bound")
    past_end = rows.past_end_rows[rows.depth == 1] if rows.past_end_rows is not None else None  # one per anchor
    accepted_len_by_k, draft_len_by_k, past_end_by_k = _by_k(plan, rows, spans, accepted_len, draft_len, past_end,
                                                             requests_path)
    checked = Rows(
        session=rows.session, request=rows.request, pos=rows.pos, depth=rows.depth, segment=rows.segment,
        turn=spans.turn[span_index][anchor], accepted=rows.accepted, on_path=on_path, on_policy=rows.on_policy,
        p_accept=rows.p_accept, draft_token=rows.draft_token, anchor=anchor, tree_node=rows.tree_node,
        confidence=rows.confidence,
    )
    own, longest = _session_facts(req, rows.session_keys, version)
    loop = _loop_steps(req, rows.session_keys, rows.sessions, spans, requests_path) if with_loop else None
    return Run(path=path, manifest=plan.manifest, k=K, profiles=plan.profiles, sessions=rows.sessions,
               segments=rows.segments, session_keys=rows.session_keys, rows=checked, spans=spans,
               accepted_len=accepted_len, notes=tuple(notes), version=version, own_sampler=own, longest=longest,
               loop=loop, drafter=chosen, drafters=plan.drafters, target_ran=plan.target_ran,
               accepted_len_by_k=accepted_len_by_k, draft_len=draft_len, draft_len_by_k=draft_len_by_k,
               precision=precision, past_end=past_end, past_end_by_k=past_end_by_k)


def _canonical_order(codes: np.ndarray, keys: tuple, path: Path, status: str, version: int, manifest: dict,
                     notes: list[str]) -> tuple[np.ndarray, tuple]:
    """Sessions renumbered in input order — requests.parquet `session_index` (version 3) — whatever order their
    parts list them in (torchrun ranks, merged shards, a Ray job's completion order): so the report of any of those
    equals the report of one process reading the input in order, bootstrap included (it resamples session
    numbers). A version-2 run has no such column: its sessions stay in the order its parts list them, which is
    input order for a run of one process."""
    if version < 3:
        if int(manifest.get("world_size") or 1) > 1:
            notes.append("schema_version 2 run of several processes: no session_index, so sessions are taken in the "
                         "order its parts list them (each rank's together), not in input order; the bootstrap's draws "
                         "follow that order (re-run replay to report it as one process would)")
        return codes, keys
    req = read_dataset(path / "requests.parquet", ["session_id", "session_index", PART], status)
    part_index, names = _part_of_rows(req)
    index_of: dict = {}
    for p, sid, i in zip(part_index.tolist(), req.column("session_id").to_pylist(),
                         req.column("session_index").to_pylist()):
        if i is not None:
            index_of.setdefault((names[p], sid), i)
    order = sorted(range(len(keys)), key=lambda s: (index_of.get(keys[s], float("inf")), s))
    rank = np.empty(len(keys), dtype=np.int64)
    rank[order] = np.arange(len(keys), dtype=np.int64)
    return rank[codes], tuple(keys[s] for s in order)


def _variant(drafter: str, k: int):
    """The dataset filter of one drafter's rows drafted for K' = k."""
    return (pads.field("drafter") == drafter) & (pads.field("draft_k") == k)


def _draft_lengths(draft_len_rows: np.ndarray | None, depth: np.ndarray, anchor: np.ndarray, draft_token: np.ndarray,
                   k: int, where: Path) -> np.ndarray:
    """[A] the tokens each anchor's draft holds: the rows' draft_len (schema 3; the same on every row of an anchor,
    at least the depths it drafted, at most k), or without it the depths with a draft (a draft read to end at the
    end of its turn)."""
    proposed = np.bincount(anchor, weights=draft_token >= 0, minlength=int((depth == 1).sum())).astype(np.int64)
    if draft_len_rows is None:
        return proposed
    first = depth == 1
    out = draft_len_rows[first]
    if np.any(draft_len_rows != out[anchor]) or np.any(out < proposed) or np.any(out > k):
        raise _run_error(where, f"draft_len disagrees with the rows' drafts (it must be one value per anchor, between the "
                                f"depths drafted and k = {k}); the file is corrupt, re-run replay")
    return out


def _accepted_at(positions_path: Path, status: str, drafter: str, k: int, session_keys, spans: "Spans", sessions,
                 requests_path: Path, with_draft_len: bool = False, with_past_end: bool = False) -> tuple:
    """([A] the accepted length, [A] the draft length, [A] accepted_past_end or None) at every anchor of the draft
    `drafter` made for K' = k (its rows with draft_k = k, checked as the Kmax rows are), in the anchor order of the
    Kmax rows."""
    table = read_dataset(positions_path, ["session_id", "request", "pos", "depth", "match", "accepted", "draft_token"]
                         + (["draft_len"] if with_draft_len else []) + (["accepted_past_end"] if with_past_end else [])
                         + [PART], status, filter=_variant(drafter, k))
    codes, keys = _session_keys(table)
    index = {key: i for i, key in enumerate(session_keys)}
    unknown = [key for key in keys if key not in index]
    if unknown:
        raise _run_error(positions_path, f"session {unknown[0][1]} has rows of {drafter} drafted for K = {k} but none for "
                                         "the largest K; the run directory is inconsistent, re-run replay")
    session = np.array([index[key] for key in keys], dtype=np.int64)[codes] if len(keys) else codes

    def col(name, dtype=np.int64, table=table):
        return table.column(name).to_numpy(zero_copy_only=False).astype(dtype)

    request, pos, depth = col("request"), col("pos"), col("depth")
    order = np.lexsort((depth, pos, request, session))
    _, anchor, accepted_len, _ = _chains(k, session[order], request[order], pos[order], depth[order],
                                         col("match", bool)[order], col("accepted", bool)[order], spans, sessions,
                                         positions_path, requests_path)
    draft_len = _draft_lengths(col("draft_len")[order] if with_draft_len else None, depth[order], anchor,
                               col("draft_token")[order], k, positions_path)
    past_end = col("accepted_past_end")[order][depth[order] == 1] if with_past_end else None
    return accepted_len, draft_len, past_end


def _chains(k: int, session, request, pos, depth, match, accepted, spans: "Spans", sessions,
            positions_path: Path, requests_path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows of one draft length k (sorted by session, request, pos, depth) checked as chains ->
    (on_path [R], anchor [R] index of each row's anchor, accepted_len [A], span_index [A] of each anchor)."""
    if depth.size == 0 or depth.min() < 1 or depth.max() > k:
        bad = int(np.flatnonzero((depth < 1) | (depth > k))[0]) if depth.size else None
        raise _run_error(positions_path, f"session {sessions[session[bad]]} request {request[bad]} pos {pos[bad]} has depth "
                         f"{depth[bad]}, outside 1..{k} (run.json k); the run directory is inconsistent" if bad is not None
                         else f"has no rows drafted for K = {k}; the run directory is incomplete, re-run replay")
    same_anchor = np.zeros(len(depth), dtype=bool)
    same_anchor[1:] = (session[1:] == session[:-1]) & (request[1:] == request[:-1]) & (pos[1:] == pos[:-1])
    previous_depth = np.concatenate([[0], depth[:-1]])
    contiguous = np.where(depth == 1, ~same_anchor, same_anchor & (previous_depth == depth - 1))
    if not contiguous.all():
        bad = int(np.flatnonzero(~contiguous)[0])
        raise _run_error(positions_path, f"session {sessions[session[bad]]} request {request[bad]} anchor {pos[bad]}: depth "
                         f"{depth[bad]} does not follow depth {depth[bad] - 1} (rows must be depths 1..m per anchor); "
                         "the file is corrupt, re-run replay")
    on_path = np.ones(len(depth), dtype=bool)
    on_path[1:] = np.where(depth[1:] == 1, True, accepted[:-1])
    consistent = accepted == (match & on_path)
    if not consistent.all():
        bad = int(np.flatnonzero(~consistent)[0])
        raise _run_error(positions_path, f"session {sessions[session[bad]]} request {request[bad]} anchor {pos[bad]} depth "
                         f"{depth[bad]}: accepted={bool(accepted[bad])} but match at depths 1..{depth[bad]} says "
                         f"{bool(match[bad] and on_path[bad])}; the file is corrupt, re-run replay")
    first = depth == 1
    anchor = np.cumsum(first) - 1  # [R]
    accepted_len = np.bincount(anchor, weights=accepted, minlength=int(first.sum())).astype(np.int64)

    # every anchor in exactly one span, one per position s..e-1, with rows at depths 1..min(k, e - p)
    a_session, a_request, a_pos = session[first], request[first], pos[first]
    span_index = _assign_spans(a_session, a_request, a_pos, spans)
    if (span_index < 0).any():
        bad = int(np.flatnonzero(span_index < 0)[0])
        raise _run_error(positions_path, f"session {sessions[a_session[bad]]} request {a_request[bad]} anchor {a_pos[bad]} "
                         f"lies in no scored span of {requests_path.name}; the run directory is inconsistent, re-run replay")
    anchors_per_span = np.bincount(span_index, minlength=len(spans.start))
    expected = spans.end - spans.start
    if not np.array_equal(anchors_per_span, expected):
        bad = int(np.flatnonzero(anchors_per_span != expected)[0])
        raise _run_error(positions_path, f"session {sessions[spans.session[bad]]} request {spans.request[bad]} span "
                         f"[{spans.start[bad]}, {spans.end[bad]}] has {anchors_per_span[bad]} anchor rows, expected "
                         f"{expected[bad]} (one per position s..e-1); the file is incomplete, re-run replay")
    depths_drafted = np.bincount(anchor)  # [A] m: rows at each anchor
    evaluable = np.minimum(k, spans.end[span_index] - a_pos)  # min(k, e - p): every evaluable depth has a row
    if not np.array_equal(depths_drafted, evaluable):
        bad = int(np.flatnonzero(depths_drafted != evaluable)[0])
        raise _run_error(positions_path, f"session {sessions[a_session[bad]]} request {a_request[bad]} anchor {a_pos[bad]} "
                         f"has rows at depths 1..{depths_drafted[bad]}, expected 1..{evaluable[bad]} (min(k, e - p)); "
                         "the file is incomplete, re-run replay")
    return on_path, anchor, accepted_len, span_index


def _loop_steps(requests: pa.Table, session_keys: tuple[tuple[str, str], ...], sessions: tuple[str, ...], spans: Spans,
                where: Path) -> LoopSteps | None:
    """requests.parquet's `speculative` column -> LoopSteps (None when no request has one); every anchor must lie in
    its request's one span [s, e-1], or the run is refused."""
    column = requests.column("speculative").combine_chunks()
    present = np.flatnonzero(column.is_valid().to_numpy(zero_copy_only=False))
    if present.size == 0:
        return None
    code = _request_sessions(requests, session_keys)[present]
    request = requests.column("request").to_numpy(zero_copy_only=False).astype(np.int64)[present]
    keep = code >= 0
    present, code, request = present[keep], code[keep], request[keep]
    values = column.take(pa.array(present)).to_pylist()
    pair = spans.session * (1 << 32) + spans.request
    k, span, owner, anchor, accepted = [], [], [], [], []
    for m, (c, r, v) in enumerate(zip(code.tolist(), request.tolist(), values)):
        lo, hi = np.searchsorted(pair, c * (1 << 32) + r, side="left"), np.searchsorted(pair, c * (1 << 32) + r, side="right")
        anchors, kept = list(v["anchors"] or []), list(v["accepted"] or [])
        if hi - lo != 1 or len(anchors) != len(kept):
            raise _run_error(where, f"session {sessions[c]} request {r}: speculative steps belong to a request with one "
                                    "scored span and one accepted length per anchor; the run directory is damaged, re-run replay")
        s, e = int(spans.start[lo]), int(spans.end[lo])
        if any(not s <= p < e for p in anchors) or any(not 0 <= a <= v["k"] for a in kept):
            raise _run_error(where, f"session {sessions[c]} request {r}: a speculative step lies outside the span [{s}, {e}] "
                                    f"or keeps more than k = {v['k']} drafts; the run directory is damaged, re-run replay")
        k.append(int(v["k"]))
        span.append(int(lo))
        owner += [m] * len(anchors)
        anchor += anchors
        accepted += kept
    k, span, owner, anchor, accepted = (np.array(x, dtype=np.int64) for x in (k, span, owner, anchor, accepted))
    return LoopSteps(k=k, span=span, owner=owner, anchor=anchor, accepted=accepted)


def _request_sessions(requests: pa.Table, session_keys: tuple[tuple[str, str], ...]) -> np.ndarray:
    """[n] the session code of each requests.parquet row (by its (part, session_id) key), -1 for a session
    without rows in positions.parquet."""
    index = {key: i for i, key in enumerate(session_keys)}
    part_index, names = _part_of_rows(requests)
    ids = requests.column("session_id").to_pylist()
    return np.array([index.get((names[p], s), -1) for p, s in zip(part_index.tolist(), ids)], dtype=np.int64)


def _session_facts(requests: pa.Table, session_keys: tuple[tuple[str, str], ...], version: int) -> tuple[np.ndarray, np.ndarray]:
    """([S] the session was scored with its own meta.sampling, [S] its longest request's tokens)."""
    code = _request_sessions(requests, session_keys)
    keep = code >= 0
    longest = np.zeros(len(session_keys), dtype=np.int64)
    np.maximum.at(longest, code[keep], requests.column("n_tokens").to_numpy(zero_copy_only=False).astype(np.int64)[keep])
    own = np.zeros(len(session_keys), dtype=bool)
    if version >= 2:
        source = requests.column("recorded_sampling").combine_chunks().field("source").to_pylist()
        np.logical_or.at(own, code[keep], np.array([x == "session" for x in source], dtype=bool)[keep])
    return own, longest


def _factorize(values) -> tuple[np.ndarray, tuple[str, ...]]:
    """Strings -> (codes [n] int64 by first appearance, the distinct values in that order)."""
    import pandas as pd

    codes, uniques = pd.factorize(values, sort=False)
    return codes.astype(np.int64), tuple(str(u) for u in uniques)


def _part_of_rows(table: pa.Table) -> tuple[np.ndarray, list[str]]:
    """([n] int64 index of each row's part, the part names) from read_dataset's PART column."""
    parts = table.column(PART).combine_chunks()
    return parts.indices.to_numpy(zero_copy_only=False).astype(np.int64), parts.dictionary.to_pylist()


def _session_keys(table: pa.Table) -> tuple[np.ndarray, tuple[tuple[str, str], ...]]:
    """Rows -> (session code [n] int64 by first appearance, (part, session_id) of each session). A part holds one
    session or a group of them (parts.py), ids unique within a run; keying by the pair keeps apart two sessions
    that share an id in different parts (runs of schema_version 1)."""
    import pandas as pd

    part_index, names = _part_of_rows(table)
    # Encoded by pyarrow (codes by first appearance, one dictionary over every chunk): millions of rows never
    # become Python strings.
    encoded = table.column("session_id").dictionary_encode().unify_dictionaries()
    ids = encoded.chunk(0).dictionary.to_pylist() if encoded.num_chunks else []
    id_codes = np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in encoded.chunks]).astype(np.int64) \
        if encoded.num_chunks else np.zeros(0, dtype=np.int64)
    width = len(ids) + 1
    codes, pairs = pd.factorize(part_index * width + id_codes, sort=False)
    keys = tuple((str(names[p // width]), str(ids[p % width])) for p in pairs)
    return codes.astype(np.int64), keys


def _session_names(keys: tuple[tuple[str, str], ...], notes: list[str]) -> tuple[str, ...]:
    """What each session is called: its id, or '<id> [<part>]' for an id that more than one part holds."""
    from collections import Counter

    repeated = Counter(sid for _, sid in keys)
    shared = sorted(sid for sid, n in repeated.items() if n > 1)
    if shared:
        notes.append(f"{len(shared)} session id(s) appear in more than one part (e.g. {shared[0]!r}: a run written before "
                     "ids were unique within a run); those sessions are reported apart as '<id> [<part>]'")
    return tuple(f"{sid} [{part}]" if repeated[sid] > 1 else sid for part, sid in keys)


def _check_ranges(table: pa.Table, profiles: tuple[str, ...], where: Path, model_free: bool = False) -> None:
    """Probabilities in [0, 1] and log-probabilities <= 0 (within the rounding slack); NaN and inf are outside —
    except where a value is undefined: target_logprob where nothing was proposed (draft_token -1), draft_logprob of
    a drafter other than the head (model_free: NaN where it did not take the head's draft)."""
    bounds = [(c, -np.inf, LOGPROB_SLACK) for c in ("draft_logprob", "target_logprob", "actual_logprob") if c in table.column_names]
    bounds += [(f"p_accept_{p}", -PROB_SLACK, 1 + PROB_SLACK) for p in profiles]
    proposed = table.column("draft_token").to_numpy(zero_copy_only=False) >= 0
    for name, lo, hi in bounds:
        values = table.column(name).to_numpy(zero_copy_only=False)
        outside = ~((values >= lo) & (values <= hi)) | np.isinf(values)
        if name == "target_logprob":
            outside &= proposed | ~np.isnan(values)
        elif name == "draft_logprob" and model_free:
            outside &= ~np.isnan(values)
        if outside.any():
            i = int(np.flatnonzero(outside)[0])
            lo_text = "-inf" if lo == -np.inf else f"{lo:g}"
            raise _run_error(where, f"{name} has {int(outside.sum())} value(s) outside [{lo_text}, {hi:g}] (the first: "
                                    f"{values[i]!r} in session {table.column('session_id')[i].as_py()}); the run "
                                    "directory is damaged, re-run replay")


def _check_counts(manifest_path: Path, counts: dict, requests: pa.Table, anchors: int, rows: int, requests_path: Path,
                  positions_path: Path) -> None:
    """A complete run holds what its manifest counted: a part deleted, added or cut since is one line. anchors: the
    drafter's anchors (every drafter drafts at the same ones); rows: every drafter's rows."""
    spans = requests.column("spans").combine_chunks().flatten()
    part_index, _ = _part_of_rows(requests)
    keys = set(zip(part_index.tolist(), requests.column("session_id").to_pylist()))
    actual = {
        "sessions_ok": (len(keys), "the run holds", "session" if len(keys) == 1 else "sessions"),
        "requests": (requests.num_rows, f"{requests_path.name} holds", "requests"),
        "tokens_replayed": (int(np.sum(requests.column("n_tokens").to_numpy(zero_copy_only=False))),
                            f"{requests_path.name} holds", "tokens"),
        "scored_tokens": (int(np.sum(spans.field("end").to_numpy(zero_copy_only=False) -
                                     spans.field("start").to_numpy(zero_copy_only=False) + 1)),
                          f"{requests_path.name} spans hold", "scored tokens"),
        "anchors": (anchors, f"{positions_path.name} holds", "anchors"),
        "rows": (rows, f"{positions_path.name} holds", "rows"),
    }
    for key, (value, where, what) in actual.items():
        expected = counts.get(key)
        if isinstance(expected, int) and not isinstance(expected, bool) and expected != value:
            raise _run_error(manifest_path, f"counts.{key} is {expected} but {where} {value} {what}; the run directory "
                                            "changed after the replay wrote it (a part deleted, added or cut?): re-run replay")


def _flatten_spans(requests: pa.Table, session_keys: tuple[tuple[str, str], ...], sessions: tuple[str, ...], where: Path,
                   notes: list[str], profiles: tuple[str, ...], read_fit: bool) -> Spans:
    """Spans sorted by (session, request, start), with their fit sums (zeros without read_fit: a version-1 run)."""
    spans_col = requests.column("spans").combine_chunks()
    lengths = spans_col.value_lengths().fill_null(0).to_numpy().astype(np.int64)
    flat = spans_col.flatten()
    session_ids = requests.column("session_id").to_pylist()
    request_session = _request_sessions(requests, session_keys)
    left_out = {s for s, c, n in zip(session_ids, request_session, lengths) if c < 0 and n > 0}
    if left_out:
        notes.append(f"{len(left_out)} session(s) of {where.name} have scored spans but no rows in positions.parquet "
                     "and are left out")
    session = np.repeat(request_session, lengths)
    request = np.repeat(requests.column("request").to_numpy(zero_copy_only=False).astype(np.int64), lengths)
    start = flat.field("start").to_numpy(zero_copy_only=False).astype(np.int64)
    end = flat.field("end").to_numpy(zero_copy_only=False).astype(np.int64)
    turn = flat.field("turn").to_numpy(zero_copy_only=False).astype(np.int64)
    P = len(profiles)
    fit_tokens, fit = np.zeros(len(start), dtype=np.int64), np.zeros((len(start), len(FIT_STATS), P))
    if read_fit:
        fit_col = requests.column("fit").combine_chunks()
        if not np.array_equal(fit_col.value_lengths().fill_null(0).to_numpy(), lengths):
            raise _run_error(where, "fit has not one entry per span in some request; the file is corrupt, re-run replay")
        fit_flat = fit_col.flatten()
        fields = {f.name for f in fit_flat.type}
        missing = [f"{stat}_{p}" for p in profiles for stat in FIT_STATS if f"{stat}_{p}" not in fields]
        if missing:
            raise _run_error(where, f"fit has no {missing[0]}; it was not written with this run's profiles (re-run replay)")
        fit_tokens = fit_flat.field("tokens").to_numpy(zero_copy_only=False).astype(np.int64)
        for j, stat in enumerate(FIT_STATS):
            for i, prof in enumerate(profiles):
                fit[:, j, i] = fit_flat.field(f"{stat}_{prof}").to_numpy(zero_copy_only=False).astype(np.float64)
    keep = session >= 0
    session, request, start, end, turn = session[keep], request[keep], start[keep], end[keep], turn[keep]
    fit_tokens, fit = fit_tokens[keep], fit[keep]
    order = np.lexsort((start, request, session))
    spans = Spans(session=session[order], request=request[order], start=start[order], end=end[order], turn=turn[order],
                  fit_tokens=fit_tokens[order], fit=fit[order])
    bad = spans.end < spans.start
    same_request = (spans.session[1:] == spans.session[:-1]) & (spans.request[1:] == spans.request[:-1])
    bad[1:] |= same_request & (spans.start[1:] <= spans.end[:-1])
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _run_error(where, f"session {sessions[spans.session[i]]} request {spans.request[i]} span "
                         f"[{spans.start[i]}, {spans.end[i]}] is empty-reversed or overlaps the span before it; "
                         "the run directory is inconsistent, re-run replay")
    return spans


def _assign_spans(session: np.ndarray, request: np.ndarray, pos: np.ndarray, spans: Spans) -> np.ndarray:
    """For each anchor (sorted by session, request, pos): the index of the span [s, e) holding it, or -1."""
    pair = session * (1 << 32) + request  # requests are int32 >= 0; sessions < 2^31
    span_pair = spans.session * (1 << 32) + spans.request
    pairs = np.unique(np.concatenate([pair, span_pair]))
    # One coordinate per (session, request, position): pair rank * 2^31 + position.
    coordinate = np.searchsorted(pairs, pair) * (1 << 31) + pos
    span_start = np.searchsorted(pairs, span_pair) * (1 << 31) + spans.start
    span_end = np.searchsorted(pairs, span_pair) * (1 << 31) + spans.end
    index = np.searchsorted(span_start, coordinate, side="right") - 1
    inside = (index >= 0) & (coordinate < span_end[np.maximum(index, 0)])
    return np.where(inside, index, -1)


def newest_run(root: str | Path = "reports") -> Path:
    """The newest run directory under root: by run.json `created`, else by run.json's mtime."""
    root = Path(root)
    candidates = [d for d in root.iterdir() if (d / "run.json").is_file()] if root.is_dir() else []
    if not candidates:
        raise RunDirectoryError(f"{root}/: holds no run directory (a directory with run.json); pass RUN, "
                                "or write one with `mtp-observe replay`")

    def when(d: Path) -> tuple[float, str]:
        try:
            created = json.loads((d / "run.json").read_text()).get("created")
            return datetime.fromisoformat(str(created).replace("Z", "+00:00")).timestamp(), d.name
        except (ValueError, TypeError, OSError, AttributeError, json.JSONDecodeError):
            return (d / "run.json").stat().st_mtime, d.name

    return max(candidates, key=when)
