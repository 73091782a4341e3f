"""MetaImage (``.mhd`` with its data file, or ``.mha`` with the data inside): the text header is
parsed here, the voxels are memory-mapped (uncompressed) or inflated as one zlib stream.

The header is ``Key = Value`` lines ending with ``ElementDataFile``. Read: ``NDims``, ``DimSize``
(x y z), ``ElementType`` (``MET_UCHAR`` ... ``MET_DOUBLE``), ``ElementSpacing`` (or
``ElementSize``), ``ElementNumberOfChannels`` (must be 1), ``BinaryDataByteOrderMSB`` /
``ElementByteOrderMSB``, ``HeaderSize`` (bytes to skip in the data file; -1: the data is the
file's last bytes), ``CompressedData`` (zlib) and ``CompressedDataSize``, and
``ElementDataFile`` (``LOCAL``: right after the header; a file name, relative to the header's
folder). Lists of slice files (``LIST``, ``%d`` patterns) and ASCII data are refused.

The data is x fastest, then y, then z, so the volume is already ``(Z, Y, X)``: the slices are
along DimSize's third axis. MetaImage has no unit field; ITK and the tools built on it take
ElementSpacing as mm, and so does ctpore (units ``"mm"``; ``"unknown"`` when no spacing is given).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ctpore.data.io.formats import (
    DEFLATE_MAX_RATIO,
    InflatedSlices,
    MappedOrInflated,
    check_3d,
    deflate_limit,
    reason,
    size_text,
    truncated_error,
)
from ctpore.data.io.geometry import Geometry
from ctpore.errors import InputError

__all__ = ["MetaImageReader", "METAIMAGE_SUFFIXES", "read_header"]

METAIMAGE_SUFFIXES = (".mhd", ".mha")

_TYPES = {
    "MET_UCHAR": "u1", "MET_CHAR": "i1", "MET_USHORT": "u2", "MET_SHORT": "i2", "MET_UINT": "u4",
    "MET_INT": "i4", "MET_ULONG": "u4", "MET_LONG": "i4", "MET_ULONG_LONG": "u8", "MET_LONG_LONG": "i8",
    "MET_FLOAT": "f4", "MET_DOUBLE": "f8",
}
_TRUE = ("true", "1", "yes")
# The most header text read before ElementDataFile must have appeared.
_MAX_HEADER = 1 << 20


def read_header(path: Path) -> tuple[dict[str, str], int]:
    """The header's ``{key: value}`` (keys as written) and the byte offset just after it."""
    try:
        with open(path, "rb") as f:
            head = f.read(_MAX_HEADER)
    except OSError as exc:
        raise InputError(f"cannot read the file ({reason(exc)})", path) from exc
    fields: dict[str, str] = {}
    pos = 0
    while pos < len(head):
        end = head.find(b"\n", pos)
        end = len(head) if end < 0 else end + 1
        line = head[pos:end].decode("latin-1").strip()
        pos = end
        if not line:
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise InputError(f"is not a MetaImage header: line {line[:40]!r} is not 'Key = Value'", path)
        fields[key.strip()] = value.strip()
        if key.strip().lower() == "elementdatafile":
            return fields, pos
    raise InputError("is not a MetaImage header: it has no ElementDataFile line", path)


def _get(fields: dict[str, str], *names: str) -> str | None:
    low = {k.lower(): v for k, v in fields.items()}
    for name in names:
        if name.lower() in low:
            return low[name.lower()]
    return None


def _numbers(text: str, kind, path: Path, key: str) -> list:
    try:
        return [kind(v) for v in text.split()]
    except ValueError:
        raise InputError(f"MetaImage {key} = {text!r} is not a list of numbers", path) from None


