"""Local similarity, SAPA's step before the reassembly: every output point's query against the ``k^n``
keys around its source point, ``sim[p, r, o] = <query(p, r), key(p + o)>`` with keys outside the
image zero.

Computed in tiles of ``t^n`` input points: the queries of a tile (``t^n`` points times ``r``
sub-positions) meet the ``(t + k - 1)^n`` keys of the tile's window in one matmul, and a fixed index
picks each query's ``k^n`` neighbours out of the window. That is ``(t + k - 1)^n / k^n`` times the
multiply-adds of the neighbourhood product (2.6x at ``k = 5, t = 4``) in a few thousand mid-sized
matmuls instead of one ``r x D`` by ``D x k^n`` product per input point, and the keys are copied
about ``((t + k - 1) / t)^n`` times instead of ``k^n`` times: forward+backward about 1.5x faster
than materialising the neighbourhoods (docs/benchmarks.md). The queries are laid out tile by tile
straight from the channels-first guide, in the one copy that puts them channels-last anyway.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = ["tile_for", "tiled_queries", "local_similarity"]


def tile_for(spatial_dims: int) -> int:
    """Input points per tile along each axis: 4 in 2D (16 points against a window of 64 keys at
    k = 5), 2 in 3D (8 points against 64 keys at k = 3); measured fastest of 2, 4 and 8."""
    return 4 if spatial_dims == 2 else 2


def _tiles(spatial: Sequence[int], tile: int) -> list[int]:
    return [(size + tile - 1) // tile for size in spatial]  # not -(-a // b): ONNX's Div truncates


def _none(padding: Sequence[int]) -> bool:
    """Whether no padding is needed, known without a guard: ``False`` for symbolic sizes (export,
    dynamic compile), which then take the padded path whatever they turn out to be."""
    return all(isinstance(p, int) and p == 0 for p in padding)


def tiled_queries(guide: torch.Tensor, scale: Sequence[int], tile: int) -> torch.Tensor:
    """``(B, C, *S * scale) -> (B, *T, t^n * r, C)``, channels-last, ``T = ceil(S / t)``: the guide
    at every output point, grouped by the tile of its source point, rows ordered by the source point
    within the tile, then the sub-position (row-major). Zero-padded at the end to whole tiles.

    >>> tiled_queries(torch.zeros(2, 3, 10, 12), (2, 2), 4).shape
    torch.Size([2, 2, 2, 64, 3])
    """
    b, c, *big = guide.shape
    n = len(scale)
    tiles = _tiles([size // r for size, r in zip(big, scale)], tile)
    padding = [t * tile * r - size for t, r, size in zip(tiles, scale, big)]
    if not _none(padding):
        guide = F.pad(guide, [v for p in reversed(padding) for v in (0, p)])
    y = guide.reshape(b, c, *(v for t, r in zip(tiles, scale) for v in (t, tile, r)))
    # (B, C, T1, t, s1, ..., Tn, t, sn) -> (B, T1..Tn, t..t, s1..sn, C)
    order = [*(2 + 3 * a for a in range(n)), *(3 + 3 * a for a in range(n)), *(4 + 3 * a for a in range(n))]
    rows = tile**n * math.prod(scale)
    return y.permute(0, *order, 1).reshape(b, *tiles, rows, c)  # every size named: no -1 (export)


def _window_index(n: int, tile: int, kernel_size: int, sub_positions: int, device: torch.device) -> torch.Tensor:
    """``(t^n * r, k^n)``: for each query row of a tile, the window columns of its ``k^n`` neighbours
    (offsets row-major), the window being ``(t + k - 1)^n`` keys, row-major."""
    width = tile + kernel_size - 1
    local, offset = torch.arange(tile**n, device=device), torch.arange(kernel_size**n, device=device)
    column = torch.zeros(tile**n, kernel_size**n, dtype=torch.long, device=device)
    for axis in range(n):
        at = (local // tile ** (n - 1 - axis)) % tile
        shift = (offset // kernel_size ** (n - 1 - axis)) % kernel_size
        column = column * width + at[:, None] + shift[None, :]
    return column.repeat_interleave(sub_positions, dim=0)


def _windows(keys: torch.Tensor, tiles: Sequence[int], tile: int, kernel_size: int) -> torch.Tensor:
    """``(B, *S, D) -> (B, *T, w^n, D)``, ``w = t + k - 1``: the zero-padded window of keys that
    the neighbourhoods of a tile's points cover, row-major. Built from whole blocks of ``t`` (a
    reshape, then slices of the next blocks), not ``Tensor.unfold``: every size stays an expression
    of the input's, so exports keep the sizes dynamic."""
    b, *spatial, d = keys.shape
    n, half, width = len(spatial), kernel_size // 2, tile + kernel_size - 1
    reach = (kernel_size - 2) // tile + 1  # blocks beyond its own that a window reaches into
    padding = [v for t, s in zip(reversed(tiles), reversed(spatial)) for v in (half, (t + reach) * tile - s - half)]
    u = F.pad(keys, [0, 0] + padding)  # each axis (T + reach) * t long
    for axis, t in enumerate(tiles):
        at = 1 + 2 * axis  # (B, T1, w1, ..., T_axis + reach, ...) -> (B, ..., T_axis, w_axis, ...)
        u = u.reshape(*u.shape[:at], t + reach, tile, *u.shape[at + 1 :])
        u = torch.cat([u.narrow(at, j, t) for j in range(reach + 1)], dim=at + 1)
        if width < (reach + 1) * tile:  # a static check: no copy where the blocks fill the window
            u = u.narrow(at + 1, 0, width)
    order = [*(1 + 2 * a for a in range(n)), *(2 + 2 * a for a in range(n))]
    return u.permute(0, *order, 2 * n + 1).reshape(b, *tiles, width**n, d)


