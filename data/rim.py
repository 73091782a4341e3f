"""The partial-volume rim of a sample's surface is not pore.

A voxel on the sample's surface is partly air: it looks darker than the material it holds, and a
method reading grey values takes a rim of them for pore, a thin shell of false pores (hundreds of
small components, or all the pores open at the surface joined into one). :func:`clear_rim` keeps a
pore voxel of the surface (a sample voxel within :data:`RIM` voxels of the outside, in its slice)
only where the pore reaches inwards: where it joins a pore voxel deeper than the rim (:data:`RIM`
voxels, within its slice) through at most :data:`RIM` steps between face neighbours in 3D, each on a
pore voxel of the rim. A pore open at the surface keeps its mouth, and a pore that runs through the
rim stays whole where it reaches the deeper pore only through the slices above or below; the rim
along solid material goes. Every join the rule reads lies within :data:`RIM` slices, so a slab read
with that many slices of halo on each side gives the whole volume's result (:func:`cleared`).

Examples
--------
>>> outside = np.zeros((1, 7, 7), bool); outside[0, :, :2] = True     # the sample is columns 2..6
>>> prob = np.zeros((1, 7, 7), np.float32); prob[0, :, 2] = 0.9       # a dark rim along the surface
>>> prob[0, 3, 2:6] = 0.9                                              # and a pore open at it
>>> clear_rim(prob, outside)[0, :, 2]
array([0. , 0. , 0. , 0.9, 0. , 0. , 0. ], dtype=float32)
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from scipy import ndimage as ndi

from ctpore.data.sample import SURFACE, WALL

__all__ = ["INSIDE", "RIM", "RIM_SHARE", "SHELL", "RimCheck", "clear_rim", "cleared"]

#: Depth of the rim, in voxels: the partial-volume voxels of the surface, and one more for a surface
#: found half a voxel out.
RIM = 3

_CROSS = ndi.generate_binary_structure(2, 1)
_CROSS3 = ndi.generate_binary_structure(3, 1)


def _surface(outside: np.ndarray, wall: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(outside, across the surface) from a bool outside (all of it across the surface) or from the
    codes of :meth:`ctpore.data.sample.SampleFit.outside` (1: across the sample's surface facing air;
    2: across no surface, such as a field of view's cut or a margin taken off; 3: a container's wall
    touching the sample, across the surface where ``wall``)."""
    outside = np.asarray(outside)
    if outside.dtype == bool:
        return outside, outside
    return outside > 0, (outside == SURFACE) | (outside == WALL) if wall else outside == SURFACE


