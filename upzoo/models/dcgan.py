"""DCGAN generator (every x2 stage a registered upsampler) and the matching discriminator."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from upzoo.checks import check_positive_int
from upzoo.errors import ConfigError, ShapeError
from upzoo.layers import check_input_shape
from upzoo.models.stage_blocks import post_filter_block, stage_block
from upzoo.registry import block_options
from upzoo.runtime import warn_at_caller
from upzoo.validation import positional_deprecated

__all__ = ["DCGANGenerator", "DCGANDiscriminator", "DCGAN_TRANSPOSED_OPTIONS"]

DCGAN_TRANSPOSED_OPTIONS: dict[str, Any] = {"kernel_size": 4, "padding": 1}
"""Options that make the ``transposed`` block the classic DCGAN stage: kernel 4, stride 2, padding 1."""

DEFAULT_CHANGES = (
    "DCGANGenerator without upsampler= builds interp_conv stages; the default becomes DCGAN's own "
    "transposed stage (upsampler='transposed', upsampler_options=DCGAN_TRANSPOSED_OPTIONS) in the next "
    "release, as every builder defaults to its architecture's reference upsampling; pass "
    "upsampler='interp_conv' to keep today's stages"
)


def _stages(resolution: int) -> int:
    if not isinstance(resolution, int) or resolution < 8 or resolution & (resolution - 1):
        raise ConfigError(f"resolution must be a power of two >= 8 (32, 64, 128, ...), got {resolution!r}")
    return int(math.log2(resolution)) - 2


class DCGANGenerator(nn.Module):
    """``z (B, latent_dim) or (B, latent_dim, 1, 1) -> image (B, out_channels, R, R)`` in [-1, 1].

    A linear projection to ``(C0, 4, 4)``, then ``log2(R / 4)`` stages, each a registered upsampler
    (x2, channels halved) -> BatchNorm -> ReLU; the last stage maps to ``out_channels`` -> tanh, then
    the optional post-filter (e.g. ``masked_blur``). ``C0 = base_channels * 2 ** (stages - 1)``.

    Use ``upsampler="transposed", upsampler_options=DCGAN_TRANSPOSED_OPTIONS`` (or
    :meth:`classic`) for the original DCGAN stage. Without ``upsampler`` the stages are
    ``interp_conv`` (resize-conv) for this release, with a ``FutureWarning``: the default becomes
    DCGAN's own transposed stage, as every builder defaults to its architecture's reference
    upsampling. ``last_upsampler`` (with its own
    ``last_upsampler_options``) sets the last stage's block alone — the layer that writes the
    image, whose swap alone changes the spectrum's high frequencies (Chandrasegaran et al., CVPR
    2021); by default the last stage uses ``upsampler`` too.

    Raises:
        ConfigError: a resolution that is not a power of two >= 8, a stage that does not double
            the size, ``last_upsampler_options`` without a ``last_upsampler``, or a block's options.
    """

    @positional_deprecated("latent_dim", "out_channels", "resolution")
    def __init__(
        self,
        *,
        latent_dim: int,
        out_channels: int,
        resolution: int,
        upsampler: str | None = None,
        upsampler_options: dict[str, Any] | None = None,
        last_upsampler: str | None = None,
        last_upsampler_options: dict[str, Any] | None = None,
        post_filter: str | None = None,
        post_filter_options: dict[str, Any] | None = None,
        base_channels: int = 64,
    ) -> None:
        super().__init__()
        if upsampler is None:
            warn_at_caller(DEFAULT_CHANGES)
            upsampler = "interp_conv"
        self.latent_dim = check_positive_int(latent_dim, "latent_dim")
        self.out_channels = check_positive_int(out_channels, "out_channels")
        self.resolution = resolution
        n = _stages(resolution)
        channels = [check_positive_int(base_channels, "base_channels") * 2 ** (n - 1 - i) for i in range(n)]
        self.project = nn.Sequential(
            nn.Linear(self.latent_dim, channels[0] * 16, bias=False),
            nn.Unflatten(1, (channels[0], 4, 4)),
            nn.BatchNorm2d(channels[0]),
            nn.ReLU(inplace=True),
        )
        self.stages = _build_stages(
            (upsampler, upsampler_options), (last_upsampler, last_upsampler_options), channels, self.out_channels
        )
        self.post_filter = post_filter_block(post_filter, post_filter_options, channels=out_channels,
                                             where="DCGANGenerator post_filter")  # fmt: skip

    @classmethod
    def classic(
        cls, latent_dim: int = 100, out_channels: int = 3, resolution: int = 64, **kwargs: Any
    ) -> DCGANGenerator:
        """The original DCGAN generator: transposed convs with kernel 4, stride 2, padding 1."""
        return cls(
            latent_dim=latent_dim,
            out_channels=out_channels,
            resolution=resolution,
            upsampler="transposed",
            upsampler_options=DCGAN_TRANSPOSED_OPTIONS,
            **kwargs,
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Images ``(B, out_channels, resolution, resolution)`` from latents ``(B, latent_dim)``.

        Raises:
            ShapeError: latents that are not ``(B, latent_dim)`` or ``(B, latent_dim, 1, 1)``.
        """
        if z.ndim == 4 and z.shape[2:] == (1, 1):
            z = z.flatten(1)
        if z.ndim != 2 or z.shape[1] != self.latent_dim:
            raise ShapeError(
                f"DCGANGenerator expects latents (B, {self.latent_dim}) or (B, {self.latent_dim}, 1, 1), "
                f"got {tuple(z.shape)}"
            )
        x = self.stages(self.project(z))
        return self.post_filter(x) if self.post_filter is not None else x


