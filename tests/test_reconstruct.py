"""End to end: files in, the promised files out, metrics that the files reproduce, clean errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import tifffile

from ctpore.app.cli import main
from ctpore.data.metrics import comparison_metrics, volume_metrics
from ctpore.errors import InputError
from ctpore.pipelines.bench.quality import default_leopard, default_shared
from ctpore.pipelines.reconstruct import reconstruct
from helpers import run_cli

SHARED = default_shared() or Path("missing")
REAL_SCAN = SHARED / "quantimpy_rock" / "gray.nii.gz"




def two_phase(shape=(14, 18, 16), seed=0):
    """A grey volume: dark pores (a blob field) in bright solid, uint16, with its truth."""
    from scipy import ndimage

    rng = np.random.default_rng(seed)
    field = ndimage.gaussian_filter(rng.standard_normal(shape), 2.0)
    truth = field > np.quantile(field, 0.7)  # porosity 0.3
    grey = np.where(truth, 9000, 30000) + rng.normal(0, 1500, shape)
    return grey.astype(np.uint16), truth.astype(np.uint8)


def rotated_affine(spacing=(0.02, 0.03, 0.05), mirror=True):
    th = np.deg2rad(30)
    rot = np.array([[np.cos(th), -np.sin(th), 0], [np.sin(th), np.cos(th), 0], [0, 0, 1]])
    a = np.eye(4)
    a[:3, :3] = rot @ np.diag(spacing) @ (np.diag([-1, 1, 1]) if mirror else np.eye(3))
    a[:3, 3] = [12.5, -3.0, 40.0]
    return a


def write_nifti(path, data, affine, qcode=1, scode=2):
    img = nib.Nifti1Image(data, affine)
    img.set_qform(affine, code=qcode)
    img.set_sform(affine, code=scode)
    img.header.set_xyzt_units("mm")
    nib.save(img, str(path))
    return img


def test_python_api_on_array():
    grey, truth = two_phase()
    res = reconstruct(grey.astype(np.float32), method="otsu", truth=truth, spacing_mm=(0.1, 0.1, 0.1))
    assert res.pores.shape == grey.shape and res.pores.dtype == np.uint8
    assert res.probability.dtype == np.float32
    assert res.metrics["dice"] > 0.8
    ref = volume_metrics(res.pores, (0.1, 0.1, 0.1))
    for k, v in ref.items():
        assert res.metrics[k] == v
    assert res.metrics["mse"] == comparison_metrics(res.pores, truth, prob=res.probability)["mse"]


@pytest.mark.parametrize("slice_axis", [None, 0, 1, 2])
def test_outputs_keep_geometry_and_voxel_order(tmp_path, capsys, slice_axis):
    grey, truth = two_phase()
    data = grey.transpose(2, 1, 0)  # file voxel order (i, j, k)
    aff = rotated_affine()
    write_nifti(tmp_path / "scan.nii.gz", data, aff)
    args = ["reconstruct", tmp_path / "scan.nii.gz", "-o", tmp_path / "out", "--method", "otsu"]
    if slice_axis is not None:
        args += ["--slice-axis", slice_axis]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    src = nib.load(str(tmp_path / "scan.nii.gz"))
    for name, dtype in (("scan_pores.nii.gz", np.uint8), ("scan_prob.nii.gz", np.float32)):
        img = nib.load(str(tmp_path / "out" / name))
        assert img.shape == data.shape
        assert img.get_data_dtype() == dtype
        assert np.array_equal(img.affine, src.affine)
        assert int(img.header["qform_code"]) == 1 and int(img.header["sform_code"]) == 2
        assert np.array_equal(img.header.get_qform(), src.header.get_qform())
        assert np.array_equal(img.header.get_sform(), src.header.get_sform())
        assert np.array_equal(img.header["pixdim"], src.header["pixdim"])
        assert img.header.get_xyzt_units() == src.header.get_xyzt_units()
    # Voxel order: Otsu is a per-voxel threshold of a median filter; in file order, dark voxels
    # must be the pores whatever slice axis was streamed.
    pores = np.asarray(nib.load(str(tmp_path / "out" / "scan_pores.nii.gz")).dataobj)
    assert (data[pores == 1].mean()) < (data[pores == 0].mean())
    agree = np.mean(pores == truth.transpose(2, 1, 0))
    assert agree > 0.9
    m = json.loads((tmp_path / "out" / "scan_metrics.json").read_text())
    axis = 2 if slice_axis is None else slice_axis
    assert m["shape_zyx"][0] == data.shape[axis]


def test_tiff_stack_and_folder_give_the_nifti_result(tmp_path, capsys):
    grey, _ = two_phase(seed=3)
    sp = (0.004, 0.002, 0.002)  # (z, y, x) mm
    aff = np.diag([sp[2], sp[1], sp[0], 1.0])
    write_nifti(tmp_path / "a.nii", grey.transpose(2, 1, 0), aff, qcode=1, scode=1)
    tifffile.imwrite(tmp_path / "b.tif", grey, imagej=True, resolution=(1 / (sp[2] * 1000), 1 / (sp[1] * 1000)),
                     metadata={"spacing": sp[0] * 1000, "unit": "um", "axes": "ZYX"})
    folder = tmp_path / "c"
    folder.mkdir()
    for z in range(grey.shape[0]):
        tifffile.imwrite(folder / f"slice_{z + 1}.tif", grey[z], imagej=True,
                         resolution=(1 / (sp[2] * 1000), 1 / (sp[1] * 1000)),
                         metadata={"spacing": sp[0] * 1000, "unit": "um"})
    for src in ("a.nii", "b.tif", "c"):
        code, _, err = run_cli(["reconstruct", tmp_path / src, "-o", tmp_path / "out", "--method", "otsu"], capsys)
        assert code == 0, err
    res = {}
    for stem in ("a", "b", "c"):
        pores = np.asarray(nib.load(str(tmp_path / "out" / f"{stem}_pores.nii.gz")).dataobj)
        m = json.loads((tmp_path / "out" / f"{stem}_metrics.json").read_text())
        res[stem] = (pores, m)
    for stem in ("b", "c"):
        assert np.array_equal(res[stem][0], res["a"][0])
        for k in ("porosity", "euler_number", "euler_number_6", "n_pores", "shape_zyx"):
            assert res[stem][1][k] == res["a"][1][k]
        np.testing.assert_allclose(res[stem][1]["spacing_mm_zyx"], res["a"][1]["spacing_mm_zyx"], rtol=1e-6)
        np.testing.assert_allclose(res[stem][1]["connectivity_density_per_mm3"],
                                   res["a"][1]["connectivity_density_per_mm3"], rtol=1e-5)


@pytest.mark.skipif(not REAL_SCAN.exists(), reason="shared data not present")
def test_real_scan_metrics_reproduce_from_written_files(tmp_path, capsys):
    code, out, err = run_cli(["reconstruct", REAL_SCAN, "-o", tmp_path], capsys)
    assert code == 0, err
    m = json.loads((tmp_path / "gray_metrics.json").read_text())
    pores_img = nib.load(str(tmp_path / "gray_pores.nii.gz"))
    prob = np.asarray(nib.load(str(tmp_path / "gray_prob.nii.gz")).dataobj)
    assert prob.min() >= 0 and prob.max() <= 1
    pores = np.asarray(pores_img.dataobj).transpose(2, 1, 0)
    assert m["spacing_unit"] == "unknown" and m["spacing_mm_zyx"] is None  # the file gives no unit: per voxel
    ref = volume_metrics(pores, (1.0, 1.0, 1.0))
    ref["connectivity_density_per_voxel3"] = ref.pop("connectivity_density_per_mm3")
    for k, v in ref.items():
        assert m[k] == v, k
    # and through `ctpore evaluate` (the pores against themselves: Dice 1, same Euler number)
    code, out, err = run_cli(["evaluate", tmp_path / "gray_pores.nii.gz", tmp_path / "gray_pores.nii.gz",
                              "--prob", tmp_path / "gray_prob.nii.gz", "--json"], capsys)
    assert code == 0, err
    ev = json.loads(out)
    for k in ("porosity", "euler_number", "euler_number_6", "n_pores", "connectivity_density_per_voxel3",
              "spacing_unit"):
        assert ev[k] == m[k], k
    assert ev["dice"] == 1.0
    for key in ("porosity", "euler_number", "euler_number_6", "connectivity_density_per_mm3", "n_pores", "shape_zyx",
                "spacing_mm_zyx", "spacing_unit", "method", "model", "device", "attention_backend", "seconds",
                "ctpore_version"):
        assert key in m


# ------------------------------------------------------------------------------------------
# Bad input: exit code 2, one line on stderr naming the file, no traceback, nothing left behind
# ------------------------------------------------------------------------------------------


def _assert_clean_error(code, err, name, outdir=None):
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert name in lines[0], lines[0]
    if outdir is not None:  # nothing written, not even an empty output folder
        assert not Path(outdir).exists(), sorted(p.name for p in Path(outdir).iterdir())


def _bad_files(tmp_path):
    cases = {}
    cases["missing.nii.gz"] = None
    (tmp_path / "empty.nii.gz").write_bytes(b"")
    cases["empty.nii.gz"] = True
    grey, _ = two_phase()
    write_nifti(tmp_path / "good.nii.gz", grey.transpose(2, 1, 0), np.eye(4))
    blob = (tmp_path / "good.nii.gz").read_bytes()
    (tmp_path / "truncated.nii.gz").write_bytes(blob[: len(blob) // 2])
    cases["truncated.nii.gz"] = True
    (tmp_path / "notes.nii").write_text("this is not an image\n" * 20)
    cases["notes.nii"] = True
    nib.save(nib.Nifti1Image(np.zeros((10, 12), np.uint8), np.eye(4)), str(tmp_path / "flat2d.nii.gz"))
    cases["flat2d.nii.gz"] = True
    nib.save(nib.Nifti1Image(np.zeros((6, 7, 8, 3), np.uint8), np.eye(4)), str(tmp_path / "four_d.nii.gz"))
    cases["four_d.nii.gz"] = True
    nanv = grey.astype(np.float32)
    nanv[5, 3, 2] = np.nan
    nib.save(nib.Nifti1Image(nanv.transpose(2, 1, 0), np.eye(4)), str(tmp_path / "nan.nii.gz"))
    cases["nan.nii.gz"] = True
    infv = grey.astype(np.float32)
    infv[1, 1, 1] = np.inf
    nib.save(nib.Nifti1Image(infv.transpose(2, 1, 0), np.eye(4)), str(tmp_path / "inf.nii"))
    cases["inf.nii"] = True
    return cases


def test_bad_scans_exit_2_with_one_line(tmp_path, capsys):
    cases = _bad_files(tmp_path)
    for name in cases:
        for method in ("otsu", "poreformer"):
            out = tmp_path / f"out_{method}_{name.replace('.', '_')}"
            code, _, err = run_cli(["reconstruct", tmp_path / name, "-o", out, "--method", method], capsys)
            _assert_clean_error(code, err, name, outdir=out)


def test_one_bad_scan_does_not_cost_the_others(tmp_path, capsys):
    grey, _ = two_phase()
    write_nifti(tmp_path / "good.nii.gz", grey.transpose(2, 1, 0), np.eye(4))
    (tmp_path / "bad.nii").write_text("nope")
    code, out, err = run_cli(["reconstruct", tmp_path / "bad.nii", tmp_path / "good.nii.gz", "-o",
                              tmp_path / "out", "--method", "otsu"], capsys)
    assert code == 2
    assert "bad.nii" in err and "Traceback" not in err
    assert (tmp_path / "out" / "good_metrics.json").exists()
    assert not list((tmp_path / "out").glob("bad*"))


def test_existing_outputs_are_kept_without_overwrite(tmp_path, capsys):
    grey, _ = two_phase()
    write_nifti(tmp_path / "s.nii.gz", grey.transpose(2, 1, 0), np.eye(4))
    out = tmp_path / "out"
    assert run_cli(["reconstruct", tmp_path / "s.nii.gz", "-o", out, "--method", "otsu"], capsys)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, _, err = run_cli(["reconstruct", tmp_path / "s.nii.gz", "-o", out, "--method", "plain-otsu"], capsys)
    _assert_clean_error(code, err, "s_")
    assert "--overwrite" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    code, _, err = run_cli(["reconstruct", tmp_path / "s.nii.gz", "-o", out, "--method", "plain-otsu",
                            "--overwrite"], capsys)
    assert code == 0, err
    assert json.loads((out / "s_metrics.json").read_text())["method"] == "plain-otsu"


def test_unwritable_output_folder(tmp_path, capsys):
    grey, _ = two_phase()
    write_nifti(tmp_path / "s.nii.gz", grey.transpose(2, 1, 0), np.eye(4))
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "sub"  # a folder cannot be made under a file, even as root
    code, _, err = run_cli(["reconstruct", tmp_path / "s.nii.gz", "-o", out, "--method", "otsu"], capsys)
    _assert_clean_error(code, err, "afile")


def test_failed_write_leaves_no_partial_set(tmp_path, capsys, monkeypatch):
    grey, _ = two_phase()
    write_nifti(tmp_path / "s.nii.gz", grey.transpose(2, 1, 0), np.eye(4))
    import ctpore.pipelines.reconstruct as rec

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rec, "write_json_atomic", boom)
    with pytest.raises(InputError, match="the disk filled up during the run"):  # the user's to fix: exit 2
        rec.reconstruct_file(tmp_path / "s.nii.gz", tmp_path / "out", "otsu")
    assert not (tmp_path / "out").exists()  # no partial set, and no empty folder either
    (tmp_path / "kept").mkdir()  # a folder that was there stays
    with pytest.raises(InputError, match="the disk filled up during the run"):
        rec.reconstruct_file(tmp_path / "s.nii.gz", tmp_path / "kept", "otsu")
    assert list((tmp_path / "kept").iterdir()) == []


def test_evaluate_refuses_bad_labels_and_shapes(tmp_path, capsys):
    lab = np.zeros((6, 7, 8), np.uint8)
    lab[2:4, 2:5, 3:6] = 1
    nib.save(nib.Nifti1Image(lab, np.eye(4)), str(tmp_path / "pred.nii.gz"))
    bad = lab.copy()
    bad[0, 0, 0] = 7
    nib.save(nib.Nifti1Image(bad, np.eye(4)), str(tmp_path / "sevens.nii.gz"))
    nib.save(nib.Nifti1Image(np.zeros((6, 7, 9), np.uint8), np.eye(4)), str(tmp_path / "other_shape.nii.gz"))
    code, _, err = run_cli(["evaluate", tmp_path / "pred.nii.gz", tmp_path / "sevens.nii.gz"], capsys)
    _assert_clean_error(code, err, "sevens.nii.gz")
    assert "7" in err
    code, _, err = run_cli(["evaluate", tmp_path / "pred.nii.gz", tmp_path / "other_shape.nii.gz"], capsys)
    _assert_clean_error(code, err, "other_shape.nii.gz")
    code, out, err = run_cli(["evaluate", tmp_path / "pred.nii.gz", tmp_path / "pred.nii.gz"], capsys)
    assert code == 0 and "dice" in out


def test_console_script_exit_code_and_single_line():
    """The installed `ctpore` script (a real process): a missing file gives exit 2 and one line."""
    proc = subprocess.run([sys.executable, "-m", "ctpore.app.cli", "reconstruct", "no_such_scan.nii.gz",
                           "-o", os.devnull + "_dir"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "no_such_scan.nii.gz" in proc.stderr


def test_poreformer_method_equals_the_full_forward_pass(tmp_path):
    """reconstruct(method='poreformer') = normalize, then stream the model (one pass, as slices come)."""
    import torch

    from ctpore.data.normalize import normalize_volume
    from ctpore.models import PoreFormer, PoreFormerConfig
    from ctpore.models.weights import save_weights

    torch.manual_seed(0)
    model = PoreFormer(PoreFormerConfig(d_model=16, n_heads=2, n_layers=1, window=6, stem_channels=4,
                                        level_channels=(8, 16), level_attention=(0, 1))).eval()
    w = tmp_path / "tiny.safetensors"
    save_weights(model, w, metadata={"name": "tiny", "threshold": "0.5", "min_size": "0"})
    grey, _ = two_phase(shape=(11, 20, 18))
    res = reconstruct(grey, method="poreformer", weights=w, chunk_slices=4, tile=8, precision="fp32")
    x = torch.from_numpy(normalize_volume(grey))[None]
    with torch.no_grad():
        ref = torch.sigmoid(model(x))[0].numpy()
    np.testing.assert_allclose(res.probability, ref, atol=1e-5)
    np.testing.assert_array_equal(res.pores, (ref >= 0.5).astype(np.uint8))
    assert res.metrics["method"] == "poreformer"
    assert res.metrics["model"]["name"] == "tiny" and len(res.metrics["model"]["sha256"]) == 64
    assert res.metrics["attention_backend"] in ("sdpa", "math", "flash") and res.metrics["precision"] == "fp32"


LEOPARD = default_leopard() or Path("missing")


@pytest.mark.skipif(not LEOPARD.exists(), reason="shared data not present")
def test_shipped_poreformer_on_a_simulated_scan_of_leopard_sandstone(tmp_path, capsys):
    """The real Leopard pore geometry, scanned by the simulator (a seed no benchmark or training
    run uses), reconstructed by the default command: Dice >= 0.9 against the real geometry."""
    from ctpore.data.io import read_label
    from ctpore.data.synthetic import scan_label
    from ctpore.models.weights import default_weights_path

    assert default_weights_path() is not None, "the package must ship PoreFormer weights"
    label = read_label(LEOPARD)
    scan = scan_label(label, np.random.default_rng(20261129))
    nib.save(nib.Nifti1Image(scan.transpose(2, 1, 0), np.diag([0.00225, 0.00225, 0.00225, 1])),
             str(tmp_path / "leopard_scan.nii.gz"))
    code, out, err = run_cli(["reconstruct", tmp_path / "leopard_scan.nii.gz", "-o", tmp_path / "out",
                              "--truth", LEOPARD], capsys)
    assert code == 0, err
    m = json.loads((tmp_path / "out" / "leopard_scan_metrics.json").read_text())
    assert m["method"] == "poreformer"
    assert m["dice"] >= 0.9, m


def test_a_scan_without_contrast_gets_no_pores_and_a_warning(tmp_path, capsys):
    """A constant scan must not come out as pores (a dark, flat image looks like one big pore)."""
    write_nifti(tmp_path / "flat.nii.gz", np.full((32, 40, 24), 1000, np.uint16), np.eye(4))
    for method in ("poreformer", "otsu"):
        with pytest.raises(SystemExit) as exc:
            main(["reconstruct", str(tmp_path / "flat.nii.gz"), "-o", str(tmp_path / method), "--method", method])
        assert exc.value.code == 0
        metrics = json.loads((tmp_path / method / "flat_metrics.json").read_text())
        assert metrics["porosity"] == 0 and metrics["n_pores"] == 0
    err = capsys.readouterr().err
    assert "ctpore: warning: the scan has no contrast" in err
