"""Where a volume came from: :class:`Geometry`, voxel units in mm, the slice-axis permutation.

Inside ctpore a volume is ``(Z, Y, X)``. A NIfTI file's axes ``(i, j, k)`` map to it through
:func:`zyx_permutation`; :class:`Geometry` keeps what is needed to write results back in the
input's voxel order with its header.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctpore.errors import InputError

__all__ = ["Geometry", "geometry_from_array", "to_mm", "f32_decimal", "zyx_permutation", "slice_axis_hint",
           "SQUARE_TOLERANCE", "unit_to_mm"]

# Two pixel sizes within this relative difference count as equal (square pixels) for the hint.
SQUARE_TOLERANCE = 0.01


def to_mm(value: float, mm_per_unit: float) -> float:
    """``value`` units in mm; divides for sub-mm units so 2.25 micron gives 0.00225 exactly."""
    if mm_per_unit < 1.0:
        return value / round(1.0 / mm_per_unit)
    return value * mm_per_unit


# Unit names (lower case) as HDF5 attributes and OME-Zarr axes write them -> (name ctpore reports, mm per unit).
_UNITS = {
    **dict.fromkeys(("mm", "millimeter", "millimeters", "millimetre", "millimetres"), ("mm", 1.0)),
    **dict.fromkeys(("um", "µm", "μm", "micron", "microns", "micrometer", "micrometers", "micrometre",
                     "micrometres"), ("micron", 1e-3)),
    **dict.fromkeys(("nm", "nanometer", "nanometers", "nanometre", "nanometres"), ("nm", 1e-6)),
    **dict.fromkeys(("cm", "centimeter", "centimeters", "centimetre", "centimetres"), ("cm", 10.0)),
    **dict.fromkeys(("m", "meter", "meters", "metre", "metres"), ("meter", 1e3)),
    **dict.fromkeys(("angstrom", "angstroms", "å"), ("angstrom", 1e-7)),
    **dict.fromkeys(("in", "inch", "inches"), ("inch", 25.4)),
}


def unit_to_mm(name: Any) -> tuple[str, float] | None:
    """``("micron", 0.001)`` for ``"micrometer"``, ``"um"``, ...; None for an unknown unit.

    Examples
    --------
    >>> unit_to_mm("Micrometer"), unit_to_mm("pixel")
    (('micron', 0.001), None)
    """
    if isinstance(name, bytes):
        name = name.decode("utf-8", "replace")
    if not isinstance(name, str):
        return None
    return _UNITS.get(name.strip().lower())


def f32_decimal(value: Any) -> float:
    """A float32 header number as the shortest decimal that round-trips (0.7, not 0.69999998)."""
    return float(str(np.float32(value)))


@dataclass(frozen=True, eq=False)
class Geometry:
    """Where a volume came from and how to write results back in the same voxel order.

    Picklable (it can travel to worker processes). Equality compares every field, the affine with
    ``np.array_equal`` and the header by its bytes.

    Attributes
    ----------
    format : str
        The reader's format: ``"nifti"``, ``"tiff"`` (a multi-page file or a folder of slices),
        ``"hdf5"``, ``"metaimage"``, ``"ome-zarr"``, ``"png"``, ``"bmp"``, ``"jpeg"`` (folders of
        slices), ... or ``"array"`` (an in-memory array, see :func:`geometry_from_array`).
    shape : tuple of int
        ``(Z, Y, X)``: the volume as ctpore sees it.
    spacing_mm : tuple of float
        ``(z, y, x)`` voxel size in mm, converted from the file's units (unknown units are
        taken as mm; see ``units``).
    slice_axis : int
        The file's voxel axis that is Z (NIfTI: 0, 1 or 2; other formats and arrays: 0).
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
    slice_axis_choosable : bool
        Whether the format lets the user choose which file axis is Z (NIfTI: True). A label read
        for such a scan takes the scan's slice axis when its own format allows it too.
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
    slice_axis_choosable: bool = False

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
    shape_zyx: tuple[int, int, int], spacing_mm: tuple[float, float, float] | None = None
) -> Geometry:
    """Geometry for an in-memory ``(Z, Y, X)`` array (API users, tests).

    Parameters
    ----------
    shape_zyx : tuple of int
        ``(Z, Y, X)``.
    spacing_mm : tuple of float, optional
        ``(z, y, x)`` voxel size in mm. None (default): the voxel size is not known, so the
        spacing is 1 and ``units="unknown"`` (outputs then say so: NIfTI spatial units code 0).

    Returns
    -------
    Geometry
        ``format="array"``, no affine or header. :func:`save_volume` writes it as NIfTI with
        ``affine = diag(x, y, z, 1)`` in the NIfTI ``(i=x, j=y, k=z)`` order, or as TIFF.

    Examples
    --------
    >>> g = geometry_from_array((4, 5, 6), (0.5, 0.25, 0.25))
    >>> g.shape, g.spacing_mm, g.units
    ((4, 5, 6), (0.5, 0.25, 0.25), 'mm')
    >>> geometry_from_array((4, 5, 6)).units
    'unknown'
    """
    shape = tuple(int(n) for n in shape_zyx)
    if len(shape) != 3 or min(shape) < 1:
        raise InputError(f"shape_zyx must be 3 positive sizes (Z, Y, X), got {tuple(shape_zyx)}")
    units = "mm" if spacing_mm is not None else "unknown"
    spacing = tuple(float(d) for d in (spacing_mm if spacing_mm is not None else (1.0, 1.0, 1.0)))
    if len(spacing) != 3 or not all(math.isfinite(d) and d > 0 for d in spacing):
        raise InputError(f"spacing_mm must be 3 positive finite sizes (z, y, x), got {tuple(spacing_mm)}")
    return Geometry(
        format="array",
        shape=shape,  # type: ignore[arg-type]
        spacing_mm=spacing,  # type: ignore[arg-type]
        slice_axis=0,
        file_shape=shape,
        permutation=(0, 1, 2),
        units=units,
    )


