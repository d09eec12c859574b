"""The verdict on the bundled model's own traffic, greedy and sampled, against a real speculative-sampling loop.

A loop (tests/speculative_loop.py: argmax drafts from the head, rejection sampling against vLLM's sampler
with presence penalties counting the drafts of the same step) generates the bundled model's own text under
instruct_general (T 0.7, top-p 0.8, top-k 20, presence 1.5) and under greedy, ten turns of 48 tokens each
(two sessions of five requests, prompts from the demo sessions). Replaying that text, the report's τ_sim(K)
is the loop's tokens per step exactly (the same trajectory), its speedup is τ_sim over the cost, and the
traffic fits the sampler that made it; the script-written demo sessions fit none.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from mtp_observe.model.loading import default_model_dir, load_model
from mtp_observe.model.target import BUILTIN_PROFILES
from mtp_observe.report import load_run, resolve_cost, summarize
from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.pipeline import replay

from .speculative_loop import ServedHead, speculative_sampling, tokens_per_step

ROOT = Path(__file__).resolve().parents[1]
K = 3
N_NEW = 48
PROFILES = {p.name: p for p in BUILTIN_PROFILES}


def _prompts():
    """Five prompts (each assistant turn's prompt of the first two requests) from each of two demo sessions."""
    from mtp_observe.sessions.reading import read_sessions
    from mtp_observe.sessions.rendering import Renderer

    renderer = Renderer.from_model_dir(default_model_dir())
    out = []
    for session in list(read_sessions([ROOT / "sessions" / "coding.jsonl"]))[:2]:
        requests = renderer.render(session).requests
        out.append([q.input_ids[: sp.start] for q in requests[:2] for sp in q.spans][:5])
    return out


@pytest.fixture(scope="module")
def own_traffic(tmp_path_factory):
    """{sampler name: (run directory, [(loop tokens, loop steps) per turn])} for instruct_general and greedy."""
    work = tmp_path_factory.mktemp("own")
    model_dir = default_model_dir()
    model = load_model(model_dir, dtype=torch.float64)
    head = ServedHead(model.head)
    prompts = _prompts()
    out = {}
    for name, seed in (("instruct_general", 11), ("greedy", 0)):
        gen = torch.Generator().manual_seed(seed)
        records, loops = [], []
        for i, session_prompts in enumerate(prompts):
            requests = []
            for prompt in session_prompts:
                tokens, steps = speculative_sampling(model.target, head, prompt, PROFILES[name], K, N_NEW, gen)
                requests.append({"prompt_token_ids": prompt, "completion_token_ids": tokens[len(prompt):]})
                loops.append(tokens_per_step(steps, len(prompt), len(tokens) - 1))
            records.append({"id": f"{name}-{i}", "requests": requests})
        path = work / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        run = replay([path], model_dir, work / f"run-{name}", ReplayOptions(k=K, device="cpu", dtype="float64"))
        out[name] = (run, loops)
    return out


@pytest.fixture(scope="module")
def foreign_run(tmp_path_factory):
    """The demo sessions, the quickstart's: written by a script, not by the model.

    The bundled model was trained on sessions from the same script, so its T = 1 samples imitate them: on
    its own, a coding demo session looks much like a T = 1 sample (instruct_reasoning: support 0.96,
    calibration 1.00), while the support sessions do not (support 0.77-0.83); pooled, they fit nothing."""
    out = tmp_path_factory.mktemp("foreign") / "run"
    return replay(sorted((ROOT / "sessions").glob("*.jsonl")), default_model_dir(), out, ReplayOptions(k=K, device="cpu"))


def _report(run: Path, **options):
    loaded = load_run(run)
    return summarize(loaded, resolve_cost(loaded), replicates=300, **options)


@pytest.mark.parametrize("sampler", ["instruct_general", "greedy"])
def test_on_its_own_text_the_reports_tau_sim_is_the_speculative_loops_tokens_per_step_exactly(own_traffic, sampler):
    run, loops = own_traffic[sampler]
    report = _report(run)
    tokens, steps = sum(t for t, _ in loops), sum(n for _, n in loops)
    o = report.overall
    assert len(loops) == 10 and tokens == 10 * (N_NEW - 1)
    assert Fraction(int(o.per_session.span_tokens.sum()), int(o.per_session.steps[:, K - 1].sum())) == Fraction(tokens, steps)
    assert float(o.value.tau_sim[K - 1]) == pytest.approx(tokens / steps, rel=1e-12)
    # the speedup is τ_sim's: at the best K, τ_sim(K) / (1 + K c + v(K))
    kb, c = report.best_k, report.cost.c
    assert float(o.value.speedup[kb - 1]) == pytest.approx(float(o.value.tau_sim[kb - 1]) / (1 + kb * c + report.cost.verify_extra[kb - 1]))
    # drafts are accepted and rejected, and the per-position formula overstates the loop (acceptance comes in runs)
    assert 1.3 < tokens / steps < K + 1
    assert float(o.value.tau[K - 1]) > 1.05 * tokens / steps, (o.value.tau, tokens / steps)


@pytest.mark.parametrize("sampler", ["instruct_general", "greedy"])
def test_the_verdict_on_the_models_own_text_is_not_unreliable_and_names_its_sampler(own_traffic, sampler):
    report = _report(own_traffic[sampler][0])
    rec = report.recording
    assert rec.fits and rec.name == sampler and rec.declared is None, rec.reason
    assert [c.name for c in report.verdict.causes] == ["sessions"], report.verdict.reason  # two sessions: too few ...
    assert _report(own_traffic[sampler][0], min_sessions=2).verdict.status in ("GO", "NO-GO")  # ... and nothing else
    assert report.resampling.unit == "turn"  # two sessions: the interval resamples their ten turns


def test_greedy_sampled_and_foreign_traffic_fit_fit_and_do_not_fit(own_traffic, foreign_run):
    greedy = _report(own_traffic["greedy"][0]).recording
    sampled = _report(own_traffic["instruct_general"][0]).recording
    foreign = _report(foreign_run).recording
    assert greedy.candidate("greedy").fits and greedy.candidate("greedy").support == 1.0
    pick = sampled.candidate("instruct_general")
    assert pick.fits and pick.support >= 0.99 and abs(pick.calibration - 1) < 0.05 and abs(pick.z) < 3, sampled.reason
    assert not sampled.candidate("greedy").fits  # sampled text is not greedy text
    assert foreign.name is None and not any(c.fits for c in foreign.candidates), foreign.reason
    assert max(c.support for c in foreign.candidates) < 0.95


def test_the_demo_sessions_stay_unreliable_and_say_why(foreign_run):
    from mtp_observe.report import parse_gate

    report = _report(foreign_run, gate=parse_gate("speedup>=1.0"))
    assert report.verdict.status == "UNRELIABLE" and report.verdict.exit_code == 1
    assert [c.name for c in report.verdict.causes] == ["sampler", "sessions"]
    assert "fit none of the 6 samplers" in report.verdict.reason and "greedy: support" in report.verdict.causes[0].detail
    assert report.verdict.next_steps[0].startswith("mtp-observe generate ")
