"""The denominator: what one draft step and one verify step cost a run, from a probe, a given c, or the roofline.

Contract:
    resolve_cost(run, probe=None, draft_cost=None) -> Cost
                                     c and v(K) at batch 1: --probe probe.json, else --draft-cost C, else the
                                     roofline in run.json (model.roofline.draft_cost)
    cost_table(run, ...) -> CostTable
                                     the step times at each batch size (cost.py computes them): measured by a probe
                                     with batch sizes, else the roofline on --device-spec from the run's geometry
    drafter_cost / drafter_table     the cost one drafter pays (ngram and suffix draft on the CPU: c = 0)
    read_probe(path) -> dict         probe.json (written by `mtp-observe probe`), checked

`run` is a report.run.Run (this module reads its k, manifest, drafters, path and anchor positions; it imports
nothing from the report, which imports it). Imports no torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..cost.geometry import Geometry
from ..cost.roofline import DEFAULT_DEVICE, ExpertCounts, expected_distinct, parse_device, roofline_times
from ..cost.speedup import DEFAULT_BATCHES, PROBE_VERSION, StepTimes, batch1_times, step_times_from_probe
from ..errors import OptionError
from ..run.readers import _one_line, _run_error, has_column, read_dataset


@dataclass(frozen=True)
class Cost:
    """speedup(K) = τ(K) / (1 + K·c + v(K)), in units of one target decode step."""

    c: float  # cost of one draft step / one target decode step
    verify_extra: np.ndarray  # [K] v(K) = verify(K+1 tokens) / decode(1 token) - 1, >= 0 (0 without a probe)
    source: str  # "probe" | "draft-cost" | "roofline"
    detail: str  # where the numbers came from, for people
    notes: tuple[str, ...]


def read_probe(path: str | Path) -> dict:
    """probe.json (written by `mtp-observe probe`), checked; keys in probe.py's docstring."""
    path = Path(path)
    try:
        probe = json.loads(path.read_text())
    except FileNotFoundError:
        raise OptionError(f"--probe {path}: no such file; write one with `mtp-observe probe MODEL -o {path}`") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise OptionError(f"--probe {path}: cannot be read as JSON ({_one_line(e)}); re-run `mtp-observe probe`") from None
    if not isinstance(probe, dict) or "probe_version" not in probe:
        raise OptionError(f"--probe {path}: not a probe.json (no probe_version); write one with `mtp-observe probe MODEL`")
    if not isinstance(probe["probe_version"], int) or probe["probe_version"] > PROBE_VERSION:
        raise OptionError(f"--probe {path}: probe_version {probe['probe_version']!r} is newer than this mtp-observe reads "
                          f"({PROBE_VERSION}); upgrade mtp-observe")
    c = probe.get("draft_cost")
    verify = probe.get("verify")
    ok = _finite(c) and c > 0 and isinstance(verify, list) and all(
        isinstance(v, dict) and isinstance(v.get("k"), int) and _finite(v.get("extra")) for v in verify)
    if not ok:
        raise OptionError(f"--probe {path}: draft_cost or verify is missing or not numeric; re-run `mtp-observe probe`")
    if probe["probe_version"] >= 2 and not _batches_ok(probe.get("batches")):
        raise OptionError(f"--probe {path}: batches is missing or not numeric (probe_version 2); re-run `mtp-observe probe`")
    return probe


