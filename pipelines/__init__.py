"""Whole jobs: reconstruct, evaluate, predict (streaming), train, benchmark.

Every pipeline is a plain function with typed arguments, no printing, and an optional
``progress`` callback (:data:`ctpore.progress.ProgressFn`), so the command line, a notebook and
any other front end call it the same way.
"""

from __future__ import annotations

from ctpore.progress import ProgressFn

__all__ = ["ProgressFn", "predict"]


def __getattr__(name: str):
    if name == "predict":
        from ctpore.pipelines.stream import predict

        return predict
    raise AttributeError(f"module 'ctpore.pipelines' has no attribute {name!r}")
