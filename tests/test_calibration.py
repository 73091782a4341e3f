"""Probability calibration: isotonic fit against a brute-force reference and known reliability."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ctpore.data import calibration as C
from ctpore.errors import InputError


def _isotonic_reference(y, w):
    """The isotonic regression by its min-max formula: fit_i = max_{j<=i} min_{k>=i} mean_w(y[j..k])."""
    n = len(y)
    out = np.empty(n)
    for i in range(n):
        out[i] = max(
            min(np.sum(w[j:k + 1] * y[j:k + 1]) / np.sum(w[j:k + 1]) for k in range(i, n))
            for j in range(i + 1)
        )
    return out


@pytest.mark.parametrize("seed", range(8))
def test_isotonic_equals_the_min_max_formula(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 15))
    y = rng.normal(size=n).cumsum() * rng.choice([-1, 1]) + rng.normal(size=n)
    w = rng.uniform(0.1, 5.0, size=n)
    fit = C.isotonic(y, w)
    np.testing.assert_allclose(fit, _isotonic_reference(y, w), atol=1e-12)
    assert np.all(np.diff(fit) >= -1e-12)


def _draw(rng, n, truth_of_p):
    p = rng.random(n).astype(np.float32)
    t = (rng.random(n) < truth_of_p(p)).astype(np.uint8)
    return p, t


def test_fit_recovers_a_known_reliability_and_lowers_the_brier_score():
    rng = np.random.default_rng(1)
    f = lambda p: p**2  # noqa: E731  the model says p; the voxel is pore with probability p^2
    cal = C.fit_calibration([_draw(rng, 400_000, f), _draw(rng, 400_000, f)])
    grid = np.linspace(0.05, 0.95, 19, dtype=np.float32)
    np.testing.assert_allclose(C.apply_calibration(grid, cal), f(grid), atol=0.02)
    p, t = _draw(np.random.default_rng(2), 400_000, f)  # fresh voxels
    raw = np.mean((p - t) ** 2)
    calibrated = np.mean((C.apply_calibration(p, cal) - t) ** 2)
    oracle = np.mean((f(p) - t) ** 2)
    assert calibrated < raw - 0.02
    assert calibrated < oracle + 5e-4


def test_an_already_calibrated_model_is_left_almost_unchanged():
    rng = np.random.default_rng(3)
    cal = C.fit_calibration([_draw(rng, 600_000, lambda p: p)])
    grid = np.linspace(0.02, 0.98, 25, dtype=np.float32)
    np.testing.assert_allclose(C.apply_calibration(grid, cal), grid, atol=0.02)


def test_apply_is_monotone_chunked_and_in_place(monkeypatch):
    rng = np.random.default_rng(4)
    cal = C.fit_calibration([_draw(rng, 100_000, lambda p: np.sqrt(p))])
    p = rng.random((7, 11, 13)).astype(np.float32)
    whole = C.apply_calibration(p, cal)
    monkeypatch.setattr(C, "_CHUNK", 50)  # many chunks, one ragged
    chunked = C.apply_calibration(p, cal)
    np.testing.assert_array_equal(whole, chunked)
    order = np.argsort(p.ravel())
    assert np.all(np.diff(whole.ravel()[order]) >= 0)
    q = p.copy()
    C.apply_calibration(q, cal, out=q)
    np.testing.assert_array_equal(q, whole)
    np.testing.assert_array_equal(C.apply_calibration(p, None), p)


def _tiny_weights(tmp_path, name, metadata):
    from ctpore.models import PoreFormer, PoreFormerConfig
    from ctpore.models.weights import save_weights

    torch.manual_seed(0)
    model = PoreFormer(PoreFormerConfig(d_model=16, n_heads=2, n_layers=1, stem_channels=4,
                                        level_channels=(8, 16), level_attention=(0, 1))).eval()
    return save_weights(model, tmp_path / name, metadata=metadata)


def test_reconstruct_calibrates_the_probability_map_but_not_the_pores(tmp_path):
    from ctpore.pipelines.reconstruct import reconstruct

    rng = np.random.default_rng(5)
    cal = C.fit_calibration([_draw(rng, 50_000, lambda p: p**3)])
    plain = _tiny_weights(tmp_path, "plain.safetensors", {"threshold": "0.5"})
    with_cal = _tiny_weights(tmp_path, "cal.safetensors", {"threshold": "0.5", "calibration": json.dumps(cal)})
    scan = (rng.random((9, 20, 17)) * 200).astype(np.uint8)
    a = reconstruct(scan, "poreformer", weights=plain)
    b = reconstruct(scan, "poreformer", weights=with_cal)
    np.testing.assert_array_equal(a.pores, b.pores)
    np.testing.assert_allclose(b.probability, C.apply_calibration(a.probability, cal), atol=1e-7)
    assert not np.allclose(a.probability, b.probability)


def test_a_malformed_calibration_is_an_input_error_naming_the_file(tmp_path):
    from ctpore.pipelines.reconstruct import reconstruct

    bad = _tiny_weights(tmp_path, "bad.safetensors", {"calibration": json.dumps({"x": [0.1, 0.5], "y": [0.2]})})
    with pytest.raises(InputError, match="calibration") as exc:
        reconstruct(np.zeros((4, 8, 8), np.uint8), "poreformer", weights=bad)
    assert "bad.safetensors" in str(exc.value)


def test_refit_postprocessing_keeps_tensors_and_provenance_and_does_not_raise_mse(tmp_path, monkeypatch):
    from ctpore.models.weights import read_metadata
    from ctpore.pipelines import train as T
    from safetensors.torch import load_file

    monkeypatch.setattr(T.export, "POSTPROCESSING_SCANS", 3)  # the run's 2 validation scans and one more
    cfg = T.config_from_dict({
        "model": "poreformer",
        "model_config": {"d_model": 16, "n_heads": 2, "n_layers": 1, "stem_channels": 4, "level_channels": [8, 16],
                         "level_attention": [0, 1]},
        "data": {"n_train": 2, "n_val": 2, "volume_size": 16, "crop": [8, 12, 12]},
        "steps": 4, "batch_size": 2, "warmup": 1, "val_every": 4, "ckpt_every": 4,
    })
    res = T.train(cfg, tmp_path / "run")
    path = T.export_weights(res, tmp_path / "w.safetensors")
    first = read_metadata(path)
    assert json.loads(first["calibration"])["x"]  # export fits one on the post-processing scans
    assert sum(json.loads(first["calibration"])["n"]) == 3 * 16**3
    before = load_file(str(path))
    out = T.refit_postprocessing(path)
    after = load_file(str(path))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    meta = read_metadata(path)
    for k in ("train_config", "data_config_sha256", "steps", "threshold", "confidence", "min_size", "calibration"):
        assert meta[k] == first[k], k  # same model, same scans: the same choices
    assert meta["confidence"] == out["postprocessing"].to_metadata()["confidence"]
    stored = json.loads(meta["calibration"])
    assert np.all(np.diff(stored["y"]) >= 0)
    assert out["mse"] <= out["mse_raw"] + 1e-4


def test_refit_refuses_a_file_without_training_provenance(tmp_path):
    from ctpore.pipelines.train import refit_postprocessing

    path = _tiny_weights(tmp_path, "bare.safetensors", {})
    with pytest.raises(InputError, match="training config"):
        refit_postprocessing(path)
