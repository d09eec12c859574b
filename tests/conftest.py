"""Shared fixtures: tiny checkpoints in the real Qwen3.5 layout, written once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from mtp_observe.synthetic import SyntheticSpec, write_synthetic_checkpoint


def _shared() -> Path | None:
    """The project's shared folder (../shared beside the checkout), or MTP_OBSERVE_SHARED."""
    candidates = [os.environ.get("MTP_OBSERVE_SHARED"), Path(__file__).resolve().parents[2] / "shared", "/work/shared"]
    for c in candidates:
        if c and (Path(c) / "sessions-public").is_dir():
            return Path(c)
    return None


SHARED = _shared()
SESSIONS_PUBLIC = SHARED / "sessions-public" if SHARED else None

# Tiny models gain nothing from threads, and on a shared 2-core machine OpenMP threads that spin
# waiting for a busy core slow small ops down a hundredfold. Tests that need throughput raise it.
torch.set_num_threads(1)

_checkpoints: dict[str, Path] = {}


@pytest.fixture(scope="session")
def make_checkpoint(tmp_path_factory):
    """make_checkpoint(**SyntheticSpec fields) -> directory; each distinct spec is written once."""

    def make(**overrides) -> Path:
        spec = SyntheticSpec(**overrides)
        key = repr(spec)
        if key not in _checkpoints:
            _checkpoints[key] = write_synthetic_checkpoint(tmp_path_factory.mktemp("checkpoint"), spec)
        return _checkpoints[key]

    return make


@pytest.fixture(scope="session")
def tiny_checkpoint(make_checkpoint) -> Path:
    return make_checkpoint()


@pytest.fixture(scope="session")
def tiny_model(tiny_checkpoint):
    from mtp_observe.pipeline import load_model

    return load_model(tiny_checkpoint)
