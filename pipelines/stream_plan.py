"""How a scan is streamed through PoreFormer within a memory budget: the tiles of the plane and the
slices per chunk.

With windowed attention the working memory depends on the tile, ``chunk_slices`` and the
windows, never on the number of slices; :meth:`PoreFormer.inference_bytes` estimates it and
:func:`plan_streaming` picks the fastest tile and chunk that fit a budget. Without a window
(``window=None``) a cache holds every earlier slice, so memory grows with the stack.

On CUDA the working set lives on the GPU: :func:`plan_for_device` sizes tiles and chunks from
the GPU's free memory (``torch.cuda.mem_get_info``, less a margin, capped by ``gpu_memory_gb``)
with the band of tokens that runs there, and keeps the host's staging buffers within the host
budget.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ctpore.errors import InputError
from ctpore.pipelines.precision import bf16_copy_dtype

__all__ = ["CHUNK_EFFICIENCY", "CUDA_CHUNK_EFFICIENCY", "GPU_MARGIN_BYTES", "TILE_SIDES", "check_int", "gpu_budget",
           "plan_for_device", "plan_streaming", "plan_tiles", "stream_host_bytes", "warm_up"]


def check_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an int, or an InputError naming ``name`` when it is not an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def warm_up(model: Any, device: str | torch.device = "cpu") -> int | None:
    """How many slices before a range of slices its computation starts, so that the range holds the
    same bytes as in a run through the whole stack (a scan split into slabs); None: from the first
    slice (a model whose reach is unbounded, see :attr:`PoreFormerConfig.z_reach`).

    The reach makes the outputs equal in exact arithmetic. For equal bytes every attention sum must
    also run over the same keys in the same order. ctpore's window kernel (CPU, head size 16,
    windows up to 32 slices) computes each query over its own window whatever the chunk holds, so
    the reach is enough there. Other kernels sum over the whole chunk and its cache: the run then
    starts a further ``W - 1`` slices early (the largest window), so that every cache that feeds the
    range is as full as in the whole run.
    """
    from ctpore.models.window_kernel import HEAD_SIZE, MAX_WINDOW, available

    reach = getattr(model, "z_reach", None)
    if reach is None:
        return None
    layout = model.attention_layout() if hasattr(model, "attention_layout") else []
    if not layout:
        return int(reach)
    config = getattr(model, "config", None)
    fits = all(b.get("head_dim") == HEAD_SIZE and b["window"] is not None and b["window"] <= MAX_WINDOW
               for b in layout)
    kernel = (torch.device(device).type == "cpu" and available() and fits
              and getattr(config, "attention_backend", "") != "math")
    return int(reach) + (0 if kernel else max(int(b["window"]) for b in layout) - 1)


def plan_tiles(
    height: int, width: int, tile: int, halo: int
) -> list[tuple[tuple[int, int, int, int], tuple[int, int, int, int]]]:
    """Cut a ``height x width`` plane into tiles with a halo.

    Parameters
    ----------
    height, width : int
        Plane size.
    tile : int
        Side of a tile's core (the part whose output is kept).
    halo : int
        Extra pixels read on each side (clipped at the plane's edges).

    Returns
    -------
    list of (core, window)
        ``core = (y0, y1, x0, x1)`` the output region; ``window = (wy0, wy1, wx0, wx1)`` the
        region read, containing the core. Cores cover the plane exactly once.

    Examples
    --------
    >>> plan_tiles(10, 4, tile=6, halo=1)
    [((0, 6, 0, 4), (0, 7, 0, 4)), ((6, 10, 0, 4), (5, 10, 0, 4))]
    """
    tiles = []
    for y0 in range(0, height, tile):
        y1 = min(y0 + tile, height)
        for x0 in range(0, width, tile):
            x1 = min(x0 + tile, width)
            window = (max(0, y0 - halo), min(height, y1 + halo), max(0, x0 - halo),
                      min(width, x1 + halo))
            tiles.append(((y0, y1, x0, x1), window))
    return tiles


#: Relative speed of PoreFormer per voxel by slices per chunk (measured on the 2-core CPU this
#: project tests on; the attention kernel and the per-call overheads favour longer chunks).
CHUNK_EFFICIENCY = {32: 0.99, 16: 1.0, 8: 0.85, 4: 0.65, 2: 0.4, 1: 0.25}

#: Tile sides tried by :func:`plan_streaming` (besides one tile for the whole plane).
TILE_SIDES = (1024, 768, 512, 384, 256, 192, 128, 96, 64)


#: Relative speed by slices per chunk on CUDA. Not measured yet (no GPU was at hand): a model in
#: which every forward call costs a fixed launch overhead worth about four slices of work, so
#: that a GPU prefers the longest chunks. ``ctpore bench gpu`` records the plan it ran.
CUDA_CHUNK_EFFICIENCY = {32: 32 / 36, 16: 16 / 20, 8: 8 / 12, 4: 4 / 8, 2: 2 / 6, 1: 1 / 5}

#: GPU memory kept out of the plan: the allocator's slack, cuDNN's and cuBLAS's workspaces and what
#: the estimate does not see; the larger of this and a tenth of the free memory.
GPU_MARGIN_BYTES = 2**30


def stream_host_bytes(window: tuple[int, int], core: tuple[int, int], chunk: int) -> int:
    """Host memory (bytes) of :func:`predict`'s staging on CUDA for one tile: the chunk being read
    and normalized, its two pinned input buffers and a spare, and two pinned output buffers."""
    return int(chunk * (4 * window[0] * window[1] + 2 * core[0] * core[1]) * 4)


def gpu_budget(device: str | torch.device, gpu_memory_gb: float | None = None) -> float:
    """Bytes of GPU memory a plan may use on the CUDA ``device``.

    Its free memory (``torch.cuda.mem_get_info(device)``, plus what this process's allocator
    holds unused) less :data:`GPU_MARGIN_BYTES` or a tenth of it, whichever is larger; at most
    ``gpu_memory_gb`` when given.
    """
    dev = torch.device(device)
    free, _total = torch.cuda.mem_get_info(dev)
    free += torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)  # ours to reuse
    budget = free - max(GPU_MARGIN_BYTES, 0.1 * free)
    if gpu_memory_gb is not None:
        budget = min(budget, gpu_memory_gb * 2**30)
    return float(budget)


def plan_for_device(model: Any, shape: tuple[int, int, int], host_budget: float,
                    device: str | torch.device | None = None, gpu_memory_gb: float | None = None,
                    precision: str = "auto") -> tuple[int, int]:
    """The fastest ``(tile, chunk_slices)`` for ``device`` within the budgets.

    On CPU the model's working memory must fit ``host_budget`` (bytes; :func:`plan_streaming`),
    its activations counted at 2 bytes where ``precision`` runs the bf16 copy
    (:func:`cpu_weights_dtype`), else at 4.
    On CUDA it must fit the GPU's budget (:func:`gpu_budget`: free memory less a margin, at most
    ``gpu_memory_gb``), estimated with the band of tokens that runs on the GPU, while the host's
    staging buffers (:func:`stream_host_bytes`) must fit ``host_budget``.

    Raises
    ------
    InputError
        When not even the smallest tile and chunk fit (the message names the option to raise).
    """
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type != "cuda":
        half = bf16_copy_dtype(model, precision, dev)
        return plan_streaming(model, shape, host_budget, dtype_bytes=4 if half is None else half.itemsize)
    if gpu_memory_gb is not None and gpu_memory_gb <= 0:
        raise InputError(f"--gpu-memory-gb must be > 0, got {gpu_memory_gb}")
    return plan_streaming(model, shape, gpu_budget(dev, gpu_memory_gb), device=dev, host_budget_bytes=host_budget)


def plan_streaming(model: Any, shape: tuple[int, int, int], budget_bytes: float, *,
                   device: torch.device | None = None, host_budget_bytes: float | None = None,
                   dtype_bytes: int = 4) -> tuple[int, int]:
    """The fastest ``(tile, chunk_slices)`` whose working memory fits ``budget_bytes``.

    The working memory of one tile comes from ``model.inference_bytes`` (activations of
    ``dtype_bytes``, 2 for the bf16 copy on CPU); speed is judged by the
    share of each window that is core (the halo is read but not kept) times
    :data:`CHUNK_EFFICIENCY`. A plane that fits whole is one tile. With a CUDA ``device``
    (see :func:`plan_for_device`) ``budget_bytes`` is the GPU's, the estimate uses that device's
    band, :data:`CUDA_CHUNK_EFFICIENCY` judges speed, and the host's staging buffers must also fit
    ``host_budget_bytes``.

    Raises
    ------
    InputError
        When not even the smallest tile and chunk fit (the message says how much is needed).
    """
    cuda = device is not None and device.type == "cuda"
    table = CUDA_CHUNK_EFFICIENCY if cuda else CHUNK_EFFICIENCY
    nz, ny, nx = shape
    align, halo = int(getattr(model, "align", 1)), int(getattr(model, "halo", 0))
    whole = -(-max(ny, nx) // align) * align
    sides = sorted({whole, *(s for s in TILE_SIDES if s < whole and s % align == 0)}, reverse=True)
    best, smallest = None, None
    for chunk in sorted({min(c, nz) for c in CHUNK_EFFICIENCY}, reverse=True):
        for side in sides:
            tiles = plan_tiles(ny, nx, side, halo)
            window = max((w[1] - w[0], w[3] - w[2]) for _c, w in tiles)
            core = (min(side, ny), min(side, nx))
            need = model.inference_bytes(window, core, chunk, device=device) if cuda else \
                model.inference_bytes(window, core, chunk, dtype_bytes=dtype_bytes)
            host = stream_host_bytes(window, core, chunk) if cuda else 0
            smallest = need if smallest is None else min(smallest, need)
            if need > budget_bytes or (host_budget_bytes is not None and host > host_budget_bytes):
                continue
            kept = sum((c[1] - c[0]) * (c[3] - c[2]) for c, _w in tiles)
            read = sum((w[1] - w[0]) * (w[3] - w[2]) for _c, w in tiles)
            score = table.get(chunk, table[min(table, key=lambda c: abs(c - chunk))])
            score *= kept / read
            if best is None or score > best[0]:
                best = (score, side, chunk)
            break  # the largest tile that fits this chunk
    if best is None:
        if cuda and smallest <= budget_bytes:
            raise InputError(f"the host memory budget leaves {max(0.0, host_budget_bytes or 0) / 2**30:.2f} GB "
                             "for the GPU's staging buffers, too little for the smallest tile; raise --memory-gb")
        where, option = ("the GPU's free memory", "--gpu-memory-gb (or free the GPU)") if cuda else \
            ("the memory budget", "--memory-gb")
        raise InputError(f"{where} leaves {budget_bytes / 2**30:.2f} GB for the model, and even "
                         f"the smallest tile needs {smallest / 2**30:.2f} GB; raise {option}")
    return best[1], best[2]
