"""Through-plane super-resolution on the MNI152 brain: the 3D network with a registered block at a
per-axis scale (shapes against real forward passes, the residual against the slab module's linear
interpolation), the thick/thin pairs (each input slice is the mean of its target's slabs; training
never sees the held-out block), the recipe's one-line refusals, and a run from `upzoo train` to a
thin-slice NIfTI whose affine nibabel and nilearn read back in the same place."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from upzoo.cli import cli
from upzoo.data.slabs import interpolate_slices, thick_affine, thick_slices, thin_affine
from upzoo.data.through_plane import ThickSliceBlock, ThickSlicePatches, thick_slice_volume
from upzoo.errors import ConfigError
from upzoo.models import build_model
from upzoo.models.through_plane import ThroughPlaneSR
from upzoo.recipe import load_recipe

RECIPE = "recipes/mni152_sr_x4_pixel_shuffle.yaml"
BLOCKS_3D = ["pixel_shuffle", "transposed", "interp_conv", "fir", "dysample", "carafe", "interpolate"]


@pytest.fixture(scope="module")
def volume():
    return thick_slice_volume(4.0)


@pytest.mark.parametrize("block", BLOCKS_3D)
def test_every_3d_block_is_the_tail_at_a_per_axis_scale(block):
    model = ThroughPlaneSR(scale=[4, 1, 1], channels=8, num_blocks=1, upsampler=block)
    x = torch.rand(2, 1, 3, 10, 7)
    out = model(x)
    assert out.shape == (2, 1, 12, 10, 7) == model.output_shape(tuple(x.shape))
    assert tuple(model.upsample.scale) == (4, 1, 1)


def test_the_residual_is_the_slab_modules_linear_interpolation():
    torch.manual_seed(0)
    model = ThroughPlaneSR(scale=[4, 1, 1], channels=4, num_blocks=1)
    torch.nn.init.zeros_(model.last.weight)
    torch.nn.init.zeros_(model.last.bias)
    thick = torch.rand(5, 6, 7)
    expected = interpolate_slices(thick.numpy(), 4, "linear")
    assert np.allclose(model(thick[None, None])[0, 0].detach().numpy(), expected, atol=1e-6)
    plain = ThroughPlaneSR(scale=[4, 1, 1], channels=4, num_blocks=1, residual=False)
    torch.nn.init.zeros_(plain.last.weight)
    torch.nn.init.zeros_(plain.last.bias)
    assert plain(thick[None, None]).abs().max() == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"scale": 4}, r"scale must be three whole factors \[D, H, W\] >= 1, one of them above 1, e.g. \[4, 1, 1\]"),
        ({"scale": [1, 1, 1]}, "one of them above 1"),
        ({"scale": [4, 1]}, "got \\[4, 1\\]"),
        ({"scale": [4, 1, 1], "residual": "yes"}, "residual must be true or false, got 'yes'"),
        (
            {"scale": [4, 1, 1], "upsampler": "fade"},
            "ThroughPlaneSR upsampler: .fade. is guided by the encoder skip, but",
        ),
    ],
)
def test_bad_model_options_are_one_line(options, message):
    with pytest.raises(ConfigError, match=message):
        ThroughPlaneSR(**options)


def test_pairs_are_slab_means_from_the_training_blocks_only(volume):
    patches = ThickSlicePatches(volume, (16, 24, 20), 40)
    val = volume.val_block
    for index in range(40):
        item = patches[index]
        image, target = item["image"][0].numpy(), item["target"][0].numpy()
        assert image.shape == (4, 24, 20) and target.shape == (16, 24, 20)
        assert np.allclose(image, thick_slices(target, 4), atol=1e-6)  # flipped or not, the same slabs
    rng_items = [patches[i]["target"] for i in (3, 3)]
    assert torch.equal(*rng_items)  # drawn from (seed, epoch, index) only
    for index in range(200):  # no training patch touches the held-out block or its gaps
        z, y, x = patches._start(patches.centres[index * 997 % len(patches.centres)])
        assert z % 4 == 0 and (y + 24 <= val.start - 8 or y >= val.stop + 8)
    item = ThickSliceBlock(volume)[0]
    assert item["image"].shape == (1, 47, val.stop - val.start, volume.thin.shape[2])
    assert item["target"].shape[1] == 188 and item["mask"].dtype == torch.bool


def test_patches_that_do_not_fit_are_refused(volume):
    with pytest.raises(ConfigError, match=r"its depth 30 is not a whole number of 4-slice slabs; use 28"):
        ThickSlicePatches(volume, (30, 32, 32), 4)
    with pytest.raises(ConfigError, match=r"larger than the training blocks"):
        ThickSlicePatches(volume, (32, 100, 32), 4)


def test_thin_affine_undoes_thick_affine():
    affine = np.array([[-1.0, 0, 0, 98], [0, 1.2, 0, -134], [0, 0, 0.9, -72], [0, 0, 0, 1]])
    for axis in range(3):
        assert np.allclose(thin_affine(thick_affine(affine, 4, axis=axis), 4, axis=axis), affine)
    with pytest.raises(ConfigError, match="axis-aligned"):
        thin_affine(np.array([[1.0, 1, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]), 4)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.scale=[3,1,1]"], r"model.scale \[3, 1, 1\] does not match 4 mm slices .* use scale: \[4, 1, 1\]"),
        (["data.slice_thickness=2.5"], "2.5 mm is not a whole multiple of the 1.0 mm voxels; use e.g. 2 mm"),
        (["data.slice_thickness=null"], "slice_thickness: data.kind mni152 needs the thick slices' thickness"),
        (["data.kind=volumes"], "data.slice_thickness: makes thick slices of the MNI152 brain .*, not 'volumes'"),
        (["data.kind=volumes", "data.slice_thickness=null"], "through_plane_sr and through_plane_segmentation train"),
        (["data.root=/tmp"], "data.root is not read for data.kind mni152"),
        (["data.synthetic_train=8"], "data.synthetic_train is not read for data.kind mni152"),
        (["data.val_split=test"], "data.val_split is not read for data.kind mni152"),
        (["data.slice_noise=-0.1"], "slice_noise"),
    ],
)
def test_bad_recipes_are_one_line_before_training(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(RECIPE, overrides)


def test_mni152_feeds_no_other_task():
    with pytest.raises(ConfigError, match="mni152 feeds them only"):
        load_recipe("recipes/volume_unet3d_aniso.yaml", ["data.kind=mni152", "data.slice_thickness=4"])


def test_a_run_trains_evaluates_and_writes_a_thin_nifti_in_place(tmp_path, volume):
    run = tmp_path / "run"
    overrides = ["model.channels=4", "model.num_blocks=1", "train.max_steps=2", "train.val_every=2",
                 "data.num_workers=0", "data.crop_size=[16,16,16]"]  # fmt: skip
    result = CliRunner().invoke(cli, ["train", RECIPE, "--out", str(run), "--no-progress",
                                      *[a for o in overrides for a in ("--set", o)]])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "in the brain beside linear 27.10" in result.output and ", B-spline 28.2447 dB (" in result.output
    assert "dB against B-spline, the best baseline; x4 through-plane" in result.output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["val"]["voxels"] == int(volume.mask[:, volume.val_block].sum())
    assert (run / "predictions.png").is_file()
    thin_affine_xyz = np.diag([1.0, 1.0, 1.0, 1.0])
    thin_affine_xyz[:3, 3] = [-20, 30, -40]
    thick = thick_slices(volume.thin[:40, 60:90, 50:80], 4)  # (10, 30, 30): z, y, x
    source = nib.Nifti1Image(thick.transpose(2, 1, 0), thick_affine(thin_affine_xyz, 4, axis=2))
    nib.save(source, tmp_path / "thick.nii.gz")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli, ["predict", str(run), str(tmp_path / "thick.nii.gz"), "--out", str(out), "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    written = nib.load(out / "thick.nii.gz")
    assert written.shape == (30, 30, 40) and np.allclose(written.affine, thin_affine_xyz)
    assert written.header.get_zooms() == (1.0, 1.0, 1.0)
    rows = (out / "predictions.csv").read_text().splitlines()
    assert "30x30x10" in rows[1] and "30x30x40" in rows[1]  # nibabel's axis order, as the files hold them
    from nilearn.image import load_img

    assert np.allclose(load_img(str(out / "thick.nii.gz")).affine, thin_affine_xyz)
    result = CliRunner().invoke(cli, ["predict", str(run), str(out / "thick.nii.gz"), "--out", str(tmp_path / "again")])
    message = str(result.exception)
    assert result.exit_code != 0 and "slices 1 mm apart at 1 mm in-plane (ratio 1.00)" in message
    assert "its slices are thin already" in message
    sideways = nib.Nifti1Image(thick.transpose(0, 1, 2), thick_affine(thin_affine_xyz, 4, axis=0))  # i is thick
    nib.save(sideways, tmp_path / "sideways.nii.gz")
    result = CliRunner().invoke(cli, ["predict", str(run), str(tmp_path / "sideways.nii.gz"), "--out", str(out / "s")])
    message = str(result.exception)
    assert (
        result.exit_code != 0 and "the thick axis is NIfTI's axis i (4 mm; nibabel spacing (4.0, 1.0, 1.0))" in message
    )
    assert "reorient the volume so its thick axis comes third" in message
    loaded = build_model({"architecture": "through_plane_sr", "scale": [4, 1, 1]})
    assert isinstance(loaded, ThroughPlaneSR)


def test_predict_scales_a_float_thick_volume_as_training_did(tmp_path, volume):
    """Training divides by the thin volume's maximum; the thick slices' maximum is lower (slab means),
    so a float thick file is divided by its maximum over the training thick volume's (``thick_peak``)."""
    from upzoo.inference.slice_upscaling import _read

    peak = float(volume.thick.max())
    assert 0.85 < peak < 0.99  # docs/anatomy.md: 0.935
    affine = thick_affine(np.diag([1.0, 1.0, 1.0, 1.0]), 4, axis=2)
    nib.save(nib.Nifti1Image((volume.thick * 1000).transpose(2, 1, 0).astype(np.float32), affine), tmp_path / "t.nii")
    array, scale, _ = _read(tmp_path / "t.nii", 4, peak)
    assert scale == pytest.approx(1000, rel=1e-5)
    np.testing.assert_allclose(array, volume.thick, rtol=1e-5, atol=1e-6)


