"""Bad input, faults and concurrency: every case ends in one line naming what was expected, what came
and the fix (never a traceback, a hang or a silent wrong result). See docs/reliability.md."""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
import yaml

from conftest import cli_streams as run
from conftest import small_recipe
from upzoo import UNet, create_upsampler, masked_gaussian_blur
from upzoo.data.cityscapes import CLASS_NAMES
from upzoo.data.volumes import VolumeDataset
from upzoo.errors import ConfigError, DataError, ShapeError, TrainingError
from upzoo.filters.masked_blur import MaskedGaussianBlur
from upzoo.recipe import parse_recipe
from upzoo.runs.checkpoint import load_checkpoint, save_checkpoint
from upzoo.runs.folder import RunFolder
from upzoo.train.engine import train
from upzoo.upsamplers import CheckerboardWarning


def assert_one_line(code: int, err: str, message: str, expected_code: int = 1) -> None:
    assert code == expected_code, (code, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert message in err, err


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


def tiny(cache: str, **data) -> dict:
    return small_recipe(cache, model={"channels": [8, 16], "upsampler": "interpolate"}, data=data)


@pytest.fixture(scope="module")
def seg_run(cache, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("seg") / "run"
    train(parse_recipe(tiny(cache)), folder, progress=False)
    return folder


@pytest.fixture(scope="module")
def gan_run(cache, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("gan") / "run"
    recipe = {
        "model": {"architecture": "dcgan", "latent_dim": 8, "out_channels": 3, "resolution": 16, "base_channels": 4},
        "data": {
            "kind": "images",
            "synthetic_train": 4,
            "synthetic_val": 1,
            "synthetic_size": [32, 64],
            "batch_size": 2,
            "num_workers": 0,
            "cache_dir": cache,
        },
        "train": {"max_steps": 1, "discriminator_base_channels": 4},
        "eval": {"features": None},
    }
    train(parse_recipe(recipe), folder, progress=False)
    return folder


@pytest.fixture
def recipe_file(cache, tmp_path) -> str:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny(cache)))
    return str(path)


# -- the command line ------------------------------------------------------------------------------
CLI_CASES = [
    (
        ("shapes", "block", "transposed", "--input", "1x3x4x4", "--out-channels", "0"),
        "'--out-channels': 0 is not in the range x>=1",
        2,
    ),
    (
        ("shapes", "solve", "--in", "33", "--out", "66", "--stride", "2", "--max-kernel", "0"),
        "'--max-kernel': 0 is not in the range",
        2,
    ),
    (
        ("shapes", "solve", "--in", "33", "--out", "66", "--stride", "99999999"),
        "no transposed conv with stride 99999999",
        1,
    ),
    (
        ("shapes", "solve", "--in", "33", "--out", "66", "--stride", "2", "--max-kernel", "100000000"),
        "max_kernel and max_dilation go up to 256",
        1,
    ),
    (
        ("shapes", "block", "transposed", "--input", "1x8x4x4", "--scale", "99999999999"),
        "scale must be at most 256 per axis",
        1,
    ),
    (("shapes", "block", "pixel_shuffle", "--input", "1x999999999x4x4"), "'pixel_shuffle' cannot be built with", 1),
    (
        ("shapes", "block", "transposed", "--input", "1x8x4x4", "-o", "kernel_size=[1"),
        "-o 'kernel_size=[1': invalid YAML",
        1,
    ),
    (
        ("shapes", "block", "transposed", "--input", "1x8x4x4", "-o", "bias=[1]"),
        "transposed.bias: expected true or false, got [1] (list)",
        1,
    ),
    (("shapes", "block", "transposed", "--input", "1x8x4.5x4"), "--input must look like 1x3x512x1024", 2),
    (("bench", "blocks", "--shape", "1x3"), "takes an input (B, C, H, W) or (B, C, D, H, W)", 1),
    (("bench", "blocks", "--shape", "8x64x64x64", "--runs", "0"), "'--runs': 0 is not in the range x>=1", 2),
    (("list", "--kind", "bogus"), "'--kind': 'bogus' is not one of", 2),
    (("train", "missing.yaml"), "File 'missing.yaml' does not exist", 2),
    (("train", "--nosuchflag"), "No such option '--nosuchflag'", 2),
]


@pytest.mark.parametrize("args, message, code", CLI_CASES, ids=lambda v: " ".join(v) if isinstance(v, tuple) else None)
def test_cli_errors_are_one_line(args, message, code):
    assert_one_line(*run(*args)[::2], message, code)


@pytest.mark.parametrize(
    "sets, message",
    [
        (["train.nproc=0"], "train.nproc: unknown key"),
        (["train.grad_clip=-1"], "train.grad_clip: input should be greater than 0, got -1"),
        (["train.max_steps=0"], "train.max_steps: input should be greater than or equal to 1, got 0"),
        (["train.max_steps=-5"], "train.max_steps: input should be greater than or equal to 1, got -5"),
        (["data.batch_size=0"], "data.batch_size: input should be greater than or equal to 1, got 0"),
        (["train.log_every=0"], "train.log_every: input should be greater than or equal to 1"),
        (["train.lr=-1"], "train.lr: input should be greater than 0, got -1"),
        (["train.lr=.nan"], "train.lr: input should be greater than 0, got nan"),
        (["data.crop_size=[0,0]"], "data.crop_size[0]: input should be greater than or equal to 1, got 0"),
        (["data.crop_size=[64]"], "data.crop_size: tuple should have at least 2 items"),
        (["eval.patch_size=[4,4]"], "eval.patch_size: tuple should have at least 3 items"),
        (["train.betas=[0.9,0.9,0.9]"], "train.betas: tuple should have at most 2 items"),
        (["train.ignore_index=0"], "train.ignore_index: unknown key"),
        (["train.latent_dim=8"], "train.latent_dim: unknown key"),
        (["model.num_classes=0"], "num_classes must be a whole number >= 1, got 0"),
        (["model.channels=[8,-16]"], "channels[1] must be a whole number >= 1, got -16"),
        (["model.spatial_dims=3"], "model.spatial_dims is 3 but data.kind is 'cityscapes'"),
        (["train.lr=\x01"], "invalid YAML: special characters are not allowed"),
        (["data=5"], "--set takes section.key=value"),
    ],
)
def test_recipe_values_out_of_range_are_refused_before_training(recipe_file, tmp_path, sets, message):
    args = [a for s in sets for a in ("--set", s)]
    code, _, err = run("train", recipe_file, "--out", str(tmp_path / "run"), "--no-progress", *args)
    assert_one_line(code, err, message)
    assert not (tmp_path / "run" / "last.pt").exists()


def test_unreadable_recipes(tmp_path):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\x00\x01\x02model")
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("model:\n  architecture: unet # caf\xe9\n".encode("latin-1"))
    listed = tmp_path / "list.yaml"
    listed.write_text("- model\n- data\n")
    for path, message in (
        (binary, "is a binary file, not YAML text"),
        (latin, "is not UTF-8 text"),
        (listed, "a recipe is a mapping with sections model, data, train, eval, got list"),
    ):
        assert_one_line(*run("train", str(path))[::2], message)
        assert_one_line(*run("shapes", "check", str(path), "--size", "64x64")[::2], message)


def test_output_folder_that_is_a_file(recipe_file, tmp_path):
    target = tmp_path / "afile"
    target.write_text("")
    assert_one_line(
        *run("train", recipe_file, "--out", str(target), "--no-progress")[::2], "is a file; give a folder path (--out)"
    )


def test_cache_dir_that_is_a_file(cache, tmp_path):
    target = tmp_path / "afile"
    target.write_text("")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(tiny(cache, cache_dir=str(target))))
    assert_one_line(
        *run("train", str(recipe), "--out", str(tmp_path / "run"), "--no-progress")[::2],
        f"cannot write generated data (synthetic sets, resampled volumes) into data.cache_dir '{target}': it is a file",
    )


