"""How a reconstruction spends its memory budget: the post-processing slab and the predictor's share.

The plan is a function of the scan's shape and the budget only (never of what the process happens
to hold at the time), so the same scan with the same budget gives the same tiles, chunks and
slabs, and so the same output bits, from the command line, a batch worker or a notebook.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ctpore.data.postprocess import whole_slab

__all__ = ["BASE_BYTES", "BASE_BYTES_CUDA", "MODEL_BYTES_DEFAULT", "RunPlan", "slab_bytes", "plan_budget", "plan_run"]

#: What the process holds before any scan: Python, PyTorch, the model and the libraries (about
#: 0.25 GB measured on the project's CPU machine; a margin on top).
BASE_BYTES = 320 * 2**20

#: The same for a process that runs on CUDA, whose libraries and context also live in host memory
#: (about 1.2 GB is usual).
BASE_BYTES_CUDA = 1536 * 2**20

#: Kept free of the plan for what the estimates do not see (allocator slack, metrics).
MARGIN_BYTES = 64 * 2**20

#: The predictor's working memory when no budget is given (an in-memory run from Python).
MODEL_BYTES_DEFAULT = 2**30


def slab_bytes(plane: tuple[int, int], n: int) -> int:
    """Working memory of post-processing one slab of ``n`` slices: the probabilities (4 bytes a
    voxel), the labels of the components (8) and a few masks and temporaries (~12)."""
    return int(n * plane[0] * plane[1] * 24)


def plan_budget(shape: tuple[int, int, int], memory_gb: Optional[float], device=None) -> tuple[int, float]:
    """``(slab, predictor_bytes)``: slices per post-processing slab and the predictor's share of
    ``memory_gb`` (GB of host memory for the whole run; None: slabs of about 8 M voxels and
    :data:`MODEL_BYTES_DEFAULT` for the predictor).

    A quarter of what is left after :data:`BASE_BYTES` (:data:`BASE_BYTES_CUDA` for a CUDA
    ``device``) and a margin goes to the slab (at most 64 slices), the rest to the predictor (on
    CUDA: its host staging buffers; the GPU's own memory is planned apart).

    Examples
    --------
    >>> plan_budget((96, 256, 256), 1.5)[0]
    64
    """
    if memory_gb is None:
        return whole_slab(shape), float(MODEL_BYTES_DEFAULT)
    cuda = device is not None and str(device).startswith("cuda")
    budget = memory_gb * 2**30 - (BASE_BYTES_CUDA if cuda else BASE_BYTES) - MARGIN_BYTES
    slab = max(1, min(shape[0], 64, int(budget * 0.25) // max(1, slab_bytes(shape[1:], 1))))
    return slab, budget - slab_bytes(shape[1:], slab)


@dataclass(frozen=True)
class RunPlan:
    """How one run of a predictor on one scan is laid out (:func:`plan_run`).

    Attributes
    ----------
    slab : int
        Slices per post-processing slab.
    model_bytes : float
        The predictor's share of the host memory budget.
    tile, chunk_slices : int or None
        The in-plane tile and the slices per chunk (the user's where given, else the predictor's
        plan; None where the predictor has neither).
    """

    slab: int
    model_bytes: float
    tile: Optional[int]
    chunk_slices: Optional[int]


def plan_run(shape: tuple[int, int, int], predictor: Any, memory_gb: Optional[float] = None,
             gpu_memory_gb: Optional[float] = None, *, tile: Optional[int] = None,
             chunk_slices: Optional[int] = None, precision: str = "auto") -> RunPlan:
    """The one plan of a run: the reconstruction follows it and the disk estimate reads it, so the
    two cannot decide differently. ``predictor`` is a
    :class:`~ctpore.pipelines.methods.Predictor`; its :meth:`plan` is asked only for what the
    user left unset."""
    slab, model_bytes = plan_budget(shape, memory_gb, predictor.device)
    if tile is None or chunk_slices is None:
        planned = predictor.plan(shape, model_bytes, gpu_memory_gb, precision=precision)
        if planned is not None:
            tile = planned[0] if tile is None else tile
            chunk_slices = planned[1] if chunk_slices is None else chunk_slices
    return RunPlan(slab, model_bytes, tile, chunk_slices)
