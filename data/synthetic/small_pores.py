"""Small isolated pores added to a structure: the 8-30-voxel vesicles of soils and the intragranular
pores of sandstones, which the four families alone rarely hold.

A set of simulated scans decides with :func:`draw_small_pores` which of its scans get them; those
scans get :func:`add_small_pores` on the fine grid before they are scanned. Each small pore is an
ellipsoid of 1.1 to 2 scan voxels in radius (about 6 to 33 voxels), placed where the solid reaches
at least 1.5 voxels beyond it, and apart from the other small pores, so that every one stays its own
pore (one more component, no new tunnel or cavity) and the structure's topology is otherwise unchanged.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import ndimage as ndi

from ctpore.errors import InputError

__all__ = ["SMALL_RADII", "draw_small_pores", "add_small_pores", "check_fraction"]

#: Radius range of the small pores, in scan voxels.
SMALL_RADII = (1.1, 2.0)

#: Small pores tried per 1000 scan voxels: drawn uniformly in this range for each scan (fewer fit
#: where the solid is thin).
_DENSITY = (0.2, 1.2)

#: Solid kept around each small pore (scan voxels), so that it touches no other pore.
_GAP = 1.5


def check_fraction(value, name: str) -> float:
    """``value`` as a fraction in [0, 1], else an InputError naming ``name``."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        f = float("nan")
    if not (math.isfinite(f) and 0.0 <= f <= 1.0):
        raise InputError(f"{name} must be a fraction between 0 and 1, got {value!r}")
    return f


def draw_small_pores(seed: int, fraction: float) -> bool:
    """Whether simulated scan ``seed`` of a set with ``fraction`` of such scans gets small pores.

    Drawn from its own stream (``seed``, 3), so a set with ``fraction`` 0 has exactly the scans
    :func:`~ctpore.data.synthetic.make_pair` gives without them.

    Examples
    --------
    >>> draw_small_pores(5, 0.0), draw_small_pores(5, 1.0)
    (False, True)
    """
    fraction = check_fraction(fraction, "small_pores")
    if fraction == 0.0:
        return False
    return bool(np.random.default_rng([int(seed), 3]).random() < fraction)


def add_small_pores(fine: np.ndarray, oversample: int, seed: int) -> tuple[np.ndarray, int]:
    """Carve small isolated ellipsoidal pores into the solid of a fine-grid structure.

    Parameters
    ----------
    fine : numpy.ndarray
        bool (Z, Y, X) on the fine grid, True = pore.
    oversample : int
        Fine voxels per scan voxel along each axis.
    seed : int
        The scan's seed; the pores are drawn from the stream (``seed``, 2).

    Returns
    -------
    (numpy.ndarray, int)
        The structure with the small pores (a new array) and how many were added.
    """
    rng = np.random.default_rng([int(seed), 2])
    shape = np.array(fine.shape)
    scan_voxels = float(np.prod(shape)) / oversample**3
    n_try = int(round(rng.uniform(*_DENSITY) * scan_voxels / 1000.0))
    centres = rng.random((n_try, 3)) * shape
    radii = rng.uniform(*SMALL_RADII, n_try) * oversample  # fine voxels
    axes = radii[:, None] * np.exp(0.15 * rng.standard_normal((n_try, 3)))  # mildly ellipsoidal
    room = ndi.distance_transform_edt(~fine)  # fine voxels from each solid voxel to the nearest pore
    out = fine.copy()
    kept: list[tuple[np.ndarray, float]] = []
    gap = _GAP * oversample
    for c, a in zip(centres, axes):
        reach = float(a.max())
        idx = tuple(np.minimum(c.astype(int), shape - 1))
        if room[idx] < reach + gap:
            continue  # too near a pore: it would join it
        if any(np.linalg.norm(c - k) < reach + r + gap for k, r in kept):
            continue  # too near another small pore
        lo = np.maximum(np.floor(c - a).astype(int), 0)
        hi = np.minimum(np.ceil(c + a).astype(int) + 1, shape)
        if np.any(lo <= 0) or np.any(hi >= shape):
            continue  # keep them whole, inside the volume
        grid = np.ogrid[lo[0]:hi[0], lo[1]:hi[1], lo[2]:hi[2]]
        inside = sum(((g + 0.5 - ci) / ai) ** 2 for g, ci, ai in zip(grid, c, a)) <= 1.0
        out[lo[0]:hi[0], lo[1]:hi[1], lo[2]:hi[2]] |= inside
        kept.append((c, reach))
    return out, len(kept)
