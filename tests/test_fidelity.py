"""Nothing silently wrong, nothing overwritten: inputs of every kind read right or refused, outputs
that never clobber, values checked where they enter, faults that leave a usable state. Each test
names the class of failure it guards (see docs/reliability.md)."""

from __future__ import annotations

import errno
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import nibabel as nib
import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from conftest import small_recipe
from upzoo import DCGANGenerator, UNet, masked_gaussian_blur
from upzoo.cli import main
from upzoo.data.io import read_image
from upzoo.data.volumes import read_volume
from upzoo.errors import ConfigError, DataError, ShapeError, TrainingError
from upzoo.inference import Predictor, load_model
from upzoo.metrics import mean_iou
from upzoo.models import plan_strides
from upzoo.recipe import load_recipe, parse_recipe, recipe_json_schema
from upzoo.runtime import FolderLock, atomic_write, remove_stale_temporaries
from upzoo.tables import to_json
from upzoo.train.engine import train
from upzoo.yaml_files import parse_yaml, read_yaml_file


def cli(*args: str) -> tuple[int, str]:
    """``upzoo ARGS`` in-process: (exit code, the last stderr line is read by the caller via capsys)."""
    try:
        main(list(args))
    except SystemExit as exc:
        return int(exc.code or 0), ""
    return 0, ""


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def run_dir(seg_run) -> Path:
    return seg_run  # the test run's shared trained run (tests/conftest.py)


def _image(run: Path) -> Path:
    return sorted((run.parent / "cache").rglob("leftImg8bit/val/**/*.png"))[0]


# -- 1. inputs of every kind, read right or refused -----------------------------------------------
def _rgb8(h: int = 6, w: int = 5) -> np.ndarray:
    return (np.arange(h * w * 3).reshape(h, w, 3) * 7 % 256).astype(np.uint8)


def test_sixteen_bit_grayscale_is_scaled_not_saturated(tmp_path):
    gray16 = (np.linspace(0, 65535, 48).reshape(6, 8)).astype(np.uint16)
    cv2.imwrite(str(tmp_path / "g16.png"), gray16)
    read = read_image(tmp_path / "g16.png")
    expected = np.rint(gray16 / 65535 * 255).astype(np.uint8)
    assert read.shape == (6, 8, 3) and read.dtype == np.uint8
    np.testing.assert_array_equal(read[..., 0], expected)
    assert (read == 255).mean() < 0.05  # convert("RGB") made > 99 % white
    np.testing.assert_array_equal(read_image(tmp_path / "g16.png", channels=1), expected)


def test_sixteen_bit_colour_float_and_palette_images(tmp_path):
    rgb16 = (np.random.default_rng(0).integers(0, 65536, (5, 7, 3))).astype(np.uint16)
    cv2.imwrite(str(tmp_path / "c16.png"), rgb16[..., ::-1])  # OpenCV writes BGR
    assert np.abs(read_image(tmp_path / "c16.png").astype(int) - rgb16 / 257).max() <= 1
    cv2.imwrite(str(tmp_path / "c16.tif"), rgb16[..., ::-1])
    assert np.abs(read_image(tmp_path / "c16.tif").astype(int) - rgb16 / 257).max() <= 1
    unit = np.random.default_rng(1).random((5, 7)).astype(np.float32)
    Image.fromarray(unit).save(tmp_path / "f.tif")  # a float TIFF in [0, 1]: was black
    np.testing.assert_array_equal(read_image(tmp_path / "f.tif")[..., 1], np.rint(unit * 255).astype(np.uint8))
    colour = np.random.default_rng(2).random((5, 7, 3)).astype(np.float32)
    cv2.imwrite(str(tmp_path / "f3.tif"), colour[..., ::-1])  # PIL cannot read it; OpenCV can
    np.testing.assert_array_equal(read_image(tmp_path / "f3.tif"), np.rint(colour * 255).astype(np.uint8))
    rgb = _rgb8()
    Image.fromarray(rgb).quantize(16).save(tmp_path / "p.png")
    palette = read_image(tmp_path / "p.png")
    np.testing.assert_array_equal(palette, np.asarray(Image.open(tmp_path / "p.png").convert("RGB")))
    Image.fromarray(np.dstack([rgb, np.full(rgb.shape[:2], 7, np.uint8)])).save(tmp_path / "rgba.png")
    np.testing.assert_array_equal(read_image(tmp_path / "rgba.png"), rgb)  # alpha dropped, colours kept
    Image.fromarray(rgb[..., 0] > 100).save(tmp_path / "bits.png")
    assert set(np.unique(read_image(tmp_path / "bits.png"))) <= {0, 255}


