"""Real anatomy offline: the MNI152 template read from nilearn's wheel (its geometry against
nibabel's), the tissue-label rule, the coronal split, the slab model of thick slices, the
interpolations a through-plane upsampler has to beat, and PSNR/SSIM in a mask against
scikit-image."""

from __future__ import annotations

import importlib.util

import nibabel as nib
import numpy as np
import pytest
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from upzoo.data import mni152
from upzoo.data.mni152 import TISSUE_NAMES, coronal_split, load_mni152, mni152_paths, tissue_labels
from upzoo.data.slabs import interpolate_slices, slab_factor, thick_affine, thick_slices, thin_affine
from upzoo.errors import ConfigError, DataError, ShapeError
from upzoo.metrics.volume_quality import masked_psnr, masked_ssim


@pytest.fixture(scope="module")
def brain():
    return load_mni152()


def test_the_template_keeps_nibabels_geometry(brain):
    image = nib.load(str(mni152_paths()["t1"]))
    assert brain.t1.shape == tuple(reversed(image.shape)) == (189, 233, 197) and brain.spacing == (1.0, 1.0, 1.0)
    xyz = np.asarray(image.dataobj)
    rng = np.random.default_rng(0)
    for z, y, x in zip(*(rng.integers(0, n, 20) for n in brain.t1.shape)):
        assert brain.t1[z, y, x] == pytest.approx(xyz[x, y, z] / 255)
        world = image.affine @ [x, y, z, 1]
        assert np.allclose(brain.affine @ [z, y, x, 1], world)
    assert brain.t1.dtype == np.float32 and 0 <= brain.t1.min() and brain.t1.max() <= 1


def test_the_template_is_its_own_mirror_about_the_midline(brain):
    """nilearn's wheel ships the symmetric ICBM 2009a template (``..._sym_09a``): the T1, the mask and
    the labels equal their left-right mirror about x = 0 mm voxel for voxel (x is the last array axis)."""
    centre = np.linalg.solve(brain.affine, [0.0, 0.0, 0.0, 1.0])[2]  # the x index of x = 0 mm
    width = brain.t1.shape[2]
    mirror = np.round(2 * centre - np.arange(width)).astype(int)
    inside = (mirror >= 0) & (mirror < width)
    assert centre == pytest.approx(98) and inside.all()  # 197 columns about the middle one
    for volume in (brain.t1, brain.labels):
        assert np.array_equal(volume[..., inside], volume[..., mirror[inside]])
    shifted = np.clip(mirror + 2, 0, width - 1)  # a mirror 1 mm off the midline is not
    assert not np.array_equal(brain.t1[..., inside], brain.t1[..., shifted[inside]])


def test_the_tissue_rule_on_the_template(brain):
    counts = np.bincount(brain.labels.ravel(), minlength=4)
    assert counts.tolist() == [6788750, 160114, 1090888, 635537]  # background, CSF/other, grey, white
    paths = mni152_paths()
    gm, wm = (np.asarray(nib.load(str(paths[k])).dataobj).transpose(2, 1, 0) / 255 for k in ("gm", "wm"))
    assert (brain.labels[brain.mask & (gm > 0.5)] == 2).all() and (brain.labels[brain.mask & (wm > 0.5)] == 3).all()
    assert (brain.labels[~brain.mask] == 0).all() and (brain.labels[brain.mask] > 0).all()


def test_the_tissue_rule_by_hand():
    gm = np.array([[[0.6, 0.1, 0.3, 0.9]]])
    wm = np.array([[[0.3, 0.2, 0.6, 0.0]]])
    mask = np.array([[[True, True, True, False]]])
    assert tissue_labels(gm, wm, mask).tolist() == [[[2, 1, 3, 0]]]  # other = 0.1, 0.7, 0.1
    with pytest.raises(DataError, match="the rule gives no voxel of background, white_matter"):
        tissue_labels(gm[..., :2], wm[..., :2], mask[..., :2])
    with pytest.raises(DataError, match=r"gm must be probabilities in \[0, 1\], got \[0.1, 255.0\]"):
        tissue_labels(gm * 0 + np.array([[[255, 0.1, 0.3, 0.9]]]), wm, mask)
    with pytest.raises(ShapeError, match="must have one shape"):
        tissue_labels(gm, wm[..., :2], mask)
    assert TISSUE_NAMES == ("background", "csf_other", "grey_matter", "white_matter")


