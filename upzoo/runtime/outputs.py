"""A model's main output, whatever else it returns."""

from __future__ import annotations

from typing import Any

__all__ = ["main_output"]


def main_output(out: Any) -> Any:
    """A model's main output: the first of a tuple or list (deep supervision), else the output."""
    return out[0] if isinstance(out, (list, tuple)) else out
