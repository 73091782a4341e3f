"""``ctpore bench adapt``: adapting to a scanner and a labeller ctpore never met, from a few slices.

The scans come from a scanner model of this module, not ctpore's simulator, with what that
simulator lacks (:func:`other_scanner`): phase-contrast fringes at the pore walls (an overshoot on
either side of every edge, as synchrotron scans have), beam-hardening cupping, a blur with long
tails (two Gaussians), and Poisson noise at low counts. The pores are ctpore's four families
(held-out seeds, one scan per family), and the labels are drawn as another labeller draws them:
the boundary a voxel inside our convention on half the scans and a voxel outside on the others.

Each scan has ``k`` labelled XY slices, spread evenly (1 and 3 for PoreFormer, 3 for the U-Nets);
every method is scored on the slices at least :data:`GAP` slices from any labelled one, in blocks of
contiguous such slices: the MSE of the probability and the Dice of the pores against the labeller's
truth, and the 3D Euler number of each block's pores against the truth's, the absolute errors
summed. Set beside: the Fiji pipeline, each learned method as shipped, PoreFormer with only its
post-processing refitted (``--calibrate-only``), and the tuned models, with the seconds each
adaptation took.

Given a real segmented rock's label (``real``; the command takes the Leopard sandstone the tests
hold), the same is run on it, scanned by the same scanner model and labelled by both labellers, and
reported on its own, apart from the means: a pore geometry no simulator drew.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import numpy as np
from scipy import ndimage as ndi

from ctpore.data.sparse_labels import PORE, SOLID
from ctpore.data.splits import FURTHER_SEED_BASE
from ctpore.pipelines.finetune import STEPS
from ctpore.progress import ProgressFn

__all__ = ["ADAPT_DEV_SEED_BASE", "ADAPT_SEED_BASE", "GAP", "adapt_case", "other_scanner", "labeller", "scored_blocks",
           "bench_adapt", "real_cases", "write_adapt_report", "adapt_picture"]

#: The held-out seeds of the scans' pore structures (the further held-out block, apart from the
#: sample benchmark's 2600000).
ADAPT_SEED_BASE = FURTHER_SEED_BASE + 700_000

#: Scans of the bench's kind that it never scores (its scan i is ADAPT_SEED_BASE + i, i < 50): where a
#: setting of the fine-tuning is chosen (scripts/adapt_dev_variants.py), so the bench stays a test.
ADAPT_DEV_SEED_BASE = ADAPT_SEED_BASE + 50

#: Slices scored lie at least this far from any labelled slice.
GAP = 4


def other_scanner(truth: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A uint16 scan of ``truth`` (1 pore) by a scanner unlike ctpore's simulator (module docstring)."""
    solid = 1.0 - truth.astype(np.float32)
    occ = ndi.gaussian_filter(solid, 0.5)  # partial volume at the walls
    fringe = float(rng.uniform(0.15, 0.3))
    img = occ - fringe * ndi.gaussian_laplace(occ, 1.0)  # phase contrast: dark and bright bands at each edge
    img = 0.8 * ndi.gaussian_filter(img, 0.7) + 0.2 * ndi.gaussian_filter(img, 2.5)  # long-tailed blur
    z, y, x = np.indices(truth.shape, dtype=np.float32)
    r2 = ((y - truth.shape[1] / 2) ** 2 + (x - truth.shape[2] / 2) ** 2) / (0.5 * max(truth.shape[1:])) ** 2
    img = img * (1.0 - float(rng.uniform(0.1, 0.25)) * np.clip(1.0 - r2, 0.0, 1.0))  # cupping: darker on the axis
    counts = float(rng.uniform(40.0, 90.0))  # low counts: Poisson noise
    lam = np.clip(0.15 + img, 0.01, None) * counts
    noisy = rng.poisson(lam).astype(np.float32) / counts
    return np.clip(noisy * 20000.0 + 5000.0, 0, 65535).astype(np.uint16)


def adapt_case(i: int, shape=(128, 256, 256), seed_base: int = ADAPT_SEED_BASE):
    """Scan ``i`` of the bench (from ``seed_base``; other bases give scans apart from it): its pore
    family by turn, ``(scan, truth, labelled)`` with the scan by :func:`other_scanner`, the truth
    as ctpore draws it (1 pore) and the labeller's, a voxel inside (even ``i``) or outside (odd)."""
    from ctpore.data.synthetic import make_pair
    from ctpore.data.synthetic.structures import FAMILIES

    seed = seed_base + i
    _scan, truth, _ = make_pair(seed, shape=tuple(shape), family=FAMILIES[i % len(FAMILIES)])
    scan = other_scanner(truth, np.random.default_rng([seed, 7]))
    return scan, truth, labeller(truth, outside=bool(i % 2))


