"""The registry: wildcards, errors with closest matches, duplicates, overrides, entry-point plugins."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from torch import nn

from upzoo import ConfigError, MaskedGaussianBlur, RegistryError, create_upsampler, list_upsamplers, register_upsampler
from upzoo.registry import UPSAMPLERS, PluginWarning, Registry, upsampler_info
from upzoo.upsamplers import TransposedConvUpsampler, Upsampler

BUILT_INS = [
    "anyup",
    "carafe",
    "dysample",
    "fade",
    "fir",
    "interp_conv",
    "interpolate",
    "jafar",
    "jbu",
    "loftup",
    "masked_blur",
    "modulated",
    "pixel_shuffle",
    "sapa",
    "separable_transposed",
    "transposed",
    "zero_insertion",
]


def test_built_ins_are_listed_with_wildcards_and_kinds():
    assert list_upsamplers() == BUILT_INS
    assert list_upsamplers("*shuffle*") == ["pixel_shuffle"]
    assert list_upsamplers("inter*") == ["interp_conv", "interpolate"]
    assert list_upsamplers(kind="post_filter") == ["masked_blur"]
    assert "masked_blur" not in list_upsamplers(kind="upsampler")
    info = upsampler_info("carafe")
    assert info.spatial_dims == (2, 3) and info.kind == "upsampler"
    assert info.description.startswith("CARAFE")
    assert info.options["kernel_size"] is None  # the default: 5 in 2D, 3 in 3D


def test_unknown_name_lists_the_options_and_the_closest_match():
    with pytest.raises(
        RegistryError,
        match=r"unknown upsampler 'pixelshuffle'; registered: anyup, carafe, .*did you mean 'pixel_shuffle'\?",
    ):
        create_upsampler("pixelshuffle", spatial_dims=2, in_channels=2, out_channels=2, scale=2)


def test_unknown_option_suggests_the_closest_option():
    with pytest.raises(
        RegistryError, match=r"has no option 'kernel'; its options are: kernel_size, .*did you mean 'kernel_size'\?"
    ):
        create_upsampler("transposed", spatial_dims=2, in_channels=2, out_channels=2, scale=2, kernel=3)


def test_duplicate_names_fail_naming_both_origins_unless_overridden():
    registry = Registry("upzoo.test_group_nobody_uses")

    @registry.register("nearest")
    class First(Upsampler):
        """First."""

    with pytest.raises(RegistryError, match=r"'nearest' is registered twice: by .*First and by .*Second"):

        @registry.register("nearest")
        class Second(Upsampler):
            """Second."""

    @registry.register("nearest", override=True)
    class Third(Upsampler):
        """Third."""

    assert registry.info("nearest").factory is Third


def test_bad_names_are_rejected():
    with pytest.raises(RegistryError, match="lowercase snake case"):
        register_upsampler("PixelShuffle")(TransposedConvUpsampler)


def test_decorated_block_is_created_by_name_and_removed_again():
    @register_upsampler("test_nearest_only")
    class NearestOnly(Upsampler):
        """Nearest-neighbour upsampling, for the test."""

        def upsample(self, x):
            return torch.nn.functional.interpolate(x, scale_factor=self.scale, mode="nearest")

    try:
        block = create_upsampler("test_nearest_only", spatial_dims=2, in_channels=1, out_channels=1, scale=(2, 3))
        assert block(torch.ones(1, 1, 2, 2)).shape == (1, 1, 4, 6)
        assert upsampler_info("test_nearest_only").description == "Nearest-neighbour upsampling, for the test"
    finally:
        UPSAMPLERS.unregister("test_nearest_only")
    assert "test_nearest_only" not in list_upsamplers()


@pytest.fixture
def plugin_dir(tmp_path):
    """A fake installed distribution 'upzoo-tiny-plugin' exposing entry points in upzoo.upsamplers."""

    def make(entry_points: str, modules: dict[str, str]) -> None:
        dist = tmp_path / "upzoo_tiny_plugin-0.1.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: upzoo-tiny-plugin\nVersion: 0.1\n")
        (dist / "entry_points.txt").write_text(textwrap.dedent(entry_points))
        for name, source in modules.items():
            (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        sys.path.insert(0, str(tmp_path))

    yield make
    sys.path.remove(str(tmp_path))
    UPSAMPLERS.reload_plugins()  # drops the plugin entries and restores what they overrode
    assert list_upsamplers() == BUILT_INS
    for name in [n for n in sys.modules if n.startswith("tiny_plugin")]:
        del sys.modules[name]


TINY = """
    import torch
    from upzoo import Upsampler

    class TinyRepeat(Upsampler):
        '''Repeat every pixel (a plugin block).'''
        supported_spatial_dims = (2,)

        def upsample(self, x):
            for axis, r in enumerate(self.scale):
                x = x.repeat_interleave(r, dim=2 + axis)
            return x
