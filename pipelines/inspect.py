"""Inside the heads: which earlier slices each attention head of PoreFormer looks at.

PoreFormer's defining idea is that a head follows a pore channel from slice to slice. These
functions show it (or show that it does not) on any scan, from the model's own attention weights
(the explicit ``math`` path, the only one that forms them), on a crop around the point of interest
so that they take seconds whatever the scan's size:

:func:`attention_at`  for one voxel ``(z, y, x)``: per attention block and head, the weights over
                      the earlier slices (rows sum to 1, zero on later slices), the slice each head
                      attends to most, its entropy and its mean look-back distance.
:func:`head_maps`     for one slice around a point: per head, its attention entropy and mean
                      look-back per pixel (the full-resolution block), and how alike the heads are.

Both take a scan (path, :class:`~ctpore.data.io.Scan` or ``(Z, Y, X)`` array) and normalize it as
``ctpore reconstruct`` does.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from ctpore.errors import InputError

__all__ = ["HeadView", "attention_at", "head_maps", "head_similarity", "heatmap_rgb", "write_heatmap_png"]


@dataclass
class HeadView:
    """Attention of one voxel's column, per block and head (see :func:`attention_at`).

    Attributes
    ----------
    point : (z, y, x)
    slices : ndarray of int
        The absolute slices the weights are over (the crop's, up to and including ``z``).
    blocks : list of str
        Block names (coarse levels first, then full resolution), as the model names them.
    weights : ndarray, shape (n_blocks, n_heads, n_slices)
        How much slice ``z`` attends to each slice in ``slices``; rows sum to 1.
    entropy : ndarray, shape (n_blocks, n_heads)
        Entropy (nats) of each row: 0 looks at one slice, log(n) spreads over n.
    lookback : ndarray, shape (n_blocks, n_heads)
        Mean distance back, in slices: ``sum_k w_k (z - k)``.
    top : ndarray, shape (n_blocks, n_heads)
        The slice each head attends to most.
    """

    point: tuple[int, int, int]
    slices: np.ndarray
    blocks: list
    weights: np.ndarray
    entropy: np.ndarray
    lookback: np.ndarray
    top: np.ndarray

    def to_dict(self) -> dict:
        """JSON-ready (what ``ctpore attention --json`` prints)."""
        return {
            "point": list(self.point),
            "slices": [int(s) for s in self.slices],
            "blocks": [
                {"name": name, "heads": [
                    {"weights": [float(w) for w in self.weights[b, h]], "entropy": float(self.entropy[b, h]),
                     "lookback": float(self.lookback[b, h]), "top_slice": int(self.top[b, h])}
                    for h in range(self.weights.shape[1])]}
                for b, name in enumerate(self.blocks)
            ],
        }


def _load(scan, weights, slice_axis):
    from ctpore.data.io import Scan, load_scan
    from ctpore.models.weights import load_for_inference

    model, _meta, _post, _path = load_for_inference(weights, "cpu")
    if isinstance(scan, (str, os.PathLike)):
        return model, load_scan(scan, slice_axis=slice_axis), True
    if isinstance(scan, Scan):
        return model, scan, False
    arr = np.asarray(scan)
    if arr.ndim != 3 or not np.issubdtype(arr.dtype, np.number):
        raise InputError(f"expected a numeric 3D (Z, Y, X) volume, got {arr.dtype} of shape {arr.shape}")
    return model, arr, False


def _check_point(point, shape) -> tuple[int, int, int]:
    try:
        z, y, x = (int(v) for v in point)
    except (TypeError, ValueError):
        raise InputError(f"the point must be three integers Z,Y,X, got {point!r}") from None
    for name, v, n in (("z", z, shape[0]), ("y", y, shape[1]), ("x", x, shape[2])):
        if not 0 <= v < n:
            raise InputError(f"{name} = {v} is outside the scan, which has {n} along {name} (0..{n - 1})")
    return z, y, x


def _crop(model, volume, z: int, y: int, x: int, depth: int, radius: int):
    """The normalized crop ``(1, Zc, Yc, Xc)`` around a point, its origin, and the point in it."""
    import torch

    from ctpore.data.normalize import intensity_range, normalize

    nz, ny, nx = volume.shape
    a = model.align
    z0 = max(0, z - depth + 1)
    y0 = max(0, (y - radius) // a * a)
    x0 = max(0, (x - radius) // a * a)
    y1, x1 = min(ny, y + radius + 1), min(nx, x + radius + 1)
    lo, hi = intensity_range(volume)
    block = np.asarray(volume[z0 : z + 1], dtype=np.float32)[:, y0:y1, x0:x1]
    t = torch.from_numpy(normalize(block, lo, hi))[None]
    return t, (z0, y0, x0)


def _reach(model) -> int:
    """Slices back the model's output at a slice can depend on (the stacked windows)."""
    total = 0
    for blk in model._attention_blocks() if hasattr(model, "_attention_blocks") else []:
        total += (blk.attn.window or 64) - 1
    return total + 1


def attention_at(
    scan,
    point: tuple[int, int, int],
    weights: Optional[Union[str, os.PathLike]] = None,
    slice_axis: Optional[int] = None,
) -> HeadView:
    """Per block and head, where voxel ``point = (z, y, x)``'s column looks back to.

    Raises
    ------
    InputError
        For a point outside the scan (the message gives the valid range) or a bad scan.
    """
    model, volume, opened = _load(scan, weights, slice_axis)
    try:
        z, y, x = _check_point(point, volume.shape)
        t, (z0, y0, x0) = _crop(model, volume, z, y, x, _reach(model), model.halo)
    finally:
        if opened:
            volume.close()
    maps = model.attention_maps(t, z0=z0, region=(y - y0, x - x0))  # per block (1, 1, 1, H, Zc, Zc)
    w = np.stack([m[0, 0, 0, :, -1, :].numpy() for m in maps])  # the row of slice z: (B, H, Zc)
    slices = np.arange(z0, z + 1)
    p = np.clip(w, 1e-30, None)
    entropy = -(np.where(w > 0, w * np.log(p), 0.0)).sum(-1)
    lookback = (w * (z - slices)[None, None, :]).sum(-1)
    top = slices[w.argmax(-1)]
    return HeadView((z, y, x), slices, model.attention_block_names, w, entropy, lookback, top)


def head_similarity(w: np.ndarray) -> float:
    """How alike the heads are, in [0, 1]: 1 minus the mean total-variation distance between the
    attention distributions of every pair of heads, averaged over the pixels.

    ``w`` is ``(..., H, K)`` (rows are distributions). 1: the heads are copies of each other
    (redundant); 0: no two heads share any slice.

    Examples
    --------
    >>> head_similarity(np.array([[[1.0, 0.0], [1.0, 0.0]]]))
    1.0
    >>> head_similarity(np.array([[[1.0, 0.0], [0.0, 1.0]]]))
    0.0
    """
    w = np.asarray(w, dtype=np.float64)
    h = w.shape[-2]
    if h < 2:
        return 1.0
    dists = [0.5 * np.abs(w[..., i, :] - w[..., j, :]).sum(-1) for i in range(h) for j in range(i + 1, h)]
    return float(1.0 - np.mean(dists))


def head_maps(
    scan,
    point: tuple[int, int, int],
    weights: Optional[Union[str, os.PathLike]] = None,
    radius: int = 64,
    slice_axis: Optional[int] = None,
) -> dict:
    """For slice ``z`` of ``point``, in a square of ``radius`` pixels around ``(y, x)``: each
    full-resolution head's attention entropy and mean look-back per pixel.

    Returns
    -------
    dict
        ``entropy`` and ``lookback``: ``(H, h, w)`` float32; ``origin``: ``(y0, x0)``, where the
        maps sit in the slice; ``similarity``: :func:`head_similarity` of the heads over the
        square; ``block``: the block's name.
    """
    model, volume, opened = _load(scan, weights, slice_axis)
    try:
        z, y, x = _check_point(point, volume.shape)
        t, (z0, y0, x0) = _crop(model, volume, z, y, x, _reach(model), radius + model.halo)
    finally:
        if opened:
            volume.close()
    h_img, w_img = t.shape[-2:]
    ry0, rx0 = max(0, y - radius - y0), max(0, x - radius - x0)
    ry1, rx1 = min(h_img, y + radius + 1 - y0), min(w_img, x + radius + 1 - x0)
    maps = model.attention_maps(t, z0=z0, region=(slice(ry0, ry1), slice(rx0, rx1)))
    w = maps[-1][0, :, :, :, -1, :].numpy()  # the last full-resolution block: (h, w, H, Zc)
    slices = np.arange(z0, z + 1)
    ent = -(np.where(w > 0, w * np.log(np.clip(w, 1e-30, None)), 0.0)).sum(-1)
    back = (w * (z - slices)).sum(-1)
    return {
        "entropy": np.ascontiguousarray(ent.transpose(2, 0, 1), np.float32),
        "lookback": np.ascontiguousarray(back.transpose(2, 0, 1), np.float32),
        "origin": (y0 + ry0, x0 + rx0),
        "similarity": head_similarity(w),
        "block": model.attention_block_names[-1],
        "max_entropy": math.log(len(slices)),
    }


def _colormap(v: np.ndarray) -> np.ndarray:
    """Values in [0, 1] to RGB uint8 along a perceptually ordered ramp (dark blue, teal, yellow)."""
    stops = np.array([[0.27, 0.00, 0.33], [0.23, 0.32, 0.55], [0.13, 0.57, 0.55], [0.37, 0.79, 0.38],
                      [0.99, 0.91, 0.14]])
    x = np.clip(v, 0, 1) * (len(stops) - 1)
    i = np.minimum(x.astype(int), len(stops) - 2)
    f = (x - i)[..., None]
    return ((stops[i] * (1 - f) + stops[i + 1] * f) * 255).astype(np.uint8)


def heatmap_rgb(view: HeadView, cell: int = 10) -> np.ndarray:
    """The heads x earlier slices heatmap of a :class:`HeadView` as an RGB image ``(h, w, 3)``:
    one row per block and head (blocks separated by a white line), one column per slice (the
    point's slice last), each row scaled to its own maximum."""
    b, h, k = view.weights.shape
    rows = []
    for bi in range(b):
        w = view.weights[bi]
        rows.append(_colormap(w / np.maximum(w.max(-1, keepdims=True), 1e-12)))
        if bi < b - 1:
            rows.append(np.full((1, k, 3), 255, np.uint8))
    img = np.concatenate(rows)
    return np.repeat(np.repeat(img, cell, axis=0), cell, axis=1)


def write_heatmap_png(view: HeadView, path: Union[str, os.PathLike]) -> None:
    """:func:`heatmap_rgb` with labels (block and head per row, slices along the bottom) as a PNG."""
    from PIL import Image, ImageDraw

    from ctpore.atomic import atomic_write

    cell, left, bottom, top = 10, 120, 30, 24
    heat = heatmap_rgb(view, cell)
    b, h, k = view.weights.shape
    img = Image.new("RGB", (left + heat.shape[1] + 10, top + heat.shape[0] + bottom), "white")
    img.paste(Image.fromarray(heat), (left, top))
    draw = ImageDraw.Draw(img)
    z, y, x = view.point
    draw.text((4, 4), f"attention of voxel (z={z}, y={y}, x={x}) over earlier slices", fill="black")
    row = top
    for bi, name in enumerate(view.blocks):
        for hi in range(h):
            draw.text((4, row + hi * cell - 1), f"{name} h{hi}", fill="black")
        row += (h + 1) * cell  # the white separator row is one cell high
    for j, s in enumerate(view.slices):
        if (view.slices[-1] - s) % 5 == 0:
            draw.text((left + j * cell, top + heat.shape[0] + 4), str(int(s)), fill="black")
    with atomic_write(path) as tmp:
        img.save(tmp, format="PNG")
