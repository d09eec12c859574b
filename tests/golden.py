"""Stored copies of outputs that a change must keep byte-identical (or change on purpose).

`check_golden(name, text)` compares text with tests/golden/NAME. To store a new copy after an intended change,
run the test with MTP_OBSERVE_UPDATE_GOLDEN=1 and commit the file with the change that explains it."""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "golden"


def normalise(text: str, replacements: dict[str, str]) -> str:
    """Machine- and time-specific strings (paths, timestamps) replaced by placeholders."""
    escaped = {old.replace("_", "\\_"): new for old, new in replacements.items()}  # as markdown output writes them
    for old, new in sorted({**replacements, **escaped}.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(old, new)
    text = re.sub(r"run-\d{8}-\d{6}(-\d+)?", "run-TIMESTAMP", text)
    return re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", "CREATED", text)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("MTP_OBSERVE_UPDATE_GOLDEN") == "1":
        path.write_text(text)
        return
    assert path.is_file(), f"{path} is missing: run with MTP_OBSERVE_UPDATE_GOLDEN=1 to store it"
    stored = path.read_text()
    if stored != text:
        diff = "".join(difflib.unified_diff(stored.splitlines(True), text.splitlines(True), "stored", "now", n=1))
        raise AssertionError(f"{name} differs from its stored copy:\n{diff[:6000]}")
