"""Training: resumable to the same weights, stops on non-finite values, learns something."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from ctpore.errors import InputError, NonFiniteError
from ctpore.models.losses import loss_terms, soft_skeleton
from ctpore.pipelines.train import (
    config_from_dict,
    export_weights,
    train,
)

TINY = {
    "model": "poreformer",
    "model_config": {"d_model": 16, "n_heads": 2, "n_layers": 1, "stem_channels": 4, "level_channels": [8, 16],
                     "level_attention": [0, 1]},
    "data": {"n_train": 2, "n_val": 1, "volume_size": 16, "crop": [8, 12, 12]},
    "steps": 6,
    "batch_size": 2,
    "warmup": 2,
    "val_every": 3,
    "ckpt_every": 2,
}


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_resumed_run_ends_with_the_same_weights(tmp_path):
    cfg = config_from_dict(TINY)
    full = train(cfg, tmp_path / "full")
    part = train(cfg, tmp_path / "resumed", stop_after=3)  # interrupted after step 3 (checkpoint at 3)
    assert part.steps == 3
    resumed = train(cfg, tmp_path / "resumed")  # picks the checkpoint up
    assert resumed.steps == cfg.steps
    a, b = _weights(full.model), _weights(resumed.model)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # and the validation records (incl. attention entropy per head, train and val) agree too
    assert [r["step"] for r in full.history] == [3, 6]
    assert full.history[-1]["val_dice"] == resumed.history[-1]["val_dice"]
    assert len(full.history[-1]["attn_entropy_train"]) == 2


def test_resume_refuses_a_checkpoint_of_another_config(tmp_path):
    cfg = config_from_dict(TINY)
    train(cfg, tmp_path / "run", stop_after=2)
    other = config_from_dict({**TINY, "lr": 0.1})
    with pytest.raises(InputError, match="different config"):
        train(other, tmp_path / "run")


def test_non_finite_loss_stops_training_naming_the_tensor(tmp_path):
    cfg = config_from_dict({**TINY, "lr": 1e30, "warmup": 1, "grad_clip": 1e30})
    with pytest.raises(NonFiniteError) as exc:
        train(cfg, tmp_path / "run")
    msg = str(exc.value)
    assert "non-finite" in msg and "step" in msg
    assert any(name in msg for name in ("logits", "loss term", "gradient_norm", "layer", "blocks"))


def test_unknown_config_key_is_an_input_error():
    with pytest.raises(InputError, match="unknown"):
        config_from_dict({**TINY, "stpes": 3})


def test_soft_skeleton_of_a_bar_is_its_centre_line():
    x = torch.zeros(1, 9, 9, 9)
    x[0, 3:6, 3:6, :] = 1.0  # a 3x3 bar along X
    sk = soft_skeleton(x, iters=3)[0]
    assert sk[4, 4, 2:7].min() > 0.99  # centre line kept
    assert sk[3, 3, 4] < 0.01  # corners of the cross-section removed
    assert float(sk.sum()) < float(x.sum()) / 3


def test_loss_terms_are_zero_for_a_perfect_confident_prediction():
    y = torch.zeros(1, 6, 8, 8)
    y[0, 2:4, 2:6, 2:6] = 1
    logits = (y * 2 - 1) * 30
    terms = loss_terms(logits, y, config_from_dict(TINY).loss)
    for k, v in terms.items():
        assert float(v) < 1e-6, k
    bad = loss_terms(-logits, y, config_from_dict(TINY).loss)
    assert all(float(v) > 0.5 for v in bad.values())


def test_export_writes_loadable_weights_with_provenance(tmp_path, monkeypatch):
    from ctpore.models.weights import load_model, read_metadata
    from ctpore.pipelines import train as T

    monkeypatch.setattr(T.export, "POSTPROCESSING_SCANS", 2)
    cfg = config_from_dict({**TINY, "steps": 2})
    res = train(cfg, tmp_path / "run")
    path = export_weights(res, tmp_path / "w.safetensors")
    meta = read_metadata(path)
    assert len(meta["data_config_sha256"]) == 64
    model = load_model(path)
    x = torch.randn(1, 5, 12, 12)
    res.model.eval()
    with torch.no_grad():
        assert torch.allclose(model(x), res.model(x), atol=1e-6)


@pytest.mark.parametrize("context", [0, 3, 10])
def test_batch_context_window_holds_the_labelled_crop(context):
    """The labels are the crop at the stated margins inside the input window (no augmentation,
    so a label equals ``scan > 0`` voxel for voxel where the truth was built that way)."""
    import numpy as np

    from ctpore.pipelines.train import Pool, make_batch

    rng = np.random.default_rng(0)
    scans = [rng.standard_normal((10, 20, 18)).astype(np.float32) for _ in range(3)]
    pool = Pool(scans, [(s > 0).astype(np.float32) for s in scans], ["a", "b", "c"])
    cfg = config_from_dict({**TINY, "data": {**TINY["data"], "augment": False,
                                              "context": context}})
    for step in range(5):
        x, y, _z, (mt, mb, ml, mr), _skel = make_batch(pool, cfg, step)
        assert y.shape == (2, 8, 12, 12)
        assert x.shape == (2, 8, 12 + mt + mb, 12 + ml + mr)
        assert x.shape[2] == min(12 + 2 * context, 20) and x.shape[3] == min(12 + 2 * context, 18)
        inner = x[:, :, mt:x.shape[2] - mb, ml:x.shape[3] - mr]
        assert torch.equal(y, (inner > 0).float())
        if context == 0:
            assert (mt, mb, ml, mr) == (0, 0, 0, 0)


@pytest.mark.parametrize("model", ["poreformer", "unet2d"])
def test_training_with_context_runs_and_is_deterministic(tmp_path, model):
    d = {**TINY, "model": model, "steps": 2, "val_every": 2,
         "data": {**TINY["data"], "volume_size": 24, "crop": [8, 12, 12], "context": 6}}
    if model != "poreformer":
        d["model_config"] = {"channels": [4, 8], "strides": [2]}
    a = train(config_from_dict(d), tmp_path / "a")
    b = train(config_from_dict(d), tmp_path / "b")
    for k, v in _weights(a.model).items():
        assert torch.equal(v, _weights(b.model)[k]), k


@pytest.mark.parametrize("name, config", [("poreformer", "train"), ("unet2d", "train_unet2d"),
                                          ("unet3d", "train_unet3d")])
def test_shipped_weights_were_trained_by_the_configs_in_configs(name, config):
    """The training commands of docs/training.md are what made the shipped weights: the first stage's config,
    then the second's (``<config>_continued.yaml``) and the third's (``<config>_stage3.yaml``), each
    warm-started from the stage before's export; the same data, and the budget of all stages in the file."""
    import json
    from pathlib import Path

    from ctpore.models.weights import read_metadata
    from ctpore.pipelines.train import (DATA_KEYS_ADDED, LOSS_KEYS_ADDED, TRAIN_KEYS_ADDED, config_to_dict,
                                        data_config_hash, load_train_config)

    root = Path(__file__).resolve().parent.parent
    weights = root / "models" / "weights" / f"{name}.safetensors"
    if not weights.exists():
        pytest.skip(f"no shipped {name} weights")
    meta = read_metadata(weights)
    stages = [load_train_config(root / "configs" / f"{config}{suffix}.yaml")
              for suffix in ("", "_continued", "_stage3")]
    last = stages[-1]
    stored = {**TRAIN_KEYS_ADDED, **json.loads(meta["train_config"])}
    stored["data"] = {**DATA_KEYS_ADDED, **stored["data"]}  # keys added after it was written
    stored["loss"] = {**LOSS_KEYS_ADDED, **stored["loss"]}
    # the starting file is named by where the run found it; its record says what it was
    want = config_to_dict(last)
    assert Path(stored.pop("init_weights")).name == Path(want.pop("init_weights")).name == f"{name}.safetensors"
    assert stored == want
    assert meta["data_config_sha256"] == data_config_hash(last)
    # the file it started from is the second stage's export, which counted the first stage's steps
    init = json.loads(meta["init_weights"])
    assert init["data_config_sha256"] == data_config_hash(stages[1])
    assert init["steps"] == stages[0].steps + stages[1].steps
    assert int(meta["steps"]) == sum(s.steps for s in stages)
    assert float(meta["train_seconds"]) > init["train_seconds"] > 0
    # every later stage changes only the data's size and the start: the earlier volumes are the same
    for a, b in zip(stages, stages[1:]):
        assert {**config_to_dict(a), "data": None, "init_weights": None} == \
            {**config_to_dict(b), "data": None, "init_weights": None}
        assert {**config_to_dict(a)["data"], "n_train": None} == {**config_to_dict(b)["data"], "n_train": None}
        assert b.data.n_train > a.data.n_train
        assert Path(b.init_weights).name == f"{name}.safetensors"
    # its post-processing and calibration were chosen on the validation seed range, so they ship
    from ctpore.models.weights import read_postprocessing

    cal = read_postprocessing(weights, meta).calibration
    assert cal is not None and sum(cal["n"]) >= 48 * last.data.volume_size**3
    assert all(b >= a for a, b in zip(cal["y"], cal["y"][1:]))


