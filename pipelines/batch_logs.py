"""What ``ctpore batch`` lets through of Dask's logs, and the warnings a scan raised on its worker.

Both run in the batch's driver: :func:`quiet_dask` around the work (the local cluster's workers
get the same level through ``silence_logs``), :func:`warning_records` on the worker, so that its
warnings travel back in the scan's record.
"""

from __future__ import annotations

import contextlib
import logging

__all__ = ["WORKER_DIED", "quiet_dask", "warning_records"]


def warning_records(caught: list) -> list[dict]:
    """Caught ``warnings.WarningMessage`` objects as JSON-ready dicts (``category``, its ``module``,
    ``message``, ``filename``, ``lineno``), repeats dropped."""
    out, seen = [], set()
    for w in caught:
        cat = w.category
        item = {"category": cat.__name__, "module": cat.__module__, "message": str(w.message),
                "filename": str(w.filename), "lineno": int(w.lineno)}
        if (item["category"], item["message"]) not in seen:
            seen.add((item["category"], item["message"]))
            out.append(item)
    return out


#: The scheduler's ERRORs for work lost with a dead worker: a task that was running on it (the batch
#: retries it and says so), and a result that was waiting on it to be gathered (Dask computes it again).
WORKER_DIED = ("workers died", "Couldn't gather keys")


class _WorkerDiedFilter(logging.Filter):
    """Leaves out the scheduler's ERRORs for work lost with a dead worker (:data:`WORKER_DIED`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and any(m in record.getMessage() for m in WORKER_DIED))


@contextlib.contextmanager
def quiet_dask(verbose: bool = False):
    """Within the block, Dask's loggers in this process at WARNING (INFO when ``verbose``), and
    without the scheduler's ERROR for a task whose worker died unless ``verbose``; restored after.
    The local cluster's workers get the same level (``silence_logs``, see :func:`_cluster`)."""
    names = ("distributed", "distributed.scheduler", "distributed.nanny", "distributed.worker", "distributed.core")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    filt = _WorkerDiedFilter()
    for lg in loggers:
        lg.setLevel(logging.INFO if verbose else logging.WARNING)
    sched = logging.getLogger("distributed.scheduler")
    if not verbose:
        sched.addFilter(filt)
    try:
        yield
    finally:
        sched.removeFilter(filt)
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
