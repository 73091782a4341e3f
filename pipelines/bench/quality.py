"""``ctpore bench quality``: PoreFormer beside the methods users would pick instead.

Cases: simulated scans whose seeds (from :data:`ctpore.data.splits.BENCH_SEED_BASE` on) no
training config can reach, plus the real Leopard sandstone pore geometry scanned by the simulator.
Methods: plain Otsu; the Fiji pipeline (median + Otsu + speck removal); a 2D U-Net slice by slice;
a 3D U-Net; PoreFormer — the U-Nets trained on the same simulated data with the same budget.
A real unlabelled scan adds each method's porosity and Euler number and a picture.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import time
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch

from ctpore.data.calibration import ReliabilityCounter
from ctpore.data.io import load_scan, read_label
from ctpore.data.metrics import betti_numbers, comparison_metrics, euler_number, porosity
from ctpore.data.splits import BENCH_SEED_BASE, check_bench_seeds
from ctpore.data.synthetic import draw_zoom, make_pair, scan_label
from ctpore.errors import InputError
from ctpore.models.weights import read_metadata, weights_dir
from ctpore.pipelines.bench.error_split import BoundaryErrorSplit, boundary_voxels
from ctpore.pipelines.methods import METHODS as METHODS_REGISTRY
from ctpore.pipelines.methods import bench_names, get_method
from ctpore.pipelines.reconstruct import reconstruct
from ctpore.progress import ProgressFn

__all__ = ["LABELS", "Runner", "bench_cases", "bench_quality", "default_shared", "default_leopard"]

#: How the report names them.
LABELS = {name: spec.label for name, spec in METHODS_REGISTRY.items()}


def _n_params(model) -> int:
    return int(sum(p.numel() for p in model.parameters()))


def _short(path) -> str:
    """A data file named by its folder and name: reports carry no machine's absolute paths."""
    p = Path(path)
    return f"{p.parent.name}/{p.name}" if p.parent.name else p.name


def _about(path) -> str:
    """What a data file is, in its own folder's words: the title of a ``SOURCE.md`` beside it (after
    its folder name), else nothing."""
    note = Path(path).parent / "SOURCE.md"
    try:
        title = note.read_text(encoding="utf-8").splitlines()[0].lstrip("# ").strip()
    except (OSError, IndexError, UnicodeDecodeError):
        return ""
    return title.split(" — ", 1)[-1]


def _training(path: Path) -> dict:
    """Steps, batch size, crop, training seconds and post-processing stored in a weights file."""
    meta = read_metadata(path)
    cfg = json.loads(meta.get("train_config", "{}"))
    init = json.loads(meta.get("init_weights", "null") or "null")
    return {"steps": int(meta.get("steps", cfg.get("steps", 0))), "batch_size": cfg.get("batch_size"),
            "init_steps": int(init["steps"]) if init else 0,
            "crop": cfg.get("data", {}).get("crop"), "train_seconds": float(meta.get("train_seconds", "nan")),
            "threads": cfg.get("threads"), "min_size": int(meta.get("min_size", 0)),
            "threshold": float(meta.get("threshold", 0.5)),
            "confidence": None if meta.get("confidence") in (None, "", "None") else float(meta["confidence"])}


class Runner:
    """Holds the built methods; ``run(method, scan) -> (prob, pores, seconds)`` through the one
    reconstruct pipeline, so every method is normalized, post-processed and measured the same way."""

    def __init__(self, methods: Optional[Sequence[str]] = None, device: str = "cpu", weights: Optional[Path] = None):
        methods = bench_names() if methods is None else tuple(methods)
        self.device = device
        self.predictors: dict = {}
        self.params: dict = {m: 0 for m in methods}
        self.training: dict = {}  # method -> how its weights were trained (from their metadata)
        wdir = Path(weights) if weights is not None else weights_dir()
        for m in methods:
            spec = get_method(m)
            path = None
            if spec.weights is not None:
                path = wdir / spec.weights
                if not path.exists():
                    raise InputError(f"no {m} weights; train them with the configs in configs/", path=path)
                self.training[m] = _training(path)
            self.predictors[m] = spec.factory(weights=path, device=device)
            model = getattr(self.predictors[m], "model", None)
            self.params[m] = _n_params(model) if model is not None else 0

    def run(self, method: str, scan: np.ndarray):
        t0 = time.perf_counter()
        res = reconstruct(scan, predictor=self.predictors[method])
        return res.probability, res.pores, time.perf_counter() - t0


