"""Local thickness of the pores (the pore-size distribution), whole or streamed slab by slab, exactly.

The local thickness of a pore voxel is the diameter of the largest ball that lies in the pores
and covers the voxel (Hildebrand & Rüegsegger 1997; BoneJ; PoreSpy). As PoreSpy 3.2's
``local_thickness(method="dt")`` computes it, radii are the integers ``r`` from the largest
distance down to 1: the centres are the pore voxels whose distance to the solid is at least
``r``, each covers what lies closer than ``r`` to it, and a voxel keeps the first (largest) ``r``
that covers it. The thickness is ``2 r``. Distances are Euclidean, in units of the smallest voxel
side (other sides scaled), and the volume's own border is not solid (as PoreSpy and
``scipy.ndimage.distance_transform_edt`` take it); outside the sample is solid.

Streamed, in two passes. :func:`distance_pass` makes the exact distance map slab by slab (in-plane
tiles where the budget needs them), each window's halo doubled until every distance in it is certain
(a distance no larger than the halo cannot have been cut short by it); its largest value is ``R``.
:func:`tiled_thickness` then computes the radii tile by tile from that map with a halo of ``R``: the
centres that can reach a tile lie within ``R`` of it and their distances are already exact, so the
map equals the whole-volume one voxel for voxel. The maps of a large volume wait in a
:class:`DiskArray`.

Examples
--------
>>> import numpy as np
>>> z, y, x = np.indices((21, 21, 21)) - 10
>>> ball = (z * z + y * y + x * x <= 8 * 8).astype(np.uint8)
>>> r = thickness_radii(ball)
>>> int(r.max()), int(r[10, 10, 10]), int(r[0, 10, 10])
(8, 8, 0)
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Optional

import numpy as np
from scipy import ndimage as ndi

from ctpore.progress import ProgressFn

__all__ = ["sampling_of", "distance_map", "thickness_radii", "largest_distance", "streamed_thickness",
           "BYTES_PER_VOXEL", "DiskArray", "distance_pass", "tiled_thickness", "plan_tiles"]

#: Bytes per voxel of a window while its thickness is computed (the float32 distances, the distance
#: transform to the centres with its working arrays, masks, radii): about 20 measured with ``edt``
#: (more with scipy's transform, which makes a feature transform too), with a margin.
BYTES_PER_VOXEL = 44

#: Bytes per voxel of a window of the distance pass (scipy's transform with its feature transform,
#: the float32 result, the pores).
EDT_BYTES_PER_VOXEL = 28


def sampling_of(spacing: Sequence[float]) -> tuple:
    """Voxel sides (z, y, x) in units of the smallest one."""
    s = [float(v) for v in spacing]
    m = min(s)
    return tuple(v / m for v in s)


def _edt(mask: np.ndarray, sampling: tuple) -> np.ndarray:
    """Euclidean distance of every True voxel to the nearest False one (the border is not False),
    float32: the ``edt`` package where it is installed (the ``analysis`` extra; about three times
    faster, and light on memory), else scipy's transform."""
    try:
        import edt
    except ImportError:
        return ndi.distance_transform_edt(mask, sampling=sampling).astype(np.float32)
    return edt.edt(np.ascontiguousarray(mask), anisotropy=tuple(float(s) for s in sampling), black_border=False,
                   parallel=max(1, min(4, os.cpu_count() or 1)))


def distance_map(pores: np.ndarray, sampling: Sequence[float] = (1.0, 1.0, 1.0)) -> np.ndarray:
    """Distance (float32, as PoreSpy's ``edt`` gives it; a map kept on disk is the same) of every pore
    voxel to the nearest solid one; 0 on the solid."""
    p = np.asarray(pores, bool)
    if not p.any():
        return np.zeros(p.shape, np.float32)
    if p.all():  # no solid at all: nothing bounds a ball but the border, which is not solid
        return np.full(p.shape, np.inf, np.float32)
    return _edt(p, tuple(sampling))


