"""Run directories written by hand, in the tables.py schema, for the report's tests.

A span is given by its match bits: `matches[i]` holds d_k == x_{p+k} for depths 1..min(K, e-p) at
anchor p = start + i, so e = start + len(matches). Everything else follows the definitions in
ACCEPTANCE.md, written out here independently of the report:

    accepted(k)   = match at every depth 1..k
    draft_token   = actual_token when matched, else actual_token + 1
    target_token  = actual_token, except at depth 1 of an anchor listed in off_policy (+2)
    p_accept      on-path rows (accepted at k-1): thinking 0.5 if matched else 0.1,
                  instruct 1.0 if matched else 0.0, greedy 1.0 if the draft is the target's token;
                  off-path rows 0.99 (must be ignored)
    fit sums      (schema version 2) per span and profile: (support, q, q2, var, ll) over its t = s..e
                  (t >= 1) as given in HandSpan.fit, else every token in the support with q = q2 =
                  tokens / 2, var = tokens / 4 and ll = -tokens (greedy: q = q2 = tokens, var 0, ll 0):
                  every profile fits
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from mtp_observe.run.schema import REQUESTS_SCHEMA, positions_schema, requests_schema
from mtp_observe.run.tables import write_part

PROFILES = ["thinking", "instruct", "greedy"]
SAMPLING = {"thinking": {"temperature": 0.6, "top_p": 0.95, "top_k": 20},
            "instruct": {"temperature": 0.7, "top_p": 0.8, "top_k": 20},
            "greedy": {"temperature": 0.0, "top_p": 1.0, "top_k": 0}}
OFF_PATH_P_ACCEPT = 0.99


@dataclass
class HandSpan:
    request: int
    turn: int
    start: int  # s
    matches: list[list[int]]  # per anchor p = s..e-1: match bits at depths 1..min(K, e-p)
    segments: dict[int, str] = field(default_factory=dict)  # position -> segment of x_pos (default "text"; x_e "end")
    off_policy: set[int] = field(default_factory=set)  # anchors whose depth-1 target_token differs from actual
    fit: dict = field(default_factory=dict)  # profile -> (support, q, q2, var[, ll]) over the span's scored tokens
    past_end: set[int] = field(default_factory=set)  # anchors whose accepted_past_end is 1 (write_run(past_end=True))

    @property
    def end(self) -> int:
        return self.start + len(self.matches)

    @property
    def fit_tokens(self) -> int:
        return self.end - max(self.start, 1) + 1

    def fit_sums(self, profile: str) -> tuple:
        n = self.fit_tokens
        default = (n, float(n), float(n), 0.0, 0.0) if profile == "greedy" else (n, n / 2, n / 2, n / 4, -float(n))
        sums = tuple(self.fit.get(profile, default))
        return sums if len(sums) == 5 else sums + (-float(n),)


def token(request: int, i: int) -> int:
    return (100 + 7 * i + 13 * request) % 980


def p_accept(profile: str, matched: bool, on_path: bool, target_is_draft: bool = True) -> float:
    if not on_path:
        return OFF_PATH_P_ACCEPT
    if profile == "thinking":
        return 0.5 if matched else 0.1
    if profile == "greedy":
        return 1.0 if target_is_draft else 0.0
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
    version: int = 2,
    own_sampler: set[str] = frozenset(),
    past_end: bool = False,
) -> Path:
    """Write run.json, requests.parquet/ and positions.parquet/ (one part per session, plus a
    dot-prefixed half-written temp file a reader must skip). version 1: the old layout (thinking and
    instruct only, no fit sums); own_sampler: sessions whose `recorded` profile is their own
    meta.sampling (a `recorded` profile is written, equal to thinking, only when this is given). past_end: positions
    carry accepted_past_end (1 at the span's past_end anchors; schema version 5)."""
    profiles = (["thinking", "instruct"] if version == 1 else PROFILES + (["recorded"] if own_sampler else []))
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
            ordered = sorted(rspans, key=lambda s: s.start)
            row = {
                "session_id": session_id, "request": r, "input_ids": [token(r, i) for i in range(n_tokens)],
                "n_tokens": n_tokens,
                "spans": [{"start": s.start, "end": s.end, "turn": s.turn} for s in ordered],
            }
            if version >= 2:
                row["fit"] = [{"tokens": s.fit_tokens, **{f"{stat}_{p}": value for p in profiles
                               for stat, value in zip(("support", "q", "q2", "var", "ll"), s.fit_sums("thinking" if p == "recorded" else p))}}
                              for s in ordered]
                source = "session" if session_id in own_sampler else "fallback"
                row["recorded_sampling"] = {"source": source, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
                                            "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}
            request_rows.append(row)
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
                    draft = actual if bit else actual + 1
                    target = actual + 2 if (depth == 1 and p in span.off_policy) else actual
                    row = {
                        "session_id": session_id, "request": span.request, "turn": span.turn, "pos": p, "depth": depth,
                        "segment": segment, "draft_token": draft, "actual_token": actual,
                        "target_token": target,
                        "match": bool(bit), "accepted": accepted_so_far,
                        "draft_logprob": -0.5, "target_logprob": -1.0, "actual_logprob": -0.25,
                    }
                    if past_end:
                        row["accepted_past_end"] = int(p in span.past_end)
                    for profile in profiles:
                        row[f"p_accept_{profile}"] = p_accept("thinking" if profile == "recorded" else profile, bool(bit),
                                                              on_path, draft == target)
                    rows.append(row)
        n_rows += len(rows)
        name = f"part-{index:08d}.parquet"
        schema = REQUESTS_SCHEMA if version == 1 else requests_schema(profiles)
        write_part(pa.Table.from_pylist(request_rows, schema=schema), directory / "requests.parquet", name)
        write_part(pa.Table.from_pylist(rows, schema=positions_schema(profiles, past_end=past_end)), directory / "positions.parquet", name)
    if junk_temp_file:
        (directory / "positions.parquet" / ".part-99999999.parquet.tmp-1").write_bytes(b"half-written, not Parquet")
    sampling = {p: SAMPLING["thinking" if p == "recorded" else p] for p in profiles}
    if "recorded" in sampling:
        sampling["recorded"] = {**sampling["recorded"], "per_session": True, "fallback": "generation_config"}
    data = {
        "schema_version": version,
        "tool": {"name": "mtp-observe", "version": "0.1.0"},
        "created": created, "finished": created, "status": "complete",
        "model": {"path": model_path, "bundled": False, "model_type": "qwen3_5", "config_sha256": "abc",
                  "head_tensors": [],
                  "roofline": ({"precision": "F32", "head_bytes": 1, "lm_head_bytes": 1, "target_bytes": 20,
                                "draft_cost": draft_cost} if draft_cost is not None else {})},
        "tokenizer_sha256": None,
        "k": k, "dtype": "float32", "device": "cpu",
        "sampling": sampling,
        "inputs": [], "options": {}, "counts": {"rows": n_rows}, "versions": {}, "errors": [], "timing": {},
    }
    if version >= 2:
        data["recorded_with"] = None
        data["model"].update(max_position_embeddings=None, rope_scaling=None, generation_config=None)
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
                    off_policy_rate: float = 0.0, fit_rates: dict | None = None,
                    prefix: str = "s") -> dict[str, list[HandSpan]]:
    """Many sessions with independent match bits of probability p_match (for baselines and the bootstrap).

    fit_rates: profile -> (support, q, q2, var[, ll]) per scored token, multiplied by each span's tokens."""
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
            tokens = e - start + 1
            fit = {name: (round(r[0] * tokens),) + tuple(x * tokens for x in r[1:]) for name, r in (fit_rates or {}).items()}
            spans.append(HandSpan(request=0, turn=turn, start=start, matches=matches, off_policy=off, fit=fit))
            start = e + 4
        sessions[f"{prefix}{s:03d}"] = spans
    return sessions
