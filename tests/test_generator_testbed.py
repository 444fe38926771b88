"""Schwarz et al.'s generator testbed: the toyset, the testbed modes' blocks (zero insertion, pixel
shuffle without a convolution), PGGAN's generator and the regression task with its spectra."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import run_cli
from upzoo import ConfigError, DataError, ShapeError, create_upsampler
from upzoo.data.synthetic.toyset import TOYSET_RINGS, ensure_toyset, ring_magnitude, toyset_image
from upzoo.metrics.spectrum import RadialSpectrum, radial_power_spectrum
from upzoo.models import PGGANGenerator, build_model
from upzoo.models.pggan import EqualizedConv2d, pixel_norm
from upzoo.recipe import parse_recipe
from upzoo.train.generator_testbed import channel_spectrum, read_spectra

# --- the blocks of the testbed's modes -------------------------------------------------------------


@pytest.mark.parametrize(("dims", "scale"), [(2, 2), (2, (1, 3)), (3, (2, 1, 3))])
def test_zero_insertion_puts_the_input_on_the_scale_grid_and_zeros_elsewhere(dims, scale):
    x = torch.randn(2, 3, *(4, 5, 3)[:dims], dtype=torch.float64)
    block = create_upsampler("zero_insertion", spatial_dims=dims, in_channels=3, out_channels=3, scale=scale)
    steps = (scale,) * dims if isinstance(scale, int) else scale
    expected = torch.zeros(2, 3, *(s * k for s, k in zip(x.shape[2:], steps)), dtype=torch.float64)
    expected[(..., *(slice(None, None, k) for k in steps))] = x  # the definition, by indexing
    assert torch.equal(block(x), expected)
    assert block.output_shape(x.shape) == expected.shape and not list(block.parameters())


def test_zero_insertion_refuses_another_channel_count():
    with pytest.raises(ConfigError, match=r"ZeroInsertionUpsampler keeps the channel count: out_channels must equal "):
        create_upsampler("zero_insertion", spatial_dims=2, in_channels=4, out_channels=2, scale=2)


def test_pixel_shuffle_without_a_convolution_is_torch_pixel_shuffle():
    block = create_upsampler("pixel_shuffle", spatial_dims=2, in_channels=12, out_channels=3, scale=2, kernel_size=None)
    x = torch.randn(2, 12, 5, 7)
    assert torch.equal(block(x), F.pixel_shuffle(x, 2)) and not list(block.parameters())
    anisotropic = create_upsampler(
        "pixel_shuffle", spatial_dims=3, in_channels=12, out_channels=2, scale=(1, 2, 3), kernel_size=None
    )
    assert anisotropic(torch.randn(1, 12, 2, 3, 4)).shape == (1, 2, 2, 6, 12)
    with_conv = create_upsampler("pixel_shuffle", spatial_dims=2, in_channels=12, out_channels=3, scale=2)
    assert with_conv.icnr  # ICNR stays the default where there is a convolution


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"icnr": True}, r"pixel_shuffle icnr=True applies to its convolution, and kernel_size=None has none"),
        ({"bias": False}, r"pixel_shuffle bias=False applies to its convolution"),
        ({"in_channels": 10}, r"in_channels must be out_channels \* 4 = 12, got 10"),
    ],
)
def test_pixel_shuffle_without_a_convolution_refuses_what_needs_one(options, message):
    kwargs = {"spatial_dims": 2, "in_channels": 12, "out_channels": 3, "scale": 2, "kernel_size": None, **options}
    with pytest.raises(ConfigError, match=message):
        create_upsampler("pixel_shuffle", **kwargs)


# --- the toyset ---------------------------------------------------------------------------------


def _authors_magnitude(resolution: int, freq: float) -> torch.Tensor:
    """``make_circ_magnitude`` of autonomousvision/frequency_bias ``data/toyset.py`` (MIT licence),
    ported to float64: the reference the toyset's rings are checked against."""
    spectrum_size = resolution // 2
    r = torch.stack(
        torch.meshgrid(
            torch.linspace(0, 1, spectrum_size, dtype=torch.float64),
            torch.linspace(0, 1, spectrum_size + 1, dtype=torch.float64),
            indexing="ij",
        )
    ).norm(dim=0)

    def gaussian(x, mu, sigma):
        return 1 / (math.sqrt(2 * math.pi) * sigma) * torch.exp(-((x - mu) ** 2) / (2 * sigma**2))

    std = 1 / (spectrum_size + 1)
    magnitude = gaussian(r, freq, std)
    norm = gaussian(r, 1 / math.sqrt(2), std).sum() * 4
    magnitude = magnitude / norm * resolution**2 / 3
    return torch.cat([magnitude, magnitude.flipud()])


