"""The recording sampler: which candidate sampler of the target the replayed traffic fits (ACCEPTANCE.md: support
rate and calibration), declared or inferred.

Contract: `recording_sampler(run, overall, recorded_with, min_support)` -> RecordingSampler: every candidate's
statistics (`Candidate`), the one that fits best or the declared one, and whether the traffic fits it (the verdict is
UNRELIABLE when it fits none: advice.py says why and what to run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import OptionError
from .denominator import _finite
from .metrics import (
    CALIBRATION_TOLERANCE,
    LL_FLOOR,
    Z_MAX,
    Rates,
    best_fit,
    fits,
)
from .run import Run


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
    every = "; ".join(candidate_stats(c) for c in candidates)
    rule = (f"a sampler fits when its support is >= {min_support:g} and its calibration is within {CALIBRATION_TOLERANCE:g} "
            f"of 1 or |z| <= {Z_MAX:g}")
    if pick is None:
        reason = (f"the recorded tokens fit no sampler, so they were not generated by this target with any of them and "
                  f"acceptance against them does not predict serving ({rule}): {every}")
    elif not pick.fits:
        reason = (f"the recorded tokens do not fit {label} ({rule}): {candidate_stats(pick)}; the other candidates: "
                  + "; ".join(candidate_stats(c) for c in candidates if c is not pick))
    else:
        reason = f"recorded with {label}: {candidate_stats(pick)}"
    return RecordingSampler(name=chosen, label=label, declared=declared, fits=bool(pick is not None and pick.fits),
                            candidates=candidates, tokens=tokens, own_sessions=own, min_support=min_support, reason=reason)


def candidate_stats(c: "Candidate") -> str:
    """'thinking_coding: support 0.834, calibration 0.876, z -53.6' (greedy: the support alone)."""
    z = "" if c.greedy or not math.isfinite(c.z) else f", z {c.z:+.1f}"
    cal = "" if c.greedy else f", calibration {c.calibration:.3f}"
    return f"{c.name}: support {c.support:.3f}{cal}{z}"
