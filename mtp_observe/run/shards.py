"""Shards: which sessions one of N independent jobs replays, decided by the session id alone.

A scheduler array (Slurm `--array`, a Kubernetes indexed job) runs N copies of one command that differ only in
their index I. Each copy reads the whole input, replays the sessions of shard I and writes a complete run
directory of its own; `mtp-observe merge` checks and joins them (merge.py). What a shard holds must therefore
not depend on anything the copies may see differently — file order, how the input is split into files, the
number of processes of each copy, a resumed or a fresh start — only on the sessions (the complaint this answers:
Ray Data users finding shard contents that change with the block layout between runs).

Contract:
    parse_shard("2/8", by="id") -> Shard   --shard I/N and --shard-by id|tokens, checked in one line
    shard_of(key, count) -> int            the id rule (below)
    balance(sizes, count) -> {key: shard}  the tokens rule (below)
    plan_shard(inputs, shard, renderer, max_sessions) -> ShardPlan
                                           the shard's sessions, read from the whole input before any replay:
                                           `ShardPlan.owns(key)` and the manifest entry (`ShardPlan.manifest`)
    session_key(item) -> str               what a session (or a skipped input line) is assigned by
    input_set(inputs) -> str               the fingerprint of the whole input set

The id rule (`--shard-by id`, the default): shard(id) = int.from_bytes(sha256(id as UTF-8)[:8], "big") mod N.
Worked example: sha256("demo") starts 2a97516c354b6884, so "demo" is in shard 0x2a97516c354b6884 mod 4 = 0 of 4
(tests/test_shards.py pins it). It depends on the id and N only: reordering sessions, splitting or joining the
files that hold them, or another world size leaves every session where it was.

The tokens rule (`--shard-by tokens`): every session is rendered first (the run's tokenizer and template) and
the sessions, longest first (ties by id), each go to the shard holding the fewest tokens so far (ties: the lowest
index) — the longest-processing-time rule, so no shard is left with one huge straggler: the largest shard exceeds
the mean by at most the longest session. It depends on the whole input set (a session added anywhere can move
others) but not on its order or its files; a session that does not render goes by the id rule.

Default ids and re-split inputs. A session without an "id" is called `<label>:<line>` (sessions.py: the file's
shortest unique trailing path and the line). Its id — and so its shard — changes when its file is renamed, split
or joined, or when another input of the same name is added: the rule hashes the id, and a default id names a
place, not a session. Give sessions ids (`mtp-observe import` writes them) before splitting or regrouping the
files of a sharded job; every copy of one job must be given the same input files (the run's `shard.input_set`
fingerprint, which merge checks). A line that is not a session at all (bad JSON, no readable id) is assigned by
its place, `<path>:<line>`, so exactly one shard reports it.

This module imports no torch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ..errors import OptionError

BY = ("id", "tokens")
RULES = {
    "id": "shard = int.from_bytes(sha256(session id, UTF-8)[:8], 'big') mod count",
    "tokens": "sessions rendered, longest first (ties by id), each to the shard with the fewest tokens so far "
              "(ties: the lowest index); a session that does not render by the id rule",
}


@dataclass(frozen=True)
class Shard:
    index: int  # I, 0-based
    count: int  # N
    by: str = "id"  # "id" | "tokens"

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str, by: str = "id", option: str = "--shard") -> Shard:
    """--shard I/N (I in 0..N-1; Slurm's $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT) and --shard-by."""
    index, sep, count = str(text).partition("/")
    if not sep or not index.strip().isdigit() or not count.strip().isdigit():
        raise OptionError(f"{option} {text}: expected I/N, this job's index I of N shards (0 <= I < N), e.g. 0/4 "
                          "or $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT")
    i, n = int(index), int(count)
    if n < 1:
        raise OptionError(f"{option} {text}: the number of shards N must be at least 1")
    if not 0 <= i < n:
        raise OptionError(f"{option} {text}: the index I counts from 0, so it is at most {n - 1} for {n} shards "
                          "(a 1-based array index? pass I-1)")
    if by not in BY:
        raise OptionError(f"--shard-by {by}: expected id or tokens")
    return Shard(i, n, by)


def shard_of(key: str, count: int) -> int:
    """The id rule: the first 8 bytes of sha256(key) as a big-endian integer, modulo count (module doc)."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % count


def balance(sizes: dict[str, int], count: int) -> dict[str, int]:
    """The tokens rule: {key: tokens} -> {key: shard}, the longest first to the least loaded shard (module doc).
    Worked example, 2 shards: {a: 9, b: 5, c: 4, d: 3} -> a to 0 (9), b to 1 (5), c to 1 (9), d to 0 (12)."""
    import heapq

    loads = [(0, i) for i in range(count)]  # (tokens so far, shard): the heap's smallest is the least loaded, lowest index
    out: dict[str, int] = {}
    for key in sorted(sizes, key=lambda k: (-sizes[k], k)):
        tokens, shard = heapq.heappop(loads)
        out[key] = shard
        heapq.heappush(loads, (tokens + sizes[key], shard))
    return out


def session_key(item) -> str:
    """What a session (sessions.Session) or a skipped input (sessions.Skipped) is assigned by: its id, or, for a
    line with no readable id, its place `<path>:<line>`."""
    sid = getattr(item, "id", None)
    if sid is None:
        sid = getattr(item, "session_id", None)
    return sid if sid is not None else f"{item.path}:{item.line}"


def input_set(inputs) -> str:
    """sha256 over every input's label (the part of its path default ids start with) and content sha256, in input
    order: the same files in the same order give the same fingerprint wherever they are mounted. inputs:
    sessions.inputs.Inputs, or the input files."""
    from ..sessions.inputs import Inputs
    from ..sessions.reading import input_stem, path_labels

    inputs = Inputs.of(inputs)
    labels = path_labels(inputs.files, stem=input_stem)
    h = hashlib.sha256()
    for f in inputs.files:
        h.update(f"{labels[str(f)]}\0{inputs.sha256(f)}\n".encode("utf-8", "surrogatepass"))
    return h.hexdigest()


@dataclass(frozen=True)
class ShardPlan:
    """One shard's sessions, known before any is replayed."""

    shard: Shard
    input_set: str
    keys: tuple[str, ...]  # [S] the keys (ids, or <path>:<line>) this shard owns, in input order
    assignment: dict | None = None  # {key: shard} under the tokens rule (None: the id rule)
    tokens: int | None = None  # the tokens of its sessions under the tokens rule
    indices: tuple[int, ...] = ()  # [S'] the input indices of its sessions (a repeated id's repeat too)
    total: int = 0  # the sessions (keys) of the whole input, every shard's

    def none_owned(self) -> str | None:
        """None when the shard owns a session; else what an empty shard's run says (a success: a job of N shards over
        few sessions, or an unlucky split, leaves some shards with none)."""
        from ..wording import plural

        if self.keys:
            return None
        rule = "their ids put" if self.shard.by == "id" else "the tokens rule puts"
        return f"shard {self.shard.label} owns none of the {plural(self.total, 'session')} ({rule} each in another shard)"

    def owns(self, key: str) -> bool:
        if self.assignment is not None and key in self.assignment:
            return self.assignment[key] == self.shard.index
        return shard_of(key, self.shard.count) == self.shard.index

    def manifest(self) -> dict:
        """run.json `shard` (tables.py, version 3): part of the run's identity."""
        out = {"index": self.shard.index, "count": self.shard.count, "by": self.shard.by, "rule": RULES[self.shard.by],
               "input_set": self.input_set, "sessions": len(self.keys), "session_ids": list(self.keys)}
        if self.tokens is not None:
            out["tokens"] = self.tokens
        return out


def plan_shard(inputs, shard: Shard, renderer=None, max_sessions: int | None = None) -> ShardPlan:
    """Read the whole input (every session parsed; rendered too under the tokens rule, with `renderer`) and decide
    which sessions are this shard's. Inputs that do not parse are kept as their place (`session_key`) and left to
    the replay to report. inputs: sessions.inputs.Inputs (read once: the replay takes the same sessions, and under
    the tokens rule this shard's renderings), or the input files; max_sessions: only the first N of the input count
    (replay --max-sessions)."""
    from ..sessions.inputs import Inputs
    from ..sessions.reading import SessionError, Skipped

    inputs = Inputs.of(inputs, max_sessions)
    items = []  # (key, tokens or None), by input index
    for item in inputs.items("skip"):
        tokens = None
        if shard.by == "tokens" and not isinstance(item, Skipped):
            assert renderer is not None, "the tokens rule renders every session"
            try:
                tokens = inputs.rendered(item, renderer).n_tokens
            except SessionError:
                tokens = None
        items.append((session_key(item), tokens))
    assignment = balance({k: t for k, t in items if t is not None}, shard.count) if shard.by == "tokens" else None
    plan = ShardPlan(shard, input_set(inputs), (), assignment)
    mine = [i for i, (k, _) in enumerate(items) if plan.owns(k)]
    keys = tuple(dict.fromkeys(items[i][0] for i in mine))  # a repeated id is one session (and its repeat)
    sizes = {items[i][0]: items[i][1] for i in mine if items[i][1] is not None}
    tokens = sum(sizes.values()) if assignment is not None else None
    total = len(dict.fromkeys(k for k, _ in items))
    if shard.by == "tokens":  # the other shards' renderings are not this shard's to keep
        owned = set(mine)
        for item in inputs.items("skip"):
            if item.index not in owned:
                inputs.release(item)
    return ShardPlan(shard, plan.input_set, keys, assignment, tokens, tuple(mine), total)
