"""What the model-free drafters' engine tests share: the counting-noise check of a sampled run, and `compare` on the
Prometheus text vLLM's registry holds after a run (engine_driver.py's "exposition": what /metrics serves)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

from .conftest import K


def within_counting_noise(engine: dict, expected: dict) -> None:
    """The engine's counts at T = 1.0 are one draw of what the replay predicts: the steps with a draft within 3
    standard deviations of a count, each position's rate within 3 binomial standard deviations over those steps."""
    replay = expected["counts"]
    print("engine", engine, "replay", replay)
    n = engine["num_drafts"]
    assert n > 0 and abs(replay["num_drafts"] - n) <= 3 * math.sqrt(n), (n, replay["num_drafts"])
    for i in range(K):
        p_engine = engine["num_accepted_tokens_per_pos"][i] / n
        p_replay = expected["per_position_acceptance_rate"][i]
        sigma = math.sqrt(p_replay * (1 - p_replay) / n)
        assert abs(p_engine - p_replay) <= 3 * sigma, (i, p_engine, p_replay, sigma)


def compare_on_exposition(text: str, run: Path, drafter: str, *extra: str) -> subprocess.CompletedProcess:
    metrics = run.parent / f"{run.name}-metrics.txt"
    metrics.write_text(text)
    done = subprocess.run([sys.executable, "-m", "mtp_observe", "compare", str(run), "--engine-metrics", str(metrics),
                           "--drafter", drafter, "--traffic", "same", "--replicates", "200", *extra],
                          capture_output=True, text=True)
    print(done.stdout[-3000:], done.stderr[-2000:])
    return done
