"""Who owns what in an output folder: one writer per output, and the temporaries of runs that died.

One writer per output: a run claims its stem (:func:`claim_outputs`) before any work, with a lock
file ``.<stem>.lock`` created atomically (``O_EXCL``) in the output folder, and holds it until its
outputs are whole or removed. A second run of the same stem is refused at once
(:class:`OutputsHeld`, naming the first), so the outputs of a stem always come from one run. A
lock whose run is gone (its process ended on this host, or it was not renewed for
:data:`LOCK_STALE_S` on another) is taken over with a warning. The temporaries a killed run left
beside its outputs are removed by the next run of the same stem (:func:`remove_stale_temps`,
:func:`remove_orphan_temps`).
"""

from __future__ import annotations

import glob
import json
import os
import secrets
import socket
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Union

from ctpore.atomic import host_tag, parse_owner, temp_parts
from ctpore.data.io.omezarr_split import unfinished_stores
from ctpore.data.io.omezarr_write import OME_ZARR_SUFFIX, remove_tree
from ctpore.errors import CtporeWarning, InputError
from ctpore.pipelines.disk import DiskGuard
from ctpore.pipelines.outputs import make_outdir

__all__ = ["claim_outputs", "claim_run", "clear_stale_lock", "lock_path", "read_lock", "OutputsHeld",
           "remove_stale_temps", "remove_orphan_temps", "LOCK_HEARTBEAT_S", "LOCK_STALE_S"]

#: A run renews (touches) its lock file this often, in seconds, while it holds it.
LOCK_HEARTBEAT_S = 60.0

#: A lock of a run on another host that has not been renewed for this long (seconds) is stale: that
#: run died with its host, or lost the file system. (A lock of this host is stale as soon as its
#: process is gone.)
LOCK_STALE_S = 900.0

#: A lock file that cannot be read yet (its run is writing it) counts as held for this long (seconds).
LOCK_STARTING_S = 60.0


def remove_stale_temps(paths: dict, keep_split_work: bool = False) -> int:
    """Remove the temporary files a killed earlier run left for these outputs; return how many.

    A file is written to ``.<name stem>.tmp-XXXXXXXX<suffix>`` beside it and renamed when whole
    (:func:`ctpore.atomic.atomic_write`); a run killed mid-write leaves that temporary behind.
    Only the temporaries of these outputs are touched (another run writing other scans into the
    same folder keeps its own). A killed split run's work (``.<stem>.split/`` and its unfinished
    stores ``.<stem>_<kind>.split*.ome.zarr``) goes too, unless ``keep_split_work`` (a split run's
    rerun, which finishes it).
    """
    n = 0
    metrics = Path(paths["metrics"])
    if not keep_split_work and metrics.parent.is_dir():
        stem = metrics.name[: -len("_metrics.json")]
        for stale in [*metrics.parent.glob(f".{glob.escape(stem)}.split"),
                      *(q for kind in ("pores", "prob", "sample")
                        for q in unfinished_stores(metrics.parent / f"{stem}_{kind}{OME_ZARR_SUFFIX}"))]:
            remove_tree(stale)
            n += 1
    for p in map(Path, paths.values()):
        if not p.parent.is_dir():
            continue
        name = p.name
        stem = name[: -len(OME_ZARR_SUFFIX)] if name.lower().endswith(OME_ZARR_SUFFIX) else temp_parts(name)[0]
        for stale in p.parent.glob(f".{stem}.tmp-*"):
            try:
                remove_tree(stale)
                n += 1
            except OSError:
                pass
    return n


def remove_orphan_temps(path) -> int:
    """Remove the owned temporaries of ``path`` (:func:`ctpore.atomic.atomic_write` with ``owned``)
    whose writer, a process of this host, no longer runs; return how many. Those of live runs, and
    of other hosts (whose processes cannot be asked), are kept."""
    path = Path(path)
    if not path.parent.is_dir():
        return 0
    host = host_tag()
    stem, suffix = temp_parts(path.name)
    n = 0
    for tmp in path.parent.glob(f".{stem}.tmp-*{suffix}"):
        owner = parse_owner(tmp.name)
        if owner is None or owner[0] != host or _alive(owner[1], None):
            continue
        try:
            tmp.unlink()
            n += 1
        except OSError:
            pass
    return n


class OutputsHeld(InputError):
    """Another live run holds the outputs of this stem; ``holder`` is its lock record (``pid``,
    ``host``, ``since``), or None when its lock could not be read."""

    def __init__(self, message: str, path, holder: Optional[dict]):
        super().__init__(message, path)
        self.holder = holder


