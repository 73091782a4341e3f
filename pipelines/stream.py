"""Streaming inference: a whole CT stack through PoreFormer in chunks of slices and tiles.

How it works
------------
The plane is cut into tiles; each tile is read with a halo as wide as the model's in-plane
receptive field (:attr:`PoreFormer.halo`), so once the halo is cropped off the tiles stitch
without seams and equal the full pass. Tiles start on multiples of the model's coarsest grid
(:attr:`PoreFormer.align`; the tile size is rounded up to one), so every tile sees the same
grid as the full pass. Only the tile's core becomes full-resolution tokens; the halo feeds the
per-slice convolutions. Tiles are the OUTER loop: each tile streams through the slices in chunks
of ``chunk_slices`` with its own KV caches (one per attention block), which keep the keys and
values of the last ``W - 1`` slices of a block with look-back window ``W``. The z-position
encoding gets the chunk's absolute offset. The result equals ``sigmoid(model(volume))`` up to
float rounding.

Memory
------
With windowed attention the working memory depends on the tile, ``chunk_slices`` and the
windows, never on the number of slices; :meth:`PoreFormer.inference_bytes` estimates it and
:func:`plan_streaming` picks the fastest tile and chunk that fit a budget. Without a window
(``window=None``) a cache holds every earlier slice, so memory grows with the stack.

On CUDA the working set lives on the GPU: :func:`plan_for_device` sizes tiles and chunks from
the GPU's free memory (``torch.cuda.mem_get_info``, less a margin, capped by ``gpu_memory_gb``)
with the band of tokens that runs there, and keeps the host's staging buffers within the host
budget.

Precision and device
--------------------
``precision="auto"`` runs CUDA under bf16 autocast (fp16 where the GPU lacks bf16), so that the
FlashAttention kernels, which take only half precision, are what runs. On a CPU that multiplies
bf16 in hardware (AVX512-BF16, AMX) it runs a bf16 copy of the model (:func:`cpu_weights_dtype`):
the in-plane convolutions and the projections are the most of its arithmetic, and bf16 products
run several times faster there; the stem and the z-position maps stay fp32. Elsewhere, and with
``precision="fp32"``, the stored model runs as it is.
Every CUDA call acts on the device asked for (``cuda:1`` never touches ``cuda:0``). The GPU is
kept busy between chunks by :mod:`ctpore.pipelines.staging` (read-ahead, pinned buffers,
non-blocking copies, writes behind).

Reading
-------
``volume`` is a numpy array or any object with ``.shape`` (Z, Y, X) whose ``volume[z0:z1]``
returns the ``(n, Y, X)`` slices, such as a lazily read scan. A numpy array is cropped before
conversion; a lazy volume with ``read_window`` reads only the tile's window (an uncompressed
NIfTI from its memory map); otherwise whole planes are read per chunk, once per tile.
"""

from __future__ import annotations

import functools
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch

from ctpore.errors import InputError
from ctpore.pipelines.staging import Staging, read_ahead
from ctpore.progress import ProgressFn

__all__ = ["PRECISIONS", "cpu_native_bf16", "cpu_weights_dtype", "gpu_budget", "plan_for_device", "plan_streaming",
           "plan_tiles", "precision_name", "predict", "resolve_device", "stream_host_bytes"]


def _check_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


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
        half = _bf16_copy(model, precision, dev)
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


def _volume_shape(volume: Any) -> tuple[int, int, int]:
    shape = getattr(volume, "shape", None)
    if shape is None:
        raise InputError(
            f"volume must be a (Z, Y, X) array or have .shape and [z0:z1], got "
            f"{type(volume).__name__}"
        )
    shape = tuple(int(s) for s in shape)
    if len(shape) != 3 or min(shape) < 1:
        raise InputError(f"volume must be (Z, Y, X) with every size >= 1, got shape {shape}")
    return shape  # type: ignore[return-value]


def _read_chunk(
    volume: Any, z0: int, z1: int, window: tuple[int, int, int, int], plane: tuple[int, int]
) -> np.ndarray:
    """Slices ``z0:z1`` of ``volume`` cropped to ``window``, as float32 ``(n, h, w)``."""
    wy0, wy1, wx0, wx1 = window
    if isinstance(volume, np.ndarray):
        arr = volume[z0:z1, wy0:wy1, wx0:wx1]
    elif hasattr(volume, "read_window"):  # a lazy scan that can read just the tile's window
        arr = volume.read_window(z0, z1, wy0, wy1, wx0, wx1)
        if arr.shape != (z1 - z0, wy1 - wy0, wx1 - wx0):
            raise InputError(f"volume.read_window returned shape {arr.shape}, expected "
                             f"{(z1 - z0, wy1 - wy0, wx1 - wx0)}")
    else:
        arr = np.asarray(volume[slice(z0, z1)])
        if arr.shape != (z1 - z0, *plane):
            raise InputError(
                f"volume[{z0}:{z1}] returned shape {arr.shape}, expected {(z1 - z0, *plane)}"
            )
        arr = arr[:, wy0:wy1, wx0:wx1]
    arr = np.asarray(arr, dtype=np.float32)
    if not np.isfinite(arr).all():
        raise InputError(
            f"the volume has non-finite values (NaN or Inf) in slices {z0}..{z1 - 1}; "
            "fill or mask them before prediction"
        )
    return arr


