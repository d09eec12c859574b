"""The run's numbers as an engine counts them: over the steps the simulated decode makes, at a draft length K.

Contract: `engine_numbers(report, k)` -> EngineNumbers (vLLM's counters and rates, with the run's intervals);
`synthetic_rates(accepted, drafted)`: the per-step marginal rates that reproduce the run in vLLM's synthetic
rejection sampler. Why these and not the all-anchor rates: engines/exports.py's docstring.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import OptionError
from ..report import Report

DIGITS = 6  # Model-Optimizer rounds its vectors to 6 decimals; every export here does


@dataclass(frozen=True)
class EngineNumbers:
    """The overall slice at one draft length K over the simulated decode's steps (vLLM's counters), with the
    all-anchor rates beside them. Intervals are the report's bootstrap bounds (None where there are none)."""

    k: int
    level: float  # interval level (0.95)
    steps: int  # vLLM num_drafts: the simulated decode's steps whose draft holds a token (every step: mtp, V2 n-gram)
    accepted: int  # num_accepted_tokens
    per_pos_counts: tuple[int, ...]  # [K] num_accepted_tokens_per_pos
    histogram: tuple[int, ...]  # [K+1] steps (with a draft) by accepted drafts 0..K
    per_position: np.ndarray  # [K] per_pos / num_drafts = the marginal rates
    per_position_lo: np.ndarray | None  # [K]
    per_position_hi: np.ndarray | None
    mean_acceptance_length: float  # 1 + accepted / steps
    mean_acceptance_length_lo: float | None
    mean_acceptance_length_hi: float | None
    draft_acceptance_rate: float  # accepted / (K · steps)
    accept_rate: np.ndarray  # [K] all-anchor A_k
    tau: float  # all-anchor τ(K) = 1 + Σ A_k
    tau_sim: float  # tokens / steps of the simulated decode (no bonus token past the end of a turn)
    drafted: tuple[int, ...] = ()  # [K] steps whose draft holds at least k tokens (drafted[0] = steps); () = K each

    @property
    def drafted_per_pos(self) -> tuple[int, ...]:
        return self.drafted or (self.steps,) * self.k

    @property
    def draft_tokens(self) -> int:
        return sum(self.drafted_per_pos)  # vLLM num_draft_tokens: K per step for mtp, the last of a turn too

    @property
    def variable_length(self) -> bool:
        """Whether some step drafted fewer than K tokens (suffix decoding, V1's n-gram)."""
        return any(d != self.steps for d in self.drafted_per_pos)

    @property
    def synthetic_rates(self) -> list[float]:
        """What vLLM's synthetic_acceptance_rates must be to reproduce the run (synthetic_rates())."""
        return synthetic_rates(self.per_pos_counts, self.drafted_per_pos)

    @property
    def conditional(self) -> list[float]:
        """P(draft k accepted | drafts < k accepted) = marginal[k] / marginal[k-1], 0 after a 0 (Model-Optimizer's)."""
        out, prev = [], 1.0
        for m in self.per_position:
            out.append(float(m) / prev if prev > 0 else 0.0)
            prev = float(m)
        return out


