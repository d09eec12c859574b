"""The manifest: run.json's life — the run's identity, the directory checked and started, and the finished counts.

Contract:
    identity(info, files, opts, ...) -> dict
                                     what a resumed run must share with the interrupted one for its rows to be the
                                     same (tables.py); `resume_difference(identity, resumed)` says what differs
    start_manifest(out, opts, info, identity, ...) -> dict
                                     checks the run directory (fresh, --resume or --overwrite) and writes the
                                     running manifest
    finish_manifest(out, manifest, results, files)
                                     every rank's counts and errors merged (COUNT_KEYS add, MAX_KEYS take the
                                     maximum) into the final manifest: complete, or failed with the first failure

`opts` is a pipeline.ReplayOptions; this module imports nothing from the pipeline, which imports it, and no torch
at import (merge.py compares identities without it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import RunDirectoryError


def sha256_file(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def default_run_dir() -> Path:
    import time

    base = Path("reports") / time.strftime("run-%Y%m%d-%H%M%S")
    out, i = base, 1
    while out.exists():
        out, i = Path(f"{base}-{i}"), i + 1
    return out


def now() -> str:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def text_config_limits(text_config: dict) -> dict:
    """max_position_embeddings and the rope scaling (None when positions are not scaled) of a text config."""
    rope = text_config.get("rope_scaling") or text_config.get("rope_parameters") or {}
    kind = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
    scaled = isinstance(rope, dict) and ((kind not in (None, "default")) or rope.get("factor") not in (None, 1, 1.0))
    return {"max_position_embeddings": text_config.get("max_position_embeddings"), "rope_scaling": rope if scaled else None}


def _config_if_any(path: Path) -> dict:
    """config.json of a model directory, or {} (a tokenizer-only directory has none)."""
    import json

    try:
        value = json.loads((path / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def identity(info, inputs, opts, dtype, device: str, ranks, fallback, fallback_name: str, roster,
             model_dir: Path | None = None, shard_plan=None, serving=None, variants=None) -> dict:
    """What a resumed run must share with the interrupted one for its rows to be the same (tables.py).
    inputs: sessions.inputs.Inputs (each file's fingerprint computed once per command). info None: a model-free replay, which depends on the tokenizer and the end-of-turn ids alone. shard_plan
    (shards.ShardPlan): the shard this run replays (run.json `shard`), None for the whole input. serving: the
    serving.ServingNumerics the target and head were loaded for (run.json `serving`, schema 3). variants:
    head_variants.Variants (run.json `trees` and `layer_rules`)."""
    from .. import __version__
    from ..drafting.head_variants import Variants
    from ..model.checkpoint import describe_rules, linear_rules, reading_for
    from ..model.fingerprints import tokenizer_sha256, weights_fingerprint
    from ..model.target import RECORDED
    from ..sessions.reading import input_name

    path = info.path if info is not None else Path(model_dir)
    generation_config = path / "generation_config.json"
    config = path / "config.json"
    model = {"config_sha256": info.config_sha256 if info is not None else (sha256_file(config) if config.is_file() else None),
             "head_tensors": info.head_names if info is not None else None,
             "weights_fingerprint": weights_fingerprint(info) if info is not None else None,
             "generation_config_sha256": sha256_file(generation_config) if generation_config.is_file() else None}
    return {
        "model": model,
        "tokenizer_sha256": tokenizer_sha256(path),
        "k": opts.k,
        "dtype": str(dtype).removeprefix("torch.") if dtype is not None else None,
        "device": device.split(":")[0] if ranks.world > 1 else device,
        "sampling": {} if info is None else {**{p.name: p.as_dict() for p in opts.profiles},
                                             RECORDED: {**fallback.as_dict(), "per_session": True, "fallback": fallback_name}},
        "recorded_with": opts.recorded_with,
        "drafters": roster.manifest(),
        **({"grammar": opts.grammar} if opts.grammar is not None else {}),  # replay --grammar (version 5)
        **(variants or Variants()).manifest(info.geometry.num_layers if info is not None else 1),
        "target_ran": info is not None,
        "target_engine": _target_engine(opts),
        "head_reading": reading_for(info, opts.head_engine).as_dict() if info is not None else None,
        "serving": None if serving is None else {
            **serving.manifest(), "linears": describe_rules(linear_rules(info, serving)) if info is not None else {}},
        "inputs": [{"path": input_name(f), "sha256": inputs.sha256(f)} for f in inputs.files],
        "options": {"chunk_size": opts.chunk_size, "on_error": opts.on_error, "max_sessions": opts.max_sessions,
                    "device_map": opts.device_map},
        "rendering": opts.template.manifest() if opts.template is not None else None,
        "shard": shard_plan.manifest() if shard_plan is not None else None,
        "whatifs": ({"head_precision": list(opts.head_precisions), "draft_p_min": [float(t) for t in opts.draft_p_min]}
                    if opts.head_precisions or opts.draft_p_min else None),
        "tool_version": __version__,
    }  # keys: IDENTITY_KEYS (resume_difference compares every one)


IDENTITY_KEYS = ("model", "tokenizer_sha256", "k", "dtype", "device", "sampling", "recorded_with", "drafters", "trees",
                 "layer_rules", "target_ran", "target_engine", "head_reading", "serving", "inputs", "options", "rendering", "shard",
                 "whatifs", "tool_version")  # what identity() returns: what --resume and merge compare, every key
MODEL_KEYS = ("config_sha256", "head_tensors", "weights_fingerprint", "generation_config_sha256")
_MODEL_NAMES = {"config_sha256": ("the model's config.json differs", ""),
                "head_tensors": ("the model's head tensors differ", ""),
                "weights_fingerprint": ("the model's weights differ", "; config.json is the same: a fine-tune or a "
                                                                      "retrained head?"),
                "generation_config_sha256": ("the model's generation_config.json differs",
                                             "; its end-of-turn ids decide the scored spans")}
SHARD_JOB = ("count", "by", "rule", "input_set")  # what every shard of one job shares of run.json `shard`


def _target_engine(opts) -> dict | None:
    """run.json `target_engine`: the engine that ran the target's layers (--target-engine), None where they ran here."""
    engine = getattr(opts, "target_engine", None)
    return None if engine is None else {"engine": engine.engine, "version": engine.version, "model": engine.model}


def recorded_identity(manifest: dict) -> dict:
    """The identity a run.json records, in identity()'s keys (IDENTITY_KEYS): what a resumed run, or another shard
    of the job, is compared with. Older runs' defaults: the drafters mtp alone, the target run."""
    model = manifest.get("model") or {}
    ident = {key: manifest.get(key) for key in IDENTITY_KEYS}
    ident["model"] = {key: model.get(key) for key in MODEL_KEYS}
    ident["inputs"] = [{"path": i.get("path"), "sha256": i.get("sha256")} for i in manifest.get("inputs") or []]
    ident["tool_version"] = (manifest.get("tool") or {}).get("version")
    ident["drafters"] = manifest.get("drafters") or {"mtp": {"draft_k": [manifest.get("k")]}}
    ident["target_ran"] = manifest.get("target_ran", True)
    return ident


def _of_the_job(ident: dict) -> dict:
    """An identity as the shards of one job share it: the device by kind (cuda:0 on one node is cuda on another),
    the shard by what every shard of the job has (not its index or its sessions)."""
    return {**ident, "device": str(ident.get("device")).split(":")[0],
            "shard": {key: (ident.get("shard") or {}).get(key) for key in SHARD_JOB}}


def resume_difference(identity: dict, resumed: dict, shards: bool = False) -> str | None:
    """What differs between this run's identity (identity()) and a run.json — the interrupted run's for --resume, or
    (shards=True, identity: recorded_identity of the first shard) another shard's for merge — for the refusal:
    the first key that differs, with both values ("... in the run, ... here"); None when nothing does. The one
    comparison both make: every key identity() returns (IDENTITY_KEYS)."""
    theirs_model = resumed.get("model") or {}
    if theirs_model.get("weights_fingerprint") is None and resumed.get("schema_version", 1) < 2:
        return (f"it was written by an older mtp-observe (schema_version {resumed.get('schema_version')}), which "
                "recorded no weights fingerprint to check the checkpoint against")
    from .tables import SCHEMA_VERSION

    if resumed.get("schema_version") != SCHEMA_VERSION:
        return (f"it was written with schema_version {resumed.get('schema_version')} and this mtp-observe writes "
                f"{SCHEMA_VERSION} (its parts would mix two layouts)")
    assert set(identity) == set(IDENTITY_KEYS), sorted(set(identity) ^ set(IDENTITY_KEYS))
    mine, theirs = identity, recorded_identity(resumed)
    if shards:
        mine, theirs = _of_the_job(mine), _of_the_job(theirs)
    for key in MODEL_KEYS:
        a, b = theirs["model"].get(key), mine["model"].get(key)
        if a != b:
            what, note = _MODEL_NAMES[key]
            if key == "weights_fingerprint":  # its sha256 says it; the rest (the files' sizes and names) is long
                a, b = (a or {}).get("sha256", "?"), (b or {}).get("sha256", "?")
                return f"{what} (model.{key} {str(a)[:12]} in the run, {str(b)[:12]} here{note})"
            return f"{what} (model.{key} {_short(a)} in the run, {_short(b)} here{note})"
    for key in IDENTITY_KEYS:
        if key == "model":
            continue
        where, a, b = _first_difference(key, theirs.get(key), mine.get(key))
        if where is not None:
            named = "" if where == key else f"{where} "  # the key inside it that differs (a tree, a linear's rule)
            return f"{key.replace('_', ' ')} differs ({named}{_short(a)} in the run, {_short(b)} here)"
    return None


def _first_difference(where: str, a, b):
    """(the dotted key of the first value that differs, its value in a, in b), or (None, None, None): a tree, a
    layer rule or one serving linear named, not a truncated dump of the whole key."""
    if a == b:
        return None, None, None
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            found = _first_difference(f"{where}.{key}", a.get(key), b.get(key))
            if found[0] is not None:
                return found
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            found = _first_difference(f"{where}[{i}]", x, y)
            if found[0] is not None:
                return found
    return where, a, b


def _short(value) -> str:
    import json

    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def complete_run_damage(out: Path, manifest: dict) -> str | None:
    """What a complete run lost since it was written — a part that does not read back whole (parts.read_part: every
    column, its page checksums, the rows its spans imply), or parts whose sessions and rows are not run.json's counts
    (a part deleted or added) —, in words; None when every part is whole and the counts hold. What `replay --resume`
    of a complete run checks before it says there is nothing to do."""
    from . import entries, parts, tables

    draft_ks = row_draft_ks(manifest)
    damaged: list[str] = []
    on_disk = dict.fromkeys(("sessions_ok",) + parts.COUNTED, 0)
    for name in sorted(tables.done_parts(out)):  # each part read once
        sessions, _ = parts.read_part(out, name, manifest["k"], draft_ks)
        if sessions is None:
            damaged.append(name)
        for c in (sessions or {}).values():
            on_disk["sessions_ok"] += 1
            for key in parts.COUNTED:
                on_disk[key] += c[key]
    if damaged:
        return (f"{len(damaged)} part(s) no longer read back whole ({entries.POSITIONS}/{damaged[0]}"
                f"{', ...' if len(damaged) > 1 else ''})")
    counts = manifest.get("counts") or {}
    for key in ("sessions_ok",) + parts.COUNTED:
        if counts.get(key) != on_disk[key]:
            return f"its parts hold {on_disk[key]:,} {key} where run.json counts {counts.get(key)} (a part deleted?)"
    return None


def start_manifest(out: Path, opts, info, identity: dict, bundled: bool, world: int,
                    model_dir: Path | None = None, note=None) -> dict:
    """Check the run directory (fresh, --resume or --overwrite) and write the running manifest (info None: a
    model-free replay: the model's weights, numerics and roofline are null). A complete run resumed is checked
    (complete_run_damage): whole, it is tables.RunComplete (nothing to do); damaged, it is resumed like an
    interrupted one — its damaged parts removed and their sessions recomputed (parts.finished_sessions), said
    through note(message)."""
    import platform

    import torch
    import transformers

    from .. import __version__
    from ..cost.geometry import geometry_of_checkpoint
    from ..cost.inventory import take_inventory
    from ..errors import RunDirectoryError
    from ..model.weights import compare_copies
    from . import entries, tables

    resumed = tables.prepare_run_directory(out, opts.resume, opts.overwrite)
    if resumed is not None:
        different = resume_difference(identity, resumed)
        if different is not None:
            raise RunDirectoryError(f"{out}: cannot resume, {different}; rerun with the same checkpoint, inputs and "
                                    "options, or --overwrite")
        if resumed.get("status") == "complete":
            damage = complete_run_damage(out, resumed)
            if damage is None:
                sessions = (resumed.get("counts") or {}).get("sessions_ok", 0)
                raise tables.RunComplete(f"{out}: this run is already complete ({sessions:,} session"
                                         f"{'' if sessions == 1 else 's'} of these inputs); nothing to resume")
            if note is not None:
                note(f"{out}: the run was complete but {damage}; recomputing the sessions it lost")
        entries.remove_temporaries(out)
    from ..model.target import generation_config_profile

    generation = generation_config_profile(info.path if info is not None else model_dir)
    if info is not None:
        inventory = take_inventory(info)
        precision = "BF16" if identity["dtype"] == "bfloat16" else "stored"
        model = {
            "path": str(info.path.resolve()), "bundled": bundled, "model_type": info.model_type,
            **identity["model"],
            "numerics": info.numerics(identity["dtype"]),
            "roofline": inventory.roofline(precision),
            "roofline_by_precision": {p: inventory.draft_cost(p) for p in ["stored", "BF16", "FP8", "Q8_0", "Q6_K", "Q4_K"]},
            "cost_geometry": geometry_of_checkpoint(info).as_dict(),
            "head_copies": compare_copies(info),
            "head_precisions": head_precision_costs(info, opts.head_precisions, inventory, precision),
            "generation_config": generation.as_dict() if generation is not None else None,
            **text_config_limits(info.text_config),
        }
    else:
        config = _config_if_any(Path(model_dir))
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        model = {"path": str(Path(model_dir).resolve()), "bundled": bundled, "model_type": config.get("model_type"),
                 **identity["model"], "numerics": None, "roofline": None, "roofline_by_precision": None,
                 "generation_config": generation.as_dict() if generation is not None else None,
                 **text_config_limits(text)}
    manifest = {
        "schema_version": tables.SCHEMA_VERSION,
        "tool": {"name": "mtp-observe", "version": __version__},
        "created": (resumed or {}).get("created") or now(),
        "finished": None,
        "status": "running",
        **{key: value for key, value in identity.items() if key != "tool_version"},  # tool.version holds it
        "model": model,
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__},
        "world_size": world,
        "counts": {},
        "errors": [],
        "resumed": (resumed or {}).get("resumed", []) + ([now()] if resumed else []),
    }
    tables.write_json_atomic(out / entries.MANIFEST, manifest)
    return manifest


