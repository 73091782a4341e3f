"""The scans of a batch that are split across the cluster's workers (:mod:`ctpore.pipelines.split`).

A batch runs one scan per worker; its scans are split into Z-slabs across all the workers where
whole scans would leave workers idle: every scan when there are fewer scans than workers, else the
scans of the last, partial round (``len(todo) % workers`` of them, the last in the manifest). Their
slabs are submitted from the driver after the whole-scan tasks, so the scheduler runs them as the
workers come free (a task submitted earlier goes first), and no scan task ever waits on its own
slabs (a full cluster would deadlock). They run one scan at a time, in a thread of the driver,
beside the loop that collects the whole-scan tasks.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

__all__ = ["scans_to_split", "SplitScans"]


def scans_to_split(n_todo: int, n_workers: int, splittable: bool) -> int:
    """How many of the last scans of a batch to split: every one when there are fewer scans than
    workers, else those of the last, partial round; none where they cannot be split.

    Examples
    --------
    >>> [scans_to_split(n, 16, True) for n in (3, 16, 20, 32, 33)]
    [3, 0, 4, 0, 1]
    """
    if not splittable or n_workers < 2:
        return 0
    return n_todo if n_todo < n_workers else n_todo % n_workers


class SplitScans:
    """Run ``tasks`` one at a time split across ``client``'s workers, in a thread: ``run(task)``
    gives a scan's record (:func:`~ctpore.pipelines.batch.run_task` with the client); a scan whose
    slab's worker died for good (the record's ``worker_lost``) is run again up to ``retries``
    times, keeping the slabs it recorded; each record goes to ``on_end``. :meth:`stop` ends the
    thread after the scan it is on, whose record is then dropped (the run was interrupted)."""

    def __init__(self, tasks: list, run: Callable[[Any], dict], retries: int, on_end: Callable[[dict], None],
                 on_retry: Optional[Callable[[dict], None]] = None):
        self.tasks, self._run, self.retries = list(tasks), run, retries
        self._on_end, self._on_retry = on_end, on_retry
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ctpore-split-scans", daemon=True)

    def start(self) -> "SplitScans":
        if self.tasks:
            self._thread.start()
        return self

    def _loop(self) -> None:
        for t in self.tasks:
            if self._stopping.is_set():
                return
            rec, attempt = self._run(t), 1
            while rec.pop("worker_lost", False) and attempt <= self.retries and not self._stopping.is_set():
                if self._on_retry is not None:
                    self._on_retry({"scan": t.scan, "attempt": attempt + 1, "of": self.retries + 1,
                                    "error": rec["error"]})
                attempt += 1
                rec = self._run(t)
            if self._stopping.is_set():
                return
            self._on_end({**rec, "attempts": attempt, "split": True})

    def join(self) -> None:
        """Wait for every scan (in short waits, so that an interrupt reaches the caller)."""
        while self._thread.is_alive():
            self._thread.join(0.2)

    def stop(self) -> None:
        self._stopping.set()