def test_exif_orientation_is_applied(tmp_path):
    rgb = _rgb8(4, 9)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    Image.fromarray(rgb).save(tmp_path / "o.png", exif=exif)
    read = read_image(tmp_path / "o.png")
    np.testing.assert_array_equal(read, np.rot90(rgb, -1))  # as a viewer shows it


@pytest.mark.parametrize(
    "array, message",
    [
        (np.full((4, 4), 1.5, np.float32), r"float pixels must lie in \[0, 1\], got values in \[1.5, 1.5\]"),
        (np.array([[0.5, np.nan]], np.float32), "1 pixel value\\(s\\) are NaN or infinite"),
        (np.full((4, 4), 70000, np.int32), r"32-bit integer pixels in \[70000, 70000\] are outside 0..65535"),
    ],
)
def test_images_that_cannot_be_read_right_are_refused(tmp_path, array, message):
    Image.fromarray(array).save(tmp_path / "bad.tif")
    with pytest.raises(DataError, match=message) as info:
        read_image(tmp_path / "bad.tif")
    assert "bad.tif" in str(info.value) and "\n" not in str(info.value)


def test_predictor_states_and_checks_the_value_range_of_arrays(run_dir):
    predictor = Predictor(load_model(run_dir))
    image = np.asarray(Image.open(_image(run_dir)).convert("RGB"))
    as_uint8 = predictor.predict(image).labels
    as_float = predictor.predict(image.astype(np.float32) / 255).labels  # was divided by 255 again
    as_uint16 = predictor.predict(image.astype(np.uint16) * 257).labels
    np.testing.assert_array_equal(as_float, as_uint8)
    np.testing.assert_array_equal(as_uint16, as_uint8)
    with pytest.raises(DataError, match="pixels of type int64 are not read"):
        predictor.predict(image.astype(np.int64) * 4)
    with pytest.raises(DataError, match=r"float pixels must lie in \[0, 1\], got values in \[0, 255\]"):
        predictor.predict(image.astype(np.float32))
    with pytest.raises(DataError, match="NaN or infinite"):
        predictor.predict(np.where(image > 100, np.nan, 0.5).astype(np.float32))
    with pytest.raises(ShapeError, match=r"expected prepared inputs \(N, 3, 2 sizes\), got \(3, 32, 64\)"):
        predictor.predict_batch(torch.zeros(3, 32, 64), (32, 64))
    with pytest.raises(ShapeError, match="size \\(the output size\\) must be 2 whole numbers >= 1"):
        predictor.predict_batch(torch.zeros(1, 3, 32, 64), (32,))


def test_volumes_with_nan_or_inf_are_refused_naming_the_file_and_count(tmp_path):
    volume = np.zeros((4, 5, 6), np.float32)
    volume[0, 0, :3] = [np.nan, np.inf, -np.inf]
    nib.save(nib.Nifti1Image(volume.transpose(2, 1, 0), np.eye(4)), str(tmp_path / "v.nii.gz"))
    with pytest.raises(DataError, match=r"v.nii.gz: 3 of 120 voxels are NaN or infinite"):
        read_volume(tmp_path / "v.nii.gz")
    from upzoo.inference.files import read_input

    with pytest.raises(DataError, match="3 of 120 voxels are NaN or infinite"):
        read_input(tmp_path / "v.nii.gz", volumes=True, channels=1)


def test_mixed_sizes_with_a_resize_recipe_come_back_at_their_own_sizes(tmp_path):
    recipe = small_recipe(tmp_path / "cache", data={"resize": [32, 64]}, train={"max_steps": 1})
    train(parse_recipe(recipe), tmp_path / "run", progress=False)
    folder = tmp_path / "in"
    folder.mkdir()
    rng = np.random.default_rng(0)
    sizes = {"a": (20, 30), "b": (40, 50), "c": (20, 30), "d": (33, 17)}
    for name, size in sizes.items():
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(folder / f"{name}.png")
    assert cli("predict", str(tmp_path / "run"), str(folder), "--out", str(tmp_path / "o"), "--no-progress")[0] == 0
    for name, size in sizes.items():
        assert np.asarray(Image.open(tmp_path / "o" / f"{name}.png")).shape == size


