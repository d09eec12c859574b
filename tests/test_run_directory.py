"""The run directory is the user's disk: --overwrite deletes only a run, one replay at a time holds it,
--resume continues only the same run (same weights), and I/O failures are one line that leaves it resumable."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.pipeline import replay

from .test_importers import claude_code_events
from .test_replay import SESSION, run_cli, write_sessions

REPO = Path(__file__).resolve().parents[1]


def replay_cli(sessions, model, out, *extra, **kwargs):
    return run_cli("replay", sessions, "--model", model, "--k", "1", "--device", "cpu", "--out", out, *extra, **kwargs)


def one_line(r) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def tree(root: Path) -> dict[str, str]:
    """Every entry under root (symlinks not followed): relative path -> content, link target or 'dir'."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = p.read_bytes().hex()
    return out


@pytest.fixture(scope="module")
def finished_run(tiny_checkpoint, tmp_path_factory) -> Path:
    """A complete one-session run to copy run.json and parts from."""
    base = tmp_path_factory.mktemp("finished")
    sessions = write_sessions(base / "s.jsonl", [SESSION])
    return replay([sessions], tiny_checkpoint, base / "run", ReplayOptions(k=1, device="cpu"))


def copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst, symlinks=True)
    return dst


# --- --overwrite: only this tool's run, nothing else ------------------------------------------