def thickness_radii(pores: np.ndarray, sampling: Sequence[float] = (1.0, 1.0, 1.0),
                    dist: Optional[np.ndarray] = None, centres: Optional[np.ndarray] = None,
                    rmax: Optional[int] = None, cover: Optional[np.ndarray] = None) -> np.ndarray:
    """Local thickness radii (int16; 0 on the solid) of ``pores`` (module docstring).

    ``dist``: its :func:`distance_map` when already made. ``centres`` (bool): only these voxels may
    centre a ball (the others still get covered). ``rmax``: the largest radius tried (default:
    the largest distance). ``cover``: at level ``r`` the centres (``dist >= r``) cover what lies
    closer than ``cover[r]`` to them instead of ``r`` (a level whose ``cover`` is 0 is skipped;
    ``cover[r] <= r``); the map still holds the level ``r``.
    """
    p = np.asarray(pores, bool)
    d = distance_map(p, sampling) if dist is None else dist
    out = np.zeros(p.shape, np.int16)
    if not p.any():
        return out
    dmax = float(d.max())
    if np.isfinite(dmax):
        top = int(math.floor(dmax)) if rmax is None else min(int(math.floor(dmax)), int(rmax))
    else:  # a pore space with no solid: one radius covers it all
        top = int(rmax) if rmax is not None else max(p.shape)
    ok = d if centres is None else np.where(centres, d, 0.0)
    sampling = tuple(sampling)
    for r in range(top, 0, -1):
        reach = float(r) if cover is None else float(cover[r]) if r < len(cover) else 0.0
        if reach <= 0:
            continue
        seeds = ok >= r
        if not seeds.any():
            continue
        # only the seeds' bounding box, grown by r, can be covered
        box = []
        for axis, n in enumerate(p.shape):
            on = np.flatnonzero(seeds.any(axis=tuple(a for a in range(3) if a != axis)))
            grow = int(math.ceil(r / sampling[axis]))
            box.append(slice(max(0, on[0] - grow), min(n, on[-1] + grow + 1)))
        box = tuple(box)
        covered = _edt(~seeds[box], sampling) < reach
        region = out[box]
        region[(region == 0) & covered] = r
    return out


class DiskArray:
    """A ``(Z, Y, X)`` array in a nameless file in ``folder`` (removed from the folder as it is made,
    so that nothing is left behind even when the process is killed), read and written by windows
    (``a[z0:z1, y0:y1, x0:x1]``, steps of 1) one row at a time with ``pread``/``pwrite``: only the
    window is ever in the process (a memory map would bring whole pages of the file in around every
    row it touches). :meth:`close` frees the disk space."""

    def __init__(self, folder, shape: tuple, dtype):
        import tempfile

        self.shape, self.dtype = tuple(int(n) for n in shape), np.dtype(dtype)
        self.fd, name = tempfile.mkstemp(prefix=".ctpore-map-", suffix=".raw", dir=folder)
        os.unlink(name)
        os.ftruncate(self.fd, int(np.prod(self.shape)) * self.dtype.itemsize)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self):
        self.close()

    def _box(self, key) -> tuple:
        key = key if isinstance(key, tuple) else (key,)
        key = tuple(slice(k, k + 1) if isinstance(k, (int, np.integer)) else k for k in key)
        key = key + (slice(None),) * (3 - len(key))
        box = tuple(range(*k.indices(n)) for k, n in zip(key, self.shape))
        if any(r.step != 1 for r in box):
            raise ValueError("DiskArray windows take steps of 1")
        return box

    def _rows(self, box):
        (zs, ys, xs), (_, ny, nx), item = box, self.shape, self.dtype.itemsize
        for i, z in enumerate(zs):
            for j, y in enumerate(ys):
                yield i, j, ((z * ny + y) * nx + (xs.start if len(xs) else 0)) * item, len(xs) * item

    def __getitem__(self, key) -> np.ndarray:
        box = self._box(key)
        out = np.empty(tuple(len(r) for r in box), self.dtype)
        for i, j, offset, size in self._rows(box):
            if size:
                out[i, j] = np.frombuffer(os.pread(self.fd, size, offset), self.dtype)
        return out

    def __setitem__(self, key, value) -> None:
        box = self._box(key)
        v = np.broadcast_to(np.asarray(value, self.dtype), tuple(len(r) for r in box))
        for i, j, offset, size in self._rows(box):
            if size:
                os.pwrite(self.fd, np.ascontiguousarray(v[i, j]).tobytes(), offset)


