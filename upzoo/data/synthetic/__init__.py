"""Deterministic, seeded synthetic data written in real on-disk layouts, so the same readers serve
the embedded defaults and real datasets: street scenes (:mod:`.streets`) and organ volumes
(:mod:`.volumes`), each generated once into a cache folder (:mod:`upzoo.data.cache`)."""

from upzoo.data.cache import default_cache_dir
from upzoo.data.synthetic.streets import OBJECT_KINDS, ensure_synthetic_cityscapes, street_scene
from upzoo.data.synthetic.volumes import ORGAN_NAMES, ensure_synthetic_volumes, organ_volume

__all__ = [
    "default_cache_dir",
    "ensure_synthetic_cityscapes",
    "ensure_synthetic_volumes",
    "street_scene",
    "organ_volume",
    "OBJECT_KINDS",
    "ORGAN_NAMES",
]
