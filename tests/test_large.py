"""Scans larger than memory: slab-by-slab metrics, writers and outputs equal the whole-volume ones."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest
import torch
from scipy import ndimage as ndi

from ctpore.data.io import geometry_from_array, load_scan, save_volume
from ctpore.data.io.write import SlabWriter
from ctpore.data.metrics import comparison_metrics, volume_metrics
from ctpore.data.slabs import SlabComponents, StreamingTopology
from ctpore.data.connectivity import connectivity_density
from ctpore.data.topology import euler_number, n_components
from ctpore.models.classical import clean_specks
from ctpore.pipelines.methods import Untiled

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def blobs(rng, shape, sigma=1.0):
    level = rng.uniform(-0.3, 0.3)
    return (ndi.gaussian_filter(rng.standard_normal(shape), sigma) > level).astype(np.uint8)


def cuts(rng, n):
    out, z = [], 0
    while z < n:
        k = int(rng.integers(1, 5))
        out.append((z, min(n, z + k)))
        z += k
    return out


def test_streamed_topology_equals_the_whole_volume():
    rng = np.random.default_rng(0)
    for _ in range(25):
        shape = tuple(int(s) for s in rng.integers(1, 14, 3))
        vol = blobs(rng, shape)
        st, solid = StreamingTopology(), SlabComponents(6)
        for a, b in cuts(rng, shape[0]):
            st.add(vol[a:b])
            solid.add(vol[a:b] == 0)
        spacing = (0.5, 1.0, 2.0)
        assert st.euler_number(26) == euler_number(vol, 26)
        assert st.euler_number(6) == euler_number(vol, 6)
        assert st.n_components() == n_components(vol, 26)
        assert st.connectivity_density(spacing) == pytest.approx(connectivity_density(vol, spacing), abs=1e-12)
        assert solid.n_components() == n_components(1 - vol, 6)


def test_slab_components_find_the_small_components_of_the_whole_volume():
    rng = np.random.default_rng(1)
    for conn in (26, 6):
        for _ in range(10):
            shape = tuple(int(s) for s in rng.integers(2, 16, 3))
            vol = blobs(rng, shape, 0.7).astype(bool)
            min_size = int(rng.integers(2, 20))
            structure = ndi.generate_binary_structure(3, 3 if conn == 26 else 1)
            labels, _ = ndi.label(vol, structure=structure)
            sizes = np.bincount(labels.ravel())
            want = (sizes < min_size)[labels] & vol
            comp, parts = SlabComponents(conn), cuts(rng, shape[0])
            for a, b in parts:
                comp.add(vol[a:b])
            small = comp.small(min_size)
            got = np.concatenate([small[comp.labels(vol[a:b], i)] for i, (a, b) in enumerate(parts)])
            np.testing.assert_array_equal(got, want)


def test_slab_writer_writes_what_save_volume_writes(tmp_path):
    rng = np.random.default_rng(2)
    arr = (rng.random((6, 5, 7)) * 100).astype(np.int16)  # file order (i, j, k)
    img = nib.Nifti1Image(arr, np.diag([0.5, 0.6, 0.7, 1]))
    img.header.set_xyzt_units("micron")
    nib.save(img, tmp_path / "in.nii.gz")
    with load_scan(tmp_path / "in.nii.gz") as s:
        nifti_geometry = s.geometry
    vol = (rng.random(nifti_geometry.shape) > 0.5).astype(np.uint8)
    for name, geom in (("a.nii.gz", nifti_geometry), ("b.nii", nifti_geometry),
                       ("c.nii.gz", geometry_from_array(vol.shape, (1, 2, 3)))):
        save_volume(tmp_path / f"ref_{name}", vol, geom, dtype=np.uint8)
        with SlabWriter(tmp_path / name, geom, np.uint8) as w:
            w.write(vol[:3])
            w.write(vol[3:])
        got, ref = nib.load(tmp_path / name), nib.load(tmp_path / f"ref_{name}")
        np.testing.assert_array_equal(np.asarray(got.dataobj), np.asarray(ref.dataobj))
        assert got.header.binaryblock == ref.header.binaryblock
    # unfinished or failed: no file
    with pytest.raises(ValueError, match="never written"):
        with SlabWriter(tmp_path / "d.nii.gz", nifti_geometry, np.uint8) as w:
            w.write(vol[:2])
    with pytest.raises(RuntimeError):
        with SlabWriter(tmp_path / "e.nii.gz", nifti_geometry, np.uint8) as w:
            raise RuntimeError("disk full")
    assert not (tmp_path / "d.nii.gz").exists() and not (tmp_path / "e.nii.gz").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("axis", [0, 1])
def test_slab_writer_writes_any_slice_axis_in_the_files_own_order(tmp_path, axis):
    """Slices along the file's first or second axis: the slabs wait in a nameless file and the
    output equals save_volume's, header and voxels, in the input's voxel order."""
    rng = np.random.default_rng(axis)
    arr = (rng.random((6, 5, 7)) * 100).astype(np.int16)
    nib.save(nib.Nifti1Image(arr, np.diag([0.5, 0.6, 0.7, 1])), tmp_path / "in.nii.gz")
    with load_scan(tmp_path / "in.nii.gz", slice_axis=axis) as s:
        vol, geom = s.read(), s.geometry
    save_volume(tmp_path / "ref.nii.gz", vol, geom, dtype=np.float32)
    with SlabWriter(tmp_path / "out.nii.gz", geom, np.float32) as w:
        for z in range(0, vol.shape[0], 2):
            w.write(vol[z:z + 2])
    got, ref = nib.load(tmp_path / "out.nii.gz"), nib.load(tmp_path / "ref.nii.gz")
    np.testing.assert_array_equal(np.asarray(got.dataobj), arr)  # back in the file's voxel order
    np.testing.assert_array_equal(np.asarray(got.dataobj), np.asarray(ref.dataobj))
    assert got.header.binaryblock == ref.header.binaryblock
    with pytest.raises(RuntimeError):
        with SlabWriter(tmp_path / "bad.nii.gz", geom, np.float32) as w:
            w.write(vol[:2])
            raise RuntimeError("disk full")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.nii.gz", "out.nii.gz", "ref.nii.gz"]


class _Given(Untiled):
    """A predictor that writes given probabilities, tile block by tile block as PoreFormer does."""

    name = "given"

    def __init__(self, prob, post):
        self.prob, self.post = prob, post
        self.info = {"model": {"name": "given", "sha256": None}, "device": "cpu", "attention_backend": None}

    def predict(self, volume, out, **kw):
        shape = self.prob.shape
        for y0 in range(0, shape[1], 7):  # tiles outermost, as predict writes them
            for x0 in range(0, shape[2], 9):
                for z0 in range(0, shape[0], 4):
                    key = (slice(z0, min(z0 + 4, shape[0])), slice(y0, min(y0 + 7, shape[1])),
                           slice(x0, min(x0 + 9, shape[2])))
                    out[key] = self.prob[key]
        return {}


def test_postprocessing_slab_by_slab_equals_the_whole_volume(tmp_path):
    """The pipeline's slabs (spilled probabilities, component rules across slabs, calibration,
    writers, metrics) against whole-volume references: clean_specks, scipy's labelling and the
    whole-volume metric functions."""
    from ctpore.data.postprocess import Postprocessing
    from ctpore.pipelines.reconstruct import run_reconstruction
    from ctpore.pipelines.sinks import FileSink

    rng = np.random.default_rng(3)
    for trial in range(5):
        shape = tuple(int(s) for s in rng.integers(6, 24, 3))
        prob = ndi.gaussian_filter(rng.random(shape), 1.0).astype(np.float32)
        prob = (prob - prob.min()) / (prob.max() - prob.min())
        truth = blobs(rng, shape)
        geom = geometry_from_array(shape, (0.5, 0.5, 0.5))
        save_volume(tmp_path / "truth.nii.gz", truth, geom, dtype=np.uint8)
        cal = {"x": [0.0, 0.5, 1.0], "y": [0.1, 0.4, 0.95]}
        min_size, slab_gb = int(rng.integers(2, 12)), [0.33, 0.34, None][trial % 3]
        post = Postprocessing(min_size=min_size, calibration=cal)
        paths = {"pores": tmp_path / f"p{trial}.nii.gz", "prob": tmp_path / f"q{trial}.nii.gz"}
        got = run_reconstruction(prob, geom, _Given(prob, post), FileSink(paths, geom), folder=tmp_path,
                                 truth=tmp_path / "truth.nii.gz", memory_gb=slab_gb)
        pores = clean_specks((prob >= 0.5).astype(np.uint8), min_size)
        calibrated = np.interp(prob, cal["x"], cal["y"]).astype(np.float32)
        want = volume_metrics(pores, geom.spacing_mm)
        compared = comparison_metrics(pores, truth, prob=calibrated, betti=True)
        # the prediction's own figures stand once, under the volume's keys
        for own, twin in (("porosity", "porosity_pred"), ("euler_number", "euler_number_pred"), ("n_pores", "b0_pred"),
                          ("n_tunnels", "b1_pred"), ("n_cavities", "b2_pred")):
            assert want[own] == pytest.approx(compared.pop(twin)) and twin not in got
        want.update(compared)
        for k, v in want.items():
            assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
        with load_scan(paths["pores"]) as s:
            np.testing.assert_array_equal(s.read(), pores)
        with load_scan(paths["prob"]) as s:
            np.testing.assert_allclose(s.read(), calibrated, atol=1e-7)
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ctpore-spill")]


def test_a_streamed_reconstruction_equals_the_in_memory_one(tmp_path):
    from ctpore.data.synthetic import make_pair
    from ctpore.models import PoreFormer, PoreFormerConfig
    from ctpore.models.weights import save_weights
    from ctpore.pipelines import reconstruct as R

    scan, truth, _ = make_pair(3, shape=(20, 40, 44))
    for name, arr in (("s.nii", scan), ("t.nii.gz", truth)):
        nib.save(nib.Nifti1Image(np.ascontiguousarray(arr.T), np.diag([0.01, 0.01, 0.01, 1])), tmp_path / name)
    torch.manual_seed(0)
    model = PoreFormer(PoreFormerConfig(d_model=16, n_heads=2, stem_channels=4, level_channels=(8, 16),
                                        level_attention=(0, 1))).eval()
    cal = {"x": [0.0, 0.5, 1.0], "y": [0.05, 0.45, 0.9], "n": [1, 1, 1]}
    w = save_weights(model, tmp_path / "w.safetensors", {"threshold": "0.5", "min_size": "4",
                                                         "calibration": json.dumps(cal)})
    kw = dict(weights=w, truth=tmp_path / "t.nii.gz", tile=24, chunk_slices=8)
    mem = R.reconstruct(tmp_path / "s.nii", "poreformer", **kw)  # the API: everything in memory
    big = R.reconstruct_file(tmp_path / "s.nii", tmp_path / "big", "poreformer", **kw)
    for k, v in mem.metrics.items():
        if k in ("seconds", "stage_seconds"):  # timings
            continue
        if isinstance(v, float):
            assert big["result"][k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
        else:
            assert big["result"][k] == v, k
    with load_scan(big["pores"]) as s:
        np.testing.assert_array_equal(s.read(), mem.pores)
    with load_scan(big["prob"]) as s:
        np.testing.assert_array_equal(s.read(), mem.probability)
    assert sorted(p.name for p in (tmp_path / "big").iterdir()) == ["s_metrics.json", "s_pores.nii.gz",
                                                                     "s_prob.nii.gz"]
    # a compressed scan whose plane takes several tiles is read from a temporary uncompressed copy
    gz = R.reconstruct_file(tmp_path / "t.nii.gz", tmp_path / "gz", "poreformer", weights=w, tile=24, chunk_slices=8)
    ref = R.reconstruct(tmp_path / "t.nii.gz", "poreformer", weights=w, tile=24, chunk_slices=8)
    assert gz["result"]["euler_number"] == ref.metrics["euler_number"]
    assert not [p for p in (tmp_path / "gz").iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("shape", [(96, 256, 256), (8, 1024, 1024), (2000, 2000, 2000)])
def test_the_budget_plan_keeps_slab_and_model_within_what_is_left(shape):
    """plan_budget (what reconstruct uses): slab + the model's estimated working memory of its plan
    fit in memory_gb less what the process holds before any scan."""
    from ctpore.models.weights import default_weights_path, load_model
    from ctpore.pipelines.budget import BASE_BYTES, plan_budget, slab_bytes
    from ctpore.pipelines.stream_plan import plan_streaming, plan_tiles

    model = load_model(default_weights_path())
    for gb in (1.0, 1.5, 4.0):
        slab, model_bytes = plan_budget(shape, gb)
        tile, chunk = plan_streaming(model, shape, model_bytes)
        window = max((w[1] - w[0], w[3] - w[2]) for _c, w in plan_tiles(shape[1], shape[2], tile, model.halo))
        core = (min(tile, shape[1]), min(tile, shape[2]))
        used = slab_bytes(shape[1:], slab) + model.inference_bytes(window, core, chunk)
        assert 1 <= slab <= shape[0] and 1 <= chunk <= shape[0]
        assert used <= gb * 2**30 - BASE_BYTES
