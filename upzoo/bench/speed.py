"""Timing done right: warm-up, device synchronisation, a fixed number of timed runs, median and spread."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["Timing", "time_call", "compare_calls", "memcpy_bandwidth", "synchronize", "measure_fps", "environment"]


@dataclass(frozen=True)
class Timing:
    """Seconds per call over ``runs`` timed calls."""

    median: float
    q1: float
    q3: float
    runs: int

    @property
    def spread(self) -> float:
        """Inter-quartile range relative to the median."""
        return (self.q3 - self.q1) / self.median if self.median > 0 else float("nan")


def synchronize(device: torch.device | str | None) -> None:
    """Wait for queued work on ``device`` (a no-op on the CPU)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _stats(samples: Sequence[float]) -> Timing:
    samples = sorted(samples)
    if len(samples) >= 4:
        q1, _, q3 = statistics.quantiles(samples, n=4)
    else:
        q1, q3 = samples[0], samples[-1]
    return Timing(median=statistics.median(samples), q1=q1, q3=q3, runs=len(samples))


def time_call(fn: Callable[[], object], *, warmup: int = 3, runs: int = 10, device=None) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then ``runs`` calls each bracketed by synchronisation."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        synchronize(device)
        samples.append(time.perf_counter() - start)
    return _stats(samples)


def compare_calls(
    fns: dict[str, Callable[[], object]], *, warmup: int = 3, runs: int = 10, device=None
) -> dict[str, Timing]:
    """Time several callables side by side, interleaved run by run so machine noise hits all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    synchronize(device)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            synchronize(device)
            samples[name].append(time.perf_counter() - start)
    return {name: _stats(s) for name, s in samples.items()}


def memcpy_bandwidth(megabytes: int = 256, runs: int = 5) -> float:
    """This machine's memory-copy bandwidth in bytes/s (read + write counted), measured now on the CPU."""
    n = megabytes * 2**20 // 4
    src = torch.ones(n)
    dst = torch.empty_like(src)
    timing = time_call(lambda: dst.copy_(src), warmup=2, runs=runs)
    return 2 * src.numel() * src.element_size() / timing.median


def environment(device: torch.device | str) -> dict:
    """What a timing depends on: the machine (:func:`upzoo.machine.machine_record`), with ``device``
    as a description (the GPU's name, or ``cpu (MODEL)``)."""
    from upzoo.machine import machine_record

    device = torch.device(device)
    record = machine_record(device)
    record["device"] = record["gpu"] if device.type == "cuda" else f"cpu ({record['cpu']})"
    return record


def measure_fps(
    model: torch.nn.Module,
    input_shape: tuple[int, ...],
    *,
    device: torch.device | str = "cpu",
    warmup: int = 3,
    iters: int = 10,
    amp: str = "none",
    channels_last: bool = False,
) -> dict:
    """Inference throughput of ``model`` in eval mode on a fixed random batch of ``input_shape``.

    Warm-up runs, then ``iters`` timed runs each bracketed by device synchronisation; FPS is the
    batch size over the median time, so it is defined for any number of iterations and images.
    """
    from upzoo.runtime import autocast

    device = torch.device(device)
    was_training = model.training
    model.eval().to(device)
    x = torch.rand(*input_shape, device=device)  # in [0, 1]: what image models take
    if channels_last:  # converted outside inference mode: the model stays trainable
        fmt = torch.channels_last if x.ndim == 4 else torch.channels_last_3d
        model.to(memory_format=fmt)
        x = x.contiguous(memory_format=fmt)
    try:
        with torch.inference_mode(), autocast(amp, device):
            timing = time_call(lambda: model(x), warmup=warmup, runs=iters, device=device)
    finally:
        model.train(was_training)
    return {
        "fps": input_shape[0] / timing.median,
        "latency_ms": timing.median * 1e3,
        "latency_q1_ms": timing.q1 * 1e3,
        "latency_q3_ms": timing.q3 * 1e3,
        "batch": input_shape[0],
        "input": list(input_shape),
        "iters": iters,
        "warmup": warmup,
        "amp": amp,
        "channels_last": channels_last,
        **environment(device),
    }


SPREAD_LIMIT = 0.2  # interquartile range / median above which a timing is flagged


def interleaved_fps(calls: dict[str, Callable[[], Any]], batch: int, rounds: int, device: str) -> dict[str, dict]:
    """FPS of each call from the median of ``rounds`` interleaved timings (each round runs every
    variant once, so a busy machine slows all alike), the interquartile range, and ``unstable``
    when the IQR exceeds 20 % of the median."""
    from upzoo.bench.speed import compare_calls

    timings = compare_calls(calls, warmup=2, runs=rounds, device=device)
    return {
        label: {
            "fps": batch / t.median,
            "ms": t.median * 1e3,
            "ms_q1": t.q1 * 1e3,
            "ms_q3": t.q3 * 1e3,
            "unstable": t.spread > SPREAD_LIMIT,
        }
        for label, t in timings.items()
    }


def inference_call(model: nn.Module, shape: Sequence[int], device: str, amp: str) -> Callable[[], None]:
    """One inference pass of ``model`` on a fixed input, under the same autocast as everything else."""
    from upzoo.runtime import autocast

    model = model.to(device).eval()
    x = torch.rand(*shape, device=device)  # in [0, 1]: what image models take
    dev = torch.device(device)

    def run() -> None:
        with torch.inference_mode(), autocast(amp, dev):
            model(x)

    return run
