"""Using a trained model: ``load_model``, the ``Predictor`` for images and volumes (pad policy or
sliding window, TTA, multi-scale), ``predict_files`` for folders, generator samples and export."""

from upzoo.inference.predictor import Prediction, Predictor, Preprocess
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
]
