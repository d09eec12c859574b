"""memory.run_measured: a command's own peak RSS from wait4, whatever the parent holds."""

import sys

import pytest

from mtp_observe.run.memory import run_measured

ALLOCATE = "import sys; x = bytearray({n}); x[::4096] = b'1' * len(x[::4096]); print('ok'); sys.exit({code})"


def test_the_peak_of_a_command_is_its_own_and_not_its_large_parents():
    parent = bytearray(400_000_000)
    parent[::4096] = b"1" * len(parent[::4096])  # resident, so a peak inherited through exec would show it
    m = run_measured([sys.executable, "-c", ALLOCATE.format(n=100_000_000, code=0)])
    assert m.returncode == 0 and m.stdout == "ok\n"
    assert 100e6 <= m.peak_rss < 100e6 + 60e6, m.peak_rss  # the allocation plus a bare interpreter, not 400 MB more
    del parent


def test_a_larger_allocation_shows_as_a_larger_peak_and_the_exit_code_comes_back():
    small = run_measured([sys.executable, "-c", ALLOCATE.format(n=10_000_000, code=0)])
    large = run_measured([sys.executable, "-c", ALLOCATE.format(n=150_000_000, code=3)])
    assert large.returncode == 3 and small.returncode == 0
    assert large.peak_rss - small.peak_rss > 130e6


def test_standard_input_reaches_the_command_and_its_stderr_is_captured():
    m = run_measured([sys.executable, "-c", "import sys; sys.stderr.write(sys.stdin.read().upper())"], input="abc")
    assert m.stderr == "ABC" and m.stdout == ""


def test_a_command_that_cannot_start_is_an_error_not_a_zero_peak():
    with pytest.raises(RuntimeError, match="could not be started"):
        run_measured(["/nonexistent/command"])


def test_the_cpu_time_is_the_commands_own_and_a_sleep_uses_none():
    import time

    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    t0 = time.process_time()
    working = run_measured([sys.executable, "-c", busy])
    sleeping = run_measured([sys.executable, "-c", "import time; time.sleep(0.3)"])
    assert working.cpu_s >= 0.3 > sleeping.cpu_s + 0.1, (working.cpu_s, sleeping.cpu_s)
    assert time.process_time() - t0 < 0.2  # the parent waited; the CPU was the child's
