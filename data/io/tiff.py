"""TIFF: a multi-page file or a folder of single-slice files (natural order), and the ImageJ writer.

Pages are slices, so a TIFF stack is already ``(Z, Y, X)``. Spacing comes from ImageJ metadata
(``unit``, ``spacing``) or the TIFF resolution tags (``ResolutionUnit`` centimetre or inch, with
``XResolution``/``YResolution``); see :func:`_tiff_spacing`.
Before any pixel is read, the sizes the tags describe are checked against the file (and an image
that must be read whole, against memory): a file whose tags lie is refused with one line.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import tifffile

from ctpore.data.io.formats import (
    DEFLATE_MAX_RATIO,
    TIFF_SUFFIXES,
    check_3d,
    check_fits_memory,
    check_grayscale_dtype,
    deflate_limit,
    natural_key,
    reason,
    shape_text,
    size_text,
    truncated_error,
)
from ctpore.data.io.geometry import Geometry, to_mm, unit_to_mm
from ctpore.data.io.reader import PlaneReader
from ctpore.errors import InputError

__all__ = ["TiffStackReader", "TiffFolderReader", "write_tiff"]

# TIFF ResolutionUnit tag values -> (unit name, mm per unit); 1 (NONE) names no unit.
_RESOLUTION_UNITS = {2: ("inch", 25.4), 3: ("cm", 10.0)}

#: The resolution (pixels per inch) image tools write by default for a screen, not for a scan: a
#: TIFF that gives it in inches has no known pixel size (ImageJ ignores it the same way).
_SCREEN_DPI = 72.0

# TIFF data types ImageJ can store (tifffile refuses others with imagej=True).
_IMAGEJ_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.int16), np.dtype(np.float32))


def _per_unit(page: Any, tag_name: str) -> float | None:
    """Pixel size in the resolution's unit from ``XResolution``/``YResolution`` (pixels per unit)."""
    tag = page.tags.get(tag_name)
    if tag is None:
        return None
    value = tag.value
    num, den = (value if isinstance(value, tuple) else (value, 1))[:2]
    try:
        size = float(den) / float(num)
    except (TypeError, ValueError, ZeroDivisionError):
        return None
    return size if math.isfinite(size) and size > 0 else None


def _tiff_spacing(tif: tifffile.TiffFile, page: Any) -> tuple[tuple[float, float, float], str]:
    """``((z, y, x) in mm, unit)`` from ImageJ metadata or the TIFF resolution tags.

    The unit: ImageJ's ``unit`` (``micron``, ``µm``, ``cm``, ``inch``, ...); else the
    ``ResolutionUnit`` tag, ``CENTIMETER`` (3) or ``INCH`` (2, unless at the 72 dpi screen default).
    x and y: ``XResolution`` and ``YResolution`` (pixels per unit). z: ImageJ's ``spacing``; a TIFF
    without it (not written by ImageJ) stores no slice spacing, and its slices are taken to be as far
    apart as its pixels are wide (cubic voxels, as a CT reconstruction's are). Without a unit:
    ``((1, 1, 1), "unknown")``.
    """
    meta = tif.imagej_metadata or {}
    known = unit_to_mm(str(meta.get("unit", "")).strip().lower().replace("\\u00b5", "µ"))
    y, x = _per_unit(page, "YResolution"), _per_unit(page, "XResolution")
    if known is None:  # no ImageJ unit: the TIFF's own resolution unit
        tag = page.tags.get("ResolutionUnit")
        try:
            known = _RESOLUTION_UNITS.get(int(tag.value)) if tag is not None else None
        except (TypeError, ValueError):
            known = None
        if known is None or x is None or (known[0] == "inch" and abs(x * _SCREEN_DPI - 1.0) < 1e-6):
            return (1.0, 1.0, 1.0), "unknown"
    unit, factor = known
    x = x or 1.0
    y = y or x
    try:
        z = abs(float(meta["spacing"])) or 1.0
    except (KeyError, TypeError, ValueError):
        z = 1.0 if tif.is_imagej else x
    return tuple(float(f"{to_mm(d, factor):.12g}") for d in (z, y, x)), unit  # type: ignore[return-value]


def _series_yx(series: Any, path: Path, what: str) -> tuple[int, tuple[int, int]]:
    """Number of slices and (Y, X) of a tifffile series; InputError for colour or 5D data."""
    shape = tuple(int(n) for n in series.shape)
    axes = str(series.axes)
    if "S" in axes and shape[axes.index("S")] > 1:
        raise InputError(
            f"{what} is a colour (RGB) image with shape {shape} ({axes}); ctpore needs grayscale slices",
            path,
        )
    if len(shape) < 2:
        raise InputError(f"{what} has shape {shape}; ctpore needs 2D slices", path)
    lead = [n for n, ax in zip(shape[:-2], axes[:-2]) if n != 1 and ax != "S"]
    if len(lead) > 1:
        raise InputError(
            f"{what} holds a {axes} hyperstack of shape {shape}; ctpore needs one grayscale "
            "3D stack (Z, Y, X): keep one channel and one time point",
            path,
        )
    return (lead[0] if lead else 1), (shape[-2], shape[-1])


