"""The check of an engine's own counters against the run (`mtp-observe compare`).

    check(report, measured, k, traffic) -> EngineCheck

What the engine measured is read by counters.py (read_engine_metrics -> EngineMeasurement); what the run
predicts for it is engines.engine_numbers (the engine-counted figures, engines.py's module doc). This module
judges the two: within numerics and counting noise on the same tokens (--traffic same), or within the run's
session-bootstrap band for other traffic (--traffic other).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import EngineMetricsError, OptionError
from ..report import Report
from ..report.denominator import MODEL_FREE_DRAFTERS
from ..report.flags import reading_note
from .counters import EngineMeasurement, check_acceptance_length
from .numbers import engine_numbers

TRAFFIC = ("same", "other")  # compare --traffic
BF16_DRAFT_FLIP_SHARE = 0.0069  # drafts that differ between a bfloat16 and a float32 replay of the same tokens: 0.69%
# of 12,318 drafts (0.25% at depth 1; 0.28% of match bits), the bundled model on the demo sessions
# (`python benchmarks/bf16_drafting.py`; the fidelity audit's range for this kind of flip: 0.3-0.9%). The
# engine-counted numbers moved by at most 0.0044 in mean acceptance length and 0.0031 in a per-position rate, K = 1..4.
Z_95 = 1.959963984540054  # the normal 97.5% quantile: the bands are 95% two-sided


@dataclass(frozen=True)
class Agreement:
    """One engine number against the run's: the band it must lie in (run ± half_width)."""

    name: str  # e.g. "per-position acceptance, position 1"
    engine: float
    run: float
    lo: float  # the band: run - half_width
    hi: float  # run + half_width
    counting: float  # the half-width's parts: the engine's counting noise (binomial, 95%) ...
    numerics: float  # ... bf16 drafting flips (BF16_DRAFT_FLIP_SHARE per draft) ...
    sampling: float  # ... and the run's own bootstrap over sessions (95%; --traffic other only, else 0)

    @property
    def within(self) -> bool:
        return self.lo <= self.engine <= self.hi

    @property
    def half_width(self) -> float:
        """The smallest difference from the run this comparison flags (95%)."""
        return (self.hi - self.lo) / 2


def _name_of(model: str) -> str:
    """A model's name for matching a served model_name: the last path part, the repo of a hub cache snapshot
    (models--ORG--NAME/snapshots/HASH -> NAME), lower case."""
    parts = [p for p in model.replace("\\", "/").split("/") if p]
    for i, part in enumerate(parts):
        if part.startswith("models--") and i + 2 < len(parts) and parts[i + 1] == "snapshots":
            return part.split("--")[-1].lower()
    return parts[-1].lower() if parts else ""


@dataclass(frozen=True)
class EngineCheck:
    k: int
    measured: EngineMeasurement
    rows: tuple[Agreement, ...]
    level: float
    note: str | None = None  # where the engine reads the head otherwise than the run replayed it (reading_note)
    traffic: str = "same"  # TRAFFIC
    verdict: object = None  # the run's report.verdict (Verdict): compare's header says it
    predicts: bool = True  # the run speaks for the engine's traffic (no UNRELIABLE cause that matters for `traffic`)
    why_not: str = ""  # when it does not: which cause, and its first next step
    warnings: tuple[str, ...] = ()  # one line each: a model_name that is not the run's, drafts that are not the run's
    interval: str = "session"  # the run's bootstrap unit (--traffic other): "turn" holds within these sessions only

    @property
    def agrees(self) -> bool:
        return all(r.within for r in self.rows)

    @property
    def exit_code(self) -> int:
        return 0 if self.agrees else 1

    @property
    def detectable(self) -> str:
        """What size of difference this comparison could see, in words."""
        mal = self.rows[-1]
        pos = self.rows[:-1]
        text = f"mean acceptance length ±{mal.half_width:.3f}"
        if pos:
            text += (f"; per-position acceptance {' / '.join(f'±{r.half_width:.3f}' for r in pos)} "
                     f"(positions 1..{len(pos)})")
        if self.traffic == "other" and self.interval != "session":
            text += "; the run's interval resamples turns within its sessions only"
        return text

    @property
    def reason(self) -> str:
        out = [r for r in self.rows if not r.within]
        noise = ("the engine's counting noise and bf16 drafting flips" if self.traffic == "same" else
                 "the run's bootstrap over sessions, the engine's counting noise and bf16 drafting flips")
        if not out:
            text = (f"the engine's numbers at K={self.k} lie within {noise} of the run's on "
                    f"{'the same tokens' if self.traffic == 'same' else 'other traffic'} ({len(self.rows)} compared)")
            return text if self.predicts else f"{text}; but {self.why_not}"
        worst = max(out, key=lambda r: abs(r.engine - r.run) / max(r.half_width, 1e-12))
        text = (f"{len(out)} of {len(self.rows)} engine numbers at K={self.k} differ from the run's by more than {noise}, "
                f"e.g. {worst.name}: engine {worst.engine:.3f}, run {worst.run:.3f} ± {worst.half_width:.3f}")
        if not self.predicts:
            return f"{text}; {self.why_not}, so the difference says nothing about the engine"
        if self.note is not None:
            return f"{text}; but {self.note}, so this is not yet a bug"
        if self.traffic == "same":
            return (f"{text}; on the same tokens that is an engine or checkpoint bug (a pre-norm hidden state fed to the "
                    "head, a quantised head read as BF16, a dropped head), or counters that are not of these requests")
        return (f"{text}; the engine's traffic accepts differently from the run's beyond what sampling explains: other "
                "traffic than the run's, or an engine or checkpoint bug (compare the counters of the very requests the "
                "run replayed, --traffic same, to tell which)")