#: The locks this process holds: lock path -> the thread that claimed it (a claim inside a claim of
#: the same thread, as ``ctpore batch`` checks under the lock before it reconstructs, is the same claim).
_HELD: dict[str, int] = {}


def lock_path(paths: dict) -> Path:
    """The lock file of a stem's outputs: ``.<stem>.lock`` in the output folder."""
    metrics = Path(paths["metrics"])
    return metrics.parent / f".{metrics.name[: -len('_metrics.json')]}.lock"


def read_lock(lock: Union[str, os.PathLike]) -> tuple[Optional[dict], Optional[os.stat_result]]:
    """``(record, stat)`` of a lock file; ``(None, stat)`` when it cannot be parsed (yet),
    ``(None, None)`` when there is none."""
    try:
        with open(lock, "rb") as fh:
            st = os.fstat(fh.fileno())
            text = fh.read()
    except OSError:  # none (or gone)
        return None, None
    try:
        rec = json.loads(text)
    except ValueError:
        return None, st
    return (rec, st) if isinstance(rec, dict) else (None, st)


def _proc_stat(pid: int) -> Optional[tuple[str, int]]:
    """``(state, start)`` of process ``pid`` (Linux ``/proc``): its state letter (``Z`` a zombie)
    and when it started (clock ticks since boot, to tell a reused pid apart); None without /proc."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _proc_start(pid: int) -> Optional[int]:
    stat = _proc_stat(pid)
    return None if stat is None else stat[1]


def _alive(pid: int, proc_start: Optional[int]) -> bool:
    """Whether process ``pid`` of this host still runs: it exists, is not a zombie (a killed run
    whose parent died too waits as one until it is reaped), and is the one that started at
    ``proc_start``."""
    if os.name == "nt":  # os.kill would end it there; without a safe probe, count it alive
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OverflowError:  # no such pid can exist
        return False
    except OSError:  # it exists, owned by someone else
        pass
    stat = _proc_stat(pid)
    if stat is None:
        return True
    return stat[0] not in ("Z", "X") and (proc_start is None or stat[1] == proc_start)


def _stale(rec: Optional[dict], st: os.stat_result) -> Optional[str]:
    """Why a lock is stale, or None while its run may still be running."""
    age = time.time() - st.st_mtime
    if rec is None:
        return f"an unreadable lock left {age:.0f} s ago" if age > LOCK_STARTING_S else None
    if rec.get("host") == socket.gethostname():
        pid = int(rec.get("pid", -1))
        return None if pid > 0 and _alive(pid, rec.get("proc_start")) else f"its process {pid} is gone"
    if age > LOCK_STALE_S:
        return f"its run on {rec.get('host')} has not renewed it for {age / 60:.0f} min"
    return None


def _holder(rec: Optional[dict]) -> str:
    if rec is None:
        return "a run that is starting"
    return f"pid {rec.get('pid')} on {rec.get('host')}, since {rec.get('since')}"


def _break_stale(lock: Path, rec: Optional[dict], st: os.stat_result) -> bool:
    """Remove the stale lock ``(rec, st)`` unless it changed meanwhile; one breaker at a time (a
    ``.break`` file made with ``O_EXCL``), so two runs that both found it stale cannot remove a
    lock the other has just made. True when this call removed it."""
    breaker = lock.with_name(lock.name + ".break")
    try:
        os.close(os.open(breaker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        try:  # a breaker killed in the few microseconds it holds this
            if time.time() - breaker.stat().st_mtime > LOCK_STARTING_S:
                breaker.unlink()
        except OSError:
            pass
        time.sleep(0.05)
        return False
    try:
        now, now_st = read_lock(lock)
        if now_st is None or now != rec or now_st.st_ino != st.st_ino:
            return False
        lock.unlink()
        return True
    finally:
        breaker.unlink(missing_ok=True)


def _acquire(lock: Path) -> dict:
    """Make the lock file (``O_EXCL``) with this run's record, taking over a stale one."""
    rec = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "proc_start": _proc_start(os.getpid()), "token": secrets.token_hex(8)}
    for _ in range(20):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            held, st = read_lock(lock)
            if st is None:  # released meanwhile: try again
                continue
            why = _stale(held, st)
            if why is None:
                raise OutputsHeld(f"another ctpore run is writing these outputs ({_holder(held)}); wait for it to "
                                  f"end, or write to another folder (-o); its lock is {lock}",
                                  lock.parent / lock.name[1:-5], held) from None
            if _break_stale(lock, held, st):  # named by the outputs' folder; ctpore batch adds the scan's path
                warnings.warn(f"took over a stale lock on the outputs {lock.name[1:-5]}_* in {lock.parent.absolute()} "
                              f"({why}; it was {_holder(held)}; lock file {lock.name})", CtporeWarning, stacklevel=3)
            continue
        except OSError as exc:
            raise InputError(f"cannot make the lock file {lock.name} ({exc.strerror or exc})", lock.parent) from exc
        try:
            os.write(fd, json.dumps(rec).encode())
            os.fsync(fd)
        except OSError:
            os.close(fd)
            lock.unlink(missing_ok=True)
            raise
        os.close(fd)
        return rec
    held, _ = read_lock(lock)
    raise OutputsHeld(f"another ctpore run is writing these outputs ({_holder(held)}); its lock is {lock}",
                      lock.parent / lock.name[1:-5], held)


