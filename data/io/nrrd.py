"""NRRD (``.nhdr`` with its data file, or ``.nrrd`` with the data inside), as 3D Slicer, ITK and
Teem write it: the text header is parsed here, the voxels are memory-mapped (raw) or inflated as a
gzip stream, slice by slice.

The header is the magic ``NRRD0001`` ... ``NRRD0005``, then ``field: value`` lines (``key:=value``
pairs and ``#`` comments are skipped) up to a blank line or, in a ``.nhdr``, the end of the file.
Read: ``type`` (``uchar``, ``short``, ``uint16``, ``float``, ... and their synonyms), ``dimension``
(3), ``sizes`` (x y z), ``endian``, ``encoding`` (``raw``, ``gzip``/``gz``), ``data file`` /
``datafile`` (one file, relative to the header's folder; without it the data follows the blank
line), ``line skip`` and ``byte skip`` (``-1`` for raw: the data is the file's last bytes; for gzip
the bytes skipped are those inflated), ``space directions`` (the spacing is each vector's length)
or ``spacings``, and ``space units`` or ``units``. Lists of data files (``LIST``, ``%d`` patterns)
and the ascii, hex and bzip2 encodings are refused.

The data is x fastest, then y, then z, so the volume is already ``(Z, Y, X)``: the slices are
along the third size. Units as written (``"mm"``, ``"um"``, ...) convert to mm; without them the
spacing is kept as numbers with units ``"unknown"``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from ctpore.data.io.formats import (DEFLATE_MAX_RATIO, InflatedSlices, MappedOrInflated, check_3d, deflate_limit,
                                    reason, size_text, truncated_error)
from ctpore.data.io.geometry import Geometry, to_mm, unit_to_mm
from ctpore.errors import InputError

__all__ = ["NrrdReader", "NRRD_SUFFIXES", "read_header"]

NRRD_SUFFIXES = (".nhdr", ".nrrd")

_TYPES = {
    **dict.fromkeys(("signed char", "int8", "int8_t"), "i1"),
    **dict.fromkeys(("uchar", "unsigned char", "uint8", "uint8_t"), "u1"),
    **dict.fromkeys(("short", "short int", "signed short", "signed short int", "int16", "int16_t"), "i2"),
    **dict.fromkeys(("ushort", "unsigned short", "unsigned short int", "uint16", "uint16_t"), "u2"),
    **dict.fromkeys(("int", "signed int", "int32", "int32_t"), "i4"),
    **dict.fromkeys(("uint", "unsigned int", "uint32", "uint32_t"), "u4"),
    **dict.fromkeys(("longlong", "long long", "long long int", "signed long long", "signed long long int",
                     "int64", "int64_t"), "i8"),
    **dict.fromkeys(("ulonglong", "unsigned long long", "unsigned long long int", "uint64", "uint64_t"), "u8"),
    "float": "f4", "double": "f8",
}
_GZIP, _RAW = ("gzip", "gz"), ("raw",)
# The most header text read before its end (a blank line, or the end of a .nhdr) must have appeared.
_MAX_HEADER = 1 << 20
_RESAVE = "re-save it with raw or gzip encoding (3D Slicer and ITK write gzip; or: unu save -f nrrd -e raw)"


def read_header(path: Path) -> tuple[dict[str, str], int | None]:
    """The header's ``{field: value}`` (field names in lower case, ``datafile`` as ``data file``)
    and the byte offset just after its blank line (None when the header runs to the file's end)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_MAX_HEADER)
    except OSError as exc:
        raise InputError(f"cannot read the file ({reason(exc)})", path) from exc
    if not re.match(rb"NRRD000[1-5]\s", head):
        magic = head[:8].decode("latin-1", "replace")
        raise InputError(f"is not a NRRD file: it starts with {magic!r}, not NRRD0001 ... NRRD0005", path)
    fields: dict[str, str] = {}
    pos = head.find(b"\n") + 1
    while pos < len(head):
        end = head.find(b"\n", pos)
        end = len(head) if end < 0 else end + 1
        line = head[pos:end].decode("latin-1").strip()
        pos = end
        if not line:
            return fields, pos
        if line.startswith("#"):
            continue
        field, kv = (line + " ").find(": "), line.find(":=")  # "field:" alone: an empty value
        if kv >= 0 and (field < 0 or kv < field):
            continue  # key:=value
        if field < 0:
            raise InputError(f"is not a NRRD header: line {line[:40]!r} is not 'field: value'", path)
        name = " ".join(line[:field].lower().split())
        fields["data file" if name == "datafile" else name] = line[field + 2:].strip()
        if name in ("data file", "datafile") and fields["data file"].upper().startswith("LIST"):
            break  # the lines after it are file names
    if len(head) == _MAX_HEADER:
        raise InputError(f"is not a NRRD header: no blank line ends it in its first {size_text(_MAX_HEADER)}", path)
    return fields, None


def _numbers(text: str | None, kind, path: Path, field: str) -> list:
    try:
        return [kind(v) for v in (text or "").split()]
    except ValueError:
        raise InputError(f"NRRD {field}: {text!r} is not a list of numbers; correct the header", path) from None


def _skip(fields: dict[str, str], field: str, path: Path) -> int:
    """The number a ``line skip`` or ``byte skip`` field gives (0 when absent)."""
    values = _numbers(fields.get(field) or "0", int, path, field)
    if len(values) != 1:
        raise InputError(f"NRRD {field}: {fields[field]!r} is not one number; correct the header", path)
    return values[0]


def _skip_lines(target: Path, offset: int, lines: int) -> int:
    """The offset after ``lines`` more lines of ``target`` from ``offset``."""
    with open(target, "rb") as f:
        f.seek(offset)
        for _ in range(lines):
            f.readline()
        return f.tell()


#: The NRRD spaces that name anatomical directions: their coordinates are millimetres by convention
#: (3D Slicer and ITK's NrrdImageIO write them without "space units").
_ANATOMICAL = {"right-anterior-superior", "ras", "left-anterior-superior", "las", "left-posterior-superior", "lps",
               "right-anterior-superior-time", "rast", "left-anterior-superior-time", "last",
               "left-posterior-superior-time", "lpst"}


class NrrdReader(MappedOrInflated):
    """One ``.nhdr``/``.nrrd`` scan; windowed when raw (memory map), sequential when gzip (one
    stream). See :mod:`ctpore.data.io.nrrd`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        fields, header_end = read_header(self.path)
        if "sizes" not in fields:
            raise InputError("is not a NRRD header ctpore can read: it has no sizes field", self.path)
        sizes = _numbers(fields["sizes"], int, self.path, "sizes")
        dimension = fields.get("dimension", str(len(sizes)))
        if dimension.strip() != str(len(sizes)):
            raise InputError(f"NRRD dimension: {dimension} but sizes has {len(sizes)} numbers ({fields.get('sizes')})",
                             self.path)
        if len(sizes) > 3:
            raise InputError(f"holds a {len(sizes)}-dimensional array (sizes: {' '.join(map(str, sizes))}); ctpore "
                             "needs one 3D grayscale volume: save the volume alone as a 3D NRRD", self.path)
        check_3d(tuple(sizes), self.path, tuple(sizes))
        ntype = " ".join(fields.get("type", "").lower().split())
        if ntype not in _TYPES:
            raise InputError(f"NRRD type {ntype or '(missing)'} is not supported; ctpore reads uchar, signed char, "
                             "short, ushort, int, uint, long long, unsigned long long, float and double", self.path)
        dtype = np.dtype(_TYPES[ntype])
        endian = fields.get("endian", "").lower()
        if dtype.itemsize > 1 and endian not in ("little", "big"):
            raise InputError(f"NRRD endian: {endian or '(missing)'}: its {dtype.itemsize}-byte voxels need "
                             "'endian: little' or 'endian: big' in the header", self.path)
        self.dtype = dtype.newbyteorder(">" if endian == "big" else "<")
        encoding = fields.get("encoding", "").lower()
        if encoding not in _RAW + _GZIP:
            raise InputError(f"holds its voxels with encoding {encoding or '(missing)'}, which ctpore does not read; "
                             f"{_RESAVE}", self.path)
        compressed = encoding in _GZIP
        target, offset = self._data_file(fields, header_end)
        line_skip, byte_skip = (_skip(fields, k, self.path) for k in ("line skip", "byte skip"))
        if line_skip < 0 or byte_skip < -1 or (byte_skip == -1 and compressed):
            raise InputError(f"NRRD line skip: {line_skip} / byte skip: {byte_skip} cannot be read (byte skip -1 "
                             "is for raw data only); correct the header", self.path)
        nx, ny, nz = sizes
        shape = (nz, ny, nx)
        nbytes = math.prod(sizes) * self.dtype.itemsize
        try:
            size = target.stat().st_size
            if line_skip and byte_skip != -1:
                offset = _skip_lines(target, offset, line_skip)
        except OSError as exc:
            raise InputError(f"cannot read its data file {target.name} ({reason(exc)})", self.path) from exc
        holds = f"{target.name} holds {size_text(size)}"
        self.sequential, self.windowed = compressed, not compressed
        self.memmap: np.ndarray | None = None
        self._stream: InflatedSlices | None = None
        if compressed:
            stored = size - offset
            if byte_skip + nbytes > deflate_limit(stored):
                raise truncated_error(
                    self.path, "the header", tuple(sizes), self.dtype, nbytes,
                    f"the {size_text(stored)} of gzip data in {target.name} can expand to at most "
                    f"{size_text(deflate_limit(stored))} (gzip compresses at most {DEFLATE_MAX_RATIO}:1)")
            self._stream = InflatedSlices(self.path, target, offset, ny * nx * self.dtype.itemsize, byte_skip, "gzip")
        else:
            offset = size - nbytes if byte_skip == -1 else offset + byte_skip
            if offset < 0 or offset + nbytes > size:
                skipped = f" ({offset} of them header and skipped bytes)" if offset > 0 else ""
                raise truncated_error(self.path, "the header", tuple(sizes), self.dtype, nbytes, holds + skipped)
            try:
                self.memmap = np.memmap(target, self.dtype, mode="r", offset=offset, shape=shape)
            except MemoryError:
                raise
            except Exception as exc:
                raise InputError(f"its data cannot be mapped ({reason(exc)})", self.path) from exc
        spacing, units = self._spacing(fields)
        self.geometry = Geometry(format="nrrd", shape=shape, spacing_mm=spacing, slice_axis=0,
                                 file_shape=tuple(sizes), permutation=(0, 1, 2), units=units)

    def _data_file(self, fields: dict[str, str], header_end: int | None) -> tuple[Path, int]:
        """The file that holds the voxels, and where they start in it (before any skip)."""
        name = fields.get("data file")
        if name is None:
            if header_end is None:
                raise InputError("is a NRRD header with no data: it names no data file and no blank line ends it; "
                                 "add 'data file: <name>' or save it as one .nrrd", self.path)
            return self.path, header_end
        if name.upper().startswith("LIST") or "%" in name:
            raise InputError(f"stores its slices in several files (data file: {name}); ctpore reads one data file: "
                             "save the volume as one .nrrd, or one .nhdr with one .raw", self.path)
        target = self.path.parent / name
        if not target.is_file():
            raise InputError(f"its data file {name} (data file:) is not there", self.path)
        return target, 0

    def _spacing(self, fields: dict[str, str]) -> tuple[tuple[float, float, float], str]:
        """``((z, y, x) in mm, units)`` from ``space directions`` or ``spacings`` and the units."""
        directions = fields.get("space directions")
        if directions is not None:
            vectors = re.findall(r"\(([^)]*)\)|(none)", directions)
            if len(vectors) != 3 or any(not v for v, _ in vectors):
                raise InputError(f"NRRD space directions: {directions} does not give a vector for each of the 3 "
                                 "axes; correct the header", self.path)
            steps = [math.hypot(*_numbers(v.replace(",", " "), float, self.path, "space directions"))
                     for v, _ in vectors]
            # one unit per axis of the space the vectors are in: their lengths are in it when all agree
            names = re.findall(r'"([^"]*)"', fields.get("space units", ""))
            names = names[:1] * 3 if names and len(set(names)) == 1 else []
            if not fields.get("space units") and fields.get("space", "").strip().lower() in _ANATOMICAL:
                names = ["mm"] * 3  # an anatomical space is in mm (3D Slicer and ITK write no units there)
        else:
            steps = (_numbers(fields.get("spacings"), float, self.path, "spacings") + [math.nan] * 3)[:3]
            names = re.findall(r'"([^"]*)"', fields.get("units", ""))  # one per axis (x y z)
        if not all(math.isfinite(d) and d > 0 for d in steps):
            return (1.0, 1.0, 1.0), "unknown"
        scale = steps[::-1]  # (z, y, x)
        units = [unit_to_mm(n) for n in names[::-1]]
        if len(units) != 3 or any(u is None for u in units):
            return tuple(scale), "unknown"  # type: ignore[return-value]
        spacing = tuple(to_mm(d, u[1]) for d, u in zip(scale, units))  # type: ignore[index]
        kinds = {u[0] for u in units}  # type: ignore[index]
        return spacing, (kinds.pop() if len(kinds) == 1 else "mm")  # type: ignore[return-value]
