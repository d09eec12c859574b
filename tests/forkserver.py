"""The CLI under test started from a warm interpreter: `python -m mtp_observe ...` forked, not spawned.

Most of the suite's time was interpreters starting: every `subprocess.run([sys.executable, "-m", "mtp_observe",
...])` imported torch, torch._dynamo and transformers again (about 5 s on the 2-core CI machine, against well
under a second for the command's own work on a tiny checkpoint), and the suite runs the CLI some hundreds of
times. This module keeps one server process that has imported those libraries, and pandas, pyarrow and numba
(half a forked call's time before they were preloaded: 0.75 s -> 0.38 s for a `report`), and nothing of
mtp_observe, whose import reads the environment; it forks that server for each such call. The child is a real process, as the
spawned interpreter was: its own pid, exit code, environment, working directory, stdin/stdout/stderr (the test's
files, passed over a Unix socket), signal dispositions and atexit handlers; it then runs
`runpy.run_module("mtp_observe", run_name="__main__")` exactly as `python -m` does.

Only calls that could not tell the difference go through it (`forkable`): `[sys.executable, "-m",
"mtp_observe", ...]` through `subprocess.run` with no timeout and no environment variable that the pre-imported
libraries read when imported (HF_*, TRANSFORMERS_*, TORCH*, OMP_*, PYTHON*, ...; SUITE_ENV's may be left out);
`--ray` runs are spawned.
Everything else — Popen (the signal and kill tests), `-c` programs (the "imports no torch" checks), the
console script through a shell — is spawned as before. MTP_OBSERVE_TEST_FORK=0 spawns everything.
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile

# Variables the pre-imported libraries read when imported: a call that sets or clears one is spawned.
IMPORT_TIME_ENV = ("HF_", "HUGGINGFACE", "TRANSFORMERS", "TORCH", "PYTORCH", "OMP_", "MKL_", "OPENBLAS", "CUDA", "ARROW",
                   "PANDAS",
                   "TOKENIZERS", "XDG_CACHE", "NUMBA", "KMP_", "PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED",
                   "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONWARNINGS", "PYTHONSAFEPATH", "PYTHONNOUSERSITE",
                   "PYTHONDEVMODE", "PYTHONMALLOC", "PYTHONFAULTHANDLER", "PYTHONUSERBASE")
PRELOAD = ("torch", "torch._dynamo", "numpy", "pandas", "pyarrow", "pyarrow.parquet", "pyarrow.dataset", "numba",
           "jinja2", "rich", "typer", "safetensors", "yaml", "transformers",
           *(f"transformers.models.{m}.modeling_{m}" for m in ("qwen3_5", "qwen3_5_moe", "qwen3_next", "deepseek_v3",
                                                                "glm4_moe")))


# Set by the suite and its libraries, not by a test: conftest's OMP_NUM_THREADS=1, pytest-xdist's PYTHONPATH (its
# rootdir, where mtp_observe is imported from anyway) and the TORCHINDUCTOR_CACHE_DIR that torch._inductor puts
# in os.environ once some test imports it. A call whose env leaves one out (env={"COLUMNS": ..., "PATH": ""}) is
# compared as if it held the suite's value: it is forked, and runs with the suite's one thread (a spawned child
# would start two) importing the same files. A call that sets one to another value is spawned.
SUITE_ENV = ("OMP_NUM_THREADS", "PYTHONPATH", "TORCHINDUCTOR_CACHE_DIR")


def _harmless_pythonpath(value: str | None) -> bool:
    """A PYTHONPATH the forked child can take as the interpreter would (its entries put after sys.path[0]): every
    entry a directory holding none of the preloaded libraries, which the server imported already (the tests'
    PYTHONPATH=the checkout, so that `python -m mtp_observe` runs from any working directory)."""
    if not value:
        return True
    tops = {name.split(".")[0] for name in PRELOAD}
    entries = [e for e in value.split(os.pathsep) if e]
    return all(os.path.isdir(e) and not any(os.path.exists(os.path.join(e, t)) or os.path.exists(os.path.join(e, t + ".py"))
                                            for t in tops) for e in entries)


def _import_env(env: dict, suite: dict | None = None) -> dict:
    """env's import-time variables; with `suite` (os.environ): a harmless PYTHONPATH, and those of SUITE_ENV that env
    leaves out, taken as suite's."""
    if suite is not None and _harmless_pythonpath(env.get("PYTHONPATH")):  # the child puts it on sys.path itself
        env = {k: v for k, v in env.items() if k != "PYTHONPATH"}  # (_run_command): as if left out
    out = {k: v for k, v in env.items() if k.upper().startswith(IMPORT_TIME_ENV)}
    for k in SUITE_ENV if suite is not None else ():
        if k not in env and k in suite:
            out[k] = suite[k]
    return out


