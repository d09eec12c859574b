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
from .advice import DEFAULT_MIN_SESSIONS, Cause, Facts
from .recording import RecordingSampler

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
        """The verdict in one short line: status, the K to run, what was measured against the gate and what it means
        (never a pass when the number misses the threshold), the exit code."""
        if self.serves:
            what = f"K to run: {self.run_k}"
        elif self.status == "UNRELIABLE":
            what = "K to run: 0"  # why: the next line
        else:
            what = "K to run: 0 (do not speculate)"
        gate = f"gate {self.gate.text}" if self.enforced else "informational: no --gate given"
        return f"{self.status} · {what} · {gate}; {self.measured}, exit {self.exit_code}"

    @property
    def measured(self) -> str:
        """The gated metric against the threshold in words: 'measured speedup 0.681 < 1'; a value that clears it
        with a 95% lower bound that does not says both."""
        name, t = self.gate.metric, self.gate.threshold
        if not math.isfinite(self.value):
            return f"{name} not measured (no anchors)"
        said = f"measured {name} {self.value:.3f}"
        if self.value < t:
            return f"{said} < {t:g}"
        if math.isfinite(self.lower) and self.lower < t:
            return f"{said} but its 95% lower bound {self.lower:.3f} < {t:g}"
        return f"{said} >= {t:g}"


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
        steps = advice.distinct(step for c in causes for step in c.steps)
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
