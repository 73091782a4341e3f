"""The quality benchmark: its means are the means of its rows, it scores candidate weights from a
folder, and its report holds every row."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest

from ctpore.errors import InputError
from ctpore.data.synthetic import make_pair
from ctpore.models.weights import read_metadata
from ctpore.pipelines.bench import BENCH_SEED_BASE, Runner, bench_quality, weights_dir, write_report
from ctpore.pipelines.bench.quality import LABELS, bench_cases

pytestmark = pytest.mark.usefixtures("one_thread")


def fiji_by_hand(scan):
    """The Fiji pipeline written independently of ctpore: scipy's 3x3x3 median, skimage's Otsu
    threshold (1024 bins), pores below it, then pore specks (26-connected) and solid islands
    (6-connected) under 10 voxels removed with scipy's labelling."""
    from scipy import ndimage as ndi
    from skimage.filters import threshold_otsu

    filt = ndi.median_filter(np.asarray(scan, np.float64), size=3, mode="nearest")
    pores = filt <= threshold_otsu(filt, nbins=1024)
    for phase, conn in ((True, 3), (False, 1)):
        mask = pores if phase else ~pores
        lab, n = ndi.label(mask, ndi.generate_binary_structure(3, conn))
        small = np.bincount(lab.ravel()) < 10
        small[0] = False
        pores = pores & ~small[lab] if phase else pores | small[lab]
    return pores.astype(np.uint8)


def dice(a, b):
    a, b = a.astype(bool), b.astype(bool)
    return 2 * np.count_nonzero(a & b) / (np.count_nonzero(a) + np.count_nonzero(b))


def test_summary_is_the_mean_of_rows_and_report_lists_every_row(tmp_path):
    res = bench_quality(n_sim=2, size=24, methods=("plain-otsu", "otsu"))
    assert len(res["rows"]) == 4
    for m in ("plain-otsu", "otsu"):
        rows = [r for r in res["rows"] if r["method"] == m]
        for k in ("mse", "dice", "euler_error_rel", "porosity_error"):
            assert res["summary"][m][k] == pytest.approx(np.mean([r[k] for r in rows]))
    # A row scores the Fiji pipeline, written here by hand, on the case the seed defines.
    scan, truth, _ = make_pair(BENCH_SEED_BASE + 1, shape=(24,) * 3)
    want = fiji_by_hand(scan)
    got = [r for r in res["rows"] if r["method"] == "otsu"][1]
    assert got["dice"] == pytest.approx(dice(want, truth), abs=2e-3)
    assert got["mse"] == pytest.approx(np.mean(want != truth), abs=2e-3)  # its 0/1 map's MSE: the error rate
    write_report(res, tmp_path, command="test")
    md = (tmp_path / "benchmark.md").read_text()
    assert md.count("| sim-0") == 4
    js = json.loads((tmp_path / "benchmark.json").read_text())
    assert len(js["rows"]) == 4


def test_weights_dir_is_used_and_a_missing_file_is_named(tmp_path):
    shipped = weights_dir() / "unet2d.safetensors"
    if not shipped.exists():
        pytest.skip("no shipped unet2d weights")
    with pytest.raises(InputError) as exc:
        Runner(("unet2d",), weights=tmp_path)
    assert str(tmp_path / "unet2d.safetensors") in str(exc.value)
    shutil.copy(shipped, tmp_path / "unet2d.safetensors")
    runner = Runner(("unet2d",), weights=tmp_path)
    assert runner.params["unet2d"] > 0
    # The report's training budget is the one the weights file records.
    meta = read_metadata(tmp_path / "unet2d.safetensors")
    assert runner.training["unet2d"]["steps"] == int(meta["steps"])
    assert runner.training["unet2d"]["batch_size"] == json.loads(meta["train_config"])["batch_size"]
    assert runner.training["unet2d"]["threshold"] == float(meta["threshold"])


