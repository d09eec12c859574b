"""The replay's progress: counted in tokens within a session, its ETA from tokens/s, one line that fits 80 columns,
drawn live on a terminal and printed every N seconds without one."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from mtp_observe.run.options import Observer, ReplayOptions
from mtp_observe.run.pipeline import replay
from mtp_observe.run.progress import ProgressCounter, ProgressState, progress_line, progress_lines
from mtp_observe.wording import plural


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_prefill_chunks_advance_the_tokens_within_a_session_and_the_eta_comes_from_tokens_per_second():
    clock = Clock()
    c = ProgressCounter(clock=clock)
    c.start(2)
    c.session_start("long", 10_000, requests=4)
    c.request(0)
    clock.t = 1.0
    c.tokens(1_000)
    clock.t = 2.0
    s = c.tokens(1_000)
    assert s.tokens_done == 2_000 and s.sessions_done == 0 and s.request == 1
    assert s.rate == 1_000  # 2,000 tokens in the two seconds since the session started
    total, exact = s.total_tokens
    assert (total, exact) == (20_000, False)  # the unseen session estimated at the seen one's size
    assert s.eta_s == 18.0
    assert "~20.0k tok" in progress_line(s) and "ETA 00:18" in progress_line(s)


def test_a_finished_session_found_by_resume_counts_as_done_but_not_as_speed():
    clock = Clock()
    c = ProgressCounter(clock=clock)
    c.start(2)
    s = c.session("old", 50_000, skipped=False)  # no session_start: finished in an earlier run
    assert s.sessions_done == 1 and s.tokens_done == 50_000 and s.rate is None
    c.session_start("new", 100, requests=1)
    clock.t = 1.0
    c.tokens(50)
    clock.t = 2.0
    s = c.session("new", 100, skipped=False)
    assert s.fresh_tokens == 100 and s.rate == 50 and s.total_tokens == (50_100, True) and s.eta_s == 0


def test_a_ray_jobs_progress_counts_every_replicas_sessions_against_the_known_total_from_the_start():
    """Under --ray (cluster.py) the total is known before the first session (every session is rendered first) and
    sessions finish on several replicas at once: the rate runs from start(), the replicas being loaded by then."""
    clock = Clock()
    c = ProgressCounter(clock=clock)
    c.start(3, tokens=9_000)
    assert c.state.total_tokens == (9_000, True) and c.state.rate is None
    c.session("kept", 1_000, skipped=False)  # finished in an earlier run: done, not speed
    clock.t = 4.0
    c.replayed("a", 6_000, 3)
    clock.t = 5.0
    s = c.replayed("b", 2_000, 1)
    assert s.sessions_done == 3 and s.tokens_done == 9_000 and s.fresh_tokens == 8_000 and s.rate == 8_000 / 5.0
    assert s.total_tokens == (9_000, True) and s.eta_s == 0 and "9.0k/9.0k tok" in progress_line(s)


def test_the_line_fits_80_columns_with_a_long_id_and_large_numbers():
    s = ProgressState(sessions=123_456, sessions_done=99_999, skipped=12_345, tokens_done=9_876_543_210,
                      tokens_seen=9_999_999_999, sessions_seen=100_000, fresh_tokens=10**9, fresh_s=3.0,
                      session_id="x" * 300, request=123, requests=456, current_left=10)
    lines = progress_lines(s)
    assert all(len(ln) <= 80 for ln in lines) and "99,999/123,456 sessions" in lines[0] and "ETA" in lines[0]
    s = ProgressState(sessions=5_000, sessions_done=1_234, tokens_done=12_345_678, tokens_seen=20_000_000, sessions_seen=1_235,
                      fresh_tokens=10**6, fresh_s=3.0, session_id="claude-code-" + "x" * 300, request=12, requests=80)
    lines = progress_lines(s)
    assert len(lines) == 2 and all(len(ln) <= 80 for ln in lines)
    assert lines[1].startswith("  claude-code-xxx") and "… · request 12/80 · " in lines[1]


def test_counts_are_pluralised():
    assert plural(1, "session") == "1 session" and plural(2, "session") == "2 sessions" and plural(0, "token") == "0 tokens"
    assert "0/1 session " in progress_line(ProgressState(sessions=1))


class Recorder(Observer):
    def __init__(self):
        self.events = []

    def estimate(self, estimate):
        self.events.append(("estimate", estimate))

    def session_start(self, session_id, tokens, requests, work=None):
        self.events.append(("start", session_id, tokens, requests, work))

    def request(self, index):
        self.events.append(("request", index))

    def tokens(self, n):
        self.events.append(("tokens", n))

    def reused(self, n):
        self.events.append(("reused", n))

    def session(self, session_id, tokens, skipped):
        self.events.append(("end", session_id, tokens, skipped))


def test_a_replay_reports_every_request_chunk_and_reused_prefix_and_they_add_up_to_its_estimate(tiny_checkpoint, tmp_path):
    """The chunks computed add up to the estimate's tokens to prefill, the prefixes reused to its reused tokens, both to
    the session's tokens; the estimate comes first, with a time priced by the calibration."""
    from .test_replay import SESSION, write_sessions

    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    rec = Recorder()
    run = replay([sessions], tiny_checkpoint, tmp_path / "run", ReplayOptions(k=2, device="cpu", chunk_size=16), observer=rec)
    assert rec.events[0][0] == "estimate"
    estimate = rec.events[0][1]
    start = [e for e in rec.events if e[0] == "start"]
    assert len(start) == 1 and start[0][3] >= 2
    chunks = [e[1] for e in rec.events if e[0] == "tokens"]
    reused = [e[1] for e in rec.events if e[0] == "reused"]
    assert len(chunks) > start[0][3] and reused  # several chunks per request at chunk size 16; later requests reuse
    counts = json.loads((run / "run.json").read_text())["counts"]
    assert sum(chunks) + sum(reused) == start[0][2] == counts["tokens_replayed"] == estimate.work.tokens
    assert (sum(chunks), sum(reused)) == (estimate.work.prefill, estimate.work.reused)
    assert estimate.work.anchors == counts["anchors"] and estimate.work.drafts == counts["rows"]
    assert [e[1] for e in rec.events if e[0] == "request"] == list(range(start[0][3]))
    assert sum(w.prefill for w in start[0][4]) == sum(chunks)  # the session's work, request by request
    lo, hi = estimate.seconds
    assert 0 < lo < hi


