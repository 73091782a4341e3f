"""NRRD: a detached ``.nhdr`` with its raw or gzip data file, and an attached ``.nrrd``.

Truth: every NRRD is written here by hand (a text header, the array's bytes from numpy, gzip from
the standard library), and its NIfTI twin with nibabel, from one array. What ctpore reads must be
that array with the spacing the header gives, ``ctpore reconstruct`` must give the twin's pores,
and headers that lie or that ctpore cannot read are refused in one line (exit code 2).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from ctpore.data.io import load_scan, output_stem
from ctpore.data.io import registry
from ctpore.data.io.reader import Reader
from ctpore.errors import InputError
from helpers import blob_volume, run_cli, write_nifti

SPACING_MM = (0.03, 0.015, 0.015)  # (z, y, x): thicker slices, square in-plane pixels
_TYPES = {"u1": "uchar", "u2": "unsigned short", "i2": "int16", "f4": "float", "f8": "double"}


def header(vol, encoding="raw", endian="little", spacing="directions", **fields) -> str:
    """A NRRD0004 header for ``vol`` (``(Z, Y, X)``, so sizes are ``X Y Z``) ending in its blank line."""
    z, y, x = vol.shape
    dz, dy, dx = SPACING_MM
    lines = ["NRRD0004", "# Complete NRRD file format specification at:", f"type: {_TYPES[vol.dtype.str[1:]]}",
             "dimension: 3", f"sizes: {x} {y} {z}", f"endian: {endian}", f"encoding: {encoding}", "kinds: domain "
             "domain domain", "creator:=ctpore tests"]
    if spacing == "directions":  # as 3D Slicer writes it
        lines += ["space: left-posterior-superior", f"space directions: ({dx},0,0) (0,{dy},0) (0,0,{dz})",
                  'space units: "mm" "mm" "mm"', "space origin: (-1.5,2,0.25)"]
    elif spacing == "spacings-um":
        lines += [f"spacings: {dx * 1000:g} {dy * 1000:g} {dz * 1000:g}", 'units: "um" "micron" "microns"']
    lines += [f"{k.replace('_', ' ')}: {v}" for k, v in fields.items()]
    return "\n".join(lines) + "\n\n"


def raw_bytes(vol, endian="little") -> bytes:
    return vol.astype(("<" if endian == "little" else ">") + vol.dtype.str[1:]).tobytes()


# --- writers: (folder, (Z, Y, X) array) -> (path to open, (spacing_mm, units) expected) ---------


def nhdr_raw(d: Path, vol):
    (d / "scan.raw").write_bytes(raw_bytes(vol))
    (d / "scan.nhdr").write_text(header(vol, data_file="scan.raw"))
    return d / "scan.nhdr", (SPACING_MM, "mm")


def nhdr_raw_big_endian_line_and_byte_skip(d: Path, vol):
    (d / "data").mkdir()
    (d / "data" / "be.img").write_bytes(b"first line\nsecond\n" + b"\x07" * 33 + raw_bytes(vol, "big"))
    (d / "be.nhdr").write_text(header(vol, endian="big", spacing="spacings-um", datafile="data/be.img",
                                      line_skip=2, byte_skip=33))
    return d / "be.nhdr", (SPACING_MM, "micron")


def nhdr_raw_byte_skip_minus_one(d: Path, vol):
    (d / "tail.raw").write_bytes(b"\x01" * 1234 + raw_bytes(vol))
    (d / "tail.nhdr").write_text(header(vol, spacing="none", data_file="tail.raw", byte_skip=-1))
    return d / "tail.nhdr", ((1.0, 1.0, 1.0), "unknown")


def nhdr_gzip(d: Path, vol):
    (d / "scan.raw.gz").write_bytes(gzip.compress(raw_bytes(vol)))
    (d / "packed.nhdr").write_text(header(vol, encoding="gzip", data_file="scan.raw.gz"))
    return d / "packed.nhdr", (SPACING_MM, "mm")


def nhdr_gzip_big_endian_two_members_byte_skip(d: Path, vol):
    data = b"\x05" * 40 + raw_bytes(vol, "big")
    half = len(data) // 2 + 3  # two gzip members, as `cat a.gz b.gz` gives: one stream
    (d / "two.raw.gz").write_bytes(gzip.compress(data[:half]) + gzip.compress(data[half:]))
    (d / "two.nhdr").write_text(header(vol, encoding="gz", endian="big", data_file="two.raw.gz", byte_skip=40))
    return d / "two.nhdr", (SPACING_MM, "mm")


def nrrd_attached_raw(d: Path, vol):
    (d / "scan.nrrd").write_bytes(header(vol).encode() + raw_bytes(vol))
    return d / "scan.nrrd", (SPACING_MM, "mm")


def nrrd_attached_gzip_big_endian(d: Path, vol):
    (d / "packed.nrrd").write_bytes(header(vol, encoding="gzip", endian="big").encode()
                                    + gzip.compress(raw_bytes(vol, "big")))
    return d / "packed.nrrd", (SPACING_MM, "mm")


WRITERS = [nhdr_raw, nhdr_raw_big_endian_line_and_byte_skip, nhdr_raw_byte_skip_minus_one, nhdr_gzip,
           nhdr_gzip_big_endian_two_members_byte_skip, nrrd_attached_raw, nrrd_attached_gzip_big_endian]
RAW = {nhdr_raw, nhdr_raw_big_endian_line_and_byte_skip, nhdr_raw_byte_skip_minus_one, nrrd_attached_raw}


@pytest.mark.parametrize("write", WRITERS, ids=[w.__name__ for w in WRITERS])
def test_same_values_and_spacing_as_the_nifti_of_the_same_volume(tmp_path, write):
    vol = blob_volume()
    path, (spacing, units) = write(tmp_path, vol)
    ref = load_scan(write_nifti(tmp_path / "twin.nii", vol, SPACING_MM))
    with load_scan(path) as scan:
        assert isinstance(scan._reader, Reader) and scan.geometry.format == "nrrd"
        assert scan.shape == ref.shape == vol.shape
        whole = scan.read()
        assert np.array_equal(whole, ref.read()) and np.array_equal(whole, vol.astype(np.float32))
        assert scan.geometry.spacing_mm == pytest.approx(spacing, rel=1e-9)
        assert scan.geometry.units == units
        assert scan.windowed == (write in RAW) and scan.sequential == (write not in RAW)
        # forward, backwards (a gzip stream restarts), overlapping, one slice
        for a, b in [(6, 9), (1, 4), (3, 7), (9, 10)]:
            assert np.array_equal(scan.read_slices(a, b), vol[a:b].astype(np.float32)), (a, b)
        assert np.array_equal(scan.read_window(2, 5, 3, 9, 4, 13), vol[2:5, 3:9, 4:13].astype(np.float32))
    assert output_stem(path) in {"scan", "be", "tail", "packed", "two"}


@pytest.mark.parametrize("dtype", ["u1", "i2", "f4", "f8"])
def test_every_voxel_type_reads_its_values(tmp_path, dtype):
    vol = (blob_volume() // 256).astype(dtype) - (3 if dtype != "u1" else 0)
    (tmp_path / "v.nrrd").write_bytes(header(vol, endian="big").encode() + raw_bytes(vol, "big"))
    with load_scan(tmp_path / "v.nrrd") as scan:
        assert scan._reader.dtype == np.dtype(dtype).newbyteorder(">" if dtype != "u1" else "=")
        assert np.array_equal(scan.read(), vol.astype(np.float32))


def test_spacing_is_the_length_of_each_space_direction_in_its_units(tmp_path):
    vol = blob_volume(shape=(4, 5, 6))
    oblique = "(0.006,0.008,0) (0,0,0.02) (0.05,0,0)"  # lengths 0.01, 0.02, 0.05 (x, y, z)
    cases = {
        'space units: "um" "um" "um"': ((0.05e-3, 0.02e-3, 0.01e-3), "micron"),
        'space units: "mm" "mm" "mm"': ((0.05, 0.02, 0.01), "mm"),
        "": ((0.05, 0.02, 0.01), "unknown"),  # numbers kept as they are: per voxel
        'space units: "pixel" "pixel" "pixel"': ((0.05, 0.02, 0.01), "unknown"),
    }
    for i, (units_line, (spacing, units)) in enumerate(cases.items()):
        text = header(vol, spacing="none", space="3D-right-handed", space_directions=oblique)
        text = text.replace("\n\n", "\n" + units_line + "\n\n") if units_line else text
        path = tmp_path / f"o{i}.nrrd"
        path.write_bytes(text.encode() + raw_bytes(vol))
        with load_scan(path) as scan:
            assert scan.geometry.spacing_mm == pytest.approx(spacing, rel=1e-12), units_line
            assert scan.geometry.units == units
    # an anatomical space without units (as 3D Slicer and ITK write it) is in mm; others stay unknown
    for space, units in (("left-posterior-superior", "mm"), ("RAS", "mm"), ("scanner-xyz", "unknown")):
        path = tmp_path / f"{space}.nrrd"
        path.write_bytes(header(vol, spacing="none", space=space, space_directions=oblique).encode() + raw_bytes(vol))
        with load_scan(path) as scan:
            assert scan.geometry.spacing_mm == pytest.approx((0.05, 0.02, 0.01), rel=1e-12)
            assert scan.geometry.units == units, space


@pytest.mark.parametrize("write", [nhdr_raw, nhdr_gzip, nrrd_attached_raw, nrrd_attached_gzip_big_endian],
                         ids=["nhdr-raw", "nhdr-gzip", "nrrd-raw", "nrrd-gzip-big-endian"])
def test_reconstruct_gives_the_pores_and_spacing_of_the_nifti(tmp_path, capsys, write):
    vol = blob_volume(shape=(12, 16, 16))
    path, (spacing, _) = write(tmp_path, vol)
    twin = write_nifti(tmp_path / "twin.nii.gz", vol, SPACING_MM)
    outs = {}
    for name, scan in (("ours", path), ("ref", twin)):
        code, _, err = run_cli(["reconstruct", scan, "-o", tmp_path / name, "--method", "otsu"], capsys)
        assert code == 0, err
        outs[name] = (tmp_path / name / f"{output_stem(scan)}_pores.nii.gz",
                      json.loads((tmp_path / name / f"{output_stem(scan)}_metrics.json").read_text()))
    (pores, metrics), (ref_pores, ref_metrics) = outs["ours"], outs["ref"]
    ours_img, ref_img = nib.load(str(pores)), nib.load(str(ref_pores))
    data = np.asarray(ours_img.dataobj)
    assert data.any() and not data.all()
    assert data.dtype == np.asarray(ref_img.dataobj).dtype
    assert data.tobytes() == np.asarray(ref_img.dataobj).tobytes()  # same voxel order: (x, y, z) both
    assert ours_img.header.get_zooms()[:3] == pytest.approx(spacing[::-1], rel=1e-6)
    assert metrics["spacing_mm_zyx"] == pytest.approx(list(spacing), rel=1e-6)
    assert metrics["spacing_mm_zyx"] == pytest.approx(ref_metrics["spacing_mm_zyx"], rel=1e-6)
    assert metrics["porosity"] == ref_metrics["porosity"]


def test_a_window_is_read_without_its_planes(tmp_path):
    # A NaN outside the window: reading whole planes and cropping them would find it and refuse.
    vol = np.random.default_rng(1).random((8, 12, 14)).astype(np.float32)
    vol[3, 0, 0] = np.nan
    (tmp_path / "w.raw").write_bytes(raw_bytes(vol, "big"))
    (tmp_path / "w.nhdr").write_text(header(vol, endian="big", data_file="w.raw"))
    scan = load_scan(tmp_path / "w.nhdr")
    assert scan.windowed
    for window in [(2, 5, 4, 10, 3, 12), (0, 8, 1, 12, 0, 14), (7, 8, 0, 1, 13, 14)]:
        z0, z1, y0, y1, x0, x1 = window
        assert np.array_equal(scan.read_window(*window), vol[z0:z1, y0:y1, x0:x1]), window
    with pytest.raises(InputError, match="NaN or Inf"):
        scan.read_slices(2, 5)


# --- headers that lie, and what ctpore does not read: one line, exit code 2 ----------------


def _lying_nhdr(d: Path) -> Path:
    (d / "small.raw").write_bytes(b"\0" * 1000)
    p = d / "lying.nhdr"
    p.write_text("NRRD0004\ntype: float\ndimension: 3\nsizes: 2000 2000 1000\nendian: little\nencoding: raw\n"
                 "data file: small.raw\n")  # a .nhdr may end without a blank line
    return p


def _lying_gzip_nrrd(d: Path) -> Path:
    p = d / "lying.nrrd"
    p.write_bytes(b"NRRD0005\ntype: float\ndimension: 3\nsizes: 2000 2000 1000\nendian: little\nencoding: gzip\n\n"
                  + gzip.compress(bytes(100_000), 9))
    return p


def _short_attached(d: Path) -> Path:
    vol = blob_volume(shape=(4, 5, 6))
    p = d / "short.nrrd"
    p.write_bytes(header(vol).encode() + raw_bytes(vol)[:-2])  # one voxel short
    return p


@pytest.mark.parametrize("make", [_lying_nhdr, _lying_gzip_nrrd, _short_attached], ids=lambda f: f.__name__[1:])
def test_lying_header_refused_before_allocation(tmp_path, make):
    path = make(tmp_path)
    with pytest.raises(InputError) as info:
        load_scan(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: is truncated or its header is wrong") and "\n" not in msg
    assert "re-export" in msg and "does not fit in memory" not in msg


def test_lying_header_through_the_command_is_exit_2_in_one_line(tmp_path, capsys):
    path = _lying_nhdr(tmp_path)
    code, out, err = run_cli(["reconstruct", path, "-o", tmp_path / "out", "--method", "otsu"], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and out == "", err
    assert lines[0].startswith(f"ctpore: error: {path}: is truncated or its header is wrong")
    assert "2000 x 2000 x 1000 float32 (16.0 GB of voxel data) but small.raw holds 1.0 kB" in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("encoding", ["ascii", "text", "txt", "hex", "bzip2", "bz2", "zstd"])
def test_encodings_other_than_raw_and_gzip_are_refused_in_one_line(tmp_path, capsys, encoding):
    vol = blob_volume(shape=(3, 4, 5))
    path = tmp_path / "a.nrrd"
    path.write_bytes(header(vol, encoding=encoding).encode() + " ".join(map(str, vol.ravel())).encode())
    code, out, err = run_cli(["reconstruct", path, "-o", tmp_path / "out", "--method", "otsu"], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and out == "", err
    assert lines[0].startswith(f"ctpore: error: {path}: holds its voxels with encoding {encoding}")
    assert "re-save it with raw or gzip encoding" in lines[0]


_REFUSED = {
    "several data files (LIST)": ("data file: LIST\nslice0.raw\nslice1.raw\n", "stores its slices in several files"),
    "several data files (printf)": ("data file: slice%03d.raw 0 9 1\n", "stores its slices in several files"),
    "no data file there": ("data file: missing.raw\n", "its data file missing.raw (data file:) is not there"),
    "4D": ("dimension: 4\nsizes: 2 5 4 3\n", "holds a 4-dimensional array (sizes: 2 5 4 3)"),
    "2D": ("dimension: 2\nsizes: 5 4\n", "holds a 2D image"),
    "sizes and dimension disagree": ("dimension: 3\nsizes: 5 4\n", "NRRD dimension: 3 but sizes has 2 numbers"),
    "no endian": ("endian: \n", "its 2-byte voxels need 'endian: little' or 'endian: big'"),
    "a type ctpore does not read": ("type: block\n", "NRRD type block is not supported"),
    "a none direction": ("space directions: (1,0,0) none (0,0,1)\n",
                         "does not give a vector for each of the 3 axes"),
    "byte skip -1 with gzip": ("encoding: gzip\nbyte skip: -1\n", "byte skip -1 is for raw data only"),
}


@pytest.mark.parametrize("case", list(_REFUSED), ids=list(_REFUSED))
def test_what_ctpore_does_not_read_is_refused_with_what_to_do(tmp_path, case):
    lines, expected = _REFUSED[case]
    (tmp_path / "s.raw").write_bytes(bytes(5 * 4 * 3 * 2))
    base = {"type": "ushort", "dimension": "3", "sizes": "5 4 3", "endian": "little", "encoding": "raw",
            "data file": "s.raw"}
    for line in lines.splitlines():
        if ": " in line or line.endswith(":") or line.endswith(": "):
            key, _, value = line.partition(":")
            base[key] = value.strip()
    text = "NRRD0004\n" + "".join(f"{k}: {v}\n" for k, v in base.items())
    if "LIST" in lines:
        text += "slice0.raw\nslice1.raw\n"
    path = tmp_path / "s.nhdr"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_scan(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg and expected in msg, msg


def test_not_a_nrrd_or_no_data_is_refused(tmp_path):
    (tmp_path / "x.nrrd").write_bytes(b"P5\n12 12\n255\n" + bytes(144))
    with pytest.raises(InputError, match=r"x.nrrd: is not a NRRD file: it starts with 'P5"):
        load_scan(tmp_path / "x.nrrd")
    (tmp_path / "h.nhdr").write_text("NRRD0004\ntype: uchar\ndimension: 3\nsizes: 4 4 4\nencoding: raw\n")
    with pytest.raises(InputError, match="names no data file and no blank line ends it"):
        load_scan(tmp_path / "h.nhdr")


# --- the reader table ------------------------------------------------------------------------


def test_the_table_knows_nrrd(tmp_path):
    path, _ = nhdr_raw(tmp_path, blob_volume())
    assert registry.file_kind(path) == "nrrd" and registry.file_kind(tmp_path / "a.NRRD") == "nrrd"
    assert output_stem(tmp_path / "core_3.nrrd") == "core_3"
    assert "NRRD (.nhdr, .nrrd)" in registry.supported_help()
    with pytest.raises(InputError, match="slice axis 1 only applies to NIfTI files; the slices of a NRRD"):
        load_scan(path, slice_axis=1)
    assert load_scan(path, slice_axis=0).shape == (10, 12, 14)