def test_resume_of_an_edited_run_folder(seg_run, tmp_path):
    edited = tmp_path / "edited"
    shutil.copytree(seg_run, edited)
    stored = yaml.safe_load((edited / "recipe.yaml").read_text())
    del stored["data"]
    (edited / "recipe.yaml").write_text(yaml.safe_dump(stored))
    assert_one_line(
        *run("train", "--resume", str(edited), "--no-progress")[::2],
        "recipe.yaml has no 'data' section: it was not written by upzoo train, or was edited",
    )
    (edited / "recipe.yaml").write_bytes(b"\x00\x01")
    assert_one_line(*run("train", "--resume", str(edited), "--no-progress")[::2], "is a binary file, not YAML text")


def _model_only_recipe(tmp_path: Path, **model) -> Path:
    """A recipe file with just a small 2D U-Net (for the commands that read only the model)."""
    recipe = tmp_path / "r.yaml"
    spec = {"architecture": "unet", "spatial_dims": 2, "in_channels": 3, "num_classes": 2, "channels": [4, 8]}
    recipe.write_text(yaml.safe_dump({"model": {**spec, **model}}))
    return recipe


def test_sizes_that_cannot_fit_are_refused(tmp_path):
    recipe = _model_only_recipe(tmp_path)
    code, _, err = run("bench", "model", str(recipe), "--input", "1x3x1000000x1000000")
    assert_one_line(code, err, "needs at least")
    assert "GiB of memory are free" in err


