"""The steps of one reconstruction (:func:`run_reconstruction`), which every entry runs: the sample,
the grey range, the predictor, the post-processing slab by slab into a sink, and the metrics.
The entries (the Python API, ``ctpore reconstruct``, batch, napari) are
:mod:`ctpore.pipelines.reconstruct`.
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from ctpore.data.io import Geometry, Scan
from ctpore.data.metrics import MSE_OF_BINARY, MSE_OF_PROBABILITY, MetricsAccumulator
from ctpore.data.normalize import NormalizedVolume, has_contrast, robust_range, warn_no_contrast
from ctpore.data.rim import RIM, RimCheck, cleared
from ctpore.errors import CtporeWarning
from ctpore.pipelines.budget import plan_run
from ctpore.pipelines.outputs import run_fields
from ctpore.pipelines.sample_mask import prepare_sample
from ctpore.pipelines.sample_picture import write_sample_picture
from ctpore.pipelines.sinks import TruthSlabs
from ctpore.pipelines.spill import windowed
from ctpore.progress import ProgressFn

__all__ = ["run_metrics", "run_reconstruction"]

PathLike = Union[str, os.PathLike]


def run_reconstruction(
    volume: Any,
    geometry: Geometry,
    predictor: Any,
    sink: Any,
    *,
    folder: Optional[PathLike] = None,
    truth: Any = None,
    slice_axis: Optional[int] = None,
    memory_gb: Optional[float] = None,
    chunk_slices: Optional[int] = None,
    tile: Optional[int] = None,
    precision: str = "auto",
    min_pore_voxels: Optional[int] = None,
    gpu_memory_gb: Optional[float] = None,
    sample: Any = "auto",
    source: str = "the scan",
    progress: ProgressFn = None,
    sample_margin: int = 0,
    ranges: bool = False,
) -> dict:
    """The pipeline every entry runs (see the module docstring); returns the metrics.

    Parameters
    ----------
    volume : Scan or ndarray
        The scan, ``(Z, Y, X)``.
    geometry : Geometry
    predictor : Predictor
        From :func:`build_predictor`.
    sink : object
        Where the outputs go (the arrays of :func:`reconstruct`, the files of :func:`reconstruct_file`).
    folder : path, optional
        Where temporary volumes wait (the output folder; None: the system's temporary folder).
    truth : path or ndarray, optional
        Ground-truth pores: adds the comparisons to the metrics.
    memory_gb : float, optional
        Budget of the run's working memory (the arrays an in-memory run returns come on top);
        None: the predictor's own working memory within 1 GB and slabs of about 8 M voxels.
    min_pore_voxels : int, optional
        A size rule of the user's on top of the method's post-processing.
    gpu_memory_gb : float, optional
        On CUDA, the most GPU memory (GB) the tiles and chunks may take (default: the GPU's free
        memory less a margin); ``memory_gb`` then bounds the host.
    sample : {"auto", "all"}, path or ndarray
        Which voxels are the sample (:func:`~ctpore.pipelines.sample_mask.prepare_sample`): every
        figure is of the sample only, and no pore lies outside it.
    source : str
        How warnings name the scan.
    sample_margin : int
        Erode the sample by this many voxels within each slice (a damaged rim).
    ranges : bool
        Also the porosity, Euler number and percolating porosity with the pores re-derived at five
        levels of the calibrated probability, and their ranges (:mod:`ctpore.pipelines.ranges`).
    """
    shape = tuple(int(s) for s in geometry.shape)
    run_plan = plan_run(shape, predictor, memory_gb, gpu_memory_gb, tile=tile, chunk_slices=chunk_slices,
                        precision=precision)
    slab, model_budget, tile, chunk_slices = (run_plan.slab, run_plan.model_bytes, run_plan.tile,
                                              run_plan.chunk_slices)
    post = predictor.post.with_user_rules(min_pore_voxels)
    info = dict(predictor.info)
    folder = Path(folder) if folder is not None else Path(tempfile.gettempdir())
    truth_reader = TruthSlabs(truth, geometry, slice_axis) if truth is not None else None
    acc = MetricsAccumulator(shape, geometry.spacing_mm, truth=truth_reader is not None)
    clipped = 0
    smask = None
    stages: dict = {}
    picture: dict = {}
    rim = RimCheck()
    clock = [time.perf_counter()]

    def lap(name: str) -> None:
        now = time.perf_counter()
        stages[name] = round(stages.get(name, 0.0) + now - clock[0], 3)
        clock[0] = now

    try:
        smask = prepare_sample(volume, geometry, sample, folder, source, progress, margin=sample_margin,
                               copy_filled=True)  # (the methods read the scan with its outside filled)
        outside = smask.outside
        lap("sample")
        lo, hi = robust_range(volume, outside=outside)
        lap("intensity_range")
        with sink.raw(folder) as raw:
            if has_contrast(lo, hi):
                halo = predictor.halo
                tiled = isinstance(volume, Scan) and halo is not None and tile is not None and outside is None
                reading = (windowed(volume, folder, shape, tile, halo, progress) if tiled
                           else smask.filled(volume, folder, progress))
                with reading as src:
                    lap("sample" if outside is not None and not tiled else "reading")  # the outside filled
                    view = NormalizedVolume(src, lo, hi)
                    info.update(predictor.predict(view, raw, budget_bytes=model_budget, progress=progress,
                                                  chunk_slices=chunk_slices, tile=tile, precision=precision))
                    clipped = view.clipped_voxels(progress)  # counted (and said) only when values were clipped
            else:  # nothing to see: no pores, said in a warning
                warn_no_contrast(lo)
                for a in range(0, shape[0], slab):
                    b = min(shape[0], a + slab)
                    raw[a:b, 0:shape[1], 0:shape[2]] = np.zeros((b - a, *shape[1:]), np.float32)

            def read(a: int, b: int) -> np.ndarray:
                if outside is None:
                    return sink.read(raw, a, b)
                # outside the sample: certainly not pore; nor the surface's rim (read with a halo)
                return cleared(lambda z0, z1: sink.read(raw, z0, z1), lambda z0, z1: smask.codes[z0:z1], a, b, shape[0])

            middle = shape[0] // 2  # the sample picture's slice

            def on_slab(a: int, b: int, pores: np.ndarray, prob: np.ndarray) -> None:
                inside = smask.inside(a, b)
                if inside is not None and a <= middle < b:
                    picture["inside"] = inside[middle - a].copy()
                if inside is not None and smask.fit is not None:  # every 8th slice of a found sample
                    for z in range(a + (-a) % 8, b, 8):
                        rim.add(pores[z - a], np.asarray(smask.codes[z:z + 1])[0])
                sink.write(a, b, pores, prob, inside)
                acc.add(pores, prob, truth_reader.slab(a, b) if truth_reader is not None else None, inside)

            lap("predict")
            with sink.open(with_sample=outside is not None):
                post.run(read, shape, slab, on_slab, progress)
            if "inside" in picture and getattr(sink, "paths", None) is not None:
                grey = np.asarray(volume[middle: middle + 1], np.float32)[0]
                write_sample_picture(sink.paths["sample_png"], grey, picture["inside"], lo, hi)
            lap("postprocess_and_write")
            if ranges:  # while the raw map is still there
                from ctpore.pipelines.ranges import threshold_ranges

                codes = None if outside is None else (lambda a, b: np.asarray(smask.codes[a:b]))
                spread = threshold_ranges(lambda a, b: sink.read(raw, a, b), codes, shape, post, slab, progress)
                lap("ranges")
    finally:
        if truth_reader is not None:
            truth_reader.close()
        if smask is not None:
            smask.close()
    metrics = run_metrics(acc, geometry, predictor.name, info, clipped=clipped, post=post, sample=smask.info,
                          fit=smask.fit, rim=rim, source=source, truth=truth_reader is not None)
    if ranges:
        metrics.update(spread)
    metrics["stage_seconds"] = stages
    return metrics


def run_metrics(acc: MetricsAccumulator, geometry: Geometry, method: str, info: dict, *, clipped: int, post: Any,
                sample: dict, fit: Any, rim: RimCheck, source: str, truth: bool) -> dict:
    """The metrics of a run from its accumulator, fed every slab: the figures, what ran
    (:func:`~ctpore.pipelines.outputs.run_fields`), the post-processing, the sample (``sample``, its
    info; ``fit``, what was found; the rim check, with a warning when the found sample's outer voxels
    differ from its inside) and the porosity were the left-out region pore."""
    metrics = acc.result()
    metrics.update(run_fields(acc.shape, geometry, method, info))
    metrics["clipped_voxels"] = clipped
    if truth:
        # the thresholding methods have no probability: their MSE is of the 0/1 pores (1 - accuracy)
        metrics["mse_of"] = MSE_OF_BINARY if post.binary else MSE_OF_PROBABILITY
    metrics["postprocessing"] = post.describe()
    metrics["sample"] = sample
    if fit is not None and fit.has_outside:
        check = rim.result()
        metrics["sample"]["rim_check"] = check
        if check["differs"]:
            metrics["sample"]["confident"] = False
            rim_p = "" if check["rim_porosity"] is None else f"{check['rim_porosity']:.3f} in its outer {RIM} voxels, "
            warnings.warn(f"{source}: the found sample's outer voxels differ from its inside (porosity {rim_p}"
                          f"{check['shell_porosity']:.3f} a few voxels under its surface, "
                          f"{check['inside_porosity']:.3f} inside): a container wall or an air gap may be counted "
                          "as sample; check "
                          "<stem>_sample.png, drop a rim with --sample-margin N, or give your own mask (--sample MASK)",
                          CtporeWarning, stacklevel=3)
    metrics["porosity_if_region_is_pore"] = _if_region_is_pore(metrics, acc, sample, fit, source)
    return metrics


def _if_region_is_pore(metrics: dict, acc: MetricsAccumulator, sample: dict, fit, source: str) -> float:
    """The porosity as it would be if the region the found sample left out (neither a field of
    view's constant outside nor a container's wall) were pore: (pore voxels + region) / (sample
    voxels + region), with no second pass of the model. When the shape behind it did not fit with
    confidence, a warning gives it beside the share of the scan at stake."""
    region = int(sample.get("region_voxels", 0))
    n = acc.n_sample
    pores = float(metrics["porosity"]) * n
    alt = (pores + region) / (n + region) if n + region else 0.0
    if region and fit is not None and not fit.confident:  # (the rim check warns on its own)
        total = int(np.prod(acc.shape))
        warnings.warn(f"{source}: the sample's outside is uncertain ({sample['found']}): "
                      f"{100.0 * region / max(total, 1):.1f}% of the scan, a dark region joined to the border, "
                      f"was left out; the porosity is {metrics['porosity']:.4f}, and would be {alt:.4f} if that "
                      "region were pore; check the sample mask (<stem>_sample.nii.gz, .png) or give your own "
                      "(--sample MASK)", CtporeWarning, stacklevel=4)
    return float(alt)
