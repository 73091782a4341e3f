"""Tests of the synthetic structures and the CT scanner model (ctpore.data.synthetic).

Truths used: porosity counted directly on the arrays; the noise-free scanner is an exact linear map
of the pore occupancy (computed here independently by block averaging); noise std, Poisson scaling
and clipping fractions follow from the parameters analytically; Otsu from scikit-image.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from skimage.filters import threshold_otsu

from ctpore.data import synthetic as S
from ctpore.errors import InputError
from ctpore.pipelines.bench.quality import default_leopard

LEOPARD = default_leopard() or Path("missing")

# a scanner with nothing but the partial-volume grey mapping (noise std ~1e-9 of the contrast)
CLEAN = S.ScannerParams(dtype="uint16", pore_level=0.1, contrast=0.6, cnr=1e9, poisson_fraction=0.0,
                        noise_corr_xy=0.0, noise_corr_z=0.0, psf_xy=0.0, psf_z=0.0)


def _block_occupancy(fine: np.ndarray, f: int) -> np.ndarray:
    z, y, x = (s // f for s in fine.shape)
    return fine.reshape(z, f, y, f, x, f).mean(axis=(1, 3, 5))


def _dice(a: np.ndarray, b: np.ndarray) -> float:
    return 2.0 * np.logical_and(a, b).sum() / (a.sum() + b.sum())


def _mean_chord(pores: np.ndarray, axis: int) -> float:
    """Mean length of runs of pore voxels along ``axis``."""
    b = np.moveaxis(pores, axis, -1).reshape(-1, pores.shape[axis]).astype(np.int8)
    d = np.diff(np.pad(b, ((0, 0), (1, 1))), axis=1)
    starts, ends = np.nonzero(d == 1), np.nonzero(d == -1)
    return float((ends[1] - starts[1]).mean())


# ------------------------------------------------------------------ determinism


def test_same_seed_same_pair_different_seed_different_pair():
    s1, t1, i1 = S.make_pair(11, (24, 24, 24))
    s2, t2, i2 = S.make_pair(11, (24, 24, 24))
    assert np.array_equal(s1, s2) and np.array_equal(t1, t2)
    assert i1 == i2
    s3, t3, _ = S.make_pair(12, (24, 24, 24))
    assert not np.array_equal(t1, t3)
    assert s1.shape != s3.shape or s1.dtype != s3.dtype or not np.array_equal(s1, s3)


def test_structure_and_scan_deterministic_given_rng():
    for fam in S.FAMILIES:
        a = S.make_structure(fam, (16, 16, 16), 0.3, np.random.default_rng(5))
        b = S.make_structure(fam, (16, 16, 16), 0.3, np.random.default_rng(5))
        assert np.array_equal(a, b), fam
    fine = S.make_structure("grains", (16, 16, 16), 0.3, np.random.default_rng(1))
    x = S.scan_structure(fine, 2, np.random.default_rng(3))
    y = S.scan_structure(fine, 2, np.random.default_rng(3))
    assert np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1])


# ------------------------------------------------------------------ structures


@pytest.mark.parametrize("family", S.FAMILIES)
def test_porosity_as_asked(family):
    # The threshold is the mean of the fine-grid quantile (exact fine porosity) and of the quantile
    # that makes the majority-downsampled porosity exact; the two differ by the majority rule's
    # bias on interfaces (<= ~0.02 for 2x blocks), so each error is <= ~0.01. Tolerances: 0.02 on
    # the fine grid (the contract) and 0.03 on the truth.
    for k, p in enumerate((0.08, 0.25, 0.4)):
        rng = np.random.default_rng(100 + k)
        fine = S.make_structure(family, (32, 32, 32), p, rng)
        assert fine.dtype == bool and fine.shape == (64, 64, 64)
        assert abs(fine.mean() - p) < 0.02, (family, p, fine.mean())
        _, truth = S.scan_structure(fine, 2, rng, CLEAN)
        assert abs(truth.mean() - p) < 0.03, (family, p, truth.mean())


def test_truth_is_majority_of_fine_grid():
    fine = S.make_structure("vesicles", (16, 20, 24), 0.3, np.random.default_rng(2), oversample=3)
    assert fine.shape == (48, 60, 72)
    _, truth = S.scan_structure(fine, 3, np.random.default_rng(0), CLEAN)
    assert truth.dtype == np.uint8 and truth.shape == (16, 20, 24)
    assert np.array_equal(truth, (_block_occupancy(fine, 3) >= 0.5).astype(np.uint8))


@pytest.mark.parametrize("family", ["bicontinuous", "grains", "vesicles"])
def test_anisotropy_elongates_along_the_given_axis(family):
    # features 3x longer along X than across: pore chords along X clearly longer (the box and the
    # random feature size cap the ratio below 3, so the median of three draws is compared to 1.5)
    ratios, iso = [], []
    for seed in range(3):
        fine = S.make_structure(family, (32, 32, 32), 0.3, np.random.default_rng(seed), anisotropy=3.0,
                                axis=(0.0, 0.0, 1.0))
        ratios.append(_mean_chord(fine, 2) / _mean_chord(fine, 0))
        fine = S.make_structure(family, (32, 32, 32), 0.3, np.random.default_rng(seed), anisotropy=1.0)
        iso.append(_mean_chord(fine, 2) / _mean_chord(fine, 0))
    assert np.median(ratios) > 1.5, ratios
    assert 0.7 < np.median(iso) < 1.4, iso


def test_tubes_run_along_the_axis():
    ratios = []
    for seed in range(3):
        fine = S.make_structure("tubes", (32, 32, 32), 0.15, np.random.default_rng(seed), anisotropy=3.0,
                                axis=(1.0, 0.0, 0.0))
        ratios.append(_mean_chord(fine, 0) / _mean_chord(fine, 2))
    assert np.median(ratios) > 1.5, ratios


def test_bad_inputs_raise_input_error():
    rng = np.random.default_rng(0)
    with pytest.raises(InputError, match="family"):
        S.make_structure("foam", (8, 8, 8), 0.2, rng)
    with pytest.raises(InputError, match="porosity"):
        S.make_structure("grains", (8, 8, 8), 1.5, rng)
    with pytest.raises(InputError, match="shape"):
        S.make_structure("grains", (8, 8), 0.2, rng)
    with pytest.raises(InputError, match="multiple"):
        S.scan_structure(np.zeros((9, 8, 8), bool), 2, rng)
    with pytest.raises(InputError, match="0 .solid. and 1"):
        S.scan_label(np.full((4, 4, 4), 3), rng)
    with pytest.raises(InputError, match="dtype"):
        S.scan_structure(np.zeros((8, 8, 8), bool), 2, rng, replace(CLEAN, dtype="float32"))


# ------------------------------------------------------------------ scanner physics


def test_noise_free_scan_is_the_partial_volume_map():
    fine = S.make_structure("bicontinuous", (24, 24, 24), 0.3, np.random.default_rng(9))
    scan, truth = S.scan_structure(fine, 2, np.random.default_rng(0), CLEAN)
    occ = _block_occupancy(fine, 2)
    expected = np.rint((CLEAN.pore_level + CLEAN.contrast * (1.0 - occ)) * 65535)
    assert scan.dtype == np.uint16
    assert np.abs(scan.astype(float) - expected).max() <= 1.0
    # boundary voxels (partly pore) sit strictly between pure pore and pure solid
    mixed = (occ > 0.2) & (occ < 0.8)
    assert mixed.sum() > 100
    pore_v, solid_v = scan[occ == 1].mean(), scan[occ == 0].mean()
    assert pore_v + 0.1 * (solid_v - pore_v) < scan[mixed].mean() < solid_v - 0.1 * (solid_v - pore_v)


def test_pores_darker_than_solid_for_random_scanners():
    for seed in range(8):
        scan, truth, info = S.make_pair(seed, (24, 24, 24))
        assert scan.dtype == np.dtype(info["params"]["dtype"])
        assert scan[truth == 1].mean() < scan[truth == 0].mean(), info


def _slab(shape=(32, 32, 32), f=2):
    """Fine grid: pore in the first half of X, solid in the second."""
    fine = np.zeros(tuple(s * f for s in shape), bool)
    fine[..., : shape[2] * f // 2] = True
    return fine


@pytest.mark.parametrize("corr", [0.0, 0.8])
def test_noise_std_matches_cnr(corr):
    p = replace(CLEAN, cnr=5.0, noise_corr_xy=corr, noise_corr_z=corr)
    scan, _ = S.scan_structure(_slab(), 2, np.random.default_rng(1), p)
    solid = scan[:, :, 20:].astype(float)  # well inside the solid half
    expected = p.contrast / p.cnr * 65535
    assert 0.85 * expected < solid.std() < 1.15 * expected


def test_poisson_noise_grows_with_grey_value():
    p = replace(CLEAN, cnr=5.0, poisson_fraction=1.0, pore_level=0.05, contrast=0.3)
    scan, _ = S.scan_structure(_slab((32, 32, 32)), 2, np.random.default_rng(2), p)
    pore_std = scan[:, :, 2:12].astype(float).std()
    solid_std = scan[:, :, 20:30].astype(float).std()
    b = p.pore_level / p.contrast  # variance ∝ grey value: ratio sqrt(b / (b + 1))
    assert abs(pore_std / solid_std - np.sqrt(b / (b + 1))) < 0.05


def test_clipping_at_zero_and_integer_range():
    p = replace(CLEAN, dtype="uint8", pore_level=0.0, contrast=0.5, cnr=4.0)
    scan, _ = S.scan_structure(_slab(), 2, np.random.default_rng(3), p)
    assert scan.dtype == np.uint8
    pores = scan[:, :, 2:12]
    # pure pore sits at grey 0 with symmetric noise: about half clips at 0, nothing wraps round
    assert 0.4 < (pores == 0).mean() < 0.6
    assert pores.max() < 0.8 * 255  # noise std is 0.125 * 255: nothing near the top (no wrap-round)


def test_drift_and_steps_move_slice_means():
    solid = np.zeros((128, 32, 32), bool)
    quiet = replace(CLEAN, cnr=20.0)
    drifting = replace(quiet, drift_amplitude=0.05, drift_length=10.0, step_rate=3.0, step_amplitude=0.1)
    s0, _ = S.scan_structure(solid, 2, np.random.default_rng(4), quiet)
    s1, _ = S.scan_structure(solid, 2, np.random.default_rng(4), drifting)
    m0, m1 = s0.mean(axis=(1, 2)), s1.mean(axis=(1, 2))
    c = quiet.contrast * 65535
    # without drift, slice means vary only by noise: (1/20) c / 256 per slice
    assert m0.std() < 0.01 * c
    assert m1.std() > 0.02 * c


def test_rings_are_concentric_around_the_rotation_axis():
    solid = np.zeros((8, 96, 96), bool)
    p = replace(CLEAN, ring_count=6, ring_amplitude=0.15, ring_width=1.0, axis_y=0.1, axis_x=-0.15)
    scan, _ = S.scan_structure(solid, 2, np.random.default_rng(5), p)
    img = scan.mean(axis=0)
    assert np.allclose(scan, img[None], atol=1.0)  # the same rings in every slice
    cy, cx = 23.5 + 0.1 * 48, 23.5 - 0.15 * 48  # the axis: slice centre + offset * size
    yy, xx = np.mgrid[:48, :48]
    r = np.hypot(yy - cy, xx - cx)
    rbin = np.round(r * 2).astype(int)  # half-voxel radius bins
    within = np.mean([img[rbin == k].std() for k in np.unique(rbin) if (rbin == k).sum() > 4])
    assert img.std() > 0.005 * 0.6 * 65535  # rings are there
    assert within < 0.25 * img.std()  # and constant on circles around the axis


def test_cupping_darkens_towards_the_axis():
    solid = np.zeros((4, 64, 64), bool)
    p = replace(CLEAN, cupping=0.2, fov_radius=1.0)
    scan, _ = S.scan_structure(solid, 2, np.random.default_rng(6), p)
    r = np.hypot(*np.mgrid[:32, :32] - 15.5)
    # analytic: grey = pore + contrast * (1 - cupping * (1 - (r / R)^2)), R = 32 voxels
    expected = (p.pore_level + p.contrast * (1 - p.cupping * (1 - (r / 32.0) ** 2))) * 65535
    assert np.abs(scan[0].astype(float) - expected).max() <= 1.0


def test_random_scanner_params_are_varied_and_serialisable():
    draws = [S.ScannerParams.random(np.random.default_rng(s)) for s in range(40)]
    cnrs = [d.cnr for d in draws]
    assert min(cnrs) < 4.0 and max(cnrs) > 12.0
    assert {d.dtype for d in draws} == {"uint8", "uint16"}
    assert any(d.ring_count > 0 for d in draws) and any(d.ring_count == 0 for d in draws)
    for d in draws[:5]:
        assert S.ScannerParams.from_dict(json.loads(json.dumps(d.as_dict()))) == d


# ------------------------------------------------------------------ real label


def _real_or_synthetic_label() -> np.ndarray:
    if LEOPARD.exists():
        return np.asarray(nib.load(str(LEOPARD)).dataobj).astype(np.uint8)[:64, :64, :64]
    # fallback: two balls and a slanted tube, drawn here
    z, y, x = np.mgrid[:48, :48, :48]
    lab = ((z - 15) ** 2 + (y - 16) ** 2 + (x - 20) ** 2 < 81) | ((z - 33) ** 2 + (y - 30) ** 2 + (x - 28) ** 2 < 49)
    lab |= (y - 0.5 * z - 8) ** 2 + (x - 38) ** 2 < 9
    return lab.astype(np.uint8)


def test_scan_label_contains_the_label_geometry():
    label = _real_or_synthetic_label()
    before = label.copy()
    scan = S.scan_label(label, np.random.default_rng(0), S.ScannerParams.easy())
    assert np.array_equal(label, before)  # input untouched
    assert scan.shape == label.shape and scan.dtype == np.uint8
    seg = scan < threshold_otsu(scan)
    assert _dice(seg, label.astype(bool)) > 0.9
    # noise-free: the grey value gives back the occupancy, whose majority is the label
    clean = S.scan_label(label, np.random.default_rng(0), CLEAN)
    occ = 1.0 - (clean / 65535.0 - CLEAN.pore_level) / CLEAN.contrast
    assert np.mean((occ >= 0.5) != label.astype(bool)) < 0.005
    assert ((occ > 0.05) & (occ < 0.95)).mean() > 0.005  # interfaces are sub-voxel smooth


def test_scan_label_realistic_scanner_still_segmentable():
    label = _real_or_synthetic_label()
    scan = S.scan_label(label, np.random.default_rng(1), S.ScannerParams.realistic())
    assert scan.dtype == np.uint16
    seg = scan < threshold_otsu(scan)
    assert 0.6 < _dice(seg, label.astype(bool)) < 0.98  # hard, noisy, but the geometry is there


# ------------------------------------------------------------------ pairs on disk


def test_make_pair_draws_family_and_porosity_from_seed():
    infos = [S.make_pair(s, (16, 16, 16))[2] for s in range(24)]
    assert {i["family"] for i in infos} == set(S.FAMILIES)
    assert all(0.05 <= i["porosity"] <= 0.45 for i in infos)
    scan, truth, info = S.make_pair(3, (16, 16, 16), family="tubes", porosity=0.2)
    assert info["family"] == "tubes" and info["porosity"] == 0.2
    assert info["porosity_truth"] == pytest.approx(truth.mean())
    assert info["seed"] == 3
    json.dumps(info)  # JSON-ready


def test_write_pairs(tmp_path):
    calls = []
    entries = S.write_pairs(tmp_path / "set", 3, shape=(12, 16, 20), seed=7,
                            progress=lambda d, t, s: calls.append((d, t)))
    assert calls == [(1, 3), (2, 3), (3, 3)]
    manifest = json.loads((tmp_path / "set" / "manifest.json").read_text())
    assert manifest == json.loads(json.dumps(entries)) and len(manifest) == 3
    assert len({e["seed"] for e in manifest}) == 3
    assert sorted(p.name for p in (tmp_path / "set").iterdir()) == sorted(
        ["manifest.json"] + [f"scan_{i:04d}.nii.gz" for i in range(3)] + [f"label_{i:04d}.nii.gz" for i in range(3)])
    for e in manifest:
        simg = nib.load(str(tmp_path / "set" / e["scan"]))
        limg = nib.load(str(tmp_path / "set" / e["label"]))
        scan, label = np.asarray(simg.dataobj), np.asarray(limg.dataobj)
        assert scan.shape == (20, 16, 12)  # the slice axis Z is the file's third axis
        assert scan.dtype.kind == "u" and label.dtype == np.uint8
        assert set(np.unique(label)) <= {0, 1}
        assert np.allclose(simg.affine, np.diag([0.01, 0.01, 0.01, 1.0]))
        assert simg.header.get_xyzt_units()[0] == "mm"
        s2, t2, info = S.make_pair(e["seed"], (12, 16, 20))  # reproducible from the manifest
        assert np.array_equal(scan.T, s2) and np.array_equal(label.T, t2)
        assert e["family"] == info["family"] and e["params"] == info["params"]
    again = S.write_pairs(tmp_path / "again", 1, shape=(12, 16, 20), seed=7)
    assert again[0]["seed"] == manifest[0]["seed"]


def test_zoom_fine_enlarges_a_ball_by_the_factor():
    # a ball of radius 5 off the centre of a 24^3 grid, zoomed 2.5x into a smaller box than 60^3:
    # its volume scales by 2.5^3 and its centre c (voxel-area aligned) goes to (c + 0.5) * 2.5 - 0.5
    g = np.indices((24, 24, 24)).astype(float)
    c0 = np.array([7.0, 9.0, 6.0])
    ball = ((g - c0[:, None, None, None]) ** 2).sum(0) <= 25.0
    from ctpore.data.synthetic.pairs import _zoom_fine

    big = _zoom_fine(ball, (40, 44, 36), 2.5)
    assert big.shape == (40, 44, 36)
    assert big.sum() / ball.sum() == pytest.approx(2.5**3, rel=0.06)
    assert np.allclose(np.argwhere(big).mean(0), (c0 + 0.5) * 2.5 - 0.5, atol=0.25)


def test_zoom_with_a_shape_it_does_not_divide():
    for seed, shape, zoom in ((0, (10, 20, 30), 2.7), (1, (16, 16, 16), 3.0), (2, (33, 17, 21), 1.3)):
        scan, truth, info = S.make_pair(seed, shape, porosity=0.25, zoom=zoom)
        assert scan.shape == truth.shape == shape and info["zoom"] == zoom
        assert abs(truth.mean() - 0.25) < 0.08  # the corner of the enlarged structure, not the whole
        assert info["porosity_truth"] == pytest.approx(truth.mean())


def test_zoom_enlarges_features_keeps_porosity_and_leaves_zoom_1_unchanged():
    for seed in range(3):
        a, b = S.make_pair(seed, (24, 24, 24)), S.make_pair(seed, (24, 24, 24), zoom=1.0)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    ratios = {0: [], 1: []}
    for seed in range(6):
        fam = S.FAMILIES[seed % 4]
        _, t1, i1 = S.make_pair(seed, (48, 48, 48), family=fam, porosity=0.3)
        s3, t3, i3 = S.make_pair(seed, (48, 48, 48), family=fam, porosity=0.3, zoom=3.0)
        assert i3["zoom"] == 3.0 and i1["zoom"] == 1.0 and s3.shape == t3.shape == (48, 48, 48)
        assert abs(t3.mean() - 0.3) < 0.06  # the enlarged structure keeps the porosity asked
        for v in (0, 1):
            ratios[v].append(_mean_chord(t3 == v, 2) / _mean_chord(t1 == v, 2))
    # pores and solid are both about 3x as many voxels across (less: chords are cut at the box)
    for v in (0, 1):
        assert 1.8 < float(np.exp(np.mean(np.log(ratios[v])))) < 3.6
    a, b = S.make_pair(5, (24, 24, 24), zoom=2.0), S.make_pair(5, (24, 24, 24), zoom=2.0)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    for bad in (0.5, float("nan"), float("inf"), None, "big"):
        with pytest.raises(InputError, match="zoom"):
            S.make_pair(1, (16, 16, 16), zoom=bad)


def test_draw_zoom_half_native_half_log_uniform():
    assert all(S.draw_zoom(s, 1.0) == 1.0 for s in range(50))
    z = np.array([S.draw_zoom(s, 3.0) for s in range(2000)])
    assert np.array_equal(z, [S.draw_zoom(s, 3.0) for s in range(2000)])
    native = z == 1.0
    assert 0.45 < native.mean() < 0.55
    logs = np.log(z[~native]) / np.log(3.0)  # uniform on [0, 1]
    assert logs.min() >= 0 and logs.max() <= 1
    assert np.histogram(logs, bins=4, range=(0, 1))[0].min() > 0.2 * (~native).sum()
    for bad in (0.9, float("nan"), None):
        with pytest.raises(InputError, match="zoom_max"):
            S.draw_zoom(1, bad)


def test_write_pairs_with_zoom_is_rebuilt_from_its_manifest(tmp_path):
    entries = S.write_pairs(tmp_path, 4, shape=(16, 16, 16), seed=3, zoom_max=2.5)
    assert any(e["zoom"] > 1.0 for e in entries)
    for e in entries:
        assert e["zoom"] == S.draw_zoom(e["seed"], 2.5)
        label = np.asarray(nib.load(str(tmp_path / e["label"])).dataobj).T
        assert np.array_equal(label, S.make_pair(e["seed"], (16, 16, 16), zoom=e["zoom"])[1])
    with pytest.raises(InputError, match="zoom_max"):
        S.write_pairs(tmp_path / "bad", 1, shape=(16, 16, 16), zoom_max=0.5)
    assert not (tmp_path / "bad").exists()


def test_the_leopard_label_comes_with_the_repository():
    """A clone runs the real-geometry tests without the shared data: the label is in tests/data, and
    it is the geometry its source note describes (porosity 0.2622, Euler number 18 and 17)."""
    from skimage.measure import euler_number

    here = Path(__file__).resolve().parent / "data" / "leopard_porespy" / "label.nii.gz"
    assert LEOPARD == here
    v = np.asarray(nib.load(str(LEOPARD)).dataobj)
    assert v.shape == (100, 100, 100) and set(np.unique(v)) == {0, 1}
    assert round(float(v.mean()), 4) == 0.2622
    assert euler_number(v, connectivity=3) == 18 and euler_number(v, connectivity=1) == 17
    assert nib.load(str(LEOPARD)).header.get_xyzt_units()[0] == "micron"
