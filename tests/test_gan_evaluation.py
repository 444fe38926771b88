"""A generator run measured the way GAN papers measure it: held-out real images, SWD, spectra,
KID/FD with the features of a segmentation run, in metrics.csv, summary.json, spectrum.png and
``upzoo eval``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import run_cli
from upzoo.errors import ConfigError, ShapeError
from upzoo.metrics.generative import NO_FEATURES, RealImages
from upzoo.recipe import parse_recipe
from upzoo.train.engine import train


def gan_recipe(cache: Path, **eval_section) -> dict:
    return {
        "model": {"architecture": "dcgan", "latent_dim": 8, "out_channels": 3, "resolution": 16, "base_channels": 4},
        "data": {
            "kind": "images",
            "synthetic_train": 24,
            "synthetic_val": 20,
            "batch_size": 4,
            "num_workers": 0,
            "cache_dir": str(cache),
        },  # fmt: skip
        "train": {"max_steps": 2, "sample_every": 2, "discriminator_base_channels": 4},
        "eval": {"gan_images": 16, "features": None, **eval_section},
    }


@pytest.fixture(scope="module")
def gan_run(tmp_path_factory, seg_run) -> Path:
    root = tmp_path_factory.mktemp("gan")
    train(parse_recipe(gan_recipe(root / "cache", features=str(seg_run))), root / "run", progress=False)
    return root / "run"


def test_the_embedded_gan_images_are_held_out_street_scenes(gan_run):
    cache = next((gan_run.parent / "cache").glob("gan-images-synthetic-*"))
    train_files, val_files = sorted((cache / "train").glob("*.png")), sorted((cache / "val").glob("*.png"))
    assert len(train_files) == 24 and len(val_files) == 20
    images = [np.asarray(Image.open(p)) for p in (train_files[0], val_files[0])]
    assert all(i.shape == (64, 64, 3) and i.dtype == np.uint8 for i in images)
    assert not np.array_equal(*images)


def test_a_gan_run_logs_generative_metrics_and_plots_the_spectrum(gan_run):
    import csv

    rows = list(csv.DictReader(open(gan_run / "metrics.csv")))
    evaluated = [r for r in rows if r["swd"]]
    assert evaluated and all(float(evaluated[-1][k]) >= 0 for k in ("swd", "spectral_error", "kid", "fd"))
    summary = json.loads((gan_run / "summary.json").read_text())
    assert summary["fd_name"] == "FD (features: run encoder)" and summary["images"] == 16
    assert summary["real_images"] == "validation" and {"swd_16", "spectral_decay_real", "checkerboard"} <= set(summary)
    with Image.open(gan_run / "spectrum.png") as plot:
        assert plot.size[0] > 500
    assert (gan_run / "samples_000002.png").is_file()


def test_upzoo_eval_measures_a_generator(gan_run, seg_run):
    done = run_cli("eval", gan_run, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    summary = json.loads((gan_run / "summary.json").read_text())
    assert result["swd"] == pytest.approx(summary["swd"]) and result["fd"] == pytest.approx(summary["fd"])
    plain = run_cli("eval", gan_run, "--set", "eval.features=null", "--set", "eval.gan_images=20")
    assert plain.returncode == 0 and "SWD " in plain.stdout and "(20 generated vs 20 real images)" in plain.stdout
    assert NO_FEATURES in plain.stdout and "KID" not in plain.stdout.split(";")[0]
    assert "eval.gan_images" not in plain.stderr  # 20 asked, 20 held out: nothing to say
    more = run_cli("eval", gan_run, "--set", "eval.features=null", "--set", "eval.gan_images=100")
    assert more.returncode == 0 and "(20 generated vs 20 real images)" in more.stdout
    assert "eval.gan_images=100, but the held-out validation set has 20 images" in more.stderr  # said, not silent
    missing = run_cli("eval", gan_run, "--set", "eval.features=/no/such/run")
    assert missing.returncode == 1 and "eval.features: /no/such/run does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_generated_and_real_sets_must_match():
    real = RealImages(torch.rand(20, 3, 16, 16))
    with pytest.raises(ShapeError, match=r"generated images \(10, 3, 16, 16\) and real images \(20, 3, 16, 16\)"):
        real.compare(torch.rand(10, 3, 16, 16))
    with pytest.raises(ConfigError, match=r"generated images: float images must hold values in \[0, 1\], got -0.5"):
        real.compare(torch.rand(20, 3, 16, 16) - 0.5)
    report = RealImages(torch.rand(20, 3, 8, 8)).compare(torch.rand(20, 3, 8, 8))
    assert "swd" not in report.values and "16x16" in report.notes["swd_note"]


def test_bad_gan_evaluation_settings_are_refused():
    with pytest.raises(ConfigError, match="eval.gan_images: input should be greater than or equal to 16, got 4"):
        parse_recipe(gan_recipe(Path("/tmp"), gan_images=4))


def test_a_spectrally_normalised_discriminator_has_no_batchnorm_and_the_same_shapes():
    from torch import nn

    from upzoo.models import DCGANDiscriminator

    batch, spectral = (
        DCGANDiscriminator(in_channels=3, resolution=32, base_channels=8),
        DCGANDiscriminator(in_channels=3, resolution=32, base_channels=8, norm="spectral"),
    )
    x = torch.rand(5, 3, 32, 32)
    assert batch(x).shape == spectral(x).shape == (5,)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in spectral.modules())
    convs = [m for m in spectral.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(nn.utils.parametrize.is_parametrized(m, "weight") for m in convs)
    spectral.train()
    for _ in range(20):  # power iterations: the largest singular value of each weight goes to 1
        spectral(x)
    top = float(torch.linalg.matrix_norm(convs[1].weight.detach().flatten(1), ord=2))
    assert top == pytest.approx(1.0, abs=0.05)
    with pytest.raises(ConfigError, match="norm must be 'batch' or 'spectral', got 'layer'"):
        DCGANDiscriminator(in_channels=3, resolution=32, norm="layer")


@pytest.mark.slow  # six small GAN trainings and the speed measurement
def test_bench_compare_on_a_gan_recipe_pairs_seeds_and_overlays_the_spectra(tmp_path):
    from upzoo.bench.report import display_rows, write_comparison
    from upzoo.bench.seeded import compare_upsamplers
    from upzoo.bench.variants import parse_variants

    recipe = gan_recipe(tmp_path / "cache")
    recipe["model"] |= {"upsampler": "transposed", "upsampler_options": {"kernel_size": 4, "padding": 1}}
    variants = parse_variants("transposed,interp_conv:mode=nearest:post_filter=masked_blur")
    rows, missing = compare_upsamplers(parse_recipe(recipe), variants, tmp_path / "cmp", seeds=2, rounds=2)
    assert not missing and [r["upsampler"] for r in rows] == [v.label for v in variants]
    cells = {p.parent.parent.name: yaml_of(p)["model"] for p in (tmp_path / "cmp").glob("*/seed*/recipe.yaml")}
    # the recipe's transposed options carry over to transposed, not to interp_conv; the post-filter is the model's
    assert cells["transposed"]["upsampler_options"] == {"kernel_size": 4, "padding": 1}
    blurred = cells["interp_conv_mode-nearest_post_filter-masked_blur"]
    assert blurred["upsampler_options"] == {"mode": "nearest"} and blurred["post_filter"] == "masked_blur"
    for row in rows:
        assert row["seeds"] == 2 and len(row["swd_per_seed"]) == 2 and row["params"] > 0
        assert "kid_mean" not in row  # no features in this recipe: no KID/FD columns, not NaN ones
    assert "swd_diff" in rows[1] and "swd_diff" not in rows[0]  # paired with the baseline's seeds
    table, columns = display_rows(rows)
    assert {"SWD", "Δ SWD", "spectral error", "checkerboard"} <= set(columns)
    write_comparison(rows, tmp_path / "cmp")
    with Image.open(tmp_path / "cmp" / "compare_spectra.png") as plot:
        assert plot.size[0] > 500


def yaml_of(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


def test_the_generator_step_shows_the_discriminator_the_real_and_fake_batch(tmp_path):
    """The discriminator's BatchNorm learns on real + fake batches; a fake-only batch in the
    generator's step would meet other statistics and fool it for free (the DCGAN that never learned)."""
    from contextlib import nullcontext

    from upzoo.prepare import prepare
    from upzoo.train.tasks import GanTask

    task = GanTask(prepare(parse_recipe(gan_recipe(tmp_path / "cache"))))
    sizes: list[int] = []
    task.modules["discriminator"].register_forward_hook(lambda module, args, out: sizes.append(len(args[0])))

    class Context:  # what the engine gives a task (upzoo.train.context.StepContext), minimal
        device = torch.device("cpu")

        def net(self, name):
            return task.modules[name]

        def autocast(self):
            return nullcontext()

        def to_device(self, tensor, image=False):
            return tensor

        def optimize(self, loss, name):
            task.modules[name].zero_grad()
            loss.backward()
            return float(loss)

    task.step({"image": torch.rand(4, 3, 16, 16) * 2 - 1}, Context())
    assert sizes == [8, 8]  # the discriminator's step and the generator's: 4 real + 4 fake both times


