"""Generative metrics against independent definitions: the radial spectrum against a loop written
here from the definition and known spectra, SWD against a NumPy port of the reference code, KID and
FD against torchmetrics with the same feature extractor; and their bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.ndimage
import torch
import torch.nn.functional as F
from torch import nn

from upzoo.errors import ConfigError, DataError, ShapeError
from upzoo.metrics.feature_distance import (
    FeatureDistances,
    encoder_features,
    frechet_distance,
    inception_features,
    kernel_distance,
    module_features,
)
from upzoo.metrics.sliced_wasserstein import SlicedWasserstein, laplacian_pyramid, sliced_wasserstein
from upzoo.metrics.spectrum import (
    RadialSpectrum,
    corner_error,
    radial_power_spectrum,
    spectral_decay,
    spectral_error,
)


# -- spectrum -----------------------------------------------------------------------------------------
def authors_spectrum(images: torch.Tensor) -> np.ndarray:
    """Schwarz et al.'s ``get_spectrum`` per channel, averaged over channels and images, ported from
    autonomousvision/frequency_bias ``utils/spectrum.py`` (``batch_fft``, the duplicated Nyquist row
    and column, ``roll_quadrants``, ``azimuthal_average`` with the radius floored), written plainly:
    every grid entry added to the ring of its floored distance from the grid's centre."""
    n, c, size, _ = images.shape
    power = torch.fft.fftn(images.flatten(0, 1), dim=(1, 2)).abs().square()
    if size % 2 == 0:  # the authors duplicate the Nyquist row and column (index N/2)
        half = size // 2
        power = torch.cat([power[:, : half + 1], power[:, half : half + 1], power[:, half + 1 :]], dim=1)
        power = torch.cat([power[:, :, : half + 1], power[:, :, half : half + 1], power[:, :, half + 1 :]], dim=2)
    grid = power.shape[-1]
    power = power.roll((grid // 2, grid // 2), dims=(1, 2))  # roll_quadrants: the mean to the centre
    centre = (grid - 1) / 2
    rows, cols = np.meshgrid(np.arange(grid), np.arange(grid), indexing="ij")
    rings = np.floor(np.hypot(rows - centre, cols - centre)).astype(int)
    profile = np.zeros((n * c, rings.max() + 1))
    for ring in range(rings.max() + 1):
        profile[:, ring] = power.numpy()[:, rings == ring].mean(1)
    return profile.reshape(n, c, -1).mean((0, 1))


@pytest.mark.parametrize("size", [16, 15, 8])
def test_radial_spectrum_is_the_authors_definition(size):
    images = torch.rand(3, 3, size, size, dtype=torch.float64)
    ours = radial_power_spectrum(images)
    reference = authors_spectrum(images) / size**2  # upzoo divides the power by H W (white noise: its variance)
    assert len(ours) == math.floor(math.sqrt(2) * (size // 2 if size % 2 == 0 else (size - 1) / 2)) + 1
    np.testing.assert_allclose(ours, reference, rtol=1e-10)
    grey = radial_power_spectrum(images.mean(1, keepdim=True))  # not the spectrum of the channels' mean
    assert not np.allclose(grey, ours, rtol=1e-3)


@pytest.mark.parametrize("size", [(32, 64), (16, 128), (12, 20)])
def test_the_spectrum_of_images_that_are_not_square_is_refused(size):
    # rings of one radius cannot reach both axes' Nyquist frequency: a 32x64 image's "upper half"
    # would be measured on the wrong band (issue: no silent number)
    with pytest.raises(ShapeError, match=rf"square images .* got {size[0]}x{size[1]}: crop or resize"):
        radial_power_spectrum(torch.rand(2, 3, *size))


def test_known_spectra():
    n = 64
    noise = 0.5 + 0.05 * torch.randn(400, 1, n, n, dtype=torch.float64)
    flat = radial_power_spectrum(noise)[1:]  # white noise: sigma^2 at every frequency
    assert np.allclose(flat, 0.05**2, rtol=0.08)
    board = torch.tensor([[(i + j) % 2 for j in range(n)] for i in range(n)], dtype=torch.float64)[None, None]
    spectrum = radial_power_spectrum(board)
    corner = math.floor(np.sqrt(2) * n / 2)
    assert set(np.flatnonzero(spectrum)) == {0, corner}  # the mean, and the corner frequency only
    yy = torch.arange(n, dtype=torch.float64)
    smooth = (0.5 + 0.25 * torch.cos(2 * np.pi * 3 * yy / n))[None, None, :, None].expand(1, 1, n, n)
    assert set(np.flatnonzero(radial_power_spectrum(smooth) > 1e-12)) == {0, 3}


def test_spectral_error_and_decay():
    real = radial_power_spectrum(torch.rand(64, 3, 32, 32))
    error, upper = spectral_error(real, real)
    assert upper == 0 and np.all(error == 0)
    boosted = real.copy()
    boosted[9:] *= 1.5  # the upper half of a 32x32 spectrum: rings above 8
    assert spectral_error(boosted, real)[1] == pytest.approx(0.5)
    corners = real.copy()
    corners[17:] *= 3.0  # beyond Nyquist (16): the diagonal frequencies only, measured apart
    assert spectral_error(corners, real)[1] == 0 and corner_error(corners, real) == pytest.approx(2.0)
    band = real.copy()
    band[9:17] *= 0.5  # N/4 < r <= N/2: the band both axes measure
    assert spectral_error(band, real)[1] == pytest.approx(0.5) and corner_error(band, real) == 0
    lower = real.copy()
    lower[1:9] *= 2.0  # r <= N/4: outside the summary
    assert spectral_error(lower, real)[1] == 0 and corner_error(lower, real) == 0
    radii = np.arange(1, 24, dtype=float)
    power_law = np.concatenate([[1.0], 3.0 * radii**-2.5])
    assert spectral_decay(power_law).decay == pytest.approx(2.5)
    with pytest.raises(ShapeError, match="spectra of 23 and 46 rings: the generated and real images differ in size"):
        spectral_error(real, radial_power_spectrum(torch.rand(2, 3, 64, 64)))


def test_spectrum_streams_and_refuses_mixed_sizes():
    """Streaming is algebra: checked in float64, where batches of 3 and all 10 at once agree to
    rounding (a float32 FFT's result depends on the batch the CPU's kernel sees, ~1e-8)."""
    images = torch.rand(10, 3, 32, 32, dtype=torch.float64)
    streamed = RadialSpectrum()
    for batch in images.split(3):
        streamed.update(batch)
    np.testing.assert_allclose(streamed.compute(), radial_power_spectrum(images), rtol=1e-12)
    single = RadialSpectrum()  # float32 images: the same within float32's rounding of the DFT
    for batch in images.float().split(3):
        single.update(batch)
    np.testing.assert_allclose(single.compute(), radial_power_spectrum(images), rtol=1e-5)
    with pytest.raises(ShapeError, match=r"one size: \(32, 32\) so far, then \(16, 16\)"):
        streamed.update(torch.rand(1, 3, 16, 16))


# -- SWD: a NumPy port of progressive_growing_of_gans/metrics/sliced_wasserstein.py (Karras et al.) ----
GAUSSIAN = np.float32([[1, 4, 6, 4, 1], [4, 16, 24, 16, 4], [6, 24, 36, 24, 6], [4, 16, 24, 16, 4],
                       [1, 4, 6, 4, 1]]) / 256.0  # fmt: skip


def ref_pyr_down(minibatch):
    return scipy.ndimage.convolve(minibatch, GAUSSIAN[None, None], mode="mirror")[:, :, ::2, ::2]


def ref_pyr_up(minibatch):
    s = minibatch.shape
    res = np.zeros((s[0], s[1], s[2] * 2, s[3] * 2), minibatch.dtype)
    res[:, :, ::2, ::2] = minibatch
    return scipy.ndimage.convolve(res, GAUSSIAN[None, None] * 4.0, mode="mirror")


def ref_laplacian_pyramid(minibatch, num_levels):
    pyramid = [np.float32(minibatch)]
    for _ in range(1, num_levels):
        pyramid.append(ref_pyr_down(pyramid[-1]))
        pyramid[-2] -= ref_pyr_up(pyramid[-1])
    return pyramid


def ref_finalize_descriptors(desc):
    desc = np.concatenate(desc, axis=0)
    desc -= np.mean(desc, axis=(0, 2, 3), keepdims=True)
    desc /= np.std(desc, axis=(0, 2, 3), keepdims=True)
    return desc.reshape(desc.shape[0], -1)


def ref_sliced_wasserstein(a, b, dirs):
    proj_a, proj_b = np.sort(np.matmul(a, dirs), axis=0), np.sort(np.matmul(b, dirs), axis=0)
    return np.mean(np.abs(proj_a - proj_b))


def test_laplacian_pyramid_equals_the_reference_and_opencv():
    import cv2

    images = np.random.default_rng(0).uniform(0, 255, (2, 3, 64, 64)).astype(np.float32)
    ours = laplacian_pyramid(torch.from_numpy(images), 3)
    reference = ref_laplacian_pyramid(images.copy(), 3)  # the reference subtracts in place
    for a, b in zip(ours, reference):
        np.testing.assert_allclose(a.numpy(), b, atol=2e-3)
    np.testing.assert_allclose(ours[2][0, 0].numpy(), cv2.pyrDown(cv2.pyrDown(images[0, 0])), atol=2e-3)


def test_sliced_wasserstein_equals_the_reference_for_the_same_descriptors_and_directions():
    from upzoo.metrics.sliced_wasserstein import _normalised

    rng = np.random.default_rng(1)
    a, b = (rng.normal(size=(500, 3, 7, 7)).astype(np.float32) * s for s in (1.0, 1.3))
    dirs = rng.normal(size=(147, 16)).astype(np.float32)
    dirs /= np.sqrt(np.sum(dirs**2, axis=0, keepdims=True))
    expected = ref_sliced_wasserstein(ref_finalize_descriptors([a]), ref_finalize_descriptors([b]), dirs)
    a, b = (_normalised(torch.from_numpy(x)) for x in (a, b))
    ours = sliced_wasserstein(a, b, torch.from_numpy(dirs))
    assert ours == pytest.approx(expected, rel=1e-5)


def test_swd_is_zero_for_one_set_and_grows_with_the_difference():
    images = torch.rand(64, 3, 32, 32)

    def swd(other: torch.Tensor) -> float:
        metric = SlicedWasserstein(patches_per_image=32)
        for batch in images.split(16):
            metric.update(batch, real=True)
        metric.update(other, real=False)
        return metric.compute()

    same = swd(images)
    assert same == {"level_32": 0.0, "level_16": 0.0, "mean": 0.0}
    blurred = F.avg_pool2d(F.pad(images, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
    noisy = (images + 0.3 * torch.randn_like(images)).clamp(0, 1)
    assert 0 < swd(noisy)["mean"] and swd(blurred)["level_32"] > swd(noisy)["level_32"] / 10
    assert swd(torch.rand(64, 3, 32, 32))["mean"] < swd(blurred)["mean"]  # another draw of the same noise: close


def test_swd_bad_input_is_named():
    metric = SlicedWasserstein()
    with pytest.raises(ShapeError, match="SWD needs images of at least 16x16"):
        metric.update(torch.rand(2, 3, 8, 8), real=True)
    metric.update(torch.rand(2, 3, 32, 32), real=True)
    with pytest.raises(ShapeError, match=r"one shape \(C, H, W\): \(3, 32, 32\) so far, then \(1, 32, 32\)"):
        metric.update(torch.rand(2, 1, 32, 32), real=False)
    with pytest.raises(ShapeError, match="equally many real and generated images; got 2 real and 0 generated"):
        metric.compute()
    with pytest.raises(ConfigError, match=r"generated images: float images must hold values in \[0, 1\], got -1"):
        metric.update(torch.full((2, 3, 32, 32), -1.0), real=False)
    with pytest.raises(ConfigError, match="generated images: 1 values are NaN or infinite"):
        nan = torch.rand(2, 3, 32, 32)
        nan[0, 0, 0, 0] = float("nan")
        metric.update(nan, real=False)
    with pytest.raises(ConfigError, match="patches_per_image must be a whole number >= 1, got 0"):
        SlicedWasserstein(patches_per_image=0)


# -- KID and FD against torchmetrics ---------------------------------------------------------------
class PooledLinear(nn.Module):
    """A small feature extractor usable by torchmetrics (which probes it with uint8 299x299 images)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(48, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(F.adaptive_avg_pool2d(x.float(), 4).flatten(1))


@pytest.fixture
def feature_sets():
    torch.manual_seed(0)
    return PooledLinear(), torch.rand(120, 3, 16, 16), torch.rand(120, 3, 16, 16) * 0.8


def test_kid_equals_torchmetrics_with_the_same_features(feature_sets):
    from torchmetrics.image.kid import KernelInceptionDistance

    module, real, fake = feature_sets
    reference = KernelInceptionDistance(feature=module, subsets=1, subset_size=120)  # one subset = all: no draw
    reference.update(real, real=True)
    reference.update(fake, real=False)
    extractor = module_features(module, "pooled linear")
    ours, _ = kernel_distance(extractor(real), extractor(fake), subsets=1, subset_size=120)
    assert ours == pytest.approx(float(reference.compute()[0]), rel=1e-4)
    mean, std = kernel_distance(extractor(real), extractor(fake), subsets=20, subset_size=50)
    assert abs(mean - ours) < 3 * std + 1e-6 and std > 0


def test_kid_over_subsets_equals_torchmetrics_loop_with_the_same_draws():
    """kernel_distance computes the kernel once; torchmetrics' loop (poly_mmd per subset, in float64
    here) over the same subsets must give the same mean and std."""
    from torchmetrics.image.kid import poly_mmd

    gen = torch.Generator().manual_seed(0)
    real, fake = torch.randn(2500, 64, generator=gen), 1.1 * torch.randn(2300, 64, generator=gen)
    draws, values = torch.Generator().manual_seed(3), []
    for _ in range(7):
        pick_r = torch.randperm(len(real), generator=draws)[:1500]
        pick_f = torch.randperm(len(fake), generator=draws)[:1500]
        values.append(poly_mmd(real[pick_r].double(), fake[pick_f].double()))
    expected = torch.stack(values)
    mean, std = kernel_distance(real, fake, subsets=7, subset_size=1500, seed=3)
    # float32 kernel entries of size ~1 (rounding ~1e-7 each, x3 for the cube) cancel to a KID of ~2e-3:
    # the tolerance follows the kernel's scale, not the result's (rel=1e-5 held on one CPU only)
    scale = float(((real[:500].double() @ real[:500].double().T) / real.shape[1] + 1).pow(3).abs().mean())
    assert abs(mean - float(expected.mean())) <= 1e-6 * scale
    assert abs(std - float(expected.std(unbiased=False))) <= 1e-6 * scale


def test_kid_of_one_tensor_twice_equals_that_of_its_copy():
    # the cross term is never "symmetric" because both arguments are the same object
    features = torch.randn(200, 16, generator=torch.Generator().manual_seed(1))
    same = kernel_distance(features, features, subsets=5, subset_size=100)
    copy = kernel_distance(features, features.clone(), subsets=5, subset_size=100)
    assert same == pytest.approx(copy, abs=1e-9)


@pytest.mark.parametrize(
    ("real", "generated", "message"),
    [
        (
            torch.full((10, 4), float("nan")),
            torch.rand(10, 4),
            "real features must be finite floats, got torch.float32 with 40 NaN/inf",
        ),
        (
            torch.rand(10, 4),
            torch.rand(10, 4).index_fill(0, torch.tensor([2]), float("inf")),
            "generated features must be finite floats",
        ),
        (torch.full((10, 4), 1e200, dtype=torch.float64), torch.rand(10, 4), r"reach 1e\+200, beyond 1e\+06"),
        (torch.rand(10), torch.rand(10, 4), r"real features must be a tensor \(N, D\) with N >= 2, got \(10,\)"),
        (torch.rand(10, 4), torch.rand(2, 10, 4), r"got \(2, 10, 4\)"),
        (torch.rand(10, 4), [[1.0]], "got list"),
        (torch.rand(10, 4), torch.rand(10, 5), "differ in width: 4 and 5; take both from one extractor"),
    ],
)
def test_bad_feature_sets_are_refused_by_kid_and_fd(real, generated, message):
    error = ConfigError if "finite" in message or "beyond" in message else ShapeError  # values, not shapes
    with pytest.raises(error, match=message):
        kernel_distance(real, generated, subsets=2, subset_size=5)
    with pytest.raises(error, match=message):
        frechet_distance(real, generated)


@pytest.mark.parametrize(("options", "message"), [({"subsets": 0}, "subsets must be a whole number >= 1, got 0"),
                                                   ({"subset_size": 1}, "subset_size must be a whole number >= 2"),
                                                   ({"subsets": 2.5}, "got 2.5")])  # fmt: skip
def test_kid_subsets_are_checked(options, message):
    with pytest.raises(ConfigError, match=message):
        kernel_distance(torch.rand(10, 4), torch.rand(10, 4), **{"subsets": 2, "subset_size": 5, **options})


def test_fd_equals_torchmetrics_fid_with_the_same_features(feature_sets):
    from torchmetrics.image.fid import FrechetInceptionDistance

    module, real, fake = feature_sets
    reference = FrechetInceptionDistance(feature=module)
    reference.update(real, real=True)
    reference.update(fake, real=False)
    metric = FeatureDistances(module_features(module, "pooled linear"), subsets=5, subset_size=100)
    for batch in real.split(50):
        metric.update(batch, real=True)
    metric.update(fake, real=False)
    result = metric.compute()
    assert result["fd"] == pytest.approx(float(reference.compute()), rel=1e-6)
    assert result["fd_name"] == "FD (features: pooled linear)" and result["kid"] > 0
    assert frechet_distance(metric.real_features[0], metric.real_features[0]) == pytest.approx(0, abs=1e-8)


def test_fid_from_a_local_inception_weights_file(tmp_path):
    import torch_fidelity.feature_extractor_inceptionv3 as fidelity

    path = tmp_path / "inception.pth"
    torch.manual_seed(0)  # random weights in the FID network's layout: the file format, not the values
    with pytest.MonkeyPatch.context() as patch:  # build the network without its download
        patch.setattr(fidelity, "load_state_dict_from_url", lambda *a, **k: {})
        patch.setattr(fidelity.FeatureExtractorInceptionV3, "load_state_dict", lambda self, state: None)
        torch.save(fidelity.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"]).state_dict(), path)
    extractor = inception_features(path)
    features = extractor(torch.rand(2, 3, 32, 32))
    assert features.shape == (2, 2048) and extractor.fd_name == "FID"
    (tmp_path / "bad.pth").write_bytes(b"not weights")
    with pytest.raises(DataError, match=r"bad.pth: not FID Inception weights"):
        inception_features(tmp_path / "bad.pth")
    torch.save({"conv.weight": torch.zeros(1)}, tmp_path / "other.pth")
    with pytest.raises(DataError, match=r"other.pth: not FID Inception weights \(RuntimeError: Error\(s\) in loading"):
        inception_features(tmp_path / "other.pth")
    torch.save({"model": nn.Linear(1, 1)}, tmp_path / "pickled.pth")  # a module: needs unsafe unpickling
    with pytest.raises(DataError, match=r"pickled.pth: not FID Inception weights \(UnpicklingError"):
        inception_features(tmp_path / "pickled.pth")
    with pytest.raises(DataError, match="Inception weights .*missing.pth do not exist"):
        inception_features(tmp_path / "missing.pth")


def test_encoder_features_of_a_segmentation_run(tmp_path):
    from conftest import small_recipe
    from upzoo.recipe import parse_recipe
    from upzoo.train.engine import train

    train(parse_recipe(small_recipe(str(tmp_path / "cache"))), tmp_path / "run", progress=False)
    extractor = encoder_features(tmp_path / "run")
    features = extractor(torch.rand(3, 3, 32, 32))
    assert features.shape == (3, 8) and extractor.fd_name == "FD (features: run encoder)"


def test_feature_distance_bad_input_is_named(feature_sets):
    module, real, fake = feature_sets
    metric = FeatureDistances(module_features(module, "m"), subsets=2, subset_size=200)
    metric.update(real, real=True)
    metric.update(fake, real=False)
    with pytest.raises(ShapeError, match="KID draws subsets of 200 images but the real set has 120"):
        metric.compute()
    bad = FeatureDistances(module_features(nn.Flatten(0), "flat"))
    with pytest.raises(ShapeError, match=r"extractor 'flat' must return \(N, D\) features for N = 2 images, got"):
        bad.update(torch.rand(2, 3, 4, 4), real=True)
    with pytest.raises(ConfigError, match="subset_size must be a whole number >= 2, got 1"):
        FeatureDistances(module_features(module), subset_size=1)


def test_function_forms_equal_their_classes_and_are_exported_from_upzoo_metrics():
    import upzoo.metrics as metrics
    from upzoo.metrics import SlicedWasserstein, image_spectral_error, radial_power_spectrum, spectral_error, swd

    g = torch.Generator().manual_seed(3)
    real, generated = torch.rand(8, 3, 32, 32, generator=g), torch.rand(8, 3, 32, 32, generator=g) ** 2
    metric = SlicedWasserstein(patches_per_image=8, repeats=2, directions=16, seed=1)
    metric.update(real, real=True)
    metric.update(generated, real=False)
    assert swd(real, generated, patches_per_image=8, repeats=2, directions=16, seed=1) == metric.compute()
    per_ring, summary = image_spectral_error(generated, real)
    expected = spectral_error(radial_power_spectrum(generated), radial_power_spectrum(real))
    np.testing.assert_array_equal(per_ring, expected[0])  # the same calls on the same inputs
    assert summary == expected[1] > 0
    for name in ("swd", "RealImages", "kernel_distance", "frechet_distance", "spectral_decay", "FeatureDistances"):
        assert name in metrics.__all__ and callable(getattr(metrics, name))


def test_the_spectral_error_panel_shows_the_band_beside_the_corners(tmp_path, monkeypatch):
    """A corner error of 200 must not flatten the band's tenths to a line at 0: the error axis is a
    symmetric log (sign kept), and the corners beyond Nyquist are shaded apart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from upzoo.figures import spectrum_plot

    saved = {}
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, path, **kw: saved.setdefault("fig", fig))
    r = np.arange(46.0)
    real = 1 / (1 + r) ** 2
    spectrum_plot(real, {"checkerboard": real * np.where(r > 32, 200.0, 1.1)}, tmp_path / "s.png")
    error_axis = saved["fig"].axes[1]
    assert error_axis.get_yscale() == "symlog"
    assert {0.1, 100.0} <= set(error_axis.get_yticks().tolist())  # the band's tenths and the corners' hundreds
    assert any(type(p).__name__ == "Rectangle" and p.get_alpha() == 0.12 for p in error_axis.patches)


def test_curves_give_each_metric_its_own_scale(tmp_path, monkeypatch):
    """SWD (~150), spectral error (~14) and checkerboard (~0.3) on one linear axis flatten the small
    ones: each metric gets its own panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from upzoo.figures import plot_curves

    saved = {}
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, path, **kw: saved.setdefault("fig", fig))
    rows = [{"step": str(s), "loss_g": "1.0", "loss_d": "0.5", "swd": str(150 - s), "spectral_error": "14",
             "checkerboard": "0.3"} for s in (10, 20)]  # fmt: skip
    plot_curves(rows, tmp_path / "curves.png", ["swd", "spectral_error", "checkerboard"])
    axes = saved["fig"].axes
    assert [a.get_title() for a in axes] == ["training loss", "SWD", "spectral error", "checkerboard"]
    assert [a.get_ylabel() for a in axes] == ["loss", "SWD", "spectral error", "checkerboard"]
    low, high = axes[3].get_ylim()
    assert high - low < 1  # the checkerboard's own scale, not SWD's


def test_prediction_grids_title_their_columns_and_key_the_classes_shown(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from upzoo.figures import class_palette, prediction_grid

    saved = {}
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, path, **kw: saved.setdefault("fig", fig))
    mask = torch.zeros(8, 16, dtype=torch.long)
    mask[:, 8:] = 2
    prediction = torch.ones(8, 16, dtype=torch.long)
    prediction[0, 0] = 255  # ignored: no key
    names = ["road", "sidewalk", "building", "wall"]
    prediction_grid([(torch.rand(3, 8, 16), mask, prediction)], tmp_path / "p.png", palette=class_palette(4),
                    class_names=names)  # fmt: skip
    figure = saved["fig"]
    assert [a.get_title() for a in figure.axes] == ["image", "ground truth", "prediction"]
    assert [t.get_text() for t in figure.legends[0].get_texts()] == ["road", "sidewalk", "building"]