def test_overwrite_on_a_directory_of_dot_files_refuses_and_leaves_every_file_in_place(tiny_checkpoint, finished_run, tmp_path):
    home = copy_run(finished_run, tmp_path / "home")
    (home / ".bashrc").write_text("alias ll='ls -l'\n")
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    (home / ".git").mkdir()
    (home / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    before = tree(home)
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    line = one_line(replay_cli(sessions, tiny_checkpoint, home, "--overwrite"))
    assert ".bashrc" in line or ".git" in line or ".ssh" in line, line
    assert "refusing" in line and str(home) in line
    assert tree(home) == before


def test_overwrite_through_a_symlinked_table_directory_leaves_its_target_untouched(tiny_checkpoint, finished_run, tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    (precious / "part-00000000.parquet").write_text("not ours either")
    run = copy_run(finished_run, tmp_path / "run")
    for p in (run / "requests.parquet").iterdir():
        p.unlink()
    (run / "requests.parquet").rmdir()
    (run / "requests.parquet").symlink_to(precious, target_is_directory=True)
    before, before_run = tree(precious), tree(run)
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    line = one_line(replay_cli(sessions, tiny_checkpoint, run, "--overwrite"))
    assert "requests.parquet" in line and "symbolic link" in line, line
    assert tree(precious) == before and tree(run) == before_run


def test_overwrite_never_follows_a_symlinked_part_or_manifest(tiny_checkpoint, finished_run, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("keep me")
    run = copy_run(finished_run, tmp_path / "run")
    [part] = (run / "positions.parquet").glob("part-*.parquet")
    part.unlink()
    part.symlink_to(secret)
    before = tree(run)
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    line = one_line(replay_cli(sessions, tiny_checkpoint, run, "--overwrite"))
    assert part.name in line and "symbolic link" in line, line
    assert tree(run) == before and secret.read_text() == "keep me"


@pytest.mark.parametrize("plant, needle", [
    (lambda run: (run / "requests.parquet" / "notes.txt").write_text("mine"), "notes.txt"),
    (lambda run: (run / "positions.parquet" / "part-00000000.parquet.bak").write_text("mine"), "part-00000000.parquet.bak"),
    (lambda run: (run / "run.json").write_text(json.dumps({"schema_version": 1, "tool": {"name": "other-tool"}})), "run.json"),
    (lambda run: (run / "run.json").write_text("{}"), "run.json"),
    (lambda run: (run / "positions.parquet" / "sub").mkdir(), "sub"),
])
def test_overwrite_refuses_anything_this_tool_did_not_write_before_deleting_anything(tiny_checkpoint, finished_run, tmp_path,
                                                                                    plant, needle):
    run = copy_run(finished_run, tmp_path / "run")
    plant(run)
    before = tree(run)
    from mtp_observe.errors import RunDirectoryError
    from mtp_observe.run.tables import prepare_run_directory

    with pytest.raises(RunDirectoryError, match="refusing") as e:
        prepare_run_directory(run, resume=False, overwrite=True)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert tree(run) == before


def test_overwrite_removes_exactly_the_runs_own_entries_and_its_temporaries(finished_run, tmp_path):
    from mtp_observe.run.tables import prepare_run_directory

    run = copy_run(finished_run, tmp_path / "run")
    (run / "positions.parquet" / ".part-00000001.parquet.tmp-123").write_bytes(b"half")
    (run / ".run.json.tmp-123").write_text("{")
    prepare_run_directory(run, resume=False, overwrite=True)
    assert run.is_dir() and list(run.iterdir()) == []


def test_an_out_given_through_a_symlink_is_resolved_and_said_and_the_link_is_kept(tiny_checkpoint, tmp_path):
    real = tmp_path / "disk" / "runs"
    real.mkdir(parents=True)
    (tmp_path / "runs").symlink_to(real, target_is_directory=True)
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    r = replay_cli(sessions, tiny_checkpoint, tmp_path / "runs" / "one")
    assert r.returncode == 0, r.stderr
    assert f"{tmp_path / 'runs' / 'one'} resolves to {real / 'one'}" in r.stderr, r.stderr
    assert (real / "one" / "run.json").is_file() and (tmp_path / "runs").is_symlink()
    again = replay_cli(sessions, tiny_checkpoint, tmp_path / "runs" / "one", "--overwrite")
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "runs").is_symlink() and (real / "one" / "run.json").is_file()


# --- one replay at a time ---------------------------------------------------------------------

HOLD = """
import sys, time
from pathlib import Path
from mtp_observe.run.pipeline import Observer, ReplayOptions, replay

sessions, model, out, ready, go = sys.argv[1:6]

class Hold(Observer):
    def start(self, n):  # inside the run: the manifest is written, the directory is held
        Path(ready).write_text("inside")
        while not Path(go).exists():
            time.sleep(0.01)

replay([sessions], model, Path(out), ReplayOptions(k=1, device="cpu"), observer=Hold())
"""


@contextmanager
def replay_held_inside(sessions: Path, model: Path, out: Path, tmp_path: Path):
    """A replay in another process, stopped inside its run until the context exits (then let go)."""
    ready, go = tmp_path / "ready", tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(sessions), str(model), str(out), str(ready), str(go)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        while not ready.exists():  # the handshake: the first replay says when it is inside its run
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        yield proc
    finally:
        go.write_text("go")
        if proc.poll() is None:
            try:
                proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_a_second_replay_overwrite_or_resume_is_refused_while_the_first_runs_naming_it(tiny_checkpoint, tmp_path):
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION, dict(SESSION, id="two")])
    out = tmp_path / "run"
    with replay_held_inside(sessions, tiny_checkpoint, out, tmp_path) as first:
        before = tree(out)
        for flags in ((), ("--overwrite",), ("--resume",)):
            line = one_line(replay_cli(sessions, tiny_checkpoint, out, *flags))
            assert f"pid {first.pid}" in line and "another mtp-observe replay" in line, (flags, line)
        assert tree(out) == before  # nothing was touched while the first one held it
    assert first.returncode == 0, first.stderr.read()
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    assert replay_cli(sessions, tiny_checkpoint, out, "--overwrite").returncode == 0  # released when done


def test_a_lock_left_by_a_killed_replay_does_not_block_resume(tiny_checkpoint, tmp_path):
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION, dict(SESSION, id="two")])
    out = tmp_path / "run"
    with replay_held_inside(sessions, tiny_checkpoint, out, tmp_path) as first:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    lock = out / ".mtp-observe.lock"
    assert lock.is_file() and str(first.pid) in lock.read_text()  # the file of a dead process is left behind
    r = replay_cli(sessions, tiny_checkpoint, out, "--resume")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["status"] == "complete" and manifest["counts"]["sessions_ok"] == 2
    assert not lock.exists()  # a replay that finishes removes its lock file


