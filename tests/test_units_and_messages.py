"""What a new user met: voxel units that outputs and ``ctpore info`` must keep unknown, TIFF
resolution units that must be read, and a NaN message that must not undercount.

Truth comes from nibabel and tifffile used directly (files written and read back without ctpore).
"""

from __future__ import annotations

import json
import re

import nibabel as nib
import numpy as np
import pytest
import tifffile
from helpers import blob_volume, run_cli

from ctpore.data.io import geometry_from_array, load_scan, read_volume, save_volume
from ctpore.errors import CtporeWarning, InputError
from ctpore.pipelines.outputs import finish_metrics

# -- outputs of a scan without units say "unknown" ---------------------------------------------


def _spatial_unit_code(path) -> int:
    return int(nib.load(str(path)).header["xyzt_units"]) & 0b111  # the spatial bits of xyzt_units


def test_outputs_of_a_tiff_without_resolution_say_the_unit_is_unknown(tmp_path, capsys):
    tifffile.imwrite(str(tmp_path / "plain.tif"), blob_volume(np.uint8, shape=(12, 16, 16)))
    out = tmp_path / "out"
    code, _, err = run_cli(["reconstruct", tmp_path / "plain.tif", "-o", out, "--method", "otsu"], capsys)
    assert code == 0 and "no length unit" in err, err
    for kind in ("pores", "prob"):
        path = out / f"plain_{kind}.nii.gz"
        img = nib.load(str(path))
        assert _spatial_unit_code(path) == 0 and img.header.get_xyzt_units()[0] == "unknown"
        np.testing.assert_array_equal(img.header["pixdim"][1:4], [1.0, 1.0, 1.0])  # the TIFF's numbers
        assert int(img.header["qform_code"]) == 1 and int(img.header["sform_code"]) == 1
        code, text, err = run_cli(["info", path, "--json"], capsys)
        info = json.loads(text)
        assert code == 0 and info["units"] == "unknown" and info["spacing_mm"] == [1.0, 1.0, 1.0], err
        code, table, _ = run_cli(["info", path], capsys)
        [line] = [ln for ln in table.splitlines() if ln.startswith("spacing")]
        assert "units unknown" in line and "spacing_mm" not in line, table
    assert json.loads((out / "plain_metrics.json").read_text())["spacing_unit"] == "unknown"


def test_an_array_without_spacing_is_written_with_unknown_units_and_one_with_spacing_in_mm(tmp_path):
    vol = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)
    unknown = save_volume(tmp_path / "u.nii.gz", vol, geometry_from_array(vol.shape))
    assert _spatial_unit_code(unknown) == 0
    g = load_scan(unknown).geometry
    assert g.units == "unknown" and g.spacing_mm == (1.0, 1.0, 1.0)
    mm = save_volume(tmp_path / "mm.nii.gz", vol, geometry_from_array(vol.shape, (0.5, 0.25, 0.25)))
    assert nib.load(str(mm)).header.get_xyzt_units()[0] == "mm"
    assert load_scan(mm).geometry.spacing_mm == (0.5, 0.25, 0.25)


def test_a_nifti_without_units_gives_outputs_with_its_header_unchanged(tmp_path, capsys):
    vol = blob_volume(np.uint16, shape=(12, 16, 16)).transpose(2, 1, 0)  # (i, j, k)
    affine = np.array([[0.0, 0.5, 0, 3], [0.7, 0, 0, -2], [0, 0, 0.9, 1], [0, 0, 0, 1]])
    img = nib.Nifti1Image(vol, affine)
    img.header.set_xyzt_units(0, 0)
    img.header.set_qform(affine, code=1)
    img.header.set_sform(affine, code=2)
    nib.save(img, str(tmp_path / "u.nii.gz"))
    code, _, err = run_cli(["reconstruct", tmp_path / "u.nii.gz", "-o", tmp_path / "o", "--method", "otsu"], capsys)
    assert code == 0 and "no length unit" in err, err
    src = nib.load(str(tmp_path / "u.nii.gz")).header
    for kind in ("pores", "prob"):
        out = nib.load(str(tmp_path / "o" / f"u_{kind}.nii.gz"))
        assert out.header["xyzt_units"] == src["xyzt_units"] == 0
        np.testing.assert_array_equal(out.header["pixdim"][1:4], src["pixdim"][1:4])
        np.testing.assert_array_equal(out.affine, nib.load(str(tmp_path / "u.nii.gz")).affine)
        assert [int(out.header[k]) for k in ("qform_code", "sform_code")] == [1, 2]
        assert out.shape == vol.shape  # the input's voxel order


