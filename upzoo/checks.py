"""The one place a plain value's range is checked, for the Python API and the readers alike: whole
numbers, and voxel spacings in millimetres (recipes, dataset listings, file headers, the predictor,
stride planning and the surface metrics all ask the same question and get the same answer).

Each check returns the value in its plain form (``int``, a tuple of ``float``) or raises the error
class its caller names (:class:`~upzoo.errors.ConfigError` for arguments, ``DataError`` for files)
with one line: what was expected, what came.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

import numpy as np
import torch

from upzoo.errors import ConfigError, UpzooError

__all__ = [
    "is_int",
    "check_positive_int",
    "check_odd",
    "check_sizes",
    "check_finite",
    "check_number",
    "spacing_numbers",
    "check_spacing",
    "LARGEST_SPACING_MM",
]

#: The largest voxel spacing taken, in mm (10 m): beyond it a value is a unit mistake, not a voxel.
LARGEST_SPACING_MM = 1e4


def is_int(value: object) -> bool:
    """A whole number that is not a bool (Python, NumPy or a 0-d integer tensor's ``item()``)."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def check_positive_int(value: object, name: str, *, minimum: int = 1, error: type[UpzooError] = ConfigError) -> int:
    """Return ``value`` as an int, or raise ``error`` if it is not a whole number ``>= minimum``
    (a bool, a float such as ``2.0`` and a string are refused).

    >>> check_positive_int(3, "channels")
    3
    """
    if not is_int(value) or int(value) < minimum:  # type: ignore[call-overload]
        raise error(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return int(value)  # type: ignore[call-overload]


def check_bool(value: object, name: str, *, error: type[UpzooError] = ConfigError) -> bool:
    """``value`` if it is a bool; anything else (``'no'``, ``1``) is refused, never read as one.

    >>> check_bool(True, "y_channel")
    True

    Raises:
        ConfigError (or ``error``): naming the value.
    """
    if not isinstance(value, bool):
        raise error(f"{name} must be True or False, got {value!r}")
    return value


def check_odd(value: Any, name: str) -> Any:
    """A kernel size that centres on its pixel: a whole number >= 1 that is odd, or a tuple of them
    (one per axis); returned as it came (an ``int`` or a tuple of ``int``).

    >>> check_odd(3, "kernel_size"), check_odd((1, 3, 3), "kernel_size")
    (3, (1, 3, 3))

    Raises:
        ConfigError: a value that is not whole, below 1, or even on some axis.
    """
    values = value if isinstance(value, tuple) else (value,)
    for v in values:
        check_positive_int(v, name)
    if any(int(v) % 2 == 0 for v in values):
        raise ConfigError(f"{name} must be odd (centred on its pixel, 'same' padding) on every axis, got {value!r}")
    return tuple(int(v) for v in values) if isinstance(value, tuple) else int(value)


def check_sizes(
    value: Any, what: str, *, count: int | None = None, error: type[UpzooError] = ConfigError
) -> tuple[int, ...]:
    """Sizes in pixels or voxels: ``count`` whole numbers >= 1 (``None``: any number >= 1), as a
    list, tuple, NumPy array or tensor; fractional sizes are refused, not truncated.

    >>> check_sizes((64, 64), "patch_size", count=2)
    (64, 64)
    """
    items = value.tolist() if hasattr(value, "tolist") and not isinstance(value, (str, bytes)) else value
    listed = isinstance(items, (list, tuple))
    if listed and (len(items) == count if count else len(items) >= 1) and all(is_int(v) and v >= 1 for v in items):
        return tuple(int(v) for v in items)
    amount = f"{count} whole numbers >= 1" if count else "whole numbers >= 1 (one per axis)"
    shown = tuple(items) if listed else value
    raise error(f"{what} must be {amount}, got {shown!r}")


def check_finite(x: Any, what: str, *, error: type[UpzooError] = ConfigError) -> None:
    """Refuse a tensor or array holding NaN or inf, naming how many values are: they would turn every
    score downstream into NaN without a word."""
    if isinstance(x, torch.Tensor):
        if not x.is_floating_point() or bool(torch.isfinite(x.sum())):
            return  # the fast path: a finite sum holds no NaN or inf (an overflowing one is counted below)
        total, bad = x.numel(), int((~torch.isfinite(x)).sum())
    else:
        x = np.asarray(x)
        total, bad = x.size, int(x.size - np.count_nonzero(np.isfinite(x)))
    if bad:
        raise error(f"{what}: {bad} of {total} values are NaN or infinite; replace them (e.g. torch.nan_to_num) first")


def spacing_numbers(value: Any) -> list[float] | None:
    """``value`` as a list of floats if it is a sequence, array or tensor of real numbers (no bools,
    no text), else ``None``."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        return None
    if not all(isinstance(v, Real) and not isinstance(v, bool) for v in value):
        return None
    return [float(v) for v in value]


def check_spacing(value: Any, what: str, *, axes: int | None = 3, error: type[UpzooError] = ConfigError) -> tuple:
    """A voxel spacing: one positive finite size in mm per axis (``axes`` of them; ``None``: any
    number >= 1), at most :data:`LARGEST_SPACING_MM`; a list, tuple, NumPy array or tensor.

    >>> check_spacing([5, 0.8, 0.8], "spacing")
    (5.0, 0.8, 0.8)

    Raises:
        ``error``: ``"{what} must be ..., got ..."``, showing the values as numbers where they are.
    """
    numbers = spacing_numbers(value)
    count_ok = numbers is not None and (len(numbers) == axes if axes else len(numbers) >= 1)
    if count_ok and all(0 < v <= LARGEST_SPACING_MM and math.isfinite(v) for v in numbers):
        return tuple(numbers)
    count = f"{axes} positive" if axes else "positive"
    order = " (D, H, W)" if axes == 3 else ""
    shown = tuple(numbers) if numbers is not None else value
    raise error(
        f"{what} must be {count} finite voxel sizes in mm{order}, each at most {LARGEST_SPACING_MM:g}, got {shown!r}"
    )


def check_number(
    value: object,
    name: str,
    *,
    above: float | None = None,
    at_least: float | None = None,
    below: float | None = None,
    error: type[UpzooError] = ConfigError,
) -> float:
    """Return ``value`` as a float, or raise ``error`` if it is not a finite real number (a bool, a
    string, a complex number, NaN and inf are refused) in the range the bounds give: ``> above``,
    ``>= at_least``, ``< below``.

    >>> check_number(0.5, "overlap", at_least=0, below=1)
    0.5
    """
    number = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
    if (
        number
        and (above is None or value > above)
        and (at_least is None or value >= at_least)
        and (below is None or value < below)
    ):
        return float(value)  # type: ignore[arg-type]
    low = f"> {above:g}" if above is not None else f">= {at_least:g}" if at_least is not None else ""
    high = f"< {below:g}" if below is not None else ""
    bounds = " and ".join(v for v in (low, high) if v)
    raise error(f"{name} must be a finite number{' ' + bounds if bounds else ''}, got {value!r}")
