"""The catalogue of registered blocks that ``upzoo list`` shows: one row per block with its kind,
dims, guide, learned parameters at a reference size, description and origin."""

from __future__ import annotations

from typing import Any

from upzoo.registry import UPSAMPLERS, Kind, list_upsamplers

__all__ = ["describe_blocks"]


def describe_blocks(pattern: str = "*", *, kind: Kind | None = None) -> list[dict[str, Any]]:
    """One row per matching block: name, kind, dims, whether it needs a guide, learned parameters at
    a reference size (64 -> 64 channels, scale 2, a 64-channel guide, a 512-wide style as
    StyleGAN2's w, 2D where supported),
    description and origin."""
    rows = []
    for name in list_upsamplers(pattern, kind=kind):
        info = UPSAMPLERS.info(name)
        dims = 2 if 2 in info.spatial_dims else info.spatial_dims[0]
        guide = {"guide_channels": 64} if info.needs_guide else {}
        guide |= {"style_dim": 512} if info.needs_style else {}
        block = info.factory(
            spatial_dims=dims, in_channels=64, out_channels=64, scale=1 if info.kind == "post_filter" else 2, **guide
        )
        rows.append(
            {
                "name": name,
                "kind": info.kind,
                "dims": "/".join(f"{d}D" for d in info.spatial_dims),
                "guide": info.needs_guide,
                "style": info.needs_style,
                "params": sum(p.numel() for p in block.parameters()),
                "description": info.description,
                "origin": info.origin,
            }
        )
    return rows
