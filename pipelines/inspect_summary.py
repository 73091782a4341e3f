"""What each attention head does over a whole scan: look-back and entropy, pore and solid apart.

:func:`head_summary` runs PoreFormer over a sample of the scan's pixel columns and, per block and
head, counts the sampled voxels by the head's mean look-back (slices) and by its normalized
entropy (the entropy over ``ln`` of the number of slices the head can see there: 0 = all on one
slice, 1 = spread evenly), pore voxels and solid voxels apart.

Sample
------
A regular grid of pixel columns, every ``stride``-th row and column from an offset drawn with a
fixed seed, the stride chosen so that about ``columns`` columns are taken; every slice but the
first (slice 0 can only see itself) of each column is a sampled voxel.

Streaming
---------
As ``ctpore reconstruct`` does: the plane in tiles read with the model's halo (only tiles that
hold sampled columns), each tile through the slices in chunks with a KV cache per attention
block, the attention weights formed (math path) for the chunk and kept only at the sampled
columns, reduced at once to histograms. Memory follows the tile and the chunk, never the scan.
The weights equal those of the whole scan in one pass.

Pore or solid
-------------
The model's own prediction: its raw probability at or above the weights' threshold (0.5 for
the shipped model; no speck removal), from the same pass; or, given ``pores``, that volume
(``reconstruct``'s ``<stem>_pores.nii.gz``, 1 = pore). The result says which.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional, Union

import numpy as np

from ctpore.errors import InputError
from ctpore.pipelines.inspect import UNITS, block_labels, entropy_stats, open_inputs
from ctpore.progress import ProgressFn

__all__ = ["head_summary", "sample_grid", "ENTROPY_BINS"]

#: Bins of the normalized entropy over [0, 1].
ENTROPY_BINS = 20


def sample_grid(ny: int, nx: int, columns: int, seed: int = 0) -> tuple[int, tuple[int, int]]:
    """``(stride, (y0, x0))`` of a regular grid of about ``columns`` pixel columns over an
    ``ny x nx`` plane (every ``stride``-th row and column from ``(y0, x0)``, an offset drawn with
    ``seed``).

    Examples
    --------
    >>> stride, (y0, x0) = sample_grid(64, 64, 64)
    >>> stride, len(range(y0, 64, stride)) * len(range(x0, 64, stride))
    (8, 64)
    """
    if columns < 1:
        raise InputError(f"the number of sampled columns must be >= 1, got {columns}")
    stride = max(1, int(math.sqrt(ny * nx / columns)))
    rng = np.random.default_rng(seed)
    return stride, (int(rng.integers(0, min(stride, ny))), int(rng.integers(0, min(stride, nx))))


def _lookback_edges(window: Optional[int], nz: int) -> np.ndarray:
    """Bins of the mean look-back: half a slice wide over [0, window - 1] (at most 48 bins)."""
    last = (nz if window is None else min(int(window), nz)) - 1
    if last <= 0:
        return np.array([0.0, 0.5])
    return np.linspace(0.0, float(last), min(48, 2 * last) + 1)


class _Counts:
    """Histograms of one head, pore and solid apart, and the sums for the means."""

    def __init__(self, edges: np.ndarray):
        self.edges = edges
        self.hist = {"pore": np.zeros(len(edges) - 1, np.int64), "solid": np.zeros(len(edges) - 1, np.int64)}
        self.sums = {"pore": 0.0, "solid": 0.0}

    def add(self, values: np.ndarray, pore: np.ndarray) -> None:
        for key, sel in (("pore", pore), ("solid", ~pore)):
            v = np.clip(values[sel], self.edges[0], self.edges[-1])
            self.hist[key] += np.histogram(v, bins=self.edges)[0]
            self.sums[key] += float(v.sum())

    def to_dict(self) -> dict:
        n = {k: int(h.sum()) for k, h in self.hist.items()}
        mean = {k: (round(self.sums[k] / n[k], 3) if n[k] else None) for k in ("pore", "solid")}
        total = n["pore"] + n["solid"]
        mean["all"] = round((self.sums["pore"] + self.sums["solid"]) / total, 3) if total else None
        return {"bin_edges": [round(float(e), 6) for e in self.edges],
                "pore": self.hist["pore"].tolist(), "solid": self.hist["solid"].tolist(), "mean": mean}


def _read(volume, z0: int, z1: int, window: tuple[int, int, int, int]) -> np.ndarray:
    wy0, wy1, wx0, wx1 = window
    if hasattr(volume, "read_window"):
        return np.asarray(volume.read_window(z0, z1, wy0, wy1, wx0, wx1))
    return np.asarray(volume[z0:z1])[:, wy0:wy1, wx0:wx1]


def _open_pores(pores, shape, slice_axis):
    """The pores volume (array or file) checked against the scan's shape: ``(volume, opened, said)``."""
    if pores is None:
        return None, False, None
    if isinstance(pores, (str, os.PathLike)):
        from ctpore.data.io import load_scan

        vol = load_scan(pores, slice_axis=slice_axis)
        said, opened = f"the pores file {Path(pores).name} (1 = pore)", True
    else:
        vol, said, opened = np.asarray(pores), "the pores given (1 = pore)", False
    if tuple(vol.shape) != tuple(shape):
        if opened:
            vol.close()
        raise InputError(f"the pores have shape {tuple(vol.shape)} but the scan has {tuple(shape)}; give the "
                         "pores reconstruct wrote for this scan", pores if opened else None)
    return vol, opened, said


