"""Valid input sizes of a model on one axis, as an arithmetic rule: the one rule that the models'
input policy (pad or strict: :func:`policy_size`, for upzoo's U-Net and every smp model alike),
``upzoo shapes check`` and the valid-size solver all apply."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce
from typing import Any, Literal

import torch

from upzoo.errors import ConfigError, ShapeError

__all__ = ["AxisRule", "find_axis_rule", "InputPolicy", "check_input_policy", "policy_size"]

InputPolicy = Literal["pad", "strict"]


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


def check_input_policy(input_policy: Any) -> InputPolicy:
    """``input_policy`` if it is ``"pad"`` or ``"strict"``.

    Raises:
        ConfigError: any other value.
    """
    if input_policy not in ("pad", "strict"):
        raise ConfigError(f"input_policy must be 'pad' or 'strict', got {input_policy!r}")
    return input_policy


def policy_size(spatial: tuple[int, ...], rules: list[AxisRule] | tuple[AxisRule, ...], policy: InputPolicy):
    """The size a model with these per-axis ``rules`` runs at for input size ``spatial``: ``spatial``
    if valid, else the nearest valid size above it per axis (``"pad"``).

    >>> policy_size((30, 32), [AxisRule(multiple=16, minimum=16)] * 2, "pad")
    (32, 32)

    Raises:
        ShapeError: an invalid size under ``"strict"``, naming the nearest valid sizes per axis.
    """
    spatial = tuple(int(s) for s in spatial)
    invalid = [a for a, (s, rule) in enumerate(zip(spatial, rules)) if not rule.is_valid(s)]
    if invalid and policy == "strict":
        hints = []
        for axis in invalid:
            rule, s = rules[axis], spatial[axis]
            below = rule.below(s)
            hints.append(f"axis {axis}: {s} -> " + (f"{below} or " if below else "") + f"{rule.above(s)}")
        described = ", ".join(r.describe() for r in rules)
        raise ShapeError(
            f"input size {spatial} is not valid (per axis: {described}; input_policy='strict'); nearest valid "
            f"sizes: {'; '.join(hints)}; pad/crop the input or use input_policy='pad'"
        )
    return tuple(rule.above(s) for s, rule in zip(spatial, rules))
