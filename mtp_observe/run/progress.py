"""Progress of a replay or a generate: what it has done, its rate, its ETA, as one line (or two).

Work, not sessions or tokens, is what the ETA counts. The run first makes an estimate (estimate.py: the
work ahead priced in seconds by a calibration on the model) and then reports as it goes:

    replay   (pipeline.Observer) each session as it starts, with its estimate.ReplayWork; every prefill chunk
             computed (`tokens`) and every prefix reused from the request before (`reused`, no work); each
             request; each session as it ends
    generate (generation.Observer) every prefill chunk's prompt tokens (`prefilled`), every decode step's
             tokens (`generated`), each batch of turns as it ends
    Under --ray the job knows every session's tokens before the first is dispatched (`start(sessions, tokens)`),
    and each session done by a replica comes as one `replayed` event: the line then counts the whole job.

From these:

    done      replay: tokens replayed so far (reused ones too; the current session's chunks included, so the
              line moves within a long session). generate: prompt tokens prefilled and tokens generated
    work      the estimate's seconds done: a replay session's priced work in proportion to its tokens computed
              so far (prefill and draft work together: a session heavy in drafts or in long contexts weighs more
              than its tokens); generate's prompt tokens and generated tokens at the estimate's price of each
    speed     work done per second over the last WINDOW_S seconds (not per session, not since the start):
              steady work gives a steady speed whatever the sessions' sizes; before PRIOR_S seconds of it the
              estimate's own speed (1) fills the rest, so the first ETA is the estimate
    ETA       work left / speed, less the seconds since the last report (it counts down inside a long chunk)
    rate      tokens per second over the same window (what the line shows as tok/s)

Without an estimate (a caller that makes none) the work is the tokens themselves and the total is the seen
sessions' tokens plus the unseen ones at the seen mean ("~").

`progress_lines` / `generation_lines` render the state in at most `width` characters (80 by default);
`ProgressDisplay` draws it: on a terminal a live line refreshed four times a second by rich's own thread,
without one a plain line printed every N seconds by a timer thread, so a line comes on time even while one
prefill chunk takes longer than N seconds. This module imports no torch.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace

from ..wording import plural

WINDOW_S = 120.0  # the speed's window
PRIOR_S = 10.0  # seconds of the estimate's own speed blended in while the window holds less than this
MIN_EVERY_S = 0.01  # plain lines at most this often


@dataclass(frozen=True)
class ProgressState:
    sessions: int = 0  # sessions this process will handle
    sessions_done: int = 0
    skipped: int = 0
    tokens_done: int = 0  # tokens of finished sessions and of the current one so far
    tokens_seen: int = 0  # total tokens of every session that has started (or was found finished)
    sessions_seen: int = 0
    tokens_total: int | None = None  # every token of the sessions to handle, from the estimate (exact)
    fresh_tokens: int = 0  # tokens done within the rate's window (its numerator)
    fresh_s: float = 0.0  # ... and the window's seconds
    work_left: float | None = None  # the estimate's seconds of work left (None: no estimate; the ETA counts tokens)
    speed: float | None = None  # work done per second over the window
    stalled_s: float = 0.0  # seconds since the last report
    session_id: str | None = None  # the session being replayed
    request: int = 0  # its current request (1-based) ...
    requests: int = 0  # ... of this many
    current_tokens: int = 0  # tokens of the current session
    current_left: int = 0  # ... not yet done
    elapsed_s: float = 0.0

    @property
    def rate(self) -> float | None:
        return self.fresh_tokens / self.fresh_s if self.fresh_s > 0 and self.fresh_tokens > 0 else None

    @property
    def total_tokens(self) -> tuple[int, bool]:
        """(total tokens, exact?): the estimate's, else the seen sessions' tokens plus the unseen ones at the seen mean."""
        if self.tokens_total is not None:
            return self.tokens_total, True
        unseen = max(self.sessions - self.sessions_seen - self.skipped, 0)
        seen_sessions = max(self.sessions_seen, 1)
        estimate = self.tokens_seen + round(unseen * self.tokens_seen / seen_sessions)
        return estimate, unseen == 0

    @property
    def eta_s(self) -> float | None:
        if self.work_left is not None:
            left, speed = self.work_left, self.speed
        else:
            total, _ = self.total_tokens
            left, speed = max(total - self.tokens_done, 0), self.rate
        if speed is None or speed <= 0:
            return None
        return max(left / speed - self.stalled_s, 0.0)


def _short(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{int(n)}"


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


LONG_SESSION_TOKENS = 8192  # a session of one request gets its own line from this size on


def progress_lines(state: ProgressState, width: int = 80, bar: int = 10) -> list[str]:
    """The progress as one line, or two while a long session is replayed (several requests, or
    LONG_SESSION_TOKENS and more), each of at most `width` characters:

        [####------] 2/5 sessions 12.3k/~40.1k tok 812 tok/s ETA 00:34 (1 skipped)
          claude-code-7f3a… · request 3/7 · 4.1k/9.8k tok

    The session id is shortened first to fit; what still does not fit is cut at `width`."""
    from ..literal import visible

    total, exact = state.total_tokens
    share = min(state.tokens_done / total, 1.0) if total else (state.sessions_done / state.sessions if state.sessions else 0.0)
    filled = int(round(share * bar))
    rate = state.rate
    line = " ".join([
        f"[{'#' * filled}{'-' * (bar - filled)}]",
        f"{state.sessions_done:,}/{plural(state.sessions, 'session')}",
        f"{_short(state.tokens_done)}/{'' if exact else '~'}{_short(total)} tok",
        f"{_short(rate)} tok/s" if rate is not None else "- tok/s",
        f"ETA {clock(state.eta_s)}",
    ])
    if state.skipped and len(line) + len(f" ({state.skipped:,} skipped)") <= width:
        line += f" ({state.skipped:,} skipped)"
    lines = [line[:width]]
    if state.session_id is not None and (state.requests > 1 or state.current_tokens >= LONG_SESSION_TOKENS):
        done = state.current_tokens - state.current_left
        tail = f" · request {state.request}/{state.requests} · {_short(done)}/{_short(state.current_tokens)} tok"
        room = max(width - 2 - len(tail), 4)
        sid = visible(state.session_id)
        sid = sid if len(sid) <= room else sid[: room - 1] + "…"
        lines.append(f"  {sid}{tail}"[:width])
    return lines


def progress_line(state: ProgressState, width: int = 80) -> str:
    """progress_lines joined: one text of one or two lines (the live display and the plain log print it)."""
    return "\n".join(progress_lines(state, width))


class _Speed:
    """Work and tokens done, sampled at each report; the speed over the last WINDOW_S seconds of samples."""

    def __init__(self, window_s: float = WINDOW_S, prior: bool = False):
        self.window_s = window_s
        self.prior = prior  # the work is in the estimate's seconds: its own speed, 1, fills a short window
        self.samples: deque = deque()  # (t, work, tokens)

    def add(self, t: float, work: float, tokens: int) -> None:
        self.samples.append((t, work, tokens))
        while len(self.samples) > 2 and self.samples[1][0] <= t - self.window_s:
            self.samples.popleft()  # keep the last sample at or before the window's start

    def read(self) -> tuple[float | None, int, float]:
        """(work per second, tokens in the window, the window's seconds)."""
        if not self.samples:
            return (1.0 if self.prior else None), 0, 0.0
        (t0, w0, n0), (t1, w1, n1) = self.samples[0], self.samples[-1]
        span, work = t1 - t0, w1 - w0
        pad = max(PRIOR_S - span, 0.0) if self.prior else 0.0
        speed = (work + pad) / (span + pad) if span + pad > 0 and (work > 0 or pad > 0) else None
        return speed, n1 - n0, span


@dataclass
class ProgressCounter:
    """The mutable side of a replay's progress: folds the observer's events into ProgressState."""

    clock: object = time.monotonic
    state: ProgressState = field(default_factory=ProgressState)
    started: float | None = None

    def __post_init__(self):
        self.rates = None  # estimate.Rates: prices the sessions' work in seconds
        self.work_total: float | None = None
        self.work_done = 0.0  # finished sessions' work (seconds; without rates: tokens)
        self.parts: list[tuple[float, float, int]] = []  # the current session's requests: (prefill s, all s, prefill tokens)
        self.current = -1  # its current request
        self.computed = 0  # tokens (without rates: and reused ones) of the current request so far
        self.fresh = 0  # tokens replayed by this process
        self.speed: _Speed | None = None  # from the first session this process replays
        self.last_report: float | None = None
        self.begun = False  # start() has been called: there is something to draw

    def _now(self) -> float:
        now = self.clock()
        if self.started is None:
            self.started = now
        return now

    def _done_work(self) -> float:
        """Finished sessions' work, the current session's finished requests' work, and the current request's
        prefill work in proportion to its tokens computed (its drafts come after its prefill)."""
        if self.rates is None:
            return self.work_done + self.computed
        done = sum(total for _, total, _ in self.parts[: max(self.current, 0)])
        if 0 <= self.current < len(self.parts):
            prefill_s, _, tokens = self.parts[self.current]
            done += prefill_s * min(self.computed / tokens, 1.0) if tokens else 0.0
        return self.work_done + done

    def _set(self, sample: bool = False, **changes) -> ProgressState:
        now = self._now()
        if sample and self.speed is not None:
            self.speed.add(now, self._done_work(), self.fresh)
            self.last_report = now
        self.state = replace(self.state, **changes)
        return self.snapshot(now)

    def snapshot(self, now: float | None = None) -> ProgressState:
        """The state as of now (the ETA counts down since the last report)."""
        now = self._now() if now is None else now
        speed, tokens, span = self.speed.read() if self.speed is not None else (None, 0, 0.0)
        left = None
        if self.work_total is not None:
            left = max(self.work_total - self._done_work(), 0.0)
            speed = speed if speed is not None else 1.0
        elif self.rates is None:
            speed = None  # the state's own token rate prices the tokens left
        stalled = now - self.last_report if self.last_report is not None else 0.0
        return replace(self.state, elapsed_s=now - self.started, fresh_tokens=tokens, fresh_s=span, work_left=left,
                       speed=speed, stalled_s=stalled)

    def estimate(self, estimate) -> ProgressState:
        from .estimate import replay_seconds

        w = estimate.work
        self.rates = estimate.rates
        self.work_total = replay_seconds(w, self.rates) if self.rates is not None else None
        return self._set(tokens_total=w.tokens + w.done_tokens)

    def start(self, sessions: int, tokens: int | None = None) -> ProgressState:
        """sessions this process handles; tokens: every session's, when known before the first starts (a Ray job)."""
        self.begun = True
        if tokens is not None and self.speed is None:  # a Ray job: the replicas are loaded, the speed runs from now
            self.speed = _Speed(prior=False)
            self.speed.add(self._now(), self._done_work(), self.fresh)
        return self._set(sessions=sessions, **({"tokens_total": tokens} if tokens is not None else {}))

    def replayed(self, session_id: str, tokens: int, requests: int) -> ProgressState:
        """A session replayed by a replica (a Ray job) is done: its tokens are done and fresh, and the speed is the
        whole job's, since sessions are replayed side by side. No per-session estimate reaches this process, so the
        work is the tokens."""
        if self.rates is not None:
            self.rates = self.work_total = None
        if self.speed is None:
            self.speed = _Speed(prior=False)
            self.speed.add(self._now(), self._done_work(), self.fresh)
        self.fresh += tokens
        self.work_done += tokens
        s = self.state
        return self._set(sample=True, sessions_done=s.sessions_done + 1, tokens_done=s.tokens_done + tokens,
                         tokens_seen=s.tokens_seen + tokens, sessions_seen=s.sessions_seen + 1)

    def session_start(self, session_id: str, tokens: int, requests: int, work=None) -> ProgressState:
        """work: the session's estimate.ReplayWork per request (estimate.request_works), None without an estimate."""
        from .estimate import replay_parts

        if self.rates is not None and work is None:
            self.rates = self.work_total = None  # a caller that prices no session: the work is the tokens
        self.parts = [replay_parts(w, self.rates) for w in work] if self.rates is not None else []
        self.current, self.computed = -1, 0
        if self.speed is None:
            self.speed = _Speed(prior=self.work_total is not None)
            self.speed.add(self._now(), self._done_work(), self.fresh)
        s = self.state
        return self._set(session_id=session_id, request=0, requests=requests, current_tokens=tokens, current_left=tokens,
                         tokens_seen=s.tokens_seen + tokens, sessions_seen=s.sessions_seen + 1)

    def request(self, index: int) -> ProgressState:
        if self.rates is not None:
            self.current, self.computed = index, 0
        return self._set(sample=True, request=index + 1)

    def tokens(self, n: int, computed: bool = True) -> ProgressState:
        s = self.state
        n = min(n, s.current_left)
        self.fresh += n
        if computed or self.rates is None:
            self.computed += n
        return self._set(sample=True, tokens_done=s.tokens_done + n, current_left=s.current_left - n)

    def reused(self, n: int) -> ProgressState:
        return self.tokens(n, computed=False)

    def session(self, session_id: str, tokens: int, skipped: bool) -> ProgressState:
        """A session ended: replayed (its remaining tokens done), skipped, or found finished (resumed)."""
        s = self.state
        if skipped:  # before it started (it did not render): no work of it was in the estimate
            return self._set(sessions_done=s.sessions_done + 1, skipped=s.skipped + 1, session_id=None, current_left=0,
                             current_tokens=0)
        if s.session_id == session_id:  # replayed here: the tokens not reported by chunks, and all of its work
            left = s.current_left
            self.fresh += left
            self.work_done += sum(total for _, total, _ in self.parts) if self.rates is not None else self.computed + left
            self.parts, self.current, self.computed = [], -1, 0
            seen, sample = {}, True
        else:  # finished in an earlier run: done, counted in the total, not in the rate
            left, sample = tokens, False
            seen = dict(tokens_seen=s.tokens_seen + tokens, sessions_seen=s.sessions_seen + 1)
        return self._set(sample=sample, sessions_done=s.sessions_done + 1, tokens_done=s.tokens_done + left,
                         session_id=None, requests=0, request=0, current_left=0, current_tokens=0, **seen)


# ---------------------------------------------------------------------------------------------
# generate


@dataclass(frozen=True)
class GenerationState:
    turns: int = 0  # turns this run generates
    turns_done: int = 0
    prompt_total: int = 0  # prompt tokens to prefill (the estimate's; else those of the batches begun)
    prompt_done: int = 0
    generated: int = 0  # tokens generated so far
    fresh_tokens: int = 0  # prompt and generated tokens within the rate's window ...
    fresh_s: float = 0.0  # ... and its seconds
    work_left: float | None = None  # the estimate's seconds of work left
    speed: float | None = None
    stalled_s: float = 0.0
    elapsed_s: float = 0.0

    @property
    def rate(self) -> float | None:
        return self.fresh_tokens / self.fresh_s if self.fresh_s > 0 and self.fresh_tokens > 0 else None

    @property
    def eta_s(self) -> float | None:
        if self.work_left is None or not self.speed:
            return None
        return max(self.work_left / self.speed - self.stalled_s, 0.0)


class GenerationCounter:
    """The mutable side of a generate's progress (generation.Observer's events)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.state = GenerationState()
        self.started = None
        self.prompt_price = 1.0  # the estimate's seconds per prompt token (its padding and attention included)
        self.token_price = 1.0  # ... per generated token
        self.expected_per_turn: float | None = None  # the estimate's tokens per turn, until turns finish
        self.speed: _Speed | None = None
        self.last_report = None
        self.begun = False
        self.priced = False

    def _now(self) -> float:
        now = self.clock()
        if self.started is None:
            self.started = now
        return now

    def _work(self, s: GenerationState) -> float:
        return s.prompt_done * self.prompt_price + s.generated * self.token_price

    def _left(self, s: GenerationState) -> float | None:
        per_turn = s.generated / s.turns_done if s.turns_done else self.expected_per_turn
        if per_turn is None:
            return None
        expected = max(s.turns * per_turn, s.generated)
        return (max(s.prompt_total - s.prompt_done, 0) * self.prompt_price
                + max(expected - s.generated, 0) * self.token_price)

    def _set(self, sample: bool = False, **changes) -> GenerationState:
        now = self._now()
        self.state = replace(self.state, **changes)
        if sample:
            if self.speed is None:
                self.speed = _Speed(prior=self.priced)
                self.speed.add(self.started, 0.0, 0)
            self.speed.add(now, self._work(self.state), self.state.prompt_done + self.state.generated)
            self.last_report = now
        return self.snapshot(now)

    def snapshot(self, now: float | None = None) -> GenerationState:
        now = self._now() if now is None else now
        speed, tokens, span = self.speed.read() if self.speed is not None else ((1.0 if self.priced else None), 0, 0.0)
        stalled = now - self.last_report if self.last_report is not None else 0.0
        return replace(self.state, elapsed_s=now - self.started, fresh_tokens=tokens, fresh_s=span,
                       work_left=self._left(self.state), speed=speed, stalled_s=stalled)

    def estimate(self, estimate) -> GenerationState:
        from .estimate import generate_prices

        w = estimate.work
        if estimate.rates is not None and w.prompt and w.generated_low:
            self.prompt_price, self.token_price = generate_prices(w, estimate.rates)
            self.priced = True
        self.expected_per_turn = w.generated_low / w.turns if w.turns else None
        return self._set(prompt_total=w.prompt)

    def start(self, turns: int) -> GenerationState:
        self.begun = True
        self.started = self._now()
        return self._set(turns=turns)

    def prefilled(self, n: int) -> GenerationState:
        return self._set(sample=True, prompt_done=self.state.prompt_done + n)

    def generated(self, n: int) -> GenerationState:
        return self._set(sample=True, generated=self.state.generated + n)

    def turns(self, turns: int, tokens: int) -> GenerationState:
        """A batch ended: its turns are done (its tokens were counted step by step)."""
        return self._set(sample=True, turns_done=self.state.turns_done + turns)


def generation_lines(state: GenerationState, width: int = 80) -> list[str]:
    """generate's progress in one line of at most `width` characters:

        generate: 12/57 turns · prompt 45.1k/163.2k · 1.2k generated · 812 tok/s · ETA 03:10

    (shorter words where that does not fit)."""
    rate = f"{_short(state.rate)} tok/s" if state.rate is not None else "- tok/s"
    head = f"generate: {state.turns_done:,}/{plural(state.turns, 'turn')}"
    prompt = f"{_short(state.prompt_done)}/{_short(state.prompt_total)}"
    eta = f"ETA {clock(state.eta_s)}"
    for parts in ([head, f"prompt {prompt}", f"{_short(state.generated)} generated", rate, eta],
                  [head, f"prompt {prompt}", f"{_short(state.generated)} new", rate, eta],
                  [head, f"prompt {prompt}", f"{_short(state.generated)} new", eta]):
        line = " · ".join(parts)
        if len(line) <= width:
            return [line]
    return [line[:width]]


# ---------------------------------------------------------------------------------------------
# Drawing


class ProgressDisplay:
    """A run's observer in the CLI, around a counter (ProgressCounter, GenerationCounter) whose events it passes on:
    on a terminal a live view of `lines` (rich's Live, refreshed four times a second by its own thread from the
    counter's snapshot, begun at the counter's start() and cleared when the run ends, so a failure's error line
    stands alone); without one, the same lines printed every `every_s` seconds (0: never) by a timer thread, and
    once more at a clean end, for CI logs. The estimate's line (estimate.estimate_line) goes to `on_estimate` before
    anything is drawn. Warnings and notes print above the live view."""

    def __init__(self, console, live: bool, every_s: float, say, counter=None, lines=None, on_estimate=None,
                 clock=time.monotonic):
        self.console = console
        self.say = say  # cli.say: one literal line
        self.counter = counter if counter is not None else ProgressCounter(clock=clock)
        self.lines = lines or progress_lines
        self.on_estimate = on_estimate
        self.every_s = max(every_s, MIN_EVERY_S) if every_s > 0 else 0.0
        self.want_live = live
        self.live = None
        self.printed = 0  # plain lines printed
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._timer = None

    def __enter__(self):
        if not self.want_live and self.every_s > 0:
            self._timer = threading.Thread(target=self._tick, name="mtp-observe progress", daemon=True)
            self._timer.start()
        return self

    def __exit__(self, exc_type, *exc):
        self._stop.set()
        if self._timer is not None:
            self._timer.join()
        if self.live is not None:
            self.live.__exit__(exc_type, *exc)
        elif exc_type is None and self.printed:
            self._print()  # the last state, once: a log ends at 100%
        return False

    def _print(self) -> None:
        for line in self.lines(self.counter.snapshot(), 80):
            self.say(self.console, line)
        self.printed += 1

    def _tick(self) -> None:
        while not self._stop.wait(self.every_s):
            if self.counter.begun:
                with self._lock:
                    self._print()

    def _renderable(self):
        from rich.text import Text

        return Text("\n".join(self.lines(self.counter.snapshot(), min(self.console.width, 120))))

    def _begin_live(self) -> None:
        from rich.live import Live

        self.live = Live(get_renderable=self._renderable, console=self.console, transient=True, auto_refresh=True,
                         refresh_per_second=4, redirect_stdout=False, redirect_stderr=False)
        self.live.__enter__()

    def estimate(self, estimate) -> None:
        from .estimate import estimate_line

        self.counter.estimate(estimate)
        if self.on_estimate is not None:
            self.on_estimate(estimate_line(estimate))

    def start(self, *args, **kwargs) -> None:
        self.counter.start(*args, **kwargs)  # a Ray job passes its total tokens (cluster.py: tokens=)
        if self.want_live and self.live is None:
            self._begin_live()

    def __getattr__(self, name):
        """The observer's other events (session_start, tokens, prefilled, ...) go to the counter."""
        if name.startswith("_") or name in ("counter", "lines"):
            raise AttributeError(name)
        handler = getattr(self.counter, name)

        def event(*args, **kwargs) -> None:
            handler(*args, **kwargs)

        return event

    def warn(self, message: str) -> None:
        with self._lock:
            self.say(self.console, f"skipped: {message}")

    def note(self, message: str) -> None:
        with self._lock:
            self.say(self.console, f"note: {message}")
