"""Super-resolution end to end: recipes and their bad values, training (with and without the
adversarial term), eval, predict (tiled equals whole, 16-bit in and out) and export."""

from __future__ import annotations

import json
import math

import cv2
import numpy as np
import pytest
import torch

from conftest import run_cli
from upzoo.errors import ConfigError, DataError, ShapeError
from upzoo.inference.tiled_upscaling import read_unit_image, receptive_radius, tiled_output, upscale
from upzoo.models import EDSR, ESPCN, RRDBNet
from upzoo.prepare import prepare
from upzoo.recipe import load_recipe, parse_recipe
from upzoo.train.engine import train

pytest.importorskip("skimage")


def sr_recipe(**changes) -> dict:
    recipe = {
        "model": {"architecture": "espcn", "scale": 2, "channels": [8, 8]},
        "data": {"kind": "package_images", "package_train": ["chelsea"], "package_val": ["coffee"],
                 "crop_size": [48, 48], "patches_per_image": 2, "batch_size": 2, "num_workers": 0},
        "train": {"max_steps": 2, "log_every": 1},
    }  # fmt: skip
    for key, value in changes.items():
        section, _, name = key.partition("__")
        recipe[section][name] = value
    return recipe


def _write(path, recipe: dict):
    import yaml

    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture(scope="module")
def sr_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sr") / "run"
    train(parse_recipe(sr_recipe()), folder, progress=False)
    return folder


def test_training_writes_a_run_with_per_image_metrics_beside_bicubic(sr_run):
    summary = json.loads((sr_run / "summary.json").read_text())
    val = summary["val"]
    assert val["images"] == 1 and val["per_image"][0]["image"] == "coffee"
    assert 25 < val["bicubic_psnr_y"] < 40 and 0 < val["bicubic_ssim_y"] < 1
    assert set(val) >= {"psnr_y", "ssim_y", "psnr_rgb", "spectral_error", "checkerboard"}
    assert (sr_run / "best.pt").is_file() and (sr_run / "predictions.png").is_file()


@pytest.mark.slow
def test_the_adversarial_option_trains_a_discriminator(tmp_path):
    summary = train(parse_recipe(sr_recipe(train__adversarial_weight=0.005)), tmp_path / "gan", progress=False)
    header = (tmp_path / "gan" / "metrics.csv").read_text().splitlines()[0]
    assert "loss_d" in header and "loss_adversarial" in header
    state = torch.load(tmp_path / "gan" / "last.pt", weights_only=True)
    assert "discriminator" in state and summary["steps"] == 2


def test_eval_prints_each_image_and_the_mean(sr_run):
    result = run_cli("eval", str(sr_run))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "coffee" in (result.stdout + result.stderr)
        and "mean" in (result.stdout + result.stderr)
        and "bicubic PSNR Y" in (result.stdout + result.stderr)
    )
    data = json.loads(run_cli("eval", str(sr_run), "--json").stdout)
    assert data["scale"] == 2 and data["per_image"][0]["image"] == "coffee"


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"data__crop_size": [49, 49]}, ConfigError, "not a multiple of the model's scale 2"),
        ({"data__package_val": ["astronot"]}, DataError, "did you mean 'astronaut'"),
        ({"data__normalize": "imagenet"}, ConfigError, "super-resolution takes pixels in"),
        ({"train__adversarial_weight": -1}, ConfigError, "adversarial_weight"),
        ({"data__crop_size": [4, 4]}, ConfigError, "too small for x2"),
        ({"data__package_train": ["chelsea", "coffee"]}, ConfigError,
         r"package_train and package_val share \['coffee'\]: a held-out photograph would be trained on"),
        ({"data__package_train": ["astronaut"], "data__package_val": None}, ConfigError,
         r"share \['astronaut'\]"),  # the default held-out set counts too
        ({"train__feature_ratios": []}, ConfigError, r"train.feature_ratios: .*at least 1 item"),
    ],
)  # fmt: skip
def test_bad_recipes_are_refused_in_one_line(changes, error, message):
    with pytest.raises(error, match=message):
        prepare(parse_recipe(sr_recipe(**changes)))