def _engine_k(report: Report, measured: EngineMeasurement, k: int | None, traffic: str) -> int | None:
    """The K compared (the counters' own when they say it), compare's options checked against the counters and the
    run, each refused in one line."""
    if traffic not in TRAFFIC:
        raise OptionError(f"--traffic {traffic}: expected one of {', '.join(TRAFFIC)}")
    if measured.k is not None:
        if k is not None and k != measured.k:
            raise OptionError(f"--k {k}: the engine's counters are of K={measured.k}; leave --k out")
        if measured.k > report.k:
            raise EngineMetricsError(f"the engine drafted K={measured.k}; the run replayed up to K={report.k}: replay "
                                     f"with --k {measured.k}")
        k = measured.k
    return k


def _check_draft_lengths(report: Report, n, measured: EngineMeasurement) -> None:
    """A drafter whose steps may draft fewer than K tokens, or none (V1's n-gram, suffix decoding), is compared over
    the steps that drafted, as vLLM counts them: that needs the run's draft lengths (schema 3 on). The MTP head
    drafts K every step: counters with fewer are of dynamic speculative decoding, refused."""
    if report.drafter == "mtp" and measured.draft_tokens is not None and measured.steps and \
            measured.draft_tokens != n.k * measured.steps:
        raise EngineMetricsError(f"{measured.draft_tokens:,.0f} draft tokens in {measured.steps:,.0f} drafts is not "
                                 f"{n.k} per draft (dynamic speculative decoding); compare a static K")
    if report.drafter != "mtp" and int(report.manifest.get("schema_version") or 0) < 3:
        raise OptionError(f"compare --drafter {report.drafter}: the run has no draft lengths (written before "
                          "schema_version 3), and an engine counts only the steps where the drafter proposed tokens: "
                          "replay it again with this mtp-observe")


def _why_not(relevant: list) -> str:
    """Why the run does not predict the engine's traffic: the first cause that matters, and its next step."""
    why_not = ""
    if relevant:
        first = relevant[0]
        why_not = (f"the run is UNRELIABLE ({first.reason}) and does not predict the engine's traffic; "
                   f"next: {first.steps[0]}" if first.steps else "")
    return why_not


def _warnings(report: Report, measured: EngineMeasurement, steps: int, traffic: str, counted: str) -> list[str]:
    """One line each for what may make the comparison one of other things: another model's counters, or counters of
    other requests than the replayed ones (steps: the run's decode's step count)."""
    warnings = []
    run_model = (report.manifest.get("model") or {}).get("path") or ""
    if measured.model_name and run_model and _name_of(measured.model_name) != _name_of(run_model):
        warnings.append(f"the counters are labelled model_name={measured.model_name!r}, the run replayed {run_model}: "
                        "served names are free, but if it serves another checkpoint this compares different models")
    if traffic == "same" and measured.steps and abs(measured.steps - steps) > 0.1 * steps:
        warnings.append(f"the engine counted {measured.steps:g} drafts where the run's decode of its tokens makes "
                        f"{steps}{counted}: if the counters are not of exactly the replayed requests, compare with "
                        "--traffic other")
    return warnings


