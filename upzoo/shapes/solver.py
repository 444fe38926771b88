"""Which input sizes does a model accept? Answered analytically from the stride arithmetic of its
layers, with a meta-device probing fallback for models it cannot analyse (and it says which).

For a U-Net (upzoo's ``UNet`` or an smp ``Unet``), one meta trace of the encoder records, for every
encoder feature, the chain of size-changing layers that produces it; each layer's exact rule
(:mod:`upzoo.shapes.rules`) then gives the feature sizes for any input size by arithmetic alone,
and a size is valid when every decoder upsampler's analytic output matches the skip it is
concatenated with. Axes are independent, so validity is decided per axis.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Literal

import torch
from torch import nn

from upzoo.errors import ConfigError, ShapeError
from upzoo.models.sizes import AxisRule
from upzoo.shapes.layer_table import layer_modules, to_meta
from upzoo.shapes.rules import layer_rule

__all__ = ["AxisRule", "AxisCheck", "ShapeSolver"]

Path = Literal["analytic", "probe"]
MAX_RANGE = 1_000_000  # sizes a valid_sizes() query may span (arithmetic)
MAX_PROBED_RANGE = 4_096  # the same where each size is probed on the meta device
_PROBE = 256  # per-axis size of the one encoder trace; any size the encoder alone can run at


@dataclass(frozen=True)
class AxisCheck:
    """The verdict for one axis: valid or not, the nearest valid sizes and the padding to reach one."""

    axis: int
    size: int
    valid: bool
    below: int | None
    above: int | None

    @property
    def padding(self) -> int | None:
        return None if self.above is None else self.above - self.size


@dataclass
class _Structure:
    """What the analysis needs: encoder feature size functions and decoder upsampler rules."""

    feature_sizes: list[Callable[[int, int], int]]  # per feature (shallow -> deep): (axis, n) -> size
    upsamplers: list[Callable[[tuple[int, ...]], tuple[int, ...]]]  # decoder stages, deepest first
    final_to_input: bool  # the last decoder stage must reach the input size itself
    multiple: int | None = None  # set instead when the model only requires divisibility
    native: Callable[[int, int], bool] | None = None  # the model's own rule (upzoo's UNet), used as is


class ShapeSolver:
    """Valid input sizes of a model, per spatial axis.

    Args:
        model: any ``nn.Module`` taking ``(B, C, *S)``; its weights are not touched (meta copy).
        in_channels: needed only when it cannot be read from the model.
        spatial_dims: needed only when it cannot be read from the model.
        probe_size: a size known to run, for the probing fallback (default 64 per axis).

    Attributes:
        path: ``"analytic"`` or ``"probe"``; ``reason`` says why probing was needed.

    >>> from upzoo import UNet
    >>> solver = ShapeSolver(UNet(spatial_dims=2, in_channels=3, num_classes=2))
    >>> solver.rule(0).describe(), solver.check((350, 525))[0].above
    ('multiples of 8', 352)
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        in_channels: int | None = None,
        spatial_dims: int | None = None,
        probe_size: Sequence[int] | None = None,
    ) -> None:
        self.model = to_meta(model).eval()
        self.in_channels = in_channels or _read(model, "in_channels", None) or _first_conv_channels(model)
        self.spatial_dims = spatial_dims or _read(model, "spatial_dims", 2)
        self.probe_size = tuple(probe_size) if probe_size else (64,) * self.spatial_dims
        self.reason = ""
        self._structure: _Structure | None = None
        try:
            self._structure = self._analyse()
            self.path: Path = "analytic"
        except _NoRule as why:
            self.path = "probe"
            self.reason = str(why)
        self._rules: dict[int, AxisRule | None] = {}

    # -- analysis ----------------------------------------------------------------------------------
    def _analyse(self) -> _Structure:
        from upzoo.models.smp_adapter import UpsamplerUnetDecoderBlock
        from upzoo.models.smp_decoders import PointDecoder
        from upzoo.models.unet import UNet

        model = self.model
        native = isinstance(model, UNet) or isinstance(getattr(model, "decoder", None), PointDecoder)
        if native:  # the rule its input policy applies: the answers agree by construction
            return _Structure([], [], final_to_input=False, native=model.axis_valid)
        if hasattr(model, "encoder") and hasattr(model, "decoder") and hasattr(model.decoder, "blocks"):
            encoder = model.encoder
            blocks = list(model.decoder.blocks)
            if not all(isinstance(b, UpsamplerUnetDecoderBlock) for b in blocks):
                stride = getattr(encoder, "output_stride", None)
                if stride is None:
                    raise _NoRule("an smp decoder without a known output stride")
                return _Structure([], [], final_to_input=False, multiple=int(stride))
            ups = [b.upsample for b in blocks]
        else:
            raise _NoRule(f"no stride analysis for {type(model).__name__}; probing sizes on the meta device")
        rules = [layer_rule(u) for u in ups]
        chains, _ = self._encoder_chains(encoder)
        chains = chains[1:]  # smp encoders return the input as feature 0
        n_skip = len(chains) - 1
        if len(ups) not in (n_skip, n_skip + 1):
            raise _NoRule(f"{len(ups)} decoder stages for {len(chains)} encoder features")

        def feature_size(chain):
            return lambda axis, n: reduce(lambda size, rule: rule(axis, size), chain, n)

        return _Structure([feature_size(c) for c in chains], rules, final_to_input=len(ups) == n_skip + 1)

    def _encoder_chains(self, encoder: nn.Module):
        """Trace the encoder once; return, per feature, the chain of per-axis rules producing it."""
        records: list[tuple[nn.Module, tuple[int, ...], tuple[int, ...]]] = []
        handles = []
        for _, module in layer_modules(encoder):

            def hook(mod, args, out, records=records):
                if args and isinstance(args[0], torch.Tensor) and isinstance(out, torch.Tensor):
                    records.append((mod, tuple(args[0].shape[2:]), tuple(out.shape[2:])))

            handles.append(module.register_forward_hook(hook))
        probe = (_PROBE,) * self.spatial_dims
        try:
            with torch.no_grad():
                features = encoder(torch.empty(1, self.in_channels, *probe, device="meta"))
        except Exception as exc:  # noqa: BLE001 - any failure means: no analysis, probe instead
            raise _NoRule(f"the encoder did not run on the meta device ({type(exc).__name__})") from None
        finally:
            for h in handles:
                h.remove()
        running, chain, points = probe, [], {probe: 0}
        for module, size_in, size_out in records:
            if size_in != running or size_out == size_in:
                continue  # a parallel branch, or a layer that keeps the size
            rule = layer_rule(module)
            if rule is None or rule(size_in) != size_out:
                raise _NoRule(f"no size rule for {type(module).__name__} in the encoder")
            chain.append(lambda axis, n, rule=rule: _axis_rule(rule, axis, n, self.spatial_dims))
            running = size_out
            points.setdefault(running, len(chain))
        sizes = [tuple(f.shape[2:]) for f in features]
        if any(s not in points for s in sizes):
            raise _NoRule("an encoder feature is produced by an operation without a rule (a functional call)")
        return [chain[: points[s]] for s in sizes], sizes

    # -- answers -----------------------------------------------------------------------------------
    def axis_valid(self, axis: int, n: int) -> bool:
        """Whether size ``n`` on ``axis`` is accepted natively (without padding)."""
        if n < 1:
            return False
        if self._structure is None:
            size = list(self._valid_probe_base())
            size[axis] = n
            return self._probe(tuple(size))
        s = self._structure
        if s.native is not None:
            return s.native(axis, n)
        if s.multiple is not None:  # smp's own decoder resizes to the skips; smp checks divisibility
            return n % s.multiple == 0
        feats = []
        for f in s.feature_sizes:
            value = f(axis, n)
            if value < 1:
                return False
            feats.append(value)
        targets = feats[::-1][1:] + ([n] if s.final_to_input else [])
        y = feats[-1]
        for rule, target in zip(s.upsamplers, targets):
            y = _axis_rule(rule, axis, y, self.spatial_dims)
            if y != target:
                return False
        return True

    def is_valid(self, size: Sequence[int]) -> bool:
        """Whether the spatial ``size`` is accepted natively on every axis."""
        return all(self.axis_valid(a, n) for a, n in enumerate(size))

    def valid_sizes(self, axis: int, low: int, high: int) -> list[int]:
        """Every valid size in ``[low, high]`` on ``axis``.

        Raises:
            ShapeError: an empty range, or one wider than ``MAX_RANGE`` sizes.
        """
        most = MAX_RANGE if self.path == "analytic" else MAX_PROBED_RANGE
        if not 1 <= low <= high or high - low >= most:
            raise ConfigError(
                f"a size range LOW:HIGH needs 1 <= LOW <= HIGH and at most {most:,} sizes "
                f"({self.path} path), got {low}:{high}"
            )
        rule = self.rule(axis) if self.path == "analytic" else None
        if rule is not None:
            return list(range(rule.above(low), high + 1, rule.multiple))
        return [n for n in range(low, high + 1) if self.axis_valid(axis, n)]

    def rule(self, axis: int, *, search: int = 4096) -> AxisRule | None:
        """The arithmetic rule of valid sizes on ``axis`` (checked on ``1..search``), or ``None`` if
        the valid sizes follow no single ``minimum + k * multiple`` pattern."""
        if axis in self._rules:
            return self._rules[axis]
        if self._structure is not None and self._structure.native is not None:
            return self.model.size_rules[axis]
        limit = search if self.path == "analytic" else 256
        valid = [n for n in range(1, limit + 1) if self.axis_valid(axis, n)]
        found = None
        if len(valid) >= 2:
            step = reduce(math.gcd, (b - a for a, b in zip(valid, valid[1:])))
            candidate = AxisRule(step, valid[0])
            if all(candidate.is_valid(n) == (n in set(valid)) for n in range(1, limit + 1)):
                found = candidate
        self._rules[axis] = found
        return found

    def check(self, size: Sequence[int], *, window: int = 4096) -> list[AxisCheck]:
        """Per axis: valid or not, and the nearest valid sizes below and above.

        Raises:
            ShapeError: a size with another number of axes than the model's, or a size below 1.
        """
        if len(size) != self.spatial_dims:
            raise ShapeError(
                f"the model has {self.spatial_dims} spatial axes, got a size with {len(size)}: {tuple(size)}"
            )
        out = []
        for axis, n in enumerate(size):
            if n < 1:
                raise ShapeError(f"sizes must be positive, got {tuple(size)}")
            rule = self.rule(axis)
            if self.axis_valid(axis, n):
                out.append(AxisCheck(axis, n, True, n, n))
                continue
            if rule is not None:
                k = (n - rule.minimum) // rule.multiple
                below = rule.minimum + k * rule.multiple if n > rule.minimum else None
                above = rule.minimum + (k + 1) * rule.multiple if n > rule.minimum else rule.minimum
            else:
                below = next((m for m in range(n - 1, max(0, n - window), -1) if self.axis_valid(axis, m)), None)
                above = next((m for m in range(n + 1, n + window) if self.axis_valid(axis, m)), None)
            out.append(AxisCheck(axis, n, False, below, above))
        return out

    # -- probing -----------------------------------------------------------------------------------
    def _probe(self, size: tuple[int, ...]) -> bool:
        try:
            with torch.no_grad():
                self.model(torch.empty(1, self.in_channels, *size, device="meta"))
            return True
        except Exception:  # noqa: BLE001 - any failure is an invalid size
            return False

    def _valid_probe_base(self) -> tuple[int, ...]:
        if not hasattr(self, "_base"):
            if not self._probe(self.probe_size):
                raise ShapeError(
                    f"{type(self.model).__name__} does not run at the probe size {self.probe_size}; "
                    f"pass probe_size= a size it accepts"
                )
            self._base = self.probe_size
        return self._base


class _NoRule(Exception):
    """Internal: the analytic path does not apply; fall back to probing."""


def _axis_rule(rule, axis: int, n: int, dims: int) -> int:
    sizes = [n] * dims
    return rule(tuple(sizes))[axis]


def _read(model: nn.Module, name: str, default):
    value = getattr(model, name, None)
    return value if isinstance(value, int) else default


def _first_conv_channels(model: nn.Module) -> int:
    for module in model.modules():
        if isinstance(module, nn.modules.conv._ConvNd):
            return module.in_channels
    raise ShapeError(f"cannot tell the input channels of {type(model).__name__}; pass in_channels=")
