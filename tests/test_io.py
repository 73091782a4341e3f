"""Tests for ctpore.data.io: NIfTI/TIFF in and out, axis order, headers, lazy reads, bad input.

Truth comes from nibabel and tifffile used directly (files written and read here without
ctpore), and from the axis convention written out by hand below.
"""

from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import tifffile

from ctpore.errors import InputError, NonFiniteError
from ctpore.pipelines.bench.quality import default_shared
from ctpore.data.io import (
    Geometry,
    geometry_from_array,
    load_scan,
    output_stem,
    read_label,
    read_volume,
    save_volume,
)

REAL_GRAY = (default_shared() or Path("missing")) / "quantimpy_rock" / "gray.nii.gz"

# The convention, written out by hand: file axes (i, j, k) that become (Z, Y, X).
EXPECTED_PERM = {0: (0, 2, 1), 1: (1, 2, 0), 2: (2, 1, 0)}


def rotation(ax: float, ay: float, az: float) -> np.ndarray:
    cx, sx, cy, sy, cz, sz = np.cos(ax), np.sin(ax), np.cos(ay), np.sin(ay), np.cos(az), np.sin(az)
    rx = np.array([[1, 0, 0], [0, cx, -sx], [0, sx, cx]])
    ry = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
    rz = np.array([[cz, -sz, 0], [sz, cz, 0], [0, 0, 1]])
    return rz @ ry @ rx


def oblique_affines(zooms=(0.5, 0.7, 0.9)) -> tuple[np.ndarray, np.ndarray]:
    """A rotated anisotropic qform with a mirrored axis, and a different rotated sform."""
    q = np.eye(4)
    q[:3, :3] = rotation(0.2, -0.4, 0.6) @ np.diag(zooms) @ np.diag([-1, 1, 1])  # det < 0
    q[:3, 3] = [10.5, -3.0, 7.25]
    s = np.eye(4)
    s[:3, :3] = rotation(-0.3, 0.1, 1.1) @ np.diag(zooms)
    s[:3, 3] = [-1.0, 2.0, 3.0]
    return q, s


def write_nifti(path: Path, data: np.ndarray, *, zooms=(0.5, 0.7, 0.9), units="micron",
                slope=None, cls=nib.Nifti1Image) -> nib.Nifti1Image:
    """Write with nibabel only: qform code 1 (mirrored, rotated), sform code 2, given units.

    ``slope=(s, i)`` stores ``data`` unchanged and puts s, i in scl_slope/scl_inter (patched
    into the header bytes of a NIfTI-1 file), so the file's values are ``data * s + i``.
    """
    q, s = oblique_affines(zooms)
    img = cls(data, None)
    hdr = img.header
    hdr.set_qform(q, code=1)
    hdr.set_sform(s, code=2)
    hdr.set_xyzt_units(units, "sec")
    hdr["cal_min"], hdr["cal_max"] = 1.0, 99.0
    hdr["descrip"] = b"test scan"
    if slope is None:
        nib.save(img, str(path))
        return nib.load(str(path))
    plain = path.with_name("plain_" + path.name.replace(".gz", ""))
    nib.save(img, str(plain))
    blob = bytearray(plain.read_bytes())
    blob[112:120] = np.array(slope, "<f4").tobytes()  # scl_slope, scl_inter (NIfTI-1 offsets)
    path.write_bytes(gzip.compress(bytes(blob)) if path.name.endswith(".gz") else bytes(blob))
    return nib.load(str(path))


# Header fields save_volume may change; every other field must be byte-identical.
CHANGED_FIELDS = {"datatype", "bitpix", "scl_slope", "scl_inter", "cal_min", "cal_max", "vox_offset",
                  "glmin", "glmax"}


def assert_header_kept(out: nib.Nifti1Image, ref: nib.Nifti1Image) -> None:
    ho, hr = out.header, ref.header
    assert np.array_equal(out.affine, ref.affine)
    assert np.array_equal(ho.get_qform(), hr.get_qform())
    assert np.array_equal(ho.get_sform(), hr.get_sform())
    assert int(ho["qform_code"]) == int(hr["qform_code"])
    assert int(ho["sform_code"]) == int(hr["sform_code"])
    assert np.array_equal(ho["pixdim"], hr["pixdim"])
    assert ho["xyzt_units"] == hr["xyzt_units"]
    for key in hr.keys():
        if key in CHANGED_FIELDS or key == "dim":
            continue
        assert np.asarray(ho[key]).tobytes() == np.asarray(hr[key]).tobytes(), key
    # values stored as given: no scaling, no display window
    assert out.dataobj.slope == 1.0 and out.dataobj.inter == 0.0
    assert float(ho["cal_min"]) == 0.0 and float(ho["cal_max"]) == 0.0


