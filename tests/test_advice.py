"""One verdict, everywhere: the status, the K to run (0 = do not speculate), the reason and the next steps are
decided once (report/verdict.py Verdict) and every view says the same — the table's and the markdown's first
lines, the JSON's top, the plot, export's stderr — and nothing recommends a serve line the verdict does not.

Runs written by hand (tests/handmade.py): fast, and each verdict known in advance.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from mtp_observe.report import parse_gate, read_and_summarize, report_json
from mtp_observe.report.flags import serve_lines
from mtp_observe.report.plotting import figure
from mtp_observe.report.presentation import print_rich

from .fuzzing import run_cli
from .handmade import HandSpan, hand_run_sessions, random_sessions, write_run

REPO = Path(__file__).resolve().parents[1]
REPLICATES = "200"
FOREIGN = {"thinking": (0.9, 0.4, 0.5, 0.2), "instruct": (1.0, 0.8, 0.5, 0.2), "greedy": (0.55, 0.55, 1.0, 0.0)}  # fits none
ENGINES = ("vllm", "sglang", "trtllm", "speculation-profile", "aiconfigurator")


def cli(*args) -> subprocess.CompletedProcess:
    """The command in this process (fast): exit code, stdout, stderr."""
    code, out, err = run_cli([str(a) for a in args])
    return subprocess.CompletedProcess(args, code, out, err)


def cli_at_100_columns(*args) -> subprocess.CompletedProcess:
    """The command as a user pipes it, laid out for COLUMNS=100."""
    environment = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "100"}
    return subprocess.run([sys.executable, "-m", "mtp_observe", *map(str, args)], capture_output=True, text=True,
                          env=environment)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """go: 12 sessions that pay (GO at K = 3); no_pay: the same rows at a draft cost no K survives (best K 0);
    foreign: rows that pay, from traffic that fits no sampler (UNRELIABLE, best K > 0)."""
    root = tmp_path_factory.mktemp("advice")
    sessions = random_sessions(12, 3, 0.7, seed=4)
    return {
        "go": write_run(root / "go", sessions, k=3, draft_cost=0.08),
        "no_pay": write_run(root / "no_pay", sessions, k=3, draft_cost=3.0),
        "foreign": write_run(root / "foreign", random_sessions(12, 3, 0.7, seed=4, fit_rates=FOREIGN), k=3, draft_cost=0.08),
    }


ENABLING = re.compile(r'"num_speculative_tokens": [1-9]|--speculative-algorithm|--speculative-num-steps [1-9]'
                      r'|\[\d+, \d+, [1-9]\d*\]')  # a config, SGLang's flags, or a schedule range with K > 0


def enabling(text: str) -> list[str]:
    """Lines that would turn speculation on, unless labelled as the what-if they are."""
    return [line for line in text.splitlines() if ENABLING.search(line) and "not recommended" not in line]


def plot_texts(report) -> tuple[list[str], list]:
    from matplotlib.text import Text

    fig = figure(report)
    texts = [t.get_text() for t in fig.findobj(Text) if t.get_text()]
    stars = [line for ax in fig.axes for line in ax.get_lines() if line.get_marker() == "*"]
    return texts, stars


# ---------------------------------------------------------------------------------------------
# 1. Nothing recommends speculation the verdict does not


@pytest.mark.parametrize("name, gate, status", [("no_pay", None, "NO-GO"), ("no_pay", "alpha1>=0.5", "GO"),
                                                ("foreign", None, "UNRELIABLE")])
def test_a_run_whose_k_to_run_is_0_prints_no_enabling_serve_line_in_any_view_and_export_refuses_it(runs, tmp_path, name,
                                                                                                 gate, status):
    run = runs[name]
    gated = ("--gate", gate) if gate else ()
    report = read_and_summarize(run, replicates=int(REPLICATES), gate=parse_gate(gate) if gate else None).report
    v = report.verdict
    assert (v.status, v.run_k, v.serves) == (status, 0, False) and report.best_k >= 1
    assert serve_lines(report) == []
    # table and markdown, first screen and details; JSON
    for fmt in ("table", "markdown"):
        for details in ((), ("--details",)):
            r = cli("report", run, "--format", fmt, *gated, *details, "--replicates", REPLICATES)
            assert r.returncode == 0, r.stderr
            assert enabling(r.stdout) == [], (fmt, details, enabling(r.stdout))
            assert "K to run" in "\n".join(r.stdout.splitlines()[:5])
    data = json.loads(cli("report", run, "--format", "json", *gated, "--replicates", REPLICATES).stdout)
    assert (data["verdict"]["status"], data["verdict"]["run_k"], data["verdict"]["serves"]) == (status, 0, False)
    assert data["batch"]["speculative_config"] is None and "--speculative-config" not in json.dumps(data)
    # the plot: the K to run starred at 0, "do not speculate", no K to run above 0 anywhere
    texts, stars = plot_texts(report)
    assert any("do not speculate" in t for t in texts) and not any("K to run = 1" in t or "K to run: 1" in t for t in texts)
    assert [list(star.get_xdata()) for star in stars] == [[0]]
    assert any(t.startswith(f"{run.name}: {status} · K to run: 0") for t in texts)  # the title is the headline
    # export writes nothing and says why in one line, exit 1; --force writes it and says it is not recommended
    for engine in ENGINES:
        out = tmp_path / f"{name}-{engine}.txt"
        r = cli("export", run, "--engine", engine, "-o", out, *gated, "--replicates", "50")
        assert r.returncode == 1 and not out.exists(), (engine, r.stdout, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith(f"not exported: {status}, K to run 0") and "--force" in line
    forced = cli("export", run, "--engine", "vllm", "-o", tmp_path / "forced.json", "--force", *gated, "--replicates", "50")
    assert forced.returncode == 0 and (tmp_path / "forced.json").exists(), forced.stderr
    assert "not recommended" in forced.stderr and f"verdict: {status} · K to run: 0" in forced.stderr


def test_a_go_at_a_k_that_pays_prints_its_serve_line_first_and_export_writes_it(runs, tmp_path):
    r = cli("report", runs["go"], "--replicates", REPLICATES)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("GO · K to run: 3")
    assert lines[2] == """serve MTP at K=3: vllm serve MODEL --speculative-config '{"method": "mtp", "num_speculative_tokens": 3}'"""
    assert any(line.startswith("│ 3 ★") for line in lines)  # the table stars the K to run
    out = tmp_path / "vllm.json"
    e = cli("export", runs["go"], "--engine", "vllm", "-o", out, "--replicates", "50")
    assert e.returncode == 0 and e.stderr.startswith("verdict: GO · K to run: 3"), e.stderr
    assert json.loads(out.read_text())["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 3}
    # export judges with the options that shaped the report's verdict: a gate the run does not clear refuses it
    refused = cli("export", runs["go"], "--engine", "vllm", "--gate", "speedup>=9", "--replicates", "50")
    assert refused.returncode == 1 and refused.stderr.startswith("not exported: NO-GO") and refused.stdout == ""
    texts, stars = plot_texts(read_and_summarize(runs["go"], replicates=50).report)
    assert [list(star.get_xdata()) for star in stars] == [[3]] and any("K to run = 3" in t for t in texts)


def test_the_json_opens_with_the_same_decision_the_table_opens_with(runs):
    for name in runs:
        data = json.loads(cli("report", runs[name], "--format", "json", "--replicates", REPLICATES).stdout)
        table = cli("report", runs[name], "--replicates", REPLICATES).stdout.splitlines()
        markdown = cli("report", runs[name], "--format", "markdown", "--replicates", REPLICATES).stdout.splitlines()
        v = data["verdict"]
        assert list(data)[:2] == ["report_version", "verdict"]
        assert table[0] == v["headline"] and table[1] == f"why: {v['reason']}"
        assert markdown[0] == f"## mtp-observe: **{v['status']}** · K to run {v['run_k']}"


# ---------------------------------------------------------------------------------------------
# 2. Enough sessions for a gate


def test_go_is_refused_below_min_sessions_and_the_numbers_are_shown_within_these_sessions_only(tmp_path):
    nine = write_run(tmp_path / "nine", random_sessions(9, 3, 0.7, seed=4), k=3, draft_cost=0.08)
    r = cli("report", nine, "--gate", "speedup>=1.0", "--replicates", REPLICATES)
    assert r.returncode == 1, r.stdout
    lines = r.stdout.splitlines()
    assert lines[0].startswith("UNRELIABLE · K to run: 0") and "9 sessions, fewer than --min-sessions 10" in lines[1]
    assert any("speedup" in line and "[" in line for line in lines)  # the estimates, with their interval ...
    assert any("resampling turns within these 9 sessions only" in line for line in lines)  # ... labelled as such
    data = json.loads(cli("report", nine, "--format", "json", "--replicates", REPLICATES).stdout)
    assert [c["cause"] for c in data["verdict"]["causes"]] == ["sessions"] and data["verdict"]["interval"] == "turn"
    assert data["best"]["speedup_lo"] > 1.0  # the numbers alone would say GO
    assert cli("report", nine, "--gate", "speedup>=1.0", "--min-sessions", "9", "--replicates", REPLICATES).returncode == 0
    assert cli("export", nine, "--replicates", "50").returncode == 1
    assert cli("export", nine, "--min-sessions", "9", "--replicates", "50").returncode == 0
    small = cli("report", nine, "--min-sessions", "1")
    assert small.returncode == 2 and small.stderr.startswith("error: --min-sessions 1: expected at least 2")


def test_single_turn_sessions_count_as_sessions(tmp_path):
    import random

    rng = random.Random(7)
    sessions = {f"one{i}": [HandSpan(request=0, turn=0, start=3, matches=[[int(rng.random() < 0.75) for _ in range(min(2, 30 - p))]
                                                                       for p in range(30)])] for i in range(10)}
    report = read_and_summarize(write_run(tmp_path / "ten", sessions, k=2, draft_cost=0.05), replicates=200,
                                gate=parse_gate("speedup>=1.0")).report
    assert report.resampling.unit == "session" and report.verdict.status == "GO" and report.verdict.run_k >= 1


# ---------------------------------------------------------------------------------------------
# 3. The first screen


def terminal_lines(report, width: int = 100) -> list[str]:
    console = Console(record=True, width=width, force_terminal=True, color_system=None)
    print_rich(report, None, console)
    return console.export_text().splitlines()


@pytest.mark.parametrize("name", ["go", "no_pay", "foreign", "hand"])
def test_the_first_5_lines_carry_the_verdict_and_the_default_output_fits_45_lines_at_100_columns(runs, tmp_path, name):
    run = runs.get(name) or write_run(tmp_path / "hand", hand_run_sessions(), k=2, draft_cost=0.1)
    r = cli_at_100_columns("report", run, "--replicates", REPLICATES)
    piped = r.stdout.splitlines()
    report = read_and_summarize(run, replicates=int(REPLICATES)).report
    wrapped = terminal_lines(report)
    v = report.verdict
    for lines in (piped, wrapped):
        assert len(lines) <= 45, (len(lines), "\n".join(lines))
        head = "\n".join(lines[:5])
        assert v.status in lines[0] and f"K to run: {v.run_k}" in lines[0] and "why:" in head
    details = cli_at_100_columns("report", run, "--replicates", REPLICATES, "--details").stdout.splitlines()
    assert details[: len(piped) - 1] == piped[:-1] and len(details) > len(piped)  # the same screen, then every table
    # the headline's one τ is τ_sim; the per-position formula is named for what it is, under --details
    assert "τ(K)" not in r.stdout and "τ_sim" in r.stdout
    assert "τ(K) formula" in "\n".join(details) or name == "hand"


# ---------------------------------------------------------------------------------------------
# 4. Every UNRELIABLE cause prints its next step


def _cause_runs(root: Path) -> dict[str, tuple[Path, tuple[str, ...], tuple[str, ...]]]:
    """cause -> (run, report options, what its next step must say)."""
    sessions = random_sessions(12, 3, 0.7, seed=4)
    inputs = {"inputs": [{"path": "logs/a b.jsonl", "sha256": "x"}]}
    return {
        "unfinished": (write_run(root / "unfinished", sessions, k=3, manifest={"status": "running", **inputs}), (),
                       ("mtp-observe replay 'logs/a b.jsonl' --model /nonexistent/model --k 3 --out", "--resume")),
        "sampler": (write_run(root / "sampler", random_sessions(12, 3, 0.7, seed=4, fit_rates=FOREIGN), k=3, manifest=inputs),
                    (), ("mtp-observe generate 'logs/a b.jsonl' --model /nonexistent/model -o own.jsonl",
                         "mtp-observe replay own.jsonl --model /nonexistent/model --k 3", "--recorded-with PROFILE")),
        "sessions": (write_run(root / "sessions", random_sessions(4, 3, 0.7, seed=4), k=3), (),
                     ("mtp-observe replay MORE_SESSIONS.jsonl", "at least 10 sessions (this run has 4)")),
        "interval": (write_run(root / "interval", hand_run_sessions(), k=2), ("--min-sessions", "2"),
                     ("mtp-observe replay MORE_SESSIONS.jsonl", "more sessions and turns")),
        "model-free": (write_run(root / "model-free", sessions, k=3, manifest={"target_ran": False, **inputs}), (),
                       ("--drafters mtp,mtp",)),
    }


def test_every_unreliable_cause_prints_its_next_step(tmp_path):
    from mtp_observe.report import CAUSES

    cases = _cause_runs(tmp_path)
    assert set(cases) == set(CAUSES)
    for cause, (run, options, steps) in cases.items():
        data = json.loads(cli("report", run, "--format", "json", *options, "--replicates", REPLICATES).stdout)
        v = data["verdict"]
        assert v["status"] == "UNRELIABLE" and cause in [c["cause"] for c in v["causes"]], (cause, v["causes"])
        mine = next(c for c in v["causes"] if c["cause"] == cause)
        screen = cli("report", run, *options, "--replicates", REPLICATES).stdout
        shown = screen[screen.index("next:"):]
        for step in steps:
            assert any(step in s for s in mine["next_steps"]), (cause, step, mine["next_steps"])
            assert step in shown, (cause, step, shown)
        assert all(s in v["next_steps"] for s in mine["next_steps"])


# ---------------------------------------------------------------------------------------------
# 5. The batch gate says what the verdict says


def test_each_gated_batch_sizes_k_to_run_is_the_schedules_k_there_and_only_a_serving_verdict_prints_the_schedule(runs):
    report = read_and_summarize(runs["go"], replicates=50, batch="1").report
    b = report.batch
    for size, verdict in zip(b.gated, b.verdicts):
        i = b.times.batch.index(size)
        assert verdict.run_k == (b.best_k[i] if verdict.status == "GO" else 0)
    assert report.verdict.run_k == b.best_k[b.times.batch.index(b.binding)]
    scheduled = replace(report, batch=replace(b, schedule=((1, 15, 3), (16, 128, 1))))
    assert any("dynamic speculative decoding" in line for line in serve_lines(scheduled))
    refused = replace(scheduled, verdict=replace(report.verdict, status="NO-GO", run_k=0))
    assert serve_lines(refused) == []
    data = report_json(refused)
    assert data["batch"]["speculative_config"] is None and data["verdict"]["batches"][0]["run_k"] == 3


# ---------------------------------------------------------------------------------------------
# 6. The printed next steps carry the options in force, and do what they say (issue 43, points 1, 3, 4)


def next_steps(stdout: str) -> list[str]:
    """The commands under `next:` (a comment on its own line left out, a trailing one cut off)."""
    lines = stdout.split("\nnext:\n", 1)[1].splitlines()
    steps = []
    for line in lines:
        if not line.startswith("  "):
            break
        if not line.startswith("  #"):
            steps.append(line.strip().split("  #", 1)[0])
    return steps


def test_after_a_go_the_printed_export_and_compare_carry_the_reports_options_and_exit_0(tmp_path, monkeypatch):
    import shlex

    from mtp_observe.engines.numbers import engine_numbers

    from .test_engine_counters import counts_of, scrape

    nine = write_run(tmp_path / "nine", random_sessions(9, 3, 0.7, seed=4), k=3, draft_cost=0.08)
    options = ("--min-sessions", "9", "--gate", "speedup>=1.0", "--replicates", "50", "--batch", "1-2", "--seed", "3")
    r = cli("report", nine, *options)
    assert r.returncode == 0 and r.stdout.startswith("GO · K to run: 3 · gate speedup>=1.0; measured speedup"), r.stdout
    steps = next_steps(r.stdout)
    assert [shlex.split(s)[1] for s in steps] == ["export", "compare"], steps
    for step in steps:
        for option in ("--min-sessions 9", "--gate 'speedup>=1.0'", "--replicates 50", "--batch 1-2", "--seed 3"):
            assert option in step, (option, step)
    monkeypatch.chdir(tmp_path)
    report = read_and_summarize(nine, min_sessions=9, replicates=50, batch="1-2", seed=3).report
    Path("metrics.txt").write_text(scrape(*counts_of(engine_numbers(report, report.verdict.run_k))))
    for step in steps:  # exactly as printed: the GO's export writes, its compare agrees with the run's own counts
        done = cli(*shlex.split(step)[1:])
        assert done.returncode == 0, (step, done.stdout, done.stderr)
    assert json.loads(Path("vllm.json").read_text())
    # the negative control: the export the report printed before, without the options that made the GO
    assert cli("export", nine, "--engine", "vllm", "-o", "bare.json").returncode == 1


def test_the_unreliable_steps_carry_the_options_and_generate_is_sized_to_the_run_and_writes_a_new_file(tmp_path,
                                                                                                          monkeypatch):
    import shlex

    monkeypatch.chdir(tmp_path)
    Path("own.jsonl").write_text("")  # the demo's generate made one already
    foreign = write_run(tmp_path / "foreign", random_sessions(4, 3, 0.7, seed=4, fit_rates=FOREIGN), k=3,
                        manifest={"inputs": [{"path": "own-2.jsonl", "sha256": "x"}], "options": {"max_sessions": 4}})
    r = cli("report", foreign, "--min-sessions", "3", "--draft-cost", "0.08", "--replicates", "50")
    steps = next_steps(r.stdout)
    generate = steps[0]
    assert generate.startswith("mtp-observe generate own-2.jsonl ") and "--max-sessions 4" in generate  # sized
    assert generate.endswith(" -o own-3.jsonl"), generate  # not own.jsonl (it exists), not own-2.jsonl (the input)
    assert steps[1] == "mtp-observe replay own-3.jsonl --model /nonexistent/model --k 3"
    assert steps[2] == "mtp-observe report --min-sessions 3 --draft-cost 0.08 --replicates 50"
    declared = steps[3]
    assert declared == f"mtp-observe report {foreign} --min-sessions 3 --recorded-with PROFILE --draft-cost 0.08 --replicates 50"
    done = cli(*shlex.split(declared.replace("PROFILE", "thinking"))[1:])  # the sampler the user knows, as printed
    assert done.returncode == 0 and "thinking" in done.stdout.split("\nnext:", 1)[0], done.stdout
    assert "--recorded-with" in r.stdout and "own.jsonl " not in r.stdout
    # a generate that would write over its own input is refused, in one line, exit 2
    refused = cli("generate", "own-2.jsonl", "-o", "own-2.jsonl")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "one of the input files" in refused.stderr


def test_two_causes_with_one_fix_print_it_once(tmp_path):
    """Too few sessions and no interval both say: replay more sessions, then report; the step is printed once."""
    run = write_run(tmp_path / "hand", hand_run_sessions(), k=2)
    r = cli("report", run, "--replicates", REPLICATES)
    data = json.loads(cli("report", run, "--format", "json", "--replicates", REPLICATES).stdout)
    assert {"sessions", "interval"} <= {c["cause"] for c in data["verdict"]["causes"]}
    assert r.stdout.count("mtp-observe replay MORE_SESSIONS.jsonl") == 1
    assert data["verdict"]["next_steps"].count("mtp-observe report --replicates 200") == 1


@pytest.mark.parametrize("gate", [None, "speedup>=1.0"])
def test_the_headline_says_what_was_measured_and_never_sounds_like_a_pass_below_the_threshold(runs, gate):
    extra = ("--gate", gate) if gate else ()
    r = cli("report", runs["no_pay"], "--replicates", REPLICATES, *extra)
    head = r.stdout.splitlines()[0]
    speedup = read_and_summarize(runs["no_pay"], replicates=int(REPLICATES)).report.verdict.value
    said = "gate speedup>=1.0" if gate else "informational: no --gate given"
    assert head == f"NO-GO · K to run: 0 (do not speculate) · {said}; measured speedup {speedup:.3f} < 1, exit {r.returncode}"
    assert r.returncode == (1 if gate else 0) and speedup < 1
    good = cli("report", runs["go"], "--replicates", REPLICATES, *extra).stdout.splitlines()[0]
    assert good.startswith(f"GO · K to run: 3 · {said}; measured speedup ") and ">= 1, exit 0" in good


# ---------------------------------------------------------------------------------------------
# 7. The first screen's layout (issue 43, point 8)


def test_export_force_of_a_tree_says_on_stderr_the_k_the_file_holds(runs):
    """`export --force --tree S,TOPK,T` writes the tree's T steps (export_sglang_tree); its stderr said the chain's
    best K instead."""
    from types import SimpleNamespace

    from mtp_observe.engines.exports import export_plan

    report = read_and_summarize(runs["no_pay"], replicates=50).report
    tree_steps = report.best_k + 2
    with_tree = replace(report, trees=(SimpleNamespace(name=f"tree:{tree_steps},2,6", steps=tree_steps),))
    plan = export_plan(with_tree, None, True, f"{tree_steps}, 2, 6")
    assert plan.writes and f"written at tree {tree_steps}, 2, 6 (K={tree_steps}) because of --force" in plan.lines[1]
    assert f"K={report.best_k} " not in plan.lines[1]
    assert f"written at K={report.best_k} because of --force" in export_plan(report, None, True).lines[1]  # no tree


def test_a_model_free_run_prints_no_dtype_where_none_ran(tmp_path):
    run = write_run(tmp_path / "model-free", random_sessions(12, 3, 0.7, seed=4), k=3,
                    manifest={"target_ran": False, "dtype": None})
    r = cli_at_100_columns("report", run, "--replicates", REPLICATES)
    assert r.returncode == 0 and "None" not in r.stdout, r.stdout
    [where] = [line for line in r.stdout.splitlines() if line.startswith("run ")]
    assert where.endswith(" · model /nonexistent/model · Kmax 3"), where


def test_a_step_too_long_for_100_columns_gets_its_comment_on_a_line_of_its_own():
    from mtp_observe.report.presentation import step_lines

    short = "mtp-observe replay MORE_SESSIONS.jsonl  # at least 10 sessions (this run has 7)"
    assert step_lines(short) == [f"  {short}"]
    command = "mtp-observe export " + "reports/" + "x" * 40 + " --engine vllm -o vllm.json"  # 93 columns
    assert step_lines(f"{command}  # vLLM's config and numbers") == ["  # vLLM's config and numbers", f"  {command}"]
    assert all(len(line) <= 100 for line in step_lines(f"{command}  # vLLM's config and numbers"))
