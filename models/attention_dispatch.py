"""Which kernel computes an attention call, and the kernels: math, sdpa (or ctpore's window kernel), flash.

:class:`~ctpore.models.attention.MultiHeadAttention` projects q, k, v and hands them to
:func:`attend` with its resolved backend (:func:`ctpore.models.backends.resolve_backend`);
:func:`attend` picks the kernel for this call and says which one ran. Every kernel takes and
returns the ``(B, Z, H, D)`` layout (keys and values ``(B, Zk, Hkv, D)``).

Backends
--------
``math``
    Explicit ``softmax(q k^T / sqrt(d)) v``. The reference every other backend is tested
    against, and the only one that can return the per-head weights ``(B, H, Zq, Zk)``.
``sdpa``
    :func:`torch.nn.functional.scaled_dot_product_attention` (on CPU PyTorch's flash kernel). In
    inference on CPU, a causal look-back window of at most 32 slices with head size 16
    (PoreFormer's attention blocks) runs ctpore's C kernel instead
    (:mod:`ctpore.models.window_kernel`, reported as ``window``), which computes only the keys
    each query sees; where it is not built, SDPA runs.
``flash``
    ``flash_attn_func`` from the optional ``flash-attn`` package (CUDA, fp16/bf16, compute
    capability >= 8). It is imported only when asked for, never at module load. Calls it cannot
    take (CPU or fp32 tensors) go through ``sdpa``, which agrees with it to rounding.
``auto``
    ``flash`` when :func:`~ctpore.models.backends.flash_available` says so, else ``sdpa``.

Causal alignment
----------------
With a KV cache the queries are the LAST ``Zq`` of the ``Zk`` key positions: query ``i`` sits at
absolute key index ``i + Zk - Zq`` ("bottom-right" alignment, as flash-attn does it). SDPA's
``is_causal`` aligns top-left, so it is used only when ``Zq == Zk`` and there is no window;
otherwise an explicit boolean mask is built. A band mask does not make SDPA cheaper: it still
computes the full ``Zq x Zk`` product. A window pays off only by keeping ``Zk`` small, which the
streaming driver does with the cache (at most ``W - 1`` old slices are kept).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ctpore.models.backends import flash_capable, load_flash
from ctpore.models.window_kernel import window_attention

__all__ = [
    "attend",
    "causal_mask",
    "flash_attention",
    "flash_ok",
    "math_attention",
    "sdpa_attention",
    "window_kernel_attention",
]


# Kernel launch grids put the batch on an axis limited to 65535 blocks (flash-attn, and PyTorch's
# CUDA kernels); a tile of 256 x 256 pixel columns is 65536 sequences. Split above this on CUDA.
_CUDA_MAX_BATCH = 32768


def causal_mask(
    zq: int, zk: int, window: int | None, device: torch.device | str | None = None
) -> torch.Tensor:
    """Boolean mask of the allowed (query, key) pairs, True = may attend.

    Queries are the last ``zq`` of ``zk`` positions (bottom-right alignment): query ``i`` sits at
    key index ``p = i + zk - zq`` and may see keys ``j`` with ``p - window < j <= p``
    (``window=None``: every ``j <= p``).

    Parameters
    ----------
    zq, zk : int
        Numbers of query and key positions, ``zq <= zk``.
    window : int or None
        Look-back window ``W >= 1`` (the slice itself counts), or None for no limit.
    device : torch.device or str, optional

    Returns
    -------
    torch.Tensor
        ``(zq, zk)`` bool.

    Examples
    --------
    >>> causal_mask(2, 4, window=2).int().tolist()
    [[0, 1, 1, 0], [0, 0, 1, 1]]
    """
    qpos = torch.arange(zk - zq, zk, device=device).unsqueeze(1)  # (Zq, 1) absolute key index
    kpos = torch.arange(zk, device=device).unsqueeze(0)  # (1, Zk)
    allowed = kpos <= qpos
    if window is not None:
        allowed = allowed & (kpos > qpos - window)
    return allowed


def attend(
    backend: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    p: float,
    causal: bool,
    window: int | None,
    need_weights: bool,
    row_masks: dict,
    past: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, str]:
    """Attention of ``q`` over ``k``, ``v`` by the kernel this call can take.

    Parameters
    ----------
    backend : {"flash", "sdpa", "math"}
        The resolved backend (never ``auto``).
    q : torch.Tensor
        ``(B, Zq, H, D)``: the queries, the last ``Zq`` of the ``Zk`` key positions.
    k, v : torch.Tensor
        ``(B, Zk, Hkv, D)``.
    p : float
        Dropout on the attention weights (0 in inference).
    causal, window
        As for :class:`~ctpore.models.attention.MultiHeadAttention`.
    need_weights : bool
        Also return the weights; the ``math`` kernel runs, whatever the backend.
    row_masks : dict
        The caller's cache of the multi-query SDPA mask (see :func:`sdpa_attention`).
    past : tuple of torch.Tensor, optional
        ``(k_past, v_past)`` ``(B, Zc, Hkv, D)``: key positions before ``k``'s (a KV cache's).
        The window kernel reads them in place; every other kernel gets them joined to ``k``, ``v``.

    Returns
    -------
    out : torch.Tensor
        ``(B, Zq, H, D)``.
    weights : torch.Tensor or None
        ``(B, H, Zq, Zk)`` when the ``math`` kernel ran.
    ran : str
        The kernel that ran: ``"math"``, ``"flash"``, ``"window"`` or ``"sdpa"`` (flash only takes
        fp16/bf16 CUDA tensors; other calls go through sdpa).
    """
    kernel = not need_weights and backend != "math" and not (backend == "flash" and flash_ok(q))
    out = window_kernel_attention(q, k, v, p, causal, window, past) if kernel else None
    if out is not None:
        return out, None, "window"
    if past is not None:
        k, v = torch.cat([past[0], k], dim=1), torch.cat([past[1], v], dim=1)
    if need_weights or backend == "math":
        out, weights = math_attention(q, k, v, p, causal, window)
        return out, weights, "math"
    if backend == "flash" and flash_ok(q):
        return flash_attention(q, k, v, p, causal, window), None, "flash"
    return sdpa_attention(q, k, v, p, causal, window, row_masks), None, "sdpa"


def math_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float, causal: bool, window: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Explicit softmax attention: the reference. Returns out (B, Zq, H, D), w (B,H,Zq,Zk)."""
    rep = q.shape[2] // k.shape[2]
    qh = q.transpose(1, 2)  # (B, H, Zq, D)
    kh = k.transpose(1, 2)  # (B, Hkv, Zk, D)
    vh = v.transpose(1, 2)
    if rep > 1:
        # Query head h uses kv head h // rep, as flash-attn and SDPA's enable_gqa do.
        kh = kh.repeat_interleave(rep, dim=1)  # (B, H, Zk, D)
        vh = vh.repeat_interleave(rep, dim=1)
    scores = (qh @ kh.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))  # (B,H,Zq,Zk)
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[1], k.shape[1], window, q.device), float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (B, H, Zq, Zk)
    w = F.dropout(weights, p) if p > 0 else weights
    out = w @ vh  # (B, H, Zq, D)
    return out.transpose(1, 2), weights


