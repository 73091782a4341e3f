"""Layers judged by their pores: a layer without pores at a core's surface is a container wall as
grey as the material, touching it; a layer fitted as a wall that holds pores is no wall
(:func:`wall_has_pores`: more of its voxels dark than its own scatter explains).

A tube wall about as grey as the sample's material, pressed against the core, shows no rise of its
own in the sector profiles: the cylinder is fitted to the wall's outer surface and the wall is
counted as sample (a porosity diluted by a ring of "solid"). What gives it away is the pores: a
core's pores reach its surface (the layer just under a core's surface holds dark voxels at about
its inside's share, more where the partial volume of the air adds some), a wall has none.

:func:`pore_free_layer` reads, on the fit's slices (smoothed by a pixel of the fit's grid, so that
noise alone is not dark), the share of dark voxels (below halfway from the air's level to the
material's) at each depth under the fitted surface, in bins of a pixel. Where the inside (depths
:data:`INSIDE_DEPTHS`) holds at least :data:`MIN_INSIDE` dark, and the layer one to three pixels
under the surface less than :data:`LAYER_SHARE` of the inside's share, the surface is moved in to
the depth where the share first climbs to half the inside's (within :data:`MAX_DEPTH` pixels, and
the layer's share again under :data:`LAYER_SHARE` of the three pixels past that rise, reached within
:data:`RISE_WIDTH` pixels: a wall ends where the core's pores begin, at once): the layer is a
container wall touching the sample (across its surface, so that the sample's rim is judged there as
at any surface).

Examples
--------
>>> from ctpore.data.profiles import Cylinder
>>> yy, xx = np.mgrid[:96, :96] - 47.5
>>> r = np.hypot(yy, xx)
>>> rng = np.random.default_rng(0)
>>> core = np.where(rng.random((96, 96)) < 0.3, 0.0, 1.0)          # pores in the core's material
>>> sl = np.where(r < 34, core, np.where(r < 40, 0.9, 0.0)).astype(np.float32)  # a 6-pixel wall
>>> cyl = Cylinder((47.5, 47.5), (0.0, 0.0), 40.0, 0.0)
>>> t, level = pore_free_layer([sl], [None], [0], cyl, {"air": 0.0, "material": 1.0}, (1.0, 1.0, 1.0))
>>> 5.0 <= t <= 7.0
True
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ctpore.data.profiles import smooth_masked

__all__ = ["INSIDE_DEPTHS", "LAYER_NOTE", "LAYER_SHARE", "MAX_DEPTH", "MIN_INSIDE", "POROUS_WALL", "POROUS_WALL_NOTE",
           "RISE_WIDTH", "pore_free_layer", "take_pore_free_layer", "wall_has_pores"]

#: Depths (pixels of the fit's grid under the fitted surface) the inside's share of dark voxels is read at.
INSIDE_DEPTHS = (12, 40)

#: The inside must hold at least this share of dark voxels for a layer without them to mean anything
#: (as the check of the outer voxels after the model ran, :class:`~ctpore.data.rim.RimCheck`; tubes
#: around cores of thin tubes with a share of 0.023 and 0.036 were missed at 0.05).
MIN_INSIDE = 0.02

#: The layer one to three pixels under the surface is a wall when its dark share is under this share
#: of the inside's, and of the share in the three pixels past the rise (where the core's pores begin):
#: walls pressed against a core showed 0.12 or less of either; a core's own outer band poor in pores
#: (large vesicles kept off its surface) 0.22 of its inside's, rising slowly, 0.37 of the share past
#: the rise.
LAYER_SHARE = 0.25

#: The deepest such layer taken (pixels of the fit's grid): a thicker wall is fitted as one
#: (:func:`~ctpore.data.wall.fit_wall`), and a core's own outer band poor in pores may run deeper.
MAX_DEPTH = 8

#: The rise from the layer's share to the share past it (a quarter of the way to three quarters) spans
#: at most this many pixels: a wall ends where the core's pores begin, its blur apart (walls pressed
#: against a core rose within 1 or 2; a core's band whose pores thin out linearly over 12 pixels, 4).
RISE_WIDTH = 2

#: How the fit's notes begin when a layer was taken off as a wall (``describe`` says it).
LAYER_NOTE = "a layer without pores at the surface, taken as a container wall"


def _profile(slices, valid, zs, cyl, half: float, grid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dark voxels, voxels, their grey values summed) at each whole-pixel depth under the cylinder's
    surface (dark: below ``half`` once smoothed; the grey values as read)."""
    px = min(grid[1], grid[2])
    n = INSIDE_DEPTHS[1] + 1
    dark, total, grey = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n)
    for sl, ok, z in zip(slices, valid, zs):
        ny, nx = sl.shape
        cy, cx = cyl.centre_at(float(z))
        y = np.arange(ny)[:, None] * grid[1] - cy
        x = np.arange(nx)[None, :] * grid[2] - cx
        depth = (cyl.radius_mm - np.hypot(y, x)) / px
        use = depth >= 0
        if ok is not None:
            use &= ok
        b = np.minimum(depth[use].astype(np.int64), INSIDE_DEPTHS[1])
        dark += np.bincount(b, weights=smooth_masked(sl, ok)[use] < half, minlength=n).astype(np.int64)
        total += np.bincount(b, minlength=n)
        grey += np.bincount(b, weights=sl[use], minlength=n)
    return dark, total, grey