def test_the_training_table_names_a_threshold_other_than_one_half(tmp_path):
    res = bench_quality(n_sim=1, size=20, methods=("otsu",))
    common = {"steps": 10, "init_steps": 0, "batch_size": 2, "crop": [8, 8, 8], "train_seconds": 1.0,
              "threads": 1, "min_size": 0}
    res["training"] = {"unet2d": {**common, "threshold": 0.5, "confidence": 0.98},
                       "poreformer": {**common, "init_steps": 6, "threshold": 0.4, "confidence": 0.8}}
    write_report(res, tmp_path, command="test")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in (tmp_path / "benchmark.md").read_text().splitlines()
            if line.startswith("| ") and "| 8 × 8 × 8 |" in line}
    assert rows["PoreFormer"].endswith("| threshold 0.4, confidence 0.8 |")
    assert rows["PoreFormer"].startswith("| PoreFormer | 10 (4 continued from 6) |")  # a warm start's budget
    assert rows["2D U-Net, slice by slice (MONAI)"].endswith("| confidence 0.98 |")
    # where Otsu's error lies: its squared error split between the true boundary and the interior
    s = res["summary"]["otsu"]
    n = s["boundary_share"] * s["mse_boundary"] + (1 - s["boundary_share"]) * s["mse_interior"]
    assert n == pytest.approx(res["summary"]["otsu"]["mse"])  # one case: the pooled MSE is the case's
    md = (tmp_path / "benchmark.md").read_text()
    section = md[md.index("## Where the voxel error lies"):md.index("## Per case")]
    row = f"| {LABELS['otsu']} | {s['mse_boundary']:.4f} | {s['mse_interior']:.5f} | {s['boundary_error_share']:.1%} |"
    assert row in section


def test_seed_base_moves_the_simulated_cases(tmp_path):
    res = bench_quality(n_sim=1, size=20, methods=("otsu",), seed_base=2_000_100)
    scan, truth, _ = make_pair(2_000_100, shape=(20,) * 3)
    assert res["rows"][0]["dice"] == pytest.approx(dice(fiji_by_hand(scan), truth), abs=2e-3)
    other = make_pair(BENCH_SEED_BASE, shape=(20,) * 3)[1]
    assert res["rows"][0]["porosity_truth"] == pytest.approx(truth.mean()) != pytest.approx(other.mean())
    write_report(res, tmp_path, command="test")
    assert "from seed 2000100 on" in (tmp_path / "benchmark.md").read_text()
    with pytest.raises(InputError, match="seed base"):
        bench_quality(n_sim=1, size=20, methods=("otsu",), seed_base=-1)


def test_reliability_counter_agrees_with_a_direct_count():
    from ctpore.data.calibration import ReliabilityCounter

    rng = np.random.default_rng(0)
    r = ReliabilityCounter(n_bins=10)
    ps, ts = [], []
    for _ in range(3):
        p = rng.random(5000)
        t = (rng.random(5000) < p**2).astype(np.uint8)
        r.add(p, t)
        ps.append(p), ts.append(t)
    p, t = np.concatenate(ps), np.concatenate(ts)
    b = np.minimum((p * 10).astype(int), 9)
    gaps = np.array([abs(p[b == i].mean() - t[b == i].mean()) for i in range(10)])
    counts = np.bincount(b, minlength=10)
    s = r.summary(min_count=1)
    assert s["ece"] == pytest.approx(np.sum(counts * gaps) / counts.sum())
    assert s["max_gap"] == pytest.approx(gaps.max())
    # a calibrated model's error is small; a 0/1 map's equals its error rate
    good = ReliabilityCounter()
    q = rng.random(200_000)
    good.add(q, rng.random(q.size) < q)
    assert good.summary()["ece"] < 0.01
    hard = ReliabilityCounter()
    pred, truth = rng.random(1000) < 0.3, rng.random(1000) < 0.3
    hard.add(pred.astype(float), truth)
    assert hard.summary()["ece"] == pytest.approx(np.mean(pred != truth))


