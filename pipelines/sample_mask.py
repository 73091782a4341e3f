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
from ctpore.data.sample import describe_rule, find_outside, outside_of
from ctpore.errors import CtporeWarning, InputError
from ctpore.pipelines.spill import RawCopy
from ctpore.progress import ProgressFn

__all__ = ["SAMPLE_MODES", "SampleMask", "prepare_sample"]

#: What ``--sample`` takes besides a mask file.
SAMPLE_MODES = ("auto", "all")

#: Slices read at a time when the outside is marked.
_SLAB = 16


class SampleMask:
    """The outside of a scan (None: every voxel is sample) and how it was found.

    Attributes
    ----------
    outside : array-like of bool or None
        ``(Z, Y, X)``, True outside the sample.
    info : dict
        ``mode`` (``auto``, ``all`` or ``mask``), ``found`` (in words), ``outside_voxels``.
    """

    def __init__(self, outside, info: dict, handle=None):
        self.outside, self.info, self._handle = outside, info, handle

    def inside(self, a: int, b: int) -> Optional[np.ndarray]:
        """Bool ``(n, Y, X)`` of slices ``a:b``, True in the sample (None: all of it)."""
        return None if self.outside is None else ~np.asarray(self.outside[a:b])

    def fill(self, a: int, b: int, block: np.ndarray) -> np.ndarray:
        """Slices ``a:b`` of the scan with each outside pixel given the grey value of the nearest
        sample pixel of its slice: what a method sees around the sample is the sample's own edge
        carried outwards (as the replicate padding at a scan's border), neither a dark outside that
        looks like pore nor a bright one that makes the sample look darker."""
        block = np.array(block, np.float32)
        out = np.asarray(self.outside[a:b])
        for i in range(block.shape[0]):
            if out[i].any() and not out[i].all():
                iy, ix = ndi.distance_transform_edt(out[i], return_distances=False, return_indices=True)
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
        else:
            copy = RawCopy(volume, folder, progress, transform=self.fill, stage="filling the outside")
            try:
                yield copy
            finally:
                copy.close()

    def close(self) -> None:
        if self._handle is not None:
            self.outside = None
            self._handle.close()
            self._handle = None


def _store(shape, folder: Optional[Path], in_memory: bool):
    """A writable bool ``(Z, Y, X)`` volume: an array, or a memory map of a nameless file."""
    if in_memory:
        return np.zeros(shape, bool), None
    fh = tempfile.TemporaryFile(prefix=".ctpore-sample-", dir=folder)
    return np.memmap(fh, dtype=bool, mode="w+", shape=tuple(shape)), fh


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
    store[z0:z1] = v == 0
    return int(np.count_nonzero(v == 0))


def prepare_sample(volume, geometry: Geometry, sample: Union[str, os.PathLike, np.ndarray, None] = "auto",
                   folder: Optional[Path] = None, source: str = "the scan",
                   progress: ProgressFn = None) -> SampleMask:
    """The sample of a scan: ``auto`` (find an outside connected to the slices' border; a scan
    without one is all sample), ``all`` (every voxel), or a mask (a file or an array, 1 = sample,
    of the scan's shape; a file also of its affine). When there is an outside, a warning says how
    much of the scan was left out."""
    shape = tuple(int(s) for s in geometry.shape)
    in_memory = not isinstance(volume, Scan)
    if sample is None or (isinstance(sample, str) and sample == "all"):
        return SampleMask(None, {"mode": "all", "found": "every voxel (--sample all)", "outside_voxels": 0})
    if isinstance(sample, str) and sample == "auto":
        rule = find_outside(volume)
        if rule is None:
            return SampleMask(None, {"mode": "auto", "found": describe_rule(None), "outside_voxels": 0})
        store, handle = _store(shape, folder, in_memory)
        n = 0
        for z0 in range(0, shape[0], _SLAB):
            z1 = min(shape[0], z0 + _SLAB)
            out = outside_of(np.asarray(volume[z0:z1], np.float32), rule)
            store[z0:z1] = out
            n += int(np.count_nonzero(out))
            if progress is not None:
                progress(z1, shape[0], "finding the sample")
        info = {"mode": "auto", "found": describe_rule(rule), "outside_voxels": n}
    else:
        store, handle = _store(shape, folder, in_memory)
        n = _user_mask(sample, geometry, store, progress)
        name = Path(sample).name if isinstance(sample, (str, os.PathLike)) else "given"
        info = {"mode": "mask", "found": f"the mask {name}", "outside_voxels": n}
    total = int(np.prod(shape))
    if n == total:
        if handle is not None:
            handle.close()
        raise InputError("no voxel is left for the sample (the outside covers the whole scan); check the scan, or "
                         "give --sample all or your own mask", source if source != "the scan" else None)
    if n:
        warnings.warn(f"{source}: {n} voxel(s) ({100.0 * n / total:.1f}% of the scan) lie outside the sample "
                      f"({info['found']}); every figure is of the sample's {total - n} voxels (--sample all measures "
                      "the whole volume)", CtporeWarning, stacklevel=2)
    return SampleMask(store, info, handle)
