"""Shared fixtures: tiny checkpoints in the real Qwen3.5 layout, written once per test session."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

# Every interpreter the suite starts (tests/forkserver.py's server, whose forks run most CLI calls, and the spawned
# ones) runs torch with one thread, as this process does below: each inherits the environment, and a child left at
# one thread per core spins its OpenMP threads against the other xdist worker. setdefault: a developer can raise it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402  (after OMP_NUM_THREADS: torch reads it when it starts its thread pool)

from mtp_observe.model.synthetic import SyntheticSpec, write_synthetic_checkpoint

from .forkserver import ForkServer, forkable, run_forked
from .strict_json import check_report_output, command_args


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

# pytest-xdist gives its workers COLUMNS and LINES (the controller's terminal, 80x24 without one); a CLI call that
# passes os.environ on would then print at 80 columns where the same test run in one process prints at the
# default width. The tests that care about the width set COLUMNS themselves.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

# `python -m mtp_observe ...` through subprocess.run is forked from a warm interpreter (tests/forkserver.py says
# which calls, and why the child cannot tell); MTP_OBSERVE_TEST_FORK=0 spawns every one.
_spawn = subprocess.run
_server: ForkServer | None = None


def _run(args, *positional, **kwargs):
    global _server
    if positional or not forkable(args, kwargs):
        result = _spawn(args, *positional, **kwargs)
    else:
        if _server is None:
            _server = ForkServer(tempfile.mkdtemp(prefix="mtp-fork-"))
        result = run_forked(_server, args, **kwargs)
    # every `report --format json` any test runs is strict JSON (no NaN or Infinity anywhere)
    check_report_output(command_args(args), result.returncode, getattr(result, "stdout", None))
    return result


subprocess.run = _run


# Every test starts from the suite's environment (this module's, as set above): what a test, a fixture of a wider
# scope or a test module's import put in os.environ is taken out after each test (monkeypatch's own undo comes
# first). The CLI run in this process (tests/fuzzing.run_cli) sets TRANSFORMERS_VERBOSITY, and
# scripts/train_default_model.py (imported by test_default_model) HF_HUB_OFFLINE and TRANSFORMERS_OFFLINE; left
# there, they reached every later test of the worker, and each CLI call given its own env= then differed from the
# fork server's (tests/forkserver.forkable) and was spawned: seconds each.
_SUITE_ENVIRON = dict(os.environ)


def _restore_environ() -> None:
    """os.environ back to the suite's, but for pytest's own PYTEST_CURRENT_TEST (which pytest removes itself)."""
    wanted = {**_SUITE_ENVIRON, **{k: v for k, v in os.environ.items() if k == "PYTEST_CURRENT_TEST"}}
    if os.environ != wanted:
        for k in set(os.environ) - set(wanted):
            del os.environ[k]
        os.environ.update(wanted)


def pytest_collection_finish(session):
    _restore_environ()


@pytest.fixture(autouse=True)
def _environ_restored():
    yield
    _restore_environ()


def pytest_unconfigure(config):
    if _server is not None:
        _server.close()


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
    from mtp_observe.model.loading import load_model

    return load_model(tiny_checkpoint)


def interruptible() -> None:
    """subprocess.Popen's preexec_fn for a child the test interrupts with SIGINT: Ctrl-C's default action restored in
    it. A background job of a non-interactive shell (`bash .ci/run &`) starts with SIGINT ignored, every child
    inherits that, and Python then installs no KeyboardInterrupt handler: the signal would be lost."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
