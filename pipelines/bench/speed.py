"""Speed benchmark of the attention backends through the real streaming path.

:func:`bench_speed` runs the shipped PoreFormer (or any weights file) through
:func:`ctpore.pipelines.stream.predict` with ``ctpore reconstruct``'s chunk and tile sizes on a
random ``size^3`` volume, once per backend per repeat, the backends interleaved so that the machine's drift hits them alike, and
reports the median voxels per second of each. The same weights are loaded into every backend, so
it also reports how far each backend's output is from the first one's.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ctpore.errors import InputError
from ctpore.models.attention import BACKENDS, resolve_backend
from ctpore.models.poreformer import PoreFormer
from ctpore.models.weights import default_weights_path, load_model
from ctpore.pipelines.reconstruct import DEFAULTS
from ctpore.pipelines.stream import predict
from ctpore.progress import ProgressFn

__all__ = ["bench_speed"]


def bench_speed(
    size: int = 128,
    backends: Sequence[str] = ("math", "sdpa"),
    repeats: int = 3,
    window: int | None = None,
    progress: ProgressFn = None,
    *,
    chunk_slices: int = DEFAULTS["chunk_slices"],
    tile: int = DEFAULTS["tile"],
    weights: str | Path | None = None,
    device: str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Median voxels/s of :func:`~ctpore.pipelines.stream.predict` for each attention backend.

    Parameters
    ----------
    size : int
        The volume is ``size^3`` standard-normal voxels.
    backends : sequence of str
        Backends to time (``math``, ``sdpa``, ``flash``, ``auto``); one that cannot run here
        (``flash`` without a GPU) is reported as unavailable, with the reason.
    repeats : int
        Timed runs per backend, interleaved (math, sdpa, math, sdpa, ...), after one untimed
        warm-up run per backend on a small volume.
    window : int, optional
        Override the model's look-back window (None: the model's own).
    progress : callable, optional
        ``progress(done, total, "bench <backend>")`` after each timed run.
    chunk_slices, tile : int
        Passed to ``predict`` (default: those of ``ctpore reconstruct``).
    weights : path, optional
        The model to time (default: the shipped PoreFormer).
    device : str, optional
        Default CPU.
    seed : int
        Seed of the random volume.

    Returns
    -------
    dict
        ``{"size", "voxels", "window", "repeats", "chunk_slices", "tile", "device",
        "torch_threads", "torch_version", "n_params", "backends": {name: {...}}}`` where each
        available backend has ``voxels_per_s_median``, ``seconds`` (every run),
        ``seconds_median`` and ``max_abs_diff`` (probabilities vs the first backend), and an
        unavailable one ``{"available": False, "reason": ...}``.

    Examples
    --------
    >>> r = bench_speed(size=8, repeats=1)
    >>> sorted(r["backends"])
    ['math', 'sdpa']
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise InputError(f"size must be an integer >= 1, got {size!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InputError(f"repeats must be an integer >= 1, got {repeats!r}")
    backends = list(dict.fromkeys(backends))
    if not backends:
        raise InputError("backends must name at least one of " + ", ".join(BACKENDS))
    dev = torch.device(device) if device is not None else torch.device("cpu")

    path = Path(weights) if weights is not None else default_weights_path()
    if path is None:
        raise InputError("no PoreFormer weights are installed; give a weights file to time")
    base = load_model(path, attention_backend="sdpa")
    config = base.config
    if window is not None:
        config = dataclasses.replace(config, window=window)  # no parameter changes: same weights
    state = base.state_dict()
    models: dict[str, PoreFormer] = {}
    result: dict[str, Any] = {
        "size": size,
        "voxels": size**3,
        "weights": path.name,
        "window": config.window,
        "repeats": repeats,
        "chunk_slices": chunk_slices,
        "tile": tile,
        "device": str(dev),
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "n_params": sum(v.numel() for v in state.values()),
        "backends": {},
    }
    for name in backends:
        try:
            resolved = resolve_backend(name, config.d_model // config.n_heads)
        except InputError as exc:
            if name not in BACKENDS:
                raise
            result["backends"][name] = {"available": False, "reason": str(exc)}
            continue
        m = PoreFormer(dataclasses.replace(config, attention_backend=name))
        m.load_state_dict(state)
        models[name] = m.to(dev).eval()
        result["backends"][name] = {"available": True, "resolved": resolved, "seconds": []}

    rng = np.random.default_rng(seed)
    volume = rng.standard_normal((size, size, size), dtype=np.float32)
    warm = volume[: min(size, 8), : min(size, 32), : min(size, 32)]
    for m in models.values():  # untimed: first-call costs (kernel selection, page faults)
        predict(m, warm, chunk_slices=chunk_slices, tile=tile)

    first: np.ndarray | None = None
    total, done = repeats * len(models), 0
    for rep in range(repeats):
        for name, m in models.items():
            t0 = time.perf_counter()
            prob = predict(m, volume, chunk_slices=chunk_slices, tile=tile)
            dt = time.perf_counter() - t0
            entry = result["backends"][name]
            entry["seconds"].append(dt)
            if rep == 0:
                if first is None:
                    first = prob
                entry["max_abs_diff"] = float(np.abs(prob - first).max())
            done += 1
            if progress is not None:
                progress(done, total, f"bench {name}")
    for name in models:
        entry = result["backends"][name]
        med = statistics.median(entry["seconds"])
        entry["seconds_median"] = med
        entry["voxels_per_s_median"] = size**3 / med
    return result
