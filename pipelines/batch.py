"""``ctpore batch``: many scans through ``reconstruct_file`` on a Dask cluster, resumable.

One task per scan, each a call of :func:`ctpore.pipelines.reconstruct.reconstruct_file` on a Dask
worker (weights loaded once per worker process and kept); where whole scans would leave workers
idle (fewer scans than workers, or the last, partial round of scans), those scans are split into
Z-slabs across all the workers, one at a time (:mod:`ctpore.pipelines.batch_split`, where
:func:`split_options` allows it). Dask places the tasks; this module
reads the manifest, checks everything that can be checked before any work, skips scans already
done, and writes ``OUTDIR/batch_report.jsonl``: one line per scan as it ends (scan, status,
metrics or error, seconds, worker, attempts, the warnings the scan raised, when it ended), and
``OUTDIR/batch_summary.csv``, one row per scan with its latest attempt
(:mod:`ctpore.pipelines.batch_summary`). A scan with bad input fails alone, with its
one-line error; the others go on. A scan whose outputs another run holds (another batch driver on
the same manifest and folder, a ``ctpore reconstruct``: :func:`~ctpore.pipelines.claims.claim_outputs`)
is not done here and reported as ``held`` (by whom), not failed; a scan that another run finished
meanwhile is ``skipped``, so two drivers do every scan once. A scan whose worker died is tried again, up to ``retries``
times. A run killed part-way loses nothing finished (every output is written whole or not at
all, the metrics last) and the next run picks up where it stopped.

Clusters
--------
No scheduler address: a ``LocalCluster`` on 127.0.0.1, one worker process per CPU worker asked
for, or one worker per GPU when CUDA is present (dask-cuda's ``LocalCUDACluster`` where
installed), each GPU worker holding the resource ``GPU=1`` so that a GPU takes one scan at a
time. With an address (``tcp://host:8786``): that cluster, e.g. one started by dask-jobqueue on
SLURM; workers started with ``--resources GPU=1`` get one scan per GPU. No CUDA context is
made in this (driver) process.

Talking as it goes
------------------
The callers hear of every event as it happens: ``on_record`` as each scan ends, ``on_retry``
when a scan's worker died and it is tried again, ``on_start`` once the cluster is up (with the
dashboard's address). Dask's own logs stay at WARNING (driver and local workers) unless
``verbose``, and the scheduler's ERRORs for work lost with a dead worker (a task it ran, a result it
held) are left out, since the retry is reported here and Dask computes a lost result again
(:func:`ctpore.pipelines.batch_logs.quiet_dask`). Warnings a scan raises on its
worker come back in its record (``warnings``) for the caller to show.
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

from ctpore.errors import InputError
from ctpore.pipelines.batch_cluster import cuda_count, require_cluster, start_cluster
from ctpore.pipelines.batch_logs import quiet_dask, warning_records
from ctpore.pipelines.batch_manifest import ScanTask, check_stem_collisions, read_manifest, select_part
from ctpore.pipelines.batch_split import SplitScans, scans_to_split
from ctpore.pipelines.batch_summary import BatchSummary
from ctpore.pipelines.output_formats import DEFAULT_OUTPUT_FORMAT
from ctpore.progress import ProgressFn

__all__ = ["run_batch", "run_task", "split_options", "summarize", "REPORT_NAME", "STATUSES"]

REPORT_NAME = "batch_report.jsonl"

#: How a scan of a batch ends: done here, skipped (outputs complete from an earlier or another run),
#: held (another run is writing its outputs), failed.
STATUSES = ("done", "skipped", "held", "failed")


def _options_key(options: dict, weights_sha: Optional[str]) -> dict:
    """What a finished scan's metrics must record to count as done by these options."""
    return {"method": options.get("method"), "weights_sha256": weights_sha,
            "precision": options.get("precision"), "device_type": str(options.get("device", "cpu")).split(":")[0],
            "sample": options.get("sample", "auto"),
            **({"sample_margin": m} if (m := options.get("sample_margin", 0)) else {}),
            **({"analyze": True} if options.get("analyze") or options.get("flow") else {}),
            **({"flow": True} if options.get("flow") else {}),
            **({"output_format": fmt} if (fmt := options.get("output_format", DEFAULT_OUTPUT_FORMAT))
               != DEFAULT_OUTPUT_FORMAT else {})}