def row_draft_ks(manifest: dict) -> list[int] | None:
    """The depth of every block of rows a run writes per anchor (its drafters' draft_k, its trees' steps, the
    stepwise layer rule's k, and Kmax for each --head-precision's head; parts.py counts rows by them); None for an
    mtp-only run without variants or precisions."""
    drafters = manifest.get("drafters") or {}
    extra = [t["steps"] for t in manifest.get("trees") or []] + \
        [r["k"] for r in manifest.get("layer_rules") or [] if r.get("k")]
    precisions = (manifest.get("whatifs") or {}).get("head_precision") or []
    if not (set(drafters) - {"mtp"}) and not extra and not precisions:
        return None
    return [kk for d in drafters.values() for kk in d.get("draft_k", [])] + extra + [manifest["k"]] * len(precisions)


def head_precision_costs(info, precisions, inventory, served: str) -> dict | None:
    """run.json model.head_precisions: per what-if precision its recipe (precisions.py) and what a draft step reads
    (cost.Geometry's head fields at that precision), with the batch-1 bytes ratio c against the target as served."""
    if not precisions:
        return None
    from ..model.precisions import head_recipes, head_shapes, recipe_bytes

    g = info.geometry
    shapes = head_shapes(g)
    experts = g.moe.num_experts if g.moe is not None else 0
    top_k = g.moe.experts_per_token if g.moe is not None else 0
    target = inventory.target_step_bytes(served)
    out = {}
    for name, r in head_recipes(info, precisions).items():
        b = recipe_bytes(r, shapes, (g.vocab_size, g.hidden_size), experts)
        step = b["head_dense_bytes"] + b["head_expert_bytes"] * top_k + b["lm_head_bytes"]
        out[name] = {**r.as_dict(), **b, "draft_step_bytes": step, "draft_cost": step / target}
    return out