def labeller(truth: np.ndarray, outside: bool) -> np.ndarray:
    """The truth as a labeller who draws the pores' boundary a voxel outside (or inside) ours."""
    t = truth.astype(bool)
    return (ndi.binary_dilation(t) if outside else ndi.binary_erosion(t, border_value=1)).astype(np.uint8)


def labelled_slices(nz: int, k: int) -> list[int]:
    """``k`` XY slices spread evenly through ``nz``."""
    return [int(round((i + 1) * nz / (k + 1))) for i in range(k)]


def scored_blocks(nz: int, labelled: list[int]) -> list[tuple[int, int]]:
    """The runs of slices at least :data:`GAP` from every labelled one, as ``(z0, z1)``."""
    ok = np.array([all(abs(z - s) >= GAP for s in labelled) for z in range(nz)])
    blocks, z = [], 0
    while z < nz:
        if ok[z]:
            z1 = z
            while z1 < nz and ok[z1]:
                z1 += 1
            blocks.append((z, z1))
            z = z1
        else:
            z += 1
    return blocks


def score(prob: np.ndarray, pores: np.ndarray, truth: np.ndarray, blocks: list) -> dict:
    """MSE, Dice and the summed |3D Euler error| over ``blocks`` (module docstring)."""
    from ctpore.data.topology import euler_number

    sq, n, inter, sp, st, chi = 0.0, 0, 0, 0, 0, 0
    for z0, z1 in blocks:
        p, q, t = prob[z0:z1].astype(np.float64), pores[z0:z1].astype(bool), truth[z0:z1].astype(bool)
        sq, n = sq + float(((p - t) ** 2).sum()), n + t.size
        inter, sp, st = inter + int((q & t).sum()), sp + int(q.sum()), st + int(t.sum())
        chi += abs(euler_number(q.astype(np.uint8)) - euler_number(t.astype(np.uint8)))
    return {"mse": sq / max(n, 1), "dice": 1.0 if sp + st == 0 else 2.0 * inter / (sp + st), "euler_error": int(chi)}


def _runs(methods) -> list:
    """``(method, k, rung, calibrate_only)`` of every row of a case, in the report's order."""
    runs = [("otsu", None, None, False), ("poreformer", None, None, False)]
    runs += [(m, None, None, False) for m in methods if m != "poreformer"]
    runs += [("poreformer", 3, "refit", True), ("poreformer", 1, "tuned", False), ("poreformer", 3, "tuned", False)]
    return runs + [(m, 3, "tuned", False) for m in methods if m != "poreformer"]


def _one_case(tag: str, scan: np.ndarray, truth: np.ndarray, row: dict, methods, steps, minutes, workdir: Path,
              figure: Optional[dict], progress: ProgressFn, what: str) -> dict:
    """Every method and rung on one scan (``truth``: the labeller's): ``row`` with its ``methods``
    filled; the pores the report's picture shows go into ``figure`` when it is given."""
    import nibabel as nib

    from ctpore.pipelines.finetune import finetune
    from ctpore.pipelines.reconstruct import reconstruct

    affine = np.diag([0.005, 0.005, 0.005, 1.0])
    scan_path = workdir / f"scan_{tag}.nii.gz"
    nib.save(nib.Nifti1Image(np.ascontiguousarray(scan.T), affine), scan_path)
    runs, nz = _runs(methods), scan.shape[0]
    for method, k, rung, cal_only in runs:
        name = method if k is None else f"{method} {rung} k={k}"
        weights, seconds = None, 0.0
        labelled = labelled_slices(nz, k or 3)
        if k is not None:
            lab = np.zeros(truth.shape, np.uint8)
            for z in labelled:
                lab[z] = np.where(truth[z] == 1, PORE, SOLID)
            lab_path = workdir / f"labels_{tag}_k{k}.nii.gz"
            nib.save(nib.Nifti1Image(np.ascontiguousarray(lab.T), affine), lab_path)
            weights = workdir / f"w_{tag}_{method}_{rung}_k{k}.safetensors"
            t0 = time.perf_counter()
            finetune([scan_path], [lab_path], weights, method=method, steps=steps, minutes=minutes,
                     calibrate_only=cal_only, overwrite=True)
            seconds = time.perf_counter() - t0
        r = reconstruct(scan, method=method, weights=weights, spacing_mm=(0.005, 0.005, 0.005))
        if figure is not None and method == "poreformer" and rung in (None, "tuned") and k in (None, 3):
            figure[name] = r.pores
        row["methods"][name] = {**score(r.probability, r.pores, truth, scored_blocks(nz, labelled)),
                                "adapt_seconds": round(seconds, 1)}
        if progress is not None:
            progress(len(row["methods"]), len(runs), f"{what}: {name}")
    if figure is not None:
        figure.update(scan=scan, truth=truth, labelled=labelled_slices(nz, 3),
                      scored=scored_blocks(nz, labelled_slices(nz, 3)))
    return row


