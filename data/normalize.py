"""Intensity normalization shared by reconstruction, training and the baselines.

A scan's grey values (uint8, uint16, float; any offset and gain) are mapped so that its robust
range goes to [0, 1]: ``x' = (x - lo) / (hi - lo)`` with ``lo``/``hi`` the 0.5th and 99.5th
percentiles of a subsample of the voxels. Values a little outside the range are kept; values far
outside it (more than one whole range below ``lo`` or above ``hi``: a metal inclusion, a block of
1e30 from a failed reconstruction) are clipped to ``[-1, 2]``, so that no grey value can overflow the
model or pull a histogram threshold away from the grey values that hold the structure
(:func:`count_clipped` says how many were). The same function is used on simulated training scans,
so the model sees what it was trained on.
"""

from __future__ import annotations

import warnings

import numpy as np

from ctpore.errors import CtporeWarning
from ctpore.progress import ProgressFn

#: Percentiles that define the robust intensity range.
LOW_PERCENTILE = 0.5
HIGH_PERCENTILE = 99.5

#: Grey values farther than this many times the width of the middle 80% of the grey values beyond
#: it (a block of 1e30, a fill value of -3.4e38) are left out when the robust range is found: so
#: many of them (more than 0.5% of the scan) would otherwise become the range itself. No scan of
#: a real material comes near: its phases lie within a few widths of each other.
FAR_OUTLIER = 1000.0

#: Normalized grey values are clipped to this interval: one whole robust range beyond each end.
CLIP_LOW, CLIP_HIGH = -1.0, 2.0


def _subsample(n_total: int, n_max: int) -> np.ndarray:
    """Evenly spaced indices, at most ``n_max`` of ``range(n_total)`` (deterministic)."""
    if n_total <= n_max:
        return np.arange(n_total)
    return np.unique(np.linspace(0, n_total - 1, n_max).round().astype(np.int64))


def intensity_range(
    volume,
    max_slices: int = 64,
    max_pixels_per_slice: int = 65536,
    progress: ProgressFn = None,
) -> tuple[float, float]:
    """Robust intensity range ``(lo, hi)`` of a volume, read slice by slice (:func:`robust_range`,
    made usable for division: a constant volume gives ``(c, c + 1)``).

    Parameters
    ----------
    volume : array_like or Scan
        Anything of shape ``(Z, Y, X)`` that can be sliced along Z (``volume[z0:z1]``).
    max_slices : int
        At most this many slices, evenly spaced along Z, are read.
    max_pixels_per_slice : int
        Each slice is subsampled on a regular grid to at most about this many pixels.
    progress : callable, optional
        ``progress(done, total, "intensity range")``.

    Returns
    -------
    (float, float)
        The 0.5th and 99.5th percentiles; ``hi > lo`` always.

    Examples
    --------
    >>> v = np.arange(1000, dtype=np.float32).reshape(10, 10, 10)
    >>> lo, hi = intensity_range(v)
    >>> bool(4 < lo < 6), bool(993 < hi < 995)
    (True, True)
    """
    lo, hi = robust_range(volume, max_slices, max_pixels_per_slice, progress)
    if not hi > lo:
        hi = lo + 1.0
    return lo, hi


