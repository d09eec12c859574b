"""Inputs: the sessions of one command's input files, read once and rendered once (STYLE.md 14).

A command (replay, its --dry-run, generate) builds one `Inputs` from the paths it was given and hands it to every
step that needs the sessions: the shard plan, the manifest's identity (each file's fingerprint), the progress total,
the estimate and the replay. Before, each step went back to the files: one replay read and parsed every file up to
seven times and rendered its sessions several times.

Contract:
    Inputs(paths, max_sessions=None)      the paths resolved (directories expanded, "-" spooled once: reading.py's
                                          resolve_inputs) and checked (every input holds a record), before any work
    .files -> list[Path]
    .items(on_error) -> Session | Skipped, in input order, the first max_sessions (counting skipped ones). The files
                                          are parsed on the first call; the sessions are kept while the input is at
                                          most KEEP_BYTES on disk, and a larger input is streamed again by each later
                                          call (memory then holds one session at a time, as reading.py promises).
                                          on_error "fail" raises a bad session's error where the caller reaches it
                                          (the same SessionError the reader raised), "skip" yields it as Skipped.
    .count() -> int                       items within max_sessions (the progress line's total)
    .sha256(path) -> str                  a file's content hash, computed once per command
    .rendered(item, renderer)             renderer.render(item), once: kept until `release(item)` while the kept
                                          renderings hold at most KEEP_TOKENS tokens (past that, rendered again)
    .release(item)                        the caller is done with this session's rendering

Worked example (a replay of 3 sessions, the second another shard's): the shard plan reads ids from items() (one
parse of each file); the estimate renders sessions 0 and 2 (kept); the replay takes the kept renderings and releases
each once replayed; session 1 is rendered only if a drafter with state across sessions (suffix decoding) must see its
outputs. Each file is parsed once and each owned session rendered once.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable, Iterator

from .reading import Session, SessionError, Skipped, check_inputs, read_sessions, resolve_inputs

KEEP_BYTES = 256 * 2**20  # inputs up to this size on disk are parsed once and kept as Session objects
KEEP_TOKENS = 16_000_000  # renderings kept at once (token ids of every request: about 36 bytes a token)


class Inputs:
    """The sessions of a command's inputs, read once; see the module docstring."""

    def __init__(self, paths: Iterable[str | Path], max_sessions: int | None = None):
        self.files: list[Path] = resolve_inputs(paths)
        check_inputs(self.files)
        self.max_sessions = max_sessions
        self._kept: list | None = None  # every item (Session, or the SessionError of a bad one), when kept
        self._count: int | None = None
        self._sha: dict[Path, str] = {}
        self._rendered: dict[int, tuple[object, object]] = {}  # input index -> (renderer, RenderedSession)
        self._kept_tokens = 0
        self.reads = 0  # passes over the files (tests and benchmarks check there is one)
        self.renders = 0  # sessions rendered (likewise)

    @classmethod
    def of(cls, value, max_sessions: int | None = None) -> "Inputs":
        """An Inputs from paths, or the one given (the library takes either)."""
        if isinstance(value, Inputs):
            assert max_sessions is None or value.max_sessions in (None, max_sessions), "one Inputs, one --max-sessions"
            if max_sessions is not None and value.max_sessions is None:
                value.max_sessions = max_sessions
                value._count = None
            return value
        return cls(value, max_sessions)

    # -- reading ---------------------------------------------------------------------------------------------
    def _stream(self) -> Iterator:
        """Sessions and the SessionError of each bad one (read with on_error="skip", the error kept)."""
        self.reads += 1
        for item in read_sessions(self.files, on_error="skip"):
            if self.max_sessions is not None and item.index >= self.max_sessions:
                break
            yield item

    def _all(self) -> Iterator:
        if self._kept is not None:
            yield from self._kept
            return
        keep = sum(f.stat().st_size for f in self.files) <= KEEP_BYTES
        kept = [] if keep else None
        n = 0
        for item in self._stream():
            n += 1
            if kept is not None:
                kept.append(item)
            yield item
        self._count = n
        if kept is not None:
            self._kept = kept

    def items(self, on_error: str = "skip") -> Iterator[Session | Skipped]:
        assert on_error in ("fail", "skip"), on_error
        for item in self._all():
            if isinstance(item, Skipped) and on_error == "fail":
                raise item.error if item.error is not None else SessionError(item.path, item.line, item.session_id,
                                                                              item.message)
            yield item

    def count(self) -> int:
        """Items within max_sessions: exact once the files were read; before, counted cheaply (non-blank lines, a
        message-per-line file being one session) without parsing them."""
        if self._count is not None:
            return self._count
        n = sum(count_records(f) for f in self.files)
        return min(n, self.max_sessions) if self.max_sessions is not None else n

    def sha256(self, path: Path) -> str:
        path = Path(path)
        if path not in self._sha:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            self._sha[path] = h.hexdigest()
        return self._sha[path]

    # -- rendering -------------------------------------------------------------------------------------------
    def rendered(self, item: Session, renderer):
        """renderer.render(item), computed once while kept (SessionError propagates, as from the renderer)."""
        hit = self._rendered.get(item.index)
        if hit is not None and hit[0] is renderer:
            return hit[1]
        self.renders += 1
        out = renderer.render(item)
        n = out.n_tokens
        if self._kept_tokens + n <= KEEP_TOKENS:
            self._rendered[item.index] = (renderer, out)
            self._kept_tokens += n
        return out

    def release(self, item) -> None:
        hit = self._rendered.pop(item.index, None)
        if hit is not None:
            self._kept_tokens -= hit[1].n_tokens


def count_records(path: Path) -> int:
    """Sessions a file will yield, counted cheaply (non-blank lines; a message-per-line file is one)."""
    import json

    from .reading import GZIP_ERRORS, open_binary

    n, first = 0, None
    with open_binary(path) as f:
        try:
            for line in f:
                if line.strip():
                    if first is None:
                        first = line
                    n += 1
        except GZIP_ERRORS:
            pass  # a damaged .gz: the reader names it when it gets there; this is only the progress total
    if first is not None:
        try:
            head = json.loads(first)
            if isinstance(head, dict) and "role" in head and "messages" not in head:
                return 1
        except ValueError:
            pass
    return n
