"""The upsampler contract every block follows."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from upzoo.checks import check_positive_int
from upzoo.errors import ConfigError, ShapeError
from upzoo.layers import check_input_shape, to_ntuple

__all__ = ["Upsampler", "PostFilter", "MAX_SCALE"]

MAX_SCALE = 256  # per axis, per block: beyond it the weights of most blocks alone exhaust memory


class Upsampler(nn.Module):
    """Base class of the registered blocks: ``(B, in_channels, *S) -> (B, out_channels, *S_out)``.

    Subclasses set ``supported_spatial_dims``, build their layers in ``__init__`` and implement
    :meth:`upsample`; :meth:`forward` checks the input first. ``output_shape`` is analytic: by
    default ``S_out = S * scale`` per axis; blocks with other arithmetic override
    :meth:`output_spatial`.

    Args:
        spatial_dims: 2 for images ``(B, C, H, W)``, 3 for volumes ``(B, C, D, H, W)``.
        in_channels: channels of the input.
        out_channels: channels of the output.
        scale: an int, or one int per spatial axis such as ``(1, 2, 2)``, each in ``1..MAX_SCALE`` (256).

    Raises:
        ConfigError: unsupported ``spatial_dims``, non-positive channels, bad ``scale``.
    """

    kind: ClassVar[str] = "upsampler"
    supported_spatial_dims: ClassVar[tuple[int, ...]] = (2, 3)
    any_channels: ClassVar[bool] = False  # channel-wise blocks may leave the channels unset (None): any count
    needs_guide: ClassVar[bool] = False  # guided blocks take forward(x, guide) and a guide_channels option
    keeps_channels: ClassVar[bool] = False  # out_channels must equal in_channels (nothing mixes channels)
    guide_channels: int | None = None

    def __init__(
        self, *, spatial_dims: int, in_channels: int | None, out_channels: int | None, scale: int | Sequence[int]
    ) -> None:
        super().__init__()
        if spatial_dims not in self.supported_spatial_dims:
            raise ConfigError(
                f"{type(self).__name__} supports spatial_dims in {self.supported_spatial_dims}, got {spatial_dims!r}"
            )
        self.spatial_dims = int(spatial_dims)
        if self.any_channels and in_channels is None and out_channels is None:
            self.in_channels = self.out_channels = None
        else:
            self.in_channels = check_positive_int(in_channels, "in_channels")
            self.out_channels = check_positive_int(out_channels, "out_channels")
            if self.keeps_channels and self.out_channels != self.in_channels:
                raise ConfigError(
                    f"{type(self).__name__} keeps the channel count: out_channels must equal in_channels "
                    f"({self.in_channels}), got {self.out_channels}; follow it with a convolution to change channels"
                )
        self.scale: tuple[int, ...] = to_ntuple(scale, self.spatial_dims, "scale")
        if max(self.scale) > MAX_SCALE:
            raise ConfigError(f"scale must be at most {MAX_SCALE} per axis, got {scale!r}; upsample in several stages")

    @property
    def scale_product(self) -> int:
        """How many output positions each input position becomes: ``prod(scale)``."""
        return math.prod(self.scale)

    def output_spatial(self, spatial: tuple[int, ...]) -> tuple[int, ...]:
        """Output spatial size for input spatial size ``spatial`` (no forward pass)."""
        return tuple(s * k for s, k in zip(spatial, self.scale))

    def output_shape(self, input_shape: Sequence[int]) -> tuple[int, ...]:
        """``(B, in_channels, *S) -> (B, out_channels, *S_out)``, computed without running the block.

        Raises:
            ShapeError: wrong number of dims or channels.
        """
        shape = check_input_shape(
            input_shape,
            spatial_dims=self.spatial_dims,
            channels=self.in_channels,
            owner=type(self).__name__,
            supported=self.supported_spatial_dims,
        )
        channels = shape[1] if self.out_channels is None else self.out_channels
        return (shape[0], channels, *self.output_spatial(shape[2:]))

    def forward(self, x: torch.Tensor, guide: torch.Tensor | None = None) -> torch.Tensor:
        """``x (B, in_channels, *S) -> (B, out_channels, *S_out)``.

        ``guide``: the high-resolution feature a guided block (``needs_guide``) generates its
        kernels from, ``(B, guide_channels, *S_out)`` — in a U-Net, the encoder skip at the output
        resolution. Blocks without a guide accept one and do not use it.

        Raises:
            ShapeError: wrong input dims or channels, a missing guide, or a guide of the wrong shape.
        """
        shape = check_input_shape(
            x.shape,
            spatial_dims=self.spatial_dims,
            channels=self.in_channels,
            owner=type(self).__name__,
            supported=self.supported_spatial_dims,
        )
        if not self.needs_guide:
            return self.upsample(x)
        self.check_guide(shape, guide)
        return self.upsample(x, guide)

    guide_description = "the encoder feature at the output resolution"  # what a guided block's guide is

    def check_guide(self, input_shape: Sequence[int], guide: torch.Tensor | None) -> None:
        """A guided block's guide must be ``(B, guide_channels, *S_out)`` for this input.

        Raises:
            ShapeError: naming the expected and the given shape.
        """
        name = type(self).__name__
        expected = (input_shape[0], self.guide_channels, *self.output_spatial(tuple(input_shape[2:])))
        if guide is None:
            raise ShapeError(
                f"{name} is guided: call it as block(x, guide) with guide of shape {expected} "
                f"({self.guide_description})"
            )
        if tuple(guide.shape) != expected:
            raise ShapeError(
                f"{name} expects a guide of shape {expected} for input {tuple(input_shape)}, got {tuple(guide.shape)}"
            )

    def upsample(self, x: torch.Tensor, guide: torch.Tensor | None = None) -> torch.Tensor:  # pragma: no cover
        """The block's computation, ``(B, C_in, *S)`` (and the guide) -> ``(B, C_out, *S * scale)``;
        ``forward`` checks the input first.

        Raises:
            NotImplementedError: a subclass that does not define it (every registered block does).
        """
        raise NotImplementedError

    def extra_repr(self) -> str:
        return (
            f"spatial_dims={self.spatial_dims}, in_channels={self.in_channels}, "
            f"out_channels={self.out_channels}, scale={self.scale}"
        )


class PostFilter(Upsampler):
    """A block of the same contract at scale 1 that keeps the channels (kind ``post_filter``), e.g.
    the masked blur after a model's last layer: ``(B, C, *S) -> (B, C, *S)``. ``channels=None``
    takes any channel count."""

    kind: ClassVar[str] = "post_filter"
    any_channels: ClassVar[bool] = True
    keeps_channels: ClassVar[bool] = True

    def __init__(self, *, spatial_dims: int, channels: int | None = None) -> None:
        super().__init__(spatial_dims=spatial_dims, in_channels=channels, out_channels=channels, scale=1)


def renamed_option(name: str, value: Any, default: Any, old_name: str, old_value: Any) -> Any:
    """An option under its new ``name``, or under ``old_name`` for one more release (a
    ``FutureWarning`` naming the new name, as timm's renamed arguments do).

    Raises:
        ConfigError: both names given, with different values.
    """
    if old_value is None:
        return value
    if value not in (default, old_value):
        raise ConfigError(
            f"{old_name}={old_value!r} and {name}={value!r} differ; give {name} alone ({old_name} is its old name)"
        )
    warnings.warn(f"{old_name} is deprecated and will be removed; use {name}", FutureWarning, stacklevel=4)
    return old_value
