"""Run directories written by hand, in the tables.py schema, for the report's tests.

A span is given by its match bits: `matches[i]` holds d_k == x_{p+k} for depths 1..min(K, e-p) at
anchor p = start + i, so e = start + len(matches). Everything else follows the definitions in
ACCEPTANCE.md, written out here independently of the report:

    accepted(k)   = match at every depth 1..k
    draft_token   = actual_token when matched, else actual_token + 1
    target_token  = actual_token, except at depth 1 of an anchor listed in off_policy (+2)
    p_accept      on-path rows (accepted at k-1): thinking 0.5 if matched else 0.1,
                  instruct 1.0 if matched else 0.0; off-path rows 0.99 (must be ignored)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from mtp_observe.tables import REQUESTS_SCHEMA, positions_schema, write_part

PROFILES = ["thinking", "instruct"]
OFF_PATH_P_ACCEPT = 0.99


@dataclass
class HandSpan:
    request: int
    turn: int
    start: int  # s
    matches: list[list[int]]  # per anchor p = s..e-1: match bits at depths 1..min(K, e-p)
    segments: dict[int, str] = field(default_factory=dict)  # position -> segment of x_pos (default "text"; x_e "end")
    off_policy: set[int] = field(default_factory=set)  # anchors whose depth-1 target_token differs from actual

    @property
    def end(self) -> int:
        return self.start + len(self.matches)


def token(request: int, i: int) -> int:
    return (100 + 7 * i + 13 * request) % 980


def p_accept(profile: str, matched: bool, on_path: bool) -> float:
    if not on_path:
        return OFF_PATH_P_ACCEPT
    if profile == "thinking":
        return 0.5 if matched else 0.1
    return 1.0 if matched else 0.0


def write_run(
    directory: Path,
    sessions: dict[str, list[HandSpan]],
    k: int,
    *,
    draft_cost: float | None = 0.1,
    model_path: str = "/nonexistent/model",
    created: str = "2026-11-01T00:00:00Z",
    manifest: dict | None = None,
    junk_temp_file: bool = True,
) -> Path:
    """Write run.json, requests.parquet/ and positions.parquet/ (one part per session, plus a
    dot-prefixed half-written temp file a reader must skip)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    n_rows = 0
    for index, (session_id, spans) in enumerate(sessions.items()):
        requests: dict[int, list[HandSpan]] = {}
        for span in spans:
            requests.setdefault(span.request, []).append(span)
        request_rows = []
        for r, rspans in sorted(requests.items()):
            n_tokens = max(s.end for s in rspans) + 3
            request_rows.append({
                "session_id": session_id, "request": r, "input_ids": [token(r, i) for i in range(n_tokens)],
                "n_tokens": n_tokens,
                "spans": [{"start": s.start, "end": s.end, "turn": s.turn} for s in sorted(rspans, key=lambda s: s.start)],
            })
        rows = []
        for span in sorted(spans, key=lambda s: (s.request, s.start)):
            e = span.end
            for i, bits in enumerate(span.matches):
                p = span.start + i
                assert len(bits) == min(k, e - p), (session_id, p, bits, min(k, e - p))
                accepted_so_far = True
                for depth, bit in enumerate(bits, start=1):
                    on_path = accepted_so_far
                    accepted_so_far = accepted_so_far and bool(bit)
                    actual = token(span.request, p + depth)
                    position = p + depth
                    segment = span.segments.get(position, "end" if position == e else "text")
                    row = {
                        "session_id": session_id, "request": span.request, "turn": span.turn, "pos": p, "depth": depth,
                        "segment": segment, "draft_token": actual if bit else actual + 1, "actual_token": actual,
                        "target_token": actual + 2 if (depth == 1 and p in span.off_policy) else actual,
                        "match": bool(bit), "accepted": accepted_so_far,
                        "draft_logprob": -0.5, "target_logprob": -1.0, "actual_logprob": -0.25,
                    }
                    for profile in PROFILES:
                        row[f"p_accept_{profile}"] = p_accept(profile, bool(bit), on_path)
                    rows.append(row)
        n_rows += len(rows)
        name = f"part-{index:08d}.parquet"
        write_part(pa.Table.from_pylist(request_rows, schema=REQUESTS_SCHEMA), directory / "requests.parquet", name)
        write_part(pa.Table.from_pylist(rows, schema=positions_schema(PROFILES)), directory / "positions.parquet", name)
    if junk_temp_file:
        (directory / "positions.parquet" / ".part-99999999.parquet.tmp-1").write_bytes(b"half-written, not Parquet")
    data = {
        "schema_version": 1,
        "tool": {"name": "mtp-observe", "version": "0.1.0"},
        "created": created, "finished": created, "status": "complete",
        "model": {"path": model_path, "bundled": False, "model_type": "qwen3_5", "config_sha256": "abc",
                  "head_tensors": [],
                  "roofline": ({"precision": "F32", "head_bytes": 1, "lm_head_bytes": 1, "target_bytes": 20,
                                "draft_cost": draft_cost} if draft_cost is not None else {})},
        "tokenizer_sha256": None,
        "k": k, "dtype": "float32", "device": "cpu",
        "sampling": {"thinking": {"temperature": 0.6, "top_p": 0.95, "top_k": 20},
                     "instruct": {"temperature": 0.7, "top_p": 0.8, "top_k": 20}},
        "inputs": [], "options": {}, "counts": {"rows": n_rows}, "versions": {}, "errors": [], "timing": {},
    }
    data.update(manifest or {})
    (directory / "run.json").write_text(json.dumps(data, indent=2))
    return directory


