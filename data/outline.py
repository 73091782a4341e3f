"""The outline of a sample that is not a cylinder (a block, a prism, a broken core), slab by slab.

:class:`Outline` finds, in each slab, the convex hull of the material within a gate (or, for a
block, its smallest enclosing rectangle, each side moved to where the grey values cross halfway from
the material to the air); the helpers here are that plane geometry: hulls, the smallest rectangle
(rotating calipers), how much of it a hull fills (:data:`BLOCK_FILL`).
:func:`~ctpore.data.envelope.fit_envelope` takes an outline where no cylinder describes the sample.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import numpy as np
from scipy import ndimage as ndi

from ctpore.data.profiles import Cylinder, smooth_masked

__all__ = ["BLOCK_FILL", "OUTLINE_STRAY", "STRAY_BAND", "Outline"]

#: An outline is said to be uncertain when more than this share of a band 2 to 16 pixels (of the fit's
#: grid: every voxel of a slice under 768 x 768, every n-th of a larger one) outside each fit slice's
#: own outline is material (:meth:`Outline.stray`): a hull leaves none out but a speck (at most 0.8% in 24 simulated
#: blocks turned in air, development scenes), while one cut short by large pores open at a block's
#: corners, through every slice, leaves its corners out (4.3% in the one such scene, IoU 0.82).
OUTLINE_STRAY = 0.025

#: The band :meth:`Outline.stray` looks in: from this many pixels outside each outline to this many.
STRAY_BAND = (2, 16)


@dataclass(frozen=True)
class Outline:
    """A sample that is not a cylinder (a block, a prism, a broken core): its outline, found slab by
    slab (:meth:`inside`): in each slice the convex hull of the material's voxels (brighter than
    halfway between the air and the material; specks, what an opening removes, left out) within a
    gate (:meth:`_gate`: the sample's region in the slab's mean), then the voxels inside the outlines
    of at least half the slab's slices. Where the hull fills at least 90% of its smallest enclosing
    rectangle, and that rectangle lies within the slice, the sample is a block and the rectangle is
    its outline (a large pore open at a corner does not cut the corner off). The gate keeps a speck of
    noise or a ring artefact in the air from pulling a hull out; the hull keeps the outline to the
    voxel."""

    axis: Cylinder
    n_sectors: int
    air: float
    rise: float
    material: float
    block: Optional[bool] = None  # a block (its outline a rectangle in every slice); None: judged per slice

    def judge_block(self, slices, valid) -> "Outline":
        """This outline with ``block`` decided once for the scan, on the fit's slices: a block when
        the hulls of at least half of them fill :data:`BLOCK_FILL` of their smallest rectangle, or
        the hull of their material together does (large pores open at a block's corners cut each
        slice's hull to an octagon, but not in every slice at once)."""
        votes = []
        half = 0.5 * (self.air + self.material)
        union = None
        for sl, v in zip(slices, valid):
            gate, _ = self._gate(sl[None], [v])
            m = (smooth_masked(sl, v) > half) & gate
            m = ndi.binary_opening(m if v is None else m & v)
            votes.append(_block_fill(m))
            union = m if union is None else union | m
        if not votes:
            return replace(self, block=None)
        block = np.mean([f >= BLOCK_FILL for f in votes]) >= 0.5 or _block_fill(union) >= BLOCK_FILL
        return replace(self, block=bool(block))

    def stray(self, slices, valid, zs, spacing) -> float:
        """The share of material (smoothed, brighter than halfway between the air and the material)
        in a band :data:`STRAY_BAND` pixels outside each of ``slices``' own outline (its slab of one slice),
        over them all: near 0 when the outline is the sample's, larger when it cuts material off."""
        half = 0.5 * (self.air + self.material)
        hit = tot = 0
        for sl, ok, z in zip(slices, valid, zs):
            plane = self.inside(sl[None], int(z), spacing, None if ok is None else ok[None])[0]
            band = (ndi.binary_dilation(plane, iterations=STRAY_BAND[1])
                    & ~ndi.binary_dilation(plane, iterations=STRAY_BAND[0]))
            if ok is not None:
                band &= ok
            hit += int(np.count_nonzero(band & (smooth_masked(sl, ok) > half)))
            tot += int(np.count_nonzero(band))
        return hit / tot if tot else 0.0

    def _gate(self, slab: np.ndarray, ok: list) -> tuple[np.ndarray, np.ndarray]:
        """Bool ``(Y, X)``, and the slab's mean: where the sample may be in this slab: the slab's mean grey values (the
        noise averaged over its slices) above the rise level, opened by a disc of radius 2 (a ring
        artefact or a speck is thinner) and closed by one of radius 4 (the grains of a packing are
        one piece), its largest piece (and those at least a quarter its size) filled and two voxels
        wider."""
        ny, nx = slab.shape[1:]
        acc = np.zeros((ny, nx))
        cnt = np.zeros((ny, nx))
        for sl, v in zip(slab, ok):
            g = smooth_masked(sl, v)
            acc += g if v is None else np.where(v, g, 0.0)
            cnt += 1.0 if v is None else v
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = acc / cnt
        disc = ndi.iterate_structure(ndi.generate_binary_structure(2, 1), 2)
        m = ndi.binary_opening(np.nan_to_num(mean, nan=self.air) > self.rise, disc)
        # closed (the grains of a packing, one piece), the slice's edge not eroding what reaches it
        m = ndi.binary_erosion(ndi.binary_dilation(m, disc, iterations=2), disc, iterations=2, border_value=1)
        lab, n = ndi.label(m)
        if not n:  # no material in this slab: no sample
            return np.zeros((ny, nx), bool), mean
        sizes = np.bincount(lab.ravel())[1:]
        keep = np.zeros(n + 1, bool)
        keep[1:] = sizes >= 0.25 * sizes.max()
        return ndi.binary_dilation(ndi.binary_fill_holes(keep[lab]), iterations=2), mean

    def inside(self, slab: np.ndarray, z0: int, spacing: tuple, valid: Optional[np.ndarray] = None) -> np.ndarray:
        """Bool ``(n, Y, X)``: the voxels of slices ``z0 : z0 + n`` inside the slab's outline."""
        n, ny, nx = slab.shape
        ok = [None] * n if valid is None else list(valid)
        gate, mean = self._gate(slab, ok)
        half = 0.5 * (self.air + self.material)
        # each slice's outline of its material (brighter than halfway, specks opened away), then the
        # voxels inside the outlines of half the slab's slices: what the noise adds to one is voted out
        votes = np.zeros((ny, nx), np.int32)
        for sl, v in zip(slab, ok):
            m = (smooth_masked(sl, v) > half) & gate
            votes += _hull(ndi.binary_opening(m if v is None else m & v), gate, self.block)
        out = np.zeros((n, ny, nx), bool)
        plane = 2 * votes >= n
        hull = _hull_points(plane) if self.block else None
        if hull is not None:  # a block: its rectangle, each side moved to where the slab's mean crosses
            from skimage.draw import polygon as fill_polygon  # halfway between the air and the material

            rect = _refine_rectangle(_min_rectangle(hull)[0], mean, self.air)
            rr, cc = fill_polygon(rect[:, 0], rect[:, 1], shape=(ny, nx))
            plane = np.zeros((ny, nx), bool)
            plane[rr, cc] = True
        out[:] = plane
        return out


def _refine_rectangle(rect: np.ndarray, mean: np.ndarray, air: float) -> np.ndarray:
    """A block's rectangle (corners, pixel coordinates) with each side moved along its normal to where
    the profile across it (the slab's mean, averaged along the middle 80% of the side) falls halfway
    from the material just inside to the air just outside; a side without such a fall stays."""
    c = rect.mean(axis=0)
    t = np.arange(-6.0, 6.01, 0.25)
    lines = []
    for i in range(4):
        p0, p1 = rect[i], rect[(i + 1) % 4]
        u = (p1 - p0) / max(float(np.hypot(*(p1 - p0))), 1e-9)
        nrm = np.array([-u[1], u[0]])
        if np.dot(nrm, 0.5 * (p0 + p1) - c) < 0:
            nrm = -nrm
        along = p0 + np.linspace(0.1, 0.9, 40)[:, None] * (p1 - p0)
        pts = along[:, None, :] + t[None, :, None] * nrm  # (along, t, yx)
        prof = np.nanmean(ndi.map_coordinates(np.nan_to_num(mean, nan=air), pts.reshape(-1, 2).T, order=1,
                                              mode="nearest").reshape(pts.shape[:2]), axis=0)
        inner, outer = float(np.median(prof[t <= -3])), float(np.median(prof[t >= 3]))
        shift = 0.0
        if inner - outer > 0:
            half = 0.5 * (inner + outer)
            for j in range(len(t) - 1, 0, -1):  # the outermost fall through `half`
                if prof[j - 1] >= half > prof[j]:
                    shift = float(t[j - 1] + (prof[j - 1] - half) / (prof[j - 1] - prof[j]) * (t[j] - t[j - 1]))
                    break
        lines.append((p0 + shift * nrm, u))
    corners = []
    for i in range(4):  # each corner where a side meets the one before it
        (a, u), (b, v) = lines[i - 1], lines[i]
        m = np.array([u, -v]).T
        k = np.linalg.solve(m, b - a) if abs(np.linalg.det(m)) > 1e-9 else np.zeros(2)
        corners.append(a + k[0] * u)
    return np.array(corners)


def _min_rectangle(hull: np.ndarray) -> tuple[np.ndarray, float]:
    """The smallest rectangle around a convex polygon (vertices in order): its corners and area. One
    of its sides lies on a side of the polygon (rotating calipers)."""
    best, area = None, np.inf
    for i in range(len(hull)):
        e = hull[(i + 1) % len(hull)] - hull[i]
        norm = float(np.hypot(*e))
        if norm == 0:
            continue
        u = e / norm
        v = np.array([-u[1], u[0]])
        a, b = hull @ u, hull @ v
        cur = (a.max() - a.min()) * (b.max() - b.min())
        if cur < area:
            area = cur
            best = np.array([a.min() * u + b.min() * v, a.max() * u + b.min() * v,
                             a.max() * u + b.max() * v, a.min() * u + b.max() * v])
    return best, float(area)


def _polygon_area(p: np.ndarray) -> float:
    y, x = p[:, 0], p[:, 1]
    return 0.5 * abs(float(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))))


