"""The sample found by its shape: a cylinder fitted to a core's surface, or the outline of a block.

An air outside is as dark as a dry sample's pores, so no grey value tells them apart; the sample's
shape does. The solid frame is never confused with air, and the sample is that frame and what it
encloses. :func:`fit_envelope` reads a few slices spread along Z and looks at them around the
sample's axis, in sectors (wedges) of the slice plane, averaged over the slices: each sector's
mean grey value against the distance from the axis is a clean profile (the noise averages out, the
pores of a thin shell average to the material's mean), in which the outermost rise from the air's
level is the sample's surface. A cylinder (centre, radius; a tilt as the centre's drift along Z) is
fitted to those points, robustly, in mm (an anisotropic voxel is no trouble):

1. A first centre and radius from the material's centroid and area, then three rounds of sector
   profiles and fits; the axis' drift from four groups of the slices, when it moves the axis by
   half a voxel or more over the stack.
2. A container wall (:func:`ctpore.data.wall.fit_wall`): the outermost layer is a wall when a
   blurred annulus of its own grey level and texture, around a core that may sit off its axis,
   explains the sector profiles far better than the core alone. The wall and what lies within it
   up to the sample (an air gap) are outside; the sample's surface is then found inside the wall,
   sector by sector, with the wall's blurred slab taken off the profiles (the first rise from the
   air of the gap, or the wall's inner surface where the sample touches it).
3. The fit's spread (the robust standard deviation of the surface points about the cylinder, in
   voxels) says how well a cylinder describes the sample; a block or a prism fits badly, and its
   outline is taken instead (:class:`Outline`: slab by slab, the convex hull of the material, or
   the rectangle of a block).

Sectors whose profile never reaches air (the sample cut by the edge of the slice or by a circular
field of view) give no surface point: a core wider than the field of view keeps its cut faces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np
from scipy import ndimage as ndi

from ctpore.data.profiles import (BIN, PROFILE_PIXELS, Cylinder, SectorProfiles, fit_circle, otsu, pooled,
                                  smooth_masked, surface_points)
from ctpore.data.wall import fit_wall, inner_points

__all__ = ["CYLINDER_SPREAD", "CYLINDER_SPREAD_REL", "MAX_SLICES", "Cylinder", "Envelope", "Outline",
           "fit_envelope", "sample_slices", "smooth_masked"]

#: Slices read to fit the envelope (evenly spaced along Z).
MAX_SLICES = 16

#: A cylinder describes the sample when its surface points spread about it by at most this many
#: voxels, or this share of its radius (whichever is more); else the outline is taken.
CYLINDER_SPREAD, CYLINDER_SPREAD_REL = 1.5, 0.02

#: A sector is about this many voxels of arc at the sample's surface (between 24 and 180 sectors).
_ARC = 8.0


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
        the hulls of at least half of them fill :data:`BLOCK_FILL` of their smallest rectangle."""
        votes = []
        half = 0.5 * (self.air + self.material)
        for sl, v in zip(slices, valid):
            gate, _ = self._gate(sl[None], [v])
            m = (smooth_masked(sl, v) > half) & gate
            votes.append(_block_fill(ndi.binary_opening(m if v is None else m & v)))
        return replace(self, block=bool(np.mean([f >= BLOCK_FILL for f in votes]) >= 0.5) if votes else None)

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


@dataclass
class Envelope:
    """What :func:`fit_envelope` found.

    Attributes
    ----------
    kind : {"cylinder", "outline", "none"}
        ``none``: no outside (the material reaches the border everywhere).
    cylinder : Cylinder or None
        The sample's cylinder (``kind == "cylinder"``; for ``outline`` the axis its sectors turn about).
    outline : Outline or None
        How the outline of each slab is found (``kind == "outline"``).
    wall : dict or None
        A container wall: its outer cylinder and thickness (mm), grey level.
    spread_vox : float
        Robust spread of the surface points about the fitted cylinder (voxels).
    points : int
        Surface points (sectors) the fit used, of ``sectors``.
    cut : int
        Sectors with no surface point because the material reaches the slice's edge there (a
        sample cut by the field of view).
    levels : dict
        ``air``, ``noise`` (the air's standard deviation), ``material`` (the bright phase's mean),
        ``threshold`` (between them).
    """

    kind: str
    cylinder: Optional[Cylinder] = None
    outline: Optional[Outline] = None
    wall: Optional[dict] = None
    spread_vox: float = float("nan")
    points: int = 0
    sectors: int = 0
    levels: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    zs: tuple = ()
    cut: int = 0


def sample_slices(nz: int, max_slices: int = MAX_SLICES) -> np.ndarray:
    """Indices of the slices the fit reads: evenly spaced, the first and last 5% left out (a core's
    ends are often cut or damaged)."""
    lo, hi = int(round(0.05 * (nz - 1))), int(round(0.95 * (nz - 1)))
    return np.unique(np.linspace(lo, hi, min(nz, max_slices)).round().astype(int))


