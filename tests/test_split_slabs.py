"""Each slab's work done on its own (a scan split across workers), then joined in z order, gives
the whole volume's pores, probabilities and metrics, whatever the cuts and the order slabs run in.

The truths: :meth:`Postprocessing.apply` on the whole in-memory volume (itself checked against
whole-volume labelling in test_topology_rules.py), and the metrics of the same slabs added in order
(checked against the whole volume's topology in test_large.py and test_metrics.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage as ndi

from ctpore.data.postprocess import Postprocessing
from ctpore.data.slabs import SlabComponents


def probabilities(shape=(40, 30, 30), seed=1) -> np.ndarray:
    """Smooth random probabilities: pore and solid components of many sizes that cross slab cuts."""
    p = ndi.gaussian_filter(np.random.default_rng(seed).random(shape), 1.5)
    return ((p - p.min()) / (p.max() - p.min())).astype(np.float32)


RULES = [Postprocessing(), Postprocessing(confidence=0.8), Postprocessing(min_size=5),
         Postprocessing(threshold=0.6, confidence=0.9, min_pore_voxels=20),
         Postprocessing(confidence=0.8, calibration={"x": [0.0, 0.5, 1.0], "y": [0.0, 0.3, 1.0]}),
         Postprocessing(confidence=0.8, zmix={"w": [0.8, 0.9, -0.3, 0.2]})]
CUTS = [[(0, 40)], [(0, 7), (7, 8), (8, 30), (30, 40)], [(a, a + 1) for a in range(40)]]


def backwards(fn, items):
    """Runs the slabs last to first: nothing may depend on the order."""
    return [fn(it) for it in reversed(list(items))][::-1]


@pytest.mark.parametrize("post", RULES, ids=["plain", "confidence", "size", "user-size", "calibrated",
                                          "z-neighbours"])
@pytest.mark.parametrize("cuts", CUTS, ids=["one", "uneven", "single-slices"])
def test_the_split_post_processing_equals_the_whole_volumes(post, cuts):
    prob = probabilities()
    want_pores, want_prob = post.apply(prob)
    pores, out = np.zeros_like(want_pores), np.zeros_like(want_prob)

    def on_slab(a, b, p, q):
        pores[a:b], out[a:b] = p, q
        return a, b

    ran = post.run_split(lambda a, b: prob[a:b].copy(), cuts, on_slab, map_fn=backwards)
    assert ran == [tuple(c) for c in cuts]
    assert np.array_equal(pores, want_pores)
    assert np.array_equal(out, want_prob)
    if post.pore_rule:  # the rules did something here, or the test proves little
        assert not np.array_equal(want_pores, (prob >= post.threshold).view(np.uint8))


def test_summaries_joined_in_order_equal_slabs_added_in_order():
    mask = probabilities(seed=3) > 0.55
    values = probabilities(seed=4)
    whole, joined = SlabComponents(26), SlabComponents(26)
    for a in range(0, 40, 6):
        whole.add(mask[a:a + 6], values[a:a + 6])
        s = SlabComponents(26).summarize(mask[a:a + 6], values[a:a + 6])
        s.pop("labels")
        joined.join(s)
    assert joined.n_components() == whole.n_components() == ndi.label(mask, np.ones((3, 3, 3)))[1]
    assert np.array_equal(joined.sizes(), whole.sizes())
    assert np.array_equal(joined.peak_below(0.7), whole.peak_below(0.7))
    assert joined.n_enclosed() == whole.n_enclosed()


def test_the_slabs_run_in_other_processes_on_a_dask_cluster():
    distributed = pytest.importorskip("distributed")
    prob = probabilities(shape=(24, 20, 20), seed=5)
    post = Postprocessing(confidence=0.8, min_size=3)
    want, _ = post.apply(prob)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        def on_dask(fn, items):
            return client.gather(client.map(fn, list(items), pure=False))

        # the pores come back from the workers (a split run writes them there instead)
        parts = post.run_split(lambda a, b: prob[a:b].copy(), [(0, 5), (5, 13), (13, 24)],
                               lambda a, b, p, q: (a, p), map_fn=on_dask)
    got = np.zeros_like(want)
    for a, p in parts:
        got[a:a + len(p)] = p
    assert np.array_equal(got, want)


def test_metrics_of_slabs_measured_apart_equal_those_of_slabs_added_in_order():
    """Every metric, the MSE's float sum included, to the last bit; with a truth and a sample mask."""
    from ctpore.data.metrics import MetricsAccumulator

    prob = probabilities(seed=6)
    pores = (prob >= 0.6).view(np.uint8)
    truth = probabilities(seed=7) >= 0.45
    zz, yy, xx = np.indices(prob.shape)
    sample = (yy - 14.5) ** 2 + (xx - 14.5) ** 2 <= 13 ** 2  # a core
    pores = pores & sample
    prob = np.where(sample, prob, 0.0).astype(np.float32)
    cuts = [(0, 9), (9, 10), (10, 27), (27, 40)]
    added = MetricsAccumulator(prob.shape, (0.01, 0.01, 0.01), truth=True)
    for a, b in cuts:
        added.add(pores[a:b], prob[a:b], truth[a:b], sample[a:b])
    worker = MetricsAccumulator(prob.shape, (0.01, 0.01, 0.01), truth=True)  # another process's
    parts = [worker.summarize(pores[a:b], prob[a:b], truth[a:b], sample[a:b]) for a, b in reversed(cuts)]
    joined = MetricsAccumulator(prob.shape, (0.01, 0.01, 0.01), truth=True)
    assert joined.splittable
    for part in reversed(parts):
        joined.join(part)
    want, got = added.result(), joined.result()
    assert got == want
    assert want["n_pores"] > 5 and want["n_tunnels"] > 5 and 0 < want["dice"] < 1  # the slabs share components


def test_groups_of_cuts_run_as_one_task_each_in_z_order():
    prob = probabilities(seed=8)
    post = Postprocessing(confidence=0.8, min_size=4)
    want, _ = post.apply(prob)
    cuts = [(a, min(a + 5, 40)) for a in range(0, 40, 5)]
    groups = [[0, 1, 2], [3], [4, 5, 6, 7]]
    tasks, order = [], []

    def count(fn, items):
        items = list(items)
        tasks.append(len(items))
        return [fn(it) for it in reversed(items)][::-1]

    got = np.zeros_like(want)

    def on_slab(a, b, p, q):
        got[a:b] = p
        order.append(a)

    post.run_split(lambda a, b: prob[a:b].copy(), cuts, on_slab, map_fn=count, groups=groups)
    assert tasks == [3, 3, 3]  # a task a group, in each of the three passes
    assert np.array_equal(got, want)
    assert order == [20, 25, 30, 35, 15, 0, 5, 10]  # each group's cuts in z order (the groups ran backwards)
    with pytest.raises(ValueError, match="every cut once"):
        post.run_split(lambda a, b: prob[a:b].copy(), cuts, on_slab, groups=[[0, 1]])