def _is_done(task: ScanTask, outdir: Path, key: dict) -> Optional[dict]:
    """The metrics of a scan already reconstructed with the same weights and options, or None."""
    from ctpore.pipelines.outputs import output_paths

    paths = output_paths(task.scan, outdir, key.get("output_format", DEFAULT_OUTPUT_FORMAT))
    if not all(paths[k].exists() for k in ("pores", "prob", "metrics")):
        return None
    try:
        metrics = json.loads(paths["metrics"].read_text())
    except (OSError, ValueError):
        return None
    if (metrics.get("sample") or {}).get("outside_voxels") and not paths["sample"].exists():
        return None  # its sample mask is missing
    batch = metrics.get("batch", {})
    if batch.get("options") != key or batch.get("label") != task.label or batch.get("slice_axis") != task.slice_axis \
            or batch.get("mask") != task.mask:
        return None
    return metrics


def split_options(task: ScanTask, options: dict) -> Optional[dict]:
    """The keyword arguments of :func:`~ctpore.pipelines.split.reconstruct_split` for ``task``, or None
    where a split run cannot take the scan as these options ask (another method, a label, a mask,
    the analysis, a folder for temporaries, a GPU memory cap)."""
    if (options.get("method") != "poreformer" or task.label or task.mask or options.get("analyze")
            or options.get("flow") or options.get("tmp_dir") or options.get("gpu_memory_gb") is not None):
        return None
    taken = ("weights", "device", "memory_gb", "precision", "attention_backend", "min_pore_voxels", "sample",
             "sample_margin", "output_format", "chunk_slices", "tile")
    return {k: options[k] for k in taken if options.get(k) is not None}


def run_task(task: ScanTask, outdir: str, options: dict, key: dict, client: Any = None,
             slab_resources: Optional[dict] = None) -> dict:
    """Reconstruct one scan (on a worker; or, with ``client``, split across its workers from the
    driver: :func:`split_options` says whether it can; each slab's prediction holding
    ``slab_resources``, a GPU worker's ``{"GPU": 1}``). Never raises for the scan's own problems:
    returns the record of the report line (``status`` "done" with the metrics, "skipped" when
    another run finished it meanwhile, "held" with the ``holder`` when another run is writing it, or
    "failed" with the error). The scan's outputs are claimed before they are checked again and
    written."""
    import socket

    from ctpore.pipelines.claims import OutputsHeld, claim_outputs
    from ctpore.pipelines.outputs import output_paths
    from ctpore.pipelines.reconstruct import reconstruct_file

    t0 = time.perf_counter()
    rec: dict[str, Any] = {"scan": task.scan, "worker": f"{socket.gethostname()}:{os.getpid()}"}
    with warnings.catch_warnings(record=True) as caught:  # they go back with the record, for the driver to show
        warnings.simplefilter("always")
        try:
            opts = {**options, **({"sample": Path(task.mask)} if task.mask else {})}
            paths = output_paths(task.scan, outdir, options.get("output_format", DEFAULT_OUTPUT_FORMAT))
            with claim_outputs(paths):  # reconstruct_file's claim is this one
                done = _is_done(task, Path(outdir), key)  # by another driver since this one looked
                if done is not None:
                    rec.update(status="skipped", reason="outputs complete from another run", metrics=done)
                else:
                    annotate = {"batch": {"options": key, "label": task.label, "slice_axis": task.slice_axis,
                                          "mask": task.mask}}
                    if client is not None:
                        from ctpore.pipelines.split import reconstruct_split

                        out = reconstruct_split(task.scan, outdir, client, slice_axis=task.slice_axis, overwrite=True,
                                                annotate=annotate, slab_resources=slab_resources,
                                                **split_options(task, options))
                    else:
                        out = reconstruct_file(task.scan, outdir, truth=task.label, slice_axis=task.slice_axis,
                                               overwrite=True, annotate=annotate, **opts)
                    rec.update(status="done", metrics=out["result"])
        except OutputsHeld as exc:
            rec.update(status="held", reason=str(exc), holder=exc.holder)
        except InputError as exc:
            rec.update(status="failed", error=str(exc))
        except Exception as exc:  # an internal error: reported for this scan, the batch goes on
            rec.update(status="failed", error=f"internal error: {type(exc).__name__}: {exc}")
            if client is not None:
                from distributed import KilledWorker

                rec["worker_lost"] = isinstance(exc, KilledWorker)  # a slab's worker died: run again
    if caught:
        rec["warnings"] = warning_records(caught)
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    rec["ended"] = _now()
    return rec


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def _lock(fh, take: bool = True) -> None:
    """Take (or give back) an exclusive advisory lock on an open file, where the system has them."""
    try:
        import fcntl
    except ImportError:  # Windows: appends stay unlocked
        return
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX if take else fcntl.LOCK_UN)
    except OSError:  # a file system without locks: the append goes ahead as before
        pass