# --- --resume continues only the same run -----------------------------------------------------


def _interrupted(run: Path) -> None:
    manifest = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(manifest | {"status": "running"}))


def test_resume_refuses_a_checkpoint_whose_config_is_identical_but_whose_weights_differ(make_checkpoint, tmp_path):
    a, b = make_checkpoint(), make_checkpoint(seed=1)
    assert (a / "config.json").read_bytes() == (b / "config.json").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    out = replay([sessions], a, tmp_path / "run", ReplayOptions(k=1, device="cpu"))
    _interrupted(out)
    line = one_line(replay_cli(sessions, b, out, "--resume"))
    assert "cannot resume" in line and "weights" in line and "config.json is the same" in line, line
    assert replay_cli(sessions, a, out, "--resume").returncode == 0  # the same checkpoint resumes


def test_resume_refuses_a_retrained_head_in_an_otherwise_identical_checkpoint(make_checkpoint, tmp_path):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    a = make_checkpoint()
    b = tmp_path / "retrained"
    shutil.copytree(a, b)
    index = json.loads((b / "model.safetensors.index.json").read_text())["weight_map"]
    shard = b / index["mtp.fc.weight"]
    tensors = load_file(shard)
    for name in tensors:
        if name.startswith("mtp."):
            tensors[name] = tensors[name] + 0.01 * torch.randn_like(tensors[name])
    save_file(tensors, shard, metadata={"format": "pt"})
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    out = replay([sessions], a, tmp_path / "run", ReplayOptions(k=1, device="cpu"))
    _interrupted(out)
    line = one_line(replay_cli(sessions, b, out, "--resume"))
    assert "weights" in line, line


def test_a_truncated_finished_part_is_detected_on_resume_and_recomputed(tiny_checkpoint, tmp_path):
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION, dict(SESSION, id="two")])
    whole = replay([sessions], tiny_checkpoint, tmp_path / "whole", ReplayOptions(k=1, device="cpu", part_sessions=1))
    out = copy_run(whole, tmp_path / "cut")
    _interrupted(out)
    part = out / "positions.parquet" / "part-00000001.parquet"
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])  # a finished part cut short (a disk that filled up, a bad copy)
    r = replay_cli(sessions, tiny_checkpoint, out, "--resume", "--part-sessions", "1")
    assert r.returncode == 0, r.stderr
    assert "part-00000001.parquet" in r.stderr and "recomput" in r.stderr, r.stderr
    for table in ("positions.parquet", "requests.parquet"):
        for p in sorted((whole / table).iterdir()):
            assert (out / table / p.name).read_bytes() == p.read_bytes(), p.name


def test_a_finished_part_with_rows_missing_is_recomputed_on_resume(tiny_checkpoint, tmp_path):
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    whole = replay([sessions], tiny_checkpoint, tmp_path / "whole", ReplayOptions(k=1, device="cpu"))
    out = copy_run(whole, tmp_path / "short")
    _interrupted(out)
    part = out / "positions.parquet" / "part-00000000.parquet"
    table = pq.read_table(part)
    pq.write_table(table.slice(0, table.num_rows - 3), part)  # a valid Parquet file with rows missing
    r = replay_cli(sessions, tiny_checkpoint, out, "--resume")
    assert r.returncode == 0, r.stderr
    assert pq.read_table(part).equals(pq.read_table(whole / "positions.parquet" / "part-00000000.parquet"))


# --- I/O failures: one line, exit 2, resumable ------------------------------------------------


