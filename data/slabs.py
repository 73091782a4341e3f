"""Topology of a volume fed slab by slab along z: exact, without ever holding the volume.

:class:`SlabComponents` labels connected components per slab and joins them across slab
boundaries with a union-find (counts, sizes, and the small ones to remove); :class:`StreamingTopology`
adds the Euler numbers (additive over the vertex planes between slices) and the BoneJ edge
correction (from the stack's six faces). Both give exactly what :mod:`ctpore.data.topology` and
:mod:`ctpore.data.connectivity` give on the whole volume.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import ndimage as ndi

from ctpore.data.binary import as_volume, check_connectivity, check_spacing
from ctpore.data.connectivity import edge_correction_faces, per_volume
from ctpore.data.topology import (
    SLAB_VOXELS,
    betti_numbers,  # noqa: F401 (the examples use it)
    euler_from_histogram,
    euler_number,  # noqa: F401 (the examples use it)
    n_components,  # noqa: F401 (the examples use it)
    plane_histogram,
)

__all__ = ["SlabComponents", "StreamingTopology"]

#: The largest label count m for which the pair (i, j) of labels fits one int64 key i*m + j.
_KEY_LIMIT = 3_037_000_499  # floor(sqrt(2**63 - 1))


class SlabComponents:
    """Connected components of a binary volume fed slab by slab along z, joined by a union-find.

    :meth:`add` labels each slab on its own (``scipy.ndimage.label``), numbers its components
    after those of the earlier slabs, and joins those that touch across the boundary with the
    previous slab (the 9 neighbours below for 26-connectivity, the one below for 6). Only the
    last slice's labels are kept, so memory follows the slab. :meth:`sizes` then gives each
    component's voxel count by root, and :meth:`labels` relabels a slab with the final
    components (the labelling is deterministic, so a second pass sees the same numbers).

    Parameters
    ----------
    connectivity : {26, 6}
    """

    def __init__(self, connectivity: int = 26):
        self.connectivity = check_connectivity(connectivity)
        self._structure = ndi.generate_binary_structure(3, 3 if connectivity == 26 else 1)
        self._offsets: list[int] = []  # first global label of each slab, in order
        self._prev: np.ndarray | None = None  # global labels of the last slice added
        self._parent = np.zeros(1, np.int64)  # label 0: background
        self._size = np.zeros(1, np.int64)
        self._border = np.zeros(1, bool)  # the label has a voxel on a side face or on the first slice
        self._peak = np.full(1, -np.inf)  # the largest value given to :meth:`add` over the label's voxels
        self._flags = np.zeros(1, np.uint8)  # bits a caller sets (:meth:`mark`), OR-ed over a component
        self._unions = 0

    @property
    def n_labels(self) -> int:
        return len(self._parent) - 1

    def _label(self, mask: np.ndarray, index: int | None = None, offset: int | None = None) -> np.ndarray:
        labels = np.empty(mask.shape, np.int64)
        n = ndi.label(mask, structure=self._structure, output=labels)
        first = offset if offset is not None else self.n_labels if index is None else self._offsets[index]
        if first:
            labels[labels > 0] += first
        return labels, n

    def add(self, mask: np.ndarray, values: np.ndarray | None = None) -> np.ndarray:
        """The next ``(n, Y, X)`` slab (bool or 0/1); ``values`` (same shape), when given, feed
        each component's peak (:meth:`peak_below`). Returns the slab's global labels (as numbered
        now: :meth:`roots` maps them to their components)."""
        summary = self.summarize(mask, values)
        first = self.n_labels
        self.join(summary)
        labels = summary.pop("labels")
        labels[labels > 0] += first
        return labels

    def summarize(self, mask: np.ndarray, values: np.ndarray | None = None) -> dict:
        """What :meth:`join` needs of one slab, computed from the slab alone (in another process,
        for a scan split across workers): its component count ``n``, each component's ``size``,
        whether it touches a side face (``side``), its ``peak`` value, and its labels on the
        slab's ``first`` and ``last`` slices; ``labels``, the slab's own labels 1..n, is for the
        caller (pop it before sending the summary anywhere)."""
        labels, n = self._label(mask, offset=0)
        side = np.zeros(n + 1, bool)
        for f in (labels[:, 0], labels[:, -1], labels[:, :, 0], labels[:, :, -1]):
            side[f.ravel()] = True
        peak = np.full(n + 1, -np.inf)  # index 0: the background
        if values is not None and n:
            np.maximum.at(peak, labels.ravel(), np.asarray(values, np.float64).ravel())
        small = np.min_scalar_type(n)
        return {"n": int(n), "size": np.bincount(labels.ravel(), minlength=n + 1)[1:], "side": side[1:],
                "peak": peak[1:], "first": labels[0].astype(small), "last": labels[-1].astype(small),
                "labels": labels}

    def join(self, summary: dict) -> None:
        """The next slab along z, as :meth:`summarize` described it: its components are numbered
        after those of the slabs joined before it, and joined with those they touch across the
        boundary with the previous slab (the 9 neighbours below for 26-connectivity, the one below
        for 6)."""
        n = summary["n"]
        first = self.n_labels + 1
        self._offsets.append(self.n_labels)
        self._parent = np.concatenate([self._parent, np.arange(first, first + n)])
        self._size = np.concatenate([self._size, np.asarray(summary["size"], np.int64)])
        border = np.array(summary["side"], bool)
        head = np.asarray(summary["first"], np.int64)
        if len(self._offsets) == 1:  # the first slab: its first slice is a face of the volume
            border[head[head > 0] - 1] = True
        self._border = np.concatenate([self._border, border])
        self._peak = np.concatenate([self._peak, np.asarray(summary["peak"], np.float64)])
        self._flags = np.concatenate([self._flags, np.zeros(n, np.uint8)])
        if self._prev is not None and n:
            below, above = self._prev, np.where(head > 0, head + (first - 1), 0)
            yn, xn = below.shape
            shifts = ((dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)) if self.connectivity == 26 else [(0, 0)]
            pairs = []
            for dy, dx in shifts:
                a = above[max(0, dy): yn + min(0, dy), max(0, dx): xn + min(0, dx)]
                b = below[max(0, -dy): yn + min(0, -dy), max(0, -dx): xn + min(0, -dx)]
                hit = (a > 0) & (b > 0)
                if hit.any():
                    pairs.append(np.stack([a[hit], b[hit]], axis=1))
            if pairs:
                both = np.concatenate(pairs).astype(np.int64)
                m = int(both.max()) + 1
                if m <= _KEY_LIMIT:  # (i, j) as one key i*m + j: np.unique in 1-D, same order as axis=0
                    keys = np.unique(both[:, 0] * m + both[:, 1])
                    uniq = zip((keys // m).tolist(), (keys % m).tolist())
                else:  # labels too large for one int64 key
                    uniq = np.unique(both, axis=0).tolist()
                for i, j in uniq:
                    ri, rj = self._find(int(i)), self._find(int(j))
                    if ri != rj:
                        lo, hi = min(ri, rj), max(ri, rj)
                        self._parent[hi] = lo
                        self._size[lo] += self._size[hi]
                        self._border[lo] |= self._border[hi]
                        self._peak[lo] = max(self._peak[lo], self._peak[hi])
                        self._flags[lo] |= self._flags[hi]
                        self._unions += 1
        last = np.asarray(summary["last"], np.int64)
        self._prev = np.where(last > 0, last + (first - 1), 0)

    def slab_part(self, per_label: np.ndarray, index: int) -> np.ndarray:
        """The part of a per-label array (index = global label, as :meth:`small` gives) that slab
        ``index`` needs, indexed by its own labels 1..n (0: the background, ``per_label[0]``): what a
        worker applies to its slab with :meth:`own_labels`."""
        a = self._offsets[index]
        b = self._offsets[index + 1] if index + 1 < len(self._offsets) else self.n_labels
        return np.concatenate([per_label[:1], per_label[a + 1: b + 1]])

    def own_labels(self, mask: np.ndarray) -> np.ndarray:
        """A slab's own labels 1..n, as :meth:`summarize` numbers them (deterministic)."""
        return self._label(mask, offset=0)[0]

    def mark(self, labels: np.ndarray, bit: int) -> None:
        """Set flag ``bit`` (0..7) on the components of ``labels`` (global labels; 0 is ignored)."""
        hit = np.unique(labels[labels > 0])
        while hit.size:  # up the trees, all at once
            up = self._parent[hit]
            done = up == hit
            self._flags[hit[done]] |= np.uint8(1 << bit)
            hit = np.unique(up[~done])

    def flags(self) -> np.ndarray:
        """The flags of every label's component (index = label; label 0: 0)."""
        out = np.zeros_like(self._flags)
        roots = self.roots()
        np.bitwise_or.at(out, roots, self._flags)
        return out[roots]

    def sizes(self) -> np.ndarray:
        """Voxels of every label's component (index = label; label 0: 0)."""
        out = self._size[self.roots()].copy()
        out[0] = 0
        return out

    def _find(self, i: int) -> int:
        root = i
        while self._parent[root] != root:
            root = int(self._parent[root])
        while self._parent[i] != root:  # path compression
            self._parent[i], i = root, int(self._parent[i])
        return root

    def n_components(self) -> int:
        """Number of components of everything added."""
        return self.n_labels - self._unions

    def n_enclosed(self) -> int:
        """Number of components that touch no face of the volume (the first and last slices and
        the four sides of every slab): for the solid phase, the cavities of the pore phase."""
        if self._prev is None:
            return 0
        roots = self.roots()
        touching = np.zeros(len(roots), bool)
        touching[roots[self._border]] = True
        last = self._prev[self._prev > 0]
        touching[roots[last]] = True  # the last slice added is a face too
        own = roots == np.arange(len(roots))
        own[0] = False
        return int(np.count_nonzero(own & ~touching))

    def roots(self) -> np.ndarray:
        """The root of every label (index = label; 0 stays 0)."""
        roots = self._parent.copy()
        while True:
            nxt = roots[roots]
            if np.array_equal(nxt, roots):
                return roots
            roots = nxt

    def small(self, min_size: int) -> np.ndarray:
        """Bool per label: its component has fewer than ``min_size`` voxels (label 0: False)."""
        roots = self.roots()
        out = self._size[roots] < min_size
        out[0] = False
        return out

    def peak_below(self, level: float) -> np.ndarray:
        """Bool per label: the largest value its component was given is below ``level`` (label 0:
        False)."""
        out = self._peak[self.roots()] < level
        out[0] = False
        return out

    def labels(self, mask: np.ndarray, index: int) -> np.ndarray:
        """Global labels of slab ``index`` (the same ``mask`` as was added as that slab)."""
        return self._label(mask, index)[0]


