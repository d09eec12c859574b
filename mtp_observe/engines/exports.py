"""The engines' language: the serve flags a verdict stands for, the run's numbers as an engine counts them,
files the engines and capacity planners read (the check of an engine's own counters against the run is
engine_check.py).

Contract:
    engine_numbers(report, k) -> EngineNumbers   the run at draft length K as vLLM counts it: over the steps the
                                                 simulated decode makes (metrics.decode_walk), with the intervals
    serve_lines(report) -> list[str]             the vLLM / SGLang flags of the verdict's K to run, only when it serves
    what_if_lines(report) -> list[str]           otherwise the best K's flags, labelled "not recommended"
    export(reading, engine, k) -> str            a file's text for `engine` (ENGINES)
    read_engine_metrics(text, where) -> EngineMeasurement
                                                 vLLM Prometheus text, vLLM per-request JSON, SGLang log lines
                                                 (counters.py: read, and checked to be counts)
    check(report, measured, k, traffic) -> EngineCheck   (engine_check.py)
                                                 the engine's numbers against the run's (exit 0 / 1): on the same tokens
                                                 within numerics and counting noise, or on other traffic within a
                                                 two-sample band; says when the run's verdict means it cannot judge
    export_plan(report, k, force) -> ExportPlan  export follows the verdict: refused unless it serves, or --force

Why the engine-counted numbers, not the all-anchor ones. An engine counts the steps its decoder makes: after a
step that accepts a drafts it jumps a + 1 tokens ahead, so the anchors it verifies from are the simulated
decode's visited anchors, which follow acceptance (a rejection lands the next step right after it). Its
per-position rate is per_pos[k] / num_drafts over those steps; A_k averages over every anchor. Every format
below describes one verify step, drawn independently per step, so an engine fed the all-anchor A_k replays a
decode that is not the one it will run. metrics.py's docstring defines the counts; vLLM's counters count a step's
drafts that reach the end-of-turn token as accepted (its counts are taken from the sampler's output before the
stop check), and so does the run; drafts past the end-of-turn token, which the run has no row for, count as
rejected (a lower bound there). vLLM counts a step only when the drafter proposed tokens, and a short proposal as
that many draft tokens (metrics.py: step_drafted); so do these numbers, and the synthetic rates of a drafter whose
steps draft fewer than K are rates over the steps that drafted that far (synthetic_rates). Which vLLM runner's
rules a drafter's rows follow (n-gram's V2 speculator by default, V1 for suffix decoding) is in run.json
drafters.NAME.runner; the export says it (engine_notes), and the serve line of a V1 n-gram run sets
VLLM_USE_V2_MODEL_RUNNER=0 (docs/engine-fidelity.md).

Sources (read with the search tools; file at the stored commit; no key here is invented):
- vLLM `--speculative-config` keys: vllm-project/vllm@002e77c1 vllm/config/speculative.py — `method` ("mtp"; the
  per-model MTP names are deprecated aliases of it), `num_speculative_tokens`, `rejection_sample_method`
  ("synthetic"), `synthetic_acceptance_rates` ("Per-position *unconditional* acceptance rates ... Position i's
  entry is the marginal probability that the first i+1 draft tokens are all accepted; the list must have length
  num_speculative_tokens, each entry in [0, 1], and be monotonically non-increasing"; exactly one of it and
  `synthetic_acceptance_length`), `num_speculative_tokens_per_batch_size` (dynamic SD, list of inclusive
  (range_start, range_end, num_speculative_tokens); validated in vllm/v1/spec_decode/dynamic/utils.py@a6f6bb1d).
- What vLLM counts per step: vllm/v1/core/sched/scheduler.py, Scheduler.update_from_output (several stored
  versions agree): `num_draft_tokens = len(scheduled_spec_token_ids)`, `num_accepted = len(generated_token_ids) - 1`
  from the sampler's tokens, then the stop check — so accepted drafts through the end-of-turn token count.
- vLLM counters: vllm-project/vllm@ee4ceaae vllm/v1/spec_decode/metrics.py (`vllm:spec_decode_num_drafts`,
  `_num_draft_tokens`, `_num_accepted_tokens`, `_num_accepted_tokens_per_pos` with label `position` 0-based;
  labels `model_name`, `engine`; mean acceptance length `1 + num_accepted_tokens / num_drafts`, per-position
  `per_pos / num_drafts`); the `_total` suffix (and a `_created` sample) is prometheus_client's
  (prometheus/client_python@00859b30 prometheus_client/metrics.py, Counter._child_samples).
- vLLM per-request JSON: vllm-project/vllm@02cf515f docs/features/speculative_decoding/acceptance_metrics.md —
  `metrics.speculative_decoding` with `acceptance_histogram` ("index j is the number of steps that accepted exactly
  j draft tokens"), `num_spec_steps`, `num_accepted_draft_tokens`, `num_draft_tokens`, `num_spec_tokens`;
  `--per-request-spec-decode-metrics summary`.
- SGLang flags: sgl-project/sglang@001067ff python/sglang/srt/server_args.py (`--speculative-algorithm NEXTN`,
  `--speculative-num-steps`, `--speculative-eagle-topk`, `--speculative-num-draft-tokens`), with
  docs/advanced_features/speculative_decoding.md@067ad4d3 ("If topk=1, it is adjusted to num_steps + 1").
  Simulated acceptance: python/sglang/srt/environ.py@0003215c (`SGLANG_SIMULATE_ACC_LEN`,
  `SGLANG_SIMULATE_ACC_METHOD`: "match-expected" draws floor/ceil so the mean is exact) and
  python/sglang/srt/speculative/spec_utils.py@00731f0b (the length includes the bonus token, in [1, steps + 1]).
  Its log line: scheduler metrics mixin, `accept len: {spec_accept_length:.2f}` = (accepted drafts + one per
  request-step) / request-steps over the log interval: the same convention as vLLM's mean acceptance length.
- TensorRT-LLM: NVIDIA/TensorRT-LLM@00b6d5a2 tensorrt_llm/_torch/speculative/interface.py
  (`TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS`: accepted *draft* tokens, the bonus token excluded — the engine
  adds one; a float on the one-model path (MTP): integer part always accepted, fraction the chance of one more;
  an integer on the two-model path, where a fraction is refused and forcing silently turns off; 0 is off).
  The draft length is `MTPDecodingConfig.max_draft_len` (NVIDIA/TensorRT-LLM@011d0933 tensorrt_llm/llmapi/llm_args.py,
  after PR #12341 "decouple MTP num_nextn_predict_layers from max_draft_len"): `num_nextn_predict_layers` is now an
  internal field filled from the checkpoint, and a value given by hand is remapped to max_draft_len with a
  deprecation warning (`_remap_deprecated_num_nextn_predict_layers`); the mode follows the checkpoint's MTP layers
  (`trtllm_mode`).
- NVIDIA Model-Optimizer `speculation_profile.json`: examples/specdec_bench/specdec_bench/speculation_profile.py
  at commit edf879d3 (open PR stack #2313/#2247; not in the released package, not importable here):
  SCHEMA_VERSION "1.0", the keys of `build_profile`, marginal[i] = P(length >= i + 2), conditional[i] =
  marginal[i] / marginal[i-1] (0 after a 0), 6 decimals, histogram keyed by acceptance length (tokens emitted in
  a step including the bonus), `_consistency_check` (|1 + Σ marginal - mean| <= 0.02) and `_monotonicity_check`
  (no marginal above its predecessor + 1e-9). `per_category` is {category: mean acceptance length}, as its caller
  passes it (here the category is the segment of the step's first drafted token).
- Dynamo AIConfigurator: ai-dynamo/aiconfigurator@095f58a5 src/aiconfigurator/cli/example.yaml and
  docs/cli_user_guide.md (`nextn` draft length; `nextn_accepted` "Average accepted draft tokens per decode step
  (0 <= nextn_accepted <= nextn)", i.e. mean acceptance length minus 1), read by
  src/aiconfigurator/sdk/speculative.py `normalize_speculative_decoding`.

Imports no torch (the report's rule).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import numpy as np

from ..errors import OptionError
from ..report import Reading, Report, Run, simulated_walks
from ..report.flags import (
    DYNAMIC_LIMITS,
    UNLIMITED_CACHED_REQUESTS,
    drafter_runner,
    dynamic_config,
    report_speculative_config,
    sglang_args,
    vllm_unservable,
)
from .counters import (  # noqa: F401 (read_engine_metrics and the readers are this module's contract too)
    VLLM_COUNTERS,
    EngineMeasurement,
    check_acceptance_length,
    read_engine_metrics,
    read_per_request,
    read_prometheus,
    read_sglang_log,
)
from .numbers import DIGITS, EngineNumbers, engine_numbers

ENGINES = ("vllm", "sglang", "trtllm", "speculation-profile", "aiconfigurator")
SPECULATION_PROFILE_VERSION = "1.0"  # Model-Optimizer's SCHEMA_VERSION this file follows
PROFILE_MEAN_TOLERANCE = 0.02  # Model-Optimizer's _consistency_check tolerance
PROFILE_MONOTONE_SLACK = 1e-9  # its _monotonicity_check slack


# ---------------------------------------------------------------------------------------------
# 1. The run's numbers as the engine counts them


# ---------------------------------------------------------------------------------------------
# 2. Serve flags


def engine_notes(report: Report) -> list[str]:
    """What a vLLM user must know to serve the drafter the run measured (which runner, what vLLM counts)."""
    drafter = report.drafter
    params = (report.manifest.get("drafters") or {}).get(drafter) or {}
    runner = drafter_runner(report.manifest, drafter)
    notes = []
    if drafter == "ngram" and runner == "v2":
        notes.append("n-gram as vLLM 0.33's V2 model runner proposes it (its default on CUDA): the longest match, its "
                     "most recent occurrence, always K draft tokens (slots past the match hold the last token), so "
                     "every step is a K-token draft; VLLM_USE_V2_MODEL_RUNNER=0 (or a feature V2 lacks) would run the "
                     "V1 proposer instead, which the run did not measure (replay --ngram-runner v1)")
    elif drafter == "ngram":
        notes.append("n-gram as vLLM's V1 CPU proposer proposes it (the earliest match, short or no drafts): serve "
                     "with VLLM_USE_V2_MODEL_RUNNER=0, else vLLM 0.33 runs its V2 speculator, which the run did not "
                     "measure (replay --ngram-runner v2)")
    if drafter in ("ngram", "suffix") and runner == "v1":
        notes.append("vLLM counts a step as a draft only when the drafter proposed tokens, and a short proposal as "
                     "that many draft tokens; the expected metrics are counted the same way, and the synthetic "
                     "acceptance rates are rates over the steps that drafted that far")
    if drafter == "suffix" and (params.get("max_cached_requests") or 0) < 0:
        notes.append(f"the run's suffix cache had no limit (max_cached_requests {params.get('max_cached_requests')}), "
                     f"which vLLM refuses (>= 0): suffix_decoding_max_cached_requests {UNLIMITED_CACHED_REQUESTS} "
                     "(2^31 - 1, the most Arctic's cache takes) never evicts either")
    return notes


def vllm_synthetic_config(config: dict, n: EngineNumbers) -> dict:
    """vLLM's synthetic rejection sampler fed the rates that reproduce the run (synthetic_rates): for a drafter that
    drafts K at every step, the run's per-step marginal rates (its per_pos / num_drafts then reproduce the run's,
    and 1 + Σ rates its mean acceptance length); for a variable-length one, rates over the steps that drafted that
    far, so that the engine, drafting as the run's drafter did, comes to the run's mean acceptance length."""
    rates = n.synthetic_rates
    assert all(0.0 <= r <= 1.0 for r in rates) and all(b <= a for a, b in zip(rates, rates[1:])), rates
    return {**config, "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": rates}


# ---------------------------------------------------------------------------------------------
# 3. Exports


def _r(x: float) -> float:
    return round(float(x), DIGITS)


def _provenance(reading: Reading, n: EngineNumbers) -> dict:
    report = reading.report
    rec = report.recording
    return {
        "run": str(report.path), "model": (report.manifest.get("model") or {}).get("path"),
        "sessions": len(report.sessions), "k": n.k, "verdict": report.verdict.status,
        "recorded_with": rec.label if rec is not None else None,
        "counted_as": "vLLM's counters over the steps the simulated decode makes (mtp-observe docs/engines.md, "
                      "'Using the numbers in your engine')",
    }


def _expected(n: EngineNumbers) -> dict:
    """What vLLM's metrics will show on the same traffic, with the run's intervals."""
    def seq(a):
        return None if a is None else [_r(x) for x in a]

    return {
        "mean_acceptance_length": _r(n.mean_acceptance_length),
        "mean_acceptance_length_interval": None if n.mean_acceptance_length_lo is None else
        [_r(n.mean_acceptance_length_lo), _r(n.mean_acceptance_length_hi)],
        "draft_acceptance_rate": _r(n.draft_acceptance_rate),
        "per_position_acceptance_rate": seq(n.per_position),
        "per_position_acceptance_rate_interval": None if n.per_position_lo is None else
        [seq(n.per_position_lo), seq(n.per_position_hi)],
        "interval_level": n.level,
        "counts": {"num_drafts": n.steps, "num_draft_tokens": n.draft_tokens, "num_accepted_tokens": n.accepted,
                   "num_accepted_tokens_per_pos": list(n.per_pos_counts)},
        "all_anchor": {"accept_rate": seq(n.accept_rate), "tau": _r(n.tau),
                       "note": "A_k over every anchor: NOT what the engine counts; never feed these to an engine"},
    }


def _expected_for(report: Report, n: EngineNumbers) -> dict:
    out = _expected(n)
    if n.variable_length:
        out["note"] = (f"counted as vLLM counts them: only the steps where the {report.drafter} drafter proposed tokens "
                       f"are drafts ({n.steps} of the simulated decode's steps), a short proposal that many draft tokens")
    return out


def export_vllm(reading: Reading, n: EngineNumbers) -> str:
    config = report_speculative_config(reading.report, n.k)
    if config is None:
        drafter = reading.report.drafter
        why = vllm_unservable(drafter, (reading.report.manifest.get("drafters") or {}).get(drafter))
        raise OptionError(f"--engine vllm: {why}" + ("" if drafter == "suffix" else
                          "; export this run for another engine, or judge another drafter (report --drafter)"))
    dynamic = dynamic_config(reading.report)
    doc = {
        "speculative_config": config,
        "synthetic_speculative_config": vllm_synthetic_config(config, n),
        "expected_metrics": _expected_for(reading.report, n),
        "mtp_observe": _provenance(reading, n),
    }
    notes = engine_notes(reading.report)
    if notes:
        doc["notes"] = notes
    if dynamic is not None:
        # the schedule over batch sizes; with synthetic acceptance its rates must be num_speculative_tokens long
        doc["dynamic_speculative_config"] = dynamic
        doc["dynamic_speculative_config_limits"] = DYNAMIC_LIMITS
        if dynamic["num_speculative_tokens"] == n.k:
            doc["dynamic_synthetic_speculative_config"] = vllm_synthetic_config(dynamic, n)
    return json.dumps(doc, indent=2) + "\n"


def _env_header(reading: Reading, n: EngineNumbers, engine: str) -> list[str]:
    p = _provenance(reading, n)
    return [f"# mtp-observe export --engine {engine}: run {p['run']} at K={n.k} (verdict {p['verdict']}, "
            f"{p['sessions']} sessions)",
            f"# mean acceptance length {n.mean_acceptance_length:.{DIGITS}f} as the engine counts it (1 + accepted "
            "drafts per verify step, over the steps the simulated decode makes)"]


def export_sglang(reading: Reading, n: EngineNumbers) -> str:
    serve = ("# serve: python -m sglang.launch_server --model-path MODEL " + " ".join(sglang_args(n.k))
             if reading.report.drafter == "mtp" else f"# drafter: {reading.report.drafter} (no SGLang flags mapped here)")
    lines = _env_header(reading, n, "sglang") + [
        serve,
        "# simulate the measured acceptance (environment, sglang/srt/environ.py): one length per batch step, "
        "a mean only",
        f"SGLANG_SIMULATE_ACC_LEN={n.mean_acceptance_length:.{DIGITS}f}",
        "SGLANG_SIMULATE_ACC_METHOD=match-expected",
    ]
    return "\n".join(lines) + "\n"


def head_layers(manifest: dict) -> int | None:
    """The checkpoint's MTP layers, from run.json model.head_tensors (`mtp.layers.{i}.*`), or None without them."""
    names = (manifest.get("model") or {}).get("head_tensors") or []
    layers = {m.group(1) for n in names for m in [re.match(r"mtp\.layers\.(\d+)\.", str(n))] if m}
    return len(layers) or None


