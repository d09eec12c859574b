"""The README is the user's first page and docs/*.md the reference: everything they name is in the repository,
every mtp-observe line they show names a command and options that exist, every relative link (and its #anchor)
resolves, and the quickstart block runs as written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .golden import _floats_differ, check_golden, normalise

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PAGES = {"README.md": README} | {f"docs/{p.name}": p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}
DESIGN_DOCS = ("SESSIONS.md", "PRODUCT.md", "ACCEPTANCE.md", "MTP_HEAD.md", "LOG_FORMATS.md", "STYLE.md")


def code_lines(text: str = README) -> list[str]:
    """Lines of fenced code blocks and of indented (4-space) blocks, continuation lines joined to their command."""
    out: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            text = line.strip()
            if out and text.startswith("[") and out[-1].startswith("mtp-observe"):
                out[-1] += " " + text  # a syntax line continued
            else:
                out.append(text)
    return out


def mtp_observe_calls(page: str = README) -> list[list[str]]:
    texts = [ln for ln in code_lines(page) if "mtp-observe " in ln]
    texts += re.findall(r"`(mtp-observe [^`]+)`", page)
    calls = []
    for text in texts:
        text = text.split(" #", 1)[0]
        for part in re.split(r"&&|;|\|\|", text):
            part = part.strip()
            if part.startswith("mtp-observe"):
                calls.append(part.replace("\\", " ").split())
    return calls


def test_the_readme_says_near_the_top_what_the_bundled_model_is_for_and_that_a_verdict_needs_your_checkpoint():
    """Issue 31: before the quickstart, in two sentences, the bundled model is for trying the tool, the demo and CI,
    and a verdict about your traffic needs your own checkpoint (--model DIR or a cached hub id)."""
    top = README.split("```", 1)[0]
    (paragraph,) = [p for p in top.split("\n\n") if p.startswith("The bundled model")]
    text = " ".join(paragraph.split())
    assert len(re.findall(r"\.(?:\s|$)", text)) == 2, text  # two sentences
    for said in ("trying the tool", "the demo", "CI without downloads", "A verdict about your traffic needs your own",
                 "`--model DIR`", "Hugging Face id already in your local cache"):
        assert said in text, said


def check_calls(calls: list[list[str]], where: str) -> set[str]:
    """Every call names a command and options of it (or root options); returns the commands called."""
    import typer.main

    from mtp_observe.cli import app

    group = typer.main.get_command(app)
    root_options = {opt for p in group.params for opt in p.opts} | {"-h", "--help"}
    seen = set()
    for call in calls:
        words = [w.strip("[]|,.'\"") for w in call[1:]]
        words = [w for w in words if w]
        if not words:  # `mtp-observe ...` in prose
            continue
        if words[0].startswith("-"):
            assert all(w in root_options for w in words if w.startswith("-")), (where, call)
            continue
        assert words and words[0] in group.commands, f"{where}: no command {words[:1]} in {' '.join(call)}"
        seen.add(words[0])
        command = group.commands[words[0]]
        known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"-h", "--help"}  # --x/--no-x
        for w in words[1:]:
            if re.fullmatch(r"--?[a-z][a-z0-9-]*(=.*)?", w):
                assert w.split("=")[0] in known, f"{where}: mtp-observe {words[0]} has no option {w} ({' '.join(call)})"
    return seen


def all_commands() -> set[str]:
    import typer.main

    from mtp_observe.cli import app

    return set(typer.main.get_command(app).commands)


def test_every_mtp_observe_line_in_the_readme_names_an_existing_command_and_options():
    calls = mtp_observe_calls(README)
    assert len(calls) > 30
    seen = check_calls(calls, "README.md")
    assert seen == all_commands(), f"the README shows no call of {all_commands() - seen}"


def test_every_mtp_observe_line_in_every_docs_page_names_an_existing_command_and_options():
    seen: set[str] = set()
    counted = 0
    for name, text in PAGES.items():
        if name == "README.md":
            continue
        calls = mtp_observe_calls(text)
        counted += len(calls)
        seen |= check_calls(calls, name)
    assert counted > 60 and len(PAGES) > 15
    assert seen == all_commands(), f"no docs page shows a call of {all_commands() - seen}"


def test_a_wrong_command_or_option_on_a_page_is_caught():
    """The checks above can fail: a made-up option, a made-up command."""
    import pytest

    for bad in ("`mtp-observe replay x.jsonl --no-such-option`", "    mtp-observe frobnicate x"):
        with pytest.raises(AssertionError):
            check_calls(mtp_observe_calls(bad), "made-up page")
    with pytest.raises(AssertionError):
        check_links("made-up.md", "[a](docs/missing.md) [b](docs/report.md#no-such-heading)")


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but - and _ dropped, spaces to -; repeats get -1, -2, ..."""
    out: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"#{1,6} (.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            base, n = slug, 0
            while slug in out:
                n += 1
                slug = f"{base}-{n}"
            out.add(slug)
    return out


def check_links(name: str, text: str) -> int:
    """Every relative [x](path) and [x](path#anchor) of the page (at ROOT/name) resolves; returns how many."""
    here = (ROOT / name).parent
    count = 0
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = (here / path).resolve() if path else ROOT / name
        assert file.exists(), f"{name} links {target}, which is not in the repository"
        if anchor and file.suffix == ".md":
            assert anchor in anchors(file.read_text()), f"{name} links {target}: no heading #{anchor} there"
        count += 1
    return count


def test_every_relative_link_in_the_readme_and_the_docs_pages_resolves_to_a_file_and_heading():
    counted = sum(check_links(name, text) for name, text in PAGES.items())
    assert counted > 50


