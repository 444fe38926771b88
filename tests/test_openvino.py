"""OpenVINO: the IR export verified against PyTorch, float32 weights and precision set explicitly
(never OpenVINO's bf16 default), the predictor's backend, and the refusals."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from upzoo.errors import ConfigError, DataError
from upzoo.inference import Predictor, load_model
from upzoo.inference.export import export_model

pytestmark = pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="pip install -e '.[openvino]'")


@pytest.fixture(scope="module")
def exported(seg_run, tmp_path_factory) -> tuple:
    loaded = load_model(seg_run)
    path = tmp_path_factory.mktemp("openvino") / "model.xml"
    return loaded, export_model(loaded, "openvino", path)


def test_the_ir_is_verified_written_with_float32_weights_and_its_contract(exported):
    import openvino as ov

    loaded, report = exported
    path = Path(report["path"])
    assert [c["ok"] for c in report["checks"]] == [True, True, True]
    assert max(c["max_abs_diff"] for c in report["checks"]) <= 1e-4
    model = ov.Core().read_model(str(path))
    assert model.get_rt_info(["upzoo", "upzoo.task"]).astype(str) == "segmentation"
    constants = [op for op in model.get_ops() if op.get_type_name() == "Constant" and op.get_output_size()]
    float_types = {str(op.get_output_element_type(0)) for op in constants if "f" in str(op.get_output_element_type(0))}
    assert float_types == {"<Type: 'float32'>"}  # OpenVINO's save_model stores float16 unless told not to
    params = sum(p.numel() for p in loaded.model.parameters())
    assert report["bytes"] >= 4 * params and not list(path.parent.glob(".tmp-*"))


def test_the_runner_sets_float32_where_openvinos_default_may_be_bfloat16(exported):
    from upzoo.inference.openvino_runtime import openvino_runner

    loaded, report = exported
    x = torch.rand(2, 3, 32, 64)
    with torch.no_grad():
        expected = loaded.model(x)
    run = openvino_runner(report["path"], "f32")
    assert run.precision == "f32"  # what the compiled model reports, whatever the CPU's default is
    assert np.abs(run(x.numpy()) - expected.numpy()).max() <= 1e-4


@pytest.mark.slow
def test_the_openvino_backend_predicts_as_eager(seg_run):
    loaded = load_model(seg_run)
    eager = Predictor(loaded)
    openvino = Predictor(loaded, backend="openvino")
    image = np.random.default_rng(0).integers(0, 256, (40, 70, 3), dtype=np.uint8)
    a, b = eager.predict(image), openvino.predict(image)
    assert (a.labels == b.labels).mean() >= 0.999


def test_bf16_is_refused_on_a_cpu_without_bf16_hardware(monkeypatch, seg_run):
    import upzoo.machine

    record = upzoo.machine.machine_record()
    monkeypatch.setattr(upzoo.machine, "machine_record", lambda: {**record, "isa": ["avx2"]})
    with pytest.raises(ConfigError, match=r"precision bf16: this CPU has no bfloat16 hardware \(neither AVX-512 bf16 "
                       r"nor AMX\), where OpenVINO emulates it 3-100x slower; use f32"):  # fmt: skip
        Predictor(load_model(seg_run), backend="openvino", precision="bf16")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"precision": "bf16"}, r"precision 'bf16' is set for backend 'openvino'"),
        ({"backend": "openvino", "amp": True}, r"amp \(bf16 autocast\) is for the PyTorch backends; openvino runs"),
        ({"backend": "openvino", "precision": "f16"}, r"OpenVINO precision must be one of f32, bf16, got 'f16'"),
    ],
)
def test_precision_and_amp_go_with_their_backends(seg_run, options, message):
    with pytest.raises(ConfigError, match=message):
        Predictor(load_model(seg_run), **options)


def test_an_openvino_export_goes_to_an_xml_file_and_never_over_one_without_overwrite(exported, tmp_path):
    loaded, report = exported
    with pytest.raises(ConfigError, match=r"an openvino export is written to a .xml file, got .*model.onnx"):
        export_model(loaded, "openvino", tmp_path / "model.onnx")
    with pytest.raises(DataError, match=r"already exists; pass --overwrite"):
        export_model(loaded, "openvino", report["path"])


def test_openvino_missing_names_the_extra(monkeypatch):
    import builtins

    from upzoo.inference.openvino_runtime import openvino_runner

    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name == "openvino":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(ConfigError, match=r"OpenVINO export and backend need openvino: pip install -e '.\[openvino\]'"):
        openvino_runner("model.xml")


@pytest.mark.slow
def test_a_block_openvino_cannot_convert_is_named_and_nothing_is_written(tmp_path):
    """OpenVINO's ONNX frontend does not convert the Fourier block's DFT graph: the block is named,
    with OpenVINO's own summary line, and no file is left."""
    from upzoo import UNet
    from upzoo.inference.export import ExportError, export_network

    net = UNet(spatial_dims=2, in_channels=3, num_classes=2, upsampler="interpolate",
               upsampler_options={"mode": "fourier"}, channels=(4, 8), strides=(2,))  # fmt: skip
    with pytest.raises(ExportError, match=r"cannot export UNet to openvino: block decoder.0.upsample "
                       r"\(InterpolateUpsampler\) fails: OpConversionFailure: Conversion is failed for"):  # fmt: skip
        export_network(net, [(2, 3, 16, 16), (1, 3, 17, 15)], tmp_path / "u.xml", "openvino")
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_export_format_is_refused_before_any_work(seg_run):
    with pytest.raises(ConfigError, match=r"format must be one of onnx, exported-program, openvino, got 'tflite'"):
        export_model(load_model(seg_run), "tflite")
