"""The report: a run directory read back, summarised, judged against a gate, compared with a baseline.

Contract:
    load_run(path) -> Run            reads a run directory of schema_version 1 or 2 (tables.py) and
                                     refuses anything else in one line (RunDirectoryError): a complete
                                     run must agree with its manifest's counts, probabilities must lie in
                                     [0, 1] and log-probabilities at or below 0 (float slack: PROB_SLACK,
                                     LOGPROB_SLACK); a session is one (part file, session_id), so two
                                     sessions that share an id are never merged; a version-1 run is read
                                     with a note per thing it lacks
    newest_run(root) -> Path         the run `mtp-observe report` reads when given none
    resolve_cost(run, ...) -> Cost   the speedup denominator: --probe, else --draft-cost, else roofline
    summarize(run, cost, ...) -> Report
                                     every metric of ACCEPTANCE.md per K <= Kmax, sliced by segment,
                                     context length, turn and session, with bootstrap intervals, the
                                     recording sampler, the best K and the verdict
    compare(report, baseline) -> Comparison
                                     the same numbers as differences, flagged where the difference's
                                     interval excludes zero; resamples paired over the sessions both share
    report_json(report, comparison) -> dict
                                     the stable JSON (`--format json`, keys in README.md)
    read_and_summarize(path, ...) -> Reading
                                     all of the above, as `mtp-observe report` runs it

Decisions, written down once:
- τ_sim is the verdict's τ: speedup, best K and the gate read the simulated decode (exact for chain
  speculation on the recorded trajectory when the traffic is the target's own under its recording
  sampler). τ(K) is shown under vLLM's name, "mean acceptance length" (per-position formula).
- The recording sampler: `replay --recorded-with` (run.json) or `report --recorded-with` declares it;
  a run whose sessions carry their own meta.sampling declares it per session (the `recorded` profile);
  otherwise the best-fitting candidate (metrics.best_fit: the likeliest that fits) is named. UNRELIABLE only when the
  traffic fits no declared or candidate sampler (metrics.fits), with the statistics.
- What-if under another profile S: τ_S = span tokens / expected steps of the walk with S's acceptance
  probabilities (metrics.expected_decode_steps). Depth j's probability is p_accept_S of the row while
  the chain is on the recorded path; once an earlier draft was not the recorded token the row's
  p_accept is conditioned on the wrong prefix, so the run's mean conditional rate ᾱ_j(S) stands in.
  An estimate, and labelled so; the bootstrap treats ᾱ as fixed.
- Intervals: with at least metrics.MIN_SESSIONS_FOR_BOOTSTRAP sessions, whole sessions are resampled;
  with fewer, turns within sessions (said in a note: the interval then reflects turn-to-turn variation
  only); a run of one session, an interval of zero width or none at all makes no verdict.
- The verdict: UNRELIABLE when the run is not complete, the traffic fits no sampler, it has fewer than
  metrics.MIN_SESSIONS_FOR_VERDICT sessions, or the interval cannot be estimated; else GO when the lower
  bound of the gated metric at the best K clears the threshold, NO-GO otherwise.
- Context slices: rows by the anchor's position p (CONTEXT_BINS); τ_sim and the fit sums of a context
  slice walk the turns that start in it.
- Drafters (a run of several, tables.py): `load_run(path, drafter)` reads one drafter's rows, so every metric
  above is computed for each drafter by the same lines; the judged drafter (`--drafter`, default mtp when the
  run has it, else its first) gets the slices, the verdict and the baseline comparison, and every drafter is
  summarised and ranked beside it (`summarize_drafters`) on the same resamples (paired). Each pays its own draft
  cost (`drafter_cost`): the head's c for mtp and the hybrids, 0 for ngram and suffix (CPU-side); v(K) is every
  drafter's. τ_sim(K) of a per-K drafter (suffix, the hybrids) walks the draft made for K; α_k, A_k, τ(K) and the
  what-if read its Kmax drafts. The recording-sampler check is of the traffic, so the same for every drafter;
  a model-free replay ran no target, so it has no check and its verdict is UNRELIABLE, saying what the numbers
  are (the drafts' agreement with the recorded tokens, not a serving prediction).

Counts are taken here (`tally`); rates are derived only in `metrics.py`; presenting lives in
`presentation.py` and `heatmap.py`. Imports no torch: pandas, numpy and pyarrow only, so a CI job
reads a run without the model stack.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads

from .cost import (
    DEFAULT_BATCHES, DEFAULT_DEVICE, ExpertCounts, Geometry, StepTimes, batch1_times, batch_speedup, best_k, break_even,
    check_schedule, expected_distinct, parse_device, parse_gated, roofline_times, schedule, step_times_from_probe,
)
from .errors import OptionError, RunDirectoryError
from .metrics import (
    CALIBRATION_TOLERANCE, MIN_SESSIONS_FOR_BOOTSTRAP, MIN_SESSIONS_FOR_VERDICT, MIN_SUPPORT, MIN_TURNS_FOR_BOOTSTRAP,
    LL_FLOOR, RATE_FIELDS, Z_MAX, Counts, Rates, best_fit, bootstrap_weights, decode_walk, expected_decode_steps, fits,
    nanmean, percentile_interval, rates, stratified_weights, top_k,
)
from .tables import SEGMENTS, _one_line, _run_error, read_manifest

REPORT_VERSION = 2  # the "report_version" of report_json; bump on an incompatible key change (2: best.tau_sim is the
# verdict's τ, speedup from τ_sim, recorded_with, slices.context, tau_profile is the position-aware what-if estimate)
CONTEXT_BINS = ((0, 4096, "0-4k"), (4096, 16384, "4k-16k"), (16384, 32768, "16k-32k"), (32768, 65536, "32k-64k"),
                (65536, None, "64k+"))  # [lo, hi) of the anchor position p
FIT_STATS = ("support", "q", "q2", "var", "ll")
PROBE_VERSION = 2  # the "probe_version" probe.json carries (written by probe.py; 2 added batch_sizes and batches)
MAX_REPLICATES = 100_000  # bootstrap weights are [replicates, sessions] float64: past this, memory, not accuracy
# Rounding the replay can leave in a correct value: a float32 log-softmax of a near-certain token is
# logit - logsumexp with both ~|50| (relative error 6e-8 each); sampler probabilities are float32 softmaxes.
LOGPROB_SLACK = 1e-4
PROB_SLACK = 1e-5

# ---------------------------------------------------------------------------------------------
# 1. Reading a run directory


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
    version: int = 2  # schema_version
    own_sampler: np.ndarray | None = None  # [S] bool  the session's `recorded` profile is its own meta.sampling
    longest: np.ndarray | None = None  # [S] int64  tokens of each session's longest request
    loop: "LoopSteps | None" = None  # what `generate --speculative K` recorded (requests.parquet `speculative`), or None
    drafter: str = "mtp"  # the drafter whose rows these are
    drafters: tuple[str, ...] = ("mtp",)  # every drafter of the run (run.json drafters)
    target_ran: bool = True  # False: a model-free replay (no target columns, no fit sums)
    accepted_len_by_k: np.ndarray | None = None  # [A, K] accepted length of the draft made for K' = 1..K (per-K
    #                                              drafters: suffix, the hybrids); None: the Kmax draft's, cut at K'

    @property
    def has_fit(self) -> bool:
        return self.version >= 2 and self.target_ran


PART = "__part"  # a column read_dataset adds on request: each row's part file name ("" for a single-file table)


def read_dataset(path: Path, columns: list[str], status: str, filter=None) -> pa.Table:
    """A Parquet dataset path (one file or a directory of parts; dot-prefixed files are skipped). The column
    PART, when asked for, is a dictionary column of the part file names, read as the scanner's fragment index."""
    if not path.exists():
        raise _run_error(path, "missing; the run directory is incomplete (re-run `mtp-observe replay`)")
    try:
        dataset = pads.dataset(str(path), format="parquet")
        if not dataset.files:
            raise _run_error(path, f"holds no Parquet parts (run status: {status}); nothing has been written yet")
        missing = [c for c in columns if c not in dataset.schema.names and c != PART]
        if missing:
            raise _run_error(path, f"has no column(s) {', '.join(missing)}; it was not written with this run's "
                                   "schema (re-run replay)")
        if PART not in columns:
            return dataset.to_table(columns=columns, filter=filter)
        table = dataset.to_table(columns=[c if c != PART else "__fragment_index" for c in columns], filter=filter)
        names = [Path(f).name for f in dataset.files] if path.is_dir() else [""] * len(dataset.files)
        index = table.column("__fragment_index").combine_chunks()
        parts = pa.DictionaryArray.from_arrays(index, pa.array(names, pa.string()))
        return table.set_column(table.schema.get_field_index("__fragment_index"), PART, parts)
    except (pa.ArrowException, OSError) as e:
        raise _run_error(path, f"cannot be read as Parquet ({_one_line(e)}); the run directory is damaged") from None


def run_drafters(manifest: dict) -> tuple[str, ...]:
    """The drafters a run holds rows of, in run.json order (a run without `drafters` is an mtp-only run)."""
    drafters = manifest.get("drafters")
    return tuple(drafters) if isinstance(drafters, dict) and drafters else ("mtp",)


def judged_drafter(manifest: dict, drafter: str | None = None) -> str:
    """The drafter a report reads: --drafter NAME, else mtp when the run has it, else its first drafter."""
    names = run_drafters(manifest)
    if drafter is None:
        return "mtp" if "mtp" in names else names[0]
    if drafter not in names:
        raise OptionError(f"--drafter {drafter}: the run has no rows of it; it has {', '.join(names)}")
    return drafter


def _draft_ks(manifest: dict, drafter: str, k: int) -> tuple[int, ...]:
    entry = (manifest.get("drafters") or {}).get(drafter) or {}
    ks = entry.get("draft_k") if isinstance(entry, dict) else None
    return tuple(int(x) for x in ks) if isinstance(ks, list) and ks else (k,)