def test_bench_reports_calibration_per_method(tmp_path):
    res = bench_quality(n_sim=1, size=20, methods=("otsu",))
    scan, truth, _ = make_pair(BENCH_SEED_BASE, shape=(20,) * 3)
    # a 0/1 map's calibration error is its error rate
    assert res["summary"]["otsu"]["calibration_ece"] == pytest.approx(np.mean(fiji_by_hand(scan) != truth), abs=2e-3)
    write_report(res, tmp_path, command="test")
    assert "calibration error" in (tmp_path / "benchmark.md").read_text()


def test_zoom_max_enlarges_half_the_simulated_cases():
    from ctpore.data.synthetic import draw_zoom, make_pair
    from ctpore.pipelines.bench import bench_cases

    cases = list(bench_cases(n_sim=6, size=16, seed_base=2_300_100, zoom_max=3.0))
    zooms = [draw_zoom(2_300_100 + i, 3.0) for i in range(6)]
    assert any(z > 1.0 for z in zooms) and any(z == 1.0 for z in zooms)
    for i, ((name, scan, truth), z) in enumerate(zip(cases, zooms)):
        ref_scan, ref_truth, _ = make_pair(2_300_100 + i, shape=(16,) * 3, zoom=z)
        assert (scan == ref_scan).all() and (truth == ref_truth).all()
        assert ("×" in name) == (z > 1.0)
    plain = list(bench_cases(n_sim=2, size=16, seed_base=2_300_100))
    assert all((a[1] == make_pair(2_300_100 + i, shape=(16,) * 3)[0]).all() for i, a in enumerate(plain))


def test_bad_zoom_max_is_one_line_and_exit_code_2(tmp_path, capsys):
    from ctpore.app.cli import main

    for bad in ("nan", "0.5"):
        with pytest.raises(SystemExit) as exc:
            main(["bench", "quality", "--n-sim", "1", "--size", "16", "--simulated-only", "--zoom-max", bad,
                  "-o", str(tmp_path / "out")])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "zoom" in err.lower() and "Traceback" not in err
    assert not (tmp_path / "out").exists()



def test_speed_bench_measures_a_child_process_peak_memory():
    from ctpore.pipelines.bench.speed import _run

    code = "import numpy as np; a = np.ones(300 * 2**20 // 8); print(a.sum())"
    seconds, rss = _run([sys.executable, "-c", code])
    assert seconds > 0 and 300 * 2**20 <= rss < 600 * 2**20