def trtllm_mode(layers: int | None) -> str:
    """Which TensorRT-LLM MTP path a checkpoint of `layers` MTP layers runs with MTPDecodingConfig's defaults
    (NVIDIA/TensorRT-LLM@011d0933 tensorrt_llm/llmapi/llm_args.py `MTPDecodingConfig.spec_dec_mode`: n == 1 and not
    use_mtp_vanilla and mtp_eagle_one_model -> MTP_EAGLE_ONE_MODEL; n > 1 -> MTP, vanilla; n is read from the
    checkpoint's num_nextn_predict_layers or mtp_num_hidden_layers, 1 when neither, by
    tensorrt_llm/_torch/speculative/utils.py `update_spec_config_from_model_config`)."""
    if layers is None or layers == 1:
        return ("MTP_EAGLE_ONE_MODEL: the checkpoint's single MTP layer drafts max_draft_len tokens in a chain inside "
                "the target's engine (use_mtp_vanilla false, mtp_eagle_one_model true: the defaults) — the chain this "
                "run measured")
    return (f"MTP (vanilla): {layers} MTP layers, layer i drafting position i; max_draft_len above {layers} is cut to "
            f"{layers} with a warning")


def export_trtllm(reading: Reading, n: EngineNumbers) -> str:
    accepted = n.mean_acceptance_length - 1.0  # accepted drafts per step: the engine adds the target's token
    drafter = reading.report.drafter
    if drafter == "mtp":
        config = [
            f"# draft length: speculative_config: {{decoding_type: MTP, max_draft_len: {n.k}}} (TensorRT-LLM "
            "MTPDecodingConfig; num_nextn_predict_layers is deprecated there: read from the checkpoint, and a value set "
            "by hand is remapped to max_draft_len with a warning)",
            f"# mode: {trtllm_mode(head_layers(reading.report.manifest))}",
        ]
    else:
        config = [f"# drafter: {drafter}; draft length {n.k} (no TensorRT-LLM MTP config for a model-free drafter)"]
    lines = _env_header(reading, n, "trtllm") + config + [
        "# accepted draft tokens per step = mean acceptance length - 1 (the engine adds the target token); the MTP "
        "one-model path reads the fraction, the two-model path needs an integer "
        f"({max(1, round(accepted))}); 0 turns forcing off",
        f"TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS={accepted:.{DIGITS}f}",
    ]
    return "\n".join(lines) + "\n"


