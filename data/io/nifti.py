"""NIfTI (``.nii``, ``.nii.gz``): the lazy slice reader and the image written back.

Uncompressed files are memory-mapped; a ``.nii.gz`` is kept open so that reading forward along k
is one pass over the stream. The sizes the header describes are checked against the file (and, for
a ``.nii.gz`` that must be held whole, against memory) before any voxel is read or allocated.
Outputs carry the input's header (affine, qform/sform and their codes, pixdim, units) and go back
in its voxel order.
"""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
from nibabel.volumeutils import apply_read_scaling

from ctpore.data.io.formats import (
    DEFLATE_MAX_RATIO,
    available_memory,
    check_3d,
    check_grayscale_dtype,
    deflate_limit,
    reason,
    shape_text,
    size_text,
    truncated_error,
)
from ctpore.data.io.geometry import Geometry, f32_decimal, to_mm, zyx_permutation
from ctpore.errors import InputError

__all__ = ["NiftiReader", "nifti_image", "keeps_voxel_order"]

# NIfTI xyzt_units spatial names (as nibabel reports them) -> mm per unit.
_NIFTI_UNIT_MM = {"mm": 1.0, "micron": 1e-3, "meter": 1e3, "unknown": 1.0}


class NiftiReader:
    """One ``.nii``/``.nii.gz`` file read lazily as ``(n, Y, X)`` slabs (see :mod:`ctpore.data.io`).

    A :class:`~ctpore.data.io.reader.Reader`: windowed when uncompressed (memory-mapped),
    sequential when compressed (``.nii.gz``).

    Raises
    ------
    InputError
        Not a NIfTI file, unsupported voxel type, not one 3D volume, or a header that describes more
        data than the file holds (checked before anything is read); a ``.nii.gz`` read along file
        axis 0 or 1 whose data does not fit in memory. ``MemoryError`` is left to the caller
        (:func:`ctpore.data.io.scan.open_reader` turns it into an :class:`InputError`).
    """

    def __init__(self, path: Path, slice_axis: int | None):
        self.path = path
        gz = path.name.lower().endswith(".gz")
        try:
            if gz:
                img = nib.load(str(path), keep_file_open=True)
            else:
                img = nib.load(str(path), mmap="r")
        except MemoryError:
            raise
        except Exception as exc:  # nibabel, gzip, zlib, EOFError: all mean a bad file
            raise InputError(f"is not a readable NIfTI file ({reason(exc)})", path) from exc
        if not isinstance(img, (nib.Nifti1Image, nib.Nifti2Image)):
            raise InputError(f"is not a single-file NIfTI image ({type(img).__name__})", path)
        header = img.header
        dtype = np.dtype(img.get_data_dtype())
        check_grayscale_dtype(dtype, path)
        file_shape = tuple(int(n) for n in img.shape)
        s = 2 if slice_axis is None else slice_axis
        _check_sizes(path, gz, file_shape, dtype, int(img.dataobj.offset), s)
        if len(file_shape) > 3 and any(n != 1 for n in file_shape[3:]):
            raise InputError(
                f"holds several volumes (shape {file_shape}); ctpore needs one 3D volume: "
                "extract the one to use (e.g. with fslroi or nibabel) and pass that",
                path,
            )
        check_3d(file_shape[:3], path, file_shape)
        self.perm = zyx_permutation(s)
        self.ndim = len(file_shape)
        self.file_shape = file_shape
        self.dtype = dtype
        self.img = img
        self.proxy = img.dataobj
        self.slope = float(self.proxy.slope)
        self.inter = float(self.proxy.inter)
        self.memmap: np.ndarray | None = None  # uncompressed: the whole data, memory-mapped
        self.offset = int(self.proxy.offset)  # where the voxel data starts in the (uncompressed) file
        self.disk_dtype = np.dtype(self.proxy.dtype)  # with the file's byte order
        self._fd: int | None = None  # uncompressed, slice axis 2: read with os.pread
        self.cache: np.ndarray | None = None  # .nii.gz read along i or j: whole raw data
        self.gz = gz
        self.sequential = gz  # reading backwards decompresses the stream again from its start
        try:
            if not gz:
                self.memmap = self.proxy.get_unscaled()  # np.memmap, nothing read yet
            else:
                self._check_gzip_complete(header)
        except InputError:
            raise
        except MemoryError:
            raise
        except Exception as exc:
            raise InputError(
                f"is truncated or corrupt: its data cannot be read ({reason(exc)})", path
            ) from exc

        zooms = [abs(f32_decimal(z)) for z in header.get_zooms()[:3]]
        unit = header.get_xyzt_units()[0] or "unknown"
        if unit not in _NIFTI_UNIT_MM:
            unit = "unknown"
        if not all(math.isfinite(z) and z > 0 for z in zooms):
            zooms, unit = [1.0, 1.0, 1.0], "unknown"
        factor = _NIFTI_UNIT_MM[unit]
        shape3 = file_shape[:3]
        self.geometry = Geometry(
            format="nifti",
            shape=tuple(shape3[p] for p in self.perm),  # type: ignore[arg-type]
            spacing_mm=tuple(to_mm(zooms[p], factor) for p in self.perm),  # type: ignore[arg-type]
            slice_axis=s,
            file_shape=file_shape,
            affine=np.asarray(img.affine),
            header=header.copy(),
            permutation=self.perm,
            units=unit,
            slice_axis_choosable=True,
        )

    @property
    def windowed(self) -> bool:
        """Whether a window is read alone: an uncompressed (memory-mapped) file."""
        return self.memmap is not None

    def _check_gzip_complete(self, header: Any) -> None:
        """Detect a truncated .nii.gz without decompressing it when possible.

        A gzip stream ends with ISIZE, the uncompressed size mod 2**32. If it equals the size the
        header implies, the file is complete (a cut file ends in compressed bytes that match by
        chance with probability 2**-32). Otherwise (several gzip members, trailing bytes, or a
        cut file) read the last voxel, which decompresses the whole stream once.
        """
        expected = int(header.get_data_offset()) + int(np.prod(self.file_shape)) * self.dtype.itemsize
        with open(self.path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() >= 4:
                f.seek(-4, os.SEEK_END)
                (isize,) = struct.unpack("<I", f.read(4))
                if isize == expected % 2**32:
                    return
        last = tuple(n - 1 for n in self.file_shape)
        np.asarray(self.proxy[last])

    def _pread(self, start: int, stop: int, rows: slice | None) -> np.ndarray:
        """Slices ``start:stop`` (rows ``rows``) of an uncompressed file with slice axis 2, by
        plain reads: the data is z-major there, so each slice's rows are one contiguous range.
        Unlike the memory map, this leaves nothing of the file in the process's memory."""
        nx, ny = self.file_shape[0], self.file_shape[1]
        r0, r1, _ = (rows or slice(None)).indices(ny)
        item = self.disk_dtype.itemsize
        out = np.empty((stop - start, r1 - r0, nx), self.disk_dtype)
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        for i, z in enumerate(range(start, stop)):
            off = self.offset + (z * ny + r0) * nx * item
            buf = os.pread(self._fd, (r1 - r0) * nx * item, off)
            if len(buf) != (r1 - r0) * nx * item:
                raise InputError(f"is truncated: slice {z} ends before its data does", self.path)
            out[i] = np.frombuffer(buf, self.disk_dtype).reshape(r1 - r0, nx)
        return apply_read_scaling(out, self.slope, self.inter)

    def read(self, start: int, stop: int, rows: slice | None = None, cols: slice | None = None) -> np.ndarray:
        """Slices ``start:stop`` as ``(n, Y, X)``; from an uncompressed file only ``rows`` x ``cols``
        are read (elsewhere the planes are read and cropped)."""
        s, ya, xa = self.perm
        if self.memmap is not None and self.perm == (2, 1, 0):
            out = self._pread(start, stop, rows)  # (n, rows, X)
            return out if cols is None else out[:, :, cols]
        slicer: list[Any] = [slice(None)] * 3 + [0] * (self.ndim - 3)
        slicer[s] = slice(start, stop)
        if self.memmap is not None and (rows is not None or cols is not None):
            slicer[ya] = rows if rows is not None else slice(None)
            slicer[xa] = cols if cols is not None else slice(None)
            key = tuple(slicer)
            raw = apply_read_scaling(np.asarray(self.memmap[key]), self.slope, self.inter)
            return raw.transpose(self.perm)  # (n, rows, cols)
        key = tuple(slicer)
        if rows is not None or cols is not None:
            whole = self.read(start, stop)
            return whole[:, rows or slice(None), cols or slice(None)]
        if self.memmap is not None:
            raw = apply_read_scaling(np.asarray(self.memmap[key]), self.slope, self.inter)
        elif self.gz and s != 2:
            # Slices along i or j touch the whole compressed stream: decompress it once.
            if self.cache is None:
                nbytes = math.prod(self.file_shape) * self.disk_dtype.itemsize
                _check_cache_memory(self.path, self.file_shape, self.dtype, nbytes, s)
                try:
                    self.cache = np.asarray(self.proxy.get_unscaled())
                except MemoryError:
                    raise InputError(_cache_message(self.file_shape, self.dtype, nbytes, s, "but memory ran out"),
                                     self.path) from None
            raw = apply_read_scaling(self.cache[key], self.slope, self.inter)
        else:
            raw = np.asarray(self.proxy[key])  # nibabel applies scl_slope/scl_inter here
        return raw.transpose(self.perm)  # (n, Y, X)

    def read_window(self, start: int, stop: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """Slices ``start:stop``, rows ``y0:y1``, columns ``x0:x1`` (see :meth:`read`)."""
        return self.read(start, stop, slice(y0, y1), slice(x0, x1))

    def close(self) -> None:
        # Dropping the proxy closes the file kept open by nibabel (keep_file_open=True).
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.memmap = None
        self.cache = None
        self.proxy = None
        self.img = None


def _check_sizes(path: Path, gz: bool, file_shape: tuple[int, ...], dtype: np.dtype, offset: int,
                 slice_axis: int) -> None:
    """Refuse a header whose sizes the file cannot back, before any voxel is read or allocated.

    An uncompressed file must hold ``offset + prod(shape) * itemsize`` bytes. A ``.nii.gz`` cannot
    expand more than about 1032:1 (deflate's limit), so a header describing more than that is
    refused without decompressing. A ``.nii.gz`` read along file axis 0 or 1 is held whole in
    memory, so its data must fit in memory.

    Raises
    ------
    InputError
        Naming the file, the shape and size the header describes and what the file holds.
    """
    nbytes = math.prod(file_shape) * dtype.itemsize  # Python ints: no overflow for NIfTI-2 sizes
    end = offset + nbytes
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InputError(f"cannot read the file ({reason(exc)})", path) from exc
    if not gz and end > size:
        raise truncated_error(path, "the header", file_shape, dtype, nbytes, f"the file holds {size_text(size)}")
    if gz and end > deflate_limit(size):
        raise truncated_error(
            path, "the header", file_shape, dtype, nbytes,
            f"the compressed file holds {size_text(size)}, which can expand to at most "
            f"{size_text(deflate_limit(size))} (gzip compresses at most {DEFLATE_MAX_RATIO}:1)",
        )
    if gz and slice_axis != 2:
        _check_cache_memory(path, file_shape, dtype, nbytes, slice_axis)


def _cache_message(file_shape: tuple[int, ...], dtype: np.dtype, nbytes: int, slice_axis: int, problem: str) -> str:
    return (
        f"is compressed, and reading it with slice axis {slice_axis} holds its whole voxel data "
        f"({shape_text(file_shape, dtype)}, {size_text(nbytes)}) in memory, {problem}; decompress "
        "it to .nii (e.g. gunzip -k), which is read slice by slice, or use the default slice axis 2"
    )


def _check_cache_memory(path: Path, file_shape: tuple[int, ...], dtype: np.dtype, nbytes: int,
                        slice_axis: int) -> None:
    """Refuse to decompress a whole ``.nii.gz`` (slice axis 0 or 1) that memory cannot hold."""
    avail = available_memory()
    if nbytes > avail:
        problem = f"but only about {size_text(avail)} is available"
        raise InputError(_cache_message(file_shape, dtype, nbytes, slice_axis, problem), path)


def keeps_voxel_order(geometry: Geometry) -> bool:
    """Whether :func:`nifti_image` writes in the input's voxel order with its header: the geometry
    carries a NIfTI header (it came from a NIfTI file). Otherwise it writes ``(i, j, k) = (x, y, z)``."""
    return isinstance(geometry.header, nib.Nifti1Header)  # Nifti2Header is a Nifti1Header too


def nifti_image(data_zyx: np.ndarray, geometry: Geometry) -> nib.Nifti1Image:
    """The NIfTI image to write, in the input's voxel order with its header."""
    if keeps_voxel_order(geometry):
        header = geometry.header.copy()  # type: ignore[attr-defined]
        inverse = tuple(int(i) for i in np.argsort(geometry.permutation))
        data = data_zyx.transpose(inverse)  # back to (i, j, k)
        header.set_data_shape(data.shape)
        header.set_data_dtype(data.dtype)
        header["scl_slope"] = np.nan  # values are stored as given
        header["scl_inter"] = np.nan
        header["cal_min"] = 0.0
        header["cal_max"] = 0.0
        cls = nib.Nifti2Image if isinstance(header, nib.Nifti2Header) else nib.Nifti1Image
        # affine=None: the header's qform/sform (matrices, codes), pixdim and units are kept
        # exactly as they are; nibabel would rewrite them from a passed affine.
        return cls(data, None, header)
    # Any other origin (TIFF, HDF5, ..., an array): NIfTI (i, j, k) = (x, y, z); qform and sform both "scanner" (1).
    # Spacing in mm, or, when the input gave no length unit, its own numbers with units "unknown" (code 0).
    data = data_zyx.transpose(2, 1, 0)  # (X, Y, Z)
    z, y, x = geometry.spacing_mm
    affine = np.diag([x, y, z, 1.0])
    header = nib.Nifti1Header()
    header.set_data_shape(data.shape)
    header.set_data_dtype(data.dtype)
    header.set_qform(affine, code=1)
    header.set_sform(affine, code=1)
    header.set_xyzt_units("unknown" if geometry.units == "unknown" else "mm")
    return nib.Nifti1Image(data, None, header)