def test_simulated_pool_enlarges_half_the_scans_when_zoom_max_is_set():
    from ctpore.data.synthetic import draw_zoom, make_pair
    from ctpore.data.normalize import normalize_volume
    from ctpore.pipelines.train import SEED_STRIDE, data_config_hash, simulated_pool

    cfg = config_from_dict({**TINY, "data": {**TINY["data"], "n_train": 6, "zoom_max": 2.5}})
    pool = simulated_pool(cfg.data)
    seeds = [cfg.data.seed * SEED_STRIDE + i for i in range(6)]
    zooms = [draw_zoom(s, 2.5) for s in seeds]
    assert any(z > 1.0 for z in zooms)  # this draw has both kinds
    for s, z, scan, truth in zip(seeds, zooms, pool.scans, pool.truths):
        ref_scan, ref_truth, _ = make_pair(s, shape=(16, 16, 16), zoom=z)
        assert (truth == ref_truth).all() and (scan == normalize_volume(ref_scan)).all()
    # zoom_max 1 is the data of configs written before it existed: same scans, same hash
    plain = config_from_dict(TINY)
    assert data_config_hash(plain) == data_config_hash(config_from_dict(
        {**TINY, "data": {**TINY["data"], "zoom_max": 1.0}}))
    zoomed = copy.copy(plain)
    zoomed.data = dataclasses.replace(plain.data, zoom_max=2.5)
    assert data_config_hash(plain) != data_config_hash(zoomed)
    assert data_config_hash(config_from_dict({**TINY, "data": {**TINY["data"], "zoom_max": 2}})) == \
        data_config_hash(config_from_dict({**TINY, "data": {**TINY["data"], "zoom_max": 2.0}}))
    for bad in (0.5, None, "x", float("nan")):
        with pytest.raises(InputError, match="zoom_max"):
            config_from_dict({**TINY, "data": {**TINY["data"], "zoom_max": bad}})