def test_bench_model_channels_last_measures_every_pass(tmp_path):
    """The model was converted inside inference mode, so the training pass failed."""
    recipe = _model_only_recipe(tmp_path)
    code, out, err = run(
        "bench",
        "model",
        str(recipe),
        "--input",
        "1x3x32x32",
        "--runs",
        "2",
        "--channels-last",
        "--amp",
        "bf16",
        "--json",
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["channels_last"] is True and result["amp"] == "bf16" and result["peak_train_mib"] >= 0


def test_shapes_check_ranges_answer_at_once(tmp_path):
    recipe = _model_only_recipe(tmp_path)
    assert_one_line(*run("shapes", "check", str(recipe), "--range", "1:100000000000")[::2], "at most 1,000,000 sizes")
    code, out, _ = run("shapes", "check", str(recipe), "--range", "1:999999", "--json")
    assert code == 0 and len(json.loads(out)["valid_sizes"]) == 999999 // 2


def test_shapes_model_states_padding_and_crop(tmp_path):
    recipe = _model_only_recipe(tmp_path, num_classes=19, encoder="resnet18", channels=None)
    code, out, _ = run("shapes", "model", str(recipe), "--input", "1x3x100x100", "--json")
    data = json.loads(out)
    assert code == 0 and data["padded_to"] == [1, 3, 128, 128] and data["output"] == [1, 19, 100, 100]
    assert data["layers"][-1]["output"] == [1, 19, 128, 128]
    code, out, _ = run("shapes", "model", str(recipe), "--input", "1x3x100x100")
    assert "the model pads it to 1x3x128x128" in out and "cropped back to 1x19x100x100" in out


# -- the Python API --------------------------------------------------------------------------------
def test_api_values_are_checked_where_they_enter():
    up = create_upsampler("transposed", spatial_dims=2, in_channels=8, out_channels=8, scale=2)
    with pytest.raises(ShapeError, match=r"takes a shape of whole numbers, got \(1, 8, 4.5, 4\)"):
        up.output_shape((1, 8, 4.5, 4))
    with pytest.raises(ConfigError, match="sigma must be None, a positive finite number or 2 of them, got nan"):
        masked_gaussian_blur(torch.rand(1, 1, 8, 8), sigma=float("nan"))
    with pytest.raises(ConfigError, match="threshold must be a number"):
        MaskedGaussianBlur(threshold="abc")  # at construction, not at the first forward
    with pytest.raises(ConfigError, match="scale must be at most 256 per axis"):
        create_upsampler("pixel_shuffle", spatial_dims=2, in_channels=3, out_channels=3, scale=1000)
    with pytest.raises(ConfigError, match=r"this U-Net runs at no size"), pytest.warns(CheckerboardWarning):
        UNet(
            spatial_dims=2,
            in_channels=1,
            num_classes=1,
            channels=(2, 2),
            upsampler="transposed",
            upsampler_options={"kernel_size": 3, "padding": 0},
        )


# -- JSON output -----------------------------------------------------------------------------------
def _strict_json(text: str):
    def refuse(name):
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_json_outputs_are_valid_json_with_null_for_undefined_metrics(seg_run, recipe_file):
    summary = _strict_json((seg_run / "summary.json").read_text())
    ious = summary["val"]["per_class_iou"]
    assert list(ious) == list(CLASS_NAMES)  # per-class values keyed by class name
    assert None in ious.values()  # classes absent from prediction and ground truth of one validation image
    code, out, err = run("eval", recipe_file, "--checkpoint", str(seg_run / "last.pt"), "--json")
    assert code == 0, err
    assert None in _strict_json(out)["per_class_iou"].values()


# -- checkpoints -----------------------------------------------------------------------------------
def test_checkpoints_of_the_wrong_kind_or_structure(seg_run, gan_run, recipe_file, tmp_path):
    assert_one_line(
        *run("eval", recipe_file, "--checkpoint", str(gan_run / "last.pt"))[::2],
        "is from a gan run; upzoo eval needs a checkpoint of a segmentation run",
    )
    incomplete = load_checkpoint(seg_run / "last.pt")
    for key in ("model_spec", "format", "digest"):
        incomplete.pop(key)
    save_checkpoint(incomplete, tmp_path / "incomplete.pt")
    assert_one_line(
        *run("eval", recipe_file, "--checkpoint", str(tmp_path / "incomplete.pt"))[::2],
        "lacks model_spec: it is not a complete checkpoint of an upzoo segmentation run",
    )


class _Payload:
    def __reduce__(self):
        return (print, ("this would have run",))


def test_a_pickle_with_code_is_named_and_never_loaded(recipe_file, tmp_path, capsys):
    torch.save({"model": _Payload()}, tmp_path / "evil.pt")
    code, out, err = run("eval", recipe_file, "--checkpoint", str(tmp_path / "evil.pt"))
    assert_one_line(code, err, "contains objects other than tensors and plain data, which upzoo does not load")
    assert "weights_only" not in err and "this would have run" not in out + capsys.readouterr().out


def test_resume_refuses_another_runs_checkpoint_and_another_model(seg_run, gan_run, cache, tmp_path):
    other = tmp_path / "other"
    train(parse_recipe(tiny(cache)), other, progress=False)
    shutil.copy(seg_run / "last.pt", other / "last.pt")
    code, _, err = run("train", "--resume", str(other), "--no-progress")
    assert_one_line(code, err, "belongs to run")
    assert "copied from another run folder" in err
    gan_copy = tmp_path / "gan_in_seg"
    shutil.copytree(seg_run, gan_copy)
    shutil.copy(gan_run / "last.pt", gan_copy / "last.pt")
    assert_one_line(
        *run("train", "--resume", str(gan_copy), "--no-progress")[::2],
        "is from a gan run; resuming a segmentation run needs a checkpoint of a segmentation run",
    )


def test_weights_of_another_model_are_named(seg_run, tmp_path):
    from upzoo.runs.checkpoint import load_weights

    state = load_checkpoint(seg_run / "last.pt")
    net3d = UNet(spatial_dims=3, in_channels=1, num_classes=4, channels=(8, 16))
    with pytest.raises(
        DataError,
        match=r"does not fit this model: .* differently shaped tensors .*the checkpoint "
        r"holds architecture=unet, spatial_dims=2",
    ):
        load_weights(
            net3d,
            state["model"],
            seg_run / "last.pt",
            saved_spec=state["model_spec"],
            expected_spec={"architecture": "unet", "spatial_dims": 3},
        )


# -- run folders -----------------------------------------------------------------------------------
def test_one_run_per_folder(recipe_file, seg_run, tmp_path):
    busy = RunFolder(tmp_path / "busy", ["step"])  # another run holds the folder
    code, _, err = run("train", recipe_file, "--out", str(tmp_path / "busy"), "--no-progress")
    assert_one_line(code, err, "is in use by another run; wait for it to finish or choose another --out")
    busy.close()
    assert_one_line(
        *run("train", recipe_file, "--out", str(seg_run), "--no-progress")[::2],
        f"{seg_run} already holds a run; continue it with --resume",
    )
    with pytest.raises(ConfigError, match="holds no last.pt to resume from"):
        RunFolder(tmp_path / "empty", ["step"], resume=True)


# -- data ------------------------------------------------------------------------------------------
def _volume_folder(root: Path, labels: list[np.ndarray], *, meta: dict | None = None, channels: int = 1) -> Path:
    (root / "imagesTr").mkdir(parents=True)
    (root / "labelsTr").mkdir()
    entries = []
    for i, label in enumerate(labels):
        image = (
            np.random.default_rng(i).normal(size=label.shape + ((channels,) if channels > 1 else ())).astype(np.float32)
        )
        nib.save(
            nib.Nifti1Image(image.T if channels == 1 else image.transpose(2, 1, 0, 3), np.eye(4)),
            str(root / "imagesTr" / f"c{i}.nii.gz"),
        )
        nib.save(nib.Nifti1Image(label.T, np.eye(4)), str(root / "labelsTr" / f"c{i}.nii.gz"))
        entries.append({"image": f"imagesTr/c{i}.nii.gz", "label": f"labelsTr/c{i}.nii.gz"})
    (root / "dataset.json").write_text(json.dumps({"training": entries, **(meta or {})}))
    return root


def test_validation_never_reuses_training_cases(tmp_path):
    labels = [np.zeros((4, 8, 8), np.uint8)] * 3
    for count in (3, 5, -1, 0):
        root = _volume_folder(tmp_path / f"v{count}", labels, meta={"validation_count": count})
        with pytest.raises(DataError, match=rf"validation_count must be in 1..2 for 3 cases .* got {count}"):
            VolumeDataset(root, "val")
    single = _volume_folder(tmp_path / "single", labels[:1])
    with pytest.raises(DataError, match="a dataset needs at least 2 cases"):
        VolumeDataset(single, "train")


def test_labels_are_checked_before_any_cast(tmp_path):
    wide = np.zeros((4, 8, 8), np.int16)
    wide[0, 0, 0] = 300  # wrapped to 44 by a uint8 cast before
    root = _volume_folder(tmp_path / "v", [wide, wide])
    with pytest.raises(DataError, match=r"c0.nii.gz: labels must be in 0..3 .* got values in 0..300"):
        VolumeDataset(root, "train", num_classes=4)[0]
    with pytest.raises(DataError, match=r"labels must be in 0..255"):
        VolumeDataset(root, "train")[0]
    fractional = np.zeros((4, 8, 8), np.float32)
    fractional[1, 2, 3] = 1.5
    root = _volume_folder(tmp_path / "f", [fractional, fractional])
    with pytest.raises(DataError, match=r"c0.nii.gz: labels must be whole numbers, got 1 voxel\(s\) like 1.5"):
        VolumeDataset(root, "train", num_classes=4)[0]


def test_channel_count_is_checked(tmp_path):
    root = _volume_folder(tmp_path / "v", [np.zeros((4, 8, 8), np.uint8)] * 2, channels=2)
    with pytest.raises(DataError, match=r"a volume with 2 channel\(s\), but the model takes 1 \(model.in_channels\)"):
        VolumeDataset(root, "train", channels=1)[0]


@pytest.mark.parametrize(
    "listing, message",
    [
        ([1, 2], "expected a JSON object with a 'training' list, got a list"),
        ({"training": [], "labels": {"zero": "bg"}}, "'labels' keys must be class indices"),
        ({"training": [], "spacing": "5.0"}, "'spacing' must be 3 positive finite voxel sizes in mm"),
        ({"training": [], "validation_count": "1"}, "'validation_count' must be a whole number"),
        ({"training": [{"image": "/etc/hostname", "label": "labelsTr/x.nii.gz"}]}, "points outside the dataset folder"),
        ({"training": [{"image": "../x.nii.gz", "label": "labelsTr/x.nii.gz"}]}, "set data.allow_outside_root: true"),
    ],
)
def test_dataset_json_is_checked_field_by_field(tmp_path, listing, message):
    (tmp_path / "dataset.json").write_text(json.dumps(listing))
    with pytest.raises(DataError, match=message):
        VolumeDataset(tmp_path, "train")


def test_binary_dataset_json(tmp_path):
    (tmp_path / "dataset.json").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(DataError, match="not UTF-8 JSON text"):
        VolumeDataset(tmp_path, "train")


def test_files_outside_the_root_when_allowed(tmp_path):
    inside = _volume_folder(tmp_path / "v", [np.zeros((4, 8, 8), np.uint8)] * 2)
    outside = tmp_path / "elsewhere"
    shutil.move(inside / "imagesTr", outside)
    listing = json.loads((inside / "dataset.json").read_text())
    for entry in listing["training"]:
        entry["image"] = str(outside / Path(entry["image"]).name)
    (inside / "dataset.json").write_text(json.dumps(listing))
    assert len(VolumeDataset(inside, "train", allow_outside_root=True)) == 1


def test_decompression_bomb_png(tmp_path):
    from upzoo.data.io import read_image

    path = tmp_path / "bomb.png"  # a valid PNG header claiming 900 M pixels, and no pixel data
    header = struct.pack(">IIBBBBB", 30000, 30000, 1, 0, 0, 0, 0)  # 1-bit grey, as Image.new("1") writes

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    path.write_bytes(png)
    with pytest.raises(DataError, match="bomb.png: the image header claims more pixels than upzoo reads safely"):
        read_image(path)


def test_a_worker_error_is_one_line(cache, tmp_path):
    """With DataLoader workers, a bad file still gives one line naming it (not the worker's traceback)."""
    root = tmp_path / "city"
    shutil.copytree(Path(cache).glob("cityscapes-synthetic-*").__next__(), root)
    victim = sorted((root / "leftImg8bit" / "train").rglob("*.png"))[0]
    victim.write_bytes(victim.read_bytes()[:100])
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(tiny(cache, root=str(root), num_workers=2)))
    code, _, err = run("train", str(recipe), "--out", str(tmp_path / "run"), "--no-progress")
    assert_one_line(code, err, f"{victim}: unreadable or truncated image")
    assert "DataLoader worker" not in err


def test_gradient_clipping_never_reverses_training():
    """grad_clip <= 0 flipped the gradient (clip_grad_norm_ with a negative limit); it is refused now."""
    with pytest.raises(ConfigError, match="train.grad_clip: input should be greater than 0"):
        parse_recipe(
            {
                "model": {"architecture": "unet", "spatial_dims": 2, "in_channels": 3, "num_classes": 2},
                "train": {"grad_clip": -1},
            }
        )


def test_non_finite_training_stops_with_the_step(cache, tmp_path):
    recipe = parse_recipe(
        {**tiny(cache), "train": {"max_steps": 2, "lr": 1e30, "optimizer": "sgd", "momentum": 0.0, "log_every": 1}}
    )
    with pytest.raises(TrainingError, match=r"became (nan|inf) at step"):
        train(recipe, tmp_path / "run", progress=False)
