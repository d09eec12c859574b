"""The report stage: a run directory read back, summarised, judged against a gate, compared with a baseline, shown.

Its modules, in the order the data flows (each opens with its own contract):

    manifest     run.json as the report reads it: the drafters, the what-ifs, the notes of a run's status and version
    run          load_run(path) -> Run: the run directory read back and checked; newest_run(root)
    metrics      the counts and every rate derived from them, in one place; the simulated decode
    denominator  the speedup's denominator for a run: --probe, --draft-cost, the roofline, per batch size
    tallies      counts per slice (tally), the simulated decode's walks, the what-if steps, the resampling plan
                 and the slices with their bootstrap intervals
    recording    the recording-sampler fit: which candidate sampler the traffic fits
    advice       why a verdict is UNRELIABLE and the commands that fix it; what to run after a GO or a NO-GO
    verdict      the gate (parse_gate) and the judge: the one decision (status, the K to run, why, next steps)
                 that every view renders
    summary      summarize(run, cost) -> Report: every metric of ACCEPTANCE.md per K <= Kmax, sliced by segment,
                 context length, turn and session, the verdict; the same at the gated batch size
    drafters     every drafter of the run summarised on the same anchors and ranked
    trees        the tree configurations and layer rules of the run, by the same functions, beside the chain
    whatifs      the head at other precisions and confidence-stopped drafting, beside the served head
    baseline     compare(report, baseline) -> Comparison
    reading      read_and_summarize(path, ...) -> Reading: all of the above, as `mtp-observe report` runs it
    document     report_json(report, comparison): the stable JSON (`--format json`, keys in docs/report-json.md)
    flags        the serve flags a verdict stands for (vLLM, SGLang)
    layout, presentation, tree_tables, plotting, heatmap: the views (terminal, Markdown, PNG, a session's heatmap)

Counts are taken here; rates are derived only in metrics.py; the views compute nothing. Imports no torch: pandas,
numpy and pyarrow only, so a CI job reads a run without the model stack. The names below are the package's public
ones (the CLI, engines, presentation and the tests import them from here).
"""

from ..cost.speedup import PROBE_VERSION
from ..run.readers import read_dataset
from .advice import CAUSES, DEFAULT_MIN_SESSIONS, FLOOR_MIN_SESSIONS, Cause, Facts
from .baseline import Comparison, Delta, compare
from .denominator import (
    MODEL_FREE_DRAFTERS,
    Cost,
    CostTable,
    cost_table,
    drafter_cost,
    drafter_table,
    model_free_cost,
    read_probe,
    resolve_cost,
    verify_extra_from_probe,
)
from .document import REPORT_VERSION, report_json
from .drafters import DrafterSummary, Rank, rank_drafters, summarize_drafters
from .manifest import judged_drafter, run_drafters
from .reading import Reading, read_and_summarize
from .recording import Candidate, RecordingSampler
from .run import LoopSteps, Rows, Run, Spans, load_run, newest_run
from .summary import BatchSpeedup, Report, SpeculativeCheck, batch_speedups, summarize, summarize_at_batch
from .tallies import (
    CONTEXT_BINS,
    Resampling,
    Slice,
    context_bin,
    simulated_steps,
    simulated_walks,
    tally,
    what_if_steps,
)
from .trees import Configuration, LayerRule, TreeSummary, run_layer_rules, run_trees, summarize_trees, tree_cost
from .verdict import DEFAULT_GATE, GATE_METRICS, Gate, Verdict, judge, parse_gate

__all__ = [
    "BatchSpeedup", "CAUSES", "CONTEXT_BINS", "Candidate", "Cause", "DEFAULT_MIN_SESSIONS", "FLOOR_MIN_SESSIONS", "Facts",
    "Comparison", "Configuration", "LayerRule", "TreeSummary", "run_layer_rules", "run_trees", "summarize_trees",
    "tree_cost", "Cost", "CostTable", "DEFAULT_GATE", "Delta",
    "DrafterSummary", "GATE_METRICS", "Gate", "LoopSteps", "MODEL_FREE_DRAFTERS", "PROBE_VERSION", "REPORT_VERSION",
    "Rank", "Reading", "RecordingSampler", "Report", "Resampling", "Rows", "Run", "Slice", "Spans", "SpeculativeCheck",
    "Verdict", "batch_speedups", "compare", "context_bin", "cost_table", "drafter_cost", "drafter_table", "judge",
    "judged_drafter", "load_run", "model_free_cost", "newest_run", "parse_gate", "rank_drafters", "read_and_summarize",
    "read_dataset", "read_probe", "report_json", "resolve_cost", "run_drafters", "simulated_steps", "simulated_walks",
    "summarize", "summarize_at_batch", "summarize_drafters", "tally", "verify_extra_from_probe", "what_if_steps",
]