# --------------------------------------------------------------------------------------------
# NIfTI: axis order, headers, round trip
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])
@pytest.mark.parametrize("slice_axis", [0, 1, 2])
def test_nifti_round_trip_keeps_voxel_order_and_header(tmp_path, suffix, slice_axis):
    rng = np.random.default_rng(slice_axis)
    raw = rng.integers(-500, 3000, size=(6, 7, 8)).astype(np.int16)  # (i, j, k)
    src = tmp_path / f"scan{suffix}"
    ref = write_nifti(src, raw)

    scan = load_scan(src, slice_axis=slice_axis)
    perm = EXPECTED_PERM[slice_axis]
    expected = raw.transpose(perm)
    vol = scan.read()
    assert vol.dtype == np.float32 and vol.flags.c_contiguous
    assert vol.shape == expected.shape == scan.shape
    assert np.array_equal(vol, expected)
    assert scan.dtype == np.int16
    g = scan.geometry
    assert isinstance(g, Geometry) and g.format == "nifti"
    assert g.slice_axis == slice_axis and g.file_shape == (6, 7, 8)
    assert g.units == "micron"
    # pixdim (0.5, 0.7, 0.9) micron along (i, j, k) -> mm along (Z, Y, X)
    zooms_mm = np.array([0.5, 0.7, 0.9]) / 1000.0
    np.testing.assert_allclose(g.spacing_mm, zooms_mm[list(perm)], rtol=1e-6)
    assert np.array_equal(g.affine, ref.affine)
    scan.close()

    # float32: every value back in the file's voxel order
    out = save_volume(tmp_path / f"out_prob{suffix}", vol, g, dtype=np.float32)
    back = nib.load(str(out))
    assert back.get_data_dtype() == np.float32
    assert back.shape == raw.shape
    assert np.array_equal(np.asarray(back.dataobj), raw.astype(np.float32))
    assert_header_kept(back, ref)

    # uint8 pores
    pores = (vol > 1000).astype(np.uint8)
    out = save_volume(tmp_path / f"out_pores{suffix}", pores, g, dtype=np.uint8)
    back = nib.load(str(out))
    assert back.get_data_dtype() == np.uint8
    assert np.array_equal(np.asarray(back.dataobj), (raw > 1000).astype(np.uint8))
    assert_header_kept(back, ref)


@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])
def test_nifti_scaled_data_and_nifti2(tmp_path, suffix):
    raw = np.arange(5 * 6 * 7, dtype=np.int16).reshape(5, 6, 7)
    src = tmp_path / f"scaled{suffix}"
    ref = write_nifti(src, raw, slope=(2.0, 5.0), units="mm")
    assert ref.dataobj.slope == 2.0 and ref.dataobj.inter == 5.0  # the fixture really is scaled
    assert np.array_equal(ref.get_fdata(), raw * 2.0 + 5.0)
    for axis in (0, 2):
        with load_scan(src, slice_axis=axis) as scan:
            assert np.array_equal(scan.read(), (raw * 2.0 + 5.0).transpose(EXPECTED_PERM[axis]))
            assert np.array_equal(scan.read_slices(1, 3), (raw * 2.0 + 5.0).transpose(EXPECTED_PERM[axis])[1:3])
    vol, g = read_volume(src)
    np.testing.assert_allclose(g.spacing_mm, (0.9, 0.7, 0.5), rtol=1e-6)
    back = nib.load(str(save_volume(tmp_path / f"o{suffix}", vol, g, dtype=np.float32)))
    assert np.array_equal(np.asarray(back.dataobj), raw * 2.0 + 5.0)
    assert_header_kept(back, ref)

    src2 = tmp_path / "n2.nii"
    ref2 = write_nifti(src2, raw, cls=nib.Nifti2Image, units="meter")
    vol2, g2 = read_volume(src2)
    np.testing.assert_allclose(g2.spacing_mm, (900.0, 700.0, 500.0), rtol=1e-6)
    back2 = nib.load(str(save_volume(tmp_path / "o2.nii", vol2, g2, dtype=np.int16)))
    assert isinstance(back2, nib.Nifti2Image)
    assert np.array_equal(np.asarray(back2.dataobj), raw)
    assert_header_kept(back2, ref2)


