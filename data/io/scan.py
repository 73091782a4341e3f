"""A scan on disk read lazily as ``(Z, Y, X)`` float32 slices, whatever its format.

:class:`Scan` reads slices (checked for NaN/Inf), windows and the whole volume in chunks
(:func:`chunk_slices`, :func:`allocate`). Opening one by path, with the slice-axis hint, and reading
labels is :mod:`ctpore.data.io.load`.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np

from ctpore.data.io.formats import check_fits_memory, out_of_memory, reason, size_text
from ctpore.data.io.geometry import Geometry
from ctpore.data.io.registry import open_reader
from ctpore.errors import InputError
from ctpore.progress import ProgressFn

__all__ = ["Scan", "allocate", "chunk_slices", "open_reader"]

# Slices read per chunk when streaming a whole volume (about this many bytes of float32).
_CHUNK_BYTES = 64 * 2**20


def chunk_slices(shape_zyx: tuple[int, int, int]) -> int:
    """Slices per chunk when streaming a whole volume of this shape (about 64 MiB of float32)."""
    _, y, x = shape_zyx
    return max(1, _CHUNK_BYTES // max(1, 4 * y * x))


def allocate(path: Path, shape: tuple[int, ...], dtype: Any, what: str) -> np.ndarray:
    """``np.empty(shape, dtype)``, or an :class:`InputError` when memory cannot hold it."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    advice = ("use a machine with more memory, or check that the scan's shape is the one you expect "
              "(from Python, read it in chunks of slices with Scan.read_slices)")
    check_fits_memory(path, nbytes, what, advice)
    try:
        return np.empty(shape, dtype)
    except MemoryError:
        raise out_of_memory(path, f"{what} ({size_text(nbytes)})", advice) from None


def _nonfinite_message(bad: np.ndarray, start: int, stop: int, nz: int, where: str = "") -> str:
    """What :class:`Scan` says of the NaN/Inf voxels ``bad`` (a mask of slices ``start:stop`` of
    ``nz``): their number in what was read, as "at least" when other slices were not read here.

    Examples
    --------
    >>> bad = np.zeros((3, 2, 2), bool); bad[1, 0, 0] = bad[2, 1, 1] = True
    >>> _nonfinite_message(bad, 4, 7, 20).split(";")[0]
    'at least 2 voxel(s) are NaN or Inf (or too large for float32): 2 in slices 4..6, the first in slice 5'
    >>> _nonfinite_message(bad, 0, 3, 3).split(";")[0]
    '2 voxel(s) are NaN or Inf (or too large for float32), the first in slice 1'
    """
    count = int(bad.sum())
    first = start + int(np.argmax(bad.reshape(bad.shape[0], -1).any(axis=1)))
    advice = ("; ctpore never guesses values: replace them (e.g. with the scan's minimum) and try again "
              "(ctpore info counts them all: nonfinite_voxels)")
    if start == 0 and stop == nz and not where:  # the whole scan was checked
        return f"{count} voxel(s) are NaN or Inf (or too large for float32), the first in slice {first}{advice}"
    return (f"at least {count} voxel(s) are NaN or Inf (or too large for float32): {count} in slices "
            f"{start}..{stop - 1}{where}, the first in slice {first}; the rest of the scan was not checked "
            f"here{advice}")


