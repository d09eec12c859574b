"""The run directory's Parquet columns (schema_version 3): requests.parquet's and positions.parquet's schemas.

Contract: `requests_schema(profiles)` and `positions_schema(profiles, ...)` are the exact columns the tables are
written with (tables.requests_table and tables.positions_table build them; tests/handmade.py writes runs by hand in
them). Which column holds what, and in which version it was added, is tables.py's docstring: the run directory's
contract. Imports no torch: the report reads through it.
"""

from __future__ import annotations

import pyarrow as pa

REQUESTS_SCHEMA = pa.schema(
    [
        ("session_id", pa.string()),
        ("request", pa.int32()),
        ("input_ids", pa.list_(pa.int32())),
        ("n_tokens", pa.int32()),
        ("spans", pa.list_(pa.struct([("start", pa.int32()), ("end", pa.int32()), ("turn", pa.int32())]))),
    ]
)

_POSITION_FIELDS = [
    ("session_id", pa.string()),
    ("request", pa.int32()),
    ("turn", pa.int32()),
    ("pos", pa.int32()),
    ("depth", pa.int8()),
    ("segment", pa.dictionary(pa.int8(), pa.string())),
    ("draft_token", pa.int32()),
    ("actual_token", pa.int32()),
    ("target_token", pa.int32()),
    ("match", pa.bool_()),
    ("accepted", pa.bool_()),
    ("draft_logprob", pa.float32()),
    ("target_logprob", pa.float32()),
    ("actual_logprob", pa.float32()),
]


FIT_STATISTICS = (("support", pa.int32()), ("q", pa.float64()), ("q2", pa.float64()), ("var", pa.float64()),
                  ("ll", pa.float64()))
ROUTING = pa.struct([("q_max", pa.int32()), ("layers", pa.int32()), ("experts", pa.int32()),
                     ("windows", pa.list_(pa.int64())), ("hits", pa.list_(pa.int32()))])
RECORDED_SAMPLING = pa.struct([("source", pa.string()), ("temperature", pa.float64()), ("top_p", pa.float64()),
                               ("top_k", pa.int32()), ("min_p", pa.float64()), ("presence_penalty", pa.float64()),
                               ("frequency_penalty", pa.float64()), ("repetition_penalty", pa.float64())])


def fit_type(profiles: list[str]) -> pa.DataType:
    """One span's recording-sampler sums: tokens, then support/q/q2/var/ll per profile."""
    return pa.struct([("tokens", pa.int32())] + [(f"{stat}_{p}", t) for p in profiles for stat, t in FIT_STATISTICS])


SPECULATIVE = pa.struct([("k", pa.int32()), ("anchors", pa.list_(pa.int32())), ("accepted", pa.list_(pa.int32()))])


def requests_schema(profiles: list[str]) -> pa.Schema:
    """requests.parquet's columns (version 3): REQUESTS_SCHEMA's, the fit sums per span, the recorded sampler, the
    speculative loop's steps (null unless `generate --speculative` wrote the session), the session's input index."""
    return pa.schema(list(REQUESTS_SCHEMA) + [("fit", pa.list_(fit_type(profiles))), ("recorded_sampling", RECORDED_SAMPLING),
                                              ("speculative", SPECULATIVE), ("session_index", pa.int64())])


TARGET_COLUMNS = ("target_token", "target_logprob", "actual_logprob")  # (and p_accept_*) absent without a target
DRAFTER_FIELDS = [("drafter", pa.dictionary(pa.int8(), pa.string())), ("draft_k", pa.int8()), ("draft_len", pa.int8())]
TREE_NODE = ("tree_node", pa.int8())  # version 3, runs with trees only (module docstring)
PAST_END = ("accepted_past_end", pa.int8())  # version 5, with the target's columns (tables.py's docstring)


WHATIF_FIELDS = {"head_precision": pa.dictionary(pa.int8(), pa.string()), "draft_confidence": pa.float64()}


GRAMMAR_FIELDS = (("forced", pa.bool_()), ("allowed", pa.int32()), ("draft_allowed", pa.bool_()))


def positions_schema(profiles: list[str], drafters: bool = False, target: bool = True, trees: bool = False,
                     precisions: bool = False, confidence: bool = False, grammar: bool = False,
                     past_end: bool = False) -> pa.Schema:
    """positions.parquet's columns: the fixed ones, then one float32 p_accept_<profile> per sampling profile.
    drafters: with the `drafter` and `draft_k` columns (a run of other drafters than mtp alone, or with variants);
    target False: without the target's columns (a model-free replay ran no target); trees: with `tree_node`;
    precisions: with `head_precision` (`replay --head-precision`), confidence: with `draft_confidence`
    (`replay --draft-p-min`), version 3; grammar: with `forced`, `allowed` and `draft_allowed` (`replay --grammar`,
    version 5); past_end: with `accepted_past_end` after the target's columns, version 5."""
    fields = list(_POSITION_FIELDS) + ([TREE_NODE] if trees else [])
    if drafters:
        at = [name for name, _ in fields].index("depth") + 1
        fields = fields[:at] + DRAFTER_FIELDS + fields[at:]
    if precisions:
        at = [name for name, _ in fields].index("depth") + 1
        fields = fields[:at] + [("head_precision", WHATIF_FIELDS["head_precision"])] + fields[at:]
    if confidence:
        at = [name for name, _ in fields].index("draft_logprob") + 1
        fields = fields[:at] + [("draft_confidence", WHATIF_FIELDS["draft_confidence"])] + fields[at:]
    if past_end and target:
        at = [name for name, _ in fields].index("actual_logprob") + 1
        fields = fields[:at] + [PAST_END] + fields[at:]
    if grammar:
        fields = fields + list(GRAMMAR_FIELDS)
    if not target:
        fields = [f for f in fields if f[0] not in TARGET_COLUMNS]
        profiles = []
    return pa.schema(fields + [(f"p_accept_{p}", pa.float32()) for p in profiles])
