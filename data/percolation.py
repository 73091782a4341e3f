"""Connected, isolated and percolating porosity, streamed slab by slab along z, exactly.

Pores are 26-connected, as everywhere in ctpore. A pore component is **connected** when it
touches the sample's outer surface: a voxel on a face of the volume, or one with a 26-neighbour
outside the sample. The others are **isolated**. A component **percolates** along an axis when
it touches both faces of the sample across that axis.

Which axes have faces is decided from the sample alone (:func:`sample_faces`): along an axis, the
first and last planes of the sample's extent are faces when each holds at least half of the
sample's largest section across that axis. A block (or the whole volume) has faces on every axis;
a core standing along z has them top and bottom only: across it the extent ends on a line, and the
percolation there is null. A block turned about z (a prism whose section is a rectangle turned in
the slice plane) has its side faces on slanted planes: given the sample's footprint (its voxels seen
along z), :func:`sample_faces` finds the least-area rectangle about it, and when the footprint fills
it (95%) the faces across the second and third axes are the rectangle's sides nearest y and x
(:class:`TurnedFace`: the footprint's pixels within a pixel's reach of each side); its percolation
figures are then along the block's own sides, turned by ``turned_deg``.

:class:`PoreConnectivity` joins components across slab boundaries with the union-find of
:class:`~ctpore.data.slabs.SlabComponents`, which carries each component's flags (touches the
surface; touches the low or high face of z, y, x). Memory follows the slab and the number of
components.

Examples
--------
>>> import numpy as np
>>> pores = np.zeros((6, 6, 6), np.uint8); pores[:, 2, 2] = 1; pores[2, 4, 4] = 1
>>> pc = PoreConnectivity(pores.shape, faces=sample_faces(None, pores.shape))
>>> for z in range(0, 6, 4):
...     pc.add(pores[z:z + 4])
>>> r = pc.result()
>>> r["percolates_zyx"], round(r["isolated_porosity"] * 216)
([True, False, False], 1)
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
from scipy import ndimage as ndi

from ctpore.data.binary import as_volume
from ctpore.data.slabs import SlabComponents

__all__ = ["sample_faces", "plane_counts", "PoreConnectivity", "TurnedFace", "FILL"]

_SURFACE = 6  # flag bit: touches the sample's outer surface; bits 0..5: low/high face of z, y, x
_CUBE = np.ones((3, 3, 3), bool)


def plane_counts(sample: Optional[np.ndarray], shape: tuple) -> tuple:
    """Sample voxels per plane across each axis (z, y, x) of a slab (None: every voxel)."""
    if sample is None:
        n, y, x = shape
        return (np.full(n, y * x, np.int64), np.full(y, n * x, np.int64), np.full(x, n * y, np.int64))
    s = np.asarray(sample, bool)
    return (s.sum(axis=(1, 2), dtype=np.int64), s.sum(axis=(0, 2), dtype=np.int64), s.sum(axis=(0, 1), dtype=np.int64))


#: The share of its least-area rectangle a footprint fills to be a turned block's.
FILL = 0.95


class TurnedFace(NamedTuple):
    """The two faces of a turned block across one axis: bool ``(Y, X)`` masks of the footprint's
    pixels on its low and high side, and how far the side's normal is turned from the axis."""

    low: np.ndarray
    high: np.ndarray
    turned_deg: float

    def describe(self) -> dict:
        return {"turned_deg": round(self.turned_deg, 2)}


def sample_faces(counts: Optional[tuple], shape: tuple, footprint: Optional[np.ndarray] = None) -> list:
    """Per axis (z, y, x): ``(low, high)`` plane indices of the sample's faces, a :class:`TurnedFace`,
    or None where the axis has none (module docstring). ``counts``: :func:`plane_counts` summed over
    the slabs (None: the sample is every voxel); ``footprint``: the sample's voxels seen along z
    (bool ``(Y, X)``, the union of its slices), for a turned block's faces."""
    if counts is None:
        return [(0, int(n) - 1) for n in shape]
    faces = []
    for c in counts:
        c = np.asarray(c)
        on = np.flatnonzero(c)
        if on.size == 0:
            faces.append(None)
            continue
        lo, hi, peak = int(on[0]), int(on[-1]), int(c.max())
        faces.append((lo, hi) if hi > lo and 2 * c[lo] >= peak and 2 * c[hi] >= peak else None)
    if footprint is not None and faces[1] is None and faces[2] is None and \
            int(np.asarray(counts[0]).max()) >= FILL * int(np.count_nonzero(footprint)):  # a prism along z
        turned = _turned_faces(np.asarray(footprint, bool))
        if turned is not None:
            faces[1], faces[2] = turned
    return faces