def _circle_rounds(slices, valid, zs, spacing, cyl: Cylinder, r_max: float, points_fn, rounds: int = 3):
    """Refit ``cyl`` from sector profiles about its current centre, ``rounds`` times; returns
    (cylinder, residuals in mm, the last profiles, number of sectors)."""
    px = min(spacing[1], spacing[2])
    res = np.zeros(0)
    prof = None
    n_sectors = 24
    for _ in range(rounds):
        n_sectors = int(np.clip(2 * np.pi * cyl.radius_mm / (_ARC * px), 24, 180))
        prof = SectorProfiles(slices, valid, zs, spacing, cyl, n_sectors, r_max)
        pts, _ = points_fn(prof, cyl)
        if len(pts) < 6:
            return None, res, prof, n_sectors
        c = cyl.centre_at(cyl.z_ref)
        (cy, cx, r), res = fit_circle(pts, (c[0], c[1], cyl.radius_mm))
        if not (r > 0 and np.isfinite(r)):
            return None, res, prof, n_sectors
        cyl = Cylinder((float(cy), float(cx)), cyl.drift_mm, float(r), cyl.z_ref)
    return cyl, res, prof, n_sectors


def _drift(slices, valid, zs, spacing, cyl: Cylinder, r_max: float, n_sectors: int, air: float,
           rise: float) -> Cylinder:
    """``cyl`` with its axis' drift along Z (a tilted core): the centres fitted to four groups of the
    slices, on a straight line through them (least squares). Unchanged with fewer than 8 slices,
    when a group shows too few surface points, or when the drift moves the axis by less than half a
    voxel over the whole stack."""
    if len(zs) < 8:
        return cyl
    zc, cs = [], []
    for g in np.array_split(np.arange(len(zs)), 4):
        sub = [slices[i] for i in g]
        prof = SectorProfiles(sub, [valid[i] for i in g], [zs[i] for i in g], spacing, cyl, n_sectors, r_max)
        z = float(np.mean([zs[i] for i in g]))
        pts, _ = surface_points(prof, cyl, z, air, rise, BIN)
        if len(pts) < 6:
            return cyl
        c = cyl.centre_at(z)
        (cy, cx, _), _ = fit_circle(pts, (c[0], c[1], cyl.radius_mm))
        zc.append(z)
        cs.append((cy, cx))
    zc, cs = np.array(zc), np.array(cs)
    slope = [float(np.polyfit(zc, cs[:, i], 1)[0]) for i in (0, 1)]
    height = (max(zs) - min(zs)) / 0.9 + 1  # the stack's slices (the fit's span is 90% of them)
    if math.hypot(*slope) * height < 0.5 * min(spacing[1], spacing[2]):
        return cyl  # no tilt worth a voxel over the whole stack: the axis stands straight
    centre = [float(np.mean(cs[:, i]) + slope[i] * (cyl.z_ref - np.mean(zc))) for i in (0, 1)]
    return Cylinder(tuple(centre), tuple(slope), cyl.radius_mm, cyl.z_ref)


def _cut_sectors(prof: SectorProfiles, have, level: float) -> int:
    """Sectors without a surface point whose material reaches the slice's edge (the last three voxels
    they cover are brighter than ``level``): the sample is cut there, not unseen."""
    last = max(2, int(round(3.0 / BIN)))
    n = 0
    for k in range(prof.n_sectors):
        cov = np.nonzero(prof.covered[k])[0]
        if k not in have and cov.size >= last and np.all(prof.mean[k, cov[-last:]] > level):
            n += 1
    return n


def fit_envelope(slices, zs, spacing_mm, valid=None) -> Envelope:
    """Find the sample in a few slices of a scan (see the module docstring).

    Parameters
    ----------
    slices : list of ndarray
        float32 ``(Y, X)`` slices, at the indices ``zs``.
    zs : sequence of int
    spacing_mm : tuple of float
        (z, y, x).
    valid : list of ndarray or None, optional
        Bool ``(Y, X)`` per slice: False where the scan holds no data (a field of view's constant
        outside), left out of every statistic.
    """
    env = _fit(slices, zs, spacing_mm, valid)
    env.zs = tuple(int(z) for z in zs)
    return env