def test_the_readme_needs_nothing_outside_the_repository():
    for name in DESIGN_DOCS:
        assert name not in README, f"the README points at {name}, which is not in the repository"
    assert "../research" not in README
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), f"the README links {target}, which is not in the repository"
    for path in set(re.findall(r"`((?:docs|mtp_observe|tests|benchmarks|scripts)/[\w./-]+\.(?:md|py|sh))`", README)):
        assert (ROOT / path).exists(), f"the README names {path}, which is not in the repository"
    for doc in (ROOT / "docs").glob("*.md"):
        text = doc.read_text()
        assert not any(name in text for name in DESIGN_DOCS) and "../shared" not in text, doc.name


def quickstart() -> list[str]:
    block = README.split("<!-- quickstart", 1)[1].split("```", 2)[1]
    return [ln for ln in block.splitlines() if ln.strip()]


def test_the_quickstart_installs_the_cpu_torch_before_the_project_and_states_the_suites_duration():
    lines = quickstart()
    torch_line = next(i for i, ln in enumerate(lines) if ln.startswith("pip install torch"))
    project_line = next(i for i, ln in enumerate(lines) if ln.startswith("pip install -e ."))
    assert torch_line < project_line and "/whl/cpu" in lines[torch_line]
    assert any(ln.startswith("pip install -e '.[test]' && python -m pytest") for ln in lines)
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -e '.[test]' && python -m pytest" in ci  # the README's test line is what CI runs
    assert re.search(r"the tests: about \d+ minutes", README)


def test_the_quickstart_commands_run_as_written(tmp_path):
    """Its mtp-observe commands, in a shell, from a copy of the demo sessions (the run lands in tmp_path/reports)."""
    shutil.copytree(ROOT / "sessions", tmp_path / "sessions")
    commands = [part.strip() for ln in quickstart() for part in ln.split(" #", 1)[0].split("&&")
                if part.strip().startswith("mtp-observe")]
    assert commands == ["mtp-observe replay sessions/*.jsonl", "mtp-observe report"]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    for command in commands:
        r = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, env=env)
        assert r.returncode == 0, (command, r.stderr[-2000:])
        assert r.stderr.count("error:") == 0, r.stderr
    assert r.stdout.startswith("UNRELIABLE · K to run: 0") and len(list((tmp_path / "reports").iterdir())) == 1
    first_screen_fits_100_columns(r.stdout)
    # The demo's report, stored before report.py became a package (tests/golden.py): every format byte-identical,
    # but the JSON's unrounded floats within float32 noise of another CPU.
    [run] = list((tmp_path / "reports").iterdir())
    places = {str(ROOT / "mtp_observe" / "default_model"): "MODEL", str(tmp_path): "TMP"}
    for fmt in ("json", "table", "markdown"):
        r = subprocess.run([sys.executable, "-m", "mtp_observe", "report", str(run.relative_to(tmp_path)), "--format", fmt],
                           cwd=tmp_path,  # the run as the README's user names it (a relative path: the screen's width)
                           capture_output=True, text=True, env={**env, "COLUMNS": "100"})  # the console script ran above
        assert r.returncode == 0, r.stderr
        check_golden(f"demo_report.{fmt}", normalise(r.stdout, places))
    first_screen_matches_the_readme()


def test_the_json_copy_takes_another_cpus_float32_digits_and_no_other_change():
    stored = '{\n  "tau": [1.6860819984298887, 2.15],\n  "fit_z": -0.011590593986668285,\n  "n": 7\n}\n'
    assert _floats_differ(stored, stored.replace("1.6860819984298887", "1.686081986709456")) is None
    assert _floats_differ(stored, stored.replace("-0.011590593986668285", "-0.01159085322492264")) is None
    assert "float 0" in _floats_differ(stored, stored.replace("1.6860819984298887", "1.6861"))  # a real change
    assert "not only float digits" in _floats_differ(stored, stored.replace('"n": 7', '"n": 8'))
    assert "not only float digits" in _floats_differ(stored, stored.replace("fit_z", "fit"))


def first_screen_fits_100_columns(screen: str) -> None:
    """The README's promise (issue 43, point 8): at 100 columns the demo's first screen is at most 24 lines (every line
    fits, so a terminal wraps none), no step printed twice, no `None` where the dtype goes."""
    lines = screen.splitlines()
    assert len(lines) <= 24 and max(len(line) for line in lines) <= 100, "\n".join(lines)
    steps = [line.split("  #", 1)[0].strip() for line in lines if line.startswith("  mtp-observe ")]
    assert len(steps) == len(set(steps)) and steps[0].startswith("mtp-observe generate "), steps
    assert "None" not in screen


def first_screen_matches_the_readme() -> None:
    """The README's first screen is the demo's (tests/golden/demo_report.table at 100 columns), line for line, and
    that screen fits: at most 24 lines, the verdict in the first."""
    table = (ROOT / "tests" / "golden" / "demo_report.table").read_text().splitlines()
    assert len(table) <= 24 and table[0].startswith("UNRELIABLE · K to run: 0")
    block = README.split("<!-- first screen", 1)[1].split("```", 2)[1].strip("\n").splitlines()
    def same(line: str) -> str:
        line = re.sub(r"(TMP/)?reports/run-[\w-]+", "RUN", line)
        return re.sub(r"\S*default_model|MODEL", "MODEL", line).rstrip()
    assert [same(x) for x in block] == [same(x) for x in table[: len(block)]] and len(block) >= 10