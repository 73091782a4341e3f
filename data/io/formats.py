"""Suffixes and the checks every reader shares (which reader opens which file is in
:mod:`ctpore.data.io.registry`).

Sizes a header claims are checked before anything is allocated or read: the data a header
describes must fit in the file (:func:`truncated_error`), a compressed stream cannot expand more
than :data:`DEFLATE_MAX_RATIO` times, and what a reader must hold at once must fit in memory
(:func:`check_fits_memory`; :func:`out_of_memory` for a ``MemoryError`` that still happens).
"""

from __future__ import annotations

import importlib
import os
import re
import zlib
from pathlib import Path

import numpy as np

from ctpore.errors import InputError, NonFiniteError

__all__ = [
    "NIFTI_SUFFIXES",
    "TIFF_SUFFIXES",
    "reason",
    "optional_import",
    "cast_exact",
    "InflatedSlices",
    "MappedOrInflated",
    "split_inner",
    "natural_key",
    "check_grayscale_dtype",
    "check_3d",
    "DEFLATE_MAX_RATIO",
    "size_text",
    "shape_text",
    "deflate_limit",
    "truncated_error",
    "available_memory",
    "check_fits_memory",
    "out_of_memory",
]

NIFTI_SUFFIXES = (".nii.gz", ".nii")
TIFF_SUFFIXES = (".tiff", ".tif")

# A deflate stream (gzip, zlib, TIFF Deflate) expands at most about 1032:1: a length code of 258
# bytes with a distance code takes at least 2 bits. Measured on zeros: 1028.6:1.
DEFLATE_MAX_RATIO = 1032
# Bytes a compressed stream may expand to beyond that ratio (headers, the first literal, rounding).
_DEFLATE_SLACK = 2**16


def reason(exc: BaseException) -> str:
    """One line describing an exception raised by a reader library."""
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


def optional_import(module: str, path: Path, what: str, verb: str = "reading"):
    """``import module``, or an :class:`InputError` naming the pip command when it is not installed.

    Parameters
    ----------
    module : str
        The package to import, e.g. ``"h5py"``.
    path : Path
        The scan that needs it (named in the error).
    what : str
        The format, e.g. ``"HDF5"``.
    verb : str
        What needs it: ``"reading"`` (a scan) or ``"writing"`` (an output).
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise InputError(
            f"{verb} {what} needs the Python package {module}, which is not installed here "
            f"({reason(exc)}); install it with: pip install {module} (or install ctpore with its formats extra: "
            "pip install '.[formats]' in its folder)",
            path,
        ) from None


def split_inner(path: str | Path, suffixes: tuple[str, ...]) -> tuple[Path, str | None]:
    """``(Path("scan.h5"), "/exchange/data")`` for ``"scan.h5:/exchange/data"`` (a file with one of
    ``suffixes``, a colon, a path inside the file); ``(path, None)`` when ``path`` exists or has no
    such part.

    Examples
    --------
    >>> split_inner("a/scan.H5:/exchange/data", (".h5",))
    (PosixPath('a/scan.H5'), '/exchange/data')
    """
    text = str(path)
    if not suffixes or Path(text).exists():
        return Path(text), None
    alternatives = "|".join(re.escape(s) for s in suffixes)
    match = re.match(r"^(.+?(?:" + alternatives + r")):(.+)$", text, re.IGNORECASE)
    if match is None:
        return Path(text), None
    return Path(match.group(1)), match.group(2)


def natural_key(name: str) -> tuple:
    """Sort key with digit runs compared as numbers: ``s_2`` before ``s_10``."""
    parts = re.split(r"(\d+)", name.lower())
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), name


def check_grayscale_dtype(dtype: np.dtype, path: Path) -> None:
    if dtype.kind not in "biuf" or dtype.fields is not None:
        raise InputError(
            f"voxel type {dtype} is not supported; ctpore needs a grayscale scan (integer or float)",
            path,
        )


def check_3d(spatial: tuple[int, ...], path: Path, shown: tuple[int, ...]) -> None:
    if len(spatial) < 3 or min(spatial) < 2:
        raise InputError(
            f"holds a 2D image (shape {shown}); ctpore needs a 3D volume with at least 2 voxels "
            "along each axis",
            path,
        )



def size_text(nbytes: int) -> str:
    """``"452 bytes"`` below 1 kB, else decimal units: ``"16.0 GB"``, ``"4.0 PB"``."""
    if nbytes < 1000:
        return f"{nbytes} bytes"
    value = float(nbytes)
    for unit in ("kB", "MB", "GB", "TB", "PB"):
        value /= 1000.0
        if value < 999.95 or unit == "PB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def shape_text(shape: tuple[int, ...], dtype: np.dtype) -> str:
    """``"2000 x 2000 x 1000 float32"``."""
    return " x ".join(str(int(n)) for n in shape) + f" {np.dtype(dtype).name}"


def deflate_limit(compressed_bytes: int, streams: int = 1) -> int:
    """The most bytes ``compressed_bytes`` of deflate data (gzip, zlib) in ``streams`` separate
    streams (e.g. the strips of a TIFF page) can expand to."""
    return DEFLATE_MAX_RATIO * int(compressed_bytes) + _DEFLATE_SLACK + 1024 * max(0, int(streams) - 1)


def truncated_error(path: Path, what: str, shape: tuple[int, ...], dtype: np.dtype, nbytes: int,
                    holds: str) -> InputError:
    """The error for a header that describes more data than the file can hold.

    Parameters
    ----------
    path : Path
        The file.
    what : str
        Whose description it is: ``"the header"``, ``"page 3"``.
    shape, dtype, nbytes
        What it describes: the data's shape, type and size in bytes.
    holds : str
        What the file really holds, e.g. ``"the file holds 452 bytes"``.
    """
    return InputError(
        f"is truncated or its header is wrong: {what} describes {shape_text(shape, dtype)} "
        f"({size_text(nbytes)} of voxel data) but {holds}; re-export the scan",
        path,
    )


def _cgroup_limit() -> int | None:
    """The memory limit of this process's cgroup (v2, else v1) in bytes; None if there is none."""
    candidates = []
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    rel = line.strip()[3:].lstrip("/")
                    candidates.append(os.path.join("/sys/fs/cgroup", rel, "memory.max"))
    except OSError:
        pass
    candidates += ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
    for name in candidates:
        try:
            with open(name) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # "max", or v1's near-2**63 "no limit"
            return int(text)
    return None


def available_memory() -> int:
    """Bytes this process can still allocate, as an upper estimate (to refuse only the impossible).

    RAM available plus free swap (psutil when installed, else the machine's physical memory from
    ``os.sysconf``), capped by the cgroup's memory limit (containers, batch jobs).
    """
    try:
        import psutil

        avail = int(psutil.virtual_memory().available) + int(psutil.swap_memory().free)
    except Exception:  # psutil missing, or no /proc
        try:
            avail = int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
        except (AttributeError, ValueError, OSError):
            avail = 2**63
    limit = _cgroup_limit()
    return avail if limit is None else min(avail, limit)


def check_fits_memory(path: Path, need: int, what: str, advice: str) -> None:
    """Raise :class:`InputError` when ``need`` bytes exceed :func:`available_memory`.

    The message reads ``"<what> needs <need> of memory but about <free> is available; <advice>"``.
    """
    if need <= 0:
        return
    avail = available_memory()
    if need > avail:
        raise InputError(
            f"{what} needs {size_text(need)} of memory but about {size_text(avail)} is available; {advice}",
            path,
        )


def out_of_memory(path: Path, doing: str, advice: str | None = None) -> InputError:
    """The error for a ``MemoryError`` raised while ``doing`` (e.g. ``"opening it"``)."""
    advice = advice or ("free memory (close other programs) or use a machine with more, and check that "
                        "the scan's shape is the one you expect")
    return InputError(
        f"does not fit in memory: {doing} ran out of memory (about {size_text(available_memory())} "
        f"is available); {advice}",
        path,
    )


def cast_exact(volume: np.ndarray, dtype: np.dtype, path: Path) -> np.ndarray:
    """``volume`` as ``dtype`` without changing any value; ValueError/NonFiniteError otherwise."""
    if volume.dtype == dtype:
        arr = volume
    elif dtype.kind in "iu":
        if volume.dtype.kind == "f" and volume.size:
            if not np.isfinite(volume).all():
                raise NonFiniteError(f"volume for {path.name} has NaN or Inf voxels; not written")
            if not np.array_equal(volume, np.round(volume)):
                raise ValueError(f"volume for {path.name} has non-integer values; cannot store as {dtype}")
        if volume.size:
            info = np.iinfo(dtype)
            lo, hi = volume.min(), volume.max()
            if lo < info.min or hi > info.max:
                raise ValueError(
                    f"volume for {path.name} has values in [{lo}, {hi}], outside the range of {dtype}"
                )
        arr = volume.astype(dtype)
    else:
        arr = volume.astype(dtype)
    if dtype.kind == "f" and arr.size and not np.isfinite(arr).all():
        raise NonFiniteError(f"volume for {path.name} has NaN or Inf voxels; not written")
    return arr


class InflatedSlices:
    """Slices of a zlib or gzip stream in ``target`` from byte ``offset``, after ``skip`` inflated
    bytes, inflated forward (reading backwards starts again); several gzip members one after another
    are one stream. ``path`` (the scan) and ``kind`` name it in errors. Returns raw bytes.
    The compressed MetaImage and NRRD readers share it."""

    def __init__(self, path: Path, target: Path, offset: int, slice_bytes: int, skip: int = 0,
                 kind: str = "compressed"):
        self.path, self.offset, self.skip, self.slice_bytes, self.kind = path, offset, skip, slice_bytes, kind
        self.file = open(target, "rb")
        self._restart()

    def _restart(self) -> None:
        self.file.seek(self.offset)
        self.inflate = zlib.decompressobj(32 + zlib.MAX_WBITS)  # gzip or zlib header
        self.next = 0  # the next slice the stream gives
        left = self.skip
        while left:  # a byte skip, in pieces
            left -= len(self._take(min(left, 1 << 24), "the bytes it skips (byte skip) do"))

    def _take(self, n: int, what: str = "") -> bytes:
        out = bytearray()
        try:
            while len(out) < n:
                if self.inflate.eof:  # another gzip member, or the end
                    data = self.inflate.unused_data or self.file.read(1 << 20)
                    self.inflate = zlib.decompressobj(32 + zlib.MAX_WBITS)
                else:
                    data = self.inflate.unconsumed_tail or self.file.read(1 << 20)
                if not data:
                    last = self.next + len(out) // self.slice_bytes
                    raise InputError(f"is truncated: its {self.kind} data ends before {what or f'slice {last} does'}; "
                                     "re-export the scan", self.path)
                out += self.inflate.decompress(data, n - len(out))
        except zlib.error as exc:
            raise InputError(f"its {self.kind} data is corrupt ({reason(exc)}); re-export the scan",
                             self.path) from None
        return bytes(out)

    def read(self, start: int, stop: int) -> bytes:
        if start < self.next:
            self._restart()
        while self.next < start:  # skip, one slice at a time
            self._take(self.slice_bytes)
            self.next += 1
        out = self._take((stop - start) * self.slice_bytes)
        self.next = stop
        return out

    def close(self) -> None:
        self.file.close()


class MappedOrInflated:
    """``read``/``read_window``/``close`` of a reader whose voxels are either memory-mapped
    (``self.memmap``, windowed) or one compressed stream (``self._stream``, an
    :class:`InflatedSlices`, whole planes), ``(Z, Y, X)`` in ``self.dtype``: MetaImage, NRRD."""

    memmap: "np.ndarray | None"
    _stream: "InflatedSlices | None"

    def read(self, start: int, stop: int) -> np.ndarray:
        if self.memmap is not None:
            return np.array(self.memmap[start:stop])
        _, ny, nx = self.geometry.shape  # type: ignore[attr-defined]
        raw = self._stream.read(start, stop)  # type: ignore[union-attr]
        return np.frombuffer(raw, self.dtype).reshape(stop - start, ny, nx)  # type: ignore[attr-defined]

    def read_window(self, start: int, stop: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        if self.memmap is not None:
            return np.array(self.memmap[start:stop, y0:y1, x0:x1])
        return self.read(start, stop)[:, y0:y1, x0:x1]  # a compressed stream: whole planes

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._stream = None
        self.memmap = None
