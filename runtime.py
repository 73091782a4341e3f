"""Process-wide settings that an entry point (the ``ctpore`` command, a batch worker) may apply.

The library never changes them on import: they affect the whole process, so only the program
that owns the process calls :func:`tune_allocator` and :func:`quiet_openmp`.

Why: PoreFormer's inference makes the same large activations chunk after chunk. glibc hands
blocks above its mmap threshold (at most 32 MB) straight back to the kernel when they are freed,
so every chunk pays the page faults of fresh memory again; on the 2-core machine this project
measures on, that cost as much as the model's arithmetic (inference 0.8 -> 1.1 million voxels/s
with the allocator tuned below, same outputs). Keeping freed memory in the heap for reuse holds
the process at its peak working set instead, which the memory budget bounds anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

__all__ = ["tune_allocator", "quiet_openmp", "openmp_policy_is_ours", "current_rss"]

#: Whether :func:`quiet_openmp` set ``OMP_WAIT_POLICY`` in this process (not the user).
_OURS = {"omp_wait_policy": False}

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def tune_allocator() -> bool:
    """Make glibc keep freed memory for reuse (no per-block mmap, no trimming). True if applied.

    A no-op (False) where the C library is not glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_MMAP_MAX, 0) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1 and ok
    return ok


def current_rss() -> int:
    """This process's resident memory now, in bytes (0 where it cannot be read).

    Examples
    --------
    >>> current_rss() > 0 or not sys.platform.startswith("linux")
    True
    """
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def quiet_openmp() -> bool:
    """Let OpenMP's idle threads sleep (``OMP_WAIT_POLICY=PASSIVE``) unless the user chose a policy.
    True if set. It must run before torch is imported (the OpenMP runtime reads it once, when it
    loads); after that it changes nothing and returns False.

    Why: between PyTorch's parallel operations, its OpenMP threads spin, waiting for the next one.
    ctpore's attention kernel runs in threads of its own, and Python does the work between
    operations: the spinning threads took the cores from them. On the 2-core machine this project
    measures on (AMD EPYC), ``predict`` of the bench's 96 x 256 x 256 scan took 3.87 -> 3.53 s in
    fp32 and 2.83 -> 2.50 s in bf16 with it, the whole ``ctpore reconstruct --precision fp32``
    6.87 -> 6.53 s; same outputs. MONAI's 3D U-Net process, which has no such threads, is slower with
    it (8.86 -> 9.1 s), so only ctpore's own command sets it, and ``ctpore bench speed`` runs the
    other programs without it (:func:`openmp_policy_is_ours`). ``OMP_WAIT_POLICY=ACTIVE`` restores
    the spinning.
    """
    if "OMP_WAIT_POLICY" in os.environ or "torch" in sys.modules:
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    _OURS["omp_wait_policy"] = True
    return True


def openmp_policy_is_ours() -> bool:
    """Whether this process's ``OMP_WAIT_POLICY`` was set by :func:`quiet_openmp` (so a child
    process that is not ctpore should not inherit it), not by the user."""
    return _OURS["omp_wait_policy"]
