"""Transposed-convolution parameters that turn one size into another exactly."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

from upzoo.errors import ConfigError
from upzoo.shapes.rules import conv_transpose_output_size

__all__ = ["TransposedSolution", "solve_transposed", "MAX_KERNEL", "MAX_DILATION"]

MAX_KERNEL = 256
MAX_DILATION = 16


@dataclass(frozen=True)
class TransposedSolution:
    """One exact ``(kernel, padding, output_padding, dilation)`` for the given stride."""

    kernel_size: int
    padding: int
    output_padding: int
    dilation: int
    uneven_overlap: bool  # taps land unevenly on the output phases: checkerboard risk

    def to_dict(self) -> dict:
        return asdict(self)


def solve_transposed(
    in_size: int,
    out_size: int | None = None,
    *,
    stride: int,
    scale: int | None = None,
    max_kernel: int | None = None,
    max_dilation: int = 2,
) -> list[TransposedSolution]:
    """All ``(kernel, padding, output_padding, dilation)`` with ``ConvTranspose`` output exactly
    ``out_size`` (or ``in_size * scale``) from ``in_size`` at ``stride``, best first: even overlap
    before uneven, then no output_padding, then dilation 1, smaller kernel, smaller padding.

    >>> solve_transposed(33, 66, stride=2)[0]
    TransposedSolution(kernel_size=2, padding=0, output_padding=0, dilation=1, uneven_overlap=False)

    Raises:
        ConfigError: non-positive sizes or stride, or both/neither of ``out_size`` and ``scale``.
    """
    if (out_size is None) == (scale is None):
        raise ConfigError("give exactly one of out_size and scale")
    target = out_size if out_size is not None else in_size * int(scale)  # type: ignore[arg-type]
    for name, value in (("in_size", in_size), ("out size", target), ("stride", stride), ("max_dilation", max_dilation)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive int, got {value!r}")
    max_kernel = max_kernel or min(max(2 * stride + 1, 4), MAX_KERNEL)
    if max_kernel > MAX_KERNEL or max_dilation > MAX_DILATION:
        raise ConfigError(
            f"max_kernel and max_dilation go up to {MAX_KERNEL} and {MAX_DILATION}, got {max_kernel} and "
            f"{max_dilation}; larger transposed convs are not practical"
        )
    found = [
        TransposedSolution(kernel, padding, output_padding, dilation, _uneven(kernel, stride, dilation))
        for dilation in range(1, max_dilation + 1)
        for kernel in range(1, max_kernel + 1)
        for padding, output_padding in _paddings(in_size, target, stride, kernel, dilation)
    ]
    return sorted(found, key=lambda s: (s.uneven_overlap, s.output_padding > 0, s.dilation, s.kernel_size, s.padding))


def _uneven(kernel: int, stride: int, dilation: int) -> bool:
    """Whether the taps land unevenly on the ``stride`` output phases (as
    :func:`~upzoo.upsamplers.transposed.overlap_counts`, in ``O(kernel)`` for any stride)."""
    counts = Counter(tap * dilation % stride for tap in range(kernel))
    return len(counts) < stride or len(set(counts.values())) > 1


def _paddings(in_size: int, target: int, stride: int, kernel: int, dilation: int) -> list[tuple[int, int]]:
    """Every ``(padding, output_padding)`` with ``0 <= padding <= dilation * (kernel - 1)`` and
    ``0 <= output_padding < max(stride, dilation)`` reaching ``target``, solved for directly:
    ``target = base - 2 * padding + output_padding``, so the cost does not grow with the stride."""
    base = conv_transpose_output_size(in_size, kernel_size=kernel, stride=stride, dilation=dilation)
    limit = max(stride, dilation)
    # output_padding = target - base + 2 * padding must lie in [0, limit)
    low = max(0, -(-(base - target) // 2))
    high = min(dilation * (kernel - 1), (base - target + limit - 1) // 2)
    return [(p, target - base + 2 * p) for p in range(low, high + 1)]
