"""Metrics of a pore volume: porosity, Euler and Betti numbers, connectivity density, comparisons.

A pore volume is a binary ``(Z, Y, X)`` array, 1 = pore (void), 0 = solid (the PoreSpy
convention). Every metric is computed by one :class:`MetricsAccumulator`, fed slab by slab along z
(the pores, and optionally the probability map and a ground truth), so a scan of any size is
measured without being held: ``ctpore reconstruct`` feeds it the slabs it writes, and
:func:`volume_metrics` / :func:`comparison_metrics` feed it a whole in-memory volume. The figures are
exact either way. The topology itself lives in :mod:`ctpore.data.topology` (whole volumes),
:mod:`ctpore.data.connectivity` (BoneJ's connectivity) and :mod:`ctpore.data.slabs` (slab by slab).

A metric is a :class:`Metric`: a key and a function of the accumulator (and, for a metric that needs
state of its own, an ``add`` hook that sees every slab). Adding one is a function and one
:func:`register_metric` line; the order of :data:`METRICS` is the order of the keys in the metrics
file. This module is the public place of them all: the registry lives in
:mod:`ctpore.data.metric_registry`, the accumulator in :mod:`ctpore.data.accumulator`, and importing
this module registers the built-in metrics below, first and in the metrics file's order.

Examples
--------
>>> import numpy as np
>>> cube = np.zeros((5, 5, 5), np.uint8); cube[1:4, 1:4, 1:4] = 1
>>> m = volume_metrics(cube)
>>> m["porosity"], m["euler_number"], m["n_pores"], m["n_tunnels"], m["n_cavities"]
(0.216, 1, 1, 0, 0)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ctpore.data.accumulator import MetricsAccumulator
from ctpore.data.binary import as_volume, check_binary
from ctpore.data.connectivity import connectivity_density, connectivity_index
from ctpore.data.analysis_keys import HEADLINE as ANALYSIS_HEADLINE
from ctpore.data.analysis_keys import analysis_keys
from ctpore.data.metric_registry import METRICS, Metric, register_metric, summary_keys
from ctpore.data.slabs import StreamingTopology
from ctpore.data.topology import SLAB_VOXELS, betti_numbers, euler_number, n_components
from ctpore.errors import InputError

__all__ = [
    "MSE_OF_BINARY",
    "MSE_OF_PROBABILITY",
    "summary_keys",
    "check_binary",
    "porosity",
    "euler_number",
    "n_components",
    "connectivity_index",
    "connectivity_density",
    "betti_numbers",
    "Metric",
    "METRICS",
    "register_metric",
    "MetricsAccumulator",
    "volume_metrics",
    "comparison_metrics",
    "betti_comparison",
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


#: What ``mse_of`` says when the MSE is of the probability map (the metrics files and benchmarks).
MSE_OF_PROBABILITY = "probability"

#: What ``mse_of`` says when the MSE is of 0/1 pores (a thresholding method, or no probability
#: given): the fraction of voxels that differ, 1 - accuracy.
MSE_OF_BINARY = "binary pores"


# -- the built-in metrics, in the order of the metrics file ------------------------------------


def _betti(topology: StreamingTopology) -> tuple[int, int, int]:
    return topology.betti_numbers()  # computed once per result by the topology itself


def _dice(acc: MetricsAccumulator) -> float:
    n_p, n_t, inter = acc.sums["pred"], acc.sums["truth"], acc.sums["inter"]
    return 1.0 if n_p + n_t == 0 else 2.0 * inter / (n_p + n_t)


def _iou(acc: MetricsAccumulator) -> float:
    n_p, n_t, inter = acc.sums["pred"], acc.sums["truth"], acc.sums["inter"]
    union = n_p + n_t - inter
    return 1.0 if union == 0 else inter / union


def _rel(pred: float, truth: float) -> float:
    return float(abs(pred - truth) / max(abs(truth), 1))


for _metric in (
    Metric("porosity", lambda a: a.pores.n_pore_voxels / a.n_sample if a.n_sample else 0.0, summary=True),
    Metric("euler_number", lambda a: a.pores.euler_number(26), summary=True),
    Metric("euler_number_6", lambda a: a.pores.euler_number(6)),
    Metric("connectivity_density_per_mm3", lambda a: a.pores.connectivity_density(a.spacing_mm, a.n_sample),
           summary=True),
    Metric("n_pores", lambda a: a.pores.n_components(), summary=True),  # b0
    Metric("n_tunnels", lambda a: _betti(a.pores)[1]),  # b1
    Metric("n_cavities", lambda a: _betti(a.pores)[2]),  # b2
    Metric("sample_voxels", lambda a: a.n_sample),  # the denominator of every fraction
    Metric("mse", lambda a: a.sums["sq"] / a.n_sample if a.n_sample else 0.0, "truth", summary=True),
    Metric("dice", _dice, "truth", summary=True),
    Metric("iou", _iou, "truth"),
    Metric("porosity_error", lambda a: float(abs(a.sums["pred"] / a.n_sample - a.sums["truth"] / a.n_sample)),
           "truth"),
    Metric("euler_error_rel", lambda a: _rel(a.pores.euler_number(26), a.truth_topology.euler_number(26)), "truth",
           summary=True),
    Metric("euler_number_pred", lambda a: a.pores.euler_number(26), "pred"),
    Metric("euler_number_truth", lambda a: a.truth_topology.euler_number(26), "truth"),
    Metric("porosity_pred", lambda a: a.sums["pred"] / a.n_sample, "pred"),
    Metric("porosity_truth", lambda a: a.sums["truth"] / a.n_sample, "truth"),
    *(m for k in range(3) for m in (
        Metric(f"b{k}_pred", lambda a, k=k: _betti(a.pores)[k], "pred_betti"),
        Metric(f"b{k}_truth", lambda a, k=k: _betti(a.truth_topology)[k], "betti"),
        Metric(f"b{k}_error_rel", lambda a, k=k: _rel(_betti(a.pores)[k], _betti(a.truth_topology)[k]), "betti"),
    )),
):
    register_metric(_metric)

for _key, _figure in analysis_keys():  # ctpore analyze's figures; the three the metrics hold already are theirs
    if not any(m.key == _key for m in METRICS):
        register_metric(Metric(_key, (lambda r, f=_figure: r.get(f)), "analysis", summary=_figure in ANALYSIS_HEADLINE))


# -- whole in-memory volumes ------------------------------------------------------------------


def _feed(acc: MetricsAccumulator, pred: np.ndarray, prob=None, truth=None) -> dict:
    """Feed a whole volume in slabs of about :data:`SLAB_VOXELS` voxels; the result."""
    plane = max(1, pred.shape[1] * pred.shape[2])
    step = max(1, SLAB_VOXELS // plane)
    for z0 in range(0, pred.shape[0], step):
        sl = slice(z0, z0 + step)
        acc.add(pred[sl], None if prob is None else prob[sl], None if truth is None else truth[sl])
    return acc.result()


def volume_metrics(pores: np.ndarray, spacing_mm: Sequence[float] = (1.0, 1.0, 1.0)) -> dict[str, float | int]:
    """All single-volume metrics of a binary ``(Z, Y, X)`` pore volume with voxels of ``spacing_mm``.

    Returns
    -------
    dict
        Plain Python numbers (JSON-serialisable): ``porosity`` (float), ``euler_number`` (int,
        26-connected pores), ``euler_number_6`` (int, 6-connected pores),
        ``connectivity_density_per_mm3`` (float, BoneJ, see :func:`connectivity_density`), and the
        Betti numbers of the pore phase: ``n_pores`` (b0, 26-connected pore components),
        ``n_tunnels`` (b1) and ``n_cavities`` (b2, solid pieces enclosed by pore).
    """
    vol = as_volume(pores)
    return _feed(MetricsAccumulator(vol.shape, spacing_mm), vol)


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
    betti : bool
        Also the Betti numbers of both and their relative errors (:func:`betti_comparison`).

    Returns
    -------
    dict
        ``mse`` = mean((prob or pred) - truth)², ``dice`` = 2|P∩T| / (|P| + |T|),
        ``iou`` = |P∩T| / |P∪T| (both 1.0 when pred and truth have no pore at all: they agree
        perfectly), ``porosity_error`` = |φ_pred - φ_truth|, ``euler_error_rel`` =
        |χ_pred - χ_truth| / max(|χ_truth|, 1) (26-connectivity), ``euler_number_pred``,
        ``euler_number_truth``, ``porosity_pred``, ``porosity_truth``. Plain Python numbers.
        With ``betti``, also ``b{k}_pred``, ``b{k}_truth`` and ``b{k}_error_rel`` for k = 0, 1, 2.

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
        prob = np.asarray(prob)
        if prob.shape != t.shape:
            raise InputError(f"probability and truth must have the same shape, got probability {prob.shape} "
                             f"and truth {t.shape}")
    acc = MetricsAccumulator(p.shape, truth=True, betti=betti, volume=False)
    return _feed(acc, p, prob, t)


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
    m = comparison_metrics(pred, truth, betti=True)
    return {k: v for k, v in m.items() if k[0] == "b" and k[1].isdigit()}