def _batches_ok(batches) -> bool:
    def timing(t) -> bool:
        return isinstance(t, dict) and _finite(t.get("median_s")) and t["median_s"] > 0

    return isinstance(batches, list) and len(batches) > 0 and all(
        isinstance(b, dict) and isinstance(b.get("batch"), int) and b["batch"] >= 1 and timing(b.get("target_decode"))
        and timing(b.get("draft_step")) and isinstance(b.get("verify"), list) and all(timing(v) and isinstance(v.get("k"), int)
                                                                                    for v in b["verify"])
        for b in batches) and len({b["batch"] for b in batches}) == len(batches)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def verify_extra_from_probe(probe: dict, k: int) -> tuple[np.ndarray, str | None]:
    """v(1..k) from probe.json's verify list; past the probe's largest K, extended linearly.

    Clamped at 0: verifying K+1 tokens never costs less than decoding one, whatever the timer's noise.
    """
    measured = {int(v["k"]): float(v["extra"]) for v in probe["verify"] if int(v["k"]) >= 1}
    v = np.zeros(k)
    note = None
    if not measured:
        return v, "probe.json holds no verify timings: v(K) = 0"
    top = max(measured)
    slope = (measured[top] - measured[top - 1]) if top - 1 in measured else measured[top] / top
    for K in range(1, k + 1):
        if K in measured:
            v[K - 1] = measured[K]
        elif K > top:
            v[K - 1] = measured[top] + (K - top) * slope
        else:  # a gap below the probe's largest K: the nearest measured K above
            v[K - 1] = measured[min(m for m in measured if m > K)]
    if k > top:
        note = f"the probe measured verify up to K={top}; v(K) for K>{top} is extended linearly"
    return np.maximum(v, 0.0), note


def resolve_cost(run, probe: str | Path | None = None, draft_cost: float | None = None) -> Cost:
    """c from --probe probe.json, else --draft-cost C, else the roofline in run.json (model.roofline.draft_cost).

    With a probe, v(K) is measured: the extra time of one verify forward of K+1 tokens over one
    decode step, in decode steps. Otherwise v = 0: decode at batch 1 is memory-bound, so a verify
    of a few tokens reads the same weights as a decode step (ACCEPTANCE.md).
    """
    if probe is not None and draft_cost is not None:
        raise OptionError("--probe and --draft-cost both give the draft cost; pass one of them")
    if probe is not None:
        data = read_probe(probe)
        v, note = verify_extra_from_probe(data, run.k)
        notes = [note] if note else []
        if data.get("cpu"):
            notes.append("the probe ran on a CPU: CPU figures do not stand for a GPU's")
        run_sha = (run.manifest.get("model") or {}).get("config_sha256")
        probe_sha = (data.get("model") or {}).get("config_sha256")
        if run_sha and probe_sha and run_sha != probe_sha:
            other = (data.get("model") or {}).get("path")
            notes.append(f"the probe measured another model ({other}) than the run replayed")
        if data.get("dtype") and run.manifest.get("dtype") and data["dtype"] != run.manifest["dtype"]:
            notes.append(f"the probe ran at {data['dtype']}, the run replayed at {run.manifest['dtype']}")
        detail = f"probe {probe}: {data.get('device', '?')} {data.get('dtype', '?')}, context {data.get('context', '?')}"
        return Cost(c=float(data["draft_cost"]), verify_extra=v, source="probe", detail=detail, notes=tuple(notes))
    if draft_cost is not None:
        if not _finite(draft_cost) or draft_cost < 0:
            raise OptionError(f"--draft-cost {draft_cost}: expected a finite number >= 0 (draft step / target decode step)")
        return Cost(c=float(draft_cost), verify_extra=np.zeros(run.k), source="draft-cost",
                    detail=f"--draft-cost {draft_cost}", notes=())
    roofline = ((run.manifest.get("model") or {}).get("roofline") or {})
    c = roofline.get("draft_cost")
    if not roofline and not any(d not in MODEL_FREE_DRAFTERS for d in run.drafters):
        return model_free_cost(run)
    if not _finite(c) or c < 0:
        raise _run_error(run.path / "run.json",
                         "has no model.roofline.draft_cost; pass --draft-cost C or --probe probe.json")
    precision = roofline.get("precision", run.manifest.get("dtype", "?"))
    return Cost(c=float(c), verify_extra=np.zeros(run.k), source="roofline",
                detail=f"roofline at {precision}: head + lm_head bytes / target bytes", notes=())


MODEL_FREE_DRAFTERS = ("ngram", "suffix", "grammar")  # draft on the CPU: no draft step on the GPU (grammar: its forced tokens)