def real_cases(label_path) -> list:
    """The real pore geometry's cases: ``(labeller, scan, labeller's truth)``, the label read (1 pore)
    and scanned once by :func:`other_scanner`, labelled a voxel inside ours and a voxel outside."""
    from ctpore.data.io import read_label

    truth = np.asarray(read_label(label_path)).astype(np.uint8)
    scan = other_scanner(truth, np.random.default_rng([ADAPT_SEED_BASE, 999]))
    return [(side, scan, labeller(truth, outside=side == "outside")) for side in ("inside", "outside")]


def bench_adapt(shape=(128, 256, 256), n_scans: int = 4, steps: int = STEPS, minutes: Optional[float] = 10.0,
                methods=("poreformer", "unet2d", "unet3d"), workdir: Path = Path("runs/adapt"),
                real: Optional[Path] = None, progress: ProgressFn = None) -> dict:
    """Every scan, method and rung (module docstring); returns ``{"cases", "means", ...}``; with
    ``real`` (a 0/1 label file of a real pore geometry), its two cases under ``"real"`` (apart from
    the means)."""
    from ctpore.data.synthetic.structures import FAMILIES
    from ctpore.pipelines.bench.analysis import cpu_name

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cases, figure = [], {}
    for i in range(n_scans):
        scan, _truth0, truth = adapt_case(i, shape)
        row = {"seed": ADAPT_SEED_BASE + i, "family": FAMILIES[i % len(FAMILIES)],
               "labeller": "outside" if i % 2 else "inside", "porosity": float(truth.mean()), "methods": {}}
        cases.append(_one_case(str(i), scan, truth, row, methods, steps, minutes, workdir,
                               figure if i == 0 else None, progress, f"scan {i + 1}/{n_scans}"))
    names = list(cases[0]["methods"]) if cases else []
    means = {n: {k: float(np.mean([c["methods"][n][k] for c in cases]))
                 for k in ("mse", "dice", "euler_error", "adapt_seconds")} for n in names}
    res = {"shape": list(shape), "n_scans": n_scans, "steps": steps, "minutes": minutes, "cases": cases,
           "means": means, "figure": figure, "cpu": cpu_name()}
    if real is not None:
        res["real"] = {"label": Path(real).name, "cases": []}
        for side, scan, truth in real_cases(real):
            tag = f"real-{side}"
            row = {"seed": tag, "family": f"real: {Path(real).parent.name}", "labeller": side,
                   "shape": list(scan.shape), "porosity": float(truth.mean()), "methods": {}}
            res["real"]["cases"].append(_one_case(tag, scan, truth, row, methods, steps, minutes, workdir, None,
                                                  progress, f"real geometry, labeller {side}"))
    return res


