"""The machine a figure came from, recorded with every run, benchmark and comparison: a number holds
on the kind of machine it was measured on, and a table that mixes kinds says so.

>>> record = machine_record("cpu")
>>> sorted(record)[:3]
['cores', 'cpu', 'cpu_capability']
>>> machine_kind(record) == machine_kind(machine_record("cpu"))
True
"""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

__all__ = ["machine_record", "machine_kind", "cpu_name", "instruction_sets", "installed_runtimes", "RUNTIMES"]

#: The instruction sets that decide which kernels (and precisions) run fast: name -> the cpuinfo flags
#: that must all be present (x86 ``flags``; ARM ``Features``: ``asimd`` is NEON on AArch64).
ISA_FLAGS = {
    "avx2": ("avx2", "fma"),
    "avx512": ("avx512f",),
    "avx512_bf16": ("avx512_bf16",),
    "amx": ("amx_tile", "amx_bf16"),
    "neon": ("asimd",),
}

#: The deployment runtimes upzoo looks for (their pip distribution names), none of them imported.
RUNTIMES = ("onnxruntime", "openvino", "ncnn", "executorch", "ai-edge-litert", "coremltools", "tensorrt")


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags from ``cpuinfo`` (the text of ``/proc/cpuinfo``; read here when None):
    x86's ``flags`` line or ARM's ``Features``; empty where neither is known."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as info:
                cpuinfo = info.read()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def instruction_sets(flags: set[str] | None = None) -> list[str]:
    """Which of :data:`ISA_FLAGS` the CPU has (``flags``: :func:`cpu_flags` when None), in that order.

    >>> instruction_sets({"avx2", "fma", "avx512f", "avx512_bf16"})
    ['avx2', 'avx512', 'avx512_bf16']
    """
    flags = cpu_flags() if flags is None else flags
    return [name for name, needed in ISA_FLAGS.items() if all(f in flags for f in needed)]


def installed_runtimes() -> dict[str, str | None]:
    """Each of :data:`RUNTIMES` with its installed version, or None (nothing is imported)."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in RUNTIMES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def machine_record(device: torch.device | str | None = None) -> dict[str, Any]:
    """What a figure depends on: CPU model, its instruction sets (``isa``: :func:`instruction_sets`),
    cores and the threads PyTorch uses, PyTorch and the CPU kernels it dispatches to
    (``cpu_capability``: ``default``, ``avx2``, ``avx512``; set by ``ATEN_CPU_CAPABILITY``), and for a
    CUDA ``device`` the GPU's name, CUDA and cuDNN versions."""
    record: dict[str, Any] = {
        "cpu": cpu_name(),
        "isa": instruction_sets(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability().lower(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
    }
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        record.update(
            device="cuda",
            gpu=torch.cuda.get_device_name(index),
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
        )
    else:
        record["device"] = "cpu"
    return record


def machine_kind(record: dict[str, Any] | None) -> str:
    """A short label of the kind of machine: the GPU where one was used, else the CPU model and its
    kernels (two records of one kind give the same label; threads and versions are left out)."""
    if not record:
        return "unknown machine"
    if record.get("gpu"):
        return f"{record['gpu']} (CUDA {record.get('cuda')})"
    return f"{record.get('cpu', '?')} [{record.get('cpu_capability', '?')}]"
