"""The cheap first rung of adapting to a user's scanner: the post-processing refitted on their labels.

With the network frozen, the raw pore probabilities of each scan are computed once, through the one
reconstruct pipeline (:func:`raw_probability`: the sample found, the outside filled, the
surface's rim cleared, exactly what ``ctpore reconstruct`` thresholds), and on the labels that
train (never the held-back ones):

- the z-neighbour refit (:mod:`~ctpore.data.zmix`): each voxel's probability refitted from its
  logit and its two z-neighbours' (the labeller's idea of where a pore ends along Z, which a
  causal network cannot learn from the slices below); the probability map is its output;
- the pores, chosen among candidates for their topology: decided on the z-refitted probabilities
  or on the raw ones (the refit then shapes the probability map alone), each at the threshold of
  :data:`THRESHOLDS` with the best Dice on the labelled voxels (ties: the nearest to the weights'
  own), and post-processed as ``reconstruct`` does with each evidence rule's confidence of
  :data:`CONFIDENCES` (and the weights' own, :class:`~ctpore.data.postprocess.Postprocessing`).
  Of the candidates whose Dice on the labelled voxels is within :data:`DICE_SLACK` of the best
  one's, the one whose pores have the lowest summed |2D Euler error| against the labels on the
  labelled planes wins (ties: the z-refitted probabilities, then the weights' own confidence, then
  the higher Dice). The Dice hardly moves with either choice (the confidence removes or fills
  small components; a refit along Z moves few voxels), the connectivity does;
- the probability calibration (:func:`~ctpore.data.calibration.fit_calibration`) on the labelled
  voxels. Calibration alone changes no pore; the threshold does.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

import numpy as np

from ctpore.data.calibration import fit_calibration
from ctpore.data.io import Geometry
from ctpore.data.postprocess import Postprocessing
from ctpore.data.sparse_labels import PORE, UNLABELLED
from ctpore.data.zmix import fit_zmix, mix_volume
from ctpore.pipelines.finetune.holdout import plane_euler_error
from ctpore.progress import ProgressFn

__all__ = ["THRESHOLDS", "CONFIDENCES", "DICE_SLACK", "raw_probability", "refit_on_labels"]

#: The thresholds tried.
THRESHOLDS = tuple(round(t, 2) for t in np.arange(0.1, 0.96, 0.05))

#: The evidence rule's confidences tried (None: off).
CONFIDENCES = (None, 0.9, 0.97, 0.99)

#: The pores' candidates are those whose Dice on the labels is within this of the best one's: the
#: topology is chosen among boundaries that are all about as right, never at the voxels' cost.
DICE_SLACK = 0.005


def raw_probability(volume: np.ndarray, geometry: Geometry, predictor: Any, *, sample: Any = "auto",
                    memory_gb: Optional[float] = None, progress: ProgressFn = None) -> np.ndarray:
    """The raw pore probabilities ``ctpore reconstruct`` thresholds, float32 ``(Z, Y, X)``: the run's
    own steps with a post-processing that only clears the outside and the rim (no calibration, no
    component rule)."""
    from ctpore.pipelines.reconstruct_run import run_reconstruction
    from ctpore.pipelines.sinks import ArraySink

    post = predictor.post
    predictor.post = Postprocessing(threshold=0.5, binary=post.binary)
    try:
        sink = ArraySink(geometry.shape)
        run_reconstruction(volume, geometry, predictor, sink, memory_gb=memory_gb, sample=sample, progress=progress)
    finally:
        predictor.post = post
    return np.asarray(sink.prob, np.float32)


def _dice(pred: np.ndarray, truth: np.ndarray) -> float:
    denom = int(np.count_nonzero(pred)) + int(np.count_nonzero(truth))
    return 1.0 if denom == 0 else 2.0 * int(np.count_nonzero(pred & truth)) / denom


def _threshold(probs: list, where: list, t: np.ndarray, base: Postprocessing) -> tuple[float, dict]:
    """The threshold of :data:`THRESHOLDS` (and the weights' own) with the best Dice on the labelled
    voxels (ties: the nearest to the weights' own), and every threshold's Dice."""
    p = np.concatenate([prob[w] for prob, w in zip(probs, where)]).astype(np.float32)
    scores = {float(th): _dice(p >= th, t) for th in sorted(set(THRESHOLDS) | {float(base.threshold)})}
    best = max(scores.values())
    return min((th for th, d in scores.items() if d >= best - 1e-9), key=lambda th: abs(th - base.threshold)), scores


def refit_on_labels(probs: list, labels: list, base: Postprocessing,
                    z_neighbours: bool = True) -> tuple[Postprocessing, dict]:
    """The post-processing refitted on ``labels`` (the training part: 0 / 1 pore / 2 solid) of the
    scans whose raw probabilities are ``probs``; returns it and what was tried (module docstring).
    ``z_neighbours``: fit the z-neighbour refit (else none)."""
    where = [lab != UNLABELLED for lab in labels]
    t = np.concatenate([lab[w] == PORE for lab, w in zip(labels, where)])
    zmix = fit_zmix(probs, [lab == PORE for lab in labels], where) if z_neighbours else None
    mixed = [mix_volume(prob, zmix) for prob in probs]
    sources = {"z-refit": mixed} if zmix is None else {"z-refit": mixed, "raw": [np.asarray(p) for p in probs]}
    tried, scores = {}, {}
    for name, src in sources.items():
        threshold, scores[name] = _threshold(src, where, t, base)
        for conf in sorted(set(CONFIDENCES) | {base.confidence}, key=lambda c: -1.0 if c is None else c):
            if conf is not None and conf < threshold:
                continue
            post = Postprocessing(threshold=threshold, confidence=conf, min_size=base.min_size)
            pores = [post.apply(prob)[0] for prob in src]
            q = np.concatenate([pr[w].astype(bool) for pr, w in zip(pores, where)])
            tried[f"{name} {'none' if conf is None else conf}"] = {
                "source": name, "threshold": threshold, "confidence": conf, "dice": _dice(q, t),
                "euler_2d_error": sum(plane_euler_error(pr, lab) for pr, lab in zip(pores, labels))}
    order, top = list(sources), max(c["dice"] for c in tried.values())
    pool = [c for c in tried.values() if c["dice"] >= top - DICE_SLACK]
    pick = min(pool, key=lambda c: (c["euler_2d_error"], order.index(c["source"]),
                                     c["confidence"] != base.confidence, -c["dice"]))
    cal = fit_calibration([(prob[w], (lab[w] == PORE).astype(np.uint8)) for prob, lab, w in zip(mixed, labels, where)])
    if zmix is not None and pick["source"] == "raw":
        zmix = {**zmix, "pores": "raw"}
    post = replace(base, threshold=pick["threshold"], confidence=pick["confidence"], calibration=cal, zmix=zmix)
    return post, {"threshold_dice": scores["z-refit"], "candidates": tried, "pores_on": pick["source"],
                  "threshold": pick["threshold"], "confidence": pick["confidence"], "zmix": zmix}
