"""The three recipes of docs/architecture.md, followed: a new method, a new metric and a new
reader, each one module plus one registration line, and ``ctpore reconstruct`` runs with them.
Also: every registered metric gives the same value fed slab by slab as on the whole volume."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import numpy as np
import pytest
from helpers import run_cli
from scipy import ndimage as ndi

from ctpore.data import metrics as M
from ctpore.pipelines import methods as R

RECIPES = Path(__file__).resolve().parent / "recipes"


@pytest.fixture
def registries():
    """Run the recipe modules, and put the registries back as they were afterwards."""
    metrics, methods = list(M.METRICS), dict(R.METHODS)
    yield lambda name: runpy.run_path(str(RECIPES / f"{name}.py"))
    M.METRICS[:] = metrics
    R.METHODS.clear()
    R.METHODS.update(methods)


def _scan(tmp_path):
    from ctpore.data.synthetic import make_pair
    import nibabel as nib

    scan, _truth, _ = make_pair(11, shape=(16, 24, 24))
    img = nib.Nifti1Image(np.ascontiguousarray(scan.T), np.diag([0.01, 0.01, 0.01, 1]))
    img.header.set_xyzt_units("mm")
    nib.save(img, tmp_path / "s.nii.gz")
    return tmp_path / "s.nii.gz", scan


def test_a_toy_method_and_metric_run_through_ctpore_reconstruct(tmp_path, capsys, registries):
    from ctpore.data.normalize import normalize_volume
    from ctpore.data.io import load_scan

    registries("toy_method")
    registries("toy_metric")
    path, scan = _scan(tmp_path)
    code, out, err = run_cli(["reconstruct", path, "-o", tmp_path / "out", "--method", "toy-dark"], capsys)
    assert code == 0, err
    m = json.loads((tmp_path / "out" / "s_metrics.json").read_text())
    want = (normalize_volume(scan.astype(np.float32)) < 0.3).astype(np.uint8)  # the method, by hand
    with load_scan(tmp_path / "out" / "s_pores.nii.gz") as s:
        np.testing.assert_array_equal(s.read(), want)
    assert m["method"] == "toy-dark"
    assert m["first_slice_porosity"] == pytest.approx(want[0].mean())
    assert m["porosity"] == pytest.approx(want.mean())


def test_every_metric_streamed_equals_the_whole_volume(registries):
    """For every key of the registry (a toy one too), feeding slabs of any size gives what the
    whole volume gives in one slab."""
    registries("toy_metric")
    rng = np.random.default_rng(7)
    for _trial in range(6):
        shape = tuple(int(s) for s in rng.integers(4, 18, 3))
        pores = (ndi.gaussian_filter(rng.standard_normal(shape), 1.0) > rng.uniform(-0.4, 0.4)).astype(np.uint8)
        truth = (ndi.gaussian_filter(rng.standard_normal(shape), 1.0) > 0).astype(np.uint8)
        prob = rng.random(shape).astype(np.float32)
        keys = set()
        for volume in (True, False):  # every group of keys: with the volume's, and the comparisons alone
            whole = M.MetricsAccumulator(shape, (0.5, 0.4, 0.3), truth=True, volume=volume)
            whole.add(pores, prob, truth)
            want = whole.result()
            keys |= set(want)
            acc = M.MetricsAccumulator(shape, (0.5, 0.4, 0.3), truth=True, volume=volume)
            z = 0
            while z < shape[0]:
                k = int(rng.integers(1, 4))
                acc.add(pores[z:z + k], prob[z:z + k], truth[z:z + k])
                z += k
            got = acc.result()
            for key, v in want.items():
                assert got[key] == pytest.approx(v, rel=1e-12, abs=1e-12), key
        # every key but ctpore analyze's own, which its passes compute (tests/test_analysis.py)
        assert keys == {m.key for m in M.METRICS if m.group != "analysis"}


def _signature(fn) -> list:
    import inspect

    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values() if p.name != "self"]


def test_every_registered_method_builds_a_predictor_of_the_declared_interface(registries):
    """Each factory of the table (the toy's too) gives an object with every attribute the run reads
    and ``plan``/``predict`` taking exactly the Protocol's arguments (``precision`` included), and a
    plan that is None or two positive ints: what run_reconstruction and the disk estimate call."""
    registries("toy_method")
    want_plan, want_predict = _signature(R.Predictor.plan), _signature(R.Predictor.predict)
    for name, spec in R.METHODS.items():
        predictor = spec.factory(weights=None, device="cpu")
        assert isinstance(predictor, R.Predictor), name
        assert predictor.name == name
        assert _signature(predictor.plan) == want_plan, name
        assert _signature(predictor.predict) == want_predict, name
        assert predictor.halo is None or (isinstance(predictor.halo, int) and predictor.halo >= 0), name
        planned = predictor.plan((8, 96, 96), 2**28, None, precision="fp32")
        assert planned is None or (len(planned) == 2 and all(int(v) > 0 for v in planned)), name
        assert (planned is None) == (predictor.halo is None), name  # only a tiled predictor plans tiles


def test_a_predictor_missing_part_of_the_interface_is_not_one():
    """The runtime check looks at what the run reads: an object without ``halo`` (or ``plan``) fails."""
    from ctpore.data.postprocess import Postprocessing

    class NoHalo:
        name, post, info, device = "x", Postprocessing(threshold=0.5), {}, "cpu"

        def plan(self, shape, budget_bytes, gpu_memory_gb=None, precision="auto"):
            return None

        def predict(self, volume, out, *, budget_bytes, progress=None, chunk_slices=None, tile=None,
                    precision="auto"):
            return {}

    assert not isinstance(NoHalo(), R.Predictor)
    NoHalo.halo = None
    assert isinstance(NoHalo(), R.Predictor)
    del NoHalo.plan
    assert not isinstance(NoHalo(), R.Predictor)


def test_the_disk_estimate_and_the_run_share_one_plan(tmp_path):
    """``copy_made`` decides from ``plan_run``, which a run follows: for the shipped PoreFormer on a
    scan that cannot read windows, a small budget gives several tiles (a copy) and a big one a
    single tile (none), and the user's tile wins over the plan."""
    from ctpore.pipelines.budget import plan_run
    from ctpore.pipelines.disk import copy_made
    from ctpore.pipelines.stream_plan import plan_tiles

    predictor = R.get_method("poreformer").factory(weights=None, device="cpu")

    class Unwindowed:
        shape, windowed = (64, 700, 700), False

    for memory_gb, tile in ((0.5, None), (16.0, None), (16.0, 64)):
        plan = plan_run(Unwindowed.shape, predictor, memory_gb, tile=tile, precision="fp32")
        several = len(plan_tiles(700, 700, plan.tile, predictor.halo)) > 1
        assert copy_made(Unwindowed(), predictor, memory_gb=memory_gb, tile=tile, precision="fp32") == several
        if tile is not None:
            assert plan.tile == tile and several
    assert copy_made(Unwindowed(), predictor, memory_gb=0.5, precision="fp32")
    assert not copy_made(Unwindowed(), predictor, memory_gb=16.0, precision="fp32")
    assert not copy_made(Unwindowed(), R.get_method("otsu").factory(), memory_gb=0.5)


def test_a_headline_metric_reaches_the_batch_summary_and_a_second_key_is_refused(registries):
    """The summary's columns come from the registry: the toy metric (``summary=True``) becomes a
    column with no change to batch code; registering its key again is refused."""
    from ctpore.pipelines.batch_summary import columns

    assert "first_slice_porosity" not in columns()
    registries("toy_metric")
    assert "first_slice_porosity" in columns()
    assert set(M.summary_keys()) <= set(columns())
    with pytest.raises(ValueError, match="first_slice_porosity"):
        registries("toy_metric")