def _stored_bytes(page: Any) -> int:
    """The fewest bytes one page's pixels take uncompressed (bits packed, no row padding)."""
    bits = int(page.imagewidth) * int(page.samplesperpixel) * int(page.bitspersample)
    return int(page.imagedepth) * int(page.imagelength) * (bits // 8)


def _check_series_fits(series: Any, path: Path, what: str = "the image") -> None:
    """Refuse a series whose tags describe more data than the file can hold, before reading it.

    Every strip or tile must end inside the file; uncompressed pixels must fit in the file; a
    Deflate-compressed page cannot expand more than about 1032:1. (Other compressions are bounded
    by the memory checks of the readers and :func:`ctpore.data.io.scan.open_reader`.)

    Raises
    ------
    InputError
        Naming the file, what the tags describe and what the file holds.
    """
    size = path.stat().st_size
    key = series.keyframe
    dtype = np.dtype(series.dtype)
    compression = int(key.compression)
    shape = tuple(int(n) for n in series.shape)
    images = math.prod(shape) // max(1, math.prod(int(n) for n in key.shape))  # pages' worth of pixels
    per_page = _stored_bytes(key)
    sparse = 0 in tuple(key.databytecounts)  # empty tiles, filled with zeros by tifffile
    if compression == 1 and not sparse and images * per_page > size:
        raise truncated_error(path, what, shape, dtype, images * per_page, f"the file holds {size_text(size)}")
    for index, page in enumerate(series.pages):
        if page is None:
            continue
        offsets, counts = tuple(page.dataoffsets), tuple(page.databytecounts)
        end = max((int(o) + int(c) for o, c in zip(offsets, counts) if c), default=0)
        if end > size:
            raise InputError(
                f"is truncated or its header is wrong: page {index} of {what} ({shape_text(key.shape, dtype)}) "
                f"says its data runs to byte {end} but the file holds {size_text(size)}; re-export the scan",
                path,
            )
        total = sum(int(c) for c in counts)
        if compression in (8, 32946) and counts and 0 not in counts and per_page > deflate_limit(total, len(counts)):
            raise truncated_error(
                path, f"page {index} of {what}", tuple(int(n) for n in key.shape), dtype, per_page,
                f"its {size_text(total)} of Deflate data can expand to at most "
                f"{size_text(deflate_limit(total, len(counts)))} (Deflate compresses at most {DEFLATE_MAX_RATIO}:1)",
            )


class TiffStackReader(PlaneReader):
    """One TIFF file: pages as slices, or a single 3D page / contiguous ImageJ stack."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.tif = tifffile.TiffFile(str(path))
            series = self.tif.series[0]
            n, (y, x) = _series_yx(series, path, "the image")
            if n == 1:
                # One 2D image, or pages of different shapes split into several series.
                if len(self.tif.series) > 1:
                    first = self.tif.series[0].shape
                    for idx, other in enumerate(self.tif.series[1:], start=1):
                        if tuple(other.shape) != tuple(first):
                            raise InputError(
                                f"page {idx} has shape {tuple(other.shape)} but page 0 has "
                                f"{tuple(first)}; every slice must have the same (Y, X) shape",
                                path,
                            )
                raise InputError(
                    f"holds a 2D image (shape {tuple(series.shape)}); ctpore needs a 3D stack "
                    "(a multi-page TIFF or a folder of slices)",
                    path,
                )
            self.dtype = np.dtype(series.dtype)
            check_grayscale_dtype(self.dtype, path)
            self.shape = (n, y, x)
            _check_series_fits(series, path)
            pages = series.pages
            self.paged = len(pages) == n and tuple(series.keyframe.shape) == (y, x)
            self.whole: np.ndarray | None = None
            if not self.paged:
                # One 3D page or one contiguous block: read whole, so it must fit in memory.
                check_fits_memory(
                    path, int(series.nbytes), f"its image ({shape_text(series.shape, self.dtype)}), read whole,",
                    "save the stack as one page per slice (e.g. ImageJ 'Save As > Image Sequence' or "
                    "tifffile), use a machine with more memory, or check that the file's header is right",
                )
                self.whole = np.asarray(series.asarray()).reshape(self.shape)
            spacing, unit = _tiff_spacing(self.tif, self.tif.pages[0])
            file_shape = tuple(int(v) for v in series.shape)
            check_3d(self.shape, path, file_shape)
        except (InputError, MemoryError):
            self.close()
            raise
        except Exception as exc:
            self.close()
            raise InputError(f"is not a readable TIFF file ({reason(exc)})", path) from exc
        self.geometry = Geometry(
            format="tiff",
            shape=self.shape,
            spacing_mm=spacing,
            slice_axis=0,
            file_shape=file_shape,
            permutation=(0, 1, 2),
            units=unit,
        )

    def read(self, start: int, stop: int) -> np.ndarray:
        if self.whole is not None:
            return self.whole[start:stop]
        if stop <= start:
            return np.empty((0,) + self.shape[1:], self.dtype)
        data = self.tif.asarray(key=range(start, stop), series=0)
        return np.asarray(data).reshape((stop - start,) + self.shape[1:])

    def close(self) -> None:
        tif = getattr(self, "tif", None)
        if tif is not None:
            tif.close()
        self.tif = None
        self.whole = None

    def __del__(self) -> None:
        # A Scan that is dropped without close() must not leak its open TIFF file.
        try:
            self.close()
        except Exception:
            pass


class TiffFolderReader(PlaneReader):
    """A folder of single-slice TIFF files, in natural order."""

    def __init__(self, path: Path):
        self.path = path
        try:
            names = [
                p for p in path.iterdir()
                if p.is_file() and not p.name.startswith(".") and p.name.lower().endswith(TIFF_SUFFIXES)
            ]
        except OSError as exc:
            raise InputError(f"cannot list the folder ({reason(exc)})", path) from exc
        if not names:
            raise InputError("the folder holds no .tif/.tiff slices", path)
        self.files = sorted(names, key=lambda p: natural_key(p.name))
        shape_yx: tuple[int, int] | None = None
        dtype: np.dtype | None = None
        for i, f in enumerate(self.files):
            if f.stat().st_size == 0:
                raise InputError(f"slice file {f.name} is empty (0 bytes)", path)
            try:
                with tifffile.TiffFile(str(f)) as tif:
                    series = tif.series[0]
                    n, yx = _series_yx(series, path, f"slice file {f.name}")
                    _check_series_fits(series, f, "the slice")
                    if n != 1 or len(tif.series) > 1:
                        raise InputError(
                            f"slice file {f.name} holds several images (shape {tuple(series.shape)}); "
                            "each file of a slice folder must hold one 2D slice",
                            path,
                        )
                    if i == 0:
                        spacing, unit = _tiff_spacing(tif, tif.pages[0])
                        dtype = np.dtype(series.dtype)
                        check_grayscale_dtype(dtype, path)
            except (InputError, MemoryError):
                raise
            except Exception as exc:
                raise InputError(f"slice file {f.name} is not a readable TIFF ({reason(exc)})", path) from exc
            if shape_yx is None:
                shape_yx = yx
            elif yx != shape_yx:
                raise InputError(
                    f"slice file {f.name} has shape {yx} but {self.files[0].name} has {shape_yx}; "
                    "every slice must have the same (Y, X) shape",
                    path,
                )
        self.shape = (len(self.files),) + shape_yx  # type: ignore[operator]
        self.dtype = dtype
        check_3d(self.shape, path, self.shape)
        self.geometry = Geometry(
            format="tiff",
            shape=self.shape,
            spacing_mm=spacing,
            slice_axis=0,
            file_shape=self.shape,
            permutation=(0, 1, 2),
            units=unit,
        )

    def read(self, start: int, stop: int) -> np.ndarray:
        out = np.empty((max(0, stop - start),) + self.shape[1:], self.dtype)  # (n, Y, X)
        for i in range(start, stop):
            f = self.files[i]
            try:
                data = np.asarray(tifffile.imread(str(f)))
            except MemoryError:
                raise
            except Exception as exc:
                raise InputError(f"slice file {f.name} cannot be read ({reason(exc)})", self.path) from exc
            if data.shape != self.shape[1:]:
                raise InputError(
                    f"slice file {f.name} has shape {data.shape}, expected {self.shape[1:]}", self.path
                )
            out[i - start] = data
        return out

    def close(self) -> None:
        pass


def write_tiff(tmp: Path, data_zyx: np.ndarray, geometry: Geometry) -> None:
    if data_zyx.dtype not in _IMAGEJ_DTYPES:
        raise InputError(
            f"TIFF output supports {', '.join(str(d) for d in _IMAGEJ_DTYPES)}; got {data_zyx.dtype}"
        )
    kwargs: dict[str, Any] = {"imagej": True, "metadata": {"axes": "ZYX"}}
    if geometry.units != "unknown":
        z, y, x = (d * 1000.0 for d in geometry.spacing_mm)  # micrometres
        kwargs["resolution"] = (1.0 / x, 1.0 / y)
        kwargs["metadata"].update(spacing=z, unit="um")
    tifffile.imwrite(str(tmp), np.ascontiguousarray(data_zyx), **kwargs)


