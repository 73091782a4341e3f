"""Opening scans and labels: :func:`load_scan` (with the slice-axis hint), :func:`read_volume`,
:func:`read_label` (0/1 only, cut as its scan) and :func:`label_slice_axis`.

The lazy reading itself is :class:`~ctpore.data.io.scan.Scan`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from ctpore.data.io.geometry import Geometry, slice_axis_hint
from ctpore.data.io.registry import find_format
from ctpore.data.io.scan import Scan, allocate, chunk_slices
from ctpore.errors import CtporeWarning, InputError

__all__ = ["load_scan", "read_volume", "read_label", "label_slice_axis"]


def load_scan(path: str | Path, slice_axis: int | None = None) -> Scan:
    """Open a scan for lazy reading.

    Parameters
    ----------
    path : str or Path
        ``.nii``, ``.nii.gz``, ``.tif``/``.tiff`` (multi-page, a single 3D page, or an ImageJ
        stack), HDF5 (``.h5``, ``.hdf5``, ``.hdf``; ``scan.h5:/group/name`` picks a dataset),
        MetaImage (``.mhd`` with its data file, ``.mha``), OME-Zarr (``.ome.zarr``, ``.zarr``), or a
        folder of single-slice TIFF, PNG, BMP or JPEG files (natural order). The table of formats
        is :data:`ctpore.data.io.registry.READERS`.
    slice_axis : int, optional
        NIfTI: the file axis (0, 1, 2) that is Z; default 2. Other formats: None or 0.

    Returns
    -------
    Scan

    Warns
    -----
    CtporeWarning
        When another file axis looks more like the slice axis than the chosen one (non-square
        in-plane pixels that another axis would make square; see
        :func:`ctpore.data.io.geometry.slice_axis_hint`), naming the ``--slice-axis`` to try.

    Raises
    ------
    InputError
        One line naming the file: missing, empty, truncated or corrupt, not NIfTI/TIFF,
        unsupported type, 2D, several volumes, colour, slices of different shapes, bad slice axis.
        A truncated ``.nii.gz`` is caught here (see ``NiftiReader._check_gzip_complete``). A header
        that describes more data than the file can hold (past its end, or beyond the 1032:1 that
        deflate can expand) is refused before anything is allocated, and so is a scan whose slice
        (or whatever must be held whole) does not fit in memory; a ``MemoryError`` while opening
        or reading becomes an :class:`InputError` that says the scan does not fit in memory.
    """
    scan = Scan(path, slice_axis)
    hint = slice_axis_hint(scan.geometry)
    if hint is not None:
        axis, why = hint
        # stacklevel 1: the same hint for the same scan is shown once per process, however often it is opened
        warnings.warn(f"{scan.path}: {why}; if the slices run along file axis {axis}, pass --slice-axis {axis} "
                      f"(slice_axis={axis} in Python)", CtporeWarning, stacklevel=1)
    return scan


def read_volume(path: str | Path, slice_axis: int | None = None) -> tuple[np.ndarray, Geometry]:
    """Read a whole scan: ``((Z, Y, X) float32, Geometry)``. See :func:`load_scan`."""
    with load_scan(path, slice_axis) as scan:
        return scan.read(), scan.geometry


def read_label(
    path: str | Path, slice_axis: int | None = None, like: Geometry | None = None
) -> np.ndarray:
    """Read a binary label volume (1 = pore, 0 = solid) as uint8 ``(Z, Y, X)``.

    Parameters
    ----------
    path : str or Path
        Label file or folder (same formats as :func:`load_scan`).
    slice_axis : int, optional
        As for :func:`load_scan`. When None, :func:`label_slice_axis` decides (the scan's slice
        axis when both formats let it be chosen), so the label is cut the same way as its scan.
    like : Geometry, optional
        The scan's geometry; the label's ``(Z, Y, X)`` shape must equal it.

    Raises
    ------
    InputError
        Values other than 0 and 1 (the message lists the values found), a shape that differs
        from ``like`` (both shapes are given), or anything :func:`load_scan` refuses.
    """
    path = Path(path)
    if slice_axis is None:
        slice_axis = label_slice_axis(like, path)
    with Scan(path, slice_axis) as scan:  # not load_scan: the scan's own hint is enough
        if like is not None and tuple(scan.shape) != tuple(like.shape):
            raise InputError(
                f"label shape (Z, Y, X) = {scan.shape} differs from the scan's {tuple(like.shape)}; "
                "the label must cover the same voxels as the scan",
                path,
            )
        out = allocate(path, scan.shape, np.uint8, "reading the whole label")  # (Z, Y, X)
        others: set[float] = set()
        step = chunk_slices(scan.shape)
        for z0 in range(0, scan.shape[0], step):
            z1 = min(scan.shape[0], z0 + step)
            chunk = scan.read_slices(z0, z1)
            odd = (chunk != 0) & (chunk != 1)
            if odd.any():
                others.update(np.unique(chunk[odd]).tolist())
                if len(others) > 20:
                    break
            out[z0:z1] = chunk
    if others:
        values = sorted(others)
        shown = ", ".join(f"{v:g}" for v in values[:10]) + (", ..." if len(values) > 10 else "")
        raise InputError(
            f"a label must hold only 0 (solid) and 1 (pore), found also {shown}; "
            "binarize it first (1 = pore)",
            path,
        )
    return out


def label_slice_axis(like: Geometry | None, label_path: str | Path) -> int | None:
    """The slice axis to read a label with so that it is cut as its scan was.

    ``like.slice_axis`` when the scan's format and the label's both let the slice axis be chosen
    (e.g. both NIfTI); None (the label format's own slices) otherwise, or when ``like`` is None.
    """
    if like is None or not like.slice_axis_choosable:
        return None
    try:
        fmt = find_format(label_path)
    except InputError:
        return None  # load_scan says what is wrong with the label
    return like.slice_axis if fmt is not None and fmt.slice_axis_choosable else None
