"""``ctpore attention``: what the attention heads look at, for one voxel or over a whole scan.

Registered on the ``ctpore`` group by :mod:`ctpore.app.cli`; thin like every command: parse,
call :mod:`ctpore.pipelines.inspect` / :mod:`ctpore.pipelines.inspect_summary`, print.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from ctpore.app.console import SLICE_AXIS_HELP, Progress, option
from ctpore.errors import InputError

__all__ = ["attention"]


def _point(at: str) -> tuple[int, int, int]:
    try:
        point = tuple(int(v) for v in at.split(","))
    except ValueError:
        point = ()
    if len(point) != 3:
        raise InputError(f"--at must be three integers Z,Y,X, like 40,120,88; got {at!r}")
    return point  # type: ignore[return-value]


def _summary_command(scan, out, columns, pores, weights, slice_axis) -> str:
    """The command line that makes this summary again (written into its JSON)."""
    cmd = f"ctpore attention {scan} --summary"
    cmd += f" -o {out}" if out is not None else ""
    cmd += f" --columns {columns}" if columns != 1024 else ""
    cmd += f" --pores {pores}" if pores is not None else ""
    cmd += f" --weights {weights}" if weights is not None else ""
    return cmd + (f" --slice-axis {slice_axis}" if slice_axis is not None else "")


def _summary_lines(s: dict) -> list[str]:
    smp = s["sample"]
    lines = [f"{s['scan']}: {smp['voxels']} voxels sampled ({smp['pore_voxels']} pore, {smp['solid_voxels']} solid) "
             f"in {smp['columns']} pixel columns; pore or solid: {s['pore_source']}",
             "mean look-back in slices and entropy / its maximum, pore | solid voxels:"]
    for h in s["heads"]:
        b, e = h["lookback"]["mean"], h["normalized_entropy"]["mean"]
        win = "every earlier slice" if h["window"] is None else f"window {h['window']}"

        def two(m):
            return " | ".join("-" if m[k] is None else f"{m[k]:.2f}" for k in ("pore", "solid"))

        lines.append(f"  {h['label']} ({win}): look-back {two(b)}, entropy/max {two(e)}")
    return lines


@click.command()
@click.argument("scan", type=click.Path(path_type=Path))
@option("--at", "at", default=None, show_default="required without --summary",
        help="The voxel Z,Y,X whose column's attention to show.")
@option("-o", "--out", "out", default=None, type=click.Path(path_type=Path), show_default="no PNG",
        help="PNG: the heads x earlier slices heatmap (with --at) or the whole-scan summary (with --summary; "
             "its JSON is written beside it, same name with .json).")
@option("--json", "as_json", is_flag=True, show_default=True,
        help="Print JSON (with units): per head its weights, entropy (nats and a fraction of its maximum), "
             "mean look-back and top slice; with --summary, the summary.")
@option("--normalize-rows", is_flag=True, show_default=True,
        help="Scale each heatmap row to its own maximum (rows then NOT comparable; the picture says so). "
             "Without it every row shares one colour scale of absolute weights.")
@option("--summary", is_flag=True, show_default=True,
        help="What each head does over the whole scan: per head, the distribution of look-back and of "
             "normalized entropy over a sample of voxels, pore and solid apart.")
@option("--columns", default=1024, show_default=True, type=click.IntRange(1),
        help="With --summary: about how many pixel columns to sample (a regular grid from a seeded offset).")
@option("--pores", type=click.Path(path_type=Path), default=None,
        show_default="the model's own prediction (probability >= its threshold)",
        help="With --summary: the scan's pores (reconstruct's <stem>_pores.nii.gz, 1 = pore) to split by.")
@option("--weights", type=click.Path(path_type=Path), default=None, show_default="the shipped weights",
        help="PoreFormer weights (.safetensors).")
@option("--slice-axis", type=click.IntRange(0, 2), default=None, show_default="2, the third axis", help=SLICE_AXIS_HELP)
def attention(scan, at, out, as_json, normalize_rows, summary, columns, pores, weights, slice_axis):
    """Which earlier slices each attention head looks at: for the voxel Z,Y,X of SCAN (--at), or
    over the whole scan (--summary).

    Heads are named by the scale their block works at ("1/8 scale, head 0", "full resolution,
    head 2"), each with its look-back window; entropy is in nats and as a fraction of its maximum,
    ln of the number of slices the head can see there.
    """
    if out is not None and Path(out).suffix.lower() == ".json":
        raise InputError(f"-o is the PNG picture, got {out}; with --summary its JSON is written beside it")
    if summary:
        if at is not None or normalize_rows:
            raise InputError("--summary covers the whole scan: give it without --at and --normalize-rows")
        return _summary(scan, out, as_json, columns, pores, weights, slice_axis)
    if pores is not None:
        raise InputError("--pores goes with --summary")
    if at is None:
        raise InputError("give --at Z,Y,X (a voxel) or --summary (the whole scan)")
    from ctpore.pipelines.inspect import attention_at
    from ctpore.pipelines.inspect_plot import write_heatmap_png

    view = attention_at(scan, _point(at), weights=weights, slice_axis=slice_axis)
    if out is not None:
        write_heatmap_png(view, out, normalize_rows=normalize_rows)
    if as_json:
        click.echo(json.dumps(view.to_dict(), indent=2))
    else:
        for line in view.lines():
            click.echo(line)
        if out is not None:
            click.echo(f"wrote {out}")
    return 0


def _summary(scan, out, as_json, columns, pores, weights, slice_axis):
    from ctpore.atomic import write_json_atomic
    from ctpore.pipelines.inspect_plot import write_summary_png
    from ctpore.pipelines.inspect_summary import head_summary

    with Progress("attention") as bar:
        s = head_summary(scan, weights=weights, columns=columns, pores=pores, slice_axis=slice_axis, progress=bar)
    s = {"command": _summary_command(scan, out, columns, pores, weights, slice_axis), **s}
    if out is not None:
        write_summary_png(s, out)
        write_json_atomic(Path(out).with_suffix(".json"), s)
    if as_json:
        click.echo(json.dumps(s, indent=2))
    else:
        for line in _summary_lines(s):
            click.echo(line)
        if out is not None:
            click.echo(f"wrote {out} and {Path(out).with_suffix('.json')}")
    return 0
