"""``python scripts/adapt_dev_variants.py ABCDE > runs/adapt_dev2/variants.log``: dev seeds only (ADAPT_SEED_BASE + 50 + i, i = 0..3, the bench's family/labeller rule): which fine-tuning
variant gives the lowest mean scored MSE. Rule fixed before the run: PoreFormer takes the variant
(A: crops as before; B: causal crops; C: causal crops, lr 3e-4) with the lowest mean MSE over the 4 seeds;
an lr change is taken only if the U-Net3D is also run with it (D: lr 1e-4, E: lr 3e-4) and the bench then
uses the same lr for every method."""
import functools, json, sys, time, warnings
from pathlib import Path
import numpy as np, nibabel as nib
warnings.simplefilter("ignore")
from ctpore.pipelines.bench.adapt import (ADAPT_SEED_BASE, other_scanner, labeller, labelled_slices, score,
                                          scored_blocks, PORE, SOLID)
from ctpore.data.synthetic import make_pair
from ctpore.data.synthetic.structures import FAMILIES
from ctpore.pipelines.finetune import finetune
import ctpore.pipelines.finetune.tune as tune
from ctpore.pipelines.reconstruct import reconstruct
orig = tune.tune_network
work = Path("runs/adapt_dev2"); work.mkdir(parents=True, exist_ok=True); shape = (128, 256, 256)
VARIANTS = {"A": ("poreformer", False, 1e-4), "B": ("poreformer", True, 1e-4), "C": ("poreformer", True, 3e-4),
            "D": ("unet3d", True, 1e-4), "E": ("unet3d", True, 3e-4)}
for i in range(4):
    seed = ADAPT_SEED_BASE + 50 + i
    family = FAMILIES[i % len(FAMILIES)]
    _s, truth0, _ = make_pair(seed, shape=shape, family=family)
    rng = np.random.default_rng([seed, 7])
    scan = other_scanner(truth0, rng)
    truth = labeller(truth0, outside=bool(i % 2))
    aff = np.diag([0.005] * 3 + [1.0])
    sp = work / f"scan_{i}.nii.gz"; nib.save(nib.Nifti1Image(np.ascontiguousarray(scan.T), aff), sp)
    labelled = labelled_slices(shape[0], 3)
    lab = np.zeros(truth.shape, np.uint8)
    for z in labelled:
        lab[z] = np.where(truth[z] == 1, PORE, SOLID)
    lp = work / f"lab_{i}.nii.gz"; nib.save(nib.Nifti1Image(np.ascontiguousarray(lab.T), aff), lp)
    for v in sys.argv[1]:
        method, causal, lr = VARIANTS[v]
        tune.tune_network = functools.partial(orig, causal_crops=causal, lr=lr)
        w = work / f"w_{i}_{v}.safetensors"
        t0 = time.perf_counter()
        rep = finetune([sp], [lp], w, method=method, steps=300, minutes=10.0, overwrite=True)
        sec = time.perf_counter() - t0
        r = reconstruct(scan, method=method, weights=w, spacing_mm=(0.005,) * 3)
        sc = score(r.probability, r.pores, truth, scored_blocks(shape[0], labelled))
        print(json.dumps({"seed": seed, "family": family, "variant": v, "method": method, "sec": round(sec), **sc,
                          "best_step": rep["tuning"].get("best_step"), "stopped": rep["tuning"].get("stopped")}),
              flush=True)
