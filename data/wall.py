"""A container wall around a core (a plastic or aluminium tube), and the core's surface inside it.

:func:`fit_wall` asks whether the outermost layer of a fitted outer surface is a wall: a blurred
annulus of its own grey level and texture, around a core that may sit off the wall's axis (it
touches the wall on one side, or an air gap runs between them). :func:`inner_points` then finds the
core's surface inside the wall, sector by sector, with the wall's blurred slab taken off the
profiles so that a gap of a few voxels is air again.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ctpore.data.profiles import BIN, Cylinder, SectorProfiles

__all__ = ["HELD_LEVEL", "LOSS", "OVERLAP", "STRONG_GAIN", "THIN_WALL_NOTE", "TOUCH_CONTRAST", "TOUCH_REACH",
           "blurred_step", "fit_wall", "inner_points"]

#: A sample touching its wall ends where the grey values cross from its level to the wall's, when the
#: two differ by at least this share of the sample's level above the air's ...
TOUCH_CONTRAST = 0.25
#: ... within this many voxels outside the wall's fitted inner surface.
TOUCH_REACH = 4.0

#: How the sample's texture variance falls across its blurred surface: its share of the surface's
#: blurred step to this power (2 for a texture much coarser than the blur, 1 for one much finer; the
#: pores of soil and rock are a few voxels across, near the blur's scale). On simulated cores touching
#: their tube (development scenes, 23 with a wall found), the fitted inner surface lay 0.17 voxel inside
#: the true one on average with 1, 0.12 outside it with 2 and 0.05 inside with 1.5.
TEXTURE_POWER = 1.5

#: A wall of gain under :data:`STRONG_GAIN` touching the sample at the sample's level is taken only
#: when it is clearly uniform: its texture's variance above the air's at most this share of the
#: sample's. On simulated scans (12 of each set-up), walls of gain under 25 had 0.27 at most where the
#: fit found the wall's thickness (0.30 in one more, of gain 4.8; later development scenes had 0.40 to
#: 0.54 at gains of 18 to 23, which :data:`STRONG_GAIN` takes); the outermost layer of a core with no
#: wall had 0.57 or more wherever the fit was otherwise a wall's (a core's outer layer holding half its
#: middle's pores, 0.57 to 0.64, passed a looser bound of 0.7 as a wall it touched: development scenes,
#: IoU 0.58-0.60).
CLEARLY_UNIFORM = 0.4

#: The gain at which a wall that differs from the sample needs no other evidence. Tubes the fit placed
#: right (thickness within a third of a voxel), touching the core at about its level, had gains of 18
#: to 23 and textures of 0.40 to 0.54 of the core's (development scenes, the tube counted as sample
#: under a bound of 25); cores' own outer layers that passed every other test had gains of 8 at most.
STRONG_GAIN = 12.0

#: A wall differs from the sample: apart from it, or in level by this many of the sample's scatters
#: between sectors, or in texture (the sample's variance above the wall's) by this many. On simulated
#: scans (12 of each set-up) every wall within 1.5 voxels of its sample differed from it by 0.37 or
#: more in level or by 0.43 or more in texture; the outer layer of a uniform core without pores, which
#: a wall of the core's own level and texture explains, by neither.
DISTINCT_LEVEL, DISTINCT_TEXTURE = 0.3, 0.2

#: How a fit's note begins when the outermost layer passed every test of a wall but its thickness,
#: fitted to the thinnest the fit allows (1.5 voxels, blurred more than it is thick): such a layer is
#: not taken, and the sample is said to be uncertain (development and held-out scenes: bright tubes
#: around cores of large pores, the tube counted as sample, IoU 0.80 to 0.85).
THIN_WALL_NOTE = "a layer at the surface that a container wall explains, fitted at the thinnest wall"

#: How far (voxels) the sample's disc may reach into its wall in the free fit before the fit is made
#: again with the disc held inside the wall. Where the two overlap their levels add, and can explain a
#: core's edge brightened by beam-hardening cupping as wall (a development scene: a wall fitted 8.4
#: voxels thick against 5.2, the core ending 2 to 3 voxels short).
OVERLAP = 0.5

#: ... where the free fit's disc reaches in by more than :data:`OVERLAP` but within the blur of the
#: sample's surface (or 1.5 voxels), the held fit is taken only if it changes the wall's level by at
#: most this share and keeps within its thickness limits: holding the disc inside moves the wall's
#: inner surface; a held fit needing a brighter or darker wall explains something else (a core pressed
#: on a tube much darker than itself, its held fit a ring 1.5 voxels thick at twice the level).
HELD_LEVEL = 0.2

#: The fits' loss: robust, so that the sectors where a large pore opens at the sample's surface do not
#: outweigh the wall seen in all the others (residuals are in units of the sample's own scatter).
LOSS = "soft_l1"


def blurred_step(r, level, edge, sigma):
    """A blurred step: ``level`` inside ``edge`` (smaller radii), 0 outside."""
    from scipy.special import ndtr

    return level * ndtr((edge - r) / sigma)


def fit_wall(prof: SectorProfiles, cyl: Cylinder, air: float, notes: Optional[list] = None) -> Optional[dict]:
    """A container wall as the outermost layer about ``cyl`` (the outermost surface's fit), or None.

    The sector profiles about the outer surface, each sector's mean grey value and its variance, are
    fitted twice with one geometry for both: as a core (a blurred disc) and as a wall (a blurred
    annulus about ``cyl``'s axis, with levels of its own) around a core whose axis may sit off the
    wall's. The levels are solved exactly for each geometry; the geometry is fitted with a robust
    loss (:data:`LOSS`). The wall's edges are blurred at most as much as the sample's surface: one
    scanner blurs both, and a core's surface is the rougher (without this, a thin sharp ring and a
    thick wall blurred more than the scanner does explain a grey wall's profile alike). The variance
    sees a wall as grey as the sample: a wall is uniform, the material is not. Residuals are in
    units of the sample's own scatter between sectors; the gain is how much a wall lowers their
    cost, per sector. A wall is taken when the gain is at least 12 (:data:`STRONG_GAIN`), or at least
    5 and the wall is apart from the sample (an air gap of 1.5 voxels) or of a level of its own (two
    scatters from the sample's), or at least 1.5 and the wall is clearly uniform (:data:`CLEARLY_UNIFORM`: a core's own
    outer layer that merely holds fewer pores than its middle is not); when it differs from the sample
    (:data:`DISTINCT_LEVEL`, :data:`DISTINCT_TEXTURE`); and when it is between 1.5 voxels and a
    quarter of the radius thick (and not at either limit of the fit), holds the sample (to 1.5
    voxels, or to the blur of the sample's surface where that is more) and is seen all around (in
    60% of the sectors). A layer that passes all but its thickness, fitted at the thinnest, is no
    wall, and ``notes`` (a list) is told so (:data:`THIN_WALL_NOTE`).
    Where the best fit has the sample's disc reaching into the wall beyond that (their levels added
    where they overlap, which no sample does), it is fitted again with the disc held inside the wall
    (and where it reaches in by over :data:`OVERLAP`, within that, the held fit is taken where it keeps
    the wall's level, :data:`HELD_LEVEL`),
    and such a wall, like any wall the sample's disc reaches into at all (a negative gap), must be no
    more textured than the sample.
    """
    from scipy.optimize import least_squares
    from scipy.special import ndtr

    px = prof.step / BIN
    r1 = cyl.radius_mm
    r = (np.arange(prof.nb) + 0.5) * prof.step
    reach = min(0.45 * r1, 0.25 * r1 + 24 * px, 72 * px)  # the thickest wall, and the sample inside it
    win = np.nonzero((r > r1 - reach) & (r < r1 + 6 * px))[0]
    deep = r[win] < r1 - reach + max(0.4 * reach, 6 * px)  # the sample, inside any wall
    k_idx, b_idx = np.nonzero(prof.covered[:, win] & np.isfinite(prof.mean[:, win]))
    if k_idx.size < 100:
        return None
    th = prof.angle(k_idx)
    rr = r[win][b_idx]
    py, pxx = rr * np.sin(th), rr * np.cos(th)
    out = rr > r1 + 3 * px
    ym = prof.mean[:, win][k_idx, b_idx] - air
    yv = prof.var[:, win][k_idx, b_idx]
    yv = yv - (float(np.median(yv[out])) if out.any() else 0.0)
    dmask = deep[b_idx]
    if dmask.sum() < 20:
        return None
    scat = [float(np.std(y[dmask])) + 1e-12 for y in (ym, yv)]
    ys = [ym / scat[0], yv / scat[1]]

    def solve(basis):
        """Residuals of both channels with their levels solved by least squares on ``basis`` (the
        sample's disc last). The variance channel sees the sample's disc to the power
        :data:`TEXTURE_POWER`: the scanner's blur mixes the sample's texture with what lies beyond
        its surface, so the variance falls inside the surface, as the square of the sample's share
        for a texture coarser than the blur and as the share itself for one much finer."""
        res = []
        levels = []
        for y, power in zip(ys, (1.0, TEXTURE_POWER)):
            A = np.stack(basis[:-1] + [basis[-1] ** power], axis=1)
            coef, *_ = np.linalg.lstsq(A, y, rcond=None)
            res.append(A @ coef - y)
            levels.append(coef)
        return np.concatenate(res), levels

    def core_basis(p):  # dy, dx, r_s, sigma_s
        d = np.hypot(py - p[0], pxx - p[1])
        return [ndtr((p[2] - d) / p[3])]

    def wall_basis(p):  # thickness, r_out, blur share, dy, dx, r_s, sigma_s
        sw = p[2] * p[6]  # the wall's blur, a share of the sample's surface's
        slab = ndtr((p[1] - rr) / sw) - ndtr((p[1] - p[0] - rr) / sw)
        return [slab] + core_basis(p[3:])

    core = least_squares(lambda p: solve(core_basis(p))[0], [0.0, 0.0, r1, px],
                         bounds=([-0.3 * r1, -0.3 * r1, 0.5 * r1, 0.2 * px], [0.3 * r1, 0.3 * r1, r1 + 5 * px, 6 * px]),
                         max_nfev=200, loss=LOSS)
    rss1 = 2.0 * float(core.cost)
    # the slab's inner surface as a depth below the outer one (1.5 voxels to a quarter of the radius)
    # (the wall's blur as a share of the sample's, at most all of it)
    lo = np.array([1.5 * px, r1 - 3 * px, 0.1, -0.3 * r1, -0.3 * r1, 0.5 * r1, 0.2 * px])
    hi = np.array([0.25 * r1, r1 + 3 * px, 1.0, 0.3 * r1, 0.3 * r1, r1, 6 * px])
    hi[0] = min(hi[0], 48 * px)
    starts = []
    for t in (2, 4, 7, 12, 20, 30):
        if t * px > hi[0]:
            break
        for g in (0.0, 3.0):
            x0 = np.array([t * px, r1, 1.0, 0.0, 0.0, r1 - (t + g) * px, px])
            x0 = np.clip(x0, lo + 1e-6 * (hi - lo), hi - 1e-6 * (hi - lo))
            starts.append((float(np.sum(solve(wall_basis(x0))[0] ** 2)), x0))
    if not starts:  # too small a radius for the thinnest wall
        return None
    best = None
    promising = [x for _, x in sorted(starts, key=lambda c: c[0])[:4]]  # the four most promising starts
    for x0 in promising:
        sol = least_squares(lambda p: solve(wall_basis(p))[0], x0, bounds=(lo, hi), max_nfev=100, loss=LOSS)
        if best is None or sol.cost < best.cost:
            best = sol
    def gap_of(x):  # the narrowest air between the wall and the sample
        return x[1] - x[0] - (x[5] + math.hypot(x[3], x[4]))

    def at_limit(t):  # the fit ran into its thickness limits (the thinnest, the thickest)
        return t <= lo[0] * 1.02, t >= hi[0] * 0.98

    def holds(x):  # the sample within the wall, to its surface's blur
        return gap_of(x) >= -max(1.5 * px, x[6])

    held_in = not holds(best.x)
    free = best
    if held_in or gap_of(best.x) < -OVERLAP * px:
        # the sample's disc reaches into the wall, where the two levels add up: no sample does that.
        # Fit again with the disc held inside the wall's inner surface (its gap to it, >= 0, fitted);
        # such a wall must be no more textured than the sample (the outer layer of a core in air,
        # explained as a wall of a level of its own, is as textured as the core or more)
        def held(q):
            p = np.array(q, float)
            p[5] = q[1] - q[0] - math.hypot(q[3], q[4]) - q[5]
            return p

        lo_h, hi_h = lo.copy(), hi.copy()
        lo_h[5], hi_h[5] = 0.0, 0.5 * r1
        # from the free fit and from the four most promising starts (one start can end far worse
        # than the sample alone explains the profiles: a wall a third of the core's grey, 7 voxels thick)
        held_best = None
        for x0 in [best.x] + promising:
            x0 = x0.copy()
            x0[5] = 0.0
            x0 = np.clip(x0, lo_h + 1e-6 * (hi_h - lo_h), hi_h - 1e-6 * (hi_h - lo_h))
            sol = least_squares(lambda q: solve(wall_basis(held(q)))[0], x0, bounds=(lo_h, hi_h), max_nfev=100,
                                loss=LOSS)
            if held_best is None or sol.cost < held_best.cost:
                held_best = sol
        best = held_best
        best.x = held(held_best.x)
        if not held_in:  # the free fit was within the blur: the held one must only move the wall's inner surface
            w_free, w_held = (float(solve(wall_basis(x))[1][0][0]) for x in (free.x, best.x))
            if any(at_limit(best.x[0])) or abs(w_held - w_free) > HELD_LEVEL * abs(w_free):
                best = free  # it ran into its limits, or needs a wall of another level: the free fit stands
        held_in = best is not free
    thickness, r_out, share, dy, dx, r_s, sig_s = (float(v) for v in best.x)
    rss2 = 2.0 * float(best.cost)
    sig = share * sig_s
    r_in = r_out - thickness
    _, levels = solve(wall_basis(best.x))
    (w_m, s_m), (w_v, s_v) = levels[0], levels[1]  # in units of the sample's scatter
    gap = gap_of(best.x)
    # a wall of some gain is apart from the sample or of a level of its own; else clearly uniform
    own = gap >= 1.5 * px or abs(w_m - s_m) >= 2.0
    mid = min(int(0.5 * (r_in + r_out) / prof.step), prof.nb - 1)
    seen = float(np.mean(prof.covered[:, mid]))  # a wall is seen all around, not in a slice's corners
    gain = (rss1 - rss2) / prof.n_sectors  # how much better a wall explains the profiles, per sector
    # a wall the fit cannot tell from the sample, in level or in texture, is the sample's own outer layer
    distinct = gap >= 1.5 * px or abs(w_m - s_m) >= DISTINCT_LEVEL or s_v - w_v >= DISTINCT_TEXTURE
    evidence = distinct and (gain >= STRONG_GAIN or (gain >= 5.0 and own)
                             or (gain >= 1.5 and w_v <= CLEARLY_UNIFORM * s_v))
    thinnest, thickest = at_limit(thickness)  # the fit ran into its limits: no wall
    uniform = w_v <= s_v or (not held_in and gap >= 0.0)  # a wall the sample reaches into is the less textured
    passes = evidence and uniform and holds(best.x) and w_m > 0 and seen >= 0.6
    if notes is not None and passes and thinnest:
        notes.append(f"{THIN_WALL_NOTE}: a wall may be counted as sample")
    if not passes or thinnest or thickest:
        return None
    return {"outer": cyl, "r_in": r_in, "r_out": r_out, "thickness_mm": thickness,
            "level": w_m * scat[0] + air, "blur_mm": sig, "fit_gain": rss1 / max(rss2, 1e-12)}


def _touching_edge(raw, ok, radii, t_in, r_out, wall_level, air, step):
    """Where a sample that touches its wall ends, along one sector's profile ``raw``. The wall's
    inner surface ``t_in`` is where the wall's fit put it, and a wall fitted as one blurred slab
    beside the sample can take a voxel or two of the sample into it. Where the wall's level differs
    from the sample's own (the profile 4 to 10 voxels inside ``t_in``) by at least
    :data:`TOUCH_CONTRAST` of that level above the air's, the edge is where the profile crosses
    halfway between the two, looked for from ``t_in`` outwards, up to :data:`TOUCH_REACH` voxels
    (and 1.5 voxels short of the wall's outer surface); else it is ``t_in``. Only outwards: the slab
    errs by taking the sample's edge, and a crossing a little inside ``t_in`` is the blur's and the
    pores' as much as the edge's."""
    px = step / BIN
    deep = ok & (radii > t_in - 10 * px) & (radii < t_in - 4 * px)
    if deep.sum() < 3:
        return t_in
    level = float(np.median(raw[deep]))
    if not abs(level - wall_level) >= TOUCH_CONTRAST * (level - air):
        return t_in
    mid = 0.5 * (level + wall_level)
    sign = 1.0 if wall_level < level else -1.0  # the profile falls (rises) into the wall
    lo = max(int(t_in / step), 1)
    hi = min(int(min(t_in + TOUCH_REACH * px, r_out - 1.5 * px) / step), len(raw) - 1)
    for b in range(lo, hi + 1):
        if ok[b - 1] and ok[b] and sign * (raw[b - 1] - mid) >= 0 > sign * (raw[b] - mid):
            return float(radii[b - 1] + step * (raw[b - 1] - mid) / (raw[b - 1] - raw[b]))
    return t_in


def _inner_edge(prof, m, ok, b_in: int, air: float, half: float) -> Optional[float]:
    """The sample's surface (mm from the profiles' centre) in one sector's profile ``m``, the wall's
    step taken off, inside the wall's inner surface (bin ``b_in``): the first crossing of ``half``
    going inwards, then the outermost crossing, within two voxels of it, of halfway from the air to
    the material just inside it (1 to 9 voxels in), as the outer surface is found
    (:func:`~ctpore.data.profiles.outer_edge`). Beam hardening darkens a core towards its axis: the
    material deep inside would set the halfway too low, and the surface too far out."""
    b = b_in
    while b > 0 and not (ok[b - 1] and ok[b] and m[b - 1] >= half > m[b]):
        b -= 1
    if b <= 0:
        return None
    e, vox = b - 1, int(round(1.0 / BIN))
    near = slice(max(e - 9 * vox, 0), max(e - vox, 1))
    inner = m[near][ok[near]]
    local = 0.5 * (air + float(np.median(inner))) if inner.size else half
    for c in range(min(e + 2 * vox, b_in - 1), max(e - 2 * vox, 0) - 1, -1):
        if ok[c] and ok[c + 1] and m[c] >= local > m[c + 1]:
            return prof.radius(c + (m[c] - local) / (m[c] - m[c + 1]))
    return prof.radius(e + (m[e] - half) / (m[e] - m[e + 1]))


def inner_points(prof, c: Cylinder, wall: dict, air: float, material: float):
    """The sample's surface inside a wall, in sector profiles about ``c``'s centre: each sector's
    ray meets the wall's inner surface at ``t_in``; the wall's blurred step (its level less the air's,
    spread by ``sigma``) is taken off the profile, so that what is left inside ``t_in`` is air in a
    gap and the sample's own rise; the surface is where that crosses halfway from the air to the
    material just inside it (:func:`_inner_edge`); where the sample touches the wall, at ``t_in`` or
    where the grey values cross to the wall's level (:func:`_touching_edge`)."""
    from scipy.special import ndtr

    outer = wall["outer"]
    r_in, r_out, sigma = wall["r_in"], wall["r_out"], wall["blur_mm"]
    cy, cx = c.centre_at(c.z_ref)
    wy, wx = outer.centre_at(c.z_ref)
    half = 0.5 * (air + material)
    step = prof.step
    radii = (np.arange(prof.nb) + 0.5) * step
    pts, ks = [], []
    for k in range(prof.n_sectors):
        th = prof.angle(k)
        uy, ux = math.sin(th), math.cos(th)
        oy, ox = cy - wy, cx - wx
        bq = oy * uy + ox * ux
        disc = bq * bq - (oy * oy + ox * ox - r_in * r_in)
        if disc < 0:
            continue
        t_in = -bq + math.sqrt(disc)  # where this sector's ray leaves the wall's inside
        rho = np.sqrt(np.maximum(oy * oy + ox * ox + 2 * radii * bq + radii * radii, 0.0))  # about the wall's axis
        m = prof.mean[k] - (wall["level"] - air) * (ndtr((rho - r_in) / sigma) - ndtr((rho - r_out) / sigma))
        ok = prof.covered[k]
        b = int(t_in / step)
        if b >= prof.nb - 1 or b <= 0:
            continue
        r = None
        if ok[b] and m[b] >= half:
            r = _touching_edge(prof.mean[k], ok, radii, t_in, r_out, wall["level"], air, step)  # it touches the wall
        else:
            r = _inner_edge(prof, m, ok, b, air, half)
        if r is None:
            continue
        pts.append((cy + r * uy, cx + r * ux))
        ks.append(k)
    return np.array(pts).reshape(-1, 2), np.array(ks, int)


