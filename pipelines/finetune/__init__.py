"""``ctpore finetune``: a learned method taught a user's scanner and labeller from a few labelled slices.

For each scan its labels (:mod:`ctpore.data.sparse_labels`: 0 not labelled, 1 pore, 2 solid; or a
dense truth with ``dense``) are parted into what trains and what is held back
(:mod:`.holdout`). Then, from the base weights (the shipped ones, or ``weights``):

1. the held-back figures of the base weights as they are;
2. the post-processing refitted on the training labels with the network frozen (:mod:`.refit`:
   threshold, evidence rule, calibration), the cheap first rung (``calibrate_only`` stops here);
3. the network fine-tuned on the training labels (:mod:`.tune`), the post-processing refitted
   again on its probabilities, and the held-back figures once more.

The weights file written (whole or not at all) records its provenance: the base weights' hash,
the scans, the label counts per class, the hold-out, the steps and seconds, and the held-back
figures of each rung. ``reconstruct``, ``batch`` and napari take it with ``--weights``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np

from ctpore.data.io import read_volume
from ctpore.data.normalize import normalize, robust_range
from ctpore.data.sparse_labels import label_counts, read_sparse_labels
from ctpore.data.zmix import mix_volume
from ctpore.errors import InputError
from ctpore.pipelines.finetune.holdout import Split, held_figures, hold_out
from ctpore.pipelines.finetune.refit import raw_probability, refit_on_labels
from ctpore.progress import ProgressFn

__all__ = ["STEPS", "finetune", "finetune_volumes", "network_input"]

PathLike = Union[str, os.PathLike]

#: The most steps a tuning takes unless told otherwise (it also stops itself: :mod:`.tune`), for every
#: method alike: PoreFormer's tuning ran to 300 with its held-back error still falling, and at 600 its
#: MSE and 3D Euler error fell on fresh development scans while the U-Nets, which stop themselves
#: sooner, were unchanged.
STEPS = 600


def network_input(volume: np.ndarray, geometry, sample: Any = "auto") -> np.ndarray:
    """What the network reads of a scan in ``reconstruct``: the outside filled with the sample's
    edge and the grey values normalized with the sample's robust range, float32 ``(Z, Y, X)``."""
    from ctpore.pipelines.sample_mask import prepare_sample

    smask = prepare_sample(volume, geometry, sample)
    try:
        lo, hi = robust_range(volume, outside=smask.outside)
        filled = volume if smask.outside is None else smask.fill(0, volume.shape[0], volume)
        return normalize(np.asarray(filled, np.float32), lo, hi)
    finally:
        smask.close()


def _figures(raw: list, post, splits: list[Split]) -> dict:
    """Held-back figures over every scan (voxel-weighted MSE and Dice, summed 2D Euler errors,
    the mean boundary shift) of what ``reconstruct`` would write with ``post``."""
    rows = [held_figures(mix_volume(r, post.zmix), post.threshold, s, post.calibration,
                         decide=r if post.pores_on_raw else None) for r, s in zip(raw, splits)]
    n = sum(r["voxels"] for r in rows)
    return {"mse": sum(r["mse"] * r["voxels"] for r in rows) / max(n, 1),
            "dice": sum(r["dice"] * r["voxels"] for r in rows) / max(n, 1),
            "euler_2d_error": int(sum(r["euler_2d_error"] for r in rows)),
            "boundary_shift_vox": float(np.mean([r["boundary_shift_vox"] for r in rows])),
            "threshold": float(post.threshold), "held_voxels": int(n)}


def _check_out(out: Path, overwrite: bool) -> Path:
    if out.suffix != ".safetensors":
        raise InputError("the tuned weights are a .safetensors file: name the output so", out)
    if out.exists() and not overwrite:
        raise InputError("exists already; give another name, or --overwrite", out)
    if out.parent.exists() and not out.parent.is_dir():
        raise InputError("the output's folder is a file", out.parent)
    return out


def finetune(scans: Sequence[PathLike], labels: Sequence[PathLike], out: PathLike, *, method: str = "poreformer",
             weights: Optional[PathLike] = None, steps: int = STEPS, minutes: Optional[float] = None, seed: int = 0,
             dense: bool = False, calibrate_only: bool = False, device: str = "cpu", sample: Any = "auto",
             overwrite: bool = False, progress: ProgressFn = None) -> dict:
    """Fine-tune ``method`` on ``labels`` of ``scans`` and write the weights to ``out`` (module
    docstring). Returns the report: ``before``, ``refit``, ``after`` (held-back figures),
    ``split``, ``tuning``, ``weights``."""
    if len(scans) != len(labels) or not scans:
        raise InputError(f"labels and scans must pair up, one --labels per scan in order: got {len(scans)} scan(s) "
                         f"and {len(labels)} label file(s)")
    _trainable(method)
    out = _check_out(Path(out), overwrite)
    t0 = time.perf_counter()
    vols, geoms, labs = [], [], []
    for scan, lab in zip(scans, labels):
        vol, geom = read_volume(scan)
        vols.append(vol)
        geoms.append(geom)
        labs.append(read_sparse_labels(lab, geom, dense=dense))
    return finetune_volumes(vols, geoms, labs, out, sources=[str(s) for s in scans],
                            label_sources=[str(s) for s in labels], method=method, weights=weights, steps=steps,
                            minutes=minutes, seed=seed, calibrate_only=calibrate_only, device=device, sample=sample,
                            progress=progress, t0=t0)


