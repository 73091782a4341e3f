"""A simulated scan with its truth from one seed; feature zoom; datasets written to disk."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Optional

import numpy as np
from scipy import ndimage as ndi

from ctpore.atomic import atomic_write
from ctpore.data.synthetic.fields import check_porosity, check_shape
from ctpore.data.synthetic.scanner import ScannerParams, scan_scene, scan_structure
from ctpore.data.synthetic.scenes import Scene, scene_rng
from ctpore.data.synthetic.small_pores import add_small_pores
from ctpore.data.synthetic.structures import FAMILIES, build_structure
from ctpore.errors import InputError
from ctpore.progress import ProgressFn

__all__ = ["VOXEL_SIZE_MM", "check_zoom", "draw_zoom", "make_pair", "pair_seed", "write_pairs"]

#: Voxel size written into the NIfTI files of :func:`write_pairs` (mm, isotropic).
VOXEL_SIZE_MM = 0.01


def check_zoom(value: Any, name: str = "zoom") -> float:
    """``value`` as a float feature zoom (finite, >= 1; 1 = native scale), else an InputError naming ``name``."""
    try:
        zoom = float(value)
    except (TypeError, ValueError):
        zoom = float("nan")
    if not (math.isfinite(zoom) and zoom >= 1.0):
        raise InputError(f"{name} must be a number >= 1 (1 = native feature scale), got {value!r}")
    return zoom


def _zoom_fine(fine_small: np.ndarray, out_shape: tuple[int, int, int], zoom: float) -> np.ndarray:
    """Enlarge a fine-grid pore structure ``zoom`` times: blur (sigma 0.5), linear zoom, threshold at 0.5.

    Output voxel j along an axis samples input coordinate (j + 0.5) / zoom - 0.5 (voxel-area aligned,
    as :func:`upsample_linear`); the output is ``out_shape`` (bool), the leading corner of the zoomed
    structure.
    """
    f = ndi.gaussian_filter(fine_small.astype(np.float32), 0.5, mode="nearest")
    inv = 1.0 / zoom
    off = 0.5 * inv - 0.5
    z = ndi.affine_transform(f, np.array([inv, inv, inv]), offset=off, output_shape=tuple(out_shape),
                             order=1, mode="nearest", prefilter=False)
    return z >= 0.5


def draw_zoom(seed: int, zoom_max: float) -> float:
    """The feature zoom of simulated scan ``seed`` in a set whose zooms reach ``zoom_max``.

    Half the scans keep their native scale (1.0); the other half are enlarged by a factor
    log-uniform in [1, ``zoom_max``], as when the same material is scanned at a finer voxel size.
    Drawn from its own stream (``seed``, 1), so a set without zoom (``zoom_max`` 1) has exactly the
    scans :func:`make_pair` gives for those seeds.
    """
    zoom_max = check_zoom(zoom_max, "zoom_max")
    if zoom_max == 1.0:
        return 1.0
    rng = np.random.default_rng([int(seed), 1])
    if rng.random() < 0.5:
        return 1.0
    return float(math.exp(rng.uniform(0.0, math.log(zoom_max))))


def make_pair(
    seed: int,
    shape: tuple[int, int, int] = (64, 64, 64),
    family: Optional[str] = None,
    porosity: Optional[float] = None,
    zoom: float = 1.0,
    small_pores: bool = False,
    scene=None,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """One scan with its truth, a pure function of ``seed`` (and ``zoom``).

    Parameters
    ----------
    seed : int
        Seed of ``numpy.random.default_rng``.
    shape : tuple of int
        (Z, Y, X) of the scan.
    family : str, optional
        One of :data:`FAMILIES`; None: drawn from the seed.
    porosity : float, optional
        None: uniform in [0.05, 0.45] from the seed.
    zoom : float
        Feature scale, >= 1: the structure is built on a grid ``zoom`` times smaller and enlarged to
        ``shape`` before it is scanned, so grains, pores and tubes are ``zoom`` times as many voxels
        across (a finer voxel size on the same material); the scanner's blur and noise stay per
        voxel. 1 (the default): the structure is built at ``shape`` directly. The scan shows the
        leading corner of the enlarged structure, so its porosity is that corner's: within a few
        hundredths of the one asked (``info["porosity_truth"]`` is exact).
    small_pores : bool
        Add small isolated pores (1.1 to 2 voxels in radius) to the solid before the scan
        (:func:`~ctpore.data.synthetic.small_pores.add_small_pores`, drawn from their own stream, so
        the rest of the pair is the same as without them). ``info["small_pores"]`` says how many.
    scene : Scene or str, optional
        Where the sample is and what is around it (:mod:`~ctpore.data.synthetic.scenes`): a
        :class:`~ctpore.data.synthetic.scenes.Scene`, the name of a set-up (its sizes drawn from the
        scene's own stream, ``scene_rng(seed)``) or ``"random"`` (any set-up). None: the material
        fills the box, as always. The structure, the scanner's parameters and every random draw of
        the pair are those without a scene; ``info["scene"]`` holds the scene and
        ``info["sample"]`` the true sample (bool, the voxels whose centre is inside the sample),
        ``info["porosity_truth"]`` is then the porosity inside it.

    Returns
    -------
    scan : numpy.ndarray
        (Z, Y, X) uint8 or uint16.
    truth : numpy.ndarray
        (Z, Y, X) uint8, 1 = pore.
    info : dict
        ``family``, ``porosity`` (asked), ``porosity_truth``, ``params`` (ScannerParams as a dict),
        ``structure`` (the structure's own random choices, in the voxels of the grid it was built
        on), ``seed``, ``shape``, ``oversample``, ``zoom``.
    """
    shape = check_shape(shape)
    zoom = check_zoom(zoom)
    rng = np.random.default_rng(seed)
    drawn_family = FAMILIES[int(rng.integers(len(FAMILIES)))]  # always drawn: same stream either way
    drawn_porosity = float(rng.uniform(0.05, 0.45))
    fam = drawn_family if family is None else family
    por = drawn_porosity if porosity is None else check_porosity(porosity)
    params = ScannerParams.random(rng)
    oversample = 2
    if zoom == 1.0:
        fine, meta = build_structure(fam, shape, por, rng, oversample, None, None)
    else:
        small = tuple(max(8, math.ceil(s / zoom)) for s in shape)
        fine_small, meta = build_structure(fam, small, por, rng, oversample, None, None)
        fine = _zoom_fine(fine_small, tuple(s * oversample for s in shape), zoom)
    n_small = 0
    if small_pores:
        fine, n_small = add_small_pores(fine, oversample, seed)
    if scene is None:
        scan, truth = scan_structure(fine, oversample, rng, params)
    else:
        scene = _resolve_scene(scene, seed, shape)
        scan, truth, sample = scan_scene(fine, oversample, rng, params, scene)
    info = {
        "family": fam,
        "porosity": por,
        "porosity_truth": float(truth.mean()),
        "params": params.as_dict(),
        "structure": meta,
        "seed": int(seed),
        "shape": list(shape),
        "oversample": oversample,
        "zoom": zoom,
    }
    if small_pores:
        info["small_pores"] = n_small
    if scene is not None:
        info.update(scene=scene.as_dict(), sample=sample, porosity_truth=float(truth[sample].mean()))
    return scan, truth, info


def _resolve_scene(scene, seed: int, shape: tuple[int, int, int]) -> Scene:
    if isinstance(scene, Scene):
        return scene.validate()
    if scene == "random":
        return Scene.random(scene_rng(seed), shape, (VOXEL_SIZE_MM,) * 3)
    return Scene.setup(str(scene), shape, (VOXEL_SIZE_MM,) * 3, scene_rng(seed))


def _save_nifti(arr: np.ndarray, path: Path, voxel_mm) -> None:
    import nibabel as nib

    dz, dy, dx = (voxel_mm,) * 3 if np.isscalar(voxel_mm) else voxel_mm
    # (Z, Y, X) -> NIfTI (i, j, k) = (X, Y, Z): the slice axis Z is the file's third axis k
    img = nib.Nifti1Image(np.ascontiguousarray(arr.T), np.diag([dx, dy, dz, 1.0]))
    img.header.set_xyzt_units("mm")
    img.header.set_data_dtype(arr.dtype)
    with atomic_write(path) as tmp:
        nib.save(img, str(tmp))


def pair_seed(seed: int, index: int) -> int:
    """Seed of pair ``index`` in a set made with ``seed`` (independent streams via SeedSequence)."""
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1, dtype=np.uint64)[0])


def write_pairs(
    outdir: str | os.PathLike,
    n: int,
    shape: tuple[int, int, int] = (64, 64, 64),
    seed: int = 0,
    progress: ProgressFn = None,
    zoom_max: float = 1.0,
    scene: Optional[str] = None,
) -> list[dict]:
    """Write ``n`` synthetic pairs as NIfTI files with a manifest.

    Files: ``outdir/scan_{i:04d}.nii.gz`` (uint8 or uint16), ``outdir/label_{i:04d}.nii.gz``
    (uint8, 1 = pore), isotropic voxels of :data:`VOXEL_SIZE_MM` mm, the array's Z (slice) axis
    stored as the file's third axis k. ``outdir/manifest.json`` is a JSON list with one entry per
    pair (``index``, ``scan``, ``label`` file names, ``seed``, ``family``, ``porosity``,
    ``porosity_truth``, ``params``, ``structure``, ``shape``, ``voxel_size_mm``). Each file is
    written to a temporary name and renamed; the manifest is written last.

    Pair ``i`` uses seed :func:`pair_seed` ``(seed, i)`` and zoom :func:`draw_zoom` ``(that seed,
    zoom_max)`` (1 for every pair when ``zoom_max`` is 1), so ``make_pair(entry["seed"], shape,
    zoom=entry["zoom"])`` rebuilds it. With a ``scene`` (a set-up's name or ``"random"``,
    :mod:`~ctpore.data.synthetic.scenes`) the scans show the sample in its surroundings, written with
    the scene's voxel size, and ``outdir/sample_{i:04d}.nii.gz`` holds the true sample (1 = sample;
    entry ``sample``).

    Returns
    -------
    list of dict
        The manifest entries.
    """
    if int(n) != n or n < 0:
        raise InputError(f"n must be a non-negative integer, got {n!r}")
    shape = check_shape(shape)
    draw_zoom(0, zoom_max)  # checks zoom_max before anything is written
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for i in range(int(n)):
        s = pair_seed(seed, i)
        scan, truth, info = make_pair(s, shape, zoom=draw_zoom(s, zoom_max), scene=scene)
        scan_name, label_name = f"scan_{i:04d}.nii.gz", f"label_{i:04d}.nii.gz"
        voxel = tuple(info["scene"]["spacing_mm"]) if scene is not None else (VOXEL_SIZE_MM,) * 3
        _save_nifti(scan, out / scan_name, voxel)
        _save_nifti(truth, out / label_name, voxel)
        entry = {"index": i, "scan": scan_name, "label": label_name, "voxel_size_mm": VOXEL_SIZE_MM}
        sample = info.pop("sample", None)
        if sample is not None:
            entry.update(sample=f"sample_{i:04d}.nii.gz", voxel_size_mm=list(voxel))
            _save_nifti(sample.astype(np.uint8), out / entry["sample"], voxel)
        entry.update(info)
        entries.append(entry)
        if progress is not None:
            progress(i + 1, int(n), "synthetic pairs")
    with atomic_write(out / "manifest.json") as tmp, open(tmp, "w") as fh:
        json.dump(entries, fh, indent=1)
    return entries