def load_run(path: str | Path, drafter: str | None = None) -> Run:
    """Read and check a run directory (the rows of one drafter: `judged_drafter`). Every inconsistency a reader
    would trip on is one RunDirectoryError."""
    path = Path(path)
    manifest = read_manifest(path)
    K = manifest["k"]
    target_ran = manifest.get("target_ran", True) is not False
    profiles = tuple(manifest.get("sampling", {})) if target_ran else ()
    status = str(manifest.get("status", "unknown"))
    version = int(manifest["schema_version"])
    counts = manifest.get("counts") if isinstance(manifest.get("counts"), dict) else {}
    drafters = run_drafters(manifest)
    chosen = judged_drafter(manifest, drafter)
    with_drafters = drafters != ("mtp",)
    draft_ks = _draft_ks(manifest, chosen, K)
    notes: list[str] = []
    if status != "complete":
        notes.append(f"run status is {status!r}: the report covers the sessions written so far")
    elif counts.get("sessions_ok") == 0:
        raise _run_error(path / "run.json", f"the run replayed no session ({counts.get('sessions_skipped', 0)} skipped; "
                                            "the reasons are under errors in run.json): there is nothing to report")
    if version < 2:
        notes.append("schema_version 1 run: no recording-sampler sums, so only greedy traffic can be recognised "
                     "(the on-policy rate); re-run replay for sampled traffic")
        notes.append("schema_version 1 run: its profiles have no penalties or min-p, and no what-if estimates "
                     "(they need the sampler sums); re-run replay for them")
    if not target_ran:
        notes.append(f"a model-free replay ({', '.join(drafters)}): no target ran, so there is no p_accept, no on-policy "
                     "rate, no recording-sampler check and no what-if; the rows compare drafts with the recorded tokens "
                     "only (replay with mtp in --drafters for the rest)")

    # 1. positions.parquet -> arrays, sorted by (session, request, pos, depth); a session is (part, session_id). With
    #    drafters: this drafter's rows drafted for Kmax (those for K' < Kmax give accepted lengths only, step 2)
    positions_path = path / "positions.parquet"
    columns = ["session_id", "request", "pos", "depth", "segment", "draft_token", "actual_token", "match", "accepted",
               "draft_logprob"] + (["target_token", "target_logprob", "actual_logprob"] if target_ran else []) + \
              [f"p_accept_{p}" for p in profiles] + [PART]
    table = read_dataset(positions_path, columns, status, filter=_variant(chosen, K) if with_drafters else None)
    if table.num_rows == 0:
        raise _run_error(positions_path, "has no rows" + (f" of drafter {chosen}" if with_drafters else "") +
                         ": the run scored no assistant tokens, so there is nothing to report")
    session_codes, session_keys = _session_keys(table)
    sessions = _session_names(session_keys, notes)
    _check_ranges(table, profiles, positions_path, model_free=chosen != "mtp")
    segment_col = table.column("segment").to_pandas().astype("category")
    names = list(segment_col.cat.categories.astype(str))
    segments = tuple(SEGMENTS + sorted(n for n in names if n not in SEGMENTS))
    segment_codes = np.array([segments.index(n) for n in names] + [-1], dtype=np.int64)[segment_col.cat.codes.to_numpy()]

    def col(name, dtype=np.int64):
        return table.column(name).to_numpy(zero_copy_only=False).astype(dtype)

    session, request, pos, depth = session_codes, col("request"), col("pos"), col("depth")
    order = np.lexsort((depth, pos, request, session))
    session, request, pos, depth = session[order], request[order], pos[order], depth[order]
    segment = segment_codes[order]
    del segment_col, segment_codes, session_codes
    match, accepted = col("match", bool)[order], col("accepted", bool)[order]
    draft_token = col("draft_token")[order]
    on_policy = ((col("actual_token")[order] == col("target_token")[order]).astype(np.float64) if target_ran
                 else np.full(len(order), np.nan))
    p_accept = np.stack([col(f"p_accept_{p}", np.float64)[order] for p in profiles], axis=1) if profiles \
        else np.zeros((len(order), 0))
    del table, order  # the arrays hold what the report reads: the Arrow buffers can go
    pa.default_memory_pool().release_unused()
    if (segment < 0).any():
        bad = int(np.flatnonzero(segment < 0)[0])
        raise _run_error(positions_path, f"session {sessions[session[bad]]} request {request[bad]} pos {pos[bad]} depth "
                         f"{depth[bad]} has no segment; the file is corrupt, re-run replay")

    # 2. per draft length K' (one, Kmax, for mtp): the rows of one anchor are depths 1..m, contiguous;
    #    accepted(k) = match(k) and accepted(k-1); every anchor in exactly one span with rows at depths 1..min(K', e-p)
    requests_path = path / "requests.parquet"
    with_loop = version >= 2 and _has_column(requests_path, "speculative")
    req = read_dataset(requests_path, ["session_id", "request", "n_tokens", "spans", PART]
                       + (["fit", "recorded_sampling"] if version >= 2 else []) + (["speculative"] if with_loop else []), status)
    spans = _flatten_spans(req, session_keys, sessions, requests_path, notes, profiles, read_fit=version >= 2 and target_ran)
    on_path, anchor, accepted_len, span_index = _chains(K, session, request, pos, depth, match, accepted, spans, sessions,
                                                        positions_path, requests_path)
    if status == "complete":
        _check_counts(path / "run.json", counts, req, int((depth == 1).sum()), _count_rows(positions_path),
                      requests_path, positions_path)
    accepted_len_by_k = None
    if len(draft_ks) > 1:  # a per-K drafter: the accepted length of the draft made for every K' (same anchors)
        if sorted(draft_ks) != list(range(1, K + 1)):
            raise _run_error(path / "run.json", f"drafters.{chosen}.draft_k is {list(draft_ks)}, expected [1, .., {K}] or "
                                                f"[{K}]; the run directory is inconsistent")
        accepted_len_by_k = np.stack([accepted_len if kk == K else _accepted_at(
            positions_path, status, chosen, kk, session_keys, spans, sessions, requests_path) for kk in range(1, K + 1)],
            axis=1)
    rows = Rows(
        session=session, request=request, pos=pos, depth=depth, segment=segment,
        turn=spans.turn[span_index][anchor], accepted=accepted, on_path=on_path, on_policy=on_policy,
        p_accept=p_accept, draft_token=draft_token, anchor=anchor,
    )
    own, longest = _session_facts(req, session_keys, version)
    loop = _loop_steps(req, session_keys, sessions, spans, requests_path) if with_loop else None
    return Run(path=path, manifest=manifest, k=K, profiles=profiles, sessions=sessions, segments=segments,
               session_keys=session_keys, rows=rows, spans=spans, accepted_len=accepted_len, notes=tuple(notes),
               version=version, own_sampler=own, longest=longest, loop=loop, drafter=chosen, drafters=drafters,
               target_ran=target_ran, accepted_len_by_k=accepted_len_by_k)


def _variant(drafter: str, k: int):
    """The dataset filter of one drafter's rows drafted for K' = k."""
    return (pads.field("drafter") == drafter) & (pads.field("draft_k") == k)


def _accepted_at(positions_path: Path, status: str, drafter: str, k: int, session_keys, spans: "Spans", sessions,
                 requests_path: Path) -> np.ndarray:
    """[A] the accepted length at every anchor of the draft `drafter` made for K' = k (its rows with draft_k = k,
    checked as the Kmax rows are), in the anchor order of the Kmax rows."""
    table = read_dataset(positions_path, ["session_id", "request", "pos", "depth", "match", "accepted", PART], status,
                         filter=_variant(drafter, k))
    codes, keys = _session_keys(table)
    index = {key: i for i, key in enumerate(session_keys)}
    unknown = [key for key in keys if key not in index]
    if unknown:
        raise _run_error(positions_path, f"session {unknown[0][1]} has rows of {drafter} drafted for K = {k} but none for "
                                         "the largest K; the run directory is inconsistent, re-run replay")
    session = np.array([index[key] for key in keys], dtype=np.int64)[codes] if len(keys) else codes

    def col(name, dtype=np.int64):
        return table.column(name).to_numpy(zero_copy_only=False).astype(dtype)

    request, pos, depth = col("request"), col("pos"), col("depth")
    order = np.lexsort((depth, pos, request, session))
    _, _, accepted_len, _ = _chains(k, session[order], request[order], pos[order], depth[order], col("match", bool)[order],
                                    col("accepted", bool)[order], spans, sessions, positions_path, requests_path)
    return accepted_len


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


def _count_rows(path: Path) -> int:
    """Rows of a Parquet dataset (every drafter's), from the files' metadata."""
    try:
        return int(pads.dataset(str(path), format="parquet").count_rows())
    except (pa.ArrowException, OSError) as e:
        raise _run_error(path, f"cannot be read as Parquet ({_one_line(e)}); the run directory is damaged") from None


def _has_column(path: Path, name: str) -> bool:
    """Whether a Parquet dataset path has a column (False where it cannot be read: read_dataset says why)."""
    try:
        return name in pads.dataset(str(path), format="parquet").schema.names
    except (pa.ArrowException, OSError):
        return False


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


# ---------------------------------------------------------------------------------------------
# 2. The draft cost: the speedup's denominator


@dataclass(frozen=True)
class Cost:
    """speedup(K) = τ(K) / (1 + K·c + v(K)), in units of one target decode step."""

    c: float  # cost of one draft step / one target decode step
    verify_extra: np.ndarray  # [K] v(K) = verify(K+1 tokens) / decode(1 token) - 1, >= 0 (0 without a probe)
    source: str  # "probe" | "draft-cost" | "roofline"
    detail: str  # where the numbers came from, for people
    notes: tuple[str, ...]


def read_probe(path: str | Path) -> dict:
    """probe.json (written by `mtp-observe probe`), checked; keys in probe.py's docstring."""
    path = Path(path)
    try:
        probe = json.loads(path.read_text())
    except FileNotFoundError:
        raise OptionError(f"--probe {path}: no such file; write one with `mtp-observe probe MODEL -o {path}`") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise OptionError(f"--probe {path}: cannot be read as JSON ({_one_line(e)}); re-run `mtp-observe probe`") from None
    if not isinstance(probe, dict) or "probe_version" not in probe:
        raise OptionError(f"--probe {path}: not a probe.json (no probe_version); write one with `mtp-observe probe MODEL`")
    if not isinstance(probe["probe_version"], int) or probe["probe_version"] > PROBE_VERSION:
        raise OptionError(f"--probe {path}: probe_version {probe['probe_version']!r} is newer than this mtp-observe reads "
                          f"({PROBE_VERSION}); upgrade mtp-observe")
    c = probe.get("draft_cost")
    verify = probe.get("verify")
    ok = _finite(c) and c > 0 and isinstance(verify, list) and all(
        isinstance(v, dict) and isinstance(v.get("k"), int) and _finite(v.get("extra")) for v in verify)
    if not ok:
        raise OptionError(f"--probe {path}: draft_cost or verify is missing or not numeric; re-run `mtp-observe probe`")
    if probe["probe_version"] >= 2 and not _batches_ok(probe.get("batches")):
        raise OptionError(f"--probe {path}: batches is missing or not numeric (probe_version 2); re-run `mtp-observe probe`")
    return probe


def _batches_ok(batches) -> bool:
    def timing(t) -> bool:
        return isinstance(t, dict) and _finite(t.get("median_s")) and t["median_s"] > 0

    return isinstance(batches, list) and len(batches) > 0 and all(
        isinstance(b, dict) and isinstance(b.get("batch"), int) and b["batch"] >= 1 and timing(b.get("target_decode"))
        and timing(b.get("draft_step")) and isinstance(b.get("verify"), list) and all(timing(v) and isinstance(v.get("k"), int)
                                                                                    for v in b["verify"])
        for b in batches) and len({b["batch"] for b in batches}) == len(batches)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def verify_extra_from_probe(probe: dict, k: int) -> tuple[np.ndarray, str | None]:
    """v(1..k) from probe.json's verify list; past the probe's largest K, extended linearly.

    Clamped at 0: verifying K+1 tokens never costs less than decoding one, whatever the timer's noise.
    """
    measured = {int(v["k"]): float(v["extra"]) for v in probe["verify"] if int(v["k"]) >= 1}
    v = np.zeros(k)
    note = None
    if not measured:
        return v, "probe.json holds no verify timings: v(K) = 0"
    top = max(measured)
    slope = (measured[top] - measured[top - 1]) if top - 1 in measured else measured[top] / top
    for K in range(1, k + 1):
        if K in measured:
            v[K - 1] = measured[K]
        elif K > top:
            v[K - 1] = measured[top] + (K - top) * slope
        else:  # a gap below the probe's largest K: the nearest measured K above
            v[K - 1] = measured[min(m for m in measured if m > K)]
    if k > top:
        note = f"the probe measured verify up to K={top}; v(K) for K>{top} is extended linearly"
    return np.maximum(v, 0.0), note


def resolve_cost(run: Run, probe: str | Path | None = None, draft_cost: float | None = None) -> Cost:
    """c from --probe probe.json, else --draft-cost C, else the roofline in run.json (model.roofline.draft_cost).

    With a probe, v(K) is measured: the extra time of one verify forward of K+1 tokens over one
    decode step, in decode steps. Otherwise v = 0: decode at batch 1 is memory-bound, so a verify
    of a few tokens reads the same weights as a decode step (ACCEPTANCE.md).
    """
    if probe is not None and draft_cost is not None:
        raise OptionError("--probe and --draft-cost both give the draft cost; pass one of them")
    if probe is not None:
        data = read_probe(probe)
        v, note = verify_extra_from_probe(data, run.k)
        notes = [note] if note else []
        if data.get("cpu"):
            notes.append("the probe ran on a CPU: CPU figures do not stand for a GPU's")
        run_sha = (run.manifest.get("model") or {}).get("config_sha256")
        probe_sha = (data.get("model") or {}).get("config_sha256")
        if run_sha and probe_sha and run_sha != probe_sha:
            other = (data.get("model") or {}).get("path")
            notes.append(f"the probe measured another model ({other}) than the run replayed")
        if data.get("dtype") and run.manifest.get("dtype") and data["dtype"] != run.manifest["dtype"]:
            notes.append(f"the probe ran at {data['dtype']}, the run replayed at {run.manifest['dtype']}")
        detail = f"probe {probe}: {data.get('device', '?')} {data.get('dtype', '?')}, context {data.get('context', '?')}"
        return Cost(c=float(data["draft_cost"]), verify_extra=v, source="probe", detail=detail, notes=tuple(notes))
    if draft_cost is not None:
        if not _finite(draft_cost) or draft_cost < 0:
            raise OptionError(f"--draft-cost {draft_cost}: expected a finite number >= 0 (draft step / target decode step)")
        return Cost(c=float(draft_cost), verify_extra=np.zeros(run.k), source="draft-cost",
                    detail=f"--draft-cost {draft_cost}", notes=())
    roofline = ((run.manifest.get("model") or {}).get("roofline") or {})
    c = roofline.get("draft_cost")
    if not roofline and not any(d not in MODEL_FREE_DRAFTERS for d in run.drafters):
        return model_free_cost(run)
    if not _finite(c) or c < 0:
        raise _run_error(run.path / "run.json",
                         "has no model.roofline.draft_cost; pass --draft-cost C or --probe probe.json")
    precision = roofline.get("precision", run.manifest.get("dtype", "?"))
    return Cost(c=float(c), verify_extra=np.zeros(run.k), source="roofline",
                detail=f"roofline at {precision}: head + lm_head bytes / target bytes", notes=())


