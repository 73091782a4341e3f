"""The work of one slab of a scan split across workers (:mod:`ctpore.pipelines.split`), done on a
Dask worker: its raw probabilities from a warm-up of the model's reach and its sample codes, written
to named files (:func:`predict_slab`); its raw probabilities read back for the post-processing
(:func:`read_raw`); its outputs written into its region of the stores, and its metrics summarized
(:func:`write_slab`). :class:`SplitPlan` is what the driver sends every task.
"""

from __future__ import annotations

import functools
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ctpore.atomic import atomic_write, write_json_atomic
from ctpore.data.io import load_scan
from ctpore.data.metrics import MetricsAccumulator
from ctpore.data.normalize import NormalizedVolume, count_clipped, has_contrast
from ctpore.data.postprocess import Postprocessing
from ctpore.data.rim import RimCheck, cleared
from ctpore.pipelines.sample_mask import CODE_SLABS, SampleMask, solid_level

__all__ = ["SplitPlan", "predict_slab", "read_raw", "slab_predictor", "write_slab"]


@dataclass
class SplitPlan:
    """What every slab's tasks need (small and picklable: sent to the workers)."""

    scan: str
    slice_axis: Optional[int]
    shape: tuple
    spacing_mm: tuple
    weights: Optional[str]
    device: str
    attention_backend: Optional[str]
    precision: str
    tile: int
    chunk: int
    sub: int  # slices per post-processing cut (the single run's slab)
    lo: float
    hi: float
    fit: Any  # the found sample (a SampleFit with an outside), or None: every voxel is sample
    margin: int
    post: Postprocessing
    work: str
    stores: dict
    slabs: list
    middle: int
    key: dict = field(default_factory=dict)  # what a rerun must find again to keep the work done

    @property
    def contrast(self) -> bool:
        return has_contrast(self.lo, self.hi)

    def file(self, kind: str, za: int, zb: int) -> Path:
        suffix = {"raw": ".f32", "codes": ".u8", "record": ".json"}[kind]
        return Path(self.work) / f"{kind}-{za:07d}-{zb:07d}{suffix}"

    def slab_of(self, a: int) -> tuple[int, int]:
        for za, zb in self.slabs:
            if za <= a < zb:
                return za, zb
        raise ValueError(f"slice {a} is in no slab")


@functools.lru_cache(maxsize=2)
def slab_predictor(weights: Optional[str], device: str, attention_backend: Optional[str]):
    """The PoreFormer predictor of a worker process (loaded once, for every slab it runs). The worker
    is the run's: its allocator keeps freed memory for reuse, as the ``ctpore`` command's does
    (:func:`~ctpore.runtime.tune_allocator`; a Dask worker is started with aggressive trimming)."""
    from ctpore.pipelines.methods.learned import PoreFormerPredictor
    from ctpore.runtime import tune_allocator

    tune_allocator()

    return PoreFormerPredictor(weights, device, attention_backend)


class _Codes:
    """The sample's codes of slices ``start : stop`` in a nameless file, indexed by the scan's z."""

    def __init__(self, folder: Path, start: int, stop: int, plane: tuple[int, int]):
        self.start, self.shape = start, (stop, *plane)
        self._fh = tempfile.TemporaryFile(prefix=".ctpore-split-codes-", dir=folder)
        self.array = np.memmap(self._fh, dtype=np.uint8, mode="w+", shape=(stop - start, *plane))

    def __getitem__(self, key: slice) -> np.ndarray:
        return self.array[key.start - self.start: key.stop - self.start]

    def close(self) -> None:
        del self.array
        self._fh.close()


