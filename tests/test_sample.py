"""The sample and its outside: a cylindrical core's empty or air outside is found and left out of
every figure; a scan without an outside comes out exactly as with the whole volume as sample; a
user's own mask is checked against the scan."""

from __future__ import annotations

import json
import warnings

import nibabel as nib
import numpy as np
import pytest
from helpers import run_cli

from ctpore.data.io import load_scan
from ctpore.data.synthetic import make_pair
from ctpore.models.weights import default_weights_path

pytestmark = pytest.mark.skipif(default_weights_path() is None, reason="no shipped weights")

SHAPE, RADIUS = (32, 96, 96), 42


def core(seed: int, family: str, outside: str):
    """A simulated scan cut to a cylinder (axis along z) with the outside at 0, or at an air grey
    level darker than the pores (with the scan's noise); its label and the cylinder."""
    scan, truth, _ = make_pair(seed, shape=SHAPE, family=family)
    _, yy, xx = np.indices(SHAPE)
    circle = (yy - 47.5) ** 2 + (xx - 47.5) ** 2 <= RADIUS**2
    grey = scan.astype(np.float32)
    if outside == "zero":
        grey[~circle] = 0
    else:
        pore, solid = np.median(scan[truth == 1]), np.median(scan[truth == 0])
        noise = np.std(scan[truth == 0])
        grey[~circle] = pore - 1.5 * (solid - pore) + np.random.default_rng(seed).normal(0, noise, (~circle).sum())
    return grey, truth, circle


def save(path, arr, zooms=(0.01, 0.01, 0.01)):
    img = nib.Nifti1Image(np.ascontiguousarray(arr.T), np.diag([*zooms, 1.0]))
    img.header.set_xyzt_units("mm")
    nib.save(img, path)
    return path


@pytest.mark.parametrize("seed, family, outside", [(12, "tubes", "zero"), (16, "vesicles", "air")])
def test_a_cylindrical_core_is_measured_inside_its_sample(seed, family, outside):
    from ctpore.pipelines.reconstruct import reconstruct

    grey, truth, circle = core(seed, family, outside)
    with pytest.warns(UserWarning, match="lie outside the sample"):
        res = reconstruct(grey, spacing_mm=(0.01, 0.01, 0.01))
    sample = res.sample.astype(bool)
    assert (sample & ~circle).sum() <= 0.01 * (~circle).sum()  # the outside found ...
    assert (~sample & circle).sum() <= 0.01 * circle.sum()  # ... and the core kept
    assert not np.any(res.pores.astype(bool) & ~sample)  # no pore in the outside
    assert res.metrics["porosity"] == pytest.approx(truth[circle].mean(), abs=0.02)
    assert res.metrics["sample_voxels"] == int(sample.sum())
    assert res.metrics["porosity"] == pytest.approx(res.pores[sample].mean())


def test_the_command_writes_the_sample_mask_and_says_what_was_left_out(tmp_path, capsys):
    grey, truth, circle = core(12, "tubes", "zero")
    save(tmp_path / "core.nii", grey)
    code, out, err = run_cli(["reconstruct", tmp_path / "core.nii", "-o", tmp_path / "out"], capsys)
    assert code == 0, err
    assert "lie outside the sample" in err and err.count("ctpore: warning:") >= 1
    with load_scan(tmp_path / "out" / "core_sample.nii.gz") as s:
        sample = s.read().astype(bool)
    with load_scan(tmp_path / "out" / "core_pores.nii.gz") as s:
        pores = s.read().astype(bool)
    np.testing.assert_array_equal(sample, circle)
    assert not np.any(pores & ~sample)
    m = json.loads((tmp_path / "out" / "core_metrics.json").read_text())
    assert m["sample_voxels"] == int(circle.sum()) and m["sample"]["mode"] == "auto"
    assert "constant grey value 0" in m["sample"]["found"]
    assert m["porosity"] == pytest.approx(truth[circle].mean(), abs=0.02)


