"""No output path destroys what the tool wrote or reads (#27 item 1): every command that writes a file (`export -o`,
`report --plot/--html`, `import -o`, `generate -o`, `probe -o`) refuses, in one line and before any work, a run
directory's own entries, one of its own inputs and a directory; and it writes through a temporary and a rename, so a
failed write leaves what was there."""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import pytest

from .fuzzing import run_cli
from .handmade import random_sessions, write_run
from .test_replay import SESSION


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("outputs") / "run", random_sessions(12, 3, 0.7, seed=3), k=3,
                     junk_temp_file=False)


def _refused(argv: list[str], *needles: str) -> str:
    code, out, err = run_cli(argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (argv, code, out, err)
    assert all(n in lines[0] for n in needles), (needles, lines[0])
    return lines[0]


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_no_command_may_write_over_a_run_directorys_own_entries(run_dir, tiny_checkpoint, tmp_path):
    """`export -o RUN/run.json` used to replace the manifest with exit 0, after which report, --resume and
    --overwrite all refused the directory."""
    sessions = tmp_path / "s.jsonl"
    sessions.write_text(json.dumps(SESSION) + "\n")
    before = _snapshot(run_dir)
    entries = [run_dir / "run.json", run_dir / "requests.parquet", run_dir / "positions.parquet" / "part-00000000.parquet",
               run_dir / ".mtp-observe.lock"]
    link = tmp_path / "innocent.json"
    link.symlink_to(run_dir / "run.json")  # a link leads where it points
    for target in [*entries, link]:
        _refused(["export", str(run_dir), "-o", str(target)], "of the run directory", "would destroy the run")
        _refused(["import", "auto", str(sessions), "-o", str(target)], "would destroy the run")
        _refused(["generate", str(sessions), "--model", str(tiny_checkpoint), "-o", str(target), "--max-new-tokens", "2",
                  "--device", "cpu"], "would destroy the run")
        _refused(["probe", str(tiny_checkpoint), "-o", str(target), "--repeats", "1", "--context", "8", "--k", "1",
                  "--device", "cpu"], "would destroy the run")
    _refused(["report", str(run_dir), "--plot", str(run_dir / "positions.parquet" / "plot.png")], "would destroy the run")
    _refused(["report", str(run_dir), "--heatmap", "s000", "--html", str(run_dir / "requests.parquet" / "s.html")],
             "would destroy the run")
    assert _snapshot(run_dir) == before
    code, out, err = run_cli(["report", str(run_dir), "--replicates", "20"])
    assert code in (0, 1) and not err.strip().startswith("error"), err
    code, _, err = run_cli(["export", str(run_dir), "-o", str(run_dir / "vllm.json"), "--replicates", "20"])
    assert code == 0 and (run_dir / "vllm.json").is_file(), err  # beside the run's entries is fine
    (run_dir / "vllm.json").unlink()


def test_an_output_that_is_one_of_the_commands_inputs_is_refused_before_any_work(run_dir, tiny_checkpoint, tmp_path):
    sessions_dir = tmp_path / "sessions"
    sessions_dir.mkdir()
    sessions = sessions_dir / "s.jsonl"
    sessions.write_text(json.dumps(SESSION) + "\n")
    probe = tmp_path / "probe.json"
    probe.write_text("{}")
    hard = tmp_path / "hard-link.jsonl"
    os.link(sessions, hard)
    config = (tiny_checkpoint / "config.json").read_bytes()
    _refused(["export", str(run_dir), "--probe", str(probe), "-o", str(probe)], "is one of the input files")
    _refused(["report", str(run_dir), "--probe", str(probe), "--plot", str(probe)], "expected a .png")
    _refused(["import", "auto", str(sessions), "-o", str(hard)], "is one of the input files")
    _refused(["import", "auto", str(sessions_dir), "-o", str(sessions_dir / "out.jsonl")],
             "an input directory this command reads whole")
    _refused(["generate", str(sessions), "--model", str(tiny_checkpoint), "-o", str(hard), "--device", "cpu"],
             "is one of the input files")
    _refused(["generate", str(sessions_dir), "--model", str(tiny_checkpoint), "-o", str(sessions_dir / "own.jsonl"),
              "--device", "cpu"], "an input directory this command reads whole")
    _refused(["generate", str(sessions), "--model", str(tiny_checkpoint), "-o", str(tiny_checkpoint / "config.json"),
              "--device", "cpu"], "is a file of", "which this command reads")
    _refused(["probe", str(tiny_checkpoint), "-o", str(tiny_checkpoint / "config.json"), "--device", "cpu"],
             "is a file of", "which this command reads")
    assert (tiny_checkpoint / "config.json").read_bytes() == config and probe.read_text() == "{}"
    assert not (sessions_dir / "own.jsonl.partial").exists() and not (sessions_dir / "out.jsonl").exists()


def test_a_directory_as_the_output_is_refused_before_any_work(run_dir, tiny_checkpoint, tmp_path):
    sessions = tmp_path / "s.jsonl"
    sessions.write_text(json.dumps(SESSION) + "\n")
    directory = tmp_path / "here.html"  # a directory with a file's name
    directory.mkdir()
    _refused(["export", str(run_dir), "-o", str(tmp_path)], "is a directory")
    _refused(["report", str(run_dir), "--heatmap", "s000", "--html", str(directory)], "is a directory")
    _refused(["import", "auto", str(sessions), "-o", str(tmp_path)], "is a directory")
    _refused(["probe", str(tiny_checkpoint), "-o", str(tmp_path), "--device", "cpu"], "is a directory")
    _refused(["generate", str(sessions), "--model", str(tiny_checkpoint), "-o", str(tmp_path), "--device", "cpu"],
             "is a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here.html", "s.jsonl"]  # no .partial, no temporary


def _limited(argv: list[str], limit: int) -> tuple[int, str, str]:
    """The CLI in this process with files limited to `limit` bytes (RLIMIT_FSIZE's soft limit, restored after; Python
    ignores SIGXFSZ, so a write past the limit fails with EFBIG, as on a full disk)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        return run_cli(argv)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_write_that_fails_leaves_the_previous_file_whole_and_no_temporary(run_dir, tmp_path):
    out = tmp_path / "vllm.json"
    previous = "the export of yesterday\n" * 4
    out.write_text(previous)
    code, _, err = _limited(["export", str(run_dir), "--replicates", "20", "-o", str(out)], limit=64)
    assert code == 2, err
    assert err.strip().splitlines() == [f"error: --output {out}: cannot write (File too large); choose another path"]
    assert out.read_text() == previous and sorted(p.name for p in tmp_path.iterdir()) == ["vllm.json"]
    link = tmp_path / "link.json"
    link.symlink_to(out)
    code, _, err = run_cli(["export", str(run_dir), "--replicates", "20", "-o", str(link)])
    assert code == 0, err
    assert link.is_symlink() and json.loads(out.read_text())["speculative_config"]["method"] == "mtp"


def test_the_run_entries_refused_are_the_ones_tables_defines():
    from mtp_observe import outputs
    from mtp_observe.run import entries

    assert outputs.RUN_MANIFEST == entries.MANIFEST and outputs.RUN_LOCK == entries.LOCK
    assert outputs.RUN_TABLES == (entries.REQUESTS, entries.POSITIONS)
    for name in (".run.json.tmp-12", ".requests.parquet.part-00000003.parquet.tmp-9",
                 ".positions.parquet.part-00000003-r1.parquet.tmp-9"):
        assert outputs.RUN_TEMPORARY.fullmatch(name)
        assert entries._MANIFEST_TEMPORARY.fullmatch(name) or entries._GROUP_TEMPORARY.fullmatch(name)


def test_every_command_refuses_an_output_that_is_one_of_its_inputs_in_one_line(run_dir, tiny_checkpoint, tmp_path):
    """generate -o, import -o, replay --out, export -o and report --plot naming their own input: one line, exit 2,
    the input untouched (issue 43, point 3: a printed `generate own.jsonl -o own.jsonl` would have run)."""
    own = tmp_path / "own.jsonl"
    own.write_text(json.dumps(SESSION) + "\n")
    probe = tmp_path / "probe.json"
    probe.write_text("{}\n")
    model = ["--model", str(tiny_checkpoint)]
    before = own.read_bytes()
    for argv, said in ((["generate", str(own), "-o", str(own), *model], "is one of the input files"),
                       (["import", "auto", str(own), "-o", str(own), "--overwrite"], "is one of the input files"),
                       (["replay", str(own), "--out", str(own), *model, "--overwrite"], "is one of the inputs"),
                       (["replay", str(tmp_path), "--out", str(tmp_path), *model], "is one of the inputs"),
                       (["export", str(run_dir), "--probe", str(probe), "-o", str(probe)], "is one of the input files")):
        _refused(argv, said)
    assert own.read_bytes() == before and probe.read_text() == "{}\n"
