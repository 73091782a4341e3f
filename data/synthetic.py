"""Synthetic pore structures and a micro-CT scanner model, with known truth.

Two halves:

* **Structures** (:func:`make_structure`): boolean pore volumes (1 = pore) on a grid ``oversample``
  times finer than the scan, in four families (:data:`FAMILIES`): polydisperse grain packings,
  bicontinuous smoothed random fields, tubular macropores (roots, burrows) and vesicular blobs,
  isotropic or elongated along an axis. Every family is built as a continuous field thresholded at
  a quantile, so the porosity is the one asked for (to a voxel count on the fine grid).
* **Scanner** (:func:`scan_structure`, :class:`ScannerParams`): partial volume (the fine grid is
  averaged down; the truth is the fine grid's majority), solid texture, point-spread blur, beam
  hardening cupping and ring artefacts around the rotation axis (Z), slice-to-slice drift with
  steps, Gaussian and Poisson noise with in-slice correlation, and an integer output range with
  offset, gain and clipping. Pores are dark, solid bright.

The random ranges of :meth:`ScannerParams.random` are calibrated on the real synchrotron scan of a
carbonate in ``shared/data/quantimpy_rock`` (contrast-to-noise ratio about 3.5 to 4.5, noise
correlated over about 0.75 voxel in-slice and 0.6 across slices, slice-mean drift with steps of up
to about 9 % of the pore/solid contrast) and span from that hard case to easy, clean scans.

All randomness comes from one ``numpy.random.Generator``; :func:`make_pair` builds it from a seed,
so a pair is a pure function of its seed (and of its feature zoom, :func:`draw_zoom`).

Examples
--------
>>> scan, truth, info = make_pair(7, shape=(32, 32, 32), family="tubes", porosity=0.2)
>>> scan.dtype.kind, truth.dtype, scan.shape
('u', dtype('uint8'), (32, 32, 32))
>>> abs(info["porosity_truth"] - 0.2) < 0.03
True
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
from scipy import fft as sfft
from scipy import ndimage as ndi

from ctpore.data.errors import InputError, NonFiniteError

__all__ = [
    "FAMILIES",
    "ScannerParams",
    "make_structure",
    "scan_structure",
    "scan_label",
    "make_pair",
    "draw_zoom",
    "check_zoom",
    "write_pairs",
    "VOXEL_SIZE_MM",
]

FAMILIES = ("grains", "bicontinuous", "tubes", "vesicles")

#: Voxel size written into the NIfTI files of :func:`write_pairs` (mm, isotropic).
VOXEL_SIZE_MM = 0.01

_DTYPES = {"uint8": np.uint8, "uint16": np.uint16}


# ----------------------------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------------------------


def _check_shape(shape: Sequence[int], name: str = "shape") -> tuple[int, int, int]:
    try:
        out = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be three positive integers (Z, Y, X), got {shape!r}") from None
    if len(out) != 3 or min(out) < 1:
        raise InputError(f"{name} must be three positive integers (Z, Y, X), got {shape!r}")
    return out  # type: ignore[return-value]


def _check_oversample(oversample: int) -> int:
    if int(oversample) != oversample or oversample < 1:
        raise InputError(f"oversample must be an integer >= 1, got {oversample!r}")
    return int(oversample)


def _check_porosity(porosity: float) -> float:
    p = float(porosity)
    if not (0.0 < p < 1.0):
        raise InputError(f"porosity must be > 0 and < 1, got {porosity!r}")
    return p


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)


def _random_unit(rng: np.random.Generator, n: Optional[int] = None) -> np.ndarray:
    v = rng.standard_normal(3 if n is None else (n, 3))
    return _unit(v)


def _quantile_value(field: np.ndarray, frac: float) -> float:
    """Value ``v`` such that ``(field < v).mean()`` is ``frac`` (to one voxel when no ties)."""
    flat = field.ravel()
    k = int(round(frac * flat.size))
    k = min(max(k, 1), flat.size - 1)
    part = np.partition(flat, (k - 1, k))
    return float(0.5 * (part[k - 1] + part[k]))


def _majority_threshold(field: np.ndarray, porosity: float, factor: int) -> float:
    """Threshold ``t`` for ``pores = field < t`` that gives ``porosity`` on the fine grid and on its majority.

    The fine-grid quantile makes the fine porosity exact; the quantile of each block's
    ``ceil(f^3/2)``-th smallest value makes the majority-downsampled (truth) porosity exact (a block
    is pore when at least half its sub-voxels are). They differ by the bias of the majority rule on
    the interfaces (about 0.01-0.02 for 2x blocks); the mean of the two halves both errors.
    """
    t_fine = _quantile_value(field, porosity)
    if factor == 1:
        return t_fine
    z, y, x = (s // factor for s in field.shape)
    blocks = field.reshape(z, factor, y, factor, x, factor).transpose(0, 2, 4, 1, 3, 5).reshape(-1, factor**3)
    k = (factor**3 + 1) // 2 - 1
    stat = np.partition(blocks, k, axis=1)[:, k]
    t_block = _quantile_value(stat, porosity)
    return 0.5 * (t_fine + t_block)


def _fourier_k2_terms(shape: tuple[int, int, int]):
    """Angular frequencies of a real FFT grid, broadcastable: kz (Z,1,1), ky (1,Y,1), kx (1,1,X//2+1)."""
    kz = (2 * np.pi * sfft.fftfreq(shape[0])).astype(np.float32)[:, None, None]
    ky = (2 * np.pi * sfft.fftfreq(shape[1])).astype(np.float32)[None, :, None]
    kx = (2 * np.pi * sfft.rfftfreq(shape[2])).astype(np.float32)[None, None, :]
    return kz, ky, kx


def _quad_form(shape: tuple[int, int, int], cov: np.ndarray) -> np.ndarray:
    """k^T cov k on the real-FFT grid of ``shape``: (Z, Y, X//2+1) float32."""
    kz, ky, kx = _fourier_k2_terms(shape)
    c = cov.astype(np.float32)
    q = c[0, 0] * kz**2 + c[1, 1] * ky**2 + c[2, 2] * kx**2
    if abs(c[0, 1]) + abs(c[0, 2]) + abs(c[1, 2]) > 0:
        q = q + 2 * c[0, 1] * (kz * ky) + 2 * c[0, 2] * (kz * kx) + 2 * c[1, 2] * (ky * kx)
    return q


def _aniso_cov(scale: float, anisotropy: float, axis: np.ndarray) -> np.ndarray:
    """Covariance of a Gaussian kernel: length ``scale*a^(2/3)`` along ``axis``, ``scale*a^(-1/3)`` across.

    The product of the three lengths stays ``scale**3`` (feature volume kept).
    """
    uu = np.outer(axis, axis)
    return scale**2 * (anisotropy ** (-2 / 3) * (np.eye(3) - uu) + anisotropy ** (4 / 3) * uu)


def _aniso_metric(anisotropy: float, axis: np.ndarray) -> np.ndarray:
    """Matrix M with |M d| = 1 an ellipsoid of semi-axes a^(2/3) along ``axis`` and a^(-1/3) across."""
    uu = np.outer(axis, axis)
    return anisotropy ** (1 / 3) * (np.eye(3) - uu) + anisotropy ** (-2 / 3) * uu


def _spectral_noise(rng: np.random.Generator, shape: tuple[int, int, int]) -> np.ndarray:
    """White Gaussian noise drawn directly in the real-FFT domain: (Z, Y, X//2+1) complex64."""
    half = (shape[0], shape[1], shape[2] // 2 + 1)
    z = np.empty(half, dtype=np.complex64)
    z.real = rng.standard_normal(half, dtype=np.float32)
    z.imag = rng.standard_normal(half, dtype=np.float32)
    return z


def _spectral_std(transfer: np.ndarray, shape: tuple[int, int, int]) -> float:
    """Standard deviation of ``irfftn(_spectral_noise * transfer)`` (Parseval, real-FFT edge planes once)."""
    t2 = transfer.astype(np.float64) ** 2
    total = 2.0 * t2.sum() - t2[..., 0].sum()
    if shape[2] % 2 == 0 and shape[2] > 1:
        total -= t2[..., -1].sum()
    return float(math.sqrt(max(2.0 * total, 1e-30)) / np.prod(shape))


def _random_field(rng: np.random.Generator, shape: tuple[int, int, int], transfer: np.ndarray) -> np.ndarray:
    """Gaussian random field with the given real-FFT transfer function, unit std: (Z, Y, X) float32."""
    f = sfft.irfftn(_spectral_noise(rng, shape) * transfer, s=shape)
    return (f / np.float32(_spectral_std(transfer, shape))).astype(np.float32, copy=False)


def _smooth_field(rng: np.random.Generator, shape: tuple[int, int, int], sigma: float) -> np.ndarray:
    """Isotropic Gaussian-smoothed white noise with correlation length ``sigma`` voxels, unit std."""
    q = _quad_form(shape, np.eye(3) * sigma**2)
    return _random_field(rng, shape, np.exp(-0.5 * q))


def _upsample_linear(vol: np.ndarray, factor: int) -> np.ndarray:
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


def _block_mean(fine: np.ndarray, factor: int) -> np.ndarray:
    """Mean over ``factor``^3 blocks: (Z, Y, X) float32 from (Z*f, Y*f, X*f)."""
    z, y, x = (s // factor for s in fine.shape)
    if factor == 1:
        return fine.astype(np.float32)
    v = fine.reshape(z, factor, y, factor, x, factor)
    counts = v.sum(axis=(1, 3, 5), dtype=np.int32)
    return (counts / np.float32(factor**3)).astype(np.float32)


def _gaussian_noise_gain(sigmas: Sequence[float], truncate: float = 4.0) -> float:
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


# ----------------------------------------------------------------------------------------------
# structures
# ----------------------------------------------------------------------------------------------


def _ellipsoid_field(
    shape: tuple[int, int, int],
    centres: np.ndarray,
    radii: np.ndarray,
    metric: Optional[np.ndarray],
    margin: float,
) -> np.ndarray:
    """max_i (r_i - |M (x - c_i)|), limited below by ``-margin``: (Z, Y, X) float32.

    ``centres`` (N, 3) and ``radii`` (N,) in fine voxels (centres rounded to whole voxels), ``metric``
    (3, 3) shared by every body, or None (spheres). One distance template of the largest body is
    computed once; each body takes a crop of it inside its own bounding box.
    """
    field = np.full(shape, -margin, dtype=np.float32)
    if len(radii) == 0:
        return field
    shp = np.array(shape)
    q = np.eye(3) if metric is None else metric.T @ metric
    axis_reach = np.sqrt(np.diag(np.linalg.inv(q)))  # extent of the unit ellipsoid along z, y, x
    big = np.ceil((float(np.max(radii)) + margin) * axis_reach).astype(int)
    g = [np.arange(-h, h + 1, dtype=np.float32) for h in big]
    dz, dy, dx = g[0][:, None, None], g[1][None, :, None], g[2][None, None, :]
    qf = q.astype(np.float32)
    d2 = qf[0, 0] * dz * dz + qf[1, 1] * dy * dy + qf[2, 2] * dx * dx
    if metric is not None:
        d2 = d2 + 2 * qf[0, 1] * dz * dy + 2 * qf[0, 2] * dz * dx + 2 * qf[1, 2] * dy * dx
    dist = np.sqrt(d2)  # template, centred at index `big`
    cen = np.rint(centres).astype(int)
    halves = np.ceil((radii[:, None] + margin) * axis_reach[None, :]).astype(int)  # (N, 3)
    lo = np.maximum(cen - halves, 0)
    hi = np.minimum(cen + halves + 1, shp)
    for i in np.flatnonzero(np.all(hi > lo, axis=1)):
        a = lo[i] - cen[i] + big
        b = hi[i] - cen[i] + big
        sub = field[lo[i, 0]:hi[i, 0], lo[i, 1]:hi[i, 1], lo[i, 2]:hi[i, 2]]
        np.maximum(sub, np.float32(radii[i]) - dist[a[0]:b[0], a[1]:b[1], a[2]:b[2]], out=sub)
    return field


def _relaxed_packing(rng, span_lo, span, radii, metric, overlap, iters=15):
    """Grain centres by force-biased relaxation: random centres pushed apart until pairs overlap by
    at most ``overlap`` * (r_i + r_j) (measured as |M (c_i - c_j)|), or ``iters`` sweeps: (N, 3).

    A cheap stand-in for a settled packing: grains touch and interpenetrate a little, as in a
    compacted, cemented sand; residual overlaps of a dense draw are kept (grains fuse).
    """
    from scipy.spatial import cKDTree

    n = radii.size
    minv = np.linalg.inv(metric)
    x = span_lo + rng.random((n, 3)) * span
    core = (1.0 - overlap) * radii
    reach = 2.0 * float(core.max())
    for _ in range(iters):
        y = x @ metric.T  # metric space: distances are Euclidean there
        pairs = cKDTree(y).query_pairs(reach, output_type="ndarray")
        if len(pairs) == 0:
            break
        i, j = pairs[:, 0], pairs[:, 1]
        d = y[j] - y[i]
        dist = np.maximum(np.linalg.norm(d, axis=1), 1e-6)
        gap = core[i] + core[j] - dist
        bad = gap > 0.02 * (core[i] + core[j])
        if not np.any(bad):
            break
        i, j = i[bad], j[bad]
        push = (0.5 * gap[bad] / dist[bad])[:, None] * d[bad]  # move both apart by half the overlap
        disp = np.zeros((n, 3))
        for c in range(3):
            disp[:, c] = np.bincount(j, push[:, c], minlength=n) - np.bincount(i, push[:, c], minlength=n)
        x = np.clip(x + disp @ minv.T, span_lo, span_lo + span)
    return x


def _grains(rng, fine, porosity, os_, aniso, axis, meta):
    """Polydisperse grain packing (relaxed random packing with partial overlap), pores between.

    Grains are then grown or shrunk together (cementation) until the porosity is the one asked.
    """
    r_mean = _log_uniform(rng, 3.5, 9.0) * os_
    cv = rng.uniform(0.1, 0.45)
    s_ln = math.sqrt(math.log1p(cv * cv))
    packing = rng.uniform(0.6, 0.8)  # sum of grain volumes / box volume, before relaxation
    # keep the hard cores (radius (1 - overlap) r) below about 52 % of the volume, so that they relax
    overlap = max(rng.uniform(0.03, 0.2), 1.0 - (0.52 / packing) ** (1 / 3))
    metric = _aniso_metric(aniso, axis)
    elong = max(aniso ** (2 / 3), aniso ** (-1 / 3))
    r_cap = math.exp(2.3 * s_ln)  # largest radius, relative to the mean (about the 99th percentile)
    max_bodies = 1500
    for _ in range(8):  # grains are placed in the box grown by a typical large grain's reach
        reach = r_mean * (1.0 + 2.0 * s_ln) * elong
        vol = float(np.prod(np.array(fine) + 2 * reach))
        e_r3 = r_mean**3 * math.exp(3 * s_ln**2)  # E[r^3] of the lognormal radius
        n = int(packing * vol / (4 / 3 * math.pi * e_r3))
        if n <= max_bodies:
            break
        r_mean *= (n / max_bodies) ** (1 / 3)
    n = max(min(n, max_bodies), 4)
    radii = np.minimum(r_mean * np.exp(s_ln * rng.standard_normal(n) - 0.5 * s_ln**2), r_mean * r_cap)
    centres = _relaxed_packing(rng, -reach, np.array(fine, dtype=np.float64) + 2 * reach, radii, metric, overlap)
    rough = rng.uniform(0.0, 0.25) if rng.random() < 0.5 else 0.0
    noise = None
    if rough > 0:
        noise = np.float32(rough * r_mean) * _smooth_field(rng, fine, rng.uniform(0.3, 0.7) * r_mean)
    margin = 0.4 * r_mean + 2.0
    for _ in range(4):
        field = _ellipsoid_field(fine, centres, radii, None if aniso == 1.0 else metric, margin)  # > 0 in grains
        if noise is not None:
            field += noise
        t = _majority_threshold(field, porosity, os_)
        if t > -margin + 0.5 + (0.0 if noise is None else 3 * rough * r_mean):
            break
        margin *= 2.0  # the growth needed reached the rendered margin: render further out
    meta.update(grain_radius=r_mean / os_, grain_cv=cv, n_grains=int(radii.size), overlap=overlap, packing=packing,
                roughness=rough, growth=-t / os_)
    return field < t


def _vesicles(rng, fine, porosity, os_, aniso, axis, meta):
    """Ellipsoidal blobs (vesicles, vughs) at random places, free to coalesce, optionally rough."""
    r_mean = _log_uniform(rng, 2.0, 8.0) * os_
    cv = rng.uniform(0.2, 0.8)
    s_ln = math.sqrt(math.log1p(cv * cv))
    elong = max(aniso ** (2 / 3), aniso ** (-1 / 3))
    r_cap = math.exp(2.3 * s_ln)
    max_bodies = 800
    for _ in range(8):  # blobs are placed in the box grown by the largest blob's reach
        reach = r_mean * r_cap * elong
        vol = float(np.prod(np.array(fine) + 2 * reach))
        e_r3 = r_mean**3 * math.exp(3 * s_ln**2)
        # Boolean model: porosity = 1 - exp(-n v / V)
        n = int(round(-math.log1p(-porosity) * vol / (4 / 3 * math.pi * e_r3)))
        if n <= max_bodies:
            break
        r_mean *= (n / max_bodies) ** (1 / 3)
    n = max(min(n, max_bodies), 1)
    radii = np.minimum(r_mean * np.exp(s_ln * rng.standard_normal(n) - 0.5 * s_ln**2), r_mean * r_cap)
    centres = -reach + rng.random((n, 3)) * (np.array(fine) + 2 * reach)
    rough = rng.uniform(0.0, 0.3) if rng.random() < 0.7 else 0.0
    noise = None
    if rough > 0:
        noise = np.float32(rough * r_mean) * _smooth_field(rng, fine, rng.uniform(0.3, 0.8) * r_mean)
    margin = 0.4 * r_mean + 2.0
    for _ in range(4):
        field = _ellipsoid_field(fine, centres, radii, None if aniso == 1.0 else _aniso_metric(aniso, axis),
                                 margin)  # > 0 inside blobs
        if noise is not None:
            field += noise
        np.negative(field, out=field)
        t = _majority_threshold(field, porosity, os_)
        if t < margin - 0.5 - (0.0 if noise is None else 3 * rough * r_mean):
            break
        margin *= 2.0  # blobs must grow further than rendered
    meta.update(blob_radius=r_mean / os_, blob_cv=cv, n_blobs=n, roughness=rough)
    return field < t


def _bicontinuous(rng, fine, porosity, os_, aniso, axis, meta):
    """Thresholded smoothed Gaussian random field: Gaussian, spinodal (band-pass) or two-scale."""
    scale = _log_uniform(rng, 1.2, 4.5) * os_
    kind = str(rng.choice(["gaussian", "spinodal", "twoscale"]))
    q = _quad_form(fine, _aniso_cov(scale, aniso, axis))  # (k s)^2
    if kind == "gaussian":
        transfer = np.exp(-0.5 * q)
    elif kind == "spinodal":
        k0 = rng.uniform(0.8, 1.6)
        width = rng.uniform(0.25, 0.5) * k0
        transfer = np.exp(-0.5 * (np.sqrt(q) - k0) ** 2 / width**2)
        transfer[0, 0, 0] = 0.0
    else:
        f = rng.uniform(2.0, 4.0)
        w = rng.uniform(0.4, 1.2) * f**1.5  # balances the variance of the two scales
        transfer = np.exp(-0.5 * q) + w * np.exp(-0.5 * q * f * f)
    field = sfft.irfftn(_spectral_noise(rng, fine) * transfer.astype(np.float32), s=fine)
    t = _majority_threshold(field, porosity, os_)
    meta.update(kind=kind, length=scale / os_)
    return field < t


def _walks(rng, lengths, starts, d0, bias, persistence, ds):
    """Smooth random walks, one per tube: points (P, 3) and the tube index of each point (P,).

    The direction at each step interpolates random control directions ``bias*d0 + N(0, I)`` spaced
    ``persistence`` apart, so curvature is set by ``persistence`` and straightness by ``bias``.
    """
    steps = np.maximum(np.ceil(lengths / ds).astype(int), 2)
    n_ctrl = np.ceil(steps * ds / persistence).astype(int) + 2
    ctrl_off = np.concatenate([[0], np.cumsum(n_ctrl)[:-1]])
    tube_of_ctrl = np.repeat(np.arange(len(lengths)), n_ctrl)
    ctrl = _unit(bias[tube_of_ctrl, None] * d0[tube_of_ctrl] + rng.standard_normal((n_ctrl.sum(), 3)))
    tube = np.repeat(np.arange(len(lengths)), steps)
    first = np.concatenate([[0], np.cumsum(steps)[:-1]])
    t = np.arange(steps.sum()) - first[tube]
    c = t * ds / persistence
    c0 = np.floor(c).astype(int)
    w = (c - c0)[:, None]
    i0 = ctrl_off[tube] + c0
    d = _unit((1 - w) * ctrl[i0] + w * ctrl[i0 + 1]) * ds
    pos = np.cumsum(d, axis=0)
    pos -= (pos[first] - d[first])[tube]  # restart the sum at each tube
    pos += starts[tube]
    return pos, tube


def _splat(shape, pts, weights):
    """Trilinear splat of weighted points into a periodic grid: (Z, Y, X) float32."""
    shp = np.array(shape)
    base = np.floor(pts).astype(np.int64)
    frac = (pts - base).astype(np.float32)
    idx, wts = [], []
    for corner in range(8):
        o = np.array([(corner >> 2) & 1, (corner >> 1) & 1, corner & 1])
        ijk = np.mod(base + o, shp)
        w = weights * np.prod(np.where(o == 1, frac, 1 - frac), axis=1)
        idx.append((ijk[:, 0] * shp[1] + ijk[:, 1]) * shp[2] + ijk[:, 2])
        wts.append(w)
    flat = np.bincount(np.concatenate(idx), np.concatenate(wts), minlength=int(np.prod(shp)))
    return flat.astype(np.float32).reshape(shape)


def _tubes(rng, fine, porosity, os_, aniso, axis, meta):
    """Tubular macropores: branching roots or winding burrows (smooth random walks, periodic)."""
    vol = float(np.prod(fine))
    fmax = float(max(fine))
    style = str(rng.choice(["roots", "burrows"]))
    aligned = aniso != 1.0
    if style == "roots":
        r_main = max(1.0, _log_uniform(rng, 1.0, 3.5) * (0.7 + 1.5 * porosity)) * os_
        persistence = rng.uniform(0.4, 1.2) * fmax
        fine_share = rng.uniform(0.15, 0.45)
        r_fine = max(0.8 * os_, r_main * rng.uniform(0.35, 0.6))
    else:
        r_main = max(1.2, _log_uniform(rng, 1.8, 5.0) * (0.7 + 1.0 * porosity)) * os_
        persistence = rng.uniform(0.15, 0.5) * fmax
        fine_share = 0.0
        r_fine = r_main
    target = -math.log1p(-porosity) * vol  # Boolean-model volume so that the union is near porosity
    spectrum = np.zeros((fine[0], fine[1], fine[2] // 2 + 1), dtype=np.complex64)
    k2 = _quad_form(fine, np.eye(3))
    classes = [(r_main, 1.0 - fine_share, "main")]
    if fine_share > 0:
        classes.append((r_fine, fine_share, "fine"))
    main_pts = None
    n_tubes = 0
    for radius, share, name in classes:
        length = share * target / (math.pi * radius**2)
        if name == "fine":
            m = int(min(2000, max(1, math.ceil(length / (0.4 * fmax)))))
            lengths = rng.uniform(0.2, 0.6, m) * fmax
            lengths *= length / lengths.sum()
            starts = main_pts[rng.integers(0, len(main_pts), m)]
            d0 = _random_unit(rng, m)
            bias = np.full(m, rng.uniform(0.3, 1.0))
            pers = persistence * 0.5
        else:
            m = int(min(2000, max(1, math.ceil(length / (0.8 * fmax)))))
            lengths = rng.uniform(0.5, 1.5, m)
            lengths *= length / lengths.sum()
            starts = rng.random((m, 3)) * np.array(fine)
            if aligned and aniso < 1.0:  # flattened: tubes run in the plane across the axis
                v = rng.standard_normal((m, 3))
                d0 = _unit(v - (v @ axis)[:, None] * axis[None, :])
                bias = np.full(m, 1.0 + 4.0 * abs(math.log(aniso)))
            elif aligned:
                sign = np.where(rng.random(m) < 0.5, -1.0, 1.0)[:, None]
                d0 = _unit(sign * axis + 0.15 * rng.standard_normal((m, 3)))
                bias = np.full(m, 1.0 + 4.0 * abs(math.log(aniso)))
            else:
                d0 = _random_unit(rng, m)
                bias = np.full(m, rng.uniform(0.5, 2.0) if style == "roots" else rng.uniform(0.0, 1.0))
            pers = persistence
        n_tubes += m
        s = max(0.6, radius / 1.5)  # blur of the centre line; the threshold then sits at radius
        ds = float(min(0.5 * s, 1.0))
        pts, tube = _walks(rng, lengths, starts, d0, bias, pers, ds)
        if name == "main":
            main_pts = pts
        # per-tube thickness, as weights
        wob = np.exp(0.25 * rng.standard_normal(m))[tube]
        amp = 2 * math.pi * s * s * math.exp(radius**2 / (2 * s * s))  # unit level at distance `radius`
        grid = _splat(fine, pts, (wob * amp * ds).astype(np.float32))
        spectrum += sfft.rfftn(grid) * np.exp(-0.5 * s * s * k2)
    rough = rng.uniform(0.0, 0.25) if rng.random() < 0.6 else 0.0
    if rough > 0:
        tr = np.exp(-0.5 * (rng.uniform(0.4, 0.9) * r_main) ** 2 * k2)
        spectrum += _spectral_noise(rng, fine) * (tr * np.float32(rough / _spectral_std(tr, fine)))
    field = sfft.irfftn(-spectrum, s=fine)  # negated: pores below the threshold
    t = _majority_threshold(field, porosity, os_)
    meta.update(style=style, radius=r_main / os_, fine_radius=r_fine / os_, n_tubes=n_tubes,
                persistence=persistence / os_, roughness=rough)
    return field < t


_BUILDERS = {"grains": _grains, "bicontinuous": _bicontinuous, "tubes": _tubes, "vesicles": _vesicles}


def _structure(family, shape, porosity, rng, oversample, anisotropy, axis):
    if family not in FAMILIES:
        raise InputError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    shape = _check_shape(shape)
    os_ = _check_oversample(oversample)
    p = _check_porosity(porosity)
    if anisotropy is None:  # half isotropic, else elongated (35 %) or flattened, as by bedding (15 %)
        draw = rng.random()
        aniso = 1.0 if draw < 0.5 else _log_uniform(rng, 1.3, 3.0) if draw < 0.85 else _log_uniform(rng, 0.4, 0.77)
    else:
        aniso = float(anisotropy)
        if not (aniso > 0 and math.isfinite(aniso)):
            raise InputError(f"anisotropy must be a positive number (1 = isotropic), got {anisotropy!r}")
    if axis is None:
        if family == "tubes" and rng.random() < 0.5:  # soil cores stand upright: roots run along Z
            ax = _unit(np.array([1.0, 0.0, 0.0]) + 0.2 * rng.standard_normal(3))
        else:
            ax = _random_unit(rng)
    else:
        ax = np.asarray(axis, dtype=np.float64).reshape(-1)
        if ax.size != 3 or not np.all(np.isfinite(ax)) or np.linalg.norm(ax) == 0:
            raise InputError(f"axis must be a non-zero (z, y, x) vector, got {axis!r}")
        ax = _unit(ax)
    fine = tuple(s * os_ for s in shape)
    meta: dict[str, Any] = {"family": family, "anisotropy": aniso, "axis": [float(v) for v in ax]}
    pores = _BUILDERS[family](rng, fine, p, os_, aniso, ax, meta)
    meta = {k: (float(v) if isinstance(v, (float, np.floating)) else v) for k, v in meta.items()}
    return np.ascontiguousarray(pores, dtype=bool), meta


def make_structure(
    family: str,
    shape: tuple[int, int, int],
    porosity: float,
    rng: np.random.Generator,
    oversample: int = 2,
    anisotropy: Optional[float] = None,
    axis: Optional[Sequence[float]] = None,
) -> np.ndarray:
    """A random pore structure of one family on the fine grid.

    Parameters
    ----------
    family : str
        One of :data:`FAMILIES`: ``"grains"`` (pores between polydisperse, partly interpenetrating,
        optionally rough grains), ``"bicontinuous"`` (thresholded smoothed random field: Gaussian,
        spinodal or two-scale), ``"tubes"`` (branching roots or winding burrows), ``"vesicles"``
        (coalescing ellipsoidal blobs).
    shape : tuple of int
        Output (scan) grid (Z, Y, X); the structure is ``oversample`` times finer.
    porosity : float
        Pore fraction in (0, 1). Every family thresholds a continuous field at its quantile, so the
        fine-grid porosity matches to about one voxel in ``prod(shape) * oversample**3``.
    rng : numpy.random.Generator
        Source of all randomness.
    oversample : int
        Fine-grid factor (2 by default).
    anisotropy : float, optional
        Elongation of the features along ``axis`` relative to across (1 = isotropic, > 1 prolate,
        < 1 flattened). None: isotropic half of the time, else log-uniform in [1.3, 3] (35 %) or in
        [0.4, 0.77] (15 %).
    axis : sequence of 3 floats, optional
        (z, y, x) direction of the elongation (and of the tubes' preferred run). None: random
        (for tubes, half of the time near Z).

    Returns
    -------
    numpy.ndarray
        bool (Z*oversample, Y*oversample, X*oversample), True = pore.
    """
    return _structure(family, shape, porosity, rng, oversample, anisotropy, axis)[0]


# ----------------------------------------------------------------------------------------------
# scanner
# ----------------------------------------------------------------------------------------------


@dataclass
class ScannerParams:
    """Every knob of the CT scanner model. Intensities in "contrast units" unless said otherwise:
    pure pore is 0, plain solid is 1 before the output mapping.

    :meth:`random` draws a varied set (from about the real carbonate scan's quality to clean scans);
    :meth:`easy` is a clean high-contrast scan; :meth:`realistic` mimics the real scan.
    """

    dtype: str = "uint16"  # output integer type: "uint8" or "uint16"
    pore_level: float = 0.29  # pure-pore grey value, as a fraction of the dtype's maximum
    contrast: float = 0.063  # solid minus pore grey value, as a fraction of the dtype's maximum
    cnr: float = 4.0  # contrast-to-noise ratio: contrast / std of the noise at solid level
    poisson_fraction: float = 0.3  # share of the noise variance (at solid level) that is Poisson
    noise_corr_xy: float = 0.8  # in-slice correlation of the noise, Gaussian sigma (voxels; 0 white)
    noise_corr_z: float = 0.6  # across-slice correlation of the noise, Gaussian sigma (voxels)
    psf_xy: float = 0.8  # point-spread function, in-slice Gaussian sigma (voxels)
    psf_z: float = 0.7  # point-spread function along Z, Gaussian sigma (voxels)
    axis_y: float = 0.0  # rotation axis (parallel to Z) offset from the slice centre, in slice heights
    axis_x: float = 0.0  # rotation axis offset from the slice centre, in slice widths
    fov_radius: float = 1.5  # radius of the reconstructed field of view, in slice sizes (>= corner distance)
    cupping: float = 0.0  # beam-hardening cupping: relative loss of solid attenuation on the axis
    ring_count: int = 0  # number of ring artefacts (concentric around the rotation axis, every slice)
    ring_amplitude: float = 0.0  # largest ring amplitude (each ring uniform in [-a, a])
    ring_width: float = 0.7  # radial Gaussian sigma of a ring (voxels)
    drift_amplitude: float = 0.0  # std of the smooth slice-to-slice brightness drift
    drift_length: float = 30.0  # correlation length of that drift (slices)
    slice_jitter: float = 0.0  # std of an independent brightness offset per slice
    step_rate: float = 0.0  # expected number of brightness steps per 100 slices
    step_amplitude: float = 0.0  # largest step (each uniform in [a/3, a], random sign)
    pore_texture: float = 0.0  # std of a smooth variation of the pores' grey value (fluids, fines)
    solid_texture: float = 0.0  # std of a smooth variation of the solid's attenuation (mineralogy)
    texture_length: float = 4.0  # correlation length of the solid and pore textures (voxels)
    microporosity: float = 0.0  # fraction of the solid in darker sub-resolution-porous patches
    micro_darkening: float = 0.25  # how much darker those patches are (< 0.5: they stay solid)
    inclusions: float = 0.0  # fraction of the solid in bright dense-mineral inclusions
    inclusion_contrast: float = 0.6  # how much brighter inclusions are than plain solid

    @classmethod
    def random(cls, rng: np.random.Generator) -> "ScannerParams":
        """A varied random set: CNR log-uniform in [3, 25] (the real carbonate scan is about 4),
        each artefact present with some probability and a calibrated size."""
        u = rng.uniform
        dtype = "uint16" if rng.random() < 0.6 else "uint8"
        contrast = _log_uniform(rng, 0.03, 0.45) if dtype == "uint16" else _log_uniform(rng, 0.1, 0.6)
        cnr = _log_uniform(rng, 3.0, 25.0)
        incl = u(0.002, 0.02) if rng.random() < 0.3 else 0.0
        incl_c = u(0.2, 1.0)
        top = 0.97 - contrast * (1.0 + (incl_c if incl > 0 else 0.0))
        pore_level = u(0.0, max(top, 0.0)) if rng.random() < 0.5 else u(0.0, max(min(top, 0.1), 0.0))
        noise_xy = u(0.0, 1.1)
        psf_xy = u(0.4, 1.3)
        rings = rng.random() < 0.5
        micro = rng.random() < 0.3
        return cls(
            dtype=dtype,
            pore_level=float(pore_level),
            contrast=float(contrast),
            cnr=float(cnr),
            poisson_fraction=float(u(0.0, 0.8)),
            noise_corr_xy=float(noise_xy),
            noise_corr_z=float(noise_xy * u(0.5, 1.0)),
            psf_xy=float(psf_xy),
            psf_z=float(psf_xy * u(0.7, 1.2)),
            axis_y=float(u(-0.5, 0.5)),
            axis_x=float(u(-0.5, 0.5)),
            fov_radius=float(u(0.8, 3.0)),
            cupping=float(u(0.0, 0.25)) if rng.random() < 0.6 else 0.0,
            ring_count=int(rng.integers(1, 9)) if rings else 0,
            ring_amplitude=float(u(0.02, 0.15)) if rings else 0.0,
            ring_width=float(u(0.4, 1.2)),
            drift_amplitude=float(u(0.0, 0.06)),
            drift_length=float(u(10.0, 60.0)),
            slice_jitter=float(u(0.0, 0.015)),
            step_rate=float(u(0.0, 3.0)) if rng.random() < 0.5 else 0.0,
            step_amplitude=float(u(0.02, 0.1)),
            pore_texture=float(u(0.0, 0.12)),
            solid_texture=float(u(0.0, 0.08)),
            texture_length=float(u(1.5, 8.0)),
            microporosity=float(u(0.05, 0.3)) if micro else 0.0,
            micro_darkening=float(u(0.1, 0.35)),
            inclusions=float(incl),
            inclusion_contrast=float(incl_c),
        )

    @classmethod
    def easy(cls, dtype: str = "uint8") -> "ScannerParams":
        """A clean scan: CNR 25, sharp, no artefacts, mid-range levels."""
        return cls(dtype=dtype, pore_level=0.2, contrast=0.5, cnr=25.0, poisson_fraction=0.0,
                   noise_corr_xy=0.0, noise_corr_z=0.0, psf_xy=0.5, psf_z=0.5)

    @classmethod
    def realistic(cls) -> "ScannerParams":
        """Close to the real carbonate scan ``quantimpy_rock``: uint16, contrast about 4150 grey
        levels on a pore level near 19000, CNR about 4, correlated noise, drift with steps."""
        return cls(dtype="uint16", pore_level=0.29, contrast=0.063, cnr=4.0, poisson_fraction=0.3,
                   noise_corr_xy=0.8, noise_corr_z=0.6, psf_xy=0.8, psf_z=0.7, axis_y=0.3,
                   axis_x=-0.2, fov_radius=1.5, cupping=0.1, ring_count=3, ring_amplitude=0.04,
                   drift_amplitude=0.04, drift_length=25.0, slice_jitter=0.01, step_rate=2.0,
                   step_amplitude=0.09, pore_texture=0.15, solid_texture=0.05, texture_length=3.0,
                   microporosity=0.1, micro_darkening=0.25, inclusions=0.005, inclusion_contrast=0.6)

    def validate(self) -> "ScannerParams":
        """Raise :class:`InputError` for values outside their meaning; returns self."""
        if self.dtype not in _DTYPES:
            raise InputError(f"ScannerParams.dtype must be 'uint8' or 'uint16', got {self.dtype!r}")
        if not self.cnr > 0:
            raise InputError(f"ScannerParams.cnr must be > 0, got {self.cnr!r}")
        if not self.contrast > 0:
            raise InputError(f"ScannerParams.contrast must be > 0, got {self.contrast!r}")
        if not 0.0 <= self.poisson_fraction <= 1.0:
            raise InputError(f"ScannerParams.poisson_fraction must be in [0, 1], got {self.poisson_fraction!r}")
        for name in ("noise_corr_xy", "noise_corr_z", "psf_xy", "psf_z", "ring_width", "drift_length",
                     "texture_length", "fov_radius"):
            if getattr(self, name) < 0:
                raise InputError(f"ScannerParams.{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0.0 <= self.microporosity < 1.0 or not 0.0 <= self.inclusions < 1.0:
            raise InputError("ScannerParams.microporosity and inclusions must be in [0, 1)")
        return self

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of every field."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ScannerParams":
        """Inverse of :meth:`as_dict` (unknown keys are an :class:`InputError`)."""
        names = {f.name for f in fields(cls)}
        bad = set(d) - names
        if bad:
            raise InputError(f"unknown ScannerParams fields: {sorted(bad)}")
        return cls(**d).validate()


def _solid_attenuation(rng, shape, p: ScannerParams) -> np.ndarray | float:
    """Attenuation of the solid phase in contrast units (1 = plain solid): float or (Z, Y, X)."""
    s: np.ndarray | float = 1.0
    if p.solid_texture > 0:
        s = s + np.float32(p.solid_texture) * _smooth_field(rng, shape, max(p.texture_length, 0.5))
    if p.microporosity > 0:
        g = _smooth_field(rng, shape, max(2.0 * p.texture_length, 1.0))
        patch = (g > _quantile_value(g, 1.0 - p.microporosity)).astype(np.float32)
        s = s - np.float32(p.micro_darkening) * ndi.gaussian_filter(patch, 0.7)
    if p.inclusions > 0:
        g = _smooth_field(rng, shape, 0.8)
        inc = (g > _quantile_value(g, 1.0 - p.inclusions)).astype(np.float32)
        s = s + np.float32(p.inclusion_contrast) * inc
    return s


def _slice_offsets(rng, nz: int, p: ScannerParams) -> np.ndarray:
    """Additive brightness per slice (contrast units): smooth drift + jitter + steps, (Z,)."""
    off = np.zeros(nz)
    if p.drift_amplitude > 0:
        pad = int(3 * p.drift_length) + 1
        w = rng.standard_normal(nz + 2 * pad)
        d = ndi.gaussian_filter1d(w, max(p.drift_length, 0.5), mode="wrap")[pad:pad + nz]
        d = d / max(_gaussian_noise_gain([max(p.drift_length, 0.5)]), 1e-12)
        off += p.drift_amplitude * d
    if p.slice_jitter > 0:
        off += p.slice_jitter * rng.standard_normal(nz)
    if p.step_rate > 0 and p.step_amplitude > 0:
        n = rng.poisson(p.step_rate * nz / 100.0)
        for _ in range(n):
            at = int(rng.integers(1, max(nz, 2)))
            size = rng.uniform(p.step_amplitude / 3, p.step_amplitude) * (1 if rng.random() < 0.5 else -1)
            off[at:] += size
        off -= off.mean()
    return off


def _radial(shape, p: ScannerParams) -> tuple[np.ndarray, float]:
    """Distance of each in-slice pixel from the rotation axis (Y, X), and the field-of-view radius."""
    ny, nx = shape[1], shape[2]
    cy = (ny - 1) / 2 + p.axis_y * ny
    cx = (nx - 1) / 2 + p.axis_x * nx
    y = np.arange(ny)[:, None] - cy
    x = np.arange(nx)[None, :] - cx
    r = np.sqrt(y * y + x * x)
    corner = float(r.max())
    return r.astype(np.float32), max(p.fov_radius * max(ny, nx), corner + 1.0)


def _render(occupancy: np.ndarray, rng: np.random.Generator, p: ScannerParams) -> np.ndarray:
    """Scanner model on the output grid: pore occupancy (Z, Y, X) in [0, 1] -> integer scan."""
    p.validate()
    shape = occupancy.shape
    solid = _solid_attenuation(rng, shape, p)
    u = (1.0 - occupancy) * solid  # contrast units, pore 0, solid 1  (Z, Y, X)
    if p.pore_texture > 0:
        u = u + occupancy * (np.float32(p.pore_texture) * _smooth_field(rng, shape, max(p.texture_length, 0.5)))
    u = np.asarray(u, dtype=np.float32)
    if p.psf_xy > 0 or p.psf_z > 0:
        u = ndi.gaussian_filter(u, (p.psf_z, p.psf_xy, p.psf_xy), mode="nearest")
    r, r_fov = _radial(shape, p)
    if p.cupping > 0:  # beam hardening: attenuation appears lower towards the axis
        u = u * (1.0 - np.float32(p.cupping) * (1.0 - (r / np.float32(r_fov)) ** 2))[None]
    if p.ring_count > 0 and p.ring_amplitude > 0:
        radii = rng.uniform(0.0, float(r.max()), p.ring_count)
        amps = rng.uniform(-p.ring_amplitude, p.ring_amplitude, p.ring_count)
        rings = np.zeros_like(r)
        w = max(p.ring_width, 0.3)
        for rr, aa in zip(radii, amps):
            rings += np.float32(aa) * np.exp(-0.5 * ((r - np.float32(rr)) / np.float32(w)) ** 2)
        u = u + rings[None]
    u = u + _slice_offsets(rng, shape[0], p).astype(np.float32)[:, None, None]
    # noise: Gaussian + Poisson (variance grows with the grey value), then correlated
    sigma = 1.0 / p.cnr
    noise = rng.standard_normal(shape, dtype=np.float32) * np.float32(sigma * math.sqrt(1.0 - p.poisson_fraction))
    if p.poisson_fraction > 0:
        b = p.pore_level / p.contrast  # grey value of pore in contrast units (output ∝ b + u)
        counts = (b + 1.0) / (sigma * sigma * p.poisson_fraction)  # photons at solid level
        lam = np.maximum(b + u.astype(np.float64), 0.0) * counts
        noise += ((rng.poisson(lam) - lam) / counts).astype(np.float32)
    sig = (p.noise_corr_z, p.noise_corr_xy, p.noise_corr_xy)
    if max(sig) > 0:
        noise = ndi.gaussian_filter(noise, sig, mode="wrap") / np.float32(_gaussian_noise_gain(sig))
    u = u + noise
    dt = _DTYPES[p.dtype]
    top = float(np.iinfo(dt).max)
    grey = (p.pore_level + p.contrast * u) * top
    if not np.all(np.isfinite(grey)):
        raise NonFiniteError("synthetic scan: non-finite grey values before the integer conversion")
    return np.clip(np.rint(grey), 0, top).astype(dt)


def scan_structure(
    fine_pores: np.ndarray,
    oversample: int,
    rng: np.random.Generator,
    params: Optional[ScannerParams] = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Scan a fine-grid pore structure.

    Parameters
    ----------
    fine_pores : numpy.ndarray
        bool or 0/1 (Z*oversample, Y*oversample, X*oversample), 1 = pore.
    oversample : int
        Fine-grid factor; every dimension of ``fine_pores`` must be a multiple of it.
    rng : numpy.random.Generator
        Source of the noise and artefact realisations.
    params : ScannerParams, optional
        None: ``ScannerParams.random(rng)``.

    Returns
    -------
    scan : numpy.ndarray
        (Z, Y, X) uint8 or uint16 (``params.dtype``); pores dark.
    truth : numpy.ndarray
        (Z, Y, X) uint8, 1 where at least half of the voxel's fine sub-voxels are pore.
    """
    os_ = _check_oversample(oversample)
    fine = np.asarray(fine_pores)
    if fine.ndim != 3 or any(s % os_ or s == 0 for s in fine.shape):
        raise InputError(f"fine_pores must be 3D with every size a multiple of oversample={os_}, "
                         f"got shape {fine.shape}")
    occ = _block_mean(fine.astype(bool, copy=False), os_)  # (Z, Y, X) pore fraction
    truth = (occ >= 0.5).astype(np.uint8)
    p = ScannerParams.random(rng) if params is None else params
    return _render(occ, rng, p), truth


def _label_to_fine(label: np.ndarray, oversample: int, smooth: float = 0.5) -> np.ndarray:
    """Smooth upsampling of a 0/1 label: blur, linear zoom, threshold at 0.5: bool fine grid."""
    f = ndi.gaussian_filter(label.astype(np.float32), smooth, mode="nearest") if smooth > 0 else label
    return _upsample_linear(f, oversample) >= 0.5


def scan_label(
    label: np.ndarray,
    rng: np.random.Generator,
    params: Optional[ScannerParams] = None,
    oversample: int = 2,
) -> np.ndarray:
    """Scan a real pore label (e.g. the Leopard sandstone): its truth is the label itself.

    The label is blurred slightly (sigma 0.5 voxel), zoomed linearly to the fine grid and
    thresholded at 0.5, so that interfaces are smooth at sub-voxel level and the fine grid's
    majority gives back the label almost exactly (only features a voxel thin can change); then it is
    scanned as by :func:`scan_structure`.

    Parameters
    ----------
    label : numpy.ndarray
        (Z, Y, X) 0/1 or bool, 1 = pore.
    rng : numpy.random.Generator
    params : ScannerParams, optional
        None: ``ScannerParams.random(rng)``.
    oversample : int

    Returns
    -------
    numpy.ndarray
        (Z, Y, X) uint8 or uint16 scan.
    """
    lab = np.asarray(label)
    if lab.ndim != 3:
        raise InputError(f"label must be a 3D (Z, Y, X) volume, got shape {lab.shape}")
    if lab.dtype != bool and not np.isin(np.unique(lab), (0, 1)).all():
        raise InputError("label must hold only 0 (solid) and 1 (pore)")
    os_ = _check_oversample(oversample)
    fine = _label_to_fine(lab.astype(bool), os_)
    occ = _block_mean(fine, os_)
    p = ScannerParams.random(rng) if params is None else params
    return _render(occ, rng, p)


# ----------------------------------------------------------------------------------------------
# pairs
# ----------------------------------------------------------------------------------------------


def check_zoom(value: Any, name: str = "zoom") -> float:
    """``value`` as a float feature zoom (finite, >= 1; 1 = native scale), else an InputError naming ``name``."""
    try:
        zoom = float(value)
    except (TypeError, ValueError):
        zoom = float("nan")
    if not (math.isfinite(zoom) and zoom >= 1.0):
        raise InputError(f"{name} must be a number >= 1 (1 = native feature scale), got {value!r}")
    return zoom


def _zoom_fine(fine_small: np.ndarray, out_shape: tuple[int, int, int], zoom: float) -> np.ndarray:
    """Enlarge a fine-grid pore structure ``zoom`` times: blur (sigma 0.5), linear zoom, threshold at 0.5.

    Output voxel j along an axis samples input coordinate (j + 0.5) / zoom - 0.5 (voxel-area aligned,
    as :func:`_upsample_linear`); the output is ``out_shape`` (bool), the leading corner of the zoomed
    structure.
    """
    f = ndi.gaussian_filter(fine_small.astype(np.float32), 0.5, mode="nearest")
    inv = 1.0 / zoom
    off = 0.5 * inv - 0.5
    z = ndi.affine_transform(f, np.array([inv, inv, inv]), offset=off, output_shape=tuple(out_shape),
                             order=1, mode="nearest", prefilter=False)
    return z >= 0.5


def draw_zoom(seed: int, zoom_max: float) -> float:
    """The feature zoom of simulated scan ``seed`` in a set whose zooms reach ``zoom_max``.

    Half the scans keep their native scale (1.0); the other half are enlarged by a factor
    log-uniform in [1, ``zoom_max``], as when the same material is scanned at a finer voxel size.
    Drawn from its own stream (``seed``, 1), so a set without zoom (``zoom_max`` 1) has exactly the
    scans :func:`make_pair` gives for those seeds.
    """
    zoom_max = check_zoom(zoom_max, "zoom_max")
    if zoom_max == 1.0:
        return 1.0
    rng = np.random.default_rng([int(seed), 1])
    if rng.random() < 0.5:
        return 1.0
    return float(math.exp(rng.uniform(0.0, math.log(zoom_max))))


def make_pair(
    seed: int,
    shape: tuple[int, int, int] = (64, 64, 64),
    family: Optional[str] = None,
    porosity: Optional[float] = None,
    zoom: float = 1.0,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """One scan with its truth, a pure function of ``seed`` (and ``zoom``).

    Parameters
    ----------
    seed : int
        Seed of ``numpy.random.default_rng``.
    shape : tuple of int
        (Z, Y, X) of the scan.
    family : str, optional
        One of :data:`FAMILIES`; None: drawn from the seed.
    porosity : float, optional
        None: uniform in [0.05, 0.45] from the seed.
    zoom : float
        Feature scale, >= 1: the structure is built on a grid ``zoom`` times smaller and enlarged to
        ``shape`` before it is scanned, so grains, pores and tubes are ``zoom`` times as many voxels
        across (a finer voxel size on the same material); the scanner's blur and noise stay per
        voxel. 1 (the default): the structure is built at ``shape`` directly. The scan shows the
        leading corner of the enlarged structure, so its porosity is that corner's: within a few
        hundredths of the one asked (``info["porosity_truth"]`` is exact).

    Returns
    -------
    scan : numpy.ndarray
        (Z, Y, X) uint8 or uint16.
    truth : numpy.ndarray
        (Z, Y, X) uint8, 1 = pore.
    info : dict
        ``family``, ``porosity`` (asked), ``porosity_truth``, ``params`` (ScannerParams as a dict),
        ``structure`` (the structure's own random choices, in the voxels of the grid it was built
        on), ``seed``, ``shape``, ``oversample``, ``zoom``.
    """
    shape = _check_shape(shape)
    zoom = check_zoom(zoom)
    rng = np.random.default_rng(seed)
    drawn_family = FAMILIES[int(rng.integers(len(FAMILIES)))]  # always drawn: same stream either way
    drawn_porosity = float(rng.uniform(0.05, 0.45))
    fam = drawn_family if family is None else family
    por = drawn_porosity if porosity is None else _check_porosity(porosity)
    params = ScannerParams.random(rng)
    oversample = 2
    if zoom == 1.0:
        fine, meta = _structure(fam, shape, por, rng, oversample, None, None)
    else:
        small = tuple(max(8, math.ceil(s / zoom)) for s in shape)
        fine_small, meta = _structure(fam, small, por, rng, oversample, None, None)
        fine = _zoom_fine(fine_small, tuple(s * oversample for s in shape), zoom)
    scan, truth = scan_structure(fine, oversample, rng, params)
    info = {
        "family": fam,
        "porosity": por,
        "porosity_truth": float(truth.mean()),
        "params": params.as_dict(),
        "structure": meta,
        "seed": int(seed),
        "shape": list(shape),
        "oversample": oversample,
        "zoom": zoom,
    }
    return scan, truth, info


def _save_nifti_atomic(arr: np.ndarray, path: Path, voxel_mm: float) -> None:
    import nibabel as nib

    # (Z, Y, X) -> NIfTI (i, j, k) = (X, Y, Z): the slice axis Z is the file's third axis k
    img = nib.Nifti1Image(np.ascontiguousarray(arr.T), np.diag([voxel_mm, voxel_mm, voxel_mm, 1.0]))
    img.header.set_xyzt_units("mm")
    img.header.set_data_dtype(arr.dtype)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp.nii.gz", dir=path.parent)
    os.close(fd)
    try:
        nib.save(img, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def pair_seed(seed: int, index: int) -> int:
    """Seed of pair ``index`` in a set made with ``seed`` (independent streams via SeedSequence)."""
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1, dtype=np.uint64)[0])


def write_pairs(
    outdir: str | os.PathLike,
    n: int,
    shape: tuple[int, int, int] = (64, 64, 64),
    seed: int = 0,
    progress: Optional[Callable[[int, int, str], None]] = None,
    zoom_max: float = 1.0,
) -> list[dict]:
    """Write ``n`` synthetic pairs as NIfTI files with a manifest.

    Files: ``outdir/scan_{i:04d}.nii.gz`` (uint8 or uint16), ``outdir/label_{i:04d}.nii.gz``
    (uint8, 1 = pore), isotropic voxels of :data:`VOXEL_SIZE_MM` mm, the array's Z (slice) axis
    stored as the file's third axis k. ``outdir/manifest.json`` is a JSON list with one entry per
    pair (``index``, ``scan``, ``label`` file names, ``seed``, ``family``, ``porosity``,
    ``porosity_truth``, ``params``, ``structure``, ``shape``, ``voxel_size_mm``). Each file is
    written to a temporary name and renamed; the manifest is written last.

    Pair ``i`` uses seed :func:`pair_seed` ``(seed, i)`` and zoom :func:`draw_zoom` ``(that seed,
    zoom_max)`` (1 for every pair when ``zoom_max`` is 1), so ``make_pair(entry["seed"], shape,
    zoom=entry["zoom"])`` rebuilds it.

    Returns
    -------
    list of dict
        The manifest entries.
    """
    if int(n) != n or n < 0:
        raise InputError(f"n must be a non-negative integer, got {n!r}")
    shape = _check_shape(shape)
    draw_zoom(0, zoom_max)  # checks zoom_max before anything is written
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for i in range(int(n)):
        s = pair_seed(seed, i)
        scan, truth, info = make_pair(s, shape, zoom=draw_zoom(s, zoom_max))
        scan_name, label_name = f"scan_{i:04d}.nii.gz", f"label_{i:04d}.nii.gz"
        _save_nifti_atomic(scan, out / scan_name, VOXEL_SIZE_MM)
        _save_nifti_atomic(truth, out / label_name, VOXEL_SIZE_MM)
        entry = {"index": i, "scan": scan_name, "label": label_name, "voxel_size_mm": VOXEL_SIZE_MM}
        entry.update(info)
        entries.append(entry)
        if progress is not None:
            progress(i + 1, int(n), "synthetic pairs")
    fd, tmp = tempfile.mkstemp(prefix=".manifest.", suffix=".json.tmp", dir=out)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(entries, fh, indent=1)
        os.replace(tmp, out / "manifest.json")
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return entries
