"""Read ncnn's model files: the ``.param`` graph (text) and the ``.bin`` weights, into layers that
hold their parameters and their weight tensors, float32.

The ``.param`` format (ncnn's wiki, "param and model file structure"): the magic ``7767517``, a
line ``layer_count blob_count``, then one line per layer: ``type name bottom_count top_count``,
the bottom and top blob names, then ``key=value`` pairs; a key ``-233KK`` holds an array for key
``KK`` written ``count,v1,v2,...``. Values with a ``.`` or an exponent are floats, others ints.

The ``.bin`` file is the layers' weights one after another in graph order, each layer reading what
its type loads. A convolution's kernel is read with a 4-byte storage tag before it (``0x01306B47``:
float16, ``0`` or ``0x0002C056``: float32; int8 and table-quantised kernels are refused); biases,
PReLU slopes and constants are raw float32 with no tag. Every byte must be used: a file shorter or
longer than the graph needs is refused, as is a layer type this reader does not know.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from upzoo.errors import ConfigError

__all__ = ["NcnnLayer", "read_ncnn", "KNOWN_LAYERS"]

MAGIC = 7767517
FP16_TAG, FP32_TAG, INT8_TAG = 0x01306B47, 0x0002C056, 0x000D4B38
# the layer types whose weights this reader knows how to read (and which carry none)
WEIGHTED = ("Convolution", "Deconvolution", "PReLU", "MemoryData", "InnerProduct")
UNWEIGHTED = ("Input", "Split", "Concat", "Eltwise", "BinaryOp", "Interp", "PixelShuffle", "Swish", "Sigmoid",
              "ReLU", "Crop", "Pooling")  # fmt: skip
KNOWN_LAYERS = WEIGHTED + UNWEIGHTED


@dataclass
class NcnnLayer:
    """One layer of an ncnn graph: its type, name, bottom and top blobs, ``key=value`` parameters
    (arrays as lists) and weights (``weight``, ``bias``, ``slope``, ``data``; float32 tensors)."""

    type: str
    name: str
    bottoms: list[str]
    tops: list[str]
    params: dict[int, int | float | list[int | float]]
    weights: dict[str, torch.Tensor] = field(default_factory=dict)

    def get(self, key: int, default: int | float | list[int | float]) -> int | float | list[int | float]:
        return self.params.get(key, default)


def _number(text: str) -> int | float:
    return float(text) if any(c in text for c in ".eE") else int(text)


def _parse_line(line: str, where: str) -> NcnnLayer:
    tokens = line.split()
    try:
        kind, name, n_bottom, n_top = tokens[0], tokens[1], int(tokens[2]), int(tokens[3])
        blobs = tokens[4 : 4 + n_bottom + n_top]
        params: dict[int, int | float | list[int | float]] = {}
        for pair in tokens[4 + n_bottom + n_top :]:
            key, value = pair.split("=", 1)
            if int(key) <= -23300:  # an array: -233KK=count,v1,v2,...
                values = [_number(v) for v in value.split(",")]
                params[-int(key) - 23300] = values[1 : 1 + int(values[0])]
            else:
                params[int(key)] = _number(value)
    except (IndexError, ValueError) as error:
        raise ConfigError(f"{where}: not an ncnn layer line ({error}): {line.strip()[:80]!r}") from None
    if len(blobs) != n_bottom + n_top:
        raise ConfigError(f"{where}: layer {name} names {len(blobs)} blobs, its counts say {n_bottom + n_top}")
    return NcnnLayer(kind, name, blobs[:n_bottom], blobs[n_bottom:], params)


def _parse_param(path: Path) -> list[NcnnLayer]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not lines or lines[0].strip() != str(MAGIC):
        raise ConfigError(f"{path}: not an ncnn .param file (its first line is not the magic {MAGIC}); "
                          "give the text .param beside its .bin")  # fmt: skip
    layers = [_parse_line(line, f"{path} line {i + 3}") for i, line in enumerate(lines[2:])]
    declared = int(lines[1].split()[0])
    if declared != len(layers):
        raise ConfigError(f"{path}: declares {declared} layers but holds {len(layers)}")
    for layer in layers:
        if layer.type not in KNOWN_LAYERS:
            raise ConfigError(
                f"{path}: layer {layer.name} has type {layer.type}, which upzoo's ncnn reader does not know "
                f"(it reads {', '.join(KNOWN_LAYERS)})"
            )
    return layers


class _Weights:
    """The ``.bin`` file as a cursor: raw float32 or tagged reads, the end checked once."""

    def __init__(self, path: Path) -> None:
        self.path, self.data, self.at = path, path.read_bytes(), 0

    def _take(self, nbytes: int, layer: NcnnLayer) -> bytes:
        if self.at + nbytes > len(self.data):
            raise ConfigError(f"{self.path} is shorter than its graph needs: layer {layer.name} ({layer.type}) "
                              f"needs {nbytes} bytes at offset {self.at}, the file has {len(self.data)}; "
                              "give the .bin that belongs to this .param")  # fmt: skip
        chunk = self.data[self.at : self.at + nbytes]
        self.at += nbytes
        return chunk

    def raw(self, count: int, layer: NcnnLayer) -> torch.Tensor:
        return torch.from_numpy(np.frombuffer(self._take(4 * count, layer), dtype="<f4").copy())

    def tagged(self, count: int, layer: NcnnLayer) -> torch.Tensor:
        tag = int.from_bytes(self._take(4, layer), "little")
        if tag == FP16_TAG:
            values = np.frombuffer(self._take(2 * count, layer), dtype="<f2").astype(np.float32)
            self._take((-2 * count) % 4, layer)  # float16 data is padded to 4 bytes
            return torch.from_numpy(values)
        if tag in (0, FP32_TAG):
            return self.raw(count, layer)
        kind = "int8" if tag == INT8_TAG else "table-quantised"
        raise ConfigError(f"{self.path}: layer {layer.name} stores {kind} weights (tag {tag:#010x}); upzoo reads "
                          "float32 and float16 ncnn weights only")  # fmt: skip

    def finish(self) -> None:
        if self.at != len(self.data):
            raise ConfigError(f"{self.path} is longer than its graph needs: {len(self.data) - self.at} bytes left "
                              f"after the last layer (of {len(self.data)}); give the .bin of this .param")  # fmt: skip


def _load_weights(layer: NcnnLayer, weights: _Weights) -> None:
    p = layer.params
    if layer.type in ("Convolution", "Deconvolution", "InnerProduct"):
        bias_key, size_key = (1, 2) if layer.type == "InnerProduct" else (5, 6)
        if p.get(8, 0):
            raise ConfigError(f"{weights.path}: layer {layer.name} is int8-quantised; upzoo reads float weights")
        layer.weights["weight"] = weights.tagged(int(p.get(size_key, 0)), layer)
        if p.get(bias_key, 0):
            layer.weights["bias"] = weights.raw(int(p[0]), layer)
    elif layer.type == "PReLU":
        layer.weights["slope"] = weights.raw(int(p.get(0, 0)), layer)
    elif layer.type == "MemoryData":
        shape = [int(p.get(k, 0)) for k in (2, 1, 0)]  # c, h, w
        layer.weights["data"] = weights.raw(int(np.prod([s for s in shape if s])), layer)


def read_ncnn(param: str | Path) -> list[NcnnLayer]:
    """The layers of ``param`` with their weights read from the ``.bin`` beside it, in graph order.

    Raises:
        ConfigError: a missing file, a file that is not ncnn's, a layer type the reader does not
            know, quantised weights, or a ``.bin`` shorter or longer than the graph needs.
    """
    param = Path(param)
    binary = param.with_suffix(".bin")
    for path, what in ((param, ".param graph"), (binary, ".bin weights beside it")):
        if not path.is_file():
            raise ConfigError(f"ncnn model: no {what} at {path}; give the path of a .param file with its .bin")
    layers = _parse_param(param)
    weights = _Weights(binary)
    for layer in layers:
        _load_weights(layer, weights)
    weights.finish()
    return layers