class _Report:
    """``batch_report.jsonl``: one line per ended scan, appended and flushed to disk at once."""

    def __init__(self, path: Path):
        self.path = path
        self.records: list[dict] = []

    def add(self, rec: dict) -> None:
        self.records.append(rec)
        line = json.dumps(rec, default=float) + "\n"
        with open(self.path, "a+b") as fh:
            _lock(fh)  # other drivers sharing the folder append between the check and the write
            try:
                # a run killed while writing its line left it without an end: end it first, or
                # this record would be glued to it and read as one line that does not parse
                if fh.seek(0, os.SEEK_END) > 0:
                    fh.seek(-1, os.SEEK_END)
                    if fh.read(1) != b"\n":
                        line = "\n" + line
                fh.write(line.encode())
                fh.flush()
                os.fsync(fh.fileno())
            finally:
                _lock(fh, False)


def run_batch(
    manifest: str | os.PathLike,
    outdir: str | os.PathLike,
    *,
    scheduler: Optional[str] = None,
    workers: int = 2,
    gpus_per_worker: int = 1,
    retries: int = 2,
    part: Optional[str] = None,
    options: Optional[dict] = None,
    progress: ProgressFn = None,
    on_record: Optional[Callable[[dict], None]] = None,
    on_start: Optional[Callable[[dict], None]] = None,
    on_retry: Optional[Callable[[dict], None]] = None,
    verbose: bool = False,
) -> dict:
    """Reconstruct every scan of ``manifest`` into ``outdir`` on a Dask cluster (see the module docstring).

    Parameters
    ----------
    options : dict, optional
        Keyword arguments of ``reconstruct_file`` for every scan (``method``, ``weights``,
        ``memory_gb``, ``precision``, ...).
    on_record : callable, optional
        Called with each report record as its scan ends (also written to the report and the
        summary by then).
    on_start : callable, optional
        Called once the work starts, with ``{"dashboard", "todo", "skipped"}`` (the dashboard's
        address, None without a cluster).
    on_retry : callable, optional
        Called when a scan's worker died and the scan is tried again, with ``{"scan",
        "attempt", "of", "error"}`` (``attempt`` of at most ``of``).
    verbose : bool
        Dask's own logs at INFO and unfiltered (default: WARNING, see
        :func:`~ctpore.pipelines.batch_logs.quiet_dask`).

    Returns
    -------
    dict
        ``{"records": [...], "done", "skipped", "held", "failed", "dashboard"}`` (counts of each status).
    """
    from ctpore.models.weights import sha256_file, weights_dir
    from ctpore.pipelines.methods import get_method, resolve_method

    from ctpore.pipelines.disk import check_tmp_dir

    require_cluster()
    manifest = Path(manifest)
    outdir = Path(outdir)
    options = dict(options or {})
    check_tmp_dir(options.get("tmp_dir"))
    if workers < 1 or retries < 0 or gpus_per_worker < 1:
        raise InputError("--workers and --gpus-per-worker must be >= 1 and --retries >= 0")
    tasks = select_part(read_manifest(manifest), part)
    check_stem_collisions(tasks, manifest)
    method = resolve_method(options.get("method", "auto"), options.get("weights"))
    weights_sha = None
    spec = get_method(method)
    if spec.weights is not None:  # a learned method: the weights that made the outputs decide what is done
        wpath = options.get("weights") or weights_dir() / spec.weights
        if not Path(wpath).is_file():
            raise InputError("no such weights file", wpath)
        weights_sha = sha256_file(wpath)
    options["method"] = method
    key = _options_key(options, weights_sha)
    from ctpore.pipelines.claims import clear_stale_lock
    from ctpore.pipelines.outputs import check_outputs, make_outdir, output_paths

    check_outputs(manifest, outdir, overwrite=True)  # a writable place, before any work
    make_outdir(outdir)
    report = _Report(outdir / REPORT_NAME)
    summary = BatchSummary(outdir, report.path)

    def ended(rec: dict) -> None:  # a scan ended: the report, the summary, the caller
        report.add(rec)
        summary.update(rec)
        if on_record is not None:
            on_record(rec)

    result = {"records": report.records, **{k: 0 for k in STATUSES}, "dashboard": None}
    try:
        todo: list[ScanTask] = []
        for t in tasks:
            metrics = _is_done(t, outdir, key)
            if metrics is None:
                todo.append(t)
            else:
                result["skipped"] += 1
                # of a run killed as it ended
                fmt = options.get("output_format", DEFAULT_OUTPUT_FORMAT)
                clear_stale_lock(output_paths(t.scan, outdir, fmt))
                ended({"scan": t.scan, "status": "skipped", "reason": "outputs complete from an earlier run",
                       "metrics": metrics, "ended": _now()})
        if not todo:
            if on_start is not None:
                on_start({"dashboard": None, "todo": 0, "skipped": result["skipped"]})
            return result
        with quiet_dask(verbose):
            _run_tasks(todo, outdir, options, key, result, ended, scheduler=scheduler, workers=workers,
                       gpus_per_worker=gpus_per_worker, retries=retries, verbose=verbose, progress=progress,
                       on_start=on_start, on_retry=on_retry)
    finally:
        summary.write()
    return result


