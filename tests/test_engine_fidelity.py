"""What the engines run by default, in the exports: variable-length drafts counted as vLLM counts them, synthetic
acceptance that reproduces the run when a synthetic engine drafts as the run's drafter did, TensorRT-LLM's
max_draft_len, suffix decoding's options vLLM has and has not, and the limits of the per-batch-size K schedule.

vLLM's own code is transcribed where a test needs it (vLLM 0.33.0, the files cited in mtp_observe/engines/exports.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mtp_observe.drafting.drafters.ngram import NgramConfig
from mtp_observe.engines.exports import export
from mtp_observe.engines.numbers import engine_numbers, synthetic_rates
from mtp_observe.errors import OptionError
from mtp_observe.model.loading import default_model_dir
from mtp_observe.report import Reading, read_and_summarize
from mtp_observe.report.flags import UNLIMITED_CACHED_REQUESTS, serve_lines, vllm_speculative_config
from mtp_observe.report.metrics import engine_counted, visited_anchors_reference
from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.pipeline import replay

from .handmade import random_sessions, write_run

ROOT = Path(__file__).resolve().parents[1]
DEMO = sorted((ROOT / "sessions").glob("*.jsonl"))
K = 4


@pytest.fixture(scope="module")
def variable_run(tmp_path_factory) -> Path:
    """The demo sessions through the two drafters whose steps draft fewer than K tokens, or none: V1's n-gram and
    suffix decoding (no weights are read)."""
    out = tmp_path_factory.mktemp("fidelity") / "run"
    return replay(DEMO, default_model_dir(), out, ReplayOptions(k=K, drafters=("ngram", "suffix"),
                                                                ngram=NgramConfig(runner="v1")))


@pytest.fixture(scope="module")
def mtp_reading(tmp_path_factory):
    run = write_run(tmp_path_factory.mktemp("fidelity-mtp") / "big", random_sessions(40, 4, 0.7, seed=1), k=4,
                    draft_cost=0.08)
    return read_and_summarize(run, replicates=50)


def visited_draft_lengths(run_dir: Path, drafter: str, k: int) -> tuple[list[int], list[int]]:
    """(draft length, accepted length) of every step the decode makes at K, read from positions.parquet with
    pandas and walked with the plain loop (metrics.visited_anchors_reference): the run's own proposal lengths."""
    rows = pd.read_parquet(run_dir / "positions.parquet")
    draft_k = k if drafter == "suffix" else rows[rows.drafter == drafter].draft_k.max()
    rows = rows[(rows.drafter == drafter) & (rows.draft_k == draft_k)]
    lengths, accepted = [], []
    for _, turn in rows.groupby(["session_id", "request", "turn"], sort=False, observed=True):
        anchors = turn.groupby("pos", sort=True)
        acc = anchors.accepted.sum().to_numpy()
        dl = anchors.draft_len.first().to_numpy()
        for p in visited_anchors_reference(acc.tolist(), k):
            lengths.append(int(min(dl[p], k)))
            accepted.append(int(min(acc[p], k)))
    return lengths, accepted


def vllm_synthetic_sampler(rates: list[float], lengths: list[int], reps: int, seed: int = 0) -> float:
    """vLLM's synthetic rejection sampler over steps drafting `lengths` tokens -> its mean acceptance length
    (1 + num_accepted_tokens / num_drafts), transcribed:
      vllm/v1/spec_decode/utils.py:848-851   conditional rates c_i = p_i / p_{i-1} (0 after a 0)
      vllm/v1/sample/rejection_sampler.py:793-844 (rejection_greedy_sample_kernel, SYNTHETIC_MODE):
          for pos in range(num_draft_tokens): accepted = uniform[pos] < rate[pos] ... the first rejection ends it
      vllm/v1/core/sched/scheduler.py:2346-2352: a step with no scheduled draft tokens is not counted."""
    conditional = np.array([p / q if q > 0.0 else 0.0 for p, q in zip(rates, [1.0, *rates[:-1]])])
    lengths_arr = np.array([j for j in lengths if j > 0])
    rng = np.random.default_rng(seed)
    u = rng.random((reps, len(lengths_arr), len(rates)))
    within = np.arange(len(rates))[None, None, :] < lengths_arr[None, :, None]
    accepted = np.cumprod((u < conditional) & within, axis=-1).sum()
    return 1.0 + accepted / (reps * len(lengths_arr))


