"""Photographs that ship inside installed Python packages, used as real high-resolution images
with no download: scikit-image's data images, scikit-learn's sample images and matplotlib's sample
data. They are found by name in the installed packages (nothing is imported to find them) and
read with upzoo's one image reader.

The default split, fixed so that a figure is comparable between runs and machines:

* held out (the test set, in the spirit of Set5): ``astronaut``, ``chelsea``, ``coffee``,
  ``grace_hopper``, ``rocket``;
* training: ``china``, ``flower``, ``motorcycle_left``, ``motorcycle_right``, ``hubble_deep_field``,
  ``ihc``, ``camera``, ``brick``, ``grass``, ``gravel`` (the last four grayscale, read as RGB).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from upzoo.data.io import read_image
from upzoo.errors import DataError, did_you_mean

__all__ = ["PACKAGE_IMAGES", "PACKAGE_TEST", "PACKAGE_TRAIN", "package_image_path", "read_package_image"]

#: name -> (package, folder inside the package, file, the pip package that brings it)
PACKAGE_IMAGES: dict[str, tuple[str, str, str, str]] = {
    **{
        name: ("skimage", "data", file, "scikit-image")
        for name, file in {
            "astronaut": "astronaut.png",
            "brick": "brick.png",
            "camera": "camera.png",
            "chelsea": "chelsea.png",
            "coffee": "coffee.png",
            "coins": "coins.png",
            "grass": "grass.png",
            "gravel": "gravel.png",
            "hubble_deep_field": "hubble_deep_field.jpg",
            "ihc": "ihc.png",
            "moon": "moon.png",
            "motorcycle_left": "motorcycle_left.png",
            "motorcycle_right": "motorcycle_right.png",
            "retina": "retina.jpg",
            "rocket": "rocket.jpg",
        }.items()
    },
    "china": ("sklearn", "datasets/images", "china.jpg", "scikit-learn"),
    "flower": ("sklearn", "datasets/images", "flower.jpg", "scikit-learn"),
    "grace_hopper": ("matplotlib", "mpl-data/sample_data", "grace_hopper.jpg", "matplotlib"),
}
PACKAGE_TEST = ("astronaut", "chelsea", "coffee", "grace_hopper", "rocket")
PACKAGE_TRAIN = (
    "china", "flower", "motorcycle_left", "motorcycle_right", "hubble_deep_field", "ihc", "camera", "brick",
    "grass", "gravel",
)  # fmt: skip


def package_image_path(name: str) -> Path:
    """The file of the package photograph ``name``.

    Raises:
        DataError: an unknown name (with the names there are), or a package or file not installed.
    """
    if name not in PACKAGE_IMAGES:
        known = ", ".join(sorted(PACKAGE_IMAGES))
        raise DataError(f"no package image {name!r}; there are {known}{did_you_mean(name, PACKAGE_IMAGES)}")
    package, folder, file, distribution = PACKAGE_IMAGES[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            f"package image {name!r} ships with {distribution}, which is not installed; pip install {distribution} "
            f"(or pip install 'upzoo[photos]')"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / folder / file
    if not path.is_file():
        raise DataError(
            f"package image {name!r}: {path} is missing from the installed {distribution}; reinstall it "
            f"(pip install --force-reinstall {distribution})"
        )
    return path


def read_package_image(name: str) -> np.ndarray:
    """The photograph ``name`` as ``(H, W, 3)`` uint8 RGB (grayscale ones repeated to 3 channels).

    Raises:
        DataError: as :func:`package_image_path`.
    """
    return read_image(package_image_path(name), channels=3)
