"""``make_task(prepared)``: the task a prepared recipe trains."""

from __future__ import annotations

from typing import TYPE_CHECKING

from upzoo.train.feature_upsampling import FeatureUpsamplingTask
from upzoo.train.generator_testbed import GeneratorTestbedTask
from upzoo.train.super_resolution import SuperResolutionTask
from upzoo.train.tasks import GanTask, SegmentationTask, Task
from upzoo.train.through_plane import ThroughPlaneTask
from upzoo.train.through_plane_segmentation import ThroughPlaneSegmentationTask

if TYPE_CHECKING:
    from upzoo.prepare import Prepared

__all__ = ["make_task"]


def make_task(prepared: Prepared) -> Task:
    """GAN for ``dcgan`` models, super-resolution for ``espcn``/``edsr``/``rrdbnet``, the JAFAR
    objective for ``feature_upsampler``, the generator testbed for ``pggan``, through-plane
    super-resolution for ``through_plane_sr``, tissue segmentation from thick slices for
    ``through_plane_unet``, segmentation otherwise (``linear_probe`` included).
    The initial weights follow ``train.seed``."""
    from upzoo.runtime import seed_everything

    seed_everything(prepared.recipe.train.seed)
    tasks = {
        "gan": GanTask, "super_resolution": SuperResolutionTask, "feature_upsampling": FeatureUpsamplingTask,
        "generator_testbed": GeneratorTestbedTask, "through_plane_sr": ThroughPlaneTask,
        "through_plane_segmentation": ThroughPlaneSegmentationTask,
    }  # fmt: skip
    return tasks.get(prepared.task, SegmentationTask)(prepared)
