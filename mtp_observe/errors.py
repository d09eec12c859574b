"""Errors a user can cause, as a small hierarchy.

Every message is one line that names the thing that is wrong (a path, a line, a tensor)
and says how to fix it. The CLI prints it as ``error: <message>`` and exits with 2; the
traceback is shown only when ``MTP_OBSERVE_DEBUG=1``. Internal invariants are asserts,
never these.

Messages quote what the user controls (file names, session ids, option values), which may hold
newlines or terminal escapes: a message is made one line of visible text here, once
(`literal.visible`: a newline in a file name reads `\n`), so no caller has to.
"""

from __future__ import annotations

from .literal import visible


class UserError(Exception):
    """Base class: something the user can fix. Exit code 2."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(visible(message))


class CheckpointError(UserError):
    """The model directory cannot be read as a Qwen3.5-family checkpoint with an MTP head."""


class InputError(UserError):
    """A recorded-session file is malformed (names file, line, session id and the fix)."""


class RunDirectoryError(UserError):
    """A run directory is missing, incompatible, or would be clobbered."""


class OptionError(UserError):
    """A command-line option has a value the command cannot use."""


class EngineMetricsError(UserError):
    """An engine's metrics file (Prometheus text, a log, a benchmark JSON) cannot be read as spec-decode counters."""