@pytest.mark.parametrize(("size", "frequency"), [(128, 0.1 * math.sqrt(2)), (128, 0.8 * math.sqrt(2)), (64, 0.5)])
def test_the_toyset_rings_are_the_authors_magnitudes(size, frequency):
    np.testing.assert_allclose(ring_magnitude(size, frequency), _authors_magnitude(size, frequency).numpy(), rtol=1e-12)


def test_toyset_images_have_their_power_in_the_two_rings_and_are_reproducible(tmp_path):
    rng = np.random.default_rng(0)
    images = np.stack([toyset_image(rng, 64) for _ in range(10)])
    assert images.shape == (10, 64, 64, 3) and images.dtype == np.uint8
    spectrum = RadialSpectrum()
    spectrum.update(torch.from_numpy(images).permute(0, 3, 1, 2).contiguous())
    power = spectrum.compute()
    cycles = np.arange(len(power)) / 64
    for low, high in TOYSET_RINGS:  # each ring's peak lies inside its range (sqrt(2) x fraction of Nyquist 0.5)
        inside = (cycles >= low * math.sqrt(2) / 2 - 1 / 64) & (cycles <= high * math.sqrt(2) / 2 + 1 / 64)
        outside = ~inside & (cycles > 0.02)
        assert power[inside].max() > 30 * np.median(power[outside])
    root = ensure_toyset(tmp_path, count=3, resolution=32, seed=5)
    again = ensure_toyset(tmp_path / "other", count=3, resolution=32, seed=5)
    files = sorted((root / "train").glob("*.png"))
    assert len(files) == 3 and all(f.read_bytes() == (again / "train" / f.name).read_bytes() for f in files)


# --- PGGAN's generator ----------------------------------------------------------------------------


def test_equalized_conv_and_pixel_norm_follow_their_definitions():
    conv = EqualizedConv2d(4, 6, 3)
    reference = torch.nn.Conv2d(4, 6, 3, padding=1)
    with torch.no_grad():
        reference.weight.copy_(conv.weight * math.sqrt(2) / math.sqrt(4 * 9))
        reference.bias.copy_(conv.bias)
    x = torch.randn(2, 4, 5, 5)
    torch.testing.assert_close(conv(x), reference(x))
    rms = pixel_norm(x).square().mean(1)
    torch.testing.assert_close(rms, torch.ones_like(rms), atol=1e-5, rtol=0)


def _paper_parameters(widths: list[int], latent: int, expand: int = 1) -> int:
    """The testbed generator's parameter count by its layers (dense 4x4, then two 3x3 convs per
    stage, the last stage's 1x1 to RGB); ``expand``: the reshape mode's 4x wider second convs."""
    total = latent * widths[0] * 16 + widths[0]
    total += 9 * widths[0] * widths[0] * (expand if len(widths) > 1 else 1) + widths[0] * expand
    for i in range(1, len(widths)):
        out = widths[i] * (1 if i == len(widths) - 1 else expand)
        total += 9 * widths[i - 1] * widths[i] + widths[i] + 9 * widths[i] * out + out
    return total + widths[-1] * 3 + 3


@pytest.mark.parametrize(
    ("upsampler", "options", "expand"),
    [("interpolate", {"mode": "bilinear"}, 1), ("zero_insertion", {}, 1), ("pixel_shuffle", {"kernel_size": None}, 4)],
)
def test_the_testbed_generator_has_the_papers_widths_and_layers(upsampler, options, expand):
    net = PGGANGenerator(resolution=64, latent_dim=64, channel_divisor=8, upsampler=upsampler,
                         upsampler_options=options)  # fmt: skip
    widths = [64, 64, 64, 64, 32]  # min(16384 / r, 512) / 8 at r = 4..64
    assert sum(p.numel() for p in net.parameters()) == _paper_parameters(widths, 64, expand)
    assert net(torch.randn(3, 64)).shape == (3, 3, 64, 64)


