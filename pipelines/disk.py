"""Disk space for a reconstruction: what a run writes, checked before any work, and a full disk said as such.

A run of ``reconstruct_file`` writes, beside its outputs (or in ``--tmp-dir``):

- the raw probabilities (:class:`~ctpore.pipelines.spill.BlockSpill`): 4 bytes a voxel, from the
  prediction to the end of post-processing;
- an uncompressed copy of a scan whose format cannot read windows, when the plane takes several
  tiles (:func:`~ctpore.pipelines.spill.windowed`), or, when the scan has an outside, the copy with
  the outside filled (:mod:`~ctpore.pipelines.sample_mask`): 4 bytes a voxel, during the prediction;
- the outside's mask, when there is one: 1 byte a voxel, for the whole run;
- the slabs :class:`~ctpore.data.io.write.SlabWriter` keeps until the end when the slices are not
  the file's last voxel axis: 1 byte a voxel for each uint8 output, 4 for the probabilities, during
  post-processing;

and in the output folder the outputs themselves, gzipped NIfTI, bounded by their uncompressed
size (:func:`gzip_bound`: deflate never grows data by more than a few bytes in 16 KiB), the
probabilities 4 bytes a voxel and every other volume (the pores; the sample mask, written only
when there is an outside) 1 byte; or OME-Zarr stores, their pyramids and chunk files counted too.

:class:`DiskGuard` checks, per file system, that the larger of the two phases (prediction:
raw probabilities and copy; post-processing: raw probabilities, slabs and outputs) fits the free
space ``shutil.disk_usage`` reports, before any work, and turns a disk that fills up anyway
(``ENOSPC``, or ``EDQUOT`` for a quota, which ``disk_usage`` does not see) into an
:class:`~ctpore.errors.InputError` with the same kind of line: what the run needs, what is free,
where.
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from ctpore.errors import InputError

__all__ = ["DiskGuard", "Need", "run_needs", "peaks", "check_disk", "check_tmp_dir", "copy_made", "has_outside",
           "gzip_bound", "human_bytes", "file_system", "DISK_FULL_ERRNOS"]

PathLike = Union[str, os.PathLike]

#: The errors of a write that found no room: a full disk, or a full quota.
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)

#: Bytes a voxel of each output volume, by its key in ``output_paths`` (any other volume: 1, uint8).
OUTPUT_BYTES_PER_VOXEL = {"prob": 4}

#: Room for what the estimate does not itemize: the metrics JSON, NIfTI headers, the lock file.
SLACK_BYTES = 64 << 10


@dataclass(frozen=True)
class Need:
    """One thing a run writes: ``what`` (said in messages), ``nbytes`` at most, in ``folder``,
    during ``phase`` (``"predict"``, ``"post"`` or ``"both"``)."""

    what: str
    nbytes: int
    folder: Path
    phase: str


def gzip_bound(nbytes: int) -> int:
    """At most the size of ``nbytes`` of data gzipped: the data itself, 5 bytes for each deflate
    block it may be stored in (blocks of at least 16 KiB) and the gzip header and trailer.

    Examples
    --------
    >>> gzip_bound(0) >= 18 and gzip_bound(10**6) < 10**6 + 10**3
    True
    """
    return int(nbytes) + 5 * (int(nbytes) // 16384 + 1) + 64


def human_bytes(n: float) -> str:
    """``n`` bytes in the largest decimal unit that keeps it >= 1, three figures.

    Examples
    --------
    >>> human_bytes(1_770_000), human_bytes(34.4e9), human_bytes(512)
    ('1.77 MB', '34.4 GB', '512 B')
    """
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def file_system(folder: PathLike) -> int:
    """The file system ``folder`` lies on (its device number), to add up what lands on the same one."""
    return os.stat(folder).st_dev


def _existing(folder: Path) -> Path:
    """``folder``, or the nearest folder above it that exists (where it would be made)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def check_tmp_dir(tmp_dir: Optional[PathLike]) -> Optional[Path]:
    """``tmp_dir`` as a Path after checking it is a folder this process can write in (None stays None)."""
    if tmp_dir is None:
        return None
    tmp = Path(tmp_dir)
    if not tmp.is_dir():
        raise InputError("--tmp-dir must be an existing folder" + ("" if not tmp.exists() else "; this is a file"),
                         tmp)
    if not os.access(tmp, os.W_OK | os.X_OK):
        raise InputError("cannot write in --tmp-dir: permission denied", tmp)
    return tmp


