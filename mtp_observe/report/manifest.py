"""run.json as the report reads it: the drafters and what-ifs a run holds, and what its status and version say.

Contract: `run_drafters`, `judged_drafter` (--drafter, default mtp when the run has it, else its first),
`run_precisions` and `run_thresholds` read run.json's `drafters` and `whatifs`; `check_whatifs` refuses a `whatifs`
that replay never writes, in one line; `head_reading_note` says which engine's reading of a NextN head the run
replayed; `run_notes(path, manifest, variant)` is what load_run notes of a run's status and schema version (a
partial or unfinished run, what an older version lacks, a model-free replay) — and refuses a complete run that
replayed no session, in one line. Imports no torch.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import OptionError
from ..run.readers import _run_error


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


def run_precisions(manifest: dict) -> tuple[str, ...]:
    """The head precisions a run holds what-if rows of (run.json whatifs.head_precision; version 3)."""
    whatifs = manifest.get("whatifs")
    names = whatifs.get("head_precision") if isinstance(whatifs, dict) else None
    return tuple(str(n) for n in names) if isinstance(names, list) else ()


def run_thresholds(manifest: dict) -> tuple[float, ...]:
    """The --draft-p-min thresholds of a run (run.json whatifs.draft_p_min; version 3), as check_whatifs passed them."""
    whatifs = manifest.get("whatifs")
    values = whatifs.get("draft_p_min") if isinstance(whatifs, dict) else None
    return tuple(float(v) for v in values) if isinstance(values, list) else ()


def check_whatifs(manifest_path: Path, manifest: dict) -> None:
    """run.json `whatifs` as replay writes it: draft_p_min a list of distinct probabilities in [0, 1] (replay refuses
    any other --draft-p-min), head_precision a list of known precisions; anything else is a damaged or hand-edited
    run, refused naming the key and the value (a threshold of 1.5 would otherwise be reported as measured)."""
    from ..model.formats import PRECISIONS

    whatifs = manifest.get("whatifs")
    if whatifs is None:
        return
    if not isinstance(whatifs, dict):
        raise _run_error(manifest_path, f"whatifs is {whatifs!r}, not an object; the run directory is damaged or was "
                                        "edited by hand: re-run replay")
    values = whatifs.get("draft_p_min", [])
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0] \
        if isinstance(values, list) else [values]
    if bad or len(set(values)) != len(values):
        what = f"holds {bad[0]!r}, not a probability in [0, 1]" if bad else "repeats a threshold"
        raise _run_error(manifest_path, f"whatifs.draft_p_min {what}; replay writes only thresholds 0 to 1, each once, "
                                        "so the run directory is damaged or was edited by hand: re-run replay "
                                        "--draft-p-min with the thresholds wanted")
    names = whatifs.get("head_precision", [])
    unknown = [n for n in names if n not in PRECISIONS] if isinstance(names, list) else [names]
    if unknown:
        raise _run_error(manifest_path, f"whatifs.head_precision holds {unknown[0]!r}, not one of {', '.join(PRECISIONS)}; "
                                        "the run directory is damaged or was edited by hand: re-run replay")


def run_draft_ks(manifest: dict, drafter: str, k: int) -> tuple[int, ...]:
    entry = (manifest.get("drafters") or {}).get(drafter) or {}
    ks = entry.get("draft_k") if isinstance(entry, dict) else None
    return tuple(int(x) for x in ks) if isinstance(ks, list) and ks else (k,)


def head_reading_note(manifest: dict, version: int) -> str | None:
    """For a NextN head (DeepSeek-V3, GLM-4.5), which engine's reading the run replayed, or that a run older than
    schema_version 3 recorded none; None for a Qwen head, which vLLM and SGLang read alike."""
    from ..model.families import ENGINE_NAMES, FAMILIES

    model_type = (manifest.get("model") or {}).get("model_type")
    if model_type not in FAMILIES or FAMILIES[model_type].head != "nextn" or manifest.get("target_ran") is False:
        return None
    r = manifest.get("head_reading")
    if not isinstance(r, dict):
        return (f"schema_version {version} run: no head_reading recorded, so which engine's reading of the "
                f"{model_type} head it replayed is unknown; re-run replay")
    zero = "zeroed" if r.get("zero_position_0_embedding") else "kept"
    engine = ENGINE_NAMES.get(r.get("engine"), r.get("engine"))
    return (f"the {model_type} head replayed as {engine} {r.get('engine_version')} reads it: the embedding at "
            f"position 0 {zero}, the {str(r.get('fed_back_state')).replace('_', '-')} state fed back (docs/nextn.md; "
            "replay --head-reading for the other engine's)")


def run_notes(path: Path, manifest: dict, variant: tuple[str, int] | None = None) -> list[str]:
    """What load_run notes of the run at `path` from its run.json alone (status, schema version, head reading, a
    model-free replay); a complete run that replayed no session is refused (RunDirectoryError)."""
    target_ran = manifest.get("target_ran", True) is not False
    status = str(manifest.get("status", "unknown"))
    version = int(manifest["schema_version"])
    counts = manifest.get("counts") if isinstance(manifest.get("counts"), dict) else {}
    drafters = run_drafters(manifest)
    notes: list[str] = []
    if status == "partial":
        missing = (manifest.get("merged") or {}).get("missing") or {}
        notes.append(f"a partial merge: {len(missing.get('shards') or [])} shard(s) and {len(missing.get('sessions') or [])} "
                     "session(s) of the job are missing (run.json merged.missing); the report covers the sessions merged")
    elif status != "complete":
        notes.append(f"run status is {status!r}: the report covers the sessions written so far")
    elif counts.get("sessions_ok") == 0 and isinstance(manifest.get("shard"), dict) and not counts.get("sessions_skipped"):
        shard = manifest["shard"]
        raise _run_error(path / "run.json", f"shard {shard.get('index')}/{shard.get('count')} owns none of the job's "
                                            "sessions, so it holds nothing to report; merge it with the job's other "
                                            "shards (mtp-observe merge SHARD... -o RUN) and report the merged run")
    elif counts.get("sessions_ok") == 0:
        raise _run_error(path / "run.json", f"the run replayed no session ({counts.get('sessions_skipped', 0)} skipped; "
                                            "the reasons are under errors in run.json): there is nothing to report")
    if version < 3 and variant is None:
        notes.append(f"schema_version {version} run: no tree drafts and no layer rules (replay --tree; a head with "
                     "several MTP layers); re-run replay for them")
    if version < 2:
        notes.append("schema_version 1 run: no recording-sampler sums, so only greedy traffic can be recognised "
                     "(the on-policy rate); re-run replay for sampled traffic")
        notes.append("schema_version 1 run: its profiles have no penalties or min-p, and no what-if estimates "
                     "(they need the sampler sums); re-run replay for them")
    reading_line = head_reading_note(manifest, version)
    if reading_line is not None:
        notes.append(reading_line)
    if version < 3 and target_ran:
        notes.append(f"a run written before schema_version 3 (it is {version}) records no serving numerics: a block-FP8 "
                     "checkpoint was replayed weight-only (no W8A8 activations), top-k kept every tie at the k-th "
                     "value and min-p applied at every draft position; re-run replay (--serve-device) for what vLLM "
                     "runs on a GPU")
    if version < 3 and "ngram" in drafters:
        notes.append(f"a run written before schema_version 3 (it is {version}): its n-gram rows follow vLLM's V1 "
                     "proposer (the earliest match, short or no drafts), not the V2 speculator vLLM 0.33 runs by "
                     "default; re-run replay for that")
    if not target_ran:
        notes.append(f"a model-free replay ({', '.join(drafters)}): no target ran, so there is no p_accept, no on-policy "
                     "rate, no recording-sampler check and no what-if; the rows compare drafts with the recorded tokens "
                     "only (replay with mtp in --drafters for the rest)")
    return notes