def _trainable(method: str):
    from ctpore.pipelines.methods import get_method

    spec = get_method(method)
    if not spec.trainable:
        raise InputError(f"{spec.name} has no network to tune; choose one of poreformer, unet3d, unet2d")
    return spec


def finetune_volumes(vols: list, geoms: list, labs: list, out: PathLike, *, sources: list, label_sources: list,
                     method: str = "poreformer", weights: Optional[PathLike] = None, steps: int = STEPS,
                     minutes: Optional[float] = None, seed: int = 0, calibrate_only: bool = False,
                     device: str = "cpu", sample: Any = "auto", progress: ProgressFn = None,
                     t0: Optional[float] = None) -> dict:
    """:func:`finetune` on scans and labels in memory (``labs``: checked sparse codes, as napari's
    labels layers hold them); ``sources`` and ``label_sources`` name them in the provenance."""
    from ctpore.models.weights import load_network, read_metadata, save_weights
    from ctpore.pipelines.reconstruct import build_predictor

    spec = _trainable(method)
    out = Path(out)
    t0 = time.perf_counter() if t0 is None else t0
    splits = [hold_out(lab) for lab in labs]
    predictor = build_predictor(spec.name, weights, device)
    base_post, base_sha = predictor.post, predictor.info["model"]["sha256"]
    base_path = Path(weights) if weights is not None else _shipped(spec)
    raw = [raw_probability(v, g, predictor, sample=sample, progress=progress) for v, g in zip(vols, geoms)]
    report: dict = {"before": _figures(raw, base_post, splits)}
    post, tried = refit_on_labels(raw, [s.train for s in splits], base_post)
    report["refit"] = {**_figures(raw, post, splits), "tried": tried}
    model = load_network(base_path, device="cpu")
    tuning = {"steps": 0, "seconds": 0.0, "stopped": "calibrate-only"}
    if not calibrate_only:
        from ctpore.pipelines.finetune.tune import tune_network

        inputs = [network_input(v, g, sample) for v, g in zip(vols, geoms)]
        tuning = tune_network(model, inputs, [s.train for s in splits], [s.held for s in splits], steps=steps,
                              minutes=minutes, seed=seed, progress=progress)
        scratch = _scratch(model, out)
        try:
            tuned = build_predictor(spec.name, scratch, device)
            raw = [raw_probability(v, g, tuned, sample=sample, progress=progress) for v, g in zip(vols, geoms)]
        finally:
            scratch.unlink(missing_ok=True)
        post, tried = refit_on_labels(raw, [s.train for s in splits], base_post)
        report["after"] = {**_figures(raw, post, splits), "tried": tried}
    base_meta = read_metadata(base_path)
    provenance = {"base_weights_sha256": base_sha, "method": spec.name, "seed": seed,
                  "scans": list(sources), "labels": list(label_sources),
                  "label_counts": [label_counts(lab) for lab in labs],
                  "hold_out": [s.how for s in splits], "steps": tuning["steps"], "best_step": tuning.get("best_step"),
                  "ema": tuning.get("ema"),
                  "stopped": tuning["stopped"], "seconds": round(time.perf_counter() - t0, 1),
                  "held_back": {k: {kk: vv for kk, vv in v.items() if kk != "tried"} for k, v in report.items()}}
    meta = {k: v for k, v in base_meta.items() if k not in ("config", "format")}
    meta.update(post.to_metadata())
    meta["name"] = f"{base_meta.get('name', spec.name)} fine-tuned" + (" (calibration only)" if calibrate_only else "")
    meta["finetune"] = json.dumps(provenance, sort_keys=True)
    save_weights(model, out, metadata=meta)
    report.update(split=[s.how for s in splits], tuning={k: v for k, v in tuning.items() if k != "history"},
                  weights=str(out), seconds=provenance["seconds"])
    return report


def _shipped(spec) -> Path:
    from ctpore.models.weights import weights_dir

    return weights_dir() / spec.weights


def _scratch(model, out: Path) -> Path:
    """The tuned network in a hidden scratch file (the caller removes it), to be read as any weights."""
    import tempfile

    from ctpore.models.weights import save_weights

    fd, name = tempfile.mkstemp(prefix=f".{out.stem}.tuning-", suffix=".safetensors",
                                dir=out.parent if out.parent.is_dir() else None)
    os.close(fd)
    return save_weights(model, name)
