"""``ctpore bench sample``: how well the sample is found, on every set-up scanners make.

For each set-up of :data:`~ctpore.data.synthetic.scenes.SETUPS` (a dry core in air, centred or not,
in a tube with a gap or touching it, a grey tube, a circular field of view, brine-filled pores, a
core wider than the field of view, a turned block, an anisotropic core) ``n`` scans are simulated
from held-out seeds (each set-up's sizes drawn from its scene's own stream), and each is
reconstructed twice with the shipped model: with the sample found, and with the true sample (the
voxels whose centre is inside the sample's geometry) as a mask. The report gives, per set-up: the
sample's IoU with the true one, the porosity against the true mask's run, the pore count (b0)
against it, the pore voxels outside the true sample, how often the fit was confident, and the
sample step's seconds. Plain scans (material to the border) must come out with no outside.

The seeds are ``seed_base + 1000 * k + i`` (set-up ``k``, scan ``i``) in the further held-out range
(:data:`~ctpore.data.splits.FURTHER`), which no training config reaches.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Optional, Union

import numpy as np

from ctpore.atomic import atomic_write, write_lines_atomic
from ctpore.data.splits import FURTHER_SEED_BASE, check_bench_seeds
from ctpore.progress import ProgressFn

__all__ = ["SAMPLE_SEED_BASE", "bench_sample", "write_sample_report"]

#: First seed of the sample benchmark's scans (in the further held-out range).
SAMPLE_SEED_BASE = FURTHER_SEED_BASE + 600_000

#: Each set-up's middle slice and found sample, for the report's picture (filled as cases run).
_PICTURES: dict = {}

#: The set-ups the report's picture shows, side by side.
PICTURED = ("core-air-offcentre", "tube-gap", "fov-circle", "block-turned")

#: The criteria a case meets (against the run given the true sample).
CRITERIA = {"iou": 0.97, "porosity": 0.01, "b0_rel": 0.10}


def _case(seed: int, setup: Optional[str], shape, predictor) -> dict:
    from ctpore.data.synthetic import make_pair
    from ctpore.pipelines.reconstruct import reconstruct

    scan, _truth, info = make_pair(seed, shape=shape, scene=setup)
    spacing = tuple(info["scene"]["spacing_mm"]) if setup else (0.01, 0.01, 0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = reconstruct(scan, spacing_mm=spacing, predictor=predictor)
        if setup is None:
            return {"seed": seed, "setup": "none", "family": info["family"],
                    "kind": found.metrics["sample"].get("kind", "none"),
                    "outside_voxels": found.metrics["sample"]["outside_voxels"],
                    "sample_seconds": found.metrics["stage_seconds"].get("sample", 0.0)}
        true = info["sample"]
        given = reconstruct(scan, spacing_mm=spacing, predictor=predictor, sample=true.astype(np.uint8))
    sample = found.sample.astype(bool) if found.sample is not None else np.ones(true.shape, bool)
    pores = found.pores.astype(bool)
    a, b = found.metrics, given.metrics
    mid = scan.shape[0] // 2
    lo, hi = (float(v) for v in np.percentile(scan[mid], [0.5, 99.5]))
    _PICTURES[setup] = (scan[mid].astype(np.float32), sample[mid], lo, hi)  # the last case's middle slice
    return {
        "seed": seed, "setup": setup, "family": info["family"], "cnr": round(info["params"]["cnr"], 2),
        "kind": a["sample"].get("kind", "none"), "confident": bool(a["sample"].get("confident", True)),
        "iou": float((sample & true).sum() / max((sample | true).sum(), 1)),
        "porosity": a["porosity"], "porosity_true_mask": b["porosity"],
        "porosity_truth": info["porosity_truth"],
        "porosity_if_region_is_pore": a.get("porosity_if_region_is_pore"),
        "b0": a["n_pores"], "b0_true_mask": b["n_pores"],
        "pores_outside_true": int(np.count_nonzero(pores & ~true)),
        "pore_voxels": int(pores.sum()),
        "sample_seconds": a["stage_seconds"].get("sample", 0.0),
    }


def _meets(c: dict) -> dict:
    dry = c["setup"] != "brine-tube"  # brine-filled pores: the sample is judged, not the pores
    ok = {"iou": c["iou"] >= CRITERIA["iou"]}
    if dry:
        ok["porosity"] = abs(c["porosity"] - c["porosity_true_mask"]) <= CRITERIA["porosity"]
        ok["b0"] = abs(c["b0"] - c["b0_true_mask"]) <= max(1, CRITERIA["b0_rel"] * c["b0_true_mask"])
    return ok


def bench_sample(n: int = 6, shape=(24, 160, 160), seed_base: int = SAMPLE_SEED_BASE, setups=None,
                 progress: ProgressFn = None) -> dict:
    """Run the benchmark (see the module docstring); returns the cases and their summary."""
    from ctpore.data.synthetic.scenes import SETUPS
    from ctpore.pipelines.reconstruct import build_predictor

    setups = tuple(setups or SETUPS)
    check_bench_seeds(seed_base, 1000 * len(SETUPS) + n + 1)
    predictor = build_predictor("auto")
    cases, plain = [], []
    total = (len(setups) + 1) * n
    done = 0
    t0 = time.perf_counter()
    for setup in setups:
        k = SETUPS.index(setup)
        for i in range(n):
            c = _case(seed_base + 1000 * k + i, setup, shape, predictor)
            c["meets"] = _meets(c)
            cases.append(c)
            done += 1
            if progress is not None:
                progress(done, total, "sample benchmark")
    for i in range(n):
        plain.append(_case(seed_base + 1000 * len(SETUPS) + i, None, shape, predictor))
        done += 1
        if progress is not None:
            progress(done, total, "sample benchmark")
    summary = {}
    for setup in setups:
        cs = [c for c in cases if c["setup"] == setup]
        dp = [abs(c["porosity"] - c["porosity_true_mask"]) for c in cs]
        summary[setup] = {
            "cases": len(cs), "meet_all": sum(all(c["meets"].values()) for c in cs),
            "iou_min": min(c["iou"] for c in cs), "iou_median": statistics.median(c["iou"] for c in cs),
            "porosity_diff_median": statistics.median(dp), "porosity_diff_max": max(dp),
            "b0_within": sum(c["meets"].get("b0", True) for c in cs),
            "confident": sum(c["confident"] for c in cs),
            "kinds": sorted({c["kind"] for c in cs}),
            "pores_outside_true_share_max": max(c["pores_outside_true"] / max(c["pore_voxels"], 1) for c in cs),
            "sample_seconds_median": statistics.median(c["sample_seconds"] for c in cs),
        }
    return {"shape_zyx": list(shape), "n_per_setup": n, "seed_base": seed_base, "criteria": CRITERIA,
            "summary": summary, "cases": cases,
            "plain": {"cases": plain, "no_outside": sum(p["outside_voxels"] == 0 for p in plain)},
            "seconds": round(time.perf_counter() - t0, 1)}


def _settings() -> str:
    """The rules the sample is found by, in words with their values (from the code)."""
    from ctpore.data.circle_fit import (CYLINDER_SPREAD, CYLINDER_SPREAD_REL, ONE_SIDED_OUTSIDE, ONE_SIDED_SHARE,
                                        RESTART_PHASES)
    from ctpore.data.envelope import MAX_SLICES
    from ctpore.data.layer import LAYER_SHARE, MAX_DEPTH, MIN_INSIDE, POROUS_WALL, RISE_WIDTH
    from ctpore.data.outline import BLOCK_FILL, OUTLINE_STRAY, STRAY_BAND
    from ctpore.data.face import FACE_SPAN_DEG, SEGMENT_IOU
    from ctpore.data.profiles import OUTSIDE_WEIGHT
    from ctpore.data.rim import RIM, SHELL
    from ctpore.data.sample import EDGE_PORES

    return (f"The fit reads {MAX_SLICES} slices spread along the scan. A cylinder describes the sample when its "
            f"surface points spread about it by at most {CYLINDER_SPREAD} voxels or {100 * CYLINDER_SPREAD_REL:g}% "
            "of its radius (whichever is more), or does so once restarted from the circle that most surface points "
            f"(of the sectors turned by {RESTART_PHASES} phases) agree on, each point outside it counting "
            f"{OUTSIDE_WEIGHT} against it, and refitted on the points where that circle lies within the slice, or "
            f"on those on it alone where they are {100 * ONE_SIDED_SHARE:g}% of them or more and at most "
            f"{100 * ONE_SIDED_OUTSIDE:g}% lie "
            "outside it (pores open at the surface); a core inside a wall is restarted so too where its points "
            f"spread more than that or more than {100 * ONE_SIDED_OUTSIDE:g}% of them lie outside it by more than "
            "that; where every sector's outermost rise is a thin bright line in the air (ring artefacts), the fit "
            "looks past such lines, kept where it then sees the surface in half the sectors; a wall whose voxels "
            f"below halfway from the air to its level are more than {POROUS_WALL[0]:g} times the share its scatter "
            f"puts there plus {POROUS_WALL[1]:g} holds pores and is none; "
            "a cylinder with a region of air open at its surface (on the mean of the fit's slices) that is "
            f"the segment a straight line cuts off it to an IoU of {SEGMENT_IOU:g} or more, the line spanning "
            f"{FACE_SPAN_DEG:g} degrees or more, or whose points inside it hold such a straight run that stays put "
            "along the axis (a flat face), is a core sawn or broken along its axis; "
            "a cylinder without a wall whose layer 1 to 3 pixels under its surface holds under "
            f"{100 * LAYER_SHARE:g}% of the inside's share of dark voxels (the inside holding "
            f"{100 * MIN_INSIDE:g}% or more), the share rising to where the core's pores begin within {RISE_WIDTH} "
            f"pixels and {MAX_DEPTH} pixels deep, has that layer "
            "as its wall, touching it (a tube about as grey as the core, pressed against it); "
            "otherwise, and for those, each slab's outline is the convex hull of its material, "
            f"or the smallest rectangle around it when the hull fills {100 * BLOCK_FILL:g}% of it in half the fit's "
            "slices, or the hull of their material together does (a block); an outline is uncertain where more than "
            f"{100 * OUTLINE_STRAY:g}% of a band {STRAY_BAND[0]} to {STRAY_BAND[1]} pixels of the fit's grid outside "
            "each read slice's own "
            "outline is material, and is no outside at all where it is uncertain and its surface points are fewer "
            f"than {100 * EDGE_PORES:g}% of its sectors (pores open at the slice's edge of a scan with no outside). "
            f"A pore voxel within {RIM} voxels of the surface counts only where it joins a pore deeper in, "
            f"within {RIM} steps in 3D. A tilt of the core's axis is kept where the surface points spread less about "
            "it than about a straight axis. The rim "
            f"check compares the porosity {SHELL[0]} to {SHELL[1]} voxels under the surface, and in the outer {RIM}, "
            "with the inside's.")


def _timing_lines(timings: dict) -> list[str]:
    if not timings:
        return []
    lines = ["", "## The sample step on a 256 x 1024 x 1024 core", "",
             "`python scripts/sample_step_time.py OUT.json --kind KIND --repeats 1 --append`, three times for "
             "each core, alternating this version and (on `PYTHONPATH`) the version before the sample was found "
             "by its shape, on one machine. Seconds of the sample step as the pipeline counts it "
             "(`stage_seconds.sample`: the fit, the mask written slab by slab, and the scan copied with its "
             "outside filled for the methods), median of the three. The cores: `dry` (a dry core in air, off "
             "the slice centre), `brine` (the same with brine-filled pores: the air darker than they are), "
             "`zero` (the constant 0 beyond its surface); each has 139.76 M voxels outside its surface.", "",
             "| core | before (s) | found then | voxels left out then | now (s) | found now | voxels left out now "
             "| CPU |", "|---|---|---|---|---|---|---|---|"]
    for kind, (before, now) in timings.items():
        lines.append(f"| {kind} | {before['median_seconds']:.2f} | {before['found']['found'][:48]} | "
                     f"{before['found'].get('outside_voxels', 0)} | {now['median_seconds']:.2f} | "
                     f"{now['found'].get('kind', now['found']['found'][:40])} | "
                     f"{now['found'].get('outside_voxels', 0)} | {now['cpu']}"
                     f"{' (avx512_bf16)' if now.get('avx512_bf16') else ''} |")
    return lines


def write_sample_report(result: dict, outdir: Union[str, os.PathLike], command: str,
                        timings: Optional[dict] = None) -> Path:
    """Write ``sample.md`` and ``sample.json`` into ``outdir``; ``timings``: ``{core: (before, now)}``
    from ``scripts/sample_step_time.py`` (the table of the sample step's seconds)."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    s = result["summary"]
    cr = result["criteria"]
    lines = [
        "# The sample, found by its shape", "",
        f"Written by `{command}`. {result['n_per_setup']} simulated scans per set-up, "
        f"{' x '.join(map(str, result['shape_zyx']))} voxels, held-out seeds from {result['seed_base']}; each "
        "reconstructed with the sample found and with the true sample as a mask (the shipped PoreFormer).", "",
        f"A case meets the criteria when the sample's IoU with the true one is at least {cr['iou']}, the porosity "
        f"is within {cr['porosity']} of the true mask's run and the pore count (b0) within "
        f"{int(100 * cr['b0_rel'])}% of it (or one pore); brine-filled pores are judged on the sample only.", "",
        "| set-up | meets all | IoU min / median | porosity diff median / max | b0 within | confident | kind "
        "| pores outside the true sample, max share | sample step (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for setup, v in s.items():
        lines.append(
            f"| {setup} | {v['meet_all']}/{v['cases']} | {v['iou_min']:.4f} / {v['iou_median']:.4f} | "
            f"{v['porosity_diff_median']:.4f} / {v['porosity_diff_max']:.4f} | {v['b0_within']}/{v['cases']} | "
            f"{v['confident']}/{v['cases']} | {', '.join(v['kinds'])} | "
            f"{100 * v['pores_outside_true_share_max']:.2f}% | {v['sample_seconds_median']:.2f} |")
    p = result["plain"]
    lines += ["", f"Plain scans (material to the border on every side): {p['no_outside']} of {len(p['cases'])} "
              "came out with no outside (the same voxels as with `--sample all`).", ""]
    lines += ["## Every case", "",
              "| set-up | seed | family | CNR | kind | IoU | porosity (true mask) | b0 (true mask) |",
              "|---|---|---|---|---|---|---|---|"]
    for c in result["cases"]:
        lines.append(f"| {c['setup']} | {c['seed']} | {c['family']} | {c['cnr']} | {c['kind']}"
                     f"{'' if c['confident'] else ' (uncertain)'} | {c['iou']:.4f} | {c['porosity']:.4f} "
                     f"({c['porosity_true_mask']:.4f}) | {c['b0']} ({c['b0_true_mask']}) |")
    lines += ["", "## Settings", "", _settings(), ""]
    lines += _timing_lines(timings or {})
    shown = [k for k in PICTURED if k in _PICTURES]
    if shown:
        from PIL import Image

        from ctpore.pipelines.sample_picture import sample_picture

        tiles = [sample_picture(*_PICTURES[k]) for k in shown]
        h = max(t.shape[0] for t in tiles)
        gap = np.full((h, 8, 3), 255, np.uint8)
        row = np.concatenate(sum(([np.pad(t, ((0, h - t.shape[0]), (0, 0), (0, 0)), constant_values=255), gap]
                                  for t in tiles), [])[:-1], axis=1)
        with atomic_write(outdir / "sample_setups.png") as tmp:
            Image.fromarray(row).save(tmp, format="PNG")
        lines[3:3] = ["", f"![The middle slice of the last scan of {', '.join(shown)}: the found sample's outline "
                      "in yellow, what was left out tinted blue](sample_setups.png)", "",
                      f"Left to right: {', '.join(shown)} (the middle slice of each set-up's last scan, as "
                      "`ctpore reconstruct` draws it in `<stem>_sample.png`)."]
    with atomic_write(outdir / "sample.json") as tmp, open(tmp, "w") as fh:
        json.dump({**result, "timings": timings or {}}, fh, indent=1)
    write_lines_atomic(outdir / "sample.md", lines)
    return outdir / "sample.md"
