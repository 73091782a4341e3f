"""File kinds, suffixes and output stems; the checks every reader shares."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ctpore.errors import InputError

__all__ = [
    "NIFTI_SUFFIXES",
    "TIFF_SUFFIXES",
    "SUPPORTED_HELP",
    "reason",
    "file_kind",
    "split_suffix",
    "output_stem",
    "natural_key",
    "check_grayscale_dtype",
    "check_3d",
]

NIFTI_SUFFIXES = (".nii.gz", ".nii")
TIFF_SUFFIXES = (".tiff", ".tif")
SUPPORTED_HELP = "ctpore reads NIfTI (.nii, .nii.gz) and TIFF (.tif, .tiff, or a folder of TIFF slices)"


def reason(exc: BaseException) -> str:
    """One line describing an exception raised by a reader library."""
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


def file_kind(path: Path) -> str:
    """``"nifti"``, ``"tiff"``, ``"folder"`` or ``""`` (unsupported), from the name."""
    if path.is_dir():
        return "folder"
    low = path.name.lower()
    if low.endswith(NIFTI_SUFFIXES):
        return "nifti"
    if low.endswith(TIFF_SUFFIXES):
        return "tiff"
    return ""


def split_suffix(name: str) -> tuple[str, str]:
    """``("scan", ".nii.gz")`` for ``"scan.nii.gz"``; the suffix keeps its case."""
    low = name.lower()
    for suffix in NIFTI_SUFFIXES + TIFF_SUFFIXES:
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
    return split_suffix(path.name)[0]


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

