"""User-controlled text is printed as it is: rich markup is not interpreted, control characters and ANSI
escapes are shown as escapes, Markdown does not format it, and a newline never breaks a line (or an assert)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .handmade import hand_run_sessions, write_run
from .test_replay import SESSION, run_cli, write_sessions

EVIL = "ev[red]il[/] \x1b[31mred\x1b[0m :thumbs_up: a\nb\tc\r\x07 \u202egnp.exe"
SHOWN = "ev[red]il[/] \\x1b[31mred\\x1b[0m :thumbs_up: a\\nb\\tc\\r\\x07 \\u202egnp.exe"


def test_visible_shows_control_characters_ansi_escapes_and_bidi_overrides_as_escapes():
    from mtp_observe.literal import visible

    assert visible(EVIL) == SHOWN
    assert visible("plain text, [brackets] and ünïcödé ✓") == "plain text, [brackets] and ünïcödé ✓"
    assert visible("two\nlines\tand a tab\x1b", newlines=True) == "two\nlines\tand a tab\\x1b"
    assert visible("\x00\x7f\x9b\u2028") == "\\x00\\x7f\\x9b\\u2028"
    assert visible("surrogate \udcff from a file name") == "surrogate \\udcff from a file name"
    assert visible(visible(EVIL)) == visible(EVIL)  # escaping twice changes nothing


def test_markdown_literal_escapes_what_markdown_would_format():
    from mtp_observe.literal import markdown_literal

    assert markdown_literal("a|b *c* _d_ `e` <b>x</b> [l](http://x) ~s~ $m$ &amp; #1 \\") == (
        "a\\|b \\*c\\* \\_d\\_ \\`e\\` \\<b\\>x\\</b\\> \\[l\\](http\\://x) \\~s\\~ \\$m\\$ \\&amp; \\#1 \\\\")
    assert markdown_literal("a\nb\x1b") == "a\\\\nb\\\\x1b"  # escapes are visible, then their backslash escaped


@pytest.fixture(scope="module")
def evil_run(tmp_path_factory, tiny_checkpoint) -> Path:
    sessions = hand_run_sessions()
    return write_run(tmp_path_factory.mktemp("evil") / "run", {EVIL: sessions["A"], "B": sessions["B"]}, k=2,
                     model_path=str(tiny_checkpoint))


def assert_literal(output: str) -> None:
    assert "\x1b" not in output and "\x07" not in output and "\u202e" not in output
    assert SHOWN in output, output


def test_the_report_table_shows_a_session_id_literally(evil_run):
    first = run_cli("report", evil_run, env={"COLUMNS": "300", "PATH": ""})  # the first screen names no session
    assert first.returncode == 0 and "\x1b" not in first.stdout and "\x07" not in first.stdout, first.stderr
    r = run_cli("report", evil_run, "--details", env={"COLUMNS": "300", "PATH": ""})  # the session table
    assert r.returncode == 0, r.stderr
    assert_literal(r.stdout)
    row = next(line for line in r.stdout.splitlines() if SHOWN in line)
    assert row.startswith("│ ") and row.rstrip().endswith("│")  # one table row, not broken by the newline


def test_the_heatmap_shows_a_session_id_and_decoded_text_literally(evil_run):
    r = run_cli("report", evil_run, "--heatmap", EVIL, env={"COLUMNS": "300", "PATH": ""})
    assert r.returncode == 0, r.stderr
    assert_literal(r.stdout)


def test_markdown_output_escapes_a_session_id(evil_run):
    from mtp_observe.literal import markdown_literal

    r = run_cli("report", evil_run, "--format", "markdown", "--details")  # the session table is a detail
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if "thumbs" in line)
    assert markdown_literal(EVIL) in row and "\x1b" not in r.stdout


def test_sessions_prints_a_file_name_and_shows_a_session_literally(tiny_checkpoint, tmp_path):
    name = "ev[red]il \x1b[31m:thumbs_up:\n.jsonl"
    path = write_sessions(tmp_path / name, [dict(SESSION, id=EVIL, messages=SESSION["messages"][:2] + [
        {"role": "assistant", "content": "clear the screen: \x1b[2J [bold]done[/bold] :smile:"}])])
    r = run_cli("sessions", path, "--model", tiny_checkpoint, env={"COLUMNS": "300", "PATH": ""})
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "ev[red]il \\x1b[31m:thumbs_up:\\n.jsonl" in r.stdout, r.stdout
    shown = run_cli("sessions", path, "--model", tiny_checkpoint, "--show", EVIL, env={"COLUMNS": "300", "PATH": ""})
    assert shown.returncode == 0, shown.stderr
    assert_literal(shown.stdout)
    assert "clear the screen: \\x1b[2J [bold]done[/bold] :smile:" in shown.stdout


def test_a_newline_in_a_file_name_or_session_id_is_one_escaped_error_line_not_an_assert(tiny_checkpoint, tmp_path):
    bad = tmp_path / "two\nlines.jsonl"
    bad.write_text("{oops\n")
    r = run_cli("sessions", bad, "--model", tiny_checkpoint)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [f"error: {tmp_path}/two\\nlines.jsonl:1: invalid JSON (Expecting property name "
                                             "enclosed in double quotes); fix or remove this line"]
    path = write_sessions(tmp_path / "s.jsonl", [{"id": "a\nb\x1b[31m", "messages": [{"role": "robot", "content": "x"}]}])
    r = run_cli("sessions", path, "--model", tiny_checkpoint)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert "session a\\nb\\x1b[31m: message 0 has unknown role" in line and "\x1b" not in line


def test_an_option_value_with_control_characters_is_shown_escaped(tmp_path):
    r = run_cli("report", tmp_path / "x", "--format", "x\x1b[2Jy")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == ["error: --format x\\x1b[2Jy: expected one of table, markdown, json"]


def test_json_output_keeps_the_session_id_exact(evil_run):
    r = run_cli("report", evil_run, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert [s["name"] for s in json.loads(r.stdout)["slices"]["session"]] == [EVIL, "B"]


MARKUP_IDS = ["[bold]x[/bold]", "[link=https://example.com]y[/link]", "[/x]"]  # #27 item 6's held-out ids


def test_session_ids_with_rich_markup_print_as_the_id_in_the_heatmap_and_in_markdown(tmp_path):
    """On a terminal (rich's markup parser would eat `[bold]` and raise on a stray `[/x]`) the heatmap's own lines
    show the id as it is; Markdown escapes what it would format, so that the rendered cell reads as the id."""
    import re

    from rich.console import Console

    from mtp_observe.report import load_run
    from mtp_observe.report.heatmap import print_terminal, session_view

    sessions = hand_run_sessions()
    run = write_run(tmp_path / "run", {sid: sessions["A"] for sid in MARKUP_IDS}, k=2)
    loaded = load_run(run)
    for sid in MARKUP_IDS:
        console = Console(record=True, width=120, force_terminal=True, color_system="truecolor", highlight=False)
        print_terminal(session_view(loaded, sid), console)
        assert console.export_text().splitlines()[0] == f"session {sid} — each token coloured by the accepted length at its anchor"
        r = run_cli("report", run, "--heatmap", sid, env={"COLUMNS": "200", "PATH": ""})
        assert r.returncode == 0 and r.stdout.startswith(f"session {sid} — each token coloured"), r.stderr
    markdown = run_cli("report", run, "--format", "markdown", "--details").stdout  # the session table is in the details
    cells = [line.split(" | ")[0].removeprefix("| ") for line in markdown.splitlines() if line.startswith("| \\[")]
    unescape = lambda cell: re.sub(r"\\(.)", r"\1", cell)  # CommonMark: a backslash before punctuation is the character
    assert sorted(map(unescape, cells)) == sorted(MARKUP_IDS * (len(cells) // len(MARKUP_IDS))) and cells, cells
