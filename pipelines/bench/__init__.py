"""Benchmarks: quality against the methods users would pick instead, and speed.

Rooms
-----
``quality``  ``ctpore bench quality``: every method on held-out simulated scans and a real geometry.
``report``   its Markdown, JSON and picture.
``speed``    ``ctpore bench speed``: voxels per second of the shipped PoreFormer per attention backend.
``gpu``      ``ctpore bench gpu``: the checks and figures that need a CUDA GPU, in one short run.
"""

from __future__ import annotations

from ctpore.data.splits import BENCH_SEED_BASE
from ctpore.models.weights import weights_dir
from ctpore.pipelines.bench.quality import (LABELS, Runner, bench_cases, bench_quality, default_leopard,
                                            default_shared)
from ctpore.pipelines.bench.report import overlay_png, write_report

__all__ = [
    "BENCH_SEED_BASE",
    "LABELS",
    "Runner",
    "bench_cases",
    "bench_quality",
    "default_shared",
    "default_leopard",
    "overlay_png",
    "weights_dir",
    "write_report",
]
