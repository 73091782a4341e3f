"""Writing a ``(Z, Y, X)`` volume as OME-Zarr, slab by slab, with a multiscale pyramid.

For scans that NIfTI tools handle badly (above a few GB): ``--output-format ome-zarr`` writes each
output volume as a store ``<stem>_<kind>.ome.zarr`` (NGFF 0.4 on Zarr v2, the version most viewers
read) that napari and other NGFF viewers open lazily, level by level. Level 0 is the full volume;
each further level keeps every second voxel along each axis (nearest neighbour, so pores stay 0/1
and a voxel of level ``k`` is voxel ``2^k i`` of level 0: no offset), down to a plane of at most
:data:`SMALLEST_PLANE` pixels a side. Spacing goes into each level's ``scale`` (in the file's unit;
none when the scan gives none).

The store is written beside its destination under a temporary name
(``.<stem>.tmp-XXXXXXXX.ome.zarr``) and renamed over it when whole, as
:func:`ctpore.atomic.atomic_write` does for files: a reader never meets half a store. Memory: one
row of chunks per level (each row at most :data:`ROW_BYTES`), whatever the scan's size.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ctpore.data.io.formats import cast_exact, optional_import, reason
from ctpore.data.io.geometry import Geometry
from ctpore.errors import InputError

__all__ = ["OmeZarrWriter", "OME_ZARR_SUFFIX", "level_chunks", "level_shapes", "multiscale_attrs", "open_level",
           "remove_tree", "replace_tree"]

OME_ZARR_SUFFIX = ".ome.zarr"
#: The pyramid stops at the first level whose plane is at most this many pixels a side.
SMALLEST_PLANE = 256
#: Chunks are ``(cz, 256, 256)`` with ``cz`` the most slices whose plane-wide row of chunks stays
#: within this many bytes (at least 1, at most 64): what a writer holds before it writes a row.
ROW_BYTES = 16 << 20
_TILE = 256
#: NGFF unit names of :class:`Geometry` units.
_NGFF_UNITS = {"mm": "millimeter", "micron": "micrometer", "um": "micrometer", "nm": "nanometer",
               "cm": "centimeter", "m": "meter", "meter": "meter", "inch": "inch", "angstrom": "angstrom"}


def level_shapes(shape: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    """The shapes of the pyramid's levels: each keeps every second voxel of the one before.

    Examples
    --------
    >>> level_shapes((96, 1000, 600))
    [(96, 1000, 600), (48, 500, 300), (24, 250, 150)]
    >>> level_shapes((8, 64, 64))
    [(8, 64, 64)]
    """
    shapes = [tuple(int(n) for n in shape)]
    while max(shapes[-1][1:]) > SMALLEST_PLANE and len(shapes) < 10:
        shapes.append(tuple(-(-n // 2) for n in shapes[-1]))
    return shapes  # type: ignore[return-value]


def level_chunks(shape: tuple[int, int, int], dtype: Any) -> tuple[int, int, int]:
    """A level's chunks: ``(cz, 256, 256)``, ``cz`` the most slices whose plane-wide row of chunks
    stays within :data:`ROW_BYTES` (at least 1, at most 64)."""
    plane = shape[1] * shape[2] * np.dtype(dtype).itemsize
    cz = int(max(1, min(64, shape[0], ROW_BYTES // max(1, plane))))
    return (cz, min(_TILE, shape[1]), min(_TILE, shape[2]))


def open_level(zarr: Any, folder: Path, shape: tuple[int, int, int], dtype: Any, mode: str = "w",
               chunks: tuple[int, int, int] | None = None) -> Any:
    """A level's array in a store (made with ``mode="w"``, in :func:`level_chunks` unless
    ``chunks`` are given; written into with ``"r+"``)."""
    chunks = chunks or level_chunks(shape, dtype)
    kwargs = dict(mode=mode, shape=shape, chunks=chunks, dtype=np.dtype(dtype), fill_value=0)
    if mode != "w":
        kwargs = dict(mode=mode)
    try:
        return zarr.open_array(str(folder), zarr_format=2, **kwargs)
    except TypeError:  # zarr 2.x: always format 2
        return zarr.open_array(str(folder), **kwargs)


def multiscale_attrs(stem: str, geometry: Geometry, dtype: Any) -> dict:
    """The store's NGFF ``multiscales`` entry: the levels' paths and scales, in the file's unit."""
    shapes = level_shapes(tuple(int(n) for n in geometry.shape))
    unit = _NGFF_UNITS.get(geometry.units)
    spacing = geometry.spacing_mm
    if unit is not None and unit != "millimeter":  # back to the file's own unit
        from ctpore.data.io.geometry import unit_to_mm

        factor = (unit_to_mm(unit) or ("mm", 1.0))[1]
        spacing = tuple(s / factor for s in spacing)
    axes = [{"name": n, "type": "space", **({"unit": unit} if unit else {})} for n in ("z", "y", "x")]
    datasets = [{"path": str(k), "coordinateTransformations": [
        {"type": "scale", "scale": [float(s) * 2**k for s in spacing]}]} for k in range(len(shapes))]
    return {"version": "0.4", "name": stem, "axes": axes, "datasets": datasets,
            "type": "nearest (every second voxel along each axis)",
            "metadata": {"written_by": "ctpore", "dtype": str(np.dtype(dtype))}}


def remove_tree(path: str | os.PathLike) -> None:
    """Remove a store (a folder) or a file; nothing if it is not there."""
    p = Path(path)
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists() or p.is_symlink():
        p.unlink()


