"""``build_model(spec)``: the one way recipes, ``upzoo shapes`` and ``upzoo bench`` build a model."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from upzoo.checks import check_bool
from upzoo.errors import ConfigError, RegistryError
from upzoo.models.compact_sr import SPAN, SRVGGNetCompact, UpConv7
from upzoo.models.dcgan import DCGANDiscriminator, DCGANGenerator
from upzoo.models.feature_models import FeatureUpsampler, LinearProbe
from upzoo.models.pggan import PGGANGenerator
from upzoo.models.planning import plan_strides
from upzoo.models.smp_adapter import smp_unet
from upzoo.models.smp_decoders import smp_deeplabv3plus, smp_fpn, smp_segformer, smp_upernet
from upzoo.models.super_resolution import EDSR, ESPCN, RRDBNet
from upzoo.models.through_plane import ThroughPlaneSR
from upzoo.models.through_plane_unet import ThroughPlaneUNet
from upzoo.models.unet import UNet
from upzoo.registry import Registry, origin_of
from upzoo.validation import validate_kwargs

__all__ = [
    "ModelSpec", "build_model", "build_discriminator", "register_architecture", "architecture_info",
    "list_architectures", "architecture_entry", "ArchitectureInfo", "ARCHITECTURES", "TASKS",
]  # fmt: skip

#: what trains a model (``Recipe.task``): its loss, evaluation and checkpoint kind
TASKS = ("segmentation", "gan", "super_resolution", "feature_upsampling", "generator_testbed", "through_plane_sr",
         "through_plane_segmentation")  # fmt: skip


@dataclass(frozen=True)
class ArchitectureInfo:
    """What upzoo knows about an architecture: its builder (``factory``: the constructor whose
    keyword arguments are the recipe's ``model`` keys), the task that trains it, what its input is
    (latent vectors ``(B, latent_dim)`` for generators, or pixels in [0, 1] that a frozen backbone
    normalises itself) and where it was registered."""

    name: str
    factory: Callable[..., nn.Module]
    task: str = "segmentation"
    latent_input: bool = False
    frozen_backbone: bool = False
    origin: str = ""

    @property
    def builder(self) -> Callable[..., nn.Module]:
        """The constructor (``factory``, as the registry calls every entry's)."""
        return self.factory


def architecture_entry(
    name: str, factory: Callable[..., nn.Module], origin: str, *, task: str | None = None,
    latent_input: bool | None = None, frozen_backbone: bool | None = None,
) -> ArchitectureInfo:  # fmt: skip
    """An architecture's registry entry; unset fields from the factory's attributes of the same
    names (how a plugin says them), else ``segmentation``, ``False``, ``False``.

    Raises:
        RegistryError: a task that is not one of :data:`TASKS`, or a flag that is not a bool.
    """
    task = task if task is not None else getattr(factory, "task", "segmentation")
    if task not in TASKS:
        raise RegistryError(f"architecture {name!r}: task must be one of {', '.join(TASKS)}, got {task!r}")
    flags = {"latent_input": latent_input, "frozen_backbone": frozen_backbone}
    flags = {k: getattr(factory, k, False) if v is None else v for k, v in flags.items()}
    for key, value in flags.items():
        check_bool(value, f"architecture {name!r}: {key}", error=RegistryError)
    return ArchitectureInfo(name, factory, task, origin=origin, **flags)


#: every architecture by name (the built-ins below; others through :func:`register_architecture`
#: or the ``upzoo.architectures`` entry-point group): the same registry class as the blocks'
ARCHITECTURES = Registry("upzoo.architectures", "architecture", make_info=architecture_entry)


def register_architecture(
    name: str,
    builder: Callable[..., nn.Module],
    *,
    task: str = "segmentation",
    latent_input: bool = False,
    frozen_backbone: bool = False,
    override: bool = False,
) -> ArchitectureInfo:
    """Make ``builder`` a recipe's ``model.architecture: NAME`` (as blocks register with the
    upsampler registry): its keyword arguments become the ``model`` keys, checked against its
    signature; ``task`` says what trains it (one of :data:`TASKS`; a segmentation model returns
    ``(B, num_classes, *S)`` logits for ``(B, in_channels, *S)`` images).

    >>> from torch import nn
    >>> info = register_architecture("tiny_seg", lambda num_classes=2: nn.Conv2d(3, num_classes, 1))
    >>> build_model({"architecture": "tiny_seg", "num_classes": 4}).out_channels
    4
    >>> ARCHITECTURES.unregister("tiny_seg")

    Raises:
        RegistryError: a name that is taken (unless ``override``), not lowercase snake case or a
            Python keyword, a builder that is not callable, a task that is not one of :data:`TASKS`,
            or flags that are not bools.
    """
    info = ARCHITECTURES.make(name, builder, origin_of(builder), task=task, latent_input=latent_input,
                              frozen_backbone=frozen_backbone)  # fmt: skip
    ARCHITECTURES.add(info, override=override)
    return info


def list_architectures(pattern: str = "*", *, task: str | None = None) -> list[str]:
    """Registered architectures matching ``pattern`` (shell wildcards), optionally of one task, sorted.

    >>> list_architectures("*gan*")
    ['dcgan', 'pggan']
    """
    return ARCHITECTURES.names(pattern, task=task)


def architecture_info(name: str, path: str = "model") -> ArchitectureInfo:
    """The registered architecture ``name`` (``path``: where it was given, for the message).

    Raises:
        RegistryError: an unknown name, with the registered ones and the closest.
    """
    try:
        return ARCHITECTURES.info(name)
    except RegistryError as exc:
        raise RegistryError(f"{path}.architecture: {exc}") from None


for _name, _builder in {"unet": UNet, "smp_unet": smp_unet, "smp_fpn": smp_fpn, "smp_upernet": smp_upernet,
                        "smp_segformer": smp_segformer, "smp_deeplabv3plus": smp_deeplabv3plus,
                        "linear_probe": LinearProbe}.items():  # fmt: skip
    register_architecture(_name, _builder, frozen_backbone=_name == "linear_probe")
for _name, _builder in {"espcn": ESPCN, "edsr": EDSR, "rrdbnet": RRDBNet, "srvgg_compact": SRVGGNetCompact,
                        "upconv7": UpConv7, "span": SPAN}.items():  # fmt: skip
    register_architecture(_name, _builder, task="super_resolution")
register_architecture("dcgan", DCGANGenerator, task="gan", latent_input=True)
register_architecture("feature_upsampler", FeatureUpsampler, task="feature_upsampling", frozen_backbone=True)
register_architecture("pggan", PGGANGenerator, task="generator_testbed", latent_input=True)
register_architecture("through_plane_sr", ThroughPlaneSR, task="through_plane_sr")
register_architecture("through_plane_unet", ThroughPlaneUNet, task="through_plane_segmentation")


@dataclass(frozen=True)
class ModelSpec:
    """A validated model description: the architecture and its constructor's keyword arguments.

    In a recipe: ``model: {architecture: unet, spatial_dims: 2, in_channels: 3, num_classes: 19, ...}``.
    """

    architecture: str
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: str = "model") -> ModelSpec:
        """Validate ``{"architecture": ..., **options}`` against the architecture's constructor; a
        missing ``architecture`` is ``unet``, as the recipe schema states.

        Raises:
            RegistryError: an unknown architecture (with did-you-mean).
            ConfigError: an unknown option (with did-you-mean), wrong types, missing keys.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: expected a mapping with an 'architecture' key, got {data!r}")
        options = dict(data)
        architecture = options.pop("architecture", "unet")  # the default the recipe schema states
        builder = architecture_info(architecture, path).builder
        auto = architecture in ("unet", "through_plane_unet") and options.get("strides") == "auto"
        if auto:  # planned from the data's voxel spacing when the recipe runs (resolve_auto_strides)
            options.pop("strides")
        validated = validate_kwargs(builder, options, path)
        if auto:
            validated["strides"] = "auto"
        return cls(architecture, validated)

    def resolve_auto_strides(self, spacing: Sequence[float], patch_size: Sequence[int]) -> ModelSpec:
        """Replace ``strides: auto`` by :func:`~upzoo.models.plan_strides` for this spacing and patch;
        the encoder keeps as many stages as were planned.

        Raises:
            ConfigError: a patch of which no axis can be halved.
        """
        if self.options.get("strides") != "auto":
            return self
        channels = list(self.options.get("channels") or (32, 64, 128, 256))
        strides = plan_strides(spacing, patch_size, max_stages=len(channels) - 1)
        if not strides:
            raise ConfigError(f"model.strides 'auto': no axis of patch {tuple(patch_size)} can be halved")
        return ModelSpec(
            self.architecture, {**self.options, "strides": strides, "channels": channels[: len(strides) + 1]}
        )

    def to_dict(self) -> dict[str, Any]:
        return {"architecture": self.architecture, **self.options}


def build_model(spec: ModelSpec | Mapping[str, Any]) -> nn.Module:
    """Build the model a spec describes (validating a plain mapping first).

    >>> net = build_model({"architecture": "unet", "spatial_dims": 2, "in_channels": 3, "num_classes": 4})
    >>> type(net).__name__
    'UNet'

    Raises:
        ConfigError: an unknown architecture or options its builder does not take (named, with the fix).
        RegistryError: an unknown block name.
    """
    if not isinstance(spec, ModelSpec):
        spec = ModelSpec.from_dict(spec)
    if spec.options.get("strides") == "auto":
        raise ConfigError(
            "model.strides 'auto' is planned from the data's voxel spacing: resolve it with "
            "ModelSpec.resolve_auto_strides(spacing, patch_size) (upzoo train does) or give strides"
        )
    return ARCHITECTURES.info(spec.architecture).factory(**spec.options)


def build_discriminator(
    spec: ModelSpec | Mapping[str, Any], *, base_channels: int = 64, norm: str = "batch"
) -> DCGANDiscriminator:
    """The discriminator matching a ``dcgan`` spec (same channels and resolution).

    Raises:
        ConfigError: an architecture without a discriminator (only ``dcgan`` has one).
    """
    if not isinstance(spec, ModelSpec):
        spec = ModelSpec.from_dict(spec)
    if spec.architecture != "dcgan":
        raise ConfigError(f"a discriminator goes with architecture 'dcgan', not {spec.architecture!r}")
    options = spec.options
    return DCGANDiscriminator(
        in_channels=options["out_channels"], resolution=options["resolution"], base_channels=base_channels, norm=norm
    )