@pytest.mark.parametrize("upsampler", ["zero_insertion", "pixel_shuffle"])
def test_the_generator_computes_the_testbeds_conv_blocks(upsampler):
    """The testbed's generator (autonomousvision/frequency_bias ``models/pggan_generator.py``, from
    genforce) is a chain of ConvBlocks, each ``act(conv(upsample(pixel_norm(x))))``, the 1x1 output
    one too (linear): so the features reaching ToRGB are pixel-normalised. Rebuilt here from that
    definition with the generator's own layers."""
    torch.manual_seed(0)
    options = {"kernel_size": None} if upsampler == "pixel_shuffle" else {}
    net = PGGANGenerator(resolution=16, latent_dim=8, channel_divisor=64, upsampler=upsampler,
                         upsampler_options=options)  # fmt: skip
    for conv in net.modules():  # random biases, so a missing normalisation cannot hide behind zeros
        if isinstance(conv, EqualizedConv2d):
            torch.nn.init.normal_(conv.bias)
    z = torch.randn(3, 8)

    def block(x, conv, up=None, act=True):
        x = pixel_norm(x)
        x = conv(up(x) if up is not None else x)
        return F.leaky_relu(x, 0.2) if act else x

    x = pixel_norm(z)[:, :, None, None]
    for stage in net.stages:
        x = block(block(x, stage.conv1, stage.up), stage.conv2)
    expected = block(x, net.to_image, act=False)
    torch.testing.assert_close(net(z), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"resolution": 48}, ConfigError, r"resolution must be a power of two from 8 to 1024, got 48"),
        ({"channel_divisor": 1024}, ConfigError, r"fall below one channel; lower channel_divisor"),
        ({"upsampler": "transposed", "upsampler_options": {"kernel_size": 3, "padding": 1}}, ConfigError,
         r"PGGANGenerator stage 1: TransposedConvUpsampler maps size 5 to 9x9, the model needs exactly 10x10"),
        ({"upsampler": "fade"}, ConfigError, r"fade"),
        ({"upsampler_options": {"scale": 2}}, ConfigError, r"sets scale=2, which the model sets itself"),
    ],
)  # fmt: skip
def test_bad_generator_options_are_one_line_errors(kwargs, error, message):
    with pytest.raises(error, match=message) as caught:
        PGGANGenerator(**{"resolution": 16, "latent_dim": 8, **kwargs})
    assert "\n" not in str(caught.value)


def test_the_generator_refuses_latents_of_another_shape():
    with pytest.raises(ShapeError, match=r"PGGANGenerator expects latents \(B, 8\), got \(2, 9\)"):
        PGGANGenerator(resolution=16, latent_dim=8)(torch.randn(2, 9))


# --- the task ----------------------------------------------------------------------------------


def _testbed_recipe(cache, **train) -> dict:
    return {
        "model": {"architecture": "pggan", "resolution": 16, "latent_dim": 8, "channel_divisor": 64,
                  "upsampler": "zero_insertion"},
        "data": {"kind": "toyset", "synthetic_train": 4, "batch_size": 4, "num_workers": 0, "cache_dir": str(cache)},
        "train": {"max_steps": 4, "val_every": 2, "checkpoint_every": 2, "optimizer": "adam", "weight_decay": 0.0,
                  **train},
    }  # fmt: skip


def test_the_channel_spectrum_is_the_metrics_one_on_raw_values():
    """The testbed measures the raw output (any range) with the metric's one definition: beyond ring
    0 a shift changes nothing and a scale scales the power by its square."""
    images = torch.randn(3, 2, 8, 8, dtype=torch.float64) * 3
    low, span = float(images.min()), float(images.max() - images.min())
    raw, unit = channel_spectrum(images), radial_power_spectrum((images - low) / span)
    np.testing.assert_allclose(raw[1:], unit[1:] * span**2, rtol=1e-9)
    assert raw[0] == pytest.approx(float(images.mean((2, 3)).square().mean() * 64), rel=1e-9)  # |DC|^2 / (H W)


