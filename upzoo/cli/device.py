"""``upzoo device``: the machine as upzoo sees it — the same record every run and benchmark keeps."""

from __future__ import annotations

import os
from typing import Any

import click

from upzoo.cli.group import cli
from upzoo.tables import to_json

_ISA_NAMES = {"avx2": "AVX2", "avx512": "AVX-512", "avx512_bf16": "AVX-512 bf16", "amx": "AMX", "neon": "NEON"}


def device_report() -> dict[str, Any]:
    """The machine record, the CUDA devices, the installed runtimes and what ``train`` and ``predict``
    use here by default (the recipe's ``train.device: auto`` and ``train.amp: none``; eager float32)."""
    import torch

    from upzoo.machine import installed_runtimes, machine_record
    from upzoo.runtime import resolve_device

    record = machine_record()
    gpus = [{"name": torch.cuda.get_device_name(i), "memory_gib": round(torch.cuda.mem_get_info(i)[1] / 2**30, 1)}
            for i in range(torch.cuda.device_count())]  # fmt: skip
    device = resolve_device("auto")
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()  # oneDNN's kernels capped below the bf16 ones
    capped = cap in ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")
    native_bf16 = bool({"avx512_bf16", "amx"} & set(record["isa"])) and not capped
    if device.type == "cuda":
        native_bf16 = torch.cuda.is_bf16_supported()
    defaults = {
        "train": {
            "device": str(device),
            "precision": "float32 (train.amp: none)",
            "bf16_native": native_bf16,
            "onednn_max_cpu_isa": cap or None,
        },  # fmt: skip
        "predict": {"device": str(device), "backend": "eager", "precision": "float32"},
    }
    return {"machine": record, "gpus": gpus, "runtimes": installed_runtimes(), "defaults": defaults}


def _text(report: dict[str, Any]) -> str:
    machine, defaults = report["machine"], report["defaults"]
    isa = ", ".join(f"{label} {'yes' if key in machine['isa'] else 'no'}" for key, label in _ISA_NAMES.items())
    gpus = "; ".join(f"{g['name']} ({g['memory_gib']} GiB)" for g in report["gpus"]) or "none visible"
    present = [f"{name} {version}" for name, version in report["runtimes"].items() if version]
    absent = [name for name, version in report["runtimes"].items() if not version]
    cap = defaults["train"]["onednn_max_cpu_isa"]
    bf16 = (
        "bf16 autocast runs natively here (train.amp: bf16 to use it)"
        if defaults["train"]["bf16_native"]
        else f"bf16 kernels capped by ONEDNN_MAX_CPU_ISA={cap}: bf16 would be emulated, many times slower"
        if cap and {"avx512_bf16", "amx"} & set(machine["isa"])
        else "no bf16 hardware here: bf16 would be emulated, many times slower (keep float32)"
    )
    lines = [
        ("CPU", f"{machine['cpu']} ({machine['cores']} cores; PyTorch uses {machine['threads']} threads)"),
        ("instructions", isa),
        ("PyTorch", f"{machine['torch']}, CPU kernels {machine['cpu_capability']} (ATEN_CPU_CAPABILITY)"),
        ("GPUs", gpus),
        ("runtimes", "; ".join(present + ([f"not installed: {', '.join(absent)}"] if absent else []))),
        ("train", f"device {defaults['train']['device']}, {defaults['train']['precision']}; {bf16}"),
        ("predict", f"device {defaults['predict']['device']}, backend eager, float32"),
    ]
    return "\n".join(f"{name:<13}{value}" for name, value in lines)


@cli.command("device")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def device(as_json: bool) -> None:
    """Print the machine as upzoo sees it: CPU model and the instruction sets that decide speed and
    precision (AVX2, AVX-512, AVX-512 bf16, AMX, NEON), cores and threads, PyTorch's CPU kernels, CUDA
    devices, the deployment runtimes installed, and what train and predict use here by default.
    Every run's summary.json and every benchmark keep the same machine record."""
    report = device_report()
    click.echo(to_json(report) if as_json else _text(report))
