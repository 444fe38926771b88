"""OpenVINO: a model written as OpenVINO IR (``.xml`` + ``.bin``, converted from the verified ONNX
export) and run by OpenVINO's CPU plugin at a precision chosen, never inherited.

OpenVINO's CPU plugin runs float32 models in bfloat16 by default on CPUs with bf16 hardware
(AVX-512 bf16 or AMX; its ``INFERENCE_PRECISION_HINT``), and ``save_model`` stores weights in
float16 by default: both change the numbers silently (1e-2 against PyTorch on a pixel shuffle).
Here weights are saved in float32 and the precision is always set: ``f32`` unless ``bf16`` is asked
for, which is refused on a CPU without bf16 hardware (there it is emulated, 3-100x slower).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from upzoo.errors import ConfigError

__all__ = ["OPENVINO_PRECISIONS", "check_openvino_precision", "write_openvino", "openvino_runner", "move_weights"]

OPENVINO_PRECISIONS = ("f32", "bf16")


def _openvino():
    try:
        import openvino
    except ImportError:
        raise ConfigError("OpenVINO export and backend need openvino: pip install -e '.[openvino]'") from None
    return openvino


def check_openvino_precision(precision: str) -> str:
    """``precision`` when this CPU runs it in hardware.

    Raises:
        ConfigError: an unknown precision, or ``bf16`` on a CPU without AVX-512 bf16 or AMX.
    """
    if precision not in OPENVINO_PRECISIONS:
        raise ConfigError(f"OpenVINO precision must be one of {', '.join(OPENVINO_PRECISIONS)}, got {precision!r}")
    if precision == "bf16":
        from upzoo.machine import machine_record

        if not {"avx512_bf16", "amx"} & set(machine_record().get("isa", [])):
            raise ConfigError(
                "precision bf16: this CPU has no bfloat16 hardware (neither AVX-512 bf16 nor AMX), "
                "where OpenVINO emulates it 3-100x slower; use f32 (upzoo device names the CPU)"
            )
    return precision


def write_openvino(write_onnx: Callable[[Path], None], path: Path, contract: dict[str, str] | None) -> None:
    """Write ``path`` (``.xml``, its ``.bin`` beside it) from the ONNX file ``write_onnx`` makes, with
    float32 weights and ``contract`` in the model's ``rt_info`` under ``upzoo``."""
    ov = _openvino()
    with tempfile.TemporaryDirectory(prefix="upzoo-openvino-") as folder:
        onnx_path = Path(folder) / "model.onnx"
        write_onnx(onnx_path)
        model = ov.convert_model(str(onnx_path))
    for key, value in (contract or {}).items():
        model.set_rt_info(value, ["upzoo", key])
    ov.save_model(model, str(path), compress_to_fp16=False)  # OpenVINO's default stores float16 weights


def openvino_runner(path: str | Path, precision: str = "f32", threads: int | None = None):
    """A function ``(N, C, *S) float32 array -> output array`` running the IR at ``path`` on the CPU
    at ``precision`` (set explicitly; see the module). Its ``precision`` attribute is the
    precision the compiled model reports (OpenVINO's own reading, e.g. ``f32``)."""
    ov = _openvino()
    config = {"INFERENCE_PRECISION_HINT": "bf16" if check_openvino_precision(precision) == "bf16" else "f32"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    compiled = ov.Core().compile_model(str(path), "CPU", config)
    request = compiled.create_infer_request()

    def run(x: np.ndarray) -> np.ndarray:
        return np.array(request.infer([np.ascontiguousarray(x, dtype=np.float32)])[0])

    run.precision = str(compiled.get_property("INFERENCE_PRECISION_HINT").to_string())
    return run


def move_weights(tmp: Path, out: Path) -> None:
    """After verification: the temporary IR's ``.bin`` to the final name (the ``.xml`` follows)."""
    os.replace(tmp.with_suffix(".bin"), out.with_suffix(".bin"))
