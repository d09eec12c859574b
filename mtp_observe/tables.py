"""The tables: the run directory's public contract (schema_version 2) and its atomic writing.

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

Schema history: version 2 added the recording-sampler sums (requests.parquet `fit`), the sampler
each session was scored with (`recorded_sampling`), the profiles' penalties and min-p, the
`recorded` and `greedy` profiles, and run.json's `recorded_with`, `model.generation_config`,
`model.max_position_embeddings`, `model.rope_scaling`; the report reads version 1 and says what it lacks.

run.json keys:
    schema_version      2 (version-1 runs are read too; they lack the keys marked "v2")
    tool                {"name": "mtp-observe", "version": str}
    created, finished   ISO-8601 UTC strings (finished null while running)
    status              "running" | "complete" | "failed"
    model               {"path", "bundled": bool, "model_type", "config_sha256", "head_tensors": [names],
                         "numerics": what the weights were computed in (e.g. "fp8 e4m3 weights (128x128 blocks,
                                     q * weight_scale_inv) dequantised to bfloat16"; added in schema 2),
                         "roofline": {"precision", "head_bytes", "lm_head_bytes", "target_bytes", "draft_cost",
                                      "head_step_bytes", "target_step_bytes" (batch-1 step bytes: routed experts
                                      at top-k / E; added in schema 2)},
                         "roofline_by_precision": {precision: draft_cost}}
    tokenizer_sha256    str
    k                   Kmax replayed (int)
    dtype, device       str
    sampling            {profile: {"temperature", "top_p", "top_k", "min_p", "presence_penalty",
                         "frequency_penalty", "repetition_penalty"}} (vLLM SamplingParams names), one
                         p_accept_<profile> column each; "recorded" also has "per_session": true and
                         "fallback" (the sampler of sessions without their own meta.sampling: the
                         declared one, "generation_config" or "vllm_defaults")
    recorded_with       v2: null, or the profile name `replay --recorded-with` declared
    model.generation_config         v2: the checkpoint's generation_config.json sampler (as vLLM reads it), or null
    model.max_position_embeddings   v2: the text config's, or null
    model.rope_scaling              v2: the text config's rope parameters when they scale (rope_type other than
                                    "default", or a factor), else null
    inputs              [{"path", "sha256", "sessions"}]   path "-" for standard input (its sha256 is of what was read)
    rendering           v2: null, or {"chat_template": {"path", "sha256"} | null, "template_kwargs": {...}}: what
                        --chat-template / --template-kwargs replaced (part of the run's identity: --resume needs the same)
    options             {"chunk_size", "on_error", "max_sessions", ...}
    counts              {"sessions_ok", "sessions_skipped", "requests", "tokens_replayed",
                         "scored_tokens", "anchors", "rows", "max_request_tokens"}
    versions            {"python", "torch", "transformers"}
    errors              [{"path", "line", "session_id", "message"}]   skipped inputs and why
    timing              {"wall_s", "tokens_per_s"}

requests.parquet columns added in version 2:
    fit                 list<struct>, one per entry of `spans` (same order): "tokens" int32 (scored
                        tokens x_t, t = s..e, t >= 1), and per profile P "support_P" int32 (tokens with
                        q_t(x_t) > 0), "q_P" double (Σ q_t(x_t)), "q2_P" double (Σ_t Σ_v q_t(v)²),
                        "var_P" double (Σ_t Σ_v q_t(v)³ - (Σ_v q_t(v)²)²), "ll_P" double (Σ log q_t(x_t)
                        over the tokens with q_t(x_t) > 0), q_t the profile's sampler at t on the
                        recorded prefix (ACCEPTANCE.md, "The recording sampler")
    recorded_sampling   struct: "source" ("session": its meta.sampling, or the fallback named in
                        run.json sampling.recorded) and the seven parameters the `recorded` profile used
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import RunDirectoryError

SCHEMA_VERSION = 2
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


FIT_STATISTICS = (("support", pa.int32()), ("q", pa.float64()), ("q2", pa.float64()), ("var", pa.float64()),
                  ("ll", pa.float64()))
RECORDED_SAMPLING = pa.struct([("source", pa.string()), ("temperature", pa.float64()), ("top_p", pa.float64()),
                               ("top_k", pa.int32()), ("min_p", pa.float64()), ("presence_penalty", pa.float64()),
                               ("frequency_penalty", pa.float64()), ("repetition_penalty", pa.float64())])


def fit_type(profiles: list[str]) -> pa.DataType:
    """One span's recording-sampler sums: tokens, then support/q/q2/var/ll per profile."""
    return pa.struct([("tokens", pa.int32())] + [(f"{stat}_{p}", t) for p in profiles for stat, t in FIT_STATISTICS])