@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
def test_vllms_synthetic_sampler_fed_the_exported_rates_reproduces_the_runs_mean_acceptance_length(variable_run, drafter):
    reading = read_and_summarize(variable_run, drafter=drafter, replicates=50)
    doc = json.loads(export(reading, "vllm", K))
    rates = doc["synthetic_speculative_config"]["synthetic_acceptance_rates"]
    expected = doc["expected_metrics"]["mean_acceptance_length"]
    lengths, accepted = visited_draft_lengths(variable_run, drafter, K)
    drafted = [j for j in lengths if j > 0]
    assert len(drafted) < len(lengths)  # steps without a draft
    assert any(0 < j < K for j in lengths) or drafter == "ngram"  # and short drafts (suffix decoding)
    # the run's engine-counted numbers are over the steps with a draft (what vLLM counts)
    assert doc["expected_metrics"]["counts"]["num_drafts"] == len(drafted)
    assert doc["expected_metrics"]["counts"]["num_draft_tokens"] == sum(lengths)
    assert expected == pytest.approx(1 + sum(accepted) / len(drafted), abs=1e-6)
    simulated = vllm_synthetic_sampler(rates, lengths, reps=400)
    assert simulated == pytest.approx(expected, rel=0.01)
    # a negative control: per-position rates over every step (what was exported before) come out too low
    every_step = [sum(a > i for a in accepted) / len(lengths) for i in range(K)]
    assert vllm_synthetic_sampler(every_step, lengths, reps=100) < expected * 0.99


def test_the_engine_counts_of_variable_length_drafts_are_the_plain_loops(variable_run):
    reading = read_and_summarize(variable_run, drafter="suffix", replicates=50)
    n = engine_numbers(reading.report, K)
    lengths, accepted = visited_draft_lengths(variable_run, "suffix", K)
    drafted = [j for j in lengths if j > 0]
    assert n.steps == len(drafted) and n.draft_tokens == sum(lengths)
    assert n.drafted_per_pos == tuple(sum(j > i for j in lengths) for i in range(K))
    assert n.per_pos_counts == tuple(sum(a > i for a in accepted) for i in range(K))
    assert n.draft_acceptance_rate == pytest.approx(sum(accepted) / sum(lengths))
    assert n.variable_length and "only the steps where the suffix drafter proposed" in \
        json.loads(export(reading, "vllm", K))["expected_metrics"]["note"]


def test_engine_counted_numbers_over_steps_with_drafts_by_value():
    # metrics.engine_counted's worked example: 4 steps; one drafted nothing and one a single token
    per_pos, mal, dar = engine_counted(np.array([[0, 0], [3, 1]]), np.array([4, 4]), np.array([[4, 0], [3, 2]]))
    assert per_pos[1].tolist() == pytest.approx([1.0, 1 / 3]) and mal[1] == pytest.approx(1 + 4 / 3)
    assert dar[1] == pytest.approx(4 / 5)
    # without draft lengths every step drafts K, as before
    per_pos, mal, dar = engine_counted(np.array([[0, 0], [3, 1]]), np.array([4, 4]))
    assert per_pos[1].tolist() == [0.75, 0.25] and mal[1] == 2.0 and dar[1] == 0.5


def test_synthetic_rates_are_rates_over_the_steps_that_drafted_that_far_pooled_where_they_would_rise():
    assert synthetic_rates((6, 3, 1), (10, 10, 10)) == [0.6, 0.3, 0.1]  # K drafts every step: the marginals
    assert synthetic_rates((6, 3, 1), (10, 5, 2)) == [0.6, 0.6, 0.5]  # over steps drafting at least i
    assert synthetic_rates((5, 3), (10, 4)) == [0.571429, 0.571429]  # 0.5 then 0.75: pooled, 8 / 14
    assert synthetic_rates((2, 0, 0), (4, 0, 0)) == [0.5, 0.0, 0.0]  # nothing drafted that far
    for accepted, drafted in [((5, 3), (10, 4)), ((7, 6, 6, 1), (9, 8, 6, 2))]:
        rates = synthetic_rates(accepted, drafted)
        assert all(b <= a for a, b in zip(rates, rates[1:]))  # vLLM refuses rising rates
        assert sum(r * d for r, d in zip(rates, drafted)) == pytest.approx(sum(accepted), abs=1e-4)