COUNT_KEYS = ("sessions_ok", "sessions_skipped", "requests", "tokens_replayed", "scored_tokens", "anchors", "rows")
MAX_KEYS = ("max_request_tokens",)  # counts merged by their maximum, not their sum


@dataclass
class Tally:
    """What a rank's replay counted (run.json counts, errors, sessions per file)."""

    counts: dict
    errors: list
    per_file: dict
    fresh_tokens: int = 0
    switches: set = field(default_factory=set)  # the thinking switches already said (rendering.Renderer.switches)

    def skip(self, observer, index, path, line, session_id, message, said: bool = True) -> None:
        """A session skipped (run.json errors); said: the observer hears it ended now (a Ray job says it later)."""
        self.errors.append({"index": index, "path": path, "line": line, "session_id": session_id, "message": message})
        self.counts["sessions_skipped"] += 1
        observer.warn(message)
        if said:
            observer.session(session_id or "?", 0, skipped=True)

    def say_switches(self, observer, session, switches: dict) -> None:
        """Which thinking switch a session rendered with and where it came from: said once per switch and source."""
        for name, (value, source) in switches.items():
            key = f"{name}={json.dumps(value)} ({source})"
            if key not in self.switches:
                self.switches.add(key)
                observer.note(f"sessions render with {key}, the first {session.id}")

    def skip_turns(self, observer, index, session, skipped_turns) -> None:
        """Turns of a replayed session left out under --on-error skip (rendering.TurnError): run.json errors entries
        carrying "turn" (the assistant message's index); the session itself is not skipped."""
        for turn, message in skipped_turns:
            self.errors.append({"index": index, "path": session.path, "line": session.line, "session_id": session.id,
                                "turn": turn, "message": message})
            observer.warn(message)

    def add(self, c: dict) -> None:
        self.counts["sessions_ok"] += 1
        for key, value in c.items():
            self.counts[key] = max(self.counts[key], value) if key in MAX_KEYS else self.counts[key] + value


