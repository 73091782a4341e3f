"""What a reconstruction says about itself: clipped grey values, units, a negative connectivity density.

Each case is a scan a user may well have (a block of garbage values from a failed reconstruction, a
file without length units, a sample of isolated pores); the checks compare against the same scan
without the defect, or against an independently computed figure.
"""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest
from scipy import ndimage

from ctpore.data.metrics import volume_metrics
from ctpore.data.normalize import CLIP_HIGH, CLIP_LOW, normalize
from helpers import run_cli




def grains(shape=(40, 48, 48), seed=3):
    """Dark pores between bright grains, float32 grey values, with a length unit (mm)."""
    rng = np.random.default_rng(seed)
    field = ndimage.gaussian_filter(rng.standard_normal(shape), 2.5)
    pores = field > np.quantile(field, 0.7)
    grey = np.where(pores, 900.0, 2600.0) + rng.normal(0, 120, shape)
    return grey.astype(np.float32), pores


def save(path, data, units="mm", zooms=(0.01, 0.01, 0.01)):
    img = nib.Nifti1Image(np.ascontiguousarray(data.transpose(2, 1, 0)), np.diag([*zooms, 1.0]))
    img.header.set_xyzt_units(units)
    nib.save(img, str(path))


def pores_of(folder, stem):
    return np.asarray(nib.load(str(folder / f"{stem}_pores.nii.gz")).dataobj).transpose(2, 1, 0)


def prob_of(folder, stem):
    return np.asarray(nib.load(str(folder / f"{stem}_prob.nii.gz")).dataobj).transpose(2, 1, 0)


def test_normalize_never_overflows_and_clips_far_values():
    x = np.array([-3e38, -1e30, 0.0, 5.0, 10.0, 25.0, 1e30, 3e38], np.float32)
    y = normalize(x, 0.0, 10.0)
    assert np.isfinite(y).all()
    assert y.tolist() == [CLIP_LOW, CLIP_LOW, 0.0, 0.5, 1.0, CLIP_HIGH, CLIP_HIGH, CLIP_HIGH]
    # a tiny range: the scale factor is large, still finite
    assert np.isfinite(normalize(np.array([1e30], np.float32), 0.0, 1e-6)).all()


@pytest.mark.parametrize("method", ["poreformer", "otsu"])
def test_a_block_of_1e30_is_clipped_with_a_warning_and_does_not_move_the_rest(tmp_path, capsys, method, one_thread):
    grey, _ = grains()
    bad = grey.copy()
    bad[5:15, 30:40, 30:40] = 1e30  # 1000 voxels of garbage
    save(tmp_path / "clean.nii", grey)
    save(tmp_path / "bad.nii", bad)
    code, _, err = run_cli(["reconstruct", tmp_path / "clean.nii", "-o", tmp_path / "a", "--method", method], capsys)
    assert code == 0, err
    code, _, err = run_cli(["reconstruct", tmp_path / "bad.nii", "-o", tmp_path / "b", "--method", method], capsys)
    assert code == 0, err
    assert "Traceback" not in err
    warn = [line for line in err.splitlines() if line.startswith("ctpore: warning:") and "clipped" in line]
    assert len(warn) == 1 and "1000 voxel(s)" in warn[0], err
    m = json.loads((tmp_path / "b" / "bad_metrics.json").read_text())
    assert m["clipped_voxels"] == 1000
    prob = prob_of(tmp_path / "b", "bad")
    assert np.isfinite(prob).all() and prob.min() >= 0 and prob.max() <= 1
    # away from the block the pores are those of the clean scan
    far = np.ones(grey.shape, bool)
    far[0:24, 20:48, 20:48] = False
    a, b = pores_of(tmp_path / "a", "clean"), pores_of(tmp_path / "b", "bad")
    agree = float(np.mean(a[far] == b[far]))
    assert agree > 0.99, agree
    assert abs(m["porosity"] - json.loads((tmp_path / "a" / "clean_metrics.json").read_text())["porosity"]) < 0.02