def copy_made(scan: Any, predictor: Any, *, memory_gb: Optional[float] = None,
              gpu_memory_gb: Optional[float] = None, tile: Optional[int] = None,
              chunk_slices: Optional[int] = None, precision: str = "auto") -> bool:
    """Whether a run of ``predictor`` on ``scan`` makes the temporary uncompressed copy of the scan:
    a tiled predictor (it has a halo), a format that cannot read windows, and a plane that takes
    several tiles of the run's plan (:func:`~ctpore.pipelines.budget.plan_run`, the plan the run
    itself follows)."""
    if predictor.halo is None or getattr(scan, "windowed", True):
        return False
    from ctpore.pipelines.budget import plan_run
    from ctpore.pipelines.stream_plan import plan_tiles

    shape = tuple(int(s) for s in scan.shape)
    tile = plan_run(shape, predictor, memory_gb, gpu_memory_gb, tile=tile, chunk_slices=chunk_slices,
                    precision=precision).tile
    return tile is not None and len(plan_tiles(shape[1], shape[2], tile, predictor.halo)) > 1


def has_outside(scan: Any, sample: Any = "auto") -> bool:
    """Whether a run with ``sample`` (``auto``, ``all`` or a mask) works with an outside: a mask
    always, ``auto`` when :func:`~ctpore.data.sample.find_sample` finds one (it reads at most 16
    slices, once per scan: the run that follows uses the same fit), ``all`` never."""
    if sample is None or (isinstance(sample, str) and sample == "all"):
        return False
    if isinstance(sample, str) and sample == "auto":
        from ctpore.data.sample import find_sample

        return find_sample(scan).has_outside
    return True


