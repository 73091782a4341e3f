"""The pictures of the heads: the heads x slices heatmap of one voxel, and the whole-scan summary.

Drawn with Pillow (no plotting library): every picture carries its labels, its colour bar or
legend, and the units, so it reads without the JSON beside it.

:func:`heatmap_image`  one row per block and head (named in the user's words: "1/8 scale, head 0"),
                       one column per slice (slice numbers below), absolute attention weights on
                       one colour scale shared by every row, with its colour bar; cells a head
                       cannot see (outside its look-back window) in grey. ``normalize_rows``
                       scales each row to its own maximum instead, and says so.
:func:`summary_image`  per head, the distribution of look-back and of normalized entropy over a
                       scan, pore and solid voxels apart (see :mod:`ctpore.pipelines.inspect_summary`).
"""

from __future__ import annotations

import math
import os
from typing import Union

import numpy as np

__all__ = ["colormap", "plot_font", "heatmap_image", "heatmap_rgb", "write_heatmap_png", "summary_image", "summary_rgb",
           "write_summary_png", "OUTSIDE_WINDOW", "PORE_COLOUR", "SOLID_COLOUR"]

#: Colour of the cells a head cannot see (before its look-back window).
OUTSIDE_WINDOW = (222, 222, 222)
#: Curve colours of the summary: pore and solid voxels.
PORE_COLOUR, SOLID_COLOUR = (214, 96, 20), (40, 96, 170)

_STOPS = np.array([[0.27, 0.00, 0.33], [0.23, 0.32, 0.55], [0.13, 0.57, 0.55], [0.37, 0.79, 0.38],
                   [0.99, 0.91, 0.14]])


def colormap(v: np.ndarray) -> np.ndarray:
    """Values in [0, 1] to RGB uint8 along a perceptually ordered ramp (dark purple, teal, yellow)."""
    x = np.clip(np.asarray(v, dtype=np.float64), 0, 1) * (len(_STOPS) - 1)
    i = np.minimum(x.astype(int), len(_STOPS) - 2)
    f = (x - i)[..., None]
    return np.round((_STOPS[i] * (1 - f) + _STOPS[i + 1] * f) * 255).astype(np.uint8)


def plot_font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: the small bitmap font
        return ImageFont.load_default()


def _text_w(draw, text: str, font) -> int:
    left, _, right, _ = draw.textbbox((0, 0), text, font=font)
    return int(right - left)


def nice_ceil(v: float) -> float:
    """``v`` rounded up to one significant digit (0.87 -> 0.9, 0.052 -> 0.06), for a colour bar's end."""
    if not v > 0:
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    return min(1.0, math.ceil(v / e - 1e-9) * e) if v <= 1 else math.ceil(v / e) * e


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def _ticks(first: int, last: int, max_ticks: int = 12) -> list[int]:
    n = last - first + 1
    step = next(s for s in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10**9) if n / s <= max_ticks)
    return [s for s in range(first, last + 1) if (last - s) % step == 0]