# -- TIFF resolution units ---------------------------------------------------------------------


def _tiff(path, vol, **kw):
    tifffile.imwrite(str(path), vol, **kw)
    return path


@pytest.mark.parametrize("kw, expected, unit", [
    # the TIFF's own ResolutionUnit: pixels per cm / per inch (no ImageJ metadata: cubic voxels)
    (dict(resolution=(4000.0, 4000.0), resolutionunit="CENTIMETER"), (0.0025, 0.0025, 0.0025), "cm"),
    (dict(resolution=(2000.0, 4000.0), resolutionunit="CENTIMETER"), (0.005, 0.0025, 0.005), "cm"),
    (dict(resolution=(254.0, 254.0), resolutionunit="INCH"), (0.1, 0.1, 0.1), "inch"),
    # ImageJ's unit, with its spacing for z
    (dict(imagej=True, resolution=(400.0, 400.0), metadata={"unit": "cm", "spacing": 0.005, "axes": "ZYX"}),
     (0.05, 0.025, 0.025), "cm"),
    (dict(imagej=True, resolution=(400.0, 400.0), metadata={"unit": "centimetre", "spacing": 0.005, "axes": "ZYX"}),
     (0.05, 0.025, 0.025), "cm"),
    (dict(imagej=True, resolution=(100.0, 100.0), metadata={"unit": "inch", "spacing": 0.02, "axes": "ZYX"}),
     (0.508, 0.254, 0.254), "inch"),
    (dict(imagej=True, resolution=(0.5, 0.5), metadata={"unit": "\\u00B5m", "spacing": 3.0, "axes": "ZYX"}),
     (0.003, 0.002, 0.002), "micron"),
    (dict(imagej=True, resolution=(0.5, 0.5), metadata={"unit": "micron", "spacing": 3.0, "axes": "ZYX"}),
     (0.003, 0.002, 0.002), "micron"),
])
def test_tiff_resolution_units_are_read(tmp_path, kw, expected, unit):
    vol = blob_volume(np.uint8, shape=(6, 8, 10))
    g = load_scan(_tiff(tmp_path / "s.tif", vol, **kw)).geometry
    assert g.units == unit
    np.testing.assert_allclose(g.spacing_mm, expected, rtol=1e-9)
    folder = tmp_path / "slices"  # a folder of slices: the first file's tags
    folder.mkdir()
    plain = {k: v for k, v in kw.items() if k != "imagej" and k != "metadata"}
    for z in range(vol.shape[0]):
        _tiff(folder / f"s_{z}.tif", vol[z], **plain)
    if "resolutionunit" in kw:
        g = load_scan(folder).geometry
        assert g.units == unit
        np.testing.assert_allclose(g.spacing_mm, expected, rtol=1e-9)


@pytest.mark.parametrize("kw", [
    {},                                                   # tifffile's default: ResolutionUnit NONE
    dict(resolution=(72.0, 72.0), resolutionunit="INCH"),  # a screen's default, not a pixel size
    dict(resolution=(4000.0, 4000.0), resolutionunit="NONE"),
    dict(imagej=True, resolution=(3.0, 3.0), metadata={"unit": "pixel", "axes": "ZYX"}),
])
def test_tiff_without_a_length_unit_has_unknown_units(tmp_path, kw):
    g = load_scan(_tiff(tmp_path / "s.tif", blob_volume(np.uint8, shape=(6, 8, 10)), **kw)).geometry
    assert g.units == "unknown" and g.spacing_mm == (1.0, 1.0, 1.0)


def test_a_tiff_in_cm_reconstructs_with_figures_per_mm3_and_its_spacing(tmp_path, capsys):
    path = _tiff(tmp_path / "cm.tif", blob_volume(np.uint8, shape=(12, 16, 16)), resolution=(4000.0, 4000.0),
                 resolutionunit="CENTIMETER")
    code, _, err = run_cli(["reconstruct", path, "-o", tmp_path / "o", "--method", "otsu"], capsys)
    assert code == 0 and "length unit" not in err, err
    m = json.loads((tmp_path / "o" / "cm_metrics.json").read_text())
    assert m["spacing_unit"] == "cm" and m["spacing_mm_zyx"] == pytest.approx([0.0025] * 3)
    out = nib.load(str(tmp_path / "o" / "cm_pores.nii.gz")).header
    assert out.get_xyzt_units()[0] == "mm"
    np.testing.assert_allclose(out["pixdim"][1:4], [0.0025] * 3, rtol=1e-6)


