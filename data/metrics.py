"""Metrics of a pore volume: porosity, Euler number, connectivity density, and comparisons.

A pore volume is a binary ``(Z, Y, X)`` array, 1 = pore (void), 0 = solid (the PoreSpy
convention). :func:`volume_metrics` gives what ``ctpore reconstruct`` reports about one volume;
:func:`comparison_metrics` compares a prediction with a ground truth. The topology itself
(Euler numbers, components, connectivity) lives in :mod:`ctpore.data.topology` and the input
checks in :mod:`ctpore.data.binary`; their public functions are also importable from here.

Examples
--------
>>> import numpy as np
>>> cube = np.zeros((5, 5, 5), np.uint8); cube[1:4, 1:4, 1:4] = 1
>>> m = volume_metrics(cube)
>>> m["porosity"], m["euler_number"], m["n_pores"]
(0.216, 1, 1)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ctpore.data.binary import as_volume, check_binary, check_spacing
from ctpore.data.topology import (
    SLAB_VOXELS,
    betti_numbers,
    configuration_histogram,
    connectivity_density,
    connectivity_from_euler,
    connectivity_index,
    euler_from_histogram,
    euler_number,
    n_components,
    per_volume,
)
from ctpore.errors import InputError, NonFiniteError

__all__ = [
    "check_binary",
    "porosity",
    "euler_number",
    "n_components",
    "connectivity_index",
    "connectivity_density",
    "volume_metrics",
    "comparison_metrics",
    "betti_comparison",
    "betti_numbers",
]


def porosity(pores: np.ndarray) -> float:
    """Fraction of the voxels of a binary ``(Z, Y, X)`` volume that are pore (== 1), in [0, 1].

    Examples
    --------
    >>> porosity(np.array([[[1, 0, 0, 1]]]))
    0.5
    """
    vol = as_volume(pores)
    return float(np.count_nonzero(vol) / vol.size)


def volume_metrics(
    pores: np.ndarray, spacing_mm: Sequence[float] = (1.0, 1.0, 1.0)
) -> dict[str, float | int]:
    """All single-volume metrics of a binary ``(Z, Y, X)`` pore volume with voxels of ``spacing_mm``.

    Returns
    -------
    dict
        Plain Python numbers (JSON-serialisable): ``porosity`` (float), ``euler_number`` (int, 26-connected pores), ``euler_number_6``
        (int, 6-connected pores), ``connectivity_density_per_mm3`` (float, BoneJ, see
        :func:`connectivity_density`), ``n_pores`` (int, 26-connected pore components).
    """
    s = check_spacing(spacing_mm)
    vol = as_volume(pores)
    hist = configuration_histogram(vol)  # one pass serves both Euler numbers
    chi26 = euler_from_histogram(hist, 26)
    return {
        "porosity": float(np.count_nonzero(vol) / vol.size),
        "euler_number": chi26,
        "euler_number_6": euler_from_histogram(hist, 6),
        "connectivity_density_per_mm3": per_volume(connectivity_from_euler(vol, chi26), vol.shape, s),
        "n_pores": n_components(vol, 26),
    }


def betti_comparison(pred: np.ndarray, truth: np.ndarray) -> dict[str, int | float]:
    """Betti numbers of a prediction and a truth side by side, with relative errors.

    Keys ``b{k}_pred``, ``b{k}_truth`` and ``b{k}_error_rel`` = |pred - truth| / max(truth, 1)
    for k = 0 (pores), 1 (tunnels), 2 (cavities); see :func:`~ctpore.data.topology.betti_numbers`.
    An Euler error can cancel (pores lost against tunnels lost); these cannot.

    Examples
    --------
    >>> t = np.zeros((3, 5, 5), np.uint8); t[1, 1:4, 1:4] = 1; t[1, 2, 2] = 0   # a ring: b1 = 1
    >>> p = t.copy(); p[1, 2, 2] = 1                                          # filled: b1 = 0
    >>> m = betti_comparison(p, t); m["b1_truth"], m["b1_pred"], m["b1_error_rel"]
    (1, 0, 1.0)
    """
    bp, bt = betti_numbers(pred), betti_numbers(truth)
    out: dict[str, int | float] = {}
    for k in range(3):
        out[f"b{k}_pred"], out[f"b{k}_truth"] = int(bp[k]), int(bt[k])
        out[f"b{k}_error_rel"] = float(abs(bp[k] - bt[k]) / max(bt[k], 1))
    return out


def comparison_metrics(
    pred: np.ndarray, truth: np.ndarray, prob: np.ndarray | None = None, betti: bool = False
) -> dict[str, float | int]:
    """Compare a predicted pore volume with the ground truth.

    Parameters
    ----------
    pred : numpy.ndarray
        Binary predicted ``(Z, Y, X)`` volume, 1 = pore.
    truth : numpy.ndarray
        Binary ground-truth volume of the same shape.
    prob : numpy.ndarray, optional
        Pore probability in [0, 1], same shape. When given, the MSE is computed from it
        instead of from ``pred``.

    Returns
    -------
    dict
        ``mse`` = mean((prob or pred) - truth)², ``dice`` = 2|P∩T| / (|P| + |T|),
        ``iou`` = |P∩T| / |P∪T| (both 1.0 when pred and truth have no pore at all: they agree
        perfectly), ``porosity_error`` = |φ_pred - φ_truth|, ``euler_error_rel`` =
        |χ_pred - χ_truth| / max(|χ_truth|, 1) (26-connectivity), ``euler_number_pred``,
        ``euler_number_truth``, ``porosity_pred``, ``porosity_truth``. Plain Python numbers.
        With ``betti``, also the Betti numbers of both and their relative errors
        (:func:`betti_comparison`).

    Raises
    ------
    InputError
        If shapes differ (the message gives both), a volume is not binary, or ``prob`` has
        values outside [0, 1].
    NonFiniteError
        If ``prob`` holds NaN or Inf.

    Examples
    --------
    >>> t = np.array([[[1, 1, 0, 0]]]); p = np.array([[[1, 0, 1, 0]]])
    >>> m = comparison_metrics(p, t)
    >>> m["dice"], m["mse"]
    (0.5, 0.5)
    """
    pred_a, truth_a = np.asarray(pred), np.asarray(truth)
    if pred_a.shape != truth_a.shape:
        raise InputError(
            f"prediction and truth must have the same shape, got prediction {pred_a.shape} "
            f"and truth {truth_a.shape}"
        )
    p = as_volume(pred_a, "prediction")
    t = as_volume(truth_a, "truth")
    if prob is not None:
        prob_a = np.asarray(prob)
        if prob_a.shape != t.shape:
            raise InputError(
                f"probability and truth must have the same shape, got probability "
                f"{prob_a.shape} and truth {t.shape}"
            )
        if not np.issubdtype(prob_a.dtype, np.number) and prob_a.dtype != np.bool_:
            raise InputError(f"probability must be numeric, got dtype {prob_a.dtype}")
        mse = _mse(prob_a, t)
    else:
        mse = float(np.count_nonzero(p != t) / t.size)  # (0/1 - 0/1)^2 is 1 where they differ

    n_p, n_t = np.count_nonzero(p), np.count_nonzero(t)
    inter = int(np.count_nonzero(p & t))
    union = n_p + n_t - inter
    dice = 1.0 if n_p + n_t == 0 else 2.0 * inter / (n_p + n_t)
    iou = 1.0 if union == 0 else inter / union
    phi_p, phi_t = n_p / t.size, n_t / t.size
    chi_p = euler_from_histogram(configuration_histogram(p), 26)
    chi_t = euler_from_histogram(configuration_histogram(t), 26)
    out = {
        "mse": mse,
        "dice": float(dice),
        "iou": float(iou),
        "porosity_error": float(abs(phi_p - phi_t)),
        "euler_error_rel": float(abs(chi_p - chi_t) / max(abs(chi_t), 1)),
        "euler_number_pred": chi_p,
        "euler_number_truth": chi_t,
        "porosity_pred": float(phi_p),
        "porosity_truth": float(phi_t),
    }
    if betti:
        out.update(betti_comparison(p, t))
    return out


def _mse(prob: np.ndarray, truth: np.ndarray) -> float:
    """Mean of (prob - truth)² in float64, slab by slab along z to bound memory."""
    total = 0.0
    plane = max(1, truth.shape[1] * truth.shape[2])
    step = max(1, SLAB_VOXELS // plane)
    for z0 in range(0, truth.shape[0], step):
        q = prob[z0 : z0 + step].astype(np.float64)
        if not np.isfinite(q).all():
            n = int(np.count_nonzero(~np.isfinite(q)))
            raise NonFiniteError(f"probability volume holds NaN/Inf (at least {n} voxels)")
        if q.min() < 0.0 or q.max() > 1.0:
            raise InputError(
                f"probability must lie in [0, 1], found values from {q.min():g} to {q.max():g}"
            )
        d = q - truth[z0 : z0 + step]
        total += float(np.einsum("ijk,ijk->", d, d))
    return total / truth.size