def local_similarity(queries: torch.Tensor, keys: torch.Tensor, kernel_size: int, tile: int) -> torch.Tensor:
    """``queries (B, *T, t^n * r, D)`` (as :func:`tiled_queries` lays them out) against the
    zero-padded ``k^n`` neighbourhoods of ``keys (B, *S, D)``: ``(B, *S, r, k^n)``, offsets row-major
    (as :func:`upzoo.upsamplers.reassembly.neighbourhoods`).

    >>> q = torch.ones(1, 1, 1, 16, 2)  # one tile of 4 points, r = 4, D = 2
    >>> local_similarity(q, torch.ones(1, 1, 1, 2), 3, 4)[0, 0, 0, 0]  # 4 neighbours inside
    tensor([0., 0., 0., 0., 2., 0., 0., 0., 0.])
    """
    b, *spatial, d = keys.shape
    n = len(spatial)
    tiles = _tiles(spatial, tile)
    window = _windows(keys, tiles, tile, kernel_size)  # (B, *T, w^n, D)
    full = torch.matmul(queries, window.transpose(-1, -2))  # (B, *T, t^n r, w^n)
    sub_positions = queries.shape[-2] // tile**n
    index = _window_index(n, tile, kernel_size, sub_positions, keys.device)
    sim = full.gather(-1, index.expand(*full.shape[:-1], kernel_size**n))  # (B, *T, t^n r, k^n)
    sim = sim.reshape(b, *tiles, *([tile] * n), sub_positions, kernel_size**n)
    order = [v for a in range(n) for v in (1 + a, 1 + n + a)]  # (B, T1, t, ..., Tn, t, r, k^n)
    sim = sim.permute(0, *order, 2 * n + 1, 2 * n + 2)
    sim = sim.reshape(b, *(t * tile for t in tiles), sub_positions, kernel_size**n)
    if _none([t * tile - s for t, s in zip(tiles, spatial)]):
        return sim
    for axis, size in enumerate(spatial, start=1):  # crop the padding: a copy, never a view whose
        sim = sim.index_select(axis, torch.arange(size, device=sim.device))  # layout hangs on the sizes
    return sim
