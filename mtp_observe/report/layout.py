"""Layout: the report's text tables and numbers as text, one way for every view (STYLE.md rule 9).

Contract: `TextTable(title, columns, rows, caption)` is a table any view draws; `num(x)` and `with_interval(x, lo, hi)`
print a number and its interval; `column_groups(columns, rows, width)` splits a wide table into groups of columns
that fit a narrow terminal, the first column repeated in each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TextTable:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    caption: str = ""


def num(x: float, digits: int = 3, signed: bool = False) -> str:
    x = float(x)
    if not math.isfinite(x):
        return "—"
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def with_interval(x: float, lo: float | None, hi: float | None, digits: int = 3, signed: bool = False) -> str:
    if lo is None or hi is None or not (math.isfinite(float(lo)) and math.isfinite(float(hi))):
        return num(x, digits, signed)
    return f"{num(x, digits, signed)} [{num(lo, digits - 1, signed)},{num(hi, digits - 1, signed)}]"


def column_groups(columns: list[str], rows: list[list[str]], width: int) -> list[list[int]]:
    """Column indices per printed table: the first (label) column, then as many of the others as fit
    in `width` terminal columns, and the rest in further tables — a narrow terminal gets a table
    continued below it rather than truncated numbers."""

    def cell_width(text: str) -> int:
        return max((len(line) for line in str(text).splitlines()), default=0)

    widths = [max([cell_width(c)] + [cell_width(r[i]) for r in rows]) + 3 for i, c in enumerate(columns)]  # 2 padding, 1 rule
    groups, current, used = [], [0], widths[0] + 1
    for i in range(1, len(columns)):
        if len(current) > 1 and used + widths[i] > width:
            groups.append(current)
            current, used = [0], widths[0] + 1
        current.append(i)
        used += widths[i]
    return groups + [current]