def test_flops_per_voxel_counts_the_convolutions_and_products():

    from ctpore.models import PoreFormer, PoreFormerConfig
    from ctpore.pipelines.bench.speed import poreformer_flops_per_voxel

    cfg = PoreFormerConfig(d_model=16, n_heads=2, n_layers=1, window=4, stem_channels=4, level_channels=(8,),
                           level_attention=(0,))
    flops = poreformer_flops_per_voxel(PoreFormer(cfg).eval(), chunk=8)
    # by hand, per full-resolution voxel: stem 3x3 conv 1->4, stride-2 conv 4->8 and 3x3 conv 8->8 at
    # a quarter of the pixels, 1x1 up-projection 8->16 at a quarter, 1x1 stem projection 4->16, q 16->16,
    # k/v 16->16 (one kv head of 8, twice), and the head 16->1 twice (the output projection folded
    # into it); 2 FLOPs a MAC
    macs = 9 * 4 + (9 * 4 * 8 + 9 * 8 * 8 + 8 * 16) / 4 + 4 * 16 + 16 * 16 + 16 * 16 + 2 * 16
    assert flops["counted"] == pytest.approx(2 * macs, rel=0.03)
    assert flops["attention"] == 4 * 8 * 2 * 4  # QK^T and AV over 4 keys, 2 heads of 8


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak memory from wait4 on Linux")
def test_a_measured_process_is_not_charged_the_memory_of_its_parent():
    """The peak RSS of a 200 MB child reads the same whether the measuring process holds 1 GB or not
    (forked straight from it, a child starts at the parent's high-water mark)."""
    from ctpore.pipelines.bench.speed import _run

    child = [sys.executable, "-c", "import numpy as np; a = np.ones(200 * 2**20 // 8); print(a.sum())"]
    _, small = _run(child)
    from ctpore.runtime import current_rss

    held = np.ones(1024 * 2**20 // 8)  # the parent now holds 1 GB
    assert current_rss() >= 1024 * 2**20  # (touched: resident, not only reserved)
    _, large = _run(child)
    del held
    assert 200 * 2**20 <= small < 600 * 2**20
    assert abs(large - small) < 100 * 2**20


def test_the_report_describes_the_data_it_was_given_not_fixed_text(tmp_path):
    """The real scan and the label are described by their own shape, dtype and source note."""
    import nibabel as nib

    for name, title in (("rockA", "# rockA — a basalt from somewhere, 20^3"), ("rockB", None)):
        folder = tmp_path / name
        folder.mkdir()
        grey = np.random.default_rng(0).integers(1000, 3000, (20, 22, 24)).astype(np.int16)
        nib.save(nib.Nifti1Image(grey, np.eye(4)), str(folder / "scan.nii.gz"))
        if title:
            (folder / "SOURCE.md").write_text(title + "\n\nmore\n")
        res = bench_quality(n_sim=1, size=16, methods=("otsu",), real_scan=folder / "scan.nii.gz")
        write_report(res, tmp_path / f"out{name}", command="test")
        md = (tmp_path / f"out{name}" / "benchmark.md").read_text()
        assert "carbonate" not in md and "Digital Rocks" not in md
        assert f"`{name}/scan.nii.gz` (24 × 22 × 20, int16)" in md, md
        assert ("a basalt from somewhere" in md) == bool(title)
        js = json.loads((tmp_path / f"out{name}" / "benchmark.json").read_text())
        assert js["real"]["shape"] == [24, 22, 20] and js["real"]["dtype"] == "int16"


def test_an_average_of_two_maps_is_scored_by_the_mean_of_squares_identity(tmp_path):
    # For maps P, Q and truth T: mean(((P+Q)/2 - T)^2) = (MSE_P + MSE_Q)/2 - mean((P-Q)^2)/4, case by case.
    methods = ("plain-otsu", "otsu")
    res = bench_quality(n_sim=2, size=20, methods=methods, averages=[methods])
    runner = Runner(methods)
    want = []
    for name, scan, _truth in bench_cases(2, 20):
        p, q = (runner.run(m, scan)[0].astype(np.float64) for m in methods)
        mse = {r["method"]: r["mse"] for r in res["rows"] if r["case"] == name}
        want.append((mse["plain-otsu"] + mse["otsu"]) / 2 - np.mean((p - q) ** 2) / 4)
    (avg,) = res["averages"]
    assert avg["methods"] == list(methods)
    assert avg["mse"] == pytest.approx(np.mean(want), rel=1e-9)
    assert avg["mse"] <= np.mean([res["summary"][m]["mse"] for m in methods])  # Jensen: never above the mean
    write_report(res, tmp_path, command="test")
    md = (tmp_path / "benchmark.md").read_text()
    section = md[md.index("## How far averaging the models reaches"):md.index("## Per case")]
    assert f"| {LABELS['plain-otsu']} + {LABELS['otsu']} | {avg['mse']:.4f} |" in section
    # by default only learned models are averaged; a name not run is refused before any scan is made
    assert bench_quality(n_sim=1, size=16, methods=methods)["averages"] == []
    with pytest.raises(InputError, match="two or more of the methods run"):
        bench_quality(n_sim=1, size=16, methods=methods, averages=[("otsu", "unet3d")])