@pytest.mark.parametrize("extra", [(1,), (1, 1)])
def test_nifti_trailing_singleton_dims_are_squeezed(tmp_path, extra):
    raw = np.random.default_rng(1).random((6, 7, 8)).astype(np.float32)
    src = tmp_path / "single.nii.gz"
    ref = write_nifti(src, raw.reshape(raw.shape + extra))
    scan = load_scan(src)
    assert scan.geometry.file_shape == (6, 7, 8) + extra
    assert np.array_equal(scan.read(), raw.transpose(2, 1, 0))
    back = nib.load(str(save_volume(tmp_path / "o.nii.gz", scan.read(), scan.geometry)))
    assert back.shape == (6, 7, 8)
    assert np.array_equal(np.asarray(back.dataobj), raw)
    assert np.array_equal(back.affine, ref.affine)
    assert np.array_equal(back.header["pixdim"], ref.header["pixdim"])


def test_unknown_units_taken_as_mm(tmp_path):
    src = tmp_path / "u.nii"
    write_nifti(src, np.zeros((4, 5, 6), np.uint8), zooms=(0.25, 0.5, 2.0), units="unknown")
    g = load_scan(src).geometry
    assert g.units == "unknown"
    assert g.spacing_mm == (2.0, 0.5, 0.25)


def test_array_geometry_written_as_nifti(tmp_path):
    vol = np.random.default_rng(2).random((4, 5, 6)).astype(np.float32)  # (Z, Y, X)
    g = geometry_from_array(vol.shape, (0.3, 0.2, 0.1))
    out = save_volume(tmp_path / "a.nii.gz", vol, g)
    img = nib.load(str(out))
    assert np.array_equal(np.asarray(img.dataobj), vol.transpose(2, 1, 0))  # (i, j, k) = (x, y, z)
    np.testing.assert_allclose(img.affine, np.diag([0.1, 0.2, 0.3, 1.0]), rtol=1e-6)
    assert int(img.header["qform_code"]) == 1 and int(img.header["sform_code"]) == 1
    assert img.header.get_xyzt_units()[0] == "mm"
    vol2, g2 = read_volume(out)
    assert np.array_equal(vol2, vol)
    np.testing.assert_allclose(g2.spacing_mm, (0.3, 0.2, 0.1), rtol=1e-6)


def test_geometry_pickles_and_compares(tmp_path):
    src = tmp_path / "p.nii.gz"
    write_nifti(src, np.zeros((4, 5, 6), np.int16))
    scan = load_scan(src, slice_axis=1)
    g = scan.geometry
    g2 = pickle.loads(pickle.dumps(g))
    assert g2 == g and g2 is not g
    assert g2 != geometry_from_array(g.shape, g.spacing_mm)
    assert not g.affine.flags.writeable
    s2 = pickle.loads(pickle.dumps(scan))  # reopens on first read
    assert np.array_equal(s2[1:3], scan[1:3])


# --------------------------------------------------------------------------------------------
# Lazy reading
# --------------------------------------------------------------------------------------------


def _make_source(kind: str, tmp_path: Path, vol: np.ndarray) -> Path:
    """``vol`` is (Z, Y, X); write it in the given container with nibabel/tifffile directly."""
    if kind in ("nii", "nii.gz"):
        p = tmp_path / f"v.{kind}"
        nib.save(nib.Nifti1Image(vol.transpose(2, 1, 0), np.eye(4)), str(p))
    elif kind == "tif":
        p = tmp_path / "v.tif"
        tifffile.imwrite(str(p), vol, photometric="minisblack")
    else:
        p = tmp_path / "slices"
        p.mkdir()
        for z in range(vol.shape[0]):
            tifffile.imwrite(str(p / f"s_{z + 1}.tif"), vol[z])
    return p