# -- 2. outputs never clobber -------------------------------------------------------------------------
def test_inputs_whose_names_look_like_outputs_keep_their_own_outputs(run_dir, tmp_path):
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    image = _image(run_dir).read_bytes()
    for name in ("x.png", "x_color.png", "y_overlay.png", "sub/x.png"):
        (folder / name).write_bytes(image)
    out = tmp_path / "out"
    assert cli("predict", str(run_dir), str(folder), "--out", str(out), "--overlay", "--no-progress")[0] == 0
    labels = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.png"))
    assert labels == sorted(
        [f"{kind}{name}.png" for kind in ("", "color/", "overlay/") for name in ("x", "x_color", "y_overlay", "sub/x")]
    )
    for path in out.glob("*.png"):  # every label file is a label map, none was replaced by a colour image
        assert Image.open(path).mode == "L"


def test_collisions_and_inputs_inside_out_are_refused_before_anything_is_written(run_dir, tmp_path, capsys):
    image = _image(run_dir).read_bytes()
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "x.png").write_bytes(image)
    (tmp_path / "a" / "x.jpg").write_bytes(image)
    out = tmp_path / "o"
    args = ("predict", str(run_dir), str(tmp_path / "a" / "x.png"), str(tmp_path / "b" / "x.png"), "--out", str(out))
    assert cli(*args, "--no-progress")[0] == 1
    assert "would both write" in one_line_error(capsys) and not out.exists()  # not even an empty --out
    before = (tmp_path / "a" / "x.png").read_bytes()
    for extra in ((), ("--overwrite",)):  # --out holding the inputs: refused, the inputs stay as they were
        same = str(tmp_path / "a")
        assert cli("predict", str(run_dir), same, "--out", same, "--no-progress", *extra)[0] == 1
        assert "holds the input" in one_line_error(capsys)
        assert (tmp_path / "a" / "x.png").read_bytes() == before


def test_out_inside_an_input_folder_does_not_predict_its_own_outputs(run_dir, tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "x.png").write_bytes(_image(run_dir).read_bytes())
    out = folder / "pred"
    for extra in ((), ("--overwrite",)):
        assert cli("predict", str(run_dir), str(folder), "--out", str(out), "--no-progress", *extra)[0] == 0
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.png")) == ["color/x.png", "x.png"]


def test_two_predicts_into_one_out_cannot_interleave(run_dir, tmp_path, capsys):
    out = tmp_path / "o"
    (out / "color").mkdir(parents=True)
    (out / "color" / f".tmp-{2**22 + 7}-x.png").write_bytes(b"half")  # a killed predict's file
    with FolderLock(out, "busy", name=".predict.lock"):
        assert cli("predict", str(run_dir), str(_image(run_dir)), "--out", str(out), "--no-progress")[0] == 1
        assert "another upzoo predict is writing into" in one_line_error(capsys)
    assert cli("predict", str(run_dir), str(_image(run_dir)), "--out", str(out), "--no-progress")[0] == 0
    assert not list(out.rglob(".tmp-*"))  # the next predict into the folder removes it
    assert not (out / ".predict.lock").exists()  # the lock goes with the predict: the folder holds outputs


