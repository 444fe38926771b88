"""Content-aware reassembly, the step CARAFE, FADE and SAPA share: every output point is a weighted
sum of the ``k x k`` (3D: ``k x k x k``) neighbourhood of its source point in the low-resolution
input. Computed at the input resolution, so memory grows with the input, not with the output: the
``k^n`` neighbourhoods are materialised once per input point (``Tensor.unfold`` along each axis of
one padded, channels-last copy, in 2D and 3D alike), then one batched matmul. A loop over the
``k³`` offsets that never holds the neighbourhoods at once was measured slower *and* heavier on forward+backward at
k = 3 and 5 (its backward allocates per offset): docs/benchmarks.md."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = ["reassemble", "pixel_unshuffle_nd", "neighbourhoods", "default_kernel"]


def default_kernel(kernel_size: int | None, spatial_dims: int) -> int:
    """A reassembly kernel size, ``None`` meaning the default: 5 in 2D (the papers'), 3 in 3D (27
    neighbours, about 2D's 25, so about 2D's kernel memory per voxel)."""
    return (5 if spatial_dims == 2 else 3) if kernel_size is None else kernel_size


def pixel_unshuffle_nd(y: torch.Tensor, scale: Sequence[int]) -> torch.Tensor:
    """``(B, C, *S * scale) -> (B, C, prod(scale), *S)``: each output point's value at its source
    point, sub-position row-major over the axes — the inverse of
    :func:`upzoo.upsamplers.pixel_shuffle.pixel_shuffle_nd`.

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


def neighbourhoods(t: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """The zero-padded ``k^n`` neighbourhood of every point of a channels-last ``t (B, *S, C)``:
    ``(B, *S, k^n, C)``, offsets row-major. The channels stay innermost, so the copy out of the
    unfolded view moves contiguous rows (1.5x faster than offsets innermost, measured), and a
    batched matmul reads the result as it is.

    >>> neighbourhoods(torch.arange(3.0).reshape(1, 3, 1), 3)[..., 0]
    tensor([[[0., 0., 1.],
             [0., 1., 2.],
             [1., 2., 0.]]])
    """
    n, r = t.dim() - 2, kernel_size // 2
    u = F.pad(t, [0, 0] + [r] * (2 * n))
    for axis in range(1, n + 1):
        u = u.unfold(axis, kernel_size, 1)  # (B, *S, C, k, ..., k)
    u = u.permute(0, *range(1, n + 1), *range(n + 2, 2 * n + 2), n + 1)
    return u.reshape(*t.shape[:-1], kernel_size**n, t.shape[-1])


def reassemble(x: torch.Tensor, kernels: torch.Tensor, kernel_size: int, scale: Sequence[int]) -> torch.Tensor:
    """Reassemble ``x (B, C, *S)`` with ``kernels (B, k^n, r, *S)`` (one normalised kernel over the
    ``k^n`` neighbourhood per output sub-position ``r`` of each input point, ``r = prod(scale)``) into
    ``(B, C, *S * scale)``.

    Channels-last: one batched matmul of the kernels ``(B, *S, r, k^n)`` with the neighbourhoods
    ``(B, *S, k^n, C)`` (``kernels`` may be any strided view: SAPA's are ``(B, *S, r, k^n)``
    underneath and reach the matmul without a copy), then one permute puts the sub-positions in
    place. The channels-first einsum this replaced copied the neighbourhoods once more, forward
    and backward.

    >>> x = torch.rand(1, 2, 3, 3)
    >>> centre = torch.zeros(1, 9, 4, 3, 3)
    >>> centre[:, 4] = 1.0  # all weight on the point itself: nearest upsampling
    >>> torch.equal(reassemble(x, centre, 3, (2, 2)), F.interpolate(x, scale_factor=2.0))
    True
    """
    n = x.dim() - 2
    weights = kernels.permute(0, *range(3, 3 + n), 2, 1)  # (B, *S, r, k^n)
    out = torch.matmul(weights, neighbourhoods(x.movedim(1, -1), kernel_size))  # (B, *S, r, C)
    return _sub_positions_in_place(out, scale)


def _sub_positions_in_place(out: torch.Tensor, scale: Sequence[int]) -> torch.Tensor:
    """``(B, *S, r, C) -> (B, C, *S * scale)``, sub-position ``r`` row-major over the axes (as
    :func:`pixel_unshuffle_nd` orders them): one permute, one copy."""
    n = len(scale)
    b, *spatial, _, c = out.shape
    out = out.reshape(b, *spatial, *scale, c)
    order = [0, 2 * n + 1, *(v for a in range(n) for v in (1 + a, n + 1 + a))]  # (B, C, S1, r1, ..., Sn, rn)
    return out.permute(*order).reshape(b, c, *(s * r for s, r in zip(spatial, scale)))
