"""``Predictor``: a trained segmentation model applied to new images and volumes — the recipe's
normalisation, any input size (the model's pad policy, or a Gaussian sliding window where the input
is larger than the training crop), optional flip TTA and multi-scale averaging."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from upzoo.checks import check_bool, check_finite, check_sizes, check_spacing
from upzoo.errors import ConfigError, ShapeError
from upzoo.inference.backends import Backend, model_runner
from upzoo.runs.trained_model import LoadedModel
from upzoo.runtime import autocast, resolve_device
from upzoo.windows import sliding_window_inference, window_patch

__all__ = ["Predictor", "Prediction", "Preprocess"]

Window = Literal["auto", "on", "off"]


@dataclass
class Prediction:
    """Train-id labels ``(*S)`` (uint8) and, if asked for, class probabilities ``(K, *S)`` float32."""

    labels: np.ndarray
    probabilities: np.ndarray | None = None


@dataclass(frozen=True)
class Preprocess:
    """The training-time input conversion of a model's data, picklable for DataLoader workers:
    ``(H, W[, C])`` uint8 images -> ``(C, H', W')`` (resize, normalise), or ``(D, H, W)`` /
    ``(C, D, H, W)`` volumes -> ``(C, D', H', W')`` (intensity normalisation, then resampling from
    the volume's spacing to ``spacing``, the training spacing, when both are known)."""

    volumes: bool
    in_channels: int
    resize: tuple[int, ...] | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    normalize: str = "zscore"
    ct_window: tuple[float, float] = (-1000.0, 1000.0)
    spacing: tuple[float, ...] | None = None

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, *, resample: bool = True) -> Preprocess:
        data = loaded.recipe.data
        return cls(
            volumes=loaded.volumes,
            in_channels=loaded.spec.options.get("in_channels", 3),
            resize=tuple(data.resize) if data.resize else None,
            mean=loaded.mean,
            std=loaded.std,
            normalize=data.normalize or "zscore",
            ct_window=tuple(data.ct_window),
            spacing=tuple(loaded.spacing) if resample and loaded.volumes and loaded.spacing else None,
        )

    def __call__(self, array: np.ndarray, spacing: Sequence[float] | None = None) -> torch.Tensor:
        """An image or a volume, prepared; ``spacing``: the volume's own (``(D, H, W)`` mm), if known."""
        return self.volume(array, spacing) if self.volumes else self.image(array)

    def image(self, image: np.ndarray) -> torch.Tensor:
        """``(H, W[, C])`` pixels -> ``(C, H', W')`` float32 as in training (resize, normalise).
        Pixels are uint8 (0..255), uint16 (0..65535) or float in [0, 1] (see :mod:`upzoo.data.io`).

        Raises:
            ShapeError: not ``(H, W)`` / ``(H, W, C)`` with the model's channel count.
            DataError: another dtype, NaN/inf, or floats outside [0, 1].
        """
        from upzoo.data.io import pixels_to_unit

        if not isinstance(image, np.ndarray):
            raise ShapeError(f"expected an image as a NumPy array (H, W[, C]), got {type(image).__name__}")
        if image.ndim == 2:
            image = image[..., None]
        if image.ndim != 3 or image.shape[2] != self.in_channels or 0 in image.shape:
            raise ShapeError(
                f"expected an image (H, W, {self.in_channels}) for a model with {self.in_channels} input channels, "
                f"got shape {image.shape}"
            )
        if image.dtype != np.uint8:  # uint8 stays uint8 until after the resize, exactly as in training
            image = pixels_to_unit(image, f"image of dtype {image.dtype}")
        if self.resize is not None:  # as the training pipeline resizes (OpenCV, bilinear)
            import cv2

            image = cv2.resize(image, (self.resize[1], self.resize[0]), interpolation=cv2.INTER_LINEAR)
            image = image[..., None] if image.ndim == 2 else image
        x = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).float()
        x = x / 255.0 if image.dtype == np.uint8 else x
        if self.mean is not None:
            x = (x - torch.tensor(self.mean).view(-1, 1, 1)) / torch.tensor(self.std).view(-1, 1, 1)
        return x

    def volume(self, volume: np.ndarray, spacing: Sequence[float] | None = None) -> torch.Tensor:
        """``(D, H, W)`` or ``(C, D, H, W)`` intensities at ``spacing`` -> ``(C, D', H', W')``
        normalised as in training and resampled to the training spacing (when both are known; the
        size it takes is :func:`~upzoo.data.resampling.resampled_shape`).

        Raises:
            ConfigError: not a numeric NumPy array, or NaN/inf values.
            ShapeError: not ``(D, H, W)`` or ``(C, D, H, W)`` with the model's channels.
        """
        from upzoo.data.resampling import resample_image, resampled_shape
        from upzoo.data.volumes import normalize_intensity, refuse_non_finite

        if not isinstance(volume, np.ndarray) or not np.issubdtype(volume.dtype, np.number):
            raise ConfigError(f"expected a volume as a numeric NumPy array (D, H, W), got {type(volume).__name__}")
        refuse_non_finite(volume, "volume")
        if volume.ndim == 3:
            volume = volume[None]
        if volume.ndim != 4 or volume.shape[0] != self.in_channels:
            raise ShapeError(
                f"expected a volume (D, H, W) or ({self.in_channels}, D, H, W) for a model with "
                f"{self.in_channels} input channels, got shape {volume.shape}"
            )
        channels = np.stack(
            [normalize_intensity(c.astype(np.float32), self.normalize, self.ct_window) for c in volume]
        ).astype(np.float32)
        if spacing is not None and self.spacing is not None:
            channels = resample_image(channels, resampled_shape(channels.shape[1:], spacing, self.spacing))
        return torch.from_numpy(channels)


