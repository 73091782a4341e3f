"""``ctpore info``: what a scan file holds (shape, spacing, orientation, grey range). Registered on the
``ctpore`` group by :mod:`ctpore.app.cli`; thin like every command: parse, call a pipeline, print."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ctpore.app.console import EXIT_OK
from ctpore.app.console import SLICE_AXIS_HELP as _SLICE_AXIS_HELP
from ctpore.app.console import option as _option

__all__ = ["info"]


@click.command()
@click.argument("scan", type=click.Path(path_type=Path))
@_option("--slice-axis", type=click.IntRange(0, 2), default=None, show_default="2, the third axis",
         help=_SLICE_AXIS_HELP)
@_option("--json", "as_json", is_flag=True, show_default=True, help="Print JSON instead of a table.")
def info(scan, slice_axis, as_json):
    """Shape, spacing, orientation, dtype and intensity range of SCAN.

    When the file gives no length unit (units unknown), the spacing is its own numbers, not mm.
    """
    from ctpore.data.io import load_scan

    with load_scan(scan, slice_axis=slice_axis) as s:
        d = s.describe()
    d = json.loads(json.dumps(d, default=str))
    if as_json:
        click.echo(json.dumps(d, indent=2))
    else:  # each line says the order its values are in
        named = {k: f"{k} {_INFO_ORDER[k]}" if k in _INFO_ORDER else k for k in d}
        if d.get("units") == "unknown":  # the file's own numbers: not known to be mm
            named["spacing_mm"] = "spacing (z, y, x; units unknown, not mm)"
        width = max(len(n) for n in named.values())
        for k, v in d.items():
            click.echo(f"{named[k]:<{width}}  {v}")
    return EXIT_OK


#: How ``ctpore info`` says which order the values of a line are in.
_INFO_ORDER = {"shape": "(Z, Y, X: slices, rows, columns)", "file_shape": "(as the file stores it)",
               "spacing_mm": "(z, y, x)", "orientation": "(of the file's axes i, j, k)",
               "orientation_zyx": "(of Z, Y, X)"}
