"""Export: the post-processing chosen and the calibration fitted on validation scans, then the weights written.

Everything chosen here is chosen on scans of the run's own validation seed range (never trained
on, never benchmarked), and stored in the weights file so that ``ctpore reconstruct`` applies
exactly what was chosen.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Optional, Union

import numpy as np
from torch import nn

from ctpore.data.calibration import apply_calibration, fit_calibration
from ctpore.data.metrics import comparison_metrics
from ctpore.data.splits import POSTPROCESSING_SCANS
from ctpore.errors import InputError
from ctpore.data.postprocess import Postprocessing
from ctpore.models.weights import load_network, read_metadata, save_weights
from ctpore.pipelines.train.batches import Pool, simulated_pool
from ctpore.pipelines.train.config import DataConfig, config_from_dict, config_to_dict, data_config_hash
from ctpore.pipelines.train.loop import TrainResult, init_record, predict_full
from ctpore.progress import ProgressFn

__all__ = ["CONFIDENCES", "THRESHOLDS", "DICE_SLACK", "POSTPROCESSING_SCANS", "choose_candidate",
           "postprocessing_pool", "select_postprocessing", "topology_score", "export_weights",
           "refit_postprocessing"]


#: Confidences tried for the evidence rule (None: threshold alone), chosen on validation scans.
CONFIDENCES = (None, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99)

#: Low thresholds (raw probability) tried with them: a pore component is a 26-connected component of
#: {probability >= threshold}. Empty: the configured threshold alone (decisions/rule_v14.md says why).
THRESHOLDS: tuple = ()

#: How much mean Dice a candidate may give up against the best at the configured threshold.
DICE_SLACK = 0.005

#: Share of the post-processing scans given small isolated pores (at least): the rule is chosen on
#: scans that hold many 8-30-voxel pores as well as the noise that makes false specks.
SMALL_PORES_SHARE = 0.5

# POSTPROCESSING_SCANS (48): the validation-range scans the post-processing is chosen and the
# calibration fitted on at export; defined with the seed ranges it belongs to, in ctpore.data.splits.


def postprocessing_pool(data: DataConfig, progress: ProgressFn = None) -> Pool:
    """The :data:`POSTPROCESSING_SCANS` validation-range scans (never trained on, never benchmarked),
    at least :data:`SMALL_PORES_SHARE` of them with small isolated pores."""
    wider = copy.copy(data)
    wider.n_val = max(POSTPROCESSING_SCANS, data.n_val)
    wider.small_pores = max(float(getattr(data, "small_pores", 0.0)), SMALL_PORES_SHARE)
    return simulated_pool(wider, val=True, progress=progress)


def topology_score(rows: list[dict]) -> float:
    """Mean relative Euler error + mean relative b0 error + mean relative b1 error of
    :func:`~ctpore.data.metrics.comparison_metrics` rows (``betti=True``): lower is better. The
    Euler error alone can cancel (pores lost against tunnels lost); the Betti errors cannot."""
    return float(sum(np.mean([r[k] for r in rows]) for k in ("euler_error_rel", "b0_error_rel", "b1_error_rel")))


def choose_candidate(table: list[dict], threshold: float = 0.5) -> dict:
    """The row of ``table`` the export ships (``decisions/rule_v14.md``).

    ``D0`` is the mean Dice of the row with the lowest topology score at ``threshold`` (the fixed
    low threshold of before); among the rows whose Dice is at least ``D0 - DICE_SLACK``, the
    lowest topology score wins, ties broken by MSE and then by the threshold nearest ``threshold``.
    With one threshold this is the lowest topology score, ties broken by MSE.
    """
    def key(r):
        return (round(r["topology_score"], 6), r["mse"], abs(r["threshold"] - threshold))

    base = [r for r in table if r["threshold"] == threshold] or table
    d0 = min(base, key=key)["dice"]
    return min((r for r in table if r["dice"] >= d0 - DICE_SLACK), key=key)


def select_postprocessing(model: nn.Module, pool: Pool, device="cpu", threshold: float = 0.5,
                          return_probs: bool = False, probs: Optional[list] = None,
                          thresholds: Optional[tuple] = None) -> dict:
    """Choose the post-processing on validation scans and fit the probability calibration there.

    Every low threshold in ``thresholds`` (default :data:`THRESHOLDS`) crossed with every confidence in
    :data:`CONFIDENCES` (the evidence rule of :class:`~ctpore.data.postprocess.Postprocessing`; a
    confidence below the threshold is left out: it would keep every component) is scored by
    :func:`topology_score` on ``pool`` (the validation scans, never the benchmark's) and chosen by
    :func:`choose_candidate`; the calibration is then fitted on the same scans (see
    :mod:`ctpore.data.calibration`). One pass per scan, in the slice order ``ctpore reconstruct``
    streams (``probs``: those passes, when already made). Returns ``{"postprocessing", "table",
    "calibration"}`` (and ``"probs"``, the raw probabilities of the pool's scans, with
    ``return_probs``).
    """
    model.eval()
    if probs is None:
        probs = [predict_full(model, scan, device) for scan in pool.scans]
    thresholds = tuple(THRESHOLDS if thresholds is None else thresholds)
    if threshold not in thresholds:
        thresholds = (threshold,) + thresholds
    table = []
    for t in thresholds:
        for conf in CONFIDENCES:
            if conf is not None and conf < t:
                continue
            post = Postprocessing(threshold=t, confidence=conf)
            rows = []
            for prob, truth in zip(probs, pool.truths):
                pores, _ = post.apply(prob)
                rows.append(comparison_metrics(pores, truth.astype(np.uint8), prob=prob, betti=True))
            table.append({"threshold": float(t), "confidence": conf, "topology_score": topology_score(rows),
                          **{k: float(np.mean([r[k] for r in rows]))
                             for k in ("euler_error_rel", "b0_error_rel", "b1_error_rel", "mse", "dice")}})
    best = choose_candidate(table, threshold)
    cal = fit_calibration(zip(probs, pool.truths))
    out = {"postprocessing": Postprocessing(threshold=best["threshold"], confidence=best["confidence"],
                                            calibration=cal),
           "table": table, "calibration": cal}
    if return_probs:
        out["probs"] = probs
    return out


def export_weights(result: TrainResult, path: Union[str, os.PathLike], name: Optional[str] = None,
                   device: str = "cpu", progress: ProgressFn = None) -> Path:
    """Write the trained network as a weights safetensors file with its provenance.

    The post-processing (the speck size) is chosen and the probability
    calibration fitted on :func:`postprocessing_pool` (the run's validation scans and more from the
    same seed range) and stored with the weights, so ``ctpore reconstruct`` applies exactly what
    was chosen.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cfg = result.config
    name = name or cfg.model
    if progress is not None:
        progress(0, 1, "choosing post-processing on validation scans")
    if cfg.data.source == "synthetic":
        post = select_postprocessing(result.model, postprocessing_pool(cfg.data, progress), device, cfg.threshold)
    else:
        post = {"postprocessing": Postprocessing(threshold=cfg.threshold, min_size=cfg.min_size), "table": []}
    init = init_record(result.history)
    meta = {
        "name": name,
        **post["postprocessing"].to_metadata(),
        "postprocessing_validation": json.dumps(post["table"]),
        "data_config_sha256": data_config_hash(cfg),
        "train_config": json.dumps(config_to_dict(cfg)),
        # A warm-started run's budget counts the steps and seconds that made its starting weights.
        "steps": str(result.steps + (init["steps"] if init else 0)),
        "train_seconds": f"{result.seconds + (init['train_seconds'] if init else 0.0):.0f}",
        "final_validation": json.dumps(result.history[-1] if result.history else {}),
    }
    if init:
        meta["init_weights"] = json.dumps(init)
    save_weights(result.model, path, metadata=meta)
    if progress is not None:
        progress(1, 1, "choosing post-processing on validation scans")
    return path


def refit_postprocessing(path: Union[str, os.PathLike], device: str = "cpu", progress: ProgressFn = None) -> dict:
    """Choose the post-processing and fit the calibration of a trained weights file again, in place.

    For weights exported before :data:`POSTPROCESSING_SCANS` or calibration existed. The file's own
    training config names its validation seed range (simulated; a file trained on labelled scans
    has none and is refused); :func:`select_postprocessing` runs on
    :func:`postprocessing_pool` exactly as at export, and the file is rewritten with the same
    tensors and provenance and the new ``min_size``, ``calibration`` and
    ``postprocessing_validation``.

    Returns
    -------
    dict
        What :func:`select_postprocessing` returned, plus the pool's mean MSE before
        (``mse_raw``) and after (``mse``) calibration.
    """
    path = Path(path)
    meta = read_metadata(path)
    if "train_config" not in meta:
        raise InputError("the weights file has no training config, so no validation scans to "
                         "choose its post-processing on", path=path)
    cfg = config_from_dict(json.loads(meta["train_config"]), path)
    if cfg.data.source != "synthetic":
        raise InputError("weights trained on labelled scans have no held-out validation scans to "
                         "choose their post-processing on", path=path)
    model = load_network(path, device=device)  # its stored map is refitted, never applied here
    pool = postprocessing_pool(cfg.data, progress)
    post = select_postprocessing(model, pool, device, cfg.threshold, return_probs=True)
    probs = post.pop("probs")
    post["mse_raw"] = float(np.mean([np.mean((p - t) ** 2) for p, t in zip(probs, pool.truths)]))
    post["mse"] = float(np.mean([np.mean((apply_calibration(p, post["calibration"]) - t) ** 2)
                                 for p, t in zip(probs, pool.truths)]))
    out = {k: v for k, v in meta.items() if k not in ("config", "format")}
    out.update(post["postprocessing"].to_metadata(), postprocessing_validation=json.dumps(post["table"]))
    save_weights(model, path, metadata=out)
    return post
