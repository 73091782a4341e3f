"""Which voxels of a scan are the sample: found (``auto``), all of them (``all``), or a user's mask.

:func:`prepare_sample` gives the reconstruct pipeline a :class:`SampleMask`: the outside as a bool
``(Z, Y, X)`` volume (in memory for an in-memory run, else in a nameless temporary file beside the
outputs, one byte a voxel, so memory does not grow with the scan) and how it was found, for the
metrics. How an outside is recognised is :mod:`ctpore.data.sample`.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
from scipy import ndimage as ndi

from ctpore.data.io import Geometry, Scan, label_slice_axis
from ctpore.data.sample import BEYOND, SURFACE, WALL, find_sample
from ctpore.errors import CtporeWarning, InputError
from ctpore.pipelines.spill import RawCopy
from ctpore.progress import ProgressFn

__all__ = ["CODE_SLABS", "NO_SURFACE", "SAMPLE_MODES", "SampleMask", "check_margin", "check_outside", "prepare_sample",
           "sample_info", "solid_level", "warn_margin_not_applied"]

#: What ``--sample`` takes besides a mask file.
SAMPLE_MODES = ("auto", "all")

#: Slices read at a time when the outside is marked (from slice 0 on; a split run's slabs start on
#: multiples of it).
CODE_SLABS = _SLAB = 16

#: How far (voxels, within the slice) a user's mask may lie inside the found sample's air surface and
#: still have that surface across its own outside.
_NEAR = 2


class _Outside:
    """The outside as bool ``(Z, Y, X)`` (True outside), sliced along Z, over the outside's codes
    (:meth:`~ctpore.data.sample.SampleFit.outside`: 1 across the sample's surface facing air, 2 across
    none, 3 a container's wall)."""

    def __init__(self, codes):
        self.codes, self.shape = codes, tuple(codes.shape)

    def __getitem__(self, key) -> np.ndarray:
        return np.asarray(self.codes[key]) > 0


class SampleMask:
    """The outside of a scan (None: every voxel is sample) and how it was found.

    Attributes
    ----------
    outside : array-like of bool or None
        ``(Z, Y, X)``, True outside the sample.
    info : dict
        ``mode`` (``auto``, ``all`` or ``mask``), ``found`` (in words), ``outside_voxels``; for a found
        sample also ``margin_vox`` and the geometry (:meth:`~ctpore.data.sample.SampleFit.info`; a
        wall's ``voxels``), and ``region_voxels``: the voxels a shape left out that are neither a
        field of view's constant outside nor a container's wall (what would be pore if the shape were
        wrong).
    fit : SampleFit or None
        What was found (``auto``).
    level : float or None
        The grey level of the sample's solid material (the fit's), which the outside is filled with
        for the methods (:meth:`fill`); None where the scan shows no air and material apart.
    """

    def __init__(self, codes, info: dict, handle=None, fit=None, level: Optional[float] = None):
        self.codes = codes  # uint8 (Z, Y, X): 0 sample, 1 outside across air, 2 across none, 3 a wall
        self.outside = _Outside(codes) if codes is not None else None
        self.info, self._handle, self.fit = info, handle, fit
        self._nearest = None  # the last slice's outside and its nearest sample pixels
        self.level = level
        self._copy = None  # the scan with its outside filled, made in the pass that found the outside

    def inside(self, a: int, b: int) -> Optional[np.ndarray]:
        """Bool ``(n, Y, X)`` of slices ``a:b``, True in the sample (None: all of it)."""
        return None if self.outside is None else ~np.asarray(self.outside[a:b])

    def fill(self, a: int, b: int, block: np.ndarray) -> np.ndarray:
        """Slices ``a:b`` of the scan with the outside filled for the methods: with :attr:`level`,
        the grey level of the sample's solid material, where it is known (what the methods see
        around the sample is solid, as every figure counts the outside); else each outside pixel
        gets the grey value of the nearest sample pixel of its slice (the sample's edge carried
        outwards). Neither way is the outside a dark region that looks like pore; the solid level
        also stays the same wherever the sample's boundary is drawn, where the carried edge changes
        with every voxel the boundary moves."""
        block = np.array(block, np.float32)
        out = np.asarray(self.outside[a:b])
        if self.level is not None:
            block[out] = self.level
            return block
        for i in range(block.shape[0]):
            if out[i].any() and not out[i].all():
                if self._nearest is None or not np.array_equal(self._nearest[0], out[i]):  # (a core's slices
                    iy, ix = ndi.distance_transform_edt(out[i], return_distances=False, return_indices=True)
                    self._nearest = (out[i].copy(), iy, ix)  # share one outside: computed once)
                _, iy, ix = self._nearest
                block[i] = block[i][iy, ix]
        return block

    @contextmanager
    def filled(self, volume, folder: Optional[Path], progress: ProgressFn = None):
        """``volume`` with the outside filled (:meth:`fill`): itself when there is no outside, an
        array for an in-memory scan, else a nameless temporary copy beside the outputs (4 bytes a
        voxel), read window by window."""
        if self.outside is None:
            yield volume
        elif not isinstance(volume, Scan):
            yield self.fill(0, volume.shape[0], np.asarray(volume))
        elif self._copy is not None:  # made already, in the pass that found the outside
            try:
                yield self._copy
            finally:
                self._copy.close()
                self._copy = None
        else:
            copy = RawCopy(volume, folder, progress, transform=self.fill, stage="filling the outside")
            try:
                yield copy
            finally:
                copy.close()

    def close(self) -> None:
        if self._copy is not None:
            self._copy.close()
            self._copy = None
        if self._handle is not None:
            self.outside = self.codes = None
            self._handle.close()
            self._handle = None


def _store(shape, folder: Optional[Path], in_memory: bool):
    """A writable uint8 ``(Z, Y, X)`` volume of the outside's codes: an array, or a memory map of a
    nameless file."""
    if in_memory:
        return np.zeros(shape, np.uint8), None
    fh = tempfile.TemporaryFile(prefix=".ctpore-sample-", dir=folder)
    return np.memmap(fh, dtype=np.uint8, mode="w+", shape=tuple(shape)), fh


def _user_mask(mask: Any, geometry: Geometry, store, progress: ProgressFn) -> int:
    """Fill ``store`` with the outside of a user's mask (1 = sample); the voxels outside."""
    shape = tuple(geometry.shape)
    if isinstance(mask, (str, os.PathLike)):
        with Scan(mask, slice_axis=label_slice_axis(geometry, mask)) as m:  # cut as its scan (no axis hint)
            if tuple(m.shape) != shape:
                raise InputError(f"the sample mask's shape (Z, Y, X) = {m.shape} differs from the scan's {shape}",
                                 mask)
            a, b = m.geometry.affine, geometry.affine
            if a is not None and b is not None and not np.allclose(a, b, atol=1e-4 * max(1.0, np.abs(b).max())):
                raise InputError("the sample mask's affine (voxel to world) differs from the scan's: it is not "
                                 "this scan's mask", mask)
            read = m.read_slices
            n = 0
            for z0 in range(0, shape[0], _SLAB):
                z1 = min(shape[0], z0 + _SLAB)
                n += _check_put(read(z0, z1), store, z0, z1, mask)
            return n
    arr = np.asarray(mask)
    if arr.shape != shape:
        raise InputError(f"the sample mask's shape {arr.shape} differs from the scan's (Z, Y, X) {shape}")
    return _check_put(arr, store, 0, shape[0], "the sample mask")


def _check_put(values, store, z0: int, z1: int, path) -> int:
    v = np.asarray(values)
    odd = (v != 0) & (v != 1)
    if odd.any():
        shown = ", ".join(f"{x:g}" for x in np.unique(v[odd])[:5])
        raise InputError(f"a sample mask must hold only 1 (sample) and 0 (outside), found also {shown}", path)
    store[z0:z1] = np.where(v == 0, BEYOND, 0)  # a user's mask: its boundary is no partial-volume surface
    return int(np.count_nonzero(v == 0))


def check_margin(margin) -> int:
    """``margin`` as a number of voxels (an integer >= 0), else an InputError that shows it."""
    if isinstance(margin, bool) or not isinstance(margin, (int, np.integer)) or margin < 0:
        raise InputError(f"the sample margin must be a whole number of voxels >= 0, got {margin!r}")
    return int(margin)


def solid_level(fit) -> Optional[float]:
    """The grey level of the sample's solid material from a fit, where air and material stand apart
    (by more than 1.5 times the noise); else None."""
    lv = fit.envelope.levels
    if "air" in lv and "material" in lv and lv["material"] - lv["air"] > 1.5 * lv.get("noise", 0.0):
        return float(lv["material"])
    return None


def _mark_air(volume, fit, store) -> None:
    """Give a user's mask the sample's surface where it has one (code 1, or 3 by a wall): there its
    partial-volume rim is not pore. Where the sample is found by its shape
    (:func:`~ctpore.data.sample.find_sample`), the mask's outside within :data:`_NEAR` voxels of what
    the found sample has across its air surface is across it too (or across its container's wall,
    code 3, within as far of the found wall), whatever the mask's own boundary: a gap of air a voxel
    or two wide between a core and its tube is seen by the fit, not by the grey values next to the mask. Else a
    slice whose band two and three voxels out from the mask is darker, on the median, than a
    quarter of the way from the air's level to the material's is across air all round. Where the
    mask cuts through material (a region of interest inside the rock) the outside stays code 2 and
    the pores it cuts stay whole. ``fit``: the scan's :func:`~ctpore.data.sample.find_sample`."""
    lv = fit.envelope.levels
    shaped = fit.has_outside and fit.kind in ("cylinder", "outline")
    if not shaped and ("air" not in lv or "material" not in lv):
        return
    cross = ndi.generate_binary_structure(2, 1)
    for z0 in range(0, store.shape[0], _SLAB):
        z1 = min(store.shape[0], z0 + _SLAB)
        codes = np.asarray(store[z0:z1]).copy()
        if not codes.any():
            continue
        raw = np.asarray(volume[z0:z1], np.float32)
        if shaped:
            found = fit.outside(raw, z0)[0]
            for i in range(z1 - z0):
                for code in (SURFACE, WALL):  # (air first: a gap's outside is across air)
                    if (found[i] == code).any():
                        near = ndi.binary_dilation(found[i] == code, cross, iterations=_NEAR)
                        codes[i][(codes[i] == BEYOND) & near] = code
            store[z0:z1] = codes
            continue
        rise = lv["air"] + 0.25 * (lv["material"] - lv["air"])
        for i in range(z1 - z0):
            sample = codes[i] == 0
            if not sample.any() or sample.all():
                continue
            band = ndi.binary_dilation(sample, cross, iterations=3) & ~ndi.binary_dilation(sample, cross)
            if band.any() and float(np.median(raw[i][band])) < rise:
                codes[i][codes[i] == BEYOND] = SURFACE
        store[z0:z1] = codes


def _erode(store, shape, margin: int) -> int:
    """Erode the sample (codes 0 of ``store``) by ``margin`` voxels within each slice, in place; the
    outside's new count. The slice's edge is not a surface: a cut face stays."""
    disk = ndi.iterate_structure(ndi.generate_binary_structure(2, 1), margin)
    n = 0
    for z in range(shape[0]):
        codes = np.asarray(store[z])
        kept = ndi.binary_erosion(codes == 0, disk, border_value=1)
        store[z] = np.where(kept, 0, BEYOND).astype(np.uint8)
        n += int(np.count_nonzero(~kept))
    return n


#: Why a margin is not applied (:func:`warn_margin_not_applied`).
NO_SURFACE = {"all": "--sample all takes every voxel",
              "border": "the material reaches the border: the sample has no surface"}


def warn_margin_not_applied(margin: int, source: str, why: str) -> None:
    """Warn that ``--sample-margin`` is not applied, and why (a :data:`NO_SURFACE` value)."""
    if margin:
        warnings.warn(f"{source}: --sample-margin {margin} is not applied ({why}); every figure is of the whole "
                      "volume", CtporeWarning, stacklevel=3)


def prepare_sample(volume, geometry: Geometry, sample: Union[str, os.PathLike, np.ndarray, None] = "auto",
                   folder: Optional[Path] = None, source: str = "the scan",
                   progress: ProgressFn = None, margin: int = 0, copy_filled: bool = False) -> SampleMask:
    """The sample of a scan: ``auto`` (found by its shape, :func:`~ctpore.data.sample.find_sample`;
    a scan without an outside is all sample), ``all`` (every voxel), or a mask (a file or an array,
    1 = sample, of the scan's shape; a file also of its affine). ``margin``: the sample (found or
    given) is eroded by that many voxels within each slice (a damaged rim). When there is an outside,
    a warning says how much of the scan was left out. ``copy_filled``: a scan read from a file
    whose sample is found also gets, in the same pass, the copy with its outside filled that
    :meth:`SampleMask.filled` gives (the scan read once, not twice)."""
    shape = tuple(int(s) for s in geometry.shape)
    margin = check_margin(margin)
    units_known = getattr(geometry, "units", "mm") != "unknown"  # else the fit's lengths are in voxels
    in_memory = not isinstance(volume, Scan)
    if sample is None or (isinstance(sample, str) and sample == "all"):
        warn_margin_not_applied(margin, source, NO_SURFACE["all"])
        return SampleMask(None, sample_info(None, units_known))
    fit = None
    if isinstance(sample, str) and sample == "auto":
        fit = shape_fit = find_sample(volume, geometry.spacing_mm)
        if not fit.has_outside:  # no surface to erode a margin from either
            warn_margin_not_applied(margin, source, NO_SURFACE["border"])
            return SampleMask(None, sample_info(fit, units_known), fit=fit)
        store, handle = _store(shape, folder, in_memory)
        found = SampleMask(store, {}, handle, fit, level=solid_level(fit))
        if copy_filled and not in_memory:
            found._copy = RawCopy(volume, folder if folder is not None else Path(tempfile.gettempdir()), None,
                                  copy=False)
        n = region = wall = 0
        try:
            for z0 in range(0, shape[0], _SLAB):
                z1 = min(shape[0], z0 + _SLAB)
                raw = np.asarray(volume[z0:z1], np.float32)
                codes, counts = fit.outside(raw, z0, margin)
                store[z0:z1] = codes
                if found._copy is not None:
                    found._copy.write(z0, found.fill(z0, z1, raw))
                n += int(np.count_nonzero(codes))
                region += counts["region"]
                wall += counts["wall"]
                if progress is not None:
                    progress(z1, shape[0], "finding the sample")
            found.info = sample_info(fit, units_known, (n, region, wall), margin)
            check_outside(found.info, shape, source)
        except BaseException:
            found.close()
            raise
        return found
    else:
        store, handle = _store(shape, folder, in_memory)
        n = _user_mask(sample, geometry, store, progress)
        shape_fit = find_sample(volume, geometry.spacing_mm)
        _mark_air(volume, shape_fit, store)
        if margin:
            n = _erode(store, shape, margin)
        name = Path(sample).name if isinstance(sample, (str, os.PathLike)) else "given"
        info = {"mode": "mask", "found": f"the mask {name}", "outside_voxels": n, "margin_vox": margin}
    try:
        check_outside(info, shape, source)
    except InputError:
        if handle is not None:
            handle.close()
        raise
    return SampleMask(store, info, handle, fit, level=solid_level(shape_fit))


def sample_info(fit, units_known: bool, counts: Optional[tuple[int, int, int]] = None, margin: int = 0) -> dict:
    """The metrics' ``sample`` entry: every voxel (``fit`` None, ``--sample all``), a scan found to
    have no outside, or a found sample with its ``counts`` (outside, region and wall voxels) and
    ``margin``."""
    if fit is None:
        return {"mode": "all", "found": "every voxel (--sample all)", "outside_voxels": 0, "margin_vox": 0}
    if counts is None:
        return {"mode": "auto", "found": fit.describe(units_known), "outside_voxels": 0, "margin_vox": 0,
                **fit.info(units_known)}
    n, region, wall = counts
    info = {"mode": "auto", "found": fit.describe(units_known), "outside_voxels": n, "region_voxels": region,
            "margin_vox": margin, **fit.info(units_known)}
    if fit.envelope.wall is not None:
        info["wall"]["voxels"] = wall
    return info


def check_outside(info: dict, shape, source: str = "the scan") -> None:
    """Refuse an outside that covers the whole scan; say how much of it an outside leaves out."""
    n, total = int(info["outside_voxels"]), int(np.prod(shape))
    if n == total:
        raise InputError("no voxel is left for the sample (the outside covers the whole scan); check the scan, or "
                         "give --sample all or your own mask", source if source != "the scan" else None)
    if n:
        warnings.warn(f"{source}: {n} voxel(s) ({100.0 * n / total:.1f}% of the scan) lie outside the sample "
                      f"({info['found']}); every figure is of the sample's {total - n} voxels (--sample all measures "
                      "the whole volume)", CtporeWarning, stacklevel=3)