# ---------------------------------------------------------------------------------------------
# The server (run as a script: python tests/forkserver.py SOCKET)


def _serve(path: str) -> None:
    import importlib
    import signal

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional library this environment lacks: the child imports what it needs
            pass
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: F401  (their lazy imports)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the managers below are reaped by the kernel
    print("ready", flush=True)
    parent = os.getppid()
    listener.settimeout(5.0)
    while True:
        try:
            conn, _ = listener.accept()
        except socket.timeout:  # a pytest killed without unconfigure leaves no server behind
            if os.getppid() != parent:
                os._exit(0)
            continue
        conn.settimeout(None)
        if os.fork() == 0:  # the manager: forks the command, waits for it, reports its status
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _manage(conn)
            os._exit(0)
        conn.close()


def _manage(conn: socket.socket) -> None:
    size = struct.unpack("!I", _recv_exact(conn, 4))[0]
    msg, fds, _, _ = socket.recv_fds(conn, size, 3)
    while len(msg) < size:
        msg += conn.recv(size - len(msg))
    request = json.loads(msg)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run_command(request, fds)
    for fd in fds:
        os.close(fd)
    conn.sendall(struct.pack("!i", pid))
    _, status = os.waitpid(pid, 0)
    conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
    conn.close()


def _run_command(request: dict, fds: list[int]) -> None:
    """In the forked child: become `python -m mtp_observe ARGS` in the caller's directory and environment."""
    import atexit
    import random
    import runpy
    import signal
    import threading

    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[0] = os.getcwd()  # `python -m` puts the working directory first (the server's was its script's)
    extra = [os.path.abspath(e) for e in request["env"].get("PYTHONPATH", "").split(os.pathsep) if e]
    sys.path[1:1] = [e for e in extra if e not in sys.path]  # then PYTHONPATH's entries (forkable: none shadows a preload)
    import io

    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))  # as the interpreter reads it at start
    sys.stdin = io.TextIOWrapper(open(0, "rb", closefd=False), encoding=sys.stdin.encoding, errors=sys.stdin.errors)
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), encoding=sys.stdout.encoding,
                                  errors=sys.stdout.errors, write_through=unbuffered)
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), encoding=sys.stderr.encoding,
                                  errors="backslashreplace", line_buffering=True)
    random.seed()
    try:
        import numpy

        numpy.random.seed()
    except ImportError:
        pass
    sys.argv = ["-m"] + request["args"]  # runpy puts the module's path at argv[0], as `python -m` does
    code = 0
    try:
        runpy.run_module("mtp_observe", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:  # an uncaught exception: its traceback and exit 1, as the interpreter does
        import traceback

        traceback.print_exc()
        code = 1
    try:  # what the interpreter does on the way out: wait for threads, run atexit, flush
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        code = code or 120
    os._exit(code)


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("fork server closed the connection")
        data += chunk
    return data


# ---------------------------------------------------------------------------------------------
# The client (in the test process)


class ForkServer:
    def __init__(self, directory: str):
        self.path = os.path.join(directory, "fork.sock")
        self.process = subprocess.Popen([sys.executable, __file__, self.path], stdout=subprocess.PIPE,
                                        stdin=subprocess.DEVNULL, cwd=directory)
        ready = self.process.stdout.readline()
        assert ready.strip() == b"ready", ready

    def close(self) -> None:
        import shutil

        self.process.kill()
        self.process.wait()
        shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)

    def run(self, args: list[str], env: dict, cwd: str, stdin_fd: int, stdout_fd: int, stderr_fd: int) -> int:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        try:
            msg = json.dumps({"args": args, "env": env, "cwd": cwd}).encode()
            conn.sendall(struct.pack("!I", len(msg)))
            conn.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [stdin_fd, stdout_fd, stderr_fd]))])
            struct.unpack("!i", _recv_exact(conn, 4))  # the command's pid: it started
            return struct.unpack("!i", _recv_exact(conn, 4))[0]
        finally:
            conn.close()


