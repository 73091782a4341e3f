"""Connected, isolated and percolating porosity, streamed slab by slab along z, exactly.

Pores are 26-connected, as everywhere in ctpore. A pore component is **connected** when it
touches the sample's outer surface: a voxel on a face of the volume, or one with a 26-neighbour
outside the sample. The others are **isolated**. A component **percolates** along an axis when
it touches both faces of the sample across that axis.

Which axes have faces is decided from the sample alone (:func:`sample_faces`): along an axis, the
first and last planes of the sample's extent are faces when each holds at least half of the
sample's largest section across that axis. A block (or the whole volume) has faces on every axis;
a core standing along z has them top and bottom only: across it the extent ends on a line, and the
percolation there is null. (A block turned about z has no faces across y and x for the same
reason.)

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

from typing import Optional

import numpy as np
from scipy import ndimage as ndi

from ctpore.data.binary import as_volume
from ctpore.data.slabs import SlabComponents

__all__ = ["sample_faces", "plane_counts", "PoreConnectivity"]

_SURFACE = 6  # flag bit: touches the sample's outer surface; bits 0..5: low/high face of z, y, x
_CUBE = np.ones((3, 3, 3), bool)


def plane_counts(sample: Optional[np.ndarray], shape: tuple) -> tuple:
    """Sample voxels per plane across each axis (z, y, x) of a slab (None: every voxel)."""
    if sample is None:
        n, y, x = shape
        return (np.full(n, y * x, np.int64), np.full(y, n * x, np.int64), np.full(x, n * y, np.int64))
    s = np.asarray(sample, bool)
    return (s.sum(axis=(1, 2), dtype=np.int64), s.sum(axis=(0, 2), dtype=np.int64), s.sum(axis=(0, 1), dtype=np.int64))


def sample_faces(counts: Optional[tuple], shape: tuple) -> list:
    """Per axis (z, y, x): ``(low, high)`` plane indices of the sample's faces, or None where the axis
    has none (module docstring). ``counts``: :func:`plane_counts` summed over the slabs (None: the
    sample is every voxel)."""
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
    return faces


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
