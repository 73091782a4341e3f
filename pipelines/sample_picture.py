"""A small picture of the sample found in a scan: its middle slice with the sample's outline.

``ctpore reconstruct`` writes it beside the sample mask (``<stem>_sample.png``) so that a user of
``ctpore batch`` can check hundreds of cores at a glance: the middle slice in grey (its robust
range), the outside tinted blue, the sample's outline in yellow, at most :data:`MAX_SIDE` pixels a
side.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy import ndimage as ndi

from ctpore.atomic import atomic_write

__all__ = ["MAX_SIDE", "MIN_SIDE", "sample_picture", "write_sample_picture"]

#: The picture's longer side at most (pixels); a larger slice is shrunk by a whole factor.
MAX_SIDE = 512

#: A slice smaller than this (its longer side, pixels) is enlarged by a whole factor (nearest).
MIN_SIDE = 256


def sample_picture(grey: np.ndarray, inside: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """RGB uint8 ``(y, x, 3)``: ``grey`` (a slice, ``lo``..``hi`` to black..white) with the outside
    of ``inside`` (bool, the sample) tinted blue and the sample's outline yellow, shrunk to at most
    :data:`MAX_SIDE` a side (block means of the grey, the sample by majority).

    Examples
    --------
    >>> g = np.zeros((8, 8), np.float32); s = np.zeros((8, 8), bool); s[2:6, 2:6] = True
    >>> rgb = sample_picture(g, s, 0.0, 1.0)[::32, ::32]      # (enlarged 32 times: 8 < MIN_SIDE)
    >>> rgb.shape, rgb[2, 2].tolist(), rgb[3, 3].tolist(), rgb[0, 0].tolist()
    ((8, 8, 3), [255, 220, 0], [0, 0, 0], [0, 0, 90])
    """
    grey = np.asarray(grey, np.float32)
    inside = np.asarray(inside, bool)
    f = max(1, int(np.ceil(max(grey.shape) / MAX_SIDE)))
    if f > 1:
        ny, nx = (s // f * f for s in grey.shape)
        grey = grey[:ny, :nx].reshape(ny // f, f, nx // f, f).mean(axis=(1, 3))
        inside = inside[:ny, :nx].reshape(ny // f, f, nx // f, f).mean(axis=(1, 3)) >= 0.5
    up = max(1, MIN_SIDE // max(grey.shape))
    if up > 1:
        grey = np.repeat(np.repeat(grey, up, axis=0), up, axis=1)
        inside = np.repeat(np.repeat(inside, up, axis=0), up, axis=1)
    v = np.clip((grey - lo) / max(hi - lo, 1e-12), 0.0, 1.0)
    rgb = np.repeat((v * 255).astype(np.uint8)[..., None], 3, axis=2)
    out = ~inside
    rgb[out] = (0.5 * rgb[out] + np.array([0, 0, 90])).clip(0, 255).astype(np.uint8)
    edge = inside & ~ndi.binary_erosion(inside, border_value=0)
    rgb[edge] = (255, 220, 0)
    return rgb


def write_sample_picture(path: Path, grey: np.ndarray, inside: np.ndarray, lo: float, hi: float) -> None:
    """Write :func:`sample_picture` as a PNG, whole or not at all."""
    from PIL import Image

    with atomic_write(Path(path)) as tmp:
        Image.fromarray(sample_picture(grey, inside, lo, hi)).save(tmp, format="PNG")
