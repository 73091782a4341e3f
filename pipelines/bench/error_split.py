"""Where a probability map's voxel error lies: on the true pore boundary, or in the interior.

The benchmark's error split (``ctpore bench quality``): under blur and partial volume a boundary
voxel's label is a sub-voxel decision, so the share of the squared error that lies there says how
much of a method's MSE any method could remove.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["BoundaryErrorSplit", "boundary_voxels"]


def boundary_voxels(truth: np.ndarray) -> np.ndarray:
    """Voxels on the true pore boundary: those with a face neighbour (6-connected) of the other phase.

    Inside the volume only (its edge is no boundary). Under blur and partial volume these are the
    voxels whose label is a sub-voxel decision; the rest is the interior of a phase.

    Examples
    --------
    >>> cube = np.zeros((6, 6, 6), np.uint8); cube[1:5, 1:5, 1:5] = 1
    >>> int(boundary_voxels(cube).sum())  # 4**3 - 2**3 pore voxels and 6 * 4**2 solid ones
    152
    """
    t = np.asarray(truth).astype(bool)
    out = np.zeros(t.shape, bool)
    for axis in range(t.ndim):
        a = [slice(None)] * t.ndim
        b = [slice(None)] * t.ndim
        a[axis], b[axis] = slice(1, None), slice(None, -1)
        differ = t[tuple(a)] != t[tuple(b)]
        out[tuple(a)] |= differ
        out[tuple(b)] |= differ
    return out


class BoundaryErrorSplit:
    """Squared error of a probability map pooled over cases, split between the true boundary's voxels
    (:func:`boundary_voxels`) and the interior.

    ``add(prob, truth)`` any number of times; :meth:`summary` gives the share of voxels on the
    boundary, the MSE on boundary voxels and on interior voxels, and the share of all squared error
    that lies on the boundary.

    Examples
    --------
    >>> truth = np.zeros((1, 1, 4), np.uint8); truth[..., 2:] = 1
    >>> s = BoundaryErrorSplit(); s.add(np.array([[[0.0, 0.5, 0.5, 1.0]]]), truth)
    >>> s.summary()["mse_boundary"], s.summary()["mse_interior"], s.summary()["boundary_error_share"]
    (0.25, 0.0, 1.0)
    """

    def __init__(self) -> None:
        self.n = np.zeros(2)      # interior, boundary
        self.sse = np.zeros(2)

    def add(self, prob: np.ndarray, truth: np.ndarray, edge: Optional[np.ndarray] = None) -> None:
        """Add one case; ``edge``: its :func:`boundary_voxels`, when already computed (several methods
        scored against one truth)."""
        p = np.asarray(prob, np.float64)
        t = np.asarray(truth).astype(bool)
        if p.shape != t.shape:
            raise ValueError(f"probability and truth differ in shape: {p.shape} vs {t.shape}")
        edge = boundary_voxels(t) if edge is None else edge
        e = (p - t) ** 2
        self.n += (np.count_nonzero(~edge), np.count_nonzero(edge))
        self.sse += (float(e[~edge].sum()), float(e[edge].sum()))

    def summary(self) -> dict:
        n, sse = self.n, self.sse
        nan = float("nan")
        return {"boundary_share": float(n[1] / n.sum()) if n.sum() else nan,
                "mse_boundary": float(sse[1] / n[1]) if n[1] else nan,
                "mse_interior": float(sse[0] / n[0]) if n[0] else nan,
                "boundary_error_share": float(sse[1] / sse.sum()) if sse.sum() else nan}