def robust_range(
    volume,
    max_slices: int = 64,
    max_pixels_per_slice: int = 65536,
    progress: ProgressFn = None,
    outside=None,
) -> tuple[float, float]:
    """The 0.5th and 99.5th percentiles of a subsample of the volume (equal for a constant one),
    far outliers left out (:data:`FAR_OUTLIER`); parameters as :func:`intensity_range`.
    ``outside`` (bool ``(Z, Y, X)``, sliceable along Z, True outside the sample): only the sample's
    voxels count.

    Examples
    --------
    >>> v = np.tile(np.arange(100, dtype=np.float32), (10, 10, 1)); v[:, :, :3] = 1e30  # 3% garbage
    >>> lo, hi = robust_range(v)
    >>> bool(3 <= lo < 4), bool(98 < hi <= 99)
    (True, True)
    """
    z_total, y, x = (int(s) for s in volume.shape)
    zs = _subsample(z_total, max_slices)
    step = max(1, int(np.ceil(np.sqrt(y * x / max_pixels_per_slice))))
    samples = []
    for i, z in enumerate(zs):
        sl = np.asarray(volume[int(z) : int(z) + 1], dtype=np.float32)[0]
        picked = sl[::step, ::step]
        if outside is not None:
            picked = picked[~np.asarray(outside[int(z) : int(z) + 1])[0][::step, ::step]]
        samples.append(picked.ravel())
        if progress is not None:
            progress(i + 1, len(zs), "intensity range")
    values = np.concatenate(samples)
    if values.size == 0:  # no sample voxel in the slices looked at
        values = np.zeros(1, np.float32)
    p10, p90 = np.percentile(values, [10.0, 90.0])
    width = float(p90) - float(p10)
    if width > 0:  # leave out far outliers, which would otherwise stretch the range (see FAR_OUTLIER)
        near = (values >= p10 - FAR_OUTLIER * width) & (values <= p90 + FAR_OUTLIER * width)
        if not near.all():
            values = values[near]
    lo, hi = np.percentile(values, [LOW_PERCENTILE, HIGH_PERCENTILE])
    return float(lo), float(hi)


