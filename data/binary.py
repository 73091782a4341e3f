"""Binary pore volumes: the checks every metric runs first (values 0/1, 3D, spacing, connectivity); the
in-plane erosion a sample's margin takes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ctpore.errors import InputError

__all__ = ["check_binary", "as_volume", "check_spacing", "check_connectivity", "erode_diamond"]


def check_binary(
    arr: np.ndarray, path: str | Path | None = None, what: str = "label"
) -> np.ndarray:
    """Return ``arr`` as a uint8 array of 0/1, or raise :class:`InputError`.

    Parameters
    ----------
    arr : array_like
        Bool, integer or float array whose values must all be 0 or 1 (1 = pore).
    path : str or Path, optional
        The file the array came from; the error message names it.
    what : str
        What the array is ("label", "prediction", ...), used in the error message.

    Returns
    -------
    numpy.ndarray
        uint8 array of the same shape with values in {0, 1}: ``arr`` itself if it already is
        uint8, a uint8 view of a bool array, otherwise a copy.

    Raises
    ------
    InputError
        If the array is not numeric or holds values other than 0 and 1; the message shows up
        to 5 distinct offending values and how many voxels hold them.

    Examples
    --------
    >>> check_binary(np.array([True, False])).tolist()
    [1, 0]
    >>> try:
    ...     check_binary(np.array([0, 2, 5, 2]), path="a.nii.gz")
    ... except InputError as err:
    ...     print(err)  # doctest: +ELLIPSIS
    a.nii.gz: label must be binary (0 = solid, 1 = pore) but has 3 voxels ...: 2, 5; ...
    """
    a = np.asarray(arr)
    if a.dtype == np.bool_:
        return a.view(np.uint8)
    if not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise InputError(
            f"{what} must be a binary numeric array (0 = solid, 1 = pore), got dtype {a.dtype}",
            path=path,
        )
    bad = (a != 0) & (a != 1)  # NaN counts as bad
    n_bad = int(np.count_nonzero(bad))
    if n_bad:
        distinct = np.unique(a[bad])  # sorted; NaN last
        shown = ", ".join(_fmt_value(v) for v in distinct[:5])
        more = f" (first 5 of {distinct.size} distinct values shown)" if distinct.size > 5 else ""
        raise InputError(
            f"{what} must be binary (0 = solid, 1 = pore) but has {n_bad} voxels with other "
            f"values: {shown}{more}; threshold or relabel it first",
            path=path,
        )
    if a.dtype == np.uint8:
        return a
    return a.astype(np.uint8)


def _fmt_value(v: np.generic) -> str:
    x = v.item()
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return repr(x) if isinstance(x, float) else str(x)


def as_volume(pores: np.ndarray, what: str = "pores") -> np.ndarray:
    """Checked bool ``(Z, Y, X)`` view/copy of a binary volume."""
    a = np.asarray(pores)
    if a.ndim != 3:
        raise InputError(f"{what} must be a 3D (Z, Y, X) volume, got shape {a.shape}")
    if a.size == 0:
        raise InputError(f"{what} is empty (shape {a.shape}); it needs at least one voxel")
    return check_binary(a, what=what).view(np.bool_)


def check_spacing(spacing_mm: Sequence[float]) -> tuple[float, float, float]:
    try:
        s = tuple(float(v) for v in spacing_mm)
    except (TypeError, ValueError):
        raise InputError(
            f"spacing_mm must be 3 numbers (z, y, x) in mm, got {spacing_mm!r}"
        ) from None
    if len(s) != 3 or not all(math.isfinite(v) and v > 0 for v in s):
        raise InputError(
            f"spacing_mm must be 3 positive finite numbers (z, y, x) in mm, got {spacing_mm!r}"
        )
    return s  # type: ignore[return-value]


def check_connectivity(connectivity: int) -> int:
    if connectivity not in (6, 26):
        raise InputError(f"connectivity must be 6 or 26, got {connectivity!r}")
    return connectivity


def erode_diamond(mask: np.ndarray, margin: int) -> np.ndarray:
    """``mask`` (2D bool) eroded by a diamond (the 4-connected ball) of radius ``margin``, the
    image's border counting as inside: the pixels whose taxicab distance to the nearest pixel off
    the mask is more than ``margin``. One distance pass, whatever the margin (the erosion by the
    diamond itself takes margin^2 the time).

    Examples
    --------
    >>> m = np.ones((5, 7), bool); m[2, 3] = False
    >>> erode_diamond(m, 1).astype(int)
    array([[1, 1, 1, 1, 1, 1, 1],
           [1, 1, 1, 0, 1, 1, 1],
           [1, 1, 0, 0, 0, 1, 1],
           [1, 1, 1, 0, 1, 1, 1],
           [1, 1, 1, 1, 1, 1, 1]])
    """
    from scipy import ndimage

    if mask.all():  # nothing off the mask: nothing to erode from (the distance pass reports -1)
        return mask.copy()
    return ndimage.distance_transform_cdt(mask, metric="taxicab") > margin
