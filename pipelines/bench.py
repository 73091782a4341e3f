"""``ctpore bench quality``: PoreFormer beside the methods users would pick instead.

Cases: simulated scans whose seeds (from :data:`ctpore.pipelines.train.BENCH_SEED_BASE` on) no
training config can reach, plus the real Leopard sandstone pore geometry scanned by the simulator.
Methods: plain Otsu; the Fiji pipeline (median + Otsu + speck removal); a 2D U-Net slice by slice;
a 3D U-Net; PoreFormer — the U-Nets trained on the same simulated data with the same budget.
A real unlabelled scan adds each method's porosity and Euler number and a picture.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch

from ctpore.data.errors import InputError
from ctpore.data.metrics import comparison_metrics, euler_number, porosity
from ctpore.data.normalize import normalize_volume
from ctpore.pipelines import ProgressFn
from ctpore.pipelines.train import BENCH_SEED_BASE

METHODS = ("otsu", "filtered_otsu", "unet2d", "unet3d", "poreformer")
LABELS = {
    "otsu": "Otsu",
    "filtered_otsu": "Filtered Otsu (median + Otsu + specks, Fiji)",
    "unet2d": "2D U-Net, slice by slice (MONAI)",
    "unet3d": "3D U-Net (MONAI)",
    "poreformer": "PoreFormer",
}


def weights_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "models" / "weights"


def _load_unet(kind: str, path: Path, calibrated: bool = True):
    from safetensors import safe_open

    from ctpore.models.baselines import build_unet

    if not path.exists():
        raise InputError(f"no trained {kind} weights; train them with configs/train_{kind}.yaml", path=path)
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata()
        sd = {k: fh.get_tensor(k) for k in fh.keys()}
    model = build_unet(json.loads(meta["config"]))
    model.load_state_dict(sd)
    model.min_size = int(meta.get("min_size", 0))  # post-processing chosen on validation scans
    model.threshold = float(meta.get("threshold", 0.5))
    from ctpore.pipelines.reconstruct import _calibration

    model.calibration = _calibration(meta, path) if calibrated else None
    return model.eval()


def n_params(model) -> int:
    return int(sum(p.numel() for p in model.parameters()))


class Runner:
    """Holds the loaded models; ``run(method, scan) -> (prob, pores, seconds)``."""

    def __init__(self, methods=METHODS, device: str = "cpu", weights: Optional[Path] = None):
        self.device = device
        self.models: dict = {}
        self.params: dict = {m: 0 for m in methods}
        self.poreformer_weights: Optional[Path] = None
        wdir = Path(weights) if weights is not None else weights_dir()
        for m in methods:
            if m in ("unet2d", "unet3d"):
                self.models[m] = _load_unet(m, wdir / f"{m}.safetensors")
                self.params[m] = n_params(self.models[m])
            elif m == "poreformer":
                from ctpore.models.weights import load_model

                path = wdir / "poreformer.safetensors"
                if not path.exists():
                    raise InputError("no PoreFormer weights; train them with configs/train.yaml",
                                     path=path)
                self.poreformer_weights = path
                self.params[m] = n_params(load_model(path))

    def run(self, method: str, scan: np.ndarray):
        from ctpore.models.baselines import clean_specks, otsu_segment, predict_unet

        t0 = time.perf_counter()
        if method in ("otsu", "filtered_otsu"):
            vol = normalize_volume(scan)
            if method == "otsu":
                pores, _ = otsu_segment(vol)
            else:
                from ctpore.pipelines.reconstruct import OTSU_MIN_SIZE

                pores, _ = otsu_segment(vol, median_size=3, min_size=OTSU_MIN_SIZE)
            prob = pores.astype(np.float32)
        elif method in ("unet2d", "unet3d"):
            model = self.models[method]
            prob = predict_unet(model, normalize_volume(scan), device=self.device)
            pores = (prob >= model.threshold).astype(np.uint8)  # on the raw probability
            if model.min_size > 1:
                pores = clean_specks(pores, model.min_size)
            if model.calibration is not None:
                from ctpore.data.calibration import apply_calibration

                apply_calibration(prob, model.calibration, out=prob)
        else:
            from ctpore.pipelines.reconstruct import reconstruct

            res = reconstruct(scan, method="poreformer", weights=self.poreformer_weights,
                              device=self.device)
            prob, pores = res.probability, res.pores
        return prob, pores, time.perf_counter() - t0


def bench_cases(n_sim: int = 8, size: int = 64, leopard: Optional[Union[str, os.PathLike]] = None,
                seed_base: int = BENCH_SEED_BASE, zoom_max: float = 1.0):
    """Yield ``(name, scan, truth)`` for the held-out benchmark cases (simulated from ``seed_base``;
    with ``zoom_max`` > 1, half of them with features enlarged, as :func:`~ctpore.data.synthetic.draw_zoom`)."""
    from ctpore.data.synthetic import draw_zoom, make_pair, scan_label

    for i in range(n_sim):
        zoom = draw_zoom(seed_base + i, zoom_max)
        scan, truth, info = make_pair(seed_base + i, shape=(size,) * 3, zoom=zoom)
        tag = f", ×{zoom:.1f}" if zoom != 1.0 else ""
        yield f"sim-{i:02d} ({info.get('family', '?')}, φ={float(truth.mean()):.2f}{tag})", scan, truth
    if leopard is not None:
        from ctpore.data.io import read_label

        label = read_label(leopard)
        rng = np.random.default_rng(BENCH_SEED_BASE + 999)
        yield "Leopard sandstone (simulated scan)", scan_label(label, rng), label


def default_shared() -> Optional[Path]:
    """``../shared/data`` beside the repository (or $CTPORE_SHARED_DATA), when present."""
    env = os.environ.get("CTPORE_SHARED_DATA")
    cands = [Path(env)] if env else []
    cands.append(Path(__file__).resolve().parent.parent.parent / "shared" / "data")
    for c in cands:
        if c.is_dir():
            return c
    return None


def bench_quality(
    n_sim: int = 8,
    size: int = 64,
    leopard: Optional[Union[str, os.PathLike]] = None,
    real_scan: Optional[Union[str, os.PathLike]] = None,
    methods=METHODS,
    device: str = "cpu",
    progress: ProgressFn = None,
    weights: Optional[Union[str, os.PathLike]] = None,
    seed_base: int = BENCH_SEED_BASE,
    zoom_max: float = 1.0,
) -> dict:
    """Score every method on every case; return the per-case rows, the means and the real scan.

    ``weights`` is a folder holding ``poreformer``/``unet2d``/``unet3d.safetensors`` (default:
    the shipped ones in ``models/weights``), so candidate weights are scored before they ship.
    ``seed_base`` moves the simulated cases to another seed range (e.g. further unseen scans to
    decide between candidates on, so that the held-out cases are never used for that); ``zoom_max``
    > 1 enlarges the features of half the simulated cases (coarser structures than the default
    benchmark's, as at a finer voxel size).
    """
    if seed_base < 0:
        raise InputError(f"the seed base must be >= 0, got {seed_base}")
    from ctpore.data.synthetic import draw_zoom

    draw_zoom(0, zoom_max)  # a bad zoom_max is an InputError before any weights load
    runner = Runner(methods, device, None if weights is None else Path(weights))
    cases = list(bench_cases(n_sim, size, leopard, seed_base, zoom_max))
    total = len(cases) * len(methods) + (len(methods) if real_scan else 0)
    done = 0
    rows = []
    from ctpore.data.calibration import ReliabilityCounter

    reliability = {m: ReliabilityCounter() for m in methods}
    for name, scan, truth in cases:
        for m in methods:
            prob, pores, secs = runner.run(m, scan)
            r = comparison_metrics(pores, truth, prob=prob)
            reliability[m].add(prob, truth)
            rows.append({"case": name, "method": m, "seconds": secs, **r})
            done += 1
            if progress is not None:
                progress(done, total, f"{m} on {name}")
    summary = {}
    for m in methods:
        mr = [r for r in rows if r["method"] == m]
        summary[m] = {k: float(np.mean([r[k] for r in mr]))
                      for k in ("mse", "dice", "euler_error_rel", "porosity_error", "seconds")}
        summary[m]["params"] = runner.params[m]
        rel = reliability[m].summary()
        summary[m]["calibration_ece"], summary[m]["calibration_max_gap"] = rel["ece"], rel["max_gap"]
    real = None
    if real_scan is not None:
        from ctpore.data.io import read_volume

        vol, geom = read_volume(real_scan)
        real = {"path": str(real_scan), "methods": {}, "pores": {}}
        for m in methods:
            prob, pores, secs = runner.run(m, vol)
            real["methods"][m] = {"porosity": porosity(pores), "euler_number": euler_number(pores),
                                  "seconds": secs}
            real["pores"][m] = pores
            done += 1
            if progress is not None:
                progress(done, total, f"{m} on the real scan")
        real["volume"] = vol
    return {"rows": rows, "summary": summary, "real": real, "n_sim": n_sim, "size": size, "seed_base": seed_base,
            "zoom_max": zoom_max, "leopard": str(leopard) if leopard else None, "torch": torch.__version__,
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"}


def overlay_png(volume: np.ndarray, pores_by_method: dict, path: Path, slices=None) -> None:
    """A grid of slices (rows) x methods (columns), pores in red over the grey scan."""
    from PIL import Image

    z = volume.shape[0]
    slices = slices or [z // 4, z // 2, (3 * z) // 4]
    v = normalize_volume(volume)
    v = np.clip(v, 0, 1)
    tiles = []
    for s in slices:
        row = []
        g = (v[s] * 255).astype(np.uint8)
        row.append(np.stack([g, g, g], -1))
        for m, pores in pores_by_method.items():
            rgb = np.stack([g, g, g], -1).astype(np.float32)
            mask = pores[s].astype(bool)
            rgb[mask] = 0.45 * rgb[mask] + 0.55 * np.array([255, 40, 40])
            row.append(rgb.astype(np.uint8))
        pad = np.full((g.shape[0], 4, 3), 255, np.uint8)
        tiles.append(np.concatenate(sum(([t, pad] for t in row), [])[:-1], axis=1))
    hpad = np.full((4, tiles[0].shape[1], 3), 255, np.uint8)
    img = np.concatenate(sum(([t, hpad] for t in tiles), [])[:-1], axis=0)
    im = Image.fromarray(img).resize((img.shape[1] * 2, img.shape[0] * 2), Image.NEAREST)
    im.save(path)


def write_report(result: dict, outdir: Union[str, os.PathLike], command: str) -> dict:
    """Write ``benchmark.md``, ``benchmark.json`` and (with a real scan) ``real_scan.png``."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    s = result["summary"]
    lines = [
        "# Benchmark: PoreFormer beside the methods users run instead",
        "",
        f"Reproduce: `{command}` (CPU, {result['machine']}, torch {result['torch']}).",
        "",
        f"Cases: {result['n_sim']} simulated scans of {result['size']}³ voxels "
        + ("whose seeds no training run uses" if result.get("seed_base", BENCH_SEED_BASE) == BENCH_SEED_BASE
           else f"from seed {result['seed_base']} on (not the held-out benchmark seeds)")
        + (f", half of them with features enlarged up to {result['zoom_max']:g}× (marked ×)"
           if result.get("zoom_max", 1.0) != 1.0 else "")
        + (", and the real Leopard sandstone pore geometry (Digital Rocks Portal 317) scanned by ctpore's CT simulator."
           if result["leopard"] else "."),
        "MSE is computed from each method's probability map (0/1 for the thresholding methods; for the learned",
        "models calibrated on validation-range scans, as `ctpore reconstruct` writes it); the relative Euler",
        "error is |χ − χ_true| / max(|χ_true|, 1) with 26-connected pores. Means over cases; lower is better",
        "except Dice.",
        "",
        "| method | MSE | Dice | rel. Euler error | porosity error | seconds | parameters |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for m, v in s.items():
        lines.append(f"| {LABELS[m]} | {v['mse']:.4f} | {v['dice']:.3f} | {v['euler_error_rel']:.3f} | "
                     f"{v['porosity_error']:.4f} | {v['seconds']:.2f} | {v['params']:,} |")
    if "poreformer" in s and "unet2d" in s:
        pf, u2 = s["poreformer"], s["unet2d"]
        de = 100 * (1 - pf["euler_error_rel"] / u2["euler_error_rel"]) if u2["euler_error_rel"] else float("nan")
        dm = 100 * (1 - pf["mse"] / u2["mse"]) if u2["mse"] else float("nan")
        word = lambda d: f"{abs(d):.0f}% {'lower' if d >= 0 else 'higher'}"  # noqa: E731
        lines += ["", f"PoreFormer against the 2D U-Net: relative Euler error {word(de)}, MSE {word(dm)} "
                  "(the seed reports 37% and 22% lower for its model against a CNN)."]
    if all("calibration_ece" in v for v in s.values()):
        lines += ["", "## Can the probabilities be trusted?", "",
                  "Over all cases' voxels, in ten equal bins of the predicted probability: the expected calibration",
                  "error (voxel-weighted mean |mean probability − observed pore fraction|) and the largest gap in a",
                  "bin of at least 1000 voxels. A 0/1 map is as overconfident as it is wrong.", "",
                  "| method | calibration error | largest gap |", "|---|---:|---:|"]
        for m, v in s.items():
            lines.append(f"| {LABELS[m]} | {v['calibration_ece']:.4f} | {v['calibration_max_gap']:.3f} |")
    lines += ["", "## Per case", "", "| case | method | MSE | Dice | rel. Euler error | χ pred | χ true |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['case']} | {r['method']} | {r['mse']:.4f} | {r['dice']:.3f} | "
                     f"{r['euler_error_rel']:.3f} | {r['euler_number_pred']} | {r['euler_number_truth']} |")
    real = result.get("real")
    if real:
        overlay_png(real["volume"], real["pores"], outdir / "real_scan.png")
        lines += ["", "## A real scan (no label)", "",
                  f"`{Path(real['path']).name}`: real synchrotron micro-CT of a carbonate rock (100³, uint16).",
                  "", "| method | porosity | Euler number | seconds |", "|---|---:|---:|---:|"]
        for m, v in real["methods"].items():
            lines.append(f"| {LABELS[m]} | {v['porosity']:.4f} | {v['euler_number']} | {v['seconds']:.2f} |")
        lines += ["", "![slices with pores in red, one column per method](real_scan.png)", "",
                  "Columns: the scan, then " + ", ".join(LABELS[m] for m in real["methods"]) + "; rows: slices at "
                  "1/4, 1/2 and 3/4 of the stack."]
    (outdir / "benchmark.md").write_text("\n".join(lines) + "\n")
    js = {k: v for k, v in result.items() if k != "real"}
    if real:
        js["real"] = {"path": real["path"], "methods": real["methods"]}
    (outdir / "benchmark.json").write_text(json.dumps(js, indent=2, default=float) + "\n")
    return js