@pytest.mark.parametrize("kind", ["nii", "nii.gz", "tif", "folder"])
def test_read_slices_equals_whole_read(tmp_path, kind):
    vol = np.random.default_rng(3).integers(0, 60000, size=(12, 7, 8)).astype(np.uint16)
    src = _make_source(kind, tmp_path, vol)
    with load_scan(src) as scan:
        whole = scan.read()
        assert np.array_equal(whole, vol.astype(np.float32))
        # forward, overlapping, backwards, single slice, empty, full
        for a, b in [(0, 3), (2, 7), (5, 12), (1, 4), (11, 12), (4, 4), (0, 12)]:
            part = scan.read_slices(a, b)
            assert part.shape == (b - a, 7, 8) and part.dtype == np.float32
            assert np.array_equal(part, whole[a:b]), (a, b)
            assert np.array_equal(scan[a:b], whole[a:b])
        assert np.array_equal(scan[-2:], whole[-2:])
        first = scan.read_slices(2, 6)
        first[:] = -1  # the caller owns what it gets: no shared cache
        assert np.array_equal(scan.read_slices(3, 8), whole[3:8])
        assert np.array_equal(scan[3], whole[3])
        with pytest.raises(IndexError):
            scan.read_slices(5, 13)
    # closed -> reopens
    assert np.array_equal(scan.read_slices(6, 9), whole[6:9])


def test_folder_reads_only_requested_files(tmp_path, monkeypatch):
    vol = np.arange(12 * 3 * 4, dtype=np.uint8).reshape(12, 3, 4)
    scan = load_scan(_make_source("folder", tmp_path, vol))
    calls = []
    real = tifffile.imread
    monkeypatch.setattr(tifffile, "imread", lambda f, *a, **k: calls.append(Path(f).name) or real(f, *a, **k))
    assert np.array_equal(scan.read_slices(9, 11), vol[9:11])
    assert calls == ["s_10.tif", "s_11.tif"]


def test_nifti_uncompressed_is_memory_mapped(tmp_path):
    vol = np.zeros((5, 6, 7), np.float32)
    scan = load_scan(_make_source("nii", tmp_path, vol))
    assert isinstance(scan._reader.memmap, np.memmap)


# --------------------------------------------------------------------------------------------
# TIFF
# --------------------------------------------------------------------------------------------


def test_tiff_stack_and_folder_match_nifti(tmp_path):
    rng = np.random.default_rng(4)
    vol = rng.random((12, 5, 6)).astype(np.float32)  # (Z, Y, X)
    dz_um, dy_um, dx_um = 4.5, 3.5, 2.25
    meta = {"spacing": dz_um, "unit": "um"}
    res = (1 / dx_um, 1 / dy_um)

    nii = tmp_path / "v.nii.gz"
    img = nib.Nifti1Image(vol.transpose(2, 1, 0), np.diag([dx_um, dy_um, dz_um, 1]))
    img.header.set_xyzt_units("micron")
    nib.save(img, str(nii))

    stack = tmp_path / "v.tif"
    tifffile.imwrite(str(stack), vol, imagej=True, resolution=res, metadata={**meta, "axes": "ZYX"})

    folder = tmp_path / "slices"
    folder.mkdir()
    for z in range(vol.shape[0]):  # s_1 .. s_12: lexical order would put s_10 after s_1
        tifffile.imwrite(str(folder / f"s_{z + 1}.tif"), vol[z], imagej=True, resolution=res, metadata=meta)
    (folder / "notes.txt").write_text("not a slice")

    expected_mm = (dz_um / 1000, dy_um / 1000, dx_um / 1000)
    from_nii, g_nii = read_volume(nii)
    assert np.array_equal(from_nii, vol)
    for src in (stack, folder):
        arr, g = read_volume(src)
        assert np.array_equal(arr, from_nii), src
        assert g.format == "tiff" and g.shape == (12, 5, 6) and g.slice_axis == 0
        np.testing.assert_allclose(g.spacing_mm, expected_mm, rtol=1e-6)
        np.testing.assert_allclose(g.spacing_mm, g_nii.spacing_mm, rtol=1e-6)
    assert output_stem(folder) == "slices"


def test_tiff_output_round_trip(tmp_path):
    vol = (np.random.default_rng(5).random((6, 7, 8)) > 0.5).astype(np.uint8)
    g = geometry_from_array(vol.shape, (0.004, 0.002, 0.001))
    out = save_volume(tmp_path / "p.tif", vol, g)
    with tifffile.TiffFile(str(out)) as tif:
        assert np.array_equal(tif.asarray(), vol)
        assert tif.imagej_metadata["spacing"] == pytest.approx(4.0)
    arr, g2 = read_volume(out)
    assert np.array_equal(arr, vol)
    np.testing.assert_allclose(g2.spacing_mm, g.spacing_mm, rtol=1e-6)