class _Filled:
    """Slices ``start : stop`` of the scan as float32, the outside filled as the single run fills it,
    in a nameless file read window by window (what the model reads; ``stop`` is the end of the chunk
    that holds the slab's last slice, which the model computes whole, as the single run does); their
    sample codes into ``codes``, and the outside's counts of the slab's own slices
    ``own[0] : own[1]`` (those before are the warm-up, another slab's)."""

    def __init__(self, scan, plan: SplitPlan, start: int, own: tuple[int, int], stop: int,
                 codes: Optional[_Codes]):
        self.shape, self.start = tuple(plan.shape), start
        _, ny, nx = self.shape
        self._fh = tempfile.TemporaryFile(prefix=".ctpore-split-scan-", dir=plan.work)
        self.array = np.memmap(self._fh, dtype=np.float32, mode="w+", shape=(stop - start, ny, nx))
        mask = SampleMask(codes, {}, level=solid_level(plan.fit)) if codes is not None else None
        self.counts = {"outside": 0, "region": 0, "wall": 0}
        for g0 in range(start // CODE_SLABS * CODE_SLABS, stop, CODE_SLABS):  # the single run's code slabs
            g1 = min(self.shape[0], g0 + CODE_SLABS)
            raw = np.asarray(scan[g0:g1], np.float32)
            a, b = max(g0, start), min(g1, stop)
            part = raw[a - g0: b - g0]
            if codes is not None:
                got, counts = plan.fit.outside(raw, g0, plan.margin)
                codes.array[a - start: b - start] = got[a - g0: b - g0]
                if own[0] <= g0 < own[1]:  # (slabs start on code slabs: a group is the slab's own or not at all)
                    self.counts["outside"] += int(np.count_nonzero(got))
                    self.counts["region"] += counts["region"]
                    self.counts["wall"] += counts["wall"]
                part = mask.fill(a, b, part)  # slice by slice, as the single run fills
            self.array[a - start: b - start] = part

    def read_window(self, z0: int, z1: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        return np.array(self.array[z0 - self.start: z1 - self.start, y0:y1, x0:x1])

    def __getitem__(self, key: slice) -> np.ndarray:
        return np.array(self.array[key.start - self.start: key.stop - self.start])

    def close(self) -> None:
        del self.array
        self._fh.close()


def predict_slab(plan: SplitPlan, za: int, zb: int) -> dict:
    """Step 1 on a worker: the slab's raw probabilities and sample codes into named files, then its
    record (the outside's counts, the clipped voxels, the kernels that ran); a slab with a record
    is done and not computed again."""
    from ctpore.pipelines.stream import predict
    from ctpore.pipelines.stream_plan import warm_up

    record = plan.file("record", za, zb)
    if record.exists():  # done by an earlier, interrupted run
        return {**json.loads(record.read_text()), "done_before": True}
    wall, cpu = time.perf_counter(), time.process_time()
    predictor = slab_predictor(plan.weights, plan.device, plan.attention_backend)
    early = warm_up(predictor.model, predictor.device)
    start = 0 if early is None else max(0, za - early) // plan.chunk * plan.chunk
    _, ny, nx = plan.shape
    stop = min(plan.shape[0], -(-zb // plan.chunk) * plan.chunk)  # the chunk holding zb - 1 is run whole
    codes = _Codes(Path(plan.work), start, stop, (ny, nx)) if plan.fit is not None else None
    out = {"backend": None, "clipped": 0, "warm_up_slices": za - start}
    try:
        with load_scan(plan.scan, slice_axis=plan.slice_axis) as scan:
            src = _Filled(scan, plan, start, (za, zb), stop, codes)
        try:
            raw_path = plan.file("raw", za, zb)
            with atomic_write(raw_path) as tmp:
                prob = np.memmap(tmp, dtype=np.float32, mode="w+", shape=(zb - za, ny, nx))
                if plan.contrast:
                    view = NormalizedVolume(src, plan.lo, plan.hi)
                    predictor.model.reset_backends_ran()
                    predict(predictor.model, view, chunk_slices=plan.chunk, tile=plan.tile, device=predictor.device,
                            out=prob, precision=plan.precision, z_range=(za, zb))
                    out["backend"] = predictor.model.backend_calls()
                    if view.saw_clipping:
                        out["clipped"] = count_clipped(src.array[za - start: zb - start], plan.lo, plan.hi)
                prob.flush()
                del prob
            out.update(src.counts)
        finally:
            src.close()
        if codes is not None:
            with atomic_write(plan.file("codes", za, zb)) as tmp:
                tmp.write_bytes(np.ascontiguousarray(codes.array[za - start: zb - start]).tobytes())
    finally:
        if codes is not None:
            codes.close()
    out["seconds"] = round(time.perf_counter() - wall, 3)
    out["cpu_seconds"] = round(time.process_time() - cpu, 3)  # this worker's process, all its threads
    write_json_atomic(record, out)  # last: the slab is done
    return out


def _read(plan: SplitPlan, kind: str, a: int, b: int) -> np.ndarray:
    za, zb = plan.slab_of(a)
    _, ny, nx = plan.shape
    dtype = np.float32 if kind == "raw" else np.uint8
    n = (b - a) * ny * nx
    return np.fromfile(plan.file(kind, za, zb), dtype=dtype, count=n,
                       offset=(a - za) * ny * nx * np.dtype(dtype).itemsize).reshape(b - a, ny, nx)


def _span(plan: SplitPlan, kind: str, a: int, b: int) -> np.ndarray:
    """Slices ``a:b`` of ``kind``, read from every slab they reach."""
    parts = []
    while a < b:
        zb = plan.slab_of(a)[1]
        parts.append(_read(plan, kind, a, min(b, zb)))
        a = min(b, zb)
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def read_raw(plan: SplitPlan, a: int, b: int) -> np.ndarray:
    """Raw probabilities of slices ``a:b`` (within one slab), the outside and the surface's rim
    cleared as the single run clears them (the rim read with a halo from the slabs beside)."""
    if plan.fit is None:
        return _read(plan, "raw", a, b).copy()
    return cleared(functools.partial(_span, plan, "raw"), functools.partial(_span, plan, "codes"), a, b, plan.shape[0])


def write_slab(plan: SplitPlan, a: int, b: int, pores: np.ndarray, prob: np.ndarray) -> dict:
    """Step 3 on a worker: slices ``a:b``'s outputs into the stores; their metrics' summaries."""
    codes = _read(plan, "codes", a, b) if plan.fit is not None else None
    inside = None if codes is None else codes == 0
    plan.stores["pores"].write(a, pores)
    plan.stores["prob"].write(a, prob)
    rim = RimCheck()
    if inside is not None:
        plan.stores["sample"].write(a, inside.view(np.uint8))
        for z in range(a + (-a) % 8, b, 8):  # every 8th slice of a found sample, as the single run
            rim.add(pores[z - a], codes[z - a])
    summary = MetricsAccumulator(plan.shape, plan.spacing_mm).summarize(pores, prob, None, inside)
    picture = inside[plan.middle - a].copy() if inside is not None and a <= plan.middle < b else None
    return {"metrics": summary, "rim": rim.counts, "picture": picture}


