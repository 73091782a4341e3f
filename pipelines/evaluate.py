"""Compare a pore volume (and optionally its probability map) with a ground truth."""

from __future__ import annotations

import os
from typing import Optional, Union

import numpy as np

from ctpore.errors import InputError
from ctpore.data.io import load_scan, read_label, read_volume
from ctpore.data.metrics import MSE_OF_BINARY, MSE_OF_PROBABILITY, MetricsAccumulator, check_binary
from ctpore.data.postprocess import whole_slab


def evaluate(pred, truth, prob=None, spacing_mm=(1.0, 1.0, 1.0)) -> dict:
    """Metrics of a predicted pore volume against a ground truth.

    Parameters
    ----------
    pred, truth : ndarray, shape (Z, Y, X)
        Binary pore volumes (1 = pore).
    prob : ndarray, optional
        Pore probability in [0, 1]; MSE is computed from it when given, else from ``pred``
        (of a 0/1 volume the MSE is the fraction of voxels that differ: 1 - accuracy).
    spacing_mm : tuple
        Voxel size (z, y, x) in mm, for the connectivity density.

    Returns
    -------
    dict
        The keys ``ctpore reconstruct`` writes with a truth (one :class:`MetricsAccumulator`, so the
        same figures): the volume metrics of ``pred`` (porosity, Euler numbers, connectivity
        density, pores, tunnels and cavities) and the comparison (mse, dice, iou, porosity_error,
        euler_error_rel, the Betti numbers of both and their relative errors, ...), with
        ``mse_of`` saying which volume the MSE is of: :data:`MSE_OF_PROBABILITY`
        (``"probability"``) or :data:`MSE_OF_BINARY` (``"binary pores"``).
    """
    pred = check_binary(np.asarray(pred), what="prediction")
    truth = check_binary(np.asarray(truth), what="ground truth")
    if truth.shape != pred.shape:
        raise InputError(f"prediction and truth must have the same shape, got prediction {pred.shape} "
                         f"and truth {truth.shape}")
    if pred.ndim != 3:
        raise InputError(f"prediction must be a 3D (Z, Y, X) volume, got shape {pred.shape}")
    if prob is not None:
        prob = np.asarray(prob, dtype=np.float32)
        if prob.shape != pred.shape:
            raise InputError(f"probability shape {prob.shape} differs from prediction shape {pred.shape}")
    acc = MetricsAccumulator(pred.shape, spacing_mm, truth=True)
    step = whole_slab(pred.shape)
    for z0 in range(0, pred.shape[0], step):
        sl = slice(z0, z0 + step)
        acc.add(pred[sl], None if prob is None else prob[sl], truth[sl])
    out = {}
    for k, v in acc.result().items():
        out[k] = v
        if k == "mse":  # say which volume the MSE is of, right beside it
            out["mse_of"] = MSE_OF_PROBABILITY if prob is not None else MSE_OF_BINARY
    return out


def evaluate_files(
    pred_path: Union[str, os.PathLike],
    truth_path: Union[str, os.PathLike],
    prob_path: Optional[Union[str, os.PathLike]] = None,
    slice_axis: Optional[int] = None,
) -> dict:
    """:func:`evaluate` on files (NIfTI or TIFF); the spacing is the prediction's."""
    with load_scan(pred_path, slice_axis=slice_axis) as scan:  # one open: geometry and data
        geometry = scan.geometry
        pred = check_binary(scan.read(), path=pred_path, what="prediction")
    truth = read_label(truth_path, slice_axis=slice_axis, like=geometry)
    prob = None
    if prob_path is not None:
        prob, _ = read_volume(prob_path, slice_axis=slice_axis)
        if prob.shape != pred.shape:
            raise InputError(f"shape {prob.shape} differs from the prediction's {pred.shape}", path=prob_path)
        if prob.min() < 0 or prob.max() > 1:
            raise InputError(
                f"values must be probabilities in [0, 1], found [{prob.min():g}, {prob.max():g}]", path=prob_path
            )
    out = evaluate(pred, truth, prob=prob, spacing_mm=geometry.spacing_mm)
    out["spacing_mm_zyx"] = [float(s) for s in geometry.spacing_mm]
    out["shape_zyx"] = [int(s) for s in pred.shape]
    from ctpore.pipelines.outputs import finish_metrics

    return finish_metrics(out, geometry, str(pred_path))  # units as reconstruct reports them
