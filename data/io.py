"""Volumes in and out: NIfTI (``.nii``, ``.nii.gz``) and TIFF (a multi-page file or a folder of slices).

Inside ctpore a volume is an array ``(Z, Y, X)``: slices, rows, columns. This module is the only
place that knows how a file's voxel order maps to that, and back.

Axis convention (NIfTI)
-----------------------
A NIfTI file stores voxels along its axes ``(i, j, k)``. The *slice axis* ``s`` is the file axis
that becomes Z; by default ``s = 2`` (k). With ``a < b`` the two other axes, ctpore's array is::

    volume = data.transpose(s, b, a)        # (Z, Y, X)

so ``s = 2`` gives ``(k, j, i)``, ``s = 1`` gives ``(j, k, i)`` and ``s = 0`` gives ``(i, k, j)``.
:func:`save_volume` applies the inverse permutation, so outputs are in the input's voxel order and
carry the input's affine, qform and sform (matrices and codes), pixdim and units unchanged.

Files with 4 or more dimensions are accepted when every dimension after the third has size 1
(e.g. ``(X, Y, Z, 1)`` as some tools write a single volume); those singleton dimensions are dropped.
A 2D image (fewer than 3 dimensions, or a 3D shape with a size-1 spatial axis) and a 4D file that
holds several volumes are refused.

Axis convention (TIFF)
----------------------
Pages (or the files of a folder, in natural order: ``s_2.tif`` before ``s_10.tif``) are slices:
the stack is already ``(Z, Y, X)``, so ``slice_axis`` must be None or 0. Spacing comes from ImageJ
metadata (``unit``, ``spacing`` for z, XResolution/YResolution for x/y); a TIFF without ImageJ
metadata (or with unit ``pixel``) has spacing 1.0 and units ``"unknown"``.

Units
-----
NIfTI ``xyzt_units`` ``mm``, ``micron`` and ``meter`` are converted to mm. Unknown units (code 0,
common in files from tools that do not set them) are *treated as mm* and reported as
``units="unknown"`` so that the user can check the spacing (``ctpore info`` shows it).

Values policy
-------------
ctpore never guesses voxel values. :meth:`Scan.read_slices` (and everything built on it:
:meth:`Scan.read`, :func:`read_volume`, :func:`read_label`) raises :class:`InputError` that names
the file and the slice range when a voxel is NaN or Inf; the user must replace those values.
Opening a scan does not read all voxels, so a NaN deep inside a file is found when its slices
are read. :meth:`Scan.describe` counts non-finite voxels instead of raising.

Examples
--------
>>> scan = load_scan("rock.nii.gz")                      # doctest: +SKIP
>>> scan.shape, scan.geometry.spacing_mm                 # doctest: +SKIP
((100, 100, 100), (1.0, 1.0, 1.0))
>>> chunk = scan[10:20]                                  # (10, Y, X) float32  # doctest: +SKIP
>>> save_volume("out/rock_pores.nii.gz", pores, scan.geometry, dtype=np.uint8)  # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
import re
import secrets
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import nibabel as nib
import numpy as np
import tifffile
from nibabel.volumeutils import apply_read_scaling

from ctpore.data.errors import InputError, NonFiniteError

__all__ = [
    "Geometry",
    "Scan",
    "load_scan",
    "read_volume",
    "read_label",
    "save_volume",
    "output_stem",
    "geometry_from_array",
]

ProgressFn = Callable[[int, int, str], None]

_NIFTI_SUFFIXES = (".nii.gz", ".nii")
_TIFF_SUFFIXES = (".tiff", ".tif")
_SUPPORTED_HELP = "ctpore reads NIfTI (.nii, .nii.gz) and TIFF (.tif, .tiff, or a folder of TIFF slices)"

# NIfTI xyzt_units spatial names (as nibabel reports them) -> mm per unit.
_NIFTI_UNIT_MM = {"mm": 1.0, "micron": 1e-3, "meter": 1e3, "unknown": 1.0}


def _to_mm(value: float, mm_per_unit: float) -> float:
    """``value`` units in mm; divides for sub-mm units so 2.25 micron gives 0.00225 exactly."""
    if mm_per_unit < 1.0:
        return value / round(1.0 / mm_per_unit)
    return value * mm_per_unit


def _f32_decimal(value: Any) -> float:
    """A float32 header number as the shortest decimal that round-trips (0.7, not 0.69999998)."""
    return float(str(np.float32(value)))

# ImageJ 'unit' strings -> (canonical name, mm per unit).
_IMAGEJ_UNIT_MM = {
    **dict.fromkeys(("mm", "millimeter", "millimeters", "millimetre", "millimetres"), ("mm", 1.0)),
    **dict.fromkeys(
        ("um", "µm", "μm", "\\u00b5m", "micron", "microns", "micrometer", "micrometers", "micrometre"),
        ("micron", 1e-3),
    ),
    **dict.fromkeys(("nm", "nanometer", "nanometers", "nanometre"), ("nm", 1e-6)),
    **dict.fromkeys(("cm", "centimeter", "centimeters", "centimetre"), ("cm", 10.0)),
    **dict.fromkeys(("m", "meter", "meters", "metre"), ("meter", 1e3)),
    **dict.fromkeys(("in", "inch", "inches"), ("inch", 25.4)),
}

# TIFF data types ImageJ can store (tifffile refuses others with imagej=True).
_IMAGEJ_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.int16), np.dtype(np.float32))

# Slices read per chunk when streaming a whole volume (about this many bytes of float32).
_CHUNK_BYTES = 64 * 2**20


# --------------------------------------------------------------------------------------------
# Geometry
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Geometry:
    """Where a volume came from and how to write results back in the same voxel order.

    Picklable (it travels to Dask workers). Equality compares every field, the affine with
    ``np.array_equal`` and the header by its bytes.

    Attributes
    ----------
    format : str
        ``"nifti"``, ``"tiff"`` (a multi-page file or a folder of slices) or ``"array"``
        (an in-memory array, see :func:`geometry_from_array`).
    shape : tuple of int
        ``(Z, Y, X)``: the volume as ctpore sees it.
    spacing_mm : tuple of float
        ``(z, y, x)`` voxel size in mm, converted from the file's units (unknown units are
        taken as mm; see ``units``).
    slice_axis : int
        The file's voxel axis that is Z (NIfTI: 0, 1 or 2; TIFF and arrays: 0).
    file_shape : tuple of int
        The data's shape as stored in the file (NIfTI: ``(i, j, k[, 1, ...])``; TIFF: the
        shape tifffile reports for the series, or ``(n_files, Y, X)`` for a folder).
    affine : numpy.ndarray or None
        The NIfTI image's 4x4 affine (voxel ``(i, j, k)`` to world), read-only; None otherwise.
    header : object or None
        A copy of the input's ``Nifti1Header``/``Nifti2Header``; None otherwise.
    permutation : tuple of int
        File spatial axes in ``(Z, Y, X)`` order: ``volume = data.transpose(permutation)``.
        ``(s, b, a)`` for NIfTI, ``(0, 1, 2)`` otherwise.
    units : str
        Spatial unit named in the file: ``"mm"``, ``"micron"``, ``"meter"``, ... or
        ``"unknown"`` (then the numbers were taken as mm).
    """

    format: str
    shape: tuple[int, int, int]
    spacing_mm: tuple[float, float, float]
    slice_axis: int
    file_shape: tuple[int, ...]
    affine: np.ndarray | None = None
    header: object | None = None
    permutation: tuple[int, int, int] = (0, 1, 2)
    units: str = "mm"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
        object.__setattr__(self, "spacing_mm", tuple(float(d) for d in self.spacing_mm))
        object.__setattr__(self, "file_shape", tuple(int(n) for n in self.file_shape))
        object.__setattr__(self, "permutation", tuple(int(p) for p in self.permutation))
        if self.affine is not None:
            affine = np.array(self.affine, dtype=np.float64)  # own copy
            affine.flags.writeable = False
            object.__setattr__(self, "affine", affine)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Geometry):
            return NotImplemented
        simple = ("format", "shape", "spacing_mm", "slice_axis", "file_shape", "permutation", "units")
        if any(getattr(self, f) != getattr(other, f) for f in simple):
            return False
        if (self.affine is None) != (other.affine is None):
            return False
        if self.affine is not None and not np.array_equal(self.affine, other.affine):
            return False
        return _header_bytes(self.header) == _header_bytes(other.header)

    def __hash__(self) -> int:
        return hash((self.format, self.shape, self.spacing_mm, self.slice_axis, self.file_shape))

    def __setstate__(self, state: dict) -> None:
        # Keep the affine read-only after unpickling as well.
        for key, value in state.items():
            object.__setattr__(self, key, value)
        if self.affine is not None:
            affine = np.array(self.affine, dtype=np.float64)
            affine.flags.writeable = False
            object.__setattr__(self, "affine", affine)

    @property
    def voxel_volume_mm3(self) -> float:
        """Volume of one voxel in mm³."""
        z, y, x = self.spacing_mm
        return z * y * x


def _header_bytes(header: object | None) -> bytes | None:
    if header is None:
        return None
    return bytes(header.binaryblock)  # type: ignore[attr-defined]


def geometry_from_array(
    shape_zyx: tuple[int, int, int], spacing_mm: tuple[float, float, float] = (1.0, 1.0, 1.0)
) -> Geometry:
    """Geometry for an in-memory ``(Z, Y, X)`` array (API users, tests).

    Parameters
    ----------
    shape_zyx : tuple of int
        ``(Z, Y, X)``.
    spacing_mm : tuple of float
        ``(z, y, x)`` voxel size in mm.

    Returns
    -------
    Geometry
        ``format="array"``, no affine or header. :func:`save_volume` writes it as NIfTI with
        ``affine = diag(x, y, z, 1)`` in the NIfTI ``(i=x, j=y, k=z)`` order, or as TIFF.

    Examples
    --------
    >>> g = geometry_from_array((4, 5, 6), (0.5, 0.25, 0.25))
    >>> g.shape, g.spacing_mm
    ((4, 5, 6), (0.5, 0.25, 0.25))
    """
    shape = tuple(int(n) for n in shape_zyx)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"shape_zyx must be 3 positive sizes (Z, Y, X), got {tuple(shape_zyx)}")
    spacing = tuple(float(d) for d in spacing_mm)
    if len(spacing) != 3 or not all(math.isfinite(d) and d > 0 for d in spacing):
        raise ValueError(f"spacing_mm must be 3 positive finite sizes (z, y, x), got {tuple(spacing_mm)}")
    return Geometry(
        format="array",
        shape=shape,  # type: ignore[arg-type]
        spacing_mm=spacing,  # type: ignore[arg-type]
        slice_axis=0,
        file_shape=shape,
        permutation=(0, 1, 2),
        units="mm",
    )


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


def _reason(exc: BaseException) -> str:
    """One line describing an exception raised by a reader library."""
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


def _kind(path: Path) -> str:
    """``"nifti"``, ``"tiff"``, ``"folder"`` or ``""`` (unsupported), from the name."""
    if path.is_dir():
        return "folder"
    low = path.name.lower()
    if low.endswith(_NIFTI_SUFFIXES):
        return "nifti"
    if low.endswith(_TIFF_SUFFIXES):
        return "tiff"
    return ""


def _split_suffix(name: str) -> tuple[str, str]:
    """``("scan", ".nii.gz")`` for ``"scan.nii.gz"``; the suffix keeps its case."""
    low = name.lower()
    for suffix in _NIFTI_SUFFIXES + _TIFF_SUFFIXES:
        if low.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)], name[-len(suffix):]
    return name, ""


def output_stem(path: str | Path) -> str:
    """File name without ``.nii.gz``, ``.nii``, ``.tif`` or ``.tiff``; a folder gives its name.

    Examples
    --------
    >>> output_stem("/data/rock_01.nii.gz"), output_stem("b.TIF"), output_stem("c.raw")
    ('rock_01', 'b', 'c.raw')
    """
    path = Path(path)
    if path.is_dir():
        return path.name
    return _split_suffix(path.name)[0]


def _natural_key(name: str) -> tuple:
    """Sort key with digit runs compared as numbers: ``s_2`` before ``s_10``."""
    parts = re.split(r"(\d+)", name.lower())
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), name


def _check_slice_axis(slice_axis: Any, path: Path, kind: str) -> int | None:
    if slice_axis is None:
        return None
    if isinstance(slice_axis, bool) or not isinstance(slice_axis, (int, np.integer)):
        raise InputError(f"slice axis must be 0, 1 or 2, got {slice_axis!r}", path)
    slice_axis = int(slice_axis)
    if kind != "nifti":
        if slice_axis != 0:
            raise InputError(
                f"slice axis {slice_axis} only applies to NIfTI files; the slices of a TIFF stack "
                "are its pages (leave the slice axis unset or use 0)",
                path,
            )
        return 0
    if slice_axis not in (0, 1, 2):
        raise InputError(f"slice axis must be 0, 1 or 2, got {slice_axis}", path)
    return slice_axis


def _permutation(slice_axis: int) -> tuple[int, int, int]:
    """``(s, b, a)`` with ``a < b`` the two other axes: file axes in ``(Z, Y, X)`` order."""
    a, b = (ax for ax in (0, 1, 2) if ax != slice_axis)
    return (slice_axis, b, a)


def _check_grayscale_dtype(dtype: np.dtype, path: Path) -> None:
    if dtype.kind not in "biuf" or dtype.fields is not None:
        raise InputError(
            f"voxel type {dtype} is not supported; ctpore needs a grayscale scan (integer or float)",
            path,
        )


def _check_3d(spatial: tuple[int, ...], path: Path, shown: tuple[int, ...]) -> None:
    if len(spatial) < 3 or min(spatial) < 2:
        raise InputError(
            f"holds a 2D image (shape {shown}); ctpore needs a 3D volume with at least 2 voxels "
            "along each axis",
            path,
        )


def _chunk_slices(shape_zyx: tuple[int, int, int]) -> int:
    _, y, x = shape_zyx
    return max(1, _CHUNK_BYTES // max(1, 4 * y * x))


# --------------------------------------------------------------------------------------------
# Readers (one per format). Each returns raw slices (n, Y, X) in the file's number type,
# scaled (NIfTI scl_slope/scl_inter) but not yet converted to float32 or checked.
# --------------------------------------------------------------------------------------------


class _NiftiReader:
    def __init__(self, path: Path, slice_axis: int | None):
        self.path = path
        gz = path.name.lower().endswith(".gz")
        try:
            if gz:
                img = nib.load(str(path), keep_file_open=True)
            else:
                img = nib.load(str(path), mmap="r")
        except MemoryError:
            raise
        except Exception as exc:  # nibabel, gzip, zlib, EOFError: all mean a bad file
            raise InputError(f"is not a readable NIfTI file ({_reason(exc)})", path) from exc
        if not isinstance(img, (nib.Nifti1Image, nib.Nifti2Image)):
            raise InputError(f"is not a single-file NIfTI image ({type(img).__name__})", path)
        header = img.header
        dtype = np.dtype(img.get_data_dtype())
        _check_grayscale_dtype(dtype, path)
        file_shape = tuple(int(n) for n in img.shape)
        if len(file_shape) > 3 and any(n != 1 for n in file_shape[3:]):
            raise InputError(
                f"holds several volumes (shape {file_shape}); ctpore needs one 3D volume: "
                "extract the one to use (e.g. with fslroi or nibabel) and pass that",
                path,
            )
        _check_3d(file_shape[:3], path, file_shape)
        s = 2 if slice_axis is None else slice_axis
        self.perm = _permutation(s)
        self.ndim = len(file_shape)
        self.file_shape = file_shape
        self.dtype = dtype
        self.img = img
        self.proxy = img.dataobj
        self.slope = float(self.proxy.slope)
        self.inter = float(self.proxy.inter)
        self.memmap: np.ndarray | None = None  # uncompressed: the whole data, memory-mapped
        self.cache: np.ndarray | None = None  # .nii.gz read along i or j: whole raw data
        self.gz = gz
        try:
            if not gz:
                self.memmap = self.proxy.get_unscaled()  # np.memmap, nothing read yet
            else:
                self._check_gzip_complete(header)
        except InputError:
            raise
        except MemoryError:
            raise
        except Exception as exc:
            raise InputError(
                f"is truncated or corrupt: its data cannot be read ({_reason(exc)})", path
            ) from exc

        zooms = [abs(_f32_decimal(z)) for z in header.get_zooms()[:3]]
        unit = header.get_xyzt_units()[0] or "unknown"
        if unit not in _NIFTI_UNIT_MM:
            unit = "unknown"
        if not all(math.isfinite(z) and z > 0 for z in zooms):
            zooms, unit = [1.0, 1.0, 1.0], "unknown"
        factor = _NIFTI_UNIT_MM[unit]
        shape3 = file_shape[:3]
        self.geometry = Geometry(
            format="nifti",
            shape=tuple(shape3[p] for p in self.perm),  # type: ignore[arg-type]
            spacing_mm=tuple(_to_mm(zooms[p], factor) for p in self.perm),  # type: ignore[arg-type]
            slice_axis=s,
            file_shape=file_shape,
            affine=np.asarray(img.affine),
            header=header.copy(),
            permutation=self.perm,
            units=unit,
        )

    def _check_gzip_complete(self, header: Any) -> None:
        """Detect a truncated .nii.gz without decompressing it when possible.

        A gzip stream ends with ISIZE, the uncompressed size mod 2**32. If it equals the size the
        header implies, the file is complete (a cut file ends in compressed bytes that match by
        chance with probability 2**-32). Otherwise (several gzip members, trailing bytes, or a
        cut file) read the last voxel, which decompresses the whole stream once.
        """
        expected = int(header.get_data_offset()) + int(np.prod(self.file_shape)) * self.dtype.itemsize
        with open(self.path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() >= 4:
                f.seek(-4, os.SEEK_END)
                (isize,) = struct.unpack("<I", f.read(4))
                if isize == expected % 2**32:
                    return
        last = tuple(n - 1 for n in self.file_shape)
        np.asarray(self.proxy[last])

    def read(self, start: int, stop: int) -> np.ndarray:
        s = self.perm[0]
        slicer: list[Any] = [slice(None)] * 3 + [0] * (self.ndim - 3)
        slicer[s] = slice(start, stop)
        key = tuple(slicer)
        if self.memmap is not None:
            raw = apply_read_scaling(np.asarray(self.memmap[key]), self.slope, self.inter)
        elif self.gz and s != 2:
            # Slices along i or j touch the whole compressed stream: decompress it once.
            if self.cache is None:
                self.cache = np.asarray(self.proxy.get_unscaled())
            raw = apply_read_scaling(self.cache[key], self.slope, self.inter)
        else:
            raw = np.asarray(self.proxy[key])  # nibabel applies scl_slope/scl_inter here
        return raw.transpose(self.perm)  # (n, Y, X)

    def close(self) -> None:
        # Dropping the proxy closes the file kept open by nibabel (keep_file_open=True).
        self.memmap = None
        self.cache = None
        self.proxy = None
        self.img = None


def _imagej_spacing(tif: tifffile.TiffFile, page: Any) -> tuple[tuple[float, float, float], str]:
    """``((z, y, x) in mm, unit)`` from ImageJ metadata; ``((1, 1, 1), "unknown")`` without."""
    meta = tif.imagej_metadata or {}
    raw_unit = str(meta.get("unit", "")).strip().lower().replace("\\u00b5", "µ")
    known = _IMAGEJ_UNIT_MM.get(raw_unit) or _IMAGEJ_UNIT_MM.get(raw_unit.replace("µ", "\\u00b5"))
    if known is None:
        return (1.0, 1.0, 1.0), "unknown"
    unit, factor = known

    def per_pixel(tag_name: str) -> float:
        tag = page.tags.get(tag_name)
        if tag is None:
            return 1.0
        value = tag.value
        num, den = (value if isinstance(value, tuple) else (value, 1))[:2]
        if not num or not den:
            return 1.0
        return float(den) / float(num)  # resolution is pixels per unit

    z = meta.get("spacing", 1.0)
    try:
        z = abs(float(z))
    except (TypeError, ValueError):
        z = 1.0
    spacing = (z or 1.0, per_pixel("YResolution"), per_pixel("XResolution"))
    return tuple(_to_mm(d, factor) for d in spacing), unit  # type: ignore[return-value]


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


class _TiffStackReader:
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
            _check_grayscale_dtype(self.dtype, path)
            self.shape = (n, y, x)
            pages = series.pages
            self.paged = len(pages) == n and tuple(series.keyframe.shape) == (y, x)
            self.whole: np.ndarray | None = None
            if not self.paged:
                self.whole = np.asarray(series.asarray()).reshape(self.shape)
            spacing, unit = _imagej_spacing(self.tif, self.tif.pages[0])
            file_shape = tuple(int(v) for v in series.shape)
            _check_3d(self.shape, path, file_shape)
        except (InputError, MemoryError):
            self.close()
            raise
        except Exception as exc:
            self.close()
            raise InputError(f"is not a readable TIFF file ({_reason(exc)})", path) from exc
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


class _TiffFolderReader:
    """A folder of single-slice TIFF files, in natural order."""

    def __init__(self, path: Path):
        self.path = path
        try:
            names = [
                p for p in path.iterdir()
                if p.is_file() and not p.name.startswith(".") and p.name.lower().endswith(_TIFF_SUFFIXES)
            ]
        except OSError as exc:
            raise InputError(f"cannot list the folder ({_reason(exc)})", path) from exc
        if not names:
            raise InputError(f"the folder holds no .tif/.tiff slices; {_SUPPORTED_HELP}", path)
        self.files = sorted(names, key=lambda p: _natural_key(p.name))
        shape_yx: tuple[int, int] | None = None
        dtype: np.dtype | None = None
        for i, f in enumerate(self.files):
            if f.stat().st_size == 0:
                raise InputError(f"slice file {f.name} is empty (0 bytes)", path)
            try:
                with tifffile.TiffFile(str(f)) as tif:
                    series = tif.series[0]
                    n, yx = _series_yx(series, path, f"slice file {f.name}")
                    if n != 1 or len(tif.series) > 1:
                        raise InputError(
                            f"slice file {f.name} holds several images (shape {tuple(series.shape)}); "
                            "each file of a slice folder must hold one 2D slice",
                            path,
                        )
                    if i == 0:
                        spacing, unit = _imagej_spacing(tif, tif.pages[0])
                        dtype = np.dtype(series.dtype)
                        _check_grayscale_dtype(dtype, path)
            except (InputError, MemoryError):
                raise
            except Exception as exc:
                raise InputError(f"slice file {f.name} is not a readable TIFF ({_reason(exc)})", path) from exc
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
        _check_3d(self.shape, path, self.shape)
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
                raise InputError(f"slice file {f.name} cannot be read ({_reason(exc)})", self.path) from exc
            if data.shape != self.shape[1:]:
                raise InputError(
                    f"slice file {f.name} has shape {data.shape}, expected {self.shape[1:]}", self.path
                )
            out[i - start] = data
        return out

    def close(self) -> None:
        pass


def _open_reader(path: Path, slice_axis: int | None):
    """Check the path and open the right reader."""
    if not path.exists():
        raise InputError("file not found", path)
    kind = _kind(path)
    if not kind:
        suffix = path.suffix or "(none)"
        raise InputError(f"unsupported file type {suffix}; {_SUPPORTED_HELP}", path)
    slice_axis = _check_slice_axis(slice_axis, path, kind)
    if kind == "folder":
        return _TiffFolderReader(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InputError(f"cannot read the file ({_reason(exc)})", path) from exc
    if size == 0:
        raise InputError("the file is empty (0 bytes)", path)
    if kind == "nifti":
        return _NiftiReader(path, slice_axis)
    return _TiffStackReader(path)


# --------------------------------------------------------------------------------------------
# Scan
# --------------------------------------------------------------------------------------------


class Scan:
    """A scan on disk, read lazily as ``(Z, Y, X)`` float32 slices.

    Parameters
    ----------
    path : str or Path
        A ``.nii``/``.nii.gz`` file, a ``.tif``/``.tiff`` file, or a folder of TIFF slices.
    slice_axis : int, optional
        NIfTI only: the file axis that is Z (default 2, k). See the module docstring.

    Attributes
    ----------
    path : Path
    geometry : Geometry
    dtype : numpy.dtype
        The voxel type on disk (before NIfTI scaling; slices come back as float32).

    Notes
    -----
    ``scan[z0:z1]`` equals ``scan.read_slices(z0, z1)``, so a Scan can stand where a
    ``(Z, Y, X)`` array is read in chunks of slices. A ``.nii.gz`` is kept open between reads
    (reading forward is cheap; reading backwards re-decompresses from the start, so the last
    chunk read is kept to serve overlapping halos). Reading a ``.nii.gz`` along i or j
    (``slice_axis`` 0 or 1) decompresses the whole data once and keeps it in memory.
    :meth:`close` releases files; a later read reopens them. A Scan pickles as its path and
    slice axis (files reopen on the worker).
    """

    def __init__(self, path: str | Path, slice_axis: int | None = None):
        self.path = Path(path)
        self._slice_axis = slice_axis
        self._lock = threading.RLock()
        self._reader = _open_reader(self.path, slice_axis)
        self.geometry: Geometry = self._reader.geometry
        self.dtype: np.dtype = np.dtype(self._reader.dtype)
        self._last: tuple[int, int, np.ndarray] | None = None  # last chunk read (gz only)

    # -- array-like surface ------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(Z, Y, X)``."""
        return self.geometry.shape

    @property
    def ndim(self) -> int:
        return 3

    @property
    def spacing_mm(self) -> tuple[float, float, float]:
        """``(z, y, x)`` voxel size in mm."""
        return self.geometry.spacing_mm

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"Scan({str(self.path)!r}, shape={self.shape}, format={self.geometry.format!r})"

    def __getitem__(self, key: Any) -> np.ndarray:
        """``scan[z0:z1]`` (step 1) is ``read_slices(z0, z1)``; ``scan[z]`` is one (Y, X) slice.

        A tuple ``scan[z0:z1, ...]`` reads the slices and then indexes the rest in memory.
        """
        rest: tuple = ()
        if isinstance(key, tuple):
            if not key:
                return self.read()
            key, rest = key[0], key[1:]
        nz = self.shape[0]
        if key is Ellipsis:
            out = self.read()
            return out[(Ellipsis,) + rest] if rest else out
        if isinstance(key, slice):
            start, stop, step = key.indices(nz)
            if step != 1:
                raise IndexError(f"Scan supports only slices with step 1 along Z, got step {key.step}")
            out = self.read_slices(start, max(start, stop))  # (n, Y, X)
            return out[(slice(None),) + rest] if rest else out
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            z = int(key) + nz if key < 0 else int(key)
            if not 0 <= z < nz:
                raise IndexError(f"slice {key} is out of range for {nz} slices")
            out = self.read_slices(z, z + 1)[0]  # (Y, X)
            return out[rest] if rest else out
        raise IndexError(f"Scan supports scan[z0:z1] and scan[z], got {key!r}")

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        vol = self.read()
        return vol if dtype is None else vol.astype(dtype, copy=False)

    # -- reading -----------------------------------------------------------------------------

    def _ensure_open(self):
        if self._reader is None:
            self._reader = _open_reader(self.path, self._slice_axis)
        return self._reader

    def _read_unchecked(self, start: int, stop: int) -> np.ndarray:
        """Slices [start, stop) as C-contiguous float32 (n, Y, X), not checked for NaN/Inf."""
        nz = self.shape[0]
        if not (isinstance(start, (int, np.integer)) and isinstance(stop, (int, np.integer))):
            raise TypeError(f"start and stop must be integers, got {start!r}, {stop!r}")
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= nz:
            raise IndexError(f"slice range {start}..{stop} is outside 0..{nz} for {self.path.name}")
        if start == stop:
            return np.empty((0,) + self.shape[1:], np.float32)
        with self._lock:
            reader = self._ensure_open()
            cached = None
            lo = start
            if self._last is not None:
                a, b, arr = self._last
                if a <= start < b:
                    cached = arr[start - a : min(stop, b) - a]
                    lo = min(stop, b)
            try:
                fresh = reader.read(lo, stop) if lo < stop else None
            except (InputError, MemoryError):
                raise
            except Exception as exc:
                raise InputError(
                    f"cannot read slices {lo}..{stop - 1}: the file may be truncated or corrupt "
                    f"({_reason(exc)})",
                    self.path,
                ) from exc
            parts = [p for p in (cached, fresh) if p is not None]
            with np.errstate(over="ignore", invalid="ignore"):
                out = np.concatenate([np.asarray(p, dtype=np.float32) for p in parts], axis=0)
            if getattr(reader, "gz", False):
                self._last = (start, stop, out.copy())
            return out  # (n, Y, X)

    def read_slices(self, start: int, stop: int) -> np.ndarray:
        """Slices ``start`` to ``stop - 1`` along Z as float32 ``(stop - start, Y, X)``.

        Only those slices are read from disk.

        Raises
        ------
        InputError
            If a voxel in the range is NaN or Inf (ctpore does not guess values), or the file
            cannot be read (truncated, corrupt). The message names the file and slice range.
        IndexError
            If the range is outside ``0 .. Z``.
        """
        out = self._read_unchecked(start, stop)
        bad = ~np.isfinite(out)
        if bad.any():
            count = int(bad.sum())
            first = int(start) + int(np.argmax(bad.reshape(bad.shape[0], -1).any(axis=1)))
            raise InputError(
                f"{count} voxel(s) in slices {start}..{int(stop) - 1} are NaN or Inf (first in slice "
                f"{first}; or too large for float32); ctpore never guesses values: replace them "
                "(e.g. with the scan's minimum) and try again",
                self.path,
            )
        return out

    def read(self, progress: ProgressFn | None = None) -> np.ndarray:
        """The whole volume as float32 ``(Z, Y, X)``, read in chunks of slices.

        Parameters
        ----------
        progress : callable, optional
            ``progress(done_slices, total_slices, "read")`` after each chunk.
        """
        nz = self.shape[0]
        out = np.empty(self.shape, np.float32)  # (Z, Y, X)
        step = _chunk_slices(self.shape)
        for z0 in range(0, nz, step):
            z1 = min(nz, z0 + step)
            out[z0:z1] = self.read_slices(z0, z1)
            if progress is not None:
                progress(z1, nz, "read")
        return out

    def describe(self, progress: ProgressFn | None = None) -> dict:
        """What ``ctpore info`` shows: geometry, header codes and the intensity range.

        The range is computed by streaming the slices; NaN/Inf voxels are counted
        (``nonfinite_voxels``) and left out of ``min``/``max`` instead of raising.
        """
        g = self.geometry
        info: dict[str, Any] = {
            "path": str(self.path),
            "format": g.format,
            "shape": list(g.shape),
            "file_shape": list(g.file_shape),
            "slice_axis": g.slice_axis,
            "spacing_mm": list(g.spacing_mm),
            "units": g.units,
            "dtype": str(self.dtype),
            "orientation": None,
            "orientation_zyx": None,
            "qform_code": None,
            "sform_code": None,
        }
        if g.format == "nifti" and g.header is not None and g.affine is not None:
            codes = nib.aff2axcodes(g.affine)
            codes = tuple(c or "?" for c in codes)
            info["orientation"] = "".join(codes)
            info["orientation_zyx"] = "".join(codes[p] for p in g.permutation)
            info["qform_code"] = int(g.header["qform_code"])  # type: ignore[index]
            info["sform_code"] = int(g.header["sform_code"])  # type: ignore[index]
        lo, hi, nonfinite = math.inf, -math.inf, 0
        nz = self.shape[0]
        step = _chunk_slices(self.shape)
        for z0 in range(0, nz, step):
            z1 = min(nz, z0 + step)
            chunk = self._read_unchecked(z0, z1)
            finite = np.isfinite(chunk)
            nbad = chunk.size - int(finite.sum())
            if nbad:
                nonfinite += nbad
                chunk = chunk[finite]
            if chunk.size:
                lo, hi = min(lo, float(chunk.min())), max(hi, float(chunk.max()))
            if progress is not None:
                progress(z1, nz, "describe")
        info["min"] = lo if math.isfinite(lo) else None
        info["max"] = hi if math.isfinite(hi) else None
        info["nonfinite_voxels"] = nonfinite
        return info

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Release open files and caches (a later read reopens them)."""
        with self._lock:
            if self._reader is not None:
                self._reader.close()
            self._reader = None
            self._last = None

    def __enter__(self) -> "Scan":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        return {
            "path": self.path,
            "_slice_axis": self._slice_axis,
            "geometry": self.geometry,
            "dtype": self.dtype,
        }

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._reader = None
        self._last = None


def load_scan(path: str | Path, slice_axis: int | None = None) -> Scan:
    """Open a scan for lazy reading.

    Parameters
    ----------
    path : str or Path
        ``.nii``, ``.nii.gz``, ``.tif``/``.tiff`` (multi-page, a single 3D page, or an ImageJ
        stack) or a folder of single-slice ``.tif``/``.tiff`` files (natural order).
    slice_axis : int, optional
        NIfTI: the file axis (0, 1, 2) that is Z; default 2. TIFF: None or 0.

    Returns
    -------
    Scan

    Raises
    ------
    InputError
        One line naming the file: missing, empty, truncated or corrupt, not NIfTI/TIFF,
        unsupported type, 2D, several volumes, colour, slices of different shapes, bad slice axis.
        A truncated ``.nii.gz`` is caught here (see ``_NiftiReader._check_gzip_complete``).
    """
    return Scan(path, slice_axis)


def read_volume(path: str | Path, slice_axis: int | None = None) -> tuple[np.ndarray, Geometry]:
    """Read a whole scan: ``((Z, Y, X) float32, Geometry)``. See :func:`load_scan`."""
    with load_scan(path, slice_axis) as scan:
        return scan.read(), scan.geometry


def read_label(
    path: str | Path, slice_axis: int | None = None, like: Geometry | None = None
) -> np.ndarray:
    """Read a binary label volume (1 = pore, 0 = solid) as uint8 ``(Z, Y, X)``.

    Parameters
    ----------
    path : str or Path
        Label file or folder (same formats as :func:`load_scan`).
    slice_axis : int, optional
        As for :func:`load_scan`. When None and ``like`` is a NIfTI geometry and the label is
        NIfTI, ``like.slice_axis`` is used, so the label is cut the same way as its scan.
    like : Geometry, optional
        The scan's geometry; the label's ``(Z, Y, X)`` shape must equal it.

    Raises
    ------
    InputError
        Values other than 0 and 1 (the message lists the values found), a shape that differs
        from ``like`` (both shapes are given), or anything :func:`load_scan` refuses.
    """
    path = Path(path)
    if slice_axis is None and like is not None and like.format == "nifti" and _kind(path) == "nifti":
        slice_axis = like.slice_axis
    with load_scan(path, slice_axis) as scan:
        if like is not None and tuple(scan.shape) != tuple(like.shape):
            raise InputError(
                f"label shape (Z, Y, X) = {scan.shape} differs from the scan's {tuple(like.shape)}; "
                "the label must cover the same voxels as the scan",
                path,
            )
        out = np.empty(scan.shape, np.uint8)  # (Z, Y, X)
        others: set[float] = set()
        step = _chunk_slices(scan.shape)
        for z0 in range(0, scan.shape[0], step):
            z1 = min(scan.shape[0], z0 + step)
            chunk = scan.read_slices(z0, z1)
            odd = (chunk != 0) & (chunk != 1)
            if odd.any():
                others.update(np.unique(chunk[odd]).tolist())
                if len(others) > 20:
                    break
            out[z0:z1] = chunk
    if others:
        values = sorted(others)
        shown = ", ".join(f"{v:g}" for v in values[:10]) + (", ..." if len(values) > 10 else "")
        raise InputError(
            f"a label must hold only 0 (solid) and 1 (pore), found also {shown}; "
            "binarize it first (1 = pore)",
            path,
        )
    return out


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def _cast_exact(volume: np.ndarray, dtype: np.dtype, path: Path) -> np.ndarray:
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


def _nifti_image(data_zyx: np.ndarray, geometry: Geometry) -> nib.Nifti1Image:
    """The NIfTI image to write, in the input's voxel order with its header."""
    if geometry.format == "nifti" and geometry.header is not None:
        header = geometry.header.copy()  # type: ignore[attr-defined]
        inverse = tuple(int(i) for i in np.argsort(geometry.permutation))
        data = data_zyx.transpose(inverse)  # back to (i, j, k)
        header.set_data_shape(data.shape)
        header.set_data_dtype(data.dtype)
        header["scl_slope"] = np.nan  # values are stored as given
        header["scl_inter"] = np.nan
        header["cal_min"] = 0.0
        header["cal_max"] = 0.0
        cls = nib.Nifti2Image if isinstance(header, nib.Nifti2Header) else nib.Nifti1Image
        # affine=None: the header's qform/sform (matrices, codes), pixdim and units are kept
        # exactly as they are; nibabel would rewrite them from a passed affine.
        return cls(data, None, header)
    # TIFF or array origin: NIfTI (i, j, k) = (x, y, z); qform and sform both "scanner" (1).
    data = data_zyx.transpose(2, 1, 0)  # (X, Y, Z)
    z, y, x = geometry.spacing_mm
    affine = np.diag([x, y, z, 1.0])
    header = nib.Nifti1Header()
    header.set_data_shape(data.shape)
    header.set_data_dtype(data.dtype)
    header.set_qform(affine, code=1)
    header.set_sform(affine, code=1)
    header.set_xyzt_units("mm")
    return nib.Nifti1Image(data, None, header)