def export_aiconfigurator(reading: Reading, n: EngineNumbers) -> str:
    accepted = n.mean_acceptance_length - 1.0
    assert 0.0 <= accepted <= n.k, (accepted, n.k)
    lines = _env_header(reading, n, "aiconfigurator") + [
        "# AIConfigurator task keys: nextn = draft length, nextn_accepted = accepted draft tokens per step",
        f"nextn: {n.k}",
        f"nextn_accepted: {accepted:.{DIGITS}f}",
    ]
    return "\n".join(lines) + "\n"


def segment_acceptance_lengths(run: Run, k: int) -> dict[str, float]:
    """Mean acceptance length per segment of each step's first drafted token, over the simulated decode's steps
    at K (Model-Optimizer's per_category, here per segment)."""
    from ..report.metrics import decode_walk

    walk = decode_walk(run.accepted_len, run.spans.end - run.spans.start, k)
    first = run.rows.depth == 1
    segment_of_anchor = np.full(len(run.accepted_len), -1, dtype=np.int64)
    segment_of_anchor[run.rows.anchor[first]] = run.rows.segment[first]
    assert np.all(segment_of_anchor >= 0), "every anchor has a depth-1 row"
    seg = segment_of_anchor[walk.visited]
    accepted = np.minimum(run.accepted_len[walk.visited], k)
    out = {}
    for i, name in enumerate(run.segments):
        here = seg == i
        if here.any():
            out[name] = _r(1.0 + accepted[here].mean())
    return out


