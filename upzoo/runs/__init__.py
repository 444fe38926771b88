"""Runs: the folder a training writes (one run per folder, its identity, recipe and metrics), the
checkpoint format (atomic, digest-checked, ``weights_only``), and :func:`load_model`, the one way a
trained model is rebuilt — for eval, predict, sample, export and bench alike."""

from upzoo.runs.checkpoint import load_checkpoint, load_weights, save_checkpoint
from upzoo.runs.encoder_backbone import run_encoder_backbone
from upzoo.runs.folder import RunFolder
from upzoo.runs.state import expected_recipe, run_state
from upzoo.runs.trained_model import LoadedModel, find_checkpoint, load_model

__all__ = [
    "RunFolder",
    "save_checkpoint",
    "load_checkpoint",
    "load_weights",
    "LoadedModel",
    "load_model",
    "find_checkpoint",
    "run_state",
    "expected_recipe",
    "run_encoder_backbone",
]
