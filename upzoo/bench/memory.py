"""Peak memory of a call. CUDA: the caching allocator's peak statistics. CPU: the process's peak
resident set size minus the RSS just before the call (garbage is collected and free heap memory
returned to the OS first, so the baseline is honest). On Linux the kernel's own high-water mark
(``VmHWM``, reset through ``/proc/self/clear_refs``) gives the exact peak, however briefly it
lasted; elsewhere a background thread samples the RSS every ``interval`` seconds (a short-lived
peak can fall between samples)."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import psutil
import torch

from upzoo.errors import ConfigError

__all__ = ["MemoryPeak", "peak_memory", "estimate_training_bytes", "ensure_fits"]


@dataclass(frozen=True)
class MemoryPeak:
    """Peak bytes a call added on top of what was allocated before it, and how it was measured."""

    bytes: int
    method: str

    @property
    def mib(self) -> float:
        return self.bytes / 2**20


def _release_free_heap() -> None:
    """Free unreachable objects (earlier garbage freed during the call would hide part of its peak)
    and return free heap memory to the OS, so the baseline holds only what is alive."""
    gc.collect()
    name = ctypes.util.find_library("c")
    if name:
        try:
            ctypes.CDLL(name).malloc_trim(0)
        except (OSError, AttributeError):  # not glibc
            pass


def peak_memory(
    fn: Callable[[], object], *, device: torch.device | str = "cpu", interval: float = 0.0005
) -> MemoryPeak:
    """Run ``fn()`` once and return the peak memory it added (see module docstring for the method).
    ``interval`` is the sampling period, used only where the kernel keeps no high-water mark."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return MemoryPeak(torch.cuda.max_memory_allocated(device) - before, "torch.cuda.max_memory_allocated")
    _release_free_heap()
    exact = _reset_high_water_mark()  # before the baseline: the mark starts at it
    baseline = psutil.Process().memory_info().rss
    if exact:
        fn()
        return MemoryPeak(max(_high_water_mark() - baseline, 0), "CPU peak RSS (the kernel's VmHWM)")
    return MemoryPeak(_sampled_peak(fn, interval) - baseline, f"CPU RSS sampled every {interval * 1e3:g} ms")


def _reset_high_water_mark() -> bool:
    """Set the process's peak RSS to its current RSS (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _high_water_mark() > 0
    except (OSError, ValueError):
        return False


def _high_water_mark() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise ValueError("no VmHWM in /proc/self/status")


def _sampled_peak(fn: Callable[[], object], interval: float) -> int:
    process = psutil.Process()
    peak = process.memory_info().rss
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, process.memory_info().rss)
            done.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        fn()
    finally:
        done.set()
        sampler.join()
    return max(peak, process.memory_info().rss)


def estimate_training_bytes(model: torch.nn.Module, input_shape: tuple[int, ...]) -> int:
    """A lower bound on the memory of a training step, from a meta-device trace (nothing is
    allocated): the weights with their gradients and two optimiser moments, the input, and every
    layer's output kept for the backward pass, at 4 bytes an element."""
    from upzoo.shapes import trace

    rows = trace(model, input_shape)
    params = sum(p.numel() for p in model.parameters())
    activations = sum(math.prod(r.output_shape) for r in rows if r.output_shape)
    return 4 * (4 * params + math.prod(input_shape) + activations)


def ensure_fits(nbytes: int, what: str) -> None:
    """Refuse, in one line, work that needs more memory than this machine has free.

    Raises:
        ConfigError: naming the estimate, the free memory and the fix.
    """
    available = psutil.virtual_memory().available
    if nbytes > available:
        raise ConfigError(
            f"{what} needs at least {nbytes / 2**30:.1f} GiB but {available / 2**30:.1f} GiB of memory "
            f"are free; use a smaller input, batch or channel count"
        )
