"""The work behind the napari widgets, as plain functions: no viewer, no Qt.

Layers travel as napari's layer data tuples ``(data, kwargs, layer_type)``. Volumes are
``(Z, Y, X)`` with the scan's voxel size in mm as ``scale``, so anisotropic voxels look right;
``metadata["ctpore_geometry"]`` keeps where a NIfTI came from, so a layer saved back keeps its
header. Every layer ctpore adds that is not a scan (probability, pores, entropy maps, markers)
carries ``metadata["ctpore_role"]`` (:data:`OUTPUT_ROLES`), so the widgets' scan lists leave it out.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional, Union

import numpy as np

from ctpore.errors import InputError

__all__ = ["Cancelled", "scan_layer", "volume_of", "reconstruct_layers", "write_layer", "inspect_layers",
           "simulated_layers", "summary_of", "is_output", "sample_mask_choices", "sample_of", "ROLE", "OUTPUT_ROLES",
           "INSPECTOR_ROLES", "SAMPLE_MASK_ROLE", "AXIS_LABELS"]

LayerData = tuple  # (data, kwargs, layer_type)

#: The metadata key that marks what a layer ctpore added is.
ROLE = "ctpore_role"
#: Roles of the layers the attention inspector adds (replaced at each new voxel).
INSPECTOR_ROLES = ("entropy", "inspected voxel", "most attended")
#: Roles of the layers ctpore adds that are results, not scans (never offered as a scan).
OUTPUT_ROLES = ("probability", "pores", "sample", "truth", "thickness", *INSPECTOR_ROLES)
#: The role of a 0/1 layer the user picked as the sample mask (painted, loaded, or ctpore's found
#: sample edited): an input of its own, apart from the pores and from labels of pore and solid.
SAMPLE_MASK_ROLE = "sample mask"
#: Names of a ``(Z, Y, X)`` volume's axes, for ``viewer.dims.axis_labels``.
AXIS_LABELS = ("z", "y", "x")


def is_output(metadata) -> bool:
    """Whether a layer with this ``metadata`` is a result ctpore added (not a scan to work on)."""
    return isinstance(metadata, dict) and metadata.get(ROLE) in OUTPUT_ROLES


class Cancelled(Exception):
    """The user pressed Cancel (raised between chunks of slices, from the progress callback)."""


def sample_mask_choices(layers, shape) -> list[str]:
    """Names of the layers that may serve as a scan's sample mask: labels layers of the scan's
    ``shape`` that are not results other than a sample (a user's painted or loaded mask, ctpore's
    found sample, perhaps edited, or a layer already picked as the sample mask)."""
    names = []
    for layer in layers:
        role = (layer.metadata or {}).get(ROLE) if isinstance(layer.metadata, dict) else None
        if type(layer).__name__ != "Labels" or role not in (None, "sample", SAMPLE_MASK_ROLE):
            continue
        if tuple(np.shape(layer.data)) == tuple(shape):
            names.append(layer.name)
    return names


def sample_of(choice, layer=None):
    """What ``reconstruct`` takes as ``sample`` for a choice of the dock: ``"auto"`` (found by its
    shape), ``"all"``, or the 0/1 volume of ``layer`` (a mask; anything but 0 and 1 is refused by the
    reconstruction with the values it found). The layer is marked with :data:`SAMPLE_MASK_ROLE`."""
    if choice in ("auto", "all"):
        return choice
    if layer is None:
        raise InputError(f"there is no layer {choice!r} to take as the sample mask")
    if isinstance(layer.metadata, dict) and layer.metadata.get(ROLE) != "sample":
        layer.metadata[ROLE] = SAMPLE_MASK_ROLE
    return np.asarray(layer.data)


def scan_layer(path: Union[str, os.PathLike]) -> LayerData:
    """A scan file or folder as an image layer (see the module docstring)."""
    from ctpore.data.io import load_scan, output_stem

    with load_scan(path) as scan:
        geometry = scan.geometry
        levels = _pyramid(path, geometry)
        data = levels if levels is not None else scan.read()
    meta = {"name": output_stem(path), "scale": tuple(geometry.spacing_mm),
            "metadata": {"ctpore_geometry": geometry, "ctpore_path": str(path)}}
    if levels is not None:
        meta["multiscale"] = True
    return data, meta, "image"


def _pyramid(path, geometry) -> Optional[list]:
    """An OME-Zarr store's levels as lazy Zarr arrays (napari reads only the chunks it shows; what
    ``--output-format ome-zarr`` writes), or None when there is one level or it is not such a store."""
    from pathlib import Path

    from ctpore.data.io.omezarr import level_paths

    if geometry.format != "ome-zarr" or geometry.file_shape != geometry.shape:
        return None
    paths = level_paths(Path(path))
    if len(paths) < 2:
        return None
    import zarr

    levels = [zarr.open_array(str(Path(path) / p), mode="r") for p in paths]
    return levels if all(a.ndim == 3 for a in levels) else None


def volume_of(data, name: str = "the layer") -> np.ndarray:
    """The layer's data as a ``(Z, Y, X)`` float32 volume, or an :class:`InputError` that says why not
    (of a multiscale layer, its full-resolution level)."""
    if type(data).__name__ == "MultiScaleData" or (isinstance(data, (list, tuple)) and len(data)
                                                    and getattr(data[0], "ndim", 0) == 3):
        data = data[0]
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
    sample="auto",
) -> tuple[list[LayerData], dict]:
    """Reconstruct a layer's volume; return the probability and pores layers (and the sample,
    shown by its outline on every slice, when the scan has an outside or a mask was given) and the
    metrics. ``sample``: ``"auto"``, ``"all"`` or a 0/1 mask of the scan's shape (:func:`sample_of`).

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
    res = reconstruct(vol, method, weights=weights or None, device=device, spacing_mm=spacing, progress=tick,
                      sample=sample)
    if should_stop():
        raise Cancelled
    meta = {"ctpore_metrics": res.metrics, "ctpore_source": name}
    layers = [
        (res.probability, {"scale": spacing, "name": f"{name} pore probability", "colormap": "magma",
                           "contrast_limits": (0.0, 1.0), "visible": False,
                           "metadata": {**meta, ROLE: "probability"}}, "image"),
        (res.pores, {"scale": spacing, "name": f"{name} pores", "opacity": 0.6,
                     "metadata": {**meta, ROLE: "pores"}}, "labels"),
    ]
    if res.sample is not None:  # the scan had an outside: the sample every figure is of (drawn as its outline)
        layers.append((res.sample, {"scale": spacing, "name": f"{name} sample", "opacity": 0.9,
                                    "metadata": {**meta, ROLE: "sample"}}, "labels"))
    return layers, res.metrics


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
    radius: int = 12,
    normalize_rows: bool = False,
) -> tuple[list[LayerData], dict]:
    """The attention inspector's results for voxel ``point`` of a layer's volume.

    Returns
    -------
    layers : list
        On the point's slice: one small image layer per full-resolution head with its attention
        entropy as a fraction of its maximum, per pixel in a square of ``radius`` around the
        point (head 0 shown, the others hidden until asked), and a marker on the voxel
        itself; and a points layer marking the slices the full-resolution heads attend to most
        (labelled with the heads; each shows when its slice is viewed).
    info : dict
        ``view`` (:class:`~ctpore.pipelines.inspect.HeadView`), ``heatmap`` (the labelled
        picture, RGB), ``similarity`` of the heads, ``max_entropy``.
    """
    from ctpore.pipelines.inspect import attention_at, head_maps
    from ctpore.pipelines.inspect_plot import heatmap_rgb

    vol = volume_of(data)
    spacing = _spacing(scale)
    view = attention_at(vol, point, weights=weights)
    maps = head_maps(vol, point, weights=weights, radius=radius)
    z, y, x = view.point
    y0, x0 = maps["origin"]
    label = maps["label"]
    layers: list[LayerData] = []
    for h, ent in enumerate(maps["entropy"]):
        frac = ent[None] / maps["max_entropy"] if maps["max_entropy"] > 0 else np.zeros_like(ent[None])
        layers.append((frac, {"name": f"head {h} attention entropy", "scale": spacing,
                              "translate": (z * spacing[0], y0 * spacing[1], x0 * spacing[2]),
                              "colormap": "viridis", "contrast_limits": (0.0, 1.0),
                              "visible": h == 0, "opacity": 0.6,
                              "metadata": {ROLE: "entropy", "ctpore_about": f"{label}, head {h}: attention entropy "
                                           "/ its maximum (0: one slice, 1: even over its window)"}}, "image"))
    layers.append((np.array([[z, y, x]], dtype=float),
                   {"name": "inspected voxel", "scale": spacing, "size": 4, "symbol": "ring", "face_color": "red",
                    "border_color": "red", "metadata": {ROLE: "inspected voxel"}}, "points"))
    top = view.top[-1]  # the full-resolution block: one marker per slice some head attends to most
    slices = sorted({int(t) for t in top})
    says = [f"head{'s' if (top == s).sum() > 1 else ''} {', '.join(str(h) for h in np.flatnonzero(top == s))}: "
            "most attended" for s in slices]
    layers.append((np.array([[s, y, x] for s in slices], dtype=float),
                   {"name": "most attended slices", "scale": spacing, "size": 3, "face_color": "yellow",
                    "features": {"says": says}, "metadata": {ROLE: "most attended"},
                    "text": {"string": "{says}", "color": "yellow", "anchor": "lower_left", "size": 9}},
                   "points"))
    return layers, {"view": view, "heatmap": heatmap_rgb(view, normalize_rows), "similarity": maps["similarity"],
                    "max_entropy": maps["max_entropy"]}