MODEL_FREE_DRAFTERS = ("ngram", "suffix")  # draft on the CPU: no draft step on the GPU


def drafter_cost(cost: Cost, drafter: str) -> Cost:
    """The cost one drafter's speculation pays per target step, in the same units as the head's.

    mtp and the hybrids: the head's c — Arctic Inference runs the model drafter at every step for every request
    and only then weighs suffix decoding's draft against it (arctic_inference/vllm/model_runner.py @ 9d464388,
    `propose_draft_token_ids`), so a hybrid pays the head's draft step whichever draft it keeps. ngram and
    suffix: c = 0 — they draft on the CPU from the tokens alone, between target steps, with no GPU work (their CPU
    time, run.json timing.drafting, is microseconds per draft against a target step of milliseconds: README,
    "Model-free drafters"). The verify term v(K) is every drafter's: verifying K+1 tokens costs the target the
    same whoever drafted them."""
    if drafter not in MODEL_FREE_DRAFTERS or cost.source == "model-free":
        return cost
    return Cost(c=0.0, verify_extra=cost.verify_extra, source=cost.source,
                detail=f"{drafter} drafts on the CPU between target steps: c = 0; v(K) as for every drafter "
                       f"({cost.detail})", notes=cost.notes)


def model_free_cost(run: "Run") -> Cost:
    """The cost of a run whose drafters are all model-free and whose manifest has no roofline: c = 0, v(K) = 0."""
    return Cost(c=0.0, verify_extra=np.zeros(run.k), source="model-free",
                detail="model-free drafters only: no draft step on the GPU (c = 0), v(K) = 0 without a probe", notes=())


# ---------------------------------------------------------------------------------------------
# 3. The gate and the recording sampler


GATE_METRICS = {  # gate name -> (Rates field, depth-indexed by best K?)
    "speedup": ("speedup", True),
    "tau_sim": ("tau_sim", True),
    "alpha1": ("alpha", False),
}
_GATE = re.compile(r"\s*([a-z_0-9]+)\s*>=\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*")
DEFAULT_GATE = "speedup>=1"


@dataclass(frozen=True)
class Gate:
    metric: str  # "speedup" | "tau_sim" | "alpha1"
    threshold: float
    text: str  # as written, normalised: "speedup>=1.2"


def parse_gate(text: str) -> Gate:
    """'speedup>=1.2' -> Gate. Strict: METRIC>=NUMBER, nothing else (no '>', no unknown metric, no trailing text)."""
    m = _GATE.fullmatch(text)
    if m is not None and m.group(1) == "tau":
        raise OptionError(f"--gate {text!r}: tau, vLLM's mean acceptance length (per-position formula), overstates what a "
                          "decoder emits when acceptance comes in bursts and is not a verdict metric; gate on tau_sim "
                          "(the simulated decode) or speedup")
    if m is None or m.group(1) not in GATE_METRICS:
        raise OptionError(f"--gate {text!r}: expected METRIC>=NUMBER with METRIC one of "
                          f"{', '.join(GATE_METRICS)} (e.g. --gate 'speedup>=1.2')")
    return Gate(metric=m.group(1), threshold=float(m.group(2)), text=f"{m.group(1)}>={m.group(2)}")


@dataclass(frozen=True)
class Candidate:
    """How the recorded tokens fit one sampler (ACCEPTANCE.md, "The recording sampler")."""

    name: str
    greedy: bool
    support: float  # scored tokens with q(x) > 0
    calibration: float  # Σ q(x) / Σ Σ q²
    z: float  # (Σ q(x) - Σ Σ q²) / √variance under own sampling; NaN for greedy (no variance)
    fits: bool  # metrics.fits
    log_likelihood: float  # per scored token (a token outside the support counts log LL_FLOOR); the best fit has the most


@dataclass(frozen=True)
class RecordingSampler:
    name: str | None  # the profile the traffic is taken to be recorded with; None: no candidate fits
    label: str  # for people, e.g. "thinking_coding (best fit of 7)"
    declared: str | None  # "replay" (run.json), "report" (--recorded-with), "sessions" (every session's own
    #                       meta.sampling), None (the best-fitting candidate)
    fits: bool
    candidates: tuple[Candidate, ...]
    tokens: int  # scored tokens the statistics cover
    own_sessions: int  # sessions scored with their own meta.sampling (the `recorded` profile)
    min_support: float
    reason: str  # one sentence, with the statistics
    checked: bool = True  # False: no target ran (a model-free replay), so nothing could be checked

    def candidate(self, name: str | None) -> Candidate | None:
        return next((c for c in self.candidates if c.name == name), None)


def _stats(c: Candidate) -> str:
    z = "" if c.greedy or not math.isfinite(c.z) else f", z {c.z:+.1f}"
    cal = "" if c.greedy else f", calibration {c.calibration:.3f}"
    return f"{c.name}: support {c.support:.3f}{cal}{z}"


def recording_sampler(run: Run, overall: Rates, recorded_with: str | None, min_support: float) -> RecordingSampler:
    """Which sampler the traffic was recorded with, and whether it fits (the decisions in the module docstring)."""
    sampling = run.manifest.get("sampling") or {}
    own = int(run.own_sampler.sum()) if run.own_sampler is not None else 0
    S = len(run.sessions)

    def greedy(name: str) -> bool:
        params = sampling.get(name) or {}
        return isinstance(params, dict) and _finite(params.get("temperature")) and params["temperature"] < 1e-5

    if not run.target_ran:
        if recorded_with is not None:
            raise OptionError(f"--recorded-with {recorded_with}: this model-free run ran no target, so no sampler can be "
                              "checked; replay with mtp in --drafters to check one")
        return RecordingSampler(
            name=None, label="not checked (no target ran)", declared=None, fits=False, candidates=(), tokens=0,
            own_sessions=0, min_support=min_support, checked=False,
            reason=(f"no target ran (a model-free replay), so it cannot be checked that these sessions are the target's "
                    f"own traffic, which is what makes a draft that equals the recorded token a draft the target accepts: "
                    f"the numbers measure how often {run.drafter}'s drafts equal the recorded tokens (how repetitive the "
                    "traffic is), not what serving would accept; replay with mtp in --drafters for the check"))
    if not run.has_fit:  # version 1: greedy, through the on-policy rate, is all that can be checked
        if recorded_with not in (None, "greedy"):
            raise OptionError(f"--recorded-with {recorded_with}: this schema_version 1 run has no sampler sums, so only "
                              "greedy can be checked; re-run replay to check a sampler")
        rate = float(overall.on_policy)
        candidates = (Candidate("greedy", True, rate, rate, float("nan"), fits(rate, rate, float("nan"), True, min_support),
                                (1 - rate) * math.log(LL_FLOOR)),)
        chosen, declared = "greedy", ("report" if recorded_with else None)
    else:
        listed = [p for p in run.profiles if p != "recorded" or own > 0 or run.manifest.get("recorded_with")
                  or recorded_with == "recorded"]
        candidates = []
        for p in listed:
            i = run.profiles.index(p)
            g = greedy(p)
            sup, cal, z = float(overall.support[i]), float(overall.calibration[i]), float(overall.fit_z[i])
            candidates.append(Candidate(p, g, sup, cal, float("nan") if g else z, fits(sup, cal, z, g, min_support),
                                        float(overall.log_likelihood[i])))
        candidates = tuple(candidates)
        if recorded_with is not None:
            if recorded_with not in run.profiles:
                raise OptionError(f"--recorded-with {recorded_with}: the run has no such profile; it has "
                                  f"{', '.join(run.profiles)}")
            chosen, declared = recorded_with, "report"
        elif run.manifest.get("recorded_with"):
            chosen, declared = "recorded", "replay"
        elif S and own == S:
            chosen, declared = "recorded", "sessions"
        else:
            chosen = best_fit([c.name for c in candidates], [c.log_likelihood for c in candidates], [c.fits for c in candidates])
            declared = None
    tokens = int(run.spans.fit_tokens.sum()) if run.has_fit else int((run.rows.depth == 1).sum())
    pick = next((c for c in candidates if c.name == chosen), None)
    if declared == "replay":
        base = run.manifest["recorded_with"]
        label = base + (f" (each of {own} session(s) with its own meta.sampling)" if own else "") + ", declared at replay"
    elif declared == "sessions":
        label = "each session's own meta.sampling"
    elif declared == "report":
        label = f"{chosen}, declared by --recorded-with"
    elif pick is not None:
        same = [c.name for c in candidates if c.name != pick.name and c.log_likelihood == pick.log_likelihood]
        label = f"{pick.name} (best fit of {len(candidates)} candidates" + (f"; identical: {', '.join(same)}" if same else "") + ")"
    else:
        label = "none fits"
    every = "; ".join(_stats(c) for c in candidates)
    rule = (f"a sampler fits when its support is >= {min_support:g} and its calibration is within {CALIBRATION_TOLERANCE:g} "
            f"of 1 or |z| <= {Z_MAX:g}")
    if pick is None:
        reason = (f"the recorded tokens fit no sampler, so they were not generated by this target with any of them and "
                  f"acceptance against them does not predict serving ({rule}): {every}")
    elif not pick.fits:
        reason = (f"the recorded tokens do not fit {label} ({rule}): {_stats(pick)}; the other candidates: "
                  + "; ".join(_stats(c) for c in candidates if c is not pick))
    else:
        reason = f"recorded with {label}: {_stats(pick)}"
    return RecordingSampler(name=chosen, label=label, declared=declared, fits=bool(pick is not None and pick.fits),
                            candidates=candidates, tokens=tokens, own_sessions=own, min_support=min_support, reason=reason)


@dataclass(frozen=True)
class Verdict:
    status: str  # "GO" | "NO-GO" | "UNRELIABLE"
    gate: Gate  # the gate judged (DEFAULT_GATE when none was given)
    enforced: bool  # a gate was given: the exit code follows the verdict
    k: int  # the best K, where the gated metric is read
    value: float  # the gated metric at K
    lower: float  # its bootstrap lower bound (what must clear the threshold)
    on_policy: float
    min_support: float
    reason: str  # one sentence for people

    @property
    def exit_code(self) -> int:
        return 0 if not self.enforced or self.status == "GO" else 1


def judge(overall: "Slice", k: int, gate: Gate | None, recording: RecordingSampler, status: str, sessions: int,
          resampling: "Resampling") -> Verdict:
    """GO when the lower bound of the gated metric at the best K clears the threshold, NO-GO when it does not;
    UNRELIABLE (whatever the numbers) when the run is not complete, the traffic fits no sampler, the run has
    fewer than MIN_SESSIONS_FOR_VERDICT sessions, or there is no interval of non-zero width."""
    enforced = gate is not None
    gate = gate or parse_gate(DEFAULT_GATE)
    field, by_k = GATE_METRICS[gate.metric]
    at = k - 1 if by_k else 0
    value = float(getattr(overall.value, field)[at])
    lower = float(getattr(overall.lo, field)[at]) if overall.lo is not None else float("nan")
    upper = float(getattr(overall.hi, field)[at]) if overall.hi is not None else float("nan")
    where = f"at K={k}" if by_k else "(depth 1)"
    if status != "complete":
        verdict = ("UNRELIABLE", f"run status is {status!r}: an unfinished run covers only the sessions written so far and "
                                 "is not a verdict; finish it with `mtp-observe replay ... --resume`")
    elif not recording.fits:
        verdict = ("UNRELIABLE", recording.reason)
    elif sessions < MIN_SESSIONS_FOR_VERDICT:
        verdict = ("UNRELIABLE", f"{sessions} session: turns of one conversation say nothing about the next one; replay at "
                                 f"least {MIN_SESSIONS_FOR_VERDICT} sessions ({MIN_SESSIONS_FOR_BOOTSTRAP} for an interval "
                                 "over sessions)")
    elif not (math.isfinite(lower) and math.isfinite(upper)) or upper - lower <= 0:
        verdict = ("UNRELIABLE", f"{gate.metric} {where} = {value:.3f} has no interval of non-zero width "
                                 f"({resampling.note or 'every resample gives the same value'}); replay more sessions")
    elif lower >= gate.threshold:
        verdict = ("GO", f"{gate.metric} {where} = {value:.3f}, 95% lower bound {lower:.3f} >= {gate.threshold:g}")
    else:
        verdict = ("NO-GO", f"{gate.metric} {where} = {value:.3f}, 95% lower bound {lower:.3f} < {gate.threshold:g}")
    return Verdict(status=verdict[0], gate=gate, enforced=enforced, k=k, value=value, lower=lower,
                   on_policy=float(overall.value.on_policy), min_support=recording.min_support, reason=verdict[1])