def _run_tasks(todo, outdir, options, key, result, ended, *, scheduler, workers, gpus_per_worker, retries, verbose,
               progress, on_start, on_retry) -> None:
    """The scans ``todo`` on the cluster: each result to ``ended`` as it comes, a dead worker's scan again."""
    from distributed import as_completed

    client, cluster, gpu = start_cluster(scheduler, workers, gpus_per_worker, verbose)
    try:
        result["dashboard"] = getattr(client, "dashboard_link", None)
        if on_start is not None:
            on_start({"dashboard": result["dashboard"], "todo": len(todo), "skipped": result["skipped"]})
        resources = {"GPU": 1} if gpu else None
        if gpu:
            options.setdefault("device", "cuda")
        attempts: dict[str, int] = {}
        futures = {}
        n_workers = len(client.scheduler_info().get("workers", {}))
        # on GPU workers the driver (this process) plans the slabs' tiles for a GPU: it needs one too
        n_split = scans_to_split(len(todo), n_workers, not gpu or cuda_count() > 0)
        if not all(split_options(t, options) for t in todo[len(todo) - n_split:]):
            n_split = 0
        whole, tail = todo[: len(todo) - n_split], todo[len(todo) - n_split:]
        lock, n_end = threading.Lock(), [0]

        def end(rec: dict) -> None:  # from this thread and the split scans' one
            with lock:
                result[rec["status"] if rec["status"] in STATUSES else "failed"] += 1
                n_end[0] += 1
                ended(rec)
                if progress is not None:
                    progress(n_end[0], len(todo), "scans")

        def submit(t: ScanTask):
            attempts[t.scan] = attempts.get(t.scan, 0) + 1
            f = client.submit(run_task, t, str(outdir), options, key, pure=False, resources=resources,
                              key=f"ctpore-{Path(t.scan).name}-{attempts[t.scan]}-{os.getpid()}")
            futures[f] = t
            return f

        pending = as_completed([submit(t) for t in whole])
        # after the whole scans: their slabs queue behind those tasks
        split = SplitScans(tail, lambda t: run_task(t, str(outdir), options, key, client=client,
                                                    slab_resources=resources), retries, end, on_retry).start()
        try:
            for fut in pending:
                t = futures.pop(fut)
                try:
                    rec = fut.result()
                    fut.release()  # its result is here now: no worker keeps it (nor recomputes it if it dies)
                except Exception as exc:  # the worker died (or the cluster failed) during this scan
                    why = f"{type(exc).__name__}: {exc}"
                    if attempts[t.scan] <= retries:
                        if on_retry is not None:
                            on_retry({"scan": t.scan, "attempt": attempts[t.scan] + 1, "of": retries + 1,
                                      "error": why})
                        pending.add(submit(t))
                        continue
                    rec = {"scan": t.scan, "status": "failed",
                           "error": f"worker lost {attempts[t.scan]} times ({why})", "ended": _now()}
                rec["attempts"] = attempts[t.scan]
                end(rec)
            split.join()
        finally:
            split.stop()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def summarize(records: list[dict]) -> dict:
    """Counts per status and, over the scans with a label, the mean MSE, Dice and Euler error."""
    out: dict[str, Any] = {s: sum(r["status"] == s for r in records) for s in STATUSES}
    from ctpore.data.metrics import summary_keys

    keys = summary_keys("truth")  # the headline comparisons with a label
    scored = [r["metrics"] for r in records if r.get("metrics") and all(k in r["metrics"] for k in keys)]
    for k in keys:
        if scored:
            out[f"mean_{k}"] = sum(m[k] for m in scored) / len(scored)
    return out

