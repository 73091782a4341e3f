"""The sample and its outside: the region of a scan that is not the material.

Real scans are mostly cylindrical cores (or boxes with a margin) with the reconstruction's empty or
air-filled outside around them. Counting that outside as pore gives a confidently wrong porosity,
so every figure of ctpore is of the sample only. :func:`find_outside` looks for an outside from the
border of the slices; :func:`outside_of` then marks it slice by slice:

``constant``
    Most of the slices' border holds one exact grey value (the value a reconstruction writes
    outside its field of view, often 0). The outside is that value, where it is connected to the
    slice's border.
``dark``
    The border is nearly uniform and darker than anything in the middle of the slices (air around
    a core, darker than the pores), judged on each pixel's 3 x 3 neighbourhood median, where the
    noise is smaller. The outside is what is that dark (at most the border's level plus four of its
    noise widths, and below halfway to the middle's darkest percent), where it is connected to the
    slice's border through more than a narrow mouth (a pore open at the surface is not taken in);
    then one more pixel where a voxel is darker than halfway between the air and the material's
    median (the partial-volume rim of the core's surface).

A scan whose border is material (a block of rock filling the volume) has no outside: no rule is
found and every voxel is sample, so its figures are exactly those of the whole volume.

Examples
--------
>>> rng = np.random.default_rng(0)
>>> scan = rng.normal(1000, 50, (6, 40, 40)).astype(np.float32)
>>> zz, yy, xx = np.indices(scan.shape)
>>> scan[(yy - 19.5) ** 2 + (xx - 19.5) ** 2 > 17 ** 2] = 0        # a core inside a zero outside
>>> rule = find_outside(scan)
>>> rule.kind, rule.level
('constant', 0.0)
>>> inside = ~outside_of(scan, rule)
>>> int(inside.sum()) == int(((yy - 19.5) ** 2 + (xx - 19.5) ** 2 <= 17 ** 2).sum())
True
>>> find_outside(rng.normal(1000, 50, (6, 40, 40))) is None        # material up to the border
True
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Optional

import numpy as np
from scipy import ndimage as ndi

__all__ = ["OutsideRule", "find_outside", "outside_of", "describe_rule"]

#: Share of the border pixels that must hold the outside's grey value (exactly, or within its noise).
_BORDER_SHARE = 0.6

#: Border pixels are "nearly uniform" when their spread (IQR) is below this share of the distance
#: from their median to the middle's median.
_UNIFORM = 0.35

#: Dark outside: a pore opening at the sample's surface through a mouth narrower than about
#: 2 * _MOUTH + 1 pixels is not taken for outside.
_MOUTH = 2


@dataclass(frozen=True)
class OutsideRule:
    """How the outside of a scan looks (see the module docstring).

    Attributes
    ----------
    kind : {"constant", "dark"}
    level : float
        The outside's grey value (``constant``) or the border's median (``dark``).
    upper : float
        Voxels at or below this (``dark``; equal to ``level`` for ``constant``) may be outside.
    rim : float
        One pixel more is outside where the grey value is below this (``dark``; else ``-inf``).
    """

    kind: str
    level: float
    upper: float
    rim: float = float("-inf")


def _border(sl: np.ndarray, width: int = 2) -> np.ndarray:
    return np.concatenate([sl[:width].ravel(), sl[-width:].ravel(), sl[:, :width].ravel(), sl[:, -width:].ravel()])


def _middle(sl: np.ndarray) -> np.ndarray:
    y, x = sl.shape
    return sl[y // 4: y - y // 4, x // 4: x - x // 4].ravel()


def find_outside(volume, max_slices: int = 16) -> Optional[OutsideRule]:
    """The rule that marks a scan's outside, or None when the material reaches the border.

    Parameters
    ----------
    volume : array_like or Scan
        Raw grey values ``(Z, Y, X)``, sliceable along Z (``volume[z0:z1]``).
    max_slices : int
        At most this many slices, evenly spaced, are looked at.
    """
    nz, ny, nx = (int(s) for s in volume.shape)
    if ny < 8 or nx < 8:
        return None
    cached = _RULES.get(volume, {}) if _weakrefable(volume) else {}
    if max_slices in cached:
        return cached[max_slices]
    zs = np.unique(np.linspace(0, nz - 1, min(nz, max_slices)).round().astype(int))
    border, middle, border_f, middle_f = [], [], [], []
    for z in zs:
        sl = np.asarray(volume[int(z): int(z) + 1], dtype=np.float64)[0]
        border.append(_border(sl))
        middle.append(_middle(sl))
        # what outside_of judges a dark pixel by: the 3 x 3 median, here only where it is looked at
        b_f, m_f = _filtered_border_and_middle(sl)
        border_f.append(b_f)
        middle_f.append(m_f)
    rule = _find_rule(border, middle, border_f, middle_f)
    if _weakrefable(volume):
        _RULES.setdefault(volume, {})[max_slices] = rule  # a run asks twice (the disk estimate, the mask)
    return rule


def _weakrefable(volume) -> bool:
    return not isinstance(volume, np.ndarray) and hasattr(volume, "__weakref__")


#: find_outside's answer per scan object (a Scan, not an array, whose contents may change).
_RULES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _median3(a: np.ndarray) -> np.ndarray:
    return ndi.median_filter(a, size=3, mode="nearest")


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


def _find_rule(border, middle, border_f, middle_f) -> Optional[OutsideRule]:
    b, m = np.concatenate(border), np.concatenate(middle)
    values, counts = np.unique(b, return_counts=True)
    mode = float(values[np.argmax(counts)])
    if counts.max() >= _BORDER_SHARE * b.size and np.count_nonzero(m == mode) < 0.01 * m.size:
        return OutsideRule("constant", mode, mode)
    bf, mf = np.concatenate(border_f), np.concatenate(middle_f)
    b_q, m_q = np.percentile(bf, [25, 50, 75]), np.percentile(mf, [1, 50])
    b_iqr, level = float(b_q[2] - b_q[1]), float(b_q[1])
    if level >= m_q[0] or b_iqr > _UNIFORM * (float(m_q[1]) - level):
        return None  # the border is material: no darker than the material's darkest, or mixed grey values
    noise = max(b_iqr / 1.349, 1e-12)
    upper = min(level + 4 * noise, 0.5 * (level + float(m_q[0])))
    if np.count_nonzero(bf <= upper) < _BORDER_SHARE * bf.size:
        return None
    return OutsideRule("dark", level, float(upper), rim=0.5 * (level + float(np.median(m))))


def outside_of(raw: np.ndarray, rule: OutsideRule) -> np.ndarray:
    """Bool ``(n, Y, X)``: the outside in slices of raw grey values, each slice on its own (what
    the rule allows, connected to the slice's border; the rim pixel for ``dark``)."""
    raw = np.asarray(raw)
    dark = rule.kind == "dark"
    if dark:  # air is noisy: judge each pixel with its 3 x 3 neighbourhood's median
        cand = ndi.median_filter(raw, size=(1, 3, 3), mode="nearest") <= rule.upper
    else:
        cand = raw == rule.level
    out = np.zeros(raw.shape, bool)
    cross = ndi.generate_binary_structure(2, 1)
    disk = ndi.iterate_structure(cross, _MOUTH)
    for i in range(raw.shape[0]):
        # Dark air may be as dark as the pores: flood only through what stays after an erosion, so
        # that pores open at the sample's surface through a narrow mouth are not taken in, and then
        # grow back over the eroded band (within what the rule allows).
        seed = ndi.binary_erosion(cand[i], disk, border_value=1) if dark else cand[i]
        lab, n = ndi.label(seed, structure=cross)
        if not n:
            continue
        edge = np.unique(np.concatenate([lab[0], lab[-1], lab[:, 0], lab[:, -1]]))
        keep = np.zeros(n + 1, bool)
        keep[edge] = True
        keep[0] = False
        out[i] = keep[lab]
        if dark:
            out[i] = ndi.binary_dilation(out[i], disk) & cand[i]
            out[i] |= ndi.binary_dilation(out[i], cross) & (raw[i] < rule.rim)  # the partial-volume rim
    return out


def describe_rule(rule: Optional[OutsideRule]) -> str:
    """How the outside was found, in words (for the metrics and the warning)."""
    if rule is None:
        return "no outside: the material reaches the border"
    if rule.kind == "constant":
        return f"the constant grey value {rule.level:g} connected to the slices' border"
    return (f"grey values up to {rule.upper:g} (the border's level {rule.level:g}, darker than the material) "
            "connected to the slices' border")