def test_a_transient_lock_is_never_shared_after_its_file_is_deleted(tmp_path):
    first = FolderLock(tmp_path, "busy", name=".l", transient=True)
    stale = os.open(tmp_path / ".l", os.O_RDWR)  # a newcomer that opened the file before it went
    first.release()
    assert not (tmp_path / ".l").exists()
    second = FolderLock(tmp_path, "busy", name=".l", transient=True)  # takes a new file
    import fcntl

    fcntl.flock(stale, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the old inode is free, but it is not the path's file
    assert os.fstat(stale).st_ino != os.stat(tmp_path / ".l").st_ino
    with pytest.raises(ConfigError, match="busy"):
        FolderLock(tmp_path, "busy", name=".l", transient=True)
    second.release()
    os.close(stale)


def test_export_never_replaces_a_checkpoint_or_an_existing_file(run_dir, tmp_path, capsys):
    last = run_dir / "last.pt"
    before = last.read_bytes()
    assert cli("export", str(run_dir), "--out", str(last))[0] == 1
    assert "an onnx export is written to a .onnx file" in one_line_error(capsys)
    assert cli("export", str(run_dir), "--out", str(last), "--overwrite")[0] == 1
    capsys.readouterr()
    assert last.read_bytes() == before
    existing = tmp_path / "model.onnx"
    existing.write_bytes(b"mine")
    assert cli("export", str(run_dir), "--out", str(existing))[0] == 1
    assert "already exists; pass --overwrite" in one_line_error(capsys)
    assert existing.read_bytes() == b"mine"


# -- 3. values checked where they enter -------------------------------------------------------------
@pytest.mark.parametrize(
    "text, message",
    [
        ("train: {lr: 0.1}\ntrain: {lr: 0.2}\n", "duplicate key 'train' at line 2 \\(first at line 1\\)"),
        ("a: &a [1,1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
         "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\n", "expands to more than 100,000"),
        ("a: " + "[" * 100_000 + "]" * 100_000, "nested more than 50 levels deep"),
        ("a: " + "[" * 60 + "]" * 60, "nested more than 50 levels deep"),
    ],
)  # fmt: skip
def test_yaml_that_would_be_read_wrong_or_explode_is_refused(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_yaml(text, "recipe.yaml")


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lr=true", "train.lr: expected a number, got True \\(a boolean\\)"),
        ("train.seed=9223372036854775808", "train.seed: input should be less than or equal to 9223372036854775807"),
        ("model.channels=[]", "channels is an empty list"),
        ("data.crop_size=[true, 32]", "data.crop_size: expected a list of numbers"),
    ],
)
def test_recipe_values_are_not_reinterpreted(tmp_path, override, message):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(small_recipe(tmp_path / "cache")))
    with pytest.raises(ConfigError, match=message):
        load_recipe(path, [override])


def test_a_fifo_or_a_huge_recipe_is_refused_at_once(tmp_path, capsys):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="is not a regular file"):
        read_yaml_file(fifo)
    assert time.perf_counter() - start < 5
    huge = tmp_path / "huge.yaml"
    huge.write_text("model: {architecture: '" + "x" * 5_000_000 + "'}\n")
    with pytest.raises(ConfigError, match="is 5.0 MB; a recipe is a small YAML file"):
        read_yaml_file(huge)
    value = tmp_path / "value.yaml"
    value.write_text("model: {architecture: unet, num_classes: '" + "y" * 900_000 + "'}\n")
    assert cli("recipe", "show", str(value))[0] == 1
    assert len(one_line_error(capsys)) < 1200  # the bad value is not echoed back whole


def test_public_constructors_and_functions_check_their_arguments():
    with pytest.raises(ConfigError, match="UNet channels is an empty list"):
        UNet(spatial_dims=2, in_channels=3, num_classes=2, channels=[])
    with pytest.raises(
        ConfigError, match=r"stage 0: TransposedConvUpsampler maps size 5 to 9x9, the model needs exactly 10x10"
    ):
        DCGANGenerator(
            latent_dim=16,
            out_channels=3,
            resolution=32,
            upsampler="transposed",
            upsampler_options={"kernel_size": 3, "padding": 1},
        )
    uneven = {"upsampler": "transposed", "upsampler_options": {"kernel_size": 3, "padding": 1, "output_padding": 1}}
    for kwargs in ({"upsampler": "interp_conv"}, uneven):
        for resolution in (8, 16, 32, 64):
            with pytest.warns() if "upsampler_options" in kwargs else _no_warning():
                g = DCGANGenerator(latent_dim=8, out_channels=3, resolution=resolution, base_channels=4, **kwargs)
            assert g(torch.randn(2, 8)).shape == (2, 3, resolution, resolution)
    with pytest.raises(ConfigError, match=r"spacing must be positive finite voxel sizes in mm, .* got \(nan"):
        plan_strides((math.nan, 1.0, 1.0), (8, 8, 8))
    with pytest.raises(ConfigError, match="patch_size must be whole numbers >= 1 \\(one per axis\\), got \\(8.5"):
        plan_strides((1.0, 1.0, 1.0), (8.5, 8, 8))
    with pytest.raises(ConfigError, match="min_size must be a whole number >= 1, got 0"):
        plan_strides((1.0, 1.0, 1.0), (8, 8, 8), min_size=0)
    with pytest.raises(ConfigError, match="num_classes must be a whole number >= 1, got '3' \\(str\\)"):
        mean_iou(torch.tensor([0]), torch.tensor([0]), "3")
    miou, per_class = mean_iou(np.array([0, 1, 1]), np.array([0, 1, 255]), 3)  # NumPy input works
    assert miou == 1.0 and per_class.dtype == torch.float64
    x = torch.rand(1, 1, 8, 8)
    for mask, shown in ((torch.full_like(x, 5.0), r"\[5, 5\]"), (torch.full_like(x, math.nan), "NaN")):
        with pytest.raises(
            ConfigError, match=f"a float mask holds blend weights in \\[0, 1\\], got values in .*{shown}"
        ):
            masked_gaussian_blur(x, mask=mask)
    with pytest.raises(DataError, match="load_model takes a run folder or checkpoint path, got None"):
        load_model(None)


