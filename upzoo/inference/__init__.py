"""Using a trained model: sliding-window inference over images and volumes larger than a window."""

from upzoo.inference.sliding_window import gaussian_importance, sliding_window_inference

__all__ = ["gaussian_importance", "sliding_window_inference"]