def distance_pass(read: Callable, nz: int, slab: int, sampling: Sequence[float] = (1.0, 1.0, 1.0),
                  out: Optional[np.ndarray] = None, start_halo: int = 8, progress: ProgressFn = None,
                  budget_bytes: Optional[int] = None) -> float:
    """The exact distance map of a volume read as ``read(z0, z1)`` (pores of slices ``z0:z1``) into
    ``out`` (a ``(Z, Y, X)`` float32 array or :class:`DiskArray`; None: not kept); returns the
    largest distance.

    Slabs of ``slab`` slices are taken with a halo (the pores kept as bytes, read forward once: the
    slices a slab shares with the next stay); each is cut into in-plane tiles when ``budget_bytes``
    cannot hold its distance transform whole. A tile's distances are certain when none is larger
    than its halo (a distance no larger than that cannot have been cut short); the halo doubles
    until they are, or until the window reaches the volume's ends.
    """
    sampling = tuple(sampling)
    best, h = 0.0, max(1, int(start_halo))
    buf, b0 = None, 0  # the pores of slices b0 .. b0 + len(buf), as bool

    def window(w0, w1):
        nonlocal buf, b0
        keep = 0 if buf is None or w0 < b0 else min(w1 - w0, max(0, b0 + len(buf) - w0))  # kept from the last window
        first = None if keep else np.asarray(read(w0, min(w1, w0 + 8)), bool)
        plane = (buf if keep else first).shape[1:]
        new = np.empty((w1 - w0,) + plane, bool)
        if keep:
            new[:keep] = buf[w0 - b0:]
        else:
            new[:len(first)] = first
            keep = len(first)
        buf = None  # the old window goes before the rest is read
        for a in range(w0 + keep, w1, 8):  # forward, a few slices at a time
            new[a - w0:min(w1, a + 8) - w0] = np.asarray(read(a, min(w1, a + 8)), bool)
        buf, b0 = new, w0
        return buf

    for z0 in range(0, nz, slab):
        z1 = min(nz, z0 + slab)
        while True:
            halo = tuple(int(math.ceil(h / sv)) for sv in sampling)
            w0, w1 = max(0, z0 - halo[0]), min(nz, z1 + halo[0])
            pores = window(w0, w1)
            ny, nx = pores.shape[1:]
            ty, tx = _plane_tile(pores.shape, halo, budget_bytes)
            top, certain = 0.0, True
            for y0 in range(0, ny, ty):
                for x0 in range(0, nx, tx):
                    y1, x1 = min(ny, y0 + ty), min(nx, x0 + tx)
                    ly, hy = max(0, y0 - halo[1]), min(ny, y1 + halo[1])
                    lx, hx = max(0, x0 - halo[2]), min(nx, x1 + halo[2])
                    d = distance_map(pores[:, ly:hy, lx:hx], sampling)
                    c = d[z0 - w0:z1 - w0, y0 - ly:y1 - ly, x0 - lx:x1 - lx]
                    cmax = float(c.max()) if c.size else 0.0
                    whole = w0 == 0 and w1 == nz and ly == 0 and hy == ny and lx == 0 and hx == nx
                    if not whole and cmax > h:
                        certain = False
                        break
                    top = max(top, cmax)
                    if out is not None:
                        out[z0:z1, y0:y1, x0:x1] = c
                if not certain:
                    break
            if certain:
                break
            h *= 2
        best = max(best, top)
        if progress is not None:
            progress(z1, nz, "distance map")
    return best


def _plane_tile(shape: tuple, halo: tuple, budget_bytes: Optional[int]) -> tuple:
    """``(ty, tx)`` of the distance transform's tiles of a slab window ``shape`` within ``budget_bytes``
    (None: the whole plane)."""
    n, ny, nx = shape
    if budget_bytes is None or n * ny * nx * EDT_BYTES_PER_VOXEL <= budget_bytes:
        return ny, nx
    side = int(math.sqrt(budget_bytes / (EDT_BYTES_PER_VOXEL * n))) - 2 * max(halo[1:])
    return max(8, min(ny, side)), max(8, min(nx, side))


def largest_distance(read: Callable, nz: int, slab: int, sampling: Sequence[float] = (1.0, 1.0, 1.0),
                     start_halo: int = 8, progress: ProgressFn = None) -> float:
    """The largest distance to the solid (:func:`distance_pass` without keeping the map)."""
    return distance_pass(read, nz, slab, sampling, None, start_halo, progress)