def drafter_cost(cost: Cost, drafter: str) -> Cost:
    """The cost one drafter's speculation pays per target step, in the same units as the head's.

    mtp and the hybrids: the head's c — Arctic Inference runs the model drafter at every step for every request
    and only then weighs suffix decoding's draft against it (arctic_inference/vllm/model_runner.py @ 9d464388,
    `propose_draft_token_ids`), so a hybrid pays the head's draft step whichever draft it keeps. ngram and
    suffix: c = 0 — they draft on the CPU from the tokens alone, between target steps, with no GPU work (their CPU
    time, run.json timing.drafting, is microseconds per draft against a target step of milliseconds: docs/drafters.md,
    "Model-free drafters"). The verify term v(K) is every drafter's: verifying K+1 tokens costs the target the
    same whoever drafted them."""
    if drafter not in MODEL_FREE_DRAFTERS or cost.source == "model-free":
        return cost
    return Cost(c=0.0, verify_extra=cost.verify_extra, source=cost.source,
                detail=f"{drafter} drafts on the CPU between target steps: c = 0; v(K) as for every drafter "
                       f"({cost.detail})", notes=cost.notes)


def model_free_cost(run) -> Cost:
    """The cost of a run whose drafters are all model-free and whose manifest has no roofline: c = 0, v(K) = 0."""
    return Cost(c=0.0, verify_extra=np.zeros(run.k), source="model-free",
                detail="model-free drafters only: no draft step on the GPU (c = 0), v(K) = 0 without a probe", notes=())


#
# The cost table (`cost_table`): --probe with batch sizes (probe.json version 2) measured; else, unless
# --draft-cost or a version-1 probe gives batch 1 only, the roofline on --device-spec (default h100) from
# the run's geometry (run.json model.cost_geometry, else the checkpoint at model.path) at --context tokens
# per sequence (default: the run's mean anchor position, the context a drafted token sees), routed experts
# from the run's router sums when it has them. speedup(K, B) then takes the overall τ_sim(K) and its
# bootstrap replicates through cost.batch_speedup: the intervals are τ_sim's, the cost being fixed.
# The gate (--batch B or LO-HI) is judged at each gated batch size by the same rules as at batch 1
# (judge); the report's slices, best K and verdict are at the binding one: the worst verdict, then the
# lowest lower bound.


@dataclass(frozen=True)
class CostTable:
    """The run's step times at each batch size, and where they came from."""

    times: StepTimes
    legacy: Cost | None  # the batch-1 Cost of a batch-1-only source (resolve_cost), kept exact
    context: float | None  # the roofline's context per sequence (None: measured or batch 1 only)
    experts: dict | None  # MoE roofline: distinct experts per layer, measured and expected (JSON `batch.experts`)
    k_max: int  # the run's Kmax: v_B(K) for K = 1..k_max
    device: object = None  # cost.Device of a roofline table (None: measured or batch 1 only)

    def cost_at(self, b: int) -> Cost:
        """The slices' Cost at batch size b: c_B and v_B(K), K = 1..Kmax."""
        if self.legacy is not None and b == 1:
            return self.legacy
        t = self.times
        i = t.index(b)
        return Cost(c=float(t.draft_cost()[i]), verify_extra=t.verify_extra(self.k_max)[i], source=t.source,
                    detail=f"{t.detail}; at batch {b}", notes=t.notes + t.flags)


def drafter_table(table: CostTable, drafter: str) -> CostTable:
    """The cost table one drafter pays (drafter_cost at every batch size): ngram and suffix draft on the CPU, so
    their draft step is 0 at every B; the verify steps are every drafter's."""
    if drafter not in MODEL_FREE_DRAFTERS or (table.legacy is not None and table.legacy.source == "model-free"):
        return table
    from dataclasses import replace

    t = table.times
    times = replace(t, draft=np.zeros_like(t.draft), detail=f"{t.detail}; {drafter} drafts on the CPU: t_draft = 0")
    return replace(table, times=times, legacy=drafter_cost(table.legacy, drafter) if table.legacy is not None else None)


def run_context(run) -> float:
    """The mean anchor position: the tokens before a drafted position, the context its step reads."""
    first = run.rows.depth == 1
    return float(run.rows.pos[first].mean()) if first.any() else 0.0


