"""A core sawn or broken along its axis: its round side fits a cylinder, and the fit must not take the
air beyond its flat face for sample. Two signs tell such a face (:func:`sawn`):

- The air beyond it (:func:`air_face`). Inside the circle fitted to the round side, the face leaves
  a region of air open at the circle: the segment of the circle that the face cuts off, wherever the
  face lies (through the axis, short of it or past it). A vug or vesicle open at the surface leaves
  one too, and its far wall can be straight over a stretch; but its air is no segment of the circle.
  The slices the fit reads are averaged (a pore's far wall moves along the axis, a face stays where
  it is), the largest regions of air open at the circle are taken, a straight line is fitted to the
  boundary between each and the material, and it is a face where that boundary lies on the line and
  the region is the segment the line cuts off the circle.
- The surface points (:func:`flat_face`): a straight run of them inside the circle that stays where
  it is in four groups of the slices read.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
from scipy import ndimage as ndi

from ctpore.data.profiles import PROFILE_PIXELS, Cylinder, SectorProfiles, smooth_masked

__all__ = ["FACE_NOTE", "FACE_SHRINK", "FACE_SPAN_DEG", "SEGMENT_IOU", "air_face", "flat_face", "sawn", "straight_run"]


#: A face spans at least this many degrees about the circle's centre: the boundary of the air beyond it
#: (:func:`air_face`), or a run of surface points inside the circle on a straight line that reaches some
#: depths deeper than others and stays put along the axis (:func:`flat_face`). (A chord of 40 degrees
#: lies 6% of the radius inside the circle at its middle.)
FACE_SPAN_DEG = 40.0

#: The air region is its segment of the circle (the pixels beyond its boundary's best line) to at
#: least this IoU. On synthetic development cores, sawn or broken ones whose face was straight gave 0.86
#: to 1.0 (pores open on the face lower it), vesicles and vugs open at the surface 0.83 at most.
SEGMENT_IOU = 0.9

#: How the fit's note begins when a cylinder was a core sawn or broken along its axis (``describe`` says it).
FACE_NOTE = "a core sawn or broken along its axis, its round side a cylinder"

#: Voxels kept off the fitted circle: its blurred surface is neither air nor material.
FACE_SHRINK = 3


def _mean_inside(slices, valid, zs, spacing, c: Cylinder) -> tuple[np.ndarray, np.ndarray, tuple]:
    """The read slices' mean (each smoothed by a pixel) on a grid of every n-th pixel of a large slice
    (as the profiles read it), where every slice has it valid and inside ``c`` less
    :data:`FACE_SHRINK` voxels; that mask; the grid's spacing (mm)."""
    stride = max(1, int(round(math.sqrt(slices[0].size / PROFILE_PIXELS))))
    sp = (spacing[1] * stride, spacing[2] * stride)
    shrink = FACE_SHRINK * min(spacing[1], spacing[2])
    acc = cnt = None
    for sl, ok, z in zip(slices, valid, zs):
        ok = None if ok is None else ok[::stride, ::stride]
        g = smooth_masked(sl[::stride, ::stride], ok)
        m = c.inside(float(z), g.shape, sp, shrink_mm=shrink)
        if ok is not None:
            m &= ok
        if acc is None:
            acc, cnt = np.zeros(g.shape), np.zeros(g.shape, np.int32)
        acc += np.where(m, g, 0.0)
        cnt += m
    inner = cnt == len(slices)
    return np.where(inner, acc / np.maximum(cnt, 1), np.inf), inner, sp


