"""compare refuses what cannot be a measurement (#27 item 2): counters that are not finite, non-negative whole counts,
per-position counts above the drafts or increasing, accepted tokens above the drafted ones, an SGLang accept len below
1, a mean acceptance length outside [1, K+1], malformed per-request JSON — one line naming the value and where it is,
exit 2, never AGREES or DISAGREES. Several scrapes of one counter are differenced in time order, never summed."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from mtp_observe.engines.exports import read_engine_metrics
from mtp_observe.engines.numbers import engine_numbers
from mtp_observe.errors import EngineMetricsError
from mtp_observe.report import read_and_summarize

from .fuzzing import run_cli
from .handmade import random_sessions, write_run

REPLICATES = 200


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """40 sessions, K = 4: intervals a few points wide."""
    return write_run(tmp_path_factory.mktemp("counters") / "run", random_sessions(40, 4, 0.7, seed=1, off_policy_rate=0.02),
                     k=4, draft_cost=0.08)


@pytest.fixture(scope="module")
def numbers(run_dir):
    return engine_numbers(read_and_summarize(run_dir, replicates=REPLICATES).report)


def scrape(drafts, draft_tokens, accepted, per_pos, stamp: str = "") -> str:
    """One /metrics scrape as vLLM's prometheus_client writes it (the _total form, a _created sample beside each)."""
    lines = ["# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.", "# TYPE vllm:spec_decode_num_drafts counter"]
    labels = 'engine="0",model_name="Qwen/Qwen3.5-0.8B"'
    for name, value in (("num_drafts", drafts), ("num_draft_tokens", draft_tokens), ("num_accepted_tokens", accepted)):
        lines += [f"vllm:spec_decode_{name}_total{{{labels}}} {value}{stamp}", f"vllm:spec_decode_{name}_created{{{labels}}} 1.7e9"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{p}"}} {v}{stamp}' for p, v in enumerate(per_pos)]
    return "\n".join(lines) + "\n"


def counts_of(n, scale: int = 10):
    """The run's own engine counts, `scale` times over: (drafts, draft tokens, accepted, per_pos)."""
    per_pos = [c * scale for c in n.per_pos_counts]
    return n.steps * scale, n.k * n.steps * scale, sum(per_pos), per_pos


def compare(run_dir, tmp_path, text: str, *extra: str, name: str = "m.txt"):
    path = tmp_path / name
    path.write_text(text)
    return (path, *run_cli(["compare", str(run_dir), "--engine-metrics", str(path), "--replicates", str(REPLICATES), *extra]))


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if needle in line)


BAD_SCRAPES = {  # (what to change in the run's own counts, the value the refusal names, the counter whose line it names)
    "NaN drafts": (lambda d, t, a, p: ("NaN", t, a, p), "is nan, not a count", "num_drafts_total{"),
    "infinite accepted": (lambda d, t, a, p: (d, t, "+Inf", p), "is inf, not a count", "num_accepted_tokens_total{"),
    "-Inf draft tokens": (lambda d, t, a, p: (d, "-Inf", a, p), "is -inf, not a count", "num_draft_tokens_total{"),
    "negative per-position count": (lambda d, t, a, p: (d, t, a, p[:-1] + [-3]), "is -3, a negative count", 'position="3"'),
    "fractional drafts": (lambda d, t, a, p: (d + 0.5, t, a, p), "not a whole number of events", "num_drafts_total{"),
    "per-position above drafts": (lambda d, t, a, p: (d, t, a - p[0] + d + 1, [d + 1] + p[1:]), "above vllm:spec_decode_num_drafts", 'position="0"'),
    "per-position increasing": (lambda d, t, a, p: (d, t, a - p[2] + p[1] + 1, p[:2] + [p[1] + 1] + p[3:]), "more than position 1",
                                'position="2"'),
    "accepted above drafted": (lambda d, t, a, p: (d, a - 1, a, p), "above vllm:spec_decode_num_draft_tokens",
                               "num_accepted_tokens_total{"),
    "accepted not the per-position sum": (lambda d, t, a, p: (d, t, a - 1, p), "add up to", "num_accepted_tokens_total{"),
}


@pytest.mark.parametrize("case", list(BAD_SCRAPES))
def test_counters_that_cannot_be_a_measurement_are_refused_in_one_line_naming_the_value_and_its_line(run_dir, numbers,
                                                                                                     tmp_path, case):
    change, said, where = BAD_SCRAPES[case]
    text = scrape(*change(*counts_of(numbers)))
    path, code, out, err = compare(run_dir, tmp_path, text)
    assert code == 2 and "AGREES" not in out and "DISAGREES" not in out, (code, out, err)
    [line] = err.strip().splitlines()
    assert line.startswith(f"error: {path}:{_line_of(text, where)}: ") and said in line, line


