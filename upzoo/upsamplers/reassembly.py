"""Content-aware reassembly, the step CARAFE, FADE and SAPA share: every output point is a weighted
sum of the ``k x k`` neighbourhood of its source point in the low-resolution input. Computed at the
input resolution — the ``C x k²`` neighbourhoods are unfolded once per input point, never per
output point — so memory grows with the input, not with the output."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from upzoo.upsamplers.pixel_shuffle import pixel_shuffle_nd

__all__ = ["reassemble", "pixel_unshuffle_2d", "neighbourhoods"]


def pixel_unshuffle_2d(y: torch.Tensor, scale: Sequence[int]) -> torch.Tensor:
    """``(B, C, H * s_h, W * s_w) -> (B, C, s_h * s_w, H, W)``: each output point's value at its
    source point, sub-position ``i * s_w + j`` — the inverse of :func:`pixel_shuffle_nd`.

    >>> pixel_unshuffle_2d(torch.zeros(2, 3, 8, 12), (2, 3)).shape
    torch.Size([2, 3, 6, 4, 4])
    """
    b, c, hs, ws = y.shape
    sh, sw = scale
    y = y.reshape(b, c, hs // sh, sh, ws // sw, sw).permute(0, 1, 3, 5, 2, 4)
    return y.reshape(b, c, sh * sw, hs // sh, ws // sw)


def neighbourhoods(x: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """``(B, C, H, W) -> (B, C, k², H, W)``: the zero-padded ``k x k`` neighbourhood of every point."""
    b, c, h, w = x.shape
    return F.unfold(x, kernel_size, padding=kernel_size // 2).reshape(b, c, kernel_size**2, h, w)


def reassemble(x: torch.Tensor, kernels: torch.Tensor, kernel_size: int, scale: Sequence[int]) -> torch.Tensor:
    """Reassemble ``x (B, C, H, W)`` with ``kernels (B, k², r, H, W)`` (one normalised ``k x k``
    kernel per output sub-position ``r`` of each input point, ``r = s_h * s_w``) into
    ``(B, C, H * s_h, W * s_w)``.

    >>> x = torch.rand(1, 2, 3, 3)
    >>> centre = torch.zeros(1, 9, 4, 3, 3)
    >>> centre[:, 4] = 1.0  # all weight on the point itself: nearest upsampling
    >>> torch.equal(reassemble(x, centre, 3, (2, 2)), F.interpolate(x, scale_factor=2.0))
    True
    """
    b, c, h, w = x.shape
    r = kernels.shape[2]
    out = torch.einsum("bckhw,bkrhw->bcrhw", neighbourhoods(x, kernel_size), kernels)
    return pixel_shuffle_nd(out.reshape(b, c * r, h, w), scale)
