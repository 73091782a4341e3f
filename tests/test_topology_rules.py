"""Topology that holds: Betti numbers against analytic shapes, the evidence rule of the
post-processing against a whole-volume reference written with scipy, and small true pores that
the shipped model sees surviving its post-processing (where a size rule deleted them)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage as ndi

from ctpore.data.metrics import betti_numbers, comparison_metrics
from ctpore.data.postprocess import Postprocessing


def _torus(shape=(9, 21, 21), r_big=6.0, r_small=2.0):
    z, y, x = np.indices(shape).astype(float)
    c = np.array(shape) / 2 - 0.5
    q = np.hypot(y - c[1], x - c[2]) - r_big
    return ((q**2 + (z - c[0]) ** 2) <= r_small**2).astype(np.uint8)


def test_betti_numbers_of_analytic_shapes():
    ball = np.zeros((11, 11, 11), np.uint8)
    ball[np.sum((np.indices(ball.shape) - 5) ** 2, axis=0) <= 16] = 1
    assert betti_numbers(ball) == (1, 0, 0)
    hollow = ball.copy()
    hollow[np.sum((np.indices(ball.shape) - 5) ** 2, axis=0) <= 4] = 0  # a solid core inside a pore shell
    assert betti_numbers(hollow) == (1, 0, 1)
    assert betti_numbers(_torus()) == (1, 1, 0)
    two = np.concatenate([_torus(), np.zeros((3, 21, 21), np.uint8), _torus()])  # two separate rings
    assert betti_numbers(two) == (2, 2, 0)
    grid = np.zeros((3, 13, 13), np.uint8)  # a window frame with 4 panes: 4 independent loops
    grid[1, 1:12, 1:12] = 1
    grid[1, 2:6, 2:6] = grid[1, 2:6, 7:11] = grid[1, 7:11, 2:6] = grid[1, 7:11, 7:11] = 0
    assert betti_numbers(grid) == (1, 4, 0)


def test_a_lost_pore_and_a_lost_tunnel_cancel_in_the_euler_number_but_not_in_betti():
    truth = _torus()
    truth[1:3, 1:3, 1:3] = 1  # a small pore apart from the ring: b0 = 2, b1 = 1, chi = 1
    z, y, x = np.indices(truth.shape)
    pred = ((np.hypot(y - 10, x - 10) <= 8) & (z >= 2) & (z <= 6)).astype(np.uint8)  # the ring filled in: a disc
    assert betti_numbers(truth) == (2, 1, 0) and betti_numbers(pred) == (1, 0, 0)
    m = comparison_metrics(pred, truth, betti=True)
    assert m["euler_error_rel"] == 0.0  # chi 1 = 1: one pore lost against one tunnel lost
    assert m["b0_error_rel"] == 0.5 and m["b1_error_rel"] == 1.0


def _hysteresis_reference(prob, threshold, confidence):
    """Keep a pore component (26-connected) when its peak reaches ``confidence``; then fill a solid
    component (6-connected) whose most solid voxel never reaches it for solid."""
    pores = prob >= threshold
    lab, n = ndi.label(pores, ndi.generate_binary_structure(3, 3))
    keep = np.zeros(n + 1, bool)
    if n:
        keep[1:] = ndi.maximum(prob, lab, np.arange(1, n + 1)) >= confidence
    pores &= keep[lab]
    solid = ~pores
    lab, n = ndi.label(solid, ndi.generate_binary_structure(3, 1))
    fill = np.zeros(n + 1, bool)
    if n:
        fill[1:] = ndi.minimum(prob, lab, np.arange(1, n + 1)) > 1 - confidence
    return (pores | (solid & fill[lab])).astype(np.uint8)


def test_the_evidence_rule_equals_a_whole_volume_reference_for_any_slab():
    rng = np.random.default_rng(11)
    for _ in range(25):
        shape = tuple(int(s) for s in rng.integers(3, 22, 3))
        p = ndi.gaussian_filter(rng.random(shape), rng.uniform(0.6, 1.5))
        p = ((p - p.min()) / (p.max() - p.min() + 1e-12)).astype(np.float32)
        conf = float(rng.uniform(0.55, 0.99))
        want = _hysteresis_reference(p, 0.5, conf)
        got = []

        def read(a, b, p=p):
            return p[a:b].copy()

        def keep(a, b, pores, prob, got=got):
            got.append(pores.copy())

        Postprocessing(confidence=conf).run(read, shape, int(rng.integers(1, 6)), keep)
        np.testing.assert_array_equal(np.concatenate(got), want)


def test_small_true_pores_the_shipped_model_sees_survive_its_postprocessing():
    """A vesicular scan with many small pores: every true pore of 8 voxels or more whose raw
    probability reaches the shipped post-processing's confidence is in the output; a size rule of
    32 voxels (the rule shipped before) loses most of the small ones."""
    from ctpore.data.synthetic import make_pair
    from ctpore.models.weights import default_weights_path
    from ctpore.pipelines.reconstruct import build_predictor, reconstruct

    if default_weights_path() is None:
        pytest.skip("no shipped weights")
    scan, truth, _ = make_pair(9, shape=(48, 64, 64), family="vesicles", porosity=0.12, small_pores=True)
    pred = build_predictor("poreformer")
    post = pred.post
    if post.confidence is None:
        pytest.skip("the shipped post-processing has no evidence rule")
    pred.post = Postprocessing(threshold=post.threshold)  # the raw probabilities
    raw = reconstruct(scan, predictor=pred).probability
    pred.post = post
    final = reconstruct(scan, predictor=pred).pores
    lab, n = ndi.label(truth, ndi.generate_binary_structure(3, 3))
    idx = np.arange(n + 1)
    sizes, peak = np.bincount(lab.ravel(), minlength=n + 1), ndi.maximum(raw, lab, idx)
    seen = (idx > 0) & (sizes >= 8) & (peak >= post.confidence)
    small = seen & (sizes < 32)
    assert small.sum() >= 20  # the scan does hold many small pores the model sees
    kept = ndi.maximum(final, lab, idx) > 0
    assert np.all(kept[seen]), f"{int((seen & ~kept).sum())} of {int(seen.sum())} seen true pores were removed"
    by_size = Postprocessing(threshold=post.threshold, min_size=32).apply(raw)[0]
    assert (ndi.maximum(by_size, lab, idx)[small] > 0).mean() < 0.5


def test_a_lower_threshold_chosen_on_validation_reopens_a_throat_the_model_is_unsure_of():
    """Two pores joined by a throat the model gives 0.42: at the fixed threshold 0.5 the pore phase
    splits (b0 2 for a true 1); with the threshold grid the choice falls on one that keeps the
    throat, because it lowers the topology score without costing Dice."""
    from types import SimpleNamespace

    import torch

    from ctpore.pipelines.train.export import select_postprocessing

    truth = np.zeros((12, 16, 32), np.uint8)
    truth[3:9, 4:12, 2:12] = 1
    truth[3:9, 4:12, 20:30] = 1
    truth[5:7, 7:9, 12:20] = 1  # the throat
    prob = np.where(truth, 0.995, 0.005).astype(np.float32)
    prob[5:7, 7:9, 12:20] = 0.42
    pool = SimpleNamespace(truths=[truth])
    model = torch.nn.Identity()

    fixed = select_postprocessing(model, pool, probs=[prob], thresholds=(0.5,))
    assert fixed["postprocessing"].threshold == 0.5
    assert {r["threshold"] for r in fixed["table"]} == {0.5}
    pores, _ = fixed["postprocessing"].apply(prob)
    assert betti_numbers(pores)[0] == 2 and betti_numbers(truth)[0] == 1

    grid = select_postprocessing(model, pool, probs=[prob], thresholds=(0.35, 0.4, 0.45, 0.5, 0.55, 0.6))
    chosen = grid["postprocessing"]
    assert chosen.threshold == 0.4
    pores, _ = chosen.apply(prob)
    assert (pores == truth).all()
    # every confidence below a threshold is left out (it would keep every component)
    assert all(r["confidence"] is None or r["confidence"] >= r["threshold"] for r in grid["table"])


def test_the_choice_never_gives_up_more_dice_than_the_slack_for_topology():
    from ctpore.pipelines.train.export import DICE_SLACK, choose_candidate

    def row(t, conf, score, dice, mse=0.01):
        return {"threshold": t, "confidence": conf, "topology_score": score, "dice": dice, "mse": mse}

    base = row(0.5, 0.9, 1.0, 0.90)
    cheap = row(0.4, 0.9, 0.5, 0.90 - 2 * DICE_SLACK)  # better topology, but fatter pores
    fair = row(0.45, 0.9, 0.8, 0.90 - DICE_SLACK / 2)
    assert choose_candidate([base, cheap]) is base
    assert choose_candidate([base, cheap, fair]) is fair
    # with one threshold: the lowest score, ties by MSE (the rule before the grid)
    a, b = row(0.5, 0.8, 1.0, 0.9, mse=0.02), row(0.5, 0.9, 1.0, 0.8, mse=0.01)
    assert choose_candidate([a, b]) is b
    # equal score and MSE: the threshold nearest the configured one
    assert choose_candidate([row(0.45, None, 1.0, 0.9), row(0.55, None, 1.0, 0.9), row(0.5, None, 1.0, 0.9)],
                            0.5)["threshold"] == 0.5
