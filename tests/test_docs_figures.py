"""Every time figure in README.md and docs/*.md comes from a script with its machine and date: a paragraph, table or
code block that holds one (a number followed by s, seconds, min, minutes, h, hours, ms or µs) names its source — a
script in benchmarks/, scripts/ or `.ci/run` — in itself or, for a table or a code block, in the paragraph next to
it. Numbers that are not measurements (timeouts, option defaults, sampling intervals) are the explicit allow-list
below, each with its reason."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"README.md": (ROOT / "README.md").read_text()} | {
    f"docs/{p.name}": p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}

NUMBER = r"(?<![\w.])\d(?:[\d,]*\d)?(?:\.\d+)?"
FIGURE = re.compile(rf"{NUMBER}(?:\s?[-–]\s?{NUMBER})?\s?(?:seconds|minutes|hours|min|ms|µs|s|h)(?![\w])")
SOURCE = re.compile(r"benchmarks/\w+\.py|scripts/[\w./-]+|\.ci/run")

# (page, the figure's text as FIGURE finds it, why it is not a measurement)
ALLOWED = {
    ("README.md", "8 minutes", "a budget the CUDA script is written to stay under, not a measurement"),
    ("docs/estimates-and-progress.md", "30 s", "the progress line's interval (--progress-every 30), an option default"),
    ("docs/drafters.md", "2 s", "the interval at which the benchmark samples /proc, a setting of the script"),
}


def blocks(text: str) -> list[tuple[str, str]]:
    """(kind, text) of each paragraph, table and fenced code block, in order (kind: "prose" | "table" | "code")."""
    out: list[tuple[str, str]] = []
    current: list[str] = []
    kind = "prose"
    fenced = False

    def close():
        nonlocal current
        if current:
            out.append((kind, "\n".join(current)))
        current = []

    for line in text.splitlines():
        if line.startswith("```"):
            if fenced:
                current.append(line)
                close()
                fenced = False
                kind = "prose"
            else:
                close()
                fenced, kind = True, "code"
                current.append(line)
            continue
        if fenced:
            current.append(line)
            continue
        line_kind = "table" if line.lstrip().startswith("|") else "prose"
        if not line.strip() or line_kind != kind or line.startswith("#"):
            close()
            kind = line_kind
        if line.strip():
            current.append(line)
    close()
    return out


def unsourced(page: str, text: str) -> list[str]:
    """The figures of `text` in a block with no source (module docstring), as 'page: figure  «block's start»'."""
    allowed = {(p, f) for p, f, _ in ALLOWED}
    items = blocks(text)
    missing = []
    for i, (kind, body) in enumerate(items):
        figures = [m.group(0) for m in FIGURE.finditer(body) if (page, m.group(0)) not in allowed]
        if not figures or SOURCE.search(body):
            continue
        if kind in ("table", "code"):
            near = [items[j][1] for j in (i - 1, i + 1) if 0 <= j < len(items) and items[j][0] == "prose"]
            if any(SOURCE.search(n) for n in near):
                continue
        missing.append(f"{page}: {', '.join(figures)}  «{body[:80]}»")
    return missing


def test_every_time_figure_in_the_readme_and_the_docs_names_the_script_it_comes_from():
    missing = [m for page, text in PAGES.items() for m in unsourced(page, text)]
    assert not missing, "time figures with no source line (name the benchmarks/ script, its machine and date):\n" + \
        "\n".join(missing)


def test_a_figure_without_a_source_is_caught_and_one_with_a_source_or_an_allowed_reason_is_not():
    assert unsourced("x.md", "The replay took 22-27 s on this CPU.\n") == [
        "x.md: 22-27 s  «The replay took 22-27 s on this CPU.»"]
    assert unsourced("x.md", "It took 5 min 08 s.\n") != []
    assert unsourced("x.md", "The replay took 22 s (benchmarks/replay_bench.py, 2-core CPU, 2026-12-03).\n") == []
    table = "| a | b |\n|---|---|\n| 1 | 84.8 s |\n"
    assert unsourced("x.md", table) != []
    assert unsourced("x.md", "Measured by `python benchmarks/tree_bench.py` on 2026-12-01:\n\n" + table) == []
    assert unsourced("README.md", "meant to finish in under 8 minutes\n") == []  # allowed, with its reason
    assert unsourced("x.md", "H200s (141 GB), a100 and l40s, min(S, e - p), min_p, Qwen3.5 and 8×H200\n") == []
    assert all(reason for _, _, reason in ALLOWED)
