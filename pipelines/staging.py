"""Chunks between the host and the device without making the device wait.

:func:`~ctpore.pipelines.stream.predict` runs one chunk of slices at a time. On CUDA the GPU
should never wait on the CPU between chunks, so:

- the next chunk is read (and normalized, and checked) by one background thread while the
  current one runs (:func:`read_ahead`);
- on CUDA it is read straight into one of two page-locked (pinned) host buffers, from which the
  copy to the GPU is queued with ``non_blocking=True`` (:class:`Staging`);
- the probabilities come back the same way, into one of two pinned buffers, and are written to
  the output only after the next chunk has been queued on the GPU, so writing (a spill file's
  ``pwrite``) overlaps the GPU's work.

Each pinned buffer is reused two chunks later, after a CUDA event says its copy is done. On CPU
nothing is pinned or deferred: the chunk read ahead is the only change, and the numbers are
those of a plain loop (the same operations on the same values).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, TypeVar

import numpy as np
import torch

__all__ = ["Staging", "read_ahead"]

T = TypeVar("T")
R = TypeVar("R")


def read_ahead(load: Callable[[T], R], items: Iterable[T], enabled: bool = True) -> Iterator[tuple[T, R]]:
    """``(item, load(item))`` in order, loading the next item in a background thread meanwhile.

    At most one load runs ahead of the caller. An exception raised by ``load`` is raised here, at
    the item it belongs to. Closing the iterator early waits for the load in flight.

    Examples
    --------
    >>> [r for _i, r in read_ahead(lambda i: i * i, range(4))]
    [0, 1, 4, 9]
    """
    items = list(items)
    if not enabled or len(items) < 2:
        for item in items:
            yield item, load(item)
        return
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctpore-read-ahead")
    try:
        future = pool.submit(load, items[0])
        for i, item in enumerate(items):
            result = future.result()
            if i + 1 < len(items):
                future = pool.submit(load, items[i + 1])
            yield item, result
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class Staging:
    """Host-side buffers of one ``predict`` call on ``device``.

    Parameters
    ----------
    device : torch.device
        Where the model runs.
    in_elems, out_elems : int
        The most float32 values of one chunk's input window and of its output core.
    overlap : bool, optional
        Use two input and two output buffers and defer each chunk's write until the next chunk
        has been queued. Default: on CUDA only. (On CPU the buffers are ordinary memory; tests
        use it there to check the buffer rotation.)
    """

    def __init__(self, device: torch.device, in_elems: int, out_elems: int, overlap: bool | None = None):
        self.device = device
        cuda = device.type == "cuda"
        self.overlap = cuda if overlap is None else bool(overlap)
        self._in: list[torch.Tensor] = []
        self._out: list[torch.Tensor] = []
        self._in_done: list[Any] = [None, None]  # CUDA events: the copy out of input buffer i is done
        self._pending: tuple | None = None  # (out, index, buffer view, event)
        if self.overlap:
            pin = cuda and torch.cuda.is_available()
            self._in = [torch.empty(in_elems, dtype=torch.float32, pin_memory=pin) for _ in range(2)]
            self._out = [torch.empty(out_elems, dtype=torch.float32, pin_memory=pin) for _ in range(2)]

    # -- host -> device ------------------------------------------------------------------------
    def host_input(self, arr: np.ndarray, slot: int) -> np.ndarray | torch.Tensor:
        """``arr`` (float32) where :meth:`to_device` copies it from: input buffer ``slot % 2``.

        Runs in the read-ahead thread: first waits until the copy that last used the buffer is
        done. Without overlap, ``arr`` itself.
        """
        if not self.overlap:
            return arr
        i = slot % 2
        if self._in_done[i] is not None:
            self._in_done[i].synchronize()
        view = self._in[i][: arr.size].view(arr.shape)  # a view of the pinned tensor
        np.copyto(view.numpy(), arr)
        return view

    def to_device(self, host: np.ndarray | torch.Tensor, slot: int, dtype: torch.dtype) -> torch.Tensor:
        """The chunk on the device as ``dtype``; on CUDA the copy is queued, not waited for."""
        if not self.overlap:
            return torch.from_numpy(host).to(device=self.device, dtype=dtype)
        x = host.to(self.device, non_blocking=True)
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self._in_done[slot % 2] = event
        return x if x.dtype == dtype else x.to(dtype)

    # -- device -> host ------------------------------------------------------------------------
    def write(self, out: Any, index: tuple, prob: torch.Tensor, slot: int) -> int:
        """``out[index] = prob`` (float32 on the device). Returns how many chunks were written now.

        Without overlap the chunk is written at once (1). With it, ``prob`` is copied into output
        buffer ``slot % 2`` without waiting, and the chunk before it is written (0 for the first
        chunk, else 1); :meth:`flush` writes the last one.
        """
        if not self.overlap:
            out[index] = prob.cpu().numpy()
            return 1
        view = self._out[slot % 2][: prob.numel()].view(prob.shape)
        view.copy_(prob, non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
        written = self.flush()
        self._pending = (out, index, view, event)
        return written

    def flush(self) -> int:
        """Write the deferred chunk, if any (waiting for its copy); how many were written."""
        if self._pending is None:
            return 0
        out, index, view, event = self._pending
        self._pending = None
        if event is not None:
            event.synchronize()
        out[index] = view.numpy()
        return 1