def test_bad_data_sources_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="package_train: names package photographs"):
        parse_recipe(sr_recipe(data__kind="images", data__root=str(tmp_path)))
    with pytest.raises(ConfigError, match="package_images are found by name"):
        parse_recipe(sr_recipe(data__root=str(tmp_path)))
    recipe = sr_recipe(data__kind="images", data__root=str(tmp_path))
    del recipe["data"]["package_train"], recipe["data"]["package_val"]
    with pytest.raises(DataError, match="train/ and val/ subfolders"):
        prepare(parse_recipe(recipe))
    with pytest.raises(ConfigError, match="train.adversarial_weight is read by super_resolution recipes only"):
        parse_recipe(
            {"model": {"spatial_dims": 2, "in_channels": 3, "num_classes": 2}, "train": {"adversarial_weight": 0.1}}
        )


def test_an_image_smaller_than_the_crop_is_named(tmp_path):
    for split in ("train", "val"):
        (tmp_path / split).mkdir()
        cv2.imwrite(str(tmp_path / split / "small.png"), np.full((40, 40, 3), 128, np.uint8))
    recipe = sr_recipe(data__kind="images", data__root=str(tmp_path))
    del recipe["data"]["package_train"], recipe["data"]["package_val"]
    with pytest.raises(DataError, match=r"small.png: the image is 40x40, smaller than the training crop 48x48"):
        prepare(parse_recipe(recipe))
    result = run_cli("train", "--out", str(tmp_path / "run"), str(_write(tmp_path / "r.yaml", recipe)))
    assert result.returncode == 1 and "smaller than the training crop" in result.stderr
    assert not (tmp_path / "run").exists()  # refused before the run folder is made
    from upzoo.data.super_resolution import SuperResolutionImages

    with pytest.raises(DataError, match=r"small.png: the image is 40x40, smaller than what x12 can be measured on"):
        SuperResolutionImages([tmp_path / "val" / "small.png"], 12, 3)


