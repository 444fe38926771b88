"""Exports that carry their contract: ONNX metadata and the ``.pt2`` extra file hold the input layout,
preprocessing, mean/std, classes, palette and provenance; a deployment that uses only onnxruntime,
NumPy and PIL reproduces upzoo's predictions; a ``.pt2`` says when it needs ``import upzoo``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from conftest import run_cli, small_recipe
from upzoo.inference import Predictor, load_model
from upzoo.inference.contract import CONTRACT_FILE
from upzoo.inference.export import export_model
from upzoo.recipe import parse_recipe
from upzoo.runs.identity import recipe_digest
from upzoo.train.engine import train

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("contract")
    recipe = small_recipe(
        root / "cache", model={"post_filter": "masked_blur", "post_filter_options": {"threshold": 2.0}}
    )
    train(parse_recipe(recipe), root / "run", progress=False)
    return root / "run"


def _deploy_without_upzoo(onnx_path: str, image_path: str) -> np.ndarray:
    """The deployment of docs/deploy.md: onnxruntime, NumPy and PIL only, the preprocessing read from
    the file's own metadata."""
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    mean, std = json.loads(meta["input.mean"]), json.loads(meta["input.std"])
    pixels = np.asarray(Image.open(image_path).convert("RGB"), dtype=np.float32) / 255.0
    x = (pixels - np.array(mean, np.float32)) / np.array(std, np.float32)
    logits = session.run(None, {"input": x.transpose(2, 0, 1)[None].astype(np.float32)})[0]
    return logits[0].argmax(axis=0).astype(np.uint8)


def test_the_onnx_file_carries_its_contract_and_deploys_without_upzoo(run_dir, tmp_path):
    loaded = load_model(run_dir)
    report = export_model(loaded, "onnx", tmp_path / "model.onnx")
    meta = ort.InferenceSession(report["path"], providers=["CPUExecutionProvider"]).get_modelmeta()
    contract = meta.custom_metadata_map
    assert contract == report["contract"]
    assert contract["input.layout"] == "NCHW" and contract["input.dtype"] == "float32"
    assert json.loads(contract["class_names"]) == loaded.class_names
    assert json.loads(contract["palette"]) == loaded.palette.tolist()
    assert len(json.loads(contract["palette"])) == len(loaded.class_names) == 19  # one colour per class
    assert json.loads(contract["input.mean"]) == list(loaded.mean) and json.loads(contract["input.std"]) == list(
        loaded.std
    )
    assert contract["upzoo.task"] == "segmentation"
    stored = json.loads((run_dir / "run.json").read_text())["recipe_sha256"]  # the run folder's digest
    assert (
        contract["upzoo.recipe_sha256"]
        == stored
        == recipe_digest(yaml.safe_load((run_dir / "recipe.yaml").read_text()))
    )
    image = sorted((run_dir.parent / "cache").rglob("leftImg8bit/val/**/*.png"))[0]
    deployed = _deploy_without_upzoo(report["path"], str(image))
    expected = Predictor(loaded, window="off").predict(str(image)).labels
    assert (deployed == expected).mean() >= 0.999


@pytest.mark.slow  # three .pt2 exports, each verified
def test_a_pt2_says_it_needs_upzoo_and_portable_exports_do_not(run_dir, tmp_path):
    loaded = load_model(run_dir)
    fused = export_model(loaded, "exported-program", tmp_path / "fused.pt2")
    from upzoo.filters.blur_fused import FUSED_CPU_KERNEL

    if FUSED_CPU_KERNEL:
        assert fused["custom_ops"] == ["upzoo.masked_blur.default"]
    portable = export_model(loaded, "exported-program", tmp_path / "portable.pt2", portable=True)
    assert portable["custom_ops"] == [] and all(check["ok"] for check in portable["checks"])
    extra = {CONTRACT_FILE: ""}
    torch.export.load(str(tmp_path / "portable.pt2"), extra_files=extra)
    assert json.loads(extra[CONTRACT_FILE]) == portable["contract"]
    result = run_cli("export", run_dir, "--format", "exported-program", "--out", tmp_path / "cli.pt2")
    assert result.returncode == 0, result.stderr
    assert "input.layout: NCHW" in result.stdout
    if FUSED_CPU_KERNEL:
        assert "load it after 'import upzoo', or export again with --portable" in result.stderr


@pytest.mark.slow
def test_predict_through_onnxruntime_gives_the_eager_labels(run_dir, tmp_path):
    from upzoo.errors import ConfigError

    loaded = load_model(run_dir)
    images = sorted((run_dir.parent / "cache").rglob("leftImg8bit/val/**/*.png"))
    onnx = export_model(loaded, "onnx", tmp_path / "model.onnx")["path"]
    for options in ({"window": "off"}, {"window": "on", "tta": "flip", "scales": (0.75, 1.0)}):
        eager = Predictor(loaded, **options)
        ort_predictor = Predictor(loaded, backend="onnxruntime", onnx_path=onnx, **options)
        for image in images:
            a, b = eager.predict(str(image)).labels, ort_predictor.predict(str(image)).labels
            assert (a == b).mean() >= 0.999
    exported_now = Predictor(loaded, backend="onnxruntime")  # exports (verified) when no file is given
    assert (
        exported_now.predict(str(images[0])).labels == Predictor(loaded).predict(str(images[0])).labels
    ).mean() >= 0.999
    with pytest.raises(ConfigError, match="amp \\(bf16 autocast\\) is for the PyTorch backends"):
        Predictor(loaded, backend="onnxruntime", amp=True)
    with pytest.raises(ConfigError, match="backend must be one of eager, compile, onnxruntime, openvino, got 'tens"):
        Predictor(loaded, backend="tensorrt")
    result = run_cli("predict", run_dir, images[0], "--out", tmp_path / "p", "--backend", "onnxruntime",
                     "--onnx", onnx, "--no-progress")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "export" not in result.stdout  # the given export: no time spent exporting
    written = np.asarray(Image.open(tmp_path / "p" / images[0].name))
    assert (written == Predictor(loaded).predict(str(images[0])).labels).mean() >= 0.999
    exporting = run_cli("predict", run_dir, images[0], "--out", tmp_path / "q", "--backend", "onnxruntime",
                        "--no-progress")  # fmt: skip
    assert exporting.returncode == 0, exporting.stderr
    assert re.search(r"before that, exporting the model to ONNX and verifying it took \d+\.\d s \(pass --onnx",
                     exporting.stdout)  # fmt: skip


@pytest.mark.slow  # inductor compiles C++ on the CPU: tens of seconds
def test_predict_through_torch_compile_gives_the_eager_labels(run_dir):
    loaded = load_model(run_dir)
    image = str(sorted((run_dir.parent / "cache").rglob("leftImg8bit/val/**/*.png"))[0])
    compiled = Predictor(loaded, backend="compile", window="off").predict(image).labels
    assert (compiled == Predictor(loaded, window="off").predict(image).labels).mean() >= 0.999
