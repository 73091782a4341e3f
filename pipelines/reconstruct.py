"""Scan -> pore probability, pore volume and metrics.

:func:`reconstruct` works in memory and returns a :class:`Reconstruction`;
:func:`reconstruct_file` does the same for a file on disk and writes the outputs that
``ctpore reconstruct`` promises (``<stem>_pores.nii.gz``, ``<stem>_prob.nii.gz``,
``<stem>_metrics.json``, each whole or not at all, the metrics last).

Methods
-------
``poreformer``  the causal inter-slice attention model with the shipped (or given) weights.
``otsu``        the pipeline users run in Fiji: 3x3x3 median, global Otsu, speck removal.
``plain-otsu``  a bare global Otsu threshold (for comparison).
``auto``        ``poreformer`` when weights are available, else ``otsu``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from ctpore.atomic import write_json_atomic
from ctpore.data.calibration import apply_calibration
from ctpore.data.io import Geometry, Scan, geometry_from_array, load_scan, read_label, save_volume
from ctpore.data.metrics import comparison_metrics, volume_metrics
from ctpore.data.normalize import NormalizedVolume, has_contrast, robust_range, warn_no_contrast
from ctpore.errors import InputError
from ctpore.models.classical import OTSU_MIN_SIZE, clean_specks, otsu_segment
from ctpore.pipelines.outputs import (check_outputs, finish_metrics, output_paths, output_set, remove_stale_temps,
                                      run_fields)
from ctpore.progress import ProgressFn
from ctpore.runtime import current_rss

__all__ = ["METHODS", "DEFAULTS", "Reconstruction", "reconstruct", "reconstruct_file", "resolve_method",
           "output_paths"]

METHODS = ("auto", "poreformer", "otsu", "plain-otsu")


def _defaults() -> dict:
    """Defaults of reconstruction, from ``configs/reconstruct.yaml``."""
    import yaml

    path = Path(__file__).resolve().parent.parent / "configs" / "reconstruct.yaml"
    return yaml.safe_load(path.read_text())


#: Defaults for the command and the API (``configs/reconstruct.yaml``).
DEFAULTS = _defaults()

#: Scans up to this many bytes (as float32) are read into memory once before PoreFormer runs;
#: larger ones are streamed from disk slice-chunk by chunk (once per in-plane tile).
IN_MEMORY_BYTES = 2 * 2**30

#: Memory kept free of the plan for what the estimate does not see (allocator slack, metrics).
_MARGIN_BYTES = 96 * 2**20

#: The model's working memory when :func:`reconstruct` is given no whole-process budget.
_API_MODEL_BYTES = 2**30



def _auto(value):
    """A config/CLI size that may be ``auto`` (None: chosen from the memory budget)."""
    return None if value in (None, "auto") else int(value)


@dataclass
class Reconstruction:
    """What :func:`reconstruct` returns.

    Attributes
    ----------
    probability : ndarray of float32, shape (Z, Y, X)
        Pore probability in [0, 1].
    pores : ndarray of uint8, shape (Z, Y, X)
        1 = pore, 0 = solid.
    metrics : dict
        The metrics JSON (keys in ``docs/architecture.md``; MSE, Dice, ... added when a truth
        was given).
    geometry : Geometry
        Where the volume came from (to write outputs back in the input's voxel order).
    """

    probability: np.ndarray
    pores: np.ndarray
    metrics: dict
    geometry: Geometry


def resolve_method(method: str, weights: Optional[Union[str, os.PathLike]] = None) -> str:
    """Turn ``auto`` into a concrete method; check the name."""
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if method != "auto":
        return method
    from ctpore.models.weights import default_weights_path

    return "poreformer" if (weights is not None or default_weights_path() is not None) else "otsu"


def _as_scan(scan, slice_axis, spacing_mm) -> tuple[Any, Geometry, Optional[Scan]]:
    """(volume sliceable along Z, geometry, Scan we opened and must close or None)."""
    if isinstance(scan, (str, os.PathLike)):
        opened = load_scan(scan, slice_axis=slice_axis)
        return opened, opened.geometry, opened
    if isinstance(scan, Scan):
        return scan, scan.geometry, None
    arr = np.asarray(scan)
    if arr.ndim != 3:
        raise InputError(f"expected a 3D (Z, Y, X) volume, got an array of shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise InputError("the volume has NaN or Inf voxels; replace them before reconstructing")
    geom = geometry_from_array(arr.shape, spacing_mm or (1.0, 1.0, 1.0))
    return arr, geom, None


def _predict_poreformer(volume, weights, device, chunk_slices, tile, progress, memory_gb=None,
                        precision="auto", attention_backend=None, gpu_memory_gb=None):

    from ctpore.models.weights import load_for_inference, sha256_file
    from ctpore.pipelines.stream import plan_for_device, predict, resolve_device

    dev = resolve_device(device)  # a usage error before any weights are read
    model, meta, post, path = load_for_inference(weights, dev, attention_backend)
    nvox = int(np.prod(volume.shape))
    if isinstance(volume, Scan) and 4 * nvox <= IN_MEMORY_BYTES:
        volume = volume.read()  # one sequential read instead of one pass per tile
    if tile is None or chunk_slices is None:
        if memory_gb is None:  # the API in a notebook: bound the model's own working memory
            budget = _API_MODEL_BYTES
        else:  # a budget for the whole process, less what the rest of the run holds: this
            # process now, the probability map and the pores (and their post-processing), a margin
            budget = memory_gb * 2**30 - (current_rss() + nvox * (4 + 1 + 4) + _MARGIN_BYTES)
        plan_tile, plan_chunk = plan_for_device(model, volume.shape, budget, dev, gpu_memory_gb)
        tile = plan_tile if tile is None else tile
        chunk_slices = plan_chunk if chunk_slices is None else chunk_slices
    lo, hi = robust_range(volume)
    model.reset_backends_ran()
    clipped = 0
    if has_contrast(lo, hi):
        view = NormalizedVolume(volume, lo, hi)
        prob = predict(model, view, chunk_slices=chunk_slices, tile=tile, device=dev,
                       progress=progress, precision=precision)
        clipped = view.clipped_voxels(progress)
    else:
        warn_no_contrast(lo)
        prob = np.zeros(volume.shape, np.float32)
    info = {
        "model": {"name": meta.get("name", path.stem), "sha256": sha256_file(path)},
        "attention_backend": model.backends_ran(),  # what ran, not what was asked for
        "device": str(dev),
        "threshold": post.threshold,
        "min_size": post.min_size,
        "calibration": post.calibration,
        "tile": int(tile),
        "chunk_slices": int(chunk_slices),
        "clipped_voxels": clipped,
    }
    return prob, info


def _otsu(volume, method: str, chunk: int, progress: ProgressFn):
    """The pores of the ``otsu`` (Fiji's pipeline) or ``plain-otsu`` method."""
    if method == "otsu":
        return otsu_segment(volume, median_size=3, min_size=OTSU_MIN_SIZE, chunk_slices=chunk, progress=progress)[0]
    return otsu_segment(volume, chunk_slices=chunk, progress=progress)[0]


def reconstruct(
    scan,
    method: str = DEFAULTS["method"],
    *,
    weights: Optional[Union[str, os.PathLike]] = None,
    device: str = DEFAULTS["device"],
    slice_axis: Optional[int] = None,
    spacing_mm: Optional[tuple] = None,
    truth=None,
    chunk_slices: Optional[int] = _auto(DEFAULTS["chunk_slices"]),
    tile: Optional[int] = _auto(DEFAULTS["tile"]),
    progress: ProgressFn = None,
    memory_gb: Optional[float] = None,
    precision: str = DEFAULTS["precision"],
    attention_backend: Optional[str] = None,
    gpu_memory_gb: Optional[float] = None,
) -> Reconstruction:
    """Reconstruct the 3D pore phase of a scan.

    Parameters
    ----------
    scan : str, Path, Scan or ndarray
        A NIfTI/TIFF file (read lazily, slice by slice), an opened :class:`~ctpore.data.io.Scan`,
        or an in-memory ``(Z, Y, X)`` array of grey values.
    method : {"auto", "poreformer", "otsu", "plain-otsu"}
        See the module docstring.
    weights : path, optional
        A PoreFormer ``.safetensors`` file (default: the shipped weights).
    device : str
        ``"cpu"``, ``"cuda"``, ``"cuda:1"``... (PoreFormer only).
    slice_axis : int, optional
        The file's voxel axis that holds the slices (NIfTI; default its third axis).
    spacing_mm : tuple, optional
        Voxel size (z, y, x) in mm for an in-memory array (files carry their own).
    truth : ndarray or path, optional
        Ground-truth pores (1 = pore); adds MSE, Dice, IoU, porosity and Euler errors.
    chunk_slices, tile : int, optional
        Streaming: slices per chunk and the in-plane tile size (PoreFormer); None (default):
        the fastest that fit ``memory_gb``.
    progress : callable, optional
        ``progress(done, total, stage)``.
    memory_gb : float, optional
        Memory budget of the whole process in GB: the tile and chunk sizes follow from it.
        Default: the model's own working memory stays within 1 GB (the arrays returned come
        on top).
    precision : {"auto", "fp32", "bf16", "fp16"}
        ``auto``: bf16 autocast on CUDA (so FlashAttention runs), fp32 on CPU.
    attention_backend : {"auto", "flash", "sdpa", "math"}, optional
        Override the attention backend stored with the weights (the metrics report the one
        that ran).
    gpu_memory_gb : float, optional
        On CUDA, the most GPU memory (GB) the tiles and chunks may take. Default: the GPU's free
        memory less a margin.

    Returns
    -------
    Reconstruction
    """
    t0 = time.perf_counter()
    volume, geometry, opened = _as_scan(scan, slice_axis, spacing_mm)
    try:
        concrete = resolve_method(method, weights)
        info: dict = {"model": {"name": concrete, "sha256": None}, "attention_backend": None, "device": "cpu"}
        if concrete == "poreformer":
            prob, pf = _predict_poreformer(volume, weights, device, chunk_slices, tile, progress,
                                           memory_gb, precision, attention_backend, gpu_memory_gb)
            info.update(pf)
            pores = (prob >= info["threshold"]).astype(np.uint8)  # on the raw probability
            if info["min_size"] > 1:
                pores = clean_specks(pores, info["min_size"])
            if info["calibration"] is not None:
                apply_calibration(prob, info["calibration"], out=prob)
        else:
            chunk = chunk_slices or 32
            lo, hi = robust_range(volume)
            if not has_contrast(lo, hi):  # no structure to threshold: no pores, said in a warning
                warn_no_contrast(lo)
                pores = np.zeros(tuple(int(d) for d in volume.shape), np.uint8)
            else:  # far-out grey values clipped, so that they cannot move the threshold
                view = NormalizedVolume(volume, lo, hi)
                pores = _otsu(view, concrete, chunk, progress)
                info["clipped_voxels"] = view.clipped_voxels(progress)
            prob = pores.astype(np.float32)
    finally:
        if opened is not None:
            opened.close()

    metrics = volume_metrics(pores, geometry.spacing_mm)
    metrics.update(run_fields(pores.shape, geometry, concrete, info))
    if "clipped_voxels" in info:
        metrics["clipped_voxels"] = info["clipped_voxels"]
    finish_metrics(metrics, geometry, str(scan) if isinstance(scan, (str, os.PathLike)) else "the scan")
    if truth is not None:
        if isinstance(truth, (str, os.PathLike)):
            truth = read_label(truth, slice_axis=slice_axis, like=geometry)
        metrics.update(comparison_metrics(pores, np.asarray(truth), prob=prob))
        # the thresholding methods have no probability: their MSE is of the 0/1 pores (1 - accuracy)
        metrics["mse_of"] = "probability" if concrete == "poreformer" else "binary pores"
    from ctpore import __version__

    metrics["seconds"] = round(time.perf_counter() - t0, 3)
    metrics["ctpore_version"] = __version__
    return Reconstruction(probability=prob, pores=pores, metrics=metrics, geometry=geometry)


def reconstruct_file(
    scan_path: Union[str, os.PathLike],
    outdir: Union[str, os.PathLike],
    method: str = DEFAULTS["method"],
    *,
    overwrite: bool = False,
    weights: Optional[Union[str, os.PathLike]] = None,
    device: str = DEFAULTS["device"],
    slice_axis: Optional[int] = None,
    truth: Optional[Union[str, os.PathLike]] = None,
    chunk_slices: Optional[int] = _auto(DEFAULTS["chunk_slices"]),
    tile: Optional[int] = _auto(DEFAULTS["tile"]),
    progress: ProgressFn = None,
    memory_gb: float = DEFAULTS["memory_gb"],
    precision: str = DEFAULTS["precision"],
    attention_backend: Optional[str] = None,
    annotate: Optional[dict] = None,
    gpu_memory_gb: Optional[float] = None,
) -> dict:
    """Reconstruct one scan file and write its outputs (see the module docstring).

    ``annotate``: extra keys for the metrics file (``ctpore batch`` records its options there).
    ``gpu_memory_gb``: on CUDA, the most GPU memory the tiles and chunks may take (see
    :func:`reconstruct`).

    Returns
    -------
    dict
        ``{"pores": Path, "prob": Path, "metrics": Path, "result": metrics dict}``.
    """
    paths = check_outputs(scan_path, outdir, overwrite)
    with load_scan(scan_path, slice_axis=slice_axis):  # a bad scan (or a lying header) is said at once,
        pass  # from its header, before the model's libraries load
    remove_stale_temps(paths)  # what a killed earlier run of this scan left half-written
    if resolve_method(method, weights) == "poreformer":
        # Slab by slab, so that memory does not grow with the number of slices (the figures
        # equal the in-memory ones; see ctpore.pipelines.large).
        from ctpore.pipelines.large import reconstruct_large

        with output_set(paths):
            metrics = reconstruct_large(
                scan_path, paths, weights=weights, device=device, slice_axis=slice_axis, truth=truth,
                memory_gb=memory_gb, precision=precision, chunk_slices=chunk_slices, tile=tile, progress=progress,
                attention_backend=attention_backend, gpu_memory_gb=gpu_memory_gb,
            )
            metrics.update(annotate or {})
            write_json_atomic(paths["metrics"], metrics)
        return {**paths, "result": metrics}
    result = reconstruct(
        scan_path, method, weights=weights, device=device, slice_axis=slice_axis, truth=truth,
        chunk_slices=chunk_slices, tile=tile, progress=progress, memory_gb=memory_gb, precision=precision,
        attention_backend=attention_backend, gpu_memory_gb=gpu_memory_gb,
    )
    result.metrics.update(annotate or {})
    with output_set(paths):
        save_volume(paths["pores"], result.pores, result.geometry, dtype=np.uint8)
        save_volume(paths["prob"], result.probability, result.geometry, dtype=np.float32)
        write_json_atomic(paths["metrics"], result.metrics)  # last: its presence means the set is whole
    return {**paths, "result": result.metrics}
