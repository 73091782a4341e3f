"""Writing volumes: :func:`save_volume`, whole or not at all (through :func:`ctpore.atomic.atomic_write`)."""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np

from ctpore.atomic import atomic_write
from ctpore.data.io.formats import NIFTI_SUFFIXES, TIFF_SUFFIXES, cast_exact, reason
from ctpore.data.io.geometry import Geometry
from ctpore.data.io.nifti import keeps_voxel_order, nifti_image
from ctpore.data.io.tiff import write_tiff
from ctpore.errors import InputError

__all__ = ["save_volume", "SlabWriter", "DeterministicGzip", "spools", "volume_writer"]


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
    ``affine = diag(x, y, z, 1)`` in mm, qform and sform codes both 1 (scanner); when the input
    gave no length unit (``geometry.units == "unknown"``) its numbers are kept as they are and the
    spatial unit is ``unknown`` (``xyzt_units`` code 0), so a reader does not take them as mm.
    TIFF: pages are the Z slices.

    The data goes through :func:`atomic_write`: a temporary file in the same folder, renamed
    over ``path`` when complete, removed on any failure.

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
    low = path.name.lower()
    nifti = low.endswith(NIFTI_SUFFIXES)
    if path.is_dir() or not (nifti or low.endswith(TIFF_SUFFIXES)):
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
    data = cast_exact(volume, target, path)

    folder = path.parent if str(path.parent) else Path(".")
    try:
        with atomic_write(path) as tmp:
            if nifti:
                nib.save(nifti_image(data, geometry), str(tmp))
            else:
                write_tiff(tmp, data, geometry)
    except OSError as exc:
        raise InputError(f"could not write {path.name} ({reason(exc)})", folder) from exc
    return path


def spools(geometry: Geometry) -> bool:
    """Whether :class:`SlabWriter` keeps the slabs in a temporary file until the end (the slices
    are not the file's last voxel axis): as many bytes a voxel as the output's dtype."""
    # the file's axes in (Z, Y, X) order: the slices are its last axis unless the scan says otherwise
    perm = tuple(geometry.permutation) if keeps_voxel_order(geometry) else (2, 1, 0)
    return perm != (2, 1, 0)


class DeterministicGzip(gzip.GzipFile):
    """A gzip file whose bytes follow from its data alone: no time stamp and no file name in its
    header (the name would be the temporary one it is written under), as nibabel writes its own, so
    the same run writes the same bytes. Closes the file it writes into."""

    def __init__(self, path: str | Path, compresslevel: int = 1):
        self._raw = open(path, "wb")
        super().__init__(filename="", mode="wb", compresslevel=compresslevel, fileobj=self._raw, mtime=0)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


