"""Resampling to a voxel spacing: against SciPy's zoom, with objects of known physical size and
place at several spacings, through ``upzoo predict`` (to the training spacing and back) and in
training (``data.target_spacing``, cached, ``strides: auto`` planned from it)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import small_volume_recipe
from upzoo.data.resampling import median_spacing, resample_image, resample_labels, resampled_shape
from upzoo.data.volumes import VolumeDataset, write_nifti
from upzoo.errors import ConfigError
from upzoo.inference import Predictor, load_model
from upzoo.inference.run import PredictOptions, predict_files
from upzoo.recipe import parse_recipe
from upzoo.train.engine import train

EXTENT = np.array([120.0, 96.0, 96.0])  # mm, (z, y, x)
CENTER = np.array([58.0, 41.0, 52.0])
RADII = np.array([25.0, 14.0, 18.0])
TRAINING_SPACING = (5.0, 0.8, 0.8)


def ellipsoid(spacing) -> np.ndarray:
    """The ellipsoid rasterised at voxel centres of a grid with this spacing over EXTENT."""
    shape = np.round(EXTENT / np.asarray(spacing)).astype(int)
    axes = [(np.arange(n) + 0.5) * s for n, s in zip(shape, spacing)]
    zz, yy, xx = np.meshgrid(*axes, indexing="ij")
    return ((((zz - CENTER[0]) / RADII[0]) ** 2 + ((yy - CENTER[1]) / RADII[1]) ** 2
             + ((xx - CENTER[2]) / RADII[2]) ** 2) < 1).astype(np.uint8)  # fmt: skip


def physical(mask: np.ndarray, spacing) -> tuple[float, np.ndarray]:
    """Volume (mm^3) and centroid (mm) of a mask."""
    voxel = float(np.prod(spacing))
    centroid = (np.argwhere(mask).mean(0) + 0.5) * np.asarray(spacing)
    return mask.sum() * voxel, centroid


def dice(a: np.ndarray, b: np.ndarray) -> float:
    return 2 * np.logical_and(a, b).sum() / (a.sum() + b.sum())


@pytest.mark.parametrize("shape", [(14, 26, 22), (4, 6, 5), (9, 20, 7), (7, 13, 11)])
def test_linear_resampling_equals_pytorch_trilinear(shape):
    x = np.random.default_rng(0).normal(size=(7, 13, 11)).astype(np.float32)
    ours = resample_image(x, shape, order=1)
    reference = F.interpolate(torch.from_numpy(x)[None, None], size=shape, mode="trilinear", align_corners=False)
    np.testing.assert_allclose(ours, reference[0, 0].numpy(), atol=1e-5)
    channels = resample_image(np.stack([x, 2 * x]), shape, order=1)
    np.testing.assert_allclose(channels[1], 2 * ours, atol=1e-5)


def test_cubic_resampling_follows_smooth_fields_closer_than_linear():
    """A cubic B-spline reproduces polynomials up to degree 3 away from the edges (where the
    nearest-voxel extension bends it): a cubic field sampled at voxel centres comes back at the new
    voxel centres several times closer than by linear interpolation."""

    def field(shape, extent=(12.0, 24.0, 20.0)):
        axes = [(np.arange(n) + 0.5) * e / n for n, e in zip(shape, extent)]
        zz, yy, xx = np.meshgrid(*axes, indexing="ij")
        return (0.5 * zz + 0.2 * yy**2 - 0.3 * xx + 0.01 * xx**3 + 1).astype(np.float32)

    inner = (slice(8, -8),) * 3  # four source voxels from each edge
    truth = field((24, 48, 40))[inner]
    cubic = np.abs(resample_image(field((12, 24, 20)), (24, 48, 40))[inner] - truth).max()
    linear = np.abs(resample_image(field((12, 24, 20)), (24, 48, 40), order=1)[inner] - truth).max()
    assert cubic < 0.03 and cubic < 0.2 * linear
    assert resample_image(field((12, 24, 20)), (12, 24, 20)).shape == (12, 24, 20)


@pytest.mark.parametrize("source", [(5.0, 0.8, 0.8), (2.5, 1.6, 1.6), (10.0, 1.2, 0.6), (3.0, 2.0, 2.0)])
def test_an_object_keeps_its_physical_size_and_place(source):
    truth_volume = 4 / 3 * np.pi * RADII.prod()
    labels = ellipsoid(source)
    shape = resampled_shape(labels.shape, source, TRAINING_SPACING)
    assert shape == tuple(np.round(EXTENT / TRAINING_SPACING).astype(int))
    resampled = resample_labels(labels, shape)
    volume, centroid = physical(resampled, TRAINING_SPACING)
    assert abs(volume / truth_volume - 1) < 0.04
    np.testing.assert_allclose(centroid, CENTER, atol=0.6 * max(source))
    assert dice(resampled, ellipsoid(TRAINING_SPACING)) > 0.93
    image = resample_image(labels.astype(np.float32) * 100, shape)  # intensities: the same object at 50
    assert dice(image > 50, ellipsoid(TRAINING_SPACING)) > 0.93


def test_labels_resample_class_by_class_and_keep_their_dtype():
    labels = np.zeros((4, 8, 8), np.uint8)
    labels[:, 2:6, 2:6] = 1
    labels[:, 3:5, 3:5] = 2  # a small class inside a larger one
    up = resample_labels(labels, (8, 16, 16))
    assert up.dtype == np.uint8 and set(np.unique(up)) == {0, 1, 2}
    np.testing.assert_array_equal(up[::2, ::2, ::2][:, 1:, 1:], labels[:, 1:, 1:])
    assert (up == 2).sum() == 2 * 4 * 4 * 4  # 2 -> 4 voxels per in-plane axis, 4 -> 8 slices
    assert resample_labels(labels, labels.shape) is labels


def test_median_spacing_is_per_axis():
    assert median_spacing([(5.0, 0.8, 0.8), (2.5, 0.7, 0.6), (3.0, 0.9, 1.0)]) == (3.0, 0.8, 0.8)


# -- predict: to the training spacing and back --------------------------------------------------------
class Threshold(nn.Module):
    """An oracle 4-class "model": class 1 where the intensity is above the middle of its range (the
    edge of a step at half height); records the spatial sizes it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, ...]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(tuple(x.shape[2:]))
        x = x - (x.amax() + x.amin()) / 2
        other = torch.full_like(x, -1e3)
        return torch.cat([-x, x, other, other], 1)