def plan_tiles(shape: tuple, halo: tuple, budget_bytes: int) -> tuple:
    """``(tz, ty, tx)``: the tile of the thickness pass that fits ``budget_bytes`` with its halo and
    computes the fewest halo voxels per voxel: slabs of whole planes, or the largest cube.
    InputError when neither fits."""
    from ctpore.errors import InputError

    nz, ny, nx = shape
    hz, hy, hx = halo
    room = budget_bytes / BYTES_PER_VOXEL

    def window(t):  # a tile with its halo, clipped by the volume
        return math.prod(n if ti >= n else min(n, ti + 2 * h) for n, ti, h in zip(shape, t, halo))

    cands = []
    tz = nz if nz * ny * nx <= room else min(nz, int(room / (ny * nx) - 2 * hz))
    if tz >= 1:
        cands.append((tz, ny, nx))
    side = int(room ** (1 / 3))
    while side >= 1 and window((side, side, side)) > room:
        side -= 1
    if side >= 8:
        cands.append((min(nz, side), min(ny, side), min(nx, side)))
    if not cands:
        need = BYTES_PER_VOXEL * window((8, 8, 8)) / 2**30
        raise InputError(f"the local thickness of pores this large (a radius of {max(halo)} voxels) needs a "
                         f"budget of about {need:.2f} GB for its tiles; give a larger --memory-gb")
    return min(cands, key=lambda t: window(t) / (t[0] * t[1] * t[2]))


def tiled_thickness(dist: np.ndarray, out: np.ndarray, sampling: Sequence[float] = (1.0, 1.0, 1.0),
                    rmax: Optional[float] = None, budget_bytes: int = 1 << 30, progress: ProgressFn = None,
                    cover: Optional[np.ndarray] = None) -> tuple:
    """The radii of :func:`thickness_radii` of the whole volume into ``out`` (int16, an array or a
    memory map), from its exact distance map ``dist`` (:func:`distance_pass`), tile by tile: each tile
    is computed with a halo of the largest radius (the centres that can reach it) read from the map
    (:func:`plan_tiles`). ``cover``: as for :func:`thickness_radii`. Returns the tile."""
    sampling = tuple(sampling)
    shape = tuple(dist.shape)
    nz = shape[0]
    if rmax is None:
        rmax = max((float(np.max(dist[z:z + 64])) for z in range(0, nz, 64)), default=0.0)
    R = int(math.floor(rmax)) if np.isfinite(rmax) else max(shape)
    halo = tuple(int(math.ceil(R / s)) for s in sampling)
    tile = plan_tiles(shape, halo, budget_bytes)
    tz, ty, tx = tile
    for z0 in range(0, nz, tz):
        z1 = min(nz, z0 + tz)
        for y0 in range(0, shape[1], ty):
            for x0 in range(0, shape[2], tx):
                y1, x1 = min(shape[1], y0 + ty), min(shape[2], x0 + tx)
                lo = (max(0, z0 - halo[0]), max(0, y0 - halo[1]), max(0, x0 - halo[2]))
                hi = (min(nz, z1 + halo[0]), min(shape[1], y1 + halo[1]), min(shape[2], x1 + halo[2]))
                d = np.asarray(dist[lo[0]:hi[0], lo[1]:hi[1], lo[2]:hi[2]], np.float32)
                radii = thickness_radii(d > 0, sampling, dist=d, rmax=R, cover=cover)
                out[z0:z1, y0:y1, x0:x1] = radii[z0 - lo[0]:z1 - lo[0], y0 - lo[1]:y1 - lo[1], x0 - lo[2]:x1 - lo[2]]
        if progress is not None:
            progress(z1, nz, "local thickness")
    return tile


def streamed_thickness(read: Callable, nz: int, slab: int, sampling: Sequence[float] = (1.0, 1.0, 1.0),
                       rmax: Optional[float] = None, progress: ProgressFn = None) -> Iterator[tuple]:
    """``(z0, z1, radii)`` slab after slab: :func:`tiled_thickness` of a volume read as ``read(z0, z1)``
    with tiles that fit ``slab`` planes, the maps held in memory (for volumes that fit;
    :func:`ctpore.pipelines.analysis.analyze_volume` keeps them in files)."""
    first = np.asarray(read(0, min(nz, 1)))
    dist = np.zeros((nz,) + first.shape[1:], np.float32)
    top = distance_pass(read, nz, slab, sampling, dist, progress=progress)
    radii = np.zeros(dist.shape, np.int16)
    rmax = top if rmax is None else rmax
    hz = int(math.ceil(math.floor(rmax) / sampling[0])) if np.isfinite(rmax) else nz
    tiled_thickness(dist, radii, sampling, rmax, progress=progress,
                    budget_bytes=BYTES_PER_VOXEL * (slab + 2 * hz) * dist.shape[1] * dist.shape[2])
    for z0 in range(0, nz, slab):
        yield z0, min(nz, z0 + slab), radii[z0:z0 + slab]
