"""Merge: the shard runs of one job checked and joined into one run directory (`mtp-observe merge SHARD... -o RUN`).

Contract:
    merge_runs(shards, out, allow_partial=False, overwrite=False) -> MergeSummary
        checks every shard (below), then links their parts into `out` and writes its run.json: a run like any
        other, which `report` reads as it reads one unsharded run of the same sessions — every aggregate, interval
        and verdict is recomputed from the rows (nothing is averaged from the shards' summaries), sessions in input
        order (requests.parquet `session_index`), so the report, bootstrap included, is the unsharded run's
    sessions_of(run_dir, manifest, draft_ks="manifest", damaged=None) -> {session_id: (part name, counts)}
        every session a run's parts hold, each part read back whole (parts.read_part: every column, page
        checksums); a session in two parts is refused (what a Ray job checks of its own directory too, cluster.py)

Checks, each refusal one line naming the run, shard or session and the fix:
    1. every SHARD is a run written with `replay --shard I/N` (run.json `shard`) that no replay is writing now, and
       `out` is neither a shard, nor inside one (its positions.parquet/ ...), nor around one (links followed)
    2. one job: the comparison `replay --resume` makes, the same function (manifest.resume_difference with
       shards=True): every key of the run identity (manifest.IDENTITY_KEYS — model, tokenizer, template, samplers,
       drafters, K, trees, layer rules, what-ifs, serving numerics, head reading, inputs, options, tool version,
       ...), the device by kind and of `shard` the number of shards, assignment rule and input set
       (shards.input_set: every input's label and content, in order); the first key that differs is named with
       both values
    3. no shard given twice, none missing, every shard complete — unless --allow-partial, which merges what there
       is, records what is missing (run.json `merged.missing`) and writes status "partial" (the verdict UNRELIABLE)
    4. every part reads back whole (the rows its spans imply); a complete shard's parts hold what its counts say —
       else the shard is refused with the `replay ... --resume` that recomputes what it lost, or, under
       --allow-partial, its damaged parts are left out and their sessions recorded as missing
    5. no session in two shards' parts; every session a shard owns (`shard.session_ids`) in its parts or its errors

Parts are hard-linked into RUN under their own names (a part is named by its first session's input index, so the
names of different shards never meet), copied where the filesystem cannot link (another device): nothing is
rewritten row by row. This module imports no torch.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import RunDirectoryError


@dataclass(frozen=True)
class MergeSummary:
    out: Path
    shards: int  # shards merged
    count: int  # N, the job's shards
    sessions: int  # sessions in the merged run
    skipped: int  # sessions the shards skipped (run.json errors)
    linked: int  # part files hard-linked
    copied: int  # part files copied (no hard link across filesystems)
    status: str  # "complete" | "partial"
    missing: dict | None  # run.json merged.missing (None when nothing is)
    seconds: float
    left_out: tuple = ()  # ((part path, why), ...): damaged parts --allow-partial left out, their sessions missing


def _overlap(out: Path, shard: Path) -> str | None:
    """How the merged run's directory would meet a shard's (links followed): it is the shard, inside it (its
    positions.parquet/, requests.parquet/ or anywhere else), or around it (writing there would put the merged run's
    parts and run.json beside or over the shard's); None when they are apart."""
    o, p = out.resolve(), shard.resolve()
    if o == p:
        return "is the shard"
    if o.is_relative_to(p):
        return "is inside the shard"
    if p.is_relative_to(o):
        return "holds the shard"
    return None


def _being_written(run_dir: Path) -> bool:
    """A replay holds the run's lock (tables.RunLock) now: its parts are still changing."""
    import fcntl

    try:
        fd = os.open(run_dir / ".mtp-observe.lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def _draft_ks(manifest: dict) -> list[int] | None:
    """The row blocks per anchor of the shards' runs: manifest.row_draft_ks (drafters, trees, layer rules, precisions)."""
    from .manifest import row_draft_ks

    return row_draft_ks(manifest)


def sessions_of(run_dir: Path, manifest: dict, draft_ks="manifest", damaged: list | None = None
                ) -> dict[str, tuple[str, dict]]:
    """{session_id: (part name, its counts)} of every part in both tables, each read back whole (parts.read_part:
    every column); a part that does not, or a session in two parts, is one RunDirectoryError — or, given a list
    `damaged` (merge --allow-partial), a part that does not read back is appended to it as (path, why) and left out.
    draft_ks: the row blocks per anchor (default: the manifest's, manifest.row_draft_ks)."""
    from . import parts, tables

    if draft_ks == "manifest":
        draft_ks = _draft_ks(manifest)
    out: dict[str, tuple[str, dict]] = {}
    for name in sorted(tables.done_parts(run_dir)):
        sessions, damaged_why = parts.read_part(run_dir, name, manifest["k"], draft_ks)
        if sessions is None and damaged is not None:
            damaged.append((Path(run_dir) / tables.POSITIONS / name, damaged_why))
            continue
        if sessions is None:
            raise RunDirectoryError(f"{Path(run_dir) / tables.POSITIONS / name}: {damaged_why}; the run is damaged: "
                                    f"resume it (mtp-observe replay ... --out {run_dir} --resume) to recompute its sessions")
        for sid, counts in sessions.items():
            if sid in out:
                raise RunDirectoryError(f"{run_dir}: session {sid} is in two parts ({out[sid][0]} and {name}); the run is "
                                        "damaged: replay it again")
            out[sid] = (name, counts)
    return out


def merge_runs(shards, out: Path, allow_partial: bool = False, overwrite: bool = False) -> MergeSummary:
    """Check the shard runs (module doc) and join them into `out`."""
    started = time.time()
    paths = [Path(s) for s in shards]
    if not paths:
        raise RunDirectoryError("merge: no SHARD given; pass the run directories of every shard (e.g. reports/shard-*)")
    out = Path(out)
    runs = _one_job(paths, out)  # 1. every SHARD a shard run, read back; 2. one job
    count = int(runs[0][1]["shard"]["count"])
    by_index, absent = _every_shard(runs, count, allow_partial)  # 3. shards given twice, missing, unfinished
    held = _held_sessions(by_index, count, allow_partial)  # 4. every part whole, counts as recorded; 5. sessions once
    merged, linked, copied = _write(out, runs[0][1], by_index, count, absent, held, overwrite)
    return MergeSummary(out=out, shards=len(by_index), count=count, sessions=merged["counts"]["sessions_ok"],
                        skipped=merged["counts"]["sessions_skipped"], linked=linked, copied=copied,
                        status=merged["status"], missing=merged["merged"]["missing"], seconds=time.time() - started,
                        left_out=tuple(held.left_out))


def _one_job(paths: list[Path], out: Path) -> list[tuple[Path, dict]]:
    """(path, run.json) of every SHARD: each a shard run no replay is writing, none overlapping --out, all of one job
    (the run identity --resume compares: manifest.resume_difference)."""
    from . import tables
    from .manifest import recorded_identity, resume_difference

    runs = []
    for path in paths:
        manifest = tables.read_manifest(path)
        if not isinstance(manifest.get("shard"), dict):
            raise RunDirectoryError(f"{path}: not a shard (its run.json has no shard); merge joins runs written with "
                                    "`mtp-observe replay --shard I/N`")
        if _being_written(path):
            raise RunDirectoryError(f"{path}: a replay is writing this shard now; wait for it to finish, then merge")
        where = _overlap(out, path)
        if where is not None:
            raise RunDirectoryError(f"--out {out} {where} {path}; write the merged run outside every shard (e.g. beside "
                                    "them)")
        runs.append((path, manifest))
    first_path, first = runs[0]
    for path, manifest in runs:  # the comparison --resume makes (one function), on what shards of a job share
        different = resume_difference(recorded_identity(first), manifest, shards=True)
        if different is not None:
            different = different.replace("in the run", f"in {path}").replace(" here", f" in {first_path}")
            raise RunDirectoryError(f"{path}: not a shard of the same job as {first_path}: {different}; merge the shards "
                                    "of one job (one command run with each --shard I/N)")
    return runs


def _every_shard(runs, count: int, allow_partial: bool) -> tuple[dict, list[int]]:
    """({index: (path, run.json)}, the absent indices): each shard once, all of them and complete (--allow-partial
    merges what there is)."""
    by_index: dict[int, tuple[Path, dict]] = {}
    for path, manifest in runs:
        i = int(manifest["shard"]["index"])
        if i in by_index:
            raise RunDirectoryError(f"{path}: shard {i}/{count} is given twice ({by_index[i][0]} is shard {i}/{count} too); "
                                    "pass each shard once")
        by_index[i] = (path, manifest)
    absent = [i for i in range(count) if i not in by_index]
    if absent and not allow_partial:
        raise RunDirectoryError(f"merge: shard {absent[0]}/{count} is missing ({len(absent)} of {count} not given); pass "
                                "every shard's run directory, or --allow-partial to merge these (the verdict is then "
                                "UNRELIABLE)")
    for i, (path, manifest) in sorted(by_index.items()):
        if manifest.get("status") != "complete" and not allow_partial:
            raise RunDirectoryError(f"{path}: shard {i}/{count} is not complete (status {manifest.get('status')!r}); finish "
                                    f"it with the same command and --resume, or merge with --allow-partial")
    return by_index, absent


@dataclass
class Held:
    """The sessions the shards' parts hold, and what is missing."""

    per_shard: dict  # shard index -> {session id: (part, counts)}
    missing: list  # session ids a shard lists but lost
    unknown: list  # shard indices that lost a part and do not list their sessions
    left_out: list  # (part, why): damaged parts --allow-partial leaves out


def _held_sessions(by_index: dict, count: int, allow_partial: bool) -> Held:
    held: dict[str, int] = {}  # session id -> shard
    out = Held({}, [], [], [])
    for i, (path, manifest) in sorted(by_index.items()):
        damaged: list | None = [] if allow_partial else None
        sessions = sessions_of(path, manifest, damaged=damaged)
        out.left_out += damaged or []
        for sid in sessions:
            if sid in held:
                raise RunDirectoryError(f"session {sid} is in shard {held[sid]}/{count} ({by_index[held[sid]][0]}) and in "
                                        f"shard {i}/{count} ({path}); the shards do not come from one assignment: replay "
                                        "them again with one command")
            held[sid] = i
        out.per_shard[i] = sessions
        skipped = {e.get("session_id") if e.get("session_id") is not None else f"{e.get('path')}:{e.get('line')}"
                   for e in manifest.get("errors") or [] if "turn" not in e}
        lost = [sid for sid in manifest["shard"].get("session_ids") or [] if sid not in sessions and sid not in skipped]
        # --allow-partial: what a shard lost (a part deleted or damaged) is recorded as missing, not refused
        if manifest.get("status") == "complete" and not (allow_partial and (lost or damaged)):
            _check_counts(path, manifest, sessions)
        if lost and manifest.get("status") == "complete" and not allow_partial:
            raise RunDirectoryError(f"{path}: session {lost[0]} of shard {i}/{count} is in neither its parts nor its "
                                    f"errors ({len(lost)} missing); the run changed after it was written: resume it "
                                    f"(mtp-observe replay ... --out {path} --resume) to recompute them, or "
                                    "--allow-partial")
        out.missing += lost
        if damaged and not manifest["shard"].get("session_ids"):
            out.unknown.append(i)  # it lost a part, and it does not list its sessions: which are missing is not known
    return out


def _write(out: Path, first: dict, by_index: dict, count: int, absent: list, held: Held, overwrite: bool):
    """The running manifest, the parts linked (or copied), the final manifest; (merged run.json, linked, copied)."""
    from . import tables
    from .manifest import COUNT_KEYS, MAX_KEYS, now

    lock = tables.RunLock(out).acquire()
    try:
        tables.prepare_run_directory(out, resume=False, overwrite=overwrite,
                                     fix="pass --overwrite to replace it with the merged run, or another -o")
        merged = _merged_manifest(first, by_index, count, held.per_shard, absent, held.missing, now, COUNT_KEYS,
                                  MAX_KEYS, held.unknown)
        tables.write_json_atomic(out / tables.MANIFEST, {**merged, "status": "running", "finished": None},
                                 hint="free space, then merge again with --overwrite")
        linked = copied = 0
        for i, (path, _) in sorted(by_index.items()):
            for name in sorted({part for part, _ in held.per_shard[i].values()}):
                for table in (tables.POSITIONS, tables.REQUESTS):
                    if _link_or_copy(path / table / name, out / table / name):
                        linked += 1
                    else:
                        copied += 1
        merged["merged"].update(linked=linked, copied=copied)
        merged["finished"] = now()
        tables.write_json_atomic(out / tables.MANIFEST, merged, hint="free space, then merge again with --overwrite")
    finally:
        lock.release()
    return merged, linked, copied


def _check_counts(path: Path, manifest: dict, sessions: dict) -> None:
    counts = manifest.get("counts") or {}
    found = {"sessions_ok": len(sessions)}
    for key in ("requests", "tokens_replayed", "scored_tokens", "anchors", "rows"):
        found[key] = sum(c[key] for _, c in sessions.values())
    for key, value in found.items():
        if isinstance(counts.get(key), int) and counts[key] != value:
            raise RunDirectoryError(f"{path / 'run.json'}: counts.{key} is {counts[key]} but its parts hold {value}; the "
                                    "shard changed after it was written (a part deleted, added or cut?): resume it "
                                    f"(mtp-observe replay ... --out {path} --resume) to recompute what it lost, or "
                                    "--allow-partial")


def _merged_manifest(first: dict, by_index: dict, count: int, per_shard: dict, absent: list[int], lost: list[str], now,
                     count_keys, max_keys, unknown: list[int] = ()) -> dict:
    """run.json of the merged run: the shards' identity, counts recomputed from their parts, every shard's errors in
    input order, `merged` (tables.py, version 3)."""
    manifests = [m for _, (_, m) in sorted(by_index.items())]
    sessions = [c for i in sorted(per_shard) for _, c in per_shard[i].values()]
    counts = {key: sum(c[key] for c in sessions) for key in count_keys if key not in ("sessions_ok", "sessions_skipped")}
    counts["sessions_ok"] = len(sessions)
    errors = sorted((e for m in manifests for e in m.get("errors") or []),
                    key=lambda e: (e.get("index", float("inf")), str(e.get("path")), e.get("line") or 0))
    counts["sessions_skipped"] = sum(1 for e in errors if "turn" not in e)  # an entry with "turn": a turn left out
    for key in max_keys:
        counts[key] = max((c[key] for c in sessions), default=0)
    walls = [float((m.get("timing") or {}).get("wall_s") or 0.0) for m in manifests]
    fresh = sum(float((m.get("timing") or {}).get("tokens_per_s") or 0.0) * w for m, w in zip(manifests, walls))
    drafting: dict = {}
    for m in manifests:
        for part, t in ((m.get("timing") or {}).get("drafting") or {}).items():
            total = drafting.setdefault(part, {"seconds": 0.0, "anchors": 0})
            total["seconds"] = round(total["seconds"] + t["seconds"], 3)
            total["anchors"] += t["anchors"]
    wall = max(walls, default=0.0)
    timing = {"wall_s": round(wall, 3), "tokens_per_s": round(fresh / wall, 1) if wall > 0 else None}
    if drafting:
        timing["drafting"] = drafting
    missing = None
    if absent or lost or unknown:
        missing = {"shards": absent, "sessions": lost, "unknown": list(unknown)}
    shard = first["shard"]
    tallies = [m["grammar_tally"] for m in manifests if m.get("grammar_tally")]
    merged = {key: value for key, value in first.items() if key not in ("shard", "failure", "cluster")}
    if tallies:  # --grammar: every shard's tool-call regions, forced tokens and violations, added
        from .manifest import summed_grammar

        merged["grammar_tally"] = summed_grammar(tallies)
    merged.update(
        created=min(str(m.get("created")) for m in manifests), finished=None,
        status="partial" if missing is not None or any(m.get("status") != "complete" for m in manifests) else "complete",
        counts=counts, errors=errors, timing=timing, resumed=[],
        world_size=sum(int(m.get("world_size") or 1) for m in manifests),
        merged={"count": count, "by": shard.get("by"), "rule": shard.get("rule"), "input_set": shard.get("input_set"),
                "shards": [{"path": str(p.resolve()), "index": i, "status": m.get("status"), "created": m.get("created"),
                            "finished": m.get("finished"), "sessions_ok": (m.get("counts") or {}).get("sessions_ok"),
                            "world_size": m.get("world_size"), "timing": m.get("timing")}
                           for i, (p, m) in sorted(by_index.items())],
                "linked": 0, "copied": 0, "missing": missing},
    )
    if merged["status"] == "partial" and missing is None:
        merged["merged"]["missing"] = {"shards": [], "sessions": [], "unknown": []}
    return merged


def _link_or_copy(src: Path, dst: Path) -> bool:
    """src at dst: a hard link (True), or, where the filesystem cannot link (another device, no links), an atomic copy
    (False). A failure is one line naming dst."""
    import errno
    import shutil

    from .tables import cannot_write

    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
        return True
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise cannot_write(dst, e, "free space or make it writable, then merge again with --overwrite") from None
    tmp = dst.parent.parent / f".{dst.parent.name}.{dst.name}.tmp-{os.getpid()}"
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise cannot_write(dst, e, "free space or make it writable, then merge again with --overwrite") from None
    return False