@pytest.fixture(scope="module")
def volume_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("resample")
    recipe = small_volume_recipe(str(root / "cache"), synthetic_spacing=list(TRAINING_SPACING))
    train(parse_recipe(recipe), root / "run", progress=False)
    return root / "run"


def oracle(volume_run: Path) -> tuple:
    loaded = load_model(volume_run)
    loaded.model = Threshold()
    return loaded, loaded.model


@pytest.mark.parametrize("source", [(10.0, 1.6, 1.6), (2.5, 0.4, 0.4), (5.0, 1.2, 0.6)])
def test_predict_resamples_to_the_training_spacing_and_back(volume_run, tmp_path, source):
    loaded, model = oracle(volume_run)
    assert loaded.spacing == TRAINING_SPACING
    truth = ellipsoid(source)
    path = tmp_path / "case.nii.gz"
    write_nifti(path, truth.astype(np.float32) * 100, source)
    options = PredictOptions(tmp_path / "o", num_workers=0, progress=False)
    predict_files(Predictor(loaded, window="off"), [path], options)
    assert model.seen == [resampled_shape(truth.shape, source, TRAINING_SPACING)]
    import nibabel as nib

    written = nib.load(str(tmp_path / "o" / "case.nii.gz"))
    assert np.allclose(written.affine, nib.load(str(path)).affine)
    labels = np.asarray(written.dataobj).transpose(2, 1, 0)
    assert labels.shape == truth.shape
    assert dice(labels == 1, truth) > 0.95
    volume, centroid = physical(labels == 1, source)
    assert abs(volume / (4 / 3 * np.pi * RADII.prod()) - 1) < 0.05
    np.testing.assert_allclose(centroid, CENTER, atol=0.6 * max(source))


def test_no_resample_runs_the_source_grid_and_warns(volume_run, tmp_path):
    loaded, model = oracle(volume_run)
    truth = ellipsoid((10.0, 1.6, 1.6))
    path = tmp_path / "case.nii.gz"
    write_nifti(path, truth.astype(np.float32), (10.0, 1.6, 1.6))
    predictor = Predictor(loaded, window="off", resample=False)
    with pytest.warns(UserWarning, match=r"case.nii.gz: voxel spacing \(10.0, 1.6, 1.6\) mm differs .* --no-resample"):
        predict_files(predictor, [path], PredictOptions(tmp_path / "o", num_workers=0, progress=False))
    assert model.seen == [truth.shape]


