"""Using trained models: load_model, Predictor, upzoo predict / sample / export, round trips a user
relies on (predict == eval, label PNGs reload, NIfTI keeps the source grid), and bad inputs."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import run_cli, small_volume_recipe
from upzoo.errors import ConfigError, DataError
from upzoo.inference import Predictor, load_model
from upzoo.inference.run import PredictOptions, predict_files
from upzoo.recipe import parse_recipe
from upzoo.train.engine import train


def _val_images(run: Path) -> list[Path]:
    return sorted((run.parent / "cache").rglob("leftImg8bit/val/**/*.png"))


def test_load_model_brings_the_data_conventions(seg_run):
    loaded = load_model(seg_run)
    assert loaded.checkpoint.name == "best.pt" and not loaded.model.training
    assert loaded.class_names[:2] == ["road", "sidewalk"] and loaded.palette.shape == (19, 3)  # one colour per class
    assert loaded.mean == pytest.approx((0.485, 0.456, 0.406)) and loaded.num_classes == 19
    import upzoo

    assert upzoo.load_model is load_model


def test_predict_gives_the_labels_of_upzoo_eval(seg_run):
    from upzoo.prepare import prepare
    from upzoo.train.evaluate import evaluate_segmentation

    loaded = load_model(seg_run)
    bundle = prepare(loaded.recipe).data
    _, examples = evaluate_segmentation(loaded.model, bundle.val, num_classes=19, keep=3)
    predictor = Predictor(loaded)
    paths = [pair.image for pair in bundle.val.pairs]
    for path, (_, _, expected) in zip(paths, examples):
        got = predictor.predict(str(path)).labels
        np.testing.assert_array_equal(got, expected.numpy())


def test_cli_predict_writes_labels_colours_overlays_and_csv(seg_run, tmp_path):
    images = _val_images(seg_run)
    out = tmp_path / "pred"
    assert run_cli("predict", seg_run, images[0].parent, "--out", out, "--overlay", "--no-progress").returncode == 0
    predictor = Predictor(load_model(seg_run))
    for image in images:
        stem = image.stem
        labels = np.asarray(Image.open(out / f"{stem}.png"))
        assert labels.dtype == np.uint8 and labels.shape == (32, 64)
        np.testing.assert_array_equal(labels, predictor.predict(str(image)).labels)
        colours = np.asarray(Image.open(out / "color" / f"{stem}.png").convert("RGB"))
        np.testing.assert_array_equal(colours, predictor.loaded.palette[labels])
        overlay = np.asarray(Image.open(out / "overlay" / f"{stem}.png")).astype(int)
        pixels = np.asarray(Image.open(image).convert("RGB")).astype(int)
        assert np.abs(overlay - (pixels + colours) / 2).max() <= 1
    rows = (out / "predictions.csv").read_text().splitlines()
    assert rows[0] == "file,labels,shape,seconds,classes_present" and len(rows) == len(images) + 1
    # a second predict into the same folder keeps the first one's rows; rewritten outputs replace theirs
    other = tmp_path / "other"
    other.mkdir()
    (other / "extra.png").write_bytes(images[0].read_bytes())
    assert run_cli("predict", seg_run, other, "--out", out, "--no-progress").returncode == 0
    assert len((out / "predictions.csv").read_text().splitlines()) == len(images) + 2
    assert run_cli("predict", seg_run, other, "--out", out, "--overwrite", "--no-progress").returncode == 0
    assert len((out / "predictions.csv").read_text().splitlines()) == len(images) + 2


def test_nothing_is_overwritten_without_overwrite(seg_run, tmp_path):
    image = _val_images(seg_run)[0]
    out = tmp_path / "p"
    assert run_cli("predict", seg_run, image, "--out", out, "--no-progress").returncode == 0
    before = (out / f"{image.stem}.png").stat().st_mtime_ns
    refused = run_cli("predict", seg_run, image, "--out", out, "--no-progress")
    err = refused.stderr.strip()
    assert refused.returncode == 1
    assert err.startswith("error: ") and "already exists" in err and "--overwrite" in err and "\n" not in err
    assert (out / f"{image.stem}.png").stat().st_mtime_ns == before
    assert run_cli("predict", seg_run, image, "--out", out, "--overwrite", "--no-progress").returncode == 0


def test_a_bad_file_stops_with_one_line_or_is_skipped_with_keep_going(seg_run, tmp_path):
    good = _val_images(seg_run)[0]
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a_good.png").write_bytes(good.read_bytes())
    (folder / "b_broken.png").write_bytes(b"not a png at all")
    Image.fromarray(np.zeros((8, 8, 4), np.uint8)).save(folder / "c_rgba.png")  # converted to RGB: fine
    result = run_cli("predict", seg_run, folder, "--out", tmp_path / "o1", "--no-progress")
    code, err = result.returncode, result.stderr.strip().splitlines()
    assert code == 1 and err[-1].startswith("error: ") and "b_broken.png" in err[-1] and "--keep-going" in err[-1]
    result = run_cli(
        *["predict", str(seg_run), str(folder), "--out", str(tmp_path / "o2"), "--keep-going", "--no-progress"]
    )
    code, err = result.returncode, result.stderr
    assert code == 1 and "skipped: " in err and "1 of 3 inputs failed" in err
    assert (tmp_path / "o2" / "a_good.png").is_file() and (tmp_path / "o2" / "c_rgba.png").is_file()
    assert not (tmp_path / "o2" / "b_broken.png").exists()


@pytest.mark.parametrize(
    "args, message, exit_code",
    [
        (["nothing/here*.png"], "no such file, folder or matching glob", 1),
        (["nothing/here.png"], "input 'nothing/here.png' does not exist", 2),
        (["--scales", "1,x"], "--scales takes numbers", 2),
        (["--scales", "0"], "--scales takes numbers in [0.125, 8]", 2),
        (["--scales", "0,1"], "--scales takes numbers in [0.125, 8]", 2),
        (["--probabilities", "nifti"], "--probabilities nifti is for volumes", 2),
        (["--device", "tpu"], "--device must be cpu, cuda or auto, got 'tpu'", 2),
    ],
)
def test_bad_predict_arguments_give_one_line(seg_run, tmp_path, args, message, exit_code):
    image = str(_val_images(seg_run)[0])
    inputs = [a for a in args if not a.startswith("-") and "/" in a] or [image]
    options = [a for a in args if a not in inputs]
    result = run_cli("predict", seg_run, *inputs, "--out", tmp_path / "o", "--no-progress", *options)
    code, err = result.returncode, result.stderr.strip()
    assert code == exit_code and err.startswith("error: ") and message in err and "\n" not in err


def test_a_volume_file_given_to_a_2d_model_is_named(seg_run, tmp_path):
    volume = tmp_path / "case.nii.gz"
    volume.write_bytes(b"")
    predictor = Predictor(load_model(seg_run))
    with pytest.raises(DataError, match=r"case.nii.gz: a 2D model predicts images"):
        predictor.predict(str(volume))


def test_sliding_window_tta_and_scales_keep_the_input_size(seg_run):
    loaded = load_model(seg_run)
    image = np.random.default_rng(0).integers(0, 255, (70, 150, 3), dtype=np.uint8)
    plain = Predictor(loaded, window="off").predict(image)
    windowed = Predictor(loaded, window="auto", probabilities=True).predict(image)
    tta = Predictor(loaded, tta="flip", scales=(0.75, 1.0, 1.25), probabilities=True).predict(image)
    assert plain.labels.shape == windowed.labels.shape == tta.labels.shape == (70, 150)
    for p in (windowed.probabilities, tta.probabilities):
        assert p.shape == (19, 70, 150)
        np.testing.assert_allclose(p.sum(0), 1.0, atol=1e-5)
    # flip TTA of a mirrored image is the mirrored prediction
    flip = Predictor(loaded, tta="flip", probabilities=True)
    np.testing.assert_allclose(
        flip.predict(image[:, ::-1].copy()).probabilities, flip.predict(image).probabilities[:, :, ::-1], atol=1e-5
    )


def test_predictor_refuses_bad_options(seg_run):
    loaded = load_model(seg_run)
    with pytest.raises(ConfigError, match="tta must be 'flip'"):
        Predictor(loaded, tta="rotate")
    with pytest.raises(ConfigError, match="window must be 'auto', 'on' or 'off'"):
        Predictor(loaded, window="sometimes")
    cases = [
        ({"scales": "1"}, r"scales must be a non-empty sequence of numbers such as \(0.75, 1.0, 1.25\), got '1'"),
        ({"scales": [1e-6]}, r"scales must be numbers in \[0.125, 8\], got 1e-06"),
        ({"scales": [True]}, r"scales must be numbers in \[0.125, 8\], got True"),
        ({"window_batch": -1}, "window_batch must be a whole number >= 1"),
        ({"overlap": 1.0}, r"overlap must be a number in \[0, 1\), got 1.0"),
        ({"device": "tpu"}, "device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            Predictor(loaded, **kwargs)


@pytest.fixture(scope="module")
def volume_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vol")
    recipe = small_volume_recipe(str(root / "cache"))
    train(parse_recipe(recipe), root / "run", progress=False)
    return root / "run"


@pytest.mark.slow
def test_mni152_through_a_3d_run_keeps_the_source_grid(volume_run, tmp_path):
    import nibabel as nib
    from nilearn.datasets import load_mni152_template

    source = tmp_path / "mni.nii.gz"
    nib.save(load_mni152_template(resolution=2), str(source))
    out = tmp_path / "out"
    loaded = load_model(volume_run)
    predictor = Predictor(loaded, probabilities=True, resample=False)  # resampling: tests/test_resampling.py
    with pytest.warns(UserWarning, match=r"mni.nii.gz: voxel spacing \(2.0, 2.0, 2.0\) mm differs by more than 10 %"):
        predict_files(predictor, [source], PredictOptions(out, probabilities="nifti", num_workers=0, progress=False))
    written, original = nib.load(str(out / "mni.nii.gz")), nib.load(str(source))
    assert written.shape == original.shape and np.allclose(written.affine, original.affine)
    assert written.get_data_dtype() == np.uint8
    labels = np.asarray(written.dataobj)
    assert set(np.unique(labels)) <= {0, 1, 2, 3}
    probabilities = nib.load(str(out / "probabilities" / "mni.nii.gz"))
    assert probabilities.shape == (*original.shape, 4) and probabilities.get_data_dtype() == np.float32
    np.testing.assert_array_equal(np.asarray(probabilities.dataobj).argmax(-1), labels)


def test_matching_spacing_gives_no_warning(volume_run, tmp_path):
    from upzoo.data.volumes import write_nifti

    loaded = load_model(volume_run)
    path = tmp_path / "case.nii.gz"
    write_nifti(path, np.random.default_rng(0).normal(size=(8, 20, 20)).astype(np.float32), loaded.spacing)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        predict_files(Predictor(loaded), [path], PredictOptions(tmp_path / "o", num_workers=0, progress=False))
    assert nib_shape(tmp_path / "o" / "case.nii.gz") == (20, 20, 8)


def nib_shape(path: Path) -> tuple[int, ...]:
    import nibabel as nib

    return nib.load(str(path)).shape


def test_decathlon_dataset_json_test_list(volume_run, tmp_path):
    from upzoo.data.volumes import write_nifti

    loaded = load_model(volume_run)
    (tmp_path / "imagesTs").mkdir()
    for name in ("x1", "x2"):
        write_nifti(tmp_path / "imagesTs" / f"{name}.nii.gz", np.ones((8, 16, 16), np.float32), loaded.spacing)
    (tmp_path / "dataset.json").write_text(json.dumps({"test": ["./imagesTs/x1.nii.gz", "./imagesTs/x2.nii.gz"]}))
    summary = predict_files(
        Predictor(loaded), [tmp_path / "dataset.json"], PredictOptions(tmp_path / "o", num_workers=0, progress=False)
    )
    assert summary["written"] == 2 and (tmp_path / "o" / "x2.nii.gz").is_file()


@pytest.fixture(scope="module")
def gan_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gan")
    recipe = {
        "model": {
            "architecture": "dcgan",
            "latent_dim": 8,
            "out_channels": 3,
            "resolution": 16,
            "base_channels": 4,
            "post_filter": "masked_blur",
            "post_filter_options": {"threshold": 0.5},
        },
        "data": {
            "synthetic_train": 4,
            "synthetic_val": 1,
            "synthetic_size": [32, 64],
            "batch_size": 2,
            "num_workers": 0,
            "cache_dir": str(root / "cache"),
        },
        "train": {"max_steps": 1, "discriminator_base_channels": 4},
        "eval": {"features": None},
    }
    train(parse_recipe(recipe), root / "run", progress=False)
    return root / "run"


def test_sample_is_seeded_and_applies_the_post_filter(gan_run, tmp_path):
    from upzoo.filters import masked_gaussian_blur
    from upzoo.inference.sampling import generate

    assert run_cli("sample", gan_run, "--num", "5", "--out", tmp_path / "a", "--seed", "7").returncode == 0
    assert run_cli("sample", gan_run, "--num", "5", "--out", tmp_path / "b", "--seed", "7").returncode == 0
    for i in range(5):
        a, b = (np.asarray(Image.open(tmp_path / d / f"sample_{i:04d}.png")) for d in "ab")
        assert a.shape == (16, 16, 3)
        np.testing.assert_array_equal(a, b)
    assert Image.open(tmp_path / "a" / "grid.png").size[0] > 16
    loaded = load_model(gan_run)
    images = generate(loaded, 3, seed=7)
    z = torch.randn(3, 8, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        raw = loaded.model.stages(loaded.model.project(z))
    torch.testing.assert_close(images, masked_gaussian_blur(raw, threshold=0.5).clamp(-1, 1))


def test_sample_refuses_a_segmentation_run(seg_run, tmp_path):
    result = run_cli("sample", seg_run, "--out", tmp_path / "s")
    code, err = result.returncode, result.stderr.strip()
    assert code == 1 and "sample needs a GAN (dcgan) run" in err and "\n" not in err


def test_predict_refuses_a_gan_run(gan_run, tmp_path):
    result = run_cli("predict", gan_run, tmp_path, "--out", tmp_path / "o")
    code, err = result.returncode, result.stderr.strip()
    assert code == 1 and "is a gan run; Predictor segments with a segmentation run; sample its generator" in err


@pytest.mark.slow
def test_export_cli_verifies_onnx_and_the_exported_program(seg_run, tmp_path):
    result = run_cli("export", seg_run, "--out", tmp_path / "m.onnx", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    inputs = [c["input"] for c in report["checks"]]
    assert inputs == ["2x3x32x64", "1x3x33x65", "3x3x51x99"]  # the middle one is off the size grid
    assert all(c["ok"] and c["max_abs_diff"] <= 1e-4 for c in report["checks"])
    import onnxruntime as ort

    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    x = torch.randn(2, 3, 45, 77)
    with torch.no_grad():
        expected = load_model(seg_run).model(x).numpy()
    assert np.abs(session.run(None, {"input": x.numpy()})[0] - expected).max() < 1e-4
    result = run_cli("export", seg_run, "--format", "exported-program", "--json")
    assert result.returncode == 0 and (seg_run / "model.pt2").is_file()
    program = torch.export.load(str(seg_run / "model.pt2")).module()
    torch.testing.assert_close(program(x), torch.from_numpy(expected), atol=1e-5, rtol=0)


def test_volume_runs_log_hd95_and_surface_dice_and_2d_runs_the_boundary_fscore(volume_run, seg_run):
    header = (volume_run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header[-2:] == ["val_hd95", "val_surface_dice"]
    val = json.loads((volume_run / "summary.json").read_text())["val"]
    assert len(val["per_class_hd95"]) == 4 and 0 <= val["surface_dice"] <= 1
    header = (seg_run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header[-2:] == ["val_boundary_iou", "val_boundary_fscore"]
    val = json.loads((seg_run / "summary.json").read_text())["val"]
    assert 0 <= val["boundary_fscore"] <= 1 and len(val["per_class_boundary_fscore"]) == 19