def mean_per_turn(run: Run, k: int) -> float:
    """The mean over turns of each turn's mean acceptance length at K (Model-Optimizer's per-request mean)."""
    steps, step_accepted, step_drafted = simulated_walks(run)
    s = steps[:, k - 1] if step_drafted is None else step_drafted[:, k - 1, 0]  # steps with a draft
    a = step_accepted[:, k - 1, :k].sum(axis=1)
    has = s > 0
    return float(np.mean(1.0 + a[has] / s[has])) if has.any() else float("nan")


def profile_validation(mean_accept_length: float, marginal: list[float]) -> dict:
    """Model-Optimizer's two checks, as its file states them (module docstring)."""
    implied = 1.0 + sum(marginal)
    delta = abs(implied - mean_accept_length)
    violations = [{"position": i, "value": marginal[i], "previous": marginal[i - 1]}
                  for i in range(1, len(marginal)) if marginal[i] > marginal[i - 1] + PROFILE_MONOTONE_SLACK]
    return {
        "mean_consistency": {"implied_mean_accept_length": _r(implied), "reported_mean_accept_length": _r(mean_accept_length),
                             "abs_delta": _r(delta), "tolerance": PROFILE_MEAN_TOLERANCE,
                             "passed": delta <= PROFILE_MEAN_TOLERANCE},
        "marginal_monotonicity": {"passed": not violations, "violations": violations},
    }