def bench_cases(n_sim: int = 8, size: int = 64, leopard: Optional[Union[str, os.PathLike]] = None,
                seed_base: int = BENCH_SEED_BASE, zoom_max: float = 1.0):
    """Yield ``(name, scan, truth)`` for the held-out benchmark cases (simulated from ``seed_base``;
    with ``zoom_max`` > 1, half of them with features enlarged, as :func:`~ctpore.data.synthetic.draw_zoom`).

    ``seed_base`` is absolute: the cases are seeds ``seed_base .. seed_base + n_sim - 1``, which must
    be held out (:func:`ctpore.data.splits.check_bench_seeds`, an InputError at the first case).
    """
    check_bench_seeds(seed_base, n_sim)
    for i in range(n_sim):
        zoom = draw_zoom(seed_base + i, zoom_max)
        scan, truth, info = make_pair(seed_base + i, shape=(size,) * 3, zoom=zoom)
        tag = f", ×{zoom:.1f}" if zoom != 1.0 else ""
        yield f"sim-{i:02d} ({info.get('family', '?')}, φ={float(truth.mean()):.2f}{tag})", scan, truth
    if leopard is not None:
        label = read_label(leopard)
        rng = np.random.default_rng(BENCH_SEED_BASE + 999)
        yield "Leopard sandstone (simulated scan)", scan_label(label, rng), label


def default_shared() -> Optional[Path]:
    """``../shared/data`` beside the repository (or $CTPORE_SHARED_DATA), when present."""
    env = os.environ.get("CTPORE_SHARED_DATA")
    cands = [Path(env)] if env else []
    repo = Path(__file__).resolve().parents[2]  # pipelines/bench/quality.py -> the repository
    cands.append(repo.parent / "shared" / "data")
    for c in cands:
        if c.is_dir():
            return c
    return None


def default_leopard() -> Optional[Path]:
    """The real Leopard sandstone label: the repository's copy in ``tests/data`` (a clone has it),
    else the one in the shared data (:func:`default_shared`); None when neither is there."""
    repo = Path(__file__).resolve().parents[2]
    cands = [repo / "tests" / "data" / "leopard_porespy" / "label.nii.gz"]
    shared = default_shared()
    if shared is not None:
        cands.append(shared / "leopard_porespy" / "label.nii.gz")
    return next((c for c in cands if c.is_file()), None)


