"""The project's side of the engine tests: the prompts the engine completes, and the token-level sessions the
replay reads back (docs/sessions.md, token-level records; the shape `mtp-observe generate` writes)."""

from __future__ import annotations

import json
from pathlib import Path

from mtp_observe.run.decoding import turn_prompts
from mtp_observe.sessions.reading import read_sessions
from mtp_observe.sessions.rendering import Renderer


def demo_prompts(files, model_dir: Path) -> tuple[list[tuple[str, int]], list[list[int]], frozenset[int]]:
    """Every assistant turn of the sessions in FILES, rendered with the model's chat template as replay and generate
    render them: ([(session id, turn)], [prompt token ids], the end-of-turn ids)."""
    renderer = Renderer.from_model_dir(model_dir)
    keys, prompts = [], []
    for session in read_sessions(files):
        for p in turn_prompts(renderer.render(session)):
            keys.append((p.session_id, p.turn))
            prompts.append(list(p.prompt))
    return keys, prompts, renderer.eos_ids


def write_token_sessions(path: Path, keys, prompts, completions, sampling: dict) -> int:
    """One token-level record per session ({"id", "requests", "meta": {"sampling"}}), turns in order; a completion
    of fewer than two tokens is left out (nothing to draft, as generate does). Returns the requests written."""
    by_session: dict[str, list[dict]] = {}
    for (sid, _turn), prompt, completion in zip(keys, prompts, completions):
        if len(completion) >= 2:
            by_session.setdefault(sid, []).append({"prompt_token_ids": prompt, "completion_token_ids": completion})
    with open(path, "w") as f:
        for sid, requests in by_session.items():
            f.write(json.dumps({"id": sid, "requests": requests, "meta": {"sampling": sampling}}) + "\n")
    return sum(len(r) for r in by_session.values())