"""


def test_plugin_from_an_installed_distribution_is_created_by_name(plugin_dir):
    plugin_dir(
        """
        [upzoo.upsamplers]
        tiny_repeat = tiny_plugin_ok:TinyRepeat
        tiny_broken = tiny_plugin_missing:Nothing
        """,
        {"tiny_plugin_ok": TINY},
    )
    with pytest.warns(
        PluginWarning, match=r"skipped the upsampler plugin 'tiny_broken' from package 'upzoo-tiny-plugin'"
    ):
        UPSAMPLERS.reload_plugins()
    assert "tiny_repeat" in list_upsamplers()
    info = upsampler_info("tiny_repeat")
    assert info.origin == "plugin package 'upzoo-tiny-plugin' (tiny_plugin_ok:TinyRepeat)"
    assert info.spatial_dims == (2,) and info.description == "Repeat every pixel (a plugin block)"
    block = create_upsampler("tiny_repeat", spatial_dims=2, in_channels=1, out_channels=1, scale=(1, 2))
    assert torch.equal(block(torch.tensor([[[[1.0, 2.0]]]])), torch.tensor([[[[1.0, 1.0, 2.0, 2.0]]]]))
    # the built-ins keep working next to a broken plugin
    assert create_upsampler("transposed", spatial_dims=2, in_channels=1, out_channels=1, scale=2) is not None


def test_plugin_that_reuses_a_built_in_name_is_an_error_naming_both(plugin_dir):
    plugin_dir("[upzoo.upsamplers]\ntransposed = tiny_plugin_dup:TinyRepeat\n", {"tiny_plugin_dup": TINY})
    with pytest.raises(
        RegistryError,
        match=r"'transposed' is registered twice: by upzoo.upsamplers.transposed:TransposedConvUpsampler "
        r"and by plugin package 'upzoo-tiny-plugin'",
    ):
        UPSAMPLERS.reload_plugins()
    with pytest.raises(RegistryError, match="registered twice"):  # every lookup says so until it is fixed
        create_upsampler("carafe", spatial_dims=2, in_channels=1, out_channels=1, scale=2)


def test_plugin_may_override_explicitly(plugin_dir):
    plugin_dir(
        "[upzoo.upsamplers]\ncarafe = tiny_plugin_over:TinyRepeat\n",
        {"tiny_plugin_over": TINY + "\n    TinyRepeat.override = True\n"},
    )
    UPSAMPLERS.reload_plugins()
    assert upsampler_info("carafe").origin.startswith("plugin package")


def test_post_filters_are_blocks_of_the_contract():
    from upzoo.upsamplers.base import PostFilter, Upsampler

    blur = create_upsampler("masked_blur", spatial_dims=3, in_channels=4, out_channels=4, scale=1, threshold=0.5)
    assert isinstance(blur, PostFilter) and isinstance(blur, Upsampler) and blur.kind == "post_filter"
    assert blur.output_shape((2, 4, 5, 6, 7)) == (2, 4, 5, 6, 7) == tuple(blur(torch.rand(2, 4, 5, 6, 7)).shape)
    any_channels = MaskedGaussianBlur(threshold=0.5)
    assert any_channels.in_channels is None and any_channels.output_shape((1, 9, 8, 8)) == (1, 9, 8, 8)


def test_a_bug_inside_a_block_keeps_its_traceback_and_only_unbindable_options_are_the_callers():
    """The registry translates what is the caller's (options the block cannot take, weights too
    large to allocate) and lets a block's own bug through as it is, with its traceback."""
    registry = Registry("upzoo.test_group_for_bugs")

    @registry.register("buggy")
    class Buggy(Upsampler):
        def __init__(self, *, spatial_dims, in_channels, out_channels, scale, width: int = 1):
            super().__init__(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, scale=scale)
            {}["missing"]  # a bug: KeyError

    contract = {"spatial_dims": 2, "in_channels": 2, "out_channels": 2, "scale": 2}
    with pytest.raises(KeyError, match="missing") as info:
        registry.create("buggy", **contract)
    assert any(frame.name == "__init__" for frame in info.traceback)  # the bug's own frame is there
    with pytest.raises(RegistryError, match="has no option 'depth'"):
        registry.create("buggy", **contract, depth=3)
    with pytest.raises(ConfigError, match=r"'pixel_shuffle' cannot be built with .*in_channels=999999999"):
        create_upsampler("pixel_shuffle", spatial_dims=2, in_channels=999999999, out_channels=999999999, scale=2)


def test_carafe_takes_the_option_names_of_fade_and_sapa_and_its_old_ones_for_a_release():
    torch.manual_seed(0)
    new = create_upsampler("carafe", spatial_dims=2, in_channels=4, out_channels=4, scale=2, kernel_size=3,
                           encoder_kernel_size=1, embedding_channels=8)  # fmt: skip
    torch.manual_seed(0)
    with pytest.warns(FutureWarning, match="kernel_up is deprecated and will be removed; use kernel_size"):
        old = create_upsampler("carafe", spatial_dims=2, in_channels=4, out_channels=4, scale=2, kernel_up=3,
                               kernel_encoder=1, compressed_channels=8)  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(new.state_dict().values(), old.state_dict().values()))
    assert new.kernel_size == old.kernel_size == 3 and new.encoder.kernel_size == (1, 1)
    with pytest.raises(ConfigError, match=r"kernel_up=3 and kernel_size=5 differ; give kernel_size alone"):
        create_upsampler("carafe", spatial_dims=2, in_channels=4, out_channels=4, scale=2, kernel_size=5, kernel_up=3)


