"""The spread of the figures over the probability map: porosity, Euler number and percolating
porosity with the pores re-derived at five thresholds.

A learned method's probabilities are calibrated (:mod:`ctpore.data.calibration`): where the map says
0.7, seven voxels in ten are pore. The pores at the method's own threshold are one reading of that
map; a labeller who draws pores a little tighter or looser reads it at another level. So beside the
figures of the pores, :func:`threshold_ranges` gives them at the five levels of the calibrated
probability :data:`LEVELS` (0.3 to 0.7): at each, the raw threshold whose calibrated probability is
that level (:func:`raw_thresholds`), and the pores re-derived from the raw map by the same
post-processing (the surface's rim, the evidence rules for pore and solid components) with only the
threshold changed. The ranges are the least and the greatest of the five.

It needs the raw map, which lives only inside a reconstruction (the written ``<stem>_prob`` is
calibrated, and a calibration with plateaus cannot be undone), so the ranges come with
``ctpore reconstruct --analyze`` and ``ctpore batch --analyze``, not from ``ctpore analyze`` on
written files. Each level costs one more post-processing of the raw map (it is read two to four
times) and a labelling of its pores; the model is not run again.

Examples
--------
>>> cal = {"x": [0.1, 0.5, 0.9], "y": [0.0, 0.5, 1.0]}
>>> [round(t, 3) for t in raw_thresholds(cal)]
[0.34, 0.42, 0.5, 0.58, 0.66]
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional

import numpy as np

from ctpore.data.percolation import PoreConnectivity, plane_counts, sample_faces
from ctpore.data.postprocess import Postprocessing
from ctpore.data.rim import cleared
from ctpore.data.slabs import StreamingTopology
from ctpore.progress import ProgressFn

__all__ = ["LEVELS", "RANGE_FIGURES", "raw_thresholds", "threshold_ranges"]

#: The calibrated probabilities at which the pores are re-derived.
LEVELS = (0.3, 0.4, 0.5, 0.6, 0.7)

#: The range keys, each ``[least, greatest]`` over :data:`LEVELS` (per axis for the percolation).
RANGE_FIGURES = ("porosity_range", "euler_number_range", "percolating_porosity_range")

_TINY = 1e-6  # the smallest threshold: every voxel whose raw probability is above 0 (and 0 itself not)


def raw_thresholds(calibration: Optional[dict], levels=LEVELS) -> list[float]:
    """The raw probability at which the calibrated one first reaches each of ``levels``: the inverse
    of the calibration map (piecewise linear and non-decreasing, as
    :func:`~ctpore.data.calibration.apply_calibration` applies it), so that a raw probability is at
    least the threshold exactly where its calibrated one is at least the level. Without a
    calibration the levels themselves. A level below the map's least value gives the smallest
    threshold (every voxel); one above its greatest gives 1.0 (only voxels the model is certain of)."""
    if calibration is None:
        return [float(c) for c in levels]
    x = np.asarray(calibration["x"], np.float64)
    y = np.asarray(calibration["y"], np.float64)
    out = []
    for c in levels:
        if c <= y[0]:
            out.append(_TINY)
            continue
        if c > y[-1]:
            out.append(1.0)
            continue
        i = int(np.flatnonzero(y >= c)[0])  # the first point at or above the level; y[i - 1] < c
        t = x[i - 1] + (c - y[i - 1]) * (x[i] - x[i - 1]) / (y[i] - y[i - 1])
        out.append(float(min(max(t, _TINY), 1.0)))
    return out


def threshold_ranges(read_raw: Callable[[int, int], np.ndarray], codes: Optional[Callable[[int, int], np.ndarray]],
                     shape, post: Postprocessing, slab: int, progress: ProgressFn = None) -> dict:
    """The figures at each level of :data:`LEVELS` and their ranges (module docstring).

    Parameters
    ----------
    read_raw : callable
        ``read_raw(z0, z1)`` -> the raw probabilities of slices ``z0:z1``, a fresh float32 array.
    codes : callable or None
        ``codes(z0, z1)`` -> the sample's outside codes of those slices
        (:meth:`~ctpore.data.sample.SampleFit.outside`: 0 in the sample); None: every voxel is sample.
    shape : tuple
    post : Postprocessing
        The method's own; only its threshold changes.
    slab : int
        Slices per slab (the result does not depend on it).

    Returns
    -------
    dict
        :data:`RANGE_FIGURES` and ``ranges_by_level``: the levels, the raw thresholds and the three
        figures at each. All None for a method without probabilities (``post.binary``).
    """
    if post.binary:
        return {**{k: None for k in RANGE_FIGURES}, "ranges_by_level": None}
    shape = tuple(int(s) for s in shape)
    cuts = [(a, min(shape[0], a + slab)) for a in range(0, shape[0], max(1, int(slab)))]
    counts = footprint = None
    if codes is not None:  # the sample's faces, from its planes and its footprint
        counts = [np.zeros(n, np.int64) for n in shape]
        footprint = np.zeros(shape[1:], bool)
        for a, b in cuts:
            inside = np.asarray(codes(a, b)) == 0
            cz, cy, cx = plane_counts(inside, (b - a,) + shape[1:])
            counts[0][a:b] += cz
            counts[1] += cy
            counts[2] += cx
            footprint |= inside.any(axis=0)
    faces = sample_faces(counts, shape, footprint)
    thresholds = raw_thresholds(post.calibration)
    rows = []
    for k, t in enumerate(thresholds):
        rule = replace(post, threshold=float(t), calibration=None)  # the pores only: no map to calibrate

        def read(a, b, t=t):
            if codes is None:
                return read_raw(a, b)
            # outside: not pore; the surface's rim, judged at this threshold (read with a halo)
            return cleared(read_raw, codes, a, b, shape[0], threshold=t)

        topo, conn = StreamingTopology(components=False), PoreConnectivity(shape, faces)

        def take(a, b, pores, _prob, topo=topo, conn=conn):
            inside = None if codes is None else np.asarray(codes(a, b)) == 0
            topo.add(pores)
            conn.add(pores, inside)

        def tick(done, total, stage, k=k):
            if progress is not None:
                progress(k * total + done, len(thresholds) * total, f"ranges: {stage}")

        rule.run(read, shape, slab, take, tick)
        c = conn.result()
        rows.append({"porosity": conn.n_pore / conn.n_sample if conn.n_sample else 0.0,
                     "euler_number": topo.euler_number(26),
                     "percolating_porosity_zyx": c["percolating_porosity_zyx"]})
    by_axis = []
    for axis in range(3):
        vals = [r["percolating_porosity_zyx"][axis] for r in rows]
        by_axis.append(None if any(v is None for v in vals) else [min(vals), max(vals)])
    por = [r["porosity"] for r in rows]
    eul = [r["euler_number"] for r in rows]
    return {"porosity_range": [min(por), max(por)], "euler_number_range": [min(eul), max(eul)],
            "percolating_porosity_range": by_axis,
            "ranges_by_level": {"levels": list(LEVELS), "raw_thresholds": thresholds, "porosity": por,
                                "euler_number": eul,
                                "percolating_porosity_zyx": [r["percolating_porosity_zyx"] for r in rows]}}
