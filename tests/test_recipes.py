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
        assert keys == {m.key for m in M.METRICS}