def test_a_registered_architecture_trains_from_a_recipe_like_a_built_in(tmp_path):
    from conftest import small_recipe
    from upzoo import register_architecture
    from upzoo.models.factory import ARCHITECTURES, architecture_info
    from upzoo.recipe import parse_recipe
    from upzoo.train.engine import train

    def tiny_segmenter(*, in_channels: int = 3, num_classes: int = 2, width: int = 4) -> nn.Module:
        return nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, num_classes, 1))

    register_architecture("tiny_segmenter", tiny_segmenter)
    try:
        assert architecture_info("tiny_segmenter").task == "segmentation"
        model = {"architecture": "tiny_segmenter", "num_classes": 19, "width": 6}
        recipe = parse_recipe({**small_recipe(tmp_path / "cache"), "model": model})
        assert recipe.task == "segmentation"
        summary = train(recipe, tmp_path / "run", progress=False)
        assert summary["steps"] == 1 and 0 <= summary["val"]["miou"] <= 1
        with pytest.raises(RegistryError, match=r"architecture 'tiny_segmenter' is registered twice: by "):
            register_architecture("tiny_segmenter", lambda: nn.Identity())
        with pytest.raises(ConfigError, match=r"depth"):  # its keys are its builder's arguments
            parse_recipe({**small_recipe(tmp_path / "cache"), "model": {**model, "depth": 2}})
    finally:
        ARCHITECTURES.unregister("tiny_segmenter")


@pytest.mark.parametrize(
    ("name", "builder", "options", "message"),
    [
        ("TinyNet", nn.Identity, {}, r"architecture names are lowercase snake case and not a Python keyword, "),
        ("lambda", nn.Identity, {}, r"not a Python keyword, like 'my_architecture', got 'lambda'"),
        ("tiny_net", nn.Identity, {"task": "detection"},
         r"task must be one of segmentation, gan, super_resolution, .* got 'detection'"),
        ("unet", nn.Identity, {}, r"architecture 'unet' is registered twice: by upzoo.models.unet:UNet and by "),
        ("tiny_net", 5, {}, r"architecture 'tiny_net' from .* is not callable: got 5"),
        ("tiny_net", nn.Identity, {"latent_input": "yes"}, r"latent_input must be True or False, got 'yes'"),
    ],
)  # fmt: skip
def test_bad_architecture_registrations_are_refused(name, builder, options, message):
    from upzoo import list_architectures, register_architecture

    before = list_architectures()
    with pytest.raises(RegistryError, match=message):
        register_architecture(name, builder, **options)
    assert list_architectures() == before


def test_architectures_share_the_blocks_registry_listing_and_plugins(monkeypatch):
    """One registry class: wildcard listing, by task, did-you-mean, entry-point plugins."""
    import importlib.metadata

    from upzoo import list_architectures
    from upzoo.models.factory import ARCHITECTURES, architecture_info

    assert list_architectures("*gan*") == ["dcgan", "pggan"]
    assert list_architectures(task="super_resolution") == [
        "edsr",
        "espcn",
        "rrdbnet",
        "span",
        "srvgg_compact",
        "upconv7",
    ]

    def plugin_net(*, width: int = 2) -> nn.Module:
        return nn.Conv2d(3, width, 1)

    plugin_net.task = "gan"
    plugin_net.latent_input = True
    entries = [_FakeEntryPoint("plugin_net", plugin_net)]
    real = importlib.metadata.entry_points

    def entry_points(group=None, **kw):
        return entries if group == "upzoo.architectures" else real(group=group, **kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    try:
        ARCHITECTURES.reload_plugins()
        info = architecture_info("plugin_net")
        assert info.task == "gan" and info.latent_input and "plugin package 'fake-plugin'" in info.origin
    finally:
        monkeypatch.undo()
        ARCHITECTURES.reload_plugins()
    assert "plugin_net" not in list_architectures()


class _FakeEntryPoint:
    def __init__(self, name, target):
        self.name, self.value, self._target = name, f"fake_plugin:{name}", target
        self.module = "fake_plugin"
        self.dist = type("Dist", (), {"name": "fake-plugin"})()

    def load(self):
        return self._target


def test_an_unknown_architecture_names_the_registered_ones():
    from upzoo.models import build_model

    with pytest.raises(
        RegistryError, match=r"model.architecture: unknown architecture 'pgan'; registered: .*pggan.*pggan"
    ):
        build_model({"architecture": "pgan"})