def forkable(args, kwargs: dict) -> bool:
    if os.environ.get("MTP_OBSERVE_TEST_FORK") == "0" or not isinstance(args, (list, tuple)) or len(args) < 3:
        return False
    if str(args[0]) != sys.executable or list(map(str, args[1:3])) != ["-m", "mtp_observe"]:
        return False
    if "--ray" in map(str, args) or set(kwargs) - {"capture_output", "text", "env", "cwd", "input", "check",
                                                   "stdout", "stderr", "encoding", "universal_newlines", "stdin"}:
        return False
    env = kwargs.get("env")
    if env is not None and _import_env({k: str(v) for k, v in env.items()}, dict(os.environ)) != _import_env(dict(os.environ)):
        return False
    for stream in ("stdout", "stderr", "stdin"):  # only pipes, files and the defaults
        value = kwargs.get(stream)
        if value is not None and value not in (subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT) \
                and not hasattr(value, "fileno"):
            return False
    return True


def run_forked(server: ForkServer, args, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(args, **kwargs) for a `forkable` call, through the server."""
    text = kwargs.get("text") or kwargs.get("universal_newlines") or kwargs.get("encoding") is not None
    encoding = kwargs.get("encoding") or "utf-8"
    env = {k: str(v) for k, v in (kwargs["env"] if kwargs.get("env") is not None else os.environ).items()}
    cwd = os.fspath(kwargs["cwd"]) if kwargs.get("cwd") is not None else os.getcwd()
    capture = kwargs.get("capture_output", False)
    opened: list = []

    def stream(name: str, default: int):
        value = kwargs.get(name)
        if capture and name != "stdin" or value == subprocess.PIPE:
            f = tempfile.TemporaryFile()
            opened.append(f)
            return f.fileno(), f
        if value == subprocess.DEVNULL:
            f = open(os.devnull, "r+b")
            opened.append(f)
            return f.fileno(), None
        if value is not None and hasattr(value, "fileno"):
            return value.fileno(), None
        return default, None

    try:
        if kwargs.get("input") is not None:
            data = kwargs["input"].encode(encoding) if isinstance(kwargs["input"], str) else kwargs["input"]
            f = tempfile.TemporaryFile()
            opened.append(f)
            f.write(data)
            f.seek(0)
            stdin_fd = f.fileno()
        else:
            stdin_fd, _ = stream("stdin", 0)
        stdout_fd, out_file = stream("stdout", 1)
        if kwargs.get("stderr") == subprocess.STDOUT:
            stderr_fd, err_file = stdout_fd, None
        else:
            stderr_fd, err_file = stream("stderr", 2)
        sys.stdout.flush()
        sys.stderr.flush()
        code = server.run([str(a) for a in args[3:]], env, cwd, stdin_fd, stdout_fd, stderr_fd)

        def read(f):
            if f is None:
                return None
            f.seek(0)
            data = f.read()
            if text:
                data = data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")  # universal newlines
            return data

        result = subprocess.CompletedProcess(list(args), code, read(out_file), read(err_file))
    finally:
        for f in opened:
            f.close()
    if kwargs.get("check") and code != 0:
        raise subprocess.CalledProcessError(code, list(args), result.stdout, result.stderr)
    return result


if __name__ == "__main__":
    _serve(sys.argv[1])
