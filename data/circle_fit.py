"""Circles fitted to a core's surface points, round by round, and a fit that does not hold together
restarted.

:func:`circle_rounds` refits a cylinder from sector profiles about its current centre (the points
a ``points_fn`` reads off them, a robust least-squares circle). A least-squares fit follows its
start: where false surface points are many and all on one side (pores open at the surface, a core
wider than the slice seen in its corners only, with pores cut by the slice's edge) it settles
between them and the true ones. :func:`restart` starts again from the circle most points agree on
(a point outside it counting against it: a pore puts a false point inside the surface, never
outside) and keeps what then holds together as a cylinder. Used for a core in air and for the core
found inside a container's wall alike (:func:`ctpore.data.envelope.fit_envelope`).
"""

from __future__ import annotations

import numpy as np

from ctpore.data.profiles import BIN, Cylinder, SectorProfiles, consensus_circle, fit_circle

__all__ = ["CYLINDER_SPREAD", "CYLINDER_SPREAD_REL", "ONE_SIDED_OUTSIDE", "ONE_SIDED_SHARE", "RESTART_PHASES",
           "circle_rounds", "cut_sectors", "cylinder_spread_limit", "radial_offsets", "restart", "robust_spread",
           "sector_count"]

#: A cylinder describes the sample when its surface points spread about it by at most this many
#: voxels, or this share of its radius (whichever is more); else the outline is taken.
CYLINDER_SPREAD, CYLINDER_SPREAD_REL = 1.5, 0.02


def cylinder_spread_limit(radius_mm: float, px: float) -> float:
    """The most a cylinder's surface points may spread about it (voxels) for it to describe a sample
    of radius ``radius_mm`` (``px``: the in-plane voxel, mm)."""
    return max(CYLINDER_SPREAD, CYLINDER_SPREAD_REL * radius_mm / px)

#: A sector is about this many voxels of arc at the sample's surface (between 24 and 180 sectors).
_ARC = 8.0

#: A fit that does not hold together is restarted with the points of the sectors turned by this many
#: phases (a quarter of a sector apart for 4): a core wider than the field of view shows air in its
#: corners only, in a few sectors each.
RESTART_PHASES = 4

#: A restart whose refit spreads too much is kept on the points on its surface alone when they are at
#: least the first share of the points and at most the second lie outside it (pores open at the surface).
ONE_SIDED_SHARE, ONE_SIDED_OUTSIDE = 0.5, 0.02


def sector_count(radius_mm: float, px: float) -> int:
    """Sectors of about :data:`_ARC` voxels of arc at ``radius_mm`` (between 24 and 180)."""
    return int(np.clip(2 * np.pi * radius_mm / (_ARC * px), 24, 180))


def circle_rounds(slices, valid, zs, spacing, cyl: Cylinder, r_max: float, points_fn, rounds: int = 3,
                   phases: tuple = (0.0,)):
    """Refit ``cyl`` from sector profiles about its current centre, ``rounds`` times (the points of
    the sectors of every one of ``phases`` together); returns (cylinder, residuals in mm, the last
    profiles of the first phase, number of sectors)."""
    px = min(spacing[1], spacing[2])
    res = np.zeros(0)
    prof = None
    n_sectors = 24
    for _ in range(rounds):
        n_sectors = sector_count(cyl.radius_mm, px)
        profs = [SectorProfiles(slices, valid, zs, spacing, cyl, n_sectors, r_max, phase) for phase in phases]
        prof = profs[0]
        pts = np.concatenate([points_fn(q, cyl)[0] for q in profs])
        if len(pts) < 6:
            return None, res, prof, n_sectors
        c = cyl.centre_at(cyl.z_ref)
        (cy, cx, r), res = fit_circle(pts, (c[0], c[1], cyl.radius_mm))
        if not (r > 0 and np.isfinite(r)):
            return None, res, prof, n_sectors
        cyl = Cylinder((float(cy), float(cx)), cyl.drift_mm, float(r), cyl.z_ref)
    return cyl, res, prof, n_sectors