def air_face(slices, valid, zs, spacing, c: Cylinder, rise: float, tol: float) -> Optional[dict]:
    """The air beyond a flat face inside ``c`` (fitted to a core's round side), or None.

    On the mean of the read slices (:func:`_mean_inside`), the air (below ``rise``) inside ``c`` is
    split into regions; each of the three largest that is open at the circle is tried. The boundary
    between it and the material, deeper than a grid pixel past the circle's blurred rim, is fitted
    with a straight line (least squares, twice refitted on its nearest three in four). It is a face
    when three in four of its pixels lie within ``2 * tol`` of the line (``tol``: the most a
    cylinder's surface points may spread, mm), it spans :data:`FACE_SPAN_DEG` or more about the axis,
    its depths differ by ``2 * tol`` or more (a band at one depth is a circle fitted a little off),
    and the region is the segment that line cuts off the circle to :data:`SEGMENT_IOU` or more.
    Returns the region's share of the circle (less its rim), the face's span (degrees) and the IoU."""
    if not slices:
        return None
    mean, inner, sp = _mean_inside(slices, valid, zs, spacing, c)
    if not inner.any():
        return None
    air = inner & (mean < rise)
    lab, n = ndi.label(air)
    if n == 0:
        return None
    cy, cx = c.centre_at(float(np.mean(zs)))
    y = np.arange(inner.shape[0])[:, None] * sp[0]
    x = np.arange(inner.shape[1])[None, :] * sp[1]
    depth = c.radius_mm - np.hypot(y - cy, x - cx)
    rim = FACE_SHRINK * min(spacing[1], spacing[2]) + 1.5 * max(sp)
    near_face = ndi.binary_dilation(inner & ~air)
    sizes = ndi.sum(air, lab, np.arange(1, n + 1))
    for j in np.argsort(-sizes, kind="stable")[:3] + 1:
        region = lab == j
        if not (region & (depth < rim)).any():  # not open at the circle: a pore inside
            continue
        edge = region & near_face & (depth >= rim)
        if np.count_nonzero(edge) < 6:
            continue
        ey, ex = np.nonzero(edge)
        q = np.stack([ey * sp[0], ex * sp[1]], axis=1)
        keep = np.ones(len(q), bool)
        for _ in range(2):
            mu = q[keep].mean(axis=0)
            normal = np.linalg.svd(q[keep] - mu, full_matrices=False)[2][-1]
            d = np.abs((q - mu) @ normal)
            keep = d <= np.percentile(d, 75)
        ang = np.sort(np.arctan2(q[:, 0] - cy, q[:, 1] - cx))
        span = math.degrees(2 * np.pi - np.max(np.diff(np.concatenate([ang, [ang[0] + 2 * np.pi]]))))
        ry, rx = np.nonzero(region)
        beyond = np.sign(np.mean((np.stack([ry * sp[0], rx * sp[1]], axis=1) - mu) @ normal))
        segment = inner & (((y - mu[0]) * normal[0] + (x - mu[1]) * normal[1]) * beyond > 0)
        iou = float(np.count_nonzero(segment & region) / np.count_nonzero(segment | region))
        if (np.mean(d <= 2 * tol) >= 0.75 and span >= FACE_SPAN_DEG and np.ptp(depth[edge]) >= 2 * tol
                and iou >= SEGMENT_IOU):
            return {"share": float(sizes[j - 1] / np.count_nonzero(inner)), "span_deg": span, "segment_iou": iou}
    return None


def straight_run(points: np.ndarray, depth: np.ndarray, centre: tuple[float, float], gap: float,
                 tol: float) -> Optional[np.ndarray]:
    """The indices of a run of the surface ``points`` (y, x) deeper than ``tol`` inside a circle about
    ``centre`` (``depth``: inside it, > 0) that may be a flat face, or None: in the order of their
    angle (neighbours at most ``gap`` radians apart), spanning :data:`FACE_SPAN_DEG` or more, their
    distances to their own best line of RMS at most ``tol``, and their depths differing by ``2 * tol``
    or more (a band at one depth is a circle fitted a little off). The far wall of a pore open at the
    surface can be as straight; it changes along the axis, a face does not."""
    depth = np.asarray(depth, float)
    inward = np.flatnonzero(depth > tol)
    if len(inward) < 3:
        return None
    ang = np.arctan2(points[inward, 0] - centre[0], points[inward, 1] - centre[1])
    order = np.argsort(ang)
    a, idx = ang[order], inward[order]
    n = len(a)
    ends = np.flatnonzero(np.diff(np.concatenate([a, [a[0] + 2 * np.pi]])) > gap)  # a run ends after each
    runs = [np.arange(n)] if not ends.size else []  # no gap: all round, one run
    for e0, e1 in zip(ends, np.roll(ends, -1)):
        runs.append((e0 + 1 + np.arange((e1 - e0 - 1) % n + 1)) % n)
    for run in runs:
        span = (a[run[-1]] - a[run[0]]) % (2 * np.pi)
        if len(run) < 3 or math.degrees(span) < FACE_SPAN_DEG or np.ptp(depth[idx[run]]) < 2 * tol:
            continue
        q = points[idx[run]]
        if float(np.linalg.svd(q - q.mean(axis=0), compute_uv=False)[-1]) / math.sqrt(len(run)) <= tol:
            return idx[run]
    return None


