"""Where a reconstruction's outputs go, and where its ground truth comes from, slab by slab.

:class:`ArraySink` fills arrays (the Python API, napari); :class:`FileSink` appends to the output
files, NIfTI or OME-Zarr by their names (``ctpore reconstruct``, ``ctpore batch``);
:class:`TruthSlabs` reads a ground truth slab by slab for the metrics.
"""

from __future__ import annotations

import os
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Optional

import numpy as np

from ctpore.data.io import Geometry, Scan, label_slice_axis
from ctpore.data.io.write import volume_writer
from ctpore.errors import InputError
from ctpore.pipelines.spill import BlockSpill

__all__ = ["ArraySink", "FileSink", "TruthSlabs"]


# -- where the outputs go ----------------------------------------------------------------------


class ArraySink:
    """Outputs into arrays; the probability array also holds the raw probabilities until they are
    post-processed (in place, slab by slab, each slab read before it is written)."""

    def __init__(self, shape):
        self.prob = np.empty(shape, np.float32)
        self.pores = np.empty(shape, np.uint8)
        self.sample = None

    @contextmanager
    def raw(self, folder):
        yield self.prob

    def read(self, raw, a: int, b: int) -> np.ndarray:
        return raw[a:b].copy()

    @contextmanager
    def open(self, with_sample: bool = False):
        if with_sample:
            self.sample = np.empty(self.pores.shape, np.uint8)
        yield self

    def write(self, a: int, b: int, pores: np.ndarray, prob: np.ndarray, inside=None) -> None:
        self.pores[a:b] = pores
        self.prob[a:b] = prob
        if inside is not None:
            self.sample[a:b] = inside


class FileSink:
    """Outputs appended slab by slab to ``paths["pores"]`` and ``paths["prob"]`` (NIfTI in the
    input's voxel order, or OME-Zarr stores, by their names; each whole or not at all); the raw
    probabilities wait in a nameless file."""

    def __init__(self, paths: dict, geometry: Geometry):
        self.paths, self.geometry = paths, geometry
        self._writers, self._tmp = None, None  # _tmp: where the raw probabilities (and any spooled slabs) wait

    @contextmanager
    def raw(self, folder):
        self._tmp = folder
        with BlockSpill(folder, self.geometry.shape) as spill:
            yield spill

    def read(self, raw, a: int, b: int) -> np.ndarray:
        return raw.read(a, b)

    @contextmanager
    def open(self, with_sample: bool = False):
        kinds = (("pores", np.uint8), ("prob", np.float32)) + ((("sample", np.uint8),) if with_sample else ())
        with ExitStack() as stack:
            self._writers = [stack.enter_context(volume_writer(self.paths[k], self.geometry, t, spool_dir=self._tmp))
                             for k, t in kinds]
            yield self
        self._writers = None

    def write(self, a: int, b: int, pores: np.ndarray, prob: np.ndarray, inside=None) -> None:
        self._writers[0].write(pores)
        self._writers[1].write(prob)
        if inside is not None:
            self._writers[2].write(inside.view(np.uint8))


# -- the truth, slab by slab -------------------------------------------------------------------


class TruthSlabs:
    """A ground truth read slab by slab (a file, or an in-memory array), checked to be 0/1."""

    def __init__(self, truth, geometry: Geometry, slice_axis: Optional[int]):
        self.path, self.scan, self.array = None, None, None
        shape = tuple(geometry.shape)
        if isinstance(truth, (str, os.PathLike)):
            self.path = Path(truth)
            axis = slice_axis if slice_axis is not None else label_slice_axis(geometry, truth)
            self.scan = Scan(truth, slice_axis=axis)  # cut as its scan was (no second axis hint)
            if tuple(self.scan.shape) != shape:
                self.scan.close()
                raise InputError(f"label shape (Z, Y, X) = {self.scan.shape} differs from the scan's {shape}",
                                 self.path)
        else:
            self.array = np.asarray(truth)
            if self.array.shape != shape:
                raise InputError(f"prediction and truth must have the same shape, got prediction {shape} "
                                 f"and truth {self.array.shape}")

    def slab(self, a: int, b: int) -> np.ndarray:
        t = self.scan.read_slices(a, b) if self.scan is not None else self.array[a:b]
        odd = (t != 0) & (t != 1)
        if odd.any():
            vals = ", ".join(f"{v:g}" for v in np.unique(t[odd])[:10])
            raise InputError(f"a label must hold only 0 (solid) and 1 (pore), found also {vals}; binarize it "
                             "first (1 = pore)", self.path)
        return t.astype(np.uint8)

    def close(self) -> None:
        if self.scan is not None:
            self.scan.close()
