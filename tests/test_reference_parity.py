"""Agreement with the upsampler authors' code: their module ported here (pure PyTorch, from the public
repository), weights converted with ``load_reference_state_dict`` (and back), outputs and gradients
compared in float64."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from upzoo import create_upsampler
from upzoo.errors import ConfigError, DataError
from upzoo.upsamplers.reference_weights import load_reference_state_dict, reference_state_dict


class AuthorsDySample(nn.Module):
    """A port of ``DySample`` from tiny-smart/dysample (``dysample.py``, Liu et al., ICCV 2023): the
    same layers, buffer and arithmetic, written out for the test (``indexing="ij"`` is their
    ``meshgrid``'s default)."""

    def __init__(self, in_channels: int, scale: int = 2, style: str = "lp", groups: int = 4, dyscope: bool = False):
        super().__init__()
        self.scale, self.style, self.groups = scale, style, groups
        conv_in = in_channels // scale**2 if style == "pl" else in_channels
        out = 2 * groups if style == "pl" else 2 * groups * scale**2
        self.offset = nn.Conv2d(conv_in, out, 1)
        if dyscope:
            self.scope = nn.Conv2d(conv_in, out, 1, bias=False)
        # theirs is computed in the default float32; in float64 here, so that 1/3 is not rounded to
        # float32 (a 7e-8 difference at scale 3, below float32's resolution, is not a disagreement)
        h = torch.arange((-scale + 1) / 2, (scale - 1) / 2 + 1, dtype=torch.float64) / scale
        grid = torch.stack(torch.meshgrid([h, h], indexing="ij")).transpose(1, 2)
        self.register_buffer("init_pos", grid.repeat(1, groups, 1).reshape(1, -1, 1, 1))

    def sample(self, x: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        b, _, h, w = offset.shape
        offset = offset.view(b, 2, -1, h, w)
        coords_h, coords_w = torch.arange(h) + 0.5, torch.arange(w) + 0.5
        coords = torch.stack(torch.meshgrid([coords_w, coords_h], indexing="ij")).transpose(1, 2)
        coords = coords.unsqueeze(1).unsqueeze(0).type(x.dtype)
        normalizer = torch.tensor([w, h], dtype=x.dtype).view(1, 2, 1, 1, 1)
        coords = 2 * (coords + offset) / normalizer - 1
        coords = F.pixel_shuffle(coords.view(b, -1, h, w), self.scale).view(b, 2, -1, self.scale * h, self.scale * w)
        coords = coords.permute(0, 2, 3, 4, 1).contiguous().flatten(0, 1)
        sampled = F.grid_sample(x.reshape(b * self.groups, -1, h, w), coords, mode="bilinear", align_corners=False,
                                padding_mode="border")  # fmt: skip
        return sampled.view(b, -1, self.scale * h, self.scale * w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.style == "pl":
            x_ = F.pixel_shuffle(x, self.scale)
            raw = self.offset(x_) * self.scope(x_).sigmoid() if hasattr(self, "scope") else self.offset(x_)
            factor = 0.5 if hasattr(self, "scope") else 0.25
            return self.sample(x, F.pixel_unshuffle(raw, self.scale) * factor + self.init_pos)
        if hasattr(self, "scope"):
            return self.sample(x, self.offset(x) * self.scope(x).sigmoid() * 0.5 + self.init_pos)
        return self.sample(x, self.offset(x) * 0.25 + self.init_pos)


CASES = [
    (scale, groups, style, dyscope)
    for scale, groups, style, dyscope in itertools.product([2, 3, 4], [1, 2, 4], ["lp", "pl"], [False, True])
]


@pytest.mark.parametrize("scale, groups, style, dyscope", CASES)
def test_dysample_equals_the_authors_module_with_their_weights(scale, groups, style, dyscope):
    torch.manual_seed(scale * 100 + groups * 10 + (style == "pl") * 2 + dyscope)
    channels = 144  # divisible by every scale² and group count here
    torch.set_default_dtype(torch.float64)
    try:
        ref = AuthorsDySample(channels, scale, style, groups, dyscope)
    finally:
        torch.set_default_dtype(torch.float32)
    with torch.no_grad():
        for parameter in ref.parameters():
            parameter.normal_(0, 0.3)  # offsets of several pixels, not the near-zero initial ones
    block = create_upsampler("dysample", spatial_dims=2, in_channels=channels, out_channels=channels, scale=scale,
                             groups=groups, style=style, dynamic_scope=dyscope).double()  # fmt: skip
    load_reference_state_dict(block, ref.state_dict(), source="dysample")
    x = torch.randn(2, channels, 5, 6, dtype=torch.float64, requires_grad=True)
    expected = ref(x)
    got = block(x)
    assert (got - expected).abs().max() <= 1e-10
    grad = torch.randn_like(expected)
    (gx_ref,) = torch.autograd.grad(expected, x, grad)
    (gx,) = torch.autograd.grad(got, x, grad)
    assert (gx - gx_ref).abs().max() <= 1e-10
    back = reference_state_dict(block, source="dysample")
    assert set(back) == set(ref.state_dict())  # the persistent init_pos included
    for key, value in back.items():
        tolerance = 1e-7 if key == "init_pos" else 0  # theirs in float32, the port's in float64 (see the port)
        torch.testing.assert_close(value, ref.state_dict()[key], rtol=0, atol=tolerance)
    fresh = _float64(lambda: AuthorsDySample(channels, scale, style, groups, dyscope))
    fresh.load_state_dict(back, strict=True)  # the weights go back into the authors' module
    torch.testing.assert_close(fresh(x), expected, rtol=0, atol=1e-6)


def test_weights_that_are_not_finite_float_tensors_are_refused_naming_the_key():
    block = create_upsampler("dysample", spatial_dims=2, in_channels=16, out_channels=16, scale=2)
    good = AuthorsDySample(16, 2, "lp", 4).state_dict()
    nan = torch.full((32,), float("nan"))
    bad_values = [("abc", "got str"), (None, "got NoneType"), (nan, "32 of 32 values are NaN"),
                  (torch.zeros(32, dtype=torch.long), "got torch.int64")]  # fmt: skip
    for value, message in bad_values:
        with pytest.raises(DataError, match=f"dysample state_dict\\[.offset.bias.\\].*{message}"):
            load_reference_state_dict(block, {**good, "offset.bias": value}, source="dysample")
    carafe = create_upsampler("carafe", spatial_dims=2, in_channels=4, out_channels=4, scale=2)
    theirs = reference_state_dict(carafe, source="carafe")
    load_reference_state_dict(carafe, {k: v.numpy() for k, v in theirs.items()}, source="carafe")  # arrays load
    with pytest.raises(DataError, match=r"carafe state_dict\['content_encoder.weight'\]: 1 of"):
        theirs["content_encoder.weight"].view(-1)[0] = float("inf")
        load_reference_state_dict(carafe, theirs, source="carafe")
    with pytest.raises(DataError, match=r"init_pos \(1, 16, 1, 1\) is not the one of scale 2 and 4 group\(s\)"):
        load_reference_state_dict(
            block, {**good, "init_pos": AuthorsDySample(16, 2, "lp", 2).init_pos}, source="dysample"
        )


def test_a_fresh_block_starts_where_the_authors_block_starts():
    torch.manual_seed(0)
    block = create_upsampler("dysample", spatial_dims=2, in_channels=64, out_channels=64, scale=2, dynamic_scope=True)
    assert block.offset.weight.std().item() == pytest.approx(0.001, rel=0.1) and not block.offset.bias.any()
    assert not block.scope.weight.any() and not block.scope.bias.any()


def test_conversion_errors_name_the_keys_and_shapes():
    block = create_upsampler("dysample", spatial_dims=2, in_channels=16, out_channels=16, scale=2)
    ref = AuthorsDySample(16, 2, "lp", 4, dyscope=True)
    with pytest.raises(DataError, match=r"missing nothing, unexpected \['scope.weight'\]"):
        load_reference_state_dict(block, ref.state_dict(), source="dysample")
    other = AuthorsDySample(16, 2, "lp", 2).state_dict()
    with pytest.raises(DataError, match=r"dysample offset.bias has shape \(16,\), this block \(32,\)"):
        load_reference_state_dict(block, other, source="dysample")
    with pytest.raises(ConfigError, match="source must be one of carafe, fade, sapa, dysample, got 'mmcv'"):
        load_reference_state_dict(block, other, source="mmcv")
    scoped = create_upsampler("dysample", spatial_dims=2, in_channels=16, out_channels=16, scale=2, dynamic_scope=True)
    with torch.no_grad():
        scoped.scope.bias.fill_(0.5)
    with pytest.raises(ConfigError, match="scope.bias is not zero; the authors' scope conv has no bias"):
        reference_state_dict(scoped, source="dysample")


def test_pl_style_needs_channels_divisible_by_the_scale_product():
    with pytest.raises(ConfigError, match=r"in_channels=6 must be a multiple of the scale product 4"):
        create_upsampler("dysample", spatial_dims=2, in_channels=6, out_channels=6, scale=2, style="pl", groups=1)


@pytest.mark.slow
def test_pl_style_compiles_fullgraph_and_exports_with_dynamic_sizes():
    from torch.export import Dim

    block = create_upsampler("dysample", spatial_dims=2, in_channels=16, out_channels=16, scale=2, style="pl",
                             dynamic_scope=True).eval()  # fmt: skip
    x = torch.randn(2, 16, 5, 7)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager", dynamic=True)
    torch.testing.assert_close(compiled(x), block(x))
    dynamic = ({0: Dim.DYNAMIC, 2: Dim.DYNAMIC, 3: Dim.DYNAMIC},)
    program = torch.export.export(block, (x,), dynamic_shapes=dynamic).module()
    other = torch.randn(1, 16, 6, 4)
    torch.testing.assert_close(program(other), block(other))


def _mean_largest_kernel_weight(block, x, guide=None) -> float:
    kernels = block.kernels(x, guide) if guide is not None else None
    if kernels is None:  # carafe: its kernels from the encoder, as in its upsample
        b, _, h, w = x.shape
        logits = block.encoder(block.compress(x)).reshape(b, block.kernel_size**2, block.scale_product, h, w)
        kernels = logits.softmax(dim=1)
    return float(kernels.max(dim=1).values.mean())


def test_fresh_carafe_and_fade_start_where_the_references_start():
    """mmcv's CARAFEPack: compressor xavier-uniform, content encoder N(0, 0.001), zero biases: its
    kernels start nearly uniform (largest weight ~1/25). FADE (poppinace/fade): content conv
    xavier-normal, gate xavier-uniform, zero biases: its kernels start peaked."""
    torch.manual_seed(0)
    carafe = create_upsampler("carafe", spatial_dims=2, in_channels=64, out_channels=64, scale=2)
    assert carafe.encoder.weight.std().item() == pytest.approx(0.001, rel=0.05)
    assert not carafe.encoder.bias.any() and not carafe.compress.bias.any()
    bound = (6 / (64 + 64)) ** 0.5  # xavier uniform of a 64 -> 64 1x1 conv
    assert carafe.compress.weight.abs().max().item() <= bound
    x = torch.randn(2, 64, 12, 12)
    with torch.no_grad():
        assert 0.040 <= _mean_largest_kernel_weight(carafe, x) <= 0.045  # mmcv's: 0.042; uniform: 0.040
    fade = create_upsampler("fade", spatial_dims=2, in_channels=64, out_channels=64, scale=2, guide_channels=64)
    fan_in, fan_out = 64 * 9, 25 * 9
    assert fade.content.weight.std().item() == pytest.approx((2 / (fan_in + fan_out)) ** 0.5, rel=0.05)
    assert not fade.content.bias.any() and not fade.gate.bias.any()
    assert fade.gate.weight.abs().max().item() <= (6 / (64 + 1)) ** 0.5
    guide = torch.randn(2, 64, 24, 24)
    with torch.no_grad():
        peak = _mean_largest_kernel_weight(fade, x, guide)
        fade.content.reset_parameters()  # PyTorch's default, what upzoo used before
        default = _mean_largest_kernel_weight(fade, x, guide)
    assert peak > 1.5 * default  # the reference's init starts peaked (0.18 vs 0.09 here), as the authors' runs did


def _neighbourhoods_up(t: torch.Tensor, k: int, s: int) -> torch.Tensor:
    """``(B, C, H, W) -> (B, C, k², H*s, W*s)``: each output point's k x k neighbourhood of its source
    point, zero outside the image (what the references' kernels read)."""
    b, c, h, w = t.shape
    windows = F.unfold(t, k, padding=k // 2).view(b, c, k * k, h, w)
    return windows.repeat_interleave(s, dim=3).repeat_interleave(s, dim=4)


class MmcvCarafePack(nn.Module):
    """A port of mmcv's ``CARAFEPack`` (``mmcv/ops/carafe.py``) with its naive CARAFE: compress,
    encode ``k_up² * s²`` logits, pixel-shuffle them to the output, softmax over the ``k_up²`` taps,
    reassemble the zero-padded source neighbourhood."""

    def __init__(self, channels: int, scale: int, up_kernel: int = 5, encoder_kernel: int = 3, compressed: int = 64):
        super().__init__()
        self.scale, self.up_kernel = scale, up_kernel
        self.channel_compressor = nn.Conv2d(channels, compressed, 1)
        self.content_encoder = nn.Conv2d(
            compressed, up_kernel**2 * scale**2, encoder_kernel, padding=encoder_kernel // 2
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = F.pixel_shuffle(self.content_encoder(self.channel_compressor(x)), self.scale).softmax(dim=1)
        return torch.einsum("bckhw,bkhw->bchw", _neighbourhoods_up(x, self.up_kernel, self.scale), mask)


class AuthorsFade(nn.Module):
    """A port of ``FADE`` from poppinace/fade (``FADE_H2L.py``, the mmcv-based implementation; scale
    2, square inputs as there): the gate from the decoder feature, kernels by semi-shift convolution
    (the encoder feature through a stride-2 conv over its four half-pixel-shifted paddings, plus the
    decoder's), CARAFE of the decoder feature, ``gate * en + (1 - gate) * carafe``. (The repository's
    einops copy in ``pytorch_implementation/`` splits the concatenated paddings as ``(c scale_2)``,
    which mixes channels across the four shifts; the mmcv-based module is the one the paper's
    results come from.)"""

    def __init__(self, channels: int, embedding: int = 64, k: int = 5):
        super().__init__()
        self.k = k
        self.gate_generator = nn.Module()
        self.gate_generator.conv = nn.Conv2d(channels, 1, 1)
        self.kernel_generator = nn.Module()
        self.kernel_generator.conv1_en = nn.Conv2d(channels, embedding, 1)
        self.kernel_generator.conv1_de = nn.Conv2d(channels, embedding, 1, bias=False)
        self.kernel_generator.conv2_kernels = nn.Parameter(torch.randn(k * k, embedding, 3, 3))
        self.kernel_generator.conv2_bias = nn.Parameter(torch.randn(k * k))

    @staticmethod
    def split_shifts(padded: torch.Tensor, b: int, c: int) -> torch.Tensor:
        """``(B, 4 * C, H', W')`` -> ``(4 * B, C, H', W')``: one shift per sample (mmcv module)."""
        return padded.reshape(b * 4, c, *padded.shape[2:])

    def forward(self, en: torch.Tensor, de: torch.Tensor) -> torch.Tensor:
        gen = self.kernel_generator
        b, _, h, w = de.shape
        compressed_en, compressed_de = gen.conv1_en(en), gen.conv1_de(de)
        pads = [F.pad(compressed_en, p) for p in ([1, 0, 1, 0], [0, 1, 1, 0], [1, 0, 0, 1], [0, 1, 0, 1])]
        c = compressed_en.shape[1]
        pad_en = self.split_shifts(torch.cat(pads, dim=1), b, c)
        kernels = F.conv2d(pad_en, gen.conv2_kernels, gen.conv2_bias, stride=2)
        kernels = kernels.view(b, 4, self.k**2, h, w)
        kernels = kernels + F.conv2d(compressed_de, gen.conv2_kernels, gen.conv2_bias, padding=1).unsqueeze(1)
        kernels = kernels.view(b, 2, 2, self.k**2, h, w).permute(0, 3, 4, 1, 5, 2).reshape(b, self.k**2, 2 * h, 2 * w)
        kernels = kernels.softmax(dim=1)
        gate = torch.sigmoid(F.interpolate(self.gate_generator.conv(de), scale_factor=2))
        reassembled = torch.einsum("bckhw,bkhw->bchw", _neighbourhoods_up(de, self.k, 2), kernels)
        return gate * en + (1 - gate) * reassembled


class AuthorsSapa(nn.Module):
    """A port of ``SAPA`` from poppinace/sapa (``SAPA.py``, SAPA-B) with its CUDA kernels' semantics
    written out: the similarity of each output point's query with the keys of its source point's
    neighbourhood (0 outside the image), softmax, and the weighted sum of the raw decoder feature
    (0 outside)."""

    def __init__(self, dim_y: int, dim_x: int, up_factor: int, k: int = 5, embedding: int = 64):
        super().__init__()
        self.up_factor, self.k = up_factor, k
        self.norm_y, self.norm_x = nn.LayerNorm(dim_y), nn.LayerNorm(dim_x)
        self.q, self.k_proj = nn.Linear(dim_y, embedding), nn.Linear(dim_x, embedding)

    def state_dict(self, *args, **kwargs):  # their key is 'k', which is also our kernel size here
        sd = super().state_dict(*args, **kwargs)
        return {("k." + key[len("k_proj.") :] if key.startswith("k_proj.") else key): v for key, v in sd.items()}

    def forward(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q = self.q(self.norm_y(y.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        key = self.k_proj(self.norm_x(x.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        sim = (q.unsqueeze(2) * _neighbourhoods_up(key, self.k, self.up_factor)).sum(1)
        attn = sim.softmax(dim=1)
        return torch.einsum("bckhw,bkhw->bchw", _neighbourhoods_up(x, self.k, self.up_factor), attn)


def _randomise(module: nn.Module) -> None:
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.normal_(0, 0.3)


def _float64(factory):
    torch.set_default_dtype(torch.float64)
    try:
        return factory()
    finally:
        torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("scale, up_kernel, encoder_kernel", [(2, 5, 3), (3, 3, 1), (4, 5, 5)])
def test_carafe_equals_mmcv_carafepack_with_its_weights(scale, up_kernel, encoder_kernel):
    torch.manual_seed(scale)
    ref = _float64(lambda: MmcvCarafePack(8, scale, up_kernel, encoder_kernel, compressed=6))
    _randomise(ref)
    options = dict(kernel_size=up_kernel, encoder_kernel_size=encoder_kernel, embedding_channels=6)
    block = create_upsampler("carafe", spatial_dims=2, in_channels=8, out_channels=8, scale=scale, **options).double()
    load_reference_state_dict(block, ref.state_dict(), source="carafe")
    x = torch.randn(2, 8, 5, 6, dtype=torch.float64, requires_grad=True)
    _assert_same(block(x), ref(x), [x])
    assert set(reference_state_dict(block, source="carafe")) == set(ref.state_dict())


def test_fade_equals_the_authors_module_with_their_weights():
    torch.manual_seed(1)
    ref = _float64(lambda: AuthorsFade(6, embedding=4))
    _randomise(ref)
    block = create_upsampler("fade", spatial_dims=2, in_channels=6, out_channels=6, scale=2, guide_channels=6,
                             embedding_channels=4).double()  # fmt: skip
    load_reference_state_dict(block, ref.state_dict(), source="fade")
    de = torch.randn(2, 6, 5, 5, dtype=torch.float64, requires_grad=True)
    en = torch.randn(2, 6, 10, 10, dtype=torch.float64, requires_grad=True)
    _assert_same(block(de, en), ref(en, de), [de, en])
    back = reference_state_dict(block, source="fade")
    assert all(torch.equal(back[key], value) for key, value in ref.state_dict().items())


class AuthorsFadeEinopsCopy(AuthorsFade):
    """A port of the einops copy in poppinace/fade's ``pytorch_implementation/FADE_H2L.py``: the same
    keys and arithmetic, but the concatenated paddings split as ``'b (c scale_2) h w -> (b scale_2) c
    h w'``, which mixes channels across the four shifts."""

    @staticmethod
    def split_shifts(padded: torch.Tensor, b: int, c: int) -> torch.Tensor:
        return padded.view(b, c, 4, *padded.shape[2:]).transpose(1, 2).reshape(b * 4, c, *padded.shape[2:])


def test_the_fade_repositorys_einops_copy_computes_another_function_and_is_refused():
    torch.manual_seed(2)
    ref = _float64(lambda: AuthorsFade(6, embedding=4))
    _randomise(ref)
    copy = _float64(lambda: AuthorsFadeEinopsCopy(6, embedding=4))
    copy.load_state_dict(ref.state_dict(), strict=True)  # the same keys and shapes
    de, en = torch.randn(2, 6, 5, 5, dtype=torch.float64), torch.randn(2, 6, 10, 10, dtype=torch.float64)
    assert (copy(en, de) - ref(en, de)).abs().max() > 1e-3  # one set of weights, two functions
    block = create_upsampler("fade", spatial_dims=2, in_channels=6, out_channels=6, scale=2, guide_channels=6,
                             embedding_channels=4)  # fmt: skip
    with pytest.raises(ConfigError, match="splits the four shifted encoder paddings channel-interleaved"):
        load_reference_state_dict(block, copy.state_dict(), source="fade_pytorch")


@pytest.mark.parametrize("scale, kernel", [(2, 5), (3, 3), (4, 5)])
def test_sapa_equals_the_authors_module_with_their_weights(scale, kernel):
    torch.manual_seed(scale)
    ref = _float64(lambda: AuthorsSapa(dim_y=5, dim_x=6, up_factor=scale, k=kernel, embedding=4))
    _randomise(ref)
    block = create_upsampler("sapa", spatial_dims=2, in_channels=6, out_channels=6, scale=scale, guide_channels=5,
                             kernel_size=kernel, embedding_channels=4).double()  # fmt: skip
    load_reference_state_dict(block, ref.state_dict(), source="sapa")
    x = torch.randn(2, 6, 4, 5, dtype=torch.float64, requires_grad=True)
    y = torch.randn(2, 5, 4 * scale, 5 * scale, dtype=torch.float64, requires_grad=True)
    _assert_same(block(x, y), ref(y, x), [x, y])  # every border point included: zeros, as their kernels


def _assert_same(got: torch.Tensor, expected: torch.Tensor, inputs: list[torch.Tensor]) -> None:
    assert got.shape == expected.shape and (got - expected).abs().max() <= 1e-10
    grad = torch.randn_like(expected)
    for ours, theirs in zip(torch.autograd.grad(got, inputs, grad), torch.autograd.grad(expected, inputs, grad)):
        assert (ours - theirs).abs().max() <= 1e-10


def test_converters_refuse_blocks_that_cannot_hold_the_reference():
    inner = create_upsampler("sapa", spatial_dims=2, in_channels=4, out_channels=4, scale=2, guide_channels=4,
                             variant="inner")  # fmt: skip
    with pytest.raises(ConfigError, match="the reference SAPA is SAPA-B"):
        reference_state_dict(inner, source="sapa")
    carafe = create_upsampler("carafe", spatial_dims=2, in_channels=4, out_channels=8, scale=2)
    with pytest.raises(ConfigError, match="the reference carafe keeps the channels"):
        reference_state_dict(carafe, source="carafe")
    same = create_upsampler("carafe", spatial_dims=2, in_channels=4, out_channels=4, scale=2)
    with pytest.raises(ConfigError, match="source 'fade' converts into a 2D fade block, got CarafeUpsampler"):
        reference_state_dict(same, source="fade")
    with pytest.raises(DataError, match=r"missing \['content_encoder.bias'\]"):
        theirs = reference_state_dict(same, source="carafe")
        del theirs["content_encoder.bias"]
        load_reference_state_dict(same, theirs, source="carafe")
