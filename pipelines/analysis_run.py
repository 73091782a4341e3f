"""``ctpore analyze`` on files: which files, what is written, and the figures under their names.

Inputs: a 0/1 pore volume in any format ctpore reads; the sample mask given, else the
``<stem>_sample`` file beside the pores when there is one, else every voxel; the probability map
given, else ``<stem>_prob`` beside the pores when there is one (for the expected porosity).
Output names drop the ``_pores`` of the input's stem: ``scan_pores.nii.gz`` gives
``scan_analysis.json``, ``scan_thickness.nii.gz`` (``.ome.zarr`` when the pores are one),
``scan_psd.csv``, ``scan_psd.png`` and ``scan_drainage.csv`` (the drainage curve from the top face;
its header only where the sample has no top face). The volumes and the tables are written whole or
not at all, the JSON last.

Lengths are in mm where the pores' file gives its units, else per voxel, named as the metrics
name them: ``surface_area_mm2`` or ``surface_area_voxel2``, ``specific_surface_per_mm`` or
``_per_voxel``, ``mean_breadth_mm`` or ``_voxel``, ``thickness_d50_mm`` or ``_voxel``.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Optional, Union

from ctpore.data.analysis_keys import analysis_record
from ctpore.data.io import output_stem
from ctpore.errors import CtporeWarning, InputError
from ctpore.progress import ProgressFn

__all__ = ["analysis_paths", "beside", "analyze", "analyze_written"]

PathLike = Union[str, os.PathLike]


def _suffix(path: Path) -> str:
    from ctpore.data.io.registry import split_suffix

    return split_suffix(path.name)[1]


def _stem(pores: Path) -> str:
    stem = output_stem(pores)
    return stem[: -len("_pores")] if stem.endswith("_pores") and len(stem) > len("_pores") else stem


def beside(pores: PathLike, role: str) -> Optional[Path]:
    """``<stem>_<role>`` in the pores' folder with the pores' suffix, when it exists."""
    p = Path(pores)
    cand = p.parent / f"{_stem(p)}_{role}{_suffix(p)}"
    return cand if cand.exists() and cand != p else None


def analysis_paths(pores: PathLike, outdir: Optional[PathLike] = None) -> dict:
    """The output paths of :func:`analyze` for ``pores`` (module docstring)."""
    p = Path(pores)
    out = Path(outdir) if outdir is not None else p.parent
    stem = _stem(p)
    ext = ".ome.zarr" if _suffix(p).lower() == ".ome.zarr" else ".nii.gz"
    return {"analysis": out / f"{stem}_analysis.json", "thickness": out / f"{stem}_thickness{ext}",
            "psd_csv": out / f"{stem}_psd.csv", "psd_png": out / f"{stem}_psd.png",
            "drainage_csv": out / f"{stem}_drainage.csv"}


def analyze(pores: PathLike, sample: Optional[PathLike] = None, prob: Optional[PathLike] = None,
            outdir: Optional[PathLike] = None, memory_gb: Optional[float] = None, overwrite: bool = False,
            progress: ProgressFn = None, flow_cube: Optional[Union[int, str]] = None,
            ranges: Optional[dict] = None, flow_optional: bool = False) -> dict:
    """Analyse the pores in ``pores`` and write the outputs (module docstring); returns the record
    written to ``<stem>_analysis.json``, with ``outputs`` (what was written). ``flow_cube``: also the
    permeability and tortuosity on a cube of that many voxels a side inside the sample
    (:mod:`ctpore.pipelines.flow`; ``"auto"``: the default side, or the largest that fits
    ``memory_gb``; None: no flow); a side given that does not fit ``memory_gb`` is refused.
    ``ranges``: the reconstruction's figures over the levels of the probability
    (:func:`~ctpore.pipelines.ranges.threshold_ranges`), which need its raw map; without them those
    keys are null. ``flow_optional``: a sample with no cube inside it gives null flow figures and a
    warning instead of the refusal (after a reconstruction, whose work is not to be lost)."""
    from ctpore.atomic import write_json_atomic
    from ctpore.data.io import load_scan
    from ctpore.data.io.write import volume_writer
    from ctpore.pipelines.analysis import analyze_volume
    from ctpore.pipelines.analysis_outputs import write_drainage_csv, write_psd_csv, write_psd_png
    from ctpore.pipelines.claims import remove_orphan_temps

    src = Path(pores)
    paths = analysis_paths(src, outdir)
    if not overwrite:
        there = [str(v) for v in paths.values() if v.exists()]
        if there:
            raise InputError(f"exists already: {there[0]}; give another -o, or --overwrite")
    sample = Path(sample) if sample is not None else beside(src, "sample")
    prob = Path(prob) if prob is not None else beside(src, "prob")
    scan = load_scan(src)
    mask = load_scan(sample) if sample is not None else None
    pmap = load_scan(prob) if prob is not None else None
    paths["analysis"].parent.mkdir(parents=True, exist_ok=True)
    for p in paths.values():  # what a killed earlier analysis of these outputs left (not a live run's)
        remove_orphan_temps(p)
    geom = scan.geometry
    try:
        cube = None
        if flow_cube is not None:  # refused before any work: a cube too large (or beyond the memory
            # budget) or none inside the sample, voxels not cubes, no extra
            from ctpore.pipelines.flow import DEFAULT_CUBE, check_flow, choose_cube, flow_side

            asked = None if flow_cube == "auto" else int(flow_cube)
            check_flow(DEFAULT_CUBE if asked is None else asked, geom.spacing_mm,
                       getattr(geom, "units", "mm") != "unknown")
            side = flow_side(memory_gb, asked)
            try:
                cube = choose_cube(scan.shape, mask, side)
            except InputError as exc:
                if not flow_optional:
                    raise
                warnings.warn(f"{src}: no permeability or tortuosity: {exc}", CtporeWarning, stacklevel=2)
                cube = False
        with volume_writer(paths["thickness"], geom, "float32", owned=True) as writer:
            res = analyze_volume(scan, geom, sample=mask, prob=pmap, memory_gb=memory_gb, thickness_writer=writer,
                                 progress=progress)
        if cube:
            res.update(_flow(scan, cube, min(geom.spacing_mm) if res["units_known"] else None, progress))
        elif cube is False:  # asked for, and no cube fits: the keys say so
            res.update({"permeability_zyx": None, "permeability_darcy_zyx": None, "tortuosity_zyx": None,
                        "flow_cube_voxels": None, "flow_cube_start_zyx": None})
        if ranges is not None:
            from ctpore.pipelines.ranges import RANGE_FIGURES

            res.update({k: ranges.get(k) for k in RANGE_FIGURES + ("ranges_by_level",)})
        unit_name = "mm" if res["units_known"] else "voxel"
        write_psd_csv(res["psd_counts"], res["unit"] or 1.0, unit_name, paths["psd_csv"])
        write_psd_png(res["psd_counts"], res["unit"] or 1.0, unit_name, paths["psd_png"], res)
        write_drainage_csv(res["drainage"], unit_name, paths["drainage_csv"])
        record = analysis_record(res)
        record.update(source=str(src), sample=str(sample) if sample else None, prob=str(prob) if prob else None,
                      spacing_mm_zyx=list(geom.spacing_mm) if res["units_known"] else None,
                      thickness_map_unit=unit_name, faces_zyx=res["faces_zyx"], largest_radius=res["largest_radius"],
                      seconds=res["seconds"], memory_gb=memory_gb,
                      outputs={k: str(v) for k, v in paths.items()})
        write_json_atomic(paths["analysis"], record)  # last: its presence means the set is whole
    except BaseException:
        from ctpore.data.io.omezarr_write import remove_tree

        for p in paths.values():  # nothing half-done is left: the set is one analysis's, or none
            remove_tree(p)
        raise
    finally:
        for s in (scan, mask, pmap):
            if s is not None:
                s.close()
    return record


def _flow(scan, cube: tuple, voxel_mm: Optional[float], progress: ProgressFn) -> dict:
    """The flow's figures on ``cube`` (``((z0, y0, x0), side)``, from
    :func:`~ctpore.pipelines.flow.choose_cube`) of the pores in ``scan``."""
    import numpy as np

    from ctpore.pipelines.flow import flow_figures

    (z0, y0, x0), n = cube
    cube = np.stack([np.asarray(scan[z:z + 1])[0, y0:y0 + n, x0:x0 + n] != 0 for z in range(z0, z0 + n)])
    return {**flow_figures(cube, voxel_mm, progress), "flow_cube_voxels": n, "flow_cube_start_zyx": [z0, y0, x0]}


def analyze_written(paths: dict, memory_gb: Optional[float] = None, progress: ProgressFn = None,
                    ranges: Optional[dict] = None, flow: bool = False) -> dict:
    """:func:`analyze` of the pores a reconstruction just wrote (``paths``: its output paths), beside
    them; returns the figures to add to its metrics (those the metrics hold already left out) and
    ``analysis``, the record's path. ``ranges``: the reconstruction's metrics, which hold its ranges
    over the probability's levels. ``flow``: the flow too, on the cube that fits ``memory_gb``."""
    from ctpore.data.metrics import METRICS

    sample = paths["sample"] if Path(paths["sample"]).exists() else None
    rec = analyze(paths["pores"], sample=sample, prob=paths["prob"], outdir=Path(paths["pores"]).parent,
                  memory_gb=memory_gb, overwrite=True, progress=progress, ranges=ranges,
                  flow_cube="auto" if flow else None, flow_optional=True)
    own = {m.key for m in METRICS if m.group == "analysis"}
    return {**{k: v for k, v in rec.items() if k in own}, "analysis": rec["outputs"]["analysis"]}