def normalize(array: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Map ``[lo, hi]`` to ``[0, 1]`` (float32), values clipped to ``[CLIP_LOW, CLIP_HIGH]``.

    A value that overflows float32 on the way (``1e30 - lo`` times a large scale) becomes ±inf and
    is clipped like any far value, so any finite input gives a finite output.

    Examples
    --------
    >>> normalize(np.array([0.0, 5.0, 10.0, 1e30, -1e30], np.float32), 0.0, 10.0).tolist()
    [0.0, 0.5, 1.0, 2.0, -1.0]
    """
    out = np.asarray(array).astype(np.float32)
    with np.errstate(over="ignore"):
        out -= np.float32(lo)
        out *= np.float32(1.0 / (hi - lo))
    np.clip(out, CLIP_LOW, CLIP_HIGH, out=out)
    return out


def clip_bounds(lo: float, hi: float) -> tuple[float, float]:
    """The raw grey values that :func:`normalize` maps to ``CLIP_LOW`` and ``CLIP_HIGH``."""
    return lo + CLIP_LOW * (hi - lo), lo + CLIP_HIGH * (hi - lo)


def count_clipped(volume, lo: float, hi: float, chunk_bytes: int = 32 << 20, progress: ProgressFn = None) -> int:
    """How many voxels of ``volume`` :func:`normalize` clips (one pass over the slices, about
    ``chunk_bytes`` of float32 at a time).

    Examples
    --------
    >>> v = np.zeros((4, 4, 4), np.float32); v[0, 0, :2] = 1e30; v[1, 1, 1] = -50.0
    >>> count_clipped(v, 0.0, 10.0)
    3
    """
    a, b = clip_bounds(lo, hi)
    n = 0
    nz, ny, nx = (int(d) for d in volume.shape)
    chunk_slices = max(1, chunk_bytes // (4 * ny * nx))
    for z0 in range(0, nz, chunk_slices):
        block = np.asarray(volume[z0 : min(nz, z0 + chunk_slices)])
        n += int(np.count_nonzero((block < a) | (block > b)))
        if progress is not None:
            progress(min(nz, z0 + chunk_slices), nz, "checking grey values")
    return n


def check_clipped(volume, lo: float, hi: float, progress: ProgressFn = None) -> int:
    """:func:`count_clipped`, with a :class:`CtporeWarning` when any voxel is clipped."""
    n = count_clipped(volume, lo, hi, progress=progress)
    if n:
        warn_clipped(n, int(np.prod(volume.shape)), lo, hi)
    return n


def warn_clipped(n: int, total: int, lo: float, hi: float) -> None:
    """Say that ``n`` of ``total`` voxels lay far outside the scan's robust grey range."""
    a, b = clip_bounds(lo, hi)
    warnings.warn(f"{n} voxel(s) ({100.0 * n / max(1, total):.3g}% of the scan) lie far outside its grey-value range "
                  f"({lo:g} to {hi:g}): below {a:g} or above {b:g}; they were clipped to those values before "
                  "segmentation. Check the scan for metal, reconstruction artefacts or a wrong data type",
                  CtporeWarning, stacklevel=3)


class NormalizedVolume:
    """A lazy, normalized view of a volume: ``view[z0:z1]`` reads and normalizes those slices.

    Parameters
    ----------
    volume : array_like or Scan
        Source of shape ``(Z, Y, X)``, sliceable along Z.
    lo, hi : float
        Intensity range mapped to [0, 1] (see :func:`intensity_range`).
    """

    def __init__(self, volume, lo: float, hi: float):
        self.volume = volume
        self.lo = float(lo)
        self.hi = float(hi)
        self.shape = tuple(int(s) for s in volume.shape)
        #: Whether any value read so far reached the clip bounds (then :meth:`clipped_voxels`
        #: counts them exactly, in one more pass; a scan without such values never pays for it).
        self.saw_clipping = False

    def _norm(self, raw) -> np.ndarray:
        out = normalize(raw, self.lo, self.hi)
        if not self.saw_clipping and out.size and (out.min() <= CLIP_LOW or out.max() >= CLIP_HIGH):
            self.saw_clipping = True
        return out

    def clipped_voxels(self, progress: ProgressFn = None) -> int:
        """How many voxels of the source are clipped (0 without a pass when none was seen), with a
        warning when there are any (:func:`check_clipped`). Call it after the whole volume was read."""
        return check_clipped(self.volume, self.lo, self.hi, progress) if self.saw_clipping else 0

    def __len__(self) -> int:
        return self.shape[0]

    def read_window(self, z0: int, z1: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """Slices ``z0:z1`` cropped to rows ``y0:y1`` and columns ``x0:x1``, normalized; reads only
        the window where the source can (``read_window``)."""
        if hasattr(self.volume, "read_window"):
            return self._norm(self.volume.read_window(z0, z1, y0, y1, x0, x1))
        return self._norm(np.asarray(self.volume[z0:z1])[:, y0:y1, x0:x1])

    def __getitem__(self, key) -> np.ndarray:
        if not isinstance(key, slice):
            raise TypeError("NormalizedVolume supports slicing along Z only, e.g. view[z0:z1]")
        start, stop, step = key.indices(self.shape[0])
        if step != 1:
            raise TypeError("NormalizedVolume supports contiguous slices only (step 1)")
        return self._norm(self.volume[start:stop])


def normalize_volume(volume: np.ndarray) -> np.ndarray:
    """Normalize a whole in-memory volume with its own robust range (see :func:`intensity_range`)."""
    lo, hi = intensity_range(volume)
    return normalize(volume, lo, hi)


def has_contrast(lo: float, hi: float) -> bool:
    """Whether the raw robust range ``(lo, hi)`` of :func:`robust_range` holds any contrast.

    A scan whose middle 99% of grey values are equal (a constant scan, a blank) shows no
    structure, and nothing in it should be called pore.

    Examples
    --------
    >>> has_contrast(*robust_range(np.full((4, 8, 8), 1000.0))), has_contrast(0.0, 0.5)
    (False, True)
    """
    return (hi - lo) > 1e-6 * max(1.0, abs(lo), abs(hi))


def warn_no_contrast(level: float) -> None:
    """Say that a scan without contrast got no pores (rather than invent some)."""
    warnings.warn(f"the scan has no contrast (the middle 99% of its grey values are all {level:g}): "
                  "nothing was segmented as pore; check that this is the scan you meant", CtporeWarning,
                  stacklevel=3)