def _turned_faces(footprint: np.ndarray) -> Optional[tuple]:
    """The faces of a footprint that fills its least-area rectangle (:data:`FILL`), turned by at least
    a degree: ``(across y, across x)`` :class:`TurnedFace`, or None."""
    from scipy.spatial import ConvexHull, QhullError

    yy, xx = np.nonzero(footprint)
    if yy.size < 16:
        return None
    pts = np.stack([xx, yy], axis=1).astype(np.float64)
    try:
        hull = pts[ConvexHull(pts).vertices]
    except QhullError:  # a line of pixels
        return None
    best = None
    for i in range(len(hull)):  # the least-area rectangle has a side along an edge of the hull
        ex, ey = hull[(i + 1) % len(hull)] - hull[i]
        a = np.arctan2(ey, ex) % (np.pi / 2)
        u = hull[:, 0] * np.cos(a) + hull[:, 1] * np.sin(a)
        v = -hull[:, 0] * np.sin(a) + hull[:, 1] * np.cos(a)
        area = (np.ptp(u) + 1) * (np.ptp(v) + 1)  # pixels are a unit wide
        if best is None or area < best[0]:
            best = (area, a)
    area, a = best
    a = a - np.pi / 2 if a > np.pi / 4 else a  # in (-45, 45] degrees
    if abs(np.degrees(a)) < 1.0 or yy.size < FILL * area:
        return None
    reach = max(abs(np.cos(a)), abs(np.sin(a))) + 1e-9  # a side's pixels lie within this of its line
    y, x = np.indices(footprint.shape, dtype=np.float64)
    out = []
    for s in (-x * np.sin(a) + y * np.cos(a), x * np.cos(a) + y * np.sin(a)):  # across y, across x
        lo, hi = float(s[footprint].min()), float(s[footprint].max())
        out.append(TurnedFace(footprint & (s <= lo + reach), footprint & (s >= hi - reach), float(np.degrees(a))))
    return tuple(out)


class PoreConnectivity:
    """Connected, isolated and percolating porosity of a pore volume fed slab by slab along z.

    Parameters
    ----------
    shape : tuple
        ``(Z, Y, X)`` of the volume.
    faces : list
        :func:`sample_faces`: per axis, the planes of its two faces, or None.
    """

    def __init__(self, shape: tuple, faces: list):
        self.shape = tuple(int(s) for s in shape)
        self.faces = list(faces)
        self._components = SlabComponents(26)
        self._z = 0
        self._prev: Optional[tuple] = None  # (labels, sample) of the last slice added
        self.n_pore = 0
        self.n_sample = 0

    def add(self, pores: np.ndarray, sample: Optional[np.ndarray] = None) -> None:
        """The next ``(n, Y, X)`` slab of pores (0/1, taken as solid outside the sample) and of the
        sample (bool; None: every voxel)."""
        p = as_volume(pores, "pores")
        smp = np.ones(p.shape, bool) if sample is None else np.asarray(sample, bool)
        p = p & smp
        n = p.shape[0]
        self.n_pore += int(np.count_nonzero(p))
        self.n_sample += int(np.count_nonzero(smp))
        comp = self._components
        labels = comp.add(p)
        z0, z1 = self._z, self._z + n
        # the surface: outside-the-sample voxels next to pores, the previous slice included (its
        # neighbours above were unknown when it came)
        if self._prev is not None:
            lab_w = np.concatenate([self._prev[0][None], labels])
            out_w = ~np.concatenate([self._prev[1][None], smp])
        else:
            lab_w, out_w = labels, ~smp
        if out_w.any():
            near = ndi.binary_dilation(out_w, _CUBE)
            comp.mark(lab_w[near], _SURFACE)
        comp.mark(labels[:, [0, -1]], _SURFACE)  # the volume's sides
        comp.mark(labels[:, :, [0, -1]], _SURFACE)
        if z0 == 0:
            comp.mark(labels[0], _SURFACE)
        if z1 == self.shape[0]:
            comp.mark(labels[-1], _SURFACE)
        for axis, face in enumerate(self.faces):
            if face is None:
                continue
            if isinstance(face, TurnedFace):  # a prism: the same pixels in every slice
                comp.mark(labels[:, face.low], 2 * axis)
                comp.mark(labels[:, face.high], 2 * axis + 1)
                continue
            for side, plane in enumerate(face):
                if axis == 0:
                    if z0 <= plane < z1:
                        comp.mark(labels[plane - z0], 2 * axis + side)
                else:
                    comp.mark(np.take(labels, plane, axis=axis), 2 * axis + side)
        self._prev = (labels[-1].copy(), smp[-1].copy())
        self._z = z1

    def result(self) -> dict:
        """``connected_porosity``, ``isolated_porosity`` (fractions of the sample's voxels),
        ``percolating_porosity_zyx`` and ``percolates_zyx`` (None across an axis without faces),
        and ``n_pores_connected``."""
        if self._z != self.shape[0]:
            raise ValueError(f"{self._z} of {self.shape[0]} slices were added")
        comp = self._components
        roots = comp.roots()
        own = roots == np.arange(len(roots))
        own[0] = False
        flags, sizes = comp.flags()[own], comp.sizes()[own]
        denom = max(self.n_sample, 1)
        surf = (flags >> _SURFACE) & 1 == 1
        connected = int(sizes[surf].sum())
        perc, yes = [], []
        for axis, face in enumerate(self.faces):
            if face is None:
                perc.append(None)
                yes.append(None)
                continue
            both = ((flags >> (2 * axis)) & 1 == 1) & ((flags >> (2 * axis + 1)) & 1 == 1)
            perc.append(int(sizes[both].sum()) / denom)
            yes.append(bool(both.any()))
        return {"connected_porosity": connected / denom, "isolated_porosity": (self.n_pore - connected) / denom,
                "percolating_porosity_zyx": perc, "percolates_zyx": yes,
                "n_pores_connected": int(surf.sum())}