#: Read the next chunk in a background thread on CPU too (always on CUDA). Off: on the 2-core CPU
#: this project tests on, the reading thread competes with torch's threads for the cores.
READ_AHEAD_ON_CPU = False

#: Inference precisions: ``auto`` is bf16 autocast on CUDA (fp16 where the GPU lacks bf16), so
#: that the flash kernels, which take only fp16/bf16, are what run; on a CPU that multiplies bf16
#: in hardware, the model's weights in bf16 (:func:`cpu_weights_dtype`); fp32 on other CPUs.
PRECISIONS = ("auto", "fp32", "bf16", "fp16")


@functools.lru_cache(maxsize=1)
def cpu_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (x86 AVX512-BF16 or AMX-BF16).

    Read from ``/proc/cpuinfo`` (Linux). Elsewhere, or where it cannot be read: False, so
    ``precision="auto"`` stays fp32 (oneDNN emulates bf16 on other CPUs, slower than fp32).
    """
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def cpu_weights_dtype(precision: str, dev: torch.device) -> torch.dtype | None:
    """The dtype PoreFormer's weights and activations take on CPU (None: fp32 as stored).

    ``bf16`` (and ``auto`` on a CPU with native bf16, :func:`cpu_native_bf16`) runs a copy of
    the model in bf16 (:meth:`PoreFormer.with_weights_in`), measured faster on CPU than bf16
    autocast, which casts around every product. On CUDA: None (autocast, see :func:`autocast_dtype`).
    """
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if dev.type != "cpu":
        return None
    if precision == "bf16" or (precision == "auto" and cpu_native_bf16()):
        return torch.bfloat16
    return None


def _bf16_copy(model: Any, precision: str, dev: torch.device) -> torch.dtype | None:
    """The dtype of the copy of ``model`` that ``precision`` runs on ``dev`` (None: the model itself).
    A model without :meth:`~ctpore.models.PoreFormer.with_weights_in` runs under autocast instead."""
    half = cpu_weights_dtype(precision, dev)
    return half if half is not None and hasattr(model, "with_weights_in") else None


def precision_name(precision: str, dev: torch.device) -> str:
    """What ``precision`` runs as on ``dev``: ``fp32``, ``bf16`` or ``fp16`` (recorded in the metrics)."""
    dtype = cpu_weights_dtype(precision, dev) or autocast_dtype(precision, dev)
    return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device`` as a ``torch.device``, or an :class:`InputError` saying why it cannot be used.

    Examples
    --------
    >>> resolve_device("cpu")
    device(type='cpu')
    """
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InputError(f"device {device!r} is not a device PyTorch knows ({exc}); use cpu or cuda") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {device!r}: this PyTorch has no usable CUDA GPU "
                             f"(torch {torch.__version__}); use --device cpu, or install a CUDA build of torch")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(f"device {device!r}: there are {torch.cuda.device_count()} CUDA GPU(s), "
                             f"numbered from 0")
    elif dev.type != "cpu":
        raise InputError(f"device {device!r} is not supported; use cpu or cuda")
    return dev


