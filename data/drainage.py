"""The drainage curve (mercury intrusion), streamed and exact: the share of the pore volume a
non-wetting fluid invades from the sample's top face, against the smallest diameter it has passed.

As PoreSpy 3.2's ``porosimetry(im, inlets=..., method="dt")`` computes it (its ``drainage_dt``, with
``smooth=True`` and its default sizes): the steps are the distinct distances ``r`` of the pore
voxels to the solid, from the largest down. At step ``r`` the centres are the pore voxels whose
distance, rounded down, is at least ``r`` and that join a voxel of the inlet face through such voxels
(6-connected: PoreSpy's ``conn="min"``); the fluid fills what lies closer than ``r`` to a centre,
and a voxel keeps the first (largest) ``r`` that fills it. The volume's border is not solid, as for
the local thickness (:mod:`ctpore.data.thickness`); outside the sample is solid.

The centres of a step depend only on ``k = ceil(r)``, and of the steps with one ``k`` only the
largest, ``r_k`` (:func:`step_radii`), fills anything. Each pore voxel ``s`` has an *access level*
``a(s)``, the largest ``k`` at which it is a centre (0: none), and a voxel's drainage radius is
``r_k`` for the largest ``k`` with a centre ``s``, ``a(s) >= k``, closer than ``r_k``: the local
thickness's operator on ``a`` with ``r_k`` as the reach of level ``k``.
:func:`access_radii` makes ``a`` with the slab union-find of
:class:`~ctpore.data.slabs.SlabComponents`, two passes a level (the components of
``{distance >= k}``, marked where they hold an inlet voxel; then the voxels of the marked ones), and
:func:`~ctpore.data.thickness.tiled_thickness` turns it into the drainage levels tile by tile with a
halo of the largest access level, so the map equals the whole-volume one voxel for voxel.

Examples
--------
>>> import numpy as np
>>> pores = np.zeros((16, 9, 9), bool)
>>> pores[:, 3:6, 3:6] = True          # a 3-voxel-wide channel from top to bottom
>>> pores[4:13, 1:8, 1:8] = True       # a 7-voxel-wide chamber on its way
>>> from ctpore.data.thickness import distance_map
>>> a = np.zeros(pores.shape, np.int16)
>>> dist = distance_map(pores)
>>> int(dist[8, 4, 4]), int(dist[2, 4, 4])   # the chamber's centre, and the channel's
(4, 2)
>>> access_radii(dist, a, inlet=0, slab=4)     # the channel lets a radius of 2 through, not 4
2
>>> int(a[8, 4, 4])
2
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ctpore.data.slabs import SlabComponents
from ctpore.progress import ProgressFn

__all__ = ["access_radii", "drainage_curve", "step_radii"]


def access_radii(dist, out, inlet: int, slab: int, progress: ProgressFn = None) -> int:
    """Fill ``out`` (int16, of ``dist``'s shape; an array or a memory map) with every voxel's access
    level (module docstring) from the exact distance map ``dist`` (0 on the solid and outside the
    sample), the inlet being plane ``inlet`` along z; returns the largest access level (0: the fluid
    enters nowhere)."""
    nz = int(dist.shape[0])
    starts = list(range(0, nz, slab))
    top = max((float(np.max(dist[z0:z0 + slab])) for z0 in starts), default=0.0)
    for z0 in starts:
        out[z0:z0 + slab] = 0
    if not np.isfinite(top) or top < 1:
        return 0
    largest = 0
    rmax = int(math.floor(top))
    for r in range(rmax, 0, -1):
        comp = SlabComponents(connectivity=6)
        for z0 in starts:
            labels = comp.add(np.asarray(dist[z0:z0 + slab]) >= r)
            if z0 <= inlet < z0 + slab:
                comp.mark(labels[inlet - z0], 0)
        reach = (comp.flags() & 1).astype(bool)
        if reach.any():
            largest = max(largest, r)
            for i, z0 in enumerate(starts):
                hit = reach[comp.labels(np.asarray(dist[z0:z0 + slab]) >= r, i)]
                if hit.any():
                    o = np.asarray(out[z0:z0 + slab])
                    o = np.where(hit & (o == 0), np.int16(r), o)
                    out[z0:z0 + slab] = o
        if progress is not None:
            progress(rmax - r + 1, rmax, "drainage: access levels")
    return largest


def step_radii(dist, slab: int) -> np.ndarray:
    """``r_k`` per level ``k`` (index; 0 where no pore voxel's distance ``d`` has ``ceil(d) == k``): the
    largest such distance, from the exact distance map ``dist`` (0 off the pores) read slab by slab."""
    top = np.zeros(1, np.float64)
    for z0 in range(0, int(dist.shape[0]), slab):
        d = np.asarray(dist[z0:z0 + slab], np.float64)
        d = d[(d > 0) & np.isfinite(d)]
        if d.size:
            k = np.ceil(d).astype(np.int64)
            if k.max() >= len(top):
                top = np.concatenate([top, np.zeros(int(k.max()) + 1 - len(top))])
            np.maximum.at(top, k, d)
    return top


def drainage_curve(counts: np.ndarray, n_pore: int, unit: float, steps: Optional[np.ndarray] = None) -> dict:
    """The curve from ``counts[k]`` (pore voxels whose drainage level is ``k``; 0: never invaded) and
    the levels' radii ``steps`` (:func:`step_radii`; default ``k``): ``diameter`` (``2 r_k unit``, from
    the largest down, the levels with a step only) and ``invaded`` (the share of the pore volume
    invaded once the fluid has passed that diameter), and ``d50``, the diameter at which half the pore
    volume is invaded (None where it never is)."""
    c = np.asarray(counts, np.int64)
    if n_pore <= 0 or len(c) < 2:
        return {"diameter": [], "invaded": [], "d50": None}
    r = np.arange(len(c), dtype=np.float64) if steps is None else np.asarray(steps, np.float64)[:len(c)]
    levels = [k for k in range(len(c) - 1, 0, -1) if k < len(r) and r[k] > 0]
    invaded = np.cumsum([c[k] for k in levels]) / float(n_pore)
    at = np.flatnonzero(invaded >= 0.5 - 1e-12)
    d50: Optional[float] = float(2 * r[levels[at[0]]] * unit) if at.size else None
    return {"diameter": [float(2 * r[k] * unit) for k in levels], "invaded": [float(v) for v in invaded], "d50": d50}
