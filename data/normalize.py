"""Intensity normalization shared by reconstruction, training and the baselines.

A scan's grey values (uint8, uint16, float; any offset and gain) are mapped so that its robust
range goes to [0, 1]: ``x' = (x - lo) / (hi - lo)`` with ``lo``/``hi`` the 0.5th and 99.5th
percentiles of a subsample of the voxels. Values outside the range are kept (not clipped), so
nothing is lost. The same function is used on simulated training scans, so the model sees what it
was trained on.
"""

from __future__ import annotations

import warnings

import numpy as np

from ctpore.errors import CtporeWarning
from ctpore.progress import ProgressFn

#: Percentiles that define the robust intensity range.
LOW_PERCENTILE = 0.5
HIGH_PERCENTILE = 99.5


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
) -> tuple[float, float]:
    """The 0.5th and 99.5th percentiles of a subsample of the volume (equal for a constant one);
    parameters as :func:`intensity_range`."""
    z_total, y, x = (int(s) for s in volume.shape)
    zs = _subsample(z_total, max_slices)
    step = max(1, int(np.ceil(np.sqrt(y * x / max_pixels_per_slice))))
    samples = []
    for i, z in enumerate(zs):
        sl = np.asarray(volume[int(z) : int(z) + 1], dtype=np.float32)[0]
        samples.append(sl[::step, ::step].ravel())
        if progress is not None:
            progress(i + 1, len(zs), "intensity range")
    values = np.concatenate(samples)
    lo, hi = np.percentile(values, [LOW_PERCENTILE, HIGH_PERCENTILE])
    return float(lo), float(hi)


def normalize(array: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Map ``[lo, hi]`` to ``[0, 1]`` (float32, not clipped)."""
    out = np.asarray(array, dtype=np.float32) - np.float32(lo)
    out *= np.float32(1.0 / (hi - lo))
    return out


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

    def __len__(self) -> int:
        return self.shape[0]

    def read_window(self, z0: int, z1: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """Slices ``z0:z1`` cropped to rows ``y0:y1`` and columns ``x0:x1``, normalized; reads only
        the window where the source can (``read_window``)."""
        if hasattr(self.volume, "read_window"):
            return normalize(self.volume.read_window(z0, z1, y0, y1, x0, x1), self.lo, self.hi)
        return normalize(np.asarray(self.volume[z0:z1])[:, y0:y1, x0:x1], self.lo, self.hi)

    def __getitem__(self, key) -> np.ndarray:
        if not isinstance(key, slice):
            raise TypeError("NormalizedVolume supports slicing along Z only, e.g. view[z0:z1]")
        start, stop, step = key.indices(self.shape[0])
        if step != 1:
            raise TypeError("NormalizedVolume supports contiguous slices only (step 1)")
        return normalize(self.volume[start:stop], self.lo, self.hi)


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
