"""Frozen backbones (timm by name with local weights, a run's encoder), the feature-upsampler and
linear-probe models, the JAFAR-objective task, and their bad input: one line each, before training."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import timm
import torch

from conftest import run_cli, small_recipe
from upzoo import ConfigError, ShapeError
from upzoo.models import build_model
from upzoo.models.backbones import build_backbone, timm_backbone
from upzoo.models.feature_models import FeatureUpsampler, LinearProbe
from upzoo.recipe import parse_recipe
from upzoo.train.engine import train
from upzoo.train.feature_upsampling import feature_loss

VIT = "vit_tiny_patch16_224"


@pytest.fixture(scope="module")
def vit_weights(tmp_path_factory):
    """A state dict of timm's ViT-Ti/16 on disk (as a user's downloaded weights would be)."""
    path = tmp_path_factory.mktemp("weights") / "vit_tiny.pth"
    torch.manual_seed(3)
    torch.save(timm.create_model(VIT, num_classes=0).state_dict(), path)
    return path


def test_timm_backbone_loads_local_weights_and_stays_frozen(vit_weights):
    backbone = timm_backbone(VIT, vit_weights, layer=5)
    saved = torch.load(vit_weights)
    assert torch.equal(backbone.model.patch_embed.proj.weight, saved["patch_embed.proj.weight"])
    assert (backbone.channels, backbone.stride) == (192, 16)
    backbone.train()
    assert not backbone.model.training and not any(p.requires_grad for p in backbone.parameters())
    image = torch.rand(2, 3, 32, 48)
    features = backbone(image)
    reference = timm.create_model(VIT, num_classes=0, dynamic_img_size=True)
    reference.load_state_dict(saved)
    normalised = (image - 0.5) / 0.5  # the ViT's own mean and std
    expected = reference.forward_intermediates(normalised, indices=[5], intermediates_only=True)[0]
    torch.testing.assert_close(features, expected)
    assert features.shape == (2, 192, 2, 3)


def test_dinov2_architectures_by_their_tagged_names():
    backbone = timm_backbone("vit_small_patch14_reg4_dinov2.lvd142m", "random")
    assert (backbone.channels, backbone.stride) == (384, 14)
    assert backbone(torch.rand(1, 3, 28, 42)).shape == (1, 384, 2, 3)  # register tokens left out


def test_a_copy_or_a_pickled_backbone_computes_with_its_own_weights(seg_run):
    import copy
    import pickle

    for backbone in (timm_backbone(VIT, "random", layer=1), build_backbone(f"run:{seg_run}")):
        clone = copy.deepcopy(backbone)
        with torch.no_grad():
            for p in clone.parameters():
                p.mul_(0.5)
        image = torch.rand(1, 3, 32, 32)
        assert not torch.equal(clone(image), backbone(image))
        torch.testing.assert_close(pickle.loads(pickle.dumps(backbone))(image), backbone(image))
    from upzoo.shapes.layer_table import trace

    probe = LinearProbe(num_classes=3, backbone=VIT, weights="random")
    assert trace(probe, (1, 3, 64, 64))[-1].output_shape == (1, 3, 64, 64)  # runs on the meta device


def test_random_weights_are_the_same_in_every_run():
    torch.manual_seed(1)
    first = timm_backbone(VIT, "random")
    torch.manual_seed(2)
    second = timm_backbone(VIT, "random")
    assert torch.equal(first.model.pos_embed, second.model.pos_embed)


@pytest.mark.parametrize(
    "name, weights, layer, message",
    [
        ("vit_tiny_patch16", "random", None, "timm does not know a model 'vit_tiny_patch16'; did you mean"),
        ("vit_small_patch14_dinov2.lvd14", "random", None, "did you mean 'vit_small_patch14_dinov2.lvd142m'"),
        (VIT, "random", 12, r"vit_tiny_patch16_224 has no layer 12: layers are 0..11"),
        (VIT, "random", -1, r"has no layer -1"),
        (VIT, "/no/such/file.pth", None, "is not a file; give a local weights file, 'imagenet-lite' .* or 'random'"),
        (VIT, "imagenet", None, "backbone weights 'imagenet' is not a file; give .* 'imagenet-lite' \\(ImageNet"),
        (VIT, "", None, "backbone weights '' is not a file"),
        (VIT, None, None, "needs weights: a local weights file \\(nothing is downloaded\\) or 'random'"),
    ],
)
def test_bad_backbones_are_one_line_config_errors(name, weights, layer, message):
    with pytest.raises(ConfigError, match=message):
        build_backbone(name, weights, layer)


def test_weights_of_another_architecture_or_no_weights_at_all(tmp_path):
    torch.save(timm.create_model("resnet18", num_classes=0).state_dict(), tmp_path / "r18.pth")
    with pytest.raises(
        ConfigError, match=r"do not fit timm model 'vit_tiny_patch16_224' \(\d+ missing keys, \d+ unexpected keys\)"
    ):
        timm_backbone(VIT, tmp_path / "r18.pth")
    (tmp_path / "notes.txt").write_text("not weights")
    with pytest.raises(ConfigError, match="cannot be read as a state dict"):
        timm_backbone(VIT, tmp_path / "notes.txt")


def test_images_must_be_multiples_of_the_stride():
    backbone = timm_backbone(VIT, "random")
    with pytest.raises(
        ShapeError, match=r"stride 16: image sides must be multiples of it, got \[40, 48\]; .* e.g. \[32, 48\]"
    ):
        backbone(torch.rand(1, 3, 40, 48))
    with pytest.raises(ShapeError, match=r"takes images \(B, 3, H, W\) in \[0, 1\], got shape \(1, 1, 32, 32\)"):
        backbone(torch.rand(1, 1, 32, 32))


def test_a_runs_encoder_is_a_backbone(seg_run):
    backbone = build_backbone(f"run:{seg_run}", layer=1)
    assert (backbone.channels, backbone.stride) == (8, 2)
    from upzoo.runs import load_model

    loaded = load_model(seg_run)
    image = torch.rand(1, 3, 32, 64)
    normalised = (image - torch.tensor(loaded.mean).view(1, 3, 1, 1)) / torch.tensor(loaded.std).view(1, 3, 1, 1)
    torch.testing.assert_close(backbone(image), loaded.model.encoder(normalised)[1])
    with pytest.raises(ConfigError, match=r"the run's encoder has no layer 5: layers are 0..1 with strides \[1, 2\]"):
        build_backbone(f"run:{seg_run}", layer=5)


@pytest.mark.parametrize("upsampler", ["jafar", "jbu", "loftup", "anyup", "interpolate", "carafe", "sapa"])
def test_feature_upsampler_lifts_features_to_pixels(upsampler):
    options = {"jafar": {"qk_dim": 16}, "anyup": {"qk_dim": 16}, "loftup": {"width": 196}}.get(upsampler)
    model = FeatureUpsampler(backbone=VIT, weights="random", layer=2, upsampler=upsampler, upsampler_options=options)
    image = torch.rand(1, 3, 32, 48)
    assert model(image).shape == (1, 192, 32, 48)


def test_feature_evaluation_runs_the_model_under_the_recipes_precision():
    """Training runs the objective under train.amp; its evaluation (and upzoo eval) do the same."""
    import functools

    from upzoo.runtime import autocast
    from upzoo.train.feature_upsampling import evaluate_feature_upsampling

    model = FeatureUpsampler(backbone=VIT, weights="random", upsampler="jafar", upsampler_options={"qk_dim": 16})
    seen, objective = [], model.objective

    def watched(images, ratio, **options):
        seen.append(torch.is_autocast_enabled("cpu"))
        return objective(images, ratio, **options)

    model.objective = watched
    results = []
    for amp in ("bf16", "none"):
        precision = functools.partial(autocast, amp, torch.device("cpu"))
        results.append(evaluate_feature_upsampling(model, [{"image": torch.rand(3, 64, 64)}], (2,), "cpu", precision))
    assert seen == [True, False] and all(0 < r["cosine"] <= 1 for r in results)


def test_the_objective_pairs_downscaled_features_with_the_full_images():
    model = FeatureUpsampler(backbone=VIT, weights="random", upsampler="jafar", upsampler_options={"qk_dim": 16})
    images = torch.rand(2, 3, 64, 128)
    prediction, target, low = model(images, ratio=2)
    torch.testing.assert_close(target, model.backbone(images))
    torch.testing.assert_close(low, model.backbone(torch.nn.functional.avg_pool2d(images, 2)))
    assert prediction.shape == target.shape == (2, 192, 4, 8)
    assert float(feature_loss(target, target)) == pytest.approx(0.0, abs=1e-6)
    fixed = FeatureUpsampler(backbone=VIT, weights="random", upsampler="carafe")
    with pytest.raises(ConfigError, match="'carafe' runs at its one scale \\(x16\\); the objective trains a block"):
        fixed(images, ratio=2)
    assert float(feature_loss(-target, target)) > 2.0


def test_the_objective_guided_by_the_full_image_lifts_to_pixels_then_pools():
    torch.manual_seed(0)
    model = FeatureUpsampler(backbone=VIT, weights="random", upsampler="jbu", upsampler_options={"radius": 1})
    images = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        prediction, target, low = model(images, ratio=2, guide="image")
        lifted = model.upsampler.resample(low, images, 32)
        torch.testing.assert_close(prediction, torch.nn.functional.avg_pool2d(lifted, 16))
        pooled, _, _ = model(images, ratio=2)
        torch.testing.assert_close(pooled, model.upsampler.resample(low, torch.nn.functional.avg_pool2d(images, 16), 2))
    assert prediction.shape == target.shape == pooled.shape == (1, 192, 4, 4)
    assert not torch.allclose(prediction, pooled)
    with pytest.raises(ConfigError, match="the objective's guide must be one of pooled, image, got 'full'"):
        model(images, ratio=2, guide="full")


def test_probe_refuses_an_untrained_learned_block():
    with pytest.raises(ConfigError, match="carafe has learned weights: give upsampler_run .* or train_upsampler: true"):
        LinearProbe(num_classes=3, backbone=VIT, weights="random", upsampler="carafe")
    probe = LinearProbe(num_classes=3, backbone=VIT, weights="random", upsampler="carafe", train_upsampler=True)
    trained = {n for n, p in probe.named_parameters() if p.requires_grad}
    assert trained and all(n.startswith(("head.", "features.upsampler.")) for n in trained)
    assert probe(torch.rand(1, 3, 32, 32)).shape == (1, 3, 32, 32)


def _feature_recipe(cache, **model):
    recipe = small_recipe(
        cache,
        model={"architecture": "feature_upsampler", "backbone": VIT, "weights": "random", "upsampler": "jafar",
               "upsampler_options": {"qk_dim": 16}, **model},
        data={"normalize": "minmax", "synthetic_size": [32, 64], "crop_size": [32, 64]},
        train={"max_steps": 2, "feature_ratios": [2]},
    )  # fmt: skip
    for key in ("spatial_dims", "in_channels", "num_classes", "channels"):
        recipe["model"].pop(key)
    return recipe


def test_objective_trains_only_the_block_and_a_probe_uses_it(tmp_path):
    run = tmp_path / "featup"
    train(parse_recipe(_feature_recipe(tmp_path / "cache")), run, progress=False)
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["val"]["per_ratio"]) == {"2"} and 0 < summary["val"]["cosine_bilinear"] <= 1
    from upzoo.cli.train import _task_result_line

    assert _task_result_line(summary["val"]).startswith(
        f"val cosine to the full images' features: {summary['val']['cosine']:.4f} beside bilinear"
    )
    assert (run / "predictions.png").stat().st_size > 0
    state = torch.load(run / "last.pt", weights_only=True)["model"]
    fresh = FeatureUpsampler(backbone=VIT, weights="random", upsampler="jafar", upsampler_options={"qk_dim": 16})
    for name, value in fresh.backbone.state_dict().items():  # the backbone did not move
        assert torch.equal(state[f"backbone.{name}"], value)
    assert any(not torch.equal(state[f"upsampler.{n}"], v) for n, v in fresh.upsampler.state_dict().items())

    probe = LinearProbe(num_classes=19, backbone=VIT, weights="random", upsampler_run=str(run))
    for name, value in probe.features.upsampler.state_dict().items():
        assert torch.equal(value, state[f"upsampler.{name}"])
    assert not any(p.requires_grad for p in probe.features.parameters())
    with pytest.raises(ConfigError, match=r"was trained on layer=None, the probe has layer=3"):
        LinearProbe(num_classes=19, backbone=VIT, weights="random", layer=3, upsampler_run=str(run))
    with pytest.raises(ConfigError, match=r"trained 'jafar' .*; leave upsampler and upsampler_options unset"):
        LinearProbe(num_classes=19, backbone=VIT, weights="random", upsampler="jbu", upsampler_run=str(run))
    from upzoo.recipe import load_recipe

    probe_recipe = Path(__file__).parent.parent / "recipes" / "probe_bilinear.yaml"  # as its comment says
    same_backbone = [f"model.backbone={VIT}", "model.weights=random", "model.layer=null"]
    loaded = load_recipe(probe_recipe, [*same_backbone, f"model.upsampler_run={run}"])
    assert isinstance(build_model(loaded.model), LinearProbe)


def test_probe_recipe_trains_as_segmentation(tmp_path):
    recipe = small_recipe(
        tmp_path / "cache",
        model={"architecture": "linear_probe", "backbone": VIT, "weights": "random", "upsampler": "interpolate"},
        data={"normalize": "minmax", "synthetic_size": [32, 64], "crop_size": [32, 64]},
    )
    for key in ("spatial_dims", "in_channels", "channels"):
        recipe["model"].pop(key)
    train(parse_recipe(recipe), tmp_path / "probe", progress=False)
    val = json.loads((tmp_path / "probe" / "summary.json").read_text())["val"]
    assert 0 <= val["miou"] <= 1 and "boundary_fscore" in val


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"data": {"normalize": "imagenet"}},
            "feature_upsampler takes pixels in \\[0, 1\\] .* set data.normalize: minmax",
        ),
        (
            {"data": {"kind": "volumes", "crop_size": None, "synthetic_size": [8, 32, 32]}},
            "feature_upsampler trains on 2D images: data.kind cityscapes or images or package_images",
        ),
        ({"train": {"feature_ratios": [1]}}, "train.feature_ratios.0"),
        (
            {"data": {"crop_size": [32, 48]}},
            r"data.crop_size \[32, 48\]: .* \(32\); use sides that are multiples of it, e.g. \[32, 32\]",
        ),
        (
            {"model": {"upsampler": "carafe", "upsampler_options": None}},
            "'carafe' has one fixed scale; use jbu, jafar, loftup or anyup",
        ),
    ],
)
def test_bad_feature_recipes_fail_before_training(tmp_path, change, message):
    recipe = _feature_recipe(tmp_path / "cache")
    for section, values in change.items():
        recipe[section].update(values)
    with pytest.raises(ConfigError, match=message):
        train(parse_recipe(recipe), tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "last.pt").exists()


def test_feature_ratios_belong_to_the_feature_task(tmp_path):
    recipe = small_recipe(tmp_path / "cache", train={"feature_ratios": [2]})
    with pytest.raises(
        ConfigError,
        match="train.feature_ratios is read by feature_upsampling recipes only, and this is a segmentation recipe",
    ):
        parse_recipe(recipe)


@pytest.mark.parametrize(
    "train_keys, message",
    [
        (
            {"loss": "ce+dice"},
            "train.loss is read by segmentation and through_plane_segmentation recipes only, "
            "and this is a feature_upsampling",
        ),
        ({"class_weights": "balanced"}, "train.class_weights is read by segmentation recipes only"),
        ({"sample_every": 5}, "train.sample_every is read by gan recipes only"),
        ({"discriminator_norm": "spectral"}, "train.discriminator_norm is read by gan recipes only"),
        ({"discriminator_base_channels": 8}, "read by gan and super_resolution recipes only"),
    ],
)
def test_train_keys_a_task_does_not_read_are_refused(tmp_path, train_keys, message):
    recipe = _feature_recipe(tmp_path / "cache")
    recipe["train"].update(train_keys)
    with pytest.raises(ConfigError, match=message):
        parse_recipe(recipe)


def test_an_sr_discriminator_size_needs_the_adversarial_term():
    from test_super_resolution_use import sr_recipe

    with pytest.raises(ConfigError, match="discriminator_base_channels sizes the discriminator of train.adversarial"):
        parse_recipe(sr_recipe(train__discriminator_base_channels=16))
    parse_recipe(sr_recipe(train__discriminator_base_channels=16, train__adversarial_weight=0.01))


def test_cli_reports_a_bad_backbone_in_one_line(tmp_path):
    import yaml

    recipe = _feature_recipe(tmp_path / "cache", backbone="vit_tiny_patch16")
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    result = run_cli("train", tmp_path / "r.yaml", "--out", tmp_path / "run")
    assert result.returncode == 1
    assert "timm does not know a model 'vit_tiny_patch16'" in result.stderr and "Traceback" not in result.stderr


def test_shapes_check_answers_with_the_backbones_stride():
    recipe = Path(__file__).parent.parent / "recipes" / "probe_bilinear.yaml"
    result = run_cli("shapes", "check", recipe, "--size", "100x200")
    assert result.returncode == 0, result.stderr
    assert "multiples of 16 (the backbone's stride)" in result.stdout
    assert "100x200: not valid; nearest valid sizes 96x192 or 112x208" in result.stdout
    assert "128x256: valid" in run_cli("shapes", "check", recipe, "--size", "128x256").stdout


def test_the_consistency_term_follows_the_authors_training(tmp_path):
    """JAFAR's train.py: the full images' features lifted to half the image size from a blurred or
    noised guide must match those from the clean guide (no gradient into the target), weighted 0.1."""
    torch.manual_seed(0)
    model = FeatureUpsampler(backbone=VIT, weights="random", upsampler="jafar", upsampler_options={"qk_dim": 16})
    images, features = torch.rand(1, 3, 32, 32), torch.randn(1, model.channels, 2, 2)
    draws = {}
    for seed in range(40):  # find draws that blur (rand < 0.5) or not, noise (rand < 0.3) or not
        g = torch.Generator().manual_seed(seed)
        draws.setdefault((float(torch.rand((), generator=g)) < 0.5, float(torch.rand((), generator=g)) < 0.3), seed)
    pairs = {}
    for (blur, noise), seed in draws.items():
        torch.manual_seed(seed)
        pairs[(blur, noise)] = model.consistency_pair(images, features)
    prediction, target = pairs[(False, False)]
    assert prediction.shape == (1, model.channels, 16, 16) and torch.equal(prediction, target)  # clean guide twice
    for key in ((True, False), (False, True), (True, True)):
        assert not torch.equal(*pairs[key]) and not pairs[key][1].requires_grad, key
    assert pairs[(True, True)][0].requires_grad

    recipe = _feature_recipe(tmp_path / "cache")
    recipe["train"]["consistency_weight"] = 0.1
    run = tmp_path / "run"
    train(parse_recipe(recipe), run, progress=False)
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    values = [float(r["loss_consistency"]) for r in rows if r["loss_consistency"]]
    assert values and all(math.isfinite(v) and v >= 0 for v in values)
    segmentation = small_recipe(tmp_path / "cache", train={"consistency_weight": 0.1})
    with pytest.raises(ConfigError, match=r"train.consistency_weight is read by feature_upsampling recipes only"):
        parse_recipe(segmentation)


def test_the_objective_trains_with_the_full_image_as_guide_when_asked(tmp_path):
    recipe = _feature_recipe(tmp_path / "cache", upsampler="jbu", upsampler_options={"radius": 1})
    recipe["train"]["feature_guide"] = "image"
    run = tmp_path / "run"
    train(parse_recipe(recipe), run, progress=False)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["val"]["guide"] == "image" and -1 <= summary["val"]["cosine"] <= 1
    recipe["train"]["feature_guide"] = "full"
    with pytest.raises(ConfigError, match=r"train.feature_guide: expected one of 'pooled', 'image', got 'full'"):
        parse_recipe(recipe)
    segmentation = small_recipe(tmp_path / "cache", train={"feature_guide": "image"})
    with pytest.raises(ConfigError, match=r"train.feature_guide is read by feature_upsampling recipes only"):
        parse_recipe(segmentation)
