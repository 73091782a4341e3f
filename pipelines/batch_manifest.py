"""The manifest of ``ctpore batch``: which scans (with their labels, slice axes and sample masks),
read and checked before any work, and the share of them one node of a job array takes."""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ctpore.errors import InputError

__all__ = ["ScanTask", "read_manifest", "select_part", "check_stem_collisions"]


@dataclass(frozen=True)
class ScanTask:
    """One scan of a manifest: its path, optional label, slice axis and sample mask, and its row
    (1-based)."""

    scan: str
    label: Optional[str] = None
    slice_axis: Optional[int] = None
    row: int = 0
    mask: Optional[str] = None


def _resolve(base: Path, value: str) -> str:
    p = Path(value.strip()).expanduser()
    return str(p if p.is_absolute() else (base / p))


def read_manifest(path: str | os.PathLike) -> list[ScanTask]:
    """The scans of a manifest: a text file of paths (one a line; ``#`` comments) or a CSV file
    with a ``scan`` column and optional ``label``, ``slice_axis`` and ``mask`` (the sample mask,
    1 = sample; without one the sample is found) columns. Relative paths are relative to the
    manifest's folder.

    Raises
    ------
    InputError
        For a missing or empty manifest, a CSV without a ``scan`` column, a bad slice axis or a
        listed path that does not exist (all before any work).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("no such manifest file" if not path.exists() else "the manifest is not a file", path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the manifest ({exc})", path) from None
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise InputError("the manifest lists no scans", path)
    base = path.parent
    tasks: list[ScanTask] = []
    is_csv = path.suffix.lower() == ".csv" or "," in lines[0]
    if is_csv:
        rows = list(csv.DictReader(lines))
        fields = [f.strip().lower() for f in (csv.DictReader(lines[:1]).fieldnames or [])]
        if "scan" not in fields:
            raise InputError(f"a CSV manifest needs a 'scan' column; its header is {', '.join(fields) or '(empty)'}",
                             path)
        for i, row in enumerate(rows, start=2):
            row = {(k or "").strip().lower(): (v or "").strip() for k, v in row.items()}
            if not row.get("scan"):
                raise InputError(f"row {i} has no scan path", path)
            axis = row.get("slice_axis") or None
            if axis is not None and axis not in ("0", "1", "2"):
                raise InputError(f"row {i}: slice_axis must be 0, 1 or 2, got {axis!r}", path)
            label, mask = row.get("label") or None, row.get("mask") or None
            tasks.append(ScanTask(_resolve(base, row["scan"]), _resolve(base, label) if label else None,
                                  None if axis is None else int(axis), i, _resolve(base, mask) if mask else None))
    else:
        tasks = [ScanTask(_resolve(base, ln), row=i) for i, ln in enumerate(lines, start=1)]
    for t in tasks:
        for p in (t.scan, t.label, t.mask):
            if p is not None and not Path(p).exists():
                raise InputError(f"row {t.row}: {p} does not exist", path)
    return tasks


def select_part(tasks: list[ScanTask], part: str | None) -> list[ScanTask]:
    """The share ``I/N`` of the tasks (every N-th from the I-th, 1-based): the same split on every
    node of a job array, whatever order the nodes start in."""
    if part is None:
        return tasks
    try:
        i, n = (int(v) for v in part.split("/"))
    except ValueError:
        raise InputError(f"--part must be I/N with 1 <= I <= N, like 2/8; got {part!r}") from None
    if not 1 <= i <= n:
        raise InputError(f"--part must be I/N with 1 <= I <= N, like 2/8; got {part!r}")
    return [t for k, t in enumerate(tasks) if k % n == i - 1]


def check_stem_collisions(tasks: list[ScanTask], manifest: Path) -> None:
    """Refuse a manifest two of whose scans would write the same output names (InputError naming the rows)."""
    from ctpore.data.io import output_stem

    seen: dict[str, ScanTask] = {}
    for t in tasks:
        stem = output_stem(t.scan)
        if stem in seen:
            raise InputError(f"rows {seen[stem].row} and {t.row} would both write {stem}_*: output names must "
                             "differ (rename one scan, or run them into different folders)", manifest)
        seen[stem] = t