def test_a_variant_can_swap_a_generators_last_stage_alone(tmp_path):
    from upzoo.bench.plan import variant_recipe
    from upzoo.bench.variants import parse_variants

    recipe = gan_recipe(tmp_path / "cache")
    recipe["model"] |= {"upsampler": "transposed", "upsampler_options": {"kernel_size": 4, "padding": 1}}
    base, swapped = parse_variants("transposed,transposed:last_upsampler=fir")
    model = variant_recipe(parse_recipe(recipe), swapped, 1).model.to_dict()
    assert model["last_upsampler"] == "fir" and model["upsampler"] == "transposed"
    assert model["upsampler_options"] == {"kernel_size": 4, "padding": 1}  # the block's options, not the model's
    assert "last_upsampler" not in variant_recipe(parse_recipe(recipe), base, 1).model.to_dict()


def test_kid_shows_a_spread_only_where_there_is_one():
    from upzoo.cli.train import _generative_line

    assert "KID 0.0100 ± 0.0020" in _generative_line({"kid": 0.01, "kid_std": 0.002})
    whole = _generative_line({"kid": 0.01, "kid_std": 0.0})  # every subset was the whole set: no spread to show
    assert "KID 0.0100 (one subset: all images)" in whole and "±" not in whole
    assert "--features" not in NO_FEATURES and "eval.features" in NO_FEATURES  # an option that exists


def test_upzoo_eval_generates_under_the_recipes_precision(gan_run, monkeypatch):
    """Training evaluated its generator under train.amp; `upzoo eval` does the same, not float32."""
    from upzoo.eval import evaluate_generator
    from upzoo.train.gan_evaluation import GanEvaluator

    seen = []
    original = GanEvaluator.generate

    def generate(self, generator, device, autocast):
        with autocast():
            seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
        return original(self, generator, device, autocast)

    monkeypatch.setattr(GanEvaluator, "generate", generate)
    raw = yaml_of(gan_run / "recipe.yaml") | {"eval": {"gan_images": 16, "features": None}}
    for amp in ("bf16", "none"):
        recipe = parse_recipe(raw | {"train": {**raw["train"], "amp": amp}})
        evaluate_generator(recipe, gan_run / "last.pt")
    assert seen == [True, False]