class SlabWriter:
    """Write a ``(Z, Y, X)`` volume to NIfTI slab by slab in z order, whole or not at all.

    For volumes larger than memory: the header is written first, then each :meth:`write`
    appends slices (``.nii.gz`` compressed on the fly). The data lands in the input's voxel
    order with its header, as :func:`save_volume` writes it. When the slices are not the file's
    last voxel axis (a NIfTI read with slice axis 0 or 1), the slabs first go to a nameless
    temporary file beside the output (or in ``spool_dir``), and the file is written from it in the
    file's own order when the last slab is in, one plane at a time: memory stays one plane, for any
    slice axis (:func:`spools` says when). Use it as
    a context manager: on an error inside the block the partial file is removed.

    Examples
    --------
    >>> with SlabWriter(folder / "pores.nii.gz", geometry, np.uint8) as w:   # doctest: +SKIP
    ...     for z0 in range(0, nz, 16):
    ...         w.write(pores_of(z0, z0 + 16))
    """

    def __init__(self, path: str | Path, geometry: Geometry, dtype: Any, compresslevel: int = 1,
                 spool_dir: str | Path | None = None, owned: bool = False):
        self.path, self.geometry, self.dtype = Path(path), geometry, np.dtype(dtype)
        if not self.path.name.lower().endswith(NIFTI_SUFFIXES):
            raise InputError("a volume written slab by slab must be NIfTI (.nii or .nii.gz)", self.path)
        self._spool = None
        if spools(geometry):  # z is not the file's slowest axis: keep the slabs until the end
            import tempfile

            fd, name = tempfile.mkstemp(prefix=".ctpore-slabs-", suffix=".raw", dir=spool_dir or self.path.parent)
            os.unlink(name)  # nameless from the start: nothing is left behind
            self._spool = os.fdopen(fd, "w+b")
        # The header nibabel would write for the whole volume (a zero-strided stand-in for the data).
        img = nifti_image(np.broadcast_to(np.zeros((), self.dtype), geometry.shape), geometry)
        img.update_header()
        self._left = int(geometry.shape[0])
        self._ctx = atomic_write(self.path, owned=owned)  # owned: a killed run's temporary can be told
        tmp = self._ctx.__enter__()
        try:
            gz = self.path.name.lower().endswith(".gz")
            self._fh = DeterministicGzip(tmp, compresslevel) if gz else open(tmp, "wb")
            img.header.write_to(self._fh)
            self._fh.write(b"\0" * (int(img.header.get_data_offset()) - self._fh.tell()))
        except BaseException as exc:
            self._close_spool()
            self._ctx.__exit__(type(exc), exc, exc.__traceback__)
            raise

    def write(self, slab: np.ndarray) -> None:
        """Append the next ``(n, Y, X)`` slices (their values must fit the dtype exactly)."""
        slab = np.asarray(slab)
        if slab.ndim != 3 or slab.shape[1:] != tuple(self.geometry.shape[1:]) or slab.shape[0] > self._left:
            raise ValueError(f"slab {slab.shape} does not continue the volume {self.geometry.shape}")
        data = np.ascontiguousarray(cast_exact(slab, self.dtype, self.path))
        # z-last file order: x fastest, then y, then z, which is the slab's own C order
        (self._spool or self._fh).write(data.tobytes())
        self._left -= slab.shape[0]

    def _write_spooled(self) -> None:
        """The spooled ``(Z, Y, X)`` volume into the file in its own voxel order, plane by plane."""
        self._spool.flush()
        vol = np.memmap(self._spool, dtype=self.dtype, mode="r", shape=tuple(self.geometry.shape))
        inverse = tuple(int(i) for i in np.argsort(self.geometry.permutation))
        data = vol.transpose(inverse)  # (i, j, k) view
        for k in range(data.shape[2]):  # NIfTI data: i fastest, then j, then k
            self._fh.write(np.ascontiguousarray(data[:, :, k].T).tobytes())
        del vol, data

    def _close_spool(self) -> None:
        if self._spool is not None:
            self._spool.close()
            self._spool = None

    def __enter__(self) -> "SlabWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None and self._left:
                raise ValueError(f"{self._left} slices of {self.path.name} were never written")
            if exc_type is None and self._spool is not None:
                self._write_spooled()
            self._fh.close()
        except BaseException as err:
            self._close_spool()
            try:
                self._fh.close()
            except Exception:
                pass
            self._ctx.__exit__(type(err), err, err.__traceback__)
            raise
        self._close_spool()
        self._ctx.__exit__(exc_type, exc, tb)


def volume_writer(path: str | Path, geometry: Geometry, dtype: Any, spool_dir: str | Path | None = None,
                  owned: bool = False):
    """The slab-by-slab writer for ``path``'s format: :class:`SlabWriter` for ``.nii``/``.nii.gz``,
    :class:`~ctpore.data.io.omezarr_write.OmeZarrWriter` for ``.ome.zarr`` (same use). ``owned``:
    a NIfTI's temporary carries this process's host and pid (:func:`ctpore.atomic.atomic_write`)."""
    from ctpore.data.io.omezarr_write import OME_ZARR_SUFFIX, OmeZarrWriter

    if str(path).lower().endswith(OME_ZARR_SUFFIX):
        return OmeZarrWriter(path, geometry, dtype)
    return SlabWriter(path, geometry, dtype, spool_dir=spool_dir, owned=owned)
