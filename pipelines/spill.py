"""Volumes that wait on disk during a reconstruction, so memory never grows with the scan.

:class:`BlockSpill` holds the raw probabilities between prediction (written tile block by tile
block) and post-processing (read back slab by slab); :func:`windowed` gives the predictor an
uncompressed copy of a compressed scan when the plane needs several tiles. Both are nameless
temporary files beside the outputs (:func:`nameless_file`): they vanish with the process, whatever
ends it.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from ctpore.data.io import Scan
from ctpore.progress import ProgressFn

__all__ = ["BlockSpill", "RawCopy", "nameless_file", "windowed"]


def nameless_file(folder, prefix: str) -> int:
    """A read-write descriptor of a new file in ``folder`` that has no name: made so by the kernel
    (``O_TMPFILE``) where the file system allows it, so that not even a kill at that instant leaves a
    file behind; elsewhere made with a name (``prefix``) that is removed at once."""
    flag = getattr(os, "O_TMPFILE", 0)
    if flag:
        try:
            return os.open(folder, flag | os.O_RDWR, 0o600)
        except OSError:  # a file system without it
            pass
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=".f32", dir=folder)
    os.unlink(name)
    return fd


class BlockSpill:
    """A ``(Z, Y, X)`` float32 volume on disk, written in tile blocks and read back in slabs.

    Stands as ``predict``'s ``out``: ``spill[z0:z1, y0:y1, x0:x1] = block``. Each tile (the
    ``(y0:y1, x0:x1)`` of its blocks) gets its own region of the file, slices one after the
    other, so writing a block is one write and :meth:`read` of a slab one read per tile. The
    data goes through the page cache, not the process's memory. The file has no name (it is
    unlinked as soon as it is made), so it vanishes with :meth:`close` or with the process.
    """

    def __init__(self, folder: str | os.PathLike, shape: tuple[int, int, int]):
        self.shape = tuple(int(s) for s in shape)
        self._fd = nameless_file(folder, ".ctpore-spill-")  # even a killed run leaves nothing behind
        self._tiles: dict[tuple[int, int, int, int], int] = {}  # (y0, y1, x0, x1) -> byte offset
        self._end = 0

    def __setitem__(self, key, value) -> None:
        zs, ys, xs = key
        box = (ys.start, ys.stop, xs.start, xs.stop)
        h, w = box[1] - box[0], box[3] - box[2]
        if box not in self._tiles:
            self._tiles[box] = self._end
            self._end += self.shape[0] * h * w * 4
        block = np.ascontiguousarray(value, dtype=np.float32)
        if block.shape != (zs.stop - zs.start, h, w):
            raise ValueError(f"block {block.shape} does not fit {key}")
        os.pwrite(self._fd, block.tobytes(), self._tiles[box] + zs.start * h * w * 4)

    def read(self, z0: int, z1: int) -> np.ndarray:
        """Slices ``z0:z1`` as ``(n, Y, X)`` float32."""
        n = z1 - z0
        out = np.empty((n, *self.shape[1:]), np.float32)
        for (y0, y1, x0, x1), off in self._tiles.items():
            h, w = y1 - y0, x1 - x0
            raw = os.pread(self._fd, n * h * w * 4, off + z0 * h * w * 4)
            out[:, y0:y1, x0:x1] = np.frombuffer(raw, np.float32).reshape(n, h, w)
        return out

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> "BlockSpill":
        return self

    def __exit__(self, *exc) -> None:
        self.close()



class RawCopy:
    """A scan copied to a nameless temporary float32 file (z-major), read back window by window.

    ``transform(z0, z1, block)``, when given, changes each block of slices on the way (e.g. fills a
    sample's outside); ``stage`` names the copy in progress reports. With ``copy=False`` the file
    starts empty and the caller writes it (:meth:`write`), e.g. in a pass over the scan it makes anyway.
    """

    def __init__(self, scan, folder: Path, progress: ProgressFn, transform=None,
                 stage: str = "decompressing the scan", copy: bool = True):
        self.shape = tuple(int(s) for s in scan.shape)
        nz, ny, nx = self.shape
        self._fd = nameless_file(folder, ".ctpore-scan-")
        if not copy:  # the caller writes the slices (:meth:`write`), in a pass of its own
            return
        step = max(1, (64 << 20) // (4 * ny * nx))
        for z0 in range(0, nz, step):
            z1 = min(nz, z0 + step)
            block = np.asarray(scan[z0:z1], np.float32)
            self.write(z0, block if transform is None else transform(z0, z1, block))
            if progress is not None:
                progress(z1, nz, stage)

    def write(self, z0: int, block: np.ndarray) -> None:
        """Slices ``z0 : z0 + n`` (``block`` ``(n, Y, X)``), for a copy made with ``copy=False``."""
        _nz, ny, nx = self.shape
        os.pwrite(self._fd, np.ascontiguousarray(block, np.float32).tobytes(), z0 * ny * nx * 4)

    def read_window(self, z0: int, z1: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        _nz, ny, nx = self.shape
        out = np.empty((z1 - z0, y1 - y0, x1 - x0), np.float32)
        for i, z in enumerate(range(z0, z1)):
            raw = os.pread(self._fd, (y1 - y0) * nx * 4, (z * ny + y0) * nx * 4)
            out[i] = np.frombuffer(raw, np.float32).reshape(y1 - y0, nx)[:, x0:x1]
        return out

    def __getitem__(self, key: slice) -> np.ndarray:
        z0, z1, _ = key.indices(self.shape[0])
        return self.read_window(z0, z1, 0, self.shape[1], 0, self.shape[2])

    def close(self) -> None:
        os.close(self._fd)


@contextmanager
def windowed(scan: Scan, folder: Path, shape, tile: int, halo: int, progress: ProgressFn) -> Iterator:
    """``scan``, or, when its format cannot read a window without reading whole planes (a
    ``.nii.gz``, a TIFF, a folder of images) and the plane takes several tiles, a temporary
    uncompressed copy beside the outputs (nameless, so nothing is left behind): each tile streams
    through every slice, and reading a window of the copy costs only that window (a ``.nii.gz``
    would be decompressed again for every tile)."""
    from ctpore.pipelines.stream_plan import plan_tiles

    if scan.windowed or len(plan_tiles(shape[1], shape[2], tile, halo)) == 1:
        yield scan
        return
    copy = RawCopy(scan, folder, progress)
    try:
        yield copy
    finally:
        copy.close()