@pytest.mark.slow
def test_a_testbed_run_writes_psnr_and_the_spectra_over_training_and_resumes(tmp_path):
    from upzoo.train.engine import train

    run = tmp_path / "run"
    summary = train(parse_recipe(_testbed_recipe(tmp_path / "cache")), run, progress=False)
    spectra = read_spectra(run / "spectra.csv")
    assert sorted(spectra) == [0, 2, 4]  # the untrained generator, then every val_every steps
    rings = len(spectra[0]["real"])
    assert rings == round(math.sqrt(2) * 8) + 1 and all(len(s["error"]) == rings for s in spectra.values())
    final = spectra[4]
    np.testing.assert_allclose(final["error"], final["generated"] / final["real"] - 1, rtol=1e-6)
    for name in ("spectrum_evolution.png", "spectral_error_evolution.png", "samples.png", "curves.png"):
        assert (run / name).stat().st_size > 1000
    val = summary["val"]
    assert set(val) == {"psnr", "spectral_error", "spectral_error_corners", "images"} and 0 < val["psnr"] < 60
    assert set(summary["untrained"]) == {"psnr", "spectral_error", "spectral_error_corners"}
    assert summary["spectrum_generated"] == pytest.approx(final["generated"].tolist(), rel=1e-6)
    # PSNR against its definition on the saved 8-bit images: 10 log10(1 / MSE), per image, averaged
    with open(run / "metrics.csv") as f:
        logged = [r for r in csv.DictReader(f) if r["val_psnr"]]
    assert [int(r["step"]) for r in logged] == [2, 4]
    resumed = run_cli("train", "--resume", run, "--set", "train.max_steps=6", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    assert "val PSNR " in resumed.stdout and "spectral error" in resumed.stdout  # the run ends with its result
    assert sorted(read_spectra(run / "spectra.csv")) == [0, 2, 4, 6]
    evaluated = run_cli("eval", run, "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    result = json.loads(evaluated.stdout)
    best = max(float(r["val_psnr"]) for r in csv.DictReader(open(run / "metrics.csv")) if r["val_psnr"])
    assert result["psnr"] == pytest.approx(best, rel=1e-6) and result["images"] == 4  # best.pt: the best PSNR
    line = run_cli("eval", run).stdout
    assert line.startswith("PSNR ") and "corner error" in line


def test_the_testbed_psnr_is_the_8_bit_images_psnr():
    from upzoo.train.generator_testbed import _measure

    targets = torch.rand(3, 3, 16, 16) * 2 - 1
    images = (targets + 0.1 * torch.randn_like(targets)).clamp(-1.2, 1.2)
    measured = _measure(images, targets, channel_spectrum(targets))
    to_8 = lambda x: np.round(((x.numpy() + 1) / 2).clip(0, 1) * 255)  # noqa: E731
    mse = ((to_8(images) - to_8(targets)) ** 2).mean(axis=(1, 2, 3))
    assert measured["val_psnr"] == pytest.approx(float(np.mean(10 * np.log10(255**2 / mse))), rel=1e-5)


def test_testbed_images_of_another_size_are_one_line(tmp_path):
    from upzoo.data.io import write_png

    folder = tmp_path / "photos"
    write_png(folder / "a.png", np.zeros((16, 16, 3), np.uint8))
    write_png(folder / "b.png", np.zeros((20, 16, 3), np.uint8))
    recipe = _testbed_recipe(tmp_path / "cache")
    recipe["data"] = {"kind": "images", "root": str(folder), "batch_size": 2, "num_workers": 0}
    from upzoo.prepare import prepare

    with pytest.raises(DataError, match=r"b.png: the testbed regresses 16x16 images .* got 20x16; resize the images"):
        prepare(parse_recipe(recipe))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kind": "cityscapes"}, r"regresses the embedded toyset \(data.kind: toyset\) or a folder of images"),
        ({"kind": "images"}, r"data.kind 'images' without a root"),
        ({"kind": "toyset", "root": "somewhere"}, r"root: the toyset is generated"),
    ],
)
def test_testbed_data_that_does_not_fit_is_refused(tmp_path, data, message):
    from upzoo.prepare import prepare

    recipe = _testbed_recipe(tmp_path / "cache")
    recipe["data"] = {"num_workers": 0, **data}
    with pytest.raises(ConfigError, match=message):
        prepare(parse_recipe(recipe))


def test_raw_range_spectra_refuse_what_is_not_finite_float_images():
    spectrum = RadialSpectrum(unit_range=False)
    with pytest.raises(ConfigError, match=r"2 values are NaN or infinite"):
        spectrum.update(torch.tensor([math.nan, math.inf, 0.0, 1.0]).reshape(1, 1, 2, 2))
    with pytest.raises(ConfigError, match=r"expected a float batch of images \(N, C, H, W\), got a torch.uint8 tensor"):
        spectrum.update(torch.zeros(1, 1, 2, 2, dtype=torch.uint8))
    with pytest.raises(ShapeError, match=r"expected a float batch of images \(N, C, H, W\), got shape \(1, 2, 2\)"):
        spectrum.update(torch.zeros(1, 2, 2))


