"""The estimate (estimate.py): the work it counts is the work the run computes, `--dry-run` prints it and writes
nothing, `sessions` shows it; the progress ETA counted in that work is steady on steady work (a synthetic clock);
generate's progress counts prompt and generated tokens and prints on time inside a long prefill (a slow model,
through a pipe and through a pty)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

from mtp_observe.run.estimate import (
    Estimate,
    Rates,
    ReplayWork,
    TurnShape,
    duration,
    estimate_line,
    generate_work,
    replay_seconds,
    replay_work,
)
from mtp_observe.run.progress import GenerationCounter, GenerationState, ProgressCounter, generation_lines

from .test_generation import SESSIONS, _write
from .test_replay import SESSION, write_sessions


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "mtp_observe", *map(str, args)], capture_output=True, text=True, cwd=cwd)


class PairCounter:
    """torch.nn.functional.scaled_dot_product_attention, counting query-key pairs per query head."""

    def __init__(self, monkeypatch):
        self.pairs = 0
        real = torch.nn.functional.scaled_dot_product_attention

        def counted(query, key, value, *args, **kwargs):
            *batch, heads, q, _ = query.shape
            self.pairs += (batch[0] if batch else 1) * heads * q * key.shape[-2]
            return real(query, key, value, *args, **kwargs)

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)


def test_the_replay_estimate_counts_the_attention_pairs_the_replay_computes(tiny_model, tiny_checkpoint, tmp_path, monkeypatch):
    """Target and head together: every scaled_dot_product_attention call of a session's replay (chunked prefill
    over a carried prefix, the head's row chunks, its chain blocks) adds up to the estimate's pairs."""
    from mtp_observe.run.estimate import full_attention_layers
    from mtp_observe.run.options import default_profiles
    from mtp_observe.run.requests import replay_session
    from mtp_observe.sessions.reading import read_sessions
    from mtp_observe.sessions.rendering import Renderer

    path = write_sessions(tmp_path / "s.jsonl", [SESSION])
    rendered = Renderer.from_model_dir(tiny_checkpoint).render(next(iter(read_sessions([path]))))
    assert len(rendered.requests) >= 2
    heads = tiny_model.info.geometry.num_heads
    work = replay_work(rendered, 3, 16, heads)
    assert work.reused > 0 and work.prefill + work.reused == work.tokens
    counter = PairCounter(monkeypatch)
    replay_session(tiny_model, rendered.requests, 3, default_profiles(tiny_checkpoint)[:1], 16)
    full = full_attention_layers(tiny_model.info.text_config)
    assert counter.pairs == (work.target_pairs * full + work.head_pairs) * heads


def test_the_generate_estimate_counts_the_prompts_padding_forwards_and_pairs_generate_computes(tiny_checkpoint, tmp_path,
                                                                                                monkeypatch):
    """With every turn running to --max-new-tokens (no end-of-turn token drawn), the estimate's longer case is what
    generate computes: the padded prefill and the decode rows through the target, and their attention pairs."""
    import mtp_observe.run.decoding as decoding
    from mtp_observe.run.estimate import full_attention_layers
    from mtp_observe.run.generation import GenerateOptions, generate, generate_estimate

    monkeypatch.setattr(decoding, "draw", lambda dist, uniforms: torch.full((uniforms.shape[0],), 7, dtype=torch.long))
    sessions = _write(tmp_path / "s.jsonl", SESSIONS)
    opts = GenerateOptions(sampling="greedy", max_new_tokens=5, device="cpu", batch_size=2, chunk_size=128)
    estimate = generate_estimate([sessions], tiny_checkpoint, opts)
    import mtp_observe.run.estimate as estimate_module

    monkeypatch.setattr(estimate_module, "calibrate_generate", lambda *args: estimate.rates)  # count the run alone
    forwarded = [0]
    real_forward = decoding._forward

    def counted(model, input_ids, cache, *args, **kwargs):
        forwarded[0] += input_ids.numel()
        return real_forward(model, input_ids, cache, *args, **kwargs)

    monkeypatch.setattr(decoding, "_forward", counted)
    pairs = PairCounter(monkeypatch)
    summary = generate([sessions], tiny_checkpoint, tmp_path / "own.jsonl", opts)
    w = estimate.work
    assert (w.sessions, w.turns, w.prompt) == (3, summary.turns, summary.prompt_tokens) and w.batches == 3
    assert summary.tokens == w.generated_high == w.turns * 5
    assert forwarded[0] == w.prefill + w.generated_high - w.turns  # the first token of each turn needs no forward
    assert w.prefill > w.prompt  # the batches' shorter prompts are padded
    import mtp_observe.run.pipeline as pipeline

    model_info = pipeline.load_model(tiny_checkpoint).info
    heads = model_info.geometry.num_heads
    assert pairs.pairs == (w.prefill_pairs + w.decode_pairs_high) * full_attention_layers(model_info.text_config) * heads


def test_generate_batches_turns_as_generate_does_and_the_recorded_lengths_are_the_shorter_case():
    one = [TurnShape(100, 30), TurnShape(300, 5)]
    two = [TurnShape(200, 12)]
    w = generate_work([one, two], batch_size=2, chunk_size=2048, max_new_tokens=20, window=8)
    # one window (3 turns < 8): sorted by prompt length 100, 200 | 300 -> batches [100, 200] padded to 200, [300]
    assert (w.batches, w.prompt, w.prefill) == (2, 600, 2 * 200 + 300)
    assert (w.generated_low, w.generated_high) == (20 + 12 + 5, 60)
    assert (w.steps_low, w.steps_high) == ((20 - 1) + (5 - 1), 2 * (20 - 1))
    spec = generate_work([one], batch_size=2, chunk_size=2048, max_new_tokens=20, speculative=3)
    assert (spec.batches, spec.prefill) == (2, 400) and (spec.steps_low, spec.steps_high) == (5 + 1, 2 * 19)


RATES = Rates(device="cpu", tokens=736, token_s=1e-3, pair_s=0.0, full_layers=1, heads=1, call_s=0.05, draft_s=4e-3)


def test_the_line_says_the_work_the_range_and_that_it_is_an_estimate():
    work = ReplayWork(sessions=160, requests=1072, tokens=8_784_494, prefill=2_075_722, reused=6_708_772, anchors=241_048,
                      drafts=900_000)
    est = Estimate(work, RATES, k=4)
    point = replay_seconds(work, RATES)
    assert point == pytest.approx(1072 * 0.05 + 2_075_722e-3 + 900_000 * 4e-3)
    lo, hi = est.seconds
    line = estimate_line(est)
    assert line.startswith("estimate: 2.08M tokens to prefill (+6.71M reused from shared prefixes), 241k anchors to draft (K <= 4), "
                           "160 sessions · ")
    assert f"{duration(lo)} - {duration(hi)} on cpu (an estimate, calibrated on 736 tokens of this model)" in line
    assert lo < point < hi
    assert [duration(s) for s in (45, 190, 7500)] == ["45 s", "3 min 10 s", "2 h 05 min"]
    no_time = estimate_line(Estimate(work, k=4, why_no_time="no time estimate (model-free drafters: no target runs)"))
    assert no_time.endswith("160 sessions · no time estimate (model-free drafters: no target runs)")


# --- the ETA on a synthetic clock -----------------------------------------------------------------


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _session(kind: int) -> list[ReplayWork]:
    """Two kinds of sessions the public corpus has: long ones of several requests that reuse most of their tokens
    and draft a lot (tau-bench), and short ones of one request, few anchors."""
    if kind == 0:
        return [ReplayWork(requests=1, tokens=t, prefill=p, reused=t - p, anchors=a, drafts=4 * a)
                for t, p, a in ((8_000, 8_000, 900), (14_000, 6_000, 1_100), (21_000, 7_000, 1_300))]
    return [ReplayWork(requests=1, tokens=6_000, prefill=6_000, anchors=150, drafts=600)]


def _run(counter: ProgressCounter, clock: Clock, sessions: list[list[ReplayWork]], priced: bool, prefill: float = 1.3,
         drafts: float = 2.0, every: float = 30.0) -> list[tuple[float, float | None, float]]:
    """Feed a replay's events at the times steady work takes on a machine the calibration priced wrongly (its
    prefill `prefill` times, the rest of a request `drafts` times the priced seconds); read the ETA every `every`
    seconds as the plain line would. -> [(t, ETA, seconds really left)]."""
    events = []  # (seconds before it, method, args)
    for i, requests in enumerate(sessions):
        events.append((0.0, "session_start", (f"s{i}", sum(w.tokens for w in requests), len(requests), requests if priced else None)))
        for r, w in enumerate(requests):
            events.append((0.0, "request", (r,)))
            if w.reused:
                events.append((0.0, "reused", (w.reused,)))
            prefill_s = w.prefill * RATES.token_s
            for c0 in range(0, w.prefill, 2048):
                n = min(2048, w.prefill - c0)
                events.append((prefill * prefill_s * n / w.prefill, "tokens", (n,)))
            events.append((drafts * (replay_seconds(w, RATES) - prefill_s), None, ()))
        events.append((0.0, "session", (f"s{i}", sum(w.tokens for w in requests), False)))
    end = sum(dt for dt, *_ in events)
    readings, t, next_line = [], 0.0, every
    for dt, method, args in events:
        while next_line <= t + dt:
            clock.t = next_line
            readings.append((next_line, counter.snapshot().eta_s, end - next_line))
            next_line += every
        t += dt
        clock.t = t
        if method is not None:
            getattr(counter, method)(*args)
    return readings


def _swing(readings) -> float:
    """The largest change between two consecutive lines of the ETA's ratio to the time really left (1: the ETA moves
    exactly as the time left does), over the lines with more than a minute left."""
    ratios = [e / left for _, e, left in readings if e is not None and left > 60]
    return max(max(a, b) / min(a, b) for a, b in zip(ratios, ratios[1:]))


def test_the_eta_is_steady_on_steady_work_and_tracks_the_time_left():
    """Sessions of very different sizes, reuse and draft work, on a machine that runs the prefill 1.3x and the
    drafts 2x slower than calibrated: the ETA printed every 30 s moves by less than 30% against the time left
    between two lines (the most, from the first line, the estimate, to the second, the measured speed), and
    from a fifth of the way on it is within 20% of the time really left. The ETA counted in tokens (no estimate:
    reused prefixes are tokens done in no time, a session weighs by its tokens, not its work) jumps by half
    and more on the same work: the issue's 8:54 to 15:55."""
    sessions = [_session(i % 3 == 2) for i in range(24)]
    clock = Clock()
    counter = ProgressCounter(clock=clock)
    total = ReplayWork()
    for requests in sessions:
        for w in requests:
            total += w
    counter.estimate(Estimate(total, RATES, k=4))
    counter.start(len(sessions))
    assert counter.snapshot().eta_s == pytest.approx(replay_seconds(total, RATES))  # before any work: the estimate
    readings = _run(counter, clock, sessions, priced=True)
    end = readings[-1][0] + readings[-1][2]
    assert len(readings) > 40 and _swing(readings) < 1.3
    late = [(e, left) for t, e, left in readings if t > end / 5 and left > 60]
    assert late and all(abs(e - left) / left < 0.2 for e, left in late), late
    tokens_clock = Clock()
    by_tokens = ProgressCounter(clock=tokens_clock)
    by_tokens.start(len(sessions))
    assert _swing(_run(by_tokens, tokens_clock, sessions, priced=False)) > 1.5