def test_matching_spacing_is_not_resampled_and_npy_files_are_named(volume_run, tmp_path):
    loaded, model = oracle(volume_run)
    volume = ellipsoid(TRAINING_SPACING).astype(np.float32)
    write_nifti(tmp_path / "a.nii.gz", volume, TRAINING_SPACING)
    np.save(tmp_path / "b.npy", volume)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        predict_files(Predictor(loaded, window="off"), [tmp_path / "a.nii.gz"],
                      PredictOptions(tmp_path / "o", num_workers=0, progress=False))  # fmt: skip
    with pytest.warns(UserWarning, match=r"b.npy: a .npy file carries no voxel spacing, so it runs as if at the "):
        predict_files(Predictor(loaded, window="off"), [tmp_path / "b.npy"],
                      PredictOptions(tmp_path / "o", num_workers=0, progress=False))  # fmt: skip
    assert model.seen == [volume.shape, volume.shape]


def test_predictor_takes_the_spacing_of_an_array(volume_run):
    loaded, model = oracle(volume_run)
    truth = ellipsoid((10.0, 1.6, 1.6))
    prediction = Predictor(loaded, window="off").predict(truth.astype(np.float32), spacing=(10.0, 1.6, 1.6))
    assert model.seen == [(24, 120, 120)] and prediction.labels.shape == truth.shape
    assert dice(prediction.labels == 1, truth) > 0.95
    for bad in ((10.0, 1.6), (0, 1, 1), "10", (float("nan"), 1, 1)):
        with pytest.raises(ConfigError, match=r"spacing must be 3 positive finite voxel sizes in mm \(D, H, W\), "):
            Predictor(loaded).predict(truth.astype(np.float32), spacing=bad)
    with pytest.raises(ConfigError, match="resample must be True or False, got 'no'"):
        Predictor(loaded, resample="no")


# -- training at a target spacing ---------------------------------------------------------------------
def mixed_dataset(root: Path) -> list[tuple[float, ...]]:
    spacings = [(2.5, 0.8, 0.8), (5.0, 0.8, 0.8), (5.0, 1.6, 1.6), (4.0, 1.0, 1.0)]
    entries = []
    for i, spacing in enumerate(spacings):
        labels = ellipsoid(spacing)
        image = labels.astype(np.float32) * 100 + np.random.default_rng(i).normal(0, 5, labels.shape)
        write_nifti(root / "imagesTr" / f"c{i}.nii.gz", image.astype(np.float32), spacing)
        write_nifti(root / "labelsTr" / f"c{i}.nii.gz", labels, spacing)
        entries.append({"image": f"./imagesTr/c{i}.nii.gz", "label": f"./labelsTr/c{i}.nii.gz"})
    listing = {"labels": {"0": "background", "1": "organ"}, "training": entries, "validation_count": 1}
    (root / "dataset.json").write_text(json.dumps(listing))
    return spacings


def test_training_resamples_to_the_median_once_and_plans_strides_from_it(tmp_path, monkeypatch):
    spacings = mixed_dataset(tmp_path / "data")
    recipe = parse_recipe({
        "model": {"architecture": "unet", "spatial_dims": 3, "in_channels": 1, "num_classes": 2,
                  "channels": [4, 8, 8], "strides": "auto"},
        "data": {"kind": "volumes", "root": str(tmp_path / "data"), "target_spacing": "median",
                 "crop_size": [16, 32, 32], "batch_size": 1, "num_workers": 0, "cache_dir": str(tmp_path / "cache")},
        "train": {"max_steps": 1},
    })  # fmt: skip
    median = median_spacing(spacings[:3])  # the three training cases (the last one validates)
    assert median == (5.0, 0.8, 0.8)
    from upzoo.prepare import prepare

    prepared = prepare(recipe)
    assert prepared.data.spacing == median
    from upzoo.models.planning import plan_strides

    planned = [tuple(s) for s in prepared.spec.options["strides"]]
    assert planned == plan_strides(median, (16, 32, 32), max_stages=2) == [(1, 2, 2), (1, 2, 2)]
    assert plan_strides(spacings[0], (16, 32, 32), max_stages=2) != planned  # not the first case's spacing
    for dataset in (prepared.data.train, prepared.data.val):
        for i in range(len(dataset)):
            image, label, spacing = dataset.load(i)
            assert spacing == median and image.shape[1:] == label.shape == (24, 120, 120)
            assert dice(label == 1, ellipsoid(median)) > 0.93
    assert len(list((tmp_path / "cache").glob("resampled-*/image.npy"))) == 4
    import upzoo.data.resampling as resampling

    monkeypatch.setattr(resampling, "resample_image", lambda *a: pytest.fail("resampled twice"))
    prepared.data.train.load(1)  # from the cache
    train(recipe, tmp_path / "run", progress=False)
    assert load_model(tmp_path / "run").spacing == median


