"""``export_model``: a trained model as ONNX or as a ``torch.export`` program, with dynamic batch and
spatial sizes, **verified** before it is reported: the written file runs (onnxruntime, or the reloaded
program) at three sizes, one of them off the model's size grid so the pad-and-crop path is in the
graph, and must match PyTorch within the tolerance. A file that computes something else is deleted
and the command fails, naming the block that does not export."""

from __future__ import annotations

import contextlib
import io
import os
import time
import warnings
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from upzoo.errors import ConfigError, DataError, UpzooError
from upzoo.inference.openvino_runtime import move_weights, openvino_runner, write_openvino
from upzoo.inference.verification_inputs import verification_input
from upzoo.runs.trained_model import LoadedModel
from upzoo.runtime import atomic_write, main_output

__all__ = ["ExportError", "export_model", "export_network", "check_sizes", "TOLERANCE"]

TOLERANCE = 1e-4  # max |exported - PyTorch| in float32


class ExportError(UpzooError):
    """The model does not export, or its export computes something else than the model."""


def _quiet(fn, *args, **kwargs):
    """Run an exporter without its progress chatter (its errors still propagate)."""
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def check_sizes(loaded: LoadedModel) -> list[tuple[int, ...]]:
    """Three input shapes ``(B, C, *S)`` (or ``(B, latent)`` for a generator): a size on the
    model's grid (at least twice its size step, so that no deepest feature has size 1), one off it
    on every axis, and a larger odd one; batch 2, 1 and 3."""
    from upzoo.models.factory import architecture_info

    options = loaded.spec.options
    if architecture_info(loaded.spec.architecture).latent_input:
        return [(2, options["latent_dim"]), (1, options["latent_dim"]), (3, options["latent_dim"])]
    dims = options.get("spatial_dims", 2)
    base = tuple(loaded.recipe.data.crop_size or ((32,) * dims if dims == 3 else (64, 64)))
    if loaded.task == "super_resolution":  # the low-resolution side of the training crop
        base = tuple(max(s // options["scale"], 8) for s in loaded.recipe.data.crop_size or (96, 96))
    if loaded.task in ("through_plane_sr", "through_plane_segmentation"):  # the thick side of the training patch
        base = tuple(max(s // f, 4) for s, f in zip(loaded.recipe.data.crop_size or (32, 32, 32), options["scale"]))
    rules = getattr(loaded.model, "size_rules", None)
    if rules is not None:  # on the grid, and no deepest feature of size 1 (a tracer specialises those)
        base = tuple(max(rule.above(s), rule.above(2 * rule.multiple)) for s, rule in zip(base, rules))
    channels = options.get("in_channels", getattr(loaded.model, "in_channels", 3))
    off = tuple(s + 1 for s in base)
    larger = tuple(s + s // 2 + 3 for s in base)
    return [(2, channels, *base), (1, channels, *off), (3, channels, *larger)]


def _dynamic_shapes(shape: tuple[int, ...]) -> tuple[dict[int, Any], ...]:
    dynamic = torch.export.Dim.DYNAMIC
    return ({axis: dynamic for axis in [0, *range(2, len(shape))]},)


def _reference(model: nn.Module, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        out = model(x)
    return main_output(out).float().numpy()


def _write_onnx(model: nn.Module, example: torch.Tensor, path: Path, opset: int | None) -> None:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise ConfigError(
            "ONNX export needs onnx, onnxruntime and onnxscript: pip install -e '.[export]' (or upzoo[export])"
        ) from None
    kwargs = {"opset_version": opset} if opset is not None else {}
    _quiet(
        torch.onnx.export,
        model,
        (example,),
        str(path),
        input_names=["input"],
        output_names=["output"],
        dynamic_shapes=_dynamic_shapes(tuple(example.shape)),
        dynamo=True,
        external_data=False,
        verbose=False,
        **kwargs,
    )


def _add_onnx_metadata(path: Path, contract: dict[str, str]) -> None:
    """Store the contract in the ONNX file's ``metadata_props`` (read back by onnxruntime's
    ``get_modelmeta().custom_metadata_map``)."""
    import onnx

    model = onnx.load(str(path))
    del model.metadata_props[:]
    for key, value in contract.items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))


def _onnx_runner(path: Path):
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"input": x.numpy()})[0]


def _write_program(model: nn.Module, example: torch.Tensor, path: Path, contract: dict[str, str] | None = None) -> None:
    import json

    from upzoo.inference.contract import CONTRACT_FILE

    program = _quiet(torch.export.export, model, (example,), dynamic_shapes=_dynamic_shapes(tuple(example.shape)))
    extra = {CONTRACT_FILE: json.dumps(contract, indent=2)} if contract else None
    torch.export.save(program, str(path), extra_files=extra)


def custom_ops(path: str | Path) -> list[str]:
    """The upzoo custom ops a saved ``.pt2`` program calls (loading it then needs ``import upzoo``)."""
    program = torch.export.load(str(path))
    names = {str(node.target) for node in program.graph_module.graph.nodes if node.op == "call_function"}
    return sorted(name for name in names if name.startswith("upzoo."))


def _program_runner(path: Path):
    module = torch.export.load(str(path)).module()

    def run(x: torch.Tensor) -> np.ndarray:
        with torch.no_grad():
            return module(x).float().numpy()

    return run


def _verify(model: nn.Module, run, shapes: list[tuple[int, ...]], seed: int = 0) -> list[dict[str, Any]]:
    """Run the exported file at every shape; the max abs difference to PyTorch at each."""
    generator = torch.Generator().manual_seed(seed)
    checks = []
    for shape in shapes:
        x = verification_input(model, shape, generator)
        got, expected = run(x), _reference(model, x)
        if got.shape != expected.shape:
            diff = float("inf")
        else:
            diff = float(np.abs(got.astype(np.float64) - expected).max()) if expected.size else 0.0
        checks.append({"input": "x".join(map(str, shape)), "max_abs_diff": diff, "ok": diff <= TOLERANCE})
    return checks


def _blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    from upzoo.upsamplers.base import Upsampler

    return [(name, m) for name, m in model.named_modules() if isinstance(m, Upsampler) and name]


def _culprit(model: nn.Module, example: torch.Tensor, fmt: str, folder: Path) -> str:
    """The first registered block that does not export (or whose export differs), tried alone at
    the input it sees in the model; '' if every block exports correctly on its own."""
    seen: dict[str, tuple] = {}
    hooks = [
        m.register_forward_pre_hook(lambda mod, args, name=name: seen.setdefault(name, args))
        for name, m in _blocks(model)
    ]
    with torch.no_grad():
        model(example)
    for hook in hooks:
        hook.remove()
    for name, block in _blocks(model):
        args = tuple(a for a in seen.get(name, ()) if isinstance(a, torch.Tensor))
        if len(args) != 1:  # guided blocks take two inputs: judged with their model
            continue
        path = folder / f".probe-{os.getpid()}{SUFFIXES[fmt]}"
        try:
            _write(fmt, block, args[0], path, None)
            bad = [c for c in _verify(block, _runner(fmt, path), [tuple(args[0].shape)]) if not c["ok"]]
            if bad:
                return f"block {name} ({type(block).__name__}) differs by {bad[0]['max_abs_diff']:.3g}"
        except ConfigError:
            raise
        except Exception as exc:
            return f"block {name} ({type(block).__name__}) fails: {_reason(exc)}"
        finally:
            path.unlink(missing_ok=True)
            path.with_suffix(".bin").unlink(missing_ok=True)  # an OpenVINO probe's weights
    return ""


def _reason(exc: BaseException) -> str:
    """The root cause of an exporter failure as one short line (exporters wrap it in steps)."""
    import re

    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    summary = [line[3:] for line in lines if line.startswith("-- ")]  # OpenVINO's conversion summary
    first = summary[-1] if summary else lines[0] if lines else type(exc).__name__
    text = re.sub(r"\x1b\[[0-9;]*m", "", first)
    return f"{type(exc).__name__}: {text[:200]}"


SUFFIXES = {"onnx": ".onnx", "exported-program": ".pt2", "openvino": ".xml"}


def _default_out(loaded: LoadedModel, fmt: str) -> Path:
    return loaded.checkpoint.parent / f"model{SUFFIXES[fmt]}"


def _write(
    fmt: str, model: nn.Module, example: torch.Tensor, path: Path, opset: int | None, contract: dict | None = None
) -> None:
    if fmt == "onnx":
        _write_onnx(model, example, path, opset)
        if contract:
            _add_onnx_metadata(path, contract)
    elif fmt == "openvino":
        write_openvino(lambda onnx_path: _write_onnx(model, example, onnx_path, opset), path, contract)
    else:
        _write_program(model, example, path, contract)


def _runner(fmt: str, path: Path):
    if fmt == "openvino":
        return openvino_runner(path, "f32")  # verified in float32, the precision set, not OpenVINO's default
    return _onnx_runner(path) if fmt == "onnx" else _program_runner(path)


FORMATS = tuple(SUFFIXES)


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ConfigError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def _write_verified(
    fmt: str,
    model: nn.Module,
    example: torch.Tensor,
    tmp: Path,
    opset: int | None,
    shapes: list,
    scratch: Path,
    contract: dict[str, str] | None = None,
    reference: nn.Module | None = None,
) -> list[dict[str, Any]]:
    """Write the export of ``model`` to ``tmp`` and check it at ``shapes`` against ``reference``
    (default: ``model``); the checks, or ``ExportError`` naming the block that does not export or
    differs (an ``OSError`` is the disk's, not a block's)."""
    try:
        _write(fmt, model, example, tmp, opset, contract)
        checks = _verify(reference or model, _runner(fmt, tmp), shapes)
    except (ConfigError, ExportError, OSError):
        raise
    except Exception as exc:
        where = _culprit(model, example, fmt, scratch)
        detail = where or f"the model fails: {_reason(exc)}"
        raise ExportError(f"cannot export {type(model).__name__} to {fmt}: {detail}; nothing was written") from None
    bad = [c for c in checks if not c["ok"]]
    if bad:
        where = _culprit(model, example, fmt, scratch)
        raise ExportError(
            f"the {fmt} export of {type(model).__name__} differs from PyTorch by {bad[0]['max_abs_diff']:.3g} at "
            f"input {bad[0]['input']} (limit {TOLERANCE:g}){'; ' + where if where else ''}; nothing was written"
        )
    return checks


def _check_target(out: Path, fmt: str, overwrite: bool) -> None:
    """An export goes to a file of its own kind: never over a checkpoint, over an existing file
    only with ``overwrite``."""
    suffix = SUFFIXES[fmt]
    if out.suffix.lower() != suffix:
        raise ConfigError(f"an {fmt} export is written to a {suffix} file, got {out}; name the file *{suffix}")
    if out.is_dir():
        raise ConfigError(f"{out} is a folder; --out takes the file to write, e.g. {out / ('model' + suffix)}")
    if out.exists() and not overwrite:
        raise DataError(f"{out} already exists; pass --overwrite to replace it or choose another --out")


def export_model(
    loaded: LoadedModel,
    fmt: str = "onnx",
    out: str | Path | None = None,
    *,
    opset: int | None = None,
    overwrite: bool = False,
    portable: bool = False,
) -> dict[str, Any]:
    """Export ``loaded.model`` (float32, CPU, eval) to ``out`` with its contract
    (:mod:`upzoo.inference.contract`) and verify it; returns the report ``{path, format, checks:
    [{input, max_abs_diff, ok}], contract, custom_ops, seconds, bytes}``. A ``.pt2`` holding upzoo's
    custom ops (the masked blur's fused kernel) needs ``import upzoo`` to load; ``portable`` traces
    the pure-PyTorch formulation instead, so it loads anywhere (``custom_ops`` lists what remains).

    Raises:
        ExportError: the model does not export, or the export differs from PyTorch by more than
            :data:`TOLERANCE` at a checked size (the file is not written; the block is named).
        ConfigError: an unknown format, or the ONNX packages missing.
    """
    _check_format(fmt)
    start = time.perf_counter()
    from upzoo.models.factory import architecture_info

    if architecture_info(loaded.spec.architecture).frozen_backbone:
        raise ConfigError(
            f"{loaded.spec.architecture} runs do not export yet: a timm backbone's dynamic image size does not "
            f"trace with dynamic shapes; the upsampling blocks themselves export (torch.onnx.export of the block)"
        )
    from upzoo.inference.contract import export_contract

    out = Path(out) if out is not None else _default_out(loaded, fmt)
    report = export_network(loaded.model, check_sizes(loaded), out, fmt, export_contract(loaded), opset=opset,
                            overwrite=overwrite, portable=portable)  # fmt: skip
    report["seconds"] = round(time.perf_counter() - start, 2)
    return report


def export_network(
    model: nn.Module, shapes: list[tuple[int, ...]], out: str | Path, fmt: str = "onnx",
    contract: dict[str, str] | None = None, *, opset: int | None = None, overwrite: bool = False,
    portable: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Export ``model`` (float32, CPU, eval) to ``out`` with ``contract`` as metadata, verified
    against PyTorch at ``shapes`` (the first is the tracing example) before it is written; the
    report of :func:`export_model`. ``upzoo export`` (a run) and ``upzoo upscale --export``
    (shipped weights) both write through here.

    Raises:
        ExportError, ConfigError: as :func:`export_model`.
    """
    _check_format(fmt)
    start = time.perf_counter()
    model = model.float().cpu().eval()
    out = Path(out)
    _check_target(out, fmt, overwrite)
    example = torch.randn(shapes[0], generator=torch.Generator().manual_seed(1))
    from upzoo.filters.blur_fused import pytorch_formulation
    from upzoo.inference.static_padding import with_static_same_padding

    checks: list[dict[str, Any]] = []
    exported = with_static_same_padding(model)  # TF "same" padding as constants: verified against the model

    def write(tmp: Path) -> None:  # written to a temporary file, verified there, renamed only when all pass
        with pytorch_formulation() if portable else contextlib.nullcontext():
            checks.extend(_write_verified(fmt, exported, example, tmp, opset, shapes, out.parent, contract, model))
        if fmt == "openvino":  # the IR's weights beside it, then its .xml (atomic_write)
            move_weights(tmp, out)

    try:
        atomic_write(out, write)
    finally:
        if fmt == "openvino":
            out.parent.joinpath(f".tmp-{os.getpid()}-{out.stem}.bin").unlink(missing_ok=True)
    return {
        "path": str(out),
        "format": fmt,
        "checks": checks,
        "contract": contract or {},
        "custom_ops": custom_ops(out) if fmt == "exported-program" else [],
        "tolerance": TOLERANCE,
        "bytes": out.stat().st_size + (out.with_suffix(".bin").stat().st_size if fmt == "openvino" else 0),
        "seconds": round(time.perf_counter() - start, 2),
    }
