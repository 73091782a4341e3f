"""Scan -> pore probability, pore volume and metrics: the one reconstruct pipeline.

Every entry goes through :func:`run_reconstruction`: the Python API (:func:`reconstruct`, arrays
back), ``ctpore reconstruct`` and ``ctpore batch`` (:func:`reconstruct_file`, files written), and
the napari plugin, for every method of :mod:`ctpore.pipelines.methods` and every slice axis. Its
steps:

1. The scan's robust grey range (:mod:`ctpore.data.normalize`); a scan without contrast gets no
   pores and a warning.
2. The method's predictor writes the raw pore probabilities of the normalized scan into a volume
   that waits on disk beside the outputs (:class:`~ctpore.pipelines.spill.BlockSpill`) or, for
   arrays, into the probability array itself.
3. The method's :class:`~ctpore.data.postprocess.Postprocessing` reads them back slab by slab
   (threshold, component rules, calibration); each final slab goes to the sink (appended to the
   output files, or into the arrays) and to one
   :class:`~ctpore.data.metrics.MetricsAccumulator`, with the truth's slab when there is one.

Memory is then the predictor's working set plus a few slabs, whatever the number of slices, and
the figures equal those of the whole volume. The files a run writes are ``<stem>_pores.nii.gz``,
``<stem>_prob.nii.gz`` (or ``.ome.zarr`` stores) and ``<stem>_metrics.json``, each whole or not at
all, the metrics last.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from ctpore.atomic import write_json_atomic
from ctpore.data.io import Geometry, Scan, geometry_from_array, load_scan
from ctpore.data.io.formats import optional_import
from ctpore.data.io.omezarr_write import remove_tree
from ctpore.errors import InputError
from ctpore.pipelines.methods import get_method, resolve_method
from ctpore.pipelines.claims import claim_run
from ctpore.pipelines.outputs import (check_outputs, finish_metrics, other_format_outputs, output_paths, output_set)
from ctpore.pipelines.output_formats import DEFAULT_OUTPUT_FORMAT, OUTPUT_FORMATS
from ctpore.pipelines.reconstruct_run import run_reconstruction
from ctpore.pipelines.sinks import ArraySink, FileSink
from ctpore.progress import ProgressFn

__all__ = ["DEFAULTS", "Reconstruction", "reconstruct", "reconstruct_file", "resolve_method", "build_predictor",
           "run_reconstruction", "output_paths"]

PathLike = Union[str, os.PathLike]


def _defaults() -> dict:
    """Defaults of reconstruction, from ``configs/reconstruct.yaml``."""
    import yaml

    path = Path(__file__).resolve().parent.parent / "configs" / "reconstruct.yaml"
    return yaml.safe_load(path.read_text())


#: Defaults for the command and the API (``configs/reconstruct.yaml``).
DEFAULTS = _defaults()

#: Scans up to this many bytes (as float32) are read into memory once before an in-memory run;
#: larger ones are read window by window.
IN_MEMORY_BYTES = 2 * 2**30


def _auto(value):
    """A config/CLI size that may be ``auto`` (None: chosen from the memory budget)."""
    return None if value in (None, "auto") else int(value)


@dataclass
class Reconstruction:
    """What :func:`reconstruct` returns.

    Attributes
    ----------
    probability : ndarray of float32, shape (Z, Y, X)
        Pore probability in [0, 1] (a thresholding method's: its 0/1 pores).
    pores : ndarray of uint8, shape (Z, Y, X)
        1 = pore, 0 = solid.
    metrics : dict
        The metrics JSON (keys in ``docs/architecture.md``; MSE, Dice, ... added when a truth
        was given).
    geometry : Geometry
        Where the volume came from (to write outputs back in the input's voxel order).
    sample : ndarray of uint8, shape (Z, Y, X), or None
        1 in the sample, 0 outside it (None: the whole volume is sample).
    """

    probability: np.ndarray
    pores: np.ndarray
    metrics: dict
    geometry: Geometry
    sample: Optional[np.ndarray] = None


def build_predictor(method: str, weights: Optional[PathLike] = None, device: str = "cpu",
                    attention_backend: Optional[str] = None):
    """The predictor of ``method`` (``auto`` resolved), its weights loaded."""
    spec = get_method(resolve_method(method, weights))
    return spec.factory(weights=weights, device=device, attention_backend=attention_backend)


def _finish(metrics: dict, geometry: Geometry, source: str, t0: float) -> dict:
    from ctpore.version import __version__

    finish_metrics(metrics, geometry, source)
    metrics["seconds"] = round(time.perf_counter() - t0, 3)
    metrics["ctpore_version"] = __version__
    return metrics


def _as_volume(scan, slice_axis, spacing_mm) -> tuple[Any, Geometry, Optional[Scan]]:
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


def reconstruct(
    scan,
    method: str = DEFAULTS["method"],
    *,
    weights: Optional[PathLike] = None,
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
    min_pore_voxels: Optional[int] = None,
    predictor: Any = None,
    gpu_memory_gb: Optional[float] = None,
    sample: Any = "auto",
    sample_margin: int = 0,
) -> Reconstruction:
    """Reconstruct the 3D pore phase of a scan, in memory.

    Parameters
    ----------
    scan : str, Path, Scan or ndarray
        A scan file (read lazily, slice by slice), an opened :class:`~ctpore.data.io.Scan`, or an
        in-memory ``(Z, Y, X)`` array of grey values.
    method : str
        ``auto`` or a name of :mod:`ctpore.pipelines.methods` (``poreformer``, ``unet3d``,
        ``unet2d``, ``otsu``, ``plain-otsu``).
    weights : path, optional
        The method's ``.safetensors`` file (default: the shipped weights).
    device : str
        ``"cpu"``, ``"cuda"``, ``"cuda:1"``... (learned methods).
    slice_axis : int, optional
        The file's voxel axis that holds the slices (NIfTI; default its third axis).
    spacing_mm : tuple, optional
        Voxel size (z, y, x) in mm for an in-memory array (files carry their own).
    truth : ndarray or path, optional
        Ground-truth pores (1 = pore); adds MSE, Dice, IoU, porosity, Euler and Betti errors.
    chunk_slices, tile : int, optional
        Streaming: slices per chunk and the in-plane tile size (PoreFormer); None (default):
        the fastest that fit the memory budget.
    progress : callable, optional
        ``progress(done, total, stage)``.
    memory_gb : float, optional
        Budget of the run's working memory in GB (the arrays returned come on top): tiles, chunks
        and slabs follow from it. Default: the model's working memory within 1 GB.
    precision : {"auto", "fp32", "bf16", "fp16"}
        ``auto``: bf16 autocast on CUDA (so FlashAttention runs); on a CPU that multiplies bf16 in
        hardware (AVX512-BF16, AMX) a bf16 copy of the model; fp32 on other CPUs
        (:mod:`ctpore.pipelines.precision`).
    attention_backend : {"auto", "flash", "sdpa", "math"}, optional
        Override the attention backend stored with the weights (the metrics report the one
        that ran).
    min_pore_voxels : int, optional
        Also remove pore components smaller than this (recorded in the metrics).
    predictor : Predictor, optional
        An already built predictor (its weights loaded once for many scans); ``method``,
        ``weights``, ``device`` and ``attention_backend`` are then not used.
    gpu_memory_gb : float, optional
        On CUDA, the most GPU memory (GB) the tiles and chunks may take. Default: the GPU's free
        memory less a margin.
    sample : {"auto", "all"}, path or ndarray
        Which voxels are the sample: ``auto`` (default) finds an outside connected to the slices'
        border (a cylinder's empty or air-filled outside, a box's margin; a scan without one is all
        sample); ``all``: every voxel; or a mask (1 = sample) of the scan's shape. Every figure is
        of the sample only and no pore lies outside it; ``Reconstruction.sample`` holds the mask.
    sample_margin : int
        Erode the sample (found or given) by this many voxels within each slice: users often drop a
        damaged rim.

    Returns
    -------
    Reconstruction
    """
    t0 = time.perf_counter()
    volume, geometry, opened = _as_volume(scan, slice_axis, spacing_mm)
    try:
        if predictor is None:
            predictor = build_predictor(method, weights, device, attention_backend)
        if isinstance(volume, Scan) and 4 * int(np.prod(volume.shape)) <= IN_MEMORY_BYTES:
            volume = volume.read()  # one sequential read instead of one pass per tile
        sink = ArraySink(geometry.shape)
        metrics = run_reconstruction(volume, geometry, predictor, sink, truth=truth, slice_axis=slice_axis,
                                     memory_gb=memory_gb, chunk_slices=chunk_slices, tile=tile,
                                     precision=precision, min_pore_voxels=min_pore_voxels,
                                     gpu_memory_gb=gpu_memory_gb, sample=sample, progress=progress,
                                     sample_margin=sample_margin,
                                     source=str(scan) if isinstance(scan, (str, os.PathLike)) else "the scan")
    finally:
        if opened is not None:
            opened.close()
    _finish(metrics, geometry, str(scan) if isinstance(scan, (str, os.PathLike)) else "the scan", t0)
    return Reconstruction(probability=sink.prob, pores=sink.pores, metrics=metrics, geometry=geometry,
                          sample=sink.sample)


def reconstruct_file(
    scan_path: PathLike,
    outdir: PathLike,
    method: str = DEFAULTS["method"],
    *,
    overwrite: bool = False,
    weights: Optional[PathLike] = None,
    device: str = DEFAULTS["device"],
    slice_axis: Optional[int] = None,
    truth: Optional[PathLike] = None,
    chunk_slices: Optional[int] = _auto(DEFAULTS["chunk_slices"]),
    tile: Optional[int] = _auto(DEFAULTS["tile"]),
    progress: ProgressFn = None,
    memory_gb: float = DEFAULTS["memory_gb"],
    precision: str = DEFAULTS["precision"],
    attention_backend: Optional[str] = None,
    min_pore_voxels: Optional[int] = None,
    annotate: Optional[dict] = None,
    predictor: Any = None,
    gpu_memory_gb: Optional[float] = None,
    sample: Any = "auto",
    tmp_dir: Optional[PathLike] = None,
    output_format: str = DEFAULT_OUTPUT_FORMAT,
    sample_margin: int = 0,
    analyze: bool = False,
    flow: bool = False,
) -> dict:
    """Reconstruct one scan file and write its outputs (see the module docstring), slab by slab
    within ``memory_gb`` for the whole process, whatever the scan's size.

    ``annotate``: extra keys for the metrics file (``ctpore batch`` records its options there).
    ``tmp_dir``: where the temporary files go (default: the output folder; :func:`~.claims.claim_run`).
    ``output_format``: ``"nifti"`` (``.nii.gz``) or ``"ome-zarr"`` (multiscale ``.ome.zarr`` stores,
    :mod:`ctpore.data.io.omezarr_write`); an earlier run's volumes of the stem in the other format
    are removed when this run's are whole.
    Other parameters as :func:`reconstruct`. When the scan has an outside (or ``sample`` is a
    mask), the sample mask is written too (``<stem>_sample.nii.gz``, 1 = sample); an older sample
    mask of the same stem that this run does not replace is removed, so the files of a stem are
    always one run's. ``analyze``: also ``ctpore analyze``'s outputs of the pores written
    (:mod:`ctpore.pipelines.analysis_run`: ``<stem>_analysis.json``, the thickness map, the pore-size
    table and plot), its figures in the metrics too, with the ranges of the porosity, Euler number and
    percolating porosity over five levels of the probability (:mod:`ctpore.pipelines.ranges`).
    ``flow`` (implies ``analyze``): also the permeability and tortuosity on the largest cube up to
    200³ inside the sample that fits ``memory_gb`` (:mod:`ctpore.pipelines.flow`); what the flow
    cannot do is refused before the model runs, and a sample with no cube inside it gives null
    figures and a warning, not a lost reconstruction.

    Returns
    -------
    dict
        ``{"pores": Path, "prob": Path, "metrics": Path, "sample": Path, "result": metrics dict}``
        (``sample`` is written only when there is an outside).
    """
    t0 = time.perf_counter()
    paths = check_outputs(scan_path, outdir, overwrite, output_format)
    analyze = analyze or flow
    if analyze:
        from ctpore.pipelines.analysis_run import analysis_paths, analyze_written

        there = [p for p in analysis_paths(paths["pores"]).values() if p.exists()]
        if there and not overwrite:
            raise InputError(f"exists already: {there[0]}; give another -o, or --overwrite")
    fmt = OUTPUT_FORMATS[output_format]
    if fmt.library:  # its library, before any work rather than when the first slab is written
        optional_import(fmt.library, Path(paths["pores"]), fmt.label, "writing")
    # a bad scan (or a lying header) is said at once, from its header, before the model's libraries load
    with claim_run(paths, overwrite, tmp_dir) as disk, load_scan(scan_path, slice_axis=slice_axis) as scan:
        if flow:  # before the model runs: the extra, cubic voxels, room in the budget
            from ctpore.pipelines.flow import DEFAULT_CUBE, check_flow, flow_side

            try:
                check_flow(DEFAULT_CUBE, scan.geometry.spacing_mm, getattr(scan.geometry, "units", "mm") != "unknown")
                flow_side(memory_gb)
            except InputError as exc:
                what = exc.message.replace("resample the pores", "resample the scan")
                raise InputError(what, path=scan_path) from None
        if predictor is None:
            predictor = build_predictor(method, weights, device, attention_backend)
        disk.check(scan, predictor, memory_gb=memory_gb, gpu_memory_gb=gpu_memory_gb, tile=tile,
                   chunk_slices=chunk_slices, sample=sample, precision=precision)
        with output_set(paths):
            metrics = run_reconstruction(
                scan, scan.geometry, predictor, FileSink(paths, scan.geometry), folder=disk.folder,
                truth=truth, slice_axis=slice_axis, memory_gb=memory_gb, chunk_slices=chunk_slices, tile=tile,
                precision=precision, min_pore_voxels=min_pore_voxels, gpu_memory_gb=gpu_memory_gb,
                sample=sample, source=str(scan_path), progress=progress, sample_margin=sample_margin, ranges=analyze)
            stale = other_format_outputs(paths) + ([paths["sample"], paths["sample_png"]]
                                                   if not metrics["sample"]["outside_voxels"] else [])
            for p in stale:  # an earlier run's (--overwrite): the files of a stem are one run's
                remove_tree(p)
            if analyze:
                metrics.update(analyze_written(paths, memory_gb=memory_gb, progress=progress, ranges=metrics,
                                               flow=flow))
            _finish(metrics, scan.geometry, str(scan_path), t0)
            metrics.update(annotate or {})
            write_json_atomic(paths["metrics"], metrics)  # last: its presence means the set is whole
    return {**paths, "result": metrics}
