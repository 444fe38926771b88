"""Dimension-generic helpers shared by the blocks: layer classes by ``spatial_dims``, per-axis
tuples and input-shape checks with errors that say how to fix the input."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from upzoo.checks import is_int
from upzoo.errors import ConfigError, ShapeError

__all__ = [
    "conv_nd",
    "conv_transpose_nd",
    "batch_norm_nd",
    "instance_norm_nd",
    "avg_pool_nd",
    "linear_mode",
    "to_ntuple",
    "check_input_shape",
    "refuse_jit_trace",
    "pad_end",
    "crop_start",
    "format_shape",
]

_CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
_CONV_TRANSPOSE = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}
_BATCH_NORM = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
_INSTANCE_NORM = {1: nn.InstanceNorm1d, 2: nn.InstanceNorm2d, 3: nn.InstanceNorm3d}
_AVG_POOL = {1: nn.functional.avg_pool1d, 2: nn.functional.avg_pool2d, 3: nn.functional.avg_pool3d}
_LINEAR_MODE = {1: "linear", 2: "bilinear", 3: "trilinear"}
_AXES = {1: "L", 2: "H, W", 3: "D, H, W"}


def conv_nd(spatial_dims: int) -> type[nn.Conv1d | nn.Conv2d | nn.Conv3d]:
    """The ``nn.ConvNd`` class for 1, 2 or 3 spatial dims."""
    return _CONV[spatial_dims]


def conv_transpose_nd(spatial_dims: int) -> type[nn.ConvTranspose1d | nn.ConvTranspose2d | nn.ConvTranspose3d]:
    """The ``nn.ConvTransposeNd`` class for 1, 2 or 3 spatial dims."""
    return _CONV_TRANSPOSE[spatial_dims]


def batch_norm_nd(spatial_dims: int) -> type[nn.modules.batchnorm._BatchNorm]:
    """The ``nn.BatchNormNd`` class for 1, 2 or 3 spatial dims."""
    return _BATCH_NORM[spatial_dims]


def instance_norm_nd(spatial_dims: int) -> type[nn.modules.instancenorm._InstanceNorm]:
    """The ``nn.InstanceNormNd`` class for 1, 2 or 3 spatial dims."""
    return _INSTANCE_NORM[spatial_dims]


def avg_pool_nd(spatial_dims: int):
    """``F.avg_pool1d/2d/3d`` for 1, 2 or 3 spatial dims."""
    return _AVG_POOL[spatial_dims]


def linear_mode(spatial_dims: int) -> str:
    """The (multi-)linear interpolation mode of ``F.interpolate`` / ``grid_sample`` for these dims.

    >>> linear_mode(2), linear_mode(3)
    ('bilinear', 'trilinear')
    """
    return _LINEAR_MODE[spatial_dims]


def to_ntuple(value: object, n: int, name: str, *, minimum: int = 1) -> tuple[int, ...]:
    """Expand an int to an ``n``-tuple, or check a sequence has length ``n``; all ints ``>= minimum``.

    >>> to_ntuple(2, 3, "scale"), to_ntuple((1, 2, 2), 3, "scale")
    ((2, 2, 2), (1, 2, 2))

    Raises:
        ConfigError: not an int or sequence of ints, wrong length, or a value below ``minimum``.
    """
    if is_int(value):
        values: tuple[object, ...] = (value,) * n
    elif isinstance(value, Sequence) and not isinstance(value, str):
        values = tuple(value)
        if len(values) != n:
            raise ConfigError(
                f"{name} needs one value per spatial axis ({n} for {n}D), got {len(values)}: {value!r}; "
                f"pass an int or a tuple of {n} ints"
            )
    else:
        values = ()
    if not values or not all(is_int(v) and int(v) >= minimum for v in values):  # type: ignore[call-overload]
        raise ConfigError(f"{name} must be a whole number >= {minimum} or a tuple of {n} such numbers, got {value!r}")
    return tuple(int(v) for v in values)  # type: ignore[call-overload]


def format_shape(shape: Sequence[int]) -> str:
    """``(2, 3, 64, 64)`` -> ``'2x3x64x64'``, the notation of the CLI."""
    return "x".join(str(s) for s in shape)


def pad_end(x: torch.Tensor, padding: Sequence) -> torch.Tensor:
    """Zero-pad each spatial axis of ``(B, C, *S)`` at its end by ``padding[axis]`` (ints or symbolic)."""
    return torch.nn.functional.pad(x, [p for amount in reversed(padding) for p in (0, amount)])


def crop_start(x: torch.Tensor, spatial: Sequence) -> torch.Tensor:
    """``x[:, :, :spatial[0], :spatial[1], ...]``. Traced by ``torch.compile``/``torch.export``, the
    crop is a copy (``slice_copy``): a view's contiguity would depend on the size, and the tracer
    would specialise the graph to it (ONNX has no strides, and no ``slice_copy``: a view there)."""
    if not torch.compiler.is_compiling() or torch.onnx.is_in_onnx_export():
        return x[(slice(None), slice(None)) + tuple(slice(0, s) for s in spatial)]
    for axis, size in enumerate(spatial):
        x = torch.slice_copy(x, axis + 2, 0, size)
    return x


def refuse_jit_trace(owner: str) -> None:
    """Raise ``ConfigError`` inside ``torch.jit.trace`` (also the TorchScript ONNX exporter): it
    records sizes and data-dependent choices as constants, so its graph would compute something
    else than the model at other inputs."""
    if torch.jit.is_tracing():
        raise ConfigError(
            f"{owner} cannot be traced by torch.jit.trace or the TorchScript ONNX exporter (torch.onnx.export with "
            f"dynamo=False): that tracer turns sizes and data-dependent choices into constants; use "
            f"`upzoo export`, torch.onnx.export(..., dynamo=True) or torch.export.export"
        )


def check_input_shape(
    shape: Sequence[int], *, spatial_dims: int, channels: int | None, owner: str, supported: Sequence[int] = (2, 3)
) -> tuple[int, ...]:
    """Check ``shape`` is ``(B, channels, *S)`` with ``spatial_dims`` axes in ``S`` (``supported``:
    the spatial dims the owner can be built with, which the message suggests).

    Raises:
        ShapeError: naming the expected layout, the shape that came, and the fix.
    """
    refuse_jit_trace(owner)
    if not all(is_int(s) or isinstance(s, torch.SymInt) for s in shape):
        raise ShapeError(f"{owner} takes a shape of whole numbers, got {tuple(shape)!r}")
    shape = tuple(shape)
    expected = f"(B, {channels if channels is not None else 'C'}, {_AXES.get(spatial_dims, '...')})"
    if len(shape) != spatial_dims + 2:
        other = len(shape) - 2  # suggest another spatial_dims only where it exists (2D and 3D)
        rebuild = f" or build it with spatial_dims={other}" if other in supported else ""
        raise ShapeError(
            f"{owner} expects a {spatial_dims}D batch {expected} with {spatial_dims + 2} dims, "
            f"got {len(shape)} dims {shape}; add the batch/channel axes{rebuild}"
        )
    if channels is not None and shape[1] != channels:
        raise ShapeError(
            f"{owner} expects {channels} input channels {expected}, got {shape[1]} in shape {shape}; "
            f"build it with in_channels={shape[1]} or feed {channels} channels"
        )
    if any(s < 1 for s in shape[2:]):
        raise ShapeError(f"{owner} got an empty spatial axis in shape {shape}")
    return shape
