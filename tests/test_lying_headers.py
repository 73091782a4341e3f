"""Files whose headers claim more data than they hold: refused from the header, before any allocation.

Each lying file goes through the real ``ctpore`` command in a fresh process: exit code 2, one
``ctpore: error: <path>: ...`` line, no traceback, no output folder, and a small peak memory (the
file is refused from its header, not after nibabel or tifffile allocated what it claims). Valid
files, highly compressible ones included, must still open.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import tifffile

from ctpore.data.io import load_scan
from ctpore.data.io.nifti import NiftiReader
from ctpore.errors import InputError

# Peak resident memory allowed to a refusing ``ctpore`` process (it imports torch for reconstruct).
MAX_RSS = 500 * 2**20

# Runs the command in a fresh child and prints [wall seconds, the child's peak RSS in bytes, exit
# code]. A forked child's ru_maxrss starts at its parent's high-water mark, so the parent is this
# small launcher, not pytest. The child's stdout goes to the file named first.
_LAUNCHER = """
import json, os, sys, time
t = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.execvp(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_pid, status, usage = os.wait4(pid, 0)
print(json.dumps([time.perf_counter() - t, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status)]))
"""


def measured_cli(args: list, tmp_path: Path) -> tuple[int, str, str, float, int]:
    """Run ``ctpore ARGS`` in a fresh process: (exit code, stdout, stderr, wall seconds, peak RSS bytes)."""
    stdout_file = tmp_path / "cli_stdout.txt"
    env = dict(os.environ, CTPORE_NO_PROGRESS="1", OMP_NUM_THREADS="1")
    env.pop("CTPORE_DEBUG", None)
    cmd = [sys.executable, "-m", "ctpore.app.cli", *[str(a) for a in args]]
    proc = subprocess.run([sys.executable, "-c", _LAUNCHER, str(stdout_file), *cmd], capture_output=True,
                          text=True, env=env, timeout=300, check=False)
    seconds, rss, code = json.loads(proc.stdout.strip().splitlines()[-1])
    return int(code), stdout_file.read_text(), proc.stderr, float(seconds), int(rss)


# --------------------------------------------------------------------------------------------
# Lying files
# --------------------------------------------------------------------------------------------


def _nifti_header_only(path: Path, header_cls, shape) -> Path:
    """A ``.nii`` of the header, 4 extension bytes and 100 zero bytes: far less than ``shape`` needs."""
    h = header_cls()
    h.set_data_shape(shape)
    h.set_data_dtype(np.float32)
    path.write_bytes(h.binaryblock + b"\0" * 4 + b"\0" * 100)
    return path


def lying_nifti1(tmp_path):
    return _nifti_header_only(tmp_path / "lying_n1.nii", nib.Nifti1Header, (2000, 2000, 1000))  # 16 GB


def lying_nifti2(tmp_path):
    return _nifti_header_only(tmp_path / "lying_n2.nii", nib.Nifti2Header, (100000,) * 3)  # 4 PB


def lying_nifti1_max(tmp_path):
    return _nifti_header_only(tmp_path / "lying_max.nii", nib.Nifti1Header, (32767,) * 3)  # 141 TB


def lying_gz(tmp_path):
    # 100 kB of zeros compress to ~100 bytes; the header claims 16 GB: > 1032 x the file size.
    h = nib.Nifti1Header()
    h.set_data_shape((2000, 2000, 1000))
    h.set_data_dtype(np.float32)
    p = tmp_path / "lying_scan.nii.gz"
    p.write_bytes(gzip.compress(h.binaryblock + b"\0" * 4 + b"\0" * 100_000))
    return p


def _tiff_by_hand(path: Path, width: int, height: int, pages: int, compression: int, bytecount: int) -> Path:
    """A little-endian TIFF of ``pages`` IFDs, each ``height x width`` uint16 in one strip that
    points at the same 64 bytes of data and claims ``bytecount`` bytes."""
    out = bytearray(b"II*\0" + struct.pack("<I", 0))
    data_offset = len(out)
    out += b"\0" * 64
    ifds, next_slots = [], []
    for _ in range(pages):
        ifds.append(len(out))
        tags = [(256, 4, width), (257, 4, height), (258, 3, 16), (259, 3, compression), (262, 3, 1),
                (273, 4, data_offset), (277, 3, 1), (278, 4, height), (279, 4, bytecount)]
        out += struct.pack("<H", len(tags))
        for tag, typ, value in tags:
            short = typ == 3  # SHORT values sit left-aligned in the 4-byte value field
            out += struct.pack("<HHIHH", tag, typ, 1, value, 0) if short else struct.pack("<HHII", tag, typ, 1, value)
        next_slots.append(len(out))
        out += struct.pack("<I", 0)
    struct.pack_into("<I", out, 4, ifds[0])
    for slot, nxt in zip(next_slots, ifds[1:]):
        struct.pack_into("<I", out, slot, nxt)
    path.write_bytes(bytes(out))
    return path


def lying_tiff(tmp_path):
    # 3 uncompressed pages of 40000 x 40000 uint16 (9.6 GB) in a few hundred bytes
    return _tiff_by_hand(tmp_path / "lying_stack.tif", 40000, 40000, 3, 1, 40000 * 40000 * 2)


def lying_deflate_tiff(tmp_path):
    # 3 Deflate pages of 40000 x 40000 uint16 from 40 compressed bytes each
    return _tiff_by_hand(tmp_path / "lying_deflate.tif", 40000, 40000, 3, 8, 40)


LYING = [lying_nifti1, lying_nifti2, lying_nifti1_max, lying_gz, lying_tiff, lying_deflate_tiff]


@pytest.mark.parametrize("command", ["info", "reconstruct"])
@pytest.mark.parametrize("make", LYING, ids=[f.__name__ for f in LYING])
def test_lying_file_is_refused_from_its_header(tmp_path, make, command):
    path = make(tmp_path)
    out = tmp_path / "out"
    args = [command, path] + (["-o", out] if command == "reconstruct" else [])
    code, stdout, stderr, seconds, rss = measured_cli(args, tmp_path)
    print(f"{command} {path.name}: exit {code}, {seconds:.2f} s, peak RSS {rss / 2**20:.0f} MiB")
    lines = stderr.strip().splitlines()
    assert code == 2, stderr
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"ctpore: error: {path}: "), stderr
    assert "is truncated or its header is wrong" in lines[0]
    assert "Traceback" not in stderr and "MemoryError" not in stderr
    assert stdout == ""
    assert not out.exists()
    assert 0 < rss < MAX_RSS, f"peak RSS {rss / 2**20:.0f} MiB"


@pytest.mark.parametrize("make", LYING, ids=[f.__name__ for f in LYING])
def test_lying_file_refused_in_process(tmp_path, make):
    path = make(tmp_path)
    with pytest.raises(InputError) as info:
        load_scan(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: is truncated or its header is wrong") and "\n" not in msg
    assert "re-export" in msg


def test_lying_nifti_message_says_what_and_how_much(tmp_path):
    path = lying_nifti1(tmp_path)
    with pytest.raises(InputError) as info:
        load_scan(path)
    msg = str(info.value)
    assert "2000 x 2000 x 1000 float32 (16.0 GB of voxel data)" in msg
    assert f"the file holds {path.stat().st_size} bytes" in msg


def test_lying_slice_in_a_folder_names_the_slice(tmp_path):
    folder = tmp_path / "slices"
    folder.mkdir()
    for z in (1, 2):
        tifffile.imwrite(str(folder / f"s_{z}.tif"), np.zeros((6, 7), np.uint16))
    _tiff_by_hand(folder / "s_3.tif", 40000, 40000, 1, 1, 40000 * 40000 * 2)
    with pytest.raises(InputError) as info:
        load_scan(folder)
    assert "s_3.tif" in str(info.value) and "is truncated or its header is wrong" in str(info.value)


def test_truncated_data_within_the_deflate_bound_is_still_refused(tmp_path):
    # a header claiming a little more than the stream holds: caught by the existing gzip check
    h = nib.Nifti1Header()
    h.set_data_shape((20, 20, 20))
    h.set_data_dtype(np.float32)
    p = tmp_path / "short.nii.gz"
    p.write_bytes(gzip.compress(h.binaryblock + b"\0" * 4 + os.urandom(20 * 20 * 10 * 4)))
    with pytest.raises(InputError) as info:
        load_scan(p)
    assert p.name in str(info.value)


# --------------------------------------------------------------------------------------------
# Memory: refused with a line that says how much and what to do
# --------------------------------------------------------------------------------------------


def _little_memory(monkeypatch, nbytes: int) -> None:
    import ctpore.data.io.formats as formats
    import ctpore.data.io.nifti as nifti

    monkeypatch.setattr(formats, "available_memory", lambda: nbytes)
    monkeypatch.setattr(nifti, "available_memory", lambda: nbytes)


def test_gz_read_along_i_refused_when_it_cannot_be_held(tmp_path, monkeypatch):
    vol = np.arange(16 * 12 * 10, dtype=np.float32).reshape(16, 12, 10)
    p = tmp_path / "held.nii.gz"
    nib.save(nib.Nifti1Image(vol, np.eye(4)), str(p))
    assert load_scan(p, slice_axis=0).read().shape == (16, 10, 12)
    _little_memory(monkeypatch, 4000)  # less than the 7.7 kB of voxels
    with pytest.raises(InputError) as info:
        load_scan(p, slice_axis=0)
    msg = str(info.value)
    assert p.name in msg and "decompress it to .nii" in msg and "slice axis 2" in msg and "\n" not in msg
    assert load_scan(p).shape == (10, 12, 16)  # along k it is read slice by slice


def test_slice_that_cannot_fit_memory_is_refused_at_open(tmp_path, monkeypatch):
    p = tmp_path / "wide.nii"
    nib.save(nib.Nifti1Image(np.zeros((40, 30, 4), np.float32), np.eye(4)), str(p))
    _little_memory(monkeypatch, 1000)  # one 30 x 40 slice needs more
    with pytest.raises(InputError) as info:
        load_scan(p)
    assert "one 30 x 40 slice" in str(info.value) and p.name in str(info.value)


def test_whole_tiff_image_that_cannot_fit_memory_is_refused(tmp_path, monkeypatch):
    p = tmp_path / "volume.tif"
    tifffile.imwrite(str(p), np.zeros((5, 16, 32), np.uint16), volumetric=True, tile=(16, 16))
    _little_memory(monkeypatch, 4000)  # the one 3D page holds 5.1 kB
    with pytest.raises(InputError) as info:
        load_scan(p)
    assert p.name in str(info.value) and "read whole" in str(info.value)


def test_memory_error_while_reading_becomes_input_error(tmp_path, monkeypatch):
    p = tmp_path / "small.nii"
    nib.save(nib.Nifti1Image(np.zeros((6, 5, 4), np.float32), np.eye(4)), str(p))
    scan = load_scan(p)

    def no_memory(self, *args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(NiftiReader, "read", no_memory)
    for call in (lambda: scan.read_slices(0, 2), lambda: scan.read_window(0, 2, 0, 3, 0, 3), scan.read):
        with pytest.raises(InputError) as info:
            call()
        msg = str(info.value)
        assert msg.startswith(f"{p}: does not fit in memory") and "\n" not in msg


def test_memory_error_while_opening_becomes_input_error(tmp_path, monkeypatch):
    p = tmp_path / "small.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((6, 5, 4), np.float32), np.eye(4)), str(p))

    def no_memory(self, *args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(NiftiReader, "__init__", no_memory)
    with pytest.raises(InputError) as info:
        load_scan(p)
    assert str(info.value).startswith(f"{p}: does not fit in memory: opening it ran out of memory")


def test_whole_read_beyond_memory_is_refused_before_allocating(tmp_path, monkeypatch):
    p = tmp_path / "small.nii"
    nib.save(nib.Nifti1Image(np.zeros((20, 20, 20), np.float32), np.eye(4)), str(p))
    scan = load_scan(p)
    _little_memory(monkeypatch, 10_000)  # a slice (1.6 kB) fits, the volume (32 kB) does not
    assert scan.read_slices(0, 2).shape == (2, 20, 20)
    with pytest.raises(InputError) as info:
        scan.read()
    assert p.name in str(info.value) and "whole scan" in str(info.value)


# --------------------------------------------------------------------------------------------
# Valid files are not refused
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])
def test_valid_small_nifti_reads_back(tmp_path, suffix):
    data = np.random.default_rng(0).integers(0, 4000, size=(9, 7, 5)).astype(np.int16)  # (i, j, k)
    p = tmp_path / f"good{suffix}"
    nib.save(nib.Nifti1Image(data, np.eye(4)), str(p))
    assert np.array_equal(load_scan(p).read(), data.transpose(2, 1, 0))
    assert np.array_equal(load_scan(p, slice_axis=0).read(), data.transpose(0, 2, 1))


@pytest.mark.parametrize("n", [64, 192])
def test_all_zero_gz_compressed_to_the_limit_opens(tmp_path, n):
    # zeros at gzip level 9 are close to deflate's 1032:1 ceiling; they must not look like a lie
    h = nib.Nifti1Header()
    h.set_data_shape((n, n, n))
    h.set_data_dtype(np.uint8)
    raw = h.binaryblock + b"\0" * 4 + bytes(n**3)
    p = tmp_path / f"zeros{n}.nii.gz"
    p.write_bytes(gzip.compress(raw, compresslevel=9))
    print(f"{p.name}: {len(raw)} bytes in {p.stat().st_size} ({len(raw) / p.stat().st_size:.0f}:1)")
    scan = load_scan(p)
    assert scan.shape == (n, n, n)
    chunk = scan.read_slices(n - 2, n)
    assert chunk.shape == (2, n, n) and not chunk.any()


def test_all_zero_deflate_tiff_opens(tmp_path):
    vol = np.zeros((3, 2048, 2048), np.uint8)
    p = tmp_path / "zeros.tif"
    tifffile.imwrite(str(p), vol, photometric="minisblack", compression="zlib", compressionargs={"level": 9},
                     rowsperstrip=2048)
    print(f"{p.name}: {vol.nbytes} bytes in {p.stat().st_size}")
    scan = load_scan(p)
    assert scan.shape == vol.shape and not scan.read_slices(0, 3).any()
