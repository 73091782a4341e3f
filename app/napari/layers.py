"""The work behind the napari widgets, as plain functions: no viewer, no Qt.

Layers travel as napari's layer data tuples ``(data, kwargs, layer_type)``. Volumes are
``(Z, Y, X)`` with the scan's voxel size in mm as ``scale``, so anisotropic voxels look right;
``metadata["ctpore_geometry"]`` keeps where a NIfTI came from, so a layer saved back keeps its
header.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional, Union

import numpy as np

from ctpore.errors import InputError

__all__ = ["Cancelled", "scan_layer", "volume_of", "reconstruct_layers", "write_layer", "inspect_layers",
           "simulated_layers"]

LayerData = tuple  # (data, kwargs, layer_type)


class Cancelled(Exception):
    """The user pressed Cancel (raised between chunks of slices, from the progress callback)."""


def scan_layer(path: Union[str, os.PathLike]) -> LayerData:
    """A scan file or folder as an image layer (see the module docstring)."""
    from ctpore.data.io import load_scan, output_stem

    with load_scan(path) as scan:
        data, geometry = scan.read(), scan.geometry
    return data, {"name": output_stem(path), "scale": tuple(geometry.spacing_mm),
                  "metadata": {"ctpore_geometry": geometry, "ctpore_path": str(path)}}, "image"


def volume_of(data, name: str = "the layer") -> np.ndarray:
    """The layer's data as a ``(Z, Y, X)`` float32 volume, or an :class:`InputError` that says why not."""
    arr = np.asarray(data)
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise InputError(f"{name} holds {arr.dtype} values; pores are reconstructed from a grayscale scan")
    if arr.ndim != 3:
        raise InputError(f"{name} is {arr.ndim}D (shape {arr.shape}); pores are reconstructed from a 3D scan "
                         "(Z, Y, X)")
    if min(arr.shape) < 2:
        raise InputError(f"{name} has shape {arr.shape}; a 3D scan needs at least 2 voxels along each axis")
    return arr.astype(np.float32, copy=False)


def _spacing(scale) -> tuple:
    s = tuple(float(v) for v in (scale if scale is not None else (1.0, 1.0, 1.0)))[-3:]
    return s if len(s) == 3 and all(v > 0 for v in s) else (1.0, 1.0, 1.0)


def reconstruct_layers(
    data,
    name: str = "scan",
    scale=None,
    method: str = "auto",
    weights: Optional[str] = None,
    device: str = "cpu",
    progress: Optional[Callable[[int, int, str], None]] = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> tuple[list[LayerData], dict]:
    """Reconstruct a layer's volume; return the probability and pores layers and the metrics.

    ``should_stop`` is asked after every chunk; when it says True, :class:`Cancelled` is raised
    and nothing is returned (no half-made layers).
    """
    from ctpore.pipelines.reconstruct import reconstruct

    vol = volume_of(data, f"layer {name!r}")

    def tick(done: int, total: int, stage: str) -> None:
        if should_stop():
            raise Cancelled
        if progress is not None:
            progress(done, total, stage)

    spacing = _spacing(scale)
    res = reconstruct(vol, method, weights=weights or None, device=device, spacing_mm=spacing, progress=tick)
    if should_stop():
        raise Cancelled
    kw = {"scale": spacing, "metadata": {"ctpore_metrics": res.metrics}}
    return [
        (res.probability, {**kw, "name": f"{name} pore probability", "colormap": "magma",
                           "contrast_limits": (0.0, 1.0), "visible": False}, "image"),
        (res.pores, {**kw, "name": f"{name} pores", "opacity": 0.6}, "labels"),
    ], res.metrics


def write_layer(path: Union[str, os.PathLike], data, meta: dict, kind: str) -> list[str]:
    """Save an image or labels layer as NIfTI or TIFF; keep the source header when it came from one."""
    from ctpore.data.io import geometry_from_array, save_volume

    arr = np.asarray(data)
    if arr.ndim != 3:
        raise InputError(f"only 3D (Z, Y, X) layers can be saved as a scan; this one is {arr.ndim}D", path)
    geometry = (meta.get("metadata") or {}).get("ctpore_geometry")
    if geometry is None or tuple(geometry.shape) != arr.shape:
        geometry = geometry_from_array(arr.shape, _spacing(meta.get("scale")))
    if kind == "labels":
        top = int(arr.max()) if arr.size else 0
        dtype = np.uint8 if top <= 255 else (np.uint16 if top <= 65535 else np.int32)
    else:
        dtype = np.float32 if arr.dtype.kind == "f" else arr.dtype
    return [str(save_volume(path, arr, geometry, dtype=dtype))]


def inspect_layers(
    data,
    point: tuple[int, int, int],
    scale=None,
    weights: Optional[str] = None,
    radius: int = 48,
) -> tuple[list[LayerData], dict]:
    """The attention inspector's results for voxel ``point`` of a layer's volume.

    Returns
    -------
    layers : list
        One image layer per full-resolution head with its attention entropy per pixel around the
        point (on the point's slice), and a points layer marking, for each head, the slice it
        attends to most.
    info : dict
        ``view`` (:class:`~ctpore.pipelines.inspect.HeadView`), ``heatmap`` (RGB), ``similarity``
        of the heads, ``max_entropy``.
    """
    from ctpore.pipelines.inspect import attention_at, head_maps, heatmap_rgb

    vol = volume_of(data)
    spacing = _spacing(scale)
    view = attention_at(vol, point, weights=weights)
    maps = head_maps(vol, point, weights=weights, radius=radius)
    z, y, x = view.point
    y0, x0 = maps["origin"]
    layers: list[LayerData] = []
    for h, ent in enumerate(maps["entropy"]):
        layers.append((ent[None], {"name": f"head {h} attention entropy", "scale": spacing,
                                   "translate": (z * spacing[0], y0 * spacing[1], x0 * spacing[2]),
                                   "colormap": "viridis", "contrast_limits": (0.0, maps["max_entropy"]),
                                   "visible": h == 0, "opacity": 0.7}, "image"))
    top = view.top[-1]  # the full-resolution block
    pts = np.array([[t, y, x] for t in top], dtype=float)
    layers.append((pts, {"name": "most attended slices", "scale": spacing, "size": 3, "face_color": "red",
                         "features": {"head": np.arange(len(top))}}, "points"))
    return layers, {"view": view, "heatmap": heatmap_rgb(view), "similarity": maps["similarity"],
                    "max_entropy": maps["max_entropy"]}


def simulated_layers(seed: int = 2026, shape=(64, 128, 128)) -> list[LayerData]:
    """A simulated scan of a porous medium and its true pores (the plugin's sample data)."""
    from ctpore.data.synthetic import VOXEL_SIZE_MM, make_pair

    scan, truth, info = make_pair(seed, shape=tuple(shape))
    scale = (VOXEL_SIZE_MM,) * 3
    return [(scan, {"name": f"simulated {info['family']} scan", "scale": scale}, "image"),
            (truth, {"name": "true pores", "scale": scale, "opacity": 0.5, "visible": False}, "labels")]


def is_readable(path) -> bool:
    """Whether ``path`` opens as a scan (a cheap header check; never raises)."""
    from ctpore.data.io import load_scan
    from ctpore.data.io.registry import file_kind

    try:
        p = Path(path)
        if not p.exists() or not file_kind(p):
            return False
        with load_scan(p):
            return True
    except Exception:  # a reader never raises: whatever is wrong, napari tries other readers
        return False
