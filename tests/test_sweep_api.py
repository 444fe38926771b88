"""A sweep of bad values over the Python API of the newer surfaces (generative, surface and boundary
metrics, sliding windows, stride planning, the smp decoders, the authors' weight converters, volume
I/O, comparison plans): every argument of every entry point gets each bad value of its kind, one at a
time, the others good. Each call must raise an :class:`~upzoo.errors.UpzooError` whose message is one
line naming the argument — never a number, never another exception, never a hang.

Each entry point is first called with its good arguments (it must succeed), so a case fails only
because of the one value it changes. ``tests/test_sweep.py`` keeps the hand-written cases (with the
exact message fragments) and the command-line sweep.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from upzoo.errors import UpzooError

NAN, INF = float("nan"), float("inf")


class Opaque:
    """An object of no kind an argument takes."""

    def __repr__(self) -> str:
        return "Opaque()"


# The bad values of each kind of argument.
WHOLE = ["3", 2.5, -1, None, True, NAN, INF, [2], 1e300, Opaque(), 2 + 0j]
WHOLE_POSITIVE = [0, *WHOLE]  # a count or size: 0 is bad too
NUMBER = ["2", None, True, NAN, INF, -INF, [1.0], Opaque(), 1 + 1j]  # any finite number
NON_NEGATIVE = [-1.0, -1e-9, *NUMBER]  # a finite number >= 0
POSITIVE = [0, *NON_NEGATIVE]  # a finite number > 0
FRACTION = [1.0, -0.1, 1.5, *NUMBER]  # a number in [0, 1)
SPACING = [(0, 1, 1), (-1, 1, 1), (NAN, 1, 1), (INF, 1, 1), (1e300, 1, 1), ("a", 1, 1), (True, 1, 1),
           1.0, (1, 1, 1, 1), None, "1,1,1", np.array([0.0, 1, 1]), torch.tensor([1.0, -2, 1]), Opaque()]  # fmt: skip
SIZES_ANY = [(0, 8), (-8, 8), (8.5, 8), "8,8", None, (True, 8), (NAN, 8), 8, [], Opaque()]  # any axis count
SIZES2 = [(8,), (8, 8, 8), *SIZES_ANY]  # two axes
IMAGES = [None, "abc", 3, np.zeros((4, 1, 16, 16)), torch.zeros(16, 16), torch.zeros(0, 1, 16, 16),
          torch.full((4, 1, 16, 16), NAN), torch.zeros(4, 1, 16, 16, dtype=torch.complex64),
          torch.zeros(4, 1, 16, 16, dtype=torch.long), torch.zeros(4, 1, 16, 16, 2)]  # fmt: skip
FEATURES = [None, "abc", torch.zeros(8), torch.zeros(8, 3, 2), torch.zeros(0, 3), torch.full((8, 3), NAN),
            torch.full((8, 3), INF), torch.full((8, 3), 1e30), torch.zeros(8, 4), np.zeros((8, 3), object)]  # fmt: skip
SPECTRA = [None, "abc", np.ones((2, 2)), np.ones(0), np.full(9, NAN), np.full(9, -1.0), np.array(["a"] * 9),
           np.ones(9, complex), np.ones(1)]  # fmt: skip
PAIRED_SPECTRA = [*SPECTRA, np.ones(7)]  # beside a spectrum of 9 rings
LABELS3D = [None, "abc", np.zeros((4, 4)), np.full((4, 4, 4), 2.5), np.full((4, 4, 4), 5), np.full((4, 4, 4), -1),
            np.zeros((4, 4, 5), int), np.full((4, 4, 4), NAN)]  # fmt: skip
LABELS2D = [None, "abc", torch.zeros(4, 4, 4, 4, dtype=torch.long), torch.full((8, 8), 0.5),
            torch.full((8, 8), 7), torch.full((8, 8), -3), torch.zeros(8, 9, dtype=torch.long)]  # fmt: skip
TEXT = [None, 3, "", "no-such-thing", ["a"], Opaque(), True]


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _entries() -> list[tuple[str, Callable[..., Any], dict[str, Any], dict[str, list]]]:
    """(name, function, good keyword arguments, {argument: bad values})."""
    from upzoo.metrics import boundary_fscore, boundary_iou, hausdorff95, surface_dice, surface_metrics
    from upzoo.metrics.boundary import BoundaryFScore, BoundaryIoU
    from upzoo.metrics.checkerboard import image_checkerboard
    from upzoo.metrics.feature_distance import FeatureDistances, frechet_distance, kernel_distance, module_features
    from upzoo.metrics.generative import RealImages
    from upzoo.metrics.sliced_wasserstein import SlicedWasserstein, swd
    from upzoo.metrics.spectrum import (
        corner_error,
        image_spectral_error,
        radial_power_spectrum,
        spectral_decay,
        spectral_error,
    )
    from upzoo.metrics.surface import SurfaceMetrics
    from upzoo.models import plan_strides
    from upzoo.windows import gaussian_importance, sliding_window_inference

    g = torch.Generator().manual_seed(0)
    images = torch.rand(4, 1, 16, 16, generator=g)
    feats = torch.rand(8, 3, generator=g)
    spectrum = 1.0 / (1.0 + np.arange(9.0)) ** 2
    flat = module_features(torch.nn.Flatten())
    vol = np.zeros((4, 4, 4), int)
    vol[1:3, 1:3, 1:3] = 1
    lab = torch.zeros(8, 8, dtype=torch.long)
    lab[2:6, 2:6] = 1
    image = torch.rand(1, 16, 16, generator=g)
    return [
        ("sliding_window_inference", sliding_window_inference,
         {"image": image, "predictor": _identity, "patch_size": (8, 8), "overlap": 0.5, "batch_size": 2},
         {"image": IMAGES[:5] + [torch.full((1, 16, 16), NAN)], "patch_size": SIZES2, "overlap": FRACTION,
          "batch_size": WHOLE_POSITIVE, "predictor": [None, "model", 3]}),
        ("gaussian_importance", gaussian_importance, {"patch": (8, 8), "sigma_scale": 0.125},
         {"patch": SIZES_ANY, "sigma_scale": POSITIVE}),
        ("radial_power_spectrum", radial_power_spectrum, {"images": images, "batch_size": 2},
         {"images": IMAGES, "batch_size": WHOLE_POSITIVE}),
        ("spectral_error", spectral_error, {"generated": spectrum, "real": spectrum},
         {"generated": PAIRED_SPECTRA, "real": PAIRED_SPECTRA}),
        ("corner_error", corner_error, {"generated": spectrum, "real": spectrum},
         {"generated": PAIRED_SPECTRA, "real": PAIRED_SPECTRA}),
        ("spectral_decay", spectral_decay, {"spectrum": spectrum}, {"spectrum": SPECTRA}),
        ("kernel_distance", kernel_distance,
         {"real": feats, "generated": feats.flip(0), "subsets": 2, "subset_size": 4, "seed": 0},
         {"real": FEATURES, "generated": FEATURES, "subsets": WHOLE_POSITIVE, "subset_size": WHOLE_POSITIVE,
          "seed": WHOLE}),
        ("frechet_distance", frechet_distance, {"real": feats, "generated": feats.flip(0)},
         {"real": FEATURES, "generated": FEATURES}),
        ("FeatureDistances", FeatureDistances, {"extractor": flat, "subsets": 2, "subset_size": 4, "seed": 0},
         {"extractor": [None, "inception", flat.extract], "subsets": WHOLE_POSITIVE,
          "subset_size": WHOLE_POSITIVE, "seed": WHOLE}),
        ("RealImages", RealImages, {"images": images, "subset_size": 4, "subsets": 2, "patches_per_image": 4},
         {"images": IMAGES, "subset_size": WHOLE_POSITIVE, "subsets": WHOLE_POSITIVE,
          "patches_per_image": WHOLE_POSITIVE, "seed": WHOLE, "extractor": ["inception", 3, _identity]}),
        ("SlicedWasserstein", SlicedWasserstein, {"patches_per_image": 4, "repeats": 1, "directions": 8},
         {"patches_per_image": WHOLE_POSITIVE, "repeats": WHOLE_POSITIVE, "directions": WHOLE_POSITIVE,
          "seed": WHOLE}),
        ("swd", swd, {"real": images, "generated": images.flip(0), "patches_per_image": 4, "directions": 8},
         {"real": IMAGES, "generated": [*IMAGES, images[:2], torch.rand(4, 1, 32, 32)],
          "patches_per_image": WHOLE_POSITIVE, "repeats": WHOLE_POSITIVE, "directions": WHOLE_POSITIVE}),
        ("image_spectral_error", image_spectral_error, {"generated": images, "real": images.flip(0)},
         {"generated": [*IMAGES, torch.rand(4, 1, 8, 8)], "real": [*IMAGES, torch.zeros(4, 1, 16, 16)]}),
        ("image_checkerboard", image_checkerboard, {"images": images, "period": 2},
         {"images": IMAGES, "period": WHOLE_POSITIVE}),
        ("hausdorff95", hausdorff95, {"pred": vol, "target": vol, "num_classes": 2, "spacing": (1, 1, 1)},
         {"pred": LABELS3D, "target": LABELS3D, "num_classes": WHOLE_POSITIVE, "spacing": SPACING}),
        ("surface_dice", surface_dice,
         {"pred": vol, "target": vol, "num_classes": 2, "spacing": (1, 1, 1), "tolerance_mm": 1.0},
         {"spacing": SPACING, "tolerance_mm": NON_NEGATIVE, "num_classes": WHOLE_POSITIVE}),
        ("surface_metrics", surface_metrics,
         {"pred": vol, "target": vol, "num_classes": 2, "spacing": (1, 1, 1), "tolerance_mm": 1.0},
         {"spacing": SPACING, "tolerance_mm": NON_NEGATIVE}),
        ("SurfaceMetrics", SurfaceMetrics, {"num_classes": 2, "tolerance_mm": 1.0},
         {"num_classes": WHOLE_POSITIVE, "tolerance_mm": NON_NEGATIVE}),
        ("boundary_iou", boundary_iou, {"pred": lab, "target": lab, "num_classes": 2},
         {"pred": LABELS2D, "target": LABELS2D, "num_classes": WHOLE_POSITIVE, "dilation_ratio": POSITIVE,
          "ignore_index": ["x", 2.5, True, NAN]}),
        ("boundary_fscore", boundary_fscore, {"pred": lab, "target": lab, "num_classes": 2},
         {"pred": LABELS2D, "num_classes": WHOLE_POSITIVE, "tolerance": NON_NEGATIVE}),
        ("BoundaryIoU", BoundaryIoU, {"num_classes": 2},
         {"num_classes": WHOLE_POSITIVE, "dilation_ratio": POSITIVE}),
        ("BoundaryFScore", BoundaryFScore, {"num_classes": 2},
         {"num_classes": WHOLE_POSITIVE, "tolerance": NON_NEGATIVE}),
        ("plan_strides", plan_strides, {"spacing": (3.0, 1.0, 1.0), "patch_size": (16, 32, 32)},
         {"spacing": SPACING, "patch_size": [(0, 8, 8), (8.5, 8, 8), (8, 8), None, "8", (True, 8, 8)],
          "max_stages": WHOLE_POSITIVE, "min_size": WHOLE_POSITIVE}),
        *_model_entries(),
    ]  # fmt: skip


def _model_entries() -> list[tuple[str, Callable[..., Any], dict[str, Any], dict[str, list]]]:
    """The smp decoders, the weight converters, volume writing and resampling by spacing."""
    import tempfile

    from upzoo import create_upsampler
    from upzoo.data.resampling import resampled_shape
    from upzoo.data.volumes import write_nifti
    from upzoo.models.smp_adapter import smp_unet
    from upzoo.models.smp_decoders import smp_fpn
    from upzoo.upsamplers.reference_weights import load_reference_state_dict, reference_state_dict

    carafe = create_upsampler("carafe", spatial_dims=2, in_channels=4, out_channels=4, scale=2)
    weights = reference_state_dict(carafe, source="carafe")
    key = next(iter(weights))
    broken = [{**weights, key: v} for v in (None, "w", weights[key].fill_(NAN).clone(), weights[key][:1])]
    smp = {"encoder_name": "resnet18", "encoder_depth": 3, "num_classes": 2, "in_channels": 3}
    nifti = str(Path(tempfile.mkdtemp()) / "v.nii.gz")
    return [
        ("smp_fpn", smp_fpn, {**smp, "upsampler": "interpolate"},
         {"num_classes": WHOLE_POSITIVE, "in_channels": WHOLE_POSITIVE, "encoder_depth": [6, *WHOLE_POSITIVE],
          "encoder_name": TEXT, "upsampler": [3, "", "no_such_block", ["interpolate"] * 9, Opaque()],
          "input_policy": TEXT}),
        ("smp_unet", smp_unet, {**smp, "decoder_channels": (16, 8, 4)},
         {"num_classes": WHOLE_POSITIVE, "in_channels": WHOLE_POSITIVE, "encoder_name": TEXT,
          "upsampler": [3, "", "no_such_block", Opaque()], "upsampler_options": ["x", 3, {"scale": 3}]}),
        ("reference_state_dict", reference_state_dict, {"block": carafe, "source": "carafe"},
         {"source": [*TEXT, "fade", "mmcv"], "block": [None, torch.nn.Linear(2, 2), "carafe"]}),
        ("load_reference_state_dict", load_reference_state_dict,
         {"block": carafe, "state_dict": reference_state_dict(carafe, source="carafe"), "source": "carafe"},
         {"source": [*TEXT, "sapa"], "state_dict": [None, "w", {}, 3, *broken]}),
        ("write_nifti", write_nifti, {"path": nifti, "array": np.zeros((4, 4, 4), np.float32), "spacing": (1, 1, 1)},
         {"spacing": SPACING, "array": [None, "abc", np.zeros((4, 4)), np.zeros((1, 4, 4, 4))]}),
        ("resampled_shape", resampled_shape, {"shape": (8, 8, 8), "spacing": (2, 1, 1), "target": (1, 1, 1)},
         {"shape": [(0, 8, 8), (8.5, 8, 8), (8, 8), None, "888"], "spacing": SPACING, "target": SPACING}),
    ]  # fmt: skip


ENTRIES = _entries()
CASES = [(name, arg, i) for name, _, _, bad in ENTRIES for arg, values in bad.items() for i in range(len(values))]
_BY_NAME = {name: (fn, good, bad) for name, fn, good, bad in ENTRIES}


@pytest.mark.parametrize("name", list(_BY_NAME))
def test_the_good_call_works(name):
    fn, good, _ = _BY_NAME[name]
    fn(**good)


@pytest.mark.parametrize("name, argument, index", CASES, ids=[f"{n}-{a}-{i}" for n, a, i in CASES])
def test_a_bad_value_gets_one_line_naming_the_argument(name, argument, index):
    fn, good, bad = _BY_NAME[name]
    value = bad[argument][index]
    try:
        result = fn(**{**good, argument: value})
    except UpzooError as error:
        message = str(error)
        assert "\n" not in message and argument in message, message
        return
    except Exception as error:  # noqa: BLE001 - what the sweep is for: anything but an UpzooError
        pytest.fail(f"{name}({argument}={value!r}) raised {type(error).__name__}: {error}")
    shown = result if not isinstance(result, float) or math.isfinite(result) else f"non-finite {result}"
    pytest.fail(f"{name}({argument}={value!r}) returned {type(result).__name__} {shown!r:.80} without a word")


def test_the_sweep_is_broad():
    """The issue asks for a sweep at least as broad as the one that found the faults (~400 cases)."""
    assert len(CASES) >= 400, len(CASES)
