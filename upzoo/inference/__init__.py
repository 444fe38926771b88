"""Using a trained model: ``load_model``, the ``Predictor`` for images and volumes (pad policy or
sliding window, TTA, multi-scale), ``predict_files`` for folders, generator samples and export;
super-resolution: ``upscale`` (whole or in tiles equal to whole), ``receptive_radius``, ``upscale_files``."""

from upzoo.inference.file_upscaling import upscale_files
from upzoo.inference.predictor import Prediction, Predictor, Preprocess
from upzoo.inference.tiled_upscaling import receptive_radius, upscale
from upzoo.runs.trained_model import LoadedModel, find_checkpoint, load_model
from upzoo.windows import gaussian_importance, sliding_window_inference

__all__ = [
    "LoadedModel",
    "load_model",
    "find_checkpoint",
    "Predictor",
    "Prediction",
    "Preprocess",
    "gaussian_importance",
    "sliding_window_inference",
    "upscale",
    "receptive_radius",
    "upscale_files",
]