def _fit(slices, zs, spacing_mm, valid) -> Envelope:
    spacing = tuple(float(s) for s in spacing_mm)
    px = min(spacing[1], spacing[2])
    valid = valid if valid is not None else [None] * len(slices)
    # grey levels and the first centre from the slices on a grid of every `step`-th pixel (smoothed there)
    step = max(1, int(round(math.sqrt(slices[0].size / PROFILE_PIXELS))))
    sub = [None if ok is None else ok[::step, ::step] for ok in valid]
    smooth = [smooth_masked(s[::step, ::step], ok) for s, ok in zip(slices, sub)]
    values = np.concatenate([(g if ok is None else g[ok]).ravel() for g, ok in zip(smooth, sub)])
    if values.size < 100 or np.ptp(values) == 0:
        return Envelope("none", notes=["too few grey values to judge"])
    t = otsu(values)
    dark = values[values <= t]
    air = float(np.median(dark))  # the air (and a dry sample's pores): the darker of Otsu's two classes
    noise = float(1.4826 * np.median(np.abs(dark - air)))
    material = float(np.mean(values[values > t]))
    levels = {"air": air, "noise": noise, "material": material, "threshold": t}
    if not material - air > 1.5 * noise:
        return Envelope("none", levels=levels, notes=["no contrast between air and material"])
    # the first centre and radius: the material's centroid and area
    ny, nx = slices[0].shape
    cys, cxs, area = [], [], []
    for g, ok in zip(smooth, sub):
        m = g > t if ok is None else (g > t) & ok
        if m.any():
            yy, xx = np.nonzero(m)
            cys.append(yy.mean() * step * spacing[1])
            cxs.append(xx.mean() * step * spacing[2])
            area.append(m.sum() * step * step * spacing[1] * spacing[2])
    if not area:
        return Envelope("none", levels=levels, notes=["no material"])
    z_ref = float(np.mean(zs))
    cyl = Cylinder((float(np.median(cys)), float(np.median(cxs))), (0.0, 0.0),
                   float(np.sqrt(np.median(area) / np.pi)), z_ref)
    corners = np.array([[0, 0], [0, (nx - 1) * spacing[2]], [(ny - 1) * spacing[1], 0],
                        [(ny - 1) * spacing[1], (nx - 1) * spacing[2]]])
    r_max = float(np.max(np.hypot(corners[:, 0] - cyl.centre_mm[0], corners[:, 1] - cyl.centre_mm[1]))) + 4 * px
    rise = air + 0.25 * (material - air)

    def outer(prof, c):
        return surface_points(prof, c, z_ref, air, rise, BIN)

    fitted, res, prof, n_sectors = _circle_rounds(slices, valid, zs, spacing, cyl, r_max, outer)
    if fitted is None:
        return Envelope("none", levels=levels, sectors=n_sectors,
                        notes=["no sector shows air outside the material"])
    spread = 1.4826 * float(np.median(np.abs(res - np.median(res)))) / px
    cylinder_like = spread <= max(CYLINDER_SPREAD, CYLINDER_SPREAD_REL * fitted.radius_mm / px)
    tilted = _drift(slices, valid, zs, spacing, fitted, r_max, n_sectors, air, rise) if cylinder_like else fitted
    if tilted is not fitted:  # refit about the drifting axis
        again, res2, prof2, n2 = _circle_rounds(slices, valid, zs, spacing, tilted, r_max, outer, rounds=2)
        if again is not None:
            fitted, res, prof, n_sectors = again, res2, prof2, n2
    _, have = outer(prof, fitted)
    env = Envelope("cylinder", cylinder=fitted, levels=levels, sectors=n_sectors, points=int(len(res)),
                   cut=_cut_sectors(prof, set(have.tolist()), 0.5 * (air + material)))
    # a wall is a tube: looked for only when the outermost surface is a cylinder
    wall_prof = SectorProfiles(slices, valid, zs, spacing, fitted, min(n_sectors, 32), r_max) if cylinder_like else None
    wall = fit_wall(wall_prof, fitted, air) if cylinder_like else None
    if wall is not None:
        r_in = wall["r_in"]
        inner_material = material  # the sample's bright phase, not the wall's
        _, mean_in, _ = pooled(prof)
        inside = [b for b in range(prof.nb) if prof.radius(b) < 0.8 * r_in and np.isfinite(mean_in[b])]
        if inside:
            inner_material = float(np.median(mean_in[inside]))

        def inner(prof2, c):
            # the wall is fixed (concentric with the outer fit): profiles about the sample's own centre
            return inner_points(prof2, c, wall, air, inner_material)

        start = Cylinder(fitted.centre_mm, fitted.drift_mm, r_in, z_ref)
        sample, res, prof, n_sectors = _circle_rounds(slices, valid, zs, spacing, start, r_max, inner)
        if sample is None:
            env.notes.append("a wall was found but not the sample inside it")
            sample, res = start, np.zeros(0)
        env.cylinder, env.wall, env.points, env.sectors = sample, wall, int(len(res)), n_sectors
    mad = 1.4826 * float(np.median(np.abs(res - np.median(res)))) if res.size else float("nan")
    env.spread_vox = mad / px
    if env.wall is None and not env.spread_vox <= max(CYLINDER_SPREAD, CYLINDER_SPREAD_REL * fitted.radius_mm / px):
        # not a cylinder: the outline of each slab (a block, a prism)
        k = int(np.clip(2 * np.pi * fitted.radius_mm / (4.0 * px), 64, 360))
        env.kind = "outline"
        env.outline = Outline(fitted, k, air, rise, material)
    return env