def test_nilearn_missing_names_the_pip_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nilearn" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'upzoo\[mni152\]' \(or pip install nilearn\)"):
        mni152.mni152_paths()


def test_the_coronal_split_does_not_touch():
    train, val = coronal_split(233, val_fraction=0.25, gap=8)
    assert val == slice(87, 145) and train == [slice(0, 79), slice(153, 233)]
    with pytest.raises(ConfigError, match="val_fraction must be in"):
        coronal_split(233, val_fraction=0.9)
    with pytest.raises(ConfigError, match="gap must be a whole number of voxels >= 0 .a negative one leaks., got -3"):
        coronal_split(233, gap=-3)
    with pytest.raises(ConfigError, match="leaves no training block"):
        coronal_split(20, val_fraction=0.5, gap=8)


def test_thick_slices_average_their_slab():
    volume = np.random.default_rng(0).random((12, 3, 5)).astype(np.float32)
    thick = thick_slices(volume, 4)
    assert thick.shape == (3, 3, 5) and np.allclose(thick[1], volume[4:8].mean(0))
    assert np.allclose(thick_slices(volume, 5, axis=2), volume.mean(2, keepdims=True))
    noisy, again = thick_slices(volume, 4, noise=0.1, seed=1), thick_slices(volume, 4, noise=0.1, seed=1)
    assert np.array_equal(noisy, again) and 0.05 < np.std(noisy - thick) < 0.15
    with pytest.raises(ShapeError, match=r"13 slices on axis 0 do not divide into slabs of 4; crop to 12 slices"):
        thick_slices(np.zeros((13, 2, 2)), 4)
    with pytest.raises(ShapeError, match=r"thick_slices: axis must be 0, 1 or 2 .*, got 3"):
        thick_slices(volume, 4, axis=3)
    with pytest.raises(ShapeError, match=r"interpolate_slices: expected a \(D, H, W\) volume, got shape \(12, 3\)"):
        interpolate_slices(volume[..., 0], 2)
    with pytest.raises(ConfigError, match="factor must be a whole number of slices >= 1, got 2.5"):
        thick_slices(volume, 2.5)


def test_slab_factor_is_a_whole_multiple():
    assert slab_factor(4, 1.0) == 4 and slab_factor(3.0, 1.5) == 2
    with pytest.raises(ConfigError, match="2.5 mm is not a whole multiple of the 1.0 mm voxels; use e.g. 2 mm"):
        slab_factor(2.5, 1.0)
    with pytest.raises(ConfigError, match="slice thickness must be a positive size in mm, got -4"):
        slab_factor(-4, 1.0)


def test_the_thick_affine_centres_each_slice_on_its_slab(brain):
    thick = thick_affine(brain.affine, 4)
    for k in (0, 7):
        thin_centres = [brain.affine @ [4 * k + i, 10, 20, 1] for i in range(4)]
        assert np.allclose(thick @ [k, 10, 20, 1], np.mean(thin_centres, axis=0))
    rotated = brain.affine.copy()
    rotated[:3, :3] = [[0.9, 0.1, 0], [0, 1, 0], [0.1, 0, 1]]
    with pytest.raises(ConfigError, match="needs an axis-aligned 4x4 affine"):
        thick_affine(rotated, 4)


@pytest.mark.parametrize("method", ["linear", "cubic", "bspline"])
def test_interpolation_puts_each_slab_where_the_geometry_says(method):
    ramp = np.broadcast_to(np.arange(80, dtype=np.float32)[:, None, None], (80, 3, 4))
    thin = interpolate_slices(thick_slices(ramp, 4), 4, method)
    assert thin.shape == ramp.shape
    if method == "linear":
        assert np.allclose(thin[4:-4], ramp[4:-4], atol=1e-4)  # exact on a ramp away from the edges
    # cubic convolution (a = -0.75) and the B-spline err symmetrically about each slab's centre:
    # each slab's mean is the ramp's there, so no method shifts the slices
    means, expected = thin.reshape(20, 4, 3, 4).mean(1), ramp.reshape(20, 4, 3, 4).mean(1)
    assert np.allclose(means[6:-6], expected[6:-6], atol=1e-3)
    constant = interpolate_slices(np.full((5, 2, 2), 0.3, np.float32), 3, method)
    assert np.allclose(constant, 0.3, atol=1e-6)


