"""The model-free drafters' benchmark runs end to end on the demo sessions and reports every figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
