"""Valid input sizes of a model on one axis, as an arithmetic rule: the one rule that the U-Net's
input policy (pad or strict), ``upzoo shapes check`` and the valid-size solver all apply."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce

import torch

__all__ = ["AxisRule", "find_axis_rule"]


@dataclass(frozen=True)
class AxisRule:
    """Valid sizes on one axis: ``n >= minimum`` and ``(n - minimum) % multiple == 0``.

    >>> rule = AxisRule(multiple=4, minimum=1)
    >>> rule.is_valid(17), rule.below(16), rule.above(16)
    (True, 13, 17)
    """

    multiple: int
    minimum: int

    def is_valid(self, n: int) -> bool:
        return n >= self.minimum and (n - self.minimum) % self.multiple == 0

    def above(self, n: int) -> int:
        """The smallest valid size ``>= n``."""
        if n <= self.minimum:
            return self.minimum
        return self.minimum + -(-(n - self.minimum) // self.multiple) * self.multiple

    def padding(self, n):
        """How much to add to ``n`` to reach :meth:`above` (``n`` may be a symbolic size: no branch).

        Examples:
            >>> [AxisRule(multiple=4, minimum=5).padding(n) for n in (1, 5, 6, 9)]
            [4, 0, 3, 0]
        """
        steps = (torch.sym_max(n, self.minimum) - self.minimum + self.multiple - 1) // self.multiple
        return self.minimum + steps * self.multiple - n  # floor division only: traced, no modulo

    def below(self, n: int) -> int | None:
        """The largest valid size ``<= n`` (``None`` below the minimum)."""
        if n < self.minimum:
            return None
        return self.minimum + (n - self.minimum) // self.multiple * self.multiple

    def describe(self) -> str:
        if self.multiple == 1:
            return f"any size >= {self.minimum}"
        if self.minimum % self.multiple == 0:
            return f"multiples of {self.multiple}" + (f" (>= {self.minimum})" if self.minimum > self.multiple else "")
        return f"{self.minimum} + k*{self.multiple} (k >= 0)"


def find_axis_rule(valid: Callable[[int], bool], limit: int) -> tuple[AxisRule | None, list[int]]:
    """The rule that ``valid`` follows on ``1..limit`` and the valid sizes found there.

    Returns ``(None, sizes)`` when the sizes follow no single ``minimum + k * multiple`` pattern
    (or fewer than two are valid).
    """
    sizes = [n for n in range(1, limit + 1) if valid(n)]
    if len(sizes) < 2:
        return None, sizes
    step = reduce(math.gcd, (b - a for a, b in zip(sizes, sizes[1:])))
    candidate = AxisRule(step, sizes[0])
    found = set(sizes)
    if all(candidate.is_valid(n) == (n in found) for n in range(1, limit + 1)):
        return candidate, sizes
    return None, sizes