def test_a_checkpoint_written_before_zoom_max_existed_still_resumes(tmp_path):
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    cfg = config_from_dict(TINY)
    full = train(cfg, tmp_path / "full")
    train(cfg, tmp_path / "old", stop_after=2)
    ckpt = tmp_path / "old" / "checkpoint.safetensors"
    with safe_open(str(ckpt), framework="pt") as fh:  # rewrite it as an older version did
        meta, tensors = fh.metadata(), {k: fh.get_tensor(k) for k in fh.keys()}
    old = json.loads(meta["train_config"])
    del old["data"]["zoom_max"], old["data"]["context"]
    save_file(tensors, str(ckpt), metadata={**meta, "train_config": json.dumps(old)})
    resumed = train(cfg, tmp_path / "old")
    for k, v in _weights(full.model).items():
        assert torch.equal(v, _weights(resumed.model)[k]), k


def test_warm_start_begins_from_the_given_weights_and_counts_their_budget(tmp_path, monkeypatch):
    """A run with ``init_weights`` starts from that file's network (its first update is the same as
    one more step of a model holding those weights) and its export counts both stages' steps."""
    import json

    from ctpore.models.weights import read_metadata
    from ctpore.pipelines import train as T

    monkeypatch.setattr(T.export, "POSTPROCESSING_SCANS", 2)
    first = train(config_from_dict({**TINY, "steps": 2}), tmp_path / "first")
    init = export_weights(first, tmp_path / "first.safetensors")
    cont = config_from_dict({**TINY, "steps": 3, "init_weights": str(init)})
    before = train(cont, tmp_path / "zero", stop_after=0)  # loads, takes no step
    for k, v in _weights(first.model).items():
        assert torch.equal(before.model.state_dict()[k], v), k
    res = train(cont, tmp_path / "cont")
    assert any(not torch.equal(res.model.state_dict()[k], v) for k, v in _weights(first.model).items())
    meta = read_metadata(export_weights(res, tmp_path / "cont.safetensors"))
    assert int(meta["steps"]) == 2 + 3
    rec = json.loads(meta["init_weights"])
    assert rec["steps"] == 2 and rec["file"] == "first.safetensors" and len(rec["sha256"]) == 64
    # resuming the continued run keeps its record; another network or a missing file is refused
    assert T.loop.init_record(train(cont, tmp_path / "cont").history)["sha256"] == rec["sha256"]
    other = {**TINY, "model_config": {**TINY["model_config"], "d_model": 8}, "init_weights": str(init)}
    with pytest.raises(InputError, match="different network"):
        train(config_from_dict(other), tmp_path / "other")
    with pytest.raises(InputError, match="no such weights file"):
        train(config_from_dict({**TINY, "init_weights": str(tmp_path / "nope.safetensors")}), tmp_path / "x")


