"""U-Net (2D/3D), the smp adapter, DCGAN and build_model, with every registered upsampler."""

from __future__ import annotations

import inspect

import pytest
import segmentation_models_pytorch as smp
import torch

from upzoo import ConfigError, RegistryError, ShapeError, UNet, build_model, list_upsamplers
from upzoo.models import (
    DCGAN_TRANSPOSED_OPTIONS,
    DCGANDiscriminator,
    DCGANGenerator,
    plan_strides,
    smp_fpn,
    smp_unet,
)
from upzoo.models.encoders import load_encoder_weights
from upzoo.models.factory import ModelSpec
from upzoo.registry import upsampler_info

# style-conditioned blocks take block(x, style): no segmentation model or DCGAN gives a style (refused: below)
UPSAMPLERS_2D = [n for n in list_upsamplers(kind="upsampler") if not upsampler_info(n).needs_style]
UPSAMPLERS_3D = [n for n in UPSAMPLERS_2D if 3 in upsampler_info(n).spatial_dims]
SMALL = dict(channels=(4, 8, 16), norm="group")


def _backward_reaches_every_parameter(model, out):
    (out * torch.randn_like(out)).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"no gradient for {missing[:5]}"


@pytest.mark.parametrize("upsampler", UPSAMPLERS_2D)
@pytest.mark.parametrize("size", [(32, 48), (35, 53)])
def test_unet_2d_output_matches_input_size(upsampler, size):
    net = UNet(spatial_dims=2, in_channels=3, num_classes=5, upsampler=upsampler, **SMALL)
    x = torch.randn(2, 3, *size)
    out = net(x)
    assert out.shape == (2, 5, *size)
    _backward_reaches_every_parameter(net, out)


@pytest.mark.parametrize("upsampler", UPSAMPLERS_3D)
def test_unet_3d_anisotropic_output_matches_awkward_volume(upsampler):
    strides = plan_strides((5.0, 0.8, 0.8), (16, 64, 64), max_stages=2)
    assert strides == [(1, 2, 2), (1, 2, 2)]
    net = UNet(spatial_dims=3, in_channels=1, num_classes=3, strides=strides, upsampler=upsampler, **SMALL)
    assert net.size_multiple == (1, 4, 4)
    x = torch.randn(1, 1, 7, 29, 22)
    out = net(x)
    assert out.shape == (1, 3, 7, 29, 22)
    _backward_reaches_every_parameter(net, out)
    scales = [stage.upsample.scale for stage in net.decoder]
    assert scales == [(1, 2, 2), (1, 2, 2)]


def test_unet_at_the_sizes_of_the_issue():
    net2 = UNet(spatial_dims=2, in_channels=3, num_classes=4, channels=(4, 8, 8, 8, 8), norm="none")
    assert net2(torch.randn(1, 3, 350, 525)).shape == (1, 4, 350, 525)
    net3 = UNet(
        spatial_dims=3, in_channels=1, num_classes=2, channels=(2, 4, 4), norm="none", strides=[(1, 2, 2), (2, 2, 2)]
    )
    assert net3(torch.randn(1, 1, 37, 131, 97)).shape == (1, 2, 37, 131, 97)


def test_strict_policy_names_the_nearest_valid_sizes():
    net = UNet(spatial_dims=2, in_channels=3, num_classes=2, input_policy="strict", **SMALL)
    assert net(torch.randn(1, 3, 32, 36)).shape == (1, 2, 32, 36)
    with pytest.raises(ShapeError, match=r"axis 0: 35 -> 32 or 36; axis 1: 53 -> 52 or 56"):
        net(torch.randn(1, 3, 35, 53))


def test_mixed_upsamplers_per_stage_and_post_filter():
    net = UNet(
        spatial_dims=2,
        in_channels=3,
        num_classes=2,
        upsampler=["pixel_shuffle", "dysample"],
        upsampler_options=[{"icnr": False}, None],
        post_filter="masked_blur",
        post_filter_options={"threshold": 0.0},
        **SMALL,
    )
    assert [type(s.upsample).__name__ for s in net.decoder] == ["PixelShuffleUpsampler", "DySampleUpsampler"]
    assert net.decoder[0].upsample.icnr is False
    assert net(torch.randn(1, 3, 20, 20)).shape == (1, 2, 20, 20)
    with pytest.raises(ConfigError, match=r"upsampler as a list needs one entry per decoder stage \(2\), got 3"):
        UNet(spatial_dims=2, in_channels=3, num_classes=2, upsampler=["transposed"] * 3, **SMALL)


