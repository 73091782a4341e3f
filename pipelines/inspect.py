"""Inside the heads: which earlier slices each attention head of PoreFormer looks at.

PoreFormer's defining idea is that a head follows a pore channel from slice to slice. These
functions show it (or show that it does not) on any scan, from the model's own attention weights
(the explicit ``math`` path, the only one that forms them), on a crop around the point of interest
so that they take seconds whatever the scan's size:

:func:`attention_at`  for one voxel ``(z, y, x)``: per attention block and head, the weights over
                      the earlier slices (rows sum to 1, zero on later slices), the slice each head
                      attends to most, its entropy (nats, and as a fraction of its maximum) and its
                      mean look-back distance.
:func:`head_maps`     for one slice around a point: per head, its attention entropy and mean
                      look-back per pixel (the full-resolution block), and how alike the heads are.

Both take a scan (path, :class:`~ctpore.data.io.Scan` or ``(Z, Y, X)`` array) and normalize it as
``ctpore reconstruct`` does. Blocks are named in the user's terms from the model's own layout
(:meth:`~ctpore.models.PoreFormer.attention_layout`): "1/8 scale", "full resolution", with their
look-back windows. A head's maximum entropy at a voxel is ``ln`` of the number of slices it can see
there (its window, fewer near the first slice). The pictures are drawn by
:mod:`ctpore.pipelines.inspect_plot`; the whole-scan summary is :mod:`ctpore.pipelines.inspect_summary`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from ctpore.errors import InputError

__all__ = ["HeadView", "UNITS", "attention_at", "block_labels", "entropy_stats", "head_maps", "head_similarity",
           "open_inputs", "scale_label", "window_words"]


def scale_label(scale: int) -> str:
    """A block's in-plane scale in the user's words: ``"full resolution"``, ``"1/8 scale"``."""
    return "full resolution" if int(scale) == 1 else f"1/{int(scale)} scale"


def block_labels(layout: list[dict]) -> list[str]:
    """The user's name of each attention block of :meth:`PoreFormer.attention_layout`: its scale,
    and ``block i`` (from 1) where a scale has more than one."""
    scales = [int(b["scale"]) for b in layout]
    out = []
    for i, s in enumerate(scales):
        n, k = scales.count(s), scales[: i + 1].count(s)
        out.append(scale_label(s) + (f" block {k}" if n > 1 else ""))
    return out


def window_words(window: Optional[int]) -> str:
    """``"looks back 24 slices"`` (the slice itself and 23 before it), or every earlier slice."""
    return "sees every earlier slice" if window is None else f"looks back {int(window)} slices"


def entropy_stats(w: np.ndarray, distance: np.ndarray, visible) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(entropy, normalized entropy, mean look-back)`` of attention rows ``w`` (``(..., K)``).

    ``distance`` (``(K,)`` or broadcastable) is how many slices back each key slice is;
    ``visible`` (broadcastable to ``w.shape[:-1]``) how many slices the head can see there. The
    entropy is in nats, clamped at 0 (rounding can make a one-hot row's a tiny negative); the
    normalized entropy is ``entropy / ln(visible)``, 0 where the head can see one slice only.

    Examples
    --------
    >>> e, n, b = entropy_stats(np.array([[0.5, 0.5, 0.0]]), np.array([2, 1, 0]), 3)
    >>> round(float(e[0]), 4), round(float(n[0]), 4), float(b[0])
    (0.6931, 0.6309, 1.5)
    """
    w = np.asarray(w, dtype=np.float64)
    ent = -(np.where(w > 0, w * np.log(np.clip(w, 1e-300, None)), 0.0)).sum(-1)
    ent = np.where(ent > 0, ent, 0.0) + 0.0  # no "-0.00": clamp rounding below zero, and -0.0 to +0.0
    hmax = np.log(np.maximum(np.asarray(visible, dtype=np.float64), 1.0))
    norm = np.where(hmax > 0, ent / np.where(hmax > 0, hmax, 1.0), 0.0)
    back = (w * np.asarray(distance, dtype=np.float64)).sum(-1)
    return ent, np.clip(norm, 0.0, 1.0), back


