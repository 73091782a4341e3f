"""``ctpore evaluate``: a pore volume compared with a ground truth. Registered on the ``ctpore`` group
by :mod:`ctpore.app.cli`; thin like every command: parse, call a pipeline, print."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ctpore.app.console import EXIT_OK
from ctpore.app.console import SLICE_AXIS_HELP as _SLICE_AXIS_HELP
from ctpore.app.console import option as _option
from ctpore.app.console import warn as _warn

__all__ = ["evaluate"]


@click.command()
@click.argument("pred", type=click.Path(path_type=Path))
@click.argument("truth", type=click.Path(path_type=Path))
@_option("--prob", type=click.Path(path_type=Path), default=None, show_default="none: MSE of PRED's 0/1 pores",
         help="Pore probability map in [0, 1] (reconstruct's <stem>_prob.nii.gz): the MSE is computed from it.")
@_option("--slice-axis", type=click.IntRange(0, 2), default=None, show_default="2, the third axis",
         help=_SLICE_AXIS_HELP + " The same for all the files.")
@_option("--json", "as_json", is_flag=True, show_default=True, help="Print JSON instead of a table.")
def evaluate(pred, truth, prob, slice_axis, as_json):
    """Compare a pore volume PRED with a ground truth TRUTH (both 0/1).

    The MSE is of the probability map given with --prob; without it, of PRED's 0/1 pores, which
    is the fraction of voxels that differ (1 - accuracy). The output says which (mse_of).
    """
    from ctpore.data.metrics import MSE_OF_BINARY
    from ctpore.pipelines.evaluate import evaluate_files

    m = evaluate_files(pred, truth, prob_path=prob, slice_axis=slice_axis)
    if m.get("mse_of") == MSE_OF_BINARY:
        _warn(f"mse is of the 0/1 pores of {pred} (no --prob), so it equals 1 - voxel accuracy; "
              "give --prob with the probability map (reconstruct's <stem>_prob.nii.gz) for the probability MSE")
    if as_json:
        click.echo(json.dumps(m, indent=2))
    else:
        width = max(len(k) for k in m)
        for k, v in m.items():
            click.echo(f"{k:<{width}}  {v:.6g}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    return EXIT_OK
