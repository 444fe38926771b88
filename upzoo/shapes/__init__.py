"""Shape tools: exact per-layer rules, per-layer traces on the meta device, the valid-input-size
solver and the transposed-convolution parameter solver."""

from upzoo.shapes.layer_table import TraceRow, trace
from upzoo.shapes.rules import (
    conv_output_size,
    conv_transpose_output_size,
    interpolate_output_size,
    layer_output_shape,
    layer_rule,
    pool_output_size,
)
from upzoo.shapes.solver import AxisCheck, AxisRule, ShapeSolver
from upzoo.shapes.transposed_solver import TransposedSolution, solve_transposed

__all__ = [
    "conv_output_size",
    "conv_transpose_output_size",
    "interpolate_output_size",
    "pool_output_size",
    "layer_output_shape",
    "layer_rule",
    "AxisCheck",
    "AxisRule",
    "ShapeSolver",
    "TraceRow",
    "trace",
    "TransposedSolution",
    "solve_transposed",
]