class StreamingTopology:
    """Euler numbers, pore components and connectivity of a volume fed slab by slab along z.

    ``add`` the slabs in order (each ``(n, Y, X)``, binary), then read the results. Exact: the
    same numbers as :func:`euler_number`, :func:`n_components` and :func:`connectivity_density`
    on the whole volume, which is never held. The Euler numbers come from the configuration
    histogram, additive over the vertex planes between consecutive slices (one slice is carried
    from slab to slab); pore components (26-connected) are joined across slab boundaries by
    :class:`SlabComponents`; the edge correction needs only the stack's six faces, which are
    collected (``Z * (2Y + 2X)`` bytes).

    Examples
    --------
    >>> vol = np.zeros((6, 5, 5), np.uint8); vol[1:5, 1:4, 1:4] = 1; vol[2:4, 2, 2] = 0
    >>> st = StreamingTopology()
    >>> for z in range(0, 6, 4):
    ...     st.add(vol[z:z + 4])
    >>> st.euler_number(26) == euler_number(vol), st.n_components() == n_components(vol)
    (True, True)
    >>> st.betti_numbers() == betti_numbers(vol)
    True
    """

    def __init__(self, components: bool = True):
        self.hist = np.zeros(256, np.int64)
        self.shape: list[int] | None = None  # (Z so far, Y, X)
        self._prev: np.ndarray | None = None  # last slice added, uint8 (Y, X)
        self._first: np.ndarray | None = None
        self._sides: list[tuple[np.ndarray, ...]] = []  # per slab: (ylo, yhi, xlo, xhi)
        self._components = SlabComponents(26) if components else None
        self._solid = SlabComponents(6) if components else None  # for the cavities (b2)
        self._betti: tuple | None = None  # (slices added, (b0, b1, b2)) when last computed
        self.n_pore_voxels = 0

    def add(self, slab: np.ndarray) -> None:
        """The next ``(n, Y, X)`` slab of the volume (binary, 1 = pore)."""
        self.join(self.summarize(slab))

    def summarize(self, slab: np.ndarray) -> dict:
        """What :meth:`join` needs of one ``(n, Y, X)`` slab, computed from the slab alone (in
        another process, for a scan split across workers): the configuration histogram of the
        vertex planes inside it, its first and last slices, its four sides, its pore voxels and its
        components' summaries (:meth:`SlabComponents.summarize`)."""
        s = as_volume(slab, "slab").view(np.uint8)
        n, y, x = s.shape
        hist = np.zeros(256, np.int64)
        step = max(1, SLAB_VOXELS // ((y + 1) * (x + 1)))
        for a in range(1, n, step):  # the planes between its slices (the one before it is the join's)
            hist += plane_histogram(s[a - 1: min(n, a + step)])
        out = {"n": n, "hist": hist, "first": s[0].copy(), "last": s[-1].copy(),
               "sides": (s[:, 0].copy(), s[:, -1].copy(), s[:, :, 0].copy(), s[:, :, -1].copy()),
               "pore_voxels": int(np.count_nonzero(s))}
        if self._components is not None:
            out["pores"] = self._components.summarize(s)
            out["solid"] = self._solid.summarize(s == 0)
            del out["pores"]["labels"], out["solid"]["labels"]
        return out

    def join(self, summary: dict) -> None:
        """The next slab along z, as :meth:`summarize` described it."""
        first = summary["first"]
        y, x = first.shape
        if self.shape is None:
            self.shape, self._first = [0, y, x], first.copy()
            self._prev = np.zeros((y, x), np.uint8)
        elif (y, x) != tuple(self.shape[1:]):
            raise ValueError(f"slab plane {(y, x)} differs from the volume's {tuple(self.shape[1:])}")
        self.hist += plane_histogram(np.stack([self._prev, first])) + summary["hist"]
        self._sides.append(tuple(summary["sides"]))
        self.n_pore_voxels += int(summary["pore_voxels"])
        if self._components is not None:
            self._components.join(summary["pores"])
            self._solid.join(summary["solid"])
        self._prev = summary["last"].copy()
        self.shape[0] += int(summary["n"])

    def euler_number(self, connectivity: int = 26) -> int:
        """χ of the pore phase added so far, as :func:`euler_number` (surrounded by solid)."""
        if self.shape is None:
            raise ValueError("no slab was added")
        y, x = self.shape[1:]
        closing = plane_histogram(np.stack([self._prev, np.zeros((y, x), np.uint8)]))
        return euler_from_histogram(self.hist + closing, check_connectivity(connectivity))

    def n_components(self) -> int:
        """Number of 26-connected pore components, as :func:`n_components`."""
        if self._components is None:
            raise ValueError("this StreamingTopology was made with components=False")
        return self._components.n_components()

    def betti_numbers(self) -> tuple[int, int, int]:
        """``(b0, b1, b2)`` of the pore phase, as :func:`~ctpore.data.topology.betti_numbers`:
        pores, tunnels (b0 + b2 - χ) and cavities (solid components that touch no face). Computed
        once for the slices added so far (every metric that reads them asks)."""
        z = self.shape[0] if self.shape is not None else 0
        if self._betti is None or self._betti[0] != z:
            b0 = self.n_components()
            b2 = self._solid.n_enclosed()
            self._betti = (z, (b0, b0 + b2 - self.euler_number(26), b2))
        return self._betti[1]

    def connectivity_density(self, spacing_mm: Sequence[float] = (1.0, 1.0, 1.0),
                             n_voxels: int | None = None) -> float:
        """BoneJ connectivity density per mm³, as :func:`connectivity_density`; per the volume of
        ``n_voxels`` voxels when given (a sample smaller than the stack), else of the whole stack."""
        s = check_spacing(spacing_mm)
        if not self.n_pore_voxels:
            return 0.0
        sides = [np.concatenate([sl[i] for sl in self._sides]) for i in range(4)]
        corr = edge_correction_faces(self._first, self._prev, *sides)
        shape = tuple(self.shape) if n_voxels is None or n_voxels == int(np.prod(self.shape)) else (int(n_voxels),)
        return per_volume(1.0 - (self.euler_number(26) - corr), shape, s)
