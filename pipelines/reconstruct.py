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
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from ctpore.atomic import write_json_atomic
from ctpore.data.calibration import apply_calibration
from ctpore.data.io import Geometry, Scan, geometry_from_array, load_scan, output_stem, read_label, save_volume
from ctpore.data.metrics import comparison_metrics, volume_metrics
from ctpore.data.normalize import NormalizedVolume, intensity_range
from ctpore.errors import InputError
from ctpore.models.classical import OTSU_MIN_SIZE, clean_specks, otsu_segment
from ctpore.progress import ProgressFn

METHODS = ("auto", "poreformer", "otsu", "plain-otsu")


def _defaults() -> dict:
    """Defaults of reconstruction, from ``configs/reconstruct.yaml``."""
    import yaml

    path = Path(__file__).resolve().parent.parent / "configs" / "reconstruct.yaml"
    return yaml.safe_load(path.read_text())


#: Defaults for the command and the API (``configs/reconstruct.yaml``).
DEFAULTS = _defaults()

#: Scans up to this many bytes (as float32) are read into memory once before PoreFormer runs;
#: larger ones are streamed from disk slice-chunk by chunk (once per in-plane tile and direction).
IN_MEMORY_BYTES = 2 * 2**30


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


def output_paths(scan_path: Union[str, os.PathLike], outdir: Union[str, os.PathLike]) -> dict:
    """The three output files of a scan: ``{"pores", "prob", "metrics"}`` -> Path."""
    stem = output_stem(scan_path)
    outdir = Path(outdir)
    return {
        "pores": outdir / f"{stem}_pores.nii.gz",
        "prob": outdir / f"{stem}_prob.nii.gz",
        "metrics": outdir / f"{stem}_metrics.json",
    }


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


class _ReversedZ:
    """A lazy view of a volume with its slices in reverse order (``view[a:b]`` reads lazily)."""

    def __init__(self, volume):
        self.volume = volume
        self.shape = tuple(int(s) for s in volume.shape)

    def __getitem__(self, key: slice) -> np.ndarray:
        start, stop, _ = key.indices(self.shape[0])
        z = self.shape[0]
        return np.ascontiguousarray(np.asarray(self.volume[z - stop : z - start])[::-1])


def _predict_poreformer(volume, weights, device, chunk_slices, tile, progress):
    import torch

    from ctpore.models.weights import (
        default_weights_path, load_model, read_metadata, read_postprocessing, sha256_file,
    )
    from ctpore.pipelines.stream import predict

    path = Path(weights) if weights is not None else default_weights_path()
    if path is None:
        raise InputError(
            "no PoreFormer weights are installed; give --weights FILE.safetensors or use --method otsu"
        )
    model = load_model(path, device=device)
    meta = read_metadata(path)
    post = read_postprocessing(path, meta)
    if isinstance(volume, Scan) and 4 * int(np.prod(volume.shape)) <= IN_MEMORY_BYTES:
        volume = volume.read()  # one sequential read instead of one pass per tile and direction
    lo, hi = intensity_range(volume)
    view = NormalizedVolume(volume, lo, hi)
    prob = predict(model, view, chunk_slices=chunk_slices, tile=tile, device=device, progress=progress)
    if post.bidirectional:
        # The causal model sees slices above each voxel; a second pass over the reversed stack
        # sees those below, and the two probabilities are averaged (the model stays causal).
        back = predict(model, _ReversedZ(view), chunk_slices=chunk_slices, tile=tile, device=device,
                       progress=progress)
        prob += back[::-1]
        prob *= 0.5
    info = {
        "model": {"name": meta.get("name", path.stem), "sha256": sha256_file(path)},
        "attention_backend": getattr(model, "attention_backend", None),
        "device": str(torch.device(device)),
        "threshold": post.threshold,
        "min_size": post.min_size,
        "bidirectional": post.bidirectional,
        "calibration": post.calibration,
    }
    return prob, info