def check(report: Report, measured: EngineMeasurement, k: int | None = None, traffic: str = "same") -> EngineCheck:
    """The engine's per-position rates and mean acceptance length against the run's at the engine's K.

    --traffic same (the counters are of the very tokens the run replayed): the difference may only be numerics and
    the engine's own counting noise — each band is the run's number ± (Z_95 · the binomial standard error at the
    engine's drafts + bf16 flips: BF16_DRAFT_FLIP_SHARE per draft, k drafts for position k, K(K+1)/2 for the mean
    acceptance length), so counters 10% below the run's on a few hundred steps disagree.
    --traffic other (another sample of the prompts, or other traffic): a two-sample band — the run's bootstrap
    replicates (standard deviation) and the engine's counting noise added in quadrature, plus the flips — whose
    half-width is the smallest difference the comparison can detect.
    Which UNRELIABLE causes matter: for the same tokens, an unfinished run or traffic that fits no sampler (the run
    then does not describe what this engine served); for other traffic, every cause (too few sessions: the run's
    numbers hold within its sessions only).
    Model-free drafters (n-gram, suffix decoding) are compared over the steps that drafted (engine_numbers), without
    the bf16 flips (their drafts are functions of the tokens alone)."""
    k = _engine_k(report, measured, k, traffic)
    n = engine_numbers(report, k)
    _check_draft_lengths(report, n, measured)
    flip_share = 0.0 if report.drafter in MODEL_FREE_DRAFTERS else BF16_DRAFT_FLIP_SHARE  # drafts from the tokens alone
    check_acceptance_length(measured, n.k)
    o = report.overall
    if traffic == "other" and o.replicates is None:
        note = report.resampling.note if report.resampling is not None else None
        raise OptionError(f"{report.path}: the run has no bootstrap interval ({note or 'too few sessions'}); compare "
                          "--traffic other needs one: replay more sessions")
    # 1. The engine's counting noise: its drafts N (the run's own step count where the source gives none).
    drafts = float(measured.steps) if measured.steps else float(n.steps)
    counted = "" if measured.steps else f" (the source gives no step count: the run's {n.steps} steps stand in)"
    hist = np.asarray(n.histogram, dtype=np.float64)
    accepted = np.arange(n.k + 1, dtype=np.float64)
    var_accepted = float((hist * (accepted - accepted @ hist / hist.sum()) ** 2).sum() / hist.sum())

    def sampling(field: str, index) -> float:
        if traffic != "other":
            return 0.0
        reps = np.asarray(getattr(o.replicates, field))[(slice(None),) + index]
        reps = reps[np.isfinite(reps)]
        return float(Z_95 * reps.std(ddof=1)) if reps.size > 1 else 0.0

    def band(name, engine, run, counting_var, flips, field, index) -> Agreement:
        counting = Z_95 * math.sqrt(counting_var / drafts)
        spread = sampling(field, index)
        half = math.sqrt(counting ** 2 + spread ** 2) + flips
        return Agreement(name, float(engine), float(run), float(run) - half, float(run) + half, counting, flips, spread)

    rows = []
    if measured.per_position is not None:
        for i in range(n.k):
            p = float(n.per_position[i])
            rows.append(band(f"per-position acceptance, position {i + 1}", measured.per_position[i], p, p * (1 - p),
                             (i + 1) * flip_share, "per_position_acceptance", (n.k - 1, i)))
    rows.append(band("mean acceptance length", measured.mean_acceptance_length, n.mean_acceptance_length, var_accepted,
                     n.k * (n.k + 1) / 2 * flip_share, "mean_acceptance_length", (n.k - 1,)))
    # 2. Whether the run speaks for this traffic (its verdict's causes).
    v = report.verdict
    matter = ("unfinished", "model-free", "sampler") if traffic == "same" else tuple(c.name for c in v.causes)
    relevant = [c for c in v.causes if c.name in matter]
    why_not = _why_not(relevant)
    # 3. One warning line each for what may make the comparison of other things.
    warnings = _warnings(report, measured, n.steps, traffic, counted)
    return EngineCheck(k=n.k, measured=measured, rows=tuple(rows), level=n.level, traffic=traffic, verdict=v,
                       predicts=not relevant, why_not=why_not, warnings=tuple(warnings),
                       interval=report.resampling.unit if report.resampling is not None else "none",
                       note=reading_note(report, "sglang" if measured.source.startswith("sglang") else "vllm"))
