"""JSON files a user hands the tool (config.json, generation_config.json, tokenizer_config.json): one object, or one line saying why not.

Shared by the stages that read a model directory's files: sessions (the end-of-turn ids in generation_config.json)
and model (config.json).
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import CheckpointError


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def reason(e: BaseException) -> str:
    """The first line of an exception's message, or its type when the message is empty."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200]}" if lines else type(e).__name__


def read_json_file(path: Path, what: str) -> dict:
    """A JSON object from a file, or one line saying why not."""
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{path}: not readable as JSON ({reason(e)}); restore {what}")
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(value).__name__}; restore {what}")
    return value


def read_generation_config(path: Path) -> dict:
    """generation_config.json as a validated dict ({} when absent): an object whose eos_token_id, if any,
    is an integer or a list of integers."""
    p = Path(path) / "generation_config.json"
    if not p.exists():
        return {}
    cfg = read_json_file(p, "generation_config.json")
    eos = cfg.get("eos_token_id")
    if eos is not None and not (_is_int(eos) or (isinstance(eos, list) and all(_is_int(i) for i in eos))):
        raise CheckpointError(f"{p}: eos_token_id is {eos!r:.60}, expected an integer or a list of integers")
    return cfg
