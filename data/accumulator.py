"""The metrics accumulator: every registered metric of a pore volume, fed slab by slab along z.

:class:`MetricsAccumulator` computes the metrics of :data:`~ctpore.data.metric_registry.METRICS` from
running sums and a streaming topology, so a scan of any size is measured without being held. Import
it from :mod:`ctpore.data.metrics`, which registers the built-in metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ctpore.data.binary import as_volume, check_spacing
from ctpore.data.metric_registry import METRICS
from ctpore.data.slabs import StreamingTopology
from ctpore.errors import InputError, NonFiniteError

__all__ = ["MetricsAccumulator"]


@dataclass
class _Slab:
    start: int
    stop: int
    pores: np.ndarray
    prob: Optional[np.ndarray]
    truth: Optional[np.ndarray]
    sample: Optional[np.ndarray] = None


class MetricsAccumulator:
    """Every metric of a pore volume, fed slab by slab along z (see the module docstring).

    Parameters
    ----------
    shape : tuple of int
        ``(Z, Y, X)`` of the whole volume.
    spacing_mm : sequence of 3 floats
        Voxel size (z, y, x) in mm, for the connectivity density.
    truth : bool
        Slabs come with a ground truth: the comparisons are computed.
    betti : bool
        With a truth, also the Betti numbers of the truth and their errors.
    volume : bool
        The metrics of the pores alone (porosity, Euler and Betti numbers, density).

    Attributes
    ----------
    n : int
        Voxels of the volume.
    pores, truth_topology : StreamingTopology
        The topology of the pores and of the truth seen so far.
    sums : dict
        Running sums: ``sq`` (squared error of the probability, float64), ``pred``, ``truth``,
        ``inter`` (voxel counts).

    Examples
    --------
    >>> from ctpore.data.metrics import volume_metrics   # (registers the built-in metrics)
    >>> vol = np.zeros((6, 5, 5), np.uint8); vol[1:5, 1:4, 1:4] = 1; vol[2:4, 2, 2] = 0
    >>> acc = MetricsAccumulator(vol.shape)
    >>> for z in range(0, 6, 4):
    ...     acc.add(vol[z:z + 4])
    >>> acc.result() == volume_metrics(vol)
    True
    """

    def __init__(self, shape, spacing_mm: Sequence[float] = (1.0, 1.0, 1.0), truth: bool = False,
                 betti: bool = True, volume: bool = True):
        self.shape = tuple(int(s) for s in shape)
        self.spacing_mm = check_spacing(spacing_mm)
        self.n = int(np.prod(self.shape))
        #: Voxels of the sample (all of them unless slabs come with a sample mask).
        self.n_sample = 0
        groups = {"volume"} if volume else set()
        if truth:
            groups |= {"truth", "betti"} if betti else {"truth"}
            if not volume:  # the prediction's own figures, which the volume group holds otherwise
                groups |= {"pred", "pred_betti"} if betti else {"pred"}
        self.metrics = [m for m in METRICS if m.group in groups]
        components = volume or (truth and betti)
        self.pores = StreamingTopology(components=components)
        self.truth_topology = StreamingTopology(components=truth and betti) if truth else None
        self.sums = {"sq": 0.0, "pred": 0, "truth": 0, "inter": 0}
        self.mse_of_probability = False
        self._state: dict[str, dict] = {m.key: {} for m in self.metrics}
        self._z = 0

    def add(self, pores: np.ndarray, prob: Optional[np.ndarray] = None, truth: Optional[np.ndarray] = None,
            sample: Optional[np.ndarray] = None) -> None:
        """The next slab: pores (0/1), and the probability map and truth of the same slices when
        the accumulator measures them (the MSE is of ``prob``, or of the pores without one).

        ``sample`` (bool, True inside the sample; None: all of it): every figure is of the sample
        only. The pores (and ``prob``) must be 0 outside it; the truth is taken as 0 there.
        """
        p = as_volume(pores, "prediction")
        self.join(self.summarize(p, prob, truth, sample))
        slab = _Slab(self._z - p.shape[0], self._z, p, prob, truth, sample)
        for m in self.metrics:
            if m.add is not None:
                m.add(self, slab, self._state[m.key])

    @property
    def splittable(self) -> bool:
        """Whether its slabs can be measured apart (:meth:`summarize`) and joined (:meth:`join`):
        no metric keeps a state of its own."""
        return all(m.add is None for m in self.metrics)

    def summarize(self, pores: np.ndarray, prob: Optional[np.ndarray] = None, truth: Optional[np.ndarray] = None,
                  sample: Optional[np.ndarray] = None) -> dict:
        """What :meth:`join` needs of one slab (the arguments of :meth:`add`), computed from the slab
        alone, in another process for a scan split across workers: its voxel sums and its topology's
        summaries (:meth:`StreamingTopology.summarize`). Joined in z order, the summaries of the
        same slabs give the same metrics as :meth:`add`, to the last bit."""
        p = as_volume(pores, "prediction")
        out = {"n": p.shape[0], "sums": {"sq": 0.0, "pred": 0, "truth": 0, "inter": 0}, "mse_of_probability": False}
        if sample is not None:
            sample = np.asarray(sample, bool)
            if np.any(p & ~sample):
                raise ValueError("pores outside the sample")
            out["n_sample"] = int(np.count_nonzero(sample))
        else:
            out["n_sample"] = int(p.size)
        out["pores"] = self.pores.summarize(p)
        if self.truth_topology is not None:
            if truth is None:
                raise ValueError("this accumulator compares with a truth: give each slab's truth")
            t = as_volume(truth, "truth")
            if t.shape != p.shape:
                raise InputError(f"prediction and truth must have the same shape, got prediction {p.shape} "
                                 f"and truth {t.shape}")
            if sample is not None:
                t = t & sample
            out["truth"] = self.truth_topology.summarize(t)
            sums = out["sums"]
            sums["pred"] = int(np.count_nonzero(p))
            sums["truth"] = int(np.count_nonzero(t))
            sums["inter"] = int(np.count_nonzero(p & t))
            if prob is not None:
                out["mse_of_probability"] = True
                if sample is not None:
                    prob = np.where(sample, prob, 0.0)  # outside: 0 against 0
                sums["sq"] = _squared_error(prob, t)
            else:  # (0/1 - 0/1)^2 is 1 where they differ
                sums["sq"] = float(np.count_nonzero(p != t))
        return out

    def join(self, summary: dict) -> None:
        """The next slab along z, as :meth:`summarize` described it."""
        self.n_sample += summary["n_sample"]
        self.pores.join(summary["pores"])
        if self.truth_topology is not None:
            self.truth_topology.join(summary["truth"])
            for k in self.sums:
                self.sums[k] += summary["sums"][k]
            self.mse_of_probability |= summary["mse_of_probability"]
        self._z += summary["n"]

    def state(self, key: str) -> dict:
        """The state dict of metric ``key`` (for a metric with an ``add`` hook)."""
        return self._state[key]

    def result(self) -> dict:
        """Every metric's value, keyed as in the metrics file, in :data:`METRICS` order."""
        if self._z != self.shape[0]:
            raise ValueError(f"{self._z} of {self.shape[0]} slices were added")
        return {m.key: m.compute(self) for m in self.metrics}


def _squared_error(prob: np.ndarray, truth: np.ndarray) -> float:
    """Sum of (prob - truth)² in float64 (prob checked: finite, in [0, 1])."""
    q = np.asarray(prob)
    if q.shape != truth.shape:
        raise InputError(f"probability and truth must have the same shape, got probability {q.shape} and "
                         f"truth {truth.shape}")
    if not np.issubdtype(q.dtype, np.number) and q.dtype != np.bool_:
        raise InputError(f"probability must be numeric, got dtype {q.dtype}")
    q = q.astype(np.float64)
    if not np.isfinite(q).all():
        n = int(np.count_nonzero(~np.isfinite(q)))
        raise NonFiniteError(f"probability volume holds NaN/Inf (at least {n} voxels)")
    if q.size and (q.min() < 0.0 or q.max() > 1.0):
        raise InputError(f"probability must lie in [0, 1], found values from {q.min():g} to {q.max():g}")
    d = q - truth
    return float(np.einsum("ijk,ijk->", d, d))
