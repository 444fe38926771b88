"""Rendering rows of results as Markdown, CSV or JSON — the one table format every command uses."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from typing import Any, Literal

__all__ = ["render_table", "to_json", "TableFormat"]

TableFormat = Literal["markdown", "csv", "json"]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.3e}"
    if isinstance(value, (tuple, list)):
        return "x".join(str(v) for v in value)
    return str(value)


def _jsonable(value: Any) -> Any:
    """Plain JSON data: NaN becomes ``None`` and infinities the strings ``"inf"`` / ``"-inf"`` (JSON
    has no such numbers; ``float()`` reads those strings back), tuples lists, tensors and NumPy
    scalars numbers, anything else its ``str``."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # 0-d tensors, NumPy scalars
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value):
            return None
        return value if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    return value if isinstance(value, (bool, int, str)) else str(value)


def to_json(value: Any, *, indent: int | None = 2) -> str:
    """Valid JSON text for results: an undefined metric (NaN, e.g. the IoU of a class absent from
    both prediction and ground truth) is written as ``null``, an infinite one (the HD95 of a class
    missed entirely) as the string ``"inf"``.

    >>> to_json({"miou": float("nan"), "hd95": float("inf"), "shape": (1, 3)}, indent=None)
    '{"miou": null, "hd95": "inf", "shape": [1, 3]}'
    """
    return json.dumps(_jsonable(value), indent=indent, allow_nan=False)


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], fmt: TableFormat = "markdown") -> str:
    """Render ``rows`` (dicts) restricted to ``columns``.

    >>> print(render_table([{"a": 1, "b": 0.5}], ["a", "b"]))
    | a | b |
    |---|---|
    | 1 | 0.5 |
    """
    if fmt == "json":
        return to_json([{c: row.get(c) for c in columns} for row in rows])
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