def requests_schema(profiles: list[str]) -> pa.Schema:
    """requests.parquet's columns (version 2): REQUESTS_SCHEMA's, the fit sums per span, the recorded sampler."""
    return pa.schema(list(REQUESTS_SCHEMA) + [("fit", pa.list_(fit_type(profiles))), ("recorded_sampling", RECORDED_SAMPLING)])


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


# ---------------------------------------------------------------------------------------------
# Building one session's parts


def requests_table(session_id: str, requests, fits: list[dict] | None = None, profiles: list[str] | None = None,
                   recorded: dict | None = None) -> pa.Table:
    """requests: objects with index, input_ids, spans (start, end, turn). Without fits: the version-1 columns.

    fits: per request {"tokens": [N], "<stat>_<profile>": [N]} over its N spans; recorded: the
    recorded_sampling struct of the session (source and parameters).
    """
    data = {
        "session_id": [session_id] * len(requests),
        "request": [r.index for r in requests],
        "input_ids": [list(r.input_ids) for r in requests],
        "n_tokens": [len(r.input_ids) for r in requests],
        "spans": [[{"start": s.start, "end": s.end, "turn": s.turn} for s in r.spans] for r in requests],
    }
    if fits is None:
        return pa.table(data, schema=REQUESTS_SCHEMA)
    schema = requests_schema(profiles)
    names = [f.name for f in fit_type(profiles)]
    data["fit"] = [[{name: _plain(fit[name][i]) for name in names} for i in range(len(r.spans))] for r, fit in zip(requests, fits)]
    data["recorded_sampling"] = [recorded] * len(requests)
    return pa.table(data, schema=schema)


def _plain(x):
    """A numpy scalar as the Python number pyarrow takes."""
    return x.item() if hasattr(x, "item") else x


def positions_table(session_id: str, per_request: list[tuple[int, dict]], profiles: list[str]) -> pa.Table:
    """per_request: [(request index, columns from acceptance.request_rows)] -> one table, schema-exact."""
    import numpy as np

    schema = positions_schema(profiles)
    if not per_request:
        return schema.empty_table()
    cols = {name: np.concatenate([c[name] for _, c in per_request]) for name in per_request[0][1]}
    n = len(cols["pos"])
    request = np.concatenate([np.full(len(c["pos"]), r, dtype=np.int32) for r, c in per_request])
    segment = pa.DictionaryArray.from_arrays(pa.array(cols["segment"], pa.int8()), pa.array(SEGMENTS, pa.string()))
    arrays = {
        "session_id": pa.array([session_id] * n, pa.string()),
        "request": pa.array(request, pa.int32()),
        "segment": segment,
    }
    for field in schema:
        if field.name not in arrays:
            arrays[field.name] = pa.array(cols[field.name], field.type)
    return pa.table([arrays[f.name] for f in schema], schema=schema)


# ---------------------------------------------------------------------------------------------
# The run directory on disk

MANIFEST = "run.json"
REQUESTS = "requests.parquet"
POSITIONS = "positions.parquet"
_RUN_ENTRIES = {MANIFEST, REQUESTS, POSITIONS}


def _run_error(path: Path, what: str) -> RunDirectoryError:
    return RunDirectoryError(f"{path}: {what}")


