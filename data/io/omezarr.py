"""OME-Zarr (NGFF 0.4 on Zarr v2, 0.5 on Zarr v3) and plain 3D Zarr arrays, through zarr (the
optional ``formats`` extra).

The store is a folder named ``*.ome.zarr`` or ``*.zarr``. Its metadata is read here from the JSON
files (``.zattrs``, or ``zarr.json``'s ``attributes.ome``): ``multiscales[0].datasets[0]`` is the
full-resolution level, ``multiscales[0].axes`` names the axes (``type`` ``space`` for z, y, x;
``channel`` and ``time`` axes must have size 1), and the ``scale`` of the dataset's
``coordinateTransformations`` (times the multiscale's own, if any) with each axis's ``unit`` gives
the spacing. The spatial axes in stored order are ``(Z, Y, X)``. A bioformats2raw store opens its
first image (``0``). A plain Zarr array at the root is read with units ``"unknown"``.

Windows are read chunk by chunk (only the chunks a window touches). A store whose array has no
chunk stored at all is refused (every voxel would be the fill value), and the sizes the metadata
claims are bounded by the memory checks of :func:`ctpore.data.io.registry.open_reader`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ctpore.data.io.formats import check_3d, check_grayscale_dtype, optional_import, reason
from ctpore.data.io.geometry import Geometry, to_mm, unit_to_mm
from ctpore.errors import InputError

__all__ = ["ZarrReader", "ZARR_SUFFIXES", "zarr_metadata", "level_paths"]

ZARR_SUFFIXES = (".ome.zarr", ".zarr")
_META_FILES = {".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json"}
_SPATIAL_NAMES = ("z", "y", "x")


def zarr_metadata(folder: Path) -> tuple[str, dict] | None:
    """``(node type, attributes)`` of a Zarr group or array folder (v2 or v3); None if it is neither."""
    try:
        v3 = folder / "zarr.json"
        if v3.is_file():
            meta = json.loads(v3.read_text())
            return str(meta.get("node_type", "")), dict(meta.get("attributes") or {})
        for name, node in ((".zgroup", "group"), (".zarray", "array")):
            if (folder / name).is_file():
                attrs = folder / ".zattrs"
                return node, (json.loads(attrs.read_text()) if attrs.is_file() else {})
    except (OSError, ValueError) as exc:
        raise InputError(f"has unreadable Zarr metadata in {folder.name} ({reason(exc)})", folder) from exc
    return None


def _multiscales(attrs: dict) -> list | None:
    ome = attrs.get("ome")
    if isinstance(ome, dict) and ome.get("multiscales"):
        return ome["multiscales"]
    return attrs.get("multiscales") or None


def level_paths(folder: Path) -> list[str]:
    """The paths of an OME-Zarr image's levels, full resolution first (``[]`` when the folder is
    not an OME-Zarr image group)."""
    node = zarr_metadata(Path(folder))
    if node is None or node[0] != "group":
        return []
    ms = _multiscales(node[1]) or [{}]
    try:
        return [str(d["path"]) for d in ms[0].get("datasets", [])]
    except (KeyError, TypeError):
        return []


def _scale(transforms: Any, ndim: int) -> list[float]:
    for t in transforms or []:
        if isinstance(t, dict) and t.get("type") == "scale" and isinstance(t.get("scale"), list):
            if len(t["scale"]) == ndim:
                return [float(v) for v in t["scale"]]
    return [1.0] * ndim


def _axes(ms: dict, ndim: int) -> list[dict]:
    axes = ms.get("axes")
    if axes is None:  # NGFF 0.1-0.2: always t, c, z, y, x (the last ndim of them)
        axes = ["t", "c", "z", "y", "x"][-ndim:]
    out = []
    for ax in axes:
        if isinstance(ax, str):  # NGFF 0.3: names only
            ax = {"name": ax, "type": "space" if ax in _SPATIAL_NAMES else ("channel" if ax == "c" else "time")}
        out.append(dict(ax))
    return out


class ZarrReader:
    """The full-resolution level of an OME-Zarr image (or a plain 3D Zarr array), read by chunks.
    See :mod:`ctpore.data.io.omezarr`."""

    windowed = True
    sequential = False

    def __init__(self, path: Path):
        self.path = Path(path)
        if not self.path.is_dir():
            raise InputError("is not a Zarr store (a Zarr store is a folder)", self.path)
        zarr = optional_import("zarr", self.path, "OME-Zarr")
        root = zarr_metadata(self.path)
        if root is None:
            raise InputError("is not a Zarr store: it has no .zgroup, .zarray or zarr.json", self.path)
        node, attrs = root
        array_dir, ms = self.path, None
        if node == "group" and not _multiscales(attrs) and "bioformats2raw.layout" in attrs:
            inner = zarr_metadata(self.path / "0")
            if inner is not None:
                array_dir, (node, attrs) = self.path / "0", inner
        if node == "group":
            multiscales = _multiscales(attrs)
            if not multiscales:
                raise InputError("is a Zarr group without OME-Zarr 'multiscales' metadata; ctpore reads an OME-Zarr "
                                 "image or a single 3D Zarr array", self.path)
            ms = multiscales[0]
            try:
                level = ms["datasets"][0]["path"]
            except (KeyError, IndexError, TypeError):
                raise InputError("has OME-Zarr multiscales without datasets[0].path", self.path) from None
            array_dir = array_dir / str(level)
        elif node != "array":
            raise InputError(f"has Zarr metadata of an unknown node type {node!r}", self.path)
        self._check_chunks(array_dir)
        try:
            self.array = zarr.open_array(str(array_dir), mode="r")
        except MemoryError:
            raise
        except Exception as exc:
            raise InputError(f"is not a readable Zarr array at {array_dir.name} ({reason(exc)})", self.path) from exc
        shape = tuple(int(n) for n in self.array.shape)
        self.dtype = np.dtype(self.array.dtype)
        check_grayscale_dtype(self.dtype, self.path)
        if ms is not None:
            axes = _axes(ms, len(shape))
            if len(axes) != len(shape):
                raise InputError(f"OME-Zarr names {len(axes)} axes but its array has shape {shape}", self.path)
            scale = _scale(ms["datasets"][0].get("coordinateTransformations"), len(shape))
            outer = _scale(ms.get("coordinateTransformations"), len(shape))
            scale = [a * b for a, b in zip(scale, outer)]
        else:
            names = ["z", "y", "x"] if len(shape) == 3 else [f"axis {i}" for i in range(len(shape))]
            axes = [{"name": n, "type": "space"} for n in names]
            scale = [1.0] * len(shape)
        spatial = [i for i, ax in enumerate(axes) if ax.get("type") == "space"
                   or (ax.get("type") is None and str(ax.get("name", "")).lower() in _SPATIAL_NAMES)]
        if ms is None and len(shape) != 3:
            spatial = [i for i, n in enumerate(shape) if n != 1]
        for i, ax in enumerate(axes):
            if i not in spatial and shape[i] != 1:
                kind = ax.get("type") or "non-spatial"
                raise InputError(f"has {shape[i]} {kind} entries along axis {ax.get('name', i)!r} (shape {shape}); "
                                 "ctpore needs one grayscale 3D volume: keep one channel and one time point", self.path)
        zyx = tuple(shape[i] for i in spatial)
        check_3d(zyx, self.path, shape)
        if len(zyx) != 3:
            raise InputError(f"has {len(zyx)} spatial axes (shape {shape}); ctpore needs 3 (z, y, x)", self.path)
        self._spatial = spatial
        self._ndim = len(shape)
        spacing, units = self._spacing([axes[i] for i in spatial], [scale[i] for i in spatial])
        self.geometry = Geometry(format="ome-zarr" if ms is not None else "zarr", shape=zyx,  # type: ignore[arg-type]
                                 spacing_mm=spacing, slice_axis=0, file_shape=shape, permutation=(0, 1, 2),
                                 units=units)

    def _check_chunks(self, array_dir: Path) -> None:
        if not array_dir.is_dir():
            raise InputError(f"its image {array_dir.name} is not in the store", self.path)
        stored = (p for p in array_dir.rglob("*") if p.is_file() and p.name not in _META_FILES)
        if next(stored, None) is None:
            raise InputError(f"its array {array_dir.relative_to(self.path.parent)} has no chunk stored (every voxel "
                             "would be the fill value); re-export the scan", self.path)

    @staticmethod
    def _spacing(axes: list[dict], scale: list[float]) -> tuple[tuple[float, float, float], str]:
        if not all(math.isfinite(d) and d > 0 for d in scale):
            return (1.0, 1.0, 1.0), "unknown"
        units = [unit_to_mm(ax.get("unit")) for ax in axes]
        if any(u is None for u in units):
            return tuple(abs(d) for d in scale), "unknown"  # type: ignore[return-value]
        names = {u[0] for u in units}  # type: ignore[index]
        spacing = tuple(to_mm(abs(d), u[1]) for d, u in zip(scale, units))  # type: ignore[index]
        return spacing, (names.pop() if len(names) == 1 else "mm")  # type: ignore[return-value]

    def _key(self, z: slice, y: slice, x: slice) -> tuple:
        key: list[Any] = [0] * self._ndim
        for axis, part in zip(self._spatial, (z, y, x)):
            key[axis] = part
        return tuple(key)

    def read(self, start: int, stop: int) -> np.ndarray:
        return np.asarray(self.array[self._key(slice(start, stop), slice(None), slice(None))])

    def read_window(self, start: int, stop: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        return np.asarray(self.array[self._key(slice(start, stop), slice(y0, y1), slice(x0, x1))])

    def close(self) -> None:
        self.array = None
