"""Whether ``ctpore finetune``'s refit takes the z-neighbour refit, chosen on scans apart from the bench's.

``python scripts/adapt_dev_zmix.py > runs/adapt_dev2/zmix.log`` (a few minutes on 2 cores), after
``scripts/adapt_dev_variants.py CE`` wrote the tuned weights of the four dev scans (seeds
``ADAPT_DEV_SEED_BASE + i``, which ``ctpore bench adapt`` never uses) to ``runs/adapt_dev2``. For each
scan and method (PoreFormer as tuned by variant C, the 3D U-Net by E): the tuned network's raw
probabilities, the post-processing refitted on the 3 labelled slices' training part with and without
the z-neighbour refit, and each scored as the bench scores it (MSE, Dice, 3D |chi error| on the
slices away from the labelled ones). One JSON line per scan and method, then the means.

The rule, fixed before the run: the refit takes the z-neighbour rung, for every method, if over the
four scans (a) PoreFormer's mean MSE falls by at least 3%, (b) the 3D U-Net's mean MSE rises by at
most 1%, and (c) PoreFormer's summed |chi error| rises by at most 10%. Otherwise it stays off.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

from ctpore.data.io import read_volume
from ctpore.data.sparse_labels import read_sparse_labels
from ctpore.pipelines.bench.adapt import ADAPT_DEV_SEED_BASE, adapt_case, labelled_slices, score, scored_blocks
from ctpore.pipelines.finetune.holdout import hold_out
from ctpore.pipelines.finetune.refit import raw_probability, refit_on_labels
from ctpore.pipelines.reconstruct import build_predictor

RUNS = {"poreformer": "C", "unet3d": "E"}


def main() -> None:
    warnings.simplefilter("ignore")
    work = Path("runs/adapt_dev2")
    shape = (128, 256, 256)
    labelled = labelled_slices(shape[0], 3)
    blocks = scored_blocks(shape[0], labelled)
    rows = []
    for i in range(4):
        _scan, _truth0, truth = adapt_case(i, shape, ADAPT_DEV_SEED_BASE)
        vol, geom = read_volume(work / f"scan_{i}.nii.gz")
        split = hold_out(read_sparse_labels(work / f"lab_{i}.nii.gz", geom))
        for method, variant in RUNS.items():
            base = build_predictor(method, None, "cpu").post
            tuned = build_predictor(method, work / f"w_{i}_{variant}.safetensors", "cpu")
            raw = raw_probability(vol, geom, tuned)
            row = {"scan": i, "method": method}
            for name, on in (("off", False), ("on", True)):
                post, tried = refit_on_labels([raw], [split.train], base, z_neighbours=on)
                pores, prob = post.apply(raw)
                row[name] = {**score(prob, pores, truth, blocks), "threshold": post.threshold,
                             "zmix": tried["zmix"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    for method in RUNS:
        mine = [r for r in rows if r["method"] == method]
        print(json.dumps({"method": method, **{f"{k}_{name}": float(np.mean([r[name][k] for r in mine]))
                                               for name in ("off", "on") for k in ("mse", "dice")},
                          **{f"euler_sum_{name}": float(np.sum([r[name]["euler_error"] for r in mine]))
                             for name in ("off", "on")}}), flush=True)


if __name__ == "__main__":
    main()
