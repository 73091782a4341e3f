"""``ctpore finetune``: a learned method taught your scanner and labeller from a few labelled slices.
Registered on the ``ctpore`` group by :mod:`ctpore.app.cli`; thin like every command: parse, call a
pipeline, print."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ctpore.app.console import EXIT_OK
from ctpore.app.console import Progress as _Progress
from ctpore.app.console import check_device as _check_device
from ctpore.app.console import option as _option

__all__ = ["finetune"]


@click.command()
@click.argument("scan", type=click.Path(path_type=Path))
@_option("--labels", "labels", multiple=True, required=True, type=click.Path(path_type=Path),
         help="The labels of each scan, in order (one --labels per scan): 0 not labelled, 1 pore, 2 solid.")
@_option("--scan", "more", multiple=True, type=click.Path(path_type=Path), show_default="none",
         help="Another labelled scan (repeat; its --labels follows in the same order).")
@_option("-o", "--out", required=True, type=click.Path(path_type=Path), help="The tuned weights (.safetensors).")
@_option("--method", default="poreformer", show_default=True, type=click.Choice(["poreformer", "unet3d", "unet2d"]),
         help="The learned method to tune.")
@_option("--weights", type=click.Path(path_type=Path), default=None, show_default="the shipped weights",
         help="The weights to start from.")
# the pipeline's STEPS (a test keeps them equal; the command does not import the pipeline to start)
@_option("--steps", default=600, show_default=True, type=click.IntRange(1), help="At most this many steps.")
@_option("--minutes", default=None, type=click.FloatRange(0.1), show_default="no limit",
         help="Stop after this many minutes of tuning.")
@_option("--seed", default=0, show_default=True, type=int, help="The same seed and labels give the same weights.")
@_option("--dense", is_flag=True, show_default=True,
         help="The labels are dense truths (1 pore, 0 solid, every voxel) rather than sparse labels.")
@_option("--calibrate-only", is_flag=True, show_default=True,
         help="Keep the network; refit only the post-processing (the z-neighbour refit, the pores' "
              "threshold and evidence rule, the calibration): seconds.")
@_option("--device", default="cpu", show_default=True, callback=_check_device, help="cpu, cuda, cuda:1, ...")
@_option("--overwrite", is_flag=True, show_default=True, help="Replace an existing OUT.")
@_option("--json", "as_json", is_flag=True, show_default=True, help="Print the report as JSON.")
def finetune(scan, labels, more, out, method, weights, steps, minutes, seed, dense, calibrate_only, device,
             overwrite, as_json):
    """Tune a learned method on a few labelled slices of SCAN (and more --scan): writes OUT, the weights
    to give reconstruct, batch or napari with --weights.

    Part of the labels is held back (one labelled slice in three, or a block of each slice) and the
    report gives MSE, Dice, 2D Euler error and the boundary's shift on it: before, with only the
    post-processing refitted (--calibrate-only stops there), and after tuning.
    """
    from ctpore.pipelines.finetune import finetune as run

    with _Progress("finetune") as bar:
        rep = run([scan, *more], list(labels), out, method=method, weights=weights, steps=steps, minutes=minutes,
                  seed=seed, dense=dense, calibrate_only=calibrate_only, device=device, overwrite=overwrite,
                  progress=bar)
    if as_json:
        click.echo(json.dumps(rep, indent=2, default=str))
        return EXIT_OK
    click.echo("held back: " + "; ".join(rep["split"]))
    click.echo(f"{'':<24}{'MSE':>9}{'Dice':>8}{'|χ2D err|':>11}{'boundary (vox)':>16}{'threshold':>11}")
    rows = [("before", "the weights as they were"), ("refit", "post-processing refitted"), ("after", "tuned")]
    for key, name in rows:
        if key in rep:
            r = rep[key]
            click.echo(f"{name:<24}{r['mse']:>9.4f}{r['dice']:>8.3f}{r['euler_2d_error']:>11d}"
                       f"{r['boundary_shift_vox']:>+16.2f}{r['threshold']:>11.2f}")
    t = rep["tuning"]
    click.echo(f"-> {rep['weights']}  ({t['steps']} steps, {t['stopped']}; {rep['seconds']:.0f} s)")
    return EXIT_OK