def test_generates_eta_counts_prompt_and_generated_tokens_at_the_estimates_prices():
    clock = Clock()
    c = GenerationCounter(clock=clock)
    shapes = [[TurnShape(1_000, 50)] * 4]
    work = generate_work(shapes, batch_size=4, chunk_size=2048, max_new_tokens=100)
    rates = Rates(device="cpu", tokens=1, token_s=1e-3, pair_s=0.0, full_layers=1, heads=1, step_s=0.02)
    c.estimate(Estimate(work, rates, max_new_tokens=100))
    c.start(4)
    assert c.snapshot().eta_s == pytest.approx(4 * 1.0 + 49 * 0.02)  # the prefill, then 49 decode forwards
    clock.t = 2.0
    s = c.prefilled(2_000)  # half the prompt, at the calibrated speed
    assert (s.prompt_done, s.prompt_total, s.generated) == (2_000, 4_000, 0)
    assert s.eta_s == pytest.approx(2.0 + 0.98)
    line = generation_lines(s)[0]
    assert line.startswith("generate: 0/4 turns · prompt 2.0k/4.0k · 0 generated · 1.0k tok/s · ETA 00:03") and len(line) <= 80
    big = GenerationState(turns=123_456, turns_done=99_999, prompt_total=987_654_321, prompt_done=123_456_789,
                          generated=12_345_678, fresh_tokens=10**6, fresh_s=3.0, work_left=1e6, speed=1.0)
    assert all(len(ln) <= 80 for ln in generation_lines(big)) and "ETA" in generation_lines(big)[0]


