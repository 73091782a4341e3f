"""Volumes in and out. In: NIfTI (``.nii``, ``.nii.gz``), TIFF (a multi-page file or a folder of
slices), HDF5 (``.h5``, ``.hdf5``, ``.hdf``), MetaImage (``.mhd`` + data file, ``.mha``), OME-Zarr
(``.ome.zarr``, ``.zarr``) and folders of PNG, BMP or JPEG slices. Out: NIfTI (or TIFF).

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
metadata (``unit``, ``spacing`` for z, XResolution/YResolution for x/y), else from the TIFF's own
``ResolutionUnit`` (centimetre or inch, not the 72 dpi screen default) with XResolution/YResolution,
the slices then as far apart as the pixels are wide (a plain TIFF stores no slice spacing); a TIFF
with neither (or with ImageJ unit ``pixel``) has spacing 1.0 and units ``"unknown"``.

Axis convention (other formats)
-------------------------------
The slices are along the format's own first axis of the stored array, already ``(Z, Y, X)``:
HDF5 datasets (``/exchange/data`` as tomopy and DXchange write it, the file's only 3D dataset, or
``scan.h5:/group/name``), MetaImage's DimSize third axis (data x fastest), OME-Zarr's first
spatial axis, the files of a folder in natural order. ``slice_axis`` must be None or 0. Spacing:
HDF5 ``element_size_um`` or DXchange's detector pixel sizes, MetaImage ElementSpacing (taken as
mm, as ITK does), OME-Zarr scale transformations with their axis units; PNG, BMP and JPEG carry
none (units ``"unknown"``). Outputs of these scans are NIfTI with that spacing.

Slice-axis hint
---------------
When a NIfTI scan's chosen slice axis gives non-square in-plane pixels (their sizes differ by
more than 1 %) and another file axis would give square ones, :func:`load_scan` warns
(:class:`~ctpore.errors.CtporeWarning`, once) naming the ``--slice-axis`` to try. Isotropic scans
and scans with thicker (or thinner) slices along the chosen axis are silent.

Units
-----
NIfTI ``xyzt_units`` ``mm``, ``micron`` and ``meter`` are converted to mm. Unknown units (code 0,
common in files from tools that do not set them) are *treated as mm* and reported as
``units="unknown"`` so that the user can check the spacing (``ctpore info`` shows it). Outputs of a
scan with unknown units say so too: NIfTI spatial units code 0, with the input's numbers as pixdim.

Sizes policy
------------
Before any voxel is read or allocated, the sizes a header (NIfTI) or the tags (TIFF) describe are
checked against the file: uncompressed data must end inside the file (NIfTI, TIFF, MetaImage raw
data, HDF5 contiguous data and chunks, BMP), and deflate data (``.nii.gz``, Deflate TIFF, zlib
MetaImage, deflate HDF5 chunks, PNG) cannot expand more than 1032:1. A header that lies is refused with one
line (``is truncated or its header is wrong: ...``) instead of allocating what it claims. What a
reader must hold at once (one slice; a whole ``.nii.gz`` read along i or j; a TIFF image that is
one 3D page) must fit in the memory available, and a ``MemoryError`` while opening or reading
becomes an :class:`InputError` that says the scan does not fit in memory and what to do.

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

Rooms
-----
``geometry``  :class:`Geometry` (where a volume came from), units, the slice-axis permutation and hint.
``formats``   suffixes and the checks every reader shares (sizes, memory, optional packages).
``reader``    :class:`~ctpore.data.io.reader.Reader`, the protocol every reader follows.
``registry``  ``READERS``, the one table of formats: which reader opens which path, file kinds,
              output stems, the list of formats in messages, :func:`open_reader`.
``nifti``     the NIfTI reader and the NIfTI image written back in the input's voxel order.
``tiff``      the TIFF readers (a multi-page file, a folder of slices) and the ImageJ writer.
``hdf5``, ``metaimage``, ``omezarr``, ``images``   the other readers (images: PNG, BMP, JPEG folders).
``scan``      :class:`Scan` (lazy slices of any format).
``load``      :func:`load_scan` (a Scan and the slice-axis hint), :func:`read_volume`,
              :func:`read_label`, :func:`label_slice_axis`.
``write``     :func:`save_volume` (whole or not at all, through :mod:`ctpore.atomic`).

A new format is a reader module (a class following :class:`~ctpore.data.io.reader.Reader`:
``path``, ``geometry``, ``dtype``, ``windowed``, ``sequential``, ``read(start, stop)``,
``read_window(...)``, ``close()``) plus one line in ``READERS``
(:mod:`ctpore.data.io.registry`), or one ``register(Format(...))`` call.
"""

from __future__ import annotations

from ctpore.data.io.geometry import Geometry, geometry_from_array
from ctpore.data.io.registry import file_kind, output_stem
from ctpore.data.io.load import label_slice_axis, load_scan, read_label, read_volume
from ctpore.data.io.scan import Scan
from ctpore.data.io.write import save_volume

__all__ = [
    "Geometry",
    "Scan",
    "load_scan",
    "read_volume",
    "read_label",
    "save_volume",
    "output_stem",
    "file_kind",
    "label_slice_axis",
    "geometry_from_array",
]
