"""Tissue segmentation from thick slices on the MNI152 brain: the 3D U-Net on the thick grid with a
registered block at a per-axis scale (shapes against real forward passes), the thick/thin-label pairs
(the thick input and the thin labels cut from one place), the scores against MONAI and the best
thick-grid labelling against a direct count, the recipe's one-line refusals, and a run from `upzoo
train` to a thin-grid label NIfTI that nibabel reads back in the same place."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from upzoo.cli import cli
from upzoo.data.seeding import sample_seed
from upzoo.data.slabs import interpolate_slices, thick_affine, thick_slices, thin_affine
from upzoo.data.through_plane import ThickSliceBlock, ThickSlicePatches, thick_slice_volume
from upzoo.errors import ConfigError, DataError
from upzoo.models import build_model
from upzoo.recipe import load_recipe
from upzoo.train.through_plane_segmentation import thick_grid_labels, tissue_scores

RECIPE = "recipes/mni152_tissue_x4_transposed.yaml"
TINY = ["model.channels=[4,8]", "train.max_steps=2", "train.val_every=2", "data.num_workers=0",
        "data.crop_size=[16,16,16]"]  # fmt: skip


@pytest.fixture(scope="module")
def volume():
    return thick_slice_volume(4.0)


@pytest.mark.parametrize("block", ["transposed", "pixel_shuffle", "interp_conv", "interpolate", "fir", "dysample"])
def test_every_unguided_3d_block_brings_the_logits_to_the_thin_grid(block):
    model = build_model({"architecture": "through_plane_unet", "scale": [4, 1, 1], "num_classes": 4,
                         "channels": [4, 8], "strides": [[1, 2, 2]], "upsampler": block})  # fmt: skip
    x = torch.rand(2, 1, 3, 10, 7)  # odd in-plane sizes: the U-Net pads and crops on the thick grid
    out = model(x)
    assert out.shape == (2, 4, 12, 10, 7) == model.output_shape(tuple(x.shape))
    assert tuple(model.upsample.scale) == (4, 1, 1)


def test_a_guided_block_is_one_line():
    with pytest.raises(ConfigError, match="'fade' is guided by an encoder skip, and the through-plane block has none"
                       ".*through_plane_upsampler: transposed"):  # fmt: skip
        build_model({"architecture": "through_plane_unet", "scale": [4, 1, 1], "num_classes": 4, "upsampler": "fade"})
    with pytest.raises(ConfigError, match="through_plane_upsampler 'sapa' is guided by an encoder skip"):
        build_model({"architecture": "through_plane_unet", "scale": [4, 1, 1], "num_classes": 4,
                     "through_plane_upsampler": "sapa"})  # fmt: skip
    with pytest.raises(ConfigError, match="through_plane_upsampler_options without a through_plane_upsampler"):
        build_model({"architecture": "through_plane_unet", "scale": [4, 1, 1], "num_classes": 4,
                     "through_plane_upsampler_options": {"kernel_size": 3}})  # fmt: skip
    with pytest.raises(ConfigError, match="through_plane_upsampler_options: expected a mapping or null, got 3"):
        build_model({"architecture": "through_plane_unet", "scale": [4, 1, 1], "num_classes": 4,
                     "through_plane_upsampler": "transposed", "through_plane_upsampler_options": 3})  # fmt: skip


@pytest.mark.parametrize("guided", ["fade", "sapa"])
def test_a_guided_decoder_reads_the_encoder_skip_and_the_through_plane_block_stays_unguided(guided):
    model = build_model({"architecture": "through_plane_unet", "scale": [4, 1, 1], "num_classes": 4,
                         "channels": [4, 8, 16], "strides": [[1, 2, 2], [2, 2, 2]], "upsampler": guided,
                         "through_plane_upsampler": "pixel_shuffle"}).eval()  # fmt: skip
    assert not getattr(model.upsample, "needs_guide", False) and tuple(model.upsample.scale) == (4, 1, 1)
    guides = []
    for stage in model.unet.decoder:
        assert stage.upsample.needs_guide
        stage.upsample.register_forward_hook(lambda m, args, out: guides.append((args[1].shape, out.shape)))
    x = torch.rand(1, 1, 4, 12, 12)
    out = model(x)
    assert out.shape == (1, 4, 16, 12, 12) == model.output_shape(tuple(x.shape))
    # each decoder stage is guided by the encoder skip at its output size: (4, 6, 6) then (4, 12, 12)
    assert [(g[2:], o[2:]) for g, o in guides] == [((4, 6, 6), (4, 6, 6)), ((4, 12, 12), (4, 12, 12))]
    assert guides[-1][0][1] == 4  # the first encoder stage's channels


def test_patches_cut_the_thick_input_and_the_thin_labels_from_one_place(volume):
    patches = ThickSlicePatches(volume, (16, 24, 20), length=6, augment=False, labels=True)
    for index in range(len(patches)):
        item = patches[index]
        rng = np.random.default_rng(sample_seed(0, 0, index))  # the dataset's own draw, repeated
        z, y, x = patches._start(patches.centres[rng.integers(len(patches.centres))])
        assert item["mask"].dtype == torch.int64 and item["mask"].shape == (16, 24, 20)
        assert np.array_equal(item["mask"].numpy(), volume.labels[z : z + 16, y : y + 24, x : x + 20])
        thick = thick_slices(volume.thin[z : z + 16, y : y + 24, x : x + 20], 4)
        assert np.allclose(item["image"][0].numpy(), thick, atol=1e-6)
    block = ThickSliceBlock(volume)[0]
    assert block["labels"].shape == block["target"].shape[1:] and block["labels"].dtype == torch.int64
    assert set(np.unique(block["labels"].numpy())) == {0, 1, 2, 3}


def test_the_best_thick_grid_labels_are_each_slabs_most_frequent_label():
    labels = np.random.default_rng(0).integers(0, 4, size=(8, 5, 6)).astype(np.int64)
    expected = np.empty_like(labels)
    for s in range(2):
        for i in range(5):
            for j in range(6):
                counts = np.bincount(labels[4 * s : 4 * s + 4, i, j], minlength=4)
                expected[4 * s : 4 * s + 4, i, j] = counts.argmax()  # ties to the lower label
    assert np.array_equal(thick_grid_labels(labels, 4), expected)


def test_the_label_free_baseline_is_lloyds_kmeans_fitted_on_the_training_blocks(volume):
    from sklearn.cluster import KMeans

    from upzoo.train.tissue_baseline import kmeans_thresholds, kmeans_tissue_labels

    rng = np.random.default_rng(3)
    values = np.concatenate([np.zeros(400), rng.normal(0.4, 0.05, 100), rng.normal(0.65, 0.05, 300),
                             rng.normal(0.85, 0.04, 200)])  # fmt: skip
    foreground = values[values > 0.05 * values.max()]
    start = np.array([0.0, *np.quantile(foreground, [0.15, 0.5, 0.85])])[:, None]
    reference = KMeans(4, init=start, n_init=1, algorithm="lloyd", tol=0, max_iter=300).fit(values[:, None])
    centres = np.sort(reference.cluster_centers_[:, 0])
    np.testing.assert_allclose(kmeans_thresholds(values), (centres[1:] + centres[:-1]) / 2, atol=1e-9)
    labels = kmeans_tissue_labels(volume)
    cubic = interpolate_slices(volume.thick, 4, "cubic")
    cuts = kmeans_thresholds(np.concatenate([cubic[:, b].ravel() for b in volume.train_blocks]))  # training only
    assert np.array_equal(labels, np.digitize(cubic[:, volume.val_block], cuts))
    assert set(np.unique(labels)) == {0, 1, 2, 3}
    with pytest.raises(DataError, match="4 classes need 4 distinct finite values"):
        kmeans_thresholds(np.array([0.0, 1.0, 1.0]))


def test_tissue_scores_equal_monai():
    monai_metrics = pytest.importorskip("monai.metrics")
    rng = np.random.default_rng(1)
    target = np.zeros((12, 20, 20), np.int64)
    target[2:10, 3:17, 3:17], target[3:9, 5:15, 5:15], target[4:8, 7:13, 7:13] = 1, 2, 3
    pred = np.where(rng.random(target.shape) < 0.05, rng.integers(0, 4, target.shape), target)
    scores = tissue_scores(pred, target)
    onehot = [torch.nn.functional.one_hot(torch.from_numpy(a), 4).permute(3, 0, 1, 2)[None] for a in (pred, target)]
    dice = monai_metrics.compute_dice(*onehot, include_background=True)[0]
    hd95 = monai_metrics.compute_hausdorff_distance(*onehot, include_background=True, percentile=95)[0]
    nsd = monai_metrics.compute_surface_dice(*onehot, [1.0] * 4, include_background=True)[0]
    for c, name in ((1, "csf"), (2, "gm"), (3, "wm")):
        assert scores[f"{name}_dice"] == pytest.approx(float(dice[c]), abs=1e-6)
        assert scores[f"{name}_hd95"] == pytest.approx(float(hd95[c]), abs=1e-5)
        assert scores[f"{name}_surface_dice"] == pytest.approx(float(nsd[c]), abs=1e-5)
    assert scores["dice"] == pytest.approx(float(dice[1:].mean()), abs=1e-6)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.num_classes=3"], r"model.num_classes 3 does not match the MNI152 tissue labels .*use num_classes: 4"),
        (["model.scale=[2,1,1]"], r"model.scale \[2, 1, 1\] does not match 4 mm slices"),
        (["data.kind=volumes", "data.slice_thickness=null"], "through_plane_segmentation train on data.kind mni152"),
        (["train.class_weights=balanced"], "train.class_weights is read by segmentation recipes only"),
        (["data.normalize=zscore"], "data.normalize .*for data.kind mni152"),
    ],
)
def test_bad_recipes_are_one_line_before_training(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(RECIPE, overrides)


def _train(run, *extra):
    args = ["train", RECIPE, "--out", str(run), "--no-progress", *[a for o in [*TINY, *extra] for a in ("--set", o)]]
    return CliRunner().invoke(cli, args)


def test_a_run_trains_evaluates_and_labels_a_thick_nifti_on_the_thin_grid(tmp_path, volume):
    run = tmp_path / "run"
    result = _train(run)
    assert result.exit_code == 0, result.output
    # the references on the held-out block (the data's, not the network's: fixed numbers)
    assert (
        "the oracle (each slab's true majority label): Dice 0.8639 (grey matter 0.9168, HD95 1.41 mm)" in result.output
    )
    assert "k-means of the cubic-interpolated T1: Dice 0.8459 (grey matter 0.8719, CSF/other 0.7641)" in result.output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["val"]["voxels"] == volume.labels[:, volume.val_block].size
    assert (run / "predictions.png").is_file()
    result = CliRunner().invoke(cli, ["eval", str(run)])
    assert result.exit_code == 0 and f"val Dice {summary['val']['dice']:.4f}" in result.output, result.output
    table = [[cell.strip() for cell in line.strip("|").split("|")] for line in result.output.splitlines()[:6]]
    assert table[0] == ["tissue", "Dice", "HD95 (mm)", "surface Dice", "k-means Dice", "oracle Dice"]
    gm_row = next(row for row in table if row[0] == "grey matter")
    assert float(gm_row[1]) == pytest.approx(summary["val"]["gm_dice"], abs=1e-3)
    assert gm_row[4:] == ["0.8719", "0.9168"]
    affine_xyz = np.diag([1.0, 1.0, 1.0, 1.0])
    affine_xyz[:3, 3] = [-20, 30, -40]
    thick = thick_slices(volume.thin[:40, 60:90, 50:80], 4)  # (10, 30, 30): z, y, x
    nib.save(nib.Nifti1Image(thick.transpose(2, 1, 0), thick_affine(affine_xyz, 4, axis=2)), tmp_path / "t.nii.gz")
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["predict", str(run), str(tmp_path / "t.nii.gz"), "--out", str(out)])
    assert result.exit_code == 0 and "labelled on the thin grid 1 volumes" in result.output, result.output
    written = nib.load(out / "t.nii.gz")
    assert written.shape == (30, 30, 40) and np.allclose(written.affine, thin_affine(written.affine, 1, axis=2))
    assert np.allclose(written.affine, affine_xyz) and written.get_data_dtype() == np.uint8
    assert set(np.unique(np.asarray(written.dataobj))) <= {0, 1, 2, 3}
    result = CliRunner().invoke(cli, ["predict", str(run), str(tmp_path / "t.nii.gz"), "--out", str(out), "--tta",
                                      "flip"])  # fmt: skip
    assert result.exit_code != 0 and "--tta is not read by a through-plane run" in str(result.exception)


@pytest.mark.slow
def test_the_export_computes_what_the_model_does(tmp_path):
    import onnxruntime as ort

    from upzoo.inference import load_model

    run = tmp_path / "run"
    assert _train(run).exit_code == 0
    result = CliRunner().invoke(cli, ["export", str(run)])
    assert result.exit_code == 0, result.output
    assert "verified at input 2x1x4x16x16" in result.output and "NKDHW logits on the thin grid" in result.output
    session = ort.InferenceSession(str(run / "model.onnx"))
    x = np.random.default_rng(0).random((1, 1, 5, 21, 17), dtype=np.float32)
    ours = load_model(run).model(torch.from_numpy(x)).detach().numpy()
    theirs = session.run(None, {session.get_inputs()[0].name: x})[0]
    assert theirs.shape == (1, 4, 20, 21, 17) and np.abs(theirs - ours).max() < 1e-4


def test_a_comparison_variant_guides_the_decoder_and_keeps_the_through_plane_block():
    from upzoo.bench.plan import check_variants, variant_recipe
    from upzoo.bench.variants import parse_variants

    recipe = load_recipe(RECIPE)
    base, guided = parse_variants("transposed,sapa:through_plane_upsampler=transposed")
    model = variant_recipe(recipe, guided, 2).model.to_dict()
    assert model["upsampler"] == "sapa" and model["through_plane_upsampler"] == "transposed"
    assert "upsampler_options" not in model  # the block's own options only
    assert "through_plane_upsampler" not in variant_recipe(recipe, base, 2).model.to_dict()
    with pytest.raises(ConfigError, match="variant 'fade'.*through_plane_upsampler: transposed"):
        check_variants(recipe, parse_variants("fade"))
