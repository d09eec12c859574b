"""vLLM's n-gram speculative decoding (the V1 CPU proposer vLLM-CPU runs) against the replay of its tokens.

This engine run needs fix (c) of the plugin: without it the torch fallback's conv roll crashes on the first step
that verifies fewer than K + 1 tokens (gdn_attention.py:556, "The size of tensor a (6) must match the size of
tensor b (5)"). The steps, draft tokens and accepted tokens agree to the integer at every position: vLLM counts a
step's accepted drafts before it trims the tokens past the stop token (vllm/v1/core/sched/scheduler.py:2116-2135
count `len(generated_token_ids) - 1`; the trim is `_update_request_with_output`, :2166-2168 and :2493-2511), so a
draft that runs past the end-of-turn token, where the target's next argmax agrees with it, is counted as accepted and
then dropped; the replay reads the target's argmax after the end-of-turn token (positions `accepted_past_end`), which
needs the target: the n-gram rows are replayed beside the MTP head's (`--drafters mtp,ngram`), not model-free.
At T = 1.0 the engine's rejection sampler draws: its counts are one draw of what the replay predicts, within
counting noise. `compare --drafter ngram` on vLLM's own Prometheus text of the greedy run agrees with its replay.
"""

from __future__ import annotations

import pytest

from .conftest import NGRAM, replay_engine_counts
from .model_free import compare_on_exposition, within_counting_noise

REPLAY = ("--drafters", "mtp,ngram", "--ngram", f"{NGRAM[0]},{NGRAM[1]}", "--ngram-runner", "v1")

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def ngram_counts(ngram_engine_run, demo_turns):
    keys, prompts = demo_turns
    run = ngram_engine_run["runs"][0]
    run_dir, expected = replay_engine_counts(run, keys, prompts, ngram_engine_run["work"], "greedy", REPLAY,
                                             export_as="ngram")
    print("engine", run["counters"], "replay", expected["counts"])
    return run["counters"], expected["counts"], run_dir


def test_the_ngram_engine_runs_with_the_conv_fix_and_emits_the_greedy_tokens(ngram_engine_run, mtp_engine_run):
    assert "spec_conv" in ngram_engine_run["fixes"]
    mtp_greedy = next(r for r in mtp_engine_run["runs"] if r["name"] == "greedy")
    # greedy speculative decoding is lossless: any drafter, the same tokens
    assert [o["token_ids"] for o in ngram_engine_run["runs"][0]["outputs"]] == \
        [o["token_ids"] for o in mtp_greedy["outputs"]]


def test_ngram_greedy_engine_counters_equal_the_replays_to_the_integer(ngram_counts):
    engine, replay, _ = ngram_counts
    assert engine == replay


def test_ngram_sampled_engine_counters_agree_with_the_replay_within_counting_noise(ngram_engine_run, demo_turns):
    keys, prompts = demo_turns
    run = next(r for r in ngram_engine_run["runs"] if r["name"] == "t1")
    model_free = ("--drafters", "ngram", *REPLAY[2:])  # seconds; the few drafts past the end are inside the noise
    _, expected = replay_engine_counts(run, keys, prompts, ngram_engine_run["work"], "t1", model_free, export_as="ngram")
    within_counting_noise(run["counters"], expected)


def test_compare_ngram_on_vllms_own_metrics_text_agrees_with_the_replay(ngram_engine_run, ngram_counts):
    greedy = next(r for r in ngram_engine_run["runs"] if r["name"] == "greedy")  # the first run: its counters alone
    done = compare_on_exposition(greedy["metrics_text"], ngram_counts[2], "ngram")
    assert done.returncode == 0 and "AGREES" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