def test_labelled_scans_are_read_through_the_format_table(tmp_path):
    """--images/--labels take every format ctpore reads (here NIfTI and HDF5 scans, TIFF labels),
    matched by sorted name; other files are not entries; a folder with no scan is refused naming it."""
    h5py = pytest.importorskip("h5py")
    import nibabel as nib
    import numpy as np
    import tifffile

    from ctpore.errors import InputError
    from ctpore.pipelines.train.batches import labelled_pool

    images, labels = tmp_path / "images", tmp_path / "labels"
    images.mkdir()
    labels.mkdir()
    rng = np.random.default_rng(0)
    vols = [rng.integers(0, 255, (8, 12, 10)).astype(np.uint8) for _ in range(2)]
    truths = [(v > 128).astype(np.uint8) for v in vols]
    nib.save(nib.Nifti1Image(np.ascontiguousarray(vols[0].T), np.eye(4)), images / "a.nii.gz")
    with h5py.File(images / "b.h5", "w") as f:
        f.create_dataset("/exchange/data", data=vols[1])
    (images / "notes.txt").write_text("not a scan")
    for name, t in zip(("a.tif", "b.tif"), truths):
        tifffile.imwrite(str(labels / name), t)
    pool = labelled_pool(images, labels)
    assert pool.names == ["a.nii.gz", "b.h5"]
    for got, want in zip(pool.truths, truths):
        np.testing.assert_array_equal(got, want)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no scan in this folder"):
        labelled_pool(empty, labels)