def test_padding_makes_no_pores_at_the_plane_edges(tmp_path, capsys, one_thread):
    """Solid with noise and one pore in the middle: nothing may be called pore near the edges."""
    rng = np.random.default_rng(0)
    shape = (24, 80, 72)
    grey = rng.normal(2600, 120, shape).astype(np.float32)
    zz, yy, xx = np.indices(shape)
    ball = (zz - 12) ** 2 + (yy - 40) ** 2 + (xx - 36) ** 2 <= 8**2
    grey[ball] = 900
    save(tmp_path / "ball.nii", grey)
    code, _, err = run_cli(["reconstruct", tmp_path / "ball.nii", "-o", tmp_path / "o"], capsys)
    assert code == 0, err
    pores = pores_of(tmp_path / "o", "ball").astype(bool)
    edge = np.ones(shape, bool)
    edge[:, 12:-12, 12:-12] = False
    assert pores[edge].sum() == 0
    dice = 2 * (pores & ball).sum() / (pores.sum() + ball.sum())
    assert dice > 0.9, dice


def test_unknown_units_give_figures_per_voxel_and_a_warning(tmp_path, capsys):
    grey, _ = grains((24, 32, 32))
    save(tmp_path / "um.nii", grey, units="micron", zooms=(5.0, 5.0, 5.0))
    save(tmp_path / "nounit.nii", grey, units="unknown", zooms=(5.0, 5.0, 5.0))
    code, _, err = run_cli(["reconstruct", tmp_path / "um.nii", "-o", tmp_path / "o", "--method", "otsu"], capsys)
    assert code == 0 and "units" not in err, err
    m = json.loads((tmp_path / "o" / "um_metrics.json").read_text())
    assert m["spacing_unit"] == "micron" and m["spacing_mm_zyx"] == [0.005, 0.005, 0.005]
    pores = pores_of(tmp_path / "o", "um")
    ref = volume_metrics(pores, (0.005, 0.005, 0.005))["connectivity_density_per_mm3"]
    assert m["connectivity_density_per_mm3"] == pytest.approx(ref, rel=1e-9)

    code, _, err = run_cli(["reconstruct", tmp_path / "nounit.nii", "-o", tmp_path / "o", "--method", "otsu"],
                           capsys)
    assert code == 0, err
    lines = [line for line in err.splitlines() if "no length unit" in line]
    assert len(lines) == 1 and lines[0].startswith("ctpore: warning:") and "nounit.nii" in lines[0], err
    m = json.loads((tmp_path / "o" / "nounit_metrics.json").read_text())
    assert m["spacing_unit"] == "unknown" and m["spacing_mm_zyx"] is None
    assert m["connectivity_density_per_mm3"] is None
    per_voxel = volume_metrics(pores_of(tmp_path / "o", "nounit"), (1.0, 1.0, 1.0))["connectivity_density_per_mm3"]
    assert m["connectivity_density_per_voxel3"] == pytest.approx(per_voxel, rel=1e-9)


def test_a_negative_connectivity_density_is_explained(tmp_path, capsys):
    """Isolated spherical pores: Euler number = number of balls > 0, so the density is negative."""
    shape = (30, 40, 40)
    rng = np.random.default_rng(1)
    grey = rng.normal(2600, 60, shape).astype(np.float32)
    zz, yy, xx = np.indices(shape)
    centres = [(8, 10, 10), (8, 30, 28), (21, 12, 28), (21, 29, 11)]
    for c in centres:
        grey[(zz - c[0]) ** 2 + (yy - c[1]) ** 2 + (xx - c[2]) ** 2 <= 16] = 900
    save(tmp_path / "balls.nii", grey)
    code, _, err = run_cli(["reconstruct", tmp_path / "balls.nii", "-o", tmp_path / "o", "--method", "otsu"], capsys)
    assert code == 0, err
    m = json.loads((tmp_path / "o" / "balls_metrics.json").read_text())
    assert m["euler_number"] == len(centres) and m["connectivity_density_per_mm3"] < 0
    lines = [line for line in err.splitlines() if "connectivity density is negative" in line]
    assert len(lines) == 1 and lines[0].startswith("ctpore: warning:"), err
    # a connected pore network with loops (half the volume, a sponge: Euler number < 0) gives no such warning
    field = ndimage.gaussian_filter(np.random.default_rng(4).standard_normal((40, 48, 48)), 2.0)
    grey2 = np.where(field > 0, 900.0, 2600.0) + np.random.default_rng(5).normal(0, 60, field.shape)
    save(tmp_path / "net.nii", grey2.astype(np.float32))
    code, _, err = run_cli(["reconstruct", tmp_path / "net.nii", "-o", tmp_path / "p", "--method", "otsu"], capsys)
    m2 = json.loads((tmp_path / "p" / "net_metrics.json").read_text())
    assert code == 0 and m2["euler_number"] < 0 and m2["connectivity_density_per_mm3"] > 0
    assert "connectivity density is negative" not in err
