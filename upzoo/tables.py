"""Rendering rows of results as Markdown, CSV or JSON — the one table format every command uses."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any, Literal, Sequence

__all__ = ["render_table", "TableFormat"]

TableFormat = Literal["markdown", "csv", "json"]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.3e}"
    if isinstance(value, (tuple, list)):
        return "x".join(str(v) for v in value)
    return str(value)


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], fmt: TableFormat = "markdown") -> str:
    """Render ``rows`` (dicts) restricted to ``columns``.

    >>> print(render_table([{"a": 1, "b": 0.5}], ["a", "b"]))
    | a | b |
    |---|---|
    | 1 | 0.5 |
    """
    if fmt == "json":
        return json.dumps([{c: row.get(c) for c in columns} for row in rows], indent=2, default=str)
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(row.get(c, "")) for c in columns])
        return buffer.getvalue().rstrip("\n")
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)
