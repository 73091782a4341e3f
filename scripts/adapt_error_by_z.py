"""Where a tuned network's error lies on a scan labelled a voxel outside ours (a 3D dilation).

``python scripts/adapt_error_by_z.py [PF UNET]`` after ``scripts/adapt_dev_variants.py CE`` (it reads
that run's weights for dev scan 1, bicontinuous, labelled outside: ``runs/adapt_dev2/w_1_PF.safetensors``
for PoreFormer and ``w_1_UNET.safetensors`` for the 3D U-Net; PF and UNET default to C and E).
On the scored slices, it prints each network's MSE against the labels, and the share of its squared
error on two kinds of voxel: pore in the labels only because the slice after holds a pore at that pixel,
or only because the slice before does (neither pore by the in-plane dilation); and the mean probability
each network gives those voxels. A causal model sees the slice before and not the one after, so an
error on both kinds alike is not its causality's.
"""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np
from scipy import ndimage as ndi

from ctpore.pipelines.bench.adapt import ADAPT_DEV_SEED_BASE, adapt_case, labelled_slices, scored_blocks
from ctpore.pipelines.reconstruct import reconstruct


def main() -> None:
    warnings.simplefilter("ignore")
    shape = (128, 256, 256)
    scan, truth0, label = adapt_case(1, shape, ADAPT_DEV_SEED_BASE)  # bicontinuous, labelled outside
    t = truth0.astype(bool)
    label = label.astype(bool)
    cross = np.zeros((3, 3, 3), bool)
    cross[1] = ndi.generate_binary_structure(2, 1)
    inplane = ndi.binary_dilation(t, structure=cross)
    after, before = np.zeros_like(t), np.zeros_like(t)
    after[:-1], before[1:] = t[1:], t[:-1]
    scored = np.zeros(shape, bool)
    for a, b in scored_blocks(shape[0], labelled_slices(shape[0], 3)):
        scored[a:b] = True
    kinds = {"only_after": label & ~inplane & after & ~before & scored,
             "only_before": label & ~inplane & before & ~after & scored}
    out: dict = {f"voxels_{k}": int(m.sum()) for k, m in kinds.items()}
    pf, unet = sys.argv[1:3] if len(sys.argv) > 2 else ("C", "E")
    for method, variant in (("poreformer", pf), ("unet3d", unet)):
        w = f"runs/adapt_dev2/w_1_{variant}.safetensors"
        p = reconstruct(scan, method=method, weights=w, spacing_mm=(0.005,) * 3).probability
        err = (p.astype(np.float64) - label) ** 2
        tot = float(err[scored].sum())
        out[method] = {"mse": tot / int(scored.sum()),
                       **{f"error_share_{k}": float(err[m].sum()) / tot for k, m in kinds.items()},
                       **{f"mean_p_{k}": float(p[m].mean()) for k, m in kinds.items()}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
