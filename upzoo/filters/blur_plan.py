"""The masked blur's plan: its options checked once (kernel sizes, sigmas, border, stride, soft,
threshold), the per-axis Gaussian taps, and the lattice of blurred positions for a given shape."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from upzoo.checks import check_odd
from upzoo.errors import ConfigError, ShapeError
from upzoo.layers import to_ntuple

__all__ = ["Border", "gaussian_taps", "check_options", "taps_and_steps", "make_plan", "Plan"]

Border = Literal["valid", "zeros", "reflect", "replicate"]


_BORDERS = ("valid", "zeros", "reflect", "replicate")


_PAD_BACKWARD = {
    ("reflect", 2): torch.ops.aten.reflection_pad2d_backward,
    ("reflect", 3): torch.ops.aten.reflection_pad3d_backward,
    ("replicate", 2): torch.ops.aten.replication_pad2d_backward,
    ("replicate", 3): torch.ops.aten.replication_pad3d_backward,
}


def gaussian_taps(kernel_size: int, sigma: float | None = None) -> tuple[float, ...]:
    """The normalised 1D Gaussian of odd length ``kernel_size``.

    ``sigma=None`` with ``kernel_size=3`` is ``[1, 2, 1] / 4`` (so the 2D kernel is the classic
    ``[1,2,1] x [1,2,1] / 16``); for other sizes ``sigma=None`` means ``0.3 * ((k - 1) / 2 - 1) + 0.8``
    (OpenCV's and torchvision's default).

    >>> gaussian_taps(3)
    (0.25, 0.5, 0.25)
    """
    if sigma is None:
        if kernel_size == 3:
            return (0.25, 0.5, 0.25)
        sigma = 0.3 * ((kernel_size - 1) * 0.5 - 1) + 0.8
    radius = kernel_size // 2
    weights = [math.exp(-(i * i) / (2.0 * sigma * sigma)) for i in range(-radius, radius + 1)]
    total = sum(weights)
    return tuple(w / total for w in weights)


@dataclass(frozen=True)
class Plan:
    """Everything the blur needs besides the tensors, derived once from the options and the shape."""

    taps: tuple[tuple[float, ...], ...]  # per spatial axis
    border: Border
    pads: tuple[int, ...]  # k // 2 per spatial axis
    lattice: tuple[tuple[int, int, int], ...]  # (first, count, step) of blurred positions per axis

    @property
    def index(self) -> tuple[slice, ...]:
        """Index selecting the blurred positions of a ``(B, C, *S)`` tensor."""
        return (slice(None), slice(None)) + tuple(slice(f, f + s * (c - 1) + 1, s) for f, c, s in self.lattice)

    @property
    def pad_list(self) -> list[int]:
        """``F.pad`` order: last axis first."""
        return [p for p in reversed(self.pads) for _ in (0, 1)]

    def window_start(self, axis: int) -> int:
        """Index in the (padded, unless ``valid``) input of the first tap for the first position."""
        first = self.lattice[axis][0]
        return first - self.pads[axis] if self.border == "valid" else first


def _is_number(value: object, *, finite: bool = True) -> bool:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return math.isfinite(value) or (not finite and not math.isnan(value))


def check_options(
    n: int, kernel_size, sigma, border, stride, soft, threshold=0.0
) -> tuple[tuple[int, ...], tuple, tuple[int, ...]]:
    """Validate the shape-independent options; return per-axis kernel sizes, sigmas and strides."""
    if not _is_number(threshold, finite=False):
        raise ConfigError(f"threshold must be a number (inf and -inf allowed, not NaN), got {threshold!r}")
    sizes = to_ntuple(kernel_size, n, "kernel_size")
    check_odd(sizes, "kernel_size")
    sigmas = tuple(sigma) if isinstance(sigma, (tuple, list)) else (sigma,) * n
    if len(sigmas) != n or any(s is not None and not (_is_number(s) and s > 0) for s in sigmas):
        raise ConfigError(f"sigma must be None, a positive finite number or {n} of them, got {sigma!r}")
    if border not in _BORDERS:
        raise ConfigError(f"border must be one of {', '.join(_BORDERS)}, got {border!r}")
    steps = to_ntuple(stride, n, "stride")
    if soft is not None and not (_is_number(soft) and soft > 0):
        raise ConfigError(f"soft must be None or a positive finite temperature, got {soft!r}")
    return sizes, sigmas, steps


def taps_and_steps(n: int, kernel_size, sigma, border, stride, soft, threshold=0.0) -> tuple[tuple, tuple[int, ...]]:
    """Check the options; return the per-axis Gaussian taps and strides."""
    sizes, sigmas, steps = check_options(n, kernel_size, sigma, border, stride, soft, threshold)
    taps = tuple(gaussian_taps(k, float(sg) if sg is not None else None) for k, sg in zip(sizes, sigmas))
    return taps, steps


def make_plan(spatial: Sequence[int], taps: tuple[tuple[float, ...], ...], border: str, steps: Sequence[int]) -> Plan:
    pads = tuple(len(k) // 2 for k in taps)
    if border == "reflect" and any(p >= s for p, s in zip(pads, spatial)):
        raise ShapeError(
            f"border='reflect' needs every spatial size > kernel_size // 2 {pads}, got {tuple(spatial)}; "
            f"use border='replicate' or a smaller kernel"
        )
    lattice = []
    for size, p, s in zip(spatial, pads, steps):
        # positions r with r = p (mod s): the original loop's grid, starting at the first interior pixel
        start, stop = (p, size - p) if border == "valid" else (p % s, size)
        lattice.append((start, len(range(start, stop, s)), s))
    return Plan(taps=taps, border=border, pads=pads, lattice=tuple(lattice))  # type: ignore[arg-type]


def axis_slice(ndim: int, axis: int, start: int, count: int, step: int) -> tuple[slice, ...]:
    index = [slice(None)] * ndim
    index[axis] = slice(start, start + step * (count - 1) + 1, step)
    return tuple(index)


def pad(x: torch.Tensor, plan: Plan) -> torch.Tensor:
    if plan.border == "valid" or not any(plan.pads):
        return x
    mode = "constant" if plan.border == "zeros" else plan.border
    return torch.nn.functional.pad(x, plan.pad_list, mode=mode)


def unpad_grad(gp: torch.Tensor, x: torch.Tensor, plan: Plan) -> torch.Tensor:
    if plan.border == "zeros":
        return gp[(slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(plan.pads, x.shape[2:]))]
    return _PAD_BACKWARD[(plan.border, x.ndim - 2)](gp, x, plan.pad_list)
