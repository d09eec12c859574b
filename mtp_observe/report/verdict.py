"""The verdict: the gate, the recording-sampler fit, and the judge that turns a slice into GO / NO-GO / UNRELIABLE.

Contract:
    parse_gate(text) -> Gate         'speedup>=1.2' (strict: METRIC>=NUMBER)
    recording_sampler(run, overall, recorded_with, min_support) -> RecordingSampler
    judge(overall, k, gate, recording, status, sessions, resampling, facts, min_sessions) -> Verdict
                                     the one decision (STYLE.md rule 12): status, the K to run, why, what next

Decisions, written down once:
- The recording sampler: `replay --recorded-with` (run.json) or `report --recorded-with` declares it; a run whose
  sessions carry their own meta.sampling declares it per session (the `recorded` profile); otherwise the
  best-fitting candidate (metrics.best_fit: the likeliest that fits) is named. UNRELIABLE only when the traffic
  fits no declared or candidate sampler (metrics.fits), with the statistics. A model-free replay ran no target,
  so it has no check and its verdict is UNRELIABLE, saying what the numbers are (the drafts' agreement with the
  recorded tokens, not a serving prediction).
- The verdict: UNRELIABLE when the run is not complete, no target ran, the traffic fits no sampler, it has fewer
  than --min-sessions sessions (default 10: advice.py says why sessions, not turns), or the interval cannot be
  estimated — every cause is kept, with the commands that fix it; else GO when the lower bound of the gated metric
  at the best K clears the threshold, NO-GO otherwise.
- The K to run: the best K when the verdict is GO and its speedup beats 1, else 0 (do not speculate). Nothing
  recommends serving with speculation unless Verdict.serves; the best K stays where the numbers are read.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import OptionError
from . import advice
from .advice import DEFAULT_MIN_SESSIONS, Cause, Facts, candidate_stats
from .denominator import _finite
from .metrics import CALIBRATION_TOLERANCE, LL_FLOOR, Z_MAX, Rates, best_fit, fits
from .run import Run

if TYPE_CHECKING:
    from .tallies import Resampling, Slice


GATE_METRICS = {  # gate name -> (Rates field, depth-indexed by best K?)
    "speedup": ("speedup", True),
    "tau_sim": ("tau_sim", True),
    "alpha1": ("alpha", False),
}
_GATE = re.compile(r"\s*([a-z_0-9]+)\s*>=\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*")
DEFAULT_GATE = "speedup>=1"


@dataclass(frozen=True)
class Gate:
    metric: str  # "speedup" | "tau_sim" | "alpha1"
    threshold: float
    text: str  # as written, normalised: "speedup>=1.2"


def parse_gate(text: str) -> Gate:
    """'speedup>=1.2' -> Gate. Strict: METRIC>=NUMBER, nothing else (no '>', no unknown metric, no trailing text)."""
    m = _GATE.fullmatch(text)
    if m is not None and m.group(1) == "tau":
        raise OptionError(f"--gate {text!r}: tau, vLLM's mean acceptance length (per-position formula), overstates what a "
                          "decoder emits when acceptance comes in bursts and is not a verdict metric; gate on tau_sim "
                          "(the simulated decode) or speedup")
    if m is None or m.group(1) not in GATE_METRICS:
        raise OptionError(f"--gate {text!r}: expected METRIC>=NUMBER with METRIC one of "
                          f"{', '.join(GATE_METRICS)} (e.g. --gate 'speedup>=1.2')")
    if not math.isfinite(float(m.group(2))):
        raise OptionError(f"--gate {text!r}: the threshold {m.group(2)} is not a finite number (e.g. --gate 'speedup>=1.2')")
    return Gate(metric=m.group(1), threshold=float(m.group(2)), text=f"{m.group(1)}>={m.group(2)}")


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


@dataclass(frozen=True)
class Verdict:
    """The one decision every view renders (STYLE.md rule 12): the status, the K to run, why, and what to do next."""

    status: str  # "GO" | "NO-GO" | "UNRELIABLE"
    gate: Gate  # the gate judged (DEFAULT_GATE when none was given)
    enforced: bool  # a gate was given: the exit code follows the verdict
    k: int  # the best K: the argmax of the speedup (never 0), where the gated metric and every headline number are read
    value: float  # the gated metric at K
    lower: float  # its bootstrap lower bound (what must clear the threshold)
    on_policy: float
    min_support: float
    reason: str  # one sentence for people (UNRELIABLE: the first cause's)
    run_k: int = 0  # the K to run: k when GO and speedup(k) > 1, else 0 (do not speculate)
    causes: tuple[Cause, ...] = ()  # UNRELIABLE: every cause, in advice.CAUSES order, each with its fix
    next_steps: tuple[str, ...] = ()  # the commands to run next (every cause's, in order; after a GO or NO-GO, theirs)
    sessions: int = 0
    min_sessions: int = DEFAULT_MIN_SESSIONS
    interval: str = "session"  # what the intervals resample: "session", "turn" (within these sessions only), "none"

    @property
    def exit_code(self) -> int:
        return 0 if not self.enforced or self.status == "GO" else 1

    @property
    def serves(self) -> bool:
        """Whether anything may recommend serving with speculation: GO, at a K that pays."""
        return self.status == "GO" and self.run_k > 0

    @property
    def headline(self) -> str:
        """The verdict in one short line: status, the K to run, what it means."""
        if self.serves:
            what = f"K to run: {self.run_k}"
        elif self.status == "GO":
            what = "K to run: 0 (do not speculate: no K has a speedup above 1)"
        elif self.status == "NO-GO":
            what = "K to run: 0 (do not speculate: serve without speculative decoding)"
        else:
            what = "K to run: 0 (no configuration yet)"
        gate = f"gate {self.gate.text}" if self.enforced else f"{self.gate.text}, no --gate: informational"
        return f"{self.status} · {what} · {gate}, exit {self.exit_code}"


def judge(overall: "Slice", k: int, gate: Gate | None, recording: RecordingSampler, status: str, sessions: int,
          resampling: "Resampling", facts: Facts | None = None, min_sessions: int = DEFAULT_MIN_SESSIONS) -> Verdict:
    """GO when the lower bound of the gated metric at the best K clears the threshold, NO-GO when it does not;
    UNRELIABLE (whatever the numbers) when the run is not complete, no target ran, the traffic fits no sampler, the
    run has fewer than min_sessions sessions, or there is no interval of non-zero width — every cause that holds is
    listed with its fix (advice.py). The K to run is k when GO and its speedup beats 1, else 0."""
    enforced = gate is not None
    gate = gate or parse_gate(DEFAULT_GATE)
    facts = facts or Facts(path="RUN", inputs=(), model=None, bundled=False, profiles=(), k=len(overall.value.alpha),
                           drafter="mtp", cost_source="")
    field, by_k = GATE_METRICS[gate.metric]
    at = k - 1 if by_k else 0
    value = float(getattr(overall.value, field)[at])
    lower = float(getattr(overall.lo, field)[at]) if overall.lo is not None else float("nan")
    upper = float(getattr(overall.hi, field)[at]) if overall.hi is not None else float("nan")
    where = f"at K={k}" if by_k else "(depth 1)"
    causes = []
    if status == "partial":
        causes.append(advice.partial_merge(facts))
    elif status != "complete":
        causes.append(advice.unfinished(facts, status))
    if not recording.checked:
        causes.append(advice.model_free(facts, recording))
    elif not recording.fits:
        causes.append(advice.sampler(facts, recording))
    if sessions < min_sessions:
        causes.append(advice.too_few_sessions(facts, sessions, min_sessions))
    if not (math.isfinite(lower) and math.isfinite(upper)) or upper - lower <= 0:
        causes.append(advice.no_interval(facts, f"{gate.metric} {where} = {value:.3f} has no interval of non-zero width "
                                                f"({resampling.note or 'every resample gives the same value'})"))
    speedup = float(overall.value.speedup[k - 1])
    pays = math.isfinite(speedup) and speedup > 1.0
    if causes:
        state, reason, run_k = "UNRELIABLE", causes[0].reason, 0
        steps = tuple(step for c in causes for step in c.steps)
    elif lower >= gate.threshold:
        state, run_k = "GO", (k if pays else 0)
        reason = f"{gate.metric} {where} = {value:.3f}, 95% lower bound {lower:.3f} >= {gate.threshold:g}"
        if not pays:
            reason += f", but no K has a speedup above 1 (at K={k}: {speedup:.3f}): do not speculate"
        steps = advice.after_go(facts, run_k)
    else:
        state, run_k = "NO-GO", 0
        reason = f"{gate.metric} {where} = {value:.3f}, 95% lower bound {lower:.3f} < {gate.threshold:g}"
        steps = advice.after_no_go(facts)
    return Verdict(status=state, gate=gate, enforced=enforced, k=k, value=value, lower=lower,
                   on_policy=float(overall.value.on_policy), min_support=recording.min_support, reason=reason,
                   run_k=run_k, causes=tuple(causes), next_steps=steps, sessions=sessions, min_sessions=min_sessions,
                   interval=resampling.unit if resampling is not None else "session")
