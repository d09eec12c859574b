"""The benchmark scripts run end to end (tiny workloads): a broken benchmark is a broken GPU check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_the_replay_benchmark_reports_every_figure_on_a_tiny_workload(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "replay_bench.py"), "--source", "generated", "--sessions", "2",
         "--vocab", "1000", "--threads", "1", "--k", "3", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["vocab"] == 1000 and result["sessions"] == 2 and result["k"] == 3
    assert result["requests"] >= 2 and 0 < result["new_tokens"] <= result["tokens"] and result["scored_tokens"] > 0
    assert result["replay_s"] > 0 and result["prefill_s"] > 0 and result["flop_floor_ratio"] > 1
    assert abs(result["ratio"] - result["replay_s"] / result["prefill_s"]) < 0.05
    assert result["peak_rss_gb"] > 0


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_the_sessions_benchmark_streams_a_generated_file_through_the_cli(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sessions_bench.py"), "--gb", "0.0005", "--keep", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "peak RSS" in proc.stdout and "sessions" in proc.stdout
    assert (tmp_path / "big.jsonl").stat().st_size >= 500_000


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_the_corpus_benchmark_imports_and_renders_the_folders_it_is_given(tmp_path):
    from .conftest import SESSIONS_PUBLIC

    if SESSIONS_PUBLIC is None:
        import pytest

        pytest.skip("../shared/sessions-public is absent on this machine")
    out = tmp_path / "corpus.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "corpus_bench.py"), "--root", str(SESSIONS_PUBLIC),
         "--only", "openai-batch,otel-genai,litellm-standard-logging-payload", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [(r["folder"], r["formats"], r["sessions"]) for r in result["folders"]] == [
        ("litellm-standard-logging-payload", ["litellm"], 1), ("openai-batch", ["openai-batch"], 2), ("otel-genai", ["otel-genai"], 8),
        ("otel-genai (structured encoding)", ["otel-genai"], 8)]
    assert result["total"]["sessions"] == 19 and result["total"]["tokens"] > 0 and result["total"]["render_s"] > 0


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_the_fp8_distance_benchmark_compares_an_fp8_copy_with_the_original(make_checkpoint, tmp_path):
    from .test_replay import SESSION, write_sessions

    model = make_checkpoint(intermediate_size=200)
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    out = tmp_path / "fp8.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fp8_distance.py"), str(sessions), "--model", str(model),
                           "--k", "3", "--json", str(out)], capture_output=True, text=True, timeout=300)  # K = 3: its tau_sim_3
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["rows"] > 100 and set(result["variants"]) == {"fp8 weight-only", "fp8 W8A8 h100", "fp8 W8A8 b200"}
    for v in result["variants"].values():  # each serving of the FP8 copy against the original
        assert 0 < v["target_tokens_equal"] <= 1 and 0 < v["drafts_equal"] <= 1
        assert v["max_abs_d_target_logprob"] > 0  # FP8 is lossy: the copy is not the original


def test_the_nextn_roofline_at_real_sizes_matches_the_published_parameters_and_needs_more_than_a_node_in_bf16():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import nextn_roofline as bench
    finally:
        sys.path.pop(0)
    ds = bench.figures("DeepSeek-V3", "h200", 4096, 3)
    bf16, fp8 = ds["precisions"]["BF16"], ds["precisions"]["FP8"]
    head = bf16["head_params"]
    assert abs(head - 11.6e9) < 0.1e9  # README_WEIGHTS.md: 11.5B unique, without the shared embedding and head
    assert abs((bf16["total_params"] - head) / 671e9 - 1) < 0.01 and abs(bf16["active_params"] / 37e9 - 1) < 0.02
    assert bf16["kv_bytes_per_token"] == 61 * (512 + 64) * 2  # MLA's latent and rope key, BF16, every layer
    assert 0.49 < fp8["weight_bytes"] / bf16["weight_bytes"] < 0.52  # FP8 keeps the embedding, lm_head, eh_proj BF16
    assert bf16["replica_as_replayed"]["gpus"]["H200 141 GB"] == 11  # more than one 8-GPU node: FP8 is dequantised
    assert fp8["replica_weights_kept"]["gpus"]["H200 141 GB"] == 6
    for s in bf16["steps"]:
        assert s["draft_ms"] < s["decode_ms"] <= s["verify_ms"]
    for name in ("GLM-4.5", "GLM-4.5-Air"):
        f = bench.figures(name)
        p = f["precisions"]["BF16"]
        total, active = f["published_params"]
        assert f["unconfirmed_config"] and abs((p["total_params"] - p["head_params"]) / total - 1) < 0.02
        assert abs(p["active_params"] / active - 1) < 0.08
    assert "| B | decode (ms) |" in bench.markdown(ds)


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_the_what_if_benchmark_times_the_precisions_against_the_plain_replay(tmp_path):
    out = tmp_path / "whatifs.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "whatifs_bench.py"), "--sessions", "1", "--k", "2",
         "--precisions", "bf16,q8_0", "--draft-p-min", "0.5", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["sessions"] == 1 and result["precisions"] == ["bf16", "q8_0"] and result["draft_p_min"] == [0.5]
    assert result["plain_cpu_s"] > 0 and result["whatif_cpu_s"] > 0 and result["confidence_only_cpu_s"] > 0
    assert result["target_forwards"]["plain"] == result["target_forwards"]["whatif"] > 0  # the target runs once
    assert result["report_cpu_s"]["with_thresholds"] > 0
