"""ctpore: the 3D pore space of soil and rock from X-ray micro-CT scans.

The Python API for notebooks::

    import ctpore
    scan = ctpore.load_scan("scan.nii.gz")
    result = ctpore.reconstruct(scan, method="otsu")
    result.pores, result.probability, result.metrics
    ctpore.evaluate(result.pores, truth)

Submodules load lazily, so ``import ctpore`` stays cheap (no torch import until needed).
"""

from __future__ import annotations

from ctpore.version import __version__

__all__ = ["__version__", "load_scan", "reconstruct", "evaluate"]


def __getattr__(name: str):
    # Lazy so that `import ctpore` does not import torch; see PEP 562.
    if name == "load_scan":
        from ctpore.data.io import load_scan

        return load_scan
    if name == "reconstruct":
        from ctpore.pipelines.reconstruct import reconstruct

        return reconstruct
    if name == "evaluate":
        from ctpore.pipelines.evaluate import evaluate

        return evaluate
    raise AttributeError(f"module 'ctpore' has no attribute {name!r}")
