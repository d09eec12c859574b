"""The baseline comparison: one report's slices as differences from another's, flagged where the interval excludes 0.

Contract:
    compare(current, baseline) -> Comparison
                                     resamples paired over the sessions both runs share (by id)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .metrics import RATE_FIELDS, Rates, bootstrap_weights, percentile_interval, rates, stratified_weights
from .summary import Report
from .tallies import Slice


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