def hand_run_sessions() -> dict[str, list[HandSpan]]:
    """The K = 2 run whose every metric test_report.py computes by hand.

    Session A, request 0, turn 0, span [2, 8] (6 tokens), anchors 2..7:
        p:        2      3      4      5      6      7
        matches:  [1,1]  [0,0]  [0,1]  [1,1]  [1,0]  [1]
        accepted: 2      0      0      2      1      1        (p=6 drafts up to x_8 = e; p=7 only x_8)
        x_3..x_5 reasoning, x_6..x_7 text, x_8 end; anchor 3 off-policy.
    Session B, request 0, turn 0, span [1, 3] (2 tokens), anchors 1..2:
        matches [1,0] [0]  -> accepted 1, 0;   x_2 tool_call, x_3 end
    Session B, request 1, turn 1, span [4, 7] (3 tokens), anchors 4..6:
        matches [0,0] [1,1] [1] -> accepted 0, 2, 1;   x_5, x_6 text, x_7 end
    """
    return {
        "A": [HandSpan(request=0, turn=0, start=2, matches=[[1, 1], [0, 0], [0, 1], [1, 1], [1, 0], [1]],
                       segments={3: "reasoning", 4: "reasoning", 5: "reasoning", 6: "text", 7: "text"},
                       off_policy={3})],
        "B": [HandSpan(request=0, turn=0, start=1, matches=[[1, 0], [0]], segments={2: "tool_call"}),
              HandSpan(request=1, turn=1, start=4, matches=[[0, 0], [1, 1], [1]], segments={5: "text", 6: "text"})],
    }


def random_sessions(n_sessions: int, k: int, p_match: float, seed: int, span_len: tuple[int, int] = (5, 40),
                    off_policy_rate: float = 0.0) -> dict[str, list[HandSpan]]:
    """Many sessions with independent match bits of probability p_match (for baselines and the bootstrap)."""
    import random

    rng = random.Random(seed)
    sessions = {}
    for s in range(n_sessions):
        spans = []
        start = 3
        for turn in range(rng.randint(1, 3)):
            n = rng.randint(*span_len)
            e = start + n
            matches = [[int(rng.random() < p_match) for _ in range(min(k, e - p))] for p in range(start, e)]
            off = {p for p in range(start, e) if rng.random() < off_policy_rate}
            spans.append(HandSpan(request=0, turn=turn, start=start, matches=matches, off_policy=off))
            start = e + 4
        sessions[f"s{s:03d}"] = spans
    return sessions
