"""Replay equals a real greedy draft-and-verify loop, step by step, on the bundled trained model."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.pipeline import replay

from .reference_head import ReferenceHead
from .test_replay import write_sessions


def greedy_speculative_decode(target, head: ReferenceHead, prompt: list[int], k: int, n_new: int):
    """A plain greedy speculative decoder: the head drafts K tokens from scratch, the target verifies them
    from scratch, the longest agreeing prefix is accepted plus the target's bonus token.

    Returns (tokens, [(anchor p, accepted length)]) — one entry per verify step.
    """
    def logits_of(seq):
        with torch.no_grad():
            return target(input_ids=torch.tensor(seq)[None]).logits[0]

    def hidden_of(seq):
        with torch.no_grad():
            return target.model(input_ids=torch.tensor(seq)[None]).last_hidden_state[0]

    x = list(prompt)
    x.append(int(logits_of(x)[-1].argmax()))  # x_s comes from the prefill
    steps = []
    while len(x) < len(prompt) + n_new:
        p = len(x) - 1  # the target has just emitted x_p; it holds h_0..h_{p-1}
        drafts, _ = head.draft(hidden_of(x[:p]), torch.tensor(x), p, k)
        verify = logits_of(x + drafts)  # position p+j predicts x_{p+j+1}
        a = 0
        while a < k and drafts[a] == int(verify[p + a].argmax()):
            a += 1
        steps.append((p, a))
        x.extend(drafts[:a] + [int(verify[p + a].argmax())])
    return x[: len(prompt) + n_new], steps


def test_replay_equals_a_real_draft_and_verify_loop_at_every_verify_step(tmp_path):
    from mtp_observe.model.loading import default_model_dir, load_model
    from mtp_observe.sessions.reading import read_sessions
    from mtp_observe.sessions.rendering import Renderer

    model_dir = default_model_dir()  # a trained head, so accepted lengths vary
    model = load_model(model_dir, dtype=torch.float64)
    head = model.head
    ref = ReferenceHead(head.named_weights(), head.geometry, head.embed_tokens, head.lm_head,
                        dtype=torch.float64)
    demo = sorted((Path(__file__).resolve().parents[1] / "sessions").glob("*.jsonl"))[0]
    session = next(s for s in read_sessions([demo]))
    prompt_request = Renderer.from_model_dir(model_dir).render(session).requests[0]
    prompt = prompt_request.input_ids[: prompt_request.spans[0].start]
    K, n_new = 3, 60
    tokens, steps = greedy_speculative_decode(model.target, ref, prompt, K, n_new)
    assert max(a for _, a in steps) >= 2 and min(a for _, a in steps) == 0  # drafts accepted and rejected
    path = write_sessions(tmp_path / "generated.jsonl", [{"id": "gen", "prompt_token_ids": prompt, "completion_token_ids": tokens[len(prompt):]}])
    run = replay([path], model_dir, tmp_path / "run", ReplayOptions(k=K, device="cpu", dtype="float64"))
    rows = pd.read_parquet(run / "positions.parquet")
    accepted_len = rows[rows.accepted].groupby("pos").depth.max().reindex(range(len(prompt), len(tokens)), fill_value=0)
    assert (rows[rows.depth == 1].actual_token == rows[rows.depth == 1].target_token).all()  # greedy: fully on-policy
    e = len(tokens) - 1
    for p, a in steps:
        assert accepted_len[p] == min(a, e - p), f"anchor {p}: loop accepted {a}, replay {accepted_len[p]}"