#: Units of the numbers a :class:`HeadView` and ``ctpore attention --json`` give.
UNITS = {
    "weights": "fraction of the head's attention on each slice (a row sums to 1)",
    "entropy": "nats",
    "max_entropy": "nats: ln of the number of slices the head can see at this voxel (its window, "
                   "fewer near the first slice); the entropy of attention spread evenly over them",
    "normalized_entropy": "entropy / max_entropy: 0 = all on one slice, 1 = spread evenly over every slice it can see",
    "lookback": "slices: the mean distance back, sum over slices k of weight_k * (z - k)",
    "window": "slices: slice z attends to z - window + 1 .. z (null: every earlier slice)",
    "top_slice": "slice index (z) the head attends to most",
    "scale": "in-plane resolution of the block's pixel columns (1/8: one column per 8 x 8 pixels)",
}


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
    labels : list of str
        Each block in the user's words (``"1/8 scale"``, ``"full resolution"``).
    windows : list of int or None
        Each block's look-back window in slices (None: every earlier slice).
    scales : list of int
        Each block's in-plane downsampling (1 = full resolution).
    entropy : ndarray, shape (n_blocks, n_heads)
        Entropy (nats) of each row: 0 looks at one slice, :attr:`max_entropy` spreads evenly.
    n_visible : ndarray of int, shape (n_blocks,)
        How many slices each block's heads can see at this voxel (the last ones of ``slices``):
        the window, fewer near the first slice.
    normalized_entropy : ndarray, shape (n_blocks, n_heads)
        ``entropy / max_entropy`` in [0, 1].
    lookback : ndarray, shape (n_blocks, n_heads)
        Mean distance back, in slices: ``sum_k w_k (z - k)``.
    top : ndarray, shape (n_blocks, n_heads)
        The slice each head attends to most.
    """

    point: tuple[int, int, int]
    slices: np.ndarray
    blocks: list
    weights: np.ndarray
    labels: list
    windows: list
    scales: list
    entropy: np.ndarray
    n_visible: np.ndarray
    normalized_entropy: np.ndarray
    lookback: np.ndarray
    top: np.ndarray

    @classmethod
    def from_weights(cls, point, slices, weights, layout: list[dict]) -> "HeadView":
        """Build the view (entropies, look-back, top slices) from the weights ``(B, H, K)`` over
        ``slices`` and the blocks' :meth:`~ctpore.models.PoreFormer.attention_layout`."""
        z = int(point[0])
        slices = np.asarray(slices)
        w = np.asarray(weights, dtype=np.float64)
        windows = [b["window"] for b in layout]
        visible = np.array([min(len(slices), z + 1 if win is None else int(win)) for win in windows])
        ent, norm, back = entropy_stats(w, z - slices, visible[:, None])
        return cls((z, int(point[1]), int(point[2])), slices, [b["name"] for b in layout], w, block_labels(layout),
                   windows, [int(b["scale"]) for b in layout], ent, visible, norm, back,
                   slices[w.argmax(-1)])

    def head_label(self, b: int, h: int) -> str:
        """``"1/8 scale, head 0"``."""
        return f"{self.labels[b]}, head {h}"

    @property
    def max_entropy(self) -> np.ndarray:
        """``ln(n_visible)`` per block (nats): the entropy of attention spread evenly."""
        return np.log(np.maximum(self.n_visible, 1).astype(float))

    def to_dict(self) -> dict:
        """JSON-ready (what ``ctpore attention --json`` prints), with the units of every number."""
        return {
            "point": list(self.point),
            "axes": "z, y, x: slice, row, column (0-based)",
            "units": UNITS,
            "slices": [int(s) for s in self.slices],
            "blocks": [
                {"name": name, "label": self.labels[b], "scale": f"1/{self.scales[b]}", "window": self.windows[b],
                 "window_says": window_words(self.windows[b]), "visible_slices": int(self.n_visible[b]),
                 "max_entropy": float(self.max_entropy[b]),
                 "heads": [
                     {"head": h, "label": self.head_label(b, h), "weights": [float(w) for w in self.weights[b, h]],
                      "entropy": float(self.entropy[b, h]),
                      "normalized_entropy": float(self.normalized_entropy[b, h]),
                      "lookback": float(self.lookback[b, h]), "top_slice": int(self.top[b, h])}
                     for h in range(self.weights.shape[1])]}
                for b, name in enumerate(self.blocks)
            ],
        }

    def lines(self) -> list[str]:
        """One line per head, as ``ctpore attention`` prints them."""
        out = []
        for b in range(len(self.blocks)):
            out.append(f"{self.labels[b]} ({window_words(self.windows[b])}; it sees {self.n_visible[b]} here, "
                       f"max entropy ln {self.n_visible[b]} = {self.max_entropy[b]:.2f} nats):")
            for h in range(self.weights.shape[1]):
                out.append(f"  {self.head_label(b, h)}: top slice {self.top[b, h]}, "
                           f"mean look-back {self.lookback[b, h]:.2f} slices, entropy {self.entropy[b, h]:.2f} nats "
                           f"= {self.normalized_entropy[b, h]:.2f} of its maximum")
        return out