# --- the CLI ---------------------------------------------------------------------------------------


def test_dry_run_prints_the_estimate_and_writes_nothing(tiny_checkpoint, tmp_path):
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION, {**SESSION, "id": "two"}])
    work = tmp_path / "work"
    work.mkdir()
    run = run_cli("replay", sessions, "--model", tiny_checkpoint, "--device", "cpu", "--dry-run", "--head-precision",
                  "q4_k", "--draft-p-min", "0.3,0.5", "--tree", "2,2,3", "--grammar", "tools", cwd=work)
    assert run.returncode == 0, run.stderr
    (line,) = [ln for ln in run.stdout.splitlines() if ln.startswith("estimate: ")]
    assert re.search(r"tokens to prefill \(\+[\d.,kM]+ reused from shared prefixes\), [\d,]+ anchors to draft \(K <= 4\), "
                     r"2 sessions · .+ - .+ on cpu \(an estimate, calibrated on [\d,]+ tokens of this model\)$", line), line
    # the breakdown (estimate_terms.py): the base replay and one line per term the options add, none wrapped at 100 columns
    breakdown = run.stdout.splitlines()[run.stdout.splitlines().index(line) + 1:]
    assert [ln.split(":")[0] for ln in breakdown] == ["  base replay", "  + what-if head q4_k", "  + thresholds 0.3,0.5",
                                                      "  + tree 2,2,3", "  + grammar tools"], breakdown
    assert "shared by all 2, over 2 chains" in breakdown[2] and "2,2,3: 6 drafted + 2 verified" in breakdown[3]
    assert "xgrammar per tool-call token (1 drafter's drafts), a compile per session" in breakdown[4]
    assert all(len(ln) <= 100 for ln in breakdown)
    assert run.stderr == "" and list(work.iterdir()) == []  # no reports/, no run directory
    out = tmp_path / "own.jsonl"
    gen = run_cli("generate", sessions, "-o", out, "--model", tiny_checkpoint, "--device", "cpu", "--max-sessions", 1,
                  "--dry-run", cwd=work)
    assert gen.returncode == 0, gen.stderr
    (line,) = [ln for ln in gen.stdout.splitlines() if ln.startswith("estimate: ")]
    assert "prompt tokens to prefill, " in line and "tokens to generate (" in line and ", 1 session · " in line
    assert not out.exists() and not out.with_name("own.jsonl.partial").exists() and list(work.iterdir()) == []
    no_output = run_cli("generate", sessions, "--model", tiny_checkpoint)
    assert no_output.returncode == 2 and "-o OWN.jsonl" in no_output.stderr and no_output.stderr.count("\n") == 1


