"""One way through: ``ctpore.reconstruct(path)``, ``ctpore reconstruct`` and ``ctpore batch`` give
the same pore bits for the same scan, for every slice axis, with a memory budget small enough that
the scan streams (several tiles, several slabs)."""

from __future__ import annotations

import gzip
import hashlib

import nibabel as nib
import numpy as np
import pytest
from helpers import run_cli

from ctpore.data.io import load_scan
from ctpore.data.synthetic import make_pair

pytest.importorskip("distributed")

BUDGET = "0.5"  # GB: several post-processing slabs and several in-plane tiles for a 40 x 200 x 200 scan


def _gunzipped(path) -> str:
    return hashlib.sha256(gzip.open(path).read()).hexdigest()


def test_api_cli_and_batch_give_the_same_pores_for_every_slice_axis(tmp_path, capsys):
    import torch
    from helpers import small

    from ctpore.models import PoreFormer
    from ctpore.models.weights import save_weights
    from ctpore.pipelines.budget import plan_budget
    from ctpore.pipelines.reconstruct import reconstruct
    from ctpore.pipelines.stream_plan import plan_streaming

    torch.manual_seed(0)
    model = PoreFormer(small()).eval()
    weights = save_weights(model, tmp_path / "w.safetensors", {"threshold": "0.5", "confidence": "0.7",
                                                               "calibration": '{"x": [0, 1], "y": [0.1, 0.9]}'})
    scan, _truth, _ = make_pair(21, shape=(40, 200, 200))  # (Z, Y, X)
    slab, model_bytes = plan_budget(scan.shape, float(BUDGET))
    tile, _chunk = plan_streaming(model, scan.shape, model_bytes)
    assert slab < scan.shape[0] and tile < 200  # it does stream: several slabs, several tiles
    rows = ["scan,slice_axis"]
    for axis in (0, 1, 2):
        # store the volume so that its slices lie along file axis `axis`
        order = {2: (2, 1, 0), 1: (2, 0, 1), 0: (0, 2, 1)}[axis]
        data = np.ascontiguousarray(scan.transpose(order))
        img = nib.Nifti1Image(data, np.diag([0.01, 0.012, 0.014, 1.0]))
        img.header.set_xyzt_units("mm")
        nib.save(img, tmp_path / f"a{axis}.nii")
        with load_scan(tmp_path / f"a{axis}.nii", slice_axis=axis) as s:
            np.testing.assert_array_equal(s.read(), scan)  # the same (Z, Y, X) volume each time
        rows.append(f"a{axis}.nii,{axis}")
    (tmp_path / "m.csv").write_text("\n".join(rows) + "\n")
    first = None
    code, _, err = run_cli(["batch", tmp_path / "m.csv", "-o", tmp_path / "batch", "--memory-gb", BUDGET,
                            "--workers", "1", "--weights", weights], capsys)
    assert code == 0, err
    for axis in (0, 1, 2):
        path = tmp_path / f"a{axis}.nii"
        api = reconstruct(path, slice_axis=axis, memory_gb=float(BUDGET), weights=weights)
        code, _, err = run_cli(["reconstruct", path, "-o", tmp_path / "cli", "--slice-axis", axis,
                                "--memory-gb", BUDGET, "--weights", weights], capsys)
        assert code == 0, err
        for out in ("cli", "batch"):
            written = tmp_path / out / f"a{axis}_pores.nii.gz"
            with load_scan(written, slice_axis=axis) as s:
                np.testing.assert_array_equal(s.read(), api.pores)
            back = np.asarray(nib.load(written).dataobj)
            assert back.shape == nib.load(path).shape  # written in the input's voxel order
        assert _gunzipped(tmp_path / "cli" / f"a{axis}_pores.nii.gz") == _gunzipped(
            tmp_path / "batch" / f"a{axis}_pores.nii.gz")
        if first is None:
            first = api.pores
        np.testing.assert_array_equal(api.pores, first)  # and the same pores whatever the axis
