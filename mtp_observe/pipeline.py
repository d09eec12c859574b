"""The pipeline: the one place that ties the stages together.

Contract: `load_model` turns a checkpoint directory into the target (transformers) and the
head (ours, borrowing the target's embedding and lm_head), on one device and dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoint import CheckpointInfo, load_head_tensors, load_target, read_checkpoint
from .errors import OptionError
from .mtp import MtpHead, build_head

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def default_model_dir() -> Path:
    """The small trained Qwen3.5-architecture checkpoint shipped inside the package."""
    path = Path(__file__).parent / "default_model"
    if not (path / "config.json").exists():
        raise OptionError(f"no --model given and the bundled default model is missing at {path}; pass --model DIR")
    return path


def resolve_device(device: str) -> str:
    """auto -> cuda when available, else cpu; cuda[:i] must exist."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise OptionError(f"--device {device}: no CUDA device is visible; use --device cpu (or auto)")
        index = device.partition(":")[2]
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            raise OptionError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return device
    raise OptionError(f"--device {device}: expected auto, cpu, cuda or cuda:N")


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """auto -> bfloat16 on CUDA, float32 on CPU (PRODUCT.md's performance rules)."""
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in DTYPES:
        raise OptionError(f"--dtype {dtype}: expected auto, float32 or bfloat16")
    return DTYPES[dtype]


@dataclass(frozen=True)
class LoadedModel:
    info: CheckpointInfo
    target: object  # transformers Qwen3_5ForCausalLM, eval mode
    head: MtpHead
    device: str
    dtype: torch.dtype


