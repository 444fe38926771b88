"""Does the Fréchet distance on ImageNet EfficientNet-Lite features measure what it should?

Two disjoint sets of real images, A and B (crops of the package photographs; the embedded street
scenes), and FD(A, B) beside FD(A, degraded B) for Gaussian blur, Gaussian noise and JPEG of growing
strength, with KID beside it. A distance worth reporting is smallest for real against real and grows
with every degradation's strength. FD's real-vs-real value is its bias at this many images (far above
0 with 100 images of 1280-d features); KID is unbiased, about 0 there. Also prints the time to import
timm and to load the pretrained network.

    python tools/fd_sanity.py [--images 200] [--features efficientnet-lite0]
"""

from __future__ import annotations

import argparse
import io
import time

import numpy as np
import torch
from PIL import Image, ImageFilter

from upzoo.data.package_images import PACKAGE_IMAGES, read_package_image
from upzoo.data.synthetic.streets import street_scene
from upzoo.metrics import frechet_distance, kernel_distance, pretrained_features

LEVELS = {
    "blur sigma (px)": ([0.5, 1.0, 2.0, 4.0], lambda a, s, rng: _blur(a, s)),
    "noise sigma (grey levels)": ([5, 10, 20, 40], lambda a, s, rng: _noise(a, s, rng)),
    "JPEG quality": ([90, 50, 20, 5], lambda a, q, rng: _jpeg(a, q)),
}


def _blur(image: np.ndarray, sigma: float) -> np.ndarray:
    return np.asarray(Image.fromarray(image).filter(ImageFilter.GaussianBlur(sigma)))


def _noise(image: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    return np.clip(image + rng.normal(0, sigma, image.shape), 0, 255).astype(np.uint8)


def _jpeg(image: np.ndarray, quality: int) -> np.ndarray:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "JPEG", quality=quality)
    return np.asarray(Image.open(buffer).convert("RGB"))


def photograph_crops(count: int, size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``count`` random ``size`` x ``size`` RGB crops, drawn evenly from every package photograph."""
    images = []
    for name in PACKAGE_IMAGES:
        image = read_package_image(name)
        image = np.repeat(image[..., None], 3, 2) if image.ndim == 2 else image[..., :3]
        images.append(image)
    crops = []
    for i in range(count):
        image = images[i % len(images)]
        y, x = rng.integers(0, image.shape[0] - size), rng.integers(0, image.shape[1] - size)
        crops.append(np.ascontiguousarray(image[y : y + size, x : x + size]))
    return crops


def scenes(count: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``count`` embedded street scenes, 128 x 256."""
    return [street_scene(rng, 128, 256)[0] for _ in range(count)]


def _distances(reference: torch.Tensor, other: torch.Tensor) -> tuple[float, float]:
    """FD and KID (x 1000; subsets of half the set, unbiased: about 0 for sets of one distribution)."""
    size = min(len(reference), len(other)) // 2
    return frechet_distance(reference, other), 1000 * kernel_distance(reference, other, 100, size).mean


def fd_table(name: str, images: list[np.ndarray], extractor, rng: np.random.Generator) -> None:
    def features(batch: list[np.ndarray]) -> torch.Tensor:
        return torch.cat([extractor(torch.as_tensor(np.stack(batch[i : i + 64])).permute(0, 3, 1, 2).float() / 255)
                          for i in range(0, len(batch), 64)])  # fmt: skip

    half = len(images) // 2
    a, b = images[:half], images[half:]
    reference = features(a)
    floor = _distances(reference, features(b))
    print(f"\n{name}: {half} real images (A) against {len(b)} others (B); each cell FD / KID x 1000")
    print(f"| degradation of B | {' | '.join(['none (real vs real)'] + ['level'] * 4)} | grows? |")
    print(f"|---|{'---|' * 5}---|")
    for what, (levels, degrade) in LEVELS.items():
        values = [_distances(reference, features([degrade(x, level, rng) for x in b])) for level in levels]
        grows = all(v2[i] > v1[i] for i in (0, 1) for v1, v2 in zip([floor, *values], values))
        cells = " | ".join(f"{level}: {fd:.1f} / {kid:.1f}" for level, (fd, kid) in zip(levels, values))
        print(f"| {what} | {floor[0]:.1f} / {floor[1]:.1f} | {cells} | {'yes' if grows else 'NO'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200, help="images per table (half in A, half in B)")
    parser.add_argument("--features", default="efficientnet-lite0")
    args = parser.parse_args()
    start = time.perf_counter()
    import timm  # noqa: F401

    imported = time.perf_counter()
    extractor = pretrained_features(args.features)
    loaded = time.perf_counter()
    print(f"features: {extractor.name}; import timm {imported - start:.2f} s, load the network "
          f"{loaded - imported:.2f} s")  # fmt: skip
    rng = np.random.default_rng(0)
    fd_table("package photographs (128 x 128 crops)", photograph_crops(args.images, 128, rng), extractor, rng)
    fd_table("embedded street scenes (128 x 256)", scenes(args.images, rng), extractor, rng)


if __name__ == "__main__":
    main()
