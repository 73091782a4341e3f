"""Sector profiles of a few slices about an axis: the grey values' mean and variance against the
distance from the axis, per sector (wedge) of the slice plane, summed over the slices.

Averaged over the slices and a sector's arc, a profile is clean where a single slice is noisy: the
noise averages out, and so do the pores of a thin shell of material (to the material's mean). In
such a profile the outermost rise from the air's level is the sample's surface
(:func:`outer_edge`, half way between the air just outside and the material just inside, to a
fraction of a voxel), and a cylinder fitted to those points (:func:`fit_circle`, robust to a vug at
the surface) is a core's surface. :mod:`ctpore.data.envelope` puts these together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
from scipy import ndimage as ndi

__all__ = ["BIN", "PROFILE_PIXELS", "Cylinder", "SectorProfiles", "consensus_circle", "fit_circle", "otsu",
           "outer_edge", "pooled", "smooth_masked", "surface_points"]

#: Profiles read about this many pixels of each slice (a grid of every n-th pixel of a larger one).
PROFILE_PIXELS = 512 * 512

#: Width of a profile bin, in voxels.
BIN = 0.5

#: In :func:`consensus_circle`, a surface point outside a circle counts this many of those on it
#: against the circle: a pore open at the surface puts a point inside the sample's surface, never
#: outside it.
OUTSIDE_WEIGHT = 3


@dataclass(frozen=True)
class Cylinder:
    """A core: its axis at ``centre_mm`` (y, x) in slice ``z_ref``, drifting by ``drift_mm`` (y, x)
    per slice, and its radius; in mm from the centre of voxel (0, 0) of each slice."""

    centre_mm: tuple
    drift_mm: tuple
    radius_mm: float
    z_ref: float

    def centre_at(self, z: float) -> tuple[float, float]:
        return (self.centre_mm[0] + self.drift_mm[0] * (z - self.z_ref),
                self.centre_mm[1] + self.drift_mm[1] * (z - self.z_ref))

    def inside(self, z: float, shape_yx: tuple[int, int], spacing_yx: tuple[float, float],
               shrink_mm: float = 0.0) -> np.ndarray:
        """Bool ``(Y, X)``: the voxels of slice ``z`` whose centre is inside (less ``shrink_mm``)."""
        cy, cx = self.centre_at(z)
        y = np.arange(shape_yx[0]) * spacing_yx[0] - cy
        x = np.arange(shape_yx[1]) * spacing_yx[1] - cx
        r = self.radius_mm - shrink_mm
        return (y[:, None] ** 2 + x[None, :] ** 2) <= r * r


def smooth_masked(sl: np.ndarray, valid: Optional[np.ndarray], sigma: float = 1.0) -> np.ndarray:
    """Gaussian smoothing that ignores the invalid pixels (a normalized convolution)."""
    if valid is None:
        return ndi.gaussian_filter(sl, sigma, mode="nearest")
    w = ndi.gaussian_filter(valid.astype(np.float32), sigma, mode="nearest")
    g = ndi.gaussian_filter(np.where(valid, sl, 0).astype(np.float32), sigma, mode="nearest")
    return g / np.maximum(w, 1e-6)


def otsu(values: np.ndarray) -> float:
    """Otsu's threshold of ``values`` (between the darker and the brighter class)."""
    from skimage.filters import threshold_otsu

    return float(threshold_otsu(values))


class SectorProfiles:
    """Per-sector sums of grey values against the distance from the axis, over the read slices."""

    def __init__(self, slices, valid, zs, spacing, cyl: Cylinder, n_sectors: int, r_max_mm: float,
                 phase: float = 0.0):
        # ``phase``: the sectors turned by this share of one (sectors of other phases, other points)
        self.phase = float(phase)
        self.step = BIN * min(spacing[1], spacing[2])
        nb = int(math.ceil(r_max_mm / self.step)) + 1
        self.n_sectors, self.nb = n_sectors, nb
        size = n_sectors * nb
        n = np.zeros(size)
        s1 = np.zeros(size)
        s2 = np.zeros(size)
        # large slices are read on a grid of every `stride`-th pixel: bins keep plenty of pixels
        stride = max(1, int(round(math.sqrt(slices[0].size / PROFILE_PIXELS)))) if len(slices) else 1
        for sl, ok, z in zip(slices, valid, zs):
            cy, cx = cyl.centre_at(float(z))
            sl = sl[::stride, ::stride]
            ok = None if ok is None else ok[::stride, ::stride]
            y = np.arange(0, sl.shape[0] * stride, stride, dtype=np.float32) * np.float32(spacing[1]) - np.float32(cy)
            x = np.arange(0, sl.shape[1] * stride, stride, dtype=np.float32) * np.float32(spacing[2]) - np.float32(cx)
            r = np.sqrt(y[:, None] ** 2 + x[None, :] ** 2)
            b = np.minimum((r / np.float32(self.step)).astype(np.int64), nb - 1)
            th = np.arctan2(y[:, None], x[None, :])
            k = np.floor((th + np.pi) * (n_sectors / (2 * np.pi)) - self.phase).astype(np.int64) % n_sectors
            idx = (k * nb + b)
            if ok is not None:
                idx, v = idx[ok], sl[ok]
            else:
                v = sl
            idx = idx.ravel()
            v = v.ravel().astype(np.float64)
            n += np.bincount(idx, minlength=size)
            s1 += np.bincount(idx, v, minlength=size)
            s2 += np.bincount(idx, v * v, minlength=size)
        self.n = n.reshape(n_sectors, nb)
        with np.errstate(invalid="ignore", divide="ignore"):
            self.mean = (s1 / n).reshape(n_sectors, nb)
            self.var = (s2 / n).reshape(n_sectors, nb) - self.mean ** 2
        # the pixels a full ring would hold in each bin of a sector, to tell a cut ring
        r_mid = (np.arange(nb) + 0.5) * self.step
        area = 2 * np.pi * r_mid * self.step / n_sectors / (spacing[1] * spacing[2]) / stride ** 2
        self.full = area * len(zs)
        # a bin counts when it holds a share of a full ring's pixels, and some pixels (few with one slice)
        self.covered = self.n >= np.maximum(0.15 * self.full[None, :], np.minimum(4, 0.5 * self.full[None, :]))
        self.covered[:, :2] = self.n[:, :2] > 0

    def angle(self, k: int) -> float:
        """The middle of sector ``k``, in radians from the +x axis (towards +y)."""
        return -np.pi + (k + 0.5 + self.phase) * 2 * np.pi / self.n_sectors

    def radius(self, b: float) -> float:
        return (b + 0.5) * self.step