def _check_arguments(loaded, tta, scales, window, overlap, window_batch) -> None:
    """The Predictor's arguments, checked once with the value named."""
    if not isinstance(loaded, LoadedModel):
        raise ConfigError(f"Predictor takes a LoadedModel (from upzoo.load_model), got {type(loaded).__name__}")
    if loaded.task != "segmentation":
        how = {
            "super_resolution": "; upscale its images with upzoo.inference.upscale(loaded.model, image, scale) "
            "or upzoo.inference.upscale_files (upzoo predict does)",
            "gan": "; sample its generator with upzoo sample",
            "through_plane_sr": "; upsample its volumes' slices with "
            "upzoo.inference.slice_upscaling.upscale_volume_files (upzoo predict does)",
            "through_plane_segmentation": "; label its thick-slice volumes on the thin grid with "
            "upzoo.inference.slice_upscaling.upscale_volume_files (upzoo predict does)",
        }.get(loaded.task, "")
        raise ConfigError(
            f"{loaded.checkpoint} is a {loaded.task} run; Predictor segments with a segmentation run{how}"
        )
    if tta not in (None, "none", "flip"):
        raise ConfigError(f"tta must be 'flip' or None, got {tta!r}")
    if isinstance(scales, (str, bytes)) or not isinstance(scales, Sequence) or not scales:
        raise ConfigError(f"scales must be a non-empty sequence of numbers such as (0.75, 1.0, 1.25), got {scales!r}")
    for s in scales:
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not (0.125 <= float(s) <= 8):
            raise ConfigError(f"scales must be numbers in [0.125, 8], got {s!r} in {list(scales)!r}")
    if window not in ("auto", "on", "off"):
        raise ConfigError(f"window must be 'auto', 'on' or 'off', got {window!r}")
    if loaded.volumes and tuple(float(s) for s in scales) != (1.0,):
        raise ConfigError("multi-scale prediction is for 2D images; volumes run at their own spacing")
    if overlap is not None and (
        isinstance(overlap, bool) or not isinstance(overlap, (int, float)) or not 0 <= overlap < 1
    ):
        raise ConfigError(f"overlap must be a number in [0, 1), got {overlap!r}")
    if window_batch is not None and (
        isinstance(window_batch, bool) or not isinstance(window_batch, int) or window_batch < 1
    ):
        raise ConfigError(f"window_batch must be a whole number >= 1 (or None: the recipe's), got {window_batch!r}")