def autocast_dtype(precision: str, dev: torch.device) -> torch.dtype | None:
    """The autocast dtype of a precision on a device (None: plain fp32)."""
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if dev.type == "cpu" and cpu_weights_dtype(precision, dev) is not None:
        return None  # bf16 weights on CPU, not autocast
    if precision == "auto":
        if dev.type != "cuda":
            return None
        return torch.bfloat16 if torch.cuda.get_device_capability(dev)[0] >= 8 else torch.float16  # that GPU's
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def predict(
    model: torch.nn.Module,
    volume: Any,
    chunk_slices: int = 32,
    tile: int = 128,
    device: str | torch.device | None = None,
    progress: ProgressFn = None,
    out: np.ndarray | None = None,
    precision: str = "auto",
) -> np.ndarray:
    """Pore probability of every voxel of a (Z, Y, X) stack, streamed slice-chunk by chunk.

    Parameters
    ----------
    model : PoreFormer
        A causal model with ``new_cache()``, ``halo`` and ``forward(x, z0, cache)``. It is put
        in eval mode for the call (its mode is restored after) and moved to ``device``.
    volume : numpy.ndarray or lazy volume
        ``(Z, Y, X)``, already normalized; or an object with ``.shape`` whose ``[z0:z1]`` gives
        ``(n, Y, X)`` arrays.
    chunk_slices : int
        Slices per forward call.
    tile : int
        Side of a tile's core in pixels (rounded up to a multiple of ``model.align``); each tile
        is read with ``model.halo`` extra pixels on every side.
    device : str or torch.device, optional
        Where to run; default the device of the model's parameters.
    progress : callable, optional
        ``progress(done, total, "predict")`` after each chunk of each tile.
    out : array-like, optional
        ``(Z, Y, X)`` destination, e.g. a ``numpy.memmap``; written slice-chunk by chunk and
        returned. Default: a new float32 array.
    precision : {"auto", "fp32", "bf16", "fp16"}
        ``auto``: bf16 autocast on CUDA (fp16 without bf16); on CPU bf16 weights where the CPU
        multiplies bf16 in hardware, else fp32 (see :data:`PRECISIONS`). ``fp32`` is the stored
        model exactly.

    Returns
    -------
    numpy.ndarray
        ``(Z, Y, X)`` float32 probabilities in [0, 1] (``out`` if given).

    Raises
    ------
    InputError
        For a volume that is not 3-D, non-finite input values, a bad ``out`` shape or bad
        ``chunk_slices``/``tile``.

    Examples
    --------
    >>> from ctpore.models import PoreFormer, PoreFormerConfig
    >>> model = PoreFormer(PoreFormerConfig(n_layers=1, window=4))
    >>> prob = predict(model, np.zeros((5, 12, 12), np.float32), chunk_slices=2, tile=8)
    >>> prob.shape, prob.dtype
    ((5, 12, 12), dtype('float32'))
    """
    shape = _volume_shape(volume)
    chunk_slices = _check_int("chunk_slices", chunk_slices)
    tile = _check_int("tile", tile)
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    elif tuple(getattr(out, "shape", ())) != shape:
        raise InputError(
            f"out must have the volume's shape {shape}, got {tuple(getattr(out, 'shape', ()))}"
        )
    params = list(model.parameters())
    dev = resolve_device(device) if device is not None else (
        params[0].device if params else torch.device("cpu")
    )
    amp = autocast_dtype(precision, dev)
    dtype = params[0].dtype if params else torch.float32  # of the input: the stem stays fp32
    if params and params[0].device != dev:
        model.to(dev)
    half = _bf16_copy(model, precision, dev)
    net = model if half is None else model.with_weights_in(half)
    if half is None and cpu_weights_dtype(precision, dev) is not None:
        amp = cpu_weights_dtype(precision, dev)  # no copy of its own: bf16 under autocast, as asked
    halo = int(getattr(model, "halo", 0))
    token_halo = int(getattr(model, "token_halo", halo))  # tokens needed around a core
    align = int(getattr(model, "align", 1))  # windows start on the model's pooling grid
    tile = -(-tile // align) * align
    nz, ny, nx = shape
    tiles = plan_tiles(ny, nx, tile, halo)
    # Tiles outermost: each streams through every z with its own KV cache.
    jobs = [(t, z0, min(z0 + chunk_slices, nz)) for t in range(len(tiles)) for z0 in range(0, nz, chunk_slices)]
    total, done = len(jobs), 0
    was_training = model.training
    model.eval()
    try:
        # Every CUDA call (pinned buffers, events, kernels) on the device asked for.
        with torch.cuda.device(dev) if dev.type == "cuda" else nullcontext(), torch.inference_mode(), \
                torch.autocast(dev.type, dtype=amp or torch.float32, enabled=amp is not None):
            stage = Staging(dev, chunk_slices * max((w[1] - w[0]) * (w[3] - w[2]) for _c, w in tiles),
                            chunk_slices * max((c[1] - c[0]) * (c[3] - c[2]) for c, _w in tiles))

            def load(job):  # in the read-ahead thread: read, normalize, check, stage
                k, (t, z0, z1) = job
                return stage.host_input(_read_chunk(volume, z0, z1, tiles[t][1], (ny, nx)), k)

            cache = None
            for (k, (t, z0, z1)), host in read_ahead(load, enumerate(jobs), dev.type == "cuda" or READ_AHEAD_ON_CPU):
                (y0, y1, x0, x1), (wy0, wy1, wx0, wx1) = tiles[t]
                # Only the core and the blocks' reach become tokens; the rest of the window
                # is read as in-plane context (encoder and context branch).
                ty0, ty1 = max(0, y0 - token_halo), min(ny, y1 + token_halo)
                tx0, tx1 = max(0, x0 - token_halo), min(nx, x1 + token_halo)
                margins = (ty0 - wy0, wy1 - ty1, tx0 - wx0, wx1 - tx1)
                if z0 == 0:  # a new tile: a new cache, sized once for a full (window=None) one
                    cache = net.new_cache(capacity=nz)
                x = stage.to_device(host, k, dtype)[None]  # (1, n, h, w)
                logits = net(x, z0=z0, cache=cache, margins=margins)  # (1, n, th, tw)
                core = logits[0, :, y0 - ty0 : y1 - ty0, x0 - tx0 : x1 - tx0]
                for _ in range(stage.write(out, (slice(z0, z1), slice(y0, y1), slice(x0, x1)),
                                           core.float().sigmoid(), k)):
                    done += 1
                    if progress is not None:
                        progress(done, total, "predict")
            cache = None
            for _ in range(stage.flush()):
                done += 1
                if progress is not None:
                    progress(done, total, "predict")
    finally:
        model.train(was_training)
    return out