def run_geometry(run) -> tuple[Geometry | None, str | None]:
    """The roofline's geometry: run.json model.cost_geometry, else the checkpoint at model.path; or why not."""
    model = run.manifest.get("model") or {}
    stored = model.get("cost_geometry")
    if isinstance(stored, dict):
        try:
            return Geometry.from_dict(stored), None
        except (TypeError, ValueError) as e:
            return None, f"run.json model.cost_geometry is unreadable ({_one_line(e)})"
    where = model.get("path")
    if where and Path(where).is_dir():
        from ..cost.geometry import geometry_of_checkpoint
        from ..errors import CheckpointError
        from ..model.checkpoint import read_checkpoint

        try:
            return geometry_of_checkpoint(read_checkpoint(where)), None
        except (CheckpointError, OSError, KeyError, ValueError) as e:
            return None, f"run.json has no model.cost_geometry and the checkpoint at {where} cannot be read ({_one_line(e)})"
    return None, f"run.json has no model.cost_geometry and the checkpoint at {where or '?'} is not here"


def run_expert_counts(run) -> ExpertCounts | None:
    """The run's router window sums (requests.parquet `routing`, tables.py), summed over sessions; None without."""
    path = run.path / "requests.parquet"
    if not has_column(path, "routing"):
        return None
    column = read_dataset(path, ["routing"], str(run.manifest.get("status"))).column("routing").to_pylist()
    sums = [r for r in column if r is not None]
    if not sums:
        return None
    shape = (sums[0]["q_max"], sums[0]["layers"], sums[0]["experts"])
    windows, hits = np.zeros(shape[0], dtype=np.int64), np.zeros(shape, dtype=np.int64)
    for r in sums:
        if (r["q_max"], r["layers"], r["experts"]) != shape or len(r["windows"]) != shape[0] or \
                len(r["hits"]) != shape[0] * shape[1] * shape[2]:
            raise _run_error(path, "routing sums of different shapes (or cut short); the run directory is inconsistent, "
                                   "re-run replay")
        windows += np.asarray(r["windows"], dtype=np.int64)
        hits += np.asarray(r["hits"], dtype=np.int64).reshape(shape)
    return ExpertCounts(windows=windows, hits=hits, sessions=len(sums))


def tree_needs(run) -> tuple[int, tuple[int, ...]]:
    """(the most tokens a verify of the run's trees holds, their frontier widths): what the cost table must cover for
    the trees of run.json `trees` (version 3; (0, ()) without)."""
    trees = [t for t in run.manifest.get("trees") or [] if isinstance(t, dict)]
    return max((int(t["draft_tokens"]) for t in trees), default=0), tuple(sorted({int(t["topk"]) for t in trees} - {1}))