def summary_of(data, name: str = "the scan", weights: Optional[str] = None, pores=None, pores_name: str = "",
               columns: int = 1024, progress: Optional[Callable[[int, int, str], None]] = None,
               ) -> tuple[dict, np.ndarray]:
    """The whole-scan summary of the heads (:func:`~ctpore.pipelines.inspect_summary.head_summary`)
    of layer ``name``'s volume, and its picture (RGB); ``pores``: the data of a pores layer
    (``pores_name``) to split by, else the model's own prediction."""
    from ctpore.pipelines.inspect_plot import summary_rgb
    from ctpore.pipelines.inspect_summary import head_summary

    vol = volume_of(data, f"layer {name!r}")
    summary = head_summary(vol, weights=weights, columns=columns, progress=progress,
                           pores=None if pores is None else np.asarray(pores))
    summary["scan"] = name
    if pores is not None:
        summary["pore_source"] = f"the layer {pores_name!r} (1 = pore)"
    return summary, summary_rgb(summary)


def simulated_layers(seed: int = 2026, shape=(64, 128, 128)) -> list[LayerData]:
    """A simulated scan of a porous medium and its true pores (the plugin's sample data)."""
    from ctpore.data.synthetic import VOXEL_SIZE_MM, make_pair

    scan, truth, info = make_pair(seed, shape=tuple(shape))
    scale = (VOXEL_SIZE_MM,) * 3
    return [(scan, {"name": f"simulated {info['family']} scan", "scale": scale}, "image"),
            (truth, {"name": "true pores", "scale": scale, "opacity": 0.5, "visible": False,
                     "metadata": {ROLE: "truth"}}, "labels")]


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
