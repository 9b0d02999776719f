"""Rows as a Markdown table: the form every experiment's table and summary take.

Kept apart from `sweep` so that the experiment modules can use it without importing the registry.
"""

from __future__ import annotations

from typing import Any

from wanspec.bench.experiment import Row


def columns(rows: list[Row]) -> list[str]:
    """Every column of any row, in order of first appearance."""
    return list(dict.fromkeys(c for r in rows for c in r))


def _cell_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == 0 or 1e-3 <= abs(value) < 1e6:
            return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value)


def markdown_table(rows: list[Row], drop: tuple[str, ...] = ("hash",)) -> str:
    """The rows under a header of every column, `drop`'s left out; "(no rows)" for none."""
    if not rows:
        return "(no rows)"
    names = [c for c in columns(rows) if c not in drop]
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    lines += ["| " + " | ".join(_cell_text(r.get(c)) for c in names) + " |" for r in rows]
    return "\n".join(lines)