def _checkpoint_id(path) -> str | None:
    """A checkpoint path's last two components (Model-Optimizer's checkpoint_id: no cluster layout published)."""
    if not path:
        return None
    parts = [p for p in str(path).replace("\\", "/").split("/") if p]
    return "/".join(parts[-2:]) if parts else None


def speculation_profile(reading: Reading, n: EngineNumbers) -> dict:
    """Model-Optimizer's speculation_profile.json at K from the simulated decode's steps."""
    report, run = reading.report, reading.run
    marginal = [_r(x) for x in n.per_position]
    conditional = [_r(x) for x in n.conditional]
    mean = n.mean_acceptance_length
    by_k = {}
    for K in range(1, report.k + 1):
        x = float(report.overall.value.mean_acceptance_length[K - 1])
        if math.isfinite(x):
            by_k[str(K)] = _r(x)
    model = _checkpoint_id((report.manifest.get("model") or {}).get("path"))
    rec = report.recording
    drafter = report.drafter
    params = {key: v for key, v in ((report.manifest.get("drafters") or {}).get(drafter) or {}).items() if key != "draft_k"}
    return {
        "schema_version": SPECULATION_PROFILE_VERSION,
        "measured": True,
        "method": drafter,
        "draft_checkpoint": {"id": model, "draft": "the checkpoint's own MTP head"} if drafter == "mtp" else
        {"id": None, "draft": f"model-free {drafter} drafter", "parameters": params},
        "target_model": {"id": model},
        "num_speculative_tokens": n.k,
        "block_size": None,
        "max_supported_k": n.k,
        "verification_method": "longest_prefix",
        "conditional_accept_rates": conditional,
        "marginal_accept_rates": marginal,
        "mean_accept_length": _r(mean),
        "mean_accept_length_per_request": _r(mean_per_turn(run, n.k)),
        # an MTP or n-gram chain at K is a prefix of the chain at K + 1; suffix and the hybrids re-plan per K
        "accept_length_model": "chain_analytic" if drafter in ("mtp", "ngram") else "measured_per_k",
        "accept_length_by_k": by_k,  # the simulated decode at every K the run replayed
        "acceptance_length_histogram": {str(j + 1): c for j, c in enumerate(n.histogram) if c > 0},
        "per_category": segment_acceptance_lengths(run, n.k),
        "measurement_conditions": {
            "engine": "mtp-observe: simulated chain decode of recorded traffic (target replayed, MTP head drafting)",
            "run": str(report.path), "sessions": len(report.sessions), "anchors": report.overall.anchors,
            "recorded_with": rec.label if rec is not None else None, "verdict": report.verdict.status,
            "per_request": "per turn (a scored assistant turn)", "per_category": "segment of the step's first drafted token",
            "histogram": "acceptance length = accepted drafts + 1 per verify step, counted as vLLM counts (a step whose "
                         "drafts reach the end-of-turn token counts them accepted)",
            "interval_level": n.level,
            "mean_accept_length_interval": None if n.mean_acceptance_length_lo is None else
            [_r(n.mean_acceptance_length_lo), _r(n.mean_acceptance_length_hi)],
            "marginal_accept_rates_interval": None if n.per_position_lo is None else
            [[_r(x) for x in n.per_position_lo], [_r(x) for x in n.per_position_hi]],
        },
        "validation": profile_validation(mean, marginal),
    }


