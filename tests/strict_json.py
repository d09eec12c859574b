"""Every `report --format json` the suite runs is read by a strict parser: no NaN, Infinity or -Infinity anywhere
(tests/conftest.py checks each CLI call through subprocess, tests/fuzzing.run_cli each call in this process)."""

from __future__ import annotations

import json
from pathlib import Path


def _refuse(constant: str):
    raise ValueError(f"report --format json printed a bare {constant}; a strict JSON parser refuses the document")


def strict_loads(text: str):
    """json.loads that refuses NaN, Infinity and -Infinity (which Python's parser accepts by default)."""
    return json.loads(text, parse_constant=_refuse)


def command_args(args) -> list[str] | None:
    """The mtp-observe arguments of a command line (`python -m mtp_observe ...` or the console script), else None."""
    if isinstance(args, (str, bytes)):
        return None
    args = [str(a) for a in args]
    for i, a in enumerate(args[:-1]):
        if a == "-m" and args[i + 1] == "mtp_observe":
            return args[i + 2:]
    if args and Path(args[0]).name == "mtp-observe":
        return args[1:]
    return None


def is_report_json(argv: list[str]) -> bool:
    """`report ... --format json` (or --format=json)."""
    if not argv or argv[0] != "report":
        return False
    return "--format=json" in argv or any(a == "--format" and b == "json" for a, b in zip(argv, argv[1:]))


def check_report_output(argv, code: int, stdout) -> None:
    """A report printed as JSON (exit 0, or 1 under a failing --gate) is strict JSON; anything else is left alone."""
    if argv is None or not is_report_json(list(map(str, argv))) or code not in (0, 1) or not stdout:
        return
    text = stdout.decode("utf-8") if isinstance(stdout, bytes) else stdout
    strict_loads(text)
