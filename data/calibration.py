"""Calibrated pore probabilities: a monotone map fitted on validation scans (isotonic regression).

A network trained with soft Dice (and clDice) beside cross-entropy does not give probabilities
that mean what they say: where such a network is unsure, its raw probabilities lean towards 0 or 1
more than the observed pore fractions do. Dice rewards the minority class for leaning towards 1 wherever it is
unsure. A probability map that users read as confidence, and the MSE that scores it, need the
frequencies right. So each learned model ships with a calibration map fitted on its own
validation scans (never the benchmark's):

* the raw probabilities are binned (:data:`N_BINS` equal bins on [0, 1]);
* in each bin, the mean raw probability and the fraction of true pore voxels are taken;
* those fractions are made non-decreasing by pool-adjacent-violators (weighted by voxel count):
  the isotonic regression of Zadrozny & Elkan (2002), which minimises the squared error among all
  monotone maps that are constant within a bin.

It is applied by linear interpolation between the bins' mean raw probabilities (constant beyond
the first and last). The map is monotone, so the ranking of voxels is unchanged. The binary pore
volume is thresholded on the *raw* probability, as the speck size and threshold were chosen, so a
calibration changes the probability map only, never the pores.

Examples
--------
>>> rng = np.random.default_rng(0)
>>> p = rng.random(200_000).astype(np.float32)
>>> t = (rng.random(p.size) < p**2).astype(np.uint8)   # the model says p, the truth is p^2
>>> cal = fit_calibration([(p, t)])
>>> bool(abs(float(apply_calibration(np.float32([0.5]), cal)[0]) - 0.25) < 0.03)
True
"""

from __future__ import annotations

from typing import Iterable, Optional

import numpy as np

__all__ = ["N_BINS", "fit_calibration", "apply_calibration", "isotonic",
           "ReliabilityCounter"]

#: Equal-width bins of the raw probability in which the pore frequency is measured.
N_BINS = 50

#: Voxels mapped per chunk by :func:`apply_calibration` (bounds its float64 temporaries).
_CHUNK = 1 << 22


def isotonic(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least-squares non-decreasing fit to ``y`` (pool-adjacent-violators).

    Parameters
    ----------
    y, w : numpy.ndarray
        Values and positive weights, 1D, same length.

    Returns
    -------
    numpy.ndarray
        float64, non-decreasing, minimising ``sum(w * (fit - y)**2)``.

    Examples
    --------
    >>> isotonic(np.array([1.0, 3.0, 2.0, 4.0]), np.ones(4)).tolist()
    [1.0, 2.5, 2.5, 4.0]
    """
    y = np.asarray(y, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    vals: list = []
    wts: list = []
    sizes: list = []
    for yi, wi in zip(y, w):
        vals.append(yi)
        wts.append(wi)
        sizes.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:  # pool the last two blocks
            wsum = wts[-2] + wts[-1]
            v = (vals[-2] * wts[-2] + vals[-1] * wts[-1]) / wsum
            n = sizes[-2] + sizes[-1]
            del vals[-1], wts[-1], sizes[-1]
            vals[-1], wts[-1], sizes[-1] = v, wsum, n
    return np.repeat(np.array(vals), sizes)


def fit_calibration(pairs: Iterable[tuple[np.ndarray, np.ndarray]], n_bins: int = N_BINS) -> dict:
    """Fit the calibration map on ``(probability, truth)`` pairs (any shapes, truth 0/1).

    Returns
    -------
    dict
        ``{"x": [...], "y": [...], "n": [...]}``: the bins' mean raw probability (increasing), the
        calibrated probability there, and the voxel count of each non-empty bin. JSON-ready.
    """
    counter = ReliabilityCounter(n_bins)
    for prob, truth in pairs:
        counter.add(prob, truth)
    keep = counter.count > 0
    if not keep.any():
        raise ValueError("no voxels to fit a calibration on")
    c = counter.count[keep]
    x, f = counter.sum_p[keep] / c, counter.sum_t[keep] / c
    y = isotonic(f, c)
    return {"x": [float(v) for v in x], "y": [float(v) for v in y], "n": [int(v) for v in c]}


def apply_calibration(prob: np.ndarray, cal: Optional[dict], out: Optional[np.ndarray] = None) -> np.ndarray:
    """Map raw probabilities through a calibration (None: unchanged). float32, chunked.

    ``out=prob`` maps in place.
    """
    prob = np.asarray(prob)
    if out is None:
        out = np.empty(prob.shape, dtype=np.float32)
    if cal is None:
        if out is not prob:
            out[...] = prob
        return out
    x = np.asarray(cal["x"], dtype=np.float64)
    y = np.asarray(cal["y"], dtype=np.float64)
    src, dst = prob.reshape(-1), out.reshape(-1)
    for i in range(0, src.size, _CHUNK):
        dst[i:i + _CHUNK] = np.interp(src[i:i + _CHUNK], x, y)
    return out


class ReliabilityCounter:
    """Accumulates how often voxels are pore at each predicted probability (reliability diagram).

    ``add(prob, truth)`` any number of times; then :meth:`summary` gives, over ``n_bins`` equal
    bins of the probability, each bin's mean probability, observed pore fraction and voxel count,
    the expected calibration error (the voxel-weighted mean of |mean probability - pore fraction|
    over bins) and the largest such gap over bins holding at least ``min_count`` voxels.

    Examples
    --------
    >>> r = ReliabilityCounter(n_bins=2)
    >>> r.add(np.array([0.1, 0.1, 0.9, 0.9]), np.array([0, 0, 1, 0]))
    >>> s = r.summary(); round(s["ece"], 3), round(s["max_gap"], 3)
    (0.25, 0.4)
    """

    def __init__(self, n_bins: int = 10):
        self.n_bins = int(n_bins)
        self.count = np.zeros(self.n_bins)
        self.sum_p = np.zeros(self.n_bins)
        self.sum_t = np.zeros(self.n_bins)

    def add(self, prob: np.ndarray, truth: np.ndarray) -> None:
        p = np.asarray(prob, dtype=np.float64).ravel()
        t = np.asarray(truth, dtype=np.float64).ravel()
        if p.shape != t.shape:
            raise ValueError(f"probability and truth differ in size: {p.size} vs {t.size}")
        idx = np.clip((p * self.n_bins).astype(np.int64), 0, self.n_bins - 1)
        self.count += np.bincount(idx, minlength=self.n_bins)
        self.sum_p += np.bincount(idx, p, minlength=self.n_bins)
        self.sum_t += np.bincount(idx, t, minlength=self.n_bins)

    def summary(self, min_count: int = 1000) -> dict:
        k = self.count > 0
        if not k.any():
            return {"ece": float("nan"), "max_gap": float("nan"), "bins": []}
        c = self.count[k]
        mp, ft = self.sum_p[k] / c, self.sum_t[k] / c
        gap = np.abs(mp - ft)
        big = c >= min(min_count, c.max())
        return {"ece": float(np.sum(c * gap) / c.sum()), "max_gap": float(gap[big].max()),
                "bins": [{"p": float(a), "pore": float(b), "n": int(n)} for a, b, n in zip(mp, ft, c)]}