def bench_quality(
    n_sim: int = 8,
    size: int = 64,
    leopard: Optional[Union[str, os.PathLike]] = None,
    real_scan: Optional[Union[str, os.PathLike]] = None,
    methods: Optional[Sequence[str]] = None,
    device: str = "cpu",
    progress: ProgressFn = None,
    weights: Optional[Union[str, os.PathLike]] = None,
    seed_base: int = BENCH_SEED_BASE,
    zoom_max: float = 1.0,
    averages=None,
) -> dict:
    """Score every method on every case; return the per-case rows, the means and the real scan.

    ``methods``: the names to score (default: the method table's benchmark columns,
    :func:`~ctpore.pipelines.methods.bench_names`).

    ``weights`` is a folder holding ``poreformer``/``unet2d``/``unet3d.safetensors`` (default:
    the shipped ones in ``models/weights``), so candidate weights are scored before they ship.
    ``seed_base`` (an absolute seed: the cases are ``seed_base + i``, ``i < n_sim``) moves the
    simulated cases to another held-out seed range (e.g. the further unseen scans,
    :data:`ctpore.data.splits.FURTHER`, to decide between candidates on, so that the benchmark's
    cases are never used for that); a range any training config can reach is an InputError
    (:func:`ctpore.data.splits.check_bench_seeds`). ``zoom_max``
    > 1 enlarges the features of half the simulated cases (coarser structures than the default
    benchmark's, as at a finer voxel size).

    ``averages`` (tuples of method names; default: every pair of the learned methods run, and all of
    them when there are three or more) are scored as the voxel-wise mean of their probability maps:
    not a method offered to users, but a measure of how much the models' voxel errors differ (the
    mean of two maps gains a quarter of their mean squared difference over the mean of their MSEs),
    hence of how far one of them could still fall by learning what another knows
    (``result["averages"]``: the mean MSE over cases of each).
    """
    check_bench_seeds(seed_base, n_sim)  # held-out seeds only, before any weights load or scan is simulated
    draw_zoom(0, zoom_max)  # a bad zoom_max is an InputError before any weights load
    methods = bench_names() if methods is None else tuple(methods)
    if averages is None:
        learned = [m for m in methods if get_method(m).weights is not None]
        averages = list(itertools.combinations(learned, 2)) + ([tuple(learned)] if len(learned) > 2 else [])
    averages = [tuple(a) for a in averages]
    for combo in averages:
        if len(combo) < 2 or not set(combo) <= set(methods):
            raise InputError(f"an average needs two or more of the methods run ({', '.join(methods)}), got {combo}")
    runner = Runner(methods, device, None if weights is None else Path(weights))
    cases = list(bench_cases(n_sim, size, leopard, seed_base, zoom_max))
    total = len(cases) * len(methods) + (len(methods) if real_scan else 0)
    done = 0
    rows = []
    reliability = {m: ReliabilityCounter() for m in methods}
    split = {m: BoundaryErrorSplit() for m in methods}
    avg_mse = {a: [] for a in averages}
    for name, scan, truth in cases:
        edge = boundary_voxels(truth)  # one truth, every method
        probs = {}
        for m in methods:
            prob, pores, secs = runner.run(m, scan)
            probs[m] = prob
            r = comparison_metrics(pores, truth, prob=prob, betti=True)
            reliability[m].add(prob, truth)
            split[m].add(prob, truth, edge)
            rows.append({"case": name, "method": m, "seconds": secs, **r})
            done += 1
            if progress is not None:
                progress(done, total, f"{m} on {name}")
        t = truth.astype(np.float64)
        for combo in averages:
            mean_prob = sum(probs[m].astype(np.float64) for m in combo) / len(combo)
            avg_mse[combo].append(float(np.mean((mean_prob - t) ** 2)))
    summary = {}
    for m in methods:
        mr = [r for r in rows if r["method"] == m]
        summary[m] = {k: float(np.mean([r[k] for r in mr]))
                      for k in ("mse", "dice", "euler_error_rel", "b0_error_rel", "b1_error_rel", "b2_error_rel",
                                "porosity_error", "seconds")}
        summary[m]["params"] = runner.params[m]
        rel = reliability[m].summary()
        summary[m]["calibration_ece"], summary[m]["calibration_max_gap"] = rel["ece"], rel["max_gap"]
        summary[m].update(split[m].summary())
    real = None
    if real_scan is not None:
        with load_scan(real_scan) as scan:
            vol, dtype = scan.read(), str(scan.dtype)
        real = {"path": _short(real_scan), "about": _about(real_scan), "shape": list(vol.shape), "dtype": dtype,
                "methods": {}, "pores": {}}
        for m in methods:
            prob, pores, secs = runner.run(m, vol)
            b0, b1, b2 = betti_numbers(pores)
            real["methods"][m] = {"porosity": porosity(pores), "euler_number": euler_number(pores),
                                  "n_pores": b0, "n_tunnels": b1, "n_cavities": b2, "seconds": secs}
            real["pores"][m] = pores
            done += 1
            if progress is not None:
                progress(done, total, f"{m} on the real scan")
        real["volume"] = vol
    return {"rows": rows, "summary": summary, "real": real,
            "averages": [{"methods": list(a), "mse": float(np.mean(v))} for a, v in avg_mse.items()],
            "training": runner.training, "n_sim": n_sim, "size": size,
            "seed_base": seed_base,
            "zoom_max": zoom_max, "leopard": _short(leopard) if leopard else None,
        "leopard_about": _about(leopard) if leopard else None, "torch": torch.__version__,
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"}
