"""Content-aware reassembly, the step CARAFE, FADE and SAPA share: every output point is a weighted
sum of the ``k x k`` (3D: ``k x k x k``) neighbourhood of its source point in the low-resolution
input. Computed at the input resolution, so memory grows with the input, not with the output: the
``k^n`` neighbourhoods are materialised once per input point (``Tensor.unfold`` along each axis of
one padded copy, in 2D and 3D alike), then one einsum. A loop over the ``k³`` offsets that
never holds the neighbourhoods at once was measured slower *and* heavier on forward+backward at
k = 3 and 5 (its backward allocates per offset): docs/benchmarks.md."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from upzoo.upsamplers.pixel_shuffle import pixel_shuffle_nd

__all__ = ["reassemble", "pixel_unshuffle_nd", "windows", "default_kernel"]


def default_kernel(kernel_size: int | None, spatial_dims: int) -> int:
    """A reassembly kernel size, ``None`` meaning the default: 5 in 2D (the papers'), 3 in 3D (27
    neighbours, about 2D's 25, so about 2D's kernel memory per voxel)."""
    return (5 if spatial_dims == 2 else 3) if kernel_size is None else kernel_size


def pixel_unshuffle_nd(y: torch.Tensor, scale: Sequence[int]) -> torch.Tensor:
    """``(B, C, *S * scale) -> (B, C, prod(scale), *S)``: each output point's value at its source
    point, sub-position row-major over the axes — the inverse of :func:`pixel_shuffle_nd`.

    >>> pixel_unshuffle_nd(torch.zeros(2, 3, 8, 12), (2, 3)).shape
    torch.Size([2, 3, 6, 4, 4])
    >>> pixel_unshuffle_nd(torch.zeros(1, 1, 3, 8, 8), (1, 2, 2)).shape
    torch.Size([1, 1, 4, 3, 4, 4])
    """
    b, c, *big = y.shape
    n = len(scale)
    small = [s // r for s, r in zip(big, scale)]
    y = y.reshape(b, c, *(v for s, r in zip(small, scale) for v in (s, r)))
    # (B, C, S1, r1, ..., Sn, rn) -> (B, C, r1..rn, S1..Sn)
    y = y.permute(0, 1, *(3 + 2 * a for a in range(n)), *(2 + 2 * a for a in range(n)))
    product = 1
    for r in scale:
        product *= r
    return y.reshape(b, c, product, *small)


def windows(t: torch.Tensor, kernel_size: int, axes: Sequence[int]) -> torch.Tensor:
    """``t`` with the zero-padded ``k^n`` neighbourhood of every point along its ``axes`` as a new
    last axis, row-major over the offsets: ``(*t.shape, k^n)``.

    >>> windows(torch.arange(3.0).reshape(1, 3), 3, [1])
    tensor([[[0., 0., 1.],
             [0., 1., 2.],
             [1., 2., 0.]]])
    """
    r = kernel_size // 2
    pad = [0] * (2 * t.dim())
    for axis in axes:
        pad[2 * (t.dim() - 1 - axis)] = pad[2 * (t.dim() - 1 - axis) + 1] = r
    u = F.pad(t, pad)
    for axis in axes:
        u = u.unfold(axis, kernel_size, 1)
    return u.reshape(*t.shape, kernel_size ** len(axes))


def reassemble(x: torch.Tensor, kernels: torch.Tensor, kernel_size: int, scale: Sequence[int]) -> torch.Tensor:
    """Reassemble ``x (B, C, *S)`` with ``kernels (B, k^n, r, *S)`` (one normalised kernel over the
    ``k^n`` neighbourhood per output sub-position ``r`` of each input point, ``r = prod(scale)``) into
    ``(B, C, *S * scale)``.

    >>> x = torch.rand(1, 2, 3, 3)
    >>> centre = torch.zeros(1, 9, 4, 3, 3)
    >>> centre[:, 4] = 1.0  # all weight on the point itself: nearest upsampling
    >>> torch.equal(reassemble(x, centre, 3, (2, 2)), F.interpolate(x, scale_factor=2.0))
    True
    """
    b, c, *spatial = x.shape
    r = kernels.shape[2]
    out = torch.einsum("bc...k,bkr...->bcr...", windows(x, kernel_size, range(2, x.dim())), kernels)
    return pixel_shuffle_nd(out.reshape(b, c * r, *spatial), scale)