@pytest.mark.parametrize(
    "net",
    [
        lambda: EDSR(scale=2, channels=8, num_blocks=2, upsampler="carafe"),
        lambda: RRDBNet(scale=4, channels=8, num_blocks=1, growth=4, upsampler="dysample"),
        lambda: ESPCN(scale=3, channels=(8, 8)),
    ],
)
def test_tiles_stitch_to_the_whole_image_result(net):
    torch.manual_seed(0)
    model = net().eval()
    scale = model.scale
    radius = receptive_radius(model, 3, scale)
    tile = 2 * radius + 10
    image = torch.rand(3, 3 * tile + 1, 3 * tile + 7, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = model(image[None])[0]
    tiled = upscale(model, image, scale, tile=tile)  # the halo defaults to the receptive radius
    assert tiled.shape == whole.shape
    assert (tiled - whole).abs().max() <= 1e-5
    assert torch.equal(upscale(model, image, scale, tile=tile, halo=radius), tiled)
    short = tiled_output(model, image, scale, tile, 0, torch.device("cpu"))  # what a halo of 0 would give:
    assert (short - whole).abs().max() > 1e-4  # seams, so the comparison above can fail
    with pytest.raises(
        ConfigError, match=rf"upscale: halo 0 is smaller than this model's receptive radius \({radius} "
    ):
        upscale(model, image, scale, tile=tile, halo=0)


def test_the_receptive_radius_is_measured_once_per_model_until_its_weights_change(monkeypatch):
    from upzoo.inference import tiled_upscaling

    model = ESPCN(scale=2, channels=(4, 4)).eval()
    calls = []
    measure = tiled_upscaling._measured_radius
    monkeypatch.setattr(tiled_upscaling, "_measured_radius", lambda *a: calls.append(a) or measure(*a))
    image = torch.rand(3, 40, 40, generator=torch.Generator().manual_seed(0))
    first = upscale(model, image, 2, tile=30)
    assert torch.equal(upscale(model, image, 2, tile=30), first) and len(calls) == 1
    radius = receptive_radius(model, 3, 2)
    assert len(calls) == 1 and radius == measure(model, 3, 2)
    with torch.no_grad():
        next(model.parameters()).mul_(0.5)  # weights changed in place: measured again
    receptive_radius(model, 3, 2)
    assert len(calls) == 2
    other = ESPCN(scale=2, channels=(4, 4)).eval()
    receptive_radius(other, 3, 2)
    assert len(calls) == 3  # another model is measured on its own


@pytest.mark.parametrize(
    "image, options, error, message",
    [
        (torch.randint(0, 255, (3, 40, 40), dtype=torch.uint8), {}, ConfigError,
         r"upscale: image must be floats in \[0, 1\], got torch.uint8; convert with image.float\(\) / 255"),
        (torch.rand(3, 40, 40) * 255, {}, ConfigError, r"upscale: image must be in \[0, 1\], got values in \[0"),
        (torch.full((3, 40, 40), float("nan")), {}, ConfigError, r"upscale: image: 4800 of 4800 values are NaN"),
        (torch.rand(1, 3, 40, 40), {}, ShapeError, r"image must be a \(C, H, W\) tensor, got \(1, 3, 40, 40\)"),
        (torch.rand(1, 40, 40), {}, ShapeError, "upscale: this model takes 3 channels, the image has 1"),
        (torch.rand(3, 40, 40), {"tile": 16.5}, ConfigError, r"upscale: tile must be a whole number >= 1, got 16.5"),
        (torch.rand(3, 40, 40), {"tile": 32, "halo": -3}, ConfigError, r"upscale: halo must be a whole number >= 0"),
        (torch.rand(3, 40, 40), {"tile": 8, "halo": 5}, ConfigError, r"tile 8 keeps nothing of a halo of 5 .*>= 11"),
    ],
)  # fmt: skip
def test_upscale_refuses_bad_input_in_one_line(image, options, error, message):
    with pytest.raises(error, match=message):
        upscale(ESPCN(scale=2, channels=(8, 8)), image, 2, **options)


def test_a_scale_the_model_was_not_trained_for_is_refused(sr_run):
    with pytest.raises(ConfigError, match="upscales x3, not x2"):
        upscale(ESPCN(scale=3), torch.rand(3, 8, 8), 2)
    result = run_cli("eval", str(sr_run), "--set", "model.scale=4")
    assert result.returncode == 1 and "upscales x2, the recipe asks for x4" in result.stderr


def test_predict_upscales_16_bit_in_and_out_and_tiles(sr_run, tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    rng = np.random.default_rng(0)
    cv2.imwrite(str(inputs / "deep.png"), rng.integers(0, 65536, (40, 50, 3), dtype=np.uint16))
    cv2.imwrite(str(inputs / "plain.png"), rng.integers(0, 256, (30, 20, 3), dtype=np.uint8))
    result = run_cli("predict", str(sr_run), str(inputs), "--out", str(tmp_path / "whole"), "--no-progress")
    assert result.returncode == 0, result.stdout + result.stderr
    deep = cv2.imread(str(tmp_path / "whole" / "deep.png"), cv2.IMREAD_UNCHANGED)
    plain = cv2.imread(str(tmp_path / "whole" / "plain.png"), cv2.IMREAD_UNCHANGED)
    assert deep.dtype == np.uint16 and deep.shape == (80, 100, 3) and plain.dtype == np.uint8
    image, bits = read_unit_image(inputs / "deep.png", 3)
    assert bits == 16 and len(torch.unique(image)) > 256  # the 16-bit steps are kept, not rounded to 8
    tiled = run_cli("predict", str(sr_run), str(inputs), "--out", str(tmp_path / "tiled"), "--tile", "25",
                     "--no-progress")  # fmt: skip
    assert tiled.returncode == 0, tiled.stderr
    again = cv2.imread(str(tmp_path / "tiled" / "deep.png"), cv2.IMREAD_UNCHANGED).astype(int)
    assert np.abs(again - deep.astype(int)).max() <= 1  # equal up to the last bit of rounding


def test_predict_refuses_a_tile_below_the_receptive_field_and_segmentation_options(sr_run, tmp_path):
    image = tmp_path / "x.png"
    cv2.imwrite(str(image), np.zeros((20, 20, 3), np.uint8))
    result = run_cli("predict", str(sr_run), str(image), "--out", str(tmp_path / "o"), "--tile", "3")
    assert result.returncode == 1 and "--tile 3 keeps nothing of a halo of" in (result.stdout + result.stderr)
    assert "use --tile >= " in (result.stdout + result.stderr)
    assert "Traceback" not in (result.stdout + result.stderr) and not (tmp_path / "o").exists()
    result = run_cli("predict", str(sr_run), str(image), "--out", str(tmp_path / "o"), "--tta", "flip")
    assert result.returncode == 2 and "--tta is for segmentation runs" in (result.stdout + result.stderr)


def test_export_is_verified_at_three_sizes_with_the_pixel_shuffle_in_the_graph(sr_run, tmp_path):
    pytest.importorskip("onnxruntime")
    import onnx

    from upzoo.inference import load_model
    from upzoo.inference.export import export_model

    report = export_model(load_model(sr_run), "onnx", str(tmp_path / "sr.onnx"))
    assert len(report["checks"]) == 3 and all(c["ok"] for c in report["checks"])
    ops = {node.op_type for node in onnx.load(str(tmp_path / "sr.onnx")).graph.node}
    assert "DepthToSpace" in ops or {"Reshape", "Transpose"} <= ops
    assert report["contract"]["scale"] == "2"


def test_shapes_check_says_every_size_is_valid_and_the_output(tmp_path):
    import yaml

    recipe = tmp_path / "sr.yaml"
    recipe.write_text(yaml.safe_dump(sr_recipe(model__scale=3)))
    result = run_cli("shapes", "check", str(recipe), "--size", "37x41")
    assert result.returncode == 0 and "37x41: valid, output 111x123" in result.stdout
    assert json.loads(run_cli("shapes", "check", str(recipe), "--size", "5x6", "--json").stdout)["output"] == [15, 18]
    assert run_cli("shapes", "check", str(recipe), "--range", "9:4").returncode == 2


def test_16_bit_gray_and_rgba_inputs_are_read_at_full_precision(tmp_path):
    rng = np.random.default_rng(1)
    gray, rgba = rng.integers(0, 65536, (9, 7), dtype=np.uint16), rng.integers(0, 65536, (9, 7, 4), dtype=np.uint16)
    cv2.imwrite(str(tmp_path / "gray.png"), gray)
    cv2.imwrite(str(tmp_path / "rgba.png"), rgba)
    image, bits = read_unit_image(tmp_path / "gray.png", 3)
    assert (
        bits == 16
        and image.shape == (3, 9, 7)
        and torch.equal(image[0], torch.from_numpy(gray.astype(np.float32) / 65535.0))
    )
    image, bits = read_unit_image(tmp_path / "rgba.png", 3)  # alpha dropped, BGR -> RGB
    assert torch.equal(image[0], torch.from_numpy(rgba[..., 2].astype(np.float32) / 65535.0))


def test_a_flat_held_out_image_has_no_spectral_error_and_the_means_skip_it():
    from upzoo.train.super_resolution import _means, image_metrics

    flat = torch.zeros(1, 3, 40, 40)
    flat[..., :20, :] = 1.0  # two flat halves: rings of no power
    row = image_metrics(flat.clone(), flat, 2)
    assert math.isnan(row["spectral_error"]) and row["psnr_y"] == math.inf
    textured = torch.rand(1, 3, 40, 40, generator=torch.Generator().manual_seed(0))
    other = image_metrics(textured.flip(-1), textured, 2)
    means = _means([row, other])
    assert means["spectral_error"] == other["spectral_error"] and means["psnr_y"] == math.inf


def test_the_predictor_on_a_super_resolution_run_names_the_way_to_upscale(sr_run):
    from upzoo.inference import Predictor, load_model

    with pytest.raises(ConfigError, match=r"is a super_resolution run; .* upzoo.inference.upscale\(loaded.model"):
        Predictor(load_model(sr_run))


def test_a_finished_run_prints_its_result_beside_bicubic(sr_run, capsys):
    from upzoo.cli.train import _print_summary

    val = json.loads((sr_run / "summary.json").read_text())["val"]
    _print_summary(json.loads((sr_run / "summary.json").read_text()), load_recipe(sr_run / "recipe.yaml"))
    out = capsys.readouterr().out
    assert "perceptual" not in out
    assert (
        f"val PSNR Y: {val['psnr_y']:.2f} dB, SSIM Y {val['ssim_y']:.4f}  beside bicubic {val['bicubic_psnr_y']:.2f}"
        in out
    )
