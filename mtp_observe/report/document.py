"""The JSON document: a Report (and a Comparison) as the stable JSON of `report --format json`.

Contract:
    report_json(report, comparison=None) -> dict
                                     keys documented in docs/report-json.md; NaN and ±inf become null anywhere
                                     (finite); REPORT_VERSION is bumped on an incompatible key change
    dumps(document) -> str           the text `report --format json` prints: json.dumps with allow_nan=False
"""

from __future__ import annotations

import math

import numpy as np

from .baseline import Comparison, Delta
from .denominator import Cost
from .metrics import CALIBRATION_TOLERANCE, LL_FLOOR, Z_MAX, Rates
from .recording import Candidate, RecordingSampler
from .summary import BatchSpeedup, Report
from .tallies import Slice

REPORT_VERSION = 3  # the "report_version" of report_json; bump on an incompatible key change (2: best.tau_sim is the
# verdict's τ, speedup from τ_sim, recorded_with, slices.context, tau_profile is the position-aware what-if estimate;
# 3: the engine-counted keys of a drafter whose steps draft fewer than K tokens count only the steps with a draft
# and their draft tokens, as vLLM does; trees, configurations and layer_rules, run.schema_version 3; `verdict`
# second, with run_k — the K to run, 0 = do not speculate —, serves, causes and next_steps; best.serve_k gone
# (verdict.run_k); batch.speculative_config null unless the verdict serves)