def test_a_caller_whose_observer_drops_the_estimate_pays_no_calibration(tiny_checkpoint, tmp_path, monkeypatch):
    """The default Observer (a library caller's) is given no estimate, so the model is not calibrated for it; an
    observer that takes the estimate (above) is."""
    import mtp_observe.run.estimate as estimate
    from mtp_observe.run.generation import GenerateOptions, generate

    from .test_replay import SESSION, write_sessions

    def refuse(*args, **kwargs):
        raise AssertionError("calibrated for an observer that drops the estimate")

    monkeypatch.setattr(estimate, "_calibrate_replay", refuse)
    monkeypatch.setattr(estimate, "_calibrate_generate", refuse)
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    replay([sessions], tiny_checkpoint, tmp_path / "run", ReplayOptions(k=2, device="cpu"))
    generate([sessions], tiny_checkpoint, tmp_path / "own.jsonl", GenerateOptions(max_new_tokens=2, device="cpu"))
    rec = Recorder()
    try:
        replay([sessions], tiny_checkpoint, tmp_path / "again", ReplayOptions(k=2, device="cpu"), observer=rec)
    except AssertionError as e:
        assert "calibrated for an observer" in str(e)  # this one takes the estimate: it is calibrated
    else:
        raise AssertionError("an observer that takes the estimate was not calibrated for")


def number(text: str) -> float:
    """'1.2k' -> 1200.0 (progress._short's notation)."""
    scale = {"k": 1e3, "M": 1e6, "G": 1e9}.get(text[-1], 1)
    return float(text.rstrip("kMG")) * scale


def three_sessions(tmp_path):
    from .test_replay import SESSION, write_sessions

    return write_sessions(tmp_path / "three.jsonl", [{**SESSION, "id": f"s{i}"} for i in range(3)])


LINE = re.compile(r"^\[[#-]{10}\] \d+/\d+ sessions? [\d.]+[kMG]?/~?[\d.]+[kMG]? tok ")


def test_without_a_terminal_the_progress_line_is_printed_every_n_seconds_and_fits_80_columns(tiny_checkpoint, tmp_path):
    sessions = three_sessions(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "mtp_observe", "replay", str(sessions), "--model", str(tiny_checkpoint),
                           "--k", "2", "--device", "cpu", "--chunk-size", "16", "--out", str(tmp_path / "run"),
                           "--progress-every", "0.01"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if LINE.match(ln)]
    assert len(lines) >= 3, proc.stderr
    assert all(len(ln) <= 80 for ln in proc.stderr.splitlines())
    done = [number(re.search(r"sessions? ([\d.]+[kMG]?)/", ln).group(1)) for ln in lines]
    assert done == sorted(done) and done[-1] > done[0]
    quiet = subprocess.run([sys.executable, "-m", "mtp_observe", "replay", str(sessions), "--model", str(tiny_checkpoint),
                            "--k", "1", "--device", "cpu", "--out", str(tmp_path / "quiet"), "--progress-every", "0"],
                           capture_output=True, text=True)
    assert quiet.returncode == 0 and not any(LINE.match(ln) for ln in quiet.stderr.splitlines()), quiet.stderr


def test_on_an_80_column_terminal_the_live_line_fits_and_is_cleared_at_the_end(tiny_checkpoint, tmp_path):
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "mtp_observe", "replay", str(three_sessions(tmp_path)), "--model", str(tiny_checkpoint),
                             "--k", "1", "--device", "cpu", "--chunk-size", "16", "--out", str(tmp_path / "run")],
                            stdout=subprocess.PIPE, stderr=follower, env=dict(os.environ, COLUMNS="80", TERM="xterm"))
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
    drawn = [f for f in frames if "tok/s" in f]
    assert drawn, screen[-2000:]
    assert all(len(f) <= 80 for f in drawn), max(drawn, key=len)
    assert any(f.lstrip().startswith("s") and " · request " in f for f in frames), frames[-40:]  # the session's own line
    assert screen.endswith("\x1b[2K"), repr(screen[-200:])  # the last frame erased: stderr is left clean