def outer_edge(mean: np.ndarray, covered: np.ndarray, air: float, rise: float, step_vox: float,
                start: Optional[int] = None, past_lines: bool = False) -> Optional[float]:
    """The outermost rise of one sector's profile from the air's level (bin units, sub-bin), or
    None when the sector never shows 3 voxels of air outside the material (cut by the slice's edge).

    ``rise``: a level between the air's and the material's that marks the rise; the edge is then
    where the profile crosses halfway between the air just outside and the material just inside.
    ``start``: look only at bins up to this one (inside a wall). ``past_lines``: where the outermost
    rise is a thin bright line in the air (a ring artefact), look for the next rise further in (else
    the sector gives no point).
    """
    nb = mean.shape[0]
    top = nb - 1 if start is None else min(start, nb - 1)
    ok = covered[: top + 1].copy()
    need = max(2, int(round(3.0 / step_vox)))  # bins of air to be sure there is air
    above = ok & (mean[: top + 1] > rise)
    # the outermost bin above the rise level with `need` covered bins of air beyond it
    idx = np.nonzero(above)[0]
    if idx.size == 0:
        return None
    e = int(idx[-1])
    beyond = ok[e + 1: e + 1 + need]
    if beyond.size < need or not beyond.all():
        return None  # no air beyond: the sector is cut
    while True:
        out_lo, out_hi = e + 1, min(e + 1 + 3 * need, top + 1)
        air_here = float(np.median(mean[out_lo:out_hi][ok[out_lo:out_hi]]))
        in_lo, in_hi = max(e - 3 * need, 0), max(e - int(round(1.0 / step_vox)), 1)
        inner = mean[in_lo:in_hi][ok[in_lo:in_hi]]
        if inner.size == 0:
            return None
        mat = float(np.median(inner))
        if mat > rise:
            break
        if not past_lines:
            return None
        # a thin bright line in the air (a ring artefact), not material that goes on inwards: the next
        # rise further in with `need` bins of air between them
        first = e
        while first > 0 and above[first - 1]:
            first -= 1
        further = idx[idx < first - need]
        if further.size == 0:
            return None
        e = int(further[-1])
    half = 0.5 * (air_here + mat)
    # the outermost crossing of `half` near e (within two voxels), linearly interpolated
    lo = max(e - 2 * need, 0)
    for b in range(min(e + need, top - 1), lo - 1, -1):
        a, c = mean[b], mean[b + 1]
        if ok[b] and ok[b + 1] and a >= half > c:
            return b + (a - half) / (a - c) if a != c else b + 0.5
    return float(e) + 0.5


def _circle_residuals(p, pts):
    return np.hypot(pts[:, 0] - p[0], pts[:, 1] - p[1]) - p[2]


def fit_circle(points: np.ndarray, init: tuple[float, float, float]) -> tuple[np.ndarray, np.ndarray]:
    """Robust circle fit to (y, x) points (mm): ((cy, cx, r), residuals)."""
    from scipy.optimize import least_squares

    def res(p):
        return np.hypot(points[:, 0] - p[0], points[:, 1] - p[1]) - p[2]

    scale = max(float(np.median(np.abs(res(np.array(init))))), 1e-9)
    sol = least_squares(res, np.array(init, float), loss="soft_l1", f_scale=scale)
    for _ in range(2):  # trim the far points (a vug at the surface, a speck), refit
        r = res(sol.x)
        mad = 1.4826 * float(np.median(np.abs(r - np.median(r))))
        keep = np.abs(r) <= max(3.0 * mad, 1e-9) + 0.0
        if keep.sum() < 6:
            break
        sol = least_squares(_circle_residuals, sol.x, args=(points[keep],), loss="soft_l1", f_scale=max(mad, 1e-9))
    return sol.x, res(sol.x)


