"""Would a refit that reads a voxel's z-neighbours close PoreFormer's gap? A check, not a feature.

``python scripts/adapt_zblend_check.py [PF UNET]`` after ``scripts/adapt_dev_variants.py CE``: on dev
scan 1 (bicontinuous, labelled a voxel outside ours), each tuned network's probability ``p`` is refitted
as ``sigmoid(a * l(z) + b * max(l(z - 1), l(z + 1)) + c * min(l(z - 1), l(z + 1)) + d)`` with ``l`` the
logit, the four numbers fitted (logistic regression) on the 3 labelled slices only; prints the MSE on the
scored slices before and after, and the numbers. Such a rung streams with a halo of one slice.
"""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import torch

from ctpore.pipelines.bench.adapt import ADAPT_DEV_SEED_BASE, adapt_case, labelled_slices, scored_blocks
from ctpore.pipelines.reconstruct import reconstruct


def features(p: np.ndarray) -> np.ndarray:
    """``(Z, Y, X, 3)``: the logit, and the larger and the smaller of its two z-neighbours' (edge repeated)."""
    q = np.clip(p.astype(np.float64), 1e-4, 1 - 1e-4)
    lg = np.log(q / (1 - q))
    up = np.concatenate([lg[:1], lg[:-1]])
    dn = np.concatenate([lg[1:], lg[-1:]])
    return np.stack([lg, np.maximum(up, dn), np.minimum(up, dn)], -1)


def fit_refit(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``(a, b, c, d)`` minimizing the cross-entropy of ``sigmoid(x @ (a, b, c) + d)`` against ``y``."""
    w = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=200)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ w[:3] + w[3], y)
        loss.backward()
        return loss

    opt.step(closure)
    return w


def main() -> None:
    warnings.simplefilter("ignore")
    shape = (128, 256, 256)
    scan, _truth0, label = adapt_case(1, shape, ADAPT_DEV_SEED_BASE)  # bicontinuous, labelled outside
    label = label.astype(np.float64)
    labelled = labelled_slices(shape[0], 3)
    scored = np.zeros(shape, bool)
    for a, b in scored_blocks(shape[0], labelled):
        scored[a:b] = True
    pf, unet = sys.argv[1:3] if len(sys.argv) > 2 else ("C", "E")
    out = {}
    for method, variant in (("poreformer", pf), ("unet3d", unet)):
        w_path = f"runs/adapt_dev2/w_1_{variant}.safetensors"
        p = reconstruct(scan, method=method, weights=w_path, spacing_mm=(0.005,) * 3).probability
        f = features(p)
        w = fit_refit(torch.tensor(f[labelled].reshape(-1, 3)), torch.tensor(label[labelled].reshape(-1)))
        q = torch.sigmoid(torch.tensor(f[scored]) @ w[:3] + w[3]).detach().numpy()
        out[method] = {"mse": float(((p[scored] - label[scored]) ** 2).mean()),
                       "mse_z_refit": float(((q - label[scored]) ** 2).mean()),
                       "a_b_c_d": [round(float(v), 3) for v in w.detach()]}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
