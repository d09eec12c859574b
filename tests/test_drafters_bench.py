"""The model-free drafters' benchmark runs end to end on the demo sessions and reports every figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_the_drafters_benchmark_reports_time_memory_and_acceptance_on_the_demo_sessions(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "drafters_bench.py"), "--input", *map(str, sorted((ROOT / "sessions").glob("*.jsonl"))),
         "--k", "3", "--drafters", "load,ngram,suffix-by-k", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["k"] == 3 and result["requests"] > 10 and result["tokens"] > 10_000
    load, ngram, suffix = result["drafters"]
    assert [d["drafter"] for d in result["drafters"]] == ["load", "ngram", "suffix-by-k"]
    for d in (ngram, suffix):
        assert d["anchors"] > 1000 and d["drafting_s"] > 0 and d["peak_rss_mb"] >= load["peak_rss_mb"] > 0
        assert len(d["tau_sim"]) == 3 and all(1 <= t <= k + 1 for k, t in enumerate(d["tau_sim"], 1))
        assert 0 < d["alpha_1"] <= d["proposed"] <= 1
    assert suffix["tau_sim"][-1] == suffix["tau_sim_truncated"][-1] and suffix["not_a_prefix"][-1] == 0
    assert "tau_sim" in proc.stdout


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_the_model_free_replay_benchmark_times_replay_and_report_and_their_peak_memory(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "model_free_replay_bench.py"), "--k", "3",
         "--input", *map(str, sorted((ROOT / "sessions").glob("*.jsonl"))), "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["drafters"] == ["ngram", "suffix"] and result["sessions"] == 7 and result["skipped"] == 0
    assert result["anchors"] > 1000 and result["rows"] > result["anchors"] * 3  # ngram K rows + suffix 1+2+3
    assert result["replay_s"] > 0 and result["report_s"] > 0 and result["replay_peak_rss_mb"] > 50
    assert result["report_peak_rss_mb"] > 50 and 0 < result["replay_cpu_s"] and 0 < result["report_cpu_s"]
    assert set(result["drafting"]) == {"ngram", "suffix"} and all(t["seconds"] > 0 for t in result["drafting"].values())
    for name in ("ngram", "suffix"):
        assert len(result["tau_sim"][name]) == 3 and all(1 <= t <= k + 1 for k, t in enumerate(result["tau_sim"][name], 1))
    assert "peak RSS" in proc.stdout
