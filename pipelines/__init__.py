"""Whole jobs: reconstruct, evaluate, predict (streaming), train, benchmark, batch.

Every pipeline is a plain function with typed arguments, no printing, and an optional
``progress`` callback ``progress(done: int, total: int, stage: str)``, so the command line, the
napari widget and a Dask task call it the same way.
"""

from __future__ import annotations

from typing import Callable, Optional

ProgressFn = Optional[Callable[[int, int, str], None]]

__all__ = ["ProgressFn", "predict"]


def __getattr__(name: str):
    if name == "predict":
        from ctpore.pipelines.stream import predict

        return predict
    raise AttributeError(f"module 'ctpore.pipelines' has no attribute {name!r}")