class _no_warning:  # noqa: N801
    def __enter__(self):
        import warnings

        self.catcher = warnings.catch_warnings()
        self.catcher.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc):
        self.catcher.__exit__(*exc)


def test_load_model_refuses_an_unknown_device(run_dir):
    with pytest.raises(ConfigError, match="device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'tpu'"):
        load_model(run_dir, device="tpu")


# -- 4. messages, exit codes, JSON and the schema -----------------------------------------------------
def test_infinite_values_in_json_are_distinguishable_from_nan():
    text = to_json({"hd95": math.inf, "nsd": math.nan, "low": -math.inf}, indent=None)
    assert json.loads(text) == {"hd95": "inf", "nsd": None, "low": "-inf"}
    assert float(json.loads(text)["hd95"]) == math.inf


def test_eval_accepts_a_run_folder_and_names_a_checkpoint_of_another_recipe(run_dir, tmp_path, capsys):
    assert cli("eval", str(run_dir), "--json")[0] == 0
    result = json.loads(capsys.readouterr().out)
    assert result["checkpoint"].endswith("best.pt") and "road" in result["per_class_iou"]
    volumes = {
        "model": {"architecture": "unet", "spatial_dims": 3, "in_channels": 1, "num_classes": 4, "channels": [4, 8]},
        "data": {"kind": "volumes", "synthetic_train": 2, "synthetic_val": 1, "synthetic_size": [8, 16, 16],
                 "crop_size": [8, 16, 16], "num_workers": 0, "cache_dir": str(tmp_path / "cache")},
    }  # fmt: skip
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump(volumes))
    assert cli("eval", str(path), "--checkpoint", str(run_dir / "last.pt"))[0] == 1
    message = one_line_error(capsys)
    assert "does not fit this recipe's data" in message and "trained with another recipe" in message
    assert cli("eval", str(path))[0] == 2
    assert "evaluating a RECIPE needs --checkpoint" in one_line_error(capsys)


@pytest.mark.slow
def test_the_schema_accepts_exactly_what_the_loader_accepts(tmp_path):
    import jsonschema

    schema = recipe_json_schema()
    assert schema["$schema"].endswith("2020-12/schema")
    recipes = sorted(Path(__file__).parent.parent.glob("recipes/*.yaml"))
    assert recipes
    for path in recipes:
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)  # the file as shipped
        jsonschema.validate(load_recipe(path).to_dict(), schema)  # what `upzoo recipe show` prints
    minimal = {"model": {"spatial_dims": 2, "in_channels": 3, "num_classes": 3}}  # architecture defaults to unet
    parse_recipe(minimal)
    jsonschema.validate(minimal, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"model": {}, "train": {"lr": True}}, schema)  # a boolean is not a number


def test_the_schema_names_each_architectures_own_model_keys():
    """An editor offers and checks the keys each architecture takes (its constructor's), not only
    ``architecture``: a misspelled key, or one of another architecture, is refused as the loader refuses it."""
    import jsonschema

    schema = recipe_json_schema()
    keys = {c["if"]["properties"]["architecture"]["const"]: c["then"] for c in schema["properties"]["model"]["allOf"]}
    assert {"through_plane_upsampler", "strides"} <= set(keys["through_plane_unet"]["properties"])
    assert {"backbone", "weights", "layer", "upsampler_run"} <= set(keys["linear_probe"]["properties"])
    assert "last_upsampler" in keys["dcgan"]["properties"] and keys["dcgan"]["additionalProperties"] is False
    tissue = yaml.safe_load(Path("recipes/mni152_tissue_x4_transposed.yaml").read_text())
    jsonschema.validate(tissue, schema)
    for wrong in ({"through_plane_upsamplr": "fir"}, {"backbone": "resnet18"}, {"channels": "wide"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**tissue, "model": {**tissue["model"], **wrong}}, schema)
    unet = {"model": {"spatial_dims": 2, "in_channels": 3, "num_classes": 3, "backbone": "x"}}  # no architecture: unet
    with pytest.raises(jsonschema.ValidationError, match="'backbone' was unexpected"):
        jsonschema.validate(unet, schema)


