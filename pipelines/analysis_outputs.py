"""The pore-size distribution as a table (``<stem>_psd.csv``) and a plot (``<stem>_psd.png``), and the
drainage curve as a table (``<stem>_drainage.csv``) and a curve on the same plot.

The distribution is volume-weighted: for each local-thickness diameter, the share of the pore
volume at that thickness, and the cumulative share at or below it. The drainage curve gives, for
each diameter from the largest down, the share of the pore volume a non-wetting fluid entering at
the sample's top face has invaded once it passes that diameter (:mod:`ctpore.data.drainage`). The
plot is drawn with Pillow (as ctpore's other pictures): bars of the share per diameter, the
cumulative curve over them, the drainage curve, and d10, d50 and d90 marked, every axis labelled
with its unit.
"""

from __future__ import annotations

import csv
import io
import os
from typing import Union

import numpy as np

__all__ = ["psd_rows", "write_psd_csv", "write_psd_png", "psd_image", "write_drainage_csv"]

PathLike = Union[str, os.PathLike]


def psd_rows(counts, unit: float) -> list[tuple[float, int, float, float]]:
    """``(diameter, voxels, share, cumulative share)`` per radius with pores (radius 0 left out)."""
    c = np.asarray(counts, np.int64).copy()
    if len(c):
        c[0] = 0
    total = int(c.sum())
    rows, cum = [], 0
    for r in range(1, len(c)):
        cum += int(c[r])
        if c[r] or (total and 0 < cum < total):
            rows.append((2.0 * r * unit, int(c[r]), c[r] / total if total else 0.0, cum / total if total else 0.0))
    return rows


def write_psd_csv(counts, unit: float, unit_name: str, path: PathLike) -> None:
    """The table, whole or not at all."""
    from ctpore.atomic import atomic_write

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([f"diameter_{unit_name}", "voxels", "pore_volume_fraction", "cumulative_fraction"])
    for d, n, share, cum in psd_rows(counts, unit):
        w.writerow([f"{d:.6g}", n, f"{share:.6g}", f"{cum:.6g}"])
    with atomic_write(path) as tmp:
        tmp.write_text(buf.getvalue())


def write_drainage_csv(drainage, unit_name: str, path: PathLike) -> None:
    """The drainage curve (``drainage``: :func:`~ctpore.data.drainage.drainage_curve`'s, or None where the
    sample has no top face: a header only), whole or not at all."""
    from ctpore.atomic import atomic_write

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([f"diameter_{unit_name}", "invaded_pore_fraction"])
    for d, v in zip(*((drainage["diameter"], drainage["invaded"]) if drainage else ((), ()))):
        w.writerow([f"{d:.6g}", f"{v:.6g}"])
    with atomic_write(path) as tmp:
        tmp.write_text(buf.getvalue())


def write_psd_png(counts, unit: float, unit_name: str, path: PathLike, figures: dict) -> None:
    """The plot (:func:`psd_image`), whole or not at all."""
    from ctpore.atomic import atomic_write

    img = psd_image(counts, unit, unit_name, figures)
    with atomic_write(path) as tmp:
        img.save(tmp, format="PNG")


def psd_image(counts, unit: float, unit_name: str, figures: dict):
    """The plot of the module docstring as a PIL image (``figures``: the ``thickness_d10``... to mark)."""
    from PIL import Image, ImageDraw

    from ctpore.pipelines.inspect_plot import plot_font

    rows = psd_rows(counts, unit)
    W, H, left, right, top, bottom = 640, 410, 70, 60, 50, 60
    img = Image.new("RGB", (W, H), "white")
    dr = ImageDraw.Draw(img)
    font = plot_font(13)
    pw, ph = W - left - right, H - top - bottom
    dr.rectangle([left, top, left + pw, top + ph], outline=(90, 90, 90))
    dr.text((left, 6), "Pore-size distribution (local thickness, volume-weighted)", fill="black", font=font)
    if rows:
        dmax = rows[-1][0] + 2 * unit
        smax = max(r[2] for r in rows) or 1.0

        def x(d):
            return left + pw * d / dmax

        bar = max(1.0, pw * 2 * unit / dmax * 0.8)
        for d, _n, share, _c in rows:
            h = ph * share / smax
            dr.rectangle([x(d) - bar / 2, top + ph - h, x(d) + bar / 2, top + ph], fill=(214, 96, 20))
        pts = [(x(d), top + ph * (1 - c)) for d, _n, _s, c in rows]
        if len(pts) > 1:
            dr.line(pts, fill=(40, 96, 170), width=2)
        drain = figures.get("drainage") or {}
        pts = [(x(d), top + ph * (1 - v)) for d, v in zip(drain.get("diameter", ()), drain.get("invaded", ()))]
        if len(pts) > 1:
            dr.line(pts, fill=(30, 140, 60), width=2)
            dr.text((left + pw / 2 - 80, top - 16), "drained from the top face", fill=(30, 140, 60), font=font)
        for q in ("d10", "d50", "d90"):
            v = figures.get(f"thickness_{q}")
            if v is not None:
                dr.line([(x(v), top), (x(v), top + ph)], fill=(120, 120, 120), width=1)
                dr.text((x(v) + 3, top + 3), q, fill=(80, 80, 80), font=font)
        for i in range(6):
            d = dmax * i / 5
            dr.text((x(d) - 12, top + ph + 6), f"{d:.3g}", fill="black", font=font)
            s = smax * i / 5
            dr.text((8, top + ph - ph * i / 5 - 7), f"{s:.2f}", fill=(214, 96, 20), font=font)
            dr.text((left + pw + 6, top + ph - ph * i / 5 - 7), f"{i / 5:.1f}", fill=(40, 96, 170), font=font)
    else:
        dr.text((left + 20, top + ph / 2), "no pores in the sample", fill="black", font=font)
    dr.text((left + pw / 2 - 60, H - 24), f"diameter ({unit_name})", fill="black", font=font)
    dr.text((left, top - 16), "share of pore volume", fill=(214, 96, 20), font=font)
    dr.text((left + pw - 70, top - 16), "cumulative", fill=(40, 96, 170), font=font)
    return img