def reconstruct(
    scan,
    method: str = DEFAULTS["method"],
    *,
    weights: Optional[Union[str, os.PathLike]] = None,
    device: str = DEFAULTS["device"],
    slice_axis: Optional[int] = None,
    spacing_mm: Optional[tuple] = None,
    truth=None,
    chunk_slices: int = DEFAULTS["chunk_slices"],
    tile: int = DEFAULTS["tile"],
    progress: ProgressFn = None,
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
    chunk_slices, tile : int
        Streaming: slices per chunk and the in-plane tile size (PoreFormer).
    progress : callable, optional
        ``progress(done, total, stage)``.

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
            prob, pf = _predict_poreformer(volume, weights, device, chunk_slices, tile, progress)
            info.update(pf)
            pores = (prob >= info["threshold"]).astype(np.uint8)  # on the raw probability
            if info["min_size"] > 1:
                pores = clean_specks(pores, info["min_size"])
            if info["calibration"] is not None:
                apply_calibration(prob, info["calibration"], out=prob)
        else:
            if concrete == "otsu":
                pores, _ = otsu_segment(volume, median_size=3, min_size=OTSU_MIN_SIZE,
                                        chunk_slices=chunk_slices, progress=progress)
            else:
                pores, _ = otsu_segment(volume, chunk_slices=chunk_slices, progress=progress)
            prob = pores.astype(np.float32)
    finally:
        if opened is not None:
            opened.close()

    metrics = volume_metrics(pores, geometry.spacing_mm)
    metrics.update(
        shape=[int(s) for s in pores.shape],
        spacing_mm=[float(s) for s in geometry.spacing_mm],
        method=concrete,
        model=info["model"],
        device=info["device"],
        attention_backend=info["attention_backend"],
    )
    if truth is not None:
        if isinstance(truth, (str, os.PathLike)):
            truth = read_label(truth, slice_axis=slice_axis, like=geometry)
        metrics.update(comparison_metrics(pores, np.asarray(truth), prob=prob))
    from ctpore import __version__

    metrics["seconds"] = round(time.perf_counter() - t0, 3)
    metrics["ctpore_version"] = __version__
    return Reconstruction(probability=prob, pores=pores, metrics=metrics, geometry=geometry)


def check_outputs(scan_path, outdir, overwrite: bool) -> dict:
    """Check, before any work, that the outputs of ``scan_path`` can be written to ``outdir``.

    Creates ``outdir`` if needed. Raises :class:`InputError` when the folder cannot be created or
    written, or when an output exists and ``overwrite`` is false.
    """
    outdir = Path(outdir)
    try:
        outdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the output folder ({exc.strerror or exc})", path=outdir) from None
    if not outdir.is_dir():
        raise InputError("the output path exists and is not a folder", path=outdir)
    try:
        with tempfile.NamedTemporaryFile(dir=outdir, prefix=".ctpore-write-test-"):
            pass
    except OSError as exc:
        raise InputError(f"the output folder is not writable ({exc.strerror or exc})", path=outdir) from None
    paths = output_paths(scan_path, outdir)
    if not overwrite:
        for p in paths.values():
            if p.exists():
                raise InputError("output exists; pass --overwrite to replace it", path=p)
    return paths


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
    chunk_slices: int = DEFAULTS["chunk_slices"],
    tile: int = DEFAULTS["tile"],
    progress: ProgressFn = None,
) -> dict:
    """Reconstruct one scan file and write its outputs (see the module docstring).

    Returns
    -------
    dict
        ``{"pores": Path, "prob": Path, "metrics": Path, "result": metrics dict}``.
    """
    paths = check_outputs(scan_path, outdir, overwrite)
    existed = {k: p.exists() for k, p in paths.items()}
    result = reconstruct(
        scan_path, method, weights=weights, device=device, slice_axis=slice_axis, truth=truth,
        chunk_slices=chunk_slices, tile=tile, progress=progress,
    )
    written = []
    try:
        save_volume(paths["pores"], result.pores, result.geometry, dtype=np.uint8)
        written.append("pores")
        save_volume(paths["prob"], result.probability, result.geometry, dtype=np.float32)
        written.append("prob")
        write_json_atomic(paths["metrics"], result.metrics)
    except BaseException:
        # The set is whole or absent: remove what this call created (never a file that was there).
        for k in written:
            if not existed[k] and paths[k].exists():
                paths[k].unlink()
        raise
    return {**paths, "result": result.metrics}
