"""Topology of the pore phase: Euler number (26- and 6-connected), components, cavities, Betti numbers.

All topology is of the *pore* phase (1), and the volume is treated as surrounded by solid (as
:func:`skimage.measure.euler_number` does by zero padding).

Euler numbers are computed from one histogram of the 256 possible 2x2x2 voxel configurations
(one per vertex of the zero-padded voxel grid) and two look-up tables derived here from first
principles (cell counting, see :func:`_lut26` and :func:`_lut6`). The histogram is built in
z-slabs of uint8 codes, so a 512³ volume needs a few hundred MB at most. The connectivity index and
density (BoneJ, edge-corrected, Odgaard & Gundersen 1993) are in :mod:`ctpore.data.connectivity`.

Examples
--------
>>> import numpy as np
>>> cube = np.zeros((5, 5, 5), np.uint8); cube[1:4, 1:4, 1:4] = 1
>>> euler_number(cube)
1
>>> cube[2, 2, 2] = 0            # a solid inclusion: the pore cube now has a cavity
>>> euler_number(cube), euler_number(cube, connectivity=6)
(2, 2)
>>> pair = np.zeros((2, 2, 2), np.uint8); pair[0, 0, 0] = pair[1, 1, 1] = 1
>>> euler_number(pair, 26), euler_number(pair, 6), n_components(pair, 6)
(1, 2, 2)
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
from scipy import ndimage as ndi

from ctpore.data.binary import as_volume, check_connectivity

__all__ = [
    "SLAB_VOXELS",
    "configuration_histogram",
    "euler_from_histogram",
    "euler_number",
    "n_components",
    "plane_histogram",
    "n_cavities",
    "betti_numbers",
]

# memory (uint8 codes plus the intp copy np.bincount makes) to roughly 8 * SLAB_VOXELS bytes.
SLAB_VOXELS = 1 << 23


# A configuration code packs the 8 voxels of a 2x2x2 block, voxel (dz, dy, dx) in bit
# 4*dz + 2*dy + dx. Summing a per-block value over every block of the zero-padded volume
# counts each cell of a cell complex exactly once when the value hands each cell a share
# 1/(number of blocks that see it). Both tables below hold 8x that share, so that they are
# integers and the Euler number is (table @ histogram) / 8.

_OFFSETS = tuple(itertools.product((0, 1), repeat=3))  # (dz, dy, dx) for bits 0..7


@functools.lru_cache(maxsize=None)
def _lut26() -> np.ndarray:
    """8 x Euler contribution of the centre vertex of a 2x2x2 block, 26-connected pores.

    The pore phase is the union of closed unit cubes (two voxels sharing a face, an edge or a
    corner touch: 26-connectivity, and the solid is then 6-connected). Its Euler number is
    V - E + F - C over the vertices, edges, squares and cubes it contains. A block is centred
    on one grid vertex and sees: that vertex (whole), its 6 half-edges (each edge has 2
    vertices), its 12 quarter-squares (4 vertices each) and 8 eighth-cubes.
    """
    lut = np.zeros(256, np.int64)
    for code in range(256):
        on = [(code >> b) & 1 for b in range(8)]
        vox = {o: on[b] for b, o in enumerate(_OFFSETS)}
        v = 8 * int(any(on))
        e = 0
        for axis in range(3):  # half-edge from the centre along +/- axis
            for d in (0, 1):
                e += int(any(x for o, x in vox.items() if o[axis] == d))
        f = 0
        for axis in range(3):  # quarter-square in the plane normal to axis, quadrant (d1, d2)
            b_ax, c_ax = [a for a in range(3) if a != axis]
            for d1, d2 in itertools.product((0, 1), repeat=2):
                f += int(any(x for o, x in vox.items() if o[b_ax] == d1 and o[c_ax] == d2))
        c = sum(on)
        lut[code] = v - 4 * e + 2 * f - c
    return lut


@functools.lru_cache(maxsize=None)
def _lut6() -> np.ndarray:
    """8 x Euler contribution of a 2x2x2 block, 6-connected pores (26-connected solid).

    The pore phase is the cubical complex on voxel centres: a vertex per pore voxel, an edge
    per 6-adjacent pair, a square per 2x2 group and a cube per 2x2x2 group of pore voxels.
    Every voxel lies in 8 blocks, every pair in 4, every square in 2, every cube in 1.
    """
    lut = np.zeros(256, np.int64)
    for code in range(256):
        on = {o: (code >> b) & 1 for b, o in enumerate(_OFFSETS)}
        n_vox = sum(on.values())
        pairs = sum(
            on[p] and on[q]
            for p, q in itertools.combinations(_OFFSETS, 2)
            if sum(abs(i - j) for i, j in zip(p, q)) == 1
        )
        squares = 0
        for axis in range(3):
            for d in (0, 1):
                squares += int(all(x for o, x in on.items() if o[axis] == d))
        cube = int(all(on.values()))
        lut[code] = n_vox - 2 * pairs + 4 * squares - 8 * cube
    return lut


def plane_histogram(stack: np.ndarray) -> np.ndarray:
    """Histogram (256,) of the codes of the vertex planes between consecutive slices of ``stack``.

    ``stack`` is ``(n+1, Y, X)`` (uint8 0/1); vertex plane ``i`` lies between slices ``i`` and
    ``i+1``, and the plane is zero-padded in y and x: ``n * (Y+1) * (X+1)`` codes.
    """
    n = stack.shape[0] - 1
    yn, xn = stack.shape[1:]
    slab = np.zeros((n + 1, yn + 2, xn + 2), np.uint8)  # (n+1, Y+2, X+2), zero padded
    slab[:, 1:-1, 1:-1] = stack
    code = np.zeros((n, yn + 1, xn + 1), np.uint8)  # (n, Y+1, X+1)
    for bit, (dz, dy, dx) in enumerate(_OFFSETS):
        block = slab[dz : dz + n, dy : dy + yn + 1, dx : dx + xn + 1]
        code |= block << np.uint8(bit) if bit else block
    return np.bincount(code.ravel(), minlength=256)


def configuration_histogram(vol: np.ndarray) -> np.ndarray:
    """Histogram (256,) of 2x2x2 configuration codes over all blocks of the zero-padded volume.

    There is one block per vertex of the voxel grid, (Z+1)(Y+1)(X+1) in all. Built slab by
    slab along z so memory stays bounded; no Python loop over voxels.
    """
    zn, yn, xn = vol.shape
    hist = np.zeros(256, np.int64)
    step = max(1, SLAB_VOXELS // ((yn + 1) * (xn + 1)))
    for v0 in range(0, zn + 1, step):  # vertex planes v0 .. v1-1
        v1 = min(v0 + step, zn + 1)
        # vertex plane v sits between slices v-1 and v; the stack holds slices v0-1 .. v1-1
        stack = np.zeros((v1 - v0 + 1, yn, xn), np.uint8)
        lo, hi = max(v0 - 1, 0), min(v1, zn)
        if hi > lo:
            start = lo - (v0 - 1)
            stack[start : start + hi - lo] = vol[lo:hi]
        hist += plane_histogram(stack)
    return hist


def euler_from_histogram(hist: np.ndarray, connectivity: int) -> int:
    lut = _lut26() if connectivity == 26 else _lut6()
    total = int(lut @ hist)
    if total % 8:  # cannot happen: every cell is shared out exactly
        raise RuntimeError(f"Euler sum {total} is not a multiple of 8")
    return total // 8


def euler_number(pores: np.ndarray, connectivity: int = 26) -> int:
    """Euler number (characteristic) χ of the pore phase.

    χ = components - tunnels (loops) + cavities. The volume is treated as surrounded by solid.

    Parameters
    ----------
    pores : numpy.ndarray
        Binary ``(Z, Y, X)`` volume, 1 = pore.
    connectivity : {26, 6}
        26: pores are 26-connected and the solid 6-connected (equal to
        ``skimage.measure.euler_number(pores, connectivity=3)``). 6: pores are 6-connected and
        the solid 26-connected (``skimage.measure.euler_number(pores, connectivity=1)``).

    Returns
    -------
    int

    Examples
    --------
    >>> ring = np.ones((1, 3, 3), np.uint8); ring[0, 1, 1] = 0
    >>> euler_number(ring)        # one loop
    0
    """
    connectivity = check_connectivity(connectivity)
    return euler_from_histogram(configuration_histogram(as_volume(pores)), connectivity)


def n_components(pores: np.ndarray, connectivity: int = 26) -> int:
    """Number of connected pore components (``scipy.ndimage.label``).

    Parameters
    ----------
    pores : numpy.ndarray
        Binary ``(Z, Y, X)`` volume, 1 = pore.
    connectivity : {26, 6}
        Neighbourhood of a pore voxel: faces, edges and corners (26) or faces only (6).

    Returns
    -------
    int
    """
    connectivity = check_connectivity(connectivity)
    vol = as_volume(pores)
    structure = ndi.generate_binary_structure(3, 3 if connectivity == 26 else 1)
    labels = np.empty(vol.shape, np.int32)  # int32: enough for any volume below 2**31 voxels
    return int(ndi.label(vol, structure=structure, output=labels))


def n_cavities(pores: np.ndarray) -> int:
    """Number of cavities of the pore phase: solid pieces (6-connected) enclosed by pore.

    The volume is surrounded by solid, as for :func:`euler_number`, so a solid component that
    touches a face of the volume joins the outside and is not a cavity. This is the second Betti
    number b2 of the 26-connected pore phase.

    Examples
    --------
    >>> shell = np.ones((5, 5, 5), np.uint8); shell[2, 2, 2] = 0   # one enclosed solid voxel
    >>> n_cavities(shell), n_cavities(1 - shell)
    (1, 0)
    """
    vol = as_volume(pores)
    structure = ndi.generate_binary_structure(3, 1)
    labels = np.empty(vol.shape, np.int64)
    n = int(ndi.label(~vol, structure=structure, output=labels))
    if n == 0:
        return 0
    faces = (labels[0], labels[-1], labels[:, 0], labels[:, -1], labels[:, :, 0], labels[:, :, -1])
    outside = np.unique(np.concatenate([f.ravel() for f in faces]))
    return n - int(np.count_nonzero(outside))


def betti_numbers(pores: np.ndarray) -> tuple[int, int, int]:
    """Betti numbers ``(b0, b1, b2)`` of the pore phase (26-connected pores, 6-connected solid).

    ``b0`` counts pores (components), ``b2`` cavities (:func:`n_cavities`) and ``b1`` tunnels:
    ``b1 = b0 + b2 - χ`` with χ the Euler number. Unlike χ alone, an error in b0 cannot cancel an
    error in b1.

    Examples
    --------
    >>> torus = np.zeros((3, 5, 5), np.uint8); torus[1, 1:4, 1:4] = 1; torus[1, 2, 2] = 0
    >>> betti_numbers(torus)
    (1, 1, 0)
    >>> ball = np.zeros((5, 5, 5), np.uint8); ball[1:4, 1:4, 1:4] = 1
    >>> betti_numbers(ball), betti_numbers(1 - ball)
    ((1, 0, 0), (1, 0, 1))
    """
    vol = as_volume(pores)
    b0, b2 = n_components(vol, 26), n_cavities(vol)
    return b0, b0 + b2 - euler_number(vol, 26), b2

