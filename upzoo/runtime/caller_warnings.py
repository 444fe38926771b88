"""Warnings re-emitted at the user's call rather than inside upzoo."""

from __future__ import annotations

import warnings

__all__ = ["warnings_at_caller"]


class warnings_at_caller:  # noqa: N801 - used as a context manager, like contextlib's
    """Re-emit the warnings raised inside the block, prefixed, at the caller of the function that
    holds the ``with`` — so a warning points at the user's own call (``UNet(...)``,
    ``create_upsampler(...)``), not at upzoo's internals."""

    def __init__(self, prefix: str = "", stacklevel: int = 3) -> None:
        self.prefix, self.stacklevel = prefix, stacklevel

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
            warnings.warn(message, caught.category, stacklevel=self.stacklevel)