def test_shapes_check_states_the_per_axis_rule():
    result = CliRunner().invoke(cli, ["shapes", "check", RECIPE, "--size", "8x32x30"])
    assert result.exit_code == 0, result.output
    assert "the output is the input x 4 x 1 x 1 per axis (D, H, W)" in result.output
    assert "8x32x30: valid, output 32x32x30" in result.output
    result = CliRunner().invoke(cli, ["shapes", "check", RECIPE, "--size", "8x32"])
    said = result.output + str(result.exception)
    assert result.exit_code != 0 and "--size takes 3 sizes DxHxW for this 3D model, got '8x32'" in said


@pytest.mark.slow
def test_the_export_computes_what_the_model_does(tmp_path):
    import onnxruntime as ort

    from upzoo.inference import load_model

    run = tmp_path / "run"
    overrides = ["model.channels=4", "model.num_blocks=1", "train.max_steps=2", "train.val_every=2",
                 "data.num_workers=0", "model.upsampler=transposed"]  # fmt: skip
    result = CliRunner().invoke(cli, ["train", RECIPE, "--out", str(run), "--no-progress",
                                      *[a for o in overrides for a in ("--set", o)]])  # fmt: skip
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli, ["eval", str(run)])
    assert result.exit_code == 0, result.output
    assert "in the brain beside linear 27.10" in result.output and ", B-spline 28.2447 dB (" in result.output
    assert "dB against B-spline, the best baseline; x4 through-plane" in result.output
    result = CliRunner().invoke(cli, ["export", str(run)])
    assert result.exit_code == 0, result.output
    assert "verified at input 2x1x8x32x32" in result.output and "scale: [4, 1, 1]" in result.output
    session = ort.InferenceSession(str(run / "model.onnx"))
    x = np.random.default_rng(0).random((1, 1, 5, 21, 17), dtype=np.float32)
    ours = load_model(run).model(torch.from_numpy(x)).detach().numpy()
    theirs = session.run(None, {session.get_inputs()[0].name: x})[0]
    assert theirs.shape == (1, 1, 20, 21, 17) and np.abs(theirs - ours).max() < 1e-4