def test_tiff_single_3d_page(tmp_path):
    vol = np.random.default_rng(6).random((5, 16, 32)).astype(np.float32)
    p = tmp_path / "vol.tif"
    tifffile.imwrite(str(p), vol, volumetric=True, tile=(16, 16))
    scan = load_scan(p)
    assert np.array_equal(scan.read(), vol)
    assert np.array_equal(scan.read_slices(1, 3), vol[1:3])


# --------------------------------------------------------------------------------------------
# Bad input: InputError, one line, naming the file
# --------------------------------------------------------------------------------------------


def _valid_gz_bytes(tmp_path: Path) -> bytes:
    src = tmp_path / "good.nii.gz"
    data = np.random.default_rng(7).integers(0, 1000, size=(16, 16, 16)).astype(np.int16)
    nib.save(nib.Nifti1Image(data, np.eye(4)), str(src))
    return src.read_bytes()


def bad_missing(tmp_path):
    return tmp_path / "missing_scan.nii.gz", None


def bad_empty_nii(tmp_path):
    p = tmp_path / "empty_scan.nii.gz"
    p.write_bytes(b"")
    return p, None


def bad_empty_tif(tmp_path):
    p = tmp_path / "empty_stack.tif"
    p.write_bytes(b"")
    return p, None


def bad_truncated_gz(tmp_path):
    blob = _valid_gz_bytes(tmp_path)
    p = tmp_path / "cut_scan.nii.gz"
    p.write_bytes(blob[: len(blob) // 2])
    return p, None


def bad_truncated_multimember_gz(tmp_path):
    # two gzip members (as pigz/bgzip write): the end-of-file size check alone cannot decide
    raw = gzip.decompress(_valid_gz_bytes(tmp_path))
    blob = gzip.compress(raw[:3000]) + gzip.compress(raw[3000:])
    p = tmp_path / "cut_members.nii.gz"
    p.write_bytes(blob[: len(blob) - 500])
    return p, None


def bad_truncated_nii(tmp_path):
    src = tmp_path / "good.nii"
    nib.save(nib.Nifti1Image(np.ones((8, 8, 8), np.float32), np.eye(4)), str(src))
    p = tmp_path / "cut_scan.nii"
    p.write_bytes(src.read_bytes()[:1000])
    return p, None


def bad_text_as_nii(tmp_path):
    p = tmp_path / "notes_scan.nii"
    p.write_text("this is not a NIfTI file\n" * 40)
    return p, None


def bad_plain_as_gz(tmp_path):
    src = tmp_path / "plain.nii"
    nib.save(nib.Nifti1Image(np.ones((4, 4, 4), np.float32), np.eye(4)), str(src))
    p = tmp_path / "not_gzipped.nii.gz"
    p.write_bytes(src.read_bytes())
    return p, None


def bad_garbage_tif(tmp_path):
    p = tmp_path / "garbage.tif"
    p.write_bytes(os.urandom(2000))
    return p, None


def bad_extension(tmp_path):
    p = tmp_path / "scan.mha"
    p.write_bytes(b"ObjectType = Image\n")
    return p, None


def bad_2d_nifti(tmp_path):
    p = tmp_path / "flat_scan.nii.gz"
    nib.save(nib.Nifti1Image(np.ones((8, 7), np.float32), np.eye(4)), str(p))
    return p, None


def bad_one_slice_nifti(tmp_path):
    p = tmp_path / "one_slice.nii"
    nib.save(nib.Nifti1Image(np.ones((8, 7, 1), np.float32), np.eye(4)), str(p))
    return p, None


def bad_2d_tiff(tmp_path):
    p = tmp_path / "flat_stack.tif"
    tifffile.imwrite(str(p), np.ones((8, 7), np.uint8))
    return p, None


def bad_4d_volumes(tmp_path):
    p = tmp_path / "series_scan.nii.gz"
    nib.save(nib.Nifti1Image(np.ones((5, 6, 7, 3), np.float32), np.eye(4)), str(p))
    return p, None


def bad_rgb_tiff(tmp_path):
    p = tmp_path / "colour.tif"
    tifffile.imwrite(str(p), np.ones((4, 6, 7, 3), np.uint8), photometric="rgb")
    return p, None


def bad_pages_of_different_shapes(tmp_path):
    p = tmp_path / "mixed_pages.tif"
    with tifffile.TiffWriter(str(p)) as w:
        w.write(np.ones((6, 7), np.uint8))
        w.write(np.ones((6, 7), np.uint8))
        w.write(np.ones((6, 5), np.uint8))
    return p, None


def bad_folder_odd_file(tmp_path):
    p = tmp_path / "slices"
    p.mkdir()
    for z in range(1, 5):
        tifffile.imwrite(str(p / f"s_{z}.tif"), np.ones((6, 7), np.uint8))
    tifffile.imwrite(str(p / "s_3b.tif"), np.ones((6, 8), np.uint8))
    return p, "s_3b.tif"


def bad_folder_3d_file(tmp_path):
    p = tmp_path / "slices3d"
    p.mkdir()
    tifffile.imwrite(str(p / "a_1.tif"), np.ones((6, 7), np.uint8))
    tifffile.imwrite(str(p / "a_2.tif"), np.ones((3, 6, 7), np.uint8), photometric="minisblack")
    return p, "a_2.tif"


def bad_empty_folder(tmp_path):
    p = tmp_path / "no_slices"
    p.mkdir()
    (p / "readme.txt").write_text("x")
    return p, None


BAD_OPEN = [
    bad_missing, bad_empty_nii, bad_empty_tif, bad_truncated_gz, bad_truncated_multimember_gz,
    bad_truncated_nii, bad_text_as_nii, bad_plain_as_gz, bad_garbage_tif, bad_extension,
    bad_2d_nifti, bad_one_slice_nifti, bad_2d_tiff, bad_4d_volumes, bad_rgb_tiff,
    bad_pages_of_different_shapes, bad_folder_odd_file, bad_folder_3d_file, bad_empty_folder,
]


@pytest.mark.parametrize("make", BAD_OPEN, ids=[f.__name__ for f in BAD_OPEN])
def test_bad_input_refused_at_load(tmp_path, make):
    path, odd_name = make(tmp_path)
    with pytest.raises(InputError) as info:
        load_scan(path)
    msg = str(info.value)
    assert path.name in msg
    if odd_name is not None:
        assert odd_name in msg
    assert "\n" not in msg


def test_valid_multimember_gz_loads(tmp_path):
    # the complement of bad_truncated_multimember_gz: the same file, whole, must load
    blob = _valid_gz_bytes(tmp_path)
    raw = gzip.decompress(blob)
    p = tmp_path / "members.nii.gz"
    p.write_bytes(gzip.compress(raw[:3000]) + gzip.compress(raw[3000:]))
    ref = np.asarray(nib.load(str(tmp_path / "good.nii.gz")).dataobj).transpose(2, 1, 0)
    assert np.array_equal(load_scan(p).read(), ref)


def test_corrupt_gz_data_raises_on_read(tmp_path):
    # header intact and gzip trailer intact, but a compressed byte in the middle flipped
    blob = bytearray(_valid_gz_bytes(tmp_path))
    blob[len(blob) // 2] ^= 0xFF
    p = tmp_path / "flipped.nii.gz"
    p.write_bytes(bytes(blob))
    with pytest.raises(InputError) as info:
        load_scan(p).read()
    assert p.name in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("bad_value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("suffix", [".nii", ".nii.gz", ".tif"])
def test_nonfinite_voxels_raise_on_their_slices(tmp_path, bad_value, suffix):
    vol = np.random.default_rng(8).random((8, 5, 6)).astype(np.float32)  # (Z, Y, X)
    vol[5, 2, 3] = bad_value
    p = tmp_path / f"holes{suffix}"
    if suffix == ".tif":
        tifffile.imwrite(str(p), vol, photometric="minisblack")
    else:
        nib.save(nib.Nifti1Image(vol.transpose(2, 1, 0), np.eye(4)), str(p))
    scan = load_scan(p)  # opening does not read every voxel
    assert np.array_equal(scan.read_slices(0, 5), vol[:5])
    assert np.array_equal(scan.read_slices(6, 8), vol[6:])
    with pytest.raises(InputError) as info:
        scan.read_slices(4, 7)
    msg = str(info.value)
    assert p.name in msg and "4..6" in msg and "slice 5" in msg
    with pytest.raises(InputError):
        scan.read()
    info_dict = scan.describe()
    assert info_dict["nonfinite_voxels"] == 1
    finite = vol[np.isfinite(vol)]
    assert info_dict["min"] == pytest.approx(float(finite.min()))
    assert info_dict["max"] == pytest.approx(float(finite.max()))


@pytest.mark.parametrize("suffix", [".nii.gz", ".tif"])
def test_bad_slice_axis(tmp_path, suffix):
    p = _make_source(suffix.lstrip("."), tmp_path, np.zeros((4, 5, 6), np.float32))
    bad = 3 if suffix == ".nii.gz" else 2
    with pytest.raises(InputError) as info:
        load_scan(p, slice_axis=bad)
    assert p.name in str(info.value)
    assert load_scan(p, slice_axis=0).shape  # 0 is valid for both


# --------------------------------------------------------------------------------------------
# Labels
# --------------------------------------------------------------------------------------------


def test_read_label_values_and_shape(tmp_path):
    lab = (np.random.default_rng(9).random((6, 7, 8)) > 0.7).astype(np.uint8)  # (i, j, k)
    good = tmp_path / "truth.nii.gz"
    nib.save(nib.Nifti1Image(lab, np.eye(4)), str(good))
    out = read_label(good)
    assert out.dtype == np.uint8 and np.array_equal(out, lab.transpose(2, 1, 0))

    # slice axis follows the scan's geometry when not given
    scan_path = tmp_path / "scan.nii.gz"
    nib.save(nib.Nifti1Image(lab.astype(np.float32), np.eye(4)), str(scan_path))
    g0 = load_scan(scan_path, slice_axis=0).geometry
    assert np.array_equal(read_label(good, like=g0), lab.transpose(0, 2, 1))

    odd = lab.copy()
    odd[0, 0, 0], odd[1, 1, 1] = 2, 255
    bad = tmp_path / "bad_truth.nii.gz"
    nib.save(nib.Nifti1Image(odd, np.eye(4)), str(bad))
    with pytest.raises(InputError) as info:
        read_label(bad)
    msg = str(info.value)
    assert bad.name in msg and "2" in msg and "255" in msg

    like = geometry_from_array((8, 7, 5))
    with pytest.raises(InputError) as info:
        read_label(good, like=like)
    msg = str(info.value)
    assert good.name in msg and "(8, 7, 6)" in msg and "(8, 7, 5)" in msg


# --------------------------------------------------------------------------------------------
# Writing: atomic, clear errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), RuntimeError("boom")])
def test_save_volume_is_atomic_nifti(tmp_path, monkeypatch, error):
    vol = np.ones((4, 5, 6), np.float32)
    g = geometry_from_array(vol.shape)
    outdir = tmp_path / "out"
    outdir.mkdir()
    old = save_volume(outdir / "kept.nii.gz", vol * 3, g)
    old_bytes = old.read_bytes()
    real_save = nib.save

    def failing_save(img, filename):
        real_save(img, filename)
        blob = Path(filename).read_bytes()
        Path(filename).write_bytes(blob[: len(blob) // 2])  # a partial file, then the failure
        raise error

    monkeypatch.setattr(nib, "save", failing_save)
    expected = InputError if isinstance(error, OSError) else type(error)
    with pytest.raises(expected):
        save_volume(outdir / "new.nii.gz", vol, g)
    with pytest.raises(expected):
        save_volume(outdir / "kept.nii.gz", vol, g)
    assert sorted(os.listdir(outdir)) == ["kept.nii.gz"]
    assert old.read_bytes() == old_bytes


def test_save_volume_is_atomic_tiff(tmp_path, monkeypatch):
    vol = np.ones((4, 5, 6), np.uint8)
    g = geometry_from_array(vol.shape)

    def failing_write(filename, *args, **kwargs):
        Path(filename).write_bytes(b"II*\x00partial")
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(tifffile, "imwrite", failing_write)
    with pytest.raises(InputError) as info:
        save_volume(tmp_path / "p.tif", vol, g)
    assert str(tmp_path) in str(info.value)
    assert os.listdir(tmp_path) == []


def test_save_volume_bad_folder_and_values(tmp_path):
    vol = np.zeros((4, 5, 6), np.uint8)
    g = geometry_from_array(vol.shape)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    for target in (blocker / "o.nii.gz", tmp_path / "missing_dir" / "o.nii.gz"):
        with pytest.raises(InputError) as info:
            save_volume(target, vol, g)
        assert str(target.parent) in str(info.value)
    with pytest.raises(InputError):
        save_volume(tmp_path / "o.png", vol, g)
    with pytest.raises(ValueError):
        save_volume(tmp_path / "o.nii", np.zeros((4, 5, 7)), g)
    with pytest.raises(ValueError):  # 0.5 cannot be stored in uint8 as given
        save_volume(tmp_path / "o.nii", np.full((4, 5, 6), 0.5), g, dtype=np.uint8)
    with pytest.raises(NonFiniteError):
        save_volume(tmp_path / "o.nii", np.full((4, 5, 6), np.nan, np.float32), g)
    assert sorted(os.listdir(tmp_path)) == ["a_file"]
    out = save_volume(tmp_path / "o.nii", vol.astype(bool), g)  # bool -> uint8
    assert nib.load(str(out)).get_data_dtype() == np.uint8


def test_output_stem():
    assert output_stem("/x/rock_01.nii.gz") == "rock_01"
    assert output_stem("a.b.nii") == "a.b"
    assert output_stem("scan.TIFF") == "scan"
    assert output_stem("scan.tif") == "scan"
    assert output_stem("scan.raw") == "scan.raw"
    # the other formats' suffixes, from the one table of formats
    assert output_stem("/x/scan.h5") == "scan" and output_stem("scan.HDF5") == "scan"
    assert output_stem("scan.h5:/exchange/data") == "scan"
    assert output_stem("ct.mhd") == "ct" and output_stem("ct.mha") == "ct"
    assert output_stem("core.ome.zarr") == "core" and output_stem("core.zarr") == "core"


# --------------------------------------------------------------------------------------------
# The transposed-scan hint
# --------------------------------------------------------------------------------------------


def _hints(path, **kw) -> list[str]:
    import warnings

    from ctpore.errors import CtporeWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_scan(path, **kw)
    return [str(w.message) for w in caught if issubclass(w.category, CtporeWarning)]


@pytest.mark.parametrize("zooms, slice_axis, expected", [
    ((0.01, 0.02, 0.01), None, 1),   # in-plane 0.01 x 0.02 along k; square along j (0.01 x 0.01)
    ((0.02, 0.01, 0.01), None, 0),   # square along i
    ((0.02, 0.01, 0.01), 1, 0),      # a chosen axis is questioned too
    ((0.01, 0.02, 0.01), 1, None),   # the right axis: silent
    ((0.01, 0.01, 0.01), None, None),  # isotropic
    ((0.01, 0.01, 0.05), None, None),  # thicker slices along k, the common case
    ((0.01, 0.0100001, 0.05), None, None),  # within 1 %: square
    ((0.01, 0.02, 0.03), None, None),  # no axis gives square pixels: nothing to suggest
])
def test_transposed_scan_hint(tmp_path, zooms, slice_axis, expected):
    p = tmp_path / "hint.nii"
    img = nib.Nifti1Image(np.zeros((6, 7, 8), np.float32), np.diag([*zooms, 1.0]))
    img.header.set_xyzt_units("mm")
    nib.save(img, str(p))
    hints = _hints(p, slice_axis=slice_axis)
    if expected is None:
        assert hints == []
    else:
        assert len(hints) == 1 and f"pass --slice-axis {expected}" in hints[0] and p.name in hints[0]
        assert _hints(p, slice_axis=expected) == []  # following the hint silences it
        lab = tmp_path / "hint_label.nii"
        nib.save(nib.Nifti1Image(np.zeros((6, 7, 8), np.uint8), np.diag([*zooms, 1.0])), str(lab))
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            read_label(lab, like=load_scan(p, slice_axis=expected).geometry)
        assert caught == []  # a label is not hinted at: its scan was


# --------------------------------------------------------------------------------------------
# Real data
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(not REAL_GRAY.exists(), reason="real scan not present")
def test_real_quantimpy_scan():
    ref = nib.load(str(REAL_GRAY)).get_fdata().transpose(2, 1, 0)  # (k, j, i)
    with load_scan(REAL_GRAY) as scan:
        assert scan.shape == (100, 100, 100)
        assert scan.dtype == np.uint16
        for a, b in [(0, 10), (45, 60), (90, 100)]:
            assert np.array_equal(scan.read_slices(a, b), ref[a:b].astype(np.float32))
        info = scan.describe()
    assert info["min"] == ref.min() and info["max"] == ref.max()
    assert info["units"] == "unknown" and info["spacing_mm"] == [1.0, 1.0, 1.0]