def test_v2_ngram_runs_export_every_step_as_a_k_token_draft_and_v1_runs_say_how_to_serve_them(mtp_reading):
    report = mtp_reading.report
    base = {"prompt_lookup_min": 3, "prompt_lookup_max": 5, "max_model_len": None, "draft_k": [4]}
    for runner, env in (("v2", False), ("v1", True)):
        manifest = {**report.manifest, "drafters": {"ngram": {**base, "runner": runner}}}
        scored = replace(report, drafter="ngram", manifest=manifest)
        line = serve_lines(scored)[0]
        assert ("VLLM_USE_V2_MODEL_RUNNER=0 vllm serve" in line) == env
        notes = json.loads(export(Reading(run=mtp_reading.run, report=scored, comparison=None), "vllm"))["notes"]
        assert ("V2 model runner" in notes[0]) == (runner == "v2")
        assert ("VLLM_USE_V2_MODEL_RUNNER=0" in notes[0])
    # a run written before the runner was recorded measured V1's rule
    old = replace(report, drafter="ngram", manifest={**report.manifest, "drafters": {"ngram": base}})
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in serve_lines(old)[0]


def test_the_trtllm_export_sets_max_draft_len_and_names_the_mode_a_checkpoint_runs(mtp_reading):
    # NVIDIA/TensorRT-LLM@011d0933 llm_args.py MTPDecodingConfig: num_nextn_predict_layers is deprecated (read from
    # the checkpoint; a value set by hand is remapped to max_draft_len); spec_dec_mode: 1 layer -> MTP_EAGLE_ONE_MODEL
    report = mtp_reading.report
    k = report.best_k
    text = export(mtp_reading, "trtllm")
    assert f"{{decoding_type: MTP, max_draft_len: {k}}}" in text and "num_nextn_predict_layers: " not in text
    assert "MTP_EAGLE_ONE_MODEL" in text
    two = {**report.manifest, "model": {**(report.manifest.get("model") or {}), "head_tensors": [
        "mtp.layers.0.mlp.up_proj.weight", "mtp.layers.1.mlp.up_proj.weight", "mtp.fc.weight"]}}
    vanilla = export(Reading(run=mtp_reading.run, report=replace(report, manifest=two), comparison=None), "trtllm")
    assert "MTP (vanilla): 2 MTP layers" in vanilla and "MTP_EAGLE_ONE_MODEL" not in vanilla


SUFFIX = {"max_tree_depth": 24, "max_cached_requests": 10000, "max_spec_factor": 1.0, "max_spec_offset": 0.0,
          "min_token_prob": 0.1, "max_model_len": None, "runner": "v1", "draft_k": [1, 2, 3, 4]}


def test_an_unlimited_suffix_cache_exports_the_largest_cache_vllm_accepts_and_says_so(mtp_reading):
    # vllm/config/speculative.py:1746-1750: suffix_decoding_max_cached_requests must be >= 0; Arctic's cache takes
    # at most 0x7FFFFFFF (arctic_inference/suffix_decoding/cache.py), never evicting below it
    config = vllm_speculative_config(4, "suffix", {**SUFFIX, "max_cached_requests": -1})
    assert config["suffix_decoding_max_cached_requests"] == UNLIMITED_CACHED_REQUESTS == 2 ** 31 - 1
    assert "max_spec_offset" not in json.dumps(config)
    manifest = {**mtp_reading.report.manifest, "drafters": {"suffix": {**SUFFIX, "max_cached_requests": -1}}}
    report = replace(mtp_reading.report, drafter="suffix", manifest=manifest)
    doc = json.loads(export(Reading(run=mtp_reading.run, report=report, comparison=None), "vllm"))
    assert doc["speculative_config"]["suffix_decoding_max_cached_requests"] == UNLIMITED_CACHED_REQUESTS
    assert any("no limit" in note for note in doc["notes"])
    assert '"suffix_decoding_max_cached_requests": 2147483647' in serve_lines(report)[0]


