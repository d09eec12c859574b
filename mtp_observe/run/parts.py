"""Part files: sessions grouped into parts of bounded size, written atomically, read back for --resume.

A replay of 100,000 small sessions must not write 200,000 files, and a replay killed at any moment
must leave a directory every reader reads and --resume continues. So:

Grouping (`PartWriter`). Finished sessions are buffered and written together as one part per table,
`part-<index of its first session:08d>.parquet` (the name tables.part_name gives the first session;
the name order is still input order), once the buffer holds GROUP_SESSIONS sessions or GROUP_ROWS
positions rows, or its oldest session has waited GROUP_SECONDS; the buffer is also written when the
replay ends, fails or is interrupted (Ctrl-C: the sessions already finished are kept). Memory is
bounded by GROUP_ROWS rows (plus the one session that crosses it); a killed process (SIGKILL, power)
loses at most the buffered sessions, at most GROUP_SECONDS of work, which --resume recomputes.

Atomicity. Each table's part is written to a dot-prefixed temporary in the run directory itself,
*outside* the table directories (`.positions.parquet.part-00000000.parquet.tmp-<pid>`), fsynced, then
renamed into its directory: a table directory only ever holds complete parts, so every reader —
pyarrow.dataset, pandas, polars, duckdb — reads a run whatever was killed when (polars refuses a
directory holding a file of another extension, so a temporary inside the directory would break it).
Positions first, then requests: a part is finished once it is in both directories.

Older runs (one session per part, temporaries `.part-....parquet.tmp-<pid>` inside the table
directories) read as before: a part of one session is a group of one, and entries.remove_temporaries
and --overwrite handle both temporary names.

Resume (`finished_sessions`). Every part present in both tables is read back whole (`read_part`:
every column of both tables decoded, the pages' checksums verified — tables.write_part writes them —,
the rows) and each of its sessions counted; a part that does not read back whole (cut short by a full
disk, a bad copy, a damaged page) is reported and removed with its twin, so its sessions are recomputed.
`counts_on_disk` sums them: run.json's counts after an interrupted or failed replay.

This module imports no torch.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from . import entries, readers, tables

GROUP_SESSIONS = 256  # sessions per part at most (replay --part-sessions): 100,000 sessions -> about 400 parts per table
GROUP_ROWS = 2_000_000  # positions rows buffered at most (about 100 MB in memory at ~50 bytes a row)
GROUP_SECONDS = 60.0  # a buffered session waits at most this long on disk-less memory


def temporary_name(table: str, name: str) -> str:
    """The temporary of part `name` of `table` (in the run directory, outside the table directory)."""
    return f".{table}.{name}.tmp-{os.getpid()}"


def write_group(run_dir: Path, name: str, positions: pa.Table, requests: pa.Table) -> None:
    """Both tables' part `name`, each atomically (temporary in run_dir, fsync, rename), positions first."""
    for table, data in ((entries.POSITIONS, positions), (entries.REQUESTS, requests)):
        tables.write_part(data, run_dir / table, name, temporary=run_dir / temporary_name(table, name))


@dataclass
class PartWriter:
    """Buffers finished sessions and writes them as grouped parts (module doc). add() may write; close() writes
    what is left. `clock` is injectable for tests."""

    run_dir: Path
    max_sessions: int = GROUP_SESSIONS
    max_rows: int = GROUP_ROWS
    max_seconds: float = GROUP_SECONDS
    clock: object = time.monotonic
    _first: int | None = None
    _since: float = 0.0
    _positions: list = field(default_factory=list)
    _requests: list = field(default_factory=list)
    _rows: int = 0

    def add(self, index: int, positions: pa.Table, requests: pa.Table) -> None:
        """One finished session (its input index and both tables); writes the group when it is full."""
        if self._first is None:
            self._first, self._since = index, self.clock()
        self._positions.append(positions)
        self._requests.append(requests)
        self._rows += positions.num_rows
        if (len(self._positions) >= self.max_sessions or self._rows >= self.max_rows
                or self.clock() - self._since >= self.max_seconds):
            self.flush()

    def flush(self) -> None:
        if self._first is None:
            return
        name = tables.part_name(self._first)
        positions = pa.concat_tables(self._positions)
        requests = pa.concat_tables(self._requests)
        # forgotten only once both tables are written: a Ctrl-C between the two renames reaches the caller's flush
        # (pipeline._replay_sessions), which writes the same group again instead of leaving a positions part alone
        write_group(Path(self.run_dir), name, positions, requests)
        self._first, self._positions, self._requests, self._rows = None, [], [], 0

    @property
    def pending(self) -> int:
        return len(self._positions)


