"""Zero insertion: each sample followed by ``scale - 1`` zeros along every axis, nothing learned
(the ``zeros`` mode of Schwarz et al.'s generator testbed; the first half of a transposed
convolution and of FIR upsampling)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from upzoo.registry import register_upsampler
from upzoo.upsamplers.base import Upsampler

__all__ = ["ZeroInsertionUpsampler", "insert_zeros"]


def insert_zeros(x: torch.Tensor, scale: Sequence[int]) -> torch.Tensor:
    """``(B, C, *S) -> (B, C, *S * scale)``: ``x`` at the positions that are multiples of ``scale``,
    zeros elsewhere; computed as a depthwise transposed convolution with a unit kernel (``stride =
    scale``, ``output_padding = scale - 1``), so it compiles and exports as one operator.

    >>> insert_zeros(torch.tensor([[[1.0, 2.0]]]), (3,))
    tensor([[[1., 0., 0., 2., 0., 0.]]])
    """
    channels, dims = x.shape[1], len(scale)
    unit = torch.ones((channels, 1) + (1,) * dims, dtype=x.dtype, device=x.device)
    transposed = getattr(F, f"conv_transpose{dims}d")
    return transposed(x, unit, stride=tuple(scale), output_padding=tuple(s - 1 for s in scale), groups=channels)


@register_upsampler("zero_insertion")
class ZeroInsertionUpsampler(Upsampler):
    """Zero insertion by ``scale`` (2D and 3D, per axis); keeps the channels and learns nothing.

    ``(B, C, *S) -> (B, C, *S * scale)``; ``out_channels`` must equal ``in_channels``. The mean
    falls by ``prod(scale)`` and the spectrum is repeated ``scale`` times per axis (images of the
    low frequencies appear at the high ones); a following convolution (a generator's next layer)
    has to remove them, which is what Schwarz et al.'s testbed measures.

    >>> up = ZeroInsertionUpsampler(spatial_dims=2, in_channels=4, out_channels=4, scale=2)
    >>> up(torch.ones(1, 4, 2, 3))[0, 0]
    tensor([[1., 0., 1., 0., 1., 0.],
            [0., 0., 0., 0., 0., 0.],
            [1., 0., 1., 0., 1., 0.],
            [0., 0., 0., 0., 0., 0.]])
    """

    keeps_channels = True

    def upsample(self, x: torch.Tensor) -> torch.Tensor:
        return insert_zeros(x, self.scale)
