"""The micro-CT scanner model: a pore occupancy volume in, an integer grey-value scan out.

Partial volume, solid texture, point-spread blur, beam-hardening cupping and rings around the
rotation axis (Z), slice drift with steps, Gaussian and Poisson noise with in-slice correlation,
then offset, gain and clipping to an integer range. Pores are dark, solid bright.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Optional

import numpy as np
from scipy import ndimage as ndi

from ctpore.data.synthetic.fields import (
    block_mean, check_oversample, gaussian_noise_gain, log_uniform, quantile_value, smooth_field,
    upsample_linear,
)
from ctpore.errors import InputError, NonFiniteError

__all__ = ["ScannerParams", "scan_structure", "scan_scene", "scan_label"]

_DTYPES = {"uint8": np.uint8, "uint16": np.uint16}


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
        contrast = log_uniform(rng, 0.03, 0.45) if dtype == "uint16" else log_uniform(rng, 0.1, 0.6)
        cnr = log_uniform(rng, 3.0, 25.0)
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
        s = s + np.float32(p.solid_texture) * smooth_field(rng, shape, max(p.texture_length, 0.5))
    if p.microporosity > 0:
        g = smooth_field(rng, shape, max(2.0 * p.texture_length, 1.0))
        patch = (g > quantile_value(g, 1.0 - p.microporosity)).astype(np.float32)
        s = s - np.float32(p.micro_darkening) * ndi.gaussian_filter(patch, 0.7)
    if p.inclusions > 0:
        g = smooth_field(rng, shape, 0.8)
        inc = (g > quantile_value(g, 1.0 - p.inclusions)).astype(np.float32)
        s = s + np.float32(p.inclusion_contrast) * inc
    return s


def _slice_offsets(rng, nz: int, p: ScannerParams) -> np.ndarray:
    """Additive brightness per slice (contrast units): smooth drift + jitter + steps, (Z,)."""
    off = np.zeros(nz)
    if p.drift_amplitude > 0:
        pad = int(3 * p.drift_length) + 1
        w = rng.standard_normal(nz + 2 * pad)
        d = ndi.gaussian_filter1d(w, max(p.drift_length, 0.5), mode="wrap")[pad:pad + nz]
        d = d / max(gaussian_noise_gain([max(p.drift_length, 0.5)]), 1e-12)
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


def _render(occupancy: np.ndarray, rng: np.random.Generator, p: ScannerParams,
            around: Optional[tuple] = None) -> np.ndarray:
    """Scanner model on the output grid: pore occupancy (Z, Y, X) in [0, 1] -> integer scan.

    ``around`` (a scene, :func:`~ctpore.data.synthetic.scenes.scene_fractions`): ``(material, wall,
    fluid)``, the share of each voxel that is sample, the container wall's attenuation times its
    share, and the pore fluid's attenuation; ``occupancy`` is then the pore share inside the sample
    and the rest of a voxel is air (0). None: the voxel is all sample with dry pores (the same
    random draws either way).
    """
    p.validate()
    shape = occupancy.shape
    solid = _solid_attenuation(rng, shape, p)
    if around is None:
        u = (1.0 - occupancy) * solid  # contrast units, pore 0, solid 1  (Z, Y, X)
    else:
        material, wall, fluid = around
        u = (material - occupancy) * solid + wall + np.float32(fluid) * occupancy
    if p.pore_texture > 0:
        u = u + occupancy * (np.float32(p.pore_texture) * smooth_field(rng, shape, max(p.texture_length, 0.5)))
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
        noise = ndi.gaussian_filter(noise, sig, mode="wrap") / np.float32(gaussian_noise_gain(sig))
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
    os_ = check_oversample(oversample)
    fine = np.asarray(fine_pores)
    if fine.ndim != 3 or any(s % os_ or s == 0 for s in fine.shape):
        raise InputError(f"fine_pores must be 3D with every size a multiple of oversample={os_}, "
                         f"got shape {fine.shape}")
    occ = block_mean(fine.astype(bool, copy=False), os_)  # (Z, Y, X) pore fraction
    truth = (occ >= 0.5).astype(np.uint8)
    p = ScannerParams.random(rng) if params is None else params
    return _render(occ, rng, p), truth


def scan_scene(
    fine_pores: np.ndarray,
    oversample: int,
    rng: np.random.Generator,
    params: ScannerParams,
    scene,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scan a fine-grid pore structure cut to a :class:`~ctpore.data.synthetic.scenes.Scene`: the
    sample in its surroundings (air, a container wall, a circular field of view), rendered on the
    fine grid before the blur and the noise.

    Returns
    -------
    scan : numpy.ndarray
        (Z, Y, X) uint8 or uint16; beyond a circular field of view, ``scene.fov_value``.
    truth : numpy.ndarray
        (Z, Y, X) uint8, 1 where the voxel's centre is in the sample and at least half of its fine
        sub-voxels are pore.
    sample : numpy.ndarray
        (Z, Y, X) bool, the true sample (:func:`~ctpore.data.synthetic.scenes.true_sample`).
    """
    from ctpore.data.synthetic.scenes import fov_outside, scene_fractions, true_sample

    os_ = check_oversample(oversample)
    fine = np.asarray(fine_pores)
    if fine.ndim != 3 or any(s % os_ or s == 0 for s in fine.shape):
        raise InputError(f"fine_pores must be 3D with every size a multiple of oversample={os_}, "
                         f"got shape {fine.shape}")
    scene = scene.validate()
    pores, material, wall = scene_fractions(fine, os_, scene)
    scan = _render(pores, rng, params, (material, wall * np.float32(scene.wall_attenuation), scene.pore_fluid))
    sample = true_sample(scene, pores.shape)
    truth = ((block_mean(fine.astype(bool, copy=False), os_) >= 0.5) & sample).astype(np.uint8)
    beyond = fov_outside(scene, pores.shape[1:])
    if beyond is not None:
        top = float(np.iinfo(scan.dtype).max)
        scan[:, beyond] = np.clip(np.rint(scene.fov_value), 0, top)
    return scan, truth, sample


def _label_to_fine(label: np.ndarray, oversample: int, smooth: float = 0.5) -> np.ndarray:
    """Smooth upsampling of a 0/1 label: blur, linear zoom, threshold at 0.5: bool fine grid."""
    f = ndi.gaussian_filter(label.astype(np.float32), smooth, mode="nearest") if smooth > 0 else label
    return upsample_linear(f, oversample) >= 0.5


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
    os_ = check_oversample(oversample)
    fine = _label_to_fine(lab.astype(bool), os_)
    occ = block_mean(fine, os_)
    p = ScannerParams.random(rng) if params is None else params
    return _render(occ, rng, p)


