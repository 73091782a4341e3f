"""The Dask cluster ``ctpore batch`` runs on: the distributed scheduler checked for, a local cluster
(one worker per CPU worker asked for, or per GPU) or a given scheduler's, with no CUDA context made
in the driver process."""

from __future__ import annotations

import logging
import os
from typing import Optional

from ctpore.errors import InputError

__all__ = ["require_cluster", "start_cluster", "cuda_count"]


def require_cluster() -> None:
    """Refuse (:class:`InputError` with the pip command) when Dask's distributed scheduler, which
    ``ctpore batch`` runs on (the ``cluster`` extra), is not installed."""
    try:
        import dask  # noqa: F401
        import distributed  # noqa: F401
    except ImportError as exc:
        raise InputError(f"ctpore batch runs on Dask's distributed scheduler, which is not installed here ({exc}); "
                         "install it with: pip install 'dask[distributed]>=2024.1' (or install ctpore with its "
                         "cluster extra: pip install '.[cluster]' in its folder)") from None


def start_cluster(scheduler: Optional[str], workers: int, gpus_per_worker: int, verbose: bool = False,
                  retries: int = 0, log_level: Optional[int] = None):
    """``(client, cluster or None, gpu)``: a client of the given scheduler or of a local cluster
    (whose workers log at WARNING, INFO when ``verbose``, or at ``log_level``). ``retries``: how
    often the local scheduler runs a task again whose worker died (batch retries worker deaths
    itself: 0)."""
    import dask
    from distributed import Client, LocalCluster

    if scheduler:
        client = Client(scheduler, timeout="30s")
        info = client.scheduler_info()
        gpu = any("GPU" in (w.get("resources") or {}) for w in info.get("workers", {}).values())
        return client, None, gpu
    gpus = cuda_count()
    dask.config.set({"distributed.scheduler.allowed-failures": int(retries)})
    quiet = {"silence_logs": log_level if log_level is not None else logging.INFO if verbose else logging.WARNING}
    if gpus:
        try:
            from dask_cuda import LocalCUDACluster

            cluster = LocalCUDACluster(host="127.0.0.1", dashboard_address="127.0.0.1:0",
                                       resources={"GPU": 1}, threads_per_worker=1, **quiet)
        except ImportError:
            cluster = LocalCluster(n_workers=max(1, gpus // max(1, gpus_per_worker)), threads_per_worker=1,
                                   processes=True, host="127.0.0.1", dashboard_address="127.0.0.1:0",
                                   resources={"GPU": gpus_per_worker}, **quiet)
    else:
        # One scan at a time per worker; the cores shared among the workers for torch's own threads
        # (Dask would give each worker process one thread: one worker would use one core).
        cores = max(1, (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
                    // workers)
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address="127.0.0.1:0",
                               env={"OMP_NUM_THREADS": str(cores), "MKL_NUM_THREADS": str(cores)}, **quiet)
    return Client(cluster), cluster, bool(gpus)


def cuda_count() -> int:
    """GPUs visible here, without making a CUDA context in this process."""
    import subprocess
    import sys

    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        return int(out.stdout.strip() or 0)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 0