def _rise_width(share: np.ndarray, layer: float, past: float) -> int:
    """Pixels from the last depth (from 1) at a quarter of the way from ``layer`` to ``past`` or less
    to the first at three quarters or more."""
    lo, hi = layer + 0.25 * (past - layer), layer + 0.75 * (past - layer)
    high = np.nonzero(share[1:] >= hi)[0]
    if high.size == 0:
        return share.size
    first_high = int(high[0]) + 1
    low = np.nonzero(share[1:first_high] <= lo)[0]
    return first_high - (int(low[-1]) + 1 if low.size else 1)


def pore_free_layer(slices, valid, zs, cyl, levels: dict, grid) -> Optional[tuple[float, float]]:
    """``(thickness, level)``: a layer without pores under the surface of the cylinder ``cyl`` fitted
    to the slices ``slices`` (of Z ``zs``, on the fit's grid of voxel size ``grid``, ``valid`` their
    masks or None), its thickness in mm and its mean grey value; None where there is none (see the
    module docstring). ``levels``: the air's and the material's grey levels."""
    half = 0.5 * (levels["air"] + levels["material"])
    dark, total, grey = _profile(slices, valid, zs, cyl, half, grid)
    a, b = INSIDE_DEPTHS
    if total[a:b].sum() < 100 or total[1:3].sum() < 100:
        return None
    share = dark / np.maximum(total, 1)
    inside = dark[a:b].sum() / total[a:b].sum()
    layer = dark[1:3].sum() / total[1:3].sum()
    if inside < MIN_INSIDE or layer >= LAYER_SHARE * inside:
        return None
    rise = np.nonzero(share[1:MAX_DEPTH + 1] >= 0.5 * inside)[0]
    if rise.size == 0:
        return None
    k = int(rise[0]) + 1  # the first bin at half the inside's share; the crossing within it, linearly
    lo = share[k - 1]
    depth = k - 0.5 + (0.5 * inside - lo) / max(share[k] - lo, 1e-9)
    below = share[int(depth) + 1: int(depth) + 4]  # where the pores begin, past the rise
    if depth < 2.0 or below.size < 3 or layer >= LAYER_SHARE * float(below.mean()):
        return None
    if _rise_width(share, layer, float(below.mean())) > RISE_WIDTH:  # a core's own band, thinning out slowly
        return None
    whole = slice(1, max(2, int(depth)))  # the layer's whole pixels: its grey level, for the metrics
    level = float(grey[whole].sum() / total[whole].sum()) if total[whole].sum() else float("nan")
    return float(depth * min(grid[1], grid[2])), level


def take_pore_free_layer(env, slices, valid, grid) -> bool:
    """Where the cylinder ``env`` (an :class:`~ctpore.data.envelope.Envelope` without a wall) has a
    layer without pores under its surface (:func:`pore_free_layer`), make that layer its container
    wall, touching the sample, and the sample the cylinder within it (in place); whether it did."""
    from dataclasses import replace

    if env.kind != "cylinder" or env.wall is not None or "air" not in env.levels or "material" not in env.levels:
        return False
    found = pore_free_layer(slices, valid, env.zs, env.cylinder, env.levels, grid)
    if found is None:
        return False
    thickness, level = found
    outer = env.cylinder
    env.wall = {"outer": outer, "r_out": outer.radius_mm, "r_in": outer.radius_mm - thickness,
                "thickness_mm": thickness, "level": level}
    env.cylinder = replace(outer, radius_mm=outer.radius_mm - thickness)
    px = min(grid[1], grid[2])
    env.notes.append(f"{LAYER_NOTE}, {thickness / px:.1f} pixels of the fit's grid thick")
    return True


#: A wall holds pores when its share of dark voxels is over ``POROUS_WALL[0]`` times the share a normal
#: spread of its own scatter puts there, plus ``POROUS_WALL[1]``: 136 true walls on simulated scans
#: (bright, grey, touching the core or apart) held at most 0.015 more than that share; a grain pack's
#: outer part taken for a wall, 0.28 against 0.06.
POROUS_WALL = (2.0, 0.05)

#: How the fit's notes begin where a wall was dropped for its pores (``describe`` says it).
POROUS_WALL_NOTE = "a layer fitted as a container wall holds pores: the sample's own material, not a wall"


def wall_has_pores(wall: dict, slices, valid, zs, grid, air: float) -> bool:
    """Whether the wall ``wall`` (:func:`~ctpore.data.wall.fit_wall`'s, about ``wall["outer"]``'s axis)
    holds pores on the fit's slices: smoothed by a pixel of the fit's grid, the share of its voxels (its
    annulus less a pixel at each face) darker than halfway from ``air`` to its median level, against
    the share below there of a normal spread of its robust scatter (:data:`POROUS_WALL`). A wall is
    uniform: noise alone darkens as many voxels as its scatter says, pores more."""
    outer, px = wall["outer"], min(grid[1], grid[2])
    values = []
    for sl, ok, z in zip(slices, valid, zs):
        m = (outer.inside(float(z), sl.shape, grid[1:], shrink_mm=outer.radius_mm - wall["r_out"] + px)
             & ~outer.inside(float(z), sl.shape, grid[1:], shrink_mm=outer.radius_mm - wall["r_in"] - px))
        if ok is not None:
            m &= ok
        if m.any():
            values.append(smooth_masked(sl, ok)[m])
    v = np.concatenate(values) if values else np.zeros(0, np.float32)
    if v.size < 200:
        return False
    level = float(np.median(v))
    if level <= air:
        return False
    scatter = 1.4826 * float(np.median(np.abs(v - level)))
    half = 0.5 * (level - air)
    normal = 0.5 * math.erfc(half / (scatter * math.sqrt(2.0))) if scatter > 0 else 0.0
    dark = float(np.count_nonzero(v < air + half)) / v.size
    return dark > POROUS_WALL[0] * normal + POROUS_WALL[1]
