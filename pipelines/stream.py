"""Streaming inference: a whole CT stack through PoreFormer in chunks of slices and tiles.

How it works
------------
The plane is cut into tiles; each tile is read with a halo as wide as the model's in-plane
receptive field (:attr:`PoreFormer.halo`), so once the halo is cropped off the tiles stitch
without seams and equal the full pass. Only the core plus the blocks' own reach
(:attr:`PoreFormer.token_halo`) becomes tokens; the rest of the halo feeds the per-slice encoder
and the pooled context branch. With a context branch, tiles start on multiples of the pooling
factor (:attr:`PoreFormer.align`; the tile size is rounded up to one) so every tile pools on the
same grid as the full pass. Tiles are the OUTER loop: each tile streams through the
slices in chunks of ``chunk_slices`` with its own per-layer KV cache, which keeps the keys and
values of the last ``W - 1`` slices of a model with look-back window ``W``. The z-position
encoding gets the chunk's absolute offset. The result equals ``sigmoid(model(volume))`` up to
float rounding.

Memory
------
With a windowed model (``config.window = W``) the memory depends on ``W``, ``chunk_slices`` and
the tile, not on the number of slices: about ``(tile + 2*token_halo)^2 * (W - 1 + chunk_slices)``
tokens of ``d_model`` floats per layer, plus the chunk's activations. With ``window=None`` the
cache holds every earlier slice (exact, as the model was trained), so memory then grows with the
stack: about ``(tile + 2*token_halo)^2 * Z * 2 * d_model * 4`` bytes per layer (1.1 GB per layer for a
128^3 volume in one 128 x 128 tile with the default model). Long stacks should use a windowed
model.

Speed (CPU)
-----------
A large tile spends much of its time in the kernel, faulting in fresh pages for each large
activation (glibc gives big blocks back to the system on every free). With
``THP_MEM_ALLOC_ENABLE=1`` in the environment before torch is imported, PyTorch backs large CPU
tensors with transparent huge pages: 128^3 went from 70k to 107k voxels/s (sdpa) on a 2-core
machine. It is a process-wide setting, so this module does not set it; an entry point may.

Reading
-------
``volume`` is a numpy array or any object with ``.shape`` (Z, Y, X) whose ``volume[z0:z1]``
returns the ``(n, Y, X)`` slices, such as a lazily read scan. A numpy array is cropped before
conversion; a lazy volume is read whole-plane per chunk, once per tile (a plane larger than one
tile means several passes over the file).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ctpore.errors import InputError
from ctpore.progress import ProgressFn

__all__ = ["plan_tiles", "predict"]


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


def predict(
    model: torch.nn.Module,
    volume: Any,
    chunk_slices: int = 32,
    tile: int = 128,
    device: str | torch.device | None = None,
    progress: ProgressFn = None,
    out: np.ndarray | None = None,
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
    dev = torch.device(device) if device is not None else (
        params[0].device if params else torch.device("cpu")
    )
    dtype = params[0].dtype if params else torch.float32
    if params and params[0].device != dev:
        model.to(dev)
    halo = int(getattr(model, "halo", 0))
    token_halo = int(getattr(model, "token_halo", halo))  # tokens needed around a core
    align = int(getattr(model, "align", 1))  # windows start on the model's pooling grid
    tile = -(-tile // align) * align
    nz, ny, nx = shape
    tiles = plan_tiles(ny, nx, tile, halo)
    n_chunks = math.ceil(nz / chunk_slices)
    total, done = len(tiles) * n_chunks, 0
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for (y0, y1, x0, x1), window in tiles:
                wy0, wy1, wx0, wx1 = window
                # Only the core and the blocks' reach become tokens; the rest of the window
                # is read as in-plane context (encoder and context branch).
                ty0, ty1 = max(0, y0 - token_halo), min(ny, y1 + token_halo)
                tx0, tx1 = max(0, x0 - token_halo), min(nx, x1 + token_halo)
                margins = (ty0 - wy0, wy1 - ty1, tx0 - wx0, wx1 - tx1)
                # One cache per tile: it streams through every z.
                cache = model.new_cache(capacity=nz)  # sizes a full (window=None) cache once
                for z0 in range(0, nz, chunk_slices):
                    z1 = min(z0 + chunk_slices, nz)
                    arr = _read_chunk(volume, z0, z1, window, (ny, nx))  # (n, h, w)
                    x = torch.from_numpy(arr).to(device=dev, dtype=dtype)[None]  # (1, n, h, w)
                    logits = model(x, z0=z0, cache=cache, margins=margins)  # (1, n, th, tw)
                    core = logits[0, :, y0 - ty0 : y1 - ty0, x0 - tx0 : x1 - tx0]
                    out[z0:z1, y0:y1, x0:x1] = core.float().sigmoid().cpu().numpy()
                    done += 1
                    if progress is not None:
                        progress(done, total, "predict")
                del cache
    finally:
        model.train(was_training)
    return out
