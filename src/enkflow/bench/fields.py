"""Smooth Gaussian random fields on a Cartesian grid (FFT filtering of white noise)."""

from __future__ import annotations

import numpy as np
import scipy.fft as sfft


def gaussian_random_field(rng: np.random.Generator, nx: int, ny: int, length: float) -> np.ndarray:
    """A (nx, ny) periodic field with unit variance and a Gaussian correlation
    of length scale ``length`` grid units."""
    noise = rng.standard_normal((nx, ny))
    kx = sfft.fftfreq(nx)[:, None]
    ky = sfft.rfftfreq(ny)[None, :]
    filt = np.exp(-((2 * np.pi * length) ** 2) * (kx * kx + ky * ky) / 4.0)
    f = sfft.irfft2(sfft.rfft2(noise) * filt, s=(nx, ny))
    f -= f.mean()
    f /= f.std()
    return f
