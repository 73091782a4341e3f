"""The outside of a sample told by grey value: the constant beyond a field of view and the dark rule.

What the slices' border holds against their middle: :func:`constant_level` (one exact grey value,
what a reconstruction writes beyond its field of view, rare in the middle) and :func:`dark_rule`
(a nearly uniform border darker than anything in the middle, judged on 3 x 3 medians:
:class:`DarkRule`, applied by :func:`dark_outside`); :func:`connected_to_border` floods such an
outside in from the slice's border. :mod:`ctpore.data.sample` uses them where no shape, or no
shape alone, tells the outside.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from scipy import ndimage as ndi

__all__ = ["MOUTH", "DarkRule", "connected_to_border", "constant_level", "dark_outside", "dark_rule"]


#: Share of the border pixels that must hold the outside's grey value (exactly, or within its noise).
_BORDER_SHARE = 0.6

#: Border pixels are "nearly uniform" when their spread (IQR) is below this share of the distance
#: from their median to the middle's median.
_UNIFORM = 0.35

#: Dark outside: a pore opening at the sample's surface through a mouth narrower than about
#: 2 * MOUTH + 1 pixels is not taken for outside.
MOUTH = 2


def _border(sl: np.ndarray, width: int = 2) -> np.ndarray:
    return np.concatenate([sl[:width].ravel(), sl[-width:].ravel(), sl[:, :width].ravel(), sl[:, -width:].ravel()])


def _middle(sl: np.ndarray) -> np.ndarray:
    y, x = sl.shape
    return sl[y // 4: y - y // 4, x // 4: x - x // 4].ravel()


def _median3(a: np.ndarray) -> np.ndarray:
    return ndi.median_filter(a, size=3, mode="nearest")


@dataclass(frozen=True)
class DarkRule:
    """The grey-value rule for a dark outside (``dark``): at most ``upper``, judged on each pixel's
    3 x 3 median, connected to the border through more than a narrow mouth, and one pixel more below
    ``rim`` (the partial-volume rim of the surface)."""

    level: float
    upper: float
    rim: float


def _filtered_border_and_middle(sl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``_border`` and ``_middle`` of the slice's 3 x 3 median (``mode="nearest"``), filtering only
    the strips and the box they take (with the one pixel of context each needs): the same values
    as filtering the whole slice."""
    y, x = sl.shape
    w = 2  # _border's width
    top, bottom = _median3(sl[: w + 1])[:w], _median3(sl[-(w + 1):])[-w:]
    left, right = _median3(sl[:, : w + 1])[:, :w], _median3(sl[:, -(w + 1):])[:, -w:]
    y0, y1, x0, x1 = y // 4, y - y // 4, x // 4, x - x // 4  # _middle's box; y0, x0 >= 2 (y, x >= 8)
    mid = _median3(sl[y0 - 1: y1 + 1, x0 - 1: x1 + 1])[1:-1, 1:-1]
    border = np.concatenate([top.ravel(), bottom.ravel(), left.ravel(), right.ravel()])
    return border, mid.ravel()


def dark_rule(slices) -> Optional[DarkRule]:
    """A uniform border darker than anything in the middle of the slices (each pixel judged by its
    3 x 3 median, where the noise is smaller), or None."""
    bf, mf, m = [], [], []
    for sl in slices:
        b, f = _filtered_border_and_middle(sl)
        bf.append(b)
        mf.append(f)
        m.append(_middle(sl))
    bf, mf, m = np.concatenate(bf), np.concatenate(mf), np.concatenate(m)
    b_q, m_q = np.percentile(bf, [25, 50, 75]), np.percentile(mf, [1, 50])
    b_iqr, level = float(b_q[2] - b_q[1]), float(b_q[1])
    if level >= m_q[0] or b_iqr > _UNIFORM * (float(m_q[1]) - level):
        return None
    noise = max(b_iqr / 1.349, 1e-12)
    upper = min(level + 4 * noise, 0.5 * (level + float(m_q[0])))
    if np.count_nonzero(bf <= upper) < _BORDER_SHARE * bf.size:
        return None
    return DarkRule(level, float(upper), 0.5 * (level + float(np.median(m))))


def constant_level(slices) -> Optional[float]:
    """The exact grey value of most of the slices' border when it is rare in their middle, or None."""
    b = np.concatenate([_border(sl) for sl in slices])
    m = np.concatenate([_middle(sl) for sl in slices])
    values, counts = np.unique(b, return_counts=True)
    mode = float(values[np.argmax(counts)])
    if counts.max() >= _BORDER_SHARE * b.size and np.count_nonzero(m == mode) < 0.01 * m.size:
        return mode
    return None


def connected_to_border(cand: np.ndarray, erode: int = 0) -> np.ndarray:
    """Bool ``(Y, X)``: the pixels of ``cand`` connected to the slice's border (4-connected), flooding
    only through what survives an erosion by ``erode`` pixels and then growing back within ``cand``."""
    cross = ndi.generate_binary_structure(2, 1)
    disk = ndi.iterate_structure(cross, erode) if erode else None
    seed = ndi.binary_erosion(cand, disk, border_value=1) if erode else cand
    lab, n = ndi.label(seed, structure=cross)
    out = np.zeros(cand.shape, bool)
    if not n:
        return out
    edge = np.unique(np.concatenate([lab[0], lab[-1], lab[:, 0], lab[:, -1]]))
    keep = np.zeros(n + 1, bool)
    keep[edge] = True
    keep[0] = False
    out = keep[lab]
    if erode:
        out = ndi.binary_dilation(out, disk) & cand
    return out


def dark_outside(raw: np.ndarray, rule: DarkRule) -> np.ndarray:
    """Bool ``(n, Y, X)``: the dark outside of the slices ``raw`` by ``rule`` (see :class:`DarkRule`)."""
    cand = ndi.median_filter(raw, size=(1, 3, 3), mode="nearest") <= rule.upper
    cross = ndi.generate_binary_structure(2, 1)
    out = np.zeros(raw.shape, bool)
    for i in range(raw.shape[0]):
        out[i] = connected_to_border(cand[i], MOUTH)
        out[i] |= ndi.binary_dilation(out[i], cross) & (raw[i] < rule.rim)  # the partial-volume rim
    return out
