"""What runs the model inside a :class:`~upzoo.inference.Predictor`: ``eager`` (the PyTorch module),
``compile`` (``torch.compile`` with dynamic sizes), ``onnxruntime`` (the verified ONNX export of the
run — given, or exported into a temporary folder when the predictor is built) or ``openvino`` (the
verified OpenVINO IR, exported into a temporary folder, run at the precision asked for: float32
unless ``bf16``). Windows, TTA, scales and writers are the predictor's and the same for every backend."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from upzoo.errors import ConfigError
from upzoo.runs.trained_model import LoadedModel
from upzoo.runtime import main_output

__all__ = ["Backend", "BACKENDS", "model_runner"]

Backend = Literal["eager", "compile", "onnxruntime", "openvino"]
BACKENDS = ("eager", "compile", "onnxruntime", "openvino")


def model_runner(
    loaded: LoadedModel, model: nn.Module, backend: str, device: torch.device, onnx_path: str | Path | None = None,
    precision: str = "f32",
) -> Callable[[torch.Tensor], torch.Tensor]:  # fmt: skip
    """``(N, C, *S) -> (N, K, *S)`` logits by ``backend``.

    Raises:
        ConfigError: an unknown backend, onnxruntime or openvino off the CPU, an ``onnx_path`` for
            another backend, a ``precision`` for another backend than openvino (or one this CPU lacks
            in hardware), or the runtime's packages missing.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if onnx_path is not None and backend != "onnxruntime":
        raise ConfigError(f"onnx_path goes with backend 'onnxruntime', not {backend!r}")
    if precision != "f32" and backend != "openvino":
        raise ConfigError(f"precision {precision!r} is set for backend 'openvino'; the PyTorch backends take amp "
                          "(bf16 autocast), onnxruntime runs float32")  # fmt: skip
    if backend == "eager":
        return lambda x: main_output(model(x))
    if backend == "compile":
        compiled = torch.compile(model, dynamic=True)
        return lambda x: main_output(compiled(x))
    if device.type != "cpu":
        raise ConfigError(f"backend {backend!r} runs on the CPU here; use device 'cpu' or backend 'eager'")
    return _openvino_runner(loaded, precision) if backend == "openvino" else _onnx_runner(loaded, onnx_path)


def _openvino_runner(loaded: LoadedModel, precision: str) -> Callable[[torch.Tensor], torch.Tensor]:
    from upzoo.inference.export import export_model
    from upzoo.inference.openvino_runtime import check_openvino_precision, openvino_runner

    check_openvino_precision(precision)  # before the export: a refused precision costs nothing
    with tempfile.TemporaryDirectory(prefix="upzoo-openvino-") as folder:
        path = export_model(loaded, "openvino", Path(folder) / "model.xml")["path"]
        run = openvino_runner(path, precision)  # compiled: the files may go
    return lambda x: torch.from_numpy(run(x.detach().float().contiguous().numpy()))


def _onnx_runner(loaded: LoadedModel, onnx_path: str | Path | None) -> Callable[[torch.Tensor], torch.Tensor]:
    try:
        import onnxruntime as ort
    except ImportError:
        raise ConfigError("backend 'onnxruntime' needs the export extra: pip install -e '.[export]'") from None
    if onnx_path is None:  # export (verified) into a temporary folder; the session keeps what it needs
        from upzoo.inference.export import export_model

        with tempfile.TemporaryDirectory(prefix="upzoo-onnx-") as folder:
            path = export_model(loaded, "onnx", Path(folder) / "model.onnx")["path"]
            session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    else:
        if not Path(onnx_path).is_file():
            raise ConfigError(f"onnx_path {str(onnx_path)!r} does not exist; export one with upzoo export")
        session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    def run(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(session.run(None, {name: x.detach().float().contiguous().numpy()})[0])

    return run