#: A hull that fills at least this share of its smallest enclosing rectangle is a block's outline.
BLOCK_FILL = 0.9


def _hull_points(mat: np.ndarray) -> Optional[np.ndarray]:
    """The vertices of the convex hull of ``mat``'s pixel centres (y, x), or None when too few."""
    from scipy.spatial import ConvexHull, QhullError

    edge = mat & ~ndi.binary_erosion(mat)
    yy, xx = np.nonzero(edge)
    if yy.size < 3:
        return None
    pts = np.stack([yy, xx], axis=1).astype(float)
    try:
        return pts[ConvexHull(pts).vertices]
    except (QhullError, ValueError):
        return None


def _block_fill(mat: np.ndarray) -> float:
    """The share of its smallest enclosing rectangle that ``mat``'s hull fills (0: no hull, or the
    rectangle reaches the slice's edge: a sample cut by the field of view, not a block)."""
    hull = _hull_points(mat)
    if hull is None:
        return 0.0
    rect, area = _min_rectangle(hull)
    ny, nx = mat.shape
    if rect is None or not (rect[:, 0].min() >= 1 and rect[:, 1].min() >= 1 and rect[:, 0].max() <= ny - 2
                            and rect[:, 1].max() <= nx - 2):
        return 0.0
    return _polygon_area(hull) / area if area > 0 else 0.0


def _hull(mat: np.ndarray, fallback: np.ndarray, block: Optional[bool] = None) -> np.ndarray:
    """The pixels whose centre lies in the convex hull of ``mat``'s pixel centres, or in its smallest
    enclosing rectangle for a block (``block``; None: when the hull fills :data:`BLOCK_FILL` of the
    rectangle); ``fallback`` when there are too few pixels."""
    from skimage.draw import polygon as fill_polygon

    hull = _hull_points(mat)
    if hull is None:
        return fallback
    if block is None:
        block = _block_fill(mat) >= BLOCK_FILL
    poly = _min_rectangle(hull)[0] if block else hull
    rr, cc = fill_polygon(poly[:, 0], poly[:, 1], shape=mat.shape)
    plane = np.zeros(mat.shape, bool)
    plane[rr, cc] = True
    if not block:
        plane[tuple(hull.astype(int).T)] = True  # the hull's own vertices
    return plane
