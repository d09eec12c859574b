"""Kernels: which of transformers' optimised kernels the target ran without, said once, in this tool's words.

transformers logs a warning the first time a layer falls back to its reference PyTorch implementation
(transformers/integrations/hub_kernels.py, use_kernel_func_from_hub_with_fallback: "`causal_conv1d_fn` is falling
back to its reference PyTorch implementation because `causal_conv1d` is not installed. ..."), on stderr, in the middle
of the run — ahead of the error line when the run then fails, and whatever TRANSFORMERS_VERBOSITY a user set. Here
those records are caught instead (`capture`, installed by the CLI unless MTP_OBSERVE_DEBUG=1) and a replay that
finishes says them once in its summary (`fallback_note`); a run that fails says nothing of them.

Contract:
    capture()                       catch the fallback records from now on (idempotent; plain logging, no import)
    fallbacks() -> {package: [function]}
                                    what fell back so far in this process
    fallback_note(device) -> str | None
                                    the summary's line, None when nothing fell back
"""

from __future__ import annotations

import logging
import re

LOGGER = "transformers.integrations.hub_kernels"  # transformers.utils.logging.get_logger(__name__) there
_FALLBACK = re.compile(r"`([^`]+)` is falling back to its reference PyTorch implementation because `([^`]+)` is not installed")


class _Catch(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.seen: dict[str, list[str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        m = _FALLBACK.search(record.getMessage())
        if m is not None:
            functions = self.seen.setdefault(m.group(2), [])
            if m.group(1) not in functions:
                functions.append(m.group(1))


_catch: _Catch | None = None


def capture() -> None:
    """The fallback warnings go to this module, not to stderr: the logger gets its own level (WARNING, whatever the
    library's verbosity), this handler, and no propagation to transformers' stderr handler."""
    global _catch
    if _catch is None:
        _catch = _Catch()
        logger = logging.getLogger(LOGGER)
        logger.addHandler(_catch)
        logger.setLevel(logging.WARNING)
        logger.propagate = False


def fallbacks() -> dict[str, list[str]]:
    return {package: list(functions) for package, functions in (_catch.seen if _catch is not None else {}).items()}


def fallback_note(device: str) -> str | None:
    """One line: the functions that ran their reference implementation and what would make them fast."""
    seen = fallbacks()
    if not seen:
        return None
    functions = ", ".join(f for package in sorted(seen) for f in seen[package])
    packages = " ".join(sorted(seen))
    if str(device).startswith("cuda"):
        return (f"the target ran transformers' reference PyTorch kernels for {functions} (correct, slower); "
                f"pip install {packages} for the fast ones")
    return (f"the target ran transformers' reference PyTorch kernels for {functions} (correct; the fast ones, from "
            f"{packages}, are GPU kernels)")