def _build_stages(
    every: tuple[str, dict[str, Any] | None], last: tuple[str | None, dict[str, Any] | None], channels: list[int],
    out_channels: int,
) -> nn.Sequential:  # fmt: skip
    """The generator's x2 stages: block -> BatchNorm -> ReLU, the last block -> tanh; ``every``
    (name, options) for each stage, ``last`` for the last one where it names a block."""
    (upsampler, upsampler_options), (last_upsampler, last_upsampler_options) = every, last
    n = len(channels)
    if last_upsampler is None and last_upsampler_options is not None:
        raise ConfigError(
            "DCGANGenerator: last_upsampler_options without a last_upsampler; name the last stage's block "
            "(last_upsampler), or set the options of every stage with upsampler_options"
        )
    blocks = [(upsampler, block_options(upsampler_options, "DCGANGenerator"), "upsampler_options")] * n
    if last_upsampler is not None:
        blocks[-1] = (
            last_upsampler,
            block_options(last_upsampler_options, "DCGANGenerator"),
            "last_upsampler_options",
        )
    stages: list[nn.Module] = []
    for i, (name, options, source) in enumerate(blocks):
        final = i == n - 1
        c_in, c_out = channels[i], out_channels if final else channels[i + 1]
        up = stage_block(name, options, where=f"DCGANGenerator stage {i}", in_channels=c_in, out_channels=c_out,
                         scale=2, options_key=source)  # fmt: skip
        stages.append(
            nn.Sequential(up, nn.Tanh()) if final else nn.Sequential(up, nn.BatchNorm2d(c_out), nn.ReLU(True))
        )
    return nn.Sequential(*stages)


class DCGANDiscriminator(nn.Module):
    """``image (B, in_channels, R, R) -> logits (B,)``: strided 4x4 convs (x1/2 each), LeakyReLU(0.2),
    down to 4x4, then a 4x4 conv to one logit. ``norm="batch"``: BatchNorm after every conv but the
    first (DCGAN); ``norm="spectral"``: every conv spectrally normalised and no BatchNorm (Miyato et
    al., ICLR 2018: the discriminator stays Lipschitz, a stabiliser when it wins too easily).

    Raises:
        ConfigError: a ``norm`` other than ``'batch'`` or ``'spectral'``, or widths that are not positive.
    """

    @positional_deprecated("in_channels", "resolution")
    def __init__(self, *, in_channels: int, resolution: int, base_channels: int = 64, norm: str = "batch") -> None:
        super().__init__()
        if norm not in ("batch", "spectral"):
            raise ConfigError(f"DCGANDiscriminator norm must be 'batch' or 'spectral', got {norm!r}")
        self.in_channels = check_positive_int(in_channels, "in_channels")
        self.resolution = resolution
        n = _stages(resolution)
        spectral = nn.utils.parametrizations.spectral_norm if norm == "spectral" else (lambda m: m)
        layers: list[nn.Module] = [spectral(nn.Conv2d(in_channels, base_channels, 4, 2, 1)), nn.LeakyReLU(0.2, True)]
        c = base_channels
        for _ in range(n - 1):
            conv = spectral(nn.Conv2d(c, 2 * c, 4, 2, 1, bias=norm == "spectral"))
            layers += (
                [conv, nn.BatchNorm2d(2 * c), nn.LeakyReLU(0.2, True)]
                if norm == "batch"
                else [conv, nn.LeakyReLU(0.2, True)]
            )
            c *= 2
        layers.append(spectral(nn.Conv2d(c, 1, 4, 1, 0)))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One logit per image ``(B,)`` of images ``(B, in_channels, resolution, resolution)``.

        Raises:
            ShapeError: images of another channel count or size than the discriminator was built for.
        """
        shape = check_input_shape(x.shape, spatial_dims=2, channels=self.in_channels, owner="DCGANDiscriminator")
        if shape[2:] != (self.resolution, self.resolution):
            raise ShapeError(
                f"DCGANDiscriminator expects {self.resolution}x{self.resolution} images, got {shape[2]}x{shape[3]}; "
                f"resize the images or build it with resolution={shape[2]}"
            )
        return self.net(x).flatten()
