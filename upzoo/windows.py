"""Sliding-window inference over large 2D images and 3D volumes: Gaussian-weighted windows that
cover every pixel, averaged where they overlap (nnU-Net, MONAI's ``SlidingWindowInferer``); and the
one rule for which window a recipe's model is evaluated with (:func:`window_patch`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from numbers import Real
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from upzoo.checks import check_finite, check_number, check_positive_int, check_sizes
from upzoo.errors import ConfigError, ShapeError

__all__ = ["gaussian_importance", "sliding_window_inference", "window_patch"]


def gaussian_importance(patch: Sequence[int], sigma_scale: float = 0.125) -> torch.Tensor:
    """nnU-Net-style weights: a Gaussian with sigma ``patch * sigma_scale``, peak 1, minimum > 0.

    Raises:
        ConfigError: ``patch`` not whole numbers >= 1, or ``sigma_scale`` not a finite number > 0.
    """
    patch = check_sizes(patch, "patch")
    sigma_scale = check_number(sigma_scale, "sigma_scale", above=0)
    axes = []
    for p in patch:
        c, s = (p - 1) / 2, max(p * sigma_scale, 1e-3)
        axes.append(torch.exp(-((torch.arange(p) - c) ** 2) / (2 * s * s)))
    weight = axes[0]
    for a in axes[1:]:
        weight = weight[..., None] * a
    weight = weight / weight.max()
    return weight.clamp_min(weight[weight > 0].min().item() if (weight > 0).any() else 1e-6)


@torch.no_grad()
def sliding_window_inference(
    image: torch.Tensor,
    predictor: Callable[[torch.Tensor], torch.Tensor],
    patch_size: Sequence[int],
    *,
    overlap: float = 0.5,
    batch_size: int = 2,
    gaussian: bool = True,
) -> torch.Tensor:
    """Logits for a whole volume ``(C, *S)`` from a patch predictor ``(N, C, *P) -> (N, K, *P)``.

    Windows step by ``patch * (1 - overlap)`` and cover every voxel; overlapping predictions are
    averaged with Gaussian weights (or uniformly). Volumes smaller than the patch are padded.

    Returns:
        ``(K, *S)`` float logits on ``image``'s device.

    Raises:
        ShapeError: an image that is not ``(C, *S)``, or a predictor whose output is not
            ``(N, K, *P)``.
        ConfigError: a predictor that is not callable, NaN/inf, or a patch size, overlap or batch
            size out of range.
    """
    patch = _check_window_arguments(image, predictor, patch_size, overlap, batch_size)
    spatial = tuple(image.shape[1:])
    pad = [max(0, p - s) for p, s in zip(patch, spatial)]
    if any(pad):
        image = F.pad(image, [q for p in reversed(pad) for q in (0, p)])
    padded = tuple(image.shape[1:])
    starts = []
    for s, p in zip(padded, patch):
        step = max(1, int(p * (1 - overlap)))
        count = max(1, math.ceil((s - p) / step) + 1)
        starts.append(sorted({min(i * step, s - p) for i in range(count)}))
    grid = [tuple(c) for c in np.stack(np.meshgrid(*starts, indexing="ij"), -1).reshape(-1, len(patch))]
    weight = gaussian_importance(patch).to(image.device) if gaussian else torch.ones(patch, device=image.device)
    logits = None
    norm = torch.zeros(padded, device=image.device)
    for i in range(0, len(grid), batch_size):
        chunk = grid[i : i + batch_size]
        batch = torch.stack([image[(slice(None),) + tuple(slice(s, s + p) for s, p in zip(st, patch))] for st in chunk])
        out = predictor(batch)
        if not isinstance(out, torch.Tensor) or out.ndim != batch.ndim or out.shape[2:] != batch.shape[2:]:
            shown = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ShapeError(f"the predictor must map patches {tuple(batch.shape)} to (N, K, *{patch}), got {shown}")
        out = out.float()
        if logits is None:
            logits = torch.zeros((out.shape[1],) + padded, device=image.device)
        for st, o in zip(chunk, out):
            index = tuple(slice(s, s + p) for s, p in zip(st, patch))
            logits[(slice(None),) + index] += o * weight
            norm[index] += weight
    logits = logits / norm
    return logits[(slice(None),) + tuple(slice(0, s) for s in spatial)]


def _check_window_arguments(
    image: Any, predictor: Any, patch_size: Any, overlap: Any, batch_size: Any
) -> tuple[int, ...]:
    """``sliding_window_inference``'s arguments checked where they enter; returns the patch."""
    if not isinstance(image, torch.Tensor) or image.ndim < 2 or image.numel() == 0:
        shown = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
        raise ShapeError(f"image must be a non-empty tensor (C, *S) with at least one spatial axis, got {shown}")
    check_finite(image, "image")
    if not callable(predictor):
        raise ConfigError(f"predictor must be callable (a model or function), got {type(predictor).__name__}")
    patch = check_sizes(
        patch_size, f"patch_size (one per spatial axis of the image {tuple(image.shape)})", count=image.ndim - 1
    )
    if isinstance(overlap, bool) or not isinstance(overlap, Real) or not 0 <= overlap < 1:
        raise ConfigError(f"overlap must be a number in [0, 1), got {overlap!r}")
    check_positive_int(batch_size, "batch_size")
    return patch


def window_patch(recipe: Any, *, volumes: bool) -> tuple[int, ...] | None:
    """The one evaluation-window rule, for validation, ``upzoo eval`` and ``upzoo predict`` alike:
    volumes slide ``eval.patch_size`` (else the training crop) over the volume, or run whole when
    ``eval.sliding_window`` is false; 2D images slide the training crop (validation evaluates images
    whole: it passes ``volumes=True`` only for volumes). ``None``: run whole."""
    crop = recipe.data.crop_size
    patch = recipe.eval.window_patch(crop) if volumes else crop
    return tuple(int(p) for p in patch) if patch is not None else None
