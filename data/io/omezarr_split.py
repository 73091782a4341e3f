"""One OME-Zarr store written by many processes at once: a scan split across workers.

Each worker writes its own range of slices (a slab), every level of the pyramid included. Slabs
start on multiples of :attr:`SplitStore.alignment` slices, so that each level's rows of chunks fall
wholly inside one slab: no two writers ever touch one chunk (concurrent partial-chunk writes are a
known way to lose data in Zarr). The store has the pyramid and metadata of
:class:`~ctpore.data.io.omezarr_write.OmeZarrWriter` and holds the same voxels as a store written
by one process; its chunks are as deep or shallower (a power of two of slices, and at most
``align / 2**k`` slices at level ``k``), so that slabs need not be hundreds of slices apart: a
single run's coarse levels hold up to 64 of their slices a chunk, 64 x 2**k slices of the scan.

Until :meth:`SplitStore.finish` the store lies beside its destination under a hidden name
(``.<stem>.split.ome.zarr``, or ``.<stem>.split-<tag>.ome.zarr`` with the run's ``tag``), which a
reader never takes for the output and a rerun of the same plan finds again; ``finish`` renames it
over the destination, as a single run's writer does.
"""

from __future__ import annotations

import glob
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ctpore.data.io.formats import cast_exact, optional_import, reason
from ctpore.data.io.geometry import Geometry
from ctpore.data.io.omezarr_write import (OME_ZARR_SUFFIX, level_chunks, level_shapes, multiscale_attrs,
                                          open_level, remove_tree, replace_tree)
from ctpore.errors import InputError

__all__ = ["SplitStore", "unfinished_stores"]


def unfinished_stores(path: str | Path) -> list[Path]:
    """The unfinished stores of the output ``path`` that split runs left, of any plan (hidden names
    ``.<stem>.split.ome.zarr`` and ``.<stem>.split-<tag>.ome.zarr``)."""
    path = Path(path)
    stem = path.name[: -len(OME_ZARR_SUFFIX)] if path.name.lower().endswith(OME_ZARR_SUFFIX) else path.name
    head = f".{stem}.split"
    return [p for p in path.parent.glob(f"{glob.escape(head)}*{OME_ZARR_SUFFIX}")
            if p.name[len(head):-len(OME_ZARR_SUFFIX)][:1] in ("", "-")]