def test_replay_and_generate_say_the_estimate_first_and_generate_takes_max_sessions(tiny_checkpoint, tmp_path):
    sessions = _write(tmp_path / "s.jsonl", SESSIONS)
    out = tmp_path / "own.jsonl"
    gen = run_cli("generate", sessions, "-o", out, "--model", tiny_checkpoint, "--device", "cpu", "--max-new-tokens", 3,
                  "--max-sessions", 2)
    assert gen.returncode == 0, gen.stderr
    lines = gen.stdout.splitlines()
    assert lines[0].startswith("estimate: ") and ", 2 sessions · " in lines[0]
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["s0", "s1"]
    refused = run_cli("generate", sessions, "-o", tmp_path / "x.jsonl", "--model", tiny_checkpoint, "--max-sessions", 0)
    assert refused.returncode == 2 and "--max-sessions 0" in refused.stderr
    rep = run_cli("replay", out, "--model", tiny_checkpoint, "--device", "cpu", "--k", 2, "-o", tmp_path / "run")
    assert rep.returncode == 0, rep.stderr
    assert rep.stdout.splitlines()[0].startswith("estimate: ") and ", 2 sessions · " in rep.stdout.splitlines()[0]


def unwrapped(stdout: str) -> list[str]:
    """stdout's lines with the terminal's wrapping undone: a line indented by two spaces continues the one before."""
    lines: list[str] = []
    for line in stdout.splitlines():
        if line.startswith("  ") and lines and not line.startswith("   "):
            lines[-1] += " " + line[2:]
        else:
            lines.append(line)
    return lines