def load_model(model_dir: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> LoadedModel:
    info = read_checkpoint(model_dir)
    target = load_target(info, device=device, dtype=dtype)
    head = build_head(
        info.geometry, load_head_tensors(info, device=device, dtype=dtype),
        embed_tokens=target.model.embed_tokens.weight, lm_head=target.lm_head.weight,
    )
    return LoadedModel(info=info, target=target, head=head, device=device, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# Replay: sessions -> requests -> target + head -> rows -> run directory


@dataclass(frozen=True)
class ReplayOptions:
    k: int = 4
    chunk_size: int = 2048
    device: str = "auto"
    dtype: str = "auto"
    profiles: tuple = ()  # SamplingProfile; empty means the built-in ones
    on_error: str = "fail"
    max_sessions: int | None = None
    resume: bool = False
    overwrite: bool = False


class Observer:
    """Progress callbacks; the CLI draws a progress bar from them. The default does nothing."""

    def start(self, sessions: int) -> None: ...

    def session(self, session_id: str, tokens: int, skipped: bool) -> None: ...

    def warn(self, message: str) -> None: ...


@dataclass(frozen=True)
class RequestResult:
    index: int
    columns: dict  # positions.parquet columns of this request (numpy), see acceptance.request_rows


def replay_request(model: LoadedModel, request, k_max: int, profiles, chunk_size: int) -> dict:
    """One request through the target and the head: the columns of its rows.

    1. target: chunked prefill -> post-norm hidden h at every position
    2. head: one row pass over every position (its KV covers the prompt), then the chain at
       every anchor of every span, depths batched over anchors
    3. target again, lm_head only at the rows' positions p+k-1 -> argmax, log-probs, sampler probs
    4. rows
    """
    from .acceptance import anchor_plan, request_rows, row_index
    from .target import prefill_hidden, reduce_logits

    ids = torch.tensor(request.input_ids, dtype=torch.long)
    n = ids.shape[0]
    segments = torch.full((n,), -1, dtype=torch.int8)
    for sp in request.spans:
        segments[sp.start : sp.end + 1] = torch.frombuffer(bytearray(sp.segments), dtype=torch.int8)
    plan = anchor_plan(request.spans, k_max)
    index = row_index(plan, k_max)
    hidden = prefill_hidden(model.target, ids, chunk_size=chunk_size)  # 1
    rows = model.head.row_pass(hidden[:-1], ids[1:].to(hidden.device), chunk_size=chunk_size)  # 2
    drafts = model.head.chain(rows, plan.anchors, plan.depths)
    del rows
    a, k = index.anchor_index, index.depth
    reductions = reduce_logits(  # 3
        model.target.lm_head.weight, hidden, index.target_position,
        drafts.tokens.cpu()[a, k - 1], ids[index.actual_position], tuple(profiles),
    )
    return request_rows(ids, segments, plan, index, drafts.tokens, drafts.logprobs, reductions, k_max)  # 4


def sha256_file(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def count_records(path: Path) -> int:
    """Sessions a file will yield, counted cheaply (non-blank lines; a message-per-line file is one)."""
    import json

    n, first = 0, None
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                if first is None:
                    first = line
                n += 1
    if first is not None:
        try:
            head = json.loads(first)
            if isinstance(head, dict) and "role" in head and "messages" not in head:
                return 1
        except ValueError:
            pass
    return n


def default_run_dir() -> Path:
    import time

    base = Path("reports") / time.strftime("run-%Y%m%d-%H%M%S")
    out, i = base, 1
    while out.exists():
        out, i = Path(f"{base}-{i}"), i + 1
    return out


def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _check_options(opts: ReplayOptions) -> None:
    import re

    if opts.k < 1:
        raise OptionError(f"--k {opts.k}: draft depth must be at least 1")
    if opts.chunk_size < 1:
        raise OptionError(f"--chunk-size {opts.chunk_size}: must be at least 1")
    if opts.on_error not in ("fail", "skip"):
        raise OptionError(f"--on-error {opts.on_error}: expected fail or skip")
    if opts.max_sessions is not None and opts.max_sessions < 1:
        raise OptionError(f"--max-sessions {opts.max_sessions}: must be at least 1")
    names = [p.name for p in opts.profiles]
    for name in names:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise OptionError(f"--sampling {name}=...: profile names are letters, digits and _ (they become column names)")
    if len(set(names)) != len(names):
        raise OptionError(f"--sampling: profile names repeat ({', '.join(names)}); give each a distinct name")


def replay(files, model_dir: Path, out: Path, opts: ReplayOptions, bundled: bool = False, observer: Observer | None = None) -> Path:
    """Replay sessions into a run directory (PRODUCT.md's contract). Returns the run directory."""
    import platform
    import time

    import transformers

    from . import __version__, tables
    from .checkpoint import tokenizer_sha256
    from .errors import InputError, RunDirectoryError
    from .inventory import take_inventory
    from .rendering import Renderer
    from .sessions import SessionError, Skipped, read_sessions
    from .target import BUILTIN_PROFILES

    observer = observer or Observer()
    profiles = tuple(opts.profiles) or BUILTIN_PROFILES
    opts = ReplayOptions(**{**opts.__dict__, "profiles": profiles})
    _check_options(opts)
    files = [Path(f) for f in files]
    for f in files:
        if not f.is_file():
            raise InputError(f"{f}: no such file; pass JSONL session files (e.g. sessions/*.jsonl)")
    device = resolve_device(opts.device)
    dtype = resolve_dtype(opts.dtype, device)
    info = read_checkpoint(model_dir)
    inventory = take_inventory(info)
    precision = {torch.bfloat16: "BF16", torch.float32: "stored", torch.float64: "stored"}[dtype]

    # 1. The identity of this run: a resumed run must match it exactly.
    identity = {
        "model": {"config_sha256": info.config_sha256, "head_tensors": info.head_names},
        "tokenizer_sha256": tokenizer_sha256(info.path),
        "k": opts.k,
        "dtype": str(dtype).removeprefix("torch."),
        "device": device,
        "sampling": {p.name: p.as_dict() for p in profiles},
        "inputs": [{"path": str(f), "sha256": sha256_file(f)} for f in files],
        "options": {"chunk_size": opts.chunk_size, "on_error": opts.on_error, "max_sessions": opts.max_sessions},
    }
    resumed = tables.prepare_run_directory(out, opts.resume, opts.overwrite)
    if resumed is not None:
        for key, value in identity.items():
            theirs = resumed.get(key)
            if key == "model":
                theirs = {k: (resumed.get("model") or {}).get(k) for k in value}
            elif key == "inputs":
                theirs = [{"path": i.get("path"), "sha256": i.get("sha256")} for i in resumed.get("inputs", [])]
            if theirs != value:
                raise RunDirectoryError(f"{out}: cannot resume, {key} differs from the interrupted run; rerun with the same inputs and options, or --overwrite")
        tables.remove_temporaries(out)
    out.mkdir(parents=True, exist_ok=True)

    # 2. Model and renderer.
    model = load_model(model_dir, device=device, dtype=dtype)
    renderer = Renderer.from_model_dir(model_dir, vocab_size=info.geometry.vocab_size)
    roofline = {
        "precision": "BF16" if precision == "BF16" else "stored",
        "head_bytes": inventory.head_bytes(precision), "lm_head_bytes": inventory.lm_head_bytes(precision),
        "target_bytes": inventory.target_bytes(precision), "draft_cost": inventory.draft_cost(precision),
    }
    manifest = {
        "schema_version": tables.SCHEMA_VERSION,
        "tool": {"name": "mtp-observe", "version": __version__},
        "created": (resumed or {}).get("created") or _now(),
        "finished": None,
        "status": "running",
        **identity,
        "model": {
            "path": str(info.path.resolve()), "bundled": bundled, "model_type": info.model_type,
            **identity["model"], "roofline": roofline,
            "roofline_by_precision": {p: inventory.draft_cost(p) for p in ["stored", "BF16", "FP8", "Q8_0", "Q6_K", "Q4_K"]},
        },
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__},
        "counts": {},
        "errors": [],
        "resumed": (resumed or {}).get("resumed", []) + ([_now()] if resumed else []),
    }
    tables.write_json_atomic(out / tables.MANIFEST, manifest)

    # 3. Every session, in input order; finished parts of a resumed run are kept.
    done = tables.done_parts(out)
    counts = {"sessions_ok": 0, "sessions_skipped": 0, "requests": 0, "tokens_replayed": 0,
              "scored_tokens": 0, "anchors": 0, "rows": 0}
    per_file = {str(f): 0 for f in files}
    total = sum(count_records(f) for f in files)
    observer.start(min(total, opts.max_sessions) if opts.max_sessions else total)
    names = [p.name for p in profiles]
    started = time.time()
    fresh_tokens = 0
    try:
        for item in read_sessions(files, on_error=opts.on_error):
            if opts.max_sessions is not None and item.index >= opts.max_sessions:
                break
            per_file[item.path] += 1
            if isinstance(item, Skipped):
                manifest["errors"].append({"path": item.path, "line": item.line, "session_id": item.session_id, "message": item.message})
                counts["sessions_skipped"] += 1
                observer.warn(item.message)
                observer.session(item.session_id or "?", 0, skipped=True)
                continue
            name = tables.part_name(item.index)
            if name in done:
                c = tables.part_counts(out, name)
            else:
                try:
                    rendered = renderer.render(item)
                except SessionError as e:
                    if opts.on_error == "fail":
                        raise
                    manifest["errors"].append({"path": e.path, "line": e.line, "session_id": e.session_id, "message": str(e)})
                    counts["sessions_skipped"] += 1
                    observer.warn(str(e))
                    observer.session(item.id, 0, skipped=True)
                    continue
                per_request = [(r.index, replay_request(model, r, opts.k, profiles, opts.chunk_size)) for r in rendered.requests]
                positions = tables.positions_table(item.id, per_request, names)
                requests = tables.requests_table(item.id, rendered.requests)
                tables.write_part(positions, out / tables.POSITIONS, name)  # positions first: a session is
                tables.write_part(requests, out / tables.REQUESTS, name)  # done once both parts exist
                c = {"requests": len(rendered.requests), "tokens_replayed": rendered.n_tokens,
                     "scored_tokens": rendered.scored_tokens, "anchors": int((positions.column("depth").to_numpy() == 1).sum()),
                     "rows": positions.num_rows}
                fresh_tokens += rendered.n_tokens
            counts["sessions_ok"] += 1
            for key, value in c.items():
                counts[key] += value
            observer.session(item.id, c["tokens_replayed"], skipped=False)
    except BaseException as e:
        manifest.update(status="failed", finished=_now(), counts=counts,
                        failure=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        tables.write_json_atomic(out / tables.MANIFEST, manifest)
        raise
    wall = time.time() - started
    for entry in manifest["inputs"]:
        entry["sessions"] = per_file[entry["path"]]
    manifest.update(status="complete", finished=_now(), counts=counts,
                    timing={"wall_s": round(wall, 3), "tokens_per_s": round(fresh_tokens / wall, 1) if wall > 0 else None})
    tables.write_json_atomic(out / tables.MANIFEST, manifest)
    return out
