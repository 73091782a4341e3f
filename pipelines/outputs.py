"""Where a reconstruction's outputs go, and what every metrics file says about the run.

The outputs of a scan are ``<stem>_pores.nii.gz``, ``<stem>_prob.nii.gz`` and
``<stem>_metrics.json`` (written last); with the ``ome-zarr`` output format the volumes are
``<stem>_pores.ome.zarr`` and ``<stem>_prob.ome.zarr`` stores instead (:data:`OUTPUT_FORMATS`).
They are checked before any work and the folder is made only when there is something to write,
so a failed run leaves nothing behind. Who may write them (one run per stem, its lock) is
:mod:`ctpore.pipelines.claims`.
"""

from __future__ import annotations

import math
import os
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Union

from ctpore.data.io import output_stem
from ctpore.data.io.omezarr_write import remove_tree
from ctpore.errors import CtporeWarning, InputError
from ctpore.pipelines.output_formats import DEFAULT_OUTPUT_FORMAT, OUTPUT_FORMATS

__all__ = ["OUTPUT_FORMATS", "output_paths", "other_format_outputs", "check_outputs", "make_outdir", "output_set",
           "run_fields", "finish_metrics"]


def output_paths(scan_path: Union[str, os.PathLike], outdir: Union[str, os.PathLike],
                 output_format: str = DEFAULT_OUTPUT_FORMAT) -> dict:
    """The output files of a scan: ``{"pores", "prob", "sample", "sample_png", "metrics"}`` -> Path (the
    sample mask and its picture only when the scan has an outside; the metrics file last, always)."""
    if output_format not in OUTPUT_FORMATS:
        raise InputError(f"output format must be one of {', '.join(OUTPUT_FORMATS)}, got {output_format!r}")
    stem = output_stem(scan_path)
    outdir = Path(outdir)
    ext = OUTPUT_FORMATS[output_format].suffix
    return {
        "pores": outdir / f"{stem}_pores{ext}",
        "prob": outdir / f"{stem}_prob{ext}",
        "sample": outdir / f"{stem}_sample{ext}",
        "sample_png": outdir / f"{stem}_sample.png",
        "metrics": outdir / f"{stem}_metrics.json",
    }


def other_format_outputs(paths: dict) -> list[Path]:
    """The volume outputs of the same stem in the other output formats (an earlier run's)."""
    out = []
    for key in ("pores", "prob", "sample"):
        p = Path(paths[key])
        suffixes = [f.suffix for f in OUTPUT_FORMATS.values()]
        for ext in suffixes:
            if p.name.endswith(ext):
                base = p.name[: -len(ext)]
                out += [p.with_name(base + other) for other in suffixes if other != ext]
    return out


def check_outputs(scan_path, outdir, overwrite: bool, output_format: str = DEFAULT_OUTPUT_FORMAT) -> dict:
    """Check, before any work, that the outputs of ``scan_path`` can be written to ``outdir``.

    Nothing is created here: a missing ``outdir`` is made only when there is something to write
    (:func:`make_outdir`), so a run that fails leaves no empty folder behind. Raises
    :class:`InputError` when the folder (or the nearest folder that exists above it) is not a
    writable folder, or when an output exists and ``overwrite`` is false.
    """
    outdir = Path(outdir)
    existing = outdir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "the output path" if existing == outdir else f"{existing} (above it)"
        raise InputError(f"{what} exists and is not a folder", path=outdir)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"cannot write in {existing}: permission denied", path=outdir)
    paths = output_paths(scan_path, outdir, output_format)
    if not overwrite:
        for p in list(paths.values()) + other_format_outputs(paths):
            if p.exists():
                raise InputError("output exists; pass --overwrite to replace it", path=p)
    return paths


def make_outdir(outdir) -> list[Path]:
    """Create ``outdir`` (and missing parents); return the folders this created, deepest last."""
    outdir = Path(outdir)
    missing = []
    p = outdir
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    try:
        outdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the output folder ({exc.strerror or exc})", path=outdir) from None
    return missing[::-1]


