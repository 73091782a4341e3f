"""The z-neighbour refit (ctpore.data.zmix): the formula against a direct computation, slab by slab
equal to the whole volume, the fit against known parameters, and a labeller who dilates along Z
learnt from a few labelled slices."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage as ndi

from ctpore.data.postprocess import Postprocessing
from ctpore.data.sparse_labels import PORE, SOLID, UNLABELLED
from ctpore.data.zmix import EPS, fit_zmix, mix_volume
from ctpore.pipelines.finetune.refit import refit_on_labels

W = {"w": [0.8, 0.9, -0.3, 0.2]}


def smooth(shape=(24, 20, 20), seed=0) -> np.ndarray:
    p = ndi.gaussian_filter(np.random.default_rng(seed).random(shape), 1.2)
    return ((p - p.min()) / (p.max() - p.min())).astype(np.float32)


def direct(p: np.ndarray, w) -> np.ndarray:
    """The documented formula, voxel by voxel in float64, the edge slice its own neighbour."""
    q = np.clip(p.astype(np.float64), EPS, 1 - EPS)
    lg = np.log(q / (1 - q))
    out = np.zeros_like(q)
    nz = p.shape[0]
    for z in range(nz):
        up, dn = lg[max(z - 1, 0)], lg[min(z + 1, nz - 1)]
        s = w[0] * lg[z] + w[1] * np.maximum(up, dn) + w[2] * np.minimum(up, dn) + w[3]
        out[z] = 1 / (1 + np.exp(-s))
    out[p == 0] = 0
    return out


def test_the_refit_is_the_formula_and_the_identity_changes_nothing():
    p = smooth()
    p[3, :5, :5] = 0.0  # cleared by the run: stays 0
    assert np.allclose(mix_volume(p, W), direct(p, W["w"]), atol=2e-6)
    assert (mix_volume(p, W)[3, :5, :5] == 0).all()
    assert np.allclose(mix_volume(p, {"w": [1.0, 0.0, 0.0, 0.0]}), np.clip(p, EPS, 1 - EPS) * (p > 0), atol=1e-6)
    assert mix_volume(p, None) is p


@pytest.mark.parametrize("slab", [1, 2, 5, 24])
def test_slab_by_slab_it_equals_the_whole_volume(slab):
    p = smooth()
    post = Postprocessing(threshold=0.5, zmix=W)
    pores, prob = np.zeros(p.shape, np.uint8), np.zeros(p.shape, np.float32)

    def keep(a, b, q, r):
        pores[a:b], prob[a:b] = q, r

    post.run(lambda a, b: p[a:b].copy(), p.shape, slab, keep)
    want = mix_volume(p, W)
    assert np.array_equal(prob, want) and np.array_equal(pores, (want >= 0.5).view(np.uint8))


def test_the_fit_recovers_known_numbers():
    rng = np.random.default_rng(1)
    p = rng.uniform(0.02, 0.98, (30, 40, 40)).astype(np.float32)
    truth = rng.random(p.shape) < direct(p, W["w"])
    got = fit_zmix([p], [truth], [np.ones(p.shape, bool)])["w"]
    assert np.allclose(got, W["w"], atol=0.06), got


def test_a_labeller_who_dilates_along_z_is_learnt_from_three_slices():
    """The labels are the model's pores grown by one slice up and down; three labelled slices
    teach it, and the slices never labelled then agree better than with the threshold refit alone."""
    p = smooth((40, 32, 32), seed=3)
    pores = p >= 0.55
    truth = pores | np.roll(pores, 1, 0) | np.roll(pores, -1, 0)
    truth[0], truth[-1] = pores[0] | pores[1], pores[-1] | pores[-2]
    lab = np.full(p.shape, UNLABELLED, np.uint8)
    for z in (8, 20, 32):
        lab[z] = np.where(truth[z], PORE, SOLID)
    with_mix, _ = refit_on_labels([p], [lab], Postprocessing())
    without, _ = refit_on_labels([p], [lab], Postprocessing(), z_neighbours=False)
    assert without.zmix is None and with_mix.zmix["w"][1] > 0.5  # the larger neighbour counts
    rest = lab == UNLABELLED

    def mse(post):
        _, prob = post.apply(p)
        return float(np.mean((prob[rest] - truth[rest]) ** 2))

    assert mse(with_mix) < 0.7 * mse(without)


def test_it_is_stored_with_the_weights_and_read_back():
    post = Postprocessing(threshold=0.4, zmix=W)
    back = Postprocessing.from_metadata(post.to_metadata())
    assert back.zmix == W and back.describe()["z_neighbour_refit"] == [0.8, 0.9, -0.3, 0.2]
    assert Postprocessing.from_metadata(Postprocessing().to_metadata()).zmix is None
    assert "z_neighbour_refit" not in Postprocessing().describe()  # runs without one: metrics as before
    with pytest.raises(Exception, match="four finite numbers"):
        Postprocessing(zmix={"w": [1.0, 0.0]})


def test_a_model_sure_of_everything_and_often_wrong_gives_a_finite_fit_no_worse_than_the_identity():
    """Logits stuck at the clip (a network on a scanner it never met): plain Newton steps blew up to
    1e12 here; the halved, shrunk steps stay finite and lower the cross-entropy."""
    rng = np.random.default_rng(4)
    sure = (rng.random((12, 30, 30)) < 0.4)
    p = np.where(sure, 1 - 1e-7, 1e-7).astype(np.float32)
    truth = sure ^ (rng.random(p.shape) < 0.15)  # 15% of the voxels labelled the other way
    where = np.zeros(p.shape, bool)
    where[[3, 6, 9]] = True
    w = fit_zmix([p], [truth], [where])["w"]
    assert np.all(np.isfinite(w)) and np.abs(w).max() < 50

    def ce(q):
        q = np.clip(q[where], 1e-12, 1 - 1e-12)
        t = truth[where]
        return float(-np.mean(t * np.log(q) + (~t) * np.log(1 - q)))

    assert ce(mix_volume(p, {"w": w})) < ce(mix_volume(p, {"w": [1.0, 0.0, 0.0, 0.0]}))


@pytest.mark.parametrize("slab", [1, 3, 24])
def test_pores_decided_on_the_raw_probabilities_leave_the_refit_to_the_map(slab):
    """With ``"pores": "raw"`` the pores are those of the same rules without the refit, the
    probability map that of the refit, slab by slab, in a split run and as stored with the weights."""
    p = smooth(seed=5)
    rules = {"threshold": 0.5, "confidence": 0.9}
    post = Postprocessing(**rules, zmix={**W, "pores": "raw"})
    want_pores = Postprocessing(**rules).apply(p)[0]
    want_prob = Postprocessing(**rules, zmix=W).apply(p)[1]
    assert not np.array_equal(want_pores, Postprocessing(**rules, zmix=W).apply(p)[0])  # the case tells them apart
    pores, prob = np.zeros(p.shape, np.uint8), np.zeros(p.shape, np.float32)

    def keep(a, b, q, r):
        pores[a:b], prob[a:b] = q, r

    post.run(lambda a, b: p[a:b].copy(), p.shape, slab, keep)
    assert np.array_equal(pores, want_pores) and np.array_equal(prob, want_prob)
    cuts = [(a, min(a + slab, p.shape[0])) for a in range(0, p.shape[0], slab)]
    parts = post.run_split(lambda a, b: p[a:b].copy(), cuts, lambda a, b, q, r: (q.copy(), r.copy()))
    assert np.array_equal(np.concatenate([q for q, _ in parts]), want_pores)
    assert np.array_equal(np.concatenate([r for _, r in parts]), want_prob)
    back = Postprocessing.from_metadata(post.to_metadata())
    assert back.pores_on_raw and back.describe()["pores_on"] == "raw"
    assert not Postprocessing(zmix=W).pores_on_raw
    with pytest.raises(Exception, match="'refit' or 'raw'"):
        Postprocessing(zmix={**W, "pores": "smooth"})