class SplitStore:
    """A store at ``path`` that slabs of slices are written into by several processes.

    The driver calls :meth:`create` (or finds the store of an earlier, interrupted run), the
    workers :meth:`write` their slabs in any order, and the driver :meth:`finish`\\ es it once every
    slab is written. The object is small and picklable: send it to the workers.

    Examples
    --------
    >>> from ctpore.data.io import geometry_from_array, load_scan
    >>> vol = (np.arange(8 * 300 * 20).reshape(8, 300, 20) % 7).astype(np.uint8)
    >>> store = SplitStore("v.ome.zarr", geometry_from_array(vol.shape, (0.5, 0.1, 0.1)), np.uint8, align=4)
    >>> store.alignment, [c[0] for c in store.chunks]   # two levels: 300 x 20 and 150 x 10 pixels
    (4, [4, 2])
    >>> store.create()
    >>> store.write(4, vol[4:]); store.write(0, vol[:4])   # two workers, any order
    >>> store.finish()
    >>> with load_scan("v.ome.zarr") as scan:
    ...     bool(np.array_equal(scan.read(), vol))
    True
    """

    def __init__(self, path: str | Path, geometry: Geometry, dtype: Any, align: int = 64, tag: str = ""):
        self.path, self.geometry, self.dtype = Path(path), geometry, np.dtype(dtype)
        if not self.path.name.lower().endswith(OME_ZARR_SUFFIX):
            raise InputError(f"an OME-Zarr output must end with {OME_ZARR_SUFFIX}", self.path)
        self.stem = self.path.name[: -len(OME_ZARR_SUFFIX)]
        #: Names the run (its plan) in the hidden name: a store of another plan is never written into.
        self.tag = tag
        self.shapes = level_shapes(tuple(int(n) for n in geometry.shape))
        if align < 1 or align & (align - 1):
            raise ValueError(f"align must be a power of two, got {align}")
        self.chunks = []
        for k, shape in enumerate(self.shapes):
            cz, cy, cx = level_chunks(shape, self.dtype)
            cz = min(2 ** int(math.floor(math.log2(cz))), max(1, align >> k))
            self.chunks.append((cz, cy, cx))
        #: Slabs start on multiples of this many slices: level ``k`` keeps every ``2**k``-th slice in
        #: chunks of ``cz_k`` slices, so a slab starts on a multiple of every ``cz_k * 2**k`` (all
        #: powers of two: ``align``, or ``2**k`` of the coarsest level where that is more).
        self.alignment = max(cz * 2**k for k, (cz, _, _) in enumerate(self.chunks))

    @property
    def work(self) -> Path:
        """The unfinished store's hidden path."""
        tag = f"-{self.tag}" if self.tag else ""
        return self.path.parent / f".{self.stem}.split{tag}{OME_ZARR_SUFFIX}"

    def others(self) -> list[Path]:
        """The unfinished stores of this output left by runs of other plans."""
        return [p for p in unfinished_stores(self.path) if p != self.work]

    def create(self) -> None:
        """Make the store (its levels and metadata, no data yet); an earlier run's store of the same
        shape and type is kept as it is, with the slabs it holds (a rerun)."""
        if self._matches():
            return
        zarr = optional_import("zarr", self.path, "OME-Zarr", "writing")
        remove_tree(self.work)
        try:
            self.work.mkdir(parents=True)
            (self.work / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
            for k, shape in enumerate(self.shapes):
                open_level(zarr, self.work / str(k), shape, self.dtype, chunks=self.chunks[k])
            attrs = {"multiscales": [multiscale_attrs(self.stem, self.geometry, self.dtype)]}
            (self.work / ".zattrs").write_text(json.dumps(attrs, indent=1))
        except OSError as exc:
            remove_tree(self.work)
            raise InputError(f"could not write {self.path.name} ({reason(exc)})", self.path.parent) from exc

    def _matches(self) -> bool:
        try:
            attrs = json.loads((self.work / ".zattrs").read_text())
            meta = attrs["multiscales"][0]
            arrays = [json.loads((self.work / str(k) / ".zarray").read_text()) for k in range(len(self.shapes))]
        except (OSError, ValueError, KeyError, IndexError):
            return False
        return (meta.get("metadata", {}).get("dtype") == str(self.dtype)
                and [tuple(a["shape"]) for a in arrays] == [tuple(s) for s in self.shapes]
                and [tuple(a["chunks"]) for a in arrays] == [tuple(c) for c in self.chunks])

    def write(self, z0: int, slab: np.ndarray) -> None:
        """Slices ``z0 : z0 + n`` of the volume, ``slab`` ``(n, Y, X)`` (their values must fit the
        dtype exactly), into every level. A worker writes its slab in one call or in several calls
        in z order; different workers' slabs must start on multiples of :attr:`alignment`."""
        slab = np.asarray(slab)
        nz = self.geometry.shape[0]
        if slab.ndim != 3 or slab.shape[1:] != tuple(self.geometry.shape[1:]) or not 0 <= z0 <= nz - slab.shape[0]:
            raise ValueError(f"slab {slab.shape} at slice {z0} does not fit the volume {self.geometry.shape}")
        zarr = optional_import("zarr", self.path, "OME-Zarr", "writing")
        data = cast_exact(slab, self.dtype, self.path)
        for k in range(len(self.shapes)):
            step = 2**k
            first = (-z0) % step  # the first slice of the slab that level k keeps
            part = data[first::step, ::step, ::step]
            if len(part):
                lz = (z0 + first) // step
                open_level(zarr, self.work / str(k), self.shapes[k], self.dtype, mode="r+")[lz: lz + len(part)] = part

    def finish(self) -> None:
        """Every slab is written: the store takes its destination's name."""
        try:
            replace_tree(self.work, self.path)
        except OSError as err:
            raise InputError(f"could not write {self.path.name} ({reason(err)})", self.path.parent) from err

    def discard(self) -> None:
        """Remove the unfinished store."""
        remove_tree(self.work)
