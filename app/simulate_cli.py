"""``ctpore simulate``: simulated CT scans of porous media with their true pores. Registered on the
``ctpore`` group by :mod:`ctpore.app.cli`; thin like every command: parse, call a pipeline, print."""

from __future__ import annotations

from pathlib import Path

import click

from ctpore.app.console import EXIT_OK
from ctpore.app.console import Progress as _Progress
from ctpore.app.console import option as _option

__all__ = ["simulate"]


@click.command()
@_option("-o", "--outdir", required=True, type=click.Path(path_type=Path),
         help="Output folder for scan_NNNN.nii.gz, label_NNNN.nii.gz and manifest.json (created if missing).")
@_option("--n", "n", default=4, show_default=True, type=click.IntRange(1), help="Number of scan/label pairs.")
@_option("--size", default=64, show_default=True, type=click.IntRange(8), help="Edge of the cubic volume (voxels).")
@_option("--seed", default=0, show_default=True, type=int,
         help="Seed of the set: the same seed, N and size give the same files.")
@_option("--zoom-max", default=1.0, show_default=True, type=click.FloatRange(1.0),
         help="Enlarge the features of half the scans by a factor up to this (as at a finer voxel size).")
@_option("--scene", default=None, show_default="the material fills the volume",
         type=click.Choice(["random", "core-air", "core-air-offcentre", "tube-gap", "tube-grey", "fov-circle",
                            "brine-tube", "core-wider-than-fov", "block-turned", "core-anisotropic", "tube-touching"]),
         help="What the scanner sees around the material: a core in air, in a tube, in a circular field of view, a "
              "block... (random: any of them); the true sample is written too (sample_NNNN.nii.gz, 1 = sample).")
def simulate(outdir, n, size, seed, zoom_max, scene):
    """Write N simulated CT scans of porous media with their true pores (scan_*.nii.gz, label_*.nii.gz)."""
    from ctpore.data.synthetic import write_pairs

    with _Progress("simulate") as bar:
        entries = write_pairs(outdir, n, shape=(size, size, size), seed=seed, progress=bar, zoom_max=zoom_max,
                              scene=scene)
    for e in entries:
        zoom = f"  features ×{e['zoom']:.2f}" if e["zoom"] != 1.0 else ""
        click.echo(f"{Path(outdir) / e['scan']}  {e['family']}  porosity {e['porosity_truth']:.3f}{zoom}")
    return EXIT_OK
