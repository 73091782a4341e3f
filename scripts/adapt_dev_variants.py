"""Which fine-tuning variant to take, chosen on scans apart from ``ctpore bench adapt``'s.

``python scripts/adapt_dev_variants.py ABCDE > runs/adapt_dev2/variants.log`` (about 30 minutes on
2 cores): four scans made as the bench makes them (the other scanner, the labeller a voxel inside
or outside, the bench's family rule) from seeds ``ADAPT_DEV_SEED_BASE + i`` (i = 0..3), which the
bench never uses; each variant fine-tuned on 3 labelled slices for 300 steps, then scored on the
slices away from them, one JSON line per scan and variant.

Variants: A PoreFormer, crops holding the labelled voxel anywhere, lr 1e-4 (as before); B causal
crops (ending at the labelled slice), lr 1e-4; C causal crops, lr 3e-4; D the 3D U-Net at lr 1e-4;
E the 3D U-Net at lr 3e-4.

The rule, fixed before the run: PoreFormer takes the variant of A, B, C with the lowest mean MSE
over the four scans; a learning-rate change is taken only with the 3D U-Net run at it too (D, E),
and then applies to every method in the bench.
"""

from __future__ import annotations

import functools
import json
import sys
import time
import warnings
from pathlib import Path

import nibabel as nib
import numpy as np

import ctpore.pipelines.finetune.tune as tune
from ctpore.data.synthetic.structures import FAMILIES
from ctpore.pipelines.bench.adapt import (ADAPT_DEV_SEED_BASE, PORE, SOLID, adapt_case, labelled_slices, score,
                                          scored_blocks)
from ctpore.pipelines.finetune import finetune
from ctpore.pipelines.reconstruct import reconstruct

VARIANTS = {"A": ("poreformer", False, 1e-4), "B": ("poreformer", True, 1e-4), "C": ("poreformer", True, 3e-4),
            "D": ("unet3d", True, 1e-4), "E": ("unet3d", True, 3e-4)}


def main() -> None:
    warnings.simplefilter("ignore")
    work = Path("runs/adapt_dev2")
    work.mkdir(parents=True, exist_ok=True)
    shape = (128, 256, 256)
    as_shipped = tune.tune_network
    aff = np.diag([0.005] * 3 + [1.0])
    for i in range(4):
        seed, family = ADAPT_DEV_SEED_BASE + i, FAMILIES[i % len(FAMILIES)]
        scan, _truth0, truth = adapt_case(i, shape, ADAPT_DEV_SEED_BASE)
        sp = work / f"scan_{i}.nii.gz"
        nib.save(nib.Nifti1Image(np.ascontiguousarray(scan.T), aff), sp)
        labelled = labelled_slices(shape[0], 3)
        lab = np.zeros(truth.shape, np.uint8)
        for z in labelled:
            lab[z] = np.where(truth[z] == 1, PORE, SOLID)
        lp = work / f"lab_{i}.nii.gz"
        nib.save(nib.Nifti1Image(np.ascontiguousarray(lab.T), aff), lp)
        for v in sys.argv[1]:
            method, causal, lr = VARIANTS[v]
            tune.tune_network = functools.partial(as_shipped, causal_crops=causal, lr=lr)
            w = work / f"w_{i}_{v}.safetensors"
            t0 = time.perf_counter()
            rep = finetune([sp], [lp], w, method=method, steps=300, minutes=10.0, overwrite=True)
            sec = time.perf_counter() - t0
            r = reconstruct(scan, method=method, weights=w, spacing_mm=(0.005,) * 3)
            sc = score(r.probability, r.pores, truth, scored_blocks(shape[0], labelled))
            print(json.dumps({"seed": seed, "family": family, "variant": v, "method": method, "sec": round(sec), **sc,
                              "best_step": rep["tuning"].get("best_step"), "stopped": rep["tuning"].get("stopped")}),
                  flush=True)
    tune.tune_network = as_shipped


if __name__ == "__main__":
    main()