def window_kernel_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float, causal: bool, window: int | None,
    past: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor | None:
    """ctpore's C kernel (:mod:`ctpore.models.window_kernel`) where it applies: CPU inference of a
    causal look-back window of at most 32 slices, head size 16 (PoreFormer's attention blocks),
    reading ``past`` (a KV cache's positions before ``k``'s) in place. None elsewhere (SDPA runs)."""
    if p or q.is_cuda or not causal or window is None:
        return None
    return window_attention(q, k, v, window, past)


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    p: float,
    causal: bool,
    window: int | None,
    row_masks: dict,
) -> torch.Tensor:
    """PyTorch SDPA; returns (B, Zq, H, D).

    ``row_masks`` keeps the last mask of the multi-query path on CPU (:func:`_sdpa_one_kv_head`),
    by ``(Zq, Zk, device)``; the caller holds it between calls.
    """
    if q.is_cuda and q.shape[0] > _CUDA_MAX_BATCH:
        return torch.cat(
            [
                sdpa_attention(q[i : i + _CUDA_MAX_BATCH], k[i : i + _CUDA_MAX_BATCH],
                               v[i : i + _CUDA_MAX_BATCH], p, causal, window, row_masks)
                for i in range(0, q.shape[0], _CUDA_MAX_BATCH)
            ]
        )
    zq, zk = q.shape[1], k.shape[1]
    n_heads, n_kv_heads = q.shape[2], k.shape[2]
    if n_kv_heads == 1 and n_heads > 1 and not q.is_cuda:
        return _sdpa_one_kv_head(q, k, v, p, causal, window, row_masks)
    mask, is_causal = None, False
    if causal:
        if window is None and zq == zk:
            is_causal = True  # top-left == bottom-right when square
        else:
            mask = causal_mask(zq, zk, window, q.device)  # (Zq, Zk)
    gqa = {"enable_gqa": True} if n_kv_heads != n_heads else {}
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),  # (B, H|Hkv, Z, D)
        attn_mask=mask, dropout_p=p, is_causal=is_causal, **gqa,
    )  # (B, H, Zq, D)
    return out.transpose(1, 2)


