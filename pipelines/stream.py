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
windows, never on the number of slices (:mod:`ctpore.pipelines.stream_plan` picks the fastest
tile and chunk that fit a budget). Precision and device: :mod:`ctpore.pipelines.precision`; the
GPU is kept busy between chunks by :mod:`ctpore.pipelines.staging` (read-ahead, pinned buffers,
non-blocking copies, writes behind).

Reading
-------
``volume`` is a numpy array or any object with ``.shape`` (Z, Y, X) whose ``volume[z0:z1]``
returns the ``(n, Y, X)`` slices, such as a lazily read scan. A numpy array is cropped before
conversion; a lazy volume with ``read_window`` reads only the tile's window (an uncompressed
NIfTI from its memory map); otherwise whole planes are read per chunk, once per tile.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import numpy as np
import torch

from ctpore.errors import InputError
from ctpore.pipelines.precision import autocast_dtype, bf16_copy_dtype, cpu_weights_dtype, resolve_device
from ctpore.pipelines.staging import Staging, read_ahead
from ctpore.pipelines.stream_plan import check_int, plan_tiles, warm_up
from ctpore.progress import ProgressFn

__all__ = ["READ_AHEAD_ON_CPU", "predict"]


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


def _z_range(z_range, nz: int) -> tuple[int, int]:
    if z_range is None:
        return 0, nz
    try:
        za, zb = (int(v) for v in z_range)
    except (TypeError, ValueError):
        raise InputError(f"z_range must be two slice indices (za, zb), got {z_range!r}") from None
    if not 0 <= za < zb <= nz:
        raise InputError(f"z_range must satisfy 0 <= za < zb <= {nz} (the volume's slices), got {(za, zb)}")
    return za, zb


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


def predict(
    model: torch.nn.Module,
    volume: Any,
    chunk_slices: int = 32,
    tile: int = 128,
    device: str | torch.device | None = None,
    progress: ProgressFn = None,
    out: np.ndarray | None = None,
    precision: str = "auto",
    z_range: tuple[int, int] | None = None,
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
    z_range : (int, int), optional
        Only the slices ``za:zb`` (``out`` is then ``(zb - za, Y, X)``): one slab of a scan split
        across processes. They are computed from the chunk that holds slice ``za - warm_up(model)``
        on (:func:`~ctpore.pipelines.stream_plan.warm_up`: the model's reach along Z, and more
        where the attention kernel is not ctpore's own), in the same chunks and tiles as the whole
        run, so they hold the same bytes as the whole run's slices ``za:zb``.

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
    chunk_slices = check_int("chunk_slices", chunk_slices)
    tile = check_int("tile", tile)
    za, zb = _z_range(z_range, shape[0])
    want = (zb - za, *shape[1:])
    if out is None:
        out = np.empty(want, dtype=np.float32)
    elif tuple(getattr(out, "shape", ())) != want:
        what = "the volume's shape" if z_range is None else f"the shape of slices {za}:{zb}"
        raise InputError(f"out must have {what} {want}, got {tuple(getattr(out, 'shape', ()))}")
    params = list(model.parameters())
    dev = resolve_device(device) if device is not None else (
        params[0].device if params else torch.device("cpu")
    )
    amp = autocast_dtype(precision, dev)
    dtype = params[0].dtype if params else torch.float32  # of the input: the stem stays fp32
    if params and params[0].device != dev:
        model.to(dev)
    half = bf16_copy_dtype(model, precision, dev)
    net = model if half is None else model.with_weights_in(half)
    if half is None and cpu_weights_dtype(precision, dev) is not None:
        amp = cpu_weights_dtype(precision, dev)  # no copy of its own: bf16 under autocast, as asked
    halo = int(getattr(model, "halo", 0))
    token_halo = int(getattr(model, "token_halo", halo))  # tokens needed around a core
    align = int(getattr(model, "align", 1))  # windows start on the model's pooling grid
    tile = -(-tile // align) * align
    nz, ny, nx = shape
    tiles = plan_tiles(ny, nx, tile, halo)
    # Tiles outermost: each streams through every z with its own KV cache (for a z range, from the
    # whole run's chunk that holds the first slice the range's outputs depend on)
    early = warm_up(model, dev) if z_range is not None else 0
    start = 0 if early is None else max(0, za - early) // chunk_slices * chunk_slices
    jobs = [(t, z0, min(z0 + chunk_slices, nz)) for t in range(len(tiles)) for z0 in range(start, zb, chunk_slices)]
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
                if z0 == start:  # a new tile: a new cache, sized once for a full (window=None) one
                    cache = net.new_cache(capacity=nz)
                x = stage.to_device(host, k, dtype)[None]  # (1, n, h, w)
                logits = net(x, z0=z0, cache=cache, margins=margins)  # (1, n, th, tw)
                a, b = max(z0, za), min(z1, zb)  # the slices of the range in this chunk (none: warm-up)
                core = logits[0, a - z0 : b - z0, y0 - ty0 : y1 - ty0, x0 - tx0 : x1 - tx0]
                dest = (slice(a - za, b - za), slice(y0, y1), slice(x0, x1))
                for _ in range(stage.write(out, dest, core.float().sigmoid(), k) if b > a else 1):
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
