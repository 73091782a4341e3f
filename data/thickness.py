"""Local thickness of the pores (the pore-size distribution), whole or streamed slab by slab, exactly.

The local thickness of a pore voxel is the diameter of the largest ball that lies in the pores
and covers the voxel (Hildebrand & Rüegsegger 1997; BoneJ; PoreSpy). As PoreSpy 3.2's
``local_thickness(method="dt")`` computes it, radii are the integers ``r`` from the largest
distance down to 1: the centres are the pore voxels whose distance to the solid is at least
``r``, each covers what lies closer than ``r`` to it, and a voxel keeps the first (largest) ``r``
that covers it. The thickness is ``2 r``. Distances are Euclidean, in units of the smallest voxel
side (other sides scaled), and the volume's own border is not solid (as PoreSpy and
``scipy.ndimage.distance_transform_edt`` take it); outside the sample is solid.

Streamed (:func:`streamed_thickness`), a slab's radii need the distances within ``R`` of it
(``R`` the largest distance of the whole volume), which need the solid within ``2 R``: each slab is
computed with that halo and only its own slices are kept, so the map equals the whole-volume one
voxel for voxel. ``R`` is found by a first pass whose halo grows until every distance of the slab
is certain (a distance no larger than the halo cannot have been cut short by it).

Examples
--------
>>> import numpy as np
>>> z, y, x = np.indices((21, 21, 21)) - 10
>>> ball = (z * z + y * y + x * x <= 8 * 8).astype(np.uint8)
>>> r = thickness_radii(ball)
>>> int(r.max()), int(r[10, 10, 10]), int(r[0, 10, 10])
(8, 8, 0)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Optional

import numpy as np
from scipy import ndimage as ndi

from ctpore.progress import ProgressFn

__all__ = ["sampling_of", "distance_map", "thickness_radii", "largest_distance", "streamed_thickness",
           "BYTES_PER_VOXEL"]

#: Bytes per voxel of a window while its thickness is computed (two float64 maps, masks, radii).
BYTES_PER_VOXEL = 24


def sampling_of(spacing: Sequence[float]) -> tuple:
    """Voxel sides (z, y, x) in units of the smallest one."""
    s = [float(v) for v in spacing]
    m = min(s)
    return tuple(v / m for v in s)


def distance_map(pores: np.ndarray, sampling: Sequence[float] = (1.0, 1.0, 1.0)) -> np.ndarray:
    """Distance (float64) of every pore voxel to the nearest solid one; 0 on the solid."""
    p = np.asarray(pores, bool)
    if not p.any():
        return np.zeros(p.shape)
    if p.all():  # no solid at all: nothing bounds a ball but the border, which is not solid
        return np.full(p.shape, np.inf)
    return ndi.distance_transform_edt(p, sampling=tuple(sampling))


def thickness_radii(pores: np.ndarray, sampling: Sequence[float] = (1.0, 1.0, 1.0),
                    dist: Optional[np.ndarray] = None, centres: Optional[np.ndarray] = None,
                    rmax: Optional[int] = None) -> np.ndarray:
    """Local thickness radii (int16; 0 on the solid) of ``pores`` (module docstring).

    ``dist``: its :func:`distance_map` when already made. ``centres`` (bool): only these voxels may
    centre a ball (the others still get covered). ``rmax``: the largest radius tried (default:
    the largest distance).
    """
    p = np.asarray(pores, bool)
    d = distance_map(p, sampling) if dist is None else dist
    out = np.zeros(p.shape, np.int16)
    if not p.any():
        return out
    finite = d[np.isfinite(d)]
    top = int(math.floor(finite.max())) if finite.size else 0
    if rmax is not None:
        top = min(top, int(rmax))
    if not np.isfinite(d).all():  # a pore space with no solid: one radius covers it all
        top = int(rmax) if rmax is not None else max(p.shape)
    ok = d if centres is None else np.where(centres, d, 0.0)
    sampling = tuple(sampling)
    for r in range(top, 0, -1):
        seeds = ok >= r
        if not seeds.any():
            continue
        # only the seeds' bounding box, grown by r, can be covered
        box = []
        for axis, n in enumerate(p.shape):
            on = np.flatnonzero(seeds.any(axis=tuple(a for a in range(3) if a != axis)))
            grow = int(math.ceil(r / sampling[axis]))
            box.append(slice(max(0, on[0] - grow), min(n, on[-1] + grow + 1)))
        box = tuple(box)
        cover = ndi.distance_transform_edt(~seeds[box], sampling=sampling) < r
        region = out[box]
        region[(region == 0) & cover] = r
    return out


def _slab_distances(read: Callable, nz: int, z0: int, z1: int, halo: int, sampling: tuple) -> tuple:
    w0, w1 = max(0, z0 - halo), min(nz, z1 + halo)
    d = distance_map(read(w0, w1), sampling)
    return d[z0 - w0:z1 - w0], w0, w1


def largest_distance(read: Callable, nz: int, slab: int, sampling: Sequence[float] = (1.0, 1.0, 1.0),
                     start_halo: int = 8, progress: ProgressFn = None) -> float:
    """The largest distance to the solid over a volume read as ``read(z0, z1)`` (pores of slices
    ``z0:z1``), exactly, slab by slab: a slab's halo doubles until its largest distance is no
    more than the halo's depth (or the halo reaches the volume's ends)."""
    sampling = tuple(sampling)
    best, halo = 0.0, max(1, int(start_halo))
    for z0 in range(0, nz, slab):
        z1 = min(nz, z0 + slab)
        while True:
            core, w0, w1 = _slab_distances(read, nz, z0, z1, halo, sampling)
            top = float(core.max()) if core.size else 0.0
            whole = w0 == 0 and w1 == nz
            if whole or top <= halo * sampling[0]:
                break
            halo *= 2
        best = max(best, top)
        if progress is not None:
            progress(z1, nz, "largest pore distance")
    return best


def streamed_thickness(read: Callable, nz: int, slab: int, sampling: Sequence[float] = (1.0, 1.0, 1.0),
                       rmax: Optional[float] = None, progress: ProgressFn = None) -> Iterator[tuple]:
    """``(z0, z1, radii)`` slab after slab: the same radii as :func:`thickness_radii` of the whole
    volume read as ``read(z0, z1)`` (module docstring). ``rmax``: the volume's largest distance
    (:func:`largest_distance`, found here when not given)."""
    sampling = tuple(sampling)
    if rmax is None:
        rmax = largest_distance(read, nz, slab, sampling, progress=progress)
    if not np.isfinite(rmax):
        rmax = float(max(nz * sampling[0], 1.0))
    R = int(math.floor(rmax))
    reach = int(math.ceil(R / sampling[0]))  # slices within R of a slice
    for z0 in range(0, nz, slab):
        z1 = min(nz, z0 + slab)
        w0, w1 = max(0, z0 - 2 * reach - 1), min(nz, z1 + 2 * reach + 1)
        pores = np.asarray(read(w0, w1), bool)
        d = distance_map(pores, sampling)
        # only the voxels within R of the slab may centre a ball that reaches it; their distances
        # are exact (the solid within R of them lies in the window)
        centres = np.zeros(pores.shape, bool)
        centres[max(0, z0 - reach - w0):min(w1, z1 + reach) - w0] = True
        radii = thickness_radii(pores, sampling, dist=d, centres=centres, rmax=R)
        yield z0, z1, radii[z0 - w0:z1 - w0]
        if progress is not None:
            progress(z1, nz, "local thickness")


def window_slices(budget_bytes: int, plane_voxels: int, reach: int) -> int:
    """Slices per slab so that a slab and its two halos of ``2 reach + 1`` slices fit ``budget_bytes``
    (at least 1)."""
    per_slice = BYTES_PER_VOXEL * max(1, plane_voxels)
    return max(1, int(budget_bytes // per_slice) - 2 * (2 * reach + 1))