def _num(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def finite(value):
    """value (dicts, lists, tuples, numbers, strings) with every NaN and ±inf as None, numpy scalars as Python's:
    what `report --format json` prints, with allow_nan=False, so no strict parser meets a bare NaN or Infinity."""
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return _num(value)
    return value


def dumps(document: dict) -> str:
    """The report JSON as text: non-finite numbers null (finite), refused if any remained (allow_nan=False)."""
    import json

    return json.dumps(finite(document), indent=2, allow_nan=False)


def rates_json(r: Rates, profiles: tuple[str, ...]) -> dict:
    """A Rates of [K] arrays -> {"alpha": [K], "accept_rate": [K], "tau": [K], "tau_sim": [K],
    "tau_profile": {profile: [K]}, "speedup": [K], "speedup_profile": {profile: [K]}, "on_policy": x,
    "support": {profile: x}, "calibration": {profile: x}, "fit_z": {profile: x}, "log_likelihood": {profile: x},
    "mean_acceptance_length": [K], "draft_acceptance_rate": [K], "per_position_acceptance": [K][K]} (the last three
    engine-counted: over the simulated decode's steps at draft length K that drafted, as vLLM counts; row K-1 of
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
    return {"source": cost.source, "c": _num(cost.c), "verify_extra": [_num(x) for x in cost.verify_extra],
            "detail": cost.detail}


def drafters_json(report: Report) -> dict:
    """report JSON `drafters`: every drafter of the run on the same anchors (docs/report-json.md)."""
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


def batch_json(b: BatchSpeedup, serves: bool) -> dict:
    """`batch`: speedup by batch size (docs/report.md, "report JSON"); the schedule's config only when the verdict
    serves (Verdict.serves)."""
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
        "speculative_config": b.speculative_config if serves else None,
    }


def verdict_json(report: Report) -> dict:
    """`verdict`: the one decision (report/verdict.py Verdict), as every view renders it."""
    v = report.verdict
    return {
        "status": v.status, "run_k": v.run_k, "serves": v.serves, "k": v.k, "headline": v.headline,
        "reason": v.reason, "gate": v.gate.text, "enforced": v.enforced, "metric": v.gate.metric,
        "threshold": v.gate.threshold, "value": _num(v.value), "lower": _num(v.lower), "exit_code": v.exit_code,
        "sessions": v.sessions, "min_sessions": v.min_sessions, "interval": v.interval,
        "causes": [{"cause": c.name, "reason": c.reason, "detail": c.detail, "next_steps": list(c.steps)}
                   for c in v.causes],
        "next_steps": list(v.next_steps),
        "batch": report.batch.binding if report.batch is not None else 1,
        "batches": [{"batch": b, "status": x.status, "run_k": x.run_k, "k": x.k, "value": _num(x.value),
                     "lower": _num(x.lower), "reason": x.reason} for b, x in zip(report.batch.gated, report.batch.verdicts)]
        if report.batch is not None else [],
    }


def trees_json(report: Report) -> list[dict]:
    """report JSON `trees`: one object per replayed tree configuration (docs/report-json.md; report/trees.py)."""
    out = []
    for t in report.trees:
        o, S = t.overall, t.steps
        speedup, lo, hi = t.speedup

        def seq(a):
            return None if a is None else [_num(x) for x in np.asarray(a)]

        out.append({
            "name": t.name, "steps": S, "topk": t.topk, "draft_tokens": t.draft_tokens, "attention": t.attention,
            "sglang_args": t.flags.split(), "alpha": seq(o.value.alpha), "alpha_lo": seq(o.lo.alpha if o.lo else None),
            "alpha_hi": seq(o.hi.alpha if o.hi else None), "accept_rate": seq(o.value.accept_rate),
            "tau_sim": _num(o.value.tau_sim[S - 1]),
            "tau_sim_lo": _num(o.lo.tau_sim[S - 1]) if o.lo is not None else None,
            "tau_sim_hi": _num(o.hi.tau_sim[S - 1]) if o.hi is not None else None,
            "mean_acceptance_length": _num(o.value.mean_acceptance_length[S - 1]),
            "speedup": _num(speedup), "speedup_lo": _num(lo) if lo is not None else None,
            "speedup_hi": _num(hi) if hi is not None else None,
            "batch": report.batch.binding if report.batch is not None else 1,
            "by_batch": {"batch_sizes": list(t.batch), "speedup": seq(t.by_batch), "speedup_lo": seq(t.by_batch_lo),
                         "speedup_hi": seq(t.by_batch_hi), "chain_k": list(t.chain_k), "vs_chain": seq(t.vs_chain),
                         "vs_chain_lo": seq(t.vs_chain_lo), "vs_chain_hi": seq(t.vs_chain_hi),
                         "draft_width": t.draft_width},
            "anchors": t.anchors, "fewer_than_chain": t.fewer, "more_than_chain": t.more,
            "fewer_than_chain_why": dict(t.fewer_why), "cost": plain_cost_json(t.report.cost),
        })
    return out


def configurations_json(report: Report) -> list[dict]:
    """report JSON `configurations`: the best of the chain and the trees at each batch size (a what-if)."""
    return [{"batch": c.batch, "name": c.name, "k": c.k, "steps": c.steps, "topk": c.topk, "draft_tokens": c.draft_tokens,
             "speedup": _num(c.speedup), "speedup_lo": _num(c.lo) if c.lo is not None else None,
             "speedup_hi": _num(c.hi) if c.hi is not None else None} for c in report.configurations]


def layer_rules_json(report: Report) -> list[dict]:
    """report JSON `layer_rules`: a head with several MTP layers, each rule over the same anchors."""
    def seq(a):
        return [_num(x) for x in np.asarray(a)]

    return [{"rule": r.rule, "drafter": r.drafter, "text": r.text, "k": list(range(1, r.k + 1)),
             "alpha": seq(r.overall.value.alpha), "tau_sim": seq(r.overall.value.tau_sim),
             "tau_sim_lo": seq(r.overall.lo.tau_sim) if r.overall.lo is not None else None,
             "tau_sim_hi": seq(r.overall.hi.tau_sim) if r.overall.hi is not None else None,
             "speedup": seq(r.overall.value.speedup), "best_k": r.best_k} for r in report.layer_rules]


def whatifs_json(report: Report) -> dict:
    """`head_precisions`, `draft_p_min` and `whatifs` (README, "report JSON"; docs/whatifs.md): empty lists and null
    for a run without what-ifs."""
    w = report.whatifs
    if w is None:
        return {"head_precisions": [], "draft_p_min": [], "whatifs": None}

    def maybe(x):
        return _num(x) if x is not None else None

    precisions = [{"precision": r.precision, "alpha": [_num(a) for a in r.alpha], "tau_sim": _num(r.tau_sim),
                   "c": _num(r.c), "speedup": _num(r.speedup), "k": r.k, "tau_sim_lo": maybe(r.tau_sim_lo),
                   "tau_sim_hi": maybe(r.tau_sim_hi), "speedup_lo": maybe(r.speedup_lo), "speedup_hi": maybe(r.speedup_hi),
                   "gain": _num(r.gain), "gain_lo": maybe(r.gain_lo), "gain_hi": maybe(r.gain_hi),
                   "draft_step_bytes": r.draft_step_bytes, "drafts_equal": _num(r.drafts_equal),
                   "fallbacks": list(r.fallbacks)} for r in w.precisions]
    thresholds = [{"threshold": r.threshold, "tau_sim": _num(r.tau_sim), "speedup": _num(r.speedup), "k": r.k,
                   "tau_sim_lo": maybe(r.tau_sim_lo), "tau_sim_hi": maybe(r.tau_sim_hi),
                   "speedup_lo": maybe(r.speedup_lo), "speedup_hi": maybe(r.speedup_hi), "gain": _num(r.gain),
                   "gain_lo": maybe(r.gain_lo), "gain_hi": maybe(r.gain_hi), "drafted_per_step": _num(r.drafted_per_step),
                   "draft_steps_per_step": _num(r.draft_steps_per_step),
                   "mean_acceptance_length": _num(r.mean_acceptance_length),
                   "draft_acceptance_rate": _num(r.draft_acceptance_rate),
                   "tau_sim_by_k": [_num(x) for x in r.tau_sim_by_k], "speedup_by_k": [_num(x) for x in r.speedup_by_k]}
                  for r in w.thresholds]

    def rule(x) -> dict:
        return {"name": x.name, "tokens": x.tokens, "fixed_k": x.fixed_k, "fixed_speedup": _num(x.fixed_speedup),
                "threshold": x.threshold, "threshold_k": x.threshold_k, "threshold_speedup": _num(x.threshold_speedup)}

    b = w.best
    best = None if b is None else {"kind": b.kind, "name": b.name, "k": b.k, "speedup": _num(b.speedup),
                                   "speedup_lo": maybe(b.speedup_lo), "speedup_hi": maybe(b.speedup_hi),
                                   "gain": _num(b.gain), "gain_lo": maybe(b.gain_lo), "gain_hi": maybe(b.gain_hi),
                                   "served_k": b.served_k, "served_speedup": _num(b.served_speedup), "batch": b.batch,
                                   "line": b.line}
    return {"head_precisions": precisions, "draft_p_min": thresholds,
            "whatifs": {"batch": w.batch, "served_k": w.served_k, "served_speedup": _num(w.served_speedup),
                        "by_batch": [rule(x) for x in w.by_batch], "by_segment": [rule(x) for x in w.by_segment],
                        "best": best, "notes": list(w.notes)}}


def shard_json(manifest: dict) -> dict | None:
    """run.shard: {"index": I, "count": N} of a run written by `replay --shard I/N` and not merged (run.json `shard`; a
    merged run has `merged` and is the whole job), what the terminal's "one shard: shard I/N" line says; None for any
    other run. A key added within report_version 3 (docs/report-json.md: keys are only added within a version)."""
    shard = manifest.get("shard")
    if not isinstance(shard, dict) or manifest.get("merged"):
        return None
    return {"index": shard.get("index"), "count": shard.get("count")}


def report_json(report: Report, comparison: Comparison | None = None) -> dict:
    """The report as the JSON document (docs/report-json.md): every NaN or infinity null (`finite`)."""
    return finite(_document(report, comparison))


def _document(report: Report, comparison: Comparison | None) -> dict:
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
        "verdict": verdict_json(report),
        "run": {
            "path": str(report.path), "status": m.get("status"), "schema_version": m.get("schema_version"),
            "created": m.get("created"), "model": model.get("path"), "dtype": m.get("dtype"), "device": m.get("device"),
            "k": report.k, "profiles": list(report.profiles), "sessions": len(report.sessions), "anchors": o.anchors,
            "rows": report.rows, "drafter": report.drafter, "target_ran": m.get("target_ran", True) is not False,
            "shard": shard_json(m),
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
            "batch": report.batch.binding if report.batch is not None else 1,
        },
        "on_policy": {"rate": _num(o.value.on_policy), "lo": _num(o.lo.on_policy) if o.lo else None,
                      "hi": _num(o.hi.on_policy) if o.hi else None, "min": v.min_support},
        "recorded_with": recording_json(report.recording) if report.recording else None,
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
        **({"grammar": report.grammar} if report.grammar is not None else {}),  # replay --grammar only (grammar.py)
        **whatifs_json(report),
        "batch": batch_json(report.batch, v.serves) if report.batch is not None else None,
        "trees": trees_json(report),
        "configurations": configurations_json(report),
        "layer_rules": layer_rules_json(report),
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
