"""The metric registry: what a metric is (:class:`Metric`), every metric in the metrics file's key
order (:data:`METRICS`), :func:`register_metric` and the headline keys (:func:`summary_keys`).

The built-in metrics are registered by :mod:`ctpore.data.metrics` (import the registry from there:
it is the public place, and importing it registers them first, in the metrics file's order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

__all__ = ["Metric", "METRICS", "register_metric", "summary_keys"]


@dataclass(frozen=True)
class Metric:
    """One key of the metrics.

    Attributes
    ----------
    key : str
        Its name in the metrics (JSON) file.
    compute : callable
        ``compute(acc) -> value`` (a plain Python number, list or None) from a
        :class:`~ctpore.data.accumulator.MetricsAccumulator` that has seen every slab.
    group : {"volume", "truth", "betti", "pred", "pred_betti", "analysis"}
        ``volume``: of the pores alone; ``truth``: needs a ground truth; ``betti``: needs a truth
        and the Betti numbers (reported by ``reconstruct`` and ``evaluate``; the cheaper
        comparisons of the benchmark rows leave them out unless asked); ``pred`` and
        ``pred_betti``: the prediction's own value beside the truth's, only where the volume
        group (which holds it under its own key) is left out, so no key repeats another;
        ``analysis``: a figure of ``ctpore analyze`` (:mod:`ctpore.data.analysis_keys`), computed
        from its record, not by the accumulator.
    add : callable, optional
        ``add(acc, slab, state)`` for each slab, in z order, for a metric that keeps state of its
        own (``state`` is a dict kept for this metric); ``slab`` has ``start``, ``stop``, ``pores``,
        ``prob`` and ``truth`` (None when not given).
    summary : bool
        A headline figure: a column of ``ctpore batch``'s summary (and, in the ``truth`` group, one
        of the means its report gives over the labelled scans).
    """

    key: str
    compute: Callable[[Any], Any]  # of a ctpore.data.accumulator.MetricsAccumulator (which imports this module)
    group: str = "volume"
    add: Optional[Callable[..., None]] = None
    summary: bool = False


#: Every metric, in the order of the keys in the metrics file.
METRICS: list[Metric] = []

_GROUPS = ("volume", "truth", "betti", "pred", "pred_betti", "analysis")


def register_metric(metric: Metric) -> Metric:
    """Add a metric to :data:`METRICS`; a key already there is refused (ValueError): two metrics of
    one key would write one value over the other in the metrics file."""
    if metric.group not in _GROUPS:
        raise ValueError(f"metric group must be one of {', '.join(_GROUPS)}, got {metric.group!r}")
    if any(m.key == metric.key for m in METRICS):
        raise ValueError(f"a metric with the key {metric.key!r} is registered already; give the new one a key "
                         "of its own")
    METRICS.append(metric)
    return metric


def summary_keys(group: Optional[str] = None) -> tuple[str, ...]:
    """The keys of the headline metrics (``summary``), in the metrics file's order; of one
    ``group`` only when given."""
    return tuple(m.key for m in METRICS if m.summary and (group is None or m.group == group))
