"""Real token sequences for the drafter tests: sessions rendered with the bundled tokenizer.

The demo sessions (sessions/) always; when ../shared/sessions-public is present, a few public
trajectories imported with the importers as well (mini-swe-agent edits and re-reads files, so
its requests repeat long stretches verbatim — what the model-free drafters are for).
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np

from mtp_observe.model.loading import default_model_dir
from mtp_observe.sessions.reading import read_sessions
from mtp_observe.sessions.rendering import Renderer

from .conftest import SESSIONS_PUBLIC

ROOT = Path(__file__).resolve().parents[1]
PUBLIC_FILES = ("mini-swe-agent_gemini-3-pro/psf__requests-1921.traj.json",
                "mini-swe-agent_gemini-3-pro/pallets__flask-5014.traj.json")


@functools.lru_cache(maxsize=1)
def renderer() -> Renderer:
    return Renderer.from_model_dir(default_model_dir())


def render(session_files) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Per session, per request: (tokens [n] int32, spans [S, 2] int64)."""
    out = []
    for s in read_sessions([str(f) for f in session_files]):
        rendered = renderer().render(s)
        out.append([(np.asarray(q.input_ids, dtype=np.int32),
                     np.array([(sp.start, sp.end) for sp in q.spans], dtype=np.int64).reshape(-1, 2))
                    for q in rendered.requests])
    return out


@functools.lru_cache(maxsize=1)
def real_sessions() -> tuple[list, ...]:
    """The demo sessions, then (when present) the public ones in PUBLIC_FILES, rendered."""
    sessions = render(sorted((ROOT / "sessions").glob("*.jsonl")))
    if SESSIONS_PUBLIC is not None:
        from mtp_observe.sessions.importers import import_files

        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "public.jsonl"
            import_files("auto", [SESSIONS_PUBLIC / f for f in PUBLIC_FILES], out)
            sessions += render([out])
    return tuple(sessions)


def real_requests() -> list[tuple[np.ndarray, np.ndarray]]:
    return [request for session in real_sessions() for request in session]
