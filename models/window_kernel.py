"""The look-back-window attention kernel in C (``models/_winattn.c``) for inference on CPU.

PoreFormer's attention is one tiny problem per pixel column: at full resolution 16 query slices
of 4 heads against the last 8 key slices of one key/value head, at the coarse levels 4 heads
against the last 24 slices. PyTorch's CPU attention kernel
computes each query against every key of the chunk and its cache and masks, and spends its time
in per-problem overhead: it was the largest single cost of ``ctpore reconstruct`` on CPU. The C
kernel computes only the keys a query may see, column by column, in fp32 (from fp32 or bf16
storage).

It is built with the package where a C compiler is found (an optional extension declared in
``pyproject.toml``: without one ctpore installs and runs PyTorch's kernel instead) and loaded with :mod:`ctypes`,
whose calls release the GIL, so ranges of columns run in as many threads as PyTorch uses.
:func:`available` says whether it is here; ``CTPORE_WINDOW_KERNEL=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

__all__ = ["HEAD_SIZE", "MAX_WINDOW", "available", "library_path", "window_attention"]

_ARGS = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 8 + [ctypes.c_float] + [ctypes.c_int64] * 12

#: The shapes the kernel is written for (PoreFormer's attention blocks): head size 16, a look-back
#: window of at most 32 slices; other shapes go to PyTorch's kernel.
HEAD_SIZE, MAX_WINDOW = 16, 32

#: Columns per call at the least: below this a thread's start costs more than it saves.
_MIN_COLUMNS_PER_THREAD = 256


def library_path() -> Path | None:
    """The built kernel beside this module, or None."""
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = here / f"_winattn{suffix}"
        if p.is_file():
            return p
    return None


@functools.lru_cache(maxsize=1)
def _library():
    if os.environ.get("CTPORE_WINDOW_KERNEL", "1") == "0":
        return None
    path = library_path()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path))
        for name in ("ctpore_winattn_f32", "ctpore_winattn_bf16"):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = _ARGS, ctypes.c_int
    except (OSError, AttributeError):
        return None
    return lib


def available() -> bool:
    """Whether the C kernel is built here (and not turned off by ``CTPORE_WINDOW_KERNEL=0``)."""
    return _library() is not None


def _heads_packed(t: torch.Tensor) -> torch.Tensor:
    """``t`` (N, Z, H or Hkv, D) as the kernel reads it (the last axis contiguous, heads ``D`` apart),
    copied only when it is not."""
    if t.stride(3) != 1 or (t.shape[2] > 1 and t.stride(2) != t.shape[3]):
        return t.contiguous()
    return t


@functools.lru_cache(maxsize=4)
def _pool(n: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=n, thread_name_prefix="ctpore-window")


if hasattr(os, "register_at_fork"):  # a forked child has the pool object but not its threads
    os.register_at_fork(after_in_child=_pool.cache_clear)


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                     past: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor | None:
    """Causal look-back-window attention (multi-, grouped- or multi-query), or None where the kernel cannot run it.

    Parameters
    ----------
    q : torch.Tensor
        ``(N, Zq, H, D)`` queries, fp32 or bf16, on CPU; ``D`` must be :data:`HEAD_SIZE`.
    k, v : torch.Tensor
        ``(N, Zk, Hkv, D)`` keys and values (``Zk >= Zq``; the queries are the last ``Zq``
        positions; ``H`` a multiple of ``Hkv``, query head ``h`` reads key/value head
        ``h // (H / Hkv)``), same dtype.
    window : int
        Query position ``p`` attends to ``p - window + 1 .. p``; at most :data:`MAX_WINDOW`.
    past : tuple of torch.Tensor, optional
        ``(k_past, v_past)``, ``(N, Zc, Hkv, D)``: key positions before ``k``'s, read where they
        lie (a KV cache's buffer), as if ``torch.cat([k_past, k], 1)`` (and ``v``'s) were passed.

    Returns
    -------
    torch.Tensor or None
        ``(N, Zq, H, D)`` in ``q``'s dtype, contiguous, or a view of a contiguous ``(Zq, N, H, D)``
        where ``q`` is slice-major (its slice stride above its column stride); None
        when the kernel is not built, the shapes are not the ones it is written for (``D`` not 16, a
        window outside 1..32, more queries than keys, no key/value head or ``H`` not a multiple of
        ``Hkv``), any tensor is not on the CPU or not fp32/bf16, or needs a gradient (PyTorch's
        kernel then runs). The C entry declines the same shapes itself (code -2, here a
        RuntimeError): nothing out of bounds whoever calls it.
    """
    lib = _library()
    if lib is None or q.dtype not in (torch.float32, torch.bfloat16):
        return None
    if any(t.device.type != "cpu" for t in (q, k, v)):
        return None
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return None
    if q.dim() != 4 or k.dim() != 4 or k.dtype != q.dtype or v.dtype != q.dtype:
        return None
    n, zq, h, d = q.shape
    zn, hkv = k.shape[1], k.shape[2]
    if tuple(k.shape) != (n, zn, hkv, d) or tuple(v.shape) != (n, zn, hkv, d) or hkv < 1 or h % hkv:
        return None
    zc = 0 if past is None else past[0].shape[1]
    kp, vp = past if zc else (k, v)  # with no cached position, the kernel never reads kp, vp
    if zc and any(t.shape != (n, zc, hkv, d) or t.dtype != q.dtype or t.device.type != "cpu" for t in (kp, vp)):
        return None
    zk = zc + zn
    if zq < 1 or zk < zq or d != HEAD_SIZE or not 1 <= window <= MAX_WINDOW:
        return None
    q, k, v, kp, vp = (_heads_packed(t) for t in (q, k, v, kp, vp))
    if q.stride(1) > q.stride(0):  # slice-major queries (a view of (Zq, N, H, D)): a slice-major output
        out = torch.empty((zq, n, h, d), dtype=q.dtype).transpose(0, 1)
    else:
        out = torch.empty((n, zq, h, d), dtype=q.dtype)
    fn = lib.ctpore_winattn_bf16 if q.dtype == torch.bfloat16 else lib.ctpore_winattn_f32
    args = (zq, zk, zc, h, hkv, int(window), 1.0 / math.sqrt(d), q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            v.stride(0), v.stride(1), out.stride(0), out.stride(1), kp.stride(0), kp.stride(1), vp.stride(0),
            vp.stride(1))
    ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), kp.data_ptr(), vp.data_ptr())
    threads = max(1, min(torch.get_num_threads(), n // _MIN_COLUMNS_PER_THREAD))
    bounds = [n * i // threads for i in range(threads + 1)]
    if threads == 1:
        codes = [fn(*ptrs, 0, n, *args)]
    else:
        codes = list(_pool(threads).map(lambda i: fn(*ptrs, bounds[i], bounds[i + 1], *args), range(threads)))
    if any(c == -1 for c in codes):
        raise MemoryError("the window attention kernel could not allocate its scratch memory")
    if any(codes):  # -2: declined at its own boundary, what the checks above should have caught
        raise RuntimeError(f"the window attention kernel declined its arguments (code {max(codes, key=abs)}): "
                           f"q {tuple(q.shape)}, k {tuple(k.shape)}, window {window}")
    return out