def _sdpa_one_kv_head(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    p: float,
    causal: bool,
    window: int | None,
    row_masks: dict,
) -> torch.Tensor:
    """SDPA for multi-query attention on CPU: the heads as rows of one head.

    With one key/value head, every query head attends over the same keys, so the ``Zq x H``
    queries of a column can be one sequence ``(B, 1, Zq*H, D)`` (rows in (z, head) order, a
    free view of q's memory) against ``(B, 1, Zk, D)``; the mask repeats each query row's
    mask ``H`` times. The kernel then runs one problem per pixel column instead of ``H``,
    which on CPU is where its time goes (measured 2.3x faster for 16 queries, 23 keys).
    Returns ``(B, Zq, H, D)``.
    """
    b, zq, h, d = q.shape
    zk = k.shape[1]
    mask = None
    if causal:
        key = (zq, zk, q.device)
        mask = row_masks.get(key)
        if mask is None:
            mask = causal_mask(zq, zk, window, q.device).repeat_interleave(h, 0)  # (Zq*H, Zk)
            row_masks.clear()
            row_masks[key] = mask
    out = F.scaled_dot_product_attention(
        q.reshape(b, 1, zq * h, d), k.transpose(1, 2), v.transpose(1, 2),  # (B, 1, Z, D)
        attn_mask=mask, dropout_p=p,
    )  # (B, 1, Zq*H, D)
    return out.view(b, zq, h, d)


def flash_ok(q: torch.Tensor) -> bool:
    """Whether flash-attn's kernel takes these queries: fp16/bf16 on a capable CUDA device."""
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and flash_capable(q.device)


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float, causal: bool, window: int | None
) -> torch.Tensor:
    """flash-attn; (B, Z, H, D) layout in and out, GQA native, bottom-right causal."""
    fn, why = load_flash()
    if fn is None:  # cannot happen after resolve_backend, unless the GPU vanished
        raise RuntimeError(f"flash-attn is not available: {why}")
    window_size = (-1, -1) if window is None else (window - 1, 0)
    outs = []
    for i in range(0, q.shape[0], _CUDA_MAX_BATCH):
        sl = slice(i, i + _CUDA_MAX_BATCH)
        outs.append(
            fn(
                q[sl].contiguous(), k[sl].contiguous(), v[sl].contiguous(),
                dropout_p=p, softmax_scale=1.0 / math.sqrt(q.shape[-1]),
                causal=causal, window_size=window_size,
            )
        )  # (b, Zq, H, D)
    return outs[0] if len(outs) == 1 else torch.cat(outs)
