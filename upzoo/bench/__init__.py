"""Measurement: speed (FPS, timings), memory (peak), artifacts (checkerboard score)."""