def run_needs(shape, paths: dict, *, tmp_dir: Optional[PathLike] = None, copy: bool = False,
              spool: bool = False, outside: bool = False) -> list[Need]:
    """What a run of a ``shape`` (Z, Y, X) scan writes, and where (see the module docstring).

    Parameters
    ----------
    paths : dict
        The outputs (``output_paths``): every ``.nii.gz``/``.nii`` or ``.ome.zarr`` value is a
        volume output.
    tmp_dir : path, optional
        Where the temporary volumes go (default: the output folder).
    copy : bool
        The scan is copied uncompressed (:func:`copy_made`).
    spool : bool
        The output volumes are spooled before they are written (slice axis not the file's last).
    outside : bool
        The scan has an outside (:func:`has_outside`): its mask waits on disk, the scan is copied
        with the outside filled, and the sample mask is an output.
    """
    voxels = 1
    for s in shape:
        voxels *= int(s)
    outdir = Path(paths["metrics"]).parent
    tmp = Path(tmp_dir) if tmp_dir is not None else outdir
    from ctpore.pipelines.output_formats import OUTPUT_FORMATS

    def written(spooled: bool) -> dict:  # the volume outputs (in the file's axis order or not), bytes a voxel
        return {k: OUTPUT_BYTES_PER_VOXEL.get(k, 1) for k, p in paths.items()
                for f in OUTPUT_FORMATS.values() if f.file_axis_order == spooled
                and str(p).lower().endswith(f.suffix) and (k != "sample" or outside)}

    volumes, stores = written(True), written(False)
    needs = [Need("raw probabilities", 4 * voxels, tmp, "both")]
    if outside:
        needs.append(Need("outside mask", voxels, tmp, "both"))
        needs.append(Need("copy of the scan with its outside filled", 4 * voxels, tmp, "predict"))
    elif copy:
        needs.append(Need("uncompressed copy of the scan", 4 * voxels, tmp, "predict"))
    if spool and volumes:  # only outputs in the file's axis order wait (NIfTI); OME-Zarr is written in z order
        needs.append(Need("output slabs", sum(volumes.values()) * voxels, tmp, "post"))
    needs += [Need(f"{k} output", gzip_bound(b * voxels), outdir, "post") for k, b in volumes.items()]
    # OME-Zarr: the pyramid adds at most 1/7 to level 0; each chunk file (>= 64 K voxels) may
    # take up to a 4 KiB block more than its bytes on disk, and compressed chunks do not grow.
    needs += [Need(f"{k} output", (b * voxels * 8) // 7 * 17 // 16 + SLACK_BYTES, outdir, "post")
              for k, b in stores.items()]
    needs.append(Need("metrics and headers", SLACK_BYTES, outdir, "post"))
    return needs


def peaks(needs: list[Need]) -> list[tuple[Path, int, list[Need]]]:
    """``(folder, peak bytes, needs)`` per file system: what stays for the whole run plus the larger phase."""
    groups: dict[int, list[Need]] = {}
    for n in needs:
        groups.setdefault(file_system(_existing(n.folder)), []).append(n)
    out = []
    for group in groups.values():
        both = sum(n.nbytes for n in group if n.phase == "both")
        phases = [sum(n.nbytes for n in group if n.phase == p) for p in ("predict", "post")]
        out.append((group[0].folder, both + max(phases), group))
    return out


def _said(group: list[Need]) -> str:
    return ", ".join(f"{n.what} {human_bytes(n.nbytes)}" for n in group)


def check_disk(needs: list[Need]) -> None:
    """Raise :class:`InputError` (one line: needed, free, where) when a file system cannot hold
    what the run writes on it at its peak."""
    for folder, peak, group in peaks(needs):
        free = shutil.disk_usage(_existing(folder)).free
        if peak > free:
            raise InputError(f"not enough free disk space for this run: it writes up to {human_bytes(peak)} here "
                             f"({_said(group)}) and {human_bytes(free)} is free; free some space, or choose "
                             "another output folder (-o) or --tmp-dir for the temporary files", folder)


def _disk_full(exc: BaseException) -> Optional[OSError]:
    """The full-disk ``OSError`` behind ``exc`` (itself, or its cause), or None."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


class DiskGuard:
    """The disk side of one run: :meth:`check` before any work, and, as a context manager around
    the run, a disk that fills up anyway (``ENOSPC``/``EDQUOT``) turned into an
    :class:`InputError` that says what the run needs, what is free and where.

    Parameters
    ----------
    paths : dict
        The run's outputs (``output_paths``).
    tmp_dir : path, optional
        Where the temporary volumes go (default: the output folder); checked to be a writable folder.
    """

    def __init__(self, paths: dict, tmp_dir: Optional[PathLike] = None):
        self.paths = paths
        self.tmp_dir = check_tmp_dir(tmp_dir)
        self.needs: list[Need] = []

    def check(self, scan: Any, predictor: Any, *, memory_gb: Optional[float] = None,
              gpu_memory_gb: Optional[float] = None, tile: Optional[int] = None,
              chunk_slices: Optional[int] = None, sample: Any = "auto", precision: str = "auto") -> list[Need]:
        """Estimate what the run of ``predictor`` on ``scan`` (with ``sample``) writes and refuse
        (:func:`check_disk`) when it does not fit; returns the estimate."""
        from ctpore.data.io.write import spools

        copy = copy_made(scan, predictor, memory_gb=memory_gb, gpu_memory_gb=gpu_memory_gb, tile=tile,
                         chunk_slices=chunk_slices, precision=precision)
        self.needs = run_needs(scan.shape, self.paths, tmp_dir=self.tmp_dir, copy=copy, spool=spools(scan.geometry),
                               outside=has_outside(scan, sample))
        check_disk(self.needs)
        return self.needs

    @property
    def folder(self) -> Path:
        """Where the temporary volumes go."""
        return self.tmp_dir if self.tmp_dir is not None else Path(self.paths["metrics"]).parent

    def __enter__(self) -> "DiskGuard":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        full = _disk_full(exc) if exc is not None else None
        if full is None:
            return
        folders = {Path(self.paths["metrics"]).parent, self.folder}
        where = min(folders, key=lambda f: shutil.disk_usage(_existing(f)).free)
        free = shutil.disk_usage(_existing(where)).free
        need = next((peak for folder, peak, _ in peaks(self.needs)
                     if file_system(_existing(folder)) == file_system(_existing(where))), None)
        needs = f"it writes up to {human_bytes(need)} here, " if need is not None else ""
        kind = "the disk quota is full" if full.errno == errno.EDQUOT else "the disk filled up"
        raise InputError(f"{kind} during the run ({full.strerror or full}): {needs}{human_bytes(free)} is free now; "
                         "nothing was left behind; free some space, or choose another output folder (-o) or "
                         "--tmp-dir for the temporary files", where) from None
