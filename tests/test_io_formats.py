"""The formats beyond NIfTI and TIFF: HDF5, MetaImage, OME-Zarr, PNG/BMP slice folders; the reader
table and its recipe.

Truth: every file is written here with its own library (h5py, zarr, Pillow) or by hand (MetaImage
headers, raw bytes), from one array; its NIfTI twin is written with nibabel. What ctpore reads
from each must be that array, with the spacing written into the file.
"""

from __future__ import annotations

import contextlib
import json
import struct
import sys
import zlib
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from ctpore.data.io import load_scan, output_stem, read_label
from ctpore.data.io import registry
from ctpore.data.io.reader import PlaneReader, Reader
from ctpore.data.io.geometry import Geometry
from ctpore.errors import CtporeWarning, InputError
from helpers import blob_volume, write_nifti

h5py = pytest.importorskip("h5py")
zarr = pytest.importorskip("zarr")
from PIL import Image  # noqa: E402  (after the skips)

SPACING_UM = (30.0, 15.0, 15.0)  # (z, y, x): thicker slices, square in-plane pixels
SPACING_MM = tuple(d / 1000 for d in SPACING_UM)
UNKNOWN = ((1.0, 1.0, 1.0), "unknown")


# --- writers: (folder, (Z, Y, X) array) -> (path to open, (spacing_mm, units) expected) ---------


def hdf5_dxchange(d: Path, vol):
    p = d / "recon.h5"
    with h5py.File(p, "w") as f:
        f["/exchange/data"] = vol
        f["/exchange/dark"] = vol[:2] * 0  # another 3D dataset: /exchange/data is still the one
        det = f.create_group("/measurement/instrument/detector")
        det["actual_pixel_size_x"] = SPACING_UM[2]
        det["actual_pixel_size_y"] = SPACING_UM[0]  # the detector's rows become the slices
        for k in ("actual_pixel_size_x", "actual_pixel_size_y"):
            det[k].attrs["units"] = "microns"
    return p, (SPACING_MM, "micron")


def hdf5_single_chunked(d: Path, vol):
    p = d / "volume.hdf5"
    with h5py.File(p, "w") as f:
        ds = f.create_dataset("/recon/volume", data=vol, chunks=(2, 6, 7), compression="gzip")
        ds.attrs["element_size_um"] = SPACING_UM
        f["/recon/preview"] = vol[0]  # 2D: not a candidate
    return p, (SPACING_MM, "micron")


def hdf5_named_dataset(d: Path, vol):
    p = d / "two.h5"
    with h5py.File(p, "w") as f:
        f["/a"] = vol[::-1]
        f["/b"] = vol
    return Path(f"{p}:/b"), UNKNOWN


def _mhd_header(vol, **extra) -> str:
    z, y, x = vol.shape
    types = {np.dtype("uint16"): "MET_USHORT", np.dtype("float32"): "MET_FLOAT", np.dtype("uint8"): "MET_UCHAR"}
    lines = {"ObjectType": "Image", "NDims": "3", "DimSize": f"{x} {y} {z}",
             "ElementType": types[vol.dtype.newbyteorder("=")],
             "ElementSpacing": " ".join(str(d) for d in SPACING_MM[::-1]), **extra}
    return "".join(f"{k} = {v}\n" for k, v in lines.items())


def mhd_raw(d: Path, vol):
    p = d / "scan.mhd"
    vol.astype("<" + vol.dtype.str[1:]).tofile(d / "scan.raw")
    p.write_text(_mhd_header(vol, ElementDataFile="scan.raw"))
    return p, (SPACING_MM, "mm")


def mhd_big_endian_header_size(d: Path, vol):
    p = d / "be.mhd"
    (d / "be.img").write_bytes(b"\x07" * 100 + vol.astype(">" + vol.dtype.str[1:]).tobytes())
    p.write_text(_mhd_header(vol, BinaryDataByteOrderMSB="True", HeaderSize="100", ElementDataFile="be.img"))
    return p, (SPACING_MM, "mm")


def mha_local(d: Path, vol):
    p = d / "scan.mha"
    p.write_bytes(_mhd_header(vol, ElementDataFile="LOCAL").encode() + vol.astype("<u2").tobytes())
    return p, (SPACING_MM, "mm")


