"""The exception family every upzoo error belongs to.

Catch :class:`UpzooError` to handle any problem upzoo reports about its input; the CLI turns it into
a one-line message and exit code 1.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "UpzooError",
    "ConfigError",
    "RegistryError",
    "ShapeError",
    "DataError",
    "TrainingError",
    "UsageError",
    "did_you_mean",
    "one_line",
]


class UpzooError(Exception):
    """Base class of every error upzoo raises for bad input."""


class ConfigError(UpzooError, ValueError):
    """A value upzoo cannot use: an option, recipe field or argument, and a tensor's dtype, value
    range or NaN/inf values (what a tensor holds, not its shape)."""


class RegistryError(UpzooError, LookupError):
    """A name is not registered, registered twice, or given an option it does not take."""


class ShapeError(UpzooError, ValueError):
    """A tensor's shape or a size is not one the model, block or metric takes (dims, channels,
    spatial sizes, two sets that must match in count or size)."""


class DataError(UpzooError, ValueError):
    """A dataset file or folder, a checkpoint or a weights file is missing, unreadable, corrupt or
    inconsistent (missing or unexpected keys, weights of another shape)."""


class UsageError(UpzooError, ValueError):
    """A command-line value that does not parse or is out of range (exit code 2, like click's)."""


class TrainingError(UpzooError, RuntimeError):
    """A run cannot go on: a non-finite loss, ranks out of step, a checkpoint that does not fit."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices``, or ``""`` when none is close."""
    match = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.5)
    return f"; did you mean {match[0]!r}?" if match else ""


def one_line(text: str) -> str:
    """``text`` as one printable line: line breaks become ``; ``, other control characters escapes.

    >>> print(one_line("bad value\\x07\\nsecond line"))
    bad value\\x07; second line
    """
    joined = "; ".join(line.strip() for line in str(text).splitlines() if line.strip())
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in joined)
