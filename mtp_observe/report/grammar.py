"""Grammar: what `replay --grammar tools` measured on tool-call spans, read back (docs/grammar.md). No torch.

Contract: `grammar_summary(run_dir)` -> None for a run without --grammar, else a dict (report JSON `grammar`):

    forced_share        forced tokens / tool-call tokens (run.json grammar_tally, the replay's own count)
    alpha_k             {drafter: [K] floats}: on the tool-call anchors (rows drafted for Kmax whose drafted token is
                        a tool-call token), the share accepted through depth k; "mtp_masked": mtp's, the chain also
                        ending at the first draft the grammar refuses (draft_allowed)
    mean_accepted       {drafter: float}: 1 + the mean accepted length at those anchors at K = Kmax (the tokens a
                        verify step yields there at batch 1, before the draft's cost)
    ranking             drafters by mean_accepted, best first
    tally               run.json grammar_tally less `flagged`; violations: calls that break their schema (scored
                        without the mask), flagged: the first of them (session, request, turn, position)

`grammar_line(summary)` is the plain report's line: labelled a what-if — the verdict is computed as for any run; in a
run of schema_version 6 or later that run is the masked one (its p_accept_<profile> on tool-call rows is the sampler's
distribution renormalised over the allowed set, model/target.py reduce_logits' grammar_masks), so the verdict's sampled
numbers are those under the mask (with greedy acceptance a recorded token is always allowed, so the mask changes no accepted row of a call that
keeps its schema: alpha_k of mtp and mtp_masked agree, which the line says).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def grammar_summary(run_dir: Path) -> dict | None:
    import pyarrow.parquet as pq

    run_dir = Path(run_dir)
    manifest = json.loads((run_dir / "run.json").read_text())
    if not manifest.get("grammar"):
        return None
    k = int(manifest["k"])
    tally = manifest.get("grammar_tally") or {}
    t = pq.read_table(run_dir / "positions.parquet",
                      columns=["segment", "drafter", "draft_k", "depth", "accepted", "draft_allowed"])
    seg = np.asarray(t["segment"].to_pandas().astype(str))
    drafter = np.asarray(t["drafter"].to_pandas().astype(str))
    depth, draft_k = t["depth"].to_numpy(), t["draft_k"].to_numpy()
    accepted = t["accepted"].to_numpy(zero_copy_only=False)
    allowed = t["draft_allowed"].to_numpy(zero_copy_only=False)
    tool = (seg == "tool_call") & (draft_k == k)
    alpha, mean = {}, {}
    for name in manifest.get("drafters", {}):
        rows = tool & (drafter == name)
        anchors = int((rows & (depth == 1)).sum())
        if not anchors:
            continue
        alpha[name] = [round(float((rows & (depth == d) & accepted).sum()) / anchors, 4) for d in range(1, k + 1)]
        mean[name] = round(1 + float((rows & accepted).sum()) / anchors, 4)
        if name == "mtp":
            # masked: accepted through k by a chain whose every draft 1..k the grammar allows
            ok = rows & _chain(drafter == name, depth, accepted & allowed)
            alpha["mtp_masked"] = [round(float((ok & (depth == d)).sum()) / anchors, 4) for d in range(1, k + 1)]
    return {"mode": manifest["grammar"], "k": k,
            "forced_share": round(tally.get("forced_tokens", 0) / tally["tool_call_tokens"], 4)
            if tally.get("tool_call_tokens") else None,
            "alpha_k": alpha, "mean_accepted": mean, "ranking": sorted(mean, key=lambda n: -mean[n]),
            "tally": {key: value for key, value in tally.items() if key != "flagged"},
            "flagged": list(tally.get("flagged", []))[:10]}


def _chain(rows: np.ndarray, depth: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """[R] bool: rows (one drafter's) whose `ok` holds at every depth 1..k of their anchor, whatever the segment of
    the earlier depths. Rows of one anchor are contiguous in depth order within a drafter's block
    (tables.positions_table's order)."""
    out = rows & ok
    for d in range(2, int(depth.max(initial=1)) + 1):
        here = np.flatnonzero(rows & (depth == d))
        out[here] &= out[here - 1] & (depth[here - 1] == d - 1)
    return out


def grammar_line(s: dict) -> str:
    """One plain-report line (a what-if label; the verdict is not changed by it)."""
    tally = s["tally"]
    share = "n/a" if s["forced_share"] is None else f"{s['forced_share']:.1%}"
    mtp = s["alpha_k"].get("mtp")
    masked = s["alpha_k"].get("mtp_masked")
    head = (f"; mtp α_1 on tool calls {mtp[0]:.3f} without the mask, {masked[0]:.3f} with it" if mtp and masked else "")
    ranked = ", ".join(f"{n} {s['mean_accepted'][n]:.2f}" for n in s["ranking"])
    broken = tally.get("violations", 0)
    names_only = tally.get("regions_names_only", 0)
    return (f"grammar (what-if, replay --grammar {s['mode']}): {share} of {tally.get('tool_call_tokens', 0):,} tool-call "
            f"tokens forced{head}; tokens per step on tool calls at K={s['k']}: {ranked}"
            + (f"; {broken} call(s) break their schema (scored without the mask)" if broken else "")
            + (f"; {names_only} of {tally.get('regions', 0)} calls had no schemas (names only)" if names_only else ""))