def _write_tiff(tmp: Path, data_zyx: np.ndarray, geometry: Geometry) -> None:
    if data_zyx.dtype not in _IMAGEJ_DTYPES:
        raise ValueError(
            f"TIFF output supports {', '.join(str(d) for d in _IMAGEJ_DTYPES)}; got {data_zyx.dtype}"
        )
    kwargs: dict[str, Any] = {"imagej": True, "metadata": {"axes": "ZYX"}}
    if geometry.units != "unknown":
        z, y, x = (d * 1000.0 for d in geometry.spacing_mm)  # micrometres
        kwargs["resolution"] = (1.0 / x, 1.0 / y)
        kwargs["metadata"].update(spacing=z, unit="um")
    tifffile.imwrite(str(tmp), np.ascontiguousarray(data_zyx), **kwargs)


def save_volume(
    path: str | Path, volume: np.ndarray, geometry: Geometry, dtype: Any = None
) -> Path:
    """Write a ``(Z, Y, X)`` volume in the input's voxel order, whole or not at all.

    Parameters
    ----------
    path : str or Path
        Ends with ``.nii``/``.nii.gz`` (NIfTI) or ``.tif``/``.tiff`` (ImageJ TIFF stack with
        spacing in µm). An existing file is replaced.
    volume : numpy.ndarray
        ``(Z, Y, X)``; its shape must equal ``geometry.shape``.
    geometry : Geometry
        From the scan the volume was computed from (or :func:`geometry_from_array`).
    dtype : numpy dtype, optional
        Stored voxel type (e.g. ``np.uint8`` for pores, ``np.float32`` for probabilities);
        default: the volume's (bool -> uint8). Values must fit exactly: no scaling is applied.

    Returns
    -------
    Path
        The written file.

    Notes
    -----
    NIfTI from a NIfTI input: the inverse of the read permutation restores the file's voxel
    order (3D; squeezed singleton dimensions are not restored); the header is the input's with
    the data type changed, ``scl_slope``/``scl_inter`` reset (values stored as given) and
    ``cal_min``/``cal_max`` reset; affine, qform/sform matrices and codes, pixdim and
    ``xyzt_units`` are unchanged. From TIFF or array geometry: data in (i=x, j=y, k=z) order,
    ``affine = diag(x, y, z, 1)`` in mm, qform and sform codes both 1 (scanner).
    TIFF: pages are the Z slices.

    The data goes to ``.<stem>.tmp-XXXXXXXX<suffix>`` in the same folder, then ``os.replace``;
    on any failure the temp file is removed.

    Raises
    ------
    InputError
        Unsupported output suffix; the folder is missing, not a folder, or not writable; the
        write failed (e.g. disk full). The message names the folder.
    ValueError
        Shape differs from the geometry, or values do not fit ``dtype``.
    NonFiniteError
        NaN/Inf in the volume.
    """
    path = Path(path)
    kind = _kind(path) if not path.is_dir() else "folder"
    if kind not in ("nifti", "tiff"):
        raise InputError(
            "output must end with .nii, .nii.gz, .tif or .tiff", path
        )
    volume = np.asarray(volume)
    if tuple(volume.shape) != tuple(geometry.shape):
        raise ValueError(
            f"volume shape {tuple(volume.shape)} differs from the geometry's (Z, Y, X) {geometry.shape}"
        )
    if dtype is None:
        target = np.dtype(np.uint8) if volume.dtype == np.bool_ else volume.dtype
    else:
        target = np.dtype(dtype)
    if target == np.bool_:
        target = np.dtype(np.uint8)
    data = _cast_exact(volume, target, path)

    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is not a folder"
        raise InputError(f"cannot write {path.name}: the output folder {what}", folder)
    stem, suffix = _split_suffix(path.name)
    tmp = folder / f".{stem}.tmp-{secrets.token_hex(4)}{suffix}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        os.close(fd)
    except OSError as exc:
        raise InputError(f"cannot write {path.name} in this folder ({_reason(exc)})", folder) from exc
    try:
        if kind == "nifti":
            nib.save(_nifti_image(data, geometry), str(tmp))
        else:
            _write_tiff(tmp, data, geometry)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise InputError(f"could not write {path.name} ({_reason(exc)})", folder) from exc
        raise
    return path