def export_sglang_tree(reading: Reading, spec: str) -> str:
    """`export --engine sglang --tree S,TOPK,T`: a replayed tree's three flags and its acceptance, as SGLang counts it
    (accept length = 1 + accepted drafts per verify step). A what-if, said in the header: the verdict is the chain's."""
    name = "tree:" + ",".join(x.strip() for x in spec.split(","))
    trees = reading.report.trees
    tree = next((t for t in trees if t.name == name), None)
    if tree is None:
        replayed = ", ".join(t.name.removeprefix("tree:") for t in trees) or "no trees"
        raise OptionError(f"--tree {spec}: the run replayed {replayed}; replay with --tree {spec} to export it")
    n = engine_numbers(tree.report, tree.steps)
    lines = _env_header(reading, n, "sglang") + [
        f"# what-if: tree {tree.name.removeprefix('tree:')} (SGLang only; the verdict is the chain's at "
        f"K={reading.report.best_k}); speedup {tree.speedup[0]:.3f} at batch "
        f"{reading.report.batch.binding if reading.report.batch is not None else 1}",
        "# serve: python -m sglang.launch_server --model-path MODEL --speculative-algorithm NEXTN " + tree.flags,
        "# simulate the measured acceptance (environment, sglang/srt/environ.py): one length per batch step, a mean only",
        f"SGLANG_SIMULATE_ACC_LEN={n.mean_acceptance_length:.{DIGITS}f}",
        "SGLANG_SIMULATE_ACC_METHOD=match-expected",
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ExportPlan:
    """What `export` does with the run's verdict: write or not, and the lines it says on stderr."""

    writes: bool  # False: the verdict does not serve (NO-GO, UNRELIABLE, or K to run 0) and --force was not given
    lines: tuple[str, ...]  # for stderr: the verdict, and (refused) the one line why, or (forced) "not recommended"

    @property
    def exit_code(self) -> int:
        return 0 if self.writes else 1


def export_plan(report: Report, k: int | None = None, force: bool = False, tree: str | None = None) -> ExportPlan:
    """export follows the verdict: a verdict that serves (GO at a K that pays) is written with the verdict on stderr;
    any other is refused in one line, unless force, which writes it and says it is not recommended (at the K the
    file holds: --k, a --tree's steps, else the best K)."""
    v = report.verdict
    said = f"verdict: {v.headline}: {v.reason}"
    if v.serves:
        other = () if k in (None, v.run_k) else (f"--k {k}: not the verdict's K to run ({v.run_k}); written as asked",)
        return ExportPlan(True, (said,) + other)
    if not force:
        return ExportPlan(False, (f"not exported: {v.status}, K to run 0 ({v.reason}); nothing is written; "
                                  "--force writes it anyway, not recommended",))
    at = k if k is not None else report.best_k
    written = next((t for t in report.trees if tree is not None and t.name == "tree:" + ",".join(
        x.strip() for x in tree.split(","))), None)  # export_sglang_tree writes the tree's steps
    what = f"tree {tree} (K={written.steps})" if written is not None else f"K={at}"
    return ExportPlan(True, (said, f"not recommended: written at {what} because of --force; the verdict is {v.status} "
                                   "and its K to run is 0"))


def export(reading: Reading, engine: str, k: int | None = None, tree: str | None = None) -> str:
    """The text of `mtp-observe export --engine ENGINE` (JSON for vllm and speculation-profile, KEY=VALUE lines
    for sglang and trtllm, YAML for aiconfigurator), at K (default: the best K, which is the verdict's K to run
    when the verdict serves; export_plan decides whether it is written); tree (--tree S,TOPK,T, sglang only): a
    replayed tree's."""
    if engine not in ENGINES:
        raise OptionError(f"--engine {engine}: expected one of {', '.join(ENGINES)}")
    if tree is not None:
        if engine != "sglang" or k is not None:
            raise OptionError(f"--tree {tree}: a tree draft is SGLang's (--speculative-eagle-topk > 1; vLLM serves no MTP "
                              "trees): use it with --engine sglang and without --k")
        return export_sglang_tree(reading, tree)
    dynamic = dynamic_config(reading.report)
    if engine == "vllm" and k is None and dynamic is not None:
        k = dynamic["num_speculative_tokens"]  # the schedule's largest K: the synthetic rates' length
    n = engine_numbers(reading.report, k)
    if engine == "speculation-profile":
        return json.dumps(speculation_profile(reading, n), indent=2) + "\n"
    return {"vllm": export_vllm, "sglang": export_sglang, "trtllm": export_trtllm,
            "aiconfigurator": export_aiconfigurator}[engine](reading, n)