def _triples(n: int, most: int) -> np.ndarray:
    """Rows ``(i, j, k)``, ``i < j < k < n``: every triple in lexicographic order, or the ``most`` of
    them that ``np.random.default_rng(0).choice`` picks by their rank in that order (found from the
    ranks, without listing the ``n^3 / 6`` triples of a few hundred points)."""
    from itertools import combinations

    total = math.comb(n, 3)
    if total <= most:
        return np.array(list(combinations(range(n), 3)), np.int64).reshape(-1, 3)
    rank = np.random.default_rng(0).choice(total, most, replace=False).astype(np.int64)
    first = np.arange(n, dtype=np.int64)
    start_i = np.concatenate([[0], np.cumsum((n - 1 - first) * (n - 2 - first) // 2)[:-1]])
    i = np.searchsorted(start_i, rank, side="right") - 1
    rem = rank - start_i[i]
    pairs = np.concatenate([[0], np.cumsum(n - 1 - first)])  # pairs (j', k) with j' < j, over all j'
    j = np.searchsorted(pairs, rem + pairs[i + 1], side="right") - 1
    k = j + 1 + (rem + pairs[i + 1] - pairs[j])
    return np.stack([i, j, k], 1)


def consensus_circle(points: np.ndarray, tol: float, max_triples: int = 4000) -> Optional[tuple[float, float, float]]:
    """The circle ``(cy, cx, r)`` through three of ``points`` (y, x) that the most of them lie within
    ``tol`` of, each point further than ``tol`` outside it counting :data:`OUTSIDE_WEIGHT` against it
    (ties: the least squared distance of those within), or None when fewer than 6 lie within.

    A least-squares fit follows its start: where false surface points are many and all on one side
    (pores open at the surface, or cut by the slice's edge, where little air is seen), it settles
    between them and the true ones. The circle that most points agree on, and that leaves none
    outside it (material beyond a surface, which no pore explains), does not. Every triple is
    tried up to ``max_triples`` of them, else that many drawn with a fixed seed (the same points,
    the same circle)."""
    n = len(points)
    if n < 6:
        return None
    idx = _triples(n, max_triples)
    a, b, c = (points[idx[:, m]].astype(np.float64) for m in range(3))
    d = 2.0 * (a[:, 0] * (b[:, 1] - c[:, 1]) + b[:, 0] * (c[:, 1] - a[:, 1]) + c[:, 0] * (a[:, 1] - b[:, 1]))
    ok = np.abs(d) > 1e-12
    a, b, c, d = a[ok], b[ok], c[ok], d[ok]
    if not len(d):
        return None
    sa, sb, sc = (np.sum(q * q, axis=1) for q in (a, b, c))
    cy = (sa * (b[:, 1] - c[:, 1]) + sb * (c[:, 1] - a[:, 1]) + sc * (a[:, 1] - b[:, 1])) / d
    cx = (sa * (c[:, 0] - b[:, 0]) + sb * (a[:, 0] - c[:, 0]) + sc * (b[:, 0] - a[:, 0])) / d
    r = np.hypot(a[:, 0] - cy, a[:, 1] - cx)
    res = np.hypot(points[None, :, 0] - cy[:, None], points[None, :, 1] - cx[:, None]) - r[:, None]
    inl = np.abs(res) <= tol
    count = inl.sum(axis=1)
    score = count - OUTSIDE_WEIGHT * (res > tol).sum(axis=1)
    sq = np.where(inl, res * res, 0.0).sum(axis=1)
    best = int(np.lexsort((sq, -score))[0])
    if count[best] < 6:
        return None
    return float(cy[best]), float(cx[best]), float(r[best])


def surface_points(prof: SectorProfiles, cyl: Cylinder, z_ref: float, air: float, rise: float, step_vox: float,
                    start_mm: Optional[np.ndarray] = None, past_lines: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Surface points (y, x) in mm about ``cyl``'s centre at ``z_ref``, one per sector that has one, and
    the sectors' indices (``past_lines``: :func:`outer_edge`'s)."""
    cy, cx = cyl.centre_at(z_ref)
    pts, ks = [], []
    for k in range(prof.n_sectors):
        start = None if start_mm is None else int(start_mm[k] / prof.step)
        e = outer_edge(prof.mean[k], prof.covered[k], air, rise, step_vox, start, past_lines)
        if e is None:
            continue
        r = prof.radius(e)
        th = prof.angle(k)
        pts.append((cy + r * math.sin(th), cx + r * math.cos(th)))
        ks.append(k)
    return np.array(pts).reshape(-1, 2), np.array(ks, int)


def pooled(prof: SectorProfiles) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All sectors together: (pixels, mean, std) per radius bin."""
    n = prof.n.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        s1 = np.nansum(prof.mean * prof.n, axis=0)
        s2 = np.nansum((prof.var + prof.mean ** 2) * prof.n, axis=0)
        mean = s1 / n
        std = np.sqrt(np.maximum(s2 / n - mean ** 2, 0.0))
    return n, mean, std


