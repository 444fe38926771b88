"""Warnings re-emitted at the user's call rather than inside upzoo."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

__all__ = ["warnings_at_caller", "warn_at_caller"]

_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep  # the upzoo package folder, as a prefix


def _first_frame_outside_upzoo() -> int:
    """The ``stacklevel`` (counted from this function's caller) of the nearest frame whose code is
    not upzoo's: the user's call, however deep inside upzoo the warning was noticed."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


class warnings_at_caller:  # noqa: N801 - used as a context manager, like contextlib's
    """Re-emit the warnings raised inside the block, prefixed, at the nearest frame outside upzoo —
    so a warning points at the user's own call (``UNet(...)``, ``create_upsampler(...)``), not at
    upzoo's internals, at any depth of nesting (an outer block's prefix is not added twice)."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    def __enter__(self) -> warnings_at_caller:
        self._catcher = warnings.catch_warnings(record=True)
        self._caught = self._catcher.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc: object) -> None:
        self._catcher.__exit__(*exc)
        for caught in self._caught:
            text = str(caught.message)
            message = text if text.startswith(self.prefix) else self.prefix + text
            warnings.warn(message, caught.category, stacklevel=_first_frame_outside_upzoo())


def warn_at_caller(message: str, category: type[Warning] = FutureWarning) -> None:
    """Warn at the nearest frame outside upzoo: the user's call, however deep upzoo noticed."""
    warnings.warn(message, category, stacklevel=_first_frame_outside_upzoo())
