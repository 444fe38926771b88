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

__all__ = ["machine_record", "machine_kind", "cpu_name"]


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


def machine_record(device: torch.device | str | None = None) -> dict[str, Any]:
    """What a figure depends on: CPU model, cores and the threads PyTorch uses, PyTorch and the CPU
    kernels it dispatches to (``cpu_capability``: ``default``, ``avx2``, ``avx512``; set by
    ``ATEN_CPU_CAPABILITY``), and for a CUDA ``device`` the GPU's name, CUDA and cuDNN versions."""
    record: dict[str, Any] = {
        "cpu": cpu_name(),
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
