"""vLLM's suffix decoding (arctic-inference 0.3.0's tree, built from source into the engine's venv) against the
replay of the engine's own tokens: greedy to the integer in steps, draft tokens and positions 1-2 (with the drafts
vLLM counts past the end of a turn, as for n-gram); at position 3 the engine counts 3 more (a second draft past the
end-of-turn token, not modelled: the xfail below), T = 1.0 within counting noise, and `compare --drafter suffix` on
vLLM's own Prometheus text agrees.

No global tree of earlier outputs (suffix_decoding_max_cached_requests 0, replayed with the same): which requests
have finished, and so what the global tree holds, depends on the engine's batch, which the replay's one-by-one
order does not follow. Suffix decoding runs on vLLM's V1 runner (vllm/config/vllm.py:3053-3087), as the replay's
suffix rows assume; every step with a draft may hold fewer than K tokens.
"""

from __future__ import annotations

import pytest

from .conftest import SUFFIX_CACHED, replay_engine_counts
from .model_free import compare_on_exposition, within_counting_noise

pytestmark = pytest.mark.engine

OPTIONS = ("--suffix-max-cached-requests", str(SUFFIX_CACHED))
# greedy: beside the head, so the target says which drafts past the end of a turn vLLM accepts (test_ngram_counters);
# T = 1.0: model-free (seconds, not minutes), those few drafts are far inside the counting noise
REPLAY = {"greedy": ("--drafters", "mtp,suffix", *OPTIONS), "t1": ("--drafters", "suffix", *OPTIONS)}


@pytest.fixture(scope="module")
def suffix_replays(suffix_engine_run, demo_turns):
    keys, prompts = demo_turns
    cache: dict = {}

    def replayed(name: str):
        run = next(r for r in suffix_engine_run["runs"] if r["name"] == name)
        if name not in cache:
            cache[name] = replay_engine_counts(run, keys, prompts, suffix_engine_run["work"], name, REPLAY[name],
                                               export_as="suffix")
        return run, cache[name]

    return replayed


def test_the_suffix_engine_runs_with_every_fix_and_drafts_fewer_than_k_tokens_at_some_steps(suffix_engine_run):
    assert suffix_engine_run["fixes"] == ["gdn_prefill", "expand", "spec_conv"]
    for run in suffix_engine_run["runs"]:
        c = run["counters"]
        assert 0 < c["num_drafts"] and c["num_drafts"] <= c["num_draft_tokens"] < 3 * c["num_drafts"], c


def test_suffix_greedy_steps_drafts_and_acceptance_at_positions_1_and_2_equal_the_replays(suffix_replays):
    run, (_, expected) = suffix_replays("greedy")
    engine, replay = run["counters"], expected["counts"]
    print("engine", engine, "replay", replay)
    assert engine["num_drafts"] == replay["num_drafts"] and engine["num_draft_tokens"] == replay["num_draft_tokens"]
    assert engine["num_accepted_tokens_per_pos"][:2] == replay["num_accepted_tokens_per_pos"][:2]
    assert engine["num_accepted_tokens_per_pos"][2] >= replay["num_accepted_tokens_per_pos"][2]


@pytest.mark.xfail(strict=True, reason="a second draft past the end-of-turn token (x_e at depth 1, two drafts past it "
                   "accepted: suffix decoding copies the chat template's next tokens) needs the target's prediction "
                   "after its own first token past x_e, another forward the replay does not run; measured: the engine "
                   "counts 294 at position 3, the replay 291, every other count equal")
def test_suffix_greedy_engine_counters_equal_the_replays_to_the_integer(suffix_replays):
    run, (_, expected) = suffix_replays("greedy")
    assert run["counters"] == expected["counts"]


def test_suffix_sampled_engine_counters_agree_with_the_replay_within_counting_noise(suffix_replays):
    run, (_, expected) = suffix_replays("t1")
    within_counting_noise(run["counters"], expected)


def test_compare_suffix_on_vllms_own_metrics_text_agrees_with_the_replay(suffix_replays):
    run, (run_dir, _) = suffix_replays("greedy")  # the first run: its counters alone
    done = compare_on_exposition(run["metrics_text"], run_dir, "suffix")
    assert done.returncode == 0 and "AGREES" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