def mha_zlib(d: Path, vol):
    p = d / "packed.mha"
    data = zlib.compress(vol.astype("<u2").tobytes())
    head = _mhd_header(vol, CompressedData="True", CompressedDataSize=str(len(data)), ElementDataFile="LOCAL")
    p.write_bytes(head.encode() + data)
    return p, (SPACING_MM, "mm")


def png_folder(d: Path, vol):
    p = d / "png_slices"
    p.mkdir()
    for z in range(vol.shape[0]):
        Image.fromarray(vol[z]).save(p / f"slice_{z + 1}.png")  # natural order: slice_10 after slice_9
    return p, UNKNOWN


def bmp_folder(d: Path, vol):
    p = d / "bmp_slices"
    p.mkdir()
    for z in range(vol.shape[0]):
        Image.fromarray(vol[z]).save(p / f"s{z + 1}.bmp")
    return p, UNKNOWN


def _ngff(axes, scale, version="0.4", levels=1):
    return [{"version": version, "axes": axes,
             "datasets": [{"path": str(i), "coordinateTransformations": [
                 {"type": "scale", "scale": [s * 2**i if a["type"] == "space" else s for s, a in zip(scale, axes)]}]}
                 for i in range(levels)]}]


def ome_zarr_04(d: Path, vol):
    p = d / "core.ome.zarr"
    g = zarr.open_group(str(p), mode="w", zarr_format=2)
    a = g.create_array("0", shape=(1,) + vol.shape, chunks=(1, 3, 5, 6), dtype=vol.dtype)
    a[:] = vol[None]
    axes = [{"name": "c", "type": "channel"}] + [{"name": n, "type": "space", "unit": "micrometer"} for n in "zyx"]
    g.attrs["multiscales"] = _ngff(axes, (1.0,) + SPACING_UM)
    return p, (SPACING_MM, "micron")


