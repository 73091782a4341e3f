"""The classical methods users run instead of PoreFormer: global Otsu and the Fiji pipeline.

``otsu``          a global Otsu threshold of the grey values, pores below it.
``filtered_otsu`` the classical pipeline people run in Fiji: a 3x3x3 median filter, a global Otsu
                  threshold, then removal of specks (pore components and solid islands smaller
                  than ``min_size`` voxels; pores 26-connected, solid 6-connected, as ctpore counts topology).

Both stream the volume in chunks of slices (with a one-slice halo for the median filter), so only
the binary result (one byte per voxel) is held whole. They take volumes already normalized by
:mod:`ctpore.data.normalize` (any monotone scaling gives the same segmentation).
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage
from skimage.filters import threshold_otsu

from ctpore.progress import ProgressFn

__all__ = ["N_BINS", "OTSU_MIN_SIZE", "otsu_segment", "clean_specks"]


#: Number of histogram bins used for the streamed Otsu threshold.
N_BINS = 1024

#: Speck size (voxels) removed by the Fiji pipeline (``otsu`` in ``ctpore reconstruct``).
OTSU_MIN_SIZE = 10


def _chunks(n: int, size: int):
    for start in range(0, n, size):
        yield start, min(n, start + size)


def _median_chunk(volume, start: int, stop: int, size: int) -> np.ndarray:
    """3D median filter of slices ``start:stop`` using a halo of ``size // 2`` slices."""
    r = size // 2
    z = volume.shape[0]
    lo, hi = max(0, start - r), min(z, stop + r)
    block = np.asarray(volume[lo:hi], dtype=np.float32)
    filt = ndimage.median_filter(block, size=size, mode="nearest")
    return filt[start - lo : start - lo + (stop - start)]


def otsu_segment(
    volume,
    median_size: int = 0,
    min_size: int = 0,
    chunk_slices: int = 32,
    progress: ProgressFn = None,
    out=None,
) -> tuple[np.ndarray | None, float]:
    """Segment pores (dark) with a global Otsu threshold, optionally filtered and cleaned.

    Parameters
    ----------
    volume : array_like or lazy volume
        ``(Z, Y, X)`` grey values, sliceable along Z.
    median_size : int
        Width of the cubic median filter applied first (0 or 1: none; 3 is Fiji's radius-1 median).
    min_size : int
        Pore components (26-connected) and solid islands (6-connected) smaller than this many
        voxels are removed (0: keep everything).
    chunk_slices : int
        Slices read at a time.
    progress : callable, optional
        ``progress(done, total, stage)``.
    out : array-like, optional
        Where to write the pores instead, chunk by chunk, as 0.0/1.0
        (``out[z0:z1, 0:Y, 0:X] = block``; e.g. a volume spilled to disk); ``min_size`` must then
        be 0 (speck removal is the caller's, slab by slab), and None is returned for the pores.

    Returns
    -------
    pores : ndarray of uint8, shape (Z, Y, X), or None
        1 = pore, 0 = solid (None when written to ``out``).
    threshold : float
        The Otsu threshold, in the units of ``volume``.

    Examples
    --------
    >>> v = np.ones((4, 8, 8), np.float32); v[:, 2:5, 2:5] = 0.0
    >>> pores, t = otsu_segment(v)
    >>> int(pores.sum()), bool(0.0 < t < 1.0)
    (36, True)
    """
    z, y, x = (int(s) for s in volume.shape)
    chunks = list(_chunks(z, chunk_slices))
    n_steps = 2 * len(chunks) + (1 if min_size > 1 else 0)
    step = 0

    def read(start: int, stop: int) -> np.ndarray:
        if median_size > 1:
            return _median_chunk(volume, start, stop, median_size)
        return np.asarray(volume[start:stop], dtype=np.float32)

    # Pass 1: the global range, then the histogram (two cheap streaming passes folded in one
    # by histogramming against the range of a first look at every chunk's extremes).
    vmin, vmax = np.inf, -np.inf
    cache: list[np.ndarray] = []
    keep_cache = z * y * x * 4 <= 512 * 2**20  # small volumes: avoid filtering twice
    for start, stop in chunks:
        block = read(start, stop)
        vmin, vmax = min(vmin, float(block.min())), max(vmax, float(block.max()))
        if keep_cache:
            cache.append(block)
        step += 1
        if progress is not None:
            progress(step, n_steps, "otsu: range")
    if out is not None and min_size > 1:
        raise ValueError("otsu_segment writes to out without speck removal: remove specks slab by slab")
    if not vmax > vmin:
        # A constant volume has no threshold; call it all solid.
        if out is not None:
            for start, stop in chunks:
                out[start:stop, 0:y, 0:x] = np.zeros((stop - start, y, x), np.float32)
            return None, vmin
        return np.zeros((z, y, x), np.uint8), vmin
    counts = np.zeros(N_BINS, np.int64)
    edges = np.linspace(vmin, vmax, N_BINS + 1)
    for i, (start, stop) in enumerate(chunks):
        block = cache[i] if keep_cache else read(start, stop)
        counts += np.histogram(block, bins=edges)[0]
    centers = 0.5 * (edges[:-1] + edges[1:])
    threshold = float(threshold_otsu(hist=(counts, centers)))

    pores = np.empty((z, y, x), np.uint8) if out is None else None
    for i, (start, stop) in enumerate(chunks):
        block = cache[i] if keep_cache else read(start, stop)
        if out is None:
            pores[start:stop] = block <= threshold
        else:
            out[start:stop, 0:y, 0:x] = (block <= threshold).astype(np.float32)
        step += 1
        if progress is not None:
            progress(step, n_steps, "otsu: threshold")
    if min_size > 1:
        pores = clean_specks(pores, min_size)
        step += 1
        if progress is not None:
            progress(step, n_steps, "otsu: specks")
    return pores, threshold


def clean_specks(pores: np.ndarray, min_size: int) -> np.ndarray:
    """Remove pore components (26-connected) and solid islands (6-connected) under ``min_size`` voxels.

    Examples
    --------
    >>> p = np.zeros((5, 5, 5), np.uint8); p[2, 2, 2] = 1
    >>> int(clean_specks(p, 2).sum())
    0
    >>> int(clean_specks(1 - p, 2).sum())  # a one-voxel solid island is filled
    125
    """
    b = pores.astype(bool)
    b = _drop_small(b, min_size, ndimage.generate_binary_structure(3, 3))
    b = ~_drop_small(~b, min_size, ndimage.generate_binary_structure(3, 1))
    return b.astype(np.uint8)


def _drop_small(b: np.ndarray, min_size: int, structure: np.ndarray) -> np.ndarray:
    """``b`` without its components smaller than ``min_size`` voxels."""
    labels, n = ndimage.label(b, structure=structure)
    if n == 0:
        return b
    sizes = np.bincount(labels.ravel())
    small = sizes < min_size
    small[0] = False
    return b & ~small[labels]