def test_checkpointing_gives_the_same_outputs_and_gradients():
    torch.manual_seed(1)
    plain = UNet(spatial_dims=2, in_channels=3, num_classes=3, **SMALL)
    ckpt = UNet(spatial_dims=2, in_channels=3, num_classes=3, checkpointing=True, **SMALL)
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 24, 24)
    a, b = plain(x), ckpt(x)
    torch.testing.assert_close(a, b)
    a.sum().backward()
    b.sum().backward()
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def _train_three_steps(checkpointing: bool, dims: int) -> tuple[dict, torch.Tensor]:
    """Three SGD steps in float64: recomputation in backward sums gradients in another order, so two
    autograd graphs agree to rounding only (float32 would leave ~1e-6 after the steps, on some CPUs)."""
    torch.manual_seed(0)
    net = UNet(spatial_dims=dims, in_channels=1, num_classes=3, channels=(4, 8, 16), checkpointing=checkpointing)
    net = net.double()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    shape = (2, 1, 16, 16) if dims == 2 else (2, 1, 8, 16, 16)
    for _ in range(3):
        loss = net(torch.randn(*shape, generator=g, dtype=torch.float64)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return net.state_dict(), net.eval()(torch.randn(*shape, generator=g, dtype=torch.float64))


@pytest.mark.parametrize("dims", [2, 3])
def test_checkpointing_changes_nothing_but_memory(dims):
    """The recomputation in backward must not update BatchNorm statistics a second time."""
    plain_state, plain_out = _train_three_steps(False, dims)
    ckpt_state, ckpt_out = _train_three_steps(True, dims)
    assert plain_state.keys() == ckpt_state.keys()
    for name, value in plain_state.items():  # a second BatchNorm update would move these by ~1e-2
        torch.testing.assert_close(ckpt_state[name], value, rtol=1e-10, atol=1e-12, msg=name)
    assert int(ckpt_state["encoder.blocks.0.0.1.num_batches_tracked"]) == 3
    torch.testing.assert_close(ckpt_out, plain_out, rtol=1e-10, atol=1e-12)


def test_channels_last_and_deep_supervision():
    net = UNet(spatial_dims=2, in_channels=3, num_classes=3, deep_supervision=True, **SMALL).eval()
    x = torch.randn(2, 3, 21, 30)
    torch.testing.assert_close(net(x.to(memory_format=torch.channels_last)), net(x), rtol=1e-4, atol=1e-5)
    net.train()
    main, *aux = net(x, aux=True)
    assert main.shape == (2, 3, 21, 30)
    assert [tuple(a.shape[2:]) for a in aux] == [(11, 15)]  # the deeper of the two decoder stages
    torch.testing.assert_close(net(x, aux=False), main)  # one tensor, the main output: as every model
    with pytest.warns(FutureWarning, match=r"call forward\(x, aux=True\)"):
        assert isinstance(net(x), list)  # the old answer, for one more release
    with pytest.raises(ConfigError, match="build with deep_supervision=True"):
        UNet(spatial_dims=2, in_channels=3, num_classes=3, **SMALL)(x, aux=True)


@pytest.mark.parametrize("encoder", ["resnet18", "tu-resnet18"])
def test_pretrained_style_encoders_and_local_weights(encoder, tmp_path):
    net = UNet(spatial_dims=2, in_channels=3, num_classes=4, encoder=encoder, upsampler="interp_conv")
    assert net.size_multiple == (32, 32)
    assert net(torch.randn(1, 3, 70, 45)).shape == (1, 4, 70, 45)
    path = tmp_path / "encoder.pt"
    torch.save(net.encoder.encoder.state_dict(), path)
    other = UNet(spatial_dims=2, in_channels=3, num_classes=4, encoder=encoder, encoder_weights=str(path))
    for (name, p), q in zip(net.encoder.state_dict().items(), other.encoder.state_dict().values()):
        assert torch.equal(p, q), name


def test_encoder_errors():
    with pytest.raises(RegistryError, match="unknown encoder 'resnet343'.*did you mean 'resnet34'"):
        UNet(spatial_dims=2, in_channels=3, num_classes=2, encoder="resnet343")
    with pytest.raises(ConfigError, match="encoder 'resnet18' is 2D only"):
        UNet(spatial_dims=3, in_channels=1, num_classes=2, encoder="resnet18")
    with pytest.raises(ConfigError, match="encoder_weights '/no/such/file.pt' is not a file; give"):
        UNet(spatial_dims=2, in_channels=3, num_classes=2, encoder="resnet18", encoder_weights="/no/such/file.pt")
    for weights in ("imagenet", ""):
        with pytest.raises(
            ConfigError, match=f"encoder_weights '{weights}' is not a file; .* 'imagenet-lite' \\(ImageNet"
        ):
            UNet(spatial_dims=2, in_channels=3, num_classes=2, encoder="resnet18", encoder_weights=weights)
    with pytest.raises(ConfigError, match=r"strides needs one entry per stage after the first \(2"):
        UNet(spatial_dims=2, in_channels=3, num_classes=2, channels=(4, 8, 16), strides=[2])


def test_encoder_weights_of_another_architecture_are_refused(tmp_path):
    path = tmp_path / "resnet34.pt"
    torch.save(smp.encoders.get_encoder("resnet34", weights=None).state_dict(), path)
    encoder = smp.encoders.get_encoder("resnet18", weights=None)
    with pytest.raises(ConfigError, match="has extra tensors for this encoder"):  # resnet34 has more blocks
        load_encoder_weights(encoder, path)
    state = encoder.state_dict()
    state["conv1.weight"] = torch.zeros(3, 3, 3, 3)
    torch.save(state, tmp_path / "bad_shape.pt")
    with pytest.raises(ConfigError, match="has wrongly shaped tensors.*conv1.weight"):
        load_encoder_weights(encoder, tmp_path / "bad_shape.pt")
    torch.save({"conv.weight": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(ConfigError, match="lacks"):
        load_encoder_weights(encoder, tmp_path / "other.pt")


# -- smp adapter -------------------------------------------------------------------------------------
def test_smp_adapter_with_nearest_interpolation_equals_smp_unet():
    torch.manual_seed(0)
    reference = smp.Unet("resnet18", encoder_weights=None, classes=3).eval()
    ours = smp_unet("resnet18", upsampler="interpolate", upsampler_options={"mode": "nearest"}, num_classes=3).eval()
    assert ours.load_state_dict(reference.state_dict(), strict=True)  # same parameter names
    x = torch.randn(2, 3, 64, 96)
    torch.testing.assert_close(ours(x), reference(x), rtol=0, atol=0)


@pytest.mark.parametrize("upsampler", UPSAMPLERS_2D)
def test_smp_adapter_accepts_every_upsampler(upsampler):
    guided = upsampler_info(upsampler).needs_guide  # the last block has no skip to guide it
    net = smp_unet("resnet18", upsampler=[upsampler] * 4 + ["interpolate"] if guided else upsampler, num_classes=2)
    out = net(torch.randn(2, 3, 32, 32))  # resnet18's smallest size (stride 32); two for BatchNorm at 1x1
    assert out.shape == (2, 2, 32, 32)
    _backward_reaches_every_parameter(net, out)


@pytest.mark.parametrize(
    "build, where",
    [(lambda: UNet(spatial_dims=2, in_channels=3, num_classes=2, upsampler="modulated", **SMALL), "UNet decoder"),
     (lambda: smp_unet("resnet18", upsampler="modulated", num_classes=2), "smp_unet"),
     (lambda: DCGANGenerator(latent_dim=16, out_channels=3, resolution=32, upsampler="modulated"), "DCGANGenerator")],
)  # fmt: skip
def test_models_without_a_style_refuse_a_style_conditioned_block_in_one_line(build, where):
    with pytest.raises(ConfigError, match=rf"{where}.*'modulated' is style-conditioned \(block\(x, style\)\); only a "
                       r"style-based generator gives its blocks a style") as caught:  # fmt: skip
        build()
    assert "\n" not in str(caught.value)


# -- GAN ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("upsampler", UPSAMPLERS_2D)
@pytest.mark.parametrize("resolution", [32, 64])
def test_generator_with_every_upsampler(upsampler, resolution):
    if upsampler_info(upsampler).needs_guide:  # a generator has no encoder feature to guide it
        with pytest.raises(ConfigError, match=rf"DCGANGenerator stage 0: '{upsampler}' is guided by the encoder skip"):
            DCGANGenerator(latent_dim=16, out_channels=3, resolution=resolution, upsampler=upsampler, base_channels=8)
        return
    if upsampler_info(upsampler).keeps_channels:  # the generator halves channels at every stage
        with pytest.raises(ConfigError, match=r"Upsampler keeps the channel count"):
            DCGANGenerator(latent_dim=16, out_channels=3, resolution=resolution, upsampler=upsampler, base_channels=8)
        return
    g = DCGANGenerator(latent_dim=16, out_channels=3, resolution=resolution, upsampler=upsampler, base_channels=8)
    assert [type(m).__name__ for m in g.stages[0][1:]] == ["BatchNorm2d", "ReLU"]
    assert [type(m).__name__ for m in g.stages[-1][1:]] == ["Tanh"]
    x = g(torch.randn(3, 16))
    assert x.shape == (3, 3, resolution, resolution)
    assert x.min() >= -1 and x.max() <= 1
    _backward_reaches_every_parameter(g, x)


@pytest.mark.parametrize(
    "last, options", [("interp_conv", {"mode": "bilinear"}), ("fir", None), ("pixel_shuffle", None)]
)
def test_last_upsampler_swaps_the_last_stage_alone(last, options):
    """Chandrasegaran et al.'s swap: only the layer that writes the image changes; the projection and
    every earlier stage are the transposed generator's, weight for weight (built in the same order)."""
    torch.manual_seed(0)
    plain = DCGANGenerator.classic(16, 3, 32, base_channels=8)
    torch.manual_seed(0)
    swapped = DCGANGenerator.classic(16, 3, 32, base_channels=8, last_upsampler=last, last_upsampler_options=options)
    layers = [[type(m).__name__ for m in stage[1:]] for stage in swapped.stages]
    assert layers == [["BatchNorm2d", "ReLU"], ["BatchNorm2d", "ReLU"], ["Tanh"]]  # only the image layer ends in tanh
    kinds = [type(stage[0]).__name__ for stage in swapped.stages]
    assert kinds[:-1] == ["TransposedConvUpsampler"] * 2 and kinds[-1] != "TransposedConvUpsampler"
    assert swapped.stages[-1][0].out_channels == 3 and swapped.stages[-1][0].in_channels == 8
    for a, b in zip([plain.project, *plain.stages[:-1]], [swapped.project, *swapped.stages[:-1]]):
        for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
            assert torch.equal(p, q), name  # copies of the same draws
    x = swapped(torch.randn(2, 16))
    assert x.shape == (2, 3, 32, 32)
    _backward_reaches_every_parameter(swapped, x)


def test_last_upsampler_options_need_a_last_upsampler_and_are_checked():
    with pytest.raises(ConfigError, match="last_upsampler_options without a last_upsampler"):
        DCGANGenerator(latent_dim=16, out_channels=3, resolution=32, last_upsampler_options={"mode": "bilinear"})
    with pytest.raises(ConfigError, match=r"DCGANGenerator stage 2: 'fade' is guided"):
        DCGANGenerator(latent_dim=16, out_channels=3, resolution=32, last_upsampler="fade")
    with pytest.raises(RegistryError, match="nope"):
        DCGANGenerator(
            latent_dim=16,
            out_channels=3,
            resolution=32,
            last_upsampler="interp_conv",
            last_upsampler_options={"nope": 1},
        )
    spec = ModelSpec.from_dict({"architecture": "dcgan", "latent_dim": 8, "out_channels": 3, "resolution": 32,
                                "last_upsampler": "fir", "base_channels": 4})  # fmt: skip
    assert type(build_model(spec).stages[-1][0]).__name__ == "FirUpsampler"


def test_classic_dcgan_and_discriminator_at_128_with_masked_blur():
    g = DCGANGenerator.classic(
        32, 3, 128, base_channels=8, post_filter="masked_blur", post_filter_options={"threshold": 0.5}
    )
    assert g.stages[0][0].kernel_size == (4, 4) and g.stages[0][0].padding == (1, 1)
    d = DCGANDiscriminator(in_channels=3, resolution=128, base_channels=8)
    x = g(torch.randn(2, 32, 1, 1))
    assert x.shape == (2, 3, 128, 128) and d(x).shape == (2,)
    with pytest.raises(ShapeError, match="expects 128x128 images, got 64x64"):
        d(torch.randn(2, 3, 64, 64))
    with pytest.raises(ShapeError, match=r"expects latents \(B, 32\)"):
        g(torch.randn(2, 31))
    with pytest.raises(ConfigError, match="power of two"):
        DCGANGenerator(latent_dim=8, out_channels=3, resolution=48)
    assert DCGAN_TRANSPOSED_OPTIONS == {"kernel_size": 4, "padding": 1}


# -- planning and the factory ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spacing, patch, expected",
    [
        ((5.0, 0.8, 0.8), (32, 128, 128), [(1, 2, 2), (1, 2, 2), (2, 2, 2), (2, 2, 2)]),
        ((1.0, 1.0, 1.0), (64, 64, 64), [(2, 2, 2)] * 3),
        ((2.0, 2.0, 2.0), (91, 109, 91), [(2, 2, 2)] * 3),  # MNI152 at 2 mm
        ((3.0, 0.7, 0.7), (16, 160, 160), [(1, 2, 2), (1, 2, 2), (2, 2, 2), (1, 2, 2)]),
        ((1.0, 1.0), (512, 1024), [(2, 2)] * 5),
    ],
)
def test_plan_strides_on_known_spacings(spacing, patch, expected):
    assert plan_strides(spacing, patch) == expected


def test_build_model_validates_the_spec():
    net = build_model(
        {
            "architecture": "unet",
            "spatial_dims": 3,
            "in_channels": 1,
            "num_classes": 2,
            "channels": [4, 8],
            "strides": [[1, 2, 2]],
        }
    )
    assert net.size_multiple == (1, 2, 2)
    assert isinstance(
        build_model({"architecture": "dcgan", "latent_dim": 8, "out_channels": 3, "resolution": 32}), DCGANGenerator
    )
    with pytest.raises(ConfigError, match=r"model.upsamplr: unknown key.*did you mean 'upsampler'\?"):
        build_model({"architecture": "unet", "spatial_dims": 2, "in_channels": 3, "num_classes": 2, "upsamplr": "x"})
    with pytest.raises(ConfigError, match="model.num_classes: expected a whole number, got '4' \\(str\\)"):
        build_model({"architecture": "unet", "spatial_dims": 2, "in_channels": 3, "num_classes": "4"})
    with pytest.raises(ConfigError, match="model: missing required key\\(s\\): num_classes"):
        build_model({"architecture": "unet", "spatial_dims": 2, "in_channels": 3})
    with pytest.raises(RegistryError, match="model.architecture: unknown architecture .*did you mean 'dcgan'"):
        build_model({"architecture": "dcgann"})


def test_the_generators_positional_arguments_still_work_for_a_release_with_a_warning():
    with pytest.warns(FutureWarning, match=r"DCGANGenerator: pass latent_dim=, out_channels=, resolution= by keyword"):
        old = DCGANGenerator(16, 3, 32, base_channels=8)
    torch.manual_seed(0)
    new = DCGANGenerator(latent_dim=16, out_channels=3, resolution=32, base_channels=8)
    assert [p.shape for p in old.parameters()] == [p.shape for p in new.parameters()]
    with pytest.warns(FutureWarning, match=r"DCGANDiscriminator: pass in_channels=, resolution= by keyword"):
        DCGANDiscriminator(3, 32, base_channels=8)
    with pytest.raises(TypeError, match=r"got 'latent_dim' both by position and by keyword"):
        DCGANGenerator(16, latent_dim=16, out_channels=3, resolution=32)
    with pytest.raises(TypeError, match=r"takes at most 3 positional arguments, got 4"):
        DCGANGenerator(16, 3, 32, "interp_conv")
    assert all(p.kind == p.KEYWORD_ONLY for p in inspect.signature(DCGANGenerator).parameters.values())


_UNEVEN = {"kernel_size": 3, "padding": 1, "output_padding": 1}  # exact size, uneven overlap: a warning


@pytest.mark.parametrize(
    ("build", "where"),
    [
        (lambda: UNet(spatial_dims=2, in_channels=3, num_classes=2, upsampler="transposed", upsampler_options=_UNEVEN),
         "UNet decoder stage 0 (upsampler_options): "),
        (lambda: smp_unet("resnet18", num_classes=2, upsampler="transposed", upsampler_options=_UNEVEN),
         "smp_unet decoder block 0 (upsampler_options): "),
        (lambda: smp_fpn("resnet18", num_classes=2, upsampler="transposed", upsampler_options=_UNEVEN),
         "smp_fpn top_down 0 (upsampler_options): "),
        (lambda: DCGANGenerator(latent_dim=8, out_channels=3, resolution=32, upsampler="transposed",
                                upsampler_options=_UNEVEN),
         "DCGANGenerator stage 0 (upsampler_options): "),
    ],
)  # fmt: skip
def test_every_builder_warns_at_the_users_call_naming_the_place(build, where):
    with pytest.warns(UserWarning) as caught:
        build()
    messages = [str(w.message) for w in caught]
    assert any(
        m.startswith(where + "transposed: kernel_size=(3, 3) at stride (2, 2) overlaps unevenly") for m in messages
    )
    assert {w.filename for w in caught} == {__file__}  # never a line inside upzoo, however deep it noticed


def test_smp_unet_refuses_a_block_whose_output_is_not_input_x_scale_when_built():
    with pytest.raises(ConfigError, match=r"smp_unet decoder block 0: TransposedConvUpsampler maps size 5 to 11x11, "
                                          r"the model needs exactly 10x10"):  # fmt: skip
        smp_unet("resnet18", num_classes=2, upsampler="transposed", upsampler_options={"kernel_size": 3})


def test_upzoo_and_smp_models_share_one_strict_input_policy():
    unet = UNet(spatial_dims=2, in_channels=3, num_classes=2, input_policy="strict")
    smp_model = smp_unet("resnet18", num_classes=2, input_policy="strict")
    for model, rule in ((unet, "multiples of 8"), (smp_model, "multiples of 32")):
        expected = rf"input size \(32, 33\) is not valid \(per axis: {rule}, {rule}; input_policy='strict'\); "
        with pytest.raises(ShapeError, match=expected + "nearest valid sizes: axis 1: 33 -> 32 or "):
            model(torch.zeros(1, 3, 32, 33))
    with pytest.raises(ConfigError, match="input_policy must be 'pad' or 'strict', got 'crop'"):
        UNet(spatial_dims=2, in_channels=3, num_classes=2, input_policy="crop")


def test_dcgan_without_an_upsampler_builds_todays_stages_and_says_the_default_moves_to_dcgans_own():
    import warnings

    with pytest.warns(FutureWarning, match=r"the default becomes DCGAN's own transposed stage") as caught:
        default = DCGANGenerator(latent_dim=8, out_channels=3, resolution=32, base_channels=4)
    assert caught[0].filename == __file__
    assert type(default.stages[0][0]).__name__ == "InterpConvUpsampler"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        named = DCGANGenerator(latent_dim=8, out_channels=3, resolution=32, base_channels=4, upsampler="interp_conv")
    assert [type(m).__name__ for m in named.modules()] == [type(m).__name__ for m in default.modules()]