def ome_zarr_05(d: Path, vol):
    p = d / "core05.zarr"
    g = zarr.open_group(str(p), mode="w", zarr_format=3)
    a = g.create_array("0", shape=vol.shape, chunks=(4, 4, 4), dtype=vol.dtype)
    a[:] = vol
    half = g.create_array("1", shape=tuple(n // 2 for n in vol.shape), chunks=(4, 4, 4), dtype=vol.dtype)
    half[:] = vol[::2, ::2, ::2][: vol.shape[0] // 2, : vol.shape[1] // 2, : vol.shape[2] // 2]
    axes = [{"name": n, "type": "space", "unit": "millimeter"} for n in "zyx"]
    g.attrs["ome"] = {"version": "0.5", "multiscales": _ngff(axes, SPACING_MM, "0.5", levels=2)}
    return p, (SPACING_MM, "mm")


WRITERS = [hdf5_dxchange, hdf5_single_chunked, hdf5_named_dataset, mhd_raw, mhd_big_endian_header_size, mha_local,
           mha_zlib, png_folder, bmp_folder, ome_zarr_04, ome_zarr_05]
WINDOWED = {hdf5_dxchange, hdf5_single_chunked, hdf5_named_dataset, mhd_raw, mhd_big_endian_header_size, mha_local,
            ome_zarr_04, ome_zarr_05}


@pytest.mark.parametrize("write", WRITERS, ids=[w.__name__ for w in WRITERS])
def test_same_values_and_spacing_as_the_nifti_of_the_same_volume(tmp_path, write):
    vol = blob_volume(np.uint8 if write is bmp_folder else np.uint16)
    path, (spacing, units) = write(tmp_path, vol)
    ref = load_scan(write_nifti(tmp_path / "twin.nii", vol, spacing))
    with load_scan(path) as scan:
        assert isinstance(scan._reader, Reader)
        assert scan.shape == ref.shape == vol.shape
        whole = scan.read()
        assert np.array_equal(whole, ref.read()) and np.array_equal(whole, vol.astype(np.float32))
        assert scan.geometry.spacing_mm == pytest.approx(spacing, rel=1e-6)
        assert scan.geometry.units == units
        if units != "unknown":
            assert scan.geometry.spacing_mm == pytest.approx(ref.geometry.spacing_mm, rel=1e-6)
        assert scan.windowed == (write in WINDOWED)
        # forward, backwards (a sequential reader restarts), overlapping, one slice
        for a, b in [(6, 9), (1, 4), (3, 7), (9, 10)]:
            assert np.array_equal(scan.read_slices(a, b), vol[a:b].astype(np.float32)), (a, b)
        assert np.array_equal(scan.read_window(2, 5, 3, 9, 4, 13), vol[2:5, 3:9, 4:13].astype(np.float32))
    assert output_stem(path) in {"recon", "volume", "two", "scan", "be", "packed", "png_slices", "bmp_slices",
                                 "core", "core05"}


@pytest.mark.parametrize("write", [hdf5_dxchange, mhd_raw, ome_zarr_05, png_folder],
                         ids=["hdf5", "metaimage", "ome-zarr", "png"])
def test_reconstruct_gives_the_pores_and_spacing_of_the_nifti(tmp_path, write):
    from ctpore.pipelines.reconstruct import reconstruct_file

    vol = blob_volume(shape=(12, 16, 16))
    path, (spacing, units) = write(tmp_path, vol)
    twin = write_nifti(tmp_path / "twin.nii.gz", vol, spacing)
    said = pytest.warns(CtporeWarning, match="no length unit") if units == "unknown" else contextlib.nullcontext()
    with said:
        ours = reconstruct_file(path, tmp_path / "out", method="otsu")
    ref = reconstruct_file(twin, tmp_path / "ref", method="otsu")
    pores, ref_pores = nib.load(str(ours["pores"])), nib.load(str(ref["pores"]))
    assert np.asarray(pores.dataobj).any()
    assert np.array_equal(np.asarray(pores.dataobj), np.asarray(ref_pores.dataobj))
    assert pores.header.get_zooms()[:3] == pytest.approx(spacing[::-1], rel=1e-6)
    metrics = json.loads(Path(ours["metrics"]).read_text())
    if units == "unknown":
        assert metrics["spacing_mm_zyx"] is None
    else:
        assert metrics["spacing_mm_zyx"] == pytest.approx(list(spacing), rel=1e-6)
        assert metrics["porosity"] == ref["result"]["porosity"]


@pytest.mark.parametrize("write", sorted(WINDOWED, key=lambda w: w.__name__), ids=lambda w: w.__name__)
def test_a_window_is_read_without_its_planes(tmp_path, write):
    # A NaN outside the window: reading whole planes and cropping them would find it and refuse.
    vol = np.random.default_rng(1).random((8, 12, 14)).astype(np.float32)
    vol[3, 0, 0] = np.nan
    if write in (mha_local,):
        path = tmp_path / "f.mha"
        path.write_bytes(_mhd_header(vol, ElementDataFile="LOCAL").encode() + vol.astype("<f4").tobytes())
    else:
        path, _ = write(tmp_path, vol)
    scan = load_scan(path)
    assert np.array_equal(scan.read_window(2, 5, 4, 10, 3, 12), vol[2:5, 4:10, 3:12])
    with pytest.raises(InputError, match="NaN or Inf"):
        scan.read_slices(2, 5)


# --- headers that lie: refused from the header, before anything is allocated --------------


def _huge_png(d: Path) -> Path:
    p = d / "huge_png"
    p.mkdir()
    for z in range(3):
        Image.fromarray(np.zeros((8, 8), np.uint16)).save(p / f"{z}.png")
    blob = bytearray((p / "1.png").read_bytes())
    ihdr = 8 + 8  # signature, then the IHDR chunk's length and type
    blob[ihdr:ihdr + 8] = struct.pack(">II", 60000, 60000)
    blob[ihdr + 13:ihdr + 17] = struct.pack(">I", zlib.crc32(bytes(blob[ihdr - 4:ihdr + 13])))
    (p / "1.png").write_bytes(bytes(blob))
    return p


def _huge_bmp(d: Path) -> Path:
    p = d / "huge_bmp"
    p.mkdir()
    for z in range(3):
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(p / f"{z}.bmp")
    blob = bytearray((p / "2.bmp").read_bytes())
    blob[18:26] = struct.pack("<ii", 50000, 50000)
    (p / "2.bmp").write_bytes(bytes(blob))
    return p


def _lying_mhd(d: Path) -> Path:
    (d / "small.raw").write_bytes(b"\0" * 1000)
    p = d / "lying.mhd"
    p.write_text("NDims = 3\nDimSize = 2000 2000 1000\nElementType = MET_FLOAT\nElementDataFile = small.raw\n")
    return p


def _lying_mha_zlib(d: Path) -> Path:
    p = d / "lying.mha"
    p.write_bytes(b"NDims = 3\nDimSize = 2000 2000 1000\nElementType = MET_FLOAT\nCompressedData = True\n"
                  b"ElementDataFile = LOCAL\n" + zlib.compress(bytes(100_000), 9))
    return p


def _lying_compressed_size(d: Path) -> Path:
    p = d / "short.mha"
    data = zlib.compress(bytes(4 * 5 * 6 * 2))
    p.write_bytes(f"NDims = 3\nDimSize = 6 5 4\nElementType = MET_SHORT\nCompressedData = True\n"
                  f"CompressedDataSize = {len(data) + 5000}\nElementDataFile = LOCAL\n".encode() + data)
    return p


def _truncated_h5(d: Path) -> Path:
    p = d / "cut.h5"
    with h5py.File(p, "w") as f:
        f["/exchange/data"] = np.ones((20, 30, 40), np.float32)
    blob = p.read_bytes()
    p.write_bytes(blob[: len(blob) // 2])
    return p


LYING = [_lying_mhd, _lying_mha_zlib, _lying_compressed_size, _truncated_h5, _huge_png, _huge_bmp]


@pytest.mark.parametrize("make", LYING, ids=[f.__name__.strip("_") for f in LYING])
def test_lying_header_refused_before_allocation(tmp_path, make):
    path = make(tmp_path)
    with pytest.raises(InputError) as info:
        load_scan(path)
    msg = str(info.value)
    assert msg.startswith(str(path)) and "\n" not in msg
    assert "is truncated or its header is wrong" in msg
    assert "does not fit in memory" not in msg  # refused from the header, not after allocating


def test_zarr_claiming_a_huge_volume_or_holding_no_chunk_is_refused(tmp_path):
    vol = blob_volume()
    path, _ = ome_zarr_04(tmp_path, vol)
    meta = path / "0" / ".zarray"
    spec = json.loads(meta.read_text())
    spec["shape"] = [1, 200000, 200000, 200000]
    meta.write_text(json.dumps(spec))
    with pytest.raises(InputError, match="reading one 200000 x 200000 slice needs .* of memory"):
        load_scan(path)
    empty = zarr.open_group(str(tmp_path / "empty.zarr"), mode="w", zarr_format=2)
    empty.create_array("0", shape=(4, 5, 6), chunks=(2, 5, 6), dtype="u2")
    empty.attrs["multiscales"] = _ngff([{"name": n, "type": "space"} for n in "zyx"], (1, 1, 1))
    with pytest.raises(InputError, match="has no chunk stored"):
        load_scan(tmp_path / "empty.zarr")


# --- choosing what to read -----------------------------------------------------------------


def test_hdf5_with_several_volumes_lists_them_and_says_how_to_choose(tmp_path):
    vol = blob_volume()
    path, _ = hdf5_named_dataset(tmp_path, vol)
    file = Path(str(path).split(":")[0])
    with pytest.raises(InputError) as info:
        load_scan(file)
    msg = str(info.value)
    assert "/a 10 x 12 x 14" in msg and "/b 10 x 12 x 14" in msg and f"{file}:/a" in msg
    assert np.array_equal(load_scan(f"{file}:/a").read(), vol[::-1].astype(np.float32))
    with pytest.raises(InputError, match="/c is not in the file; its 3D datasets: /a"):
        load_scan(f"{file}:/c")
    assert output_stem(f"{file}:/b") == "two"


def test_ome_zarr_with_several_channels_is_refused(tmp_path):
    p = tmp_path / "rgb.ome.zarr"
    g = zarr.open_group(str(p), mode="w", zarr_format=2)
    g.create_array("0", shape=(2, 4, 5, 6), chunks=(1, 4, 5, 6), dtype="u1")[:] = 1
    axes = [{"name": "c", "type": "channel"}] + [{"name": n, "type": "space"} for n in "zyx"]
    g.attrs["multiscales"] = _ngff(axes, (1, 1, 1, 1))
    with pytest.raises(InputError, match="has 2 channel entries along axis 'c'"):
        load_scan(p)


def test_slice_folders_of_mixed_kinds_or_colour_are_refused(tmp_path):
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for z in range(3):
        Image.fromarray(np.zeros((6, 7), np.uint8)).save(mixed / f"{z}.png")
    Image.fromarray(np.zeros((6, 7), np.uint8)).save(mixed / "9.bmp")
    with pytest.raises(InputError, match=r"several kinds \(3 PNG, 1 BMP\)"):
        load_scan(mixed)
    colour = tmp_path / "colour"
    colour.mkdir()
    for z in range(3):
        Image.fromarray(np.zeros((6, 7, 3), np.uint8)).save(colour / f"{z}.png")
    with pytest.raises(InputError, match="0.png is a colour \\(RGB\\) image"):
        load_scan(colour)


@pytest.mark.parametrize("package, write", [("h5py", hdf5_dxchange), ("zarr", ome_zarr_04)])
def test_a_missing_optional_package_is_an_input_error_with_the_pip_line(tmp_path, monkeypatch, package, write):
    path, _ = write(tmp_path, blob_volume())
    monkeypatch.setitem(sys.modules, package, None)  # import fails as if it were not installed
    with pytest.raises(InputError) as info:
        load_scan(path)
    assert f"pip install {package}" in str(info.value) and str(path) in str(info.value)


def test_new_formats_refuse_another_slice_axis(tmp_path):
    path, _ = mhd_raw(tmp_path, blob_volume())
    with pytest.raises(InputError, match="slice axis 1 only applies to NIfTI files; the slices of a MetaImage"):
        load_scan(path, slice_axis=1)
    assert load_scan(path, slice_axis=0).shape == (10, 12, 14)


def test_a_label_of_another_format_keeps_its_own_slices(tmp_path):
    lab = (blob_volume() < 20000).astype(np.uint8)
    scan = load_scan(write_nifti(tmp_path / "scan.nii", lab.astype(np.float32), SPACING_MM), slice_axis=2)
    path, _ = mhd_raw(tmp_path, lab)
    assert np.array_equal(read_label(path, like=scan.geometry), lab)


# --- the recipe: a new format is one module and one line ------------------------------------


class NpyReader(PlaneReader):
    """A toy format: a 3D ``.npy`` array, already ``(Z, Y, X)``."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.array = np.load(self.path, mmap_mode="r")
        self.dtype = self.array.dtype
        self.geometry = Geometry("npy", self.array.shape, (1.0, 1.0, 1.0), 0, self.array.shape, units="unknown")

    def read(self, start: int, stop: int) -> np.ndarray:
        return np.array(self.array[start:stop])

    def close(self) -> None:
        self.array = None


def test_a_toy_format_registered_with_one_line_is_read(tmp_path, monkeypatch):
    arr = np.arange(4 * 5 * 6, dtype=np.int16).reshape(4, 5, 6)
    np.save(tmp_path / "toy.npy", arr)
    with pytest.raises(InputError, match="unsupported file type .npy"):
        load_scan(tmp_path / "toy.npy")
    monkeypatch.setattr(registry, "READERS", list(registry.READERS))  # undone after the test
    registry.register(registry.Format("npy", "NumPy", (".npy",), NpyReader))  # the one line
    scan = load_scan(tmp_path / "toy.npy")
    assert isinstance(scan._reader, Reader)
    assert np.array_equal(scan.read(), arr.astype(np.float32))
    assert np.array_equal(scan.read_window(1, 3, 2, 4, 1, 5), arr[1:3, 2:4, 1:5])
    assert registry.file_kind(tmp_path / "toy.npy") == "npy" and output_stem(tmp_path / "toy.npy") == "toy"
    assert "NumPy (.npy)" in registry.supported_help()
    with pytest.raises(ValueError):
        registry.register(registry.Format("npy", "NumPy again", (".npz",), NpyReader))


def test_napari_is_offered_every_file_suffix_of_the_table():
    import yaml

    manifest = Path(__file__).resolve().parent.parent / "app" / "napari" / "napari.yaml"
    patterns = set(yaml.safe_load(manifest.read_text())["contributions"]["readers"][0]["filename_patterns"])
    suffixes = {s for f in registry.READERS if not f.folder_of for s in f.suffixes}
    assert {"*" + s for s in suffixes} <= patterns


def test_a_jpeg_folder_reads_what_pillow_decodes(tmp_path):
    # JPEG is lossy: the truth is each file as Pillow decodes it, in natural order
    p = tmp_path / "jpeg_slices"
    p.mkdir()
    vol = blob_volume(np.uint8)
    for z in range(vol.shape[0]):
        Image.fromarray(vol[z]).save(p / f"im{z + 1}.jpg", quality=90)
    decoded = np.stack([np.asarray(Image.open(p / f"im{z + 1}.jpg")) for z in range(vol.shape[0])])
    with load_scan(p) as scan:
        assert scan.geometry.format == "jpeg" and scan.geometry.units == "unknown"
        assert np.array_equal(scan.read(), decoded.astype(np.float32))
