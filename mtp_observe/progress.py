"""A replay's progress, counted in tokens: what it has done, its rate, its ETA, as one line.

The replay reports (pipeline.Observer): the number of sessions; each session as it starts, with its
tokens and requests; every prefill chunk and every reused shared prefix as tokens done; each
request as it starts; each session as it ends. From these:

    done      tokens replayed so far (the current session's chunks included, so the line moves
              within a long session, not only when it ends)
    rate      tokens replayed by this process / seconds since it started its first session (a
              resumed run's finished sessions count as done, never as speed)
    total     the tokens of the sessions seen so far, plus the sessions not yet seen times the
              mean tokens of a seen one: an estimate ("~") until the last session has started — or,
              when the job knows every session's tokens up front (a Ray job, `start(sessions, tokens)`),
              that number: across the whole job, whichever replica replays what (`replayed`)
    ETA       (total - done) / rate

`progress_lines` renders that state as a line of at most `width` characters (80 by default), and a
second one with the session, its request and its tokens while a long session is replayed; used both
for the live display on a terminal and, without one, for plain lines printed every N seconds (a CI
log). This module imports no torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from .wording import plural


@dataclass(frozen=True)
class ProgressState:
    sessions: int = 0  # sessions this process will handle
    sessions_done: int = 0
    skipped: int = 0
    tokens_done: int = 0  # tokens of finished sessions and of the current one so far
    tokens_seen: int = 0  # total tokens of every session that has started (or was found finished)
    sessions_seen: int = 0
    fresh_tokens: int = 0  # tokens this process replayed itself (the rate's numerator)
    fresh_s: float = 0.0  # seconds since its first fresh token
    session_id: str | None = None  # the session being replayed
    request: int = 0  # its current request (1-based) ...
    requests: int = 0  # ... of this many
    current_tokens: int = 0  # tokens of the current session
    current_left: int = 0  # ... not yet done
    elapsed_s: float = 0.0
    known_tokens: int | None = None  # every session's tokens, when known before the first one starts

    @property
    def rate(self) -> float | None:
        return self.fresh_tokens / self.fresh_s if self.fresh_s > 0 and self.fresh_tokens > 0 else None

    @property
    def total_tokens(self) -> tuple[int, bool]:
        """(total tokens, exact?): the seen sessions' tokens plus the unseen ones at the seen mean."""
        if self.known_tokens is not None:
            return self.known_tokens, True
        unseen = max(self.sessions - self.sessions_seen - self.skipped, 0)
        seen_sessions = max(self.sessions_seen, 1)
        estimate = self.tokens_seen + round(unseen * self.tokens_seen / seen_sessions)
        return estimate, unseen == 0

    @property
    def eta_s(self) -> float | None:
        rate = self.rate
        if rate is None:
            return None
        total, _ = self.total_tokens
        return max(total - self.tokens_done, 0) / rate


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
        sid = state.session_id if len(state.session_id) <= room else state.session_id[: room - 1] + "…"
        lines.append(f"  {sid}{tail}"[:width])
    return lines


def progress_line(state: ProgressState, width: int = 80) -> str:
    """progress_lines joined: one text of one or two lines (the live display and the plain log print it)."""
    return "\n".join(progress_lines(state, width))


