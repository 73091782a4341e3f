"""What every scan reader is: the :class:`Reader` protocol, and :class:`PlaneReader` for formats
that can only read whole planes.

A reader opens one scan (a file, a folder of slices, a store) and reads its voxels as raw values
along Z, ``(n, Y, X)`` in the file's own voxel type; :class:`ctpore.data.io.scan.Scan` turns them
into float32, checks them for NaN/Inf and caches what a sequential reader needs. Readers are
listed, one line each, in :data:`ctpore.data.io.registry.READERS`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from ctpore.data.io.geometry import Geometry

__all__ = ["Reader", "PlaneReader"]


@runtime_checkable
class Reader(Protocol):
    """A scan opened for lazy reading along Z.

    A reader is built as ``Reader(path)``, or ``Reader(path, slice_axis)`` when its format's line
    in :data:`~ctpore.data.io.registry.READERS` says the slice axis is choosable. It checks the
    sizes its header describes against the file before anything is read or allocated (a header
    that lies is refused with :func:`~ctpore.data.io.formats.truncated_error`), raises
    :class:`~ctpore.errors.InputError` for what the user must fix, and lets ``MemoryError``
    through (the caller turns it into an :class:`~ctpore.errors.InputError`).

    Attributes
    ----------
    path : Path
        What was opened (as given, e.g. ``scan.h5:/exchange/data``).
    geometry : Geometry
        Shape ``(Z, Y, X)``, spacing, units and what is needed to write results back.
    dtype : numpy.dtype
        The voxel type on disk (before any scaling); :meth:`read` returns it or a wider type.
    windowed : bool
        True when :meth:`read_window` reads only the window from disk (a memory map, HDF5
        hyperslabs, Zarr chunks). False when it must read the whole planes and crop them;
        :class:`~ctpore.data.io.scan.Scan` then reads through :meth:`read` instead.
    sequential : bool
        True when reading backwards is costly (a compressed stream, e.g. ``.nii.gz``, is
        decompressed again from its start): the Scan keeps the last chunk it read, so that
        overlapping reads (the halos of streamed chunks) do not go back in the stream.
    """

    path: Path
    geometry: Geometry
    dtype: np.dtype
    windowed: bool
    sequential: bool

    def read(self, start: int, stop: int) -> np.ndarray:
        """Slices ``start:stop`` (``0 <= start <= stop <= Z``) as ``(stop - start, Y, X)`` raw values."""
        ...

    def read_window(self, start: int, stop: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """Slices ``start:stop``, rows ``y0:y1``, columns ``x0:x1`` as ``(n, y1 - y0, x1 - x0)`` raw values."""
        ...

    def close(self) -> None:
        """Release open files; the reader is not used after this."""
        ...


class PlaneReader:
    """Base for readers that read whole planes only: not windowed, not sequential.

    :meth:`read_window` crops what ``read`` returns; a subclass defines ``read`` and ``close``.
    """

    windowed = False
    sequential = False

    def read(self, start: int, stop: int) -> np.ndarray:  # pragma: no cover - defined by subclasses
        raise NotImplementedError

    def read_window(self, start: int, stop: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """The planes ``start:stop`` read whole, cropped to rows ``y0:y1`` and columns ``x0:x1``."""
        return self.read(start, stop)[:, y0:y1, x0:x1]