def open_inputs(scan, weights, slice_axis):
    """``(model, post-processing, volume, opened)``: the weights on the CPU and the scan (a path is
    opened lazily, and ``opened`` says the caller must close it)."""
    from ctpore.data.io import Scan, load_scan
    from ctpore.models.weights import load_for_inference

    model, _meta, post, _path = load_for_inference(weights, "cpu")
    if isinstance(scan, (str, os.PathLike)):
        return model, post, load_scan(scan, slice_axis=slice_axis), True
    if isinstance(scan, Scan):
        return model, post, scan, False
    arr = np.asarray(scan)
    if arr.ndim != 3 or not np.issubdtype(arr.dtype, np.number):
        raise InputError(f"expected a numeric 3D (Z, Y, X) volume, got {arr.dtype} of shape {arr.shape}")
    return model, post, arr, False


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
    return sum((b["window"] or 64) - 1 for b in model.attention_layout()) + 1


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
    model, _post, volume, opened = open_inputs(scan, weights, slice_axis)
    try:
        z, y, x = _check_point(point, volume.shape)
        t, (z0, y0, x0) = _crop(model, volume, z, y, x, _reach(model), model.halo)
    finally:
        if opened:
            volume.close()
    maps = model.attention_maps(t, z0=z0, region=(y - y0, x - x0))  # per block (1, 1, 1, H, Zc, Zc)
    w = np.stack([m[0, 0, 0, :, -1, :].numpy() for m in maps])  # the row of slice z: (B, H, Zc)
    return HeadView.from_weights((z, y, x), np.arange(z0, z + 1), w, model.attention_layout())


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
    model, _post, volume, opened = open_inputs(scan, weights, slice_axis)
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
    layout = model.attention_layout()[-1]
    visible = min(len(slices), z + 1 if layout["window"] is None else layout["window"])
    ent, _norm, back = entropy_stats(w, z - slices, visible)
    return {
        "entropy": np.ascontiguousarray(ent.transpose(2, 0, 1), np.float32),
        "lookback": np.ascontiguousarray(back.transpose(2, 0, 1), np.float32),
        "origin": (y0 + ry0, x0 + rx0),
        "similarity": head_similarity(w),
        "block": model.attention_block_names[-1],
        "label": block_labels(model.attention_layout())[-1],
        "max_entropy": math.log(visible),
    }