def test_a_suffix_run_with_a_spec_offset_is_refused_by_the_vllm_export_in_one_line_naming_the_option(mtp_reading):
    manifest = {**mtp_reading.report.manifest, "drafters": {"suffix": {**SUFFIX, "max_spec_offset": 2.0}}}
    report = replace(mtp_reading.report, drafter="suffix", manifest=manifest)
    with pytest.raises(OptionError, match="--suffix-max-spec-offset 2") as refused:
        export(Reading(run=mtp_reading.run, report=report, comparison=None), "vllm")
    assert "\n" not in str(refused.value)
    line = serve_lines(report)[0]
    assert "no engine flag" in line and "--suffix-max-spec-offset 2" in line and "speculative-config" not in line


def test_the_dynamic_schedule_is_exported_with_the_limits_where_vllm_drops_it(mtp_reading):
    report = mtp_reading.report
    scheduled = replace(report, batch=replace(report.batch, schedule=((1, 15, 3), (16, 128, 1))))
    doc = json.loads(export(Reading(run=mtp_reading.run, report=scheduled, comparison=None), "vllm"))
    limits = doc["dynamic_speculative_config_limits"]
    assert "data parallelism" in limits and "suffix decoding" in limits
    assert any("dropped under data parallelism" in line for line in serve_lines(scheduled))


def test_a_version_2_run_is_read_with_notes_of_what_it_lacks_and_its_drafts_end_at_the_end_of_their_turn(
        variable_run, tmp_path):
    import shutil

    import pyarrow.parquet as pq

    old = tmp_path / "v2"
    shutil.copytree(variable_run, old)
    for part in (old / "positions.parquet").glob("*.parquet"):  # a version-2 run had no draft_len, no runner
        pq.write_table(pq.read_table(part).drop_columns(["draft_len"]), part)
    manifest = json.loads((old / "run.json").read_text())
    manifest["schema_version"] = 2
    manifest.pop("serving", None)
    for about in manifest["drafters"].values():
        about.pop("runner", None)
    (old / "run.json").write_text(json.dumps(manifest))
    reading = read_and_summarize(old, drafter="suffix", replicates=20)
    notes = " ".join(reading.report.notes)
    assert "before schema_version 3 (it is 2): its n-gram rows follow vLLM's V1 proposer" in notes
    assert "suffix's drafts have no recorded lengths" in notes and "a lower bound" in notes
    # the drafts read to end at the end of their turn: the steps with a draft are the same, the draft tokens
    # of a turn's last steps fewer (a lower bound), never more
    now, then = engine_numbers(read_and_summarize(variable_run, drafter="suffix", replicates=20).report, K), \
        engine_numbers(reading.report, K)
    assert then.steps == now.steps and then.per_pos_counts == now.per_pos_counts
    assert then.draft_tokens <= now.draft_tokens
    doc = json.loads(export(reading, "vllm", K))  # and it still exports
    assert doc["speculative_config"]["method"] == "suffix"


def test_compare_judges_a_model_free_drafter_over_the_steps_that_drafted(variable_run, tmp_path):
    drafter = "suffix"  # fewer than K tokens at some steps, none at others (n-gram's in the engine suite)
    import subprocess
    import sys

    from .test_engines import prometheus

    n = engine_numbers(read_and_summarize(variable_run, drafter=drafter, replicates=50).report, K)
    assert n.variable_length

    def compare(text: str):
        (tmp_path / "metrics.txt").write_text(text)
        return subprocess.run([sys.executable, "-m", "mtp_observe", "compare", str(variable_run), "--engine-metrics",
                               str(tmp_path / "metrics.txt"), "--drafter", drafter, "--replicates", "50"],
                              capture_output=True, text=True)

    same = compare(prometheus(n))  # the run's per-position rates over its steps with a draft
    assert same.returncode == 0 and "AGREES" in same.stdout and "DISAGREES" not in same.stdout, (same.stdout, same.stderr)
    lower = compare(prometheus(n, shift=-0.05))
    assert lower.returncode == 1 and "DISAGREES" in lower.stdout, (lower.stdout, lower.stderr)
