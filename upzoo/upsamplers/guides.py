"""How models call blocks: the options a model adds for a guided block at a decoder stage (the
encoder skip as its guide) and the call that passes the guide to guided blocks only."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from upzoo.errors import ConfigError
from upzoo.registry import UPSAMPLERS

__all__ = ["guide_options", "upsample"]


def guide_options(name: str, skip_channels: int, where: str) -> dict[str, Any]:
    """The options a model adds for block ``name`` at a decoder stage whose skip has
    ``skip_channels`` channels: ``guide_channels`` for a guided block, nothing otherwise.

    Raises:
        ConfigError: a guided block at a stage without a skip (``skip_channels == 0``), or a
            style-conditioned block (no model but a style-based generator gives a style).
    """
    info = UPSAMPLERS.info(name)
    if info.needs_style:
        raise ConfigError(f"{where}: {name!r} is style-conditioned (block(x, style)); only a style-based generator "
                          "gives its blocks a style; choose a block that upsamples alone")  # fmt: skip
    if not info.needs_guide:
        return {}
    if skip_channels <= 0:
        raise ConfigError(
            f"{where}: {name!r} is guided by the encoder skip, but this stage has none (it upsamples to the input "
            f"resolution, or the model is a generator); give this stage an unguided upsampler, e.g. a per-stage "
            f"list ending in 'interpolate'"
        )
    return {"guide_channels": skip_channels}


def upsample(block: nn.Module, x: torch.Tensor, guide: torch.Tensor | None) -> torch.Tensor:
    """``block(x, guide)`` for a guided block, ``block(x)`` for the others."""
    return block(x, guide) if getattr(block, "needs_guide", False) else block(x)