def test_batch_finds_the_same_sample_and_pores_as_the_api(tmp_path, capsys):
    pytest.importorskip("distributed")
    from ctpore.pipelines.reconstruct import reconstruct

    grey, _truth, _circle = core(16, "vesicles", "air")
    save(tmp_path / "air.nii", grey)
    (tmp_path / "m.txt").write_text("air.nii\n")
    code, _, err = run_cli(["batch", tmp_path / "m.txt", "-o", tmp_path / "b", "--workers", "1"], capsys)
    assert code == 0, err
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api = reconstruct(tmp_path / "air.nii", memory_gb=1.5)
    for name, want in (("air_pores.nii.gz", api.pores), ("air_sample.nii.gz", api.sample)):
        with load_scan(tmp_path / "b" / name) as s:
            np.testing.assert_array_equal(s.read(), want)


def test_a_scan_without_an_outside_comes_out_as_the_whole_volume(tmp_path, capsys):
    scan, _truth, _ = make_pair(3, shape=(24, 48, 48))
    save(tmp_path / "s.nii", scan)
    for mode in ("auto", "all"):
        code, _, err = run_cli(["reconstruct", tmp_path / "s.nii", "-o", tmp_path / mode, "--sample", mode], capsys)
        assert code == 0 and "outside the sample" not in err, err
    for name in ("s_pores.nii.gz", "s_prob.nii.gz"):
        a, b = (np.asarray(nib.load(tmp_path / m / name).dataobj) for m in ("auto", "all"))
        np.testing.assert_array_equal(a, b)
    ma, mb = (json.loads((tmp_path / m / "s_metrics.json").read_text()) for m in ("auto", "all"))
    for k in set(ma) - {"seconds", "stage_seconds", "sample"}:
        assert ma[k] == mb[k], k
    assert ma["sample_voxels"] == 24 * 48 * 48 and ma["sample"]["outside_voxels"] == 0
    assert not (tmp_path / "auto" / "s_sample.nii.gz").exists()


def test_a_users_mask_is_checked_and_used(tmp_path, capsys):
    scan, _truth, _ = make_pair(3, shape=(24, 48, 48))
    save(tmp_path / "s.nii", scan)
    mask = np.zeros(scan.shape, np.uint8)
    mask[:, 8:40, 8:40] = 1
    save(tmp_path / "m.nii", mask)
    code, _, err = run_cli(["reconstruct", tmp_path / "s.nii", "-o", tmp_path / "o", "--sample", tmp_path / "m.nii"],
                           capsys)
    assert code == 0, err
    m = json.loads((tmp_path / "o" / "s_metrics.json").read_text())
    pores = np.asarray(nib.load(tmp_path / "o" / "s_pores.nii.gz").dataobj).T
    assert m["sample"]["mode"] == "mask" and m["sample_voxels"] == int(mask.sum())
    assert not np.any(pores.astype(bool) & (mask == 0))
    assert m["porosity"] == pytest.approx(pores[mask == 1].mean())
    # refused, one line each, nothing written: another shape, another affine, values other than 0/1
    save(tmp_path / "small.nii", mask[:, :40])
    save(tmp_path / "moved.nii", mask, zooms=(0.02, 0.01, 0.01))
    save(tmp_path / "grey.nii", mask * 7)
    for bad, why in (("small.nii", "shape"), ("moved.nii", "affine"), ("grey.nii", "only 1 (sample) and 0")):
        out = tmp_path / f"out-{bad}"
        code, _, err = run_cli(["reconstruct", tmp_path / "s.nii", "-o", out, "--sample", tmp_path / bad], capsys)
        assert code == 2 and why in err and len(err.strip().splitlines()) == 1, err
        assert not out.exists()


def test_the_outside_is_found_from_medians_filtered_where_they_are_looked_at():
    """The dark rule filters only the border strips and the middle box: the same values as scipy's
    3 x 3 median of the whole slice, for odd and even sizes and every kind of outside."""
    from scipy import ndimage as ndi

    from ctpore.data.sample import _border, _filtered_border_and_middle, _middle

    rng = np.random.default_rng(5)
    for y, x in ((8, 8), (9, 13), (40, 41), (64, 37)):
        sl = rng.normal(100, 30, (y, x))
        sl[rng.random((y, x)) < 0.2] = 0  # ties, as a constant outside has
        whole = ndi.median_filter(sl, size=3, mode="nearest")
        b, m = _filtered_border_and_middle(sl)
        assert np.array_equal(b, _border(whole)) and np.array_equal(m, _middle(whole))
