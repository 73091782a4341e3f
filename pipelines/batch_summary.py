"""``batch_summary.csv``: one row per scan, its latest attempt, beside the append-only report.

``batch_report.jsonl`` gets a line each time a scan ends, run after run, so a reader would have
to take the last line per scan. The summary does that once: it is rebuilt from the report when a
run starts, updated (rewritten whole, atomically) as each scan ends, and written again when the
run ends. A ``skipped`` line (outputs complete from an earlier run) is no attempt: it replaces
nothing but an earlier failure, and stands alone only when the report holds no attempt of that
scan; a ``held`` line (another run was writing the scan) replaces only a failure. Two drivers
on one folder append to one report: each update reads it again, so the summary holds both.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

from ctpore.data.metrics import summary_keys
from ctpore.atomic import atomic_write
from ctpore.pipelines.claims import remove_orphan_temps

__all__ = ["SUMMARY_NAME", "columns", "BatchSummary", "latest_records"]

SUMMARY_NAME = "batch_summary.csv"


def columns() -> tuple[str, ...]:
    """The summary's columns: the scan, how its latest attempt ended, and its figures: the
    registry's headline metrics (:func:`~ctpore.data.metrics.summary_keys`, so a metric registered
    with ``summary=True`` reaches the summary), the density per voxel³ where a scan has no units."""
    return ("scan", "status", "attempts", "seconds", *summary_keys(), "connectivity_density_per_voxel3",
            "error", "warnings", "worker", "ended")


def _newer(old: dict | None, rec: dict) -> bool:
    """Whether ``rec`` replaces ``old`` as the scan's latest attempt (a ``held`` line, which another
    run's attempt may follow or precede, replaces only a failure or another ``held``)."""
    if old is None:
        return True
    if rec.get("status") == "held":
        return old.get("status") in ("failed", "held")
    return rec.get("status") != "skipped" or old.get("status") != "done"


def _read_report(report: str | os.PathLike, out: dict[str, dict], offset: int = 0) -> int:
    """Take the whole lines of ``report`` from byte ``offset`` into ``out`` (scan -> latest
    attempt); return the offset after the last whole line. Lines that do not parse (a run killed
    while writing one) are passed over."""
    try:
        with open(report, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return offset
    end = data.rfind(b"\n") + 1  # a line another driver is still writing waits for the next read
    for line in data[:end].splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "scan" in rec and _newer(out.get(rec["scan"]), rec):
            out[rec["scan"]] = rec
    return offset + end


def latest_records(report: str | os.PathLike) -> dict[str, dict]:
    """The latest attempt of each scan in a ``batch_report.jsonl`` (in the order the scans first
    appear); lines that do not parse (a run killed while writing one) are passed over."""
    out: dict[str, dict] = {}
    _read_report(report, out)
    return out


def _row(rec: dict) -> dict[str, Any]:
    m = rec.get("metrics") or {}
    row = {k: m.get(k, "") for k in columns() if k in m}
    row.update(scan=rec["scan"], status=rec.get("status", ""), attempts=rec.get("attempts", ""),
               seconds=rec.get("seconds", ""), error=rec.get("error", rec.get("reason", "")),
               warnings=" | ".join(w.get("message", "") for w in rec.get("warnings") or []),
               worker=rec.get("worker", ""), ended=rec.get("ended", ""))
    return row


class BatchSummary:
    """The summary of the report in ``outdir``: :meth:`update` with each record as its scan ends.

    Parameters
    ----------
    outdir : path
        The batch's output folder (it must exist).
    report : path
        The report whose earlier lines seed the summary.
    """

    def __init__(self, outdir: str | os.PathLike, report: str | os.PathLike):
        self.path = Path(outdir) / SUMMARY_NAME
        self.report = Path(report)
        self.latest: dict[str, dict] = {}
        self._read = _read_report(report, self.latest)
        remove_orphan_temps(self.path)  # a killed earlier run's half-written summary

    def update(self, rec: dict) -> None:
        """Take ``rec`` as its scan's latest attempt (see the module docstring) and rewrite the file."""
        self._read = _read_report(self.report, self.latest, self._read)
        if _newer(self.latest.get(rec["scan"]), rec):
            self.latest[rec["scan"]] = rec
        self.write()

    def write(self) -> Path:
        """Write the summary whole (a temporary file renamed over the old one), with the lines added
        to the report since it was last read (another driver's among them) taken in."""
        self._read = _read_report(self.report, self.latest, self._read)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns(), extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for rec in self.latest.values():
            writer.writerow(_row(rec))
        with atomic_write(self.path, owned=True) as tmp:
            Path(tmp).write_text(buf.getvalue())
        return self.path
