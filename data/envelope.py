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
   air of the gap; where the sample touches the wall, the wall's inner surface, or further out where
   the grey values cross from the sample's level to a wall's of a clearly different grey).
3. The fit's spread (the robust standard deviation of the surface points about the cylinder, in
   voxels) says how well a cylinder describes the sample. A fit that spreads too much is restarted
   once from the circle most surface points agree on, a point outside it counting against it (a
   pore puts a false point inside the surface, never outside), and refitted on the points where
   that circle lies within the slice (a core wider than the slice, seen in its corners only, with
   pores cut by the slice's edge), or on those on the circle alone where enough of them are and few
   outside (:data:`~ctpore.data.circle_fit.ONE_SIDED_SHARE`: vugs open at the surface); kept where it
   then spreads as little as a cylinder may (:mod:`ctpore.data.circle_fit`). The core inside a wall
   is restarted so too where its points spread that much or more than
   :data:`~ctpore.data.circle_fit.ONE_SIDED_OUTSIDE` of them lie outside it by more than that. A
   block or a prism still fits badly, and a core sawn or broken along its axis leaves air beyond its
   face, a segment of the circle with a straight edge (:mod:`ctpore.data.face`): its outline is taken
   instead (:class:`~ctpore.data.outline.Outline`: slab by slab, the convex hull of the material, or
   the rectangle of a block).

Sectors whose profile never reaches air (the sample cut by the edge of the slice or by a circular
field of view) give no surface point: a core wider than the field of view keeps its cut faces. A
thin bright line in the air (a ring artefact about the rotation axis) is no surface; where every
sector's outermost rise is one, the fit looks past them for the next rise further in, and keeps
what it finds there when it sees the surface in half the sectors or more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ctpore.data.circle_fit import (CYLINDER_SPREAD, CYLINDER_SPREAD_REL, ONE_SIDED_OUTSIDE, circle_rounds, cut_sectors,
                                   cylinder_spread_limit, restart, robust_spread)
from ctpore.data.face import sawn
from ctpore.data.layer import POROUS_WALL_NOTE, wall_has_pores
from ctpore.data.outline import Outline
from ctpore.data.profiles import (BIN, PROFILE_PIXELS, Cylinder, SectorProfiles, fit_circle, otsu,
                                  pooled, smooth_masked, surface_points)
from ctpore.data.wall import fit_wall, inner_points

__all__ = ["CYLINDER_SPREAD", "CYLINDER_SPREAD_REL", "MAX_SLICES", "Cylinder", "Envelope",
           "cylinder_spread_limit", "cylinder_stray", "fit_envelope", "sample_slices", "smooth_masked"]

#: Slices read to fit the envelope (evenly spaced along Z).
MAX_SLICES = 16



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

    def note(self, start: str) -> Optional[str]:
        """The first of the fit's notes that begins with ``start``, or None."""
        return next((n for n in self.notes if n.startswith(start)), None)


def sample_slices(nz: int, max_slices: int = MAX_SLICES) -> np.ndarray:
    """Indices of the slices the fit reads: evenly spaced, the first and last 5% left out (a core's
    ends are often cut or damaged)."""
    lo, hi = int(round(0.05 * (nz - 1))), int(round(0.95 * (nz - 1)))
    return np.unique(np.linspace(lo, hi, min(nz, max_slices)).round().astype(int))


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

    def outer_points(past_lines: bool):
        return lambda prof, c: surface_points(prof, c, z_ref, air, rise, BIN, past_lines=past_lines)

    outer = outer_points(False)
    fitted, res, prof, n_sectors = circle_rounds(slices, valid, zs, spacing, cyl, r_max, outer)
    if fitted is None:  # every sector's outermost rise a thin bright line (ring artefacts): look past them,
        outer = outer_points(True)  # kept where the surface is then seen all round (not pores at a cut border)
        fitted, res, prof, n_sectors = circle_rounds(slices, valid, zs, spacing, cyl, r_max, outer)
        fitted = fitted if len(res) >= 0.5 * n_sectors else None
    if fitted is None:
        return Envelope("none", levels=levels, sectors=n_sectors,
                        notes=["no sector shows air outside the material"])
    spread = robust_spread(res) / px
    cylinder_like = spread <= cylinder_spread_limit(fitted.radius_mm, px)
    counts = None  # (surface points, sectors, cut sectors)
    restarted = None if cylinder_like else restart(slices, valid, zs, spacing, fitted, r_max, outer,
                                                  0.5 * (air + material))
    if restarted is not None:  # restarted from the circle most surface points agree on
        fitted, res, prof, n_sectors, counts = restarted
        cylinder_like = True
    tilted = _drift(slices, valid, zs, spacing, fitted, r_max, n_sectors, air, rise) if cylinder_like else fitted
    if tilted is not fitted:  # refit about the drifting axis
        again, res2, prof2, n2 = circle_rounds(slices, valid, zs, spacing, tilted, r_max, outer, rounds=2)
        if again is not None and robust_spread(res2) <= robust_spread(res):  # the tilt kept only where it fits better
            fitted, res, prof, n_sectors, counts = again, res2, prof2, n2, None
    if counts is None:
        _, have = outer(prof, fitted)
        counts = (len(res), n_sectors, cut_sectors(prof, set(have.tolist()), 0.5 * (air + material)))
    env = Envelope("cylinder", cylinder=fitted, levels=levels, sectors=counts[1], points=int(counts[0]),
                   cut=counts[2])
    # a wall is a tube: looked for only when the outermost surface is a cylinder
    wall_prof = SectorProfiles(slices, valid, zs, spacing, fitted, min(n_sectors, 32), r_max) if cylinder_like else None
    wall = fit_wall(wall_prof, fitted, air, env.notes) if cylinder_like else None
    if wall is not None and wall_has_pores(wall, slices, valid, zs, spacing, air):  # the sample's own material
        env.notes.append(POROUS_WALL_NOTE)
        wall = None
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
        held = None
        sample, res, prof, n_sectors = circle_rounds(slices, valid, zs, spacing, start, r_max, inner)
        if sample is None:
            env.notes.append("a wall was found but not the sample inside it")
            sample, res = start, np.zeros(0)
        else:
            lim = cylinder_spread_limit(sample.radius_mm, px) * px
            if robust_spread(res) > lim or np.sum(res > lim) > ONE_SIDED_OUTSIDE * len(res):
                restarted = restart(slices, valid, zs, spacing, sample, r_max, inner, 0.5 * (air + inner_material))
                if restarted is not None:  # pores open at the surface pulled the fit inwards
                    sample, res, prof, n_sectors, held = restarted
            cy, cx = sample.centre_at(z_ref)  # the wall begins where the sample ends, where it touches the wall
            wy, wx = fitted.centre_at(z_ref)
            reach = sample.radius_mm + math.hypot(cy - wy, cx - wx)
            if reach > wall["r_in"]:
                wall = {**wall, "r_in": reach, "thickness_mm": wall["r_out"] - reach}
        env.cylinder, env.wall, env.points, env.sectors = sample, wall, int(len(res)), n_sectors
        if held is not None:
            env.points, env.sectors = int(held[0]), int(held[1])
    env.spread_vox = robust_spread(res) / px if res.size else float("nan")
    limit = cylinder_spread_limit(fitted.radius_mm, px)
    face = sawn(slices, valid, zs, spacing, fitted, n_sectors, r_max, outer, rise, limit * px) if (
        env.wall is None and cylinder_like) else None  # a core sawn or broken along its axis
    if face is not None:
        env.notes.append(face)
    if env.wall is None and (face is not None or not env.spread_vox <= limit):
        # not a cylinder: the outline of each slab (a block, a prism)
        k = int(np.clip(2 * np.pi * fitted.radius_mm / (4.0 * px), 64, 360))
        env.kind = "outline"
        env.outline = Outline(fitted, k, air, rise, material)
    return env


def cylinder_stray(slices, valid, env: Envelope, spacing) -> float:
    """The share of material (brighter than halfway between the air and the material) in a band 2 to
    8 pixels of the fit's grid (``spacing``: every ``step``-th voxel of a large slice) outside a fitted
    cylinder (and its wall): near 0 when the cylinder is the sample's surface, large when it cuts
    through the sample."""
    c = env.wall["outer"] if env.wall is not None else env.cylinder
    px = min(spacing[1], spacing[2])
    half = 0.5 * (env.levels["air"] + env.levels["material"])
    hit = tot = 0
    for sl, ok, z in zip(slices, valid, env.zs):
        ny, nx = sl.shape
        band = c.inside(float(z), (ny, nx), spacing[1:], shrink_mm=-8 * px) & ~c.inside(
            float(z), (ny, nx), spacing[1:], shrink_mm=-2 * px)
        if ok is not None:
            band &= ok
        g = smooth_masked(sl, ok)
        hit += int(np.count_nonzero(band & (g > half)))
        tot += int(np.count_nonzero(band))
    return hit / tot if tot else 0.0
