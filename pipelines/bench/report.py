"""The benchmark's report: ``benchmark.md``, ``benchmark.json`` and a picture of the real scan."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Union

import numpy as np

from ctpore.atomic import atomic_write, write_lines_atomic
from ctpore.data.normalize import normalize_volume
from ctpore.data.splits import BENCH_SEED_BASE
from ctpore.pipelines.bench.quality import LABELS

__all__ = ["overlay_png", "write_report"]


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
        for _m, pores in pores_by_method.items():
            rgb = np.stack([g, g, g], -1).astype(np.float32)
            mask = pores[s].astype(bool)
            rgb[mask] = 0.45 * rgb[mask] + 0.55 * np.array([255, 40, 40])
            row.append(rgb.astype(np.uint8))
        pad = np.full((g.shape[0], 4, 3), 255, np.uint8)
        tiles.append(np.concatenate(sum(([t, pad] for t in row), [])[:-1], axis=1))
    hpad = np.full((4, tiles[0].shape[1], 3), 255, np.uint8)
    img = np.concatenate(sum(([t, hpad] for t in tiles), [])[:-1], axis=0)
    im = Image.fromarray(img).resize((img.shape[1] * 2, img.shape[0] * 2), Image.NEAREST)
    with atomic_write(path) as tmp:
        im.save(tmp)


def _lower(a, b) -> str:
    """``"37% lower"`` (a against b), ``"12% higher"``, or ``"?"`` when either is missing or b is 0."""
    if a is None or b is None or not b:
        return "?"
    d = 100 * (1 - a / b)
    return f"{abs(d):.0f}% {'lower' if d >= 0 else 'higher'}"


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
        + (f", and a real pore geometry (`{result['leopard']}`"
           + (f": {result['leopard_about']}" if result.get("leopard_about") else "")
           + ") scanned by ctpore's CT simulator." if result["leopard"] else "."),
        "MSE is computed from each method's probability map (0/1 for the thresholding methods; for the learned",
        "models calibrated on validation-range scans, as `ctpore reconstruct` writes it); the relative Euler",
        "error is |χ − χ_true| / max(|χ_true|, 1) with 26-connected pores, and the relative b0 and b1 errors the",
        "same for the Betti numbers: b0 the pores (components), b1 the tunnels (independent loops). An Euler error",
        "can cancel (pores lost against tunnels lost); the Betti errors cannot. Means over cases; lower is better",
        "except Dice.",
        "",
        "| method | MSE | Dice | rel. Euler error | rel. b0 error | rel. b1 error | porosity error | seconds "
        "| parameters |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m, v in s.items():
        lines.append(f"| {LABELS[m]} | {v['mse']:.4f} | {v['dice']:.3f} | {v['euler_error_rel']:.3f} | "
                     f"{v.get('b0_error_rel', float('nan')):.3f} | {v.get('b1_error_rel', float('nan')):.3f} | "
                     f"{v['porosity_error']:.4f} | {v['seconds']:.2f} | {v['params']:,} |")
    for other in ("unet2d", "unet3d"):
        if "poreformer" in s and other in s:
            pf, u = s["poreformer"], s[other]
            lines += ["",
                      f"PoreFormer against the {LABELS[other]}: " + ", ".join(
                          f"{name} {_lower(pf.get(k), u.get(k))}" for name, k in
                          (("relative Euler error", "euler_error_rel"), ("MSE", "mse"), ("b0 error", "b0_error_rel"),
                           ("b1 error", "b1_error_rel"))) + "."]
    if result.get("training"):
        lines += ["", "## How the learned models were trained", "",
                  "From each weights file's metadata: all on the same simulated training volumes and crops; the",
                  "post-processing (the threshold whose components are pores, the confidence a component must",
                  "reach to be kept, or a speck size) was chosen on validation-range scans at export.", "",
                  "| method | training steps | batch | crop (Z, Y, X) | training seconds | threads | post-processing |",
                  "|---|---:|---:|---|---:|---:|---|"]
        for m, v in result["training"].items():
            crop = " × ".join(str(c) for c in v["crop"]) if v.get("crop") else "?"
            post = [f"threshold {v['threshold']:g}" if v.get("threshold", 0.5) != 0.5 else "",
                    f"confidence {v['confidence']:g}" if v.get("confidence") is not None else "",
                    f"specks under {v['min_size']} voxels" if v.get("min_size", 0) > 1 else ""]
            steps = (f"{v['steps']} ({v['steps'] - v['init_steps']} continued from {v['init_steps']})"
                     if v.get("init_steps") else f"{v['steps']}")
            lines.append(f"| {LABELS[m]} | {steps} | {v['batch_size']} | {crop} | {v['train_seconds']:.0f} | "
                         f"{v['threads']} | {', '.join(p for p in post if p) or 'threshold only'} |")
    if all("calibration_ece" in v for v in s.values()):
        lines += ["", "## Can the probabilities be trusted?", "",
                  "Over all cases' voxels, in ten equal bins of the predicted probability: the expected calibration",
                  "error (voxel-weighted mean |mean probability − observed pore fraction|) and the largest gap in a",
                  "bin of at least 1000 voxels. A 0/1 map is as overconfident as it is wrong.", "",
                  "| method | calibration error | largest gap |", "|---|---:|---:|"]
        for m, v in s.items():
            lines.append(f"| {LABELS[m]} | {v['calibration_ece']:.4f} | {v['calibration_max_gap']:.3f} |")
    if s and all("mse_boundary" in v for v in s.values()):
        share = next(iter(s.values()))["boundary_share"]
        lines += ["", "## Where the voxel error lies", "",
                  "Over all cases' voxels: the squared error of each method's probability map on the voxels of the",
                  f"true pore boundary (a face neighbour of the other phase: {share:.1%} of the voxels, those whose",
                  "label is a sub-voxel decision under blur and partial volume) and on the interior of either phase.",
                  "", "| method | MSE on boundary voxels | MSE on interior voxels | "
                  "share of the squared error on the boundary |",
                  "|---|---:|---:|---:|"]
        for m, v in s.items():
            lines.append(f"| {LABELS[m]} | {v['mse_boundary']:.4f} | {v['mse_interior']:.5f} | "
                         f"{v['boundary_error_share']:.1%} |")
    if result.get("averages"):
        best = min(s, key=lambda m: s[m]["mse"])
        ref = "unet2d" if "unet2d" in s else best
        lines += ["", "## How far averaging the models reaches", "",
                  "The voxel-wise mean of two or more methods' probability maps, scored as a method is (mean MSE over",
                  "cases). Not a method ctpore offers (it costs every model's run and is not PoreFormer). The mean of",
                  "two maps has the mean of their MSEs less a quarter of their mean squared difference: it gains only",
                  "where the models disagree, so it shows how much voxel error one of these models leaves that another",
                  "does not; where they all err alike, no average gains.", "",
                  f"| average of | MSE | against the {LABELS[ref]} | against the best single method ({LABELS[best]}) |",
                  "|---|---:|---:|---:|"]
        for a in result["averages"]:
            lines.append(f"| {' + '.join(LABELS[m] for m in a['methods'])} | {a['mse']:.4f} | "
                         f"{_lower(a['mse'], s[ref]['mse'])} | {_lower(a['mse'], s[best]['mse'])} |")
    lines += ["", "## Per case", "",
              "| case | method | MSE | Dice | rel. Euler error | χ pred | χ true | b0 pred / true | b1 pred / true "
              "| b2 pred / true |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        betti = " | ".join(f"{r[f'b{k}_pred']} / {r[f'b{k}_truth']}" if f"b{k}_pred" in r else "?" for k in range(3))
        lines.append(f"| {r['case']} | {r['method']} | {r['mse']:.4f} | {r['dice']:.3f} | "
                     f"{r['euler_error_rel']:.3f} | {r['euler_number_pred']} | {r['euler_number_truth']} | {betti} |")
    real = result.get("real")
    if real:
        overlay_png(real["volume"], real["pores"], outdir / "real_scan.png")
        lines += ["", "## A real scan (no label)", "",
                  f"`{real['path']}` ({' × '.join(str(n) for n in real['shape'])}, {real['dtype']})"
                  + (f": {real['about']}." if real.get("about") else "."),
                  "", "| method | porosity | Euler number | pores (b0) | tunnels (b1) | cavities (b2) | seconds |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for m, v in real["methods"].items():
            lines.append(f"| {LABELS[m]} | {v['porosity']:.4f} | {v['euler_number']} | {v.get('n_pores', '?')} | "
                         f"{v.get('n_tunnels', '?')} | {v.get('n_cavities', '?')} | {v['seconds']:.2f} |")
        lines += ["", "![slices with pores in red, one column per method](real_scan.png)", "",
                  "Columns: the scan, then " + ", ".join(LABELS[m] for m in real["methods"]) + "; rows: slices at "
                  "1/4, 1/2 and 3/4 of the stack."]
    write_lines_atomic(outdir / "benchmark.md", lines)
    js = {k: v for k, v in result.items() if k != "real"}
    if real:
        js["real"] = {k: real[k] for k in ("path", "about", "shape", "dtype", "methods") if k in real}
    with atomic_write(outdir / "benchmark.json") as tmp:
        tmp.write_text(json.dumps(js, indent=2, default=float) + "\n")
    return js