def head_summary(
    scan,
    weights: Optional[Union[str, os.PathLike]] = None,
    columns: int = 1024,
    pores=None,
    seed: int = 0,
    chunk_slices: int = 8,
    tile: int = 128,
    slice_axis: Optional[int] = None,
    progress: ProgressFn = None,
) -> dict:
    """Per attention head, the distribution of look-back and normalized entropy over a scan.

    Parameters
    ----------
    scan : path, Scan or array
        ``(Z, Y, X)``; normalized as ``ctpore reconstruct`` does.
    weights : path, optional
        PoreFormer weights (default: the shipped ones).
    columns : int
        About how many pixel columns to sample (see the module docstring).
    pores : path or array, optional
        Pore volume of the scan (1 = pore) to split by; default the model's own prediction.
    seed : int
        Seed of the grid's offset.
    chunk_slices, tile : int
        Slices per chunk and the tile's core side (pixels): the working memory.
    progress : callable, optional
        ``progress(done, total, "heads")`` after each chunk of each tile.

    Returns
    -------
    dict
        JSON-ready: ``scan``, ``shape`` (z, y, x), ``sample`` (``columns``, ``stride``,
        ``offset_yx``, ``seed``, ``slices`` [first, last], ``voxels``, ``pore_voxels``,
        ``solid_voxels``), ``pore_source``, ``units`` and ``heads``: one per block and head with
        ``block``, ``block_label``, ``label``, ``head``, ``scale``, ``window`` and, for
        ``lookback`` and ``normalized_entropy``, ``bin_edges``, the ``pore`` and ``solid``
        counts per bin and their ``mean``. Every voxel sampled is counted once per head.

    Raises
    ------
    InputError
        A scan with fewer than 2 slices, pores of another shape, a bad ``columns``.
    """
    import torch

    from ctpore.data.normalize import NormalizedVolume, intensity_range
    from ctpore.pipelines.stream_plan import plan_tiles

    model, post, volume, opened = open_inputs(scan, weights, slice_axis)
    pvol, p_opened = None, False
    try:
        nz, ny, nx = (int(s) for s in volume.shape)
        if nz < 2:
            raise InputError(f"the scan has {nz} slice; the heads look back over slices, so it needs at least 2")
        pvol, p_opened, said = _open_pores(pores, (nz, ny, nx), slice_axis)
        if said is None:
            said = (f"the model's own prediction: raw probability >= {post.threshold:g} (the weights' threshold, "
                    "no speck removal)")
        stride, (oy, ox) = sample_grid(ny, nx, columns, seed)
        gy, gx = np.arange(oy, ny, stride), np.arange(ox, nx, stride)
        layout = model.attention_layout()
        labels = block_labels(layout)
        counts = [[(_Counts(_lookback_edges(b["window"], nz)), _Counts(np.linspace(0, 1, ENTROPY_BINS + 1)))
                   for _ in range(b["n_heads"])] for b in layout]
        align = model.align
        tile = max(align, -(-int(tile) // align) * align)
        tiles = [(c, w) for c, w in plan_tiles(ny, nx, tile, model.halo)
                 if ((gy >= c[0]) & (gy < c[1])).any() and ((gx >= c[2]) & (gx < c[3])).any()]
        lo, hi = intensity_range(volume)
        view = NormalizedVolume(volume, lo, hi)
        n_chunks = -(-nz // chunk_slices)
        done = 0
        model.eval()
        for (y0, y1, x0, x1), window in tiles:
            wy0, wy1, wx0, wx1 = window
            ty, tx = gy[(gy >= y0) & (gy < y1)], gx[(gx >= x0) & (gx < x1)]
            region = (slice(int(ty[0]) - wy0, int(ty[-1]) - wy0 + 1, stride),
                      slice(int(tx[0]) - wx0, int(tx[-1]) - wx0 + 1, stride))
            margins = (y0 - wy0, wy1 - y1, x0 - wx0, wx1 - x1)
            cache = model.new_cache(capacity=nz)
            for z0 in range(0, nz, chunk_slices):
                z1 = min(nz, z0 + chunk_slices)
                x = torch.from_numpy(np.ascontiguousarray(_read(view, z0, z1, window), np.float32))[None]
                maps, logits = model.attention_maps(x, z0=z0, region=region, cache=cache, margins=margins,
                                                    with_logits=True)
                if pvol is None:
                    lg = logits[0][:, region[0].start - margins[0]:: stride, region[1].start - margins[2]:: stride]
                    pore = (torch.sigmoid(lg.float()) >= post.threshold).numpy()
                else:
                    pore = _read(pvol, z0, z1, (int(ty[0]), int(ty[-1]) + 1, int(tx[0]), int(tx[-1]) + 1))
                    pore = pore[:, ::stride, ::stride] > 0
                pore = pore[:, : len(ty), : len(tx)].transpose(1, 2, 0)  # (ry, rx, Zq)
                zq = np.arange(z0, z1)
                keep = zq >= 1  # slice 0 sees only itself
                for b, (m, lay) in enumerate(zip(maps, layout)):
                    w = m[0].double().numpy()  # (ry, rx, H, Zq, Zk)
                    zk = z1 - w.shape[-1] + np.arange(w.shape[-1])
                    dist = zq[:, None] - zk[None, :]  # (Zq, Zk)
                    vis = np.minimum(zq + 1, nz if lay["window"] is None else lay["window"])[:, None]
                    for h in range(w.shape[2]):
                        _ent, norm, back = entropy_stats(w[:, :, h], dist, vis[:, 0])
                        c_back, c_norm = counts[b][h]
                        c_back.add(back[..., keep], pore[..., keep])
                        c_norm.add(norm[..., keep], pore[..., keep])
                done += 1
                if progress is not None:
                    progress(done, len(tiles) * n_chunks, "heads")
            del cache
    finally:
        if opened:
            volume.close()
        if p_opened:
            pvol.close()
    heads = []
    for b, lay in enumerate(layout):
        for h, (c_back, c_norm) in enumerate(counts[b]):
            heads.append({"block": lay["name"], "block_label": labels[b], "label": f"{labels[b]}, head {h}",
                          "head": h, "scale": f"1/{lay['scale']}", "window": lay["window"],
                          "lookback": c_back.to_dict(), "normalized_entropy": c_norm.to_dict()})
    first = heads[0]["lookback"]
    n_pore, n_solid = sum(first["pore"]), sum(first["solid"])
    name = Path(scan).name if isinstance(scan, (str, os.PathLike)) else "the scan"
    return {
        "scan": name,
        "shape": [nz, ny, nx],
        "axes": "z, y, x: slices, rows, columns",
        "sample": {"columns": int(len(gy) * len(gx)), "stride": stride, "offset_yx": [oy, ox], "seed": seed,
                   "slices": [1, nz - 1], "voxels": n_pore + n_solid, "pore_voxels": n_pore, "solid_voxels": n_solid},
        "pore_source": said,
        "units": {"lookback": UNITS["lookback"], "normalized_entropy": UNITS["normalized_entropy"],
                  "counts": "sampled voxels per bin", "window": UNITS["window"], "scale": UNITS["scale"]},
        "heads": heads,
    }