def _limit_file_size(limit: int):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_a_write_the_os_refuses_mid_run_is_one_line_and_the_run_resumes_to_the_same_rows(tiny_checkpoint, tmp_path):
    """A real OS failure: RLIMIT_FSIZE with SIGXFSZ ignored makes the write of the one large part fail with EFBIG
    ("File too large"), as a full disk fails a write with ENOSPC; small files (run.json, the small parts) still fit."""
    import random

    rng = random.Random(0)
    long = {"id": "long", "prompt_token_ids": [rng.randrange(990) for _ in range(20)],
            "completion_token_ids": [rng.randrange(990) for _ in range(800)]}
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION, long, dict(SESSION, id="after")])
    whole = replay([sessions], tiny_checkpoint, tmp_path / "whole", ReplayOptions(k=2, device="cpu", part_sessions=1))
    sizes = {p.name: p.stat().st_size for p in (whole / "positions.parquet").iterdir()}
    requests = max(p.stat().st_size for p in (whole / "requests.parquet").iterdir())  # every requests part fits
    limit = 30_000
    assert sizes["part-00000001.parquet"] > limit > max(sizes["part-00000000.parquet"], (whole / "run.json").stat().st_size, requests)
    out = tmp_path / "full"
    args = ["replay", sessions, "--model", tiny_checkpoint, "--k", "2", "--device", "cpu", "--out", out, "--part-sessions", "1"]
    r = run_cli(*args, preexec_fn=_limit_file_size(limit))
    line = one_line(r)
    assert "positions.parquet" in line and "File too large" in line and "--resume" in line, line
    assert json.loads((out / "run.json").read_text())["status"] in ("running", "failed")
    assert not list((out / "positions.parquet").glob(".*")) and not list(out.glob(".*.tmp-*"))  # no temporary left
    resumed = run_cli(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    for table in ("positions.parquet", "requests.parquet"):
        names = sorted(p.name for p in (whole / table).iterdir())
        assert names == sorted(p.name for p in (out / table).iterdir())
        for name in names:
            assert (out / table / name).read_bytes() == (whole / table / name).read_bytes(), name


def test_a_full_disk_while_writing_the_manifest_is_one_line_and_keeps_the_run_resumable(tiny_checkpoint, tmp_path, monkeypatch):
    """ENOSPC itself, by monkeypatching the manifest writer to fail as a full disk does on its last write."""
    from mtp_observe.errors import RunDirectoryError
    from mtp_observe.run import tables

    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION, dict(SESSION, id="two")])
    real = tables.write_json_atomic

    def full_at_finish(path, data):
        if data.get("status") != "running":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, data)

    monkeypatch.setattr(tables, "write_json_atomic", full_at_finish)
    out = tmp_path / "run"
    with pytest.raises(RunDirectoryError, match="No space left on device") as e:
        replay([sessions], tiny_checkpoint, out, ReplayOptions(k=1, device="cpu"))
    assert "\n" not in str(e.value) and "--resume" in str(e.value)
    monkeypatch.setattr(tables, "write_json_atomic", real)
    assert json.loads((out / "run.json").read_text())["status"] == "running"
    replay([sessions], tiny_checkpoint, out, ReplayOptions(k=1, device="cpu", resume=True))
    assert json.loads((out / "run.json").read_text())["status"] == "complete"


