"""The report as a reader meets it: --heatmap/--html alone show only the session (its id checked before any work),
turns as assistant turn numbers, prose wrapped at word boundaries on an 80-column terminal."""

from __future__ import annotations

import pytest
from rich.console import Console

from mtp_observe.report import load_run, resolve_cost, summarize
from mtp_observe.report.heatmap import print_terminal, session_view
from mtp_observe.report.presentation import print_rich

from .fuzzing import run_cli
from .handmade import hand_run_sessions, write_run


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("ux") / "hand", hand_run_sessions(), k=2, draft_cost=0.1)


def test_heatmap_alone_prints_only_the_session_and_exits_0(hand):
    code, out, err = run_cli(["report", str(hand), "--heatmap", "B"])
    assert code == 0, err
    assert out.startswith("session B — each token coloured") and "verdict" not in out.lower() and "τ_sim" not in out
    assert "assistant turn 1 (message 0)" in out and "assistant turn 2 (message 1)" in out


def test_html_alone_writes_only_the_page(hand, tmp_path):
    code, out, err = run_cli(["report", str(hand), "--heatmap", "A", "--html", str(tmp_path / "a.html")])
    assert code == 0 and out == "" and err.strip() == f"wrote {tmp_path / 'a.html'}"
    assert "assistant turn 1 (message 0)" in (tmp_path / "a.html").read_text()


def test_a_bad_heatmap_id_is_refused_before_the_report_is_computed(hand, monkeypatch):
    import mtp_observe.report.summary as summary

    def never(*args, **kwargs):
        raise AssertionError("the report was computed before the id was checked")

    monkeypatch.setattr(summary, "summarize", never)
    code, out, err = run_cli(["report", str(hand), "--heatmap", "nobody", "--gate", "tau_sim>=1.5"])
    assert code == 2 and out == "" and err.startswith("error: --heatmap nobody: no such session"), err


def test_heatmap_with_a_report_option_prints_the_report_and_then_the_session(hand):
    code, out, err = run_cli(["report", str(hand), "--heatmap", "A", "--format", "table"])
    assert code == 0, err
    assert out.index("τ_sim") < out.index("session A — each token coloured")


def test_on_an_80_column_terminal_prose_wraps_between_words_never_inside_one(hand):
    from mtp_observe.report.presentation import blocks

    run = load_run(hand)
    report = summarize(run, resolve_cost(run), replicates=50, seed=0)
    prose = [line for line in blocks(report, None, details=True) if isinstance(line, str)]
    assert report.notes and max(len(p) for p in prose) > 80, "the test needs lines longer than the terminal"
    console = Console(record=True, width=80, force_terminal=True, color_system=None)
    print_rich(report, None, console, details=True)
    print_terminal(session_view(run, "B"), console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    flowing = " ".join(text.split())
    for line in prose:  # every word whole and in order: a word cut at the margin would read as two
        assert " ".join(line.split()) in flowing, line