def clear_stale_lock(paths: dict) -> bool:
    """Remove the lock of these outputs when it is stale (a run killed just after its outputs were
    whole); True when this removed one. ``ctpore batch`` calls it for the scans it skips as done."""
    lock = lock_path(paths)
    rec, st = read_lock(lock)
    if st is None or _stale(rec, st) is None:
        return False
    return _break_stale(lock, rec, st)


def _heartbeat(lock: Path, stop: threading.Event) -> None:
    while not stop.wait(LOCK_HEARTBEAT_S):
        try:
            os.utime(lock)
        except OSError:
            pass


@contextmanager
def claim_outputs(paths: dict, fresh: bool = False) -> Iterator[dict]:
    """Hold the outputs of a stem for this run: one writer per output.

    Makes the output folder (removed again at the end if it stayed empty) and the lock file
    :func:`lock_path` with ``O_EXCL``, holding this run's record as JSON (``pid``, ``host``,
    ``since``, the process's start, a token); renews it every :data:`LOCK_HEARTBEAT_S` seconds and
    removes it at the end, also on errors. A stale lock (its process gone on this host, or not
    renewed for :data:`LOCK_STALE_S` seconds by another host) is taken over with a warning. A claim
    inside a claim of the same stem by the same thread is the same claim.

    Parameters
    ----------
    paths : dict
        The stem's outputs (:func:`output_paths`).
    fresh : bool
        Also refuse, once the claim is held, when an output exists (a run that ended between
        :func:`check_outputs` and this claim wrote it; without ``--overwrite`` it stays).

    Yields
    ------
    dict
        This run's lock record.

    Raises
    ------
    OutputsHeld
        Another live run holds the stem (the message names it: pid, host, since).
    InputError
        The lock cannot be made, or ``fresh`` and an output exists.
    """
    lock = lock_path(paths)
    key = os.path.abspath(lock)
    nested = _HELD.get(key) == threading.get_ident()
    created = [] if nested else make_outdir(lock.parent)
    try:
        rec = read_lock(lock)[0] if nested else _acquire(lock)
    except BaseException:
        _remove_empty(created)
        raise
    stop = threading.Event()
    if not nested:
        _HELD[key] = threading.get_ident()
        threading.Thread(target=_heartbeat, args=(lock, stop), daemon=True, name=f"ctpore-lock-{lock.name}").start()
    try:
        if fresh:
            for p in paths.values():
                if Path(p).exists():
                    raise InputError("output exists; pass --overwrite to replace it", path=p)
        yield rec
    finally:
        if not nested:
            stop.set()
            _HELD.pop(key, None)
            now, _ = read_lock(lock)
            if now is not None and now.get("token") == rec.get("token"):  # still ours
                lock.unlink(missing_ok=True)
            _remove_empty(created)


def _remove_empty(folders: list[Path]) -> None:
    for folder in reversed(folders):  # deepest first, each only if empty
        try:
            folder.rmdir()
        except OSError:
            pass


@contextmanager
def claim_run(paths: dict, overwrite: bool = False, tmp_dir=None, keep_split_work: bool = False) -> Iterator[DiskGuard]:
    """What a run of ``reconstruct_file`` holds, from before any work to its end: its outputs
    (:func:`claim_outputs`, ``fresh`` without ``overwrite``; then the temporaries a killed earlier
    run of this stem left are removed, :func:`remove_stale_temps`) and its disk: the
    :class:`~ctpore.pipelines.disk.DiskGuard` yielded, whose ``check`` the run calls once the scan
    and the method are known, and which turns a disk that fills up anyway into an ``InputError``.
    ``tmp_dir``: where the run's temporary files go (default: the output folder)."""
    with claim_outputs(paths, fresh=not overwrite), DiskGuard(paths, tmp_dir) as disk:
        remove_stale_temps(paths, keep_split_work)
        yield disk