class Predictor:
    """Predict with a :class:`~upzoo.inference.LoadedModel` (see :func:`~upzoo.inference.load_model`).

    Args:
        tta: ``"flip"`` averages the probabilities of the input and its mirror (last axis).
        scales: 2D only: run at each scale of the input and average the probabilities at full size.
        window: ``auto`` slides the training crop over inputs larger than it (volumes: the recipe's
            evaluation window), ``on`` always, ``off`` runs every input whole.
        amp: bf16 autocast (PyTorch backends).
        backend: ``eager`` (the module), ``compile`` (``torch.compile``, dynamic sizes),
            ``onnxruntime`` (the run's verified ONNX export: ``onnx_path``, else exported now) or
            ``openvino`` (the verified OpenVINO IR, exported now, at ``precision``: ``f32``, or
            ``bf16`` on a CPU with bf16 hardware).
        resample: volumes: resample each volume from its own spacing to the training spacing and
            the prediction back to the volume's grid (the argmax of the resampled logits, or of the
            resampled probabilities with TTA). ``False`` runs volumes at their own grid.

    >>> predictor = Predictor(load_model("runs/quickstart"), tta="flip")  # doctest: +SKIP
    >>> predictor.predict(image).labels.shape  # doctest: +SKIP
    (256, 512)

    Raises:
        ConfigError: ``resample`` that is not a bool, ``amp`` with the onnxruntime backend, or another bad option.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        device: str | torch.device = "cpu",
        amp: bool = False,
        tta: str | None = None,
        scales: Sequence[float] = (1.0,),
        window: Window = "auto",
        overlap: float | None = None,
        window_batch: int | None = None,
        probabilities: bool = False,
        backend: Backend = "eager",
        onnx_path: str | None = None,
        resample: bool = True,
        precision: str = "f32",
    ) -> None:
        _check_arguments(loaded, tta, scales, window, overlap, window_batch)
        check_bool(resample, "resample")
        self.loaded, self.device = loaded, resolve_device(device, "device")
        self.model = loaded.model.to(self.device).eval()
        if backend in ("onnxruntime", "openvino") and amp:
            raise ConfigError(f"amp (bf16 autocast) is for the PyTorch backends; {backend} runs the exported model "
                              "(openvino: precision='bf16')")  # fmt: skip
        self.backend = backend
        self._run = model_runner(loaded, self.model, backend, self.device, onnx_path, precision)
        self.amp, self.flip, self.scales = "bf16" if amp else "none", tta == "flip", tuple(float(s) for s in scales)
        self.window, self.keep_probabilities = window, probabilities
        recipe = loaded.recipe
        self.overlap = recipe.eval.overlap if overlap is None else overlap
        self.window_batch = window_batch or recipe.eval.batch_size
        self.patch = window_patch(recipe, volumes=loaded.volumes)
        self.preprocess = Preprocess.from_loaded(loaded, resample=resample)

    @property
    def prepare(self) -> Preprocess:
        """Deprecated name of :attr:`preprocess` (kept for one release)."""
        import warnings

        warnings.warn("Predictor.prepare is now Predictor.preprocess", DeprecationWarning, stacklevel=2)
        return self.preprocess

    # -- prediction ----------------------------------------------------------------------------------
    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, C, *S) -> (N, K, *S)``: whole, or windows of the training crop."""
        spatial = tuple(x.shape[2:])
        slide = self.patch is not None and (
            self.window == "on" or (self.window == "auto" and any(s > p for s, p in zip(spatial, self.patch)))
        )
        with torch.no_grad(), autocast(self.amp, self.device):
            if not slide:
                return self._run(x).float()
            return torch.stack(
                [
                    sliding_window_inference(
                        item,
                        lambda b: self._run(b).float(),
                        self.patch,
                        overlap=self.overlap,
                        batch_size=self.window_batch,
                    )
                    for item in x
                ]
            )

    def probabilities(self, x: torch.Tensor, size: Sequence[int] | None = None) -> torch.Tensor:
        """``(N, C, *S)`` prepared inputs -> ``(N, K, *size)`` class probabilities, averaged over
        the scales and (with TTA) the mirror; ``size`` defaults to ``S``."""
        return self._scores(x, size, probabilities=True)

    def _scores(self, x: torch.Tensor, size: Sequence[int] | None, *, probabilities: bool) -> torch.Tensor:
        """Probabilities, or for a single pass without them the logits (same argmax, no softmax)."""
        x = x.to(self.device)
        size = tuple(size or x.shape[2:])
        single = len(self.scales) == 1 and not self.flip
        total = None
        for scale in self.scales:
            xs = x if scale == 1.0 else F.interpolate(x, scale_factor=scale, mode="bilinear", align_corners=False)
            views = [xs, xs.flip(-1)] if self.flip else [xs]
            for i, view in enumerate(views):
                p = self._logits(view)
                p = p.softmax(1) if probabilities or not single else p
                p = p.flip(-1) if i == 1 else p
                if tuple(p.shape[2:]) != size:
                    mode = "trilinear" if p.ndim == 5 else "bilinear"
                    p = F.interpolate(p, size=size, mode=mode, align_corners=False)
                total = p if total is None else total + p
        return total if single else total / (len(self.scales) * (2 if self.flip else 1))

    def predict(self, item: str | np.ndarray, spacing: Sequence[float] | None = None) -> Prediction:
        """One image (``(H, W[, C])`` uint8 array, or a file) or volume (``(D, H, W)`` /
        ``(C, D, H, W)`` array, or a NIfTI/``.npy`` file): labels at the input's own size.
        ``spacing``: a volume array's voxel spacing (mm, ``(D, H, W)``), to resample it to the
        training spacing; a NIfTI file brings its own, an array without it is taken as it is.

        Raises:
            ConfigError: ``spacing`` for a 2D model, or non-finite inputs.
            ShapeError: inputs that are not images or volumes the model takes, or a bad output ``size``.
        """
        from upzoo.inference.files import read_input

        if not isinstance(item, np.ndarray):
            read = read_input(item, volumes=self.loaded.volumes, channels=self.preprocess.in_channels)
            item, spacing = read.array, read.spacing if spacing is None else spacing
        if spacing is not None and not self.loaded.volumes:
            raise ConfigError("spacing is for volumes; a 2D model predicts images at their own size")
        if self.loaded.volumes:
            x = self.preprocess(item, None if spacing is None else check_spacing(spacing, "spacing"))
        else:
            x = self.preprocess(item)
        size = item.shape[-3:] if self.loaded.volumes else item.shape[:2]
        return self.predict_batch(x[None], size)[0]

    def predict_batch(self, x: torch.Tensor, size: Sequence[int]) -> list[Prediction]:
        """Prepared inputs ``(N, C, *S)`` of one size -> one :class:`Prediction` each at ``size``.

        Raises:
            ShapeError: ``x`` or ``size`` of the wrong rank for this model.
        """
        dims = 3 if self.loaded.volumes else 2
        if not isinstance(x, torch.Tensor) or x.ndim != dims + 2 or x.shape[1] != self.preprocess.in_channels:
            shown = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ShapeError(f"expected prepared inputs (N, {self.preprocess.in_channels}, {dims} sizes), got {shown}")
        size = check_sizes(size, "size (the output size)", count=dims, error=ShapeError)
        check_finite(x, "inputs")
        p = self._scores(x, size, probabilities=self.keep_probabilities).cpu()
        labels = p.max(1).indices.to(torch.uint8 if p.shape[1] <= 256 else torch.int32).numpy()  # max: 5x argmax
        probs = p.numpy() if self.keep_probabilities else None
        return [Prediction(labels[i], probs[i] if probs is not None else None) for i in range(len(labels))]