def test_sessions_shows_the_work_and_time_of_a_replay_and_a_generate(tiny_checkpoint, tmp_path):
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    shown = run_cli("sessions", sessions, "--model", tiny_checkpoint, "--device", "cpu")
    assert shown.returncode == 0, shown.stderr
    replay_line, generate_line = unwrapped(shown.stdout)[-2:]
    assert replay_line.startswith("replay (--k 4): ") and "anchors to draft" in replay_line and "an estimate" in replay_line
    assert generate_line.startswith("generate (--batch-size 8): ") and "tokens to generate" in generate_line
    quick = run_cli("sessions", sessions, "--model", tiny_checkpoint, "--no-estimate")
    assert quick.returncode == 0 and unwrapped(quick.stdout)[-2].endswith("· no time estimate (--no-estimate: no weights loaded)")


# --- generate's progress inside a long prefill -------------------------------------------------------

SLOW = """
import sys, time
import mtp_observe.run.estimate as estimate
import mtp_observe.run.decoding as decoding

real = decoding._forward
# the calibration is not under test here: fixed rates, so that only the run's own chunks are slow
estimate.calibrate_generate = lambda model, settings, batch: estimate.Rates("cpu", 1, 1e-3, 0.0, 1, 1, step_s=0.01)

def slow(model, input_ids, cache, *args, **kwargs):
    if input_ids.shape[1] > 1:  # a prefill chunk
        time.sleep(float(sys.argv[1]))
    return real(model, input_ids, cache, *args, **kwargs)

decoding._forward = slow
from mtp_observe.cli import main
main(sys.argv[2:])
"""

PROMPT = re.compile(r"^generate: (\d+)/(\d+) turns · prompt ([\d.]+[kM]?)/([\d.]+[kM]?) · ([\d.]+[kM]?) generated · ")


def _slow_generate(tmp_path, seconds: float, *args):
    driver = tmp_path / "slow.py"
    driver.write_text(SLOW)
    sessions = _write(tmp_path / "s.jsonl", [{**SESSION, "messages": SESSION["messages"][:5]}])  # prompts of 187, 265 tokens
    out = tmp_path / "own.jsonl"
    argv = [sys.executable, str(driver), str(seconds), "generate", str(sessions), "-o", str(out), "--device", "cpu",
            "--max-new-tokens", "3", "--batch-size", "1", "--chunk-size", "64", *map(str, args)]
    return argv, out


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_through_a_pipe_generate_prints_a_line_every_n_seconds_inside_a_long_prefill(tiny_checkpoint, tmp_path):
    """Each prefill chunk (64 tokens) takes 0.25 s and lines are due every 0.05 s: lines come while a chunk runs
    (several with the same prompt tokens), the prompt tokens move chunk by chunk, and the last line counts every
    prompt token prefilled and every token generated, as the summary does."""
    argv, out = _slow_generate(tmp_path, 0.25, "--model", tiny_checkpoint, "--progress-every", 0.05)
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = [PROMPT.match(ln) for ln in proc.stderr.splitlines()]
    lines = [m for m in lines if m]
    prompt = [m.group(3) for m in lines]
    assert len(set(prompt)) >= 3  # the count moved within the turns' prefills, chunk by chunk
    longest = max(prompt.count(p) for p in set(prompt))
    assert longest >= 3, proc.stderr  # lines kept coming while one chunk ran
    summary = re.search(r"generated (\d+) turns? \((\d+) tokens?, .*; ([\d,]+) prompt tokens prefilled\)", proc.stdout)
    last = lines[-1]
    assert (last.group(1), last.group(2)) == (summary.group(1), summary.group(1))
    assert (last.group(3), last.group(5)) == (summary.group(3).replace(",", ""), summary.group(2))
    assert time.monotonic() - started < 600 and out.exists()


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_on_a_terminal_generates_live_line_moves_inside_a_long_prefill_and_is_cleared(tiny_checkpoint, tmp_path):
    import pty

    argv, _ = _slow_generate(tmp_path, 0.5, "--model", tiny_checkpoint)
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=follower, env=dict(os.environ, COLUMNS="80", TERM="xterm"))
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait()
    os.close(leader)
    assert proc.returncode == 0
    screen = b"".join(chunks).decode(errors="replace")
    frames = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", f) for f in re.split(r"[\r\n]", screen)]
    drawn = [m.group(3) for m in (PROMPT.match(f) for f in frames) if m]
    assert len(set(drawn)) >= 3 and max(drawn.count(p) for p in set(drawn)) >= 2, frames[-40:]  # redrawn during a chunk
    assert all(len(f) <= 80 for f in frames if f.startswith("generate: "))
    assert screen.endswith("\x1b[2K"), repr(screen[-200:])
