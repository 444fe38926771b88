"""Post-filters: blocks that keep the shape (scale 1) and clean up a decoder's or generator's output."""

from upzoo.filters.masked_blur import MaskedGaussianBlur, gaussian_taps, masked_gaussian_blur

__all__ = ["MaskedGaussianBlur", "gaussian_taps", "masked_gaussian_blur"]
