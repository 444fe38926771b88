"""The metric functions' results read by name and unpack as the tuples they were (one convention:
scalars as floats, per-class/per-frame/per-image values as float64 tensors, spectra as NumPy)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from upzoo import metrics
from upzoo.errors import ShapeError


def _labels(seed: int, shape=(2, 20, 20)) -> torch.Tensor:
    return torch.randint(0, 3, shape, generator=torch.Generator().manual_seed(seed))


def test_class_scores_read_by_name_and_unpack():
    pred, target = _labels(0), _labels(1)
    for function in (metrics.mean_iou, metrics.boundary_iou, metrics.boundary_fscore):
        result = function(pred, target, 3)
        assert isinstance(result, metrics.ClassScores) and result._fields == ("mean", "per_class")
        mean, per_class = result
        assert mean == result.mean and isinstance(mean, float)
        assert per_class is result.per_class and per_class.dtype == torch.float64 and per_class.shape == (3,)
        assert mean == pytest.approx(float(per_class[~per_class.isnan()].mean()))


def test_frame_surface_and_image_scores():
    davis = metrics.davis_fmeasure(_labels(0), _labels(1), 3)
    assert davis._fields == ("per_class", "per_frame") and davis.per_frame.shape == (2, 3)
    torch.testing.assert_close(davis.per_class, davis.per_frame.mean(0), rtol=1e-12, atol=1e-12)
    volumes = _labels(2, (1, 6, 8, 8)), _labels(3, (1, 6, 8, 8))
    surface = metrics.surface_metrics(*volumes, 3, spacing=(1.0, 1.0, 1.0), tolerance_mm=1.0)
    assert surface._fields == ("hd95", "surface_dice")
    torch.testing.assert_close(surface.hd95, metrics.hausdorff95(*volumes, 3, spacing=(1.0, 1.0, 1.0)), equal_nan=True)
    images = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    with pytest.raises(
        ShapeError, match=r"must be a non-empty batch of images \(B, C, H, W\), got shape \(0, 3, 16, 16\)"
    ):
        metrics.ssim(images[:0], images[:0])
    scores = metrics.psnr_ssim(images, images.flip(-1))
    assert scores._fields == ("psnr", "ssim")
    torch.testing.assert_close(scores.psnr, metrics.psnr(images, images.flip(-1)), rtol=1e-9, atol=1e-9)


def test_kernel_distance_and_spectral_error_by_name():
    g = torch.Generator().manual_seed(5)
    kid = metrics.kernel_distance(
        torch.rand(20, 4, generator=g), torch.rand(20, 4, generator=g), subsets=3, subset_size=5
    )
    assert kid._fields == ("mean", "std") and isinstance(kid.mean, float) and kid.std > 0
    images = torch.rand(4, 1, 16, 16, generator=g)
    error = metrics.image_spectral_error(images, images.flip(-1).flip(-2).roll(1, -1))
    per_ring, mean = error
    assert error._fields == ("per_ring", "mean") and isinstance(per_ring, np.ndarray) and mean == error.mean
    assert len(per_ring) == len(metrics.ring_frequencies(per_ring)) == 12