@contextmanager
def read_only(directory: Path):
    """A directory no process may create entries in, by a real OS mechanism: mode 0555 for a normal user;
    for root (which ignores permission bits) the immutable attribute (chattr +i)."""
    directory.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        directory.chmod(0o555)
        undo = lambda: directory.chmod(0o755)  # noqa: E731
    else:
        r = subprocess.run(["chattr", "+i", str(directory)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"root cannot make a directory read-only here (chattr +i: {r.stderr.strip()})")
        undo = lambda: subprocess.run(["chattr", "-i", str(directory)], check=True)  # noqa: E731
    try:
        try:
            (directory / "probe").write_text("x")
        except OSError:
            pass
        else:
            raise AssertionError(f"{directory} is still writable")
        yield directory
    finally:
        undo()


def test_read_only_output_directories_are_one_line_in_replay_report_and_import(tiny_checkpoint, finished_run, tmp_path):
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    with read_only(tmp_path / "ro") as ro:
        line = one_line(replay_cli(sessions, tiny_checkpoint, ro / "run"))
        assert "cannot" in line and str(ro / "run") in line, line
        with read_only(tmp_path / "ro-run") as ro_run:
            line = one_line(replay_cli(sessions, tiny_checkpoint, ro_run))
            assert str(ro_run) in line and "cannot" in line, line
        line = one_line(run_cli("report", finished_run, "--plot", ro / "p.png"))
        assert "--plot" in line and "cannot write" in line, line
        line = one_line(run_cli("report", finished_run, "--heatmap", "demo", "--html", ro / "h.html"))
        assert "--html" in line and "cannot write" in line, line
        log = write_sessions(tmp_path / "t.jsonl", claude_code_events())
        line = one_line(run_cli("import", "claude-code", log, "-o", ro / "o.jsonl"))
        assert str(ro / "o.jsonl") in line and "cannot write" in line, line


def test_replay_report_plot_and_html_writes_that_fail_are_one_line(finished_run, tmp_path, monkeypatch):
    """The same failures in-process, whoever runs the tests: the writers raise EROFS as a read-only mount does."""
    import matplotlib.figure

    from .fuzzing import run_cli as main_in_process

    def erofs(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", erofs)
    monkeypatch.setattr(Path, "write_text", erofs)
    for argv, needle in ((["report", str(finished_run), "--plot", str(tmp_path / "p.png")], "--plot"),
                         (["report", str(finished_run), "--heatmap", "demo", "--html", str(tmp_path / "h.html")], "--html")):
        code, _, err = main_in_process(argv)
        assert code == 2 and err.strip().splitlines() == [err.strip()] and needle in err and "Read-only file system" in err, err


def test_a_run_directory_whose_run_json_was_deleted_is_one_line_everywhere(tiny_checkpoint, finished_run, tmp_path):
    run = copy_run(finished_run, tmp_path / "run")
    (run / "run.json").unlink()
    before = tree(run)
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    for flags in ((), ("--resume",), ("--overwrite",)):
        line = one_line(replay_cli(sessions, tiny_checkpoint, run, *flags))
        assert "run.json" in line, (flags, line)
    assert "run.json" in one_line(run_cli("report", run))
    assert tree(run) == before


# --- the weights fingerprint ------------------------------------------------------------------


def test_the_sampled_fingerprint_reads_every_tensor_and_catches_a_retrained_head(make_checkpoint, tmp_path):
    import shutil

    from mtp_observe.model.checkpoint import read_checkpoint
    from mtp_observe.model.fingerprints import weights_fingerprint

    a = make_checkpoint()
    b = tmp_path / "b"
    shutil.copytree(a, b)
    whole = weights_fingerprint(read_checkpoint(a))
    sampled = weights_fingerprint(read_checkpoint(a), whole_file_limit=0)
    assert whole["method"] == "whole files" and sampled["method"] == "sampled blocks"
    assert sampled == weights_fingerprint(read_checkpoint(b), whole_file_limit=0)  # a copy: the same
    info = read_checkpoint(b)
    # Retrain the head: every byte of every mtp.* tensor's data changes, the header and sizes do not.
    for name in info.head_names:
        entry = info.tensors[name]
        path = b / entry.file
        with open(path, "rb") as f:
            (length,) = __import__("struct").unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        begin, end = header[name]["data_offsets"]
        with open(path, "r+b") as f:
            f.seek(8 + length + begin)
            f.write(os.urandom(end - begin))
    changed = weights_fingerprint(read_checkpoint(b), whole_file_limit=0)
    assert changed["bytes"] == sampled["bytes"] and changed["sha256"] != sampled["sha256"]


def test_the_fingerprint_of_a_60_gb_checkpoint_reads_a_few_tens_of_megabytes(tmp_path):
    """A sparse 60 GB checkpoint (25 shards, 1,500 tensors): the sampled fingerprint reads a bounded
    number of bytes, whatever the size (the time is measured by benchmarks/fingerprint_bench.py)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from fingerprint_bench import sparse_checkpoint
    finally:
        sys.path.pop(0)
    from mtp_observe.model.fingerprints import sampled_fingerprint_of_files

    files = sparse_checkpoint(tmp_path, total_bytes=60 * 10**9, shards=25, tensors=1500)
    result = sampled_fingerprint_of_files(files)
    assert result["bytes"] == sum(f.stat().st_size for f in files) >= 60 * 10**9
    assert 1500 * 4096 <= result["sampled_bytes"] <= 128 * 2**20, result