def test_an_explicit_target_spacing_is_what_the_checkpoint_holds(tmp_path):
    mixed_dataset(tmp_path / "data")
    dataset = VolumeDataset(tmp_path / "data", "train", target_spacing=(4.0, 1.2, 1.2), cache_dir=tmp_path / "c")
    image, label, spacing = dataset.load(0)
    assert spacing == (4.0, 1.2, 1.2) and label.shape == (30, 80, 80) and dataset.spacing(0) == spacing
    assert dataset.source_spacing(0) == (2.5, 0.8, 0.8)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kind": "cityscapes", "target_spacing": [1, 1, 1]}, "target_spacing: applies to volumes"),
        ({"kind": "volumes", "target_spacing": [0, 1, 1]}, r"in mm \(each at most 10000\), or null, got \[0, 1, 1\]$"),
        ({"kind": "volumes", "target_spacing": [1, 1]}, r"target_spacing: expected 'median', three .* got \[1, 1\]$"),
        ({"kind": "volumes", "target_spacing": "mean"}, r"target_spacing: expected 'median', three .* got 'mean'$"),
    ],
)
def test_bad_target_spacing_is_refused_with_its_path(data, message):
    with pytest.raises(ConfigError, match=message):
        model = {"architecture": "unet", "spatial_dims": 3, "in_channels": 1, "num_classes": 2}
        parse_recipe({"model": model, "data": data})


# -- spacing as the header holds it, and resampled sizes that cannot be ---------------------------
def _nifti_with_pixdim(path: Path, pixdim: tuple[float, float, float]) -> Path:
    import nibabel as nib

    image = nib.Nifti1Image(np.ones((6, 8, 8), np.float32), np.eye(4))
    image.header["pixdim"][1:4] = pixdim  # as written by a broken converter: nibabel would repair it on load
    nib.save(image, str(path))
    return path


@pytest.mark.parametrize("pixdim", [(0.0, 1.0, 1.0), (1.0, -2.0, 1.0), (1.0, 1.0, np.nan), (1e6, 1.0, 1.0)])
def test_a_header_spacing_that_is_not_a_voxel_size_is_refused_as_written(tmp_path, pixdim, volume_run, caplog):
    from upzoo.data.resampling import read_spacing
    from upzoo.data.volumes import read_volume
    from upzoo.errors import DataError

    path = _nifti_with_pixdim(tmp_path / "case.nii.gz", pixdim)
    shown = str(tuple(float(v) for v in pixdim[::-1])).replace("(", r"\(").replace(")", r"\)")
    for read in (read_spacing, read_volume):
        with pytest.raises(
            DataError, match=rf"case.nii.gz: the header's voxel spacing must be positive .* got {shown}"
        ):
            read(path)
    loaded, model = oracle(volume_run)
    with pytest.raises(DataError, match="the header's voxel spacing"):  # predict: refused before any voxel
        predict_files(
            Predictor(loaded, window="off"), [path], PredictOptions(tmp_path / "o", num_workers=0, progress=False)
        )
    assert model.seen == [] and "setting" not in caplog.text  # nibabel's repair never ran


def test_a_nifti2_header_reads_and_a_file_that_is_no_nifti_is_named(tmp_path):
    import nibabel as nib

    from upzoo.data.resampling import read_spacing
    from upzoo.errors import DataError

    affine = np.diag([2.0, 0.5, 0.5, 1.0])
    nib.save(nib.Nifti2Image(np.ones((6, 8, 8), np.float32), affine), str(tmp_path / "two.nii"))
    assert read_spacing(tmp_path / "two.nii") == (0.5, 0.5, 2.0)  # (D, H, W) = (z, y, x)
    (tmp_path / "junk.nii").write_bytes(bytes(400))
    with pytest.raises(DataError, match="junk.nii: not a NIfTI-1 or NIfTI-2 file"):
        read_spacing(tmp_path / "junk.nii")


def test_a_resampled_size_beyond_memory_is_refused_before_any_allocation():
    from upzoo.errors import DataError

    with pytest.raises(DataError, match=r"gives \(100000, 512, 512\) = 2.62e\+10 voxels \(97.7 GiB per float32"):
        resampled_shape((100, 512, 512), (1000.0, 1.0, 1.0), (1.0, 1.0, 1.0))
    assert resampled_shape((100, 512, 512), (5.0, 1.0, 1.0), (1.0, 1.0, 1.0)) == (500, 512, 512)