def cost_table(run, *, probe: str | Path | None = None, draft_cost: float | None = None,
               device_spec: str | None = None, context: float | None = None,
               batch_sizes: tuple[int, ...] = DEFAULT_BATCHES) -> CostTable:
    """The step times at each batch size for this run (the rules at the top of this section); with trees (run.json
    `trees`), verifies up to their largest T and draft steps over their TOPK tokens per sequence too."""
    if device_spec is not None and (probe is not None or draft_cost is not None):
        raise OptionError("--device-spec sets the roofline's device, but --probe/--draft-cost give a measured or fixed "
                          "cost: pass one of them")
    batch_sizes = tuple(sorted(set(batch_sizes) | {1}))
    if probe is not None or draft_cost is not None:
        legacy = resolve_cost(run, probe, draft_cost)  # its checks and notes (CPU, another model, dtype)
        data = read_probe(probe) if probe is not None else None
        if data is not None and data["probe_version"] >= 2:
            times = step_times_from_probe(data, str(probe))
            times = StepTimes(**{**times.__dict__, "notes": tuple(dict.fromkeys(legacy.notes + times.notes))})
            return CostTable(times=times, legacy=None, context=None, experts=None, k_max=run.k)
        why = ("--draft-cost gives batch 1 only" if data is None else
               "the probe (probe_version 1) measured batch 1 only; re-run `mtp-observe probe --batch 1,2,4,...`")
        times = batch1_times(legacy.c, legacy.verify_extra, legacy.source, legacy.detail, legacy.notes + (why,))
        return CostTable(times=times, legacy=legacy, context=None, experts=None, k_max=run.k)
    geometry, why = run_geometry(run)
    if geometry is None:
        legacy = resolve_cost(run)
        times = batch1_times(legacy.c, legacy.verify_extra, legacy.source, legacy.detail,
                             legacy.notes + (f"{why}: the cost table has batch 1 only (the bytes ratio); re-run replay, or "
                                             "pass --probe with batch sizes",))
        return CostTable(times=times, legacy=legacy, context=None, experts=None, k_max=run.k)
    device = parse_device(device_spec or DEFAULT_DEVICE)
    ctx = run_context(run) if context is None else float(context)
    experts = run_expert_counts(run) if geometry.moe_layers else None
    verify_tokens, widths = tree_needs(run)
    times = roofline_times(geometry, device, batch_sizes, max(run.k + 1, verify_tokens), ctx, experts, widths)
    notes = list(times.notes)
    if device_spec is None:
        notes.append(f"the roofline is on the default device ({DEFAULT_DEVICE}); --device-spec names yours")
    if geometry.moe_layers and experts is None:
        notes.append("the run has no router sums (a run written before they were recorded): routed experts are charged "
                     "at the expected E(1-(1-k/E)^N), which assumes uniform, independent routing")
    info = None
    if geometry.moe_layers:
        info = {"source": "router" if experts is not None else "formula", "experts": geometry.experts,
                "top_k": geometry.top_k, "sessions": experts.sessions if experts is not None else 0,
                "windows": experts.windows.tolist() if experts is not None else None,
                "q": list(range(1, run.k + 2)),
                "measured": None if experts is None else [[experts.distinct(b, q) for q in range(1, run.k + 2)]
                                                          for b in batch_sizes],
                "formula": [[expected_distinct(geometry.experts, geometry.top_k, b * q) for q in range(1, run.k + 2)]
                            for b in batch_sizes]}
    times = StepTimes(**{**times.__dict__, "notes": tuple(notes)})
    return CostTable(times=times, legacy=None, context=ctx, experts=info, k_max=run.k, device=device)


def precision_table(table: CostTable, run, precision: str) -> CostTable:
    """The cost table of the head at a what-if precision (run.json model.head_precisions: its draft step's bytes),
    the target's steps unchanged. On the roofline, the draft step is the roofline's at that precision's bytes; from
    a probe or a given c, the measured draft step scaled by the batch-1 byte ratio of the two draft steps (a draft
    step is memory-bound: its bytes scale its time)."""
    from dataclasses import replace

    from ..cost.roofline import draft_times

    entry = ((run.manifest.get("model") or {}).get("head_precisions") or {}).get(precision)
    if not isinstance(entry, dict):
        raise _run_error(run.path / "run.json", f"has no model.head_precisions.{precision}; re-run replay --head-precision")
    t = table.times
    geometry = run_geometry(run)[0] if table.device is not None and t.source == "roofline" else None
    if geometry is not None:
        what_if = replace(geometry, **{key: int(entry[key]) for key in ("head_dense_bytes", "head_expert_bytes",
                                                                        "lm_head_bytes", "embedding_row_bytes")})
        draft, _ = draft_times(what_if, table.device, t.batch, table.context or 0.0)
        times = t.with_draft(draft, f"the head at {precision} ({entry['draft_step_bytes']:,} bytes a batch-1 step)")
        return replace(table, times=times)
    roofline = (run.manifest.get("model") or {}).get("roofline") or {}
    served = (roofline.get("head_step_bytes") or 0) + (roofline.get("lm_head_bytes") or 0)
    if not served:
        raise _run_error(run.path / "run.json", "has no model.roofline step bytes to scale the draft cost by; re-run replay")
    ratio = float(entry["draft_step_bytes"]) / served
    times = t.with_draft(t.draft * ratio, f"the head at {precision}: the draft step x {ratio:.3f} (its bytes over the "
                                          "served head's)")
    legacy = table.legacy
    if legacy is not None:
        legacy = Cost(c=legacy.c * ratio, verify_extra=legacy.verify_extra, source=legacy.source,
                      detail=f"{legacy.detail}; the head at {precision}: c x {ratio:.3f} (its draft step's bytes)",
                      notes=legacy.notes)
    return replace(table, times=times, legacy=legacy)