def test_the_missing_units_warning_says_what_to_set_in_each_format():
    with pytest.warns(CtporeWarning) as caught:
        finish_metrics({"connectivity_density_per_mm3": 1.0}, geometry_from_array((2, 2, 2)), "s.h5")
    [message] = [str(w.message) for w in caught if "no length unit" in str(w.message)]
    for what in ("xyzt_units", "ResolutionUnit", "XResolution", "ImageJ unit", "element_size_um"):
        assert what in message, message


# -- NaN in two distant slices -----------------------------------------------------------------


@pytest.fixture
def two_nans(tmp_path):
    """A NIfTI with one NaN in slice 5 and one in slice 12 (of 20)."""
    vol = blob_volume(np.uint16, shape=(20, 16, 16)).astype(np.float32)
    vol[5, 3, 4] = np.nan
    vol[12, 7, 8] = np.nan
    img = nib.Nifti1Image(vol.transpose(2, 1, 0), np.eye(4))
    img.header.set_xyzt_units("mm")
    nib.save(img, str(tmp_path / "nan.nii.gz"))
    return tmp_path / "nan.nii.gz"


def _count_claim(message: str) -> tuple[bool, int]:
    """``(is "at least", N)`` of a message "[at least] N voxel(s) ... NaN or Inf ..."."""
    m = re.search(r"(at least )?(\d+) voxel\(s\)[^;]* NaN or Inf", message)
    assert m, message
    return bool(m.group(1)), int(m.group(2))


@pytest.mark.parametrize("read", [
    lambda s: s.read_slices(5, 6),
    lambda s: s.read_slices(0, 10),
    lambda s: s.read_slices(4, 20),
    lambda s: s.read_window(5, 6, 0, 8, 0, 8),
    lambda s: s.read(),
    lambda s: s[5],
])
def test_the_nan_message_never_undercounts_the_scan(two_nans, read):
    with load_scan(two_nans) as scan, pytest.raises(InputError) as info:
        read(scan)
    message = str(info.value)
    at_least, n = _count_claim(message)
    assert at_least or n == 2, message  # an exact count is the scan's: both NaNs
    assert n <= 2 and "first in slice 5" in message and two_nans.name in message, message


def test_a_whole_read_counts_every_nan_exactly(two_nans):
    with pytest.raises(InputError) as info:
        read_volume(two_nans)
    assert _count_claim(str(info.value)) == (False, 2), str(info.value)


def test_reconstruct_does_not_say_one_nan_when_there_are_two(two_nans, capsys):
    code, _, err = run_cli(["reconstruct", two_nans, "-o", two_nans.parent / "o", "--method", "otsu"], capsys)
    assert code == 2, err
    at_least, n = _count_claim(err)
    assert at_least or n == 2, err
    assert not (two_nans.parent / "o").exists() or not list((two_nans.parent / "o").glob("*.nii.gz"))


def test_an_ome_zarr_output_of_a_tiff_in_inches_keeps_its_unit(tmp_path):
    pytest.importorskip("zarr")
    from ctpore.data.io.omezarr_write import OmeZarrWriter

    vol = blob_volume(np.uint8, shape=(6, 8, 10))
    scan = load_scan(_tiff(tmp_path / "in.tif", vol, resolution=(254.0, 254.0), resolutionunit="INCH"))
    with OmeZarrWriter(tmp_path / "o.ome.zarr", scan.geometry, np.uint8) as w:
        w.write(vol)
    ms = json.loads((tmp_path / "o.ome.zarr" / ".zattrs").read_text())["multiscales"][0]
    assert [ax["unit"] for ax in ms["axes"]] == ["inch"] * 3
    np.testing.assert_allclose(ms["datasets"][0]["coordinateTransformations"][0]["scale"], [0.1 / 25.4] * 3)
    with load_scan(tmp_path / "o.ome.zarr") as back:
        np.testing.assert_allclose(back.geometry.spacing_mm, (0.1, 0.1, 0.1), rtol=1e-9)
