"""Transposed-convolution parameters that turn one size into another exactly."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from upzoo.errors import ConfigError
from upzoo.shapes.rules import conv_transpose_output_size
from upzoo.upsamplers.transposed import overlap_counts

__all__ = ["TransposedSolution", "solve_transposed"]


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
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive int, got {value!r}")
    max_kernel = max_kernel or max(2 * stride + 1, 4)
    found = []
    for dilation in range(1, max_dilation + 1):
        for kernel in range(1, max_kernel + 1):
            for output_padding in range(max(stride, dilation)):
                for padding in range(0, dilation * (kernel - 1) + 1):
                    size = conv_transpose_output_size(
                        in_size, kernel_size=kernel, stride=stride, padding=padding,
                        output_padding=output_padding, dilation=dilation,
                    )
                    if size == target:
                        uneven = len(set(overlap_counts(kernel, stride, dilation))) > 1
                        found.append(TransposedSolution(kernel, padding, output_padding, dilation, uneven))
    return sorted(found, key=lambda s: (s.uneven_overlap, s.output_padding > 0, s.dilation, s.kernel_size, s.padding))
