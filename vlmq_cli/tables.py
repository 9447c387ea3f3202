"""Plain-text output: aligned tables and durations."""

from __future__ import annotations

from collections.abc import Sequence


def table(headings: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in headings], *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headings))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f} %"
