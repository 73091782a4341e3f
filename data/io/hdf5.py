"""HDF5 (``.h5``, ``.hdf5``, ``.hdf``) through h5py (the optional ``formats`` extra).

Which dataset: the one named after the file (``scan.h5:/group/name``); else ``/exchange/data``,
where tomopy and DXchange keep a volume (slices first); else the file's only 3D dataset. A file
with several 3D datasets and none of these is refused with their list and how to pick one.
The dataset's first axis is Z (singleton axes, e.g. ``(1, Z, Y, X)``, are dropped).

Spacing, where the file says it: the dataset's ``element_size_um`` attribute (``(z, y, x)`` in µm,
as Fiji's HDF5 plugin and ilastik write it); else DXchange's
``/measurement/instrument/detector/actual_pixel_size_x`` (and ``_y``) with their ``units``
attribute: in-plane pixels of ``actual_pixel_size_x``, slices ``actual_pixel_size_y`` apart (a
reconstruction's slices are the detector's rows). Without them, 1 and units ``"unknown"``.

Before any voxel is read, the stored data must lie inside the file (contiguous data, every
chunk), and a deflate-compressed chunk cannot expand more than 1032:1. Windows are read as HDF5
hyperslabs (only the chunks they touch).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ctpore.data.io.formats import (
    DEFLATE_MAX_RATIO,
    check_3d,
    check_grayscale_dtype,
    deflate_limit,
    optional_import,
    reason,
    shape_text,
    size_text,
    split_inner,
    truncated_error,
)
from ctpore.data.io.geometry import Geometry, to_mm, unit_to_mm
from ctpore.errors import InputError

__all__ = ["Hdf5Reader", "HDF5_SUFFIXES", "DXCHANGE_DATA"]

HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf")
DXCHANGE_DATA = "/exchange/data"
_DETECTOR = "/measurement/instrument/detector/"
_DEFLATE_FILTERS = {1, 2, 3}  # deflate, shuffle, fletcher32


def _split(path: Path) -> tuple[Path, str | None]:
    """``(file, dataset or None)`` from ``file.h5`` or ``file.h5:/group/name``."""
    return split_inner(path, HDF5_SUFFIXES)


def _spatial(shape: tuple[int, ...]) -> list[int]:
    return [i for i, n in enumerate(shape) if n != 1] if len(shape) > 3 else list(range(len(shape)))


def _volumes(h5py: Any, f: Any) -> list[tuple[str, tuple[int, ...]]]:
    """``(name, shape)`` of every dataset with three axes of more than one voxel."""
    found: list[tuple[str, tuple[int, ...]]] = []

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset) and obj.ndim >= 3 and len(_spatial(obj.shape)) == 3:
            found.append(("/" + name, tuple(int(n) for n in obj.shape)))

    f.visititems(visit)
    return found


def _scalar(f: Any, name: str) -> tuple[float, Any] | None:
    """A number stored as a dataset (or an attribute of the detector group), and its units."""
    if name in f:
        obj = f[name]
        try:
            value = float(np.asarray(obj[()]).reshape(-1)[0])
        except (TypeError, ValueError, IndexError):
            return None
        return value, obj.attrs.get("units")
    group, key = name.rsplit("/", 1)
    if group in f and key in f[group].attrs:
        try:
            return float(np.asarray(f[group].attrs[key]).reshape(-1)[0]), f[group].attrs.get(key + "_units")
        except (TypeError, ValueError, IndexError):
            return None
    return None


def _spacing(f: Any, dset: Any) -> tuple[tuple[float, float, float], str]:
    """``((z, y, x) in mm, units)``; see the module docstring for where they come from."""
    size = dset.attrs.get("element_size_um")
    if size is not None:
        values = [abs(float(v)) for v in np.asarray(size).reshape(-1)]
        if len(values) == 3 and all(math.isfinite(v) and v > 0 for v in values):
            return tuple(to_mm(v, 1e-3) for v in values), "micron"  # type: ignore[return-value]
    px = _scalar(f, _DETECTOR + "actual_pixel_size_x")
    if px is None or not (math.isfinite(px[0]) and px[0] > 0):
        return (1.0, 1.0, 1.0), "unknown"
    py = _scalar(f, _DETECTOR + "actual_pixel_size_y")
    if py is None or not (math.isfinite(py[0]) and py[0] > 0):
        py = px
    unit = unit_to_mm(px[1])
    if unit is None:
        return (abs(py[0]), abs(px[0]), abs(px[0])), "unknown"
    name, factor = unit
    return (to_mm(abs(py[0]), factor), to_mm(abs(px[0]), factor), to_mm(abs(px[0]), factor)), name


def _check_stored(h5py: Any, dset: Any, file: Path, path: Path) -> None:
    """Refuse a dataset whose stored data the file cannot hold, before reading it."""
    size = file.stat().st_size
    dtype = np.dtype(dset.dtype)
    shape = tuple(int(n) for n in dset.shape)
    nbytes = math.prod(shape) * dtype.itemsize
    if dset.is_virtual or dset.external:
        return  # the data is in other files; h5py reports what is missing when read
    plist = dset.id.get_create_plist()
    layout = plist.get_layout()
    if layout == h5py.h5d.CONTIGUOUS:
        offset = dset.id.get_offset()
        if offset is None:
            raise InputError(f"dataset {dset.name} ({shape_text(shape, dtype)}) has no data stored (never "
                             "written); re-export the scan", path)
        if offset + nbytes > size:
            raise truncated_error(path, f"dataset {dset.name}", shape, dtype, nbytes,
                                  f"its data would end at byte {offset + nbytes} and the file holds {size_text(size)}")
    elif layout == h5py.h5d.CHUNKED:
        n = dset.id.get_num_chunks()
        if n == 0:
            raise InputError(f"dataset {dset.name} ({shape_text(shape, dtype)}) has no data stored (never "
                             "written); re-export the scan", path)
        filters = {plist.get_filter(i)[0] for i in range(plist.get_nfilters())}
        deflate_only = bool(filters) and filters <= _DEFLATE_FILTERS
        chunk_bytes = math.prod(int(c) for c in dset.chunks) * dtype.itemsize
        for i in range(n):
            info = dset.id.get_chunk_info(i)
            end = int(info.byte_offset) + int(info.size)
            if end > size:
                raise InputError(f"is truncated or its header is wrong: a chunk of dataset {dset.name} "
                                 f"({shape_text(shape, dtype)}) runs to byte {end} but the file holds "
                                 f"{size_text(size)}; re-export the scan", path)
            if deflate_only and 1 in filters and chunk_bytes > deflate_limit(int(info.size)):
                raise truncated_error(
                    path, f"a chunk of dataset {dset.name}", tuple(int(c) for c in dset.chunks), dtype, chunk_bytes,
                    f"its {size_text(int(info.size))} of deflate data can expand to at most "
                    f"{size_text(deflate_limit(int(info.size)))} (deflate compresses at most {DEFLATE_MAX_RATIO}:1)")


class Hdf5Reader:
    """One 3D dataset of an HDF5 file, read by hyperslabs (windowed). See :mod:`ctpore.data.io.hdf5`."""

    windowed = True
    sequential = False

    def __init__(self, path: Path):
        self.path = Path(path)
        h5py = optional_import("h5py", self.path, "HDF5")
        file, inner = _split(self.path)
        self.file = None
        try:
            self.file = h5py.File(str(file), "r")
        except MemoryError:
            raise
        except Exception as exc:
            text = reason(exc)
            if "truncated" in text.lower():
                raise InputError(f"is truncated or its header is wrong: HDF5 cannot open it ({text}); re-export "
                                 "the scan", self.path) from exc
            raise InputError(f"is not a readable HDF5 file ({text})", self.path) from exc
        try:
            self.dset = self._dataset(h5py, inner)
            shape = tuple(int(n) for n in self.dset.shape)
            self.dtype = np.dtype(self.dset.dtype)
            check_grayscale_dtype(self.dtype, self.path)
            if len(shape) > 3 and len(_spatial(shape)) > 3:
                raise InputError(f"dataset {self.dset.name} holds several volumes (shape {shape}); ctpore needs "
                                 "one 3D volume", self.path)
            axes = _spatial(shape)
            if len(axes) != 3:
                check_3d(tuple(n for n in shape if n != 1), self.path, shape)
            self._key = [0] * len(shape)  # singleton axes are indexed away
            self._axes = axes
            zyx = tuple(shape[a] for a in axes)
            check_3d(zyx, self.path, shape)
            _check_stored(h5py, self.dset, file, self.path)
            spacing, units = _spacing(self.file, self.dset)
        except BaseException:
            self.close()
            raise
        self.geometry = Geometry(format="hdf5", shape=zyx, spacing_mm=spacing, slice_axis=0,  # type: ignore[arg-type]
                                 file_shape=shape, permutation=(0, 1, 2), units=units)

    def _dataset(self, h5py: Any, inner: str | None) -> Any:
        f = self.file
        if inner is not None:
            obj = f.get(inner)
            if isinstance(obj, h5py.Dataset):
                return obj
            problem = "is not in the file" if obj is None else "is a group, not a dataset"
            raise InputError(f"{inner} {problem}; {self._choices(h5py)}", self.path)
        obj = f.get(DXCHANGE_DATA)
        if isinstance(obj, h5py.Dataset) and len(_spatial(obj.shape)) == 3 and obj.ndim >= 3:
            return obj
        volumes = _volumes(h5py, f)
        if len(volumes) == 1:
            return f[volumes[0][0]]
        raise InputError(f"{'holds several 3D datasets and none is' if volumes else 'has no 3D dataset, nor'} "
                         f"{DXCHANGE_DATA}; {self._choices(h5py)}", self.path)

    def _choices(self, h5py: Any) -> str:
        volumes = _volumes(h5py, self.file)
        if not volumes:
            return "the file holds no 3D dataset"
        shown = ", ".join(f"{name} {' x '.join(map(str, shape))}" for name, shape in volumes[:10])
        more = f" and {len(volumes) - 10} more" if len(volumes) > 10 else ""
        file = _split(self.path)[0]
        return f"its 3D datasets: {shown}{more}; choose one as {file}:{volumes[0][0]}"

    def _index(self, z: slice, y: slice, x: slice) -> tuple:
        key: list[Any] = list(self._key)
        for axis, part in zip(self._axes, (z, y, x)):
            key[axis] = part
        return tuple(key)

    def read(self, start: int, stop: int) -> np.ndarray:
        return np.asarray(self.dset[self._index(slice(start, stop), slice(None), slice(None))])

    def read_window(self, start: int, stop: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        return np.asarray(self.dset[self._index(slice(start, stop), slice(y0, y1), slice(x0, x1))])

    def close(self) -> None:
        if self.file is not None:
            try:
                self.file.close()
            except Exception:
                pass
        self.file = None
        self.dset = None
