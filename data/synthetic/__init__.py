"""Synthetic pore structures and a micro-CT scanner model, with known truth.

Two halves:

* **Structures** (:func:`make_structure`): boolean pore volumes (1 = pore) on a grid ``oversample``
  times finer than the scan, in four families (:data:`FAMILIES`): polydisperse grain packings,
  bicontinuous smoothed random fields, tubular macropores (roots, burrows) and vesicular blobs,
  isotropic or elongated along an axis. Every family is built as a continuous field thresholded at
  a quantile, so the porosity is the one asked for (to a voxel count on the fine grid).
* **Scanner** (:func:`scan_structure`, :class:`ScannerParams`): partial volume (the fine grid is
  averaged down; the truth is the fine grid's majority), solid texture, point-spread blur, beam
  hardening cupping and ring artefacts around the rotation axis (Z), slice-to-slice drift with
  steps, Gaussian and Poisson noise with in-slice correlation, and an integer output range with
  offset, gain and clipping. Pores are dark, solid bright.

The random ranges of :meth:`ScannerParams.random` are calibrated on a real synchrotron scan of a
carbonate rock (contrast-to-noise ratio about 3.5 to 4.5, noise
correlated over about 0.75 voxel in-slice and 0.6 across slices, slice-mean drift with steps of up
to about 9 % of the pore/solid contrast) and span from that hard case to easy, clean scans.

All randomness comes from one ``numpy.random.Generator``; :func:`make_pair` builds it from a seed,
so a pair is a pure function of its seed (and of its feature zoom, :func:`draw_zoom`).


Rooms
-----
``fields``      random fields, quantile thresholds, anisotropy, the checks the others share.
``structures``  the four pore families on a fine grid (:func:`make_structure`).
``scanner``     the scanner model (:class:`ScannerParams`, :func:`scan_structure`, :func:`scan_label`).
``small_pores`` small isolated pores added to a structure (:func:`draw_small_pores`).
``pairs``       a scan with its truth from one seed (:func:`make_pair`), feature zoom
                (:func:`draw_zoom`), datasets on disk (:func:`write_pairs`).

Examples
--------
>>> scan, truth, info = make_pair(7, shape=(32, 32, 32), family="tubes", porosity=0.2)
>>> scan.dtype.kind, truth.dtype, scan.shape
('u', dtype('uint8'), (32, 32, 32))
>>> abs(info["porosity_truth"] - 0.2) < 0.03
True
"""

from __future__ import annotations

from ctpore.data.synthetic.pairs import VOXEL_SIZE_MM, check_zoom, draw_zoom, make_pair, pair_seed, write_pairs
from ctpore.data.synthetic.scanner import ScannerParams, scan_label, scan_structure
from ctpore.data.synthetic.small_pores import draw_small_pores
from ctpore.data.synthetic.structures import FAMILIES, make_structure

__all__ = [
    "FAMILIES",
    "ScannerParams",
    "make_structure",
    "scan_structure",
    "scan_label",
    "make_pair",
    "draw_zoom",
    "check_zoom",
    "pair_seed",
    "write_pairs",
    "draw_small_pores",
    "VOXEL_SIZE_MM",
]