def read_manifest(path: Path) -> dict:
    """run.json, checked far enough to trust schema_version, k and sampling."""
    path = Path(path)
    if not path.is_dir():
        raise _run_error(path, "no such run directory; pass a directory written by `mtp-observe replay` "
                               "(it holds run.json)")
    manifest_path = path / "run.json"
    if not manifest_path.is_file():
        raise _run_error(manifest_path, "missing; this is not a run directory written by `mtp-observe replay`")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _run_error(manifest_path, f"cannot be read as JSON ({_one_line(e)}); the run directory is damaged") from None
    if not isinstance(manifest, dict):
        raise _run_error(manifest_path, "is not a JSON object; the run directory is damaged")
    version = manifest.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _run_error(manifest_path,
                         f"schema_version {version!r} is not a version this tool wrote; not an mtp-observe run")
    if version > SCHEMA_VERSION:
        raise _run_error(
            manifest_path,
            f"schema_version {version} is newer than this mtp-observe {_tool_version()} reads ({SCHEMA_VERSION}); "
            "upgrade mtp-observe to read it",
        )
    k = manifest.get("k")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise _run_error(manifest_path,
                         f"k is {k!r}, expected the replayed Kmax (an integer >= 1); the run directory is damaged")
    sampling = manifest.get("sampling", {})
    if not isinstance(sampling, dict) or not all(isinstance(p, str) and p for p in sampling):
        raise _run_error(manifest_path, "sampling is not an object of profile names; the run directory is damaged")
    return manifest


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _tool_version() -> str:
    from . import __version__

    return __version__


def prepare_run_directory(run_dir: Path, resume: bool, overwrite: bool) -> dict | None:
    """Check what is at run_dir before a replay. Returns the manifest to resume, or None for a fresh run.

    An existing directory needs --resume (continue an unfinished run) or --overwrite (start again);
    --overwrite only ever deletes what a run writes, never a directory holding anything else.
    """
    import shutil

    run_dir = Path(run_dir)
    if resume and overwrite:
        raise RunDirectoryError("--resume and --overwrite contradict each other; pass one")
    exists = run_dir.exists() and any(run_dir.iterdir()) if run_dir.is_dir() else run_dir.exists()
    if not exists:
        if resume:
            raise RunDirectoryError(f"{run_dir}: nothing to resume (no run there); drop --resume")
        return None
    if run_dir.is_file():
        raise RunDirectoryError(f"{run_dir}: is a file; pick another --out")
    foreign = sorted(p.name for p in run_dir.iterdir() if p.name not in _RUN_ENTRIES and not p.name.startswith("."))
    if resume:
        manifest = read_manifest(run_dir)
        if manifest.get("status") == "complete":
            raise RunDirectoryError(f"{run_dir}: this run is already complete; use --overwrite to redo it or another --out")
        return manifest
    if overwrite:
        if foreign:
            raise RunDirectoryError(f"{run_dir}: holds {foreign[0]!r}, which a run does not write; refusing to overwrite it — pick another --out")
        for p in run_dir.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        return None
    raise RunDirectoryError(f"{run_dir}: already exists; pass --resume to continue it, --overwrite to replace it, or another --out")


def done_parts(run_dir: Path) -> set[str]:
    """Part names present in both tables (a session is done only when both of its parts are)."""
    names = []
    for table in (REQUESTS, POSITIONS):
        d = Path(run_dir) / table
        names.append({p.name for p in d.glob("part-*.parquet")} if d.is_dir() else set())
    return names[0] & names[1]


def remove_temporaries(run_dir: Path) -> None:
    """Half-written parts of a killed run (dot-prefixed temporary names)."""
    for table in (REQUESTS, POSITIONS):
        d = Path(run_dir) / table
        if d.is_dir():
            for p in d.glob(".part-*.tmp-*"):
                p.unlink()


def part_counts(run_dir: Path, name: str) -> dict:
    """Counts of one finished session, read back from its parts (for a resumed run's manifest)."""
    req = pq.read_table(Path(run_dir) / REQUESTS / name, columns=["n_tokens", "spans"]).to_pylist()
    pos = pq.read_table(Path(run_dir) / POSITIONS / name, columns=["depth"]).column("depth").to_pylist()
    return {
        "requests": len(req),
        "tokens_replayed": sum(r["n_tokens"] for r in req),
        "scored_tokens": sum(s["end"] - s["start"] + 1 for r in req for s in r["spans"]),
        "anchors": sum(1 for d in pos if d == 1),
        "rows": len(pos),
        "max_request_tokens": max((r["n_tokens"] for r in req), default=0),
    }
