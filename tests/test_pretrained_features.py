"""KID/FD on ImageNet EfficientNet-Lite features (``eval.features: efficientnet-lite0``): the
extractor is the pretrained network's pooled features, and its Fréchet distance grows with blur."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image, ImageFilter

from upzoo.data.package_images import PACKAGE_TEST, read_package_image
from upzoo.errors import ConfigError
from upzoo.metrics import frechet_distance, pretrained_features
from upzoo.models.pretrained import pretrained_lite_model
from upzoo.train.gan_evaluation import feature_extractor


@pytest.fixture(scope="module")
def extractor():
    return pretrained_features("efficientnet-lite0")


def test_features_are_the_pretrained_networks_pooled_features(extractor):
    images = torch.rand(3, 3, 64, 48, generator=torch.Generator().manual_seed(0))
    model = pretrained_lite_model("tf_efficientnet_lite0").eval()
    resized = F.interpolate(images, size=(224, 224), mode="bilinear", antialias=True)
    with torch.no_grad():
        expected = model.forward_head(model.forward_features((resized - 0.5) / 0.5), pre_logits=True)
    got = extractor(images)
    assert got.shape == (3, 1280) and got.dtype == torch.float64
    assert torch.allclose(got.float(), expected, atol=1e-5)
    assert torch.equal(extractor(images[:, :1]), extractor(images[:, :1].expand(-1, 3, -1, -1)))  # grey as RGB
    assert extractor.fd_name == "FD (features: efficientnet-lite0)"


def _crops(count: int, size: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    crops = []
    for i in range(count):
        image = read_package_image(PACKAGE_TEST[i % len(PACKAGE_TEST)])[..., :3]
        y, x = rng.integers(0, image.shape[0] - size), rng.integers(0, image.shape[1] - size)
        crops.append(image[y : y + size, x : x + size])
    return crops


@pytest.mark.slow
def test_frechet_distance_grows_with_blur(extractor):
    def features(crops: list[np.ndarray], sigma: float) -> torch.Tensor:
        blur = ImageFilter.GaussianBlur(sigma)
        blurred = [np.asarray(Image.fromarray(c).filter(blur)) if sigma else c for c in crops]
        return extractor(torch.as_tensor(np.stack(blurred)).permute(0, 3, 1, 2).float() / 255)

    a, b = _crops(20, 96, seed=0), _crops(20, 96, seed=1)
    reference = features(a, 0)
    distances = [frechet_distance(reference, features(b, sigma)) for sigma in (0, 1, 2, 4)]
    assert all(d2 > d1 for d1, d2 in zip(distances, distances[1:])), distances


def test_eval_features_names_the_pretrained_extractor():
    assert feature_extractor("efficientnet-lite1").name == "efficientnet-lite1"
    with pytest.raises(ConfigError, match=r"give efficientnet-lite0, efficientnet-lite1, efficientnet-lite2 "):
        feature_extractor("efficientnet-lite7")


def test_the_default_features_are_lite0_where_its_wheel_is_installed(monkeypatch):
    from upzoo.recipe import parse_recipe
    from upzoo.train import gan_evaluation

    dcgan = {"architecture": "dcgan", "latent_dim": 8, "out_channels": 3, "resolution": 16}
    assert parse_recipe({"model": dcgan}).eval.features == "auto"
    assert gan_evaluation.feature_extractor("auto").fd_name == "FD (features: efficientnet-lite0)"
    monkeypatch.setattr(gan_evaluation, "lite_weights_installed", lambda architecture: False)
    assert gan_evaluation.feature_extractor("auto") is None  # the run then says NO_FEATURES, with the extra to install
    assert gan_evaluation.feature_extractor(None) is None


@pytest.mark.slow
def test_a_gan_run_reports_fd_on_pretrained_features(tmp_path):
    import json

    from test_gan_evaluation import gan_recipe

    from upzoo.recipe import parse_recipe
    from upzoo.train.engine import train

    train(parse_recipe(gan_recipe(tmp_path / "cache", features="efficientnet-lite0")), tmp_path / "run", progress=False)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["fd_name"] == "FD (features: efficientnet-lite0)" and summary["fd"] > 0