class Scan:
    """A scan on disk, read lazily as ``(Z, Y, X)`` float32 slices.

    Parameters
    ----------
    path : str or Path
        A scan in any format of :data:`ctpore.data.io.registry.READERS` (see :func:`~ctpore.data.io.load.load_scan`).
    slice_axis : int, optional
        NIfTI only: the file axis that is Z (default 2, k). See the module docstring.

    Attributes
    ----------
    path : Path
    geometry : Geometry
    dtype : numpy.dtype
        The voxel type on disk (before NIfTI scaling; slices come back as float32).

    Notes
    -----
    ``scan[z0:z1]`` equals ``scan.read_slices(z0, z1)``, so a Scan can stand where a
    ``(Z, Y, X)`` array is read in chunks of slices. A sequential reader (``.nii.gz``, a
    compressed MetaImage) is kept open between reads (reading forward is cheap; reading
    backwards re-decompresses from the start, so the last chunk read is kept to serve
    overlapping halos). Reading a ``.nii.gz`` along i or j
    (``slice_axis`` 0 or 1) decompresses the whole data once and keeps it in memory.
    :meth:`close` releases files; a later read reopens them. A Scan pickles as its path and
    slice axis (files reopen on the worker).
    """

    def __init__(self, path: str | Path, slice_axis: int | None = None):
        self.path = Path(path)
        self._slice_axis = slice_axis
        self._lock = threading.RLock()
        self._reader = open_reader(self.path, slice_axis)
        self.geometry: Geometry = self._reader.geometry
        self.dtype: np.dtype = np.dtype(self._reader.dtype)
        self._windowed = bool(self._reader.windowed)
        self._sequential = bool(self._reader.sequential)
        self._last: tuple[int, int, np.ndarray] | None = None  # last chunk read (sequential readers only)

    # -- array-like surface ------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(Z, Y, X)``."""
        return self.geometry.shape

    @property
    def ndim(self) -> int:
        return 3

    @property
    def spacing_mm(self) -> tuple[float, float, float]:
        """``(z, y, x)`` voxel size in mm."""
        return self.geometry.spacing_mm

    @property
    def windowed(self) -> bool:
        """Whether :meth:`read_window` reads only the window from disk (else whole planes)."""
        return self._windowed

    @property
    def sequential(self) -> bool:
        """Whether reading backwards is costly (a compressed stream read from its start)."""
        return self._sequential

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"Scan({str(self.path)!r}, shape={self.shape}, format={self.geometry.format!r})"

    def __getitem__(self, key: Any) -> np.ndarray:
        """``scan[z0:z1]`` (step 1) is ``read_slices(z0, z1)``; ``scan[z]`` is one (Y, X) slice.

        A tuple ``scan[z0:z1, ...]`` reads the slices and then indexes the rest in memory.
        """
        rest: tuple = ()
        if isinstance(key, tuple):
            if not key:
                return self.read()
            key, rest = key[0], key[1:]
        nz = self.shape[0]
        if key is Ellipsis:
            out = self.read()
            return out[(Ellipsis,) + rest] if rest else out
        if isinstance(key, slice):
            start, stop, step = key.indices(nz)
            if step != 1:
                raise IndexError(f"Scan supports only slices with step 1 along Z, got step {key.step}")
            out = self.read_slices(start, max(start, stop))  # (n, Y, X)
            return out[(slice(None),) + rest] if rest else out
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            z = int(key) + nz if key < 0 else int(key)
            if not 0 <= z < nz:
                raise IndexError(f"slice {key} is out of range for {nz} slices")
            out = self.read_slices(z, z + 1)[0]  # (Y, X)
            return out[rest] if rest else out
        raise IndexError(f"Scan supports scan[z0:z1] and scan[z], got {key!r}")

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        vol = self.read()
        return vol if dtype is None else vol.astype(dtype, copy=False)

    # -- reading -----------------------------------------------------------------------------

    def _ensure_open(self):
        if self._reader is None:
            self._reader = open_reader(self.path, self._slice_axis)
        return self._reader

    def _read_unchecked(self, start: int, stop: int) -> np.ndarray:
        """Slices [start, stop) as C-contiguous float32 (n, Y, X), not checked for NaN/Inf."""
        nz = self.shape[0]
        if not (isinstance(start, (int, np.integer)) and isinstance(stop, (int, np.integer))):
            raise TypeError(f"start and stop must be integers, got {start!r}, {stop!r}")
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= nz:
            raise IndexError(f"slice range {start}..{stop} is outside 0..{nz} for {self.path.name}")
        if start == stop:
            return np.empty((0,) + self.shape[1:], np.float32)
        with self._lock:
            reader = self._ensure_open()
            cached = None
            lo = start
            if self._last is not None:
                a, b, arr = self._last
                if a <= start < b:
                    cached = arr[start - a : min(stop, b) - a]
                    lo = min(stop, b)
            try:
                fresh = reader.read(lo, stop) if lo < stop else None
            except InputError:
                raise
            except MemoryError:
                raise out_of_memory(self.path, f"reading slices {lo}..{stop - 1}") from None
            except Exception as exc:
                raise InputError(
                    f"cannot read slices {lo}..{stop - 1}: the file may be truncated or corrupt "
                    f"({reason(exc)})",
                    self.path,
                ) from exc
            parts = [p for p in (cached, fresh) if p is not None]
            try:
                with np.errstate(over="ignore", invalid="ignore"):
                    out = np.concatenate([np.asarray(p, dtype=np.float32) for p in parts], axis=0)
                if self._sequential:
                    self._last = (start, stop, out.copy())
            except MemoryError:
                raise out_of_memory(self.path, f"reading slices {start}..{stop - 1}") from None
            return out  # (n, Y, X)

    def read_slices(self, start: int, stop: int) -> np.ndarray:
        """Slices ``start`` to ``stop - 1`` along Z as float32 ``(stop - start, Y, X)``.

        Only those slices are read from disk.

        Raises
        ------
        InputError
            If a voxel in the range is NaN or Inf (ctpore does not guess values), or the file
            cannot be read (truncated, corrupt). The message names the file and slice range.
        IndexError
            If the range is outside ``0 .. Z``.
        """
        out = self._read_unchecked(start, stop)
        bad = ~np.isfinite(out)
        if bad.any():
            raise InputError(_nonfinite_message(bad, int(start), int(stop), self.shape[0]), self.path)
        return out

    def read_window(self, start: int, stop: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """Slices ``start:stop``, rows ``y0:y1``, columns ``x0:x1`` as float32 ``(n, h, w)``.

        From a windowed reader (:attr:`windowed`: uncompressed NIfTI or MetaImage, HDF5, OME-Zarr)
        only the window is read; other formats read the planes and crop them. Raises
        :class:`InputError` for NaN or Inf in the window, as :meth:`read_slices`.
        """
        reader = self._ensure_open()
        if not self._windowed:
            return self.read_slices(start, stop)[:, y0:y1, x0:x1]
        with self._lock:
            try:
                raw = reader.read_window(start, stop, y0, y1, x0, x1)
            except InputError:
                raise
            except MemoryError:
                raise out_of_memory(self.path, f"reading slices {start}..{stop - 1}") from None
            except Exception as exc:
                raise InputError(f"cannot read slices {start}..{stop - 1}: the file may be truncated or corrupt "
                                 f"({reason(exc)})", self.path) from exc
        with np.errstate(over="ignore", invalid="ignore"):
            out = np.asarray(raw, dtype=np.float32)
        bad = ~np.isfinite(out)
        if bad.any():
            raise InputError(_nonfinite_message(bad, int(start), int(stop), self.shape[0],
                                                f" (rows {y0}..{y1 - 1}, columns {x0}..{x1 - 1})"), self.path)
        return np.ascontiguousarray(out)

    def read(self, progress: ProgressFn | None = None) -> np.ndarray:
        """The whole volume as float32 ``(Z, Y, X)``, read in chunks of slices.

        Parameters
        ----------
        progress : callable, optional
            ``progress(done_slices, total_slices, "read")`` after each chunk.
        """
        nz = self.shape[0]
        out = allocate(self.path, self.shape, np.float32, "reading the whole scan as float32")  # (Z, Y, X)
        step = chunk_slices(self.shape)
        for z0 in range(0, nz, step):
            z1 = min(nz, z0 + step)
            out[z0:z1] = self.read_slices(z0, z1)
            if progress is not None:
                progress(z1, nz, "read")
        return out

    def describe(self, progress: ProgressFn | None = None) -> dict:
        """What ``ctpore info`` shows: geometry, header codes and the intensity range.

        The range is computed by streaming the slices; NaN/Inf voxels are counted
        (``nonfinite_voxels``) and left out of ``min``/``max`` instead of raising. ``spacing_mm``
        is in mm unless ``units`` is ``"unknown"``: then it is the file's own numbers.
        """
        g = self.geometry
        info: dict[str, Any] = {
            "path": str(self.path),
            "format": g.format,
            "shape": list(g.shape),
            "file_shape": list(g.file_shape),
            "slice_axis": g.slice_axis,
            "spacing_mm": list(g.spacing_mm),
            "units": g.units,
            "dtype": str(self.dtype),
            "orientation": None,
            "orientation_zyx": None,
            "qform_code": None,
            "sform_code": None,
        }
        if g.affine is not None and g.header is not None:  # a NIfTI header: orientation and codes
            codes = nib.aff2axcodes(g.affine)
            codes = tuple(c or "?" for c in codes)
            info["orientation"] = "".join(codes)
            info["orientation_zyx"] = "".join(codes[p] for p in g.permutation)
            info["qform_code"] = int(g.header["qform_code"])  # type: ignore[index]
            info["sform_code"] = int(g.header["sform_code"])  # type: ignore[index]
        lo, hi, nonfinite = math.inf, -math.inf, 0
        nz = self.shape[0]
        step = chunk_slices(self.shape)
        for z0 in range(0, nz, step):
            z1 = min(nz, z0 + step)
            chunk = self._read_unchecked(z0, z1)
            finite = np.isfinite(chunk)
            nbad = chunk.size - int(finite.sum())
            if nbad:
                nonfinite += nbad
                chunk = chunk[finite]
            if chunk.size:
                lo, hi = min(lo, float(chunk.min())), max(hi, float(chunk.max()))
            if progress is not None:
                progress(z1, nz, "describe")
        info["min"] = lo if math.isfinite(lo) else None
        info["max"] = hi if math.isfinite(hi) else None
        info["nonfinite_voxels"] = nonfinite
        return info

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Release open files and caches (a later read reopens them)."""
        with self._lock:
            if self._reader is not None:
                self._reader.close()
            self._reader = None
            self._last = None

    def __enter__(self) -> "Scan":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        return {
            "path": self.path,
            "_slice_axis": self._slice_axis,
            "geometry": self.geometry,
            "dtype": self.dtype,
            "_windowed": self._windowed,
            "_sequential": self._sequential,
        }

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._reader = None
        self._last = None

