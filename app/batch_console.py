"""What ``ctpore batch`` says as it goes: one line per scan as it ends, on stdout.

The dashboard's address when the cluster is up, then a line for each scan as it ends (done,
failed or skipped, with its figures or its one-line error), a line when a scan's worker died and
it is tried again ("retried"), the warnings each scan raised (as ``reconstruct`` shows them),
and a progress bar over the scans when stdout is a terminal (the lines then print above it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from ctpore.app.console import show_warning

__all__ = ["BatchConsole", "scan_line", "final_line"]


def scan_line(rec: dict) -> str:
    """The line of a scan that ended (a record of ``batch_report.jsonl``)."""
    name = Path(rec["scan"]).name
    status = rec["status"]
    if status == "failed":
        return f"{name}  failed: {rec.get('error', '')}"
    if status == "held":
        h = rec.get("holder") or {}
        who = f"pid {h.get('pid')} on {h.get('host')}, since {h.get('since')}" if h else "a run that is starting"
        return f"{name}  held by another run ({who}): not done here"
    m = rec.get("metrics") or {}
    figures = (f"porosity {m.get('porosity', float('nan')):.4f}  Euler {m.get('euler_number', '-')}  "
               f"pores {m.get('n_pores', '-')}")
    if "dice" in m:
        figures += f"  Dice {m['dice']:.4f}  MSE {m['mse']:.5f}"
    if status == "skipped":
        return f"{name}  skipped ({rec.get('reason', 'outputs complete from an earlier run')})  {figures}"
    attempts = rec.get("attempts", 1)
    tail = f"  [{rec.get('seconds', 0):.1f} s" + (f", attempt {attempts}" if attempts and attempts > 1 else "") + "]"
    return f"{name}  done  {figures}{tail}"


def final_line(s: dict, outdir, summary_name: str) -> str:
    """The last line of ``ctpore batch``: the counts of :func:`~ctpore.pipelines.batch.summarize` ``s``,
    the means over the labelled scans, and where the report and the summary are."""
    line = f"{s['done']} done, {s['skipped']} already done, {s['failed']} failed"
    if s.get("held"):
        line += f", {s['held']} held by another run"
    if "mean_dice" in s:
        line += (f"; with labels: mean MSE {s['mean_mse']:.5f}, Dice {s['mean_dice']:.4f}, "
                 f"Euler error {s['mean_euler_error_rel']:.3f}")
    return line + f"  (report: {Path(outdir) / 'batch_report.jsonl'}, one row per scan: {Path(outdir) / summary_name})"


def _category(item: dict) -> type:
    """The warning class a record names (ctpore's own, else a plain UserWarning)."""
    from ctpore import errors

    cat = getattr(errors, item.get("category", ""), None) if item.get("module") == errors.__name__ else None
    return cat if isinstance(cat, type) and issubclass(cat, Warning) else UserWarning


class BatchConsole:
    """The callbacks of :func:`ctpore.pipelines.batch.run_batch` that print (see the module docstring).

    Parameters
    ----------
    total : int
        Scans in this run (for the bar and the ``[n/total]`` counts).
    """

    def __init__(self, total: int):
        self.total = total
        self.ended = 0
        self.bar = None
        self.enabled = sys.stdout.isatty() and not os.environ.get("CTPORE_NO_PROGRESS")

    def echo(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
        else:
            click.echo(line)  # flushed at once: a pipe reads each line as its scan ends

    def start(self, info: dict) -> None:
        if info["dashboard"]:
            self.echo(f"Dask dashboard: {info['dashboard']}")
        self.echo(f"{info['todo']} scan(s) to do" + (f", {info['skipped']} already done" if info["skipped"] else ""))
        if self.enabled and info["todo"]:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, initial=self.ended, desc="batch", unit="scan", file=sys.stdout,
                            leave=False)

    def record(self, rec: dict) -> None:
        self.ended += 1
        self.echo(f"[{self.ended}/{self.total}] {scan_line(rec)}")
        for item in rec.get("warnings") or []:
            self.warning(rec["scan"], item)
        if self.bar is not None:
            self.bar.update(1)

    def retry(self, info: dict) -> None:
        self.echo(f"{Path(info['scan']).name}  retried: its worker died (attempt {info['attempt']} of "
                  f"{info['of']})")

    def warning(self, scan: str, item: dict) -> None:
        """A warning raised on a worker, shown by this process as ``reconstruct`` shows warnings,
        beginning with the scan's path as the manifest gave it (two scans of one name in different
        folders stay apart) unless the warning names it already."""
        message = item.get("message", "")
        if str(scan) not in message:
            message = f"{scan}: {message}"
        if self.bar is not None:
            self.bar.clear()
        show_warning(message, _category(item), item.get("filename", "?"), item.get("lineno", 0))
        if self.bar is not None:
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