def _session_counts(req: pa.Table, pos: pa.Table, k: int, draft_ks: list[int] | None = None
                    ) -> tuple[dict[str, dict] | None, str | None]:
    """One part's sessions -> {session_id: counts}, or (None, what is wrong): positions must hold, for every
    session, exactly the rows its requests' spans imply — min(K', e - p) depths at every anchor p = max(s, 1)..e-1
    of every span [s, e], once for every draft length K' of every drafter (draft_ks, e.g. [4, 1, 2, 3, 4] for
    mtp and suffix; None: [k], an mtp-only run). anchors counts each anchor once, whatever the drafters."""
    draft_ks = draft_ks or [k]
    import pyarrow.compute as pc

    if req.num_rows == 0:
        return None, "holds no requests"

    def per_session(ids) -> dict[str, int]:
        counted = pc.value_counts(ids)
        return dict(zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist()))

    rows = per_session(pos.column("session_id")) if pos.num_rows else {}
    out: dict[str, dict] = {}
    expected: dict[str, int] = {}
    for sid, spans, n in zip(req.column("session_id").to_pylist(), req.column("spans").to_pylist(),
                             req.column("n_tokens").to_pylist()):
        c = out.setdefault(sid, {"requests": 0, "tokens_replayed": 0, "scored_tokens": 0, "anchors": 0, "rows": 0,
                                 "max_request_tokens": 0})
        c["requests"] += 1
        c["tokens_replayed"] += n
        c["max_request_tokens"] = max(c["max_request_tokens"], n)
        c["scored_tokens"] += sum(sp["end"] - sp["start"] + 1 for sp in spans)
        c["anchors"] += sum(max(sp["end"] - max(sp["start"], 1), 0) for sp in spans)
        expected[sid] = expected.get(sid, 0) + sum(min(kk, sp["end"] - p) for kk in draft_ks for sp in spans
                                                   for p in range(max(sp["start"], 1), sp["end"]))
    strangers = sorted(set(rows) - set(out))
    if strangers:
        return None, f"positions hold session(s) {strangers[:3]} that its requests do not"
    for sid, c in out.items():
        c["rows"] = rows.get(sid, 0)
        if c["rows"] != expected[sid]:
            return None, f"holds {c['rows']} rows of session {sid} where its spans imply {expected[sid]}"
    return out, None


@dataclass(frozen=True)
class Finished:
    part: str  # the part file name holding the session
    counts: dict  # requests, tokens_replayed, scored_tokens, anchors, rows, max_request_tokens


def read_part(run_dir: Path, name: str, k: int, draft_ks: list[int] | None = None) -> tuple[dict[str, dict] | None, str | None]:
    """({session_id: counts}, None) for a part whose two tables read back whole, or (None, what is wrong). Whole:
    every column of both tables decoded (every page decompressed and read; a damaged page in any column fails) with
    the pages' checksums verified where the part has them (tables.write_part writes them), and the rows its
    requests' spans imply. The check merge, --resume and a Ray job's end make, one part at a time."""
    try:
        req = pq.read_table(Path(run_dir) / entries.REQUESTS / name, page_checksum_verification=True)
        pos = pq.read_table(Path(run_dir) / entries.POSITIONS / name, page_checksum_verification=True)
        for table in (req, pos):
            table.validate(full=True)  # offsets, lengths and UTF-8 of what was decoded
    except (OSError, pa.ArrowException) as e:
        return None, f"cannot be read back ({readers._one_line(e)})"
    for table, data, needed in ((entries.REQUESTS, req, ("session_id", "n_tokens", "spans")),
                                (entries.POSITIONS, pos, ("session_id",))):
        absent = [c for c in needed if c not in data.column_names]
        if absent:
            return None, f"cannot be read back ({table} has no {absent[0]} column)"
    return _session_counts(req, pos, k, draft_ks)


def finished_sessions(run_dir: Path, k: int, draft_ks: list[int] | None = None, on_damaged=None) -> dict[str, Finished]:
    """Every session in a part present in both tables and whole (for --resume). A damaged part is removed (both
    tables) after on_damaged(path, reason) hears of it; its sessions are then not finished. A part in one table
    only (killed between the two renames) is removed: its sessions are recomputed into a part that may be
    named differently, and the orphan would otherwise add its rows twice."""
    out: dict[str, Finished] = {}
    done = tables.done_parts(run_dir)
    for table in (entries.REQUESTS, entries.POSITIONS):
        d = Path(run_dir) / table
        for p in (d.glob("part-*.parquet") if d.is_dir() else ()):
            if p.name not in done:
                p.unlink()
    for name in sorted(done):
        sessions, damaged = read_part(run_dir, name, k, draft_ks)
        if sessions is None:
            if on_damaged is not None:
                on_damaged(Path(run_dir) / entries.POSITIONS / name, damaged)
            tables.remove_part(run_dir, name)
            continue
        for sid, counts in sessions.items():
            out[sid] = Finished(name, counts)
    return out


COUNTED = ("requests", "tokens_replayed", "scored_tokens", "anchors", "rows")


def counts_on_disk(run_dir: Path, k: int, draft_ks: list[int] | None = None) -> dict:
    """run.json's counts of what the parts on disk hold (sessions_ok and the sums; max_request_tokens a maximum).
    Parts that do not read back whole are left out (and left alone: --resume deals with them)."""
    counts = dict.fromkeys(("sessions_ok",) + COUNTED + ("max_request_tokens",), 0)
    for name in sorted(tables.done_parts(run_dir)):
        sessions, _ = read_part(run_dir, name, k, draft_ks)
        for c in (sessions or {}).values():
            counts["sessions_ok"] += 1
            for key in COUNTED:
                counts[key] += c[key]
            counts["max_request_tokens"] = max(counts["max_request_tokens"], c["max_request_tokens"])
    return counts
