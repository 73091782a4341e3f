"""Pore structures of four families on a fine grid: grains, bicontinuous fields, tubes, vesicles.

Every family is built as a continuous field thresholded at a quantile, so the porosity is the one
asked for (to a voxel count on the fine grid).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np
from scipy import fft as sfft

from ctpore.data.synthetic.fields import (
    aniso_cov, aniso_metric, check_oversample, check_porosity, check_shape, log_uniform, majority_threshold,
    quad_form, random_unit, smooth_field, spectral_noise, spectral_std, unit,
)
from ctpore.errors import InputError

__all__ = ["FAMILIES", "make_structure", "build_structure"]

FAMILIES = ("grains", "bicontinuous", "tubes", "vesicles")


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


def _roughness(rng, fine, rough, r_mean, length):
    """Smooth noise of amplitude ``rough * r_mean`` that roughens body surfaces; None when ``rough`` is 0.

    Its correlation length is drawn uniformly in ``length`` (a fraction of ``r_mean``).
    """
    if rough <= 0:
        return None
    return np.float32(rough * r_mean) * smooth_field(rng, fine, rng.uniform(*length) * r_mean)


def _grains(rng, fine, porosity, os_, aniso, axis, meta):
    """Polydisperse grain packing (relaxed random packing with partial overlap), pores between.

    Grains are then grown or shrunk together (cementation) until the porosity is the one asked.
    """
    r_mean = log_uniform(rng, 3.5, 9.0) * os_
    cv = rng.uniform(0.1, 0.45)
    s_ln = math.sqrt(math.log1p(cv * cv))
    packing = rng.uniform(0.6, 0.8)  # sum of grain volumes / box volume, before relaxation
    # keep the hard cores (radius (1 - overlap) r) below about 52 % of the volume, so that they relax
    overlap = max(rng.uniform(0.03, 0.2), 1.0 - (0.52 / packing) ** (1 / 3))
    metric = aniso_metric(aniso, axis)
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
    noise = _roughness(rng, fine, rough, r_mean, (0.3, 0.7))
    margin = 0.4 * r_mean + 2.0
    for _ in range(4):
        field = _ellipsoid_field(fine, centres, radii, None if aniso == 1.0 else metric, margin)  # > 0 in grains
        if noise is not None:
            field += noise
        t = majority_threshold(field, porosity, os_)
        if t > -margin + 0.5 + (0.0 if noise is None else 3 * rough * r_mean):
            break
        margin *= 2.0  # the growth needed reached the rendered margin: render further out
    meta.update(grain_radius=r_mean / os_, grain_cv=cv, n_grains=int(radii.size), overlap=overlap, packing=packing,
                roughness=rough, growth=-t / os_)
    return field < t


def _vesicles(rng, fine, porosity, os_, aniso, axis, meta):
    """Ellipsoidal blobs (vesicles, vughs) at random places, free to coalesce, optionally rough."""
    r_mean = log_uniform(rng, 2.0, 8.0) * os_
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
    noise = _roughness(rng, fine, rough, r_mean, (0.3, 0.8))
    margin = 0.4 * r_mean + 2.0
    for _ in range(4):
        field = _ellipsoid_field(fine, centres, radii, None if aniso == 1.0 else aniso_metric(aniso, axis),
                                 margin)  # > 0 inside blobs
        if noise is not None:
            field += noise
        np.negative(field, out=field)
        t = majority_threshold(field, porosity, os_)
        if t < margin - 0.5 - (0.0 if noise is None else 3 * rough * r_mean):
            break
        margin *= 2.0  # blobs must grow further than rendered
    meta.update(blob_radius=r_mean / os_, blob_cv=cv, n_blobs=n, roughness=rough)
    return field < t


def _bicontinuous(rng, fine, porosity, os_, aniso, axis, meta):
    """Thresholded smoothed Gaussian random field: Gaussian, spinodal (band-pass) or two-scale."""
    scale = log_uniform(rng, 1.2, 4.5) * os_
    kind = str(rng.choice(["gaussian", "spinodal", "twoscale"]))
    q = quad_form(fine, aniso_cov(scale, aniso, axis))  # (k s)^2
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
    field = sfft.irfftn(spectral_noise(rng, fine) * transfer.astype(np.float32), s=fine)
    t = majority_threshold(field, porosity, os_)
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
    ctrl = unit(bias[tube_of_ctrl, None] * d0[tube_of_ctrl] + rng.standard_normal((n_ctrl.sum(), 3)))
    tube = np.repeat(np.arange(len(lengths)), steps)
    first = np.concatenate([[0], np.cumsum(steps)[:-1]])
    t = np.arange(steps.sum()) - first[tube]
    c = t * ds / persistence
    c0 = np.floor(c).astype(int)
    w = (c - c0)[:, None]
    i0 = ctrl_off[tube] + c0
    d = unit((1 - w) * ctrl[i0] + w * ctrl[i0 + 1]) * ds
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
        r_main = max(1.0, log_uniform(rng, 1.0, 3.5) * (0.7 + 1.5 * porosity)) * os_
        persistence = rng.uniform(0.4, 1.2) * fmax
        fine_share = rng.uniform(0.15, 0.45)
        r_fine = max(0.8 * os_, r_main * rng.uniform(0.35, 0.6))
    else:
        r_main = max(1.2, log_uniform(rng, 1.8, 5.0) * (0.7 + 1.0 * porosity)) * os_
        persistence = rng.uniform(0.15, 0.5) * fmax
        fine_share = 0.0
        r_fine = r_main
    target = -math.log1p(-porosity) * vol  # Boolean-model volume so that the union is near porosity
    spectrum = np.zeros((fine[0], fine[1], fine[2] // 2 + 1), dtype=np.complex64)
    k2 = quad_form(fine, np.eye(3))
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
            d0 = random_unit(rng, m)
            bias = np.full(m, rng.uniform(0.3, 1.0))
            pers = persistence * 0.5
        else:
            m = int(min(2000, max(1, math.ceil(length / (0.8 * fmax)))))
            lengths = rng.uniform(0.5, 1.5, m)
            lengths *= length / lengths.sum()
            starts = rng.random((m, 3)) * np.array(fine)
            if aligned and aniso < 1.0:  # flattened: tubes run in the plane across the axis
                v = rng.standard_normal((m, 3))
                d0 = unit(v - (v @ axis)[:, None] * axis[None, :])
                bias = np.full(m, 1.0 + 4.0 * abs(math.log(aniso)))
            elif aligned:
                sign = np.where(rng.random(m) < 0.5, -1.0, 1.0)[:, None]
                d0 = unit(sign * axis + 0.15 * rng.standard_normal((m, 3)))
                bias = np.full(m, 1.0 + 4.0 * abs(math.log(aniso)))
            else:
                d0 = random_unit(rng, m)
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
        spectrum += spectral_noise(rng, fine) * (tr * np.float32(rough / spectral_std(tr, fine)))
    field = sfft.irfftn(-spectrum, s=fine)  # negated: pores below the threshold
    t = majority_threshold(field, porosity, os_)
    meta.update(style=style, radius=r_main / os_, fine_radius=r_fine / os_, n_tubes=n_tubes,
                persistence=persistence / os_, roughness=rough)
    return field < t


_BUILDERS = {"grains": _grains, "bicontinuous": _bicontinuous, "tubes": _tubes, "vesicles": _vesicles}


def build_structure(family, shape, porosity, rng, oversample, anisotropy, axis):
    if family not in FAMILIES:
        raise InputError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    shape = check_shape(shape)
    os_ = check_oversample(oversample)
    p = check_porosity(porosity)
    if anisotropy is None:  # half isotropic, else elongated (35 %) or flattened, as by bedding (15 %)
        draw = rng.random()
        aniso = 1.0 if draw < 0.5 else log_uniform(rng, 1.3, 3.0) if draw < 0.85 else log_uniform(rng, 0.4, 0.77)
    else:
        aniso = float(anisotropy)
        if not (aniso > 0 and math.isfinite(aniso)):
            raise InputError(f"anisotropy must be a positive number (1 = isotropic), got {anisotropy!r}")
    if axis is None:
        if family == "tubes" and rng.random() < 0.5:  # soil cores stand upright: roots run along Z
            ax = unit(np.array([1.0, 0.0, 0.0]) + 0.2 * rng.standard_normal(3))
        else:
            ax = random_unit(rng)
    else:
        ax = np.asarray(axis, dtype=np.float64).reshape(-1)
        if ax.size != 3 or not np.all(np.isfinite(ax)) or np.linalg.norm(ax) == 0:
            raise InputError(f"axis must be a non-zero (z, y, x) vector, got {axis!r}")
        ax = unit(ax)
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
    return build_structure(family, shape, porosity, rng, oversample, anisotropy, axis)[0]


