"""Speaking the engines' language: `report`'s serve flags, `export --engine`, `compare --engine-metrics`.

The consumers' own parsers cannot be installed here (vLLM needs its CUDA build; Model-Optimizer's
speculation_profile.py exists only in open PRs; SGLang and TensorRT-LLM read environment variables), so
their checks are transcribed below, each beside the file it comes from (mtp_observe/engines/exports.py cites them
with the commit read).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from mtp_observe.engines.check import check
from mtp_observe.engines.exports import ENGINES, export, read_engine_metrics
from mtp_observe.engines.numbers import engine_numbers
from mtp_observe.errors import EngineMetricsError
from mtp_observe.report import read_and_summarize, report_json
from mtp_observe.report.metrics import visited_anchors_reference

from .handmade import random_sessions, write_run

REPO = Path(__file__).resolve().parents[1]
REPLICATES = 300


@pytest.fixture(scope="module")
def big_run(tmp_path_factory) -> Path:
    """40 sessions, K = 4, matches with probability 0.7 (intervals a few points wide)."""
    return write_run(tmp_path_factory.mktemp("engines") / "big", random_sessions(40, 4, 0.7, seed=1,
                                                                                   off_policy_rate=0.02),
                     k=4, draft_cost=0.08)


@pytest.fixture(scope="module")
def reading(big_run):
    return read_and_summarize(big_run, replicates=REPLICATES)


def cli(*args: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "mtp_observe", *args], capture_output=True, text=True, env=environment)


def env_lines(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


# ---------------------------------------------------------------------------------------------
# The numbers, as the engine counts them


def test_the_engine_counts_are_the_visited_anchors_of_every_turn_counted_by_a_plain_loop(reading):
    run, k = reading.run, reading.report.best_k
    steps, per_pos = 0, np.zeros(k, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(run.spans.end - run.spans.start)])
    for j in range(len(run.spans.start)):
        span = run.accepted_len[offsets[j]: offsets[j + 1]].tolist()
        for p in visited_anchors_reference(span, k):
            steps += 1
            per_pos[: min(span[p], k)] += 1  # a step accepting a drafts counts positions 1..a
    n = engine_numbers(reading.report, k)
    assert (n.steps, list(n.per_pos_counts)) == (steps, per_pos.tolist())
    assert n.draft_tokens == k * steps  # every step drafts K, the last of a turn too
    assert n.mean_acceptance_length == pytest.approx(1 + per_pos.sum() / steps)
    assert np.allclose(n.per_position, per_pos / steps)
    assert n.draft_acceptance_rate == pytest.approx(per_pos.sum() / (k * steps))
    assert sum(n.histogram) == steps and sum(j * h for j, h in enumerate(n.histogram)) == per_pos.sum()


def test_the_engine_counted_rates_differ_from_the_all_anchor_rates_and_are_reported_beside_them(reading):
    n = engine_numbers(reading.report)
    assert not np.allclose(n.per_position, n.accept_rate)  # two computations, not one
    assert n.mean_acceptance_length >= n.tau_sim  # the engine counts a + 1 where the decode emits a at a turn's end
    data = report_json(reading.report)["overall"]["value"]
    assert data["per_position_acceptance"][n.k - 1][: n.k] == pytest.approx(list(n.per_position))
    assert data["accept_rate"][: n.k] == pytest.approx(list(n.accept_rate))


def test_report_prints_the_serve_flags_of_its_verdict_and_the_engine_counted_numbers(big_run, reading):
    r = cli("report", str(big_run), "--replicates", str(REPLICATES), "--details")
    assert r.returncode == 0, r.stderr
    k = reading.report.verdict.run_k
    assert reading.report.verdict.serves and k == reading.report.best_k  # GO: the K to run is the best K
    n = engine_numbers(reading.report, k)
    assert f"""--speculative-config '{{"method": "mtp", "num_speculative_tokens": {k}}}'""" in r.stdout
    assert (f"--speculative-algorithm NEXTN --speculative-num-steps {k} --speculative-eagle-topk 1 "
            f"--speculative-num-draft-tokens {k + 1}") in r.stdout
    assert "as the engine counts them" in r.stdout and f"{n.mean_acceptance_length:.3f}" in r.stdout
    assert "per-position" in r.stdout


def test_the_serve_lines_say_what_each_verdict_stands_for(big_run, tmp_path):
    from dataclasses import replace

    from mtp_observe.report.flags import serve_lines, what_if_lines

    report = read_and_summarize(big_run, replicates=50).report
    k = report.best_k
    assert report.verdict.status == "GO" and report.verdict.run_k == k
    flags = f"""--speculative-config '{{"method": "mtp", "num_speculative_tokens": {k}}}'"""
    lines = serve_lines(report)
    assert lines[0].startswith(f"serve MTP at K={k}:") and flags in lines[0]
    assert f"--speculative-num-draft-tokens {k + 1}" in lines[1] and what_if_lines(report) == []
    for status in ("NO-GO", "UNRELIABLE"):  # nothing enables speculation; the what-if says it is not recommended
        other = replace(report, verdict=replace(report.verdict, status=status, run_k=0))
        assert serve_lines(other) == []
        (what_if,) = what_if_lines(other)
        assert what_if.startswith(f"not recommended ({status}, K to run 0): MTP at the best K={k} would be:") and flags in what_if


# ---------------------------------------------------------------------------------------------
# Exports: each parses, follows its consumer's checks, and carries the report's values


def test_every_export_carries_the_reports_values(reading):
    k = reading.report.best_k
    value = report_json(reading.report)["overall"]["value"]
    mal = value["mean_acceptance_length"][k - 1]
    marginal = value["per_position_acceptance"][k - 1][:k]
    vllm = json.loads(export(reading, "vllm"))
    assert vllm["synthetic_speculative_config"]["synthetic_acceptance_rates"] == [round(x, 6) for x in marginal]
    assert vllm["expected_metrics"]["mean_acceptance_length"] == round(mal, 6)
    assert vllm["expected_metrics"]["all_anchor"]["accept_rate"] == [round(x, 6) for x in value["accept_rate"][:k]]
    profile = json.loads(export(reading, "speculation-profile"))
    assert profile["marginal_accept_rates"] == [round(x, 6) for x in marginal]
    assert profile["mean_accept_length"] == round(mal, 6)
    assert profile["accept_length_by_k"] == {str(K): round(x, 6) for K, x in
                                             enumerate(value["mean_acceptance_length"], start=1)}
    assert float(env_lines(export(reading, "sglang"))["SGLANG_SIMULATE_ACC_LEN"]) == pytest.approx(mal, abs=1e-6)
    trt = float(env_lines(export(reading, "trtllm"))["TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS"])
    assert trt == pytest.approx(mal - 1, abs=1e-6)  # accepted drafts: TensorRT-LLM adds the target's token itself
    aic = yaml.safe_load(export(reading, "aiconfigurator"))
    assert aic == {"nextn": k, "nextn_accepted": pytest.approx(mal - 1, abs=1e-6)}


def test_the_vllm_export_passes_vllms_synthetic_acceptance_validation(reading):
    # vllm-project/vllm@002e77c1 vllm/config/speculative.py, _resolve_synthetic_acceptance_rates: length
    # num_speculative_tokens, entries in [0, 1], `rates[i] > rates[i - 1]` refused (no tolerance), exactly one of
    # synthetic_acceptance_rates / synthetic_acceptance_length, only with rejection_sample_method "synthetic".
    doc = json.loads(export(reading, "vllm"))
    cfg = doc["synthetic_speculative_config"]
    rates, n = cfg["synthetic_acceptance_rates"], cfg["num_speculative_tokens"]
    assert cfg["method"] == "mtp" and cfg["rejection_sample_method"] == "synthetic"
    assert len(rates) == n and all(0.0 <= r <= 1.0 for r in rates)
    assert not any(rates[i] > rates[i - 1] for i in range(1, n))
    assert "synthetic_acceptance_length" not in cfg
    assert doc["speculative_config"] == {"method": "mtp", "num_speculative_tokens": n}
    # vllm/v1/spec_decode/utils.py unconditional_to_conditional_rates: c_i = p_i / p_{i-1}; the sampler accepts
    # position i with c_i after i-1 accepted, so its expected per-position count is the product = p_i, and its
    # mean acceptance length 1 + Σ p_i is the one the export expects vLLM's metrics to show.
    conditional = [p / q if q > 0.0 else 0.0 for p, q in zip(rates, [1.0, *rates[:-1]])]
    assert np.allclose(np.cumprod(conditional), rates)
    assert 1 + sum(rates) == pytest.approx(doc["expected_metrics"]["mean_acceptance_length"], abs=1e-5)
    counts = doc["expected_metrics"]["counts"]
    assert counts["num_draft_tokens"] == n * counts["num_drafts"]


PROFILE_KEYS = {  # build_profile's return dict, examples/specdec_bench/specdec_bench/speculation_profile.py@edf879d3
    "schema_version", "measured", "method", "draft_checkpoint", "target_model", "num_speculative_tokens", "block_size",
    "max_supported_k", "verification_method", "conditional_accept_rates", "marginal_accept_rates", "mean_accept_length",
    "mean_accept_length_per_request", "accept_length_model", "accept_length_by_k", "acceptance_length_histogram",
    "per_category", "measurement_conditions", "validation",
}


def test_the_speculation_profile_passes_model_optimizers_checks(reading):
    """NVIDIA/Model-Optimizer examples/specdec_bench/specdec_bench/speculation_profile.py@edf879d3 (PR #2247),
    its checks transcribed: schema "1.0"; vectors of length K rounded to 6 places; marginal[i] = P(length >= i+2)
    from the acceptance-length histogram (_dense_survival); conditional = marginal[i] / marginal[i-1] (prev 1.0,
    0 after 0); mean = per-step histogram mean (per_step_mean_accept_length); _consistency_check (tolerance
    0.02) and _monotonicity_check (slack 1e-9); accept_length_by_k[str(K)] = the mean. And the issue's: marginal =
    cumulative product of conditional."""
    p = json.loads(export(reading, "speculation-profile"))
    assert set(p) == PROFILE_KEYS
    k = p["num_speculative_tokens"]
    assert p["schema_version"] == "1.0" and p["measured"] is True and p["verification_method"] == "longest_prefix"
    marginal, conditional = p["marginal_accept_rates"], p["conditional_accept_rates"]
    assert len(marginal) == len(conditional) == k and p["max_supported_k"] == k
    assert all(round(x, 6) == x for x in marginal + conditional)
    assert np.allclose(np.cumprod(conditional), marginal, atol=1e-5)  # marginal = cumulative product of conditional
    prev, expected_conditional = 1.0, []
    for m in marginal:
        expected_conditional.append(round(m / prev if prev > 0 else 0.0, 6))
        prev = m
    assert conditional == expected_conditional
    h = {int(length): count for length, count in p["acceptance_length_histogram"].items()}  # string keys post-JSON
    assert min(h) >= 1 and max(h) <= k + 1
    steps = sum(h.values())
    survival = [sum(c for length, c in h.items() if length >= i + 2) / steps for i in range(k)]
    assert marginal == [round(x, 6) for x in survival]
    mean = sum(length * c for length, c in h.items()) / steps
    assert p["mean_accept_length"] == round(mean, 6) and p["accept_length_by_k"][str(k)] == round(mean, 6)
    implied = 1.0 + sum(marginal)
    assert abs(implied - mean) <= 0.02
    assert not [i for i in range(1, k) if marginal[i] > marginal[i - 1] + 1e-9]
    v = p["validation"]
    assert v["mean_consistency"] == {"implied_mean_accept_length": round(implied, 6),
                                     "reported_mean_accept_length": round(mean, 6),
                                     "abs_delta": round(abs(implied - mean), 6), "tolerance": 0.02, "passed": True}
    assert v["marginal_monotonicity"] == {"passed": True, "violations": []}
    assert p["accept_length_model"] == "chain_analytic"
    assert set(p["per_category"]) <= set(reading.run.segments)
    assert all(1.0 <= x <= k + 1 for x in p["per_category"].values())


def test_the_environment_exports_stay_inside_what_the_engines_accept(reading):
    k = reading.report.best_k
    sg = env_lines(export(reading, "sglang"))
    # sglang/srt/speculative/spec_utils.py: a length including the bonus token, in [1, num_steps + 1]
    assert 1.0 <= float(sg["SGLANG_SIMULATE_ACC_LEN"]) <= k + 1 and sg["SGLANG_SIMULATE_ACC_METHOD"] == "match-expected"
    trt = env_lines(export(reading, "trtllm"))
    assert 0.0 < float(trt["TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS"]) <= k  # 0 is "off" in interface.py


def test_export_writes_the_file_named_by_o_and_refuses_an_unknown_engine(big_run, tmp_path):
    out = tmp_path / "speculation_profile.json"
    r = cli("export", str(big_run), "--engine", "speculation-profile", "-o", str(out), "--replicates", "50")
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["schema_version"] == "1.0"
    bad = cli("export", str(big_run), "--engine", "tgi")
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: --engine tgi: expected one of")
    assert set(ENGINES) == {"vllm", "sglang", "trtllm", "speculation-profile", "aiconfigurator"}
    k_out = cli("export", str(big_run), "--k", "9")
    assert k_out.returncode == 2 and "--k 9" in k_out.stderr


# ---------------------------------------------------------------------------------------------
# compare: the engine's counters against the run's intervals


def prometheus(n, shift: float = 0.0, total: bool = True, engines: int = 1) -> str:
    """vLLM's /metrics text for the counts of `n`, split over data-parallel engines, per-position rates shifted."""
    suffix = "_total" if total else ""
    lines = ["# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.",
             "# TYPE vllm:spec_decode_num_drafts counter"]
    drafts = n.steps * 10  # ten times the run's traffic: the same rates
    per_pos = [round((rate + shift) * drafts) for rate in n.per_position]
    values = {"num_drafts": drafts, "num_draft_tokens": n.k * drafts, "num_accepted_tokens": sum(per_pos)}
    for e in range(engines):
        labels = f'engine="{e}",model_name="Qwen/Qwen3.5-0.8B"'
        for name, v in values.items():
            part = v // engines + (v % engines if e == 0 else 0)
            lines.append(f"vllm:spec_decode_{name}{suffix}{{{labels}}} {float(part)}")
            lines.append(f"vllm:spec_decode_{name}_created{{{labels}}} 1.7e9")
        for pos, v in enumerate(per_pos):
            part = v // engines + (v % engines if e == 0 else 0)
            lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos{suffix}{{{labels},position="{pos}"}} {float(part)}')
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("total,engines", [(True, 1), (False, 1), (True, 2)])
def test_compare_on_prometheus_text_equal_to_the_run_exits_0(big_run, reading, tmp_path, total, engines):
    n = engine_numbers(reading.report)
    f = tmp_path / "metrics.txt"
    f.write_text(prometheus(n, total=total, engines=engines))
    measured = read_engine_metrics(f.read_text(), str(f))
    assert measured.k == n.k and np.allclose(measured.per_position, n.per_position, atol=1e-3)
    r = cli("compare", str(big_run), "--engine-metrics", str(f), "--replicates", str(REPLICATES))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "AGREES" in r.stdout and "DISAGREES" not in r.stdout


def test_compare_on_prometheus_text_ten_points_lower_exits_1_with_the_reason(big_run, reading, tmp_path):
    n = engine_numbers(reading.report)
    f = tmp_path / "metrics.txt"
    f.write_text(prometheus(n, shift=-0.10))
    r = cli("compare", str(big_run), "--engine-metrics", str(f), "--replicates", str(REPLICATES))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "DISAGREES" in r.stdout and "differ from the run's by more than the engine's counting noise" in r.stdout
    assert "engine or checkpoint bug" in r.stdout and r.stdout.startswith("run verdict: GO · K to run: 4")
    result = check(reading.report, read_engine_metrics(f.read_text(), str(f)))
    assert not any(row.within for row in result.rows)  # every position and the mean acceptance length


def test_compare_opens_with_the_verdict_report_gives_under_the_same_options(big_run, reading, tmp_path):
    f = tmp_path / "metrics.txt"
    f.write_text(prometheus(engine_numbers(reading.report)))
    for options, status in ((("--gate", "speedup>=9"), "NO-GO"), (("--min-sessions", "50"), "UNRELIABLE")):
        data = json.loads(cli("report", str(big_run), *options, "--format", "json", "--replicates", "50").stdout)
        assert data["verdict"]["status"] == status and data["verdict"]["run_k"] == 0
        r = cli("compare", str(big_run), "--engine-metrics", str(f), *options, "--replicates", "50")
        # the header is the report's verdict; on the very tokens, too few sessions or a gate not cleared do not
        # stop the counters from agreeing with the run
        assert r.returncode == 0 and r.stdout.startswith(f"run verdict: {data['verdict']['headline']}"), (r.stdout, r.stderr)
        assert "AGREES" in r.stdout and "does not predict" not in r.stdout
    other = cli("compare", str(big_run), "--engine-metrics", str(f), "--min-sessions", "50", "--traffic", "other",
                "--replicates", "50")  # for other traffic, 40 sessions below --min-sessions 50 do not speak for it
    assert other.returncode == 0 and "does not predict the engine's traffic" in other.stdout, other.stdout


def test_on_an_unreliable_run_compare_says_the_run_does_not_predict_the_engines_traffic(tmp_path):
    foreign = {"thinking": (0.9, 0.4, 0.5, 0.2), "instruct": (1.0, 0.8, 0.5, 0.2), "greedy": (0.55, 0.55, 1.0, 0.0)}
    run = write_run(tmp_path / "foreign", random_sessions(40, 4, 0.7, seed=1, fit_rates=foreign), k=4, draft_cost=0.08)
    report = read_and_summarize(run, replicates=REPLICATES).report
    assert report.verdict.status == "UNRELIABLE" and [c.name for c in report.verdict.causes] == ["sampler"]
    f = tmp_path / "metrics.txt"
    f.write_text(prometheus(engine_numbers(report), shift=-0.10))
    for traffic in ("same", "other"):
        r = cli("compare", str(run), "--engine-metrics", str(f), "--traffic", traffic, "--replicates", str(REPLICATES))
        assert r.returncode == 1 and "DISAGREES" in r.stdout, (r.stdout, r.stderr)
        assert r.stdout.startswith("run verdict: UNRELIABLE · K to run: 0")
        assert "does not predict the engine's traffic" in r.stdout and "says nothing about the engine" in r.stdout
        assert "engine or checkpoint bug" not in r.stdout and "mtp-observe generate" in r.stdout  # its next step


def test_compare_reads_vllm_per_request_responses_and_sglang_log_lines(reading):
    n = engine_numbers(reading.report)
    # vllm-project/vllm docs/features/speculative_decoding/acceptance_metrics.md: the response's metrics object
    half = [h // 2 for h in n.histogram]
    responses = [{"choices": [], "metrics": {"speculative_decoding": {
        "acceptance_histogram": list(h), "num_spec_tokens": n.k, "num_spec_steps": sum(h)}}}
        for h in (half, [a - b for a, b in zip(n.histogram, half)])]
    measured = read_engine_metrics("\n".join(json.dumps(r) for r in responses), "responses.jsonl")
    assert measured.source == "vllm-per-request" and measured.k == n.k
    assert np.allclose(measured.per_position, n.per_position)
    assert measured.mean_acceptance_length == pytest.approx(n.mean_acceptance_length)
    assert check(reading.report, measured).agrees
    log = "\n".join(f"[2026-12-01 10:00:0{i}] Decode batch. #running-req: 3, #token: 900, token usage: 0.01, "
                    f"accept len: {n.mean_acceptance_length + d:.2f}, gen throughput (token/s): 80.1" for i, d in
                    enumerate((-0.01, 0.0, 0.01)))
    sg = read_engine_metrics(log, "sglang.log")
    assert sg.source == "sglang-log" and sg.per_position is None
    result = check(reading.report, sg, k=n.k)
    assert result.agrees and [row.name for row in result.rows] == ["mean acceptance length"]
    far = read_engine_metrics(f"Decode batch. #running-req: 1, accept len: {n.mean_acceptance_length - 0.5:.2f}, ", "s")
    assert not check(reading.report, far, k=n.k).agrees


@pytest.mark.parametrize("text,expected", [
    ("hello\n", "neither vLLM /metrics text"),
    ('vllm:spec_decode_num_drafts_total{engine="0"} 5\n', "no vllm:spec_decode_num_draft_tokens"),
    ('vllm:spec_decode_num_drafts_total{engine="0" 5\n', "not a Prometheus sample line"),
    ('vllm:spec_decode_num_drafts_total 10\nvllm:spec_decode_num_draft_tokens_total 25\n'
     'vllm:spec_decode_num_accepted_tokens_total 5\nvllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 3\n'
     'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 2\n', "not 1 to 2 per draft"),
    ('{"metrics": {"speculative_decoding": null}}', "no metrics.speculative_decoding"),
])
def test_an_unreadable_engine_metrics_file_is_one_line_naming_it(text, expected):
    with pytest.raises(EngineMetricsError, match=expected):
        read_engine_metrics(text, "m.txt")


def test_compare_refuses_an_engine_k_past_the_runs_and_a_missing_file_in_one_line(big_run, reading, tmp_path):
    n = engine_numbers(reading.report)
    f = tmp_path / "m.txt"
    per_pos = "".join(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{p}"}} 1\n' for p in range(6))
    f.write_text(f"vllm:spec_decode_num_drafts_total 10\nvllm:spec_decode_num_draft_tokens_total 60\n"
                 f"vllm:spec_decode_num_accepted_tokens_total 6\n{per_pos}")
    r = cli("compare", str(big_run), "--engine-metrics", str(f), "--replicates", "20")
    assert r.returncode == 2 and "K=6" in r.stderr and f"up to K={n.k}" in r.stderr and len(r.stderr.splitlines()) == 1
    missing = cli("compare", str(big_run), "--engine-metrics", str(tmp_path / "nope.txt"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_compare_refuses_mtp_counters_whose_drafts_are_not_k_each_in_one_line(big_run, reading, tmp_path):
    n = engine_numbers(reading.report)
    text = prometheus(n)
    full = f"vllm:spec_decode_num_draft_tokens_total{{engine=\"0\",model_name=\"Qwen/Qwen3.5-0.8B\"}} {float(n.k * n.steps * 10)}"
    assert full in text
    f = tmp_path / "m.txt"
    f.write_text(text.replace(full, full.replace(f" {float(n.k * n.steps * 10)}", f" {float(n.k * n.steps * 10 - 7)}")))
    r = cli("compare", str(big_run), "--engine-metrics", str(f), "--replicates", "20")
    assert r.returncode == 2 and "dynamic speculative decoding" in r.stderr and len(r.stderr.splitlines()) == 1


def test_a_model_free_drafter_gets_its_own_vllm_config_a_hybrid_none_and_compare_refuses_one_without_draft_lengths(
        reading):
    # vllm/config/speculative.py: method "ngram" with prompt_lookup_min / prompt_lookup_max; method "suffix" with
    # suffix_decoding_max_tree_depth / _max_cached_requests / _max_spec_factor / _min_token_prob.
    from dataclasses import replace

    from mtp_observe.errors import OptionError
    from mtp_observe.report.flags import serve_lines

    report = reading.report
    k = report.best_k
    drafters = {"ngram": {"prompt_lookup_min": 3, "prompt_lookup_max": 5, "max_model_len": None, "draft_k": [4]},
                "suffix": {"max_tree_depth": 24, "max_cached_requests": 10000, "max_spec_factor": 1.0,
                           "max_spec_offset": 0.0, "min_token_prob": 0.1, "max_model_len": None, "draft_k": [1, 2, 3, 4]},
                "hybrid": {"policy": "arctic"}}
    manifest = {**report.manifest, "drafters": drafters}

    def lines(name):
        return serve_lines(replace(report, drafter=name, manifest=manifest))

    ngram = lines("ngram")
    assert (f"""'{{"method": "ngram", "num_speculative_tokens": {k}, "prompt_lookup_min": 3, "prompt_lookup_max": 5}}'"""
            in ngram[0]) and len(ngram) == 1  # no SGLang line: its n-gram keys are not mapped
    assert (f"""'{{"method": "suffix", "num_speculative_tokens": {k}, "suffix_decoding_max_tree_depth": 24, """
            """"suffix_decoding_max_cached_requests": 10000, "suffix_decoding_max_spec_factor": 1.0, """
            """"suffix_decoding_min_token_prob": 0.1}'""") in lines("suffix")[0]
    assert "no engine flag" in lines("hybrid")[0]
    mtp_only = read_engine_metrics(prometheus(engine_numbers(report)), "m.txt")
    with pytest.raises(OptionError, match="the run has no draft lengths"):  # a hand run: no draft_len column
        check(replace(report, drafter="ngram", manifest=manifest), mtp_only)


def test_a_schedule_over_batch_sizes_becomes_vllms_dynamic_config_in_the_report_and_the_export(reading):
    # vllm/config/speculative.py num_speculative_tokens_per_batch_size: inclusive (start, end, K) ranges from 1,
    # sorted, K capped at num_speculative_tokens; with synthetic acceptance the rates are num_speculative_tokens long.
    from dataclasses import replace

    from mtp_observe.report import Reading
    from mtp_observe.report.flags import serve_lines

    report = reading.report
    assert report.batch is not None and len(report.batch.schedule) == 1  # one batch size: the static config only
    assert not any("dynamic" in line for line in serve_lines(report))
    assert "dynamic_speculative_config" not in json.loads(export(reading, "vllm"))
    schedule = ((1, 15, 3), (16, 128, 1))
    scheduled = replace(report, batch=replace(report.batch, schedule=schedule))
    dynamic = {"method": "mtp", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 15, 3], [16, 128, 1]]}
    assert any(f"--speculative-config '{json.dumps(dynamic)}'" in line for line in serve_lines(scheduled))
    doc = json.loads(export(Reading(run=reading.run, report=scheduled, comparison=None), "vllm"))
    assert doc["dynamic_speculative_config"] == dynamic
    synthetic = doc["dynamic_synthetic_speculative_config"]
    assert synthetic["num_speculative_tokens_per_batch_size"] == dynamic["num_speculative_tokens_per_batch_size"]
    n = engine_numbers(report, 3)  # the schedule's largest K, whatever the best K
    assert synthetic["synthetic_acceptance_rates"] == [round(float(x), 6) for x in n.per_position]
    assert doc["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 3}


def test_export_and_compare_import_no_torch(big_run, reading, tmp_path):
    metrics = tmp_path / "metrics.txt"
    metrics.write_text(prometheus(engine_numbers(reading.report)))
    code = f"""
import sys
from mtp_observe.cli import main
for argv in (["export", {str(big_run)!r}, "--engine", "speculation-profile", "-o", {str(tmp_path / 'p.json')!r},
              "--replicates", "20"],
             ["compare", {str(big_run)!r}, "--engine-metrics", {str(metrics)!r}, "--replicates", "50"]):
    try:
        main(argv)
    except SystemExit as e:
        assert e.code == 0, e.code
import mtp_observe.engines.exports
assert "torch" not in sys.modules and "transformers" not in sys.modules, "export or compare imported torch"
print("no torch")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0 and "no torch" in r.stdout, (r.stdout, r.stderr)