def flat_face(slices, valid, zs, spacing, c: Cylinder, prof: SectorProfiles, r_max: float, points_fn,
              tol: float) -> bool:
    """Whether the surface points inside ``c`` (``prof``'s, deeper than ``tol``: the most a cylinder's
    surface points may spread) hold a flat face along the axis (a core sawn in half, or broken),
    which a robust fit leaves out as it leaves out pores open at the surface: a straight run of them
    (:func:`straight_run`) that stays where it is in four groups of the slices (each group showing
    half the run's points or more over all, three in four of them within ``2 * tol``; a pore's far
    wall moves along the axis). With fewer than 8 slices that cannot be judged: no face.
    ``points_fn(prof, c)`` gives the surface points and their sectors."""
    if len(zs) < 8:
        return False
    cy, cx = c.centre_at(c.z_ref)

    def depths(q):
        pts, ks = points_fn(q, c)
        return pts, ks, c.radius_mm - np.hypot(pts[:, 0] - cy, pts[:, 1] - cx)

    pts, ks, d = depths(prof)
    run = straight_run(pts, d, (cy, cx), 2.01 * 2 * np.pi / prof.n_sectors, tol)  # (a sector may lack a point)
    if run is None:
        return False
    moved = []  # how far each point of the run moves in each group, where the group shows it
    for g in np.array_split(np.arange(len(zs)), 4):
        q = SectorProfiles([slices[i] for i in g], [valid[i] for i in g], [zs[i] for i in g], spacing, c,
                           prof.n_sectors, r_max, prof.phase)
        _, gk, gd = depths(q)
        at = dict(zip(gk.tolist(), gd.tolist()))
        moved += [abs(at[k] - dk) for k, dk in zip(ks[run].tolist(), d[run].tolist()) if k in at]
    return len(moved) >= 2 * len(run) and float(np.percentile(moved, 75)) <= 2 * tol


def sawn(slices, valid, zs, spacing, c: Cylinder, n_sectors: int, r_max: float, points_fn, rise: float,
         tol: float) -> Optional[str]:
    """Whether a cylinder ``c`` fitted to a core's round side is a core sawn or broken along its axis:
    the air beyond a face (:func:`air_face`), or a flat face among the surface points
    (:func:`flat_face`; looked for only where ``c`` lies within the slice: the slice's edge is a
    straight line that stays put too). Returns what was seen, in words (:data:`FACE_NOTE` first), or
    None."""
    air = air_face(slices, valid, zs, spacing, c, rise, tol)
    if air is not None:
        return (f"{FACE_NOTE}: air beyond a straight face over {air['span_deg']:.0f} degrees, "
                f"{100 * air['share']:.0f}% of the circle")
    (cy, cx), r = c.centre_at(c.z_ref), c.radius_mm
    ny, nx = slices[0].shape
    if min(cy, cx) < r or cy + r > (ny - 1) * spacing[1] or cx + r > (nx - 1) * spacing[2]:
        return None
    prof = SectorProfiles(slices, valid, zs, spacing, c, n_sectors, r_max)
    if flat_face(slices, valid, zs, spacing, c, prof, r_max, points_fn, tol):
        return f"{FACE_NOTE}: surface points on a straight line inside the circle, the same along the axis"
    return None