def adapt_picture(fig: dict, path: Path) -> None:
    """The first scan, two rows: a labelled slice with its labels (pore orange, solid cyan), and a
    slice of the scored ones with the labeller's pores, the untuned PoreFormer's and the tuned one's
    (k = 3), each in red over the grey scan."""
    from PIL import Image

    from ctpore.atomic import atomic_write
    from ctpore.data.normalize import normalize_volume

    v = np.clip(normalize_volume(fig["scan"].astype(np.float32)), 0, 1)
    zl = fig["labelled"][len(fig["labelled"]) // 2]
    z0, z1 = max(fig["scored"], key=lambda b: b[1] - b[0])
    zs = (z0 + z1) // 2

    def grey(z):
        g = (v[z] * 255).astype(np.uint8)
        return np.stack([g, g, g], -1).astype(np.float32)

    def tint(rgb, mask, colour):
        rgb = rgb.copy()
        rgb[mask] = 0.45 * rgb[mask] + 0.55 * np.array(colour, np.float32)
        return rgb.astype(np.uint8)

    lab = fig["truth"][zl].astype(bool)
    top = [grey(zl).astype(np.uint8), tint(tint(grey(zl), lab, (255, 127, 14)), ~lab, (23, 190, 207))]
    bottom = [grey(zs).astype(np.uint8), tint(grey(zs), fig["truth"][zs].astype(bool), (255, 40, 40)),
              tint(grey(zs), fig["poreformer"][zs].astype(bool), (255, 40, 40)),
              tint(grey(zs), fig["poreformer tuned k=3"][zs].astype(bool), (255, 40, 40))]
    blank = np.full_like(top[0], 255)
    top += [blank, blank]
    pad = np.full((v.shape[1], 4, 3), 255, np.uint8)
    rows = [np.concatenate(sum(([t, pad] for t in r), [])[:-1], axis=1) for r in (top, bottom)]
    img = np.concatenate([rows[0], np.full((4, rows[0].shape[1], 3), 255, np.uint8), rows[1]], axis=0)
    im = Image.fromarray(img).resize((img.shape[1] * 2, img.shape[0] * 2), Image.NEAREST)
    with atomic_write(path) as tmp:
        im.save(tmp, format="PNG")


def write_adapt_report(res: dict, outdir: Path, command: str) -> tuple[Path, Path]:
    """``adapt.json`` and ``adapt.md`` in ``outdir``: the means per method and every case."""
    from ctpore.atomic import write_json_atomic, write_lines_atomic

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    fig = res.get("figure") or {}
    res = {**{k: v for k, v in res.items() if k != "figure"}, "command": command}
    jpath = write_json_atomic(outdir / "adapt.json", res)
    picture = ""
    if {"scan", "poreformer", "poreformer tuned k=3"} <= set(fig):
        adapt_picture(fig, outdir / "adapt.png")
        picture = ("\n\n![The first scan: a labelled slice with its labels (pore orange, solid cyan); a scored slice "
                   "with the labeller's pores, the untuned PoreFormer's and the tuned one's (k = 3)](adapt.png)\n\n"
                   "Top: a labelled slice and its labels. Bottom, left to right: a slice scored (away from the "
                   "labels), the labeller's pores, PoreFormer as shipped, PoreFormer tuned on 3 slices.")
    lines = ["# Adapting to another scanner and labeller", "",
             f"Written by `{command}`. {res['n_scans']} scan(s) of {' x '.join(map(str, res['shape']))} voxels from "
             "a scanner model unlike ctpore's simulator (phase-contrast fringes, cupping, a long-tailed blur, "
             "Poisson noise at low counts), labelled a voxel inside or outside ctpore's boundary; scored on the "
             f"slices at least {GAP} slices from any labelled one (MSE, Dice, summed |3D Euler error| over "
             "those blocks); seconds on " + res.get("cpu", "an unnamed CPU") + "." + picture, "",
             "| method | MSE | Dice | summed \\|χ error\\| | seconds to adapt |", "|---|---:|---:|---:|---:|"]
    for name, m in res["means"].items():
        lines.append(f"| {name} | {m['mse']:.4f} | {m['dice']:.3f} | {m['euler_error']:.1f} | "
                     f"{m['adapt_seconds']:.0f} |")
    lines += ["", "## Every scan", "", "| scan | family | labeller | method | MSE | Dice | \\|χ error\\| |",
              "|---|---|---|---|---:|---:|---:|"]
    for c in res["cases"]:
        for name, m in c["methods"].items():
            lines.append(f"| {c['seed']} | {c['family']} | {c['labeller']} | {name} | {m['mse']:.4f} | "
                         f"{m['dice']:.3f} | {m['euler_error']} |")
    if res.get("real"):
        first = res["real"]["cases"][0]
        shape, rock = " x ".join(map(str, first["shape"])), first["family"].removeprefix("real: ")
        lines += ["", "## A real pore geometry", "",
                  f"A real segmented rock ({rock}, {shape} voxels) scanned by the "
                  "same scanner model and labelled by both labellers, 3 labelled slices (1 for PoreFormer's k = 1), "
                  "scored the same way. Apart from the means above.", "",
                  "| labeller | method | MSE | Dice | \\|χ error\\| | seconds to adapt |",
                  "|---|---|---:|---:|---:|---:|"]
        for c in res["real"]["cases"]:
            for name, m in c["methods"].items():
                lines.append(f"| {c['labeller']} | {name} | {m['mse']:.4f} | {m['dice']:.3f} | {m['euler_error']} | "
                             f"{m['adapt_seconds']:.0f} |")
    mpath = outdir / "adapt.md"
    write_lines_atomic(mpath, lines)
    return jpath, mpath
