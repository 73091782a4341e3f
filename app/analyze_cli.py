"""``ctpore analyze``: pore sizes, surface, curvature, connected and percolating porosity of a pore
volume, streamed. Registered on the ``ctpore`` group by :mod:`ctpore.app.cli`; thin like every
command: parse, call a pipeline, print."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ctpore.app.console import EXIT_OK
from ctpore.app.console import Progress as _Progress
from ctpore.app.console import option as _option

__all__ = ["analyze"]


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, list):
        return " ".join(_fmt(x) for x in v)
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


@click.command()
@click.argument("pores", type=click.Path(path_type=Path))
@_option("--sample", type=click.Path(path_type=Path), default=None,
         show_default="<stem>_sample beside PORES, else every voxel", help="The sample mask (0/1).")
@_option("--prob", type=click.Path(path_type=Path), default=None,
         show_default="<stem>_prob beside PORES, else none",
         help="The calibrated pore probability (reconstruct's <stem>_prob), for the expected porosity.")
@_option("-o", "--out", "outdir", type=click.Path(path_type=Path), default=None, show_default="PORES' folder",
         help="Folder of the outputs.")
@_option("--memory-gb", type=click.FloatRange(0.5), default=None, show_default="slabs of about 8 M voxels",
         help="Host memory for the whole analysis, in GB.")
@_option("--flow", is_flag=True, show_default=True,
         help="Also the permeability (PoreSpy's snow2 network, OpenPNM's Stokes flow) and the tortuosity along "
              "each axis, on a cube inside the sample (needs the analysis extra).")
@_option("--flow-cube", type=int, default=None, show_default="200, or the largest that fits --memory-gb",
         help="The side of that cube in voxels (16 to 400), centred on the sample.")
@_option("--overwrite", is_flag=True, show_default=True, help="Replace outputs of an earlier analysis.")
@_option("--json", "as_json", is_flag=True, show_default=True, help="Print the record as JSON.")
def analyze(pores, sample, prob, outdir, memory_gb, flow, flow_cube, overwrite, as_json):
    """Measure the pores in PORES (0/1, any format ctpore reads) within the sample: porosity,
    surface area and specific surface, mean breadth, the Euler number, the local-thickness pore-size
    distribution (d10, d50, d90, mean), the drainage curve from the top face (as mercury intrusion),
    connected, isolated and percolating porosity; with --flow, the permeability (m2 and darcy) and
    the tortuosity along each axis of a cube inside the sample.

    Writes <stem>_analysis.json, <stem>_thickness.nii.gz (the thickness map), <stem>_psd.csv,
    <stem>_psd.png and <stem>_drainage.csv, where <stem> is PORES' name without its _pores. Every
    figure is exact and streamed: memory follows the slab, not the scan.
    """
    from ctpore.pipelines.analysis_run import analyze as run

    with _Progress("analyze") as bar:
        rec = run(pores, sample=sample, prob=prob, outdir=outdir, memory_gb=memory_gb, overwrite=overwrite,
                  progress=bar, flow_cube=(flow_cube if flow_cube is not None else "auto") if flow else None)
    if as_json:
        click.echo(json.dumps(rec, indent=2))
        return EXIT_OK
    skip = {"source", "sample", "prob", "outputs", "faces_zyx", "memory_gb", "thickness_map_unit", "ranges_by_level"}
    width = max(len(k) for k in rec if k not in skip)
    for k, v in rec.items():
        if k not in skip:
            raw = k == "porosity_range" and v is None
            why = "  (they need the raw map: ctpore reconstruct --analyze)" if raw else ""
            click.echo(f"{k:<{width}}  {_fmt(v)}{why}")
    click.echo(f"-> {rec['outputs']['analysis']}")
    return EXIT_OK
