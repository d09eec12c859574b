"""The reading: the whole `mtp-observe report` computation — read, cost, summarise, rank, compare.

Contract:
    read_and_summarize(path, ...) -> Reading
                                     the run (default: the newest under root), its cost table, the report at the
                                     gated batch size with every drafter ranked and its what-ifs (whatifs.py), and
                                     the baseline comparison
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..cost.speedup import DEFAULT_BATCHES, parse_gated
from ..errors import OptionError
from ..run.tables import read_manifest
from .advice import DEFAULT_MIN_SESSIONS, FLOOR_MIN_SESSIONS, Settings
from .baseline import Comparison, compare
from .denominator import _finite, cost_table, drafter_table
from .drafters import summarize_drafters
from .manifest import run_drafters
from .metrics import MIN_SUPPORT
from .run import Run, load_run, newest_run
from .summary import Report, summarize, summarize_at_batch
from .trees import summarize_trees
from .verdict import Gate
from .whatifs import summarize_whatifs

MAX_REPLICATES = 100_000  # bootstrap weights are [replicates, sessions] float64: past this, memory, not accuracy


@dataclass(frozen=True)
class Reading:
    run: Run
    report: Report
    comparison: Comparison | None  # None without a baseline


def read_and_summarize(
    path: str | Path | None = None,
    *,
    drafter: str | None = None,
    baseline: str | Path | None = None,
    probe: str | Path | None = None,
    draft_cost: float | None = None,
    gate: Gate | None = None,
    min_support: float = MIN_SUPPORT,
    recorded_with: str | None = None,
    replicates: int = 1000,
    seed: int = 0,
    root: str | Path = "reports",
    batch: str = "1",
    batch_sizes: tuple[int, ...] | None = None,
    device_spec: str | None = None,
    context: float | None = None,
    loaded: Run | None = None,
    min_sessions: int = DEFAULT_MIN_SESSIONS,
) -> Reading:
    """What `mtp-observe report` computes. The run defaults to the newest under root. An explicit cost
    (--probe, --draft-cost) applies to the baseline too, so differences come from acceptance alone;
    otherwise each run uses its own roofline. --recorded-with applies to the current run only.

    drafter (--drafter): whose rows the slices, the verdict and the baseline comparison are of (default: mtp when
    the run has it, else its first drafter); every drafter of the run is summarised and ranked beside it, at the
    same batch size.

    min_sessions (--min-sessions): a verdict needs at least this many sessions (advice.py: why sessions, not turns);
    below it the verdict is UNRELIABLE, the numbers still shown with their turn-level interval.

    batch ('B' or 'LO-HI') is where the gate is judged (section 8): the slices, the best K and the verdict
    are at that batch size (for a range, at the one whose verdict is worst); batch_sizes, device_spec and
    context shape the roofline's table."""
    if not 1 <= replicates <= MAX_REPLICATES:
        raise OptionError(f"--replicates {replicates}: expected 1 to {MAX_REPLICATES:,} bootstrap resamples")
    if seed < 0:
        raise OptionError(f"--seed {seed}: expected an integer >= 0")
    if min_sessions < FLOOR_MIN_SESSIONS:
        raise OptionError(f"--min-sessions {min_sessions}: expected at least {FLOOR_MIN_SESSIONS} (the turns of one "
                          f"session say nothing about the next; the default {DEFAULT_MIN_SESSIONS} is the size a "
                          "bootstrap over sessions needs)")
    if not 0.0 <= min_support <= 1.0:
        raise OptionError(f"--min-support {min_support}: expected a rate between 0 and 1")
    if context is not None and not (_finite(context) and context >= 0):
        raise OptionError(f"--context {context}: expected a number of tokens >= 0")
    lo, hi = parse_gated(batch)
    roofline_options = [name for name, value in (("--batch-sizes", batch_sizes), ("--device-spec", device_spec),
                                                 ("--context", context)) if value is not None]
    if roofline_options and (probe is not None or draft_cost is not None):
        raise OptionError(f"{' and '.join(roofline_options)} shape the roofline, but --probe/--draft-cost give a measured "
                          "or fixed cost: pass one of them (a probe's batch sizes and context are its own: probe --batch)")
    run = loaded if loaded is not None else load_run(path if path is not None else newest_run(root), drafter)  # loaded: read already
    settings = Settings(drafter=drafter, gate=gate.text if gate is not None else None, min_sessions=min_sessions,
                        recorded_with=recorded_with, min_support=min_support, batch=batch,
                        batch_sizes=tuple(batch_sizes) if batch_sizes is not None else None, device_spec=device_spec,
                        context=context, probe=str(probe) if probe is not None else None, draft_cost=draft_cost,
                        replicates=replicates, seed=seed)  # what the next steps carry (advice.command)
    options = dict(replicates=replicates, seed=seed, gate=gate, min_support=min_support, min_sessions=min_sessions,
                   settings=settings)
    table = cost_table(run, probe=probe, draft_cost=draft_cost, device_spec=device_spec, context=context,
                       batch_sizes=tuple(sorted(set(batch_sizes or DEFAULT_BATCHES) | {lo, hi})))
    report = summarize_at_batch(run, drafter_table(table, run.drafter), (lo, hi), recorded_with=recorded_with, **options)
    report = summarize_drafters(report, run, table, recorded_with=recorded_with, **options)
    report = summarize_trees(report, run, table, recorded_with=recorded_with, **options)  # the what-ifs beside the chain
    whatifs = summarize_whatifs(report, run, table, recorded_with=recorded_with, **options)
    if whatifs is not None:
        report = replace(report, whatifs=whatifs, notes=report.notes + whatifs.notes)
    comparison = None
    if baseline is not None:
        base_manifest = read_manifest(Path(baseline))
        if run.drafter not in run_drafters(base_manifest):
            raise OptionError(f"--baseline {baseline}: it has no rows of {run.drafter}, the drafter judged here (it has "
                              f"{', '.join(run_drafters(base_manifest))}); pass --drafter with one both runs have")
        base_run = load_run(baseline, run.drafter)
        base_table = drafter_table(cost_table(base_run, probe=probe, draft_cost=draft_cost, device_spec=device_spec,
                                              context=context, batch_sizes=table.times.batch), run.drafter)
        b = report.batch.binding if report.batch.binding in base_table.times.batch else 1
        base = summarize(base_run, base_table.cost_at(b), **options)
        comparison = compare(report, base)
    return Reading(run=run, report=report, comparison=comparison)
