"""`compare` catches a real engine bug: vLLM with the plugin's fix (b) taken out (MTP_OBSERVE_VLLM_FIXES without
`expand`; docs/engine-fidelity.md, defect (b): the CPU expand kernel never writes the per-token temperature / top-p /
top-k, so every sampled speculative step reads uninitialised memory) runs MTP at T = 1.0, and its own counters,
read from the Prometheus text vLLM's registry holds (what /metrics serves), disagree with the replay of the very
tokens it emitted. The uninitialised memory makes the engine's numbers vary from run to run (by hand once:
0.060 / 0.033 / 0.022 against 0.41 / 0.26 / 0.19): the test asserts DISAGREES, not values.
"""

from __future__ import annotations

import pytest

from .conftest import SAMPLERS, _engine_run, engine_env, replay_engine_counts
from .model_free import compare_on_exposition

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def broken_engine_run(engine_python, demo_turns, tmp_path_factory) -> dict:
    return _engine_run(engine_python, demo_turns[1], tmp_path_factory.mktemp("engine-mtp-defect-b"), "mtp",
                       {"t1": SAMPLERS["t1"]}, env=engine_env(MTP_OBSERVE_VLLM_FIXES="gdn_prefill,spec_conv"),
                       exposition=True)


def test_compare_says_disagrees_on_the_engine_with_defect_b_left_in(broken_engine_run, demo_turns):
    assert broken_engine_run["fixes"] == ["gdn_prefill", "spec_conv"]  # (b) left in
    keys, prompts = demo_turns
    run = broken_engine_run["runs"][0]
    run_dir, expected = replay_engine_counts(run, keys, prompts, broken_engine_run["work"], "t1")
    n = run["counters"]["num_drafts"]
    print("engine", [c / n for c in run["counters"]["num_accepted_tokens_per_pos"]],
          "replay", expected["per_position_acceptance_rate"])
    done = compare_on_exposition(run["metrics_text"], run_dir, "mtp")
    assert done.returncode == 1 and "DISAGREES" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
