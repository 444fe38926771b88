"""A sweep of bad command lines over every command: each must end in exactly one ``error:`` line on
stderr with the documented exit code (2: usage, 1: input), never a traceback, never "unexpected"
(a bug), never a hang, and must leave the files it was given as they were."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from conftest import run_cli, small_recipe
from upzoo.recipe import parse_recipe
from upzoo.train.engine import train


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, str]:
    """A segmentation run, a GAN run, a recipe, images and files of the wrong kind."""
    root = tmp_path_factory.mktemp("sweep")
    cache = root / "cache"
    seg = small_recipe(cache, model={"channels": [4, 8], "upsampler": "interpolate"})
    train(parse_recipe(seg), root / "seg", progress=False)
    gan = {
        "model": {"architecture": "dcgan", "latent_dim": 8, "out_channels": 3, "resolution": 16, "base_channels": 4},
        "data": {"kind": "images", "synthetic_train": 4, "synthetic_val": 1, "synthetic_size": [32, 64],
                 "batch_size": 2, "num_workers": 0, "cache_dir": str(cache)},
        "train": {"max_steps": 1},
        "eval": {"features": None},
    }  # fmt: skip
    train(parse_recipe(gan), root / "gan", progress=False)
    (root / "recipe.yaml").write_text(yaml.safe_dump(seg))
    (root / "images").mkdir()
    Image.fromarray(np.zeros((24, 40, 3), np.uint8)).save(root / "images" / "a.png")
    (root / "text.png").write_text("not an image")
    (root / "empty.yaml").write_text("")
    (root / "list.yaml").write_text("- 1\n- 2\n")
    (root / "binary.yaml").write_bytes(b"\x00\x01\x02")
    (root / "random.pt").write_bytes(np.random.default_rng(0).bytes(2048))
    names = {
        "seg": "seg",
        "gan": "gan",
        "recipe": "recipe.yaml",
        "images": "images",
        "text_png": "text.png",
        "empty": "empty.yaml",
        "listed": "list.yaml",
        "binary": "binary.yaml",
        "random_pt": "random.pt",
    }
    return {key: str(root / name) for key, name in names.items()} | {"root": str(root)}


# (arguments with {placeholders}, expected exit code, a fragment of the message)
CASES = [
    # predict
    ("predict {seg} {images} --out {root}/p1 --batch-size 0", 2, "--batch-size"),
    ("predict {seg} {images} --out {root}/p1 --workers -1", 2, "--workers"),
    ("predict {seg} {images} --out {root}/p1 --tta rotate", 2, "--tta"),
    ("predict {seg} {images} --out {root}/p1 --window maybe", 2, "--window"),
    ("predict {seg} {images} --out {root}/p1 --scales ''", 2, "--scales"),
    ("predict {seg} {images} --out {root}/p1 --scales 1,,2", 2, "--scales"),
    ("predict {seg} {images} --out {root}/p1 --scales nan", 2, "--scales"),
    ("predict {seg} {images} --out {root}/p1 --scales inf", 2, "--scales"),
    ("predict {seg} {images} --out {root}/p1 --scales 9", 2, "--scales"),
    ("predict {seg} {images} --out {root}/p1 --device gpu", 2, "--device"),
    ("predict {seg} {images} --out {root}/p1 --device cuda:x", 2, "--device"),
    ("predict {seg} {images} --out {root}/p1 --probabilities nifti", 2, "nifti is for volumes"),
    ("predict {seg} {root}/missing.png --out {root}/p1", 2, "does not exist"),
    ("predict {seg} {text_png} --out {root}/p1", 1, "text.png"),
    ("predict {seg} {recipe} --out {root}/p1", 1, "recipe.yaml"),
    ("predict {seg} {root}/nothing*.png --out {root}/p1", 1, "no such file, folder or matching glob"),
    ("predict {seg} {images} --out {images}", 1, "holds the input"),
    ("predict {seg} {images} --out {text_png}", 2, "--out"),
    ("predict {gan} {images} --out {root}/p1", 1, "is a gan run"),
    ("predict {random_pt} {images} --out {root}/p1", 1, "not a PyTorch checkpoint"),
    ("predict {root} {images} --out {root}/p1", 1, "holds no best.pt or last.pt"),
    ("predict {root}/nope {images} --out {root}/p1", 2, "does not exist"),
    ("predict {seg} --out {root}/p1", 2, "Missing argument"),
    ("predict {seg} {images}", 2, "--out"),
    # sample
    ("sample {gan} --out {root}/s1 --num 0", 2, "--num"),
    ("sample {gan} --out {root}/s1 --num 100001", 2, "--num"),
    ("sample {gan} --out {root}/s1 --seed -1", 2, "--seed"),
    ("sample {gan} --out {root}/s1 --seed 9223372036854775808", 2, "--seed"),
    ("sample {gan} --out {root}/s1 --device tpu", 2, "--device"),
    ("sample {seg} --out {root}/s1", 1, "needs a GAN"),
    ("sample {gan} --out {text_png}", 2, "--out"),
    # export
    ("export {seg} --format tflite", 2, "--format"),
    ("export {seg} --opset 7", 2, "--opset"),
    ("export {seg} --out {seg}/last.pt", 1, "written to a .onnx file"),
    ("export {seg} --out {seg}/m.pt2", 1, "written to a .onnx file"),
    ("export {seg} --format exported-program --out {seg}/m.onnx", 1, "written to a .pt2 file"),
    ("export {seg} --out {images}", 2, "--out"),
    ("export {random_pt}", 1, "not a PyTorch checkpoint"),
    # train
    ("train {recipe} --nproc 0", 2, "--nproc"),
    ("train {recipe} --set lr=1", 1, "--set takes section.key=value"),
    ("train {recipe} --set train.lr=true --out {root}/t1", 1, "train.lr: expected a number"),
    ("train {recipe} --set train.lr=-1 --out {root}/t1", 1, "train.lr"),
    ("train {recipe} --set train.lr=.nan --out {root}/t1", 1, "train.lr"),
    ("train {recipe} --set train.max_steps=0 --out {root}/t1", 1, "train.max_steps"),
    ("train {recipe} --set train.seed=-1 --out {root}/t1", 1, "train.seed"),
    ("train {recipe} --set train.seed=9223372036854775808 --out {root}/t1", 1, "train.seed"),
    ("train {recipe} --set train.optimizer=adamm --out {root}/t1", 1, "did you mean 'adam"),
    ("train {recipe} --set model.channels=[] --out {root}/t1", 1, "channels is an empty list"),
    ("train {recipe} --set model.num_classes=0 --out {root}/t1", 1, "num_classes"),
    ("train {recipe} --set model.upsampler=nope --out {root}/t1", 1, "nope"),
    ("train {recipe} --set data.batch_size=0 --out {root}/t1", 1, "data.batch_size"),
    ("train {recipe} --set data.crop_size=[true,8] --out {root}/t1", 1, "data.crop_size"),
    ("train {recipe} --set data.kind=volume --out {root}/t1", 1, "did you mean 'volumes'"),
    ("train {recipe} --set nosection.x=1 --out {root}/t1", 1, "unknown section"),
    ("train {empty} --out {root}/t1", 1, "no 'model' section"),
    ("train {listed} --out {root}/t1", 1, "a recipe is a mapping"),
    ("train {binary} --out {root}/t1", 1, "binary file"),
    ("train {recipe} --out {seg}", 1, "already holds a run"),
    ("train {recipe} --out {text_png}", 1, "is a file"),
    ("train --resume {images}", 1, "has no recipe.yaml: is it an upzoo run folder?"),
    ("train", 2, "give a RECIPE"),
    ("train {root}/missing.yaml", 2, "does not exist"),
    # eval
    ("eval {recipe}", 2, "needs --checkpoint"),
    ("eval {recipe} --checkpoint {gan}/last.pt", 1, "gan run"),
    ("eval {recipe} --checkpoint {random_pt}", 1, "not a PyTorch checkpoint"),
    ("eval {gan} --set eval.features=/no/such/run", 1, "eval.features: /no/such/run does not exist"),
    ("eval {gan} --set eval.gan_images=8", 1, "eval.gan_images: input should be greater than or equal to 16"),
    ("eval {images}", 1, "recipe.yaml"),
    # shapes
    ("shapes block transposed --input 1x3", 2, "--input needs (B, C, *spatial), got '1x3'"),
    ("shapes block transposed --input 1x3x0x4", 2, "--input"),
    ("shapes block transposed --input 1x3x4x4 --scale 0", 1, "scale"),
    ("shapes block transposed --input 1x3x4x4 --scale 1,2,2,2", 1, "scale"),
    ("shapes block transposed --input 1x3x4x4 -o kernel_size", 2, "key=value"),
    ("shapes block transposed --input 1x3x4x4 -o kernel_size=[", 1, "invalid YAML"),
    ("shapes block transposed --input 1x3x4x4 -o nope=1", 1, "has no option 'nope'"),
    ("shapes model {recipe} --input 1x4x64x64", 1, "expects 3 input channels"),
    ("shapes check {recipe}", 2, "give exactly one of --size and --range"),
    ("shapes check {recipe} --range 64", 2, "--range must look like"),
    ("shapes check {recipe} --range 64:32", 1, "range"),
    ("shapes check {recipe} --size 0x0", 2, "size"),
    ("shapes solve --in 4 --stride 2", 1, "give exactly one of out_size and scale"),
    ("shapes solve --in 0 --stride 2 --out 8", 2, "--in"),
    # bench
    ("bench blocks --shape 1x3", 1, "got (1, 3)"),
    ("bench blocks --shape 1x3x8x8 --scale x", 2, "--scale"),
    ("bench blocks --runs 0", 2, "--runs"),
    ("bench model {recipe} --input 1x3x0x8", 2, "--input"),
    ("bench model {recipe} --amp fp16", 1, "fp16"),
    ("bench compare {recipe} --upsamplers ,", 1, "--upsamplers"),
    ("bench compare {recipe} --upsamplers masked_blur", 1, "post-filter"),
    ("bench compare {recipe} --upsamplers nope", 1, "nope"),
    ("bench compare {recipe} --upsamplers transposed,,dysample", 1, "variant 2 of 3 is empty"),
    ("bench compare {recipe} --upsamplers interp_conv:mode=nearest:scale=3", 1, "sets scale=3, which the model sets"),
    ("bench compare {recipe} --upsamplers interpolate --plan-only --out {images}", 1, "holds no comparison plan"),
    ("bench compare {recipe} --upsamplers interpolate,transposed:nope=1 --out {root}/c1", 1, "variant"),
    ("bench compare {recipe} --seeds 0", 2, "--seeds"),
    ("bench compare {recipe} --baseline nope --upsamplers interpolate", 1, "--baseline"),
    ("bench compare {recipe} --upsamplers interpolate --devices abc --plan-only --out {root}/c2", 1, "--devices"),
    ("bench compare {recipe} --upsamplers interpolate --jobs 3 --devices 0 --out {root}/c3", 1, "--devices"),
    ("bench compare {recipe} --upsamplers dysample:groups=0 --plan-only --out {root}/c4", 1, "dysample groups"),
    ("bench compare {recipe} --upsamplers interpolate --launcher slurm --time 0 --out {root}/c5", 2, "--time"),
    ("bench compare {recipe} --upsamplers interpolate --launcher slurm --sbatch nokey --out {root}/c6", 2, "nokey"),
    ("bench compare {recipe} --upsamplers interpolate --rounds 1 --out {root}/c7", 2, "--rounds"),
    ("bench collect {images}", 1, "plan.json does not exist"),
    ("bench collect {recipe}", 2, "is a file"),
    # recipe and list
    ("recipe show {binary}", 1, "binary file"),
    ("recipe show {recipe} --set train.lr=true", 1, "train.lr"),
    ("list nope*", 1, "no block matches"),
    ("list --kind nope", 2, "--kind"),
    ("nope", 2, "No such command"),
]


def _fingerprint(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.parts[-2:-1] != ("cache",) and "cache" not in p.relative_to(root).parts
    }


@pytest.mark.parametrize("line, code, fragment", CASES, ids=[c[0][:60] for c in CASES])
def test_bad_command_lines_end_in_one_line(world, line, code, fragment):
    import shlex

    args = [part.format(**world) for part in shlex.split(line)]
    root = Path(world["root"])
    before = _fingerprint(root)
    result = run_cli(*args)
    err = result.stderr
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err and "unexpected" not in err, err
    assert result.returncode == code, (result.returncode, err)
    assert fragment in errors[0], errors[0]
    after = _fingerprint(root)
    assert {k: v for k, v in after.items() if k in before} == before  # nothing the user had was changed


def _api_cases():
    import torch

    from upzoo import DCGANGenerator, UNet, create_upsampler, masked_gaussian_blur
    from upzoo.inference import Predictor, load_model
    from upzoo.metrics import boundary_fscore, boundary_iou, hausdorff95, mean_iou, surface_dice
    from upzoo.models import plan_strides

    up = {"spatial_dims": 2, "in_channels": 8, "out_channels": 8}
    net = {"spatial_dims": 2, "in_channels": 3, "num_classes": 2}
    labels = torch.zeros(4, 4, dtype=torch.long)
    return [
        (lambda: create_upsampler("transposed", **{**up, "in_channels": "8"}, scale=2), "in_channels"),
        (lambda: create_upsampler("transposed", **up, scale=0), "scale"),
        (lambda: create_upsampler("transposed", **up, scale=True), "scale"),
        (lambda: create_upsampler("transposed", **up, scale=(1, 2, 2)), "scale"),
        (lambda: create_upsampler("transposed", **up, scale=2.5), "scale"),
        (lambda: create_upsampler(None, **up, scale=2), "upsampler"),
        (lambda: create_upsampler("pixel_shuffle", **up, scale=2, icnr="yes"), "icnr"),
        (lambda: UNet(**{**net, "spatial_dims": 4}), "spatial_dims"),
        (lambda: UNet(**{**net, "num_classes": 0}), "num_classes"),
        (lambda: UNet(**net, channels="abc"), "channels"),
        (lambda: UNet(**net, channels=[8, -1]), "channels[1]"),
        (lambda: UNet(**net, upsampler=["transposed"] * 7), "upsampler"),
        (lambda: UNet(**net, input_policy="crop"), "input_policy"),
        (lambda: DCGANGenerator(latent_dim=0, out_channels=3, resolution=32), "latent_dim"),
        (lambda: DCGANGenerator(latent_dim=8, out_channels=3, resolution=30), "resolution"),
        (lambda: DCGANGenerator(latent_dim=8, out_channels=3, resolution=True), "resolution"),
        (lambda: masked_gaussian_blur(np.zeros((1, 1, 4, 4))), "torch.Tensor"),
        (lambda: masked_gaussian_blur(torch.zeros(4, 4)), "(B, C, H, W)"),
        (lambda: masked_gaussian_blur(torch.zeros(1, 1, 4, 4, dtype=torch.long)), "floating-point"),
        (lambda: masked_gaussian_blur(torch.zeros(1, 1, 8, 8), sigma=-1.0), "sigma"),
        (lambda: masked_gaussian_blur(torch.zeros(1, 1, 8, 8), threshold="high"), "threshold"),
        (lambda: mean_iou(torch.tensor([0.5]), torch.tensor([0]), 2), "integer class indices"),
        (lambda: mean_iou(torch.tensor([0, 1]), torch.tensor([0]), 2), "differ in shape"),
        (lambda: mean_iou(torch.tensor([5]), torch.tensor([0]), 2), "labels must be in 0..1"),
        (lambda: mean_iou("abc", torch.tensor([0]), 2), "prediction must be a tensor or NumPy array"),
        (lambda: mean_iou(torch.tensor([0]), torch.tensor([0]), 2, ignore_index="x"), "ignore_index"),
        (lambda: boundary_iou(labels, labels, 0), "num_classes"),
        (lambda: boundary_fscore(labels, labels, 2.5), "num_classes"),
        (lambda: hausdorff95(np.zeros((4, 4, 4)), np.zeros((4, 4, 4)), "2", spacing=(1, 1, 1)), "num_classes"),
        (lambda: surface_dice(np.zeros((4, 4, 4)), np.zeros((4, 4)), 2, spacing=(1, 1, 1), tolerance_mm=1), "shape"),
        (lambda: plan_strides("abc", (8, 8, 8)), "spacing"),
        (lambda: plan_strides((1.0, True, 1.0), (8, 8, 8)), "spacing"),
        (lambda: plan_strides((1.0, 1.0), (8, 8, 8)), "one value per axis"),
        (lambda: plan_strides((1.0, 1.0, 1.0), (8, 8, 8), max_stages=0), "max_stages"),
        (lambda: load_model(123), "run folder or checkpoint path"),
        (lambda: load_model("/nonexistent/run"), "does not exist"),
        (lambda: Predictor(None), "LoadedModel"),
        *_new_surface_cases(),
    ]


def _new_surface_cases():
    """The Python API of the windows, generative metrics and surface metrics (issue #31)."""
    import torch

    from upzoo.metrics import hausdorff95
    from upzoo.metrics.checkerboard import image_checkerboard
    from upzoo.metrics.feature_distance import FeatureDistances, kernel_distance, module_features
    from upzoo.metrics.generative import RealImages
    from upzoo.metrics.spectrum import corner_error, radial_power_spectrum, spectral_decay, spectral_error
    from upzoo.windows import sliding_window_inference

    image, same = torch.rand(1, 16, 16), (lambda x: x)
    real, flat = torch.rand(4, 1, 16, 16), module_features(torch.nn.Flatten())
    labels = np.zeros((4, 4, 4), int)
    return [
        (lambda: sliding_window_inference(image, same, (0, 8)), "image (1, 16, 16)) must be 2 whole numbers >= 1"),
        (lambda: sliding_window_inference(image, same, (8, 8, 8)), "must be 2 whole numbers >= 1, got (8, 8, 8)"),
        (lambda: sliding_window_inference(image, same, (8, 8), overlap=1.0), "overlap must be a number in [0, 1)"),
        (lambda: sliding_window_inference(image, same, (8, 8), batch_size=0), "batch_size must be a whole number"),
        (lambda: sliding_window_inference(torch.full((1, 8, 8), np.nan), same, (8, 8)), "64 of 64 values are NaN"),
        (lambda: sliding_window_inference(image, None, (8, 8)), "predictor must be callable"),
        (lambda: sliding_window_inference(image, lambda x: x[..., :4], (8, 8)), "got (2, 1, 8, 4)"),
        (lambda: spectral_decay(radial_power_spectrum(torch.zeros(2, 1, 16, 16))), "not constant"),
        (lambda: radial_power_spectrum(torch.rand(2, 16, 16)), "(N, C, H, W), got (2, 16, 16)"),
        (lambda: spectral_error("abc", np.ones(5)), "of numbers, got str"),
        (lambda: spectral_error(np.ones(5), np.ones(7)), "spectra of 5 and 7 rings"),
        (lambda: corner_error(np.full(5, np.nan), np.ones(5)), "finite values >= 0"),
        (lambda: RealImages([real, torch.rand(2, 1, 8, 8)]), "every batch needs one channel count and size"),
        (lambda: RealImages(real, extractor="inception"), "extractor must be a FeatureExtractor, got str"),
        (lambda: RealImages(real, extractor=flat, subsets=0), "KID subsets must be a whole number >= 1"),
        (lambda: RealImages(real, subset_size="a"), "KID subset_size must be a whole number >= 2"),
        (lambda: RealImages(real, seed="x"), "KID seed must be a whole number >= 0"),
        (lambda: RealImages(real, patches_per_image=0), "patches_per_image must be a whole number >= 1"),
        (lambda: RealImages(real).compare(real[:3]), "must match in count, channels and size"),
        (lambda: RealImages(real, extractor=module_features(torch.nn.Flatten(0))), "(N, D) features for N = 4"),
        (lambda: kernel_distance(torch.rand(4, 3), torch.rand(4, 2), subset_size=2), "differ in width: 3 and 2"),
        (lambda: kernel_distance(torch.full((4, 3), np.nan), torch.rand(4, 3), subset_size=2), "12 NaN/inf"),
        (lambda: kernel_distance(torch.rand(4, 3), torch.rand(4, 3), subset_size=2, seed=1.5), "KID seed"),
        (lambda: FeatureDistances(None, 1, 2), "extractor must be a FeatureExtractor, got NoneType"),
        (lambda: FeatureDistances(flat, 1, 2).compute(), "need both a real and a generated set"),
        (lambda: image_checkerboard(torch.full((1, 1, 8, 8), np.nan)), "64 of 64 values are NaN"),
        (lambda: image_checkerboard(torch.rand(1, 1, 8, 8), period=0), "period must be a whole number >= 2"),
        (lambda: image_checkerboard(torch.rand(1, 8, 8)), "expected float images (B, C, H, W)"),
        (lambda: hausdorff95(labels, labels, 2, spacing=1.0), "got 1.0"),
        (lambda: hausdorff95(labels, labels, 2, spacing=("a", 1, 1)), "got ('a', 1, 1)"),
        (lambda: hausdorff95(labels + 5, labels, 2, spacing=(1, 1, 1)), "labels must be in 0..1"),
        (lambda: hausdorff95(labels + 0.5, labels, 2, spacing=(1, 1, 1)), "integer class indices"),
    ]


API_CASES = _api_cases()


@pytest.mark.parametrize("index", range(len(API_CASES)))
def test_bad_api_arguments_raise_upzoo_errors(index):
    from upzoo.errors import UpzooError

    call, fragment = API_CASES[index]
    with pytest.raises(UpzooError) as info:
        call()
    message = str(info.value)
    assert fragment in message and "\n" not in message, message
