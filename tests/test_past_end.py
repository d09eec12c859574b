"""Drafts accepted past the end of a turn: vLLM counts a verify step's accepted drafts before it trims the tokens
past the stop token (vllm/v1/core/sched/scheduler.py:2116-2135 count len(generated_token_ids) - 1; the trim is
_update_request_with_output, :2166 and :2493-2511), so a step whose chain accepts the end-of-turn token and then a
draft the target predicts after it counts one more accepted token than the turn emits (docs/engine-fidelity.md).
"""

from __future__ import annotations

import numpy as np
import torch

from mtp_observe.drafting.acceptance import accepted_past_end, anchor_plan, past_end_entries
from mtp_observe.engines.numbers import engine_numbers
from mtp_observe.report import read_and_summarize
from mtp_observe.report.metrics import decode_walk
from mtp_observe.sessions.rendering import Span

from .handmade import HandSpan, write_run


def test_a_step_that_accepts_through_the_end_of_turn_counts_the_draft_the_target_accepts_past_it():
    # one turn, e - s = 4, K = 3; accepted lengths at anchors s..s+3: 1, 0, 2, 1. The walk: anchor 0 emits 2 tokens,
    # anchor 2 (e - p = 2 < 3) accepts both remaining tokens, the end-of-turn token last: 2 steps.
    accepted, span_len = np.array([1, 0, 2, 1]), np.array([4])
    plain = decode_walk(accepted, span_len, 3)
    assert plain.steps.tolist() == [2] and plain.step_accepted.tolist() == [[2, 1, 0]]
    # its draft's third token is the target's argmax after the end-of-turn token: vLLM counts position 3 too
    past = decode_walk(accepted, span_len, 3, past_end=np.array([1, 1, 1, 1]))
    assert past.steps.tolist() == [2] and past.step_accepted.tolist() == [[2, 1, 1]]
    # anchor 0 (a = 1 < e - p) and anchors 1 and 3 (not visited) count nothing extra; at K = 2 anchor 2 drafts
    # nothing past the end (e - p = 2 = K): the same counts as without
    assert decode_walk(accepted, span_len, 3, past_end=np.array([1, 1, 0, 1])).step_accepted.tolist() == [[2, 1, 0]]
    assert decode_walk(accepted, span_len, 2, past_end=np.array([1, 1, 1, 1])).step_accepted.tolist() == \
        decode_walk(accepted, span_len, 2).step_accepted.tolist() == [[2, 1]]


def test_the_draft_token_past_the_end_is_read_where_the_draft_reaches_it_and_judged_by_the_target_after_x_e():
    # acceptance.py's worked example: span s=10, e=13, K=4; anchors 10, 11, 12 with depths 3, 2, 1
    plan = anchor_plan([Span(10, 13, 0, b"")], 4)
    assert plan.depths.tolist() == [3, 2, 1]
    drafts = torch.tensor([[11, 12, 13, 7], [12, 13, 7, 9], [13, 8, -1, -1]])  # x_p = p; d past x_e: 7, 7, 8
    past = past_end_entries(plan, drafts, 4)
    assert past.anchor_index.tolist() == [0, 1, 2] and past.target_position.tolist() == [13, 13, 13]
    assert past.token.tolist() == [7, 7, 8]
    assert accepted_past_end(past, torch.tensor([7, 7, 7]), 3).tolist() == [1, 1, 0]
    # K = 3: anchor 10's draft ends at x_13 (nothing past the end); a proposal that stops there (-1) is not read
    short = past_end_entries(anchor_plan([Span(10, 13, 0, b"")], 3), torch.tensor([[11, 12, 13], [12, 13, -1],
                                                                                    [13, 8, 5]]), 3)
    assert short.anchor_index.tolist() == [2] and short.token.tolist() == [8]


def _engine_counts(run) -> dict:
    """What `export --engine vllm` writes as expected_metrics.counts (engines/exports.py reads engine_numbers)."""
    n = engine_numbers(read_and_summarize(run, replicates=20).report, 3)
    return {"num_drafts": n.steps, "num_draft_tokens": n.draft_tokens, "num_accepted_tokens": n.accepted,
            "num_accepted_tokens_per_pos": list(n.per_pos_counts)}


def test_the_engine_counted_numbers_count_a_draft_accepted_past_the_end_of_turn_as_vllms_counters_do(tmp_path):
    # the walk above as a run: the second step (anchor s+2) accepts x_{e-1}, x_e and the draft past x_e
    matches = [[1, 0, 0], [0, 0, 0], [1, 1], [1]]
    spans = {"a": [HandSpan(0, 1, 5, matches, past_end={7, 8})]}
    counts = _engine_counts(write_run(tmp_path / "past", spans, k=3, version=5, past_end=True))
    assert counts == {"num_drafts": 2, "num_draft_tokens": 6, "num_accepted_tokens": 4,
                      "num_accepted_tokens_per_pos": [2, 1, 1]}
    # a run without the column (older runs, model-free replays): nothing past the end, as before
    before = _engine_counts(write_run(tmp_path / "before", {"a": [HandSpan(0, 1, 5, matches)]}, k=3, version=4))
    assert before["num_accepted_tokens_per_pos"] == [2, 1, 0] and before["num_accepted_tokens"] == 3