def synthetic_rates(accepted: tuple[int, ...], drafted: tuple[int, ...]) -> list[float]:
    """vLLM's `synthetic_acceptance_rates` under which its synthetic sampler, on steps drafting as the run's did,
    accepts the run's drafts: accepted [K] steps accepting at least k drafts, drafted [K] steps drafting at least k.

    vLLM's synthetic rejection sampler (vllm/v1/sample/rejection_sampler.py, rejection_greedy_sample_kernel
    :793-844 and rejection_random_sample_kernel :896-954; V2 vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py
    `_rejection_kernel`) walks a step's own drafts only (`for pos in range(num_draft_tokens)`), accepting draft pos
    with the conditional rate c_pos = p_pos / p_{pos-1} (vllm/v1/spec_decode/utils.py:848-851
    `unconditional_to_conditional_rates`); a step that drafted j < K tokens accepts at most j, one that drafted
    nothing has no draft. So P(a step drafting j accepts at least k) = p_{k-1} for k <= j, and the expected accepted
    drafts are Σ_k p_{k-1} · drafted[k-1]: p_{k-1} = accepted[k-1] / drafted[k-1] (the rate over the steps that
    drafted at least k) gives the run's. vLLM refuses rates that increase (vllm/config/speculative.py:600-632
    `_resolve_synthetic_acceptance_rates`), which a variable-length drafter can have (long drafts come where they
    are accepted); adjacent violators are pooled, weighted by drafted (Σ accepted / Σ drafted over the pool), which
    keeps Σ_k p_{k-1} · drafted[k-1] = Σ accepted, so the mean acceptance length still comes out the run's while
    the per-position rates inside a pool are averaged. Positions no step drafted are 0.

    Worked example: drafted [10, 4], accepted [5, 3] -> raw [0.5, 0.75] -> pooled 8 / 14 = 0.571429 at both
    (14 · 0.571429 = 8 accepted drafts over 10 steps: mean acceptance length 1.8, as the run's). Every step
    drafting K (drafted [n] * K) gives accepted / n: the run's per-position rates, unchanged.
    """
    assert len(accepted) == len(drafted) and all(0 <= a <= d for a, d in zip(accepted, drafted)), (accepted, drafted)
    assert all(b <= a for a, b in zip(drafted, drafted[1:])), drafted
    blocks: list[list[float]] = []  # [accepted, drafted, positions] pooled from the left
    for a, d in zip(accepted, drafted):
        blocks.append([float(a), float(d), 1])
        while len(blocks) > 1 and blocks[-1][1] > 0 and \
                blocks[-1][0] * blocks[-2][1] > blocks[-2][0] * blocks[-1][1]:  # the later rate is larger: pool
            a2, d2, n2 = blocks.pop()
            blocks[-1] = [blocks[-1][0] + a2, blocks[-1][1] + d2, blocks[-1][2] + n2]
    rates: list[float] = []
    for a, d, n in blocks:
        rates += [a / d if d > 0 else 0.0] * int(n)
    out = [round(r, DIGITS) for r in rates]
    assert all(b <= a for a, b in zip(out, out[1:])), out
    return out


def _check_k(report: Report, k: int | None) -> int:
    k = report.best_k if k is None else k
    if not 1 <= k <= report.k:
        raise OptionError(f"--k {k}: the run replayed draft lengths 1..{report.k}; choose one of them")
    return k


def engine_numbers(report: Report, k: int | None = None) -> EngineNumbers:
    """The overall slice's engine-counted numbers at K (default: the best K)."""
    k = _check_k(report, k)
    o = report.overall
    counts = o.per_session.total()
    if int(np.asarray(counts.steps)[k - 1]) == 0:
        raise OptionError(f"{report.path}: the run has no simulated decode steps at K={k} (no scored turns); "
                          "replay sessions with generated turns")
    drafted = (tuple(int(x) for x in np.asarray(counts.step_drafted)[k - 1, :k]) if counts.step_drafted is not None
               else (int(np.asarray(counts.steps)[k - 1]),) * k)
    steps = drafted[0]  # vLLM's num_drafts: the steps with a draft
    if steps == 0:
        raise OptionError(f"{report.path}: the {report.drafter} drafter proposed nothing at any step of the simulated "
                          f"decode at K={k}: an engine would count no draft")
    per_pos_counts = [int(x) for x in np.asarray(counts.step_accepted)[k - 1, :k]]
    reaching = [steps] + per_pos_counts
    histogram = tuple(reaching[j] - reaching[j + 1] for j in range(k)) + (reaching[k],)
    assert all(h >= 0 for h in histogram), histogram  # a chain: depth k accepted only after k-1

    def at(r, field):
        return None if r is None else getattr(r, field)

    lo_pos, hi_pos = at(o.lo, "per_position_acceptance"), at(o.hi, "per_position_acceptance")
    lo_mal, hi_mal = at(o.lo, "mean_acceptance_length"), at(o.hi, "mean_acceptance_length")
    v = o.value
    return EngineNumbers(
        k=k, level=report.level, steps=steps, accepted=sum(per_pos_counts), per_pos_counts=tuple(per_pos_counts),
        histogram=histogram, per_position=np.asarray(v.per_position_acceptance[k - 1, :k], dtype=np.float64),
        per_position_lo=None if lo_pos is None else np.asarray(lo_pos[k - 1, :k]),
        per_position_hi=None if hi_pos is None else np.asarray(hi_pos[k - 1, :k]),
        mean_acceptance_length=float(v.mean_acceptance_length[k - 1]),
        mean_acceptance_length_lo=None if lo_mal is None else float(lo_mal[k - 1]),
        mean_acceptance_length_hi=None if hi_mal is None else float(hi_mal[k - 1]),
        draft_acceptance_rate=float(v.draft_acceptance_rate[k - 1]),
        accept_rate=np.asarray(v.accept_rate[:k], dtype=np.float64), tau=float(v.tau[k - 1]),
        tau_sim=float(v.tau_sim[k - 1]), drafted=drafted,
    )
