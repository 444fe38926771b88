"""Fourier upsampling: zero-padding the spectrum (periodic sinc interpolation), the ideal low-pass
upsampler of a periodic signal. ``interpolate`` and ``interp_conv`` take it as ``mode: fourier``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["fourier_resample"]


def fourier_resample(x: torch.Tensor, scale: Sequence[int]) -> torch.Tensor:
    """``(B, C, *S) -> (B, C, *S * scale)``: each spatial axis of length ``n`` resampled to ``n * k``
    by zero-padding its real spectrum, as :func:`scipy.signal.resample` does: the spectrum of the
    longer signal holds the ``n`` frequencies of the input and zeros above them; for an even ``n``
    the Nyquist bin, which stands for both ``+n/2`` and ``-n/2``, is split between the two (half
    each), so a real input stays real and the ``n`` input samples are kept exactly. Axes one after
    the other (the transform is separable); the signal is taken as periodic, so the edges see the
    opposite edge. Float16/bfloat16 inputs are computed in float32 (PyTorch's CPU FFT has no
    half-precision kernels) and returned in their dtype. The complex spectra are handled through
    their real view, so the computation compiles, exports with dynamic sizes and converts to ONNX.

    >>> x = torch.tensor([[[0.0, 1.0, 0.0, -1.0]]])
    >>> [round(v, 4) + 0.0 for v in fourier_resample(x, (2,)).flatten().tolist()]  # a sine, sampled twice as often
    [0.0, 0.7071, 1.0, 0.7071, 0.0, -0.7071, -1.0, -0.7071]
    """
    dtype = x.dtype
    y = x.float() if dtype in (torch.float16, torch.bfloat16) else x
    for axis, factor in enumerate(scale, start=2):
        if factor == 1:
            continue
        n = y.shape[axis]
        bins = n // 2 + 1  # rfft's: the last is the Nyquist bin when n is even
        spectrum = torch.view_as_real(torch.fft.rfft(y, dim=axis))  # (..., bins, ..., 2)
        shape = [1] * spectrum.ndim
        shape[axis] = bins
        last = torch.full((1,), 0.5, dtype=y.dtype, device=y.device) + 0.5 * (n % 2)  # 1/2 for even n, else 1
        weights = torch.cat([torch.ones(bins - 1, dtype=y.dtype, device=y.device), last]).reshape(shape)
        zeros = list(spectrum.shape)
        zeros[axis] = n * factor // 2 + 1 - bins
        spectrum = torch.cat([spectrum * weights, spectrum.new_zeros(zeros)], dim=axis)
        y = torch.fft.irfft(torch.view_as_complex(spectrum.contiguous()), n=n * factor, dim=axis) * factor
    return y.to(dtype)
