"""Which of a user's labels are held back to judge a fine-tuning, and the figures judged on them.

The labels lie in planes of one view (the axis along which they fill the fewest planes: XY slices,
XZ or YZ ones) or in strokes. With 3 or more labelled planes, one plane in three is held back (the
second, the fifth, ...); with fewer, a spatial block of about 20% of each plane's labelled pixels
(those furthest along one in-plane axis). What is held back never trains, never chooses a threshold
and never fits a calibration; it only says how far the tuning went.

The held-back figures (:func:`held_figures`): the MSE of the probability and the Dice of the pores
on the held-back voxels, the 2D Euler numbers of the pores in each held-back plane beside the
labels' (8-connected pore, within the labelled pixels), and the mean signed distance, in voxels,
from the predicted pore boundary to the labelled one (positive: pores drawn fatter than the labels).

Examples
--------
>>> lab = np.zeros((6, 8, 8), np.uint8); lab[[0, 2, 4]] = 2; lab[[0, 2, 4], 3:5, 3:5] = 1
>>> split = hold_out(lab)
>>> split.axis, split.planes, split.held_planes
(0, [0, 2, 4], [2])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from scipy import ndimage as ndi

from ctpore.data.calibration import apply_calibration
from ctpore.data.sparse_labels import PORE, UNLABELLED

__all__ = ["Split", "hold_out", "held_figures", "plane_euler_error", "HOLD_SHARE"]

#: The share of each plane's labelled pixels a block hold-out keeps back (fewer than 3 planes).
HOLD_SHARE = 0.2


@dataclass
class Split:
    """The labels parted: ``train`` and ``held`` are the label codes with the other part set to 0.

    ``axis``: the view's axis (0 = XY slices, 1 = XZ, 2 = YZ); ``planes``: its labelled planes;
    ``held_planes``: those held back whole (empty for a block hold-out); ``how``: in words."""

    train: np.ndarray
    held: np.ndarray
    axis: int
    planes: list
    held_planes: list
    how: str


def _planes(labels: np.ndarray, axis: int) -> list:
    other = tuple(a for a in range(3) if a != axis)
    return [int(i) for i in np.flatnonzero((labels != UNLABELLED).any(axis=other))]


def _view_axis(labels: np.ndarray) -> int:
    """The view the user painted in: the axis with the fewest labelled planes (ties: XY first)."""
    return int(np.argmin([len(_planes(labels, a)) for a in range(3)]))


def hold_out(labels: np.ndarray) -> Split:
    """Part ``labels`` (0 / 1 pore / 2 solid) into what trains and what is held back (module docstring)."""
    lab = np.asarray(labels)
    axis = _view_axis(lab)
    planes = _planes(lab, axis)
    held = np.zeros_like(lab)
    if len(planes) >= 3:
        chosen = planes[1::3]
        idx = [slice(None)] * 3
        for p in chosen:
            idx[axis] = p
            held[tuple(idx)] = lab[tuple(idx)]
        how = f"{len(chosen)} of {len(planes)} labelled planes along axis {axis} held back (one in three)"
    else:
        chosen = []
        idx = [slice(None)] * 3
        for p in planes:
            idx[axis] = p
            plane = lab[tuple(idx)]
            coords = np.nonzero(plane != UNLABELLED)
            along = coords[0]  # the plane's first in-plane axis (Y for XY slices)
            cut = np.quantile(along, 1.0 - HOLD_SHARE)
            keep = along >= cut
            hp = np.zeros_like(plane)
            hp[coords[0][keep], coords[1][keep]] = plane[coords[0][keep], coords[1][keep]]
            held[tuple(idx)] = hp
        how = (f"a block of about {HOLD_SHARE:.0%} of the labelled pixels of each of {len(planes)} plane(s) along "
               f"axis {axis} held back")
    train = np.where(held != UNLABELLED, UNLABELLED, lab).astype(np.uint8)
    return Split(train=train, held=held.astype(np.uint8), axis=axis, planes=planes, held_planes=list(chosen),
                 how=how)


def _euler_2d(mask: np.ndarray) -> int:
    from skimage.measure import euler_number

    return int(euler_number(mask, connectivity=2)) if mask.any() else 0


def plane_euler_error(pores: np.ndarray, labels: np.ndarray) -> int:
    """The summed |2D Euler error| of ``pores`` against ``labels`` (0 / 1 pore / 2 solid) over the
    labelled planes of the view painted in (as :func:`hold_out` takes it), each plane's labelled
    pixels only."""
    lab = np.asarray(labels)
    axis = _view_axis(lab)
    idx: list = [slice(None)] * 3
    err = 0
    for plane in _planes(lab, axis):
        idx[axis] = plane
        part = lab[tuple(idx)]
        labelled = part != UNLABELLED
        pred = np.asarray(pores)[tuple(idx)].astype(bool) & labelled
        err += abs(_euler_2d(pred) - _euler_2d(part == PORE))
    return int(err)


def _signed_boundary(pred: np.ndarray, truth: np.ndarray, labelled: np.ndarray) -> tuple[float, float, int, int]:
    """Where the predicted boundary lies against the labelled one: the signed distance to the labels'
    pore boundary (half a voxel at the pixels either side of it; positive outside the labelled
    pores) summed over the predicted pores' inner edge pixels and over their outer edge pixels,
    within the labelled area, with both counts. The mean of the two means is the boundary's shift:
    0 where the boundaries agree, +1 for pores drawn a voxel fatter."""
    if not truth.any() or truth.all():
        return 0.0, 0.0, 0, 0
    signed = np.where(truth, 0.5 - ndi.distance_transform_edt(truth), ndi.distance_transform_edt(~truth) - 0.5)
    cross = ndi.generate_binary_structure(2, 1)
    inner = pred & ~ndi.binary_erosion(pred, cross, border_value=1) & labelled
    outer = ndi.binary_dilation(pred, cross) & ~pred & labelled
    return float(signed[inner].sum()), float(signed[outer].sum()), int(inner.sum()), int(outer.sum())


def held_figures(prob: np.ndarray, threshold: float, split: Split, calibration: Optional[dict] = None,
                 decide: Optional[np.ndarray] = None) -> dict:
    """The held-back figures of a raw probability map (module docstring): ``mse`` (of the
    probability as ``reconstruct`` writes it, ``calibration`` applied), ``dice``, ``euler_2d`` (per
    held plane: ``[pred, labels]``), ``euler_2d_error`` (summed absolute error),
    ``boundary_shift_vox``, ``voxels``; the pores are ``decide`` (default ``prob``) at ``threshold``
    or above."""
    held = split.held
    where = held != UNLABELLED
    truth = held[where] == PORE
    raw = np.asarray(prob)[where].astype(np.float32)
    decide = prob if decide is None else decide
    pores = np.asarray(decide)[where] >= threshold
    p = apply_calibration(raw, calibration).astype(np.float64)
    inter = int(np.count_nonzero(pores & truth))
    denom = int(np.count_nonzero(pores)) + int(np.count_nonzero(truth))
    out = {"voxels": int(where.sum()), "mse": float(np.mean((p - truth) ** 2)),
           "dice": 1.0 if denom == 0 else 2.0 * inter / denom}
    idx = [slice(None)] * 3
    eulers, sums = [], np.zeros(4)
    for plane in (split.held_planes or split.planes):
        idx[split.axis] = plane
        lab = held[tuple(idx)]
        labelled = lab != UNLABELLED
        if not labelled.any():
            continue
        pred = (np.asarray(decide)[tuple(idx)] >= threshold) & labelled
        lab_pore = lab == PORE
        eulers.append([_euler_2d(pred), _euler_2d(lab_pore)])
        sums += _signed_boundary(pred, lab_pore, labelled)
    out["euler_2d"] = eulers
    out["euler_2d_error"] = int(sum(abs(a - b) for a, b in eulers))
    halves = [sums[0] / sums[2] if sums[2] else None, sums[1] / sums[3] if sums[3] else None]
    halves = [h for h in halves if h is not None]
    out["boundary_shift_vox"] = float(np.mean(halves)) if halves else 0.0
    return out

