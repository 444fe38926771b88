"""Every registered block and every model under torch.compile(fullgraph=True), torch.export with
dynamic sizes and ONNX (verified in onnxruntime), the masked blur's custom op and its branch-free
formulation, the legacy exporter refused, and exports that would compute something else refused."""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import pytest
import torch
from torch.export import Dim

from upzoo import ConfigError, create_upsampler, list_upsamplers
from upzoo.filters.blur_fused import fused_masked_blur, pytorch_formulation
from upzoo.filters.masked_blur import masked_gaussian_blur
from upzoo.filters.select_blur import select_blur
from upzoo.inference.verification_inputs import verification_input
from upzoo.models.factory import ModelSpec, build_model
from upzoo.registry import upsampler_info
from upzoo.upsamplers.base import Upsampler

ort = pytest.importorskip("onnxruntime")

SIZES = {2: [(6, 7), (9, 5)], 3: [(4, 5, 6), (5, 7, 3)]}


#: One block (and dims) per formulation runs by default: transposed conv, pixel shuffle, resize+conv,
#: resize, grid sampling (DySample), reassembly (CARAFE), and the masked blur's custom op in 2D and
#: 3D. SAPA's similarity reassembly (the slowest to trace) and the rest of the matrix run under
#: ``-m slow`` (CI runs both).
DEFAULT_BLOCKS = {
    ("transposed", 3), ("pixel_shuffle", 2), ("interp_conv", 2), ("interpolate", 3), ("dysample", 2),
    ("carafe", 2), ("masked_blur", 2), ("masked_blur", 3),
}  # fmt: skip


def _block_cases():
    for name in list_upsamplers():
        for dims in upsampler_info(name).spatial_dims:
            marks = () if (name, dims) in DEFAULT_BLOCKS else (pytest.mark.slow,)
            yield pytest.param(name, dims, id=f"{name}-{dims}d", marks=marks)


def _block(name: str, dims: int):
    info = upsampler_info(name)
    keeps = info.keeps_channels
    options = {"guide_channels": 3} if info.needs_guide else {}
    options |= {"style_dim": 5} if info.needs_style else {}
    scale = 1 if info.kind == "post_filter" else 2
    torch.manual_seed(0)
    return create_upsampler(
        name, spatial_dims=dims, in_channels=4, out_channels=4 if keeps else 6, scale=scale, **options
    ).eval()


def _inputs(block, size, batch=2):
    x = torch.randn(batch, 4, *size)
    if getattr(block, "needs_style", False):
        return (x, torch.randn(batch, 5))
    if block.needs_guide:
        return (x, torch.randn(batch, 3, *block.output_spatial(size)))
    return (x,)


def _dynamic(args):
    return tuple({0: Dim.DYNAMIC, **{a: Dim.DYNAMIC for a in range(2, t.ndim)}} for t in args)


def _quiet(fn, *args, **kwargs):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args, **kwargs)


@pytest.mark.parametrize("name, dims", list(_block_cases()))
def test_block_compiles_fullgraph_forward_and_backward_equal_eager(name, dims):
    torch._dynamo.reset()
    block = _block(name, dims)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager", dynamic=True)
    for size in SIZES[dims]:
        args = _inputs(block, size)
        eager_args = [a.clone().requires_grad_() for a in args]
        compiled_args = [a.clone().requires_grad_() for a in args]
        expected, got = block(*eager_args), compiled(*compiled_args)
        torch.testing.assert_close(got, expected)
        weights = torch.randn_like(expected)
        (expected * weights).sum().backward()
        (got * weights).sum().backward()
        for e, c in zip(eager_args, compiled_args):
            torch.testing.assert_close(c.grad, e.grad)


@pytest.mark.parametrize("name, dims", list(_block_cases()))
def test_block_exports_with_dynamic_sizes(name, dims):
    block = _block(name, dims)
    args = _inputs(block, SIZES[dims][0])
    program = _quiet(torch.export.export, block, args, dynamic_shapes=_dynamic(args))
    other = _inputs(block, SIZES[dims][1], batch=3)
    with torch.no_grad():
        torch.testing.assert_close(program.module()(*other), block(*other))


