"""The heatmap: one session's assistant text, each token coloured by the accepted length at its anchor.

Contract: `session_view(run, session_id)` gathers every scored span of the session (tokens x_s..x_e),
the accepted length a(p) at each anchor p = s..e-1 and the drafts d_1..d_m there, and decodes the
tokens with the checkpoint's tokenizer.json (the `tokenizers` package: no torch). Token x_p is
coloured by a(p), the drafts accepted right after the target emitted it: 0 (red) .. Kmax (green);
the end-of-turn token x_e has no anchor and stays uncoloured. Without the model directory the view
shows token ids and says so. `print_terminal` and `html_page` draw it.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.dataset as pads

from ..errors import OptionError
from ..literal import prose, visible
from ..run.readers import read_dataset
from . import Run

# Pastel red -> yellow -> green, legible under black text.
_LOW, _MID, _HIGH = (0xF4, 0xA6, 0xA6), (0xFB, 0xE7, 0xA1), (0xA6, 0xDB, 0xA0)


@dataclass(frozen=True)
class Piece:
    """Text of one token, or of a few that only decode together (a UTF-8 character split across tokens)."""

    text: str
    ids: tuple[int, ...]
    position: int  # p of the first token
    accepted: int | None  # accepted length at anchor p (None: the end-of-turn token, no anchor)
    drafts: tuple[str, ...]  # d_1..d_m drafted at anchor p, as text (ids when not decoded)


@dataclass(frozen=True)
class TurnView:
    request: int
    turn: int  # the index of the assistant message in the session's messages (what positions.parquet `turn` holds)
    start: int  # s
    end: int  # e
    pieces: tuple[Piece, ...]
    assistant_turn: int = 0  # 1 for the session's first assistant message, 2 for the next, ...

    @property
    def label(self) -> str:
        """'assistant turn 3 (message 6)': the turn as a reader counts it, and the message index the tables keep."""
        return f"assistant turn {self.assistant_turn} (message {self.turn})"

    @property
    def mean_accepted(self) -> float:
        a = [p.accepted for p in self.pieces if p.accepted is not None]
        return float(np.mean(a)) if a else float("nan")


@dataclass(frozen=True)
class SessionView:
    session_id: str
    run: Path
    k: int  # Kmax: the top of the colour scale
    turns: tuple[TurnView, ...]
    decoded: bool  # False: pieces show token ids
    note: str | None  # why the text is not decoded, or a tokenizer mismatch


def colour(accepted: int, k: int) -> str:
    """'#rrggbb' for an accepted length 0..k on the red-yellow-green scale."""
    t = accepted / k if k else 0.0
    a, b, u = (_LOW, _MID, t * 2) if t <= 0.5 else (_MID, _HIGH, t * 2 - 1)
    return "#" + "".join(f"{round(x + (y - x) * u):02x}" for x, y in zip(a, b))


def load_tokenizer(run: Run):
    """(tokenizer or None, note): the run's model tokenizer.json, checked against run.json's tokenizer_sha256."""
    from ..model.fingerprints import tokenizer_sha256

    model_path = (run.manifest.get("model") or {}).get("path")
    if not model_path or not (Path(model_path) / "tokenizer.json").is_file():
        return None, f"no tokenizer at {model_path}/tokenizer.json (model directory unavailable): showing token ids"
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
    recorded = run.manifest.get("tokenizer_sha256")
    if recorded and tokenizer_sha256(Path(model_path)) != recorded:
        return tokenizer, f"the tokenizer at {model_path} changed since the run (sha256 differs): text may be wrong"
    return tokenizer, None


def decode_pieces(ids: list[int], decode) -> list[tuple[str, int, int]]:
    """Token ids -> [(text, first, last)] pieces, decoding with a few tokens of left context so that
    byte-level BPE spaces and merges come out as in the whole text; tokens whose bytes end inside a
    UTF-8 character ('\\ufffd') are joined with the next ones (up to 4)."""
    out = []
    g0 = 0
    for i in range(len(ids)):
        lo = max(0, g0 - 6)
        prefix, full = decode(ids[lo:g0]), decode(ids[lo : i + 1])
        if full.endswith("\ufffd") and i + 1 < len(ids) and i - g0 < 3:
            continue
        text = full[len(prefix):] if full.startswith(prefix) else decode(ids[g0 : i + 1])
        out.append((text, g0, i))
        g0 = i + 1
    return out


def session_view(run: Run, session_id: str) -> SessionView:
    if session_id not in run.sessions:
        shown = ", ".join(run.sessions[:5]) + (f", ... ({len(run.sessions)} in all)" if len(run.sessions) > 5 else "")
        raise OptionError(f"--heatmap {session_id}: no such session in {run.path} (sessions: {shown})")
    code = run.sessions.index(session_id)
    part, stored_id = run.session_keys[code]  # the name may carry its part ('<id> [<part>]', report.py)
    status = str(run.manifest.get("status"))
    table = read_dataset(run.path / "requests.parquet" / part if part else run.path / "requests.parquet",
                         ["request", "input_ids"], status, filter=pads.field("session_id") == stored_id)
    input_ids = {int(r): ids for r, ids in zip(table.column("request").to_pylist(), table.column("input_ids").to_pylist())}
    tokenizer, note = load_tokenizer(run)

    def decode(ids: list[int]) -> str:
        if tokenizer is None:
            return "".join(f"[{i}]" for i in ids)
        return tokenizer.decode(ids, skip_special_tokens=False)

    # Anchors and drafts of this session: (request, p) -> (accepted length, [d_1..d_m]).
    r = run.rows
    mine = np.flatnonzero(r.session == code)
    drafts: dict[tuple[int, int], list[int]] = {}
    for i in mine:
        drafts.setdefault((int(r.request[i]), int(r.pos[i])), []).append(int(r.draft_token[i]))
    accepted = {(int(r.request[i]), int(r.pos[i])): int(run.accepted_len[r.anchor[i]]) for i in mine if r.depth[i] == 1}

    turns = []
    mine_spans = np.flatnonzero(run.spans.session == code)
    ordinal = {t: n for n, t in enumerate(sorted({int(run.spans.turn[j]) for j in mine_spans}), start=1)}
    for j in mine_spans:
        request, s, e = int(run.spans.request[j]), int(run.spans.start[j]), int(run.spans.end[j])
        ids = list(input_ids[request][s : e + 1])
        pieces = []
        for text, g0, g1 in decode_pieces(ids, decode):
            p = s + g0
            pieces.append(Piece(text=text, ids=tuple(ids[g0 : g1 + 1]), position=p, accepted=accepted.get((request, p)),
                                drafts=tuple(decode([d]) for d in drafts.get((request, p), []))))
        turn = int(run.spans.turn[j])
        turns.append(TurnView(request=request, turn=turn, start=s, end=e, pieces=tuple(pieces), assistant_turn=ordinal[turn]))
    return SessionView(session_id=session_id, run=run.path, k=run.k, turns=tuple(turns), decoded=tokenizer is not None,
                       note=note)


def _legend(k: int) -> list[tuple[str, str]]:
    return [(str(a), colour(a, k)) for a in range(k + 1)]


def print_terminal(view: SessionView, console) -> None:
    from rich.text import Text

    prose(console, f"session {view.session_id} — each token coloured by the accepted length at its anchor")
    legend = Text("accepted length: ")
    for label, hex_colour in _legend(view.k):
        legend.append(f" {label} ", style=f"black on {hex_colour}")
    legend.append("   end-of-turn token: ")
    legend.append(" no anchor ", style="dim")
    console.print(legend)
    if view.note:
        prose(console, f"note: {view.note}", "yellow")
    for t in view.turns:
        console.print()
        prose(console, f"── request {t.request} · {t.label} · tokens {t.start}..{t.end} · "
                       f"mean accepted length {t.mean_accepted:.2f}", "bold")
        text = Text()
        for piece in t.pieces:
            style = "dim" if piece.accepted is None else f"black on {colour(piece.accepted, view.k)}"
            text.append(visible(piece.text, newlines=True), style=style)
        console.print(text, soft_wrap=True)


def html_page(view: SessionView) -> str:
    """A standalone page: the same view, with each token's position, accepted length and drafts on hover."""
    legend = "".join(f'<span class="t" style="background:{c}">&nbsp;{a}&nbsp;</span>' for a, c in _legend(view.k))
    body = []
    for t in view.turns:
        spans = []
        for piece in t.pieces:
            if piece.accepted is None:
                spans.append(f'<span class="t end" title="pos {piece.position}: end of turn, no anchor">'
                             f"{html.escape(piece.text)}</span>")
                continue
            drafted = " ".join(repr(d) for d in piece.drafts)
            tip = f"pos {piece.position}: accepted {piece.accepted}/{view.k}; drafted {drafted}"
            spans.append(f'<span class="t" style="background:{colour(piece.accepted, view.k)}" '
                         f'title="{html.escape(tip, quote=True)}">{html.escape(piece.text)}</span>')
        body.append(f"<h3>request {t.request} · {t.label} · tokens {t.start}..{t.end} · mean accepted length "
                    f"{t.mean_accepted:.2f}</h3>\n<pre>{''.join(spans)}</pre>")
    note = f'<p class="note">note: {html.escape(view.note)}</p>' if view.note else ""
    title = html.escape(f"mtp-observe heatmap: {view.session_id}")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; max-width: 70em; }}
pre {{ white-space: pre-wrap; word-wrap: break-word; font-size: 13px; line-height: 1.6; background: #fafafa; padding: 1em; }}
.t {{ border-radius: 2px; }}
.end {{ color: #999; }}
.note {{ color: #a60; }}
</style></head><body>
<h2>{title}</h2>
<p>run {html.escape(str(view.run))}. Each token x<sub>p</sub> is coloured by the accepted length at anchor p (the
drafts d<sub>1</sub>..d<sub>K</sub> accepted right after the target emitted it); hover a token for its drafts.</p>
<p>accepted length: {legend} &nbsp; end-of-turn token: <span class="t end">no anchor</span></p>
{note}
{chr(10).join(body)}
</body></html>
"""
