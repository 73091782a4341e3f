"""One scan split into Z-slabs across the workers of a Dask cluster, with a single run's voxels and
metrics (``ctpore reconstruct SCAN -o OUT --workers N``, or ``--scheduler ADDRESS``).

What is global is computed once, by the driver: the sample's fitted shape
(:func:`~ctpore.data.sample.find_sample`), the grey range over the sample's voxels, and the plan of
tiles, chunks and post-processing slabs a single run takes (so that the voxels can be the same).
Slabs start on multiples of the output stores' alignment and of the sample's code slabs; their size
decides only where they start.

1. Each slab's raw probabilities are computed from a warm-up of the model's reach along Z
   (:func:`~ctpore.pipelines.stream_plan.warm_up`), so they hold the single run's bytes. They and
   the slab's sample codes go to named files in a work folder beside the outputs
   (``.<stem>.split/<plan id>/``, the id a hash of everything the bytes depend on), then a record
   of the slab. A rerun after the driver died finds the records of the same plan and computes
   only the slabs that have none; work of another plan is removed, and tasks of a dead driver still
   running write only under their own plan's names. A worker that dies mid-slab has its slab run
   again by the scheduler, from the start, to the same bytes.
2. The post-processing runs on the slabs (:meth:`~ctpore.data.postprocess.Postprocessing.run_split`):
   each rule on whole components takes one join of the slabs' component summaries (a union-find
   on the driver, small).
3. Each slab writes its pores, probability and sample mask into one OME-Zarr store per output, a
   disjoint chunk-aligned region each (:class:`~ctpore.data.io.omezarr_split.SplitStore`), and
   returns the summaries of its metrics, which the driver joins in z order.

The stores take their names when every slab is written, the metrics file last, and the work
folder is removed. The workers and the driver share a file system: the scan, the output folder
and the work folder must be at the same paths on each.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Optional, Union

import numpy as np

from ctpore.atomic import write_json_atomic
from ctpore.data.io import load_scan
from ctpore.data.io.omezarr_split import SplitStore
from ctpore.data.io.omezarr_write import remove_tree
from ctpore.data.metrics import MetricsAccumulator
from ctpore.data.normalize import has_contrast, robust_range, warn_clipped
from ctpore.data.normalize import warn_no_contrast
from ctpore.data.rim import RimCheck
from ctpore.errors import InputError
from ctpore.pipelines.sample_mask import (CODE_SLABS, NO_SURFACE, check_margin, check_outside, sample_info,
                                         warn_margin_not_applied)
from ctpore.pipelines.split_slab import SplitPlan, predict_slab, read_raw, slab_predictor, write_slab
from ctpore.progress import ProgressFn

__all__ = ["reconstruct_split", "split_slabs", "store_to_nifti"]

PathLike = Union[str, os.PathLike]

#: Slices of the finest chunks of a split run's stores (their alignment, :class:`SplitStore`).
STORE_ALIGN = 64


def split_slabs(nz: int, align: int, slab_slices: int) -> list[tuple[int, int]]:
    """The slabs of ``nz`` slices: ``slab_slices`` each (rounded up to a multiple of ``align``), the
    last what is left.

    Examples
    --------
    >>> split_slabs(150, 16, 40)
    [(0, 48), (48, 96), (96, 144), (144, 150)]
    """
    step = max(1, -(-int(slab_slices) // align)) * align
    return [(z, min(nz, z + step)) for z in range(0, nz, step)]


# -- on the driver ----------------------------------------------------------------------------------


class _FitOutside:
    """The outside (bool) of any slice, computed from the fit as the single run computes its codes:
    slice by slice where the fit's shape is (a cylinder, a constant or dark outside), else (an
    outline, voted over a code slab's slices) on the code slab of :data:`CODE_SLABS` slices that
    holds it, the last slab kept."""

    def __init__(self, scan, fit, margin: int):
        self.scan, self.fit, self.margin, self.shape = scan, fit, margin, tuple(scan.shape)
        self.block = CODE_SLABS if fit.envelope.kind == "outline" else 1
        self._slab: Optional[tuple[int, np.ndarray]] = None

    def __getitem__(self, key: slice) -> np.ndarray:
        z = key.start
        g0 = z // self.block * self.block
        if self._slab is None or self._slab[0] != g0 or key.stop > g0 + len(self._slab[1]):
            g1 = min(self.shape[0], max(key.stop, g0 + self.block))
            raw = np.asarray(self.scan[g0:g1], np.float32)
            self._slab = (g0, self.fit.outside(raw, g0, self.margin)[0] > 0)
        g0, out = self._slab
        return out[z - g0: key.stop - g0]

    def covers_all(self) -> bool:
        """Whether the outside covers every slice (one pass over the scan, by code slabs; it stops
        at the first slab with a sample voxel)."""
        for g0 in range(0, self.shape[0], CODE_SLABS):
            if not self[g0: min(self.shape[0], g0 + CODE_SLABS)].all():  # (an outline: the code slab whole)
                return False
        return True


def _dask_map(client, progress: ProgressFn = None, stage: str = "", resources: Optional[dict] = None):
    """``run(fn, items)``: ``fn`` of every item on ``client``'s workers, each task holding
    ``resources`` (Dask's worker resources, e.g. ``{"GPU": 1}``) while it runs; the results in order."""
    def run(fn, items):
        from distributed import as_completed

        futures = client.map(fn, list(items), pure=False, resources=resources,
                             key=f"ctpore-{stage.replace(' ', '-') or 'task'}")
        try:
            if progress is not None:
                progress(0, len(futures), stage)  # the clock of the time left starts now
            for i, _ in enumerate(as_completed(futures)):
                if progress is not None:
                    progress(i + 1, len(futures), stage)
            return client.gather(futures)
        except BaseException:  # a slab failed, or the run was interrupted: the other slabs stop
            client.cancel(futures)
            raise
    return run


def store_to_nifti(store: Path, dest: Path, geometry, dtype, spool: Path) -> None:
    """Stream a finished store's full-resolution level into a NIfTI (whole or not at all)."""
    import zarr

    from ctpore.data.io.write import volume_writer

    level = zarr.open_group(str(store), mode="r")["0"]
    nz, ny, nx = level.shape
    step = max(1, (64 << 20) // (np.dtype(dtype).itemsize * ny * nx))
    with volume_writer(dest, geometry, dtype, spool_dir=spool) as writer:
        for z in range(0, nz, step):
            writer.write(np.asarray(level[z: z + step]))


def _scan_stamp(path: Path) -> tuple[int, int]:
    """The scan's bytes and last change (ns): of the file, or of a folder and the entries in it (a
    folder of slices: a slice rewritten in place changes its own time, not the folder's)."""
    stats = [path.stat()] + ([p.stat() for p in path.iterdir()] if path.is_dir() else [])
    return sum(st.st_size for st in stats), max(st.st_mtime_ns for st in stats)


def _earlier_slabs(root: Path, key: dict) -> Optional[list[tuple[int, int]]]:
    """The slabs of an interrupted run of the same plan but for its slabs (its default slab size
    followed the workers there were then), so that a rerun keeps the slabs it recorded."""
    for f in sorted(root.glob("*/plan.json")) if root.is_dir() else ():
        try:
            earlier = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(earlier, dict) and {k: v for k, v in earlier.items() if k != "slabs"} == key:
            return [(int(a), int(b)) for a, b in earlier["slabs"]]
    return None


def _prepare_work(plan: SplitPlan, root: Path) -> None:
    """The plan's work folder (``root/<plan id>``), kept from an interrupted run of the same plan (its
    recorded slabs are done), else new. Work of other plans is removed: their folders and unfinished
    stores have other names, so a task of an earlier driver still running writes nothing of this run."""
    work = Path(plan.work)
    try:
        same = json.loads((work / "plan.json").read_text()) == plan.key
    except (OSError, ValueError):
        same = False
    for p in list(root.iterdir()) if root.is_dir() else ():
        if p != work or not same:
            remove_tree(p)
    for store in plan.stores.values():
        for p in store.others():
            remove_tree(p)
    if not same:
        for store in plan.stores.values():
            store.discard()
        work.mkdir(parents=True, exist_ok=True)
        write_json_atomic(work / "plan.json", plan.key)
    for store in plan.stores.values():
        store.create()


@contextlib.contextmanager
def _removed_on_bad_input(work: Path, stores: dict):
    """The work folder and the unfinished stores, removed when the run ends on bad input (an
    :class:`InputError`: the scan cannot be read or changed under the run, which no rerun could take
    up; or the disk filled, which this frees); kept on any other failure or interrupt, for the rerun
    that finishes them."""
    try:
        yield
    except InputError:
        for store in stores.values():
            store.discard()
        remove_tree(work)
        raise


def reconstruct_split(scan_path: PathLike, outdir: PathLike, client, *, weights: Optional[PathLike] = None,
                      device: str = "cpu", slice_axis: Optional[int] = None, memory_gb: float = 1.5,
                      precision: str = "auto", attention_backend: Optional[str] = None,
                      min_pore_voxels: Optional[int] = None, sample: str = "auto", sample_margin: int = 0,
                      overwrite: bool = False, slab_slices: Optional[int] = None, chunk_slices: Optional[int] = None,
                      tile: Optional[int] = None, progress: ProgressFn = None, annotate: Optional[dict] = None,
                      output_format: str = "ome-zarr", slab_resources: Optional[dict] = None) -> dict:
    """Reconstruct one scan file with PoreFormer split into Z-slabs across ``client``'s workers (see
    the module docstring). ``slab_slices``: slices a slab (default: eight times the model's reach,
    rounded up to the stores' alignment, at least 1/2 of the slices per worker). ``output_format``:
    ``ome-zarr`` (the stores the slabs write), or ``nifti``: the stores are written in the work folder
    and the driver then streams each into its ``.nii.gz``, one serial pass (``stage_seconds.nifti``).
    ``slab_resources``: the Dask worker resources each slab's prediction holds while it runs (on a
    cluster of GPU workers ``{"GPU": 1}``: one slab per GPU at a time; the other steps are the CPU's).
    Other parameters as :func:`~ctpore.pipelines.reconstruct.reconstruct_file`.

    Returns
    -------
    dict
        ``{"pores": Path, "prob": Path, "metrics": Path, "sample": Path, "result": metrics dict}``.
    """
    from ctpore.pipelines.budget import plan_run
    from ctpore.pipelines.claims import claim_run
    from ctpore.pipelines.outputs import check_outputs, finish_metrics, other_format_outputs, output_set
    from ctpore.pipelines.reconstruct_run import run_metrics
    from ctpore.pipelines.sample_picture import write_sample_picture
    from ctpore.pipelines.stream_plan import warm_up
    from ctpore.data.sample import find_sample

    t0 = time.perf_counter()
    margin = check_margin(sample_margin)
    if not isinstance(sample, str) or sample not in ("auto", "all"):
        raise InputError("a scan split across workers finds its sample (--sample auto) or takes every voxel "
                         "(--sample all); for your own mask, run it in one process")
    paths = check_outputs(scan_path, outdir, overwrite, output_format)
    stem = Path(paths["metrics"]).name[: -len("_metrics.json")]
    work = Path(outdir) / f".{stem}.split"
    nifti = output_format != "ome-zarr"
    source = str(scan_path)
    with claim_run(paths, overwrite, None, keep_split_work=True) as disk, \
            load_scan(scan_path, slice_axis=slice_axis) as scan:
        predictor = slab_predictor(None if weights is None else str(weights), device, attention_backend)
        disk.check(scan, predictor, memory_gb=memory_gb, tile=tile, chunk_slices=chunk_slices, sample=sample,
                   precision=precision)
        geometry, shape = scan.geometry, tuple(int(s) for s in scan.shape)
        stages: dict = {}
        units_known = getattr(geometry, "units", "mm") != "unknown"
        fit = find_sample(scan, geometry.spacing_mm) if sample == "auto" else None
        outside_fit = fit if fit is not None and fit.has_outside else None
        if outside_fit is None:  # every voxel is sample: no surface to erode a margin from
            warn_margin_not_applied(margin, source, NO_SURFACE["all" if sample == "all" else "border"])
        outside = _FitOutside(scan, outside_fit, margin) if outside_fit else None
        lo, hi = robust_range(scan, outside=outside)
        if outside is not None and lo == hi == 0.0 and outside.covers_all():  # (no sample voxel in the range's slices)
            check_outside({"outside_voxels": int(np.prod(shape))}, shape, source)  # refused before any slab runs
        if not has_contrast(lo, hi):
            warn_no_contrast(lo)
        stages["sample_and_range"] = round(time.perf_counter() - t0, 3)
        kinds = [(k, t) for k, t in (("pores", np.uint8), ("prob", np.float32), ("sample", np.uint8))
                 if k != "sample" or outside_fit is not None]
        align = math.lcm(CODE_SLABS, *(SplitStore(work / f"{k}.ome.zarr", geometry, t, align=STORE_ALIGN).alignment
                                       for k, t in kinds))
        reach = warm_up(predictor.model, predictor.device) or shape[0]
        workers = max(1, len(client.scheduler_info().get("workers", {})))
        run_plan = plan_run(shape, predictor, memory_gb, None, tile=tile, chunk_slices=chunk_slices,
                            precision=precision)
        post = predictor.post.with_user_rules(min_pore_voxels)
        size, mtime = _scan_stamp(Path(scan_path))
        key = {"scan": str(Path(scan_path).resolve()), "scan_bytes": size, "scan_mtime_ns": mtime,
               "slice_axis": slice_axis, "shape": list(shape), "lo": lo, "hi": hi,
               "weights": predictor.info["model"]["sha256"], "device": str(device),
               "attention_backend": attention_backend, "precision": precision, "tile": run_plan.tile,
               "chunk": run_plan.chunk_slices, "margin": margin, "sample": sample, "post": post.describe(),
               "output_format": output_format,
               "fit": None if outside_fit is None else outside_fit.describe(units_known)}
        slabs = (None if slab_slices else _earlier_slabs(work, key)) or split_slabs(
            shape[0], align, slab_slices or max(8 * reach, -(-shape[0] // (2 * workers))))
        key["slabs"] = [list(ab) for ab in slabs]
        tag = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
        plan_dir = work / tag
        stores = {k: SplitStore(plan_dir / f"{k}.ome.zarr" if nifti else paths[k], geometry, t, align=STORE_ALIGN,
                                tag=tag) for k, t in kinds}
        plan = SplitPlan(
            scan=key["scan"], slice_axis=slice_axis, shape=shape, spacing_mm=geometry.spacing_mm,
            weights=None if weights is None else str(weights), device=str(device),
            attention_backend=attention_backend, precision=precision,
            tile=run_plan.tile, chunk=run_plan.chunk_slices, sub=run_plan.slab, lo=lo, hi=hi, fit=outside_fit,
            margin=margin, post=post, work=str(plan_dir), stores=stores, slabs=slabs, middle=shape[0] // 2, key=key)
        with output_set(paths), _removed_on_bad_input(work, stores):
            _prepare_work(plan, work)
            clock = time.perf_counter()
            done = _dask_map(client, progress, "slabs", slab_resources)(lambda ab: predict_slab(plan, *ab), slabs)
            stages["predict"] = round(time.perf_counter() - clock, 3)
            clock, cpu = time.perf_counter(), time.process_time()
            counts = tuple(sum(d[k] for d in done) for k in ("outside", "region", "wall"))
            info_sample = (sample_info(outside_fit, units_known, counts, margin) if outside_fit is not None
                           else sample_info(fit, units_known))
            check_outside(info_sample, shape, source)
            clipped = sum(d["clipped"] for d in done)
            if clipped:
                warn_clipped(clipped, int(np.prod(shape)), lo, hi)
            cuts = [(a, min(a + plan.sub, zb)) for za, zb in slabs for a in range(za, zb, plan.sub)]
            groups = [[i for i, (a, _) in enumerate(cuts) if za <= a < zb] for za, zb in slabs]
            post = plan.post
            results = post.run_split(functools.partial(read_raw, plan), cuts, functools.partial(write_slab, plan),
                                     map_fn=_dask_map(client, progress, "post-processing slabs"), groups=groups)
            acc, rim, picture = MetricsAccumulator(shape, geometry.spacing_mm), RimCheck(), None
            for r in results:
                acc.join(r["metrics"])
                rim.counts += r["rim"]
                picture = r["picture"] if r["picture"] is not None else picture
            calls = collections.Counter()
            for d in done:
                calls.update(d["backend"] or {})
            info = {**predictor.info, "attention_backend": "+".join(k for k, _ in calls.most_common()) or None,
                    "precision": _precision_name(precision, predictor.device) if plan.contrast else None}
            metrics = run_metrics(acc, geometry, predictor.name, info, clipped=clipped, post=post, sample=info_sample,
                                  fit=outside_fit, rim=rim, source=source, truth=False)
            stages["postprocess_and_write"] = round(time.perf_counter() - clock, 3)
            metrics["stage_seconds"] = stages
            metrics["split"] = {"slabs": len(slabs), "slab_slices": slabs[0][1] - slabs[0][0], "workers": workers,
                                "slabs_done_before": sum(bool(d.get("done_before")) for d in done),
                                "warm_up_slices": sum(d["warm_up_slices"] for d in done),
                                "slab_warm_up_slices": [d["warm_up_slices"] for d in done],
                                "slab_seconds": [d["seconds"] for d in done],
                                "slab_cpu_seconds": [d["cpu_seconds"] for d in done],
                                # the driver's CPU while the slabs post-process and write, and it joins them
                                "join_cpu_seconds": round(time.process_time() - cpu, 3)}
            for store in stores.values():
                store.finish()
            if nifti:  # one serial pass: each store into its NIfTI
                clock = time.perf_counter()
                for kind, store in stores.items():
                    store_to_nifti(store.path, paths[kind], geometry, store.dtype, plan_dir)
                stages["nifti"] = round(time.perf_counter() - clock, 3)
            if picture is not None:
                grey = np.asarray(scan[plan.middle: plan.middle + 1], np.float32)[0]
                write_sample_picture(paths["sample_png"], grey, picture, lo, hi)
            stale = other_format_outputs(paths) + ([paths["sample"], paths["sample_png"]]
                                                   if not metrics["sample"]["outside_voxels"] else [])
            for p in stale:  # an earlier run's (--overwrite): the files of a stem are one run's
                remove_tree(p)
            from ctpore.version import __version__

            finish_metrics(metrics, geometry, source)
            metrics["seconds"] = round(time.perf_counter() - t0, 3)
            metrics["ctpore_version"] = __version__
            metrics.update(annotate or {})
            write_json_atomic(paths["metrics"], metrics)  # last: its presence means the set is whole
            remove_tree(work)
    return {**paths, "result": metrics}


def _precision_name(precision: str, device) -> str:
    from ctpore.pipelines.precision import precision_name

    return precision_name(precision, device)