class MetaImageReader(MappedOrInflated):
    """One ``.mhd``/``.mha`` scan; windowed when uncompressed (memory map), sequential when
    compressed (one zlib stream). See :mod:`ctpore.data.io.metaimage`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        fields, header_end = read_header(self.path)
        dims = _numbers(_get(fields, "DimSize") or "", int, self.path, "DimSize")
        ndims = _get(fields, "NDims")
        if ndims is not None and ndims.strip() != str(len(dims)):
            raise InputError(f"MetaImage NDims = {ndims} but DimSize has {len(dims)} numbers ({dims})", self.path)
        if len(dims) > 3 and any(n != 1 for n in dims[3:]):
            raise InputError(f"holds several volumes (DimSize {dims}); ctpore needs one 3D volume", self.path)
        if any(n < 1 for n in dims):
            raise InputError(f"MetaImage DimSize {dims} has a size below 1", self.path)
        check_3d(tuple(dims[:3]), self.path, tuple(dims))
        channels = _get(fields, "ElementNumberOfChannels")
        if channels is not None and channels.strip() not in ("1", ""):
            raise InputError(f"has {channels} values per voxel (ElementNumberOfChannels); ctpore needs a "
                             "grayscale scan", self.path)
        etype = (_get(fields, "ElementType") or "").upper()
        if etype not in _TYPES:
            raise InputError(f"MetaImage ElementType {etype or '(missing)'} is not supported; ctpore reads "
                             f"{', '.join(_TYPES)}", self.path)
        msb = (_get(fields, "BinaryDataByteOrderMSB", "ElementByteOrderMSB") or "false").lower() in _TRUE
        self.dtype = np.dtype((">" if msb else "<") + _TYPES[etype])
        if (_get(fields, "BinaryData") or "true").lower() not in _TRUE:
            raise InputError("holds ASCII voxel data (BinaryData = False); save it as binary MetaImage", self.path)
        data_file = _get(fields, "ElementDataFile") or ""
        if data_file.upper() == "LOCAL":
            target, offset = self.path, header_end
        elif data_file.upper().startswith("LIST") or "%" in data_file or " " in data_file.strip():
            raise InputError(f"stores its slices in several files (ElementDataFile = {data_file}); ctpore reads "
                             "one data file: save the volume as one .raw or .mha", self.path)
        else:
            target, offset = self.path.parent / data_file, 0
            if not target.is_file():
                raise InputError(f"its data file {data_file} (ElementDataFile) is not there", self.path)
            header_size = int(_numbers(_get(fields, "HeaderSize") or "0", float, self.path, "HeaderSize")[0])
            offset = header_size
        nx, ny, nz = dims[:3]
        shape = (nz, ny, nx)
        nbytes = math.prod(dims) * self.dtype.itemsize
        size = target.stat().st_size
        compressed = (_get(fields, "CompressedData") or "false").lower() in _TRUE
        self.sequential = compressed
        self.windowed = not compressed
        self.memmap: np.ndarray | None = None
        self._stream: InflatedSlices | None = None
        if offset < 0:  # HeaderSize = -1: the data is the last bytes of the file
            offset = size - nbytes if not compressed else -1
            if offset < 0:
                raise truncated_error(self.path, "the header", tuple(dims), self.dtype, nbytes,
                                      f"{target.name} holds {size_text(size)}")
        if compressed:
            if offset < 0:
                raise InputError("has compressed data with HeaderSize = -1, which cannot be located", self.path)
            stored = size - offset
            given = _get(fields, "CompressedDataSize")
            if given is not None:
                claimed = int(_numbers(given, float, self.path, "CompressedDataSize")[0])
                if offset + claimed > size:
                    raise InputError(f"is truncated or its header is wrong: CompressedDataSize is {claimed} bytes but "
                                     f"{target.name} holds {size_text(stored)} after the header; re-export the scan",
                                     self.path)
                stored = claimed
            if nbytes > deflate_limit(stored):
                raise truncated_error(
                    self.path, "the header", tuple(dims), self.dtype, nbytes,
                    f"its {size_text(stored)} of zlib data can expand to at most {size_text(deflate_limit(stored))} "
                    f"(zlib compresses at most {DEFLATE_MAX_RATIO}:1)")
            self._stream = InflatedSlices(self.path, target, offset, ny * nx * self.dtype.itemsize)
        else:
            if offset + nbytes > size:
                raise truncated_error(self.path, "the header", tuple(dims), self.dtype, nbytes,
                                      f"{target.name} holds {size_text(size)}" + (f" ({offset} of them header)"
                                                                                 if offset else ""))
            try:
                self.memmap = np.memmap(target, self.dtype, mode="r", offset=offset, shape=shape)
            except MemoryError:
                raise
            except Exception as exc:
                raise InputError(f"its data cannot be mapped ({reason(exc)})", self.path) from exc
        spacing_text = _get(fields, "ElementSpacing", "ElementSize")
        spacing, units = (1.0, 1.0, 1.0), "unknown"
        if spacing_text is not None:
            sx, sy, sz = (_numbers(spacing_text, float, self.path, "ElementSpacing") + [1.0, 1.0, 1.0])[:3]
            if all(math.isfinite(d) and d > 0 for d in (sx, sy, sz)):
                spacing, units = (abs(sz), abs(sy), abs(sx)), "mm"
        self.geometry = Geometry(format="metaimage", shape=shape, spacing_mm=spacing, slice_axis=0,
                                 file_shape=tuple(dims), permutation=(0, 1, 2), units=units)
