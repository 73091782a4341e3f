"""Which reader opens which scan: the one table of formats, :data:`READERS`.

Every question about a scan's format is answered from this table: which reader opens it
(:func:`open_reader`), its kind (:func:`file_kind`), the output stem (:func:`output_stem`), the
list of formats in error messages (:func:`supported_help`) and whether its slice axis is
choosable. A new format is a reader module (see :class:`ctpore.data.io.reader.Reader`) and one
line here (or one :func:`register` call).

A path may address one dataset inside a file for formats that hold several (HDF5):
``scan.h5:/group/name`` (the file, a colon, the dataset's path inside it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ctpore.data.io.formats import NIFTI_SUFFIXES, TIFF_SUFFIXES, check_fits_memory, out_of_memory, reason
from ctpore.data.io.formats import split_inner as split_inner_path
from ctpore.data.io.hdf5 import HDF5_SUFFIXES, Hdf5Reader
from ctpore.data.io.images import BmpFolderReader, JpegFolderReader, PngFolderReader
from ctpore.data.io.metaimage import METAIMAGE_SUFFIXES, MetaImageReader
from ctpore.data.io.nifti import NiftiReader
from ctpore.data.io.nrrd import NRRD_SUFFIXES, NrrdReader
from ctpore.data.io.omezarr import ZARR_SUFFIXES, ZarrReader
from ctpore.data.io.reader import Reader
from ctpore.data.io.tiff import TiffFolderReader, TiffStackReader
from ctpore.errors import InputError

__all__ = ["Format", "READERS", "register", "find_format", "file_kind", "split_inner", "split_suffix",
           "output_stem", "supported_help", "check_slice_axis", "open_reader"]


@dataclass(frozen=True)
class Format:
    """One line of :data:`READERS`.

    Attributes
    ----------
    kind : str
        A short unique name (:func:`file_kind` returns it).
    label : str
        The format's name in messages: ``"NIfTI"``, ``"PNG"`` (a folder format is named
        "a folder of PNG slices").
    suffixes : tuple of str
        Lower-case name endings (``".nii.gz"``). A *folder* format (``folder_of``) names the
        endings of the slice files inside the folder instead.
    reader : callable
        The reader class: ``reader(path)``, or ``reader(path, slice_axis)`` when
        ``slice_axis_choosable``; it returns a :class:`~ctpore.data.io.reader.Reader`.
    slice_axis_choosable : bool
        Whether ``--slice-axis`` can choose which file axis is Z (NIfTI).
    folder_of : bool
        The scan is a folder of slice files with these suffixes, in natural order.
    inner_path : bool
        A path ``file<suffix>:<inner>`` addresses one dataset inside the file (HDF5).
    slices : str
        Where the slices are, for the error given when a slice axis is chosen for a format that
        does not allow it: "the slices of <slices> (leave the slice axis unset or use 0)".
    """

    kind: str
    label: str
    suffixes: tuple[str, ...]
    reader: Callable[..., Reader]
    slice_axis_choosable: bool = False
    folder_of: bool = False
    inner_path: bool = False
    slices: str = "the scan are along its first axis"


# The table. Order matters only among suffixes that end one another (none do today).
READERS: list[Format] = [
    Format("nifti", "NIfTI", NIFTI_SUFFIXES, NiftiReader, slice_axis_choosable=True),
    Format("tiff", "TIFF", TIFF_SUFFIXES, TiffStackReader, slices="a TIFF stack are its pages"),
    Format("folder", "TIFF", TIFF_SUFFIXES, TiffFolderReader, folder_of=True,
           slices="a TIFF stack are its pages"),
    Format("hdf5", "HDF5", HDF5_SUFFIXES, Hdf5Reader, inner_path=True,
           slices="an HDF5 dataset are along its first axis"),
    Format("metaimage", "MetaImage", METAIMAGE_SUFFIXES, MetaImageReader,
           slices="a MetaImage are along its last dimension (DimSize's third number)"),
    Format("nrrd", "NRRD", NRRD_SUFFIXES, NrrdReader, slices="a NRRD are along its last axis (sizes' third number)"),
    Format("ome-zarr", "OME-Zarr", ZARR_SUFFIXES, ZarrReader,
           slices="an OME-Zarr image are along its first spatial axis (z)"),
    Format("png-folder", "PNG", PngFolderReader.SUFFIXES, PngFolderReader, folder_of=True,
           slices="a folder are its files"),
    Format("bmp-folder", "BMP", BmpFolderReader.SUFFIXES, BmpFolderReader, folder_of=True,
           slices="a folder are its files"),
    Format("jpeg-folder", "JPEG", JpegFolderReader.SUFFIXES, JpegFolderReader, folder_of=True,
           slices="a folder are its files"),
]


def register(fmt: Format) -> Format:
    """Add a format to :data:`READERS` (its ``kind`` must be new); returns it.

    Examples
    --------
    >>> register(Format("npy", "NumPy", (".npy",), NpyReader))      # doctest: +SKIP
    """
    if any(f.kind == fmt.kind for f in READERS):
        raise ValueError(f"a format of kind {fmt.kind!r} is already registered")
    READERS.append(fmt)
    return fmt


def split_inner(path: str | Path) -> tuple[Path, str | None]:
    """``(Path("scan.h5"), "/exchange/data")`` for ``"scan.h5:/exchange/data"``; ``(path, None)``
    for a path that exists or names no dataset inside a file (formats with ``inner_path``)."""
    return split_inner_path(path, tuple(s for f in READERS if f.inner_path for s in f.suffixes))


def _folder_format(path: Path) -> Format:
    """The folder format whose slice files are in ``path``; InputError when none or several."""
    entries = [f for f in READERS if f.folder_of]
    try:
        names = [p.name.lower() for p in path.iterdir() if p.is_file() and not p.name.startswith(".")]
    except OSError as exc:
        raise InputError(f"cannot list the folder ({reason(exc)})", path) from exc
    counts: Counter = Counter()
    for name in names:
        for f in entries:
            if name.endswith(f.suffixes):
                counts[f.kind] += 1
                break
    if not counts:
        endings = ", ".join(s for f in entries for s in f.suffixes)
        raise InputError(f"the folder holds no slice files ({endings}); {supported_help()}", path)
    if len(counts) > 1:
        found = ", ".join(f"{n} {next(f.label for f in entries if f.kind == k)}" for k, n in counts.most_common())
        raise InputError(f"the folder holds slices of several kinds ({found}); keep the slices of one "
                         "kind in a folder of their own", path)
    kind = next(iter(counts))
    return next(f for f in entries if f.kind == kind)


def find_format(path: str | Path) -> Format | None:
    """The line of :data:`READERS` that reads ``path``, or None when no format claims it.

    A file (or a store folder such as ``.zarr``) is recognised by its name's ending; another
    folder by the slice files it holds (:class:`InputError` when it holds none, or slices of
    several kinds).
    """
    file, _ = split_inner(path)
    low = file.name.lower()
    for f in READERS:
        if not f.folder_of and any(low.endswith(s) and len(low) > len(s) for s in f.suffixes):
            return f
    if file.is_dir():
        return _folder_format(file)
    return None


def file_kind(path: str | Path) -> str:
    """The ``kind`` of the format that reads ``path`` (``"nifti"``, ``"tiff"``, ``"folder"`` for
    TIFF slices, ``"hdf5"``, ...), or ``""`` when none does. Never raises."""
    try:
        f = find_format(path)
    except InputError:
        return ""
    return f.kind if f is not None else ""


def split_suffix(name: str) -> tuple[str, str]:
    """``("scan", ".nii.gz")`` for ``"scan.nii.gz"``; the suffix keeps its case.

    Every file suffix of :data:`READERS` is stripped (``scan.ome.zarr`` gives ``scan``).
    """
    low = name.lower()
    suffixes = sorted({s for f in READERS if not f.folder_of for s in f.suffixes}, key=len, reverse=True)
    for suffix in suffixes:
        if low.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)], name[-len(suffix):]
    return name, ""


def output_stem(path: str | Path) -> str:
    """File name without its format's suffix (``.nii.gz``, ``.tif``, ``.h5``, ``.ome.zarr``, ...);
    a folder of slices gives its name; ``scan.h5:/exchange/data`` gives ``scan``.

    Examples
    --------
    >>> output_stem("/data/rock_01.nii.gz"), output_stem("b.TIF"), output_stem("c.raw")
    ('rock_01', 'b', 'c.raw')
    >>> output_stem("core.ome.zarr"), output_stem("scan.h5:/exchange/data")
    ('core', 'scan')
    """
    file, _ = split_inner(path)
    stem, suffix = split_suffix(file.name)
    if suffix or not file.is_dir():
        return stem
    return file.name


def supported_help() -> str:
    """One sentence naming every format of :data:`READERS` and its suffixes."""
    files = [f"{f.label} ({', '.join(sorted(f.suffixes, key=lambda s: (len(s), s)))})"
             for f in READERS if not f.folder_of]
    folders = [f.label for f in READERS if f.folder_of]
    return f"ctpore reads {', '.join(files)}, or a folder of {', '.join(folders[:-1])} or {folders[-1]} slices"


def check_slice_axis(slice_axis: Any, path: Path, fmt: Format) -> int | None:
    """The slice axis as an int (None when not given); InputError when ``fmt`` cannot take it."""
    if slice_axis is None:
        return None
    if isinstance(slice_axis, bool) or not isinstance(slice_axis, (int, np.integer)):
        raise InputError(f"slice axis must be 0, 1 or 2, got {slice_axis!r}", path)
    slice_axis = int(slice_axis)
    if not fmt.slice_axis_choosable:
        if slice_axis != 0:
            choosable = " and ".join(f.label for f in READERS if f.slice_axis_choosable)
            raise InputError(
                f"slice axis {slice_axis} only applies to {choosable} files; the slices of {fmt.slices} "
                "(leave the slice axis unset or use 0)",
                path,
            )
        return 0
    if slice_axis not in (0, 1, 2):
        raise InputError(f"slice axis must be 0, 1 or 2, got {slice_axis}", path)
    return slice_axis


def open_reader(path: Path, slice_axis: int | None) -> Reader:
    """Check the path and open the reader its format's line names.

    The readers check the sizes a header describes against the file before reading; here one
    slice must also fit in memory, and a ``MemoryError`` while opening becomes an
    :class:`InputError` that says so (the readers let it through so that it is not reported as a
    corrupt file).
    """
    try:
        reader = _open(Path(path), slice_axis)
    except MemoryError:
        raise out_of_memory(path, "opening it") from None
    _, y, x = reader.geometry.shape
    itemsize = np.dtype(reader.dtype).itemsize
    try:
        # A slice is read raw, made float32 and joined to its chunk: about itemsize + 8 bytes a voxel.
        check_fits_memory(path, y * x * (itemsize + 8), f"reading one {y} x {x} slice",
                          "use a machine with more memory, or check that the file's header is right")
    except InputError:
        reader.close()
        raise
    return reader


def _open(path: Path, slice_axis: int | None) -> Reader:
    file, _ = split_inner(path)
    if not file.exists():
        raise InputError("file not found", path)
    fmt = find_format(path)
    if fmt is None:
        suffix = file.suffix or "(none)"
        raise InputError(f"unsupported file type {suffix}; {supported_help()}", path)
    slice_axis = check_slice_axis(slice_axis, path, fmt)
    if not file.is_dir():
        try:
            size = file.stat().st_size
        except OSError as exc:
            raise InputError(f"cannot read the file ({reason(exc)})", path) from exc
        if size == 0:
            raise InputError("the file is empty (0 bytes)", path)
    if fmt.slice_axis_choosable:
        return fmt.reader(path, slice_axis)
    return fmt.reader(path)
