"""StyleGAN2's modulated convolution (Karras et al. 2020, "Analyzing and Improving the Image
Quality of StyleGAN"), written from its definition, and the ``modulated`` upsampling block in three
forms. A style-conditioned block takes ``block(x, style)``, ``style`` of shape ``(B, style_dim)``.

Per sample, the weights are scaled by the style (an affine map of it, bias initialised to 1) over
the input channels, ``w'[o, i] = w[o, i] * s[i]``, then demodulated,
``w''[o] = w'[o] / sqrt(sum_{i,k} w'[o, i, k]^2 + eps)``. It is computed in the authors' unfused
form (StyleGAN2-ADA's ``fused_modconv=False``): the input scaled by ``s``, one shared convolution,
the output scaled by the demodulation coefficients — the same sums as per-sample weights, without a
convolution grouped by the batch, so it exports with a dynamic batch. Weights are stored N(0, 1)
and scaled at run time by ``1 / sqrt(fan_in)`` (equalized learning rate), as the authors'.

Forms of ``modulated``:

- ``stylegan2`` (x2 only): the modulated 3x3 transposed convolution of stride 2, then the FIR
  low-pass ``[1, 3, 3, 1]`` (gain 4), StyleGAN2's own upsampling layer;
- ``transposed``: the modulated transposed convolution alone (kernel 4, padding 1 at x2; kernel =
  scale otherwise), the seed's form;
- ``after``: any registered block that keeps the channels (``block``, ``block_options``: nearest or
  bilinear ``interpolate``, ``fir``, ``pixel_shuffle``, ``dysample``, ``carafe``, Fourier ...) then a
  modulated 3x3 convolution.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.checks import check_positive_int
from upzoo.errors import ConfigError, ShapeError
from upzoo.registry import UPSAMPLERS, create_upsampler, register_upsampler
from upzoo.upsamplers.base import Upsampler

__all__ = ["ModulatedConv2d", "ModulatedUpsampler", "check_style", "FORMS"]

FORMS = ("stylegan2", "transposed", "after")
BLUR_TAPS = (1.0, 3.0, 3.0, 1.0)


def check_style(owner: str, style: torch.Tensor | None, batch: int, style_dim: int) -> None:
    """A style must be ``(B, style_dim)`` for a batch of ``B``.

    Raises:
        ShapeError: a missing style, or one of another shape (both shapes named).
    """
    if style is None:
        raise ShapeError(f"{owner} is style-conditioned: call it as block(x, style) with style of shape "
                         f"({batch}, {style_dim})")  # fmt: skip
    if tuple(style.shape) != (batch, style_dim):
        raise ShapeError(f"{owner} expects a style of shape ({batch}, {style_dim}) for a batch of {batch}, "
                         f"got {tuple(style.shape)}")  # fmt: skip


class ModulatedConv2d(nn.Module):
    """A modulated (and by default demodulated) convolution: ``(x (B, in, H, W), style (B,
    style_dim)) -> (B, out, H', W')``. ``transposed_stride`` > 1 makes it a transposed convolution
    of that stride (with ``padding``); otherwise it is same-padded.

    Raises:
        ConfigError: sizes that are not positive integers.
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, style_dim: int, *, demodulate: bool = True,
        transposed_stride: int = 1, padding: int | None = None, eps: float = 1e-8,
    ) -> None:  # fmt: skip
        super().__init__()
        self.in_channels = check_positive_int(in_channels, "modulated conv in_channels")
        self.out_channels = check_positive_int(out_channels, "modulated conv out_channels")
        self.kernel_size = check_positive_int(kernel_size, "modulated conv kernel_size")
        self.style_dim = check_positive_int(style_dim, "modulated conv style_dim")
        self.stride = check_positive_int(transposed_stride, "modulated conv transposed_stride")
        self.padding = kernel_size // 2 if padding is None else int(padding)
        self.demodulate, self.eps = bool(demodulate), float(eps)
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, kernel_size, kernel_size))
        self.weight_gain = 1 / math.sqrt(in_channels * kernel_size**2)
        self.affine_weight = nn.Parameter(torch.randn(in_channels, style_dim))
        self.affine_bias = nn.Parameter(torch.ones(in_channels))  # styles start at 1: the unmodulated conv
        self.affine_gain = 1 / math.sqrt(style_dim)

    def styles(self, style: torch.Tensor) -> torch.Tensor:
        """The per-sample scales of the input channels, ``(B, in_channels)``."""
        return F.linear(style, self.affine_weight * self.affine_gain, self.affine_bias)

    def forward(self, x: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
        check_style(type(self).__name__, style, x.shape[0], self.style_dim)
        weight = self.weight * self.weight_gain
        styles = self.styles(style)
        x = x * styles[:, :, None, None]
        if self.stride == 1:
            out = F.conv2d(x, weight, padding=self.padding)
        else:  # conv_transpose2d's weight is (in, out, k, k)
            out = F.conv_transpose2d(x, weight.transpose(0, 1), stride=self.stride, padding=self.padding)
        if not self.demodulate:
            return out
        # sum_{i,k} (w[o, i, k] s[i])^2 = sum_i (sum_k w[o, i, k]^2) s[i]^2, per sample and output channel
        coefficients = torch.rsqrt(styles.pow(2) @ weight.pow(2).sum(dim=(2, 3)).t() + self.eps)
        return out * coefficients[:, :, None, None]

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, style_dim={self.style_dim}, "
                f"demodulate={self.demodulate}, transposed_stride={self.stride}")  # fmt: skip


