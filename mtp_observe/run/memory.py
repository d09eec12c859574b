"""A command's peak resident memory, as the operating system counts it (tests and benchmarks).

`run_measured(argv)` runs a command to its end and returns what it printed, its exit code and its
peak resident set size (RSS), read from the kernel's own accounting: `os.wait4` hands back the
child's `rusage`, whose `ru_maxrss` is the high-water mark the kernel kept for it (getrusage(2)).
No polling: a spike between two samples cannot be missed, and nothing runs while the child does.

One subtlety decides the shape: Linux carries a process's peak across exec(2) (fs/exec.c records
the old address space's high-water mark in the process's signal struct), and Python's subprocess
starts children with vfork, whose old address space is the parent's. A child started directly by
a large parent (pytest with torch imported, ~1 GB) would so report at least the parent's peak.
The command is therefore started by a small launcher (a bare `python -c`, about 10 MB), which
spawns it and reports the command's own `wait4` rusage: the figure is the command's peak, plus at
most the launcher's few megabytes. (`resource.getrusage(RUSAGE_CHILDREN)` is no alternative: it
is the maximum over every child reaped so far, not this one's.)

ru_maxrss is in KiB on Linux and in bytes on macOS; `Measured.peak_rss` is bytes on both. The same rusage gives
the command's CPU time (user + system, its own and its reaped children's: `Measured.cpu_s`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

# The launcher: spawn argv[2:], wait for it with wait4, write its ru_maxrss to the file descriptor argv[1],
# exit with its status (a signal as 128 + signal number, as a shell would).
_LAUNCHER = (
    "import os, sys\n"
    "pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "os.write(int(sys.argv[1]), b'%d %.6f' % (usage.ru_maxrss, usage.ru_utime + usage.ru_stime))\n"
    "code = os.waitstatus_to_exitcode(status)\n"
    "sys.exit(code if code >= 0 else 128 - code)\n"
)


@dataclass(frozen=True)
class Measured:
    returncode: int
    stdout: str
    stderr: str
    peak_rss: int  # bytes: the command's resident-set high-water mark (getrusage(2) ru_maxrss)
    cpu_s: float = 0.0  # seconds of CPU the command used, user + system (getrusage(2) ru_utime + ru_stime)


def maxrss_bytes(ru_maxrss: int) -> int:
    """rusage.ru_maxrss in bytes (KiB on Linux and the BSDs, bytes on macOS)."""
    return ru_maxrss if sys.platform == "darwin" else ru_maxrss * 1024


def run_measured(argv: list[str], *, input: str | None = None, env: dict | None = None, cwd=None) -> Measured:
    """Run argv to completion (standard input from `input`, output captured as text) -> Measured.

    Output goes to temporary files, not pipes, so a command that prints a lot cannot block on a
    full pipe while nobody reads it."""
    argv = [str(a) for a in argv]
    read_fd, write_fd = os.pipe()
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr, tempfile.TemporaryFile() as stdin:
        if input is not None:
            stdin.write(input.encode())
            stdin.seek(0)
        try:
            proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(write_fd), *argv], stdin=stdin,
                                    stdout=stdout, stderr=stderr, env=env, cwd=cwd, pass_fds=(write_fd,))
        finally:
            os.close(write_fd)
        try:
            proc.wait()
            with os.fdopen(read_fd, "rb") as f:
                read_fd = None
                reported = f.read()
        finally:
            if read_fd is not None:
                os.close(read_fd)
        stdout.seek(0)
        stderr.seek(0)
        out, err = stdout.read().decode(errors="replace"), stderr.read().decode(errors="replace")
        if not reported:  # the launcher could not start the command (not found, not executable)
            raise RuntimeError(f"{argv[0]}: could not be started ({err.strip().splitlines()[-1] if err.strip() else proc.returncode})")
        rss, cpu = reported.split()
        return Measured(proc.returncode, out, err, maxrss_bytes(int(rss)), float(cpu))
