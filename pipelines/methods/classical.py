"""The thresholding methods as predictors: the Fiji pipeline and a bare global Otsu threshold.

They give 0/1 pores, not probabilities (their post-processing is ``binary``: the probability map
is the final pores). Both stream the scan in chunks of slices.
"""

from __future__ import annotations

from typing import Any, Optional

from ctpore.data.postprocess import Postprocessing
from ctpore.pipelines.methods import Untiled
from ctpore.progress import ProgressFn

__all__ = ["OtsuPredictor", "fiji_pipeline", "plain_otsu"]


class OtsuPredictor(Untiled):
    """A global Otsu threshold of the normalized grey values (pores below it), after an optional
    cubic median filter; specks are removed by the post-processing (``min_size``)."""

    # numpy and scipy on the CPU, whatever device was asked for; chunks of 32 slices, no tiles
    def __init__(self, name: str, median_size: int, min_size: int, device: str = "cpu"):
        self.name = name
        self.median_size = int(median_size)
        self.post = Postprocessing(threshold=0.5, min_size=int(min_size), binary=True)
        self.info = {"model": {"name": name, "sha256": None}, "device": "cpu", "attention_backend": None}

    def predict(self, volume: Any, out: Any, *, budget_bytes: float, progress: ProgressFn = None,
                chunk_slices: Optional[int] = None, tile: Optional[int] = None, precision: str = "auto") -> dict:
        from ctpore.models.classical import otsu_segment

        otsu_segment(volume, median_size=self.median_size, chunk_slices=chunk_slices or 32, progress=progress,
                     out=out)
        return {}


def fiji_pipeline(weights=None, device: str = "cpu", attention_backend=None) -> OtsuPredictor:
    """The ``otsu`` method: 3x3x3 median, global Otsu, specks under 10 voxels removed (as in Fiji)."""
    from ctpore.models.classical import OTSU_MIN_SIZE

    return OtsuPredictor("otsu", median_size=3, min_size=OTSU_MIN_SIZE, device=device)


def plain_otsu(weights=None, device: str = "cpu", attention_backend=None) -> OtsuPredictor:
    """The ``plain-otsu`` method: a global Otsu threshold alone."""
    return OtsuPredictor("plain-otsu", median_size=0, min_size=0, device=device)
