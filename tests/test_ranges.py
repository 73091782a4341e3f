"""The ranges of porosity, Euler number and percolating porosity over five levels of the calibrated
probability (ctpore.pipelines.ranges): the thresholds invert the calibration, the streamed figures
equal whole-volume ones (scikit-image's Euler number, scipy's 26-connected labelling), and a
reconstruction with --analyze writes them."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest
from scipy import ndimage as ndi
from skimage.measure import euler_number as sk_euler

from ctpore.data.calibration import apply_calibration, fit_calibration
from ctpore.data.postprocess import Postprocessing
from ctpore.data.rim import clear_rim
from ctpore.pipelines.ranges import LEVELS, raw_thresholds, threshold_ranges


def _calibration_with_plateaus():
    """A calibration fitted (isotonic, so with plateaus) to a model that is overconfident below 0.5
    and noisy: its map is flat over whole stretches of the raw probability."""
    rng = np.random.default_rng(7)
    p = rng.random(200_000)
    truth = rng.random(p.size) < np.clip(1.4 * p - 0.3 + 0.15 * np.sin(20 * p), 0, 1)
    cal = fit_calibration([(p.astype(np.float32), truth)])
    assert len(set(np.round(cal["y"], 12))) < len(cal["y"])  # it has plateaus
    return cal


def test_a_raw_probability_reaches_the_threshold_exactly_where_its_calibrated_one_reaches_the_level():
    cal = _calibration_with_plateaus()
    raw = np.concatenate([np.random.default_rng(1).random(100_000), np.asarray(cal["x"])])
    mapped = np.interp(raw, cal["x"], cal["y"])  # the calibration, in float64
    for level, t in zip(LEVELS, raw_thresholds(cal)):
        assert 0 < t <= 1
        assert np.interp(t, cal["x"], cal["y"]) == pytest.approx(level, abs=1e-9)
        near = np.abs(raw - t) < 1e-9  # at the threshold itself rounding decides either way
        assert np.array_equal((raw >= t)[~near], (mapped >= level)[~near])
    assert raw_thresholds(None) == list(LEVELS)
    assert raw_thresholds({"x": [0.2, 0.8], "y": [0.45, 0.55]}) == pytest.approx([1e-6, 1e-6, 0.5, 1.0, 1.0])


def _case(shape=(18, 40, 44), seed=3):
    """Smooth raw probabilities, a core's outside codes (1 across its surface) and a calibration."""
    rng = np.random.default_rng(seed)
    field = ndi.gaussian_filter(rng.standard_normal(shape), 1.6)
    prob = (1 / (1 + np.exp(-6 * field / field.std()))).astype(np.float32)
    yy, xx = np.mgrid[: shape[1], : shape[2]]
    inside = (yy - 19.5) ** 2 + (xx - 22) ** 2 <= 17.5 ** 2
    codes = np.broadcast_to(np.where(inside, 0, 1).astype(np.uint8), shape).copy()
    return prob, codes, _calibration_with_plateaus()


def _reference(prob, codes, post, t):
    """The figures at raw threshold ``t`` from the whole volume: the rim cleared and the rules
    applied in memory, scikit-image's Euler number, scipy's 26-connected labelling for the
    percolation along z (the sample's first and last planes are its faces)."""
    p = prob.copy()
    clear_rim(p, codes, threshold=t)
    pores, _ = Postprocessing(threshold=t, confidence=post.confidence, min_size=post.min_size,
                              calibration=post.calibration).apply(p)
    inside = codes == 0
    n = int(inside.sum())
    lab, _ = ndi.label(pores, np.ones((3, 3, 3)))
    both = np.intersect1d(lab[0][lab[0] > 0], lab[-1][lab[-1] > 0])
    perc = float(np.isin(lab, both).sum()) / n
    return float(pores[inside].sum()) / n, int(sk_euler(pores, connectivity=3)), perc


@pytest.mark.parametrize("slab", [4, 18])
def test_the_streamed_ranges_equal_the_whole_volumes_figures_at_each_level(slab):
    prob, codes, cal = _case()
    post = Postprocessing(threshold=0.5, confidence=0.9, min_size=3, calibration=cal)
    got = threshold_ranges(lambda a, b: prob[a:b].copy(), lambda a, b: codes[a:b], prob.shape, post, slab)
    by = got["ranges_by_level"]
    assert by["levels"] == list(LEVELS) and by["raw_thresholds"] == raw_thresholds(cal)
    for i, t in enumerate(by["raw_thresholds"]):
        por, chi, perc = _reference(prob, codes, post, t)
        assert by["porosity"][i] == pytest.approx(por, abs=1e-12)
        assert by["euler_number"][i] == chi
        assert by["percolating_porosity_zyx"][i][0] == pytest.approx(perc, abs=1e-12)
        assert by["percolating_porosity_zyx"][i][1:] == [None, None]  # a core: no faces across it
    assert got["porosity_range"] == [min(by["porosity"]), max(by["porosity"])]
    assert got["euler_number_range"] == [min(by["euler_number"]), max(by["euler_number"])]
    z = [v[0] for v in by["percolating_porosity_zyx"]]
    assert got["percolating_porosity_range"] == [[min(z), max(z)], None, None]
    assert by["porosity"] == sorted(by["porosity"], reverse=True)  # a higher level: fewer pores here
    assert got["porosity_range"][1] > got["porosity_range"][0]


def test_a_method_without_probabilities_has_no_ranges():
    prob, codes, _ = _case((4, 12, 12))
    got = threshold_ranges(lambda a, b: prob[a:b].copy(), None, prob.shape, Postprocessing(binary=True), 4)
    assert got["porosity_range"] is None and got["ranges_by_level"] is None


def test_reconstruct_with_analyze_writes_the_ranges_and_analyze_alone_leaves_them_null(tmp_path):
    from ctpore.data.synthetic import make_pair
    from ctpore.pipelines.analysis_run import analyze
    from ctpore.pipelines.reconstruct import build_predictor, reconstruct_file

    scan, _label, _ = make_pair(2800124, shape=(20, 40, 40), family="vesicles")
    img = nib.Nifti1Image(np.ascontiguousarray(scan.T.astype(np.float32)), np.diag([0.01, 0.01, 0.01, 1.0]))
    img.header.set_xyzt_units("mm")
    nib.save(img, tmp_path / "s.nii.gz")
    predictor = build_predictor("poreformer")
    out = reconstruct_file(tmp_path / "s.nii.gz", tmp_path / "out", predictor=predictor, analyze=True, sample="all")
    m = out["result"]
    rec = json.loads((tmp_path / "out" / "s_analysis.json").read_text())
    for key in ("porosity_range", "euler_number_range", "percolating_porosity_range", "ranges_by_level"):
        assert m[key] == rec[key] and m[key] is not None, key
    by = m["ranges_by_level"]
    cal = predictor.post.calibration
    levels = apply_calibration(np.asarray(by["raw_thresholds"], np.float32), cal)
    assert levels == pytest.approx(LEVELS, abs=1e-5)
    assert m["porosity_range"][0] <= min(by["porosity"]) and max(by["porosity"]) <= m["porosity_range"][1]
    assert all(len(v) == 2 and v[0] <= v[1] for v in m["percolating_porosity_range"])  # a box: faces on every axis
    assert m["stage_seconds"]["ranges"] > 0
    alone = analyze(tmp_path / "out" / "s_pores.nii.gz", outdir=tmp_path / "again")
    assert alone["porosity_range"] is None and alone["ranges_by_level"] is None