# ---------------------------------------------------------------------------------------------
# 4. The summary


@dataclass(frozen=True)
class Resampling:
    """How the intervals resample: whole sessions, turns within sessions, or not at all."""

    unit: str  # "session" | "turn" | "none"
    weights: np.ndarray | None  # [B, U] draws of each unit (U = sessions or spans); None for "none"
    note: str | None  # said in the report when the unit is not the session
    strata: np.ndarray | None = None  # [U] the session of each turn ("turn" only)
    keys: tuple | None = None  # [U] (session id, request, start) of each turn ("turn" only), to pair turns across runs


def resampling_for(run: Run, replicates: int, seed: int) -> Resampling:
    S, N = len(run.sessions), len(run.spans.start)
    if S >= MIN_SESSIONS_FOR_BOOTSTRAP:
        return Resampling("session", bootstrap_weights(S, replicates, seed), None)
    if N >= MIN_TURNS_FOR_BOOTSTRAP and S >= 1:
        return Resampling("turn", stratified_weights(run.spans.session, replicates, seed),
                          f"{S} session(s), fewer than the {MIN_SESSIONS_FOR_BOOTSTRAP} a bootstrap over sessions needs: "
                          f"the intervals resample the {N} turns within their sessions, so they show turn-to-turn "
                          "variation only, not session-to-session", strata=run.spans.session,
                          keys=tuple((run.sessions[a], int(b), int(c)) for a, b, c in
                                     zip(run.spans.session, run.spans.request, run.spans.start)))
    return Resampling("none", None, f"{S} session(s) and {N} turn(s): too few to resample "
                                    f"(at least {MIN_TURNS_FOR_BOOTSTRAP} turns are needed); no intervals")


@dataclass(frozen=True)
class Slice:
    """One slice of the rows (all, a segment, a context range, a turn, a session): rates over K = 1..Kmax."""

    name: str
    anchors: int  # depth-1 rows in the slice
    sessions: int  # sessions with at least one anchor in the slice
    value: Rates  # token-weighted: the rates of the pooled counts; arrays [K] ([P, K], [P] per profile)
    session_weighted: Rates | None  # the mean over sessions of each session's rates (None for one session)
    lo: Rates | None  # bootstrap lower / upper percentile (None where not bootstrapped)
    hi: Rates | None
    replicates: Rates | None  # [B, ...] the bootstrap replicates
    per_session: Counts | None = None  # [S, ...] the slice's counts per session (baseline pairing)
    per_unit: Counts | None = None  # [U, ...] per resampled unit


@dataclass(frozen=True)
class Report:
    path: Path
    manifest: dict
    k: int  # Kmax
    profiles: tuple[str, ...]
    cost: Cost
    replicates: int  # bootstrap replicates B
    seed: int
    level: float  # interval level, 0.95
    rows: int  # positions rows
    overall: Slice
    segments: tuple[Slice, ...]  # by the drafted token's segment; bootstrapped
    turns: tuple[Slice, ...]  # by turn index (name "0", "1", ...); point estimates
    sessions: tuple[Slice, ...]  # one per session, in input order; point estimates
    best_k: int  # argmax of the token-weighted speedup (τ_sim)
    verdict: Verdict
    notes: tuple[str, ...]
    context: tuple[Slice, ...] = ()  # by the anchor's position (CONTEXT_BINS); bootstrapped
    recording: RecordingSampler | None = None
    resampling: Resampling | None = None
    speculative: tuple["SpeculativeCheck", ...] = ()  # one per K of `generate --speculative` loops in the run
    drafter: str = "mtp"  # the drafter these slices and the verdict are of
    drafters: tuple["DrafterSummary", ...] = ()  # every drafter of the run, run.json order (summarize_drafters)
    ranking: tuple["Rank", ...] = ()  # the drafters by speedup at their best K, best first
    batch: "BatchSpeedup | None" = None  # speedup by batch size (section 8); the slices' cost is at batch.binding

    @property
    def serve_k(self) -> int:
        """The K to serve with at the gated batch size: best_k when its speedup beats 1, else 0 (no speculation)."""
        return best_k(self.overall.value.speedup)


def tally(run: Run, row_group: np.ndarray, n_groups: int, span_group: np.ndarray | None, steps: np.ndarray,
          expected: np.ndarray | None = None, step_accepted: np.ndarray | None = None) -> Counts:
    """Counts per group: row_group [R] and span_group [N] (None: spans not counted, τ_sim NaN) -> Counts [G, ...].

    steps: [N, K] simulated decode steps of each span at K = 1..Kmax; expected: [N, P, K] the what-if
    expected steps per profile (None: zeros); step_accepted: [N, K, K] the walk's per-position counts at
    each draft length (simulated_walks; None: zeros).
    """
    K, P = run.k, len(run.profiles)
    r = run.rows
    cell = row_group * K + (r.depth - 1)

    def per_cell(weights=None) -> np.ndarray:
        return np.bincount(cell, weights=weights, minlength=n_groups * K).reshape(n_groups, K)

    def per_span(values: np.ndarray) -> np.ndarray:  # [N, ...] -> [G, ...]
        out = np.zeros((n_groups,) + values.shape[1:])
        if span_group is not None:
            np.add.at(out, span_group, values)
        return out

    first = r.depth == 1
    p_accept = [per_cell(np.where(r.on_path, r.p_accept[:, i], 0.0)) for i in range(P)]
    N = len(run.spans.start)
    fit = per_span(run.spans.fit)  # [G, 5, P]
    return Counts(
        evaluable=per_cell().astype(np.int64),
        on_path=per_cell(r.on_path).astype(np.int64),
        accepted=per_cell(r.accepted).astype(np.int64),
        p_accept=np.stack(p_accept, axis=1) if p_accept else np.zeros((n_groups, 0, K)),
        on_policy=np.bincount(row_group[first], weights=r.on_policy[first], minlength=n_groups),
        span_tokens=per_span((run.spans.end - run.spans.start).astype(np.float64)).astype(np.int64),
        steps=per_span(steps.astype(np.float64)).astype(np.int64),
        expected_steps=per_span(expected if expected is not None else np.zeros((N, P, K))),
        fit_tokens=per_span(run.spans.fit_tokens.astype(np.float64)).astype(np.int64),
        fit_support=fit[:, 0, :], fit_q=fit[:, 1, :], fit_q2=fit[:, 2, :], fit_var=fit[:, 3, :], fit_ll=fit[:, 4, :],
        step_accepted=per_span(step_accepted if step_accepted is not None else np.zeros((N, K, K))).astype(np.int64),
    )


def simulated_steps(run: Run) -> np.ndarray:
    """[N, K] steps of the simulated decode of every span at K = 1..Kmax: with the draft made for K itself where a
    drafter's draft at K is not the first K tokens of its draft at Kmax (run.accepted_len_by_k), so τ_sim(K) is
    exact at every K."""
    return simulated_walks(run)[0]