def zyx_permutation(slice_axis: int) -> tuple[int, int, int]:
    """``(s, b, a)`` with ``a < b`` the two other axes: file axes in ``(Z, Y, X)`` order."""
    a, b = (ax for ax in (0, 1, 2) if ax != slice_axis)
    return (slice_axis, b, a)



def slice_axis_hint(geometry: Geometry) -> tuple[int, str] | None:
    """Another file axis that looks more like the slice axis than the chosen one, with why.

    The rule: the chosen slice axis gives non-square in-plane pixels (their two sizes differ by
    more than :data:`SQUARE_TOLERANCE`, 1 %) while another file axis would give square ones. A
    scanner's slices have square pixels; only their thickness may differ. So an isotropic scan,
    and one with thicker (or thinner) slices along the chosen axis, give no hint.

    Parameters
    ----------
    geometry : Geometry
        A scan's geometry; only a format with a choosable slice axis can give a hint.

    Returns
    -------
    (int, str) or None
        The file axis to try and a sentence saying why; None when the chosen axis is plausible.

    Examples
    --------
    >>> g = Geometry("nifti", (4, 5, 6), (0.01, 0.02, 0.01), 2, (6, 5, 4), permutation=(2, 1, 0),
    ...              slice_axis_choosable=True)
    >>> slice_axis_hint(g)[0]
    1
    """
    if not geometry.slice_axis_choosable:
        return None
    file_spacing = [0.0, 0.0, 0.0]
    for zyx, axis in enumerate(geometry.permutation):
        file_spacing[axis] = geometry.spacing_mm[zyx]

    def square(axis: int) -> bool:
        a, b = (file_spacing[ax] for ax in (0, 1, 2) if ax != axis)
        return abs(a - b) <= SQUARE_TOLERANCE * max(a, b)

    s = geometry.slice_axis
    if square(s):
        return None
    others = [t for t in (0, 1, 2) if t != s and square(t)]
    if len(others) != 1:
        return None
    t = others[0]
    _, dy, dx = geometry.spacing_mm
    d = next(file_spacing[ax] for ax in (0, 1, 2) if ax != t)
    unit = "mm" if geometry.units != "unknown" else "units"
    return t, (f"its in-plane pixels are {dy:g} x {dx:g} {unit} with the slices along file axis {s}, but "
               f"would be square ({d:g} x {d:g} {unit}) with the slices along file axis {t}")
