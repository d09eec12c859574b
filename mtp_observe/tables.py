"""The tables: the run directory's public contract (schema_version 1) and its atomic writing.

Contract (PRODUCT.md): a run directory holds

    run.json            the manifest (keys below)
    requests.parquet    one row per replayed request
    positions.parquet   one row per (anchor, depth)

Both Parquet paths are datasets: a single file or a directory of part files. This tool
writes directories of parts, one part per session and table, named
`part-<session index:08d>[-r<rank>].parquet`; the name order is input order. Each part is
written under a dot-prefixed temporary name and renamed, so a killed run never leaves a
half-written part that a reader would pick up (pyarrow.dataset, pandas, polars and duckdb
skip dot-prefixed files). Rows are grouped by session in input order and, within a
session, sorted by (request, pos, depth).

This module imports no torch: the report reads through it.

run.json keys:
    schema_version      1
    tool                {"name": "mtp-observe", "version": str}
    created, finished   ISO-8601 UTC strings (finished null while running)
    status              "running" | "complete" | "failed"
    model               {"path", "bundled": bool, "model_type", "config_sha256", "head_tensors": [names],
                         "roofline": {"precision", "head_bytes", "lm_head_bytes", "target_bytes", "draft_cost"},
                         "roofline_by_precision": {precision: draft_cost}}
    tokenizer_sha256    str
    k                   Kmax replayed (int)
    dtype, device       str
    sampling            {profile: {"temperature", "top_p", "top_k"}}
    inputs              [{"path", "sha256", "sessions"}]
    options             {"chunk_size", "on_error", "max_sessions", ...}
    counts              {"sessions_ok", "sessions_skipped", "requests", "tokens_replayed",
                         "scored_tokens", "anchors", "rows"}
    versions            {"python", "torch", "transformers"}
    errors              [{"path", "line", "session_id", "message"}]   skipped inputs and why
    timing              {"wall_s", "tokens_per_s"}
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA_VERSION = 1
SEGMENTS = ["reasoning", "text", "tool_call", "end"]

REQUESTS_SCHEMA = pa.schema(
    [
        ("session_id", pa.string()),
        ("request", pa.int32()),
        ("input_ids", pa.list_(pa.int32())),
        ("n_tokens", pa.int32()),
        ("spans", pa.list_(pa.struct([("start", pa.int32()), ("end", pa.int32()), ("turn", pa.int32())]))),
    ]
)

_POSITION_FIELDS = [
    ("session_id", pa.string()),
    ("request", pa.int32()),
    ("turn", pa.int32()),
    ("pos", pa.int32()),
    ("depth", pa.int8()),
    ("segment", pa.dictionary(pa.int8(), pa.string())),
    ("draft_token", pa.int32()),
    ("actual_token", pa.int32()),
    ("target_token", pa.int32()),
    ("match", pa.bool_()),
    ("accepted", pa.bool_()),
    ("draft_logprob", pa.float32()),
    ("target_logprob", pa.float32()),
    ("actual_logprob", pa.float32()),
]


def positions_schema(profiles: list[str]) -> pa.Schema:
    """positions.parquet's columns: the fixed ones, then one float32 p_accept_<profile> per sampling profile."""
    return pa.schema(_POSITION_FIELDS + [(f"p_accept_{p}", pa.float32()) for p in profiles])


def part_name(session_index: int, rank: int | None = None) -> str:
    return f"part-{session_index:08d}" + (f"-r{rank}" if rank is not None else "") + ".parquet"


def write_part(table: pa.Table, directory: Path, name: str) -> Path:
    """Write one part atomically: a dot-prefixed temporary file, fsync, then rename."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / name
    tmp = directory / f".{name}.tmp-{os.getpid()}"
    pq.write_table(table, tmp, compression="zstd")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return final


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
