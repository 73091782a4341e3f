"""Random fields and small helpers shared by the structure families and the scanner.

Gaussian random fields are drawn in the real-FFT domain with a given transfer function and scaled
to unit standard deviation; thresholds are quantiles, so a structure's porosity is the one asked.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
from scipy import fft as sfft

from ctpore.errors import InputError

__all__ = [
    "check_shape", "check_oversample", "check_porosity", "log_uniform", "unit", "random_unit",
    "quantile_value", "majority_threshold", "quad_form", "aniso_cov", "aniso_metric", "spectral_noise",
    "spectral_std", "smooth_field", "upsample_linear", "block_mean", "gaussian_noise_gain",
]


def check_shape(shape: Sequence[int], name: str = "shape") -> tuple[int, int, int]:
    try:
        out = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be three positive integers (Z, Y, X), got {shape!r}") from None
    if len(out) != 3 or min(out) < 1:
        raise InputError(f"{name} must be three positive integers (Z, Y, X), got {shape!r}")
    return out  # type: ignore[return-value]


def check_oversample(oversample: int) -> int:
    if int(oversample) != oversample or oversample < 1:
        raise InputError(f"oversample must be an integer >= 1, got {oversample!r}")
    return int(oversample)


def check_porosity(porosity: float) -> float:
    p = float(porosity)
    if not (0.0 < p < 1.0):
        raise InputError(f"porosity must be > 0 and < 1, got {porosity!r}")
    return p


def log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)


def random_unit(rng: np.random.Generator, n: Optional[int] = None) -> np.ndarray:
    v = rng.standard_normal(3 if n is None else (n, 3))
    return unit(v)


def quantile_value(field: np.ndarray, frac: float) -> float:
    """Value ``v`` such that ``(field < v).mean()`` is ``frac`` (to one voxel when no ties)."""
    flat = field.ravel()
    k = int(round(frac * flat.size))
    k = min(max(k, 1), flat.size - 1)
    part = np.partition(flat, (k - 1, k))
    return float(0.5 * (part[k - 1] + part[k]))


def majority_threshold(field: np.ndarray, porosity: float, factor: int) -> float:
    """Threshold ``t`` for ``pores = field < t`` that gives ``porosity`` on the fine grid and on its majority.

    The fine-grid quantile makes the fine porosity exact; the quantile of each block's
    ``ceil(f^3/2)``-th smallest value makes the majority-downsampled (truth) porosity exact (a block
    is pore when at least half its sub-voxels are). They differ by the bias of the majority rule on
    the interfaces (about 0.01-0.02 for 2x blocks); the mean of the two halves both errors.
    """
    t_fine = quantile_value(field, porosity)
    if factor == 1:
        return t_fine
    z, y, x = (s // factor for s in field.shape)
    blocks = field.reshape(z, factor, y, factor, x, factor).transpose(0, 2, 4, 1, 3, 5).reshape(-1, factor**3)
    k = (factor**3 + 1) // 2 - 1
    stat = np.partition(blocks, k, axis=1)[:, k]
    t_block = quantile_value(stat, porosity)
    return 0.5 * (t_fine + t_block)


def _fourier_k2_terms(shape: tuple[int, int, int]):
    """Angular frequencies of a real FFT grid, broadcastable: kz (Z,1,1), ky (1,Y,1), kx (1,1,X//2+1)."""
    kz = (2 * np.pi * sfft.fftfreq(shape[0])).astype(np.float32)[:, None, None]
    ky = (2 * np.pi * sfft.fftfreq(shape[1])).astype(np.float32)[None, :, None]
    kx = (2 * np.pi * sfft.rfftfreq(shape[2])).astype(np.float32)[None, None, :]
    return kz, ky, kx


def quad_form(shape: tuple[int, int, int], cov: np.ndarray) -> np.ndarray:
    """k^T cov k on the real-FFT grid of ``shape``: (Z, Y, X//2+1) float32."""
    kz, ky, kx = _fourier_k2_terms(shape)
    c = cov.astype(np.float32)
    q = c[0, 0] * kz**2 + c[1, 1] * ky**2 + c[2, 2] * kx**2
    if abs(c[0, 1]) + abs(c[0, 2]) + abs(c[1, 2]) > 0:
        q = q + 2 * c[0, 1] * (kz * ky) + 2 * c[0, 2] * (kz * kx) + 2 * c[1, 2] * (ky * kx)
    return q


def aniso_cov(scale: float, anisotropy: float, axis: np.ndarray) -> np.ndarray:
    """Covariance of a Gaussian kernel: length ``scale*a^(2/3)`` along ``axis``, ``scale*a^(-1/3)`` across.

    The product of the three lengths stays ``scale**3`` (feature volume kept).
    """
    uu = np.outer(axis, axis)
    return scale**2 * (anisotropy ** (-2 / 3) * (np.eye(3) - uu) + anisotropy ** (4 / 3) * uu)


def aniso_metric(anisotropy: float, axis: np.ndarray) -> np.ndarray:
    """Matrix M with |M d| = 1 an ellipsoid of semi-axes a^(2/3) along ``axis`` and a^(-1/3) across."""
    uu = np.outer(axis, axis)
    return anisotropy ** (1 / 3) * (np.eye(3) - uu) + anisotropy ** (-2 / 3) * uu


def spectral_noise(rng: np.random.Generator, shape: tuple[int, int, int]) -> np.ndarray:
    """White Gaussian noise drawn directly in the real-FFT domain: (Z, Y, X//2+1) complex64."""
    half = (shape[0], shape[1], shape[2] // 2 + 1)
    z = np.empty(half, dtype=np.complex64)
    z.real = rng.standard_normal(half, dtype=np.float32)
    z.imag = rng.standard_normal(half, dtype=np.float32)
    return z


def spectral_std(transfer: np.ndarray, shape: tuple[int, int, int]) -> float:
    """Standard deviation of ``irfftn(spectral_noise * transfer)`` (Parseval, real-FFT edge planes once)."""
    t2 = transfer.astype(np.float64) ** 2
    total = 2.0 * t2.sum() - t2[..., 0].sum()
    if shape[2] % 2 == 0 and shape[2] > 1:
        total -= t2[..., -1].sum()
    return float(math.sqrt(max(2.0 * total, 1e-30)) / np.prod(shape))


def _random_field(rng: np.random.Generator, shape: tuple[int, int, int], transfer: np.ndarray) -> np.ndarray:
    """Gaussian random field with the given real-FFT transfer function, unit std: (Z, Y, X) float32."""
    f = sfft.irfftn(spectral_noise(rng, shape) * transfer, s=shape)
    return (f / np.float32(spectral_std(transfer, shape))).astype(np.float32, copy=False)


def smooth_field(rng: np.random.Generator, shape: tuple[int, int, int], sigma: float) -> np.ndarray:
    """Isotropic Gaussian-smoothed white noise with correlation length ``sigma`` voxels, unit std."""
    q = quad_form(shape, np.eye(3) * sigma**2)
    return _random_field(rng, shape, np.exp(-0.5 * q))


def upsample_linear(vol: np.ndarray, factor: int) -> np.ndarray:
    """Linear interpolation to a grid ``factor`` times finer, voxel-area aligned: (Z*f, Y*f, X*f) float32.

    Fine voxel j along an axis has its centre at coarse coordinate (j + 0.5) / f - 0.5; values beyond
    the first and last coarse centres are held constant.
    """
    out = vol.astype(np.float32, copy=False)
    if factor == 1:
        return out.copy()
    for ax in range(3):
        n = out.shape[ax]
        c = (np.arange(n * factor) + 0.5) / factor - 0.5
        i0 = np.clip(np.floor(c).astype(np.int64), 0, n - 1)
        i1 = np.clip(i0 + 1, 0, n - 1)
        w = np.clip(c - i0, 0.0, 1.0).astype(np.float32)
        shp = [1, 1, 1]
        shp[ax] = -1
        w = w.reshape(shp)
        out = np.take(out, i0, axis=ax) * (1 - w) + np.take(out, i1, axis=ax) * w
    return out


def block_mean(fine: np.ndarray, factor: int) -> np.ndarray:
    """Mean over ``factor``^3 blocks: (Z, Y, X) float32 from (Z*f, Y*f, X*f)."""
    z, y, x = (s // factor for s in fine.shape)
    if factor == 1:
        return fine.astype(np.float32)
    v = fine.reshape(z, factor, y, factor, x, factor)
    counts = v.sum(axis=(1, 3, 5), dtype=np.int32)
    return (counts / np.float32(factor**3)).astype(np.float32)


def gaussian_noise_gain(sigmas: Sequence[float], truncate: float = 4.0) -> float:
    """Std of white unit noise after ``ndi.gaussian_filter(sigma=sigmas)`` (product of 1D kernel norms)."""
    g = 1.0
    for s in sigmas:
        if s <= 0:
            continue
        r = int(truncate * s + 0.5)
        x = np.arange(-r, r + 1, dtype=np.float64)
        k = np.exp(-0.5 * (x / s) ** 2)
        k /= k.sum()
        g *= float(np.sum(k**2))
    return math.sqrt(g)