def restart(slices, valid, zs, spacing, fitted: Cylinder, r_max: float, points_fn, level: float):
    """A fit that does not hold together, restarted from the circle most of its surface points agree on
    (:func:`~ctpore.data.profiles.consensus_circle`, within the spread a cylinder may have, a point
    outside it counting against it): false points all on one side (a core wider than the slice, seen
    in its corners only, with pores cut by the slice's edge) pull a least-squares fit between them and
    the true ones. Refitted from there on the points where the circle itself lies within the slice:
    where it lies beyond the slice's edge, the air a sector shows is a pore cut by the edge, not the
    outside; else on the points on that circle alone (:func:`_one_sided`). Kept only where it then
    spreads as little as a cylinder may: returns (cylinder,
    residuals, the first phase's profiles, sectors per phase, (surface points, sectors, cut sectors)
    over every phase), or None."""
    px = min(spacing[1], spacing[2])
    phases = tuple(i / RESTART_PHASES for i in range(RESTART_PHASES))
    n = sector_count(fitted.radius_mm, px)
    pts = np.concatenate([points_fn(SectorProfiles(slices, valid, zs, spacing, fitted, n, r_max, phase), fitted)[0]
                          for phase in phases])
    circle = consensus_circle(pts, cylinder_spread_limit(fitted.radius_mm, px) * px)
    if circle is None:
        return None
    start = Cylinder((circle[0], circle[1]), fitted.drift_mm, circle[2], fitted.z_ref)
    ny, nx = slices[0].shape

    def within(c, th):  # whether the circle at angles th lies within the slice
        cy, cx = c.centre_at(c.z_ref)
        on_y, on_x = cy + c.radius_mm * np.sin(th), cx + c.radius_mm * np.cos(th)
        return (on_y >= 0) & (on_y <= (ny - 1) * spacing[1]) & (on_x >= 0) & (on_x <= (nx - 1) * spacing[2])

    def seen(prof2, c):  # the points where the circle itself lies within the slice
        pts2, ks = points_fn(prof2, c)
        cy, cx = c.centre_at(c.z_ref)
        keep = within(c, np.arctan2(pts2[:, 0] - cy, pts2[:, 1] - cx))
        return pts2[keep], ks[keep]

    again, res, prof, n2 = circle_rounds(slices, valid, zs, spacing, start, r_max, seen, rounds=2, phases=phases)
    one_sided = again is None or not robust_spread(res) / px <= cylinder_spread_limit(again.radius_mm, px)
    if one_sided:
        again, res, prof, n2 = _one_sided(slices, valid, zs, spacing, start, r_max, seen, phases)
        if again is None:
            return None
    qs = [SectorProfiles(slices, valid, zs, spacing, again, n2, r_max, phase) for phase in phases]
    shown = [seen(q, again) for q in qs]
    if one_sided:  # enough points on the circle, few outside it (material beyond a surface)
        d = radial_offsets(np.concatenate([p for p, _ in shown]), again)
        tol = cylinder_spread_limit(again.radius_mm, px) * px
        if np.sum(np.abs(d) <= tol) < ONE_SIDED_SHARE * len(d) or np.sum(d > tol) > ONE_SIDED_OUTSIDE * len(d):
            return None
    cut = 0  # a sector whose circle lies beyond the slice's edge is cut there
    for q, (_, ks) in zip(qs, shown):
        have = set(ks.tolist())
        beyond = set(np.flatnonzero(~within(again, q.angle(np.arange(n2)))).tolist()) - have
        cut += len(beyond) + cut_sectors(q, have | beyond, level)
    return again, res, prof, n2, (len(res), n2 * len(phases), cut)


def _one_sided(slices, valid, zs, spacing, start: Cylinder, r_max: float, seen, phases):
    """The surface the consensus circle ``start`` stands for, where pores open at it put many points
    inside it (a vug, a vesicle cut by the surface through every slice read): refitted on the points
    within the spread a cylinder may have of it (``seen``'s points, two rounds); ``circle_rounds``'
    answer where at least 6 such points spread as little as a cylinder may, else Nones. The caller
    keeps it where those, and the points outside it, meet :data:`ONE_SIDED_SHARE` and ``ONE_SIDED_OUTSIDE``."""
    px = min(spacing[1], spacing[2])

    def on_surface(prof2, c):
        pts, ks = seen(prof2, c)
        near = np.abs(radial_offsets(pts, c)) <= cylinder_spread_limit(c.radius_mm, px) * px
        return pts[near], ks[near]

    again, res, prof, n2 = circle_rounds(slices, valid, zs, spacing, start, r_max, on_surface, rounds=2, phases=phases)
    if again is None or len(res) < 6 or not robust_spread(res) <= cylinder_spread_limit(again.radius_mm, px) * px:
        return None, None, None, None
    return again, res, prof, n2


def radial_offsets(pts: np.ndarray, c: Cylinder) -> np.ndarray:
    """How far the points (y, x, mm) lie outside ``c``'s circle at its reference depth (< 0: inside)."""
    cy, cx = c.centre_at(c.z_ref)
    return np.hypot(pts[:, 0] - cy, pts[:, 1] - cx) - c.radius_mm


def robust_spread(res: np.ndarray) -> float:
    """The robust spread of fit residuals (1.4826 times their median absolute deviation)."""
    return 1.4826 * float(np.median(np.abs(res - np.median(res)))) if res.size else float("inf")


def cut_sectors(prof: SectorProfiles, have, level: float) -> int:
    """Sectors without a surface point whose material reaches the slice's edge (the last three voxels
    they cover are brighter than ``level``): the sample is cut there, not unseen."""
    last = max(2, int(round(3.0 / BIN)))
    n = 0
    for k in range(prof.n_sectors):
        cov = np.nonzero(prof.covered[k])[0]
        if k not in have and cov.size >= last and np.all(prof.mean[k, cov[-last:]] > level):
            n += 1
    return n