def _blur(x: torch.Tensor) -> torch.Tensor:
    """StyleGAN2's low-pass after its stride-2 transposed 3x3 conv: the separable ``[1, 3, 3, 1]``
    filter normalised to sum 1, times 4 (the zeros the stride inserted), padded by 1 per side."""
    taps = torch.tensor(BLUR_TAPS, dtype=x.dtype, device=x.device)
    kernel = torch.outer(taps, taps)
    kernel = (kernel / kernel.sum() * 4).flip(0, 1)  # a true convolution (symmetric taps: the same)
    channels = x.shape[1]
    return F.conv2d(F.pad(x, [1, 1, 1, 1]), kernel.expand(channels, 1, 4, 4).contiguous(), groups=channels)


@register_upsampler("modulated", spatial_dims=(2,))
class ModulatedUpsampler(Upsampler):
    """Style-conditioned upsampling, ``block(x, style)``: StyleGAN2's modulated transposed conv +
    FIR (``form="stylegan2"``, x2), the modulated transposed conv alone (``"transposed"``), or any
    registered block that keeps the channels followed by a modulated 3x3 conv (``"after"``, with
    ``block`` and ``block_options``). ``style_dim``: the width of the style vector.

    >>> up = ModulatedUpsampler(spatial_dims=2, in_channels=8, out_channels=4, scale=2, style_dim=16)
    >>> up(torch.rand(2, 8, 5, 5), torch.randn(2, 16)).shape
    torch.Size([2, 4, 10, 10])

    Raises:
        ConfigError: an unknown form, ``stylegan2`` at a scale other than 2, ``block`` options for
            another form, or a block for ``after`` that is guided, style-conditioned or changes the
            channels.
    """

    needs_style: ClassVar[bool] = True

    def __init__(
        self, *, spatial_dims: int, in_channels: int, out_channels: int, scale: int, style_dim: int,
        form: str = "stylegan2", block: str = "interpolate", block_options: dict[str, Any] | None = None,
        demodulate: bool = True,
    ) -> None:  # fmt: skip
        super().__init__(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, scale=scale)
        if form not in FORMS:
            raise ConfigError(f"modulated: form must be one of {', '.join(FORMS)}, got {form!r}")
        if form != "after" and (block != "interpolate" or block_options):
            raise ConfigError(f"modulated: block and block_options belong to form='after', not form={form!r}")
        if form != "after" and len(set(self.scale)) != 1:
            raise ConfigError(f"modulated form={form!r} upsamples both axes alike, got scale {scale!r}; give one "
                              "integer, or use form='after' (any block, any scale per axis)")  # fmt: skip
        factor = self.scale[0]
        self.form, self.style_dim = form, check_positive_int(style_dim, "modulated style_dim")
        if form == "stylegan2" and factor != 2:
            raise ConfigError(f"modulated form='stylegan2' upsamples by 2 (its FIR alignment), got scale {factor}; "
                              "stack x2 stages, or use form='after'")  # fmt: skip
        conv = {"stylegan2": (3, 2, 0), "transposed": (4, 2, 1) if factor == 2 else (factor, factor, 0),
                "after": (3, 1, None)}[form]  # fmt: skip
        self.conv = ModulatedConv2d(in_channels, out_channels, conv[0], self.style_dim, demodulate=demodulate,
                                    transposed_stride=conv[1], padding=conv[2])  # fmt: skip
        self.resize = _block_before(block, block_options, in_channels, self.scale) if form == "after" else None

    def forward(self, x: torch.Tensor, style: torch.Tensor | None = None) -> torch.Tensor:
        """``x (B, in_channels, H, W)`` and ``style (B, style_dim)`` -> ``(B, out_channels, H * s, W * s)``.

        Raises:
            ShapeError: wrong input dims or channels, a missing style, or one of the wrong shape.
        """
        self.output_shape(x.shape)
        check_style(type(self).__name__, style, x.shape[0], self.style_dim)
        return self.upsample(x, style)

    def upsample(self, x: torch.Tensor, style: torch.Tensor | None = None) -> torch.Tensor:
        if self.form == "after":
            return self.conv(self.resize(x), style)
        out = self.conv(x, style)
        return _blur(out) if self.form == "stylegan2" else out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, form={self.form!r}, style_dim={self.style_dim}"


def _block_before(block: str, options: dict[str, Any] | None, channels: int, scale: tuple[int, ...]) -> nn.Module:
    """The registered block of ``form='after'``, ``channels`` in and out, at ``scale``."""
    info = UPSAMPLERS.info(block)
    if info.needs_guide or getattr(info.factory, "needs_style", False):
        kind = "guided" if info.needs_guide else "style-conditioned"
        raise ConfigError(f"modulated form='after': block {block!r} is {kind}; give a block that upsamples alone "
                          "(interpolate, fir, pixel_shuffle, dysample, carafe, ...)")  # fmt: skip
    return create_upsampler(block, spatial_dims=2, in_channels=channels, out_channels=channels, scale=scale,
                            **(options or {}))  # fmt: skip