def run_fields(shape, geometry, method: str, info: dict) -> dict:
    """The metrics keys that describe the run rather than the pores (see the metrics contract)."""
    return {
        "shape_zyx": [int(s) for s in shape],
        "spacing_mm_zyx": [float(s) for s in geometry.spacing_mm],
        "method": method,
        "model": info["model"],
        "device": info["device"],
        "attention_backend": info["attention_backend"],
        "precision": info.get("precision"),
    }


def finish_metrics(metrics: dict, geometry, source: str = "the scan") -> dict:
    """Say in ``metrics`` (in place) what unit its figures are in, and warn where they need a word.

    ``spacing_unit`` is the length unit the file's header gave (``mm``, ``micron``, ``meter``) or
    ``unknown``. With unknown units a length per voxel is not known, so the figures are per voxel:
    ``spacing_mm_zyx`` is None, the connectivity density goes to ``connectivity_density_per_voxel3``
    (``connectivity_density_per_mm3`` is None) and a warning says so. A negative connectivity
    density (more isolated pores and cavities than loops: the Euler number is positive) is
    reported as computed, with a warning that says what it means.

    Examples
    --------
    >>> from ctpore.data.io.geometry import geometry_from_array
    >>> m = {"connectivity_density_per_mm3": 2.0, "spacing_mm_zyx": [0.5, 0.5, 0.5]}
    >>> finish_metrics(m, geometry_from_array((2, 2, 2), (0.5, 0.5, 0.5)))["spacing_unit"]
    'mm'
    """
    unit = getattr(geometry, "units", "mm") or "unknown"
    metrics["spacing_unit"] = unit
    cd = metrics.get("connectivity_density_per_mm3")
    if unit == "unknown":
        if cd is not None:  # per mm^3 with the header's numbers taken as mm -> per voxel^3
            metrics["connectivity_density_per_voxel3"] = float(cd) * math.prod(geometry.spacing_mm)
        metrics["connectivity_density_per_mm3"] = None
        metrics["spacing_mm_zyx"] = None
        warnings.warn(f"{source}: the file gives no length unit for its voxels, so the figures are per voxel "
                      "(connectivity_density_per_voxel3; spacing_mm_zyx is null); set the units in the file for "
                      "figures per mm^3 (NIfTI: xyzt_units; TIFF: ImageJ unit, or ResolutionUnit cm or inch with "
                      "XResolution/YResolution; HDF5: the dataset's element_size_um attribute, z y x in µm)",
                      CtporeWarning, stacklevel=2)
    cd = metrics.get("connectivity_density_per_mm3")
    if cd is None:
        cd = metrics.get("connectivity_density_per_voxel3")
    if cd is not None and cd < 0:
        warnings.warn(f"{source}: the connectivity density is negative ({cd:.4g}): the pore space has more "
                      f"isolated pores and enclosed cavities than loops (Euler number {metrics.get('euler_number')}, "
                      f"{metrics.get('n_pores')} pores), so it measures no connectivity here; read the Euler "
                      "number and n_pores instead", CtporeWarning, stacklevel=2)
    return metrics


@contextmanager
def output_set(paths: dict) -> Iterator[None]:
    """Write a scan's outputs as one set: whole, or nothing new left behind.

    Makes the output folder; if anything inside the block fails (or is interrupted), removes the
    outputs that did not exist before it and the folders it made.
    """
    existed = {k: Path(p).exists() for k, p in paths.items()}
    created = make_outdir(Path(paths["metrics"]).parent)
    try:
        yield
    except BaseException:
        for k, p in paths.items():
            if not existed[k] and Path(p).exists():
                remove_tree(p)
        for folder in reversed(created):  # and the folders it made, if they stayed empty
            try:
                folder.rmdir()
            except OSError:
                pass
        raise