def simulated_walks(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """([N, K] steps, [N, K, K] step_accepted) of the simulated decode of every span at draft length K = 1..Kmax
    (the draft made for K where run.accepted_len_by_k has one): step_accepted[n, K-1, k-1] counts the walk's steps
    that accept depth k (0 for k > K), as vLLM counts them."""
    span_len = run.spans.end - run.spans.start
    N, Kmax = len(span_len), run.k
    by_k = run.accepted_len_by_k
    steps = np.zeros((N, Kmax), dtype=np.int64)
    step_accepted = np.zeros((N, Kmax, Kmax), dtype=np.int64)
    for k in range(1, Kmax + 1):
        walk = decode_walk(run.accepted_len if by_k is None else by_k[:, k - 1], span_len, k)
        steps[:, k - 1] = walk.steps
        step_accepted[:, k - 1, :k] = walk.step_accepted
    return steps, step_accepted


def what_if_steps(run: Run) -> np.ndarray:
    """[N, P, K] expected decode steps of every span under each profile's acceptance probabilities (the what-if).

    Depth j's probability is the row's p_accept while the chain is on the recorded path, else ᾱ_j(S),
    the run's mean conditional rate at depth j under S (module docstring)."""
    K, P, r = run.k, len(run.profiles), run.rows
    A = int((r.depth == 1).sum())
    if not run.has_fit or P == 0:
        return np.zeros((len(run.spans.start), P, K))
    on = r.on_path
    mean = np.zeros((K, P))
    for k in range(1, K + 1):
        sel = on & (r.depth == k)
        mean[k - 1] = r.p_accept[sel].mean(axis=0) if sel.any() else 0.0
    accept = np.broadcast_to(mean[None], (A, K, P)).copy()
    accept[r.anchor[on], r.depth[on] - 1] = r.p_accept[on]
    return expected_decode_steps(accept, run.spans.end - run.spans.start, K)


def _to_sessions(per_span: Counts, run: Run) -> Counts:
    """Counts [N, ...] per span -> [S, ...] per session (counts add)."""
    S = len(run.sessions)

    def add(values: np.ndarray) -> np.ndarray:
        out = np.zeros((S,) + values.shape[1:], dtype=values.dtype)
        np.add.at(out, run.spans.session, values)
        return out

    return Counts(**{f: add(v) for f, v in vars(per_span).items()})


def _slice(name: str, per_unit: Counts, per_session: Counts, cost: Cost, resampling: Resampling, level: float) -> Slice:
    """Counts of one slice per resampled unit and per session -> its token-weighted, session-weighted and
    bootstrapped rates."""
    present = per_session.evaluable[:, 0] > 0
    value = rates(per_session.total(), cost.c, cost.verify_extra)
    session_weighted = rates(per_session.take(present), cost.c, cost.verify_extra).map(nanmean)
    lo = hi = replicates = None
    if resampling.weights is not None:
        replicates = rates(per_unit.resample(resampling.weights), cost.c, cost.verify_extra)
        bounds = {f: percentile_interval(getattr(replicates, f), level) for f in RATE_FIELDS}
        lo = Rates(**{f: b[0] for f, b in bounds.items()})
        hi = Rates(**{f: b[1] for f, b in bounds.items()})
    return Slice(name=name, anchors=int(per_session.evaluable[:, 0].sum()), sessions=int(present.sum()), value=value,
                 session_weighted=session_weighted, lo=lo, hi=hi, replicates=replicates, per_session=per_session,
                 per_unit=per_unit)


def context_bin(position: np.ndarray) -> np.ndarray:
    """[n] positions -> [n] index into CONTEXT_BINS."""
    edges = np.array([lo for lo, _, _ in CONTEXT_BINS[1:]])
    return np.searchsorted(edges, position, side="right")


def context_notes(run: Run) -> list[str]:
    """Warnings about positions the checkpoint was not trained for (run.json's model limits, version 2)."""
    model = run.manifest.get("model") or {}
    notes = []
    limit = model.get("max_position_embeddings")
    if isinstance(limit, int) and run.longest is not None:
        over = [run.sessions[i] for i in np.flatnonzero(run.longest > limit)]
        if over:
            notes.append(f"{len(over)} session(s) exceed the checkpoint's max_position_embeddings ({limit:,}; longest "
                         f"request {int(run.longest.max()):,} tokens, e.g. {over[0]}): acceptance there is measured past "
                         "the context the model was trained for")
    rope = model.get("rope_scaling")
    if rope:
        kind = rope.get("rope_type", rope.get("type", "?")) if isinstance(rope, dict) else rope
        factor = rope.get("factor") if isinstance(rope, dict) else None
        notes.append(f"the checkpoint's config scales RoPE ({kind}" + (f", factor {factor}" if factor else "") + "): "
                     "long-context slices measure the scaled model, which engines may serve with different settings")
    return notes


def summarize(
    run: Run,
    cost: Cost,
    *,
    replicates: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    gate: Gate | None = None,
    min_support: float = MIN_SUPPORT,
    recorded_with: str | None = None,
) -> Report:
    """Every metric, slice, interval, the recording sampler and the verdict for one run (ACCEPTANCE.md, 'Metrics')."""
    assert replicates >= 1, replicates
    S, K, N = len(run.sessions), run.k, len(run.spans.start)
    steps, step_accepted = simulated_walks(run)
    expected = what_if_steps(run)
    plan = resampling_for(run, replicates, seed)
    r = run.rows
    anchor_span = np.repeat(np.arange(N), run.spans.end - run.spans.start)  # [A] span of each anchor
    row_span = anchor_span[r.anchor]  # [R]

    def family(row_group: np.ndarray, G: int, span_group: np.ndarray | None) -> tuple[Counts, Counts]:
        """Counts [N, G, ...] per span and group, and [S, G, ...] per session."""
        counts = tally(run, row_span * G + row_group, N * G,
                       np.arange(N) * G + span_group if span_group is not None else None, steps, expected, step_accepted)
        counts = Counts(**{f: v.reshape((N, G) + v.shape[1:]) for f, v in vars(counts).items()})
        return counts, _to_sessions(counts, run)

    def units(per_span: Counts, per_session: Counts) -> Counts:
        return per_span if plan.unit == "turn" else per_session

    # 1. All rows: token-weighted = pooled, session-weighted = mean of sessions.
    all_span, all_session = family(np.zeros(len(r.depth), dtype=np.int64), 1, np.zeros(N, dtype=np.int64))
    overall = _slice("all", units(all_span.take((slice(None), 0)), all_session.take((slice(None), 0))),
                     all_session.take((slice(None), 0)), cost, plan, level)

    # 2. By segment of the drafted token (a decode walk crosses segments: no τ_sim there), and by context length.
    def sliced(row_group, names, span_group) -> tuple[Slice, ...]:
        per_span, per_session = family(row_group, len(names), span_group)
        return tuple(
            _slice(names[g], units(per_span.take((slice(None), g)), per_session.take((slice(None), g))),
                   per_session.take((slice(None), g)), cost, plan, level)
            for g in range(len(names)) if per_session.evaluable[:, g, 0].sum() > 0
        )

    segments = sliced(r.segment, run.segments, None)
    context = sliced(context_bin(r.pos), [name for _, _, name in CONTEXT_BINS], context_bin(run.spans.start))

    # 3. By turn index: point estimates; each (session, turn) is one span, so the per-span counts are per pair.
    per_span = all_span.take((slice(None), 0))
    turns = tuple(
        _slice(str(int(t)), per_span.take(np.flatnonzero(run.spans.turn == t)), per_span.take(np.flatnonzero(run.spans.turn == t)),
               cost, Resampling("none", None, None), level)
        for t in np.unique(run.spans.turn) if per_span.evaluable[run.spans.turn == t, 0].sum() > 0
    )

    # 4. Per session: its own rates (no interval).
    per_session = all_session.take((slice(None), 0))
    session_rates = rates(per_session, cost.c, cost.verify_extra)
    sessions = tuple(
        Slice(name=run.sessions[s], anchors=int(per_session.evaluable[s, 0]), sessions=1,
              value=session_rates.map(lambda a, s=s: a[s]), session_weighted=None, lo=None, hi=None, replicates=None)
        for s in range(S)
    )

    # 5. The recording sampler, the best K (by τ_sim's speedup) and the verdict.
    recording = recording_sampler(run, overall.value, recorded_with, min_support)
    k = top_k(overall.value.speedup)
    verdict = judge(overall, k, gate, recording, str(run.manifest.get("status", "unknown")), S, plan)
    notes = list(run.notes) + ([plan.note] if plan.note else []) + context_notes(run) + list(cost.notes)
    return Report(
        path=run.path, manifest=run.manifest, k=K, profiles=run.profiles, cost=cost, replicates=replicates, seed=seed,
        level=level, rows=len(r.depth), overall=overall, segments=segments, turns=turns, sessions=sessions,
        best_k=k, verdict=verdict, notes=tuple(notes), context=context, recording=recording, resampling=plan,
        speculative=speculative_checks(run, steps),
        drafter=run.drafter,
    )


@dataclass(frozen=True)
class SpeculativeCheck:
    """`generate --speculative K`'s own loop beside the replay of the text it wrote (the same trajectory).

    Convention (vLLM's mean acceptance length): a step emits its accepted drafts and one token more, none
    past the end of the turn, so tokens / steps counts the bonus token; a turn's first token comes from the
    prefill and is no step's. Where the loop and the replay accept the same drafts at every anchor the walk
    visits, the replay's τ_sim(K) on those turns is the loop's tokens per step exactly."""

    k: int
    requests: int  # turns the loop generated
    tokens: int  # Σ (e - s) over their spans
    steps: int  # the loop's verify steps
    replay_steps: int | None  # the simulated decode's steps at K on the same spans (None when the run's Kmax < K)
    agree: int  # steps whose accepted length equals the replay's at the same anchor
    first_difference: str | None  # where the two first disagree, for people

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else float("nan")

    @property
    def replay_tau_sim(self) -> float:
        return self.tokens / self.replay_steps if self.replay_steps else float("nan")

    @property
    def agrees(self) -> bool:
        return self.replay_steps is not None and self.agree == self.steps and self.replay_steps == self.steps


def speculative_checks(run: Run, steps: np.ndarray) -> tuple[SpeculativeCheck, ...]:
    """One check per K among the run's loops: steps [N, Kmax] are the simulated decode's per span."""
    loop = run.loop
    if loop is None:
        return ()
    span_len = run.spans.end - run.spans.start
    first_anchor = np.concatenate([[0], np.cumsum(span_len)[:-1]])  # [N] the anchor index of each span's s
    out = []
    for K in sorted(set(loop.k.tolist())):
        members = np.flatnonzero(loop.k == K)
        mine = np.isin(loop.owner, members)
        span = loop.span[loop.owner[mine]]
        anchor, accepted = loop.anchor[mine], loop.accepted[mine]
        comparable = K <= run.k
        agree, first, replay_steps = 0, None, None
        if comparable:
            replay = np.minimum(run.accepted_len[first_anchor[span] + anchor - run.spans.start[span]], K)
            agree = int((replay == accepted).sum())
            replay_steps = int(steps[loop.span[members], K - 1].sum())
            differ = np.flatnonzero(replay != accepted)
            if differ.size:
                i = int(differ[0])
                first = (f"session {run.sessions[run.spans.session[span[i]]]} request {int(run.spans.request[span[i]])} "
                         f"anchor {int(anchor[i])}: the loop kept {int(accepted[i])} drafts, the replay accepts {int(replay[i])}")
        else:
            first = f"the run replayed K <= {run.k}; replay with --k {K} or more to compare the loop's K = {K}"
        out.append(SpeculativeCheck(k=int(K), requests=int(members.size), tokens=int(span_len[loop.span[members]].sum()),
                                    steps=int(mine.sum()), replay_steps=replay_steps, agree=agree, first_difference=first))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# 4b. Every drafter on the same anchors


@dataclass(frozen=True)
class DrafterSummary:
    """One drafter's numbers over the run (its own Report's, with its own cost)."""

    name: str
    cost: Cost  # drafter_cost: the head's for mtp and the hybrids, c = 0 for ngram and suffix
    best_k: int  # argmax of its speedup
    overall: Slice
    segments: tuple[Slice, ...]
    context: tuple[Slice, ...]
    per_k: bool  # its τ_sim(K) walks the draft made for each K (suffix, the hybrids), not the Kmax draft cut at K
    judged: bool  # the verdict is of this drafter


@dataclass(frozen=True)
class Rank:
    """A drafter at its best K, against the best drafter on the same resamples (paired: same sessions drawn)."""

    drafter: str
    k: int
    speedup: float
    lo: float | None  # bootstrap interval of the speedup (None without intervals)
    hi: float | None
    tau_sim: float
    behind: float  # best drafter's speedup (at its K) - this one's (at its K); 0 for the best
    behind_lo: float | None  # its paired bootstrap interval (None for the best, or without intervals)
    behind_hi: float | None


def drafter_summary(report: Report, per_k: bool, judged: bool) -> DrafterSummary:
    return DrafterSummary(name=report.drafter, cost=report.cost, best_k=report.best_k, overall=report.overall,
                          segments=report.segments, context=report.context, per_k=per_k, judged=judged)


def rank_drafters(summaries: tuple[DrafterSummary, ...], level: float = 0.95) -> tuple[Rank, ...]:
    """The drafters by speedup at their own best K, best first (NaN last; run.json order on ties). Each is
    compared with the best on the same bootstrap resamples — every drafter's report resamples the same sessions
    (or turns) with the same seed — so the interval of the difference is paired."""
    def value(d: DrafterSummary) -> float:
        x = float(d.overall.value.speedup[d.best_k - 1])
        return x if math.isfinite(x) else -math.inf

    ordered = sorted(summaries, key=lambda d: -value(d))
    best = ordered[0]
    out = []
    for d in ordered:
        o, k = d.overall, d.best_k
        lo = float(o.lo.speedup[k - 1]) if o.lo is not None else None
        hi = float(o.hi.speedup[k - 1]) if o.hi is not None else None
        behind = float(best.overall.value.speedup[best.best_k - 1] - o.value.speedup[k - 1])
        b_lo = b_hi = None
        if d is not best and o.replicates is not None and best.overall.replicates is not None:
            diff = best.overall.replicates.speedup[:, best.best_k - 1] - o.replicates.speedup[:, k - 1]
            b_lo, b_hi = (float(x) for x in percentile_interval(diff, level))
        out.append(Rank(drafter=d.name, k=k, speedup=float(o.value.speedup[k - 1]), lo=lo, hi=hi,
                        tau_sim=float(o.value.tau_sim[k - 1]), behind=behind, behind_lo=b_lo, behind_hi=b_hi))
    return tuple(out)


def summarize_drafters(report: Report, run: Run, table: "CostTable", **options) -> Report:
    """The judged drafter's report with every drafter of the run summarised beside it (each its own rows, its own
    cost at the batch size the judged one's verdict binds at, the same resamples) and ranked."""
    from dataclasses import replace

    at = report.batch.binding if report.batch is not None else 1
    summaries = []
    for name in run.drafters:
        if name == run.drafter:
            other, other_run = report, run
        else:
            other_run = load_run(run.path, name)
            other = summarize(other_run, drafter_table(table, name).cost_at(at), **options)
        summaries.append(drafter_summary(other, per_k=other_run.accepted_len_by_k is not None, judged=name == run.drafter))
    summaries = tuple(summaries)
    notes = list(report.notes)
    model_free = [d.name for d in summaries if d.name in MODEL_FREE_DRAFTERS]
    if model_free:
        notes.append(f"{', '.join(model_free)} draft on the CPU between target steps: their speedup takes c = 0 (no "
                     "draft step on the GPU) and the same verify cost v(K) as every drafter")
    if any(d.per_k for d in summaries):
        notes.append(f"{', '.join(d.name for d in summaries if d.per_k)}: the draft at K is not the first K tokens of the "
                     "draft at Kmax (suffix decoding picks its match by a K-dependent score; the hybrids' threshold is K), so "
                     "τ_sim(K) and the speedup walk the draft made for each K; α_k, A_k and τ(K) are of the Kmax drafts")
    return replace(report, drafters=summaries, ranking=rank_drafters(summaries, report.level), notes=tuple(notes))


# ---------------------------------------------------------------------------------------------
# 5. Against a baseline


@dataclass(frozen=True)
class Delta:
    """current - baseline for one slice, over K = 1..min(Kmax) and the profiles both runs have."""

    name: str
    current: Slice
    baseline: Slice
    value: Rates  # current - baseline (token-weighted)
    lo: Rates | None  # the difference's bootstrap interval (None where the slices were not bootstrapped)
    hi: Rates | None
    flagged: tuple[str, ...]  # metrics whose difference interval excludes 0, e.g. "tau_sim@K=2", "alpha@k=1", "on_policy"


@dataclass(frozen=True)
class Comparison:
    baseline_path: Path
    k: int  # depths compared: min of the two runs' Kmax
    profiles: tuple[str, ...]  # profiles both runs have
    overall: Delta
    segments: tuple[Delta, ...]  # segments both runs have
    turns: tuple[Delta, ...]  # turns both runs have (no intervals, never flagged)
    shared: int = 0  # sessions (by id) in both runs
    only_current: int = 0
    only_baseline: int = 0
    paired: bool = False  # the replicates resample the shared sessions jointly
    note: str = ""  # how the differences were resampled, for people
    context: tuple[Delta, ...] = ()  # context ranges both runs have


_PROFILE_FIELDS = ("tau_profile", "speedup_profile")  # [P, K]
_SCALAR_FIELDS = ("on_policy",)
_SQUARE_FIELDS = ("per_position_acceptance",)  # [K, K]: draft length K, position k


def _restrict(r: Rates, k: int, profile_index: list[int]) -> Rates:
    def cut(field: str, a: np.ndarray) -> np.ndarray:
        if field in _SCALAR_FIELDS:
            return a
        if field in ("support", "calibration", "fit_z", "log_likelihood"):
            return a[..., profile_index]
        if field in _SQUARE_FIELDS:
            return a[..., :k, :k]
        a = a[..., :k]
        return a[..., profile_index, :] if field in _PROFILE_FIELDS else a

    return Rates(**{f: cut(f, getattr(r, f)) for f in RATE_FIELDS})


def _delta(cur: Slice, base: Slice, k: int, cur_p: list[int], base_p: list[int], level: float,
           replicates: tuple[Rates, Rates] | None) -> Delta:
    """replicates: (current, baseline) replicate rates drawn for the comparison (paired or not), or None."""
    value = Rates(**{f: getattr(_restrict(cur.value, k, cur_p), f) - getattr(_restrict(base.value, k, base_p), f)
                     for f in RATE_FIELDS})
    lo = hi = None
    flagged: list[str] = []
    if replicates is not None:
        c, b = _restrict(replicates[0], k, cur_p), _restrict(replicates[1], k, base_p)
        bounds = {f: percentile_interval(getattr(c, f) - getattr(b, f), level) for f in RATE_FIELDS}
        lo = Rates(**{f: v[0] for f, v in bounds.items()})
        hi = Rates(**{f: v[1] for f, v in bounds.items()})
        for f in RATE_FIELDS:
            if f in ("support", "calibration", "fit_z", "log_likelihood"):
                continue  # statistics of the traffic, not of the head
            outside = (getattr(lo, f) > 0) | (getattr(hi, f) < 0)
            for index in zip(*np.nonzero(np.atleast_1d(outside))):
                flagged.append(_metric_label(f, index))
    return Delta(name=cur.name, current=cur, baseline=base, value=value, lo=lo, hi=hi, flagged=tuple(flagged))


def _metric_label(field: str, index: tuple) -> str:
    if field == "on_policy":
        return "on_policy"
    if field in ("tau_profile", "speedup_profile"):
        return f"{field}[{index[0]}]@K={index[1] + 1}"
    if field in _SQUARE_FIELDS:
        return f"{field}@K={index[0] + 1},k={index[1] + 1}"
    return f"{field}@{'k' if field in ('alpha', 'accept_rate') else 'K'}={index[0] + 1}"


def compare(current: Report, baseline: Report) -> Comparison:
    """The current report's slices as differences from the baseline's.

    Replicates: when both runs resample sessions, one draw over the union of their session ids (by id)
    gives each run the weights of its own sessions, so a session both runs have is drawn equally in both
    (paired) and the others independently; when both resample turns, the same over the union of their
    turns (by session id, request and start), within sessions; otherwise (one run without intervals, or
    one resampling sessions and the other turns) the two runs are resampled independently (unpaired).
    The comparison says how many sessions differ."""
    k = min(current.k, baseline.k)
    profiles = tuple(p for p in current.profiles if p in baseline.profiles)
    cur_p = [current.profiles.index(p) for p in profiles]
    base_p = [baseline.profiles.index(p) for p in profiles]
    cur_ids = [s.name for s in current.sessions]
    base_ids = [s.name for s in baseline.sessions]
    shared = len(set(cur_ids) & set(base_ids))
    only_cur, only_base = len(set(cur_ids) - set(base_ids)), len(set(base_ids) - set(cur_ids))
    B, seed = current.replicates, current.seed
    both_sessions = (current.resampling is not None and baseline.resampling is not None
                     and current.resampling.unit == baseline.resampling.unit == "session")
    if both_sessions:
        union = cur_ids + [s for s in base_ids if s not in set(cur_ids)]
        weights = bootstrap_weights(len(union), B, seed)
        position = {s: i for i, s in enumerate(union)}
        cur_w = weights[:, [position[s] for s in cur_ids]]
        base_w = weights[:, [position[s] for s in base_ids]]
    both_turns = (current.resampling is not None and baseline.resampling is not None
                  and current.resampling.unit == baseline.resampling.unit == "turn")
    if both_turns:
        cur_keys, base_keys = list(current.resampling.keys), list(baseline.resampling.keys)
        union_keys = cur_keys + [key for key in base_keys if key not in set(cur_keys)]
        session_code = {sid: i for i, sid in enumerate(dict.fromkeys(key[0] for key in union_keys))}
        weights = stratified_weights(np.array([session_code[key[0]] for key in union_keys]), B, seed)
        position = {key: i for i, key in enumerate(union_keys)}
        cur_w = weights[:, [position[key] for key in cur_keys]]
        base_w = weights[:, [position[key] for key in base_keys]]
    paired = (both_sessions or both_turns) and shared > 0
    if paired:
        note = (f"{shared} session(s) in both runs are resampled jointly (paired{', by turn' if both_turns else ''})"
                + (f"; {only_cur} only in this run and {only_base} only in the baseline are resampled independently"
                   if only_cur or only_base else ""))
    else:
        why = "no session id in common" if shared == 0 else "the runs resample different units (sessions, turns)"
        note = (f"unpaired ({why}): the two runs are resampled independently; {shared} session(s) shared, {only_cur} only "
                f"in this run, {only_base} only in the baseline")

    def replicas(cur: Slice, base: Slice) -> tuple[Rates, Rates] | None:
        if both_sessions and cur.per_session is not None and base.per_session is not None:
            return (rates(cur.per_session.resample(cur_w), current.cost.c, current.cost.verify_extra),
                    rates(base.per_session.resample(base_w), baseline.cost.c, baseline.cost.verify_extra))
        if both_turns and cur.per_unit is not None and base.per_unit is not None:
            return (rates(cur.per_unit.resample(cur_w), current.cost.c, current.cost.verify_extra),
                    rates(base.per_unit.resample(base_w), baseline.cost.c, baseline.cost.verify_extra))
        if cur.replicates is None or base.replicates is None or base.per_unit is None or baseline.resampling is None:
            return None
        other = baseline.resampling  # redraw the baseline's resamples with another seed: independent of the current's
        if other.unit == "turn":
            w = stratified_weights(other.strata, B, seed + 1)
        else:
            w = bootstrap_weights(base.per_unit.evaluable.shape[0], B, seed + 1)
        return cur.replicates, rates(base.per_unit.resample(w), baseline.cost.c, baseline.cost.verify_extra)

    def pair(cur: tuple[Slice, ...], base: tuple[Slice, ...], intervals: bool = True) -> tuple[Delta, ...]:
        by_name = {s.name: s for s in base}
        return tuple(_delta(s, by_name[s.name], k, cur_p, base_p, current.level,
                            replicas(s, by_name[s.name]) if intervals else None)
                     for s in cur if s.name in by_name)

    return Comparison(
        baseline_path=baseline.path, k=k, profiles=profiles,
        overall=_delta(current.overall, baseline.overall, k, cur_p, base_p, current.level,
                       replicas(current.overall, baseline.overall)),
        segments=pair(current.segments, baseline.segments), turns=pair(current.turns, baseline.turns, intervals=False),
        shared=shared, only_current=only_cur, only_baseline=only_base, paired=paired, note=note,
        context=pair(current.context, baseline.context),
    )


# ---------------------------------------------------------------------------------------------
# 5b. Speedup by batch size (cost.py computes; here the run's numbers meet it)
#
# The cost table (`cost_table`): --probe with batch sizes (probe.json version 2) measured; else, unless
# --draft-cost or a version-1 probe gives batch 1 only, the roofline on --device-spec (default h100) from
# the run's geometry (run.json model.cost_geometry, else the checkpoint at model.path) at --context tokens
# per sequence (default: the run's mean anchor position, the context a drafted token sees), routed experts
# from the run's router sums when it has them. speedup(K, B) then takes the overall τ_sim(K) and its
# bootstrap replicates through cost.batch_speedup: the intervals are τ_sim's, the cost being fixed.
# The gate (--batch B or LO-HI) is judged at each gated batch size by the same rules as at batch 1
# (judge); the report's slices, best K and verdict are at the binding one: the worst verdict, then the
# lowest lower bound.


@dataclass(frozen=True)
class CostTable:
    """The run's step times at each batch size, and where they came from."""

    times: StepTimes
    legacy: Cost | None  # the batch-1 Cost of a batch-1-only source (resolve_cost), kept exact
    context: float | None  # the roofline's context per sequence (None: measured or batch 1 only)
    experts: dict | None  # MoE roofline: distinct experts per layer, measured and expected (JSON `batch.experts`)
    k_max: int  # the run's Kmax: v_B(K) for K = 1..k_max

    def cost_at(self, b: int) -> Cost:
        """The slices' Cost at batch size b: c_B and v_B(K), K = 1..Kmax."""
        if self.legacy is not None and b == 1:
            return self.legacy
        t = self.times
        i = t.index(b)
        return Cost(c=float(t.draft_cost()[i]), verify_extra=t.verify_extra(self.k_max)[i], source=t.source,
                    detail=f"{t.detail}; at batch {b}", notes=t.notes + t.flags)


def drafter_table(table: CostTable, drafter: str) -> CostTable:
    """The cost table one drafter pays (drafter_cost at every batch size): ngram and suffix draft on the CPU, so
    their draft step is 0 at every B; the verify steps are every drafter's."""
    if drafter not in MODEL_FREE_DRAFTERS or (table.legacy is not None and table.legacy.source == "model-free"):
        return table
    from dataclasses import replace

    t = table.times
    times = replace(t, draft=np.zeros_like(t.draft), detail=f"{t.detail}; {drafter} drafts on the CPU: t_draft = 0")
    return replace(table, times=times, legacy=drafter_cost(table.legacy, drafter) if table.legacy is not None else None)


def run_context(run: Run) -> float:
    """The mean anchor position: the tokens before a drafted position, the context its step reads."""
    first = run.rows.depth == 1
    return float(run.rows.pos[first].mean()) if first.any() else 0.0


def run_geometry(run: Run) -> tuple[Geometry | None, str | None]:
    """The roofline's geometry: run.json model.cost_geometry, else the checkpoint at model.path; or why not."""
    model = run.manifest.get("model") or {}
    stored = model.get("cost_geometry")
    if isinstance(stored, dict):
        try:
            return Geometry.from_dict(stored), None
        except (TypeError, ValueError) as e:
            return None, f"run.json model.cost_geometry is unreadable ({_one_line(e)})"
    where = model.get("path")
    if where and Path(where).is_dir():
        from .checkpoint import read_checkpoint
        from .cost import geometry_of_checkpoint
        from .errors import CheckpointError

        try:
            return geometry_of_checkpoint(read_checkpoint(where)), None
        except (CheckpointError, OSError, KeyError, ValueError) as e:
            return None, f"run.json has no model.cost_geometry and the checkpoint at {where} cannot be read ({_one_line(e)})"
    return None, f"run.json has no model.cost_geometry and the checkpoint at {where or '?'} is not here"


def run_expert_counts(run: Run) -> ExpertCounts | None:
    """The run's router window sums (requests.parquet `routing`, tables.py), summed over sessions; None without."""
    path = run.path / "requests.parquet"
    if not _has_column(path, "routing"):
        return None
    column = read_dataset(path, ["routing"], str(run.manifest.get("status"))).column("routing").to_pylist()
    sums = [r for r in column if r is not None]
    if not sums:
        return None
    shape = (sums[0]["q_max"], sums[0]["layers"], sums[0]["experts"])
    windows, hits = np.zeros(shape[0], dtype=np.int64), np.zeros(shape, dtype=np.int64)
    for r in sums:
        if (r["q_max"], r["layers"], r["experts"]) != shape or len(r["windows"]) != shape[0] or \
                len(r["hits"]) != shape[0] * shape[1] * shape[2]:
            raise _run_error(path, "routing sums of different shapes (or cut short); the run directory is inconsistent, "
                                   "re-run replay")
        windows += np.asarray(r["windows"], dtype=np.int64)
        hits += np.asarray(r["hits"], dtype=np.int64).reshape(shape)
    return ExpertCounts(windows=windows, hits=hits, sessions=len(sums))


def cost_table(run: Run, *, probe: str | Path | None = None, draft_cost: float | None = None,
               device_spec: str | None = None, context: float | None = None,
               batch_sizes: tuple[int, ...] = DEFAULT_BATCHES) -> CostTable:
    """The step times at each batch size for this run (the rules at the top of this section)."""
    if device_spec is not None and (probe is not None or draft_cost is not None):
        raise OptionError("--device-spec sets the roofline's device, but --probe/--draft-cost give a measured or fixed "
                          "cost: pass one of them")
    batch_sizes = tuple(sorted(set(batch_sizes) | {1}))
    if probe is not None or draft_cost is not None:
        legacy = resolve_cost(run, probe, draft_cost)  # its checks and notes (CPU, another model, dtype)
        data = read_probe(probe) if probe is not None else None
        if data is not None and data["probe_version"] >= 2:
            times = step_times_from_probe(data, str(probe))
            times = StepTimes(**{**times.__dict__, "notes": tuple(dict.fromkeys(legacy.notes + times.notes))})
            return CostTable(times=times, legacy=None, context=None, experts=None, k_max=run.k)
        why = ("--draft-cost gives batch 1 only" if data is None else
               "the probe (probe_version 1) measured batch 1 only; re-run `mtp-observe probe --batch 1,2,4,...`")
        times = batch1_times(legacy.c, legacy.verify_extra, legacy.source, legacy.detail, legacy.notes + (why,))
        return CostTable(times=times, legacy=legacy, context=None, experts=None, k_max=run.k)
    geometry, why = run_geometry(run)
    if geometry is None:
        legacy = resolve_cost(run)
        times = batch1_times(legacy.c, legacy.verify_extra, legacy.source, legacy.detail,
                             legacy.notes + (f"{why}: the cost table has batch 1 only (the bytes ratio); re-run replay, or "
                                             "pass --probe with batch sizes",))
        return CostTable(times=times, legacy=legacy, context=None, experts=None, k_max=run.k)
    device = parse_device(device_spec or DEFAULT_DEVICE)
    ctx = run_context(run) if context is None else float(context)
    experts = run_expert_counts(run) if geometry.moe_layers else None
    times = roofline_times(geometry, device, batch_sizes, run.k + 1, ctx, experts)
    notes = list(times.notes)
    if device_spec is None:
        notes.append(f"the roofline is on the default device ({DEFAULT_DEVICE}); --device-spec names yours")
    if geometry.moe_layers and experts is None:
        notes.append("the run has no router sums (a run written before they were recorded): routed experts are charged "
                     "at the expected E(1-(1-k/E)^N), which assumes uniform, independent routing")
    info = None
    if geometry.moe_layers:
        info = {"source": "router" if experts is not None else "formula", "experts": geometry.experts,
                "top_k": geometry.top_k, "sessions": experts.sessions if experts is not None else 0,
                "windows": experts.windows.tolist() if experts is not None else None,
                "q": list(range(1, run.k + 2)),
                "measured": None if experts is None else [[experts.distinct(b, q) for q in range(1, run.k + 2)]
                                                          for b in batch_sizes],
                "formula": [[expected_distinct(geometry.experts, geometry.top_k, b * q) for q in range(1, run.k + 2)]
                            for b in batch_sizes]}
    times = StepTimes(**{**times.__dict__, "notes": tuple(notes)})
    return CostTable(times=times, legacy=None, context=ctx, experts=info, k_max=run.k)


@dataclass(frozen=True)
class BatchSpeedup:
    """speedup(K, B) over the cost table's batch sizes, the best K at each, break-even τ and vLLM's schedule."""

    table: CostTable
    value: np.ndarray  # [NB, K] from the token-weighted τ_sim(K)
    lo: np.ndarray | None  # [NB, K] the bootstrap bounds (τ_sim's replicates through the same formula)
    hi: np.ndarray | None
    best_k: tuple[int, ...]  # [NB] argmax over K; 0 where no K beats 1
    break_even: np.ndarray  # [NB, K] the τ_sim(K) at which speedup(K, B) = 1
    schedule: tuple[tuple[int, int, int], ...]  # num_speculative_tokens_per_batch_size
    gated: tuple[int, ...]  # the batch sizes the gate is judged at
    binding: int  # the gated batch size whose verdict is the report's (its slices' cost)
    verdicts: tuple[Verdict, ...]  # [len(gated)]

    @property
    def times(self) -> StepTimes:
        return self.table.times

    @property
    def schedule_text(self) -> str:
        return "[" + ", ".join(f"[{a}, {b}, {k}]" for a, b, k in self.schedule) + "]"

    @property
    def speculative_config(self) -> dict | None:
        """vLLM's --speculative-config for the schedule (method "mtp", research A1); None when nothing pays anywhere."""
        k_max = max(k for _, _, k in self.schedule)
        if k_max == 0:
            return None
        return {"method": "mtp", "num_speculative_tokens": k_max,
                "num_speculative_tokens_per_batch_size": [list(r) for r in self.schedule]}


def batch_speedups(report: Report, table: CostTable, gated: tuple[int, int]) -> BatchSpeedup:
    """The table over batch sizes from the report's overall τ_sim, and the gate at each gated batch size."""
    times, o = table.times, report.overall
    value = batch_speedup(o.value.tau_sim, times)  # [NB, K]
    lo = hi = None
    if o.replicates is not None:
        lo, hi = percentile_interval(batch_speedup(o.replicates.tau_sim, times), report.level)
    best = tuple(best_k(value[i]) for i in range(len(times.batch)))
    ranges = schedule(times.batch, list(best))
    check_schedule(ranges, max(best) if max(best) > 0 else 0)
    lo_b, hi_b = gated
    chosen = tuple(b for b in times.batch if lo_b <= b <= hi_b)
    if not chosen:
        raise OptionError(f"--batch {lo_b}{'' if hi_b == lo_b else f'-{hi_b}'}: the cost table ({times.source}) has batch "
                          f"sizes {', '.join(map(str, times.batch))}; choose among them")
    verdicts = tuple(judge_at(report, value, lo, hi, times.batch.index(b), b if chosen != (1,) else None) for b in chosen)
    severity = {"UNRELIABLE": 0, "NO-GO": 1, "GO": 2}
    worst = min(range(len(chosen)), key=lambda i: (severity[verdicts[i].status],
                                                   verdicts[i].lower if math.isfinite(verdicts[i].lower) else -math.inf))
    return BatchSpeedup(table=table, value=value, lo=lo, hi=hi, best_k=best, break_even=break_even(times, report.k),
                        schedule=tuple(tuple(r) for r in ranges), gated=chosen, binding=chosen[worst], verdicts=verdicts)


def judge_at(report: Report, value: np.ndarray, lo: np.ndarray | None, hi: np.ndarray | None, i: int,
             b: int | None) -> Verdict:
    """The verdict with speedup(K, B) of row i in place of the slices' speedup (the same rules: judge); the reason
    names the batch size b (None: the default batch 1, said nowhere)."""
    from dataclasses import replace

    o = report.overall
    overall = replace(o, value=replace(o.value, speedup=value[i]),
                      lo=replace(o.lo, speedup=lo[i]) if o.lo is not None and lo is not None else o.lo,
                      hi=replace(o.hi, speedup=hi[i]) if o.hi is not None and hi is not None else o.hi)
    v = judge(overall, top_k(value[i]), report.verdict.gate if report.verdict.enforced else None, report.recording,
              str(report.manifest.get("status", "unknown")), len(report.sessions), report.resampling)
    return v if b is None else replace(v, reason=f"at batch {b}: {v.reason}")


def summarize_at_batch(run: Run, table: CostTable, gated: tuple[int, int], **options) -> Report:
    """summarize at the binding gated batch size, with the batch table attached (the section's rules)."""
    from dataclasses import replace

    first = next((b for b in table.times.batch if gated[0] <= b <= gated[1]), 1)
    report = summarize(run, table.cost_at(first), **options)
    batch = batch_speedups(report, table, gated)
    if batch.binding != first:
        report = summarize(run, table.cost_at(batch.binding), **options)
    verdict = batch.verdicts[batch.gated.index(batch.binding)]
    notes = list(report.notes)
    if len(table.times.batch) == 1 and gated[1] > 1:
        notes.append(f"--batch {gated[0]}-{gated[1]}: the cost table has batch 1 only, so the gate is judged there")
    return replace(report, batch=batch, verdict=verdict, notes=tuple(notes))


# ---------------------------------------------------------------------------------------------
# 6. The whole command: read, cost, summarise, compare


@dataclass(frozen=True)
class Reading:
    run: Run
    report: Report
    comparison: Comparison | None  # None without a baseline


def read_and_summarize(
    path: str | Path | None = None,
    *,
    drafter: str | None = None,
    baseline: str | Path | None = None,
    probe: str | Path | None = None,
    draft_cost: float | None = None,
    gate: Gate | None = None,
    min_support: float = MIN_SUPPORT,
    recorded_with: str | None = None,
    replicates: int = 1000,
    seed: int = 0,
    root: str | Path = "reports",
    batch: str = "1",
    batch_sizes: tuple[int, ...] | None = None,
    device_spec: str | None = None,
    context: float | None = None,
    loaded: Run | None = None,
) -> Reading:
    """What `mtp-observe report` computes. The run defaults to the newest under root. An explicit cost
    (--probe, --draft-cost) applies to the baseline too, so differences come from acceptance alone;
    otherwise each run uses its own roofline. --recorded-with applies to the current run only.

    drafter (--drafter): whose rows the slices, the verdict and the baseline comparison are of (default: mtp when
    the run has it, else its first drafter); every drafter of the run is summarised and ranked beside it, at the
    same batch size.

    batch ('B' or 'LO-HI') is where the gate is judged (section 8): the slices, the best K and the verdict
    are at that batch size (for a range, at the one whose verdict is worst); batch_sizes, device_spec and
    context shape the roofline's table."""
    if not 1 <= replicates <= MAX_REPLICATES:
        raise OptionError(f"--replicates {replicates}: expected 1 to {MAX_REPLICATES:,} bootstrap resamples")
    if seed < 0:
        raise OptionError(f"--seed {seed}: expected an integer >= 0")
    if not 0.0 <= min_support <= 1.0:
        raise OptionError(f"--min-support {min_support}: expected a rate between 0 and 1")
    if context is not None and not (_finite(context) and context >= 0):
        raise OptionError(f"--context {context}: expected a number of tokens >= 0")
    lo, hi = parse_gated(batch)
    roofline_options = [name for name, value in (("--batch-sizes", batch_sizes), ("--device-spec", device_spec),
                                                 ("--context", context)) if value is not None]
    if roofline_options and (probe is not None or draft_cost is not None):
        raise OptionError(f"{' and '.join(roofline_options)} shape the roofline, but --probe/--draft-cost give a measured "
                          "or fixed cost: pass one of them (a probe's batch sizes and context are its own: probe --batch)")
    run = loaded if loaded is not None else load_run(path if path is not None else newest_run(root), drafter)  # loaded: read already
    options = dict(replicates=replicates, seed=seed, gate=gate, min_support=min_support)
    table = cost_table(run, probe=probe, draft_cost=draft_cost, device_spec=device_spec, context=context,
                       batch_sizes=tuple(sorted(set(batch_sizes or DEFAULT_BATCHES) | {lo, hi})))
    report = summarize_at_batch(run, drafter_table(table, run.drafter), (lo, hi), recorded_with=recorded_with, **options)
    report = summarize_drafters(report, run, table, recorded_with=recorded_with, **options)
    comparison = None
    if baseline is not None:
        base_manifest = read_manifest(Path(baseline))
        if run.drafter not in run_drafters(base_manifest):
            raise OptionError(f"--baseline {baseline}: it has no rows of {run.drafter}, the drafter judged here (it has "
                              f"{', '.join(run_drafters(base_manifest))}); pass --drafter with one both runs have")
        base_run = load_run(baseline, run.drafter)
        base_table = drafter_table(cost_table(base_run, probe=probe, draft_cost=draft_cost, device_spec=device_spec,
                                              context=context, batch_sizes=table.times.batch), run.drafter)
        b = report.batch.binding if report.batch.binding in base_table.times.batch else 1
        base = summarize(base_run, base_table.cost_at(b), **options)
        comparison = compare(report, base)
    return Reading(run=run, report=report, comparison=comparison)


# ---------------------------------------------------------------------------------------------
# 7. JSON (`--format json`; the keys are documented in README.md, "report JSON")


def _num(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def rates_json(r: Rates, profiles: tuple[str, ...]) -> dict:
    """A Rates of [K] arrays -> {"alpha": [K], "accept_rate": [K], "tau": [K], "tau_sim": [K],
    "tau_profile": {profile: [K]}, "speedup": [K], "speedup_profile": {profile: [K]}, "on_policy": x,
    "support": {profile: x}, "calibration": {profile: x}, "fit_z": {profile: x}, "log_likelihood": {profile: x},
    "mean_acceptance_length": [K], "draft_acceptance_rate": [K], "per_position_acceptance": [K][K]} (the last three
    engine-counted: over the simulated decode's steps at draft length K, as vLLM counts; row K-1 of
    per_position_acceptance holds positions 1..K, then null); NaN -> null."""
    def seq(a):
        return [_num(v) for v in np.asarray(a)]

    return {
        "alpha": seq(r.alpha), "accept_rate": seq(r.accept_rate), "tau": seq(r.tau), "tau_sim": seq(r.tau_sim),
        "tau_profile": {p: seq(r.tau_profile[i]) for i, p in enumerate(profiles)},
        "speedup": seq(r.speedup), "speedup_profile": {p: seq(r.speedup_profile[i]) for i, p in enumerate(profiles)},
        "on_policy": _num(r.on_policy),
        "support": {p: _num(r.support[i]) for i, p in enumerate(profiles)},
        "calibration": {p: _num(r.calibration[i]) for i, p in enumerate(profiles)},
        "fit_z": {p: _num(r.fit_z[i]) for i, p in enumerate(profiles)},
        "log_likelihood": {p: _num(r.log_likelihood[i]) for i, p in enumerate(profiles)},
        "mean_acceptance_length": seq(r.mean_acceptance_length), "draft_acceptance_rate": seq(r.draft_acceptance_rate),
        "per_position_acceptance": [seq(row) for row in np.asarray(r.per_position_acceptance)],
    }


def slice_json(s: Slice, profiles: tuple[str, ...]) -> dict:
    def maybe(r):
        return rates_json(r, profiles) if r is not None else None

    return {"name": s.name, "anchors": s.anchors, "sessions": s.sessions, "value": rates_json(s.value, profiles),
            "lo": maybe(s.lo), "hi": maybe(s.hi), "session_weighted": maybe(s.session_weighted)}


def delta_json(d: Delta, profiles: tuple[str, ...]) -> dict:
    def maybe(r):
        return rates_json(r, profiles) if r is not None else None

    return {"name": d.name, "value": rates_json(d.value, profiles), "lo": maybe(d.lo), "hi": maybe(d.hi),
            "flagged": list(d.flagged)}


def recording_json(rec: RecordingSampler) -> dict:
    pick = rec.candidate(rec.name)

    def cand(c: Candidate) -> dict:
        return {"name": c.name, "greedy": c.greedy, "support": _num(c.support), "calibration": _num(c.calibration),
                "z": _num(c.z), "fits": c.fits, "log_likelihood": _num(c.log_likelihood)}

    return {
        "name": rec.name, "label": rec.label, "declared": rec.declared, "fits": rec.fits,
        "support": _num(pick.support) if pick else None, "calibration": _num(pick.calibration) if pick else None,
        "z": _num(pick.z) if pick else None, "tokens": rec.tokens, "own_sessions": rec.own_sessions,
        "reason": rec.reason,
        "rule": {"min_support": rec.min_support, "z_max": Z_MAX, "calibration_tolerance": CALIBRATION_TOLERANCE,
                 "ll_floor": LL_FLOOR},
        "candidates": [cand(c) for c in rec.candidates],
    }


def plain_cost_json(cost: Cost) -> dict:
    """A Cost as JSON (a drafter's own, at the gated batch size)."""
    return {"source": cost.source, "c": cost.c, "verify_extra": [float(x) for x in cost.verify_extra], "detail": cost.detail}


def drafters_json(report: Report) -> dict:
    """report JSON `drafters`: every drafter of the run on the same anchors (README, "report JSON")."""
    def maybe(x):
        return _num(x) if x is not None else None

    by = {}
    for d in report.drafters:
        o, k = d.overall, d.best_k
        by[d.name] = {
            "judged": d.judged, "per_k": d.per_k, "cost": plain_cost_json(d.cost),
            "best": {"k": k, "speedup": _num(o.value.speedup[k - 1]),
                     "speedup_lo": _num(o.lo.speedup[k - 1]) if o.lo is not None else None,
                     "speedup_hi": _num(o.hi.speedup[k - 1]) if o.hi is not None else None,
                     "tau_sim": _num(o.value.tau_sim[k - 1])},
            "overall": slice_json(o, report.profiles),
            "slices": {"segment": [slice_json(x, report.profiles) for x in d.segments],
                       "context": [slice_json(x, report.profiles) for x in d.context]},
        }
    best_by_k = []
    for kk in range(1, report.k + 1):
        values = [(float(d.overall.value.speedup[kk - 1]), d.name) for d in report.drafters]
        values = [v for v in values if math.isfinite(v[0])]
        best_by_k.append(max(values, key=lambda v: v[0])[1] if values else None)
    return {
        "judged": report.drafter,
        "names": [d.name for d in report.drafters],
        "ranking": [{"drafter": r.drafter, "k": r.k, "speedup": _num(r.speedup), "speedup_lo": maybe(r.lo),
                     "speedup_hi": maybe(r.hi), "tau_sim": _num(r.tau_sim), "behind": _num(r.behind),
                     "behind_lo": maybe(r.behind_lo), "behind_hi": maybe(r.behind_hi)} for r in report.ranking],
        "best_by_k": best_by_k,
        "by_drafter": by,
    }


def cost_json(report: Report) -> dict:
    """`cost`: c and v(K) at batch 1 (as before batch sizes existed), and at the gated batch size the slices use."""
    c, v, detail = report.cost.c, report.cost.verify_extra, report.cost.detail
    gated = report.batch.binding if report.batch is not None else 1
    if report.batch is not None and gated != 1:
        one = report.batch.table.cost_at(1)
        c, v, detail = one.c, one.verify_extra, one.detail
    return {"source": report.cost.source, "c": float(c), "verify_extra": [float(x) for x in v], "detail": detail,
            "batch": gated, "gated_c": float(report.cost.c), "gated_verify_extra": [float(x) for x in report.cost.verify_extra]}


def batch_json(b: BatchSpeedup) -> dict:
    """`batch`: speedup by batch size (README, "report JSON")."""
    t = b.times

    def grid(a):
        return None if a is None else [[_num(x) for x in row] for row in np.asarray(a)]

    return {
        "source": t.source, "detail": t.detail, "unit": t.unit, "batch_sizes": list(t.batch), "context": b.table.context,
        "k": list(range(1, b.value.shape[1] + 1)),
        "speedup": grid(b.value), "speedup_lo": grid(b.lo), "speedup_hi": grid(b.hi),
        "best_k": list(b.best_k), "break_even_tau": grid(b.break_even),
        "draft_cost": [_num(x) for x in t.draft_cost()], "verify_extra": grid(t.verify_extra(b.value.shape[1])),
        "target_step": grid(t.target), "draft_step": [_num(x) for x in t.draft],
        "bound": None if t.bound is None else {"target": t.bound.tolist(), "draft": t.draft_bound.tolist()},
        "flags": list(t.flags), "notes": list(t.notes), "experts": b.table.experts,
        "gated": list(b.gated), "binding": b.binding,
        "num_speculative_tokens_per_batch_size": [list(r) for r in b.schedule],
        "speculative_config": b.speculative_config,
    }


def report_json(report: Report, comparison: Comparison | None = None) -> dict:
    m = report.manifest
    model = m.get("model") or {}
    k = report.best_k
    o = report.overall
    v = report.verdict
    plan = report.resampling

    def at(r: Rates | None, field: str) -> float | None:
        return _num(getattr(r, field)[k - 1]) if r is not None else None

    return {
        "report_version": REPORT_VERSION,
        "run": {
            "path": str(report.path), "status": m.get("status"), "schema_version": m.get("schema_version"),
            "created": m.get("created"), "model": model.get("path"), "dtype": m.get("dtype"), "device": m.get("device"),
            "k": report.k, "profiles": list(report.profiles), "sessions": len(report.sessions), "anchors": o.anchors,
            "rows": report.rows, "drafter": report.drafter, "target_ran": m.get("target_ran", True) is not False,
        },
        "cost": cost_json(report),
        "bootstrap": {"replicates": report.replicates, "seed": report.seed, "level": report.level,
                      "unit": plan.unit if plan else None, "note": plan.note if plan else None},
        "k": list(range(1, report.k + 1)),
        "overall": slice_json(o, report.profiles),
        "best": {
            "k": k, "speedup": at(o.value, "speedup"), "speedup_lo": at(o.lo, "speedup"), "speedup_hi": at(o.hi, "speedup"),
            "tau_sim": at(o.value, "tau_sim"), "tau_sim_lo": at(o.lo, "tau_sim"), "tau_sim_hi": at(o.hi, "tau_sim"),
            "tau": at(o.value, "tau"), "tau_lo": at(o.lo, "tau"), "tau_hi": at(o.hi, "tau"),
            "serve_k": report.serve_k, "batch": report.batch.binding if report.batch is not None else 1,
        },
        "on_policy": {"rate": _num(o.value.on_policy), "lo": _num(o.lo.on_policy) if o.lo else None,
                      "hi": _num(o.hi.on_policy) if o.hi else None, "min": v.min_support},
        "recorded_with": recording_json(report.recording) if report.recording else None,
        "verdict": {"status": v.status, "gate": v.gate.text, "enforced": v.enforced, "metric": v.gate.metric,
                    "threshold": v.gate.threshold, "k": v.k, "value": _num(v.value), "lower": _num(v.lower),
                    "reason": v.reason, "exit_code": v.exit_code,
                    "batch": report.batch.binding if report.batch is not None else 1,
                    "batches": [{"batch": b, "status": x.status, "k": x.k, "value": _num(x.value), "lower": _num(x.lower),
                                 "reason": x.reason} for b, x in zip(report.batch.gated, report.batch.verdicts)]
                    if report.batch is not None else []},
        "slices": {
            "segment": [slice_json(s, report.profiles) for s in report.segments],
            "context": [slice_json(s, report.profiles) for s in report.context],
            "turn": [slice_json(s, report.profiles) for s in report.turns],
            "session": [slice_json(s, report.profiles) for s in report.sessions],
        },
        "notes": list(report.notes),
        "speculative_check": [
            {"k": c.k, "requests": c.requests, "tokens": c.tokens, "steps": c.steps, "tokens_per_step": _num(c.tokens_per_step),
             "replay_steps": c.replay_steps, "replay_tau_sim": _num(c.replay_tau_sim), "agreeing_steps": c.agree,
             "agree": c.agrees, "first_difference": c.first_difference}
            for c in report.speculative
        ],
        "drafters": drafters_json(report),
        "batch": batch_json(report.batch) if report.batch is not None else None,
        "baseline": None if comparison is None else {
            "path": str(comparison.baseline_path), "k": comparison.k, "profiles": list(comparison.profiles),
            "sessions": {"shared": comparison.shared, "only_current": comparison.only_current,
                         "only_baseline": comparison.only_baseline, "paired": comparison.paired,
                         "note": comparison.note},
            "overall": delta_json(comparison.overall, comparison.profiles),
            "slices": {"segment": [delta_json(d, comparison.profiles) for d in comparison.segments],
                       "context": [delta_json(d, comparison.profiles) for d in comparison.context],
                       "turn": [delta_json(d, comparison.profiles) for d in comparison.turns]},
        },
    }