def test_the_testbed_recipes_build_the_papers_generators():
    from upzoo.recipe import load_recipe

    weights = {}
    for mode in ("bilinear", "nearest", "zeros", "reshape", "fir"):
        recipe = load_recipe(f"recipes/testbed_toyset64_{mode}.yaml")
        assert recipe.task == "generator_testbed" and recipe.train.betas == (0.0, 0.99)
        net = build_model(recipe.model)
        assert net(torch.randn(2, 64)).shape == (2, 3, 64, 64)
        weights[mode] = sum(p.numel() for p in net.parameters())
    # the authors' reshape run divides the channels by 12, not 8: the same capacity as the other modes
    assert weights["reshape"] == 357_507 and weights["bilinear"] == weights["zeros"] == 351_907


def test_the_error_evolution_plot_shows_each_step_clipped_at_its_rings_frequencies(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from upzoo.figures import spectral_error_evolution_plot

    saved = {}
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, path, **kw: saved.setdefault("fig", fig))
    errors = {0: np.linspace(-3, 3, 46), 250: np.full(46, 0.5), 500: np.zeros(46)}  # 64x64 images: 46 rings
    spectral_error_evolution_plot(errors, tmp_path / "e.png")
    axis = saved["fig"].axes[0]
    image = axis.images[0]
    np.testing.assert_allclose(image.get_array(), np.stack([np.clip(errors[s][1:], -1, 1) for s in (0, 250, 500)]))
    left, right, _, _ = image.get_extent()
    assert (left, right) == pytest.approx((0.5 / 64, 45.5 / 64))  # ring 1 to ring 45 in cycles per pixel
    assert [t.get_text() for t in axis.get_yticklabels()] == ["0", "250", "500"]


@pytest.mark.slow  # four trainings and the interleaved timing
def test_bench_compare_runs_the_testbed_over_blocks_with_psnr_and_spectra(tmp_path):
    import yaml

    recipe = tmp_path / "testbed.yaml"
    recipe.write_text(yaml.safe_dump(_testbed_recipe(tmp_path / "cache", max_steps=2, val_every=2)))
    out = tmp_path / "cmp"
    result = run_cli("bench", "compare", recipe, "--upsamplers", "zero_insertion,interpolate:mode=nearest",
                     "--seeds", "2", "--out", out, "--rounds", "3", "--no-progress", "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [r["upsampler"] for r in rows] == ["zero_insertion", "interpolate mode=nearest"]
    for row in rows:
        assert row["seeds"] == 2 and 0 < row["psnr_mean"] < 60 and row["spectral_error_corners_mean"] >= 0
    assert "psnr_diff" in rows[1] and "PSNR dB" in (out / "compare.md").read_text()
    reference = rows[0]["reference"]  # the untrained generator, its mean over the cells
    assert reference["label"] == "the untrained generator" and 0 < reference["psnr"] < rows[0]["psnr_mean"] + 60
    assert "| the untrained generator (reference, not trained) |" in (out / "compare.md").read_text()
    assert (out / "compare_spectra.png").stat().st_size > 1000


@pytest.mark.parametrize(
    ("key", "value"), [("crop_size", [32, 32]), ("resize", [32, 32]), ("normalize", "minmax"), ("synthetic_val", 4)]
)
def test_data_keys_the_testbed_would_ignore_are_refused(tmp_path, key, value):
    recipe = _testbed_recipe(tmp_path / "cache")
    recipe["data"][key] = value
    with pytest.raises(ConfigError, match=rf"data.{key} is not read by the generator testbed .* remove it"):
        parse_recipe(recipe)


def test_upzoo_train_on_images_of_another_size_ends_in_one_line(tmp_path):
    import yaml

    from upzoo.data.io import write_png

    write_png(tmp_path / "photos" / "a.png", np.zeros((24, 24, 3), np.uint8))
    recipe = _testbed_recipe(tmp_path / "cache")
    recipe["data"] = {"kind": "images", "root": str(tmp_path / "photos"), "batch_size": 1, "num_workers": 0}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    result = run_cli("train", path, "--out", tmp_path / "run", "--no-progress")
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "a.png: the testbed regresses 16x16 images (the generator's resolution), got 24x24" in result.stderr