def test_two_scrapes_are_read_as_the_window_between_them_in_time_order_never_summed(run_dir, numbers, tmp_path):
    """Scrapes before and after the run's traffic: the window holds exactly the run's counts (AGREES); summed, the
    earlier traffic (of another acceptance) would be counted in. With timestamps, the time order decides."""
    d, t, a, p = counts_of(numbers)
    before = (1000, 4000, 1000, [1000, 0, 0, 0])  # earlier traffic: every first draft accepted, nothing after
    after = (before[0] + d, before[1] + t, before[2] + a, [x + y for x, y in zip(before[3], p)])
    path, code, out, err = compare(run_dir, tmp_path, scrape(*before) + scrape(*after))
    assert code == 0 and "AGREES" in out and "the window between 2 scrapes" in out, (out, err)
    measured = read_engine_metrics(scrape(*after, stamp=" 1700000600000") + scrape(*before, stamp=" 1700000000000"), "m")
    assert measured.steps == d and list(measured.per_position) == pytest.approx([c / d for c in p])
    assert "the window between 2 scrapes (from line 15 to line 3)" in measured.detail
    path, code, out, err = compare(run_dir, tmp_path, scrape(*after) + scrape(*before))  # the engine restarted between
    assert code == 2 and "falls from" in err and "restarted" in err and "AGREES" not in out, err
    path, code, out, err = compare(run_dir, tmp_path, scrape(*after) + scrape(*before).split("\n", 3)[3])  # a cut scrape
    assert code == 2 and "not whole scrapes" in err, err


def sglang(*values: str) -> str:
    return "".join(f"[2026-12-01 10:00:0{i}] Decode batch. #running-req: 3, #token: 900, token usage: 0.01, accept len: {v}, "
                   "gen throughput (token/s): 80.1\n" for i, v in enumerate(values))


def test_an_sglang_accept_len_below_1_or_past_k_plus_1_is_refused(run_dir, numbers, tmp_path):
    good = f"{numbers.mean_acceptance_length:.2f}"
    for values, said in (((good, "0.50"), ":2: accept len 0.50: an acceptance length is a finite number of at least 1"),
                         (("nan", good), ":1: accept len nan"), ((good, "-1.00"), ":2: accept len -1.00")):
        path, code, out, err = compare(run_dir, tmp_path, sglang(*values), "--k", "2", name="sglang.log")
        assert code == 2 and err.strip().startswith(f"error: {path}{said}") and "AGREES" not in out, err
        assert len(err.strip().splitlines()) == 1
    path, code, out, err = compare(run_dir, tmp_path, sglang("3.60", "3.40"), "--k", "2", name="sglang.log")
    assert code == 2 and "mean acceptance length 3.500" in err and "outside [1, 3]" in err and "AGREES" not in out, err
    assert len(err.strip().splitlines()) == 1


def response(histogram, k, **more) -> dict:
    return {"choices": [], "metrics": {"speculative_decoding": {"acceptance_histogram": histogram, "num_spec_tokens": k, **more}}}


PER_REQUEST = {
    "metrics not an object": ('{"metrics": [1, 2]}', "response 1: metrics is a list, not an object"),
    "1e400": ('{"metrics": {"speculative_decoding": {"acceptance_histogram": [1e400, 1], "num_spec_tokens": 1}}}',
              "acceptance_histogram[0] is inf, not a count"),
    "a boolean count": (json.dumps(response([True, 1], 1)), "acceptance_histogram[0] is a boolean, not a count"),
    "num_spec_tokens 10^12": (json.dumps(response([5, 1], 10 ** 12)),
                              "acceptance_histogram has 2 entries where num_spec_tokens 1,000,000,000,000 makes"),
    "100k-deep nesting": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "steps that are not the histogram's": (json.dumps(response([5, 1], 1, num_spec_steps=7)),
                                           "num_spec_steps is 7, but its acceptance_histogram makes 6"),
    "a fraction of a step": (json.dumps(response([5.5, 1], 1)), "not a whole number of events"),
}


@pytest.mark.parametrize("case", list(PER_REQUEST))
def test_malformed_per_request_json_is_one_line_with_bounded_memory(run_dir, tmp_path, case):
    text, said = PER_REQUEST[case]
    tracemalloc.start()
    try:
        with pytest.raises(EngineMetricsError) as refused:
            read_engine_metrics(text, "r.jsonl")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert said in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
    assert peak < 50 * len(text) + 10_000_000, peak  # the file's size, not what it claims
    path, code, out, err = compare(run_dir, tmp_path, text, name="r.jsonl")
    assert code == 2 and err.strip().startswith(f"error: {path}") and said in err and "AGREES" not in out, err


def test_the_documented_per_request_example_reads_as_vllm_defines_it():
    # vllm docs/features/speculative_decoding/acceptance_metrics.md's summary response
    example = response([39, 1, 0, 3], 3, mean_acceptance_length=1.2325581395348837, num_spec_steps=43,
                       num_accepted_draft_tokens=10, num_draft_tokens=129)
    measured = read_engine_metrics(json.dumps(example), "r.json")
    assert measured.k == 3 and measured.steps == 43 and measured.mean_acceptance_length == pytest.approx(1.2325581395348837)
    assert list(measured.per_position) == pytest.approx([4 / 43, 3 / 43, 3 / 43])
