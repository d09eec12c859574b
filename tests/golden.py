"""Stored copies of outputs that a change must keep byte-identical (or change on purpose); a JSON copy's floats
within FLOAT_TOL (another CPU's float32 sums).

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


# A float in JSON text (a digit string with a point or an exponent). The demo's model runs in float32: another CPU
# (its SIMD kernels sum in another order) moves the report's unrounded figures in their 7th-8th significant digit,
# and a z statistic near 0 (a difference of sums: fit_z) by up to 3e-7 absolute, 2e-5 of itself (measured between
# the machine that stored the copy and a later one). So the JSON copy keeps every byte but float digits, and each
# float within FLOAT_TOL * max(1, |stored|, |now|) of the stored one; any change of the model or the statistics
# moves them by far more. The table and markdown print rounded figures and stay byte-identical.
_FLOAT = re.compile(r"-?\d+(?:\.\d+(?:[eE][-+]?\d+)?|[eE][-+]?\d+)")
FLOAT_TOL = 1e-5


def _floats_differ(stored: str, text: str) -> str | None:
    """None when `text` is `stored` but for float digits within FLOAT_TOL; else what differs."""
    if _FLOAT.sub("FLOAT", stored) != _FLOAT.sub("FLOAT", text):
        return "its text (not only float digits)"
    for i, (a, b) in enumerate(zip(_FLOAT.findall(stored), _FLOAT.findall(text))):
        x, y = float(a), float(b)
        if abs(x - y) > FLOAT_TOL * max(1.0, abs(x), abs(y)):
            return f"float {i}: stored {a}, now {b} (beyond {FLOAT_TOL})"
    return None


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("MTP_OBSERVE_UPDATE_GOLDEN") == "1":
        path.write_text(text)
        return
    assert path.is_file(), f"{path} is missing: run with MTP_OBSERVE_UPDATE_GOLDEN=1 to store it"
    stored = path.read_text()
    if stored != text and not (name.endswith(".json") and _floats_differ(stored, text) is None):
        diff = "".join(difflib.unified_diff(stored.splitlines(True), text.splitlines(True), "stored", "now", n=1))
        why = f" ({_floats_differ(stored, text)})" if name.endswith(".json") else ""
        raise AssertionError(f"{name} differs from its stored copy{why}:\n{diff[:6000]}")
