"""compare --traffic other: an engine that served another sample of the same prompts agrees within a two-sample
band (the run's bootstrap over sessions, the engine's counting noise), and the output says what size of
difference it could detect.

Twelve one-turn sessions (single-turn sessions count as sessions: enough for a bootstrap over sessions), each a
user message of the demo sessions; `generate --speculative 3` completes them twice on the bundled model, seeds 1
and 2 (the checkpoint's generation_config sampler). The first loop's text is replayed: that is the run. The second
loop is the engine: its kept drafts, counted as vLLM counts them, are its /metrics.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtp_observe.engines.check import check
from mtp_observe.engines.exports import read_engine_metrics
from mtp_observe.model.loading import default_model_dir
from mtp_observe.report import read_and_summarize
from mtp_observe.run.generation import GenerateOptions, generate
from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.pipeline import replay

from .fuzzing import run_cli
from .test_generation import loop_counters

ROOT = Path(__file__).resolve().parents[1]
K = 3
SESSIONS = 12
N_NEW = 40


@pytest.fixture(scope="module")
def loops(tmp_path_factory) -> dict:
    """{"run": the replay of seed 1's loop, "seed1": its records, "seed2": the second loop's records}."""
    work = tmp_path_factory.mktemp("loops")
    users = [m["content"] for name in ("coding", "support") for line in (ROOT / "sessions" / f"{name}.jsonl").open()
             for m in json.loads(line)["messages"] if m["role"] == "user" and m.get("content")]
    assert len(users) >= SESSIONS
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i:02d}", "messages": [
        {"role": "user", "content": users[i]}, {"role": "assistant", "content": "Done."}]}) + "\n" for i in range(SESSIONS)))
    out = {}
    for seed in (1, 2):
        out[f"seed{seed}"] = work / f"loop{seed}.jsonl"
        generate([prompts], default_model_dir(), out[f"seed{seed}"],
                 GenerateOptions(max_new_tokens=N_NEW, seed=seed, speculative=K, device="cpu"))
    out["run"] = replay([out["seed1"]], default_model_dir(), work / "run", ReplayOptions(k=K, device="cpu"))
    return out


def test_another_seed_over_the_same_prompts_agrees_under_traffic_other_and_the_detectable_difference_is_said(loops, tmp_path):
    report = read_and_summarize(loops["run"], replicates=300).report
    assert len(report.sessions) == SESSIONS and report.resampling.unit == "session"
    assert report.verdict.status in ("GO", "NO-GO"), report.verdict.reason  # the run's own traffic, enough sessions
    engine = tmp_path / "seed2.txt"
    engine.write_text(loop_counters(loops["seed2"]))
    r = run_cli(["compare", str(loops["run"]), "--engine-metrics", str(engine), "--traffic", "other", "--replicates", "300"])
    assert r[0] == 0, r
    lines = r[1].splitlines()
    assert lines[0].startswith(f"run verdict: {report.verdict.status} · K to run")
    assert any(line.startswith("detectable (95%): mean acceptance length ±") for line in lines), lines
    assert lines[-1].startswith("AGREES") and "other traffic" in lines[-1] and "does not predict" not in lines[-1]
    result = check(report, read_engine_metrics(engine.read_text(), "m"), traffic="other")
    same = check(report, read_engine_metrics(engine.read_text(), "m"), traffic="same")
    for o, s in zip(result.rows, same.rows):  # the two-sample band holds the run's sampling noise too: it is wider
        assert o.half_width > s.half_width and o.sampling > 0 and s.sampling == 0 and o.counting == pytest.approx(s.counting)


def test_the_loops_own_counters_agree_and_a_model_name_that_is_not_the_runs_is_one_warning(loops, tmp_path):
    own = tmp_path / "own.txt"
    own.write_text(loop_counters(loops["seed1"], model_name="Qwen/Qwen3.5-27B"))
    code, out, err = run_cli(["compare", str(loops["run"]), "--engine-metrics", str(own), "--replicates", "100"])
    assert code == 0 and "AGREES" in out, (out, err)
    (warning,) = err.strip().splitlines()
    assert warning.startswith("warning: the counters are labelled model_name='Qwen/Qwen3.5-27B'")
    named = tmp_path / "named.txt"
    named.write_text(loop_counters(loops["seed1"], model_name="default_model"))  # the run's checkpoint directory's name
    code, out, err = run_cli(["compare", str(loops["run"]), "--engine-metrics", str(named), "--replicates", "100"])
    assert code == 0 and err == ""
