"""Labels a user painted on a few slices: 0 = not labelled, 1 = pore, 2 = solid.

This is how a napari labels layer reads (0 where nothing is painted). A user paints a few slices in
any view (XY, XZ or YZ), or strokes in a few places; fine-tuning takes its loss on the labelled
voxels only, wherever they are. A dense truth (1 = pore, 0 = solid, every voxel labelled) is read
with ``dense=True`` and turned into the same codes; the two conventions are never guessed between:
a file of 0 and 1 alone read as sparse labels is refused with a line that names ``--dense``.

Labels are read through the reader table, as scans are (every format ctpore reads), cut as their
scan is, and must cover the scan's voxels (its shape, and its affine where both files have one).

Examples
--------
>>> lab = np.zeros((2, 3, 3), np.uint8); lab[0, 0, :] = PORE; lab[0, 2, :] = SOLID
>>> label_counts(lab)
{'pore': 3, 'solid': 3}
>>> check_sparse(lab, "x.nii") is lab
True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np

from ctpore.data.io.geometry import Geometry
from ctpore.data.io.load import label_slice_axis
from ctpore.data.io.scan import Scan
from ctpore.errors import InputError

__all__ = ["UNLABELLED", "PORE", "SOLID", "read_sparse_labels", "check_sparse", "from_dense", "label_counts"]

#: The codes of a sparse label volume.
UNLABELLED, PORE, SOLID = 0, 1, 2


def label_counts(labels: np.ndarray) -> dict:
    """Voxels labelled pore and solid: ``{"pore": n, "solid": n}``."""
    return {"pore": int(np.count_nonzero(labels == PORE)), "solid": int(np.count_nonzero(labels == SOLID))}


def _values(arr: np.ndarray, allowed: tuple) -> list:
    odd = ~np.isin(arr, allowed)
    return sorted(np.unique(arr[odd]).tolist()) if odd.any() else []


def from_dense(truth: Any, where: Any = "the labels") -> np.ndarray:
    """A dense truth (1 = pore, 0 = solid, every voxel) as sparse codes (1 pore, 2 solid)."""
    arr = np.asarray(truth)
    odd = _values(arr, (0, 1))
    if odd:
        shown = ", ".join(f"{v:g}" for v in odd[:6])
        raise InputError(f"a dense truth (--dense) holds only 0 (solid) and 1 (pore), found also {shown}", where)
    return np.where(arr == 1, PORE, SOLID).astype(np.uint8)


def check_sparse(labels: Any, where: Any = "the labels") -> np.ndarray:
    """``labels`` (0 not labelled, 1 pore, 2 solid) checked: only those values, some voxels labelled,
    both classes present; an :class:`InputError` with one line that says what to do otherwise."""
    arr = np.asarray(labels)
    odd = _values(arr, (UNLABELLED, PORE, SOLID))
    if odd:
        shown = ", ".join(f"{v:g}" for v in odd[:6]) + (", ..." if len(odd) > 6 else "")
        raise InputError(f"labels hold 0 (not labelled), 1 (pore) and 2 (solid) only, found also {shown}; "
                         "relabel them (a dense truth of 0 and 1: give --dense)", where)
    n = label_counts(arr)
    if n["pore"] + n["solid"] == 0:
        raise InputError("no voxel is labelled (all 0); paint some pore (1) and solid (2) voxels", where)
    if n["solid"] == 0:
        raise InputError("holds only 0 and 1: as sparse labels (0 not labelled, 1 pore, 2 solid) only pores are "
                         "labelled, and fine-tuning needs both classes to learn where a pore ends; if it is a "
                         "dense truth (1 pore, 0 solid, every voxel labelled), give --dense", where)
    if n["pore"] == 0:
        raise InputError("only solid (2) is labelled: with one class the threshold and the calibration cannot "
                         "learn where a pore ends; paint some pore (1) voxels too", where)
    return arr.astype(np.uint8, copy=False)


def read_sparse_labels(path: str | Path, like: Geometry, dense: bool = False,
                       slice_axis: Optional[int] = None) -> np.ndarray:
    """The labels of the scan ``like`` describes, as uint8 ``(Z, Y, X)`` codes (0, 1 pore, 2 solid).

    Parameters
    ----------
    path : path
        A label file or folder in any format ctpore reads.
    like : Geometry
        The scan's: the labels must have its shape (and its affine, where both files give one).
    dense : bool
        The file is a dense truth (1 = pore, 0 = solid) rather than sparse labels.
    slice_axis : int, optional
        As for the scan (default: cut as the scan was, :func:`~ctpore.data.io.load.label_slice_axis`).

    Raises
    ------
    InputError
        A shape or affine that differs from the scan's, values outside the convention, no
        labelled voxel, one class only, or a dense 0/1 file given as sparse labels.
    """
    path = Path(path)
    with Scan(path, label_slice_axis(like, path) if slice_axis is None else slice_axis) as scan:
        if tuple(scan.shape) != tuple(like.shape):
            raise InputError(f"the labels' shape (Z, Y, X) = {tuple(scan.shape)} differs from the scan's "
                             f"{tuple(like.shape)}: they must cover the same voxels", path)
        a, b = scan.geometry.affine, like.affine
        if a is not None and b is not None and not np.allclose(a, b, atol=1e-4 * max(1.0, float(np.abs(b).max()))):
            raise InputError("the labels' affine (voxel to world) differs from the scan's: they are not this scan's "
                             "labels", path)
        raw = scan.read()
    return check_sparse(from_dense(raw, path) if dense else raw, path)
