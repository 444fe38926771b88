"""Exact per-layer output-size rules, the formulas PyTorch itself applies, one axis at a time.

``layer_rule(module)`` returns a function ``(spatial sizes) -> output spatial sizes`` for the layers
upzoo knows (convolutions, transposed convolutions, pooling, resizing, (un)shuffles, every registered
block) and ``None`` for the others; shape-preserving layers (norms, activations, dropout) are the
identity.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from torch import nn

from upzoo.errors import ShapeError

__all__ = [
    "conv_output_size",
    "conv_transpose_output_size",
    "pool_output_size",
    "interpolate_output_size",
    "layer_rule",
    "layer_output_shape",
    "SpatialRule",
]

SpatialRule = Callable[[tuple[int, ...]], tuple[int, ...]]


def conv_output_size(n: int, *, kernel_size: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    """``floor((n + 2p - d(k - 1) - 1) / s) + 1``, PyTorch's ``ConvNd`` (dilation included).

    >>> conv_output_size(33, kernel_size=3, stride=2, padding=1)
    17
    """
    return (n + 2 * padding - dilation * (kernel_size - 1) - 1) // stride + 1


def conv_transpose_output_size(
    n: int, *, kernel_size: int, stride: int = 1, padding: int = 0, output_padding: int = 0, dilation: int = 1
) -> int:
    """``(n - 1)s - 2p + d(k - 1) + output_padding + 1``, PyTorch's ``ConvTransposeNd``.

    >>> conv_transpose_output_size(33, kernel_size=4, stride=2, padding=1)
    66
    """
    return (n - 1) * stride - 2 * padding + dilation * (kernel_size - 1) + output_padding + 1


def pool_output_size(
    n: int, *, kernel_size: int, stride: int, padding: int = 0, dilation: int = 1, ceil_mode: bool = False
) -> int:
    """PyTorch's max/avg pooling size; with ``ceil_mode`` the last window must start inside the
    input or its left padding, otherwise it is dropped.

    >>> pool_output_size(6, kernel_size=3, stride=2, ceil_mode=True), pool_output_size(6, kernel_size=3, stride=2)
    (3, 2)
    """
    span = n + 2 * padding - dilation * (kernel_size - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= n + padding:
        out -= 1
    return out


def interpolate_output_size(n: int, *, size: int | None = None, scale_factor: float | None = None) -> int:
    """``size`` if given, else ``floor(n * scale_factor)`` (``F.interpolate``, ``nn.Upsample``)."""
    if size is not None:
        return int(size)
    return int(math.floor(n * float(scale_factor)))  # type: ignore[arg-type]


def _tuple(value: int | Sequence[int] | str, n: int) -> tuple:
    if isinstance(value, (int, float)):
        return (value,) * n
    return tuple(value)


def _conv_rule(m: nn.modules.conv._ConvNd) -> SpatialRule:
    n = len(m.kernel_size)
    if isinstance(m.padding, str):  # 'same' keeps the size (stride 1), 'valid' is no padding
        if m.padding == "same":
            return lambda s: tuple(s)
        padding = (0,) * n
    else:
        padding = m.padding
    if isinstance(m, nn.modules.conv._ConvTransposeNd):
        return lambda s: tuple(
            conv_transpose_output_size(x, kernel_size=k, stride=st, padding=p, output_padding=op, dilation=d)
            for x, k, st, p, op, d in zip(s, m.kernel_size, m.stride, padding, m.output_padding, m.dilation)
        )
    return lambda s: tuple(
        conv_output_size(x, kernel_size=k, stride=st, padding=p, dilation=d)
        for x, k, st, p, d in zip(s, m.kernel_size, m.stride, padding, m.dilation)
    )


def _pool_rule(m: nn.Module, n: int) -> SpatialRule:
    kernel = _tuple(m.kernel_size, n)
    stride = _tuple(m.stride if m.stride is not None else m.kernel_size, n)
    padding = _tuple(m.padding, n)
    dilation = _tuple(getattr(m, "dilation", 1), n)
    # PyTorch's CPU avg_pool3d also refuses inputs smaller than the kernel, whatever the padding
    needs_kernel = type(m) is nn.AvgPool3d
    return lambda s: tuple(
        0
        if needs_kernel and x < k
        else pool_output_size(x, kernel_size=k, stride=st, padding=p, dilation=d, ceil_mode=m.ceil_mode)
        for x, k, st, p, d in zip(s, kernel, stride, padding, dilation)
    )


_POOL_DIMS = {nn.MaxPool1d: 1, nn.MaxPool2d: 2, nn.MaxPool3d: 3, nn.AvgPool1d: 1, nn.AvgPool2d: 2, nn.AvgPool3d: 3}
_IDENTITY = (
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.Identity,
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.GELU,
    nn.SiLU,
    nn.Sigmoid,
    nn.Tanh,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.ELU,
    nn.PReLU,
    nn.Mish,
    nn.Softmax,
    nn.Dropout,
    nn.Dropout2d,
    nn.Dropout3d,
)


def layer_rule(module: nn.Module) -> SpatialRule | None:
    """The spatial output-size rule of ``module``, or ``None`` when upzoo has no rule for it."""
    from upzoo.upsamplers.base import Upsampler

    if isinstance(module, Upsampler):  # every registered block, post-filters included
        return lambda s: module.output_spatial(tuple(s))
    if isinstance(module, _IDENTITY):
        return lambda s: tuple(s)
    if isinstance(module, nn.modules.conv._ConvNd):
        return _conv_rule(module)
    for cls, n in _POOL_DIMS.items():
        if type(module) is cls:
            return _pool_rule(module, n)
    if isinstance(module, nn.Upsample):
        size, scale = module.size, module.scale_factor
        return lambda s: tuple(
            interpolate_output_size(
                x,
                size=None if size is None else _tuple(size, len(s))[i],
                scale_factor=None if scale is None else _tuple(scale, len(s))[i],
            )
            for i, x in enumerate(s)
        )
    if isinstance(module, (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, nn.AdaptiveAvgPool3d, nn.AdaptiveMaxPool3d)):
        out = module.output_size
        return lambda s: tuple(x if o is None else o for x, o in zip(s, _tuple(out, len(s))))
    if isinstance(module, nn.PixelShuffle):
        r = module.upscale_factor
        return lambda s: tuple(x * r for x in s)
    if isinstance(module, nn.PixelUnshuffle):
        r = module.downscale_factor
        return lambda s: tuple(x // r for x in s)
    return None


def layer_output_shape(module: nn.Module, input_shape: Sequence[int]) -> tuple[int, ...] | None:
    """Full ``(B, C, *S)`` output shape of a layer by its rule (channels included), or ``None``.

    Raises:
        ShapeError: the rule yields a non-positive size (PyTorch would fail on this input).
    """
    from upzoo.upsamplers.base import Upsampler

    if isinstance(module, Upsampler) or hasattr(module, "output_shape"):
        return tuple(module.output_shape(tuple(input_shape)))
    rule = layer_rule(module)
    if rule is None:
        return None
    b, c, *spatial = (int(v) for v in input_shape)
    out = rule(tuple(spatial))
    if any(o < 1 for o in out):
        raise ShapeError(f"{type(module).__name__} turns spatial size {tuple(spatial)} into {out}: too small an input")
    if isinstance(module, nn.modules.conv._ConvNd):
        c = module.out_channels
    elif isinstance(module, nn.PixelShuffle):
        c //= module.upscale_factor ** len(spatial)
    elif isinstance(module, nn.PixelUnshuffle):
        c *= module.downscale_factor ** len(spatial)
    return (b, c, *out)
