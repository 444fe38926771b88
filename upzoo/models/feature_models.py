"""Models around a frozen backbone: :class:`FeatureUpsampler` (its features lifted to pixel
resolution by a registry block, the image as the guide) and :class:`LinearProbe` (a 1x1 linear head on
those features: the protocol that judges feature upsamplers)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.checks import check_positive_int
from upzoo.errors import ConfigError
from upzoo.models.backbones import FrozenBackbone, build_backbone, read_run
from upzoo.registry import UPSAMPLERS, create_upsampler
from upzoo.upsamplers.guides import upsample

__all__ = ["FeatureUpsampler", "LinearProbe", "FEATURE_GUIDES"]

#: How the objective guides the block (:meth:`FeatureUpsampler.objective`).
FEATURE_GUIDES = ("pooled", "image")


class FeatureUpsampler(nn.Module):
    """``image (B, 3, H, W) in [0, 1] -> (B, C, H, W)``: a frozen backbone's features at stride
    ``s`` upsampled x``s`` by a registry block; a guided block gets the image as its guide.

    Args:
        backbone: a timm model name (with ``weights``), ``"run:PATH"`` (a trained 2D segmentation
            run's encoder) or a :class:`~upzoo.models.backbones.FrozenBackbone`.
        weights: the timm model's local weights file, or ``"random"`` (seeded random weights).
        layer: the backbone's layer (None: the last).
        upsampler: a registry block (``jafar``, ``jbu``, ``loftup``, ``anyup``, ``interpolate`` for
            bilinear, or a decoder block such as ``carafe``) and ``upsampler_options``, its options.

    Raises:
        ConfigError: bad backbone (see :func:`~upzoo.models.backbones.build_backbone`), a
            post-filter or unknown block.
    """

    def __init__(
        self,
        *,
        backbone: str | FrozenBackbone = "vit_tiny_patch16_224",
        weights: str | None = None,
        layer: int | None = None,
        upsampler: str = "jafar",
        upsampler_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.backbone = build_backbone(backbone, weights, layer)
        info = UPSAMPLERS.info(upsampler)
        if info.kind != "upsampler" or 2 not in info.spatial_dims:
            raise ConfigError(f"upsampler {upsampler!r} is a {info.kind} for {info.spatial_dims}D; give a 2D upsampler")
        options = dict(upsampler_options or {})
        if info.needs_guide:
            options.setdefault("guide_channels", 3)
        if upsampler == "interpolate":
            options.setdefault("mode", "bilinear")
        channels, stride = self.backbone.channels, self.backbone.stride
        self.upsampler = create_upsampler(
            upsampler, spatial_dims=2, in_channels=channels, out_channels=channels, scale=stride, **options
        )
        self.upsampler_name = upsampler

    @property
    def channels(self) -> int:
        return self.backbone.channels

    def size_multiple(self) -> tuple[int, int]:
        """Image sides must be multiples of the backbone's stride."""
        return (self.backbone.stride, self.backbone.stride)

    def forward(
        self, image: torch.Tensor, ratio: int | None = None, *, consistency: bool = False, guide: str = "pooled"
    ) -> Any:
        """The features at pixel resolution; with ``ratio``, :meth:`objective`'s triple instead (and
        with ``consistency``, :meth:`consistency_pair`'s two more: one forward pass, as DDP needs)."""
        if ratio is None:
            return upsample(self.upsampler, self.backbone(image), image)
        prediction, target, low = self.objective(image, ratio, guide=guide)
        if not consistency:
            return prediction, target, low
        return prediction, target, low, *self.consistency_pair(image, target)

    def objective(
        self, images: torch.Tensor, ratio: int, *, guide: str = "pooled"
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """JAFAR's training pair for images ``(B, 3, H, W)`` in [0, 1] (sides multiples of stride x
        ``ratio``): ``(prediction, target, low)`` with ``target`` the features of the images and
        ``low`` those of the images average-pooled by ``ratio``. ``prediction`` is ``low`` lifted to
        the target's grid by the block (``resample``), in one of two ways:

        - ``guide="pooled"``: x``ratio``, guided by the images pooled to the target grid;
        - ``guide="image"``: x``ratio * stride`` to the images' own pixels, guided by the full-resolution
          images (the guide the block gets in use), then average-pooled by the stride to the target grid.

        Only image-guided, ratio-agnostic blocks have ``resample``.

        Raises:
            ConfigError: a block without ``resample`` (a fixed-scale decoder block), an unknown ``guide``.
            ShapeError: images whose sides are not multiples of stride x ``ratio``.
        """
        if not hasattr(self.upsampler, "resample"):
            raise ConfigError(
                f"{self.upsampler_name!r} runs at its one scale (x{self.backbone.stride}); the objective trains a "
                f"block at lower ratios: use jbu, jafar, loftup or anyup"
            )
        if guide not in FEATURE_GUIDES:
            raise ConfigError(f"the objective's guide must be one of {', '.join(FEATURE_GUIDES)}, got {guide!r}")
        stride = self.backbone.stride
        target = self.backbone(images)
        low = self.backbone(F.avg_pool2d(images, ratio))
        if guide == "image":
            lifted = self.upsampler.resample(low, images, ratio * stride)
            return F.avg_pool2d(lifted, stride), target, low
        return self.upsampler.resample(low, F.avg_pool2d(images, stride), ratio), target, low

    def consistency_pair(self, images: torch.Tensor, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """JAFAR's consistency term's pair (the authors' ``train.py``): the full images' ``features``
        upsampled to half the image size (x stride / 2) guided by the half-size image blurred
        (Gaussian 5x5, sigma 1, with probability 0.5) and noised (0.02, with probability 0.3), and,
        without gradient, guided by the clean half-size image. Random draws from torch's generator.

        Raises:
            ConfigError: a backbone with an odd stride (no half-size grid of whole ratio).
        """
        from torchvision.transforms.functional import gaussian_blur

        stride = self.backbone.stride
        if stride % 2:
            raise ConfigError(f"the consistency term lifts features x stride / 2: the stride {stride} is odd")
        clean = F.avg_pool2d(images, 2)
        noisy = gaussian_blur(clean, [5, 5], [1.0, 1.0]) if float(torch.rand(())) < 0.5 else clean
        if float(torch.rand(())) < 0.3:
            noisy = noisy + 0.02 * torch.randn_like(noisy)
        prediction = self.upsampler.resample(features, noisy.clamp(0, 1), stride // 2)
        with torch.no_grad():
            target = self.upsampler.resample(features, clean, stride // 2)
        return prediction, target


class LinearProbe(nn.Module):
    """``image (B, 3, H, W) in [0, 1] -> logits (B, num_classes, H, W)``: a 1x1 convolution on a
    :class:`FeatureUpsampler`'s pixel-resolution features. The backbone is frozen; the upsampler is
    frozen after the JAFAR objective (``upsampler_run``: a trained ``feature_upsampler`` run, whose
    backbone and block it takes) or trained with the head (``train_upsampler: true``, the way to
    compare decoder blocks such as CARAFE or DySample); a block without weights (``interpolate``,
    bilinear: the baseline) needs neither.

    Raises:
        ConfigError: a learned block with neither ``upsampler_run`` nor ``train_upsampler``, an
            ``upsampler_run`` whose backbone or block differs from the probe's.
    """

    def __init__(
        self,
        *,
        num_classes: int,
        backbone: str | FrozenBackbone = "vit_tiny_patch16_224",
        weights: str | None = None,
        layer: int | None = None,
        upsampler: str | None = None,
        upsampler_options: Mapping[str, Any] | None = None,
        upsampler_run: str | None = None,
        train_upsampler: bool = False,
    ) -> None:
        super().__init__()
        self.num_classes = check_positive_int(num_classes, "num_classes")
        state = None
        if upsampler_run is not None:
            trained, state = read_run("upsampler", Path(upsampler_run))
            _check_same_backbone(trained, backbone, weights, layer, upsampler_run)
            if upsampler not in (None, trained["upsampler"]) or upsampler_options not in (
                None,
                trained.get("upsampler_options"),
            ):
                raise ConfigError(
                    f"upsampler_run {upsampler_run!r} trained {trained['upsampler']!r} with "
                    f"{trained.get('upsampler_options')}; leave upsampler and upsampler_options unset to use it"
                )
            upsampler, upsampler_options = trained["upsampler"], trained.get("upsampler_options")
        self.features = FeatureUpsampler(
            backbone=backbone, weights=weights, layer=layer, upsampler=upsampler or "interpolate",
            upsampler_options=upsampler_options,
        )  # fmt: skip
        block = self.features.upsampler
        if state is not None:
            block.load_state_dict(state)
        learned = any(True for _ in block.parameters())
        if learned and state is None and not train_upsampler:
            raise ConfigError(
                f"{self.features.upsampler_name} has learned weights: give upsampler_run (a feature_upsampler run "
                f"trained with the JAFAR objective) or train_upsampler: true (trained with the head)"
            )
        block.requires_grad_(bool(train_upsampler))
        self.head = nn.Conv2d(self.features.channels, self.num_classes, 1)

    def size_multiple(self) -> tuple[int, int]:
        return self.features.size_multiple()

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(image))


def _check_same_backbone(trained: Mapping[str, Any], backbone: Any, weights: Any, layer: Any, run: str) -> None:
    """The probe must read the features the upsampler was trained on."""
    ours = {"backbone": backbone, "weights": weights, "layer": layer}
    for key, value in ours.items():
        if trained.get(key) != value:
            raise ConfigError(
                f"upsampler_run {run!r} was trained on {key}={trained.get(key)!r}, the probe has {key}={value!r}; "
                f"use the same backbone, weights and layer"
            )