@dataclass
class ProgressCounter:
    """The mutable side: folds the observer's events into ProgressState (the CLI draws it)."""

    clock: object = time.monotonic
    state: ProgressState = field(default_factory=ProgressState)
    started: float | None = None
    fresh_started: float | None = None

    def _now(self) -> float:
        now = self.clock()
        if self.started is None:
            self.started = now
        return now

    def _set(self, **changes) -> ProgressState:
        now = self._now()
        fresh_s = now - self.fresh_started if self.fresh_started is not None else 0.0
        self.state = replace(self.state, elapsed_s=now - self.started, fresh_s=fresh_s, **changes)
        return self.state

    def start(self, sessions: int, tokens: int | None = None) -> ProgressState:
        return self._set(sessions=sessions, known_tokens=tokens)

    def session_start(self, session_id: str, tokens: int, requests: int) -> ProgressState:
        if self.fresh_started is None:
            self.fresh_started = self._now()
        s = self.state
        return self._set(session_id=session_id, request=0, requests=requests, current_tokens=tokens, current_left=tokens,
                         tokens_seen=s.tokens_seen + tokens, sessions_seen=s.sessions_seen + 1)

    def request(self, index: int) -> ProgressState:
        return self._set(request=index + 1)

    def tokens(self, n: int) -> ProgressState:
        s = self.state
        n = min(n, s.current_left)
        return self._set(tokens_done=s.tokens_done + n, fresh_tokens=s.fresh_tokens + n, current_left=s.current_left - n)

    def session(self, session_id: str, tokens: int, skipped: bool) -> ProgressState:
        """A session ended: replayed (its remaining tokens done), skipped, or found finished (resumed)."""
        s = self.state
        if skipped:
            return self._set(sessions_done=s.sessions_done + 1, skipped=s.skipped + 1, session_id=None, current_left=0,
                             current_tokens=0)
        if s.session_id == session_id:  # replayed here: the tokens not reported by chunks
            left = s.current_left
            fresh = dict(fresh_tokens=s.fresh_tokens + left)
            seen = {}
        else:  # finished in an earlier run: done, counted in the total, not in the rate
            left, fresh = tokens, {}
            seen = dict(tokens_seen=s.tokens_seen + tokens, sessions_seen=s.sessions_seen + 1)
        return self._set(sessions_done=s.sessions_done + 1, tokens_done=s.tokens_done + left, session_id=None,
                         requests=0, request=0, current_left=0, current_tokens=0, **fresh, **seen)

    def replayed(self, session_id: str, tokens: int, requests: int) -> ProgressState:
        """A session replayed by a replica (a Ray job) is done: its tokens are done and fresh; the rate runs from
        start() (the replicas are loaded then), since sessions are replayed side by side."""
        if self.fresh_started is None:
            self._now()
            self.fresh_started = self.started
        s = self.state
        return self._set(sessions_done=s.sessions_done + 1, tokens_done=s.tokens_done + tokens,
                         fresh_tokens=s.fresh_tokens + tokens, tokens_seen=s.tokens_seen + tokens,
                         sessions_seen=s.sessions_seen + 1)


class ProgressDisplay:
    """The replay's observer in the CLI: on a terminal a live line (redrawn at most 10 times a second,
    cleared when the replay ends, so a failure's error line stands alone); without one, the same line
    printed every `every_s` seconds (0: never), for CI logs. Warnings and notes print above it."""

    def __init__(self, console, live: bool, every_s: float, say, clock=time.monotonic):
        self.console = console
        self.say = say  # cli.say: one literal line
        self.counter = ProgressCounter(clock=clock)
        self.clock = clock
        self.every_s = every_s
        self.live = None
        self.last = None
        self.current = None
        if live:
            from rich.live import Live

            self.live = Live(console=console, transient=True, auto_refresh=False, redirect_stdout=False,
                             redirect_stderr=False)

    def __enter__(self):
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.__exit__(*exc)
        return False

    def _draw(self, state: ProgressState, force: bool = False) -> None:
        now = self.clock()
        if self.live is not None:
            if force or self.last is None or now - self.last >= 0.1:
                from rich.text import Text

                self.live.update(Text(progress_line(state, width=min(self.console.width, 120))), refresh=True)
                self.last = now
        elif self.every_s > 0:
            if self.last is None:
                self.last = now  # the first line after every_s seconds, not at once
            elif now - self.last >= self.every_s:
                for line in progress_lines(state, width=80):
                    self.say(self.console, line)
                self.last = now

    def start(self, sessions: int, tokens: int | None = None) -> None:
        self._draw(self.counter.start(sessions, tokens), force=True)

    def session_start(self, session_id: str, tokens: int, requests: int) -> None:
        from .literal import visible

        self.current = session_id
        self._draw(self.counter.session_start(visible(session_id), tokens, requests))

    def request(self, index: int) -> None:
        self._draw(self.counter.request(index))

    def tokens(self, n: int) -> None:
        self._draw(self.counter.tokens(n))

    def session(self, session_id: str, tokens: int, skipped: bool) -> None:
        from .literal import visible

        self._draw(self.counter.session(visible(session_id), tokens, skipped))

    def replayed(self, session_id: str, tokens: int, requests: int) -> None:
        self._draw(self.counter.replayed(session_id, tokens, requests))

    def warn(self, message: str) -> None:
        self.say(self.console, f"skipped: {message}")

    def note(self, message: str) -> None:
        self.say(self.console, f"note: {message}")