def clear_rim(prob: np.ndarray, outside: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """``prob`` ``(n, Y, X)`` with the outside at 0 and the surface's pore voxels that no deeper pore
    voxel supports set to 0 (in place; also returned). ``outside``: bool (True outside the sample,
    all of it across a surface) or the outside's codes (codes 1, air, and 3, a container's wall, are
    across a surface). The slice's edge is not a surface (a cut face), nor is a field of view's cut or
    a user's mask. The joins are read within the ``n`` slices given: a slab of a larger volume is
    cleared as the whole volume is by :func:`cleared`."""
    outside, across = _surface(outside)
    prob[outside] = 0.0
    if not across.any():
        return prob
    deep = np.ones(prob.shape, bool)  # deeper than the rim, within its slice
    for i in range(prob.shape[0]):
        if across[i].any():
            deep[i] = ndi.binary_erosion(~across[i], _CROSS, iterations=RIM, border_value=1)
    pore = prob > threshold
    rim_pore = pore & ~outside & ~deep
    held = pore & deep
    for _ in range(RIM):  # pore voxels of the rim joined to a deeper pore, in 3D
        held |= ndi.binary_dilation(held, _CROSS3) & rim_pore
    prob[rim_pore & ~held] = 0.0
    return prob


def cleared(read_prob: Callable[[int, int], np.ndarray], read_codes: Callable[[int, int], np.ndarray],
            a: int, b: int, nz: int, threshold: float = 0.5) -> np.ndarray:
    """Slices ``a:b`` of a volume of ``nz`` slices with :func:`clear_rim` applied as to the whole
    volume: read (``read_prob(z0, z1)`` float32, ``read_codes(z0, z1)`` the outside's codes) with
    :data:`RIM` slices of halo on each side, cleared, and cut back to ``a:b``."""
    z0, z1 = max(0, a - RIM), min(nz, b + RIM)
    prob = np.array(read_prob(z0, z1), np.float32)
    clear_rim(prob, np.asarray(read_codes(z0, z1)), threshold=threshold)
    return prob[a - z0: b - z0]


#: Depths (voxels, within the slice) of the shell a found sample's rim is judged by, and of its inside.
SHELL, INSIDE = (RIM + 1, RIM + 3), RIM + 8


#: A found sample's rim (its outer :data:`RIM` voxels) with a porosity under this share of its inside's
#: is a wall counted as sample, too thin for the shell to lie in it. Half the least share on simulated
#: scans whose sample was found right (0.156, of 195 over every set-up); two tubes 3 voxels thick that
#: the fit missed showed 0.02 or less (a third, 4 voxels thick, 0.10: it is not caught).
RIM_SHARE = 0.075


class RimCheck:
    """Porosity in a shell under the sample's surface (depth :data:`SHELL`, below the rim) and in the
    rim itself, against its inside (deeper than :data:`INSIDE`), over the slices it is shown: a
    container wall counted as sample shows a shell (or, a thin one, a rim) with almost no pore, an
    air gap counted as sample a shell of pores."""

    def __init__(self):
        # shell pores, shell voxels, inside pores, inside voxels, rim pores, rim voxels
        self.counts = np.zeros(6, np.int64)

    def add(self, pores: np.ndarray, outside: np.ndarray) -> None:
        """One slice: its pores and its outside (bool, or the outside's codes, ``(Y, X)``; depths
        are from the sample's surface facing air only)."""
        outside, across = _surface(outside, wall=False)
        inside = ~outside
        r = ndi.binary_erosion(~across, _CROSS, iterations=RIM, border_value=1)
        a = ndi.binary_erosion(r, _CROSS, iterations=SHELL[0] - RIM, border_value=1)
        b = ndi.binary_erosion(a, _CROSS, iterations=SHELL[1] - SHELL[0], border_value=1)
        c = ndi.binary_erosion(b, _CROSS, iterations=INSIDE - SHELL[1], border_value=1) & inside
        shell = a & ~b & inside
        pores = np.asarray(pores, bool)
        rim = inside & ~r
        self.counts += [np.count_nonzero(pores & shell), np.count_nonzero(shell),
                        np.count_nonzero(pores & c), np.count_nonzero(c),
                        np.count_nonzero(pores & rim), np.count_nonzero(rim)]

    def result(self) -> dict:
        """``rim_porosity``, ``shell_porosity``, ``inside_porosity`` and ``differs`` (the shell's porosity
        under a quarter of the inside's, or above 2.5 times it and 0.05 more, or the rim's under
        :data:`RIM_SHARE` of the inside's: a wall or a gap in the sample)."""
        sp, sn, ip, in_, rp, rn = (int(v) for v in self.counts)
        if sn < 100 or in_ < 100:
            return {"rim_porosity": None, "shell_porosity": None, "inside_porosity": None, "differs": False}
        shell, inner = sp / sn, ip / in_
        rim = rp / rn if rn >= 100 else None
        few_pores = shell < 0.25 * inner or (rim is not None and rim < RIM_SHARE * inner)  # a wall
        many_pores = shell > 2.5 * inner + 0.05  # a gap of air
        differs = (inner >= 0.02 and few_pores) or many_pores
        return {"rim_porosity": None if rim is None else round(rim, 4), "shell_porosity": round(shell, 4),
                "inside_porosity": round(inner, 4), "differs": bool(differs)}