class _Level:
    """One level of the pyramid: slices arrive in z order and are written a whole row of chunks
    at a time (a chunk is never written twice)."""

    def __init__(self, zarr: Any, folder: Path, shape: tuple[int, int, int], dtype: np.dtype, step: int):
        self.shape, self.step = shape, step
        self.chunks = level_chunks(shape, dtype)
        self.array = open_level(zarr, folder, shape, dtype)
        self.buffer: list[np.ndarray] = []
        self.held = 0
        self.z = 0  # slices of this level written so far

    def push(self, slices: np.ndarray) -> None:
        if len(slices):
            self.buffer.append(slices)
            self.held += len(slices)
        cz = self.chunks[0]
        if self.held >= cz or (self.held and self.z + self.held == self.shape[0]):
            block = np.concatenate(self.buffer) if len(self.buffer) > 1 else self.buffer[0]
            n = (self.held // cz) * cz if self.z + self.held < self.shape[0] else self.held
            self.array[self.z:self.z + n] = block[:n]
            self.z += n
            rest = block[n:]
            self.buffer, self.held = ([rest] if len(rest) else []), len(rest)


class OmeZarrWriter:
    """Write a ``(Z, Y, X)`` volume to ``<name>.ome.zarr`` slab by slab in z order, whole or not at all.

    The same use as :class:`~ctpore.data.io.write.SlabWriter` (a context manager whose
    :meth:`write` takes the next slices; on an error inside the block nothing is left behind).

    Examples
    --------
    >>> from ctpore.data.io import geometry_from_array
    >>> vol = (np.arange(6 * 300 * 20).reshape(6, 300, 20) % 7).astype(np.uint8)
    >>> with OmeZarrWriter(Path("v.ome.zarr"), geometry_from_array(vol.shape, (0.5, 0.1, 0.1)), np.uint8) as w:
    ...     w.write(vol[:4]); w.write(vol[4:])
    >>> from ctpore.data.io import load_scan
    >>> with load_scan("v.ome.zarr") as scan:
    ...     bool(np.array_equal(scan.read(), vol)), scan.geometry.spacing_mm
    (True, (0.5, 0.1, 0.1))
    """

    def __init__(self, path: str | Path, geometry: Geometry, dtype: Any):
        self.path, self.geometry, self.dtype = Path(path), geometry, np.dtype(dtype)
        if not self.path.name.lower().endswith(OME_ZARR_SUFFIX):
            raise InputError(f"an OME-Zarr output must end with {OME_ZARR_SUFFIX}", self.path)
        zarr = optional_import("zarr", self.path, "OME-Zarr", "writing")
        stem = self.path.name[: -len(OME_ZARR_SUFFIX)]
        self._tmp = self.path.parent / f".{stem}.tmp-{secrets.token_hex(4)}{OME_ZARR_SUFFIX}"
        try:
            self._tmp.mkdir()
            (self._tmp / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
            shapes = level_shapes(tuple(int(n) for n in geometry.shape))
            self._levels = [_Level(zarr, self._tmp / str(k), s, self.dtype, 2**k) for k, s in enumerate(shapes)]
            attrs = {"multiscales": [multiscale_attrs(stem, geometry, self.dtype)]}
            (self._tmp / ".zattrs").write_text(json.dumps(attrs, indent=1))
        except BaseException as exc:
            remove_tree(self._tmp)
            if isinstance(exc, OSError):
                raise InputError(f"could not write {self.path.name} ({reason(exc)})", self.path.parent) from exc
            raise
        self._z = 0

    def write(self, slab: np.ndarray) -> None:
        """Append the next ``(n, Y, X)`` slices (their values must fit the dtype exactly)."""
        slab = np.asarray(slab)
        nz = self.geometry.shape[0]
        if slab.ndim != 3 or slab.shape[1:] != tuple(self.geometry.shape[1:]) or self._z + slab.shape[0] > nz:
            raise ValueError(f"slab {slab.shape} does not continue the volume {self.geometry.shape}")
        data = cast_exact(slab, self.dtype, self.path)
        for level in self._levels:
            first = (-self._z) % level.step  # the first slice of the slab that level keeps
            level.push(np.ascontiguousarray(data[first::level.step, ::level.step, ::level.step]))
        self._z += slab.shape[0]

    def __enter__(self) -> "OmeZarrWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and self._z != self.geometry.shape[0]:
            remove_tree(self._tmp)
            raise ValueError(f"{self.geometry.shape[0] - self._z} slices of {self.path.name} were never written")
        if exc_type is not None:
            remove_tree(self._tmp)
            return
        try:
            replace_tree(self._tmp, self.path)
        except OSError as err:
            remove_tree(self._tmp)
            raise InputError(f"could not write {self.path.name} ({reason(err)})", self.path.parent) from err


def replace_tree(tmp: Path, path: Path) -> None:
    """Rename the folder ``tmp`` to ``path``; an existing ``path`` (file or store) is moved aside
    first (under a temporary's name) and removed after. A folder cannot be renamed over another in
    one step, so for an instant there is no ``path``; a reader never meets half of either."""
    old = None
    if path.exists() or path.is_symlink():
        name = path.name
        stem = name[: -len(OME_ZARR_SUFFIX)] if name.lower().endswith(OME_ZARR_SUFFIX) else name
        # named as a temporary, so that a run killed right here leaves one that is removed as stale
        old = path.parent / f".{stem}.tmp-old{secrets.token_hex(4)}{OME_ZARR_SUFFIX}"
        os.replace(path, old)
    try:
        os.replace(tmp, path)
    except BaseException:
        if old is not None:
            os.replace(old, path)
        raise
    if old is not None:
        remove_tree(old)