def test_cubic_is_keys_convolution_along_the_slices():
    signal = np.random.default_rng(1).random(9).astype(np.float64)

    def keys(t: float, a: float = -0.75) -> float:  # Keys (1981), PyTorch's bicubic a
        t = abs(t)
        return (
            (a + 2) * t**3 - (a + 3) * t**2 + 1
            if t <= 1
            else (a * t**3 - 5 * a * t**2 + 8 * a * t - 4 * a if t < 2 else 0)
        )

    expected = []
    for i in range(27):
        x = (i + 0.5) / 3 - 0.5
        base = int(np.floor(x))
        expected.append(sum(keys(x - j) * signal[min(max(j, 0), 8)] for j in range(base - 1, base + 3)))
    got = interpolate_slices(signal.astype(np.float32)[:, None, None], 3, "cubic")[:, 0, 0]
    assert np.allclose(got, expected, atol=1e-5)
    with pytest.raises(ConfigError, match="method must be one of linear, cubic, bspline, got 'nearest'"):
        interpolate_slices(signal[:, None, None], 3, "nearest")


def test_psnr_and_ssim_match_scikit_image_without_a_mask():
    rng = np.random.default_rng(2)
    target = rng.random((16, 20, 18))
    output = np.clip(target + rng.normal(0, 0.05, target.shape), 0, 1)
    assert masked_psnr(output, target) == pytest.approx(peak_signal_noise_ratio(target, output, data_range=1), abs=1e-9)
    reference = structural_similarity(
        target, output, gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=1
    )
    assert masked_ssim(output, target) == pytest.approx(reference, abs=1e-9)


def test_the_mask_decides_where_psnr_and_ssim_are_measured():
    target = np.zeros((12, 12, 12))
    output = target.copy()
    output[:6] = 0.5  # an error only outside the mask
    mask = np.zeros(target.shape, bool)
    mask[6:] = True
    assert masked_psnr(output, target, mask) == float("inf")
    assert masked_psnr(output, target) == pytest.approx(10 * np.log10(1 / (0.25 / 2)))
    with pytest.raises(ShapeError, match="mask selects no voxel"):
        masked_psnr(output, target, np.zeros_like(mask))
    with pytest.raises(ShapeError, match="mask must be a boolean array"):
        masked_psnr(output, target, mask.astype(np.uint8))
    with pytest.raises(ConfigError, match="NaN or inf voxels"):
        masked_ssim(output * np.nan, target)
    with pytest.raises(ShapeError, match="at least 11 voxels a side"):
        masked_ssim(np.zeros((8, 12, 12)), np.zeros((8, 12, 12)))
    ramp = np.linspace(0, 255, 12**3).reshape(12, 12, 12)
    with pytest.raises(ConfigError, match=r"data_range is 1 but the target's intensities span 255: .* data_range=255"):
        masked_psnr(ramp, ramp + 1)
    assert masked_psnr(ramp + 1, ramp, data_range=255) == pytest.approx(20 * np.log10(255))


def test_the_slab_affines_take_whole_factors_only():
    affine = np.diag([1.0, 1.0, 1.0, 1.0])
    for function in (thick_affine, thin_affine):
        for factor in (1.5, 0, True, "4"):
            with pytest.raises(ConfigError, match=f"{function.__name__}: factor must be a whole number .* got"):
                function(affine, factor)
    np.testing.assert_allclose(thin_affine(thick_affine(affine, np.int64(4)), 4), affine, atol=1e-12)


def test_interpolation_baselines_on_the_template(brain):
    t1, mask = brain.t1[:180], brain.mask[:180]
    scores = {m: masked_psnr(interpolate_slices(thick_slices(t1, 4), 4, m), t1, mask) for m in ("linear", "cubic")}
    assert 26.5 < scores["linear"] < 28 and scores["cubic"] > scores["linear"] + 0.5  # docs/anatomy.md: 27.15, 28.18