def heatmap_image(view, normalize_rows: bool = False):
    """The heatmap of a :class:`~ctpore.pipelines.inspect.HeadView` as a labelled picture.

    Returns
    -------
    image : PIL.Image.Image
        RGB.
    layout : dict
        Where things are drawn (pixels), for readers of the picture: ``cell`` ``(w, h)``;
        ``x0`` of the first slice column; ``columns``, the slices shown; ``rows``, one
        ``{"label", "block", "head", "y"}`` per head (``y`` the row's top); ``colorbar``
        ``{"x0", "x1", "y0", "y1", "vmin", "vmax", "label"}`` (values grow left to right);
        ``normalize_rows``.
    """
    from PIL import Image, ImageDraw

    nb, nh, _k = view.weights.shape
    n_show = int(max(view.n_visible))
    cols = np.asarray(view.slices[-n_show:])
    w = view.weights[:, :, -n_show:]
    seen = np.arange(n_show)[None, :] >= (n_show - np.asarray(view.n_visible))[:, None]  # (B, n_show)
    if normalize_rows:
        vmax = 1.0
        values = w / np.maximum(w.max(-1, keepdims=True), 1e-12)
        bar_label = "weight / the row's own maximum (each row scaled alone: rows NOT comparable)"
    else:
        vmax = nice_ceil(float(w.max()))
        values = w / vmax
        bar_label = "attention weight: share of the head's attention on that slice (one scale for all rows)"
    font, small, bold = plot_font(14), plot_font(12), plot_font(16)
    cw = 22 if n_show <= 16 else 16 if n_show <= 32 else 10
    ch, gap, pad = 18, 24, 12
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    row_labels = [view.head_label(b, h) for b in range(nb) for h in range(nh)]
    left = pad + max(_text_w(probe, t, font) for t in row_labels) + 10
    heat_w = cw * n_show
    stats_w = 190
    bar_w = max(240, min(heat_w, 420))
    width = max(left + heat_w + 12 + stats_w, left + bar_w + 40, 620)
    top = pad + 62
    height = top + nb * (gap + nh * ch) + 42 + 78
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    z, y, x = view.point
    draw.text((pad, pad), f"Attention of voxel (z={z}, y={y}, x={x}) over the slices before it", fill="black",
              font=bold)
    draw.text((pad, pad + 20), "each row: one head; grey: slices outside the head's look-back window",
              fill=(70, 70, 70), font=small)
    sx = left + heat_w + 12
    draw.text((sx, top - 16), "entropy/max", fill=(40, 40, 40), font=small)
    draw.text((sx + 92, top - 16), "mean look-back", fill=(40, 40, 40), font=small)
    rows = []
    yy = top
    for b in range(nb):
        draw.text((pad, yy + 5), f"{view.labels[b]}: {_window(view.windows[b])}; it sees {view.n_visible[b]} "
                                 f"slices here (max entropy ln {view.n_visible[b]} = {view.max_entropy[b]:.2f} nats)",
                  fill=(40, 40, 40), font=small)
        yy += gap
        for h in range(nh):
            rgb = colormap(values[b, h])
            rgb[~seen[b]] = OUTSIDE_WINDOW
            strip = np.repeat(np.repeat(rgb[None], ch - 1, axis=0), cw, axis=1)
            img.paste(Image.fromarray(strip), (left, yy))
            label = view.head_label(b, h)
            draw.text((left - 8 - _text_w(draw, label, font), yy + 1), label, fill="black", font=font)
            draw.text((sx, yy + 2), f"{view.normalized_entropy[b, h]:.2f}", fill="black", font=small)
            draw.text((sx + 92, yy + 2), f"{view.lookback[b, h]:.1f} slices", fill="black", font=small)
            rows.append({"label": label, "block": b, "head": h, "y": yy})
            yy += ch
    # x axis: slice numbers under their columns
    draw.line([(left, yy + 2), (left + heat_w, yy + 2)], fill="black")
    for s in _ticks(int(cols[0]), int(cols[-1])):
        cx = left + (s - int(cols[0])) * cw + cw // 2
        draw.line([(cx, yy + 2), (cx, yy + 6)], fill="black")
        t = str(s)
        draw.text((cx - _text_w(draw, t, small) // 2, yy + 8), t, fill="black", font=small)
    draw.text((left, yy + 24), f"slice z (the last column is the voxel's own slice, {z})", fill="black", font=small)
    # colour bar
    by0 = yy + 50
    bx0, bx1 = left, left + bar_w
    ramp = colormap(np.linspace(0, 1, bar_w))
    img.paste(Image.fromarray(np.repeat(ramp[None], 14, axis=0)), (bx0, by0))
    draw.rectangle([bx0 - 1, by0 - 1, bx1, by0 + 14], outline="black")
    for f in (0.0, 0.5, 1.0):
        cx = bx0 + int(round(f * (bar_w - 1)))
        draw.line([(cx, by0 + 14), (cx, by0 + 18)], fill="black")
        t = _fmt(f * vmax)
        draw.text((cx - _text_w(draw, t, small) // 2, by0 + 19), t, fill="black", font=small)
    draw.text((bx0, by0 + 35), bar_label, fill="black", font=small)
    sw = bx1 + 16
    if sw + 160 < width:
        draw.rectangle([sw, by0, sw + 14, by0 + 14], fill=OUTSIDE_WINDOW, outline=(150, 150, 150))
        draw.text((sw + 20, by0 + 1), "outside the window", fill="black", font=small)
    layout = {"cell": (cw, ch), "x0": left, "columns": [int(c) for c in cols], "rows": rows,
              "colorbar": {"x0": bx0, "x1": bx1 - 1, "y0": by0, "y1": by0 + 13, "vmin": 0.0, "vmax": vmax,
                           "label": bar_label},
              "normalize_rows": bool(normalize_rows)}
    return img, layout


def _window(window) -> str:
    return "sees every earlier slice" if window is None else f"looks back {int(window)} slices"


def heatmap_rgb(view, normalize_rows: bool = False) -> np.ndarray:
    """:func:`heatmap_image` as an RGB array ``(h, w, 3)`` (what the napari dock shows)."""
    return np.asarray(heatmap_image(view, normalize_rows)[0])


def _save(img, path: Union[str, os.PathLike]) -> None:
    from ctpore.atomic import atomic_write

    with atomic_write(path) as tmp:
        img.save(tmp, format="PNG")


def write_heatmap_png(view, path: Union[str, os.PathLike], normalize_rows: bool = False) -> None:
    """:func:`heatmap_image` written (whole or not at all) as a PNG."""
    _save(heatmap_image(view, normalize_rows)[0], path)


def _panel(draw, box, hist: dict, ticks: list, tick_fmt, font, even=None) -> None:
    """Two step curves (pore, solid: each class's share of voxels per bin) in ``box``, their means
    beside it, and a dotted line at ``even`` (the value of attention spread evenly)."""
    x0, y0, x1, y1 = box
    edges = np.asarray(hist["bin_edges"], dtype=float)
    draw.rectangle([x0, y0, x1, y1], outline=(150, 150, 150))
    shares = []
    for key in ("solid", "pore"):
        c = np.asarray(hist[key], dtype=float)
        shares.append(c / c.sum() if c.sum() > 0 else None)
    top = max([float(s.max()) for s in shares if s is not None] or [1.0]) or 1.0
    span = edges[-1] - edges[0] or 1.0

    def px(v):
        return x0 + (v - edges[0]) / span * (x1 - x0)

    for share, colour in zip(shares, (SOLID_COLOUR, PORE_COLOUR)):
        if share is None:
            continue
        pts = []
        for i, s in enumerate(share):
            yv = y1 - s / top * (y1 - y0 - 4)
            pts += [(px(edges[i]), yv), (px(edges[i + 1]), yv)]
        draw.line(pts, fill=colour, width=2)
    for t in ticks:
        cx = px(t)
        draw.line([(cx, y1), (cx, y1 + 3)], fill="black")
        s = tick_fmt(t)
        draw.text((cx - _text_w(draw, s, font) // 2, y1 + 4), s, fill="black", font=font)
    if even is not None:  # where a head spreading its attention evenly would sit
        ex = px(even)
        for yv in range(y0 + 2, y1, 6):
            draw.line([(ex, yv), (ex, min(y1, yv + 3))], fill=(150, 150, 150))
    means = hist.get("mean", {})
    for i, (key, colour) in enumerate((("pore", PORE_COLOUR), ("solid", SOLID_COLOUR))):
        if means.get(key) is not None:
            draw.text((x1 + 8, y0 + 4 + 17 * i), f"{key} {means[key]:.2f}", fill=colour, font=font)


def summary_image(summary: dict):
    """The whole-scan summary (:func:`~ctpore.pipelines.inspect_summary.head_summary`) as a picture:
    one row per head, the distribution of its mean look-back (left) and of its normalized entropy
    (right) over the sampled voxels, pore and solid apart (each curve the share of its class's
    voxels per bin, so the two compare whatever the porosity)."""
    from PIL import Image, ImageDraw

    font, small, bold = plot_font(14), plot_font(12), plot_font(16)
    heads = summary["heads"]
    pad, label_w, panel_w, panel_h, row_h, gap, means_w = 12, 180, 320, 46, 68, 28, 96
    blocks = list(dict.fromkeys(h["block_label"] for h in heads))
    width = pad + label_w + 2 * (panel_w + means_w) + pad
    top = pad + 100
    height = top + len(heads) * row_h + len(blocks) * gap + pad
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    s = summary["sample"]
    draw.text((pad, pad), f"What each attention head does over {summary['scan']}", fill="black", font=bold)
    draw.text((pad, pad + 22), f"{s['voxels']} voxels ({s['pore_voxels']} pore, {s['solid_voxels']} solid): "
                               f"{s['columns']} pixel columns ({_every(s['stride'])}), slices "
                               f"{s['slices'][0]}..{s['slices'][1]}", fill=(60, 60, 60), font=small)
    draw.text((pad, pad + 38), f"pore or solid: {summary['pore_source']}", fill=(60, 60, 60), font=small)
    lx = pad + 4
    ly = pad + 56
    draw.line([(lx, ly + 7), (lx + 24, ly + 7)], fill=PORE_COLOUR, width=3)
    draw.text((lx + 30, ly), "pore voxels", fill="black", font=small)
    draw.line([(lx + 120, ly + 7), (lx + 144, ly + 7)], fill=SOLID_COLOUR, width=3)
    draw.text((lx + 150, ly), "solid voxels   (each curve: share of its voxels per bin; means on the right)",
              fill="black", font=small)
    draw.line([(lx + 560, ly + 1), (lx + 560, ly + 13)], fill=(150, 150, 150))
    draw.text((lx + 568, ly), "dotted: attention spread evenly over the whole window", fill="black", font=small)
    px0 = pad + label_w
    px1 = px0 + panel_w + means_w
    draw.text((px0, top - 20), "mean look-back (slices back)", fill="black", font=font)
    draw.text((px1, top - 20), "entropy / its maximum (0: one slice, 1: even)", fill="black", font=font)
    yy = top
    current = None
    for h in heads:
        if h["block_label"] != current:
            current = h["block_label"]
            draw.text((pad, yy + 6), f"{current}: {_window(h['window'])}", fill=(40, 40, 40), font=small)
            yy += gap
        draw.text((pad, yy + panel_h // 2 - 8), h["label"], fill="black", font=font)
        last = float(h["lookback"]["bin_edges"][-1])
        back_ticks = sorted({0.0, round(last / 2), last}) if last >= 2 else [0.0, last]
        _panel(draw, (px0, yy, px0 + panel_w, yy + panel_h), h["lookback"], back_ticks, lambda v: f"{v:g}", small,
               even=last / 2)
        _panel(draw, (px1, yy, px1 + panel_w, yy + panel_h), h["normalized_entropy"], [0.0, 0.5, 1.0],
               lambda v: f"{v:g}", small, even=1.0)
        yy += row_h
    return img


def _every(n: int) -> str:
    """``"every 2nd row and column"`` (``"every row and column"`` for 1)."""
    n = int(n)
    if n == 1:
        return "every row and column"
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"every {n}{suffix} row and column"


def summary_rgb(summary: dict) -> np.ndarray:
    """:func:`summary_image` as an RGB array (what the napari dock shows)."""
    return np.asarray(summary_image(summary))


def write_summary_png(summary: dict, path: Union[str, os.PathLike]) -> None:
    """:func:`summary_image` written (whole or not at all) as a PNG."""
    _save(summary_image(summary), path)