def finish_manifest(out: Path, manifest: dict, results: list[dict], files) -> None:
    """The final manifest: complete, or failed with the first failure. If the disk is full even for that, the
    running manifest stays (the run resumes) and a failed run's own error is what the user sees."""
    from . import entries, tables

    counts = {key: sum(r.get("counts", {}).get(key, 0) for r in results) for key in COUNT_KEYS}
    counts.update({key: max(r.get("counts", {}).get(key, 0) for r in results) for key in MAX_KEYS})
    manifest["errors"] = sorted((e for r in results for e in r.get("errors", [])), key=lambda e: e["index"])
    failures = [r["failure"] for r in results if r.get("failure") is not None]
    if failures:  # what the parts on disk hold (every rank flushed what it finished before failing)
        from .parts import counts_on_disk

        on_disk = counts_on_disk(out, manifest["k"], row_draft_ks(manifest))
        counts = {**counts, **on_disk, "sessions_skipped": counts["sessions_skipped"]}
    manifest["counts"] = counts
    if results and results[0].get("cluster") is not None:  # a Ray job (cluster.py): its replicas, replaced and retried
        manifest["cluster"] = results[0]["cluster"]
    if failures:
        manifest.update(status="failed", finished=now(), failure=f"{type(failures[0]).__name__}: {failures[0]}")
    else:
        per_file = results[0]["per_file"]  # every rank reads every line, so every rank's per-file count agrees
        for entry in manifest["inputs"]:
            entry["sessions"] = per_file[entry["path"]]
        wall = max(r["wall_s"] for r in results)
        fresh = sum(r["fresh_tokens"] for r in results)
        timing = {"wall_s": round(wall, 3), "tokens_per_s": round(fresh / wall, 1) if wall > 0 else None}
        drafting = {}
        for r in results:
            for part, t in r.get("drafting", {}).items():
                total = drafting.setdefault(part, {"seconds": 0.0, "anchors": 0})
                total["seconds"] = round(total["seconds"] + t["seconds"], 3)
                total["anchors"] += t["anchors"]
        if drafting:
            timing["drafting"] = drafting
        tallies = [r["grammar"] for r in results if r.get("grammar")]
        if tallies:  # --grammar: the tool-call regions, forced tokens, violations (grammar.GrammarContext.manifest)
            manifest["grammar_tally"] = summed_grammar(tallies)
        manifest.update(status="complete", finished=now(), timing=timing)
    try:
        tables.write_json_atomic(out / entries.MANIFEST, manifest)
    except (OSError, RunDirectoryError) as e:
        if failures:
            return
        raise e if isinstance(e, RunDirectoryError) else tables.cannot_write(out / entries.MANIFEST, e) from None


def summed_grammar(tallies: list[dict]) -> dict:
    """Ranks' or shards' grammar tallies (grammar.GrammarContext.manifest) as one: counts, formats and seconds added,
    flagged calls joined (first 100)."""
    out = {key: value for key, value in tallies[0].items()}
    for t in tallies[1:]:
        for key, value in t.items():
            if isinstance(value, int) and not isinstance(value, bool):
                out[key] = out.get(key, 0) + value
        out["flagged"] = (list(out.get("flagged", [])) + list(t.get("flagged", [])))[:100]
        for part in ("formats", "seconds"):
            a, b = out.get(part, {}), t.get(part, {})
            out[part] = {name: round(a.get(name, 0) + b.get(name, 0), 3) for name in {**a, **b}}
    return out