# -- 5. faults leave a usable state -----------------------------------------------------------------
def test_a_run_killed_before_its_first_checkpoint_can_be_started_again(tmp_path):
    recipe = parse_recipe(small_recipe(tmp_path / "cache"))
    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("recipe.yaml", "run.json", "metrics.csv"):  # what kill -9 during the first save leaves
        (folder / name).write_text("left over\n")
    (folder / f".tmp-{2**22 + 12345}-last.pt").write_bytes(b"half a checkpoint")
    with pytest.warns(UserWarning, match="stopped before its first checkpoint; starting it again"):
        train(recipe, folder, progress=False)
    assert (folder / "last.pt").is_file() and not list(folder.glob(".tmp-*"))
    assert "left over" not in (folder / "metrics.csv").read_text()


def test_resume_refuses_an_edited_recipe(tmp_path):
    recipe = parse_recipe(small_recipe(tmp_path / "cache"))
    folder = tmp_path / "run"
    train(recipe, folder, progress=False)
    stored = yaml.safe_load((folder / "recipe.yaml").read_text())
    assert "act" not in stored["model"]  # the default, relu
    stored["model"]["act"] = "gelu"
    (folder / "recipe.yaml").write_text(yaml.safe_dump(stored))
    from upzoo.train.resume import resume_recipe

    resumed = resume_recipe(folder, overrides=["train.max_steps=2"])
    with pytest.raises(
        TrainingError,
        match=r"trained with another model than the run's recipe.yaml now holds \(model.act: None there, 'gelu' here",
    ):
        train(resumed, folder, resume=True, progress=False)


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("old")

    def full_disk(tmp: Path) -> None:
        tmp.write_text("partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(DataError, match="cannot write .*summary.json: No space left on device; free space there"):
        atomic_write(target, full_disk)
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
    (tmp_path / f".tmp-{2**22 + 1}-x.png").write_bytes(b"")  # a dead writer's file
    (tmp_path / f".tmp-{os.getpid()}-y.png").write_bytes(b"")  # a live one's: kept
    assert remove_stale_temporaries(tmp_path) == 1


def test_random_bytes_are_not_reported_as_a_pickled_payload(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "best.pt").write_bytes(np.random.default_rng(0).bytes(4096))
    assert cli("predict", str(folder), str(tmp_path), "--out", str(tmp_path / "o"))[0] == 1
    message = one_line_error(capsys)
    assert "is not a PyTorch checkpoint" in message and "objects other than tensors" not in message


def test_an_interrupted_comparison_cell_is_continued_and_a_foreign_one_refused(tmp_path):
    from upzoo.prepare import prepare
    from upzoo.runs.state import run_state as _finished

    recipe = parse_recipe(small_recipe(tmp_path / "cache"))
    prepared = prepare(recipe)
    folder = tmp_path / "cell"
    assert _finished(folder, prepared) == ("new", None)
    train(recipe, folder, progress=False)
    state, summary = _finished(folder, prepared)
    assert state == "done" and isinstance(summary["val"]["per_class_iou"], dict)
    (folder / "summary.json").write_text('{"steps": 1, "val": {"miou"')  # cut short
    assert _finished(folder, prepared) == ("resume", None)
    other = prepare(parse_recipe(small_recipe(tmp_path / "cache", train={"lr": 0.5})))
    with pytest.raises(ConfigError, match="holds a run of another recipe \\(train.lr: 0.001 there, 0.5 here\\)"):
        _finished(folder, other)


@pytest.mark.slow
def test_sigterm_stops_predict_and_its_workers(run_dir, tmp_path):
    import psutil

    folder = tmp_path / "many"
    folder.mkdir()
    image = _image(run_dir).resolve()
    for i in range(4000):  # far more work than any machine does between the workers' start and the signal
        (folder / f"{i:04d}.png").symlink_to(image)
    process = subprocess.Popen(
        [sys.executable, "-m", "upzoo", "predict", str(run_dir), str(folder), "--out", str(tmp_path / "o"),
         "--workers", "2", "--no-progress"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    parent = psutil.Process(process.pid)
    deadline = time.time() + 60
    while time.time() < deadline and len(parent.children(recursive=True)) < 2 and process.poll() is None:
        time.sleep(0.1)
    children = parent.children(recursive=True)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive and "Traceback" not in err
    assert not list((tmp_path / "o").rglob(".tmp-*"))
