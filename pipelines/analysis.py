"""``ctpore analyze``: what users compute after the pores, streamed in bounded memory, exactly.

From a 0/1 pore volume (and the sample mask, and the probability map when given) it computes,
within the sample:

- the Minkowski functionals (:mod:`ctpore.data.minkowski`): pore volume fraction, surface area,
  specific surface (per sample volume and per solid volume), mean breadth; the Euler number is
  ctpore's own (26-connected pores);
- connected, isolated and percolating porosity (:mod:`ctpore.data.percolation`);
- the local thickness (:mod:`ctpore.data.thickness`): a thickness map, the volume-weighted
  pore-size distribution and its d10, d50, d90 and mean;
- the expected porosity, the mean calibrated probability within the sample (with ``prob``).

Passes over the volume: (1) slab by slab, the sample's planes, the configuration histogram, the
Euler number and the expected porosity; (2) slab by slab, the components and the faces they touch
(the faces follow from pass 1's planes); (3) the exact distance map (:func:`~ctpore.data.thickness.distance_pass`);
(4) the thickness from it, tile by tile with a halo of the largest radius
(:func:`~ctpore.data.thickness.tiled_thickness`); the two maps are held in memory, or in nameless
files when a quarter of the budget cannot hold them. Every figure equals the whole-volume
computation's; memory follows ``memory_gb``.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from typing import Any, Optional, Union

import numpy as np

from ctpore.data.drainage import access_radii, drainage_curve, step_radii
from ctpore.data.minkowski import MinkowskiAccumulator
from ctpore.data.percolation import PoreConnectivity, TurnedFace, plane_counts, sample_faces
from ctpore.data.slabs import StreamingTopology
from ctpore.data.thickness import DiskArray, distance_pass, sampling_of, tiled_thickness
from ctpore.errors import InputError
from ctpore.progress import ProgressFn

__all__ = ["analyze_volume", "thickness_summary", "analysis_budget", "SlabsInMemory"]

PathLike = Union[str, os.PathLike]

#: Slab voxels when no memory budget is given (as ``reconstruct``'s post-processing slabs).
DEFAULT_SLAB_VOXELS = 1 << 23

#: Bytes per voxel of a slab in the passes other than the thickness (labels, masks, codes).
PASS_BYTES_PER_VOXEL = 24


#: Bytes per voxel of the maps held in memory when a quarter of the budget holds them: the distances
#: (float32), the thickness or drainage radii and the access radii (int16 each).
MAP_BYTES = 8

#: The memory budget (GB) of the whole process when none is given: ``reconstruct``'s.
DEFAULT_MEMORY_GB = 1.5


def analysis_budget(shape: tuple, memory_gb: Optional[float]) -> int:
    """Bytes the analysis may hold at once (the process's base excluded): ``memory_gb`` for the whole
    process (None: :data:`DEFAULT_MEMORY_GB`)."""
    from ctpore.pipelines.budget import BASE_BYTES, MARGIN_BYTES

    memory_gb = DEFAULT_MEMORY_GB if memory_gb is None else memory_gb
    budget = int(memory_gb * 2**30) - BASE_BYTES - MARGIN_BYTES
    if budget <= PASS_BYTES_PER_VOXEL * shape[1] * shape[2]:
        raise InputError(f"--memory-gb {memory_gb:g} leaves no room for one slice of {shape[1]} x {shape[2]} voxels "
                         "beside the process itself; give more")
    return budget


class SlabsInMemory:
    """A ``thickness_writer`` that keeps the slabs (for the API, napari and the bench); :meth:`volume`
    joins them."""

    def __init__(self):
        self.slabs: list = []

    def write(self, slab) -> None:
        self.slabs.append(np.asarray(slab))

    def volume(self) -> np.ndarray:
        return np.concatenate(self.slabs)


def _binary(slab: np.ndarray, what: str, z0: int) -> np.ndarray:
    a = np.asarray(slab)
    if a.dtype == np.bool_:
        return a
    bad = (a != 0) & (a != 1)
    if bad.any():
        z = z0 + int(np.flatnonzero(bad.any(axis=(1, 2)))[0])
        raise InputError(f"is not a 0/1 {what} volume (slice {z} holds {a[bad].flat[0]!r}); give the pores "
                         "ctpore wrote (<stem>_pores), or a mask of 0 and 1")
    return a.astype(bool)


def thickness_summary(counts: np.ndarray, unit: float) -> dict:
    """Volume-weighted d10, d50, d90 and mean of the diameters ``2 r unit``, from ``counts[r]`` (pore
    voxels of radius ``r``); a dq is the smallest diameter with at least q of the pore volume at or
    below it. None without pores."""
    c = np.asarray(counts, np.float64)
    c[0] = 0.0  # radius 0: not a pore
    total = c.sum()
    if total == 0:
        return {"mean": None, "d10": None, "d50": None, "d90": None}
    d = 2.0 * np.arange(len(c)) * unit
    cum = np.cumsum(c) / total
    pick = {f"d{q}": float(d[int(np.searchsorted(cum, q / 100 - 1e-12))]) for q in (10, 50, 90)}
    return {"mean": float((c * d).sum() / total), **pick}


def _drainage(dist, radii, inlet: int, slab: int, sampling: tuple, room: int, n_pore: int, unit: float,
              tmp, progress: ProgressFn) -> dict:
    """The drainage curve from the top face (plane ``inlet``) of the exact distance map ``dist``:
    the access levels (:func:`~ctpore.data.drainage.access_radii`, in a map beside it), then the
    drainage levels tile by tile into ``radii`` (the thickness map's, already read), counted, with
    each level's step radius (:func:`~ctpore.data.drainage.step_radii`)."""
    amap = np.zeros(dist.shape, np.int16) if isinstance(radii, np.ndarray) else DiskArray(tmp, dist.shape, np.int16)
    try:
        top = access_radii(dist, amap, inlet, slab, progress=progress)
        steps = step_radii(dist, slab)
        counts = np.zeros(top + 1, np.int64)
        if top:
            tiled_thickness(amap, radii, sampling, float(top), room, progress=progress, cover=steps)
            for z0 in range(0, dist.shape[0], slab):
                r = np.asarray(radii[z0:z0 + slab])
                counts += np.bincount(r.ravel(), minlength=top + 1)[:top + 1]
    finally:
        if isinstance(amap, DiskArray):
            amap.close()
    return {"inlet_slice": int(inlet), **drainage_curve(counts, n_pore, unit, steps)}


def analyze_volume(pores: Any, geometry, sample: Any = None, prob: Any = None, memory_gb: Optional[float] = None,
                   thickness_writer: Any = None, tmp_dir: Any = None, progress: ProgressFn = None) -> dict:
    """Every figure of the module docstring for ``pores`` (an array or a Scan, ``(Z, Y, X)``, 0/1),
    ``sample`` (the same, or None: every voxel) and ``prob`` (the calibrated probability, or
    None). ``thickness_writer``, when given, takes the thickness map (diameters, float32, in mm or in
    voxels of the smallest side where the units are unknown) slab by slab. ``tmp_dir``: where the
    distance map waits when it does not fit the budget (default: the system's temporary folder).
    Returns the figures, with ``psd_counts`` (pore voxels per radius) and ``unit`` (the smallest side
    in mm, or None where the units are unknown)."""
    t0 = time.perf_counter()
    shape = tuple(int(s) for s in pores.shape)
    nz, plane = shape[0], shape[1] * shape[2]
    for other, what in ((sample, "sample"), (prob, "probability")):
        if other is not None and tuple(other.shape) != shape:
            raise InputError(f"the {what} is {tuple(other.shape)}, the pores {shape}: give the {what} of these pores")
    budget = analysis_budget(shape, memory_gb)
    slab = max(1, min(nz, budget // (PASS_BYTES_PER_VOXEL * plane), DEFAULT_SLAB_VOXELS // plane or 1))
    known = getattr(geometry, "units", "mm") != "unknown"
    spacing = tuple(float(s) for s in geometry.spacing_mm) if known else (1.0, 1.0, 1.0)
    sampling = sampling_of(spacing)

    def read_both(z0, z1):  # the pores within the sample, and the sample (None: every voxel)
        p = _binary(pores[z0:z1], "pore", z0)
        s = None if sample is None else _binary(sample[z0:z1], "sample", z0)
        return (p if s is None else p & s), s

    def read(z0, z1):
        return read_both(z0, z1)[0]

    # pass 1: the sample's planes, the configuration histogram, the Euler number, the expectation
    mink, topo = MinkowskiAccumulator(spacing), StreamingTopology(components=False)
    counts = None if sample is None else [np.zeros(n, np.int64) for n in shape]
    footprint = None if sample is None else np.zeros(shape[1:], bool)  # the sample seen along z
    expected = 0.0
    for z0 in range(0, nz, slab):
        z1 = min(nz, z0 + slab)
        p, s = read_both(z0, z1)
        mink.add(p, s)
        topo.add(p)
        if counts is not None:
            cz, cy, cx = plane_counts(s, p.shape)
            counts[0][z0:z1] += cz
            counts[1] += cy
            counts[2] += cx
            footprint |= s.any(axis=0)
        if prob is not None:
            q = np.asarray(prob[z0:z1], np.float64)
            expected += float(q.sum() if s is None else q[s].sum())
        if progress is not None:
            progress(z1, nz, "surface and curvature")
    # pass 2: components, the surface and the faces
    faces = sample_faces(counts, shape, footprint)
    conn = PoreConnectivity(shape, faces)
    for z0 in range(0, nz, slab):
        z1 = min(nz, z0 + slab)
        conn.add(*read_both(z0, z1))
        if progress is not None:
            progress(z1, nz, "connectivity")
    # passes 3 and 4: the exact distance map, then the local thickness from it tile by tile with a
    # halo of the largest radius; both maps in memory when a quarter of the budget holds them, else in
    # nameless files (in tmp_dir, default the system's temporary folder)
    tmp = tmp_dir if tmp_dir is not None else tempfile.gettempdir()
    in_memory = MAP_BYTES * nz * plane <= budget // 4
    dist = np.zeros(shape, np.float32) if in_memory else DiskArray(tmp, shape, np.float32)
    # slabs of the distance pass: the pores of a slab and its halo (1 byte a voxel) in an eighth of
    # the budget, their transform tiled in the rest
    dslab = max(1, min(nz, budget // (8 * plane) - 64))
    rmax = distance_pass(read, nz, dslab, sampling, dist, progress=progress,
                         budget_bytes=budget - (MAP_BYTES * nz * plane if in_memory else 0) - budget // 8)
    psd = np.zeros(int(math.floor(rmax)) + 1 if np.isfinite(rmax) else 1, np.int64)
    tiles = "none"
    drain = None
    if mink.n_pore and np.isfinite(rmax):
        radii = np.zeros(shape, np.int16) if in_memory else DiskArray(tmp, shape, np.int16)
        room = budget - (MAP_BYTES * nz * plane if in_memory else 0)
        tile = tiled_thickness(dist, radii, sampling, rmax, room, progress=progress)
        tiles = "x".join(map(str, tile))
        for z0 in range(0, nz, slab):
            r = np.asarray(radii[z0:z0 + slab])
            psd += np.bincount(r.ravel(), minlength=len(psd))[:len(psd)]
            if thickness_writer is not None:
                thickness_writer.write((2.0 * r * min(spacing)).astype(np.float32))
        if faces[0] is not None:  # passes 5 and 6: the drainage from the top face, into the radii's map
            drain = _drainage(dist, radii, faces[0][0], slab, sampling, room, mink.n_pore, min(spacing), tmp,
                              progress)
        if isinstance(radii, DiskArray):
            radii.close()
    elif thickness_writer is not None:
        for z0 in range(0, nz, slab):
            thickness_writer.write(np.zeros((min(nz, z0 + slab) - z0,) + shape[1:], np.float32))
    if isinstance(dist, DiskArray):
        dist.close()
    m, c = mink.measures(), conn.result()
    n_sample = m["sample_voxels"]
    voxel = float(np.prod(spacing))
    sample_vol, solid_vol = n_sample * voxel, (n_sample - m["pore_voxels"]) * voxel
    unit = min(spacing)
    th = thickness_summary(psd, unit)
    return {
        "porosity": m["volume_fraction"], "euler_number": topo.euler_number(26),
        "surface_area": m["surface_area"],
        "specific_surface": m["surface_area"] / sample_vol if sample_vol else None,
        "specific_surface_solid": m["surface_area"] / solid_vol if solid_vol else None,
        "mean_breadth": m["mean_breadth"],
        "thickness_mean": th["mean"], "thickness_d10": th["d10"], "thickness_d50": th["d50"],
        "thickness_d90": th["d90"],
        **{k: c[k] for k in ("connected_porosity", "isolated_porosity", "percolating_porosity_zyx", "percolates_zyx")},
        "porosity_expected": expected / n_sample if prob is not None and n_sample else None,
        "drainage_d50": None if drain is None else drain["d50"], "drainage": drain,
        "sample_voxels": n_sample, "largest_radius": float(rmax) if np.isfinite(rmax) else None,
        "units_known": known, "unit": unit if known else None, "psd_counts": psd.tolist(),
        "faces_zyx": [f.describe() if isinstance(f, TurnedFace) else list(f) if f is not None else None
                      for f in faces],
        "slab_slices": int(slab), "thickness_tile": tiles, "seconds": round(time.perf_counter() - t0, 2),
    }