@pytest.mark.parametrize("name, dims", list(_block_cases()))
def test_block_onnx_matches_pytorch_in_onnxruntime(name, dims, tmp_path):
    block = _block(name, dims)
    args = _inputs(block, SIZES[dims][0])
    names = ["x", "guide"][: len(args)]
    path = tmp_path / "block.onnx"
    _quiet(torch.onnx.export, block, args, str(path), input_names=names, dynamic_shapes=_dynamic(args), dynamo=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for size, batch in zip(SIZES[dims], (2, 3)):
        other = _inputs(block, size, batch)
        (got,) = session.run(None, {n: t.numpy() for n, t in zip(names, other)})
        with torch.no_grad():
            expected = block(*other).numpy()
        assert got.shape == expected.shape and np.abs(got - expected).max() <= 1e-4


MODELS = {
    "unet2d-blur": (
        {
            "architecture": "unet",
            "spatial_dims": 2,
            "in_channels": 3,
            "num_classes": 5,
            "encoder_depth": 3,
            "channels": [8, 16, 32],
            "upsampler": "transposed",
            "post_filter": "masked_blur",
        },
        [(32, 48), (37, 50), (21, 29)],
    ),
    "unet2d-attention": (
        {
            "architecture": "unet",
            "spatial_dims": 2,
            "in_channels": 3,
            "num_classes": 4,
            "encoder_depth": 3,
            "channels": [8, 16, 32],
            "upsampler": "interp_conv",
            "attention_gates": True,
        },
        [(32, 48), (37, 50), (21, 29)],
    ),
    "unet3d": (
        {
            "architecture": "unet",
            "spatial_dims": 3,
            "in_channels": 1,
            "num_classes": 3,
            "encoder_depth": 3,
            "channels": [4, 8, 16],
            "upsampler": "pixel_shuffle",
            "strides": [[1, 2, 2], [2, 2, 2]],
        },
        [(8, 16, 16), (9, 17, 15), (6, 21, 10)],
    ),
    "smp-unet": (
        {
            "architecture": "smp_unet",
            "encoder_name": "resnet18",
            "encoder_depth": 3,
            "decoder_channels": [32, 16, 8],
            "in_channels": 3,
            "num_classes": 4,
            "upsampler": "carafe",
        },
        [(64, 64), (70, 50), (33, 97)],
    ),
    **{
        f"smp-{name}": (
            {
                "architecture": f"smp_{name}",
                "encoder_name": encoder,
                "in_channels": 3,
                "num_classes": 4,
                "upsampler": block,
                **widths,
            },
            [(64, 64), (70, 50), (33, 97)],
        )
        for name, encoder, block, widths in [
            (
                "fpn",
                "resnet18",
                "carafe",
                {"decoder_pyramid_channels": 32, "decoder_segmentation_channels": 32, "decoder_dropout": 0.0},
            ),  # no random numbers: compiled == eager
            ("upernet", "resnet18", "dysample", {"decoder_channels": 32}),
            ("segformer", "mit_b0", "sapa", {"decoder_segmentation_channels": 32}),
            ("deeplabv3plus", "resnet18", "fade", {"decoder_channels": 32}),
        ]
    },
    "dcgan-blur": (
        {
            "architecture": "dcgan",
            "latent_dim": 16,
            "out_channels": 3,
            "resolution": 32,
            "base_channels": 8,
            "post_filter": "masked_blur",
            "post_filter_options": {"threshold": 0.2},
        },
        None,
    ),
}


_SLOW_ONNX = ("unet3d", "unet2d-attention")  # 5-10 s each: the default run keeps the 2D U-Net's and the GAN's


def _model(key: str):
    torch.manual_seed(0)
    spec, sizes = MODELS[key]
    model = build_model(ModelSpec.from_dict(spec))
    channels = spec.get("in_channels")
    shapes = [(2, 16), (1, 16), (3, 16)] if sizes is None else [(b, channels, *s) for b, s in zip((2, 1, 3), sizes)]
    return model, shapes


@pytest.mark.parametrize(
    "key",
    [pytest.param(k, marks=pytest.mark.slow) if k.startswith("smp-") or k in _SLOW_ONNX else k for k in MODELS],
)
def test_model_onnx_matches_pytorch_at_sizes_that_need_padding(key, tmp_path):
    model, shapes = _model(key)
    model.eval()
    example = torch.randn(shapes[0])
    dynamic = ({0: Dim.DYNAMIC, **{a: Dim.DYNAMIC for a in range(2, example.ndim)}},)
    path = tmp_path / "model.onnx"
    _quiet(torch.onnx.export, model, (example,), str(path), input_names=["x"], dynamic_shapes=dynamic, dynamo=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    program = _quiet(torch.export.export, model, (example,), dynamic_shapes=dynamic).module()
    generator = torch.Generator().manual_seed(0)
    for shape in shapes:  # inputs clear of the masked blur's threshold: onnxruntime rounds otherwise
        x = verification_input(model, shape, generator)
        with torch.no_grad():
            expected = model(x)
        (got,) = session.run(None, {"x": x.numpy()})
        assert got.shape == tuple(expected.shape) and np.abs(got - expected.numpy()).max() <= 1e-4
        torch.testing.assert_close(program(x), expected)


@pytest.mark.parametrize(
    "key", ["dcgan-blur", *(pytest.param(k, marks=pytest.mark.slow) for k in MODELS if k != "dcgan-blur")]
)
def test_model_compiles_fullgraph_forward_and_backward_equal_eager(key):
    torch._dynamo.reset()
    model, shapes = _model(key)
    model.train()
    eager = build_model(ModelSpec.from_dict(MODELS[key][0]))
    eager.load_state_dict(model.state_dict())
    for module in [*model.modules(), *eager.modules()]:  # no random numbers: compiled and eager draw others
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        if hasattr(module, "drop_prob"):  # stochastic depth (SegFormer's MiT encoder)
            module.drop_prob = 0.0
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
    for shape in shapes[::2]:  # batches of 2 and 3 (UPerNet's and DeepLab's BatchNorm after pooling need 2)
        x = torch.randn(shape)
        expected, got = eager(x), compiled(x)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
        weights = torch.randn_like(expected)
        (expected * weights).sum().backward()
        (got * weights).sum().backward()
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):  # float32 sums in another order:
        if p.grad is None:  # a stage the model never calls (smp's encoder_depth=3 leaves resnet's layer4 unused)
            assert q.grad is None, name
            continue
        scale = p.grad.abs().max().item()  # errors scale with the gradient (a resnet's reach 100s)
        torch.testing.assert_close(q.grad, p.grad, atol=max(1e-4, 1e-5 * scale), rtol=1e-3, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("key", ["unet2d-blur", "dcgan-blur"])
def test_model_under_inductor_equals_eager(key):
    torch._dynamo.reset()
    model, shapes = _model(key)
    model.eval()
    compiled = torch.compile(model, fullgraph=True, backend="inductor")
    x = torch.randn(shapes[0])
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)


# -- the masked blur: custom op and branch-free formulation --------------------------------------------

BLUR_OPTIONS = [
    {"threshold": 0.3},
    {"threshold": 0.0, "kernel_size": 5, "sigma": 1.5, "border": "reflect"},
    {"threshold": -0.5, "border": "zeros", "stride": 2},
    {"threshold": 0.1, "border": "replicate", "kernel_size": (3, 5)},
    {"threshold": 0.2, "soft": 0.3},
]


@pytest.mark.parametrize(
    "options, mask",
    [
        pytest.param(o, m, id=",".join(f"{k}={v}" for k, v in o.items()) + f"-{m}")
        for o in BLUR_OPTIONS
        for m in (None, "bool", "float")
        if m is None or "soft" not in o  # soft applies to the threshold, not with a mask
    ],
)
def test_select_formulation_equals_the_eager_blur_in_values_and_gradients(options, mask):
    from upzoo.filters.blur_plan import taps_and_steps as _taps_and_steps

    x = torch.randn(2, 3, 9, 11, dtype=torch.float64)
    m = None if mask is None else (torch.rand(2, 1, 9, 11) > 0.5 if mask == "bool" else torch.rand(2, 1, 9, 11))
    m = m.double() if mask == "float" else m
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    with pytorch_formulation():
        expected = masked_gaussian_blur(a, mask=m, **options)
    options = {"kernel_size": 3, "sigma": None, "border": "valid", "stride": 1, "soft": None, **options}
    taps, steps = _taps_and_steps(2, options["kernel_size"], options["sigma"], options["border"], options["stride"],
                                  options["soft"], options["threshold"])  # fmt: skip
    got = select_blur(b, m, taps, options["border"], steps, options["threshold"], options["soft"])
    torch.testing.assert_close(got, expected)
    g = torch.randn_like(expected)
    (expected * g).sum().backward()
    (got * g).sum().backward()
    torch.testing.assert_close(b.grad, a.grad)


def test_the_fused_kernel_is_one_opaque_custom_op_with_fake_and_autograd():
    x = torch.randn(2, 3, 8, 9, requires_grad=True)
    args = ([0.25, 0.5, 0.25, 0.25, 0.5, 0.25], [3, 3], "valid", [1, 1], 0.1)
    torch.library.opcheck(fused_masked_blur, (x, *args))
    torch.library.opcheck(torch.ops.upzoo.masked_blur_backward, (x.detach(), torch.randn(2, 3, 8, 9), *args))
    program = torch.export.export(
        create_upsampler("masked_blur", spatial_dims=2, in_channels=3, out_channels=3, scale=1, threshold=0.1),
        (x.detach(),),
        dynamic_shapes=({0: Dim.DYNAMIC, 2: Dim.DYNAMIC, 3: Dim.DYNAMIC},),
    )
    assert "upzoo.masked_blur.default" in str(program.graph)


def test_double_backward_through_the_custom_op_equals_the_pytorch_formulation():
    x = torch.randn(1, 2, 7, 8, dtype=torch.float64)

    def grad_of_grad(formulation):
        a = x.clone().requires_grad_()
        with formulation():
            y = masked_gaussian_blur(a, threshold=0.2, border="reflect")
            (g,) = torch.autograd.grad((y * y).sum(), a, create_graph=True)
            (gg,) = torch.autograd.grad(g.square().sum(), a)
        return g.detach(), gg

    fused, reference = grad_of_grad(contextlib.nullcontext), grad_of_grad(pytorch_formulation)
    torch.testing.assert_close(fused[0], reference[0])
    torch.testing.assert_close(fused[1], reference[1])


def test_the_blur_onnx_graph_is_a_select_between_input_and_depthwise_blur(tmp_path):
    import onnx

    block = create_upsampler("masked_blur", spatial_dims=2, in_channels=3, out_channels=3, scale=1, threshold=0.3)
    x = torch.randn(1, 3, 10, 12)
    path = tmp_path / "blur.onnx"
    _quiet(torch.onnx.export, block, (x,), str(path), dynamic_shapes=({2: Dim.DYNAMIC, 3: Dim.DYNAMIC},), dynamo=True)
    ops = {node.op_type for node in onnx.load(str(path)).graph.node}
    assert {"Conv", "Where"} <= ops
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for size in [(10, 12), (5, 31)]:
        x = torch.randn(1, 3, *size)
        (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        assert np.abs(got - block(x).numpy()).max() <= 1e-6


@pytest.mark.parametrize("what", ["module", "function", "model"])
def test_the_legacy_torchscript_exporter_is_refused_not_a_constant_graph(what, tmp_path):
    if what == "model":
        module, x = _model("unet2d-blur")[0].eval(), torch.randn(1, 3, 32, 32)
    elif what == "module":
        module = create_upsampler("masked_blur", spatial_dims=2, in_channels=3, out_channels=3, scale=1)
        x = torch.randn(1, 3, 8, 8)
    else:

        class Fn(torch.nn.Module):
            def forward(self, x):
                return masked_gaussian_blur(x, threshold=0.0)

        module, x = Fn(), torch.randn(1, 3, 8, 8)
    with pytest.raises(ConfigError, match=r"cannot be traced by torch.jit.trace or the TorchScript ONNX exporter"):
        _quiet(torch.onnx.export, module, (x,), str(tmp_path / "legacy.onnx"), dynamo=False)
    assert not (tmp_path / "legacy.onnx").exists()


# -- export_model refuses what it cannot export correctly --------------------------------------------------


class _Unexportable(Upsampler):
    """Branches in Python on the data: no tracer can follow it."""

    def upsample(self, x, guide=None):
        y = torch.nn.functional.interpolate(x, scale_factor=2.0, mode="nearest")
        return y if float(x.mean()) > -100 else -y


class _DiffersWhenTraced(Upsampler):
    """Computes something else when traced: its export would be silently wrong."""

    def upsample(self, x, guide=None):
        y = torch.nn.functional.interpolate(x, scale_factor=2.0, mode="nearest")
        return y * 1.5 if torch.compiler.is_compiling() else y


@pytest.mark.parametrize(
    "bad, message", [(_Unexportable, "fails"), pytest.param(_DiffersWhenTraced, "differs", marks=pytest.mark.slow)]
)
def test_export_refuses_and_names_the_block(bad, message, tmp_path):
    from upzoo.inference.export import ExportError, export_model
    from upzoo.recipe import parse_recipe
    from upzoo.runs.trained_model import LoadedModel

    model, _ = _model("unet2d-blur")
    channels = model.decoder[1].upsample.in_channels
    model.decoder[1].upsample = bad(spatial_dims=2, in_channels=channels, out_channels=channels, scale=2)
    recipe = parse_recipe({"model": MODELS["unet2d-blur"][0], "data": {"crop_size": [32, 48]}})
    loaded = LoadedModel(model.eval(), recipe, recipe.model, tmp_path / "best.pt", None, None, None, None, None)
    with pytest.raises(ExportError, match=rf"block decoder.1.upsample \({bad.__name__}\) {message}"):
        export_model(loaded, "onnx", tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


def test_the_pytorch_formulation_compiles_and_exports_too():
    """Without the fused kernel (no C compiler, or pytorch_formulation()) the traced blur is the
    branch-free select formulation: compile and export see no data-dependent branch."""
    block = create_upsampler("masked_blur", spatial_dims=3, in_channels=2, out_channels=2, scale=1, threshold=0.1)
    x = torch.randn(2, 2, 5, 6, 7)
    with pytorch_formulation():
        torch._dynamo.reset()
        compiled = torch.compile(block, fullgraph=True, backend="aot_eager", dynamic=True)
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        expected, got = block(a), compiled(b)
        torch.testing.assert_close(got, expected)
        expected.square().sum().backward()
        got.square().sum().backward()
        torch.testing.assert_close(b.grad, a.grad)
        dynamic = ({0: Dim.DYNAMIC, 2: Dim.DYNAMIC, 3: Dim.DYNAMIC, 4: Dim.DYNAMIC},)
        program = _quiet(torch.export.export, block, (x,), dynamic_shapes=dynamic)
        assert "upzoo.masked_blur" not in str(program.graph)
        other = torch.randn(1, 2, 4, 9, 3)
        torch.testing.assert_close(program.module()(other), block(other))
