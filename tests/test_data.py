"""Data: the Cityscapes label mapping against cityscapesscripts, readers on real layouts and real
NIfTI files, the synthetic generators, bad data, transforms, sliding-window inference."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from cityscapesscripts.helpers.labels import id2label
from PIL import Image

from upzoo.data.cityscapes import CLASS_NAMES, PALETTE, CityscapesDataset, to_train_ids
from upzoo.data.io import write_png
from upzoo.data.synthetic import ensure_synthetic_cityscapes, ensure_synthetic_volumes
from upzoo.data.transforms import segmentation_2d, volume_3d
from upzoo.data.volumes import VolumeDataset, normalize_intensity, read_volume, sample_patch, write_nifti
from upzoo.errors import DataError
from upzoo.windows import sliding_window_inference

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def city(tmp_path_factory):
    return ensure_synthetic_cityscapes(tmp_path_factory.mktemp("cache"), train=3, val=2, size=(64, 128), seed=3)


@pytest.fixture(scope="module")
def volumes(tmp_path_factory):
    return ensure_synthetic_volumes(tmp_path_factory.mktemp("cache"), train=3, val=1, shape=(8, 32, 32))


# -- Cityscapes label mapping ------------------------------------------------------------------------
def test_train_ids_match_cityscapesscripts_for_every_id():
    ids = np.arange(-1, 34)
    expected = [255 if id2label[i].trainId in (-1, 255) else id2label[i].trainId for i in ids]
    assert to_train_ids(ids).tolist() == expected
    assert to_train_ids(torch.tensor(ids)).tolist() == expected
    assert list(CLASS_NAMES) == [next(l.name for l in id2label.values() if l.trainId == t) for t in range(19)]
    assert [tuple(c) for c in PALETTE[:19]] == [
        next(l.color for l in id2label.values() if l.trainId == t) for t in range(19)
    ]


def test_ids_outside_the_table_are_data_errors():
    with pytest.raises(DataError, match=r"label ids outside the Cityscapes table \(-1..33\): \[34, 200\]"):
        to_train_ids(np.array([[7, 34], [200, 8]]))
    with pytest.raises(DataError, match="outside"):
        to_train_ids(torch.tensor([-2]))


# -- the synthetic street scenes ---------------------------------------------------------------------
def test_synthetic_set_is_deterministic_cached_and_regenerated_when_incomplete(tmp_path, city):
    again = ensure_synthetic_cityscapes(city.parent, train=3, val=2, size=(64, 128), seed=3)
    assert again == city
    other = ensure_synthetic_cityscapes(tmp_path, train=3, val=2, size=(64, 128), seed=3)
    first = sorted(city.rglob("*.png"))
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in sorted(other.rglob("*.png"))]
    assert len(first) == 10
    (other / "COMPLETE.json").unlink()
    (other / "gtFine" / "train" / "synthcity" / "synthcity_000000_000019_gtFine_labelIds.png").unlink()
    regenerated = ensure_synthetic_cityscapes(tmp_path, train=3, val=2, size=(64, 128), seed=3)
    assert len(list(regenerated.rglob("*.png"))) == 10 and (regenerated / "COMPLETE.json").is_file()
    different = ensure_synthetic_cityscapes(tmp_path, train=1, val=1, size=(64, 128), seed=4)
    assert different != city


def test_synthetic_scenes_cover_many_classes(city):
    classes = set()
    for sample in CityscapesDataset(city, "train"):
        classes |= set(np.unique(sample["mask"].numpy()).tolist())
    assert {0, 1, 2, 8, 10, 13} <= classes and 255 not in classes


def test_nine_scenes_hold_all_19_classes_including_the_thin_ones(tmp_path):
    from upzoo.data.synthetic import OBJECT_KINDS

    root = ensure_synthetic_cityscapes(tmp_path, train=1, val=len(OBJECT_KINDS), size=(128, 256), seed=0)
    counts = np.zeros(256, dtype=np.int64)
    for sample in CityscapesDataset(root, "val"):
        counts += np.bincount(sample["mask"].numpy().ravel(), minlength=256)
    assert (counts[:19] > 0).all(), [i for i in range(19) if counts[i] == 0]
    widths = []  # poles (train id 5): 1-6 px wide, measured per row
    for sample in CityscapesDataset(root, "val"):
        mask = sample["mask"].numpy() == 5
        widths += [int(row.sum()) for row in mask if 0 < row.sum() <= 8]
    assert widths and 1 <= min(widths) and np.median(widths) <= 6


# -- the Cityscapes reader on its layout -------------------------------------------------------------
def test_reader_returns_tensors_and_prefers_label_train_ids(city, tmp_path):
    ds = CityscapesDataset(city, "val", segmentation_2d(None, train=False))
    sample = ds[0]
    assert sample["image"].shape == (3, 64, 128) and sample["image"].dtype == torch.float32
    assert sample["mask"].shape == (64, 128) and sample["mask"].dtype == torch.int64
    copy = tmp_path / "copy"
    shutil.copytree(city, copy)
    label = next((copy / "gtFine" / "val").rglob("*_labelIds.png"))
    train_ids = to_train_ids(np.asarray(Image.open(label)))
    train_ids[:4, :4] = 255
    write_png(label.with_name(label.name.replace("labelIds", "labelTrainIds")), train_ids)
    pair = next(p for p in CityscapesDataset(copy, "val").pairs if p.label.name.endswith("labelTrainIds.png"))
    assert pair.train_ids


def _broken(city: Path, tmp_path: Path) -> Path:
    root = tmp_path / "broken"
    shutil.copytree(city, root)
    return root


def test_bad_layouts_are_data_errors(city, tmp_path):
    with pytest.raises(DataError, match=r"missing folder .*leftImg8bit/test"):
        CityscapesDataset(city, "test")
    root = _broken(city, tmp_path)
    label = next((root / "gtFine" / "train").rglob("*_labelIds.png"))
    label.unlink()
    with pytest.raises(DataError, match=r"has no label: expected .*_gtFine_labelIds.png"):
        CityscapesDataset(root, "train")
    empty = tmp_path / "empty"
    (empty / "leftImg8bit" / "train" / "x").mkdir(parents=True)
    (empty / "gtFine" / "train").mkdir(parents=True)
    with pytest.raises(DataError, match="split is empty"):
        CityscapesDataset(empty, "train")


def test_bad_files_are_data_errors_naming_the_file(city, tmp_path):
    root = _broken(city, tmp_path)
    ds = CityscapesDataset(root, "train")
    image, label = ds.pairs[0].image, ds.pairs[0].label
    image.write_bytes(image.read_bytes()[:200])  # truncated
    with pytest.raises(DataError, match=rf"{image.name}: unreadable or truncated image"):
        ds[0]
    write_png(ds.pairs[1].label, np.zeros((10, 10), np.uint8))
    with pytest.raises(DataError, match=r"label size \(10, 10\) does not match image"):
        ds[1]
    write_png(ds.pairs[2].label, np.full((64, 128), 40, np.uint8))
    with pytest.raises(DataError, match=rf"{ds.pairs[2].label.name}: label ids outside the Cityscapes table"):
        ds[2]
    label.write_bytes(b"not a png")
    with pytest.raises(DataError, match="unreadable"):
        ds[0]


def test_prepare_cityscapes_writes_train_ids_once_and_keeps_sources(city, tmp_path):
    spec = importlib.util.spec_from_file_location("prepare_cityscapes", ROOT / "tools" / "prepare_cityscapes.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    root = _broken(city, tmp_path)
    sources = {p: p.read_bytes() for p in root.rglob("*_labelIds.png")}
    assert tool.main([str(root)]) == 0
    targets = sorted(root.rglob("*_labelTrainIds.png"))
    assert len(targets) == len(sources) == 5
    for target in targets:
        source = target.with_name(target.name.replace("labelTrainIds", "labelIds"))
        assert np.array_equal(np.asarray(Image.open(target)), to_train_ids(np.asarray(Image.open(source))))
    assert all(p.read_bytes() == data for p, data in sources.items())
    stamp = targets[0].stat().st_mtime_ns
    assert tool.convert(root, ["train", "val"]) == (0, 5)
    assert targets[0].stat().st_mtime_ns == stamp
    assert tool.main([str(tmp_path / "nothing")]) == 1


# -- transforms --------------------------------------------------------------------------------------
def test_2d_train_pipeline_keeps_image_and_mask_aligned():
    rng = np.random.default_rng(0)
    mask = np.kron(rng.random((4, 6)) > 0.5, np.ones((20, 20), bool)).astype(np.uint8)  # 20-pixel blocks
    image = np.repeat(mask[..., None] * 200, 3, axis=2).astype(np.uint8)
    pipeline = segmentation_2d((64, 64), train=True, normalize="minmax", augment=True)
    for seed in range(8):
        pipeline.set_random_seed(seed)
        out = pipeline(image=image, mask=mask)
        img, m = out["image"], out["mask"]
        assert img.shape == (3, 64, 64) and m.shape == (64, 64)
        valid = m != 255
        assert ((img[0] > 0.3) == (m == 1))[valid].float().mean() > 0.95  # only block edges may blur


def test_3d_pipeline_flips_volume_and_mask3d_together(volumes):
    ds = VolumeDataset(
        volumes,
        "train",
        patch_size=(8, 16, 16),
        normalize="none",
        foreground_ratio=1.0,
        transform=volume_3d(train=True),
    )
    raw = VolumeDataset(volumes, "train", patch_size=(8, 16, 16), normalize="none", foreground_ratio=1.0)
    sample = ds[0]
    assert sample["image"].shape == (1, 8, 16, 16) and sample["mask"].shape == (8, 16, 16)
    organ = sample["image"][0][sample["mask"] > 0]
    background_body = sample["image"][0][sample["mask"] == 0]
    assert organ.numel() and organ.mean() > background_body.mean()  # intensities still follow the labels
    assert raw[0]["mask"].sum() == sample["mask"].sum()  # same patch, only rearranged


# -- volumes ---------------------------------------------------------------------------------------
def test_nifti_roundtrip_keeps_axes_and_spacing(tmp_path):
    volume = np.random.rand(5, 7, 9).astype(np.float32)
    write_nifti(tmp_path / "v.nii.gz", volume, (5.0, 0.8, 0.7))
    array, spacing = read_volume(tmp_path / "v.nii.gz")
    assert np.array_equal(array, volume) and spacing == (5.0, 0.8, 0.7)
    header = nib.load(str(tmp_path / "v.nii.gz"))
    assert header.shape == (9, 7, 5) and tuple(float(z) for z in header.header.get_zooms()) == pytest.approx(
        (0.7, 0.8, 5.0)
    )


def test_real_mni152_template_and_brain_mask_load_through_the_dataset(tmp_path):
    from nilearn.datasets import load_mni152_brain_mask, load_mni152_template

    template, mask = load_mni152_template(resolution=2), load_mni152_brain_mask(resolution=2)
    for folder, image in (("imagesTr", template), ("labelsTr", mask)):
        (tmp_path / folder).mkdir()
        for name in ("mni152.nii.gz", "mni152_copy.nii.gz"):  # one case to train on, one to validate
            nib.save(image, str(tmp_path / folder / name))
    array, spacing = read_volume(tmp_path / "imagesTr" / "mni152.nii.gz")
    assert spacing == (2.0, 2.0, 2.0) and array.shape == template.shape[::-1]
    ds = VolumeDataset(tmp_path, "train", normalize="zscore")
    sample = ds[0]
    assert sample["image"].shape == (1, *template.shape[::-1]) and sample["mask"].shape == template.shape[::-1]
    assert set(sample["mask"].unique().tolist()) == {0, 1}
    brain, outside = sample["image"][0][sample["mask"] == 1], sample["image"][0][sample["mask"] == 0]
    assert brain.mean() > outside.mean() + 1.0  # the real template is brighter inside the real brain mask


def test_files_no_one_here_wrote_nibabel_4d_and_the_1mm_template():
    import nilearn

    array, spacing = read_volume(Path(nib.__file__).parent / "tests" / "data" / "example4d.nii.gz")
    assert array.ndim == 4 and spacing == (2.2, 2.0, 2.0)
    t1 = Path(nilearn.__file__).parent / "datasets" / "data" / "mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz"
    array, spacing = read_volume(t1)
    assert array.shape == (189, 233, 197) and spacing == (1.0, 1.0, 1.0)


def test_decathlon_json_and_folder_convention_and_npy(volumes, tmp_path):
    listing = json.loads((volumes / "dataset.json").read_text())
    assert listing["training"][0] == {"image": "./imagesTr/synth_000.nii.gz", "label": "./labelsTr/synth_000.nii.gz"}
    train, val = VolumeDataset(volumes, "train"), VolumeDataset(volumes, "val")
    assert (len(train), len(val)) == (3, 1) and train.num_classes == 4 and train.spacing() == (5.0, 0.8, 0.8)
    folder = tmp_path / "npy"
    (folder / "images").mkdir(parents=True)
    (folder / "labels").mkdir()
    for name in ("a.npy", "b.npy"):
        np.save(folder / "images" / name, np.random.rand(4, 6, 6).astype(np.float32))
        np.save(folder / "labels" / name, np.ones((4, 6, 6), np.uint8))
    sample = VolumeDataset(folder, "train")[0]
    assert sample["image"].shape == (1, 4, 6, 6) and sample["spacing"].tolist() == [1.0, 1.0, 1.0]


def test_bad_volumes_are_data_errors(volumes, tmp_path):
    root = tmp_path / "v"
    shutil.copytree(volumes, root)
    listing = json.loads((root / "dataset.json").read_text())
    (root / listing["training"][1]["label"]).unlink()
    with pytest.raises(DataError, match=r"label .*synth_001.nii.gz does not exist \(for image"):
        VolumeDataset(root, "train")
    shutil.rmtree(root)
    shutil.copytree(volumes, root)
    write_nifti(root / "labelsTr" / "synth_000.nii.gz", np.zeros((2, 2, 2), np.uint8), (1, 1, 1))
    with pytest.raises(DataError, match=r"synth_000.nii.gz: label shape \(2, 2, 2\) does not match image"):
        VolumeDataset(root, "train")[0]
    write_nifti(root / "labelsTr" / "synth_001.nii.gz", np.full((8, 32, 32), 9, np.uint8), (1, 1, 1))
    with pytest.raises(DataError, match=r"labels must be in 0..3"):
        VolumeDataset(root, "train")[1]
    image = root / "imagesTr" / "synth_002.nii.gz"
    image.write_bytes(image.read_bytes()[:300])
    with pytest.raises(DataError, match="synth_002.nii.gz: unreadable or truncated volume"):
        VolumeDataset(root, "train")[2]
    with pytest.raises(DataError, match="expected dataset.json, imagesTr/"):
        VolumeDataset(tmp_path, "train")
    with pytest.raises(DataError, match="does not exist"):
        VolumeDataset(tmp_path / "nope", "train")


def test_normalisation_and_foreground_oversampling():
    ct = normalize_intensity(np.array([-2000.0, 0.0, 3000.0]), "ct", (-1000, 1000))
    assert ct.tolist() == [0.0, 0.5, 1.0]
    z = normalize_intensity(np.random.rand(1000) * 7 + 3, "zscore")
    assert abs(z.mean()) < 1e-6 and abs(z.std() - 1) < 1e-6
    label = np.zeros((20, 40, 40), np.uint8)
    label[2:5, 30:35, 30:35] = 1
    image = label[None].astype(np.float32)
    rng = np.random.default_rng(0)
    always = [sample_patch(image, label, (4, 8, 8), rng, 1.0)[1].any() for _ in range(50)]
    never = [sample_patch(image, label, (4, 8, 8), rng, 0.0)[1].any() for _ in range(50)]
    assert all(always) and sum(never) < 25
    small_img, small_lab = sample_patch(image[:, :2, :3, :3], label[:2, :3, :3], (4, 8, 8), rng, 0.5)
    assert small_img.shape == (1, 4, 8, 8) and small_lab.shape == (4, 8, 8)


@pytest.mark.parametrize("overlap, gaussian", [(0.5, True), (0.25, False), (0.0, True)])
def test_sliding_window_reproduces_a_local_predictor(overlap, gaussian):
    volume = torch.randn(2, 11, 37, 29)

    def predictor(batch):  # a per-voxel function: windows must stitch back exactly
        return torch.cat([batch.sum(1, keepdim=True), batch[:, :1] * 3], dim=1)

    out = sliding_window_inference(volume, predictor, (8, 16, 16), overlap=overlap, gaussian=gaussian)
    torch.testing.assert_close(out, predictor(volume[None])[0], rtol=1e-4, atol=1e-4)
    small = sliding_window_inference(volume[:, :4, :5, :6], predictor, (8, 16, 16))
    assert small.shape == (2, 4, 5, 6)
