"""Fine-tuning a learned method's network on a user's labelled voxels.

Crops are drawn around labelled voxels of the training part (the held-back part never trains);
the loss is binary cross-entropy and a soft Dice on the labelled voxels only, wherever they lie (a
painted XY slice, an XZ or YZ one, a stroke). Crops get a random in-plane flip and turn. A causal
network (PoreFormer: a slice's logits depend on the slices before it only) gets crops that end at
the drawn voxel's slice, so that the slice is trained with the context it has when streamed (a
crop's slices after it would add nothing to its loss). The
optimiser steps the network; what is checked and kept is the exponential moving average of its
weights (:data:`EMA` a step, about the last 50 steps) rather than one step's weights. It is
checked on the held-back labels every :data:`CHECK_EVERY` steps, through the same probabilities
``reconstruct`` would give on those crops; tuning stops at ``steps``, at ``minutes``, or after
:data:`PATIENCE` checks without a better held-back MSE, and the best average is kept. Step ``s``
draws from ``np.random.default_rng([seed, s])`` and torch is seeded once, so the same seed and
labels give the same weights on a CPU.
"""

from __future__ import annotations

import copy
import inspect
import time
from typing import Optional

import numpy as np
import torch
from torch import nn

from ctpore.data.sparse_labels import PORE, UNLABELLED
from ctpore.pipelines.finetune import STEPS
from ctpore.progress import ProgressFn

__all__ = ["CHECK_EVERY", "EMA", "PATIENCE", "CROP", "LR", "tune_network"]

#: Steps between two checks on the held-back labels.
CHECK_EVERY = 10

#: Checks without a better held-back MSE before tuning stops.
PATIENCE = 4

#: AdamW's learning rate (one for every method: chosen on scans apart from the benchmark's, where
#: it lowered every method's error from 1e-4's).
LR = 3e-4

#: Decay a step of the moving average of the weights that is checked and kept (0: the weights the
#: last step left). Chosen on fresh development scans apart from the benchmark's, where it lowered
#: PoreFormer's and the 3D U-Net's 3D Euler error and MSE (|χ error| by 31% and 5%).
EMA = 0.98

#: The crop (Z, Y, X) a step trains on (clipped to the scan).
CROP = (16, 64, 64)

#: A U-Net's input is padded to a multiple of this on every axis (its strides).
UNET_MULTIPLE = 16


def _crop_around(rng, shape, voxel, crop) -> tuple:
    starts = []
    for n, c, v in zip(shape, crop, voxel):
        c = min(c, n)
        lo, hi = max(0, v - c + 1), min(v, n - c)
        starts.append(int(rng.integers(lo, hi + 1)))
    return tuple(slice(s, s + min(c, n)) for s, c, n in zip(starts, crop, shape))


def _forward(model: nn.Module, x: torch.Tensor, z0: int) -> torch.Tensor:
    """Logits of ``x`` (B, Z, Y, X): PoreFormer with the crop's absolute depth; a U-Net on the crop
    padded (edge values repeated) to a multiple of :data:`UNET_MULTIPLE` on every axis, cropped back."""
    if "z0" in inspect.signature(model.forward).parameters:
        return model(x, z0=z0)
    pads = [(-int(s)) % UNET_MULTIPLE for s in x.shape[1:]]
    if not any(pads):
        return model(x)
    xp = nn.functional.pad(x[:, None], (0, pads[2], 0, pads[1], 0, pads[0]), mode="replicate")[:, 0]
    return model(xp)[:, :x.shape[1], :x.shape[2], :x.shape[3]]


def _loss(logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    bce = nn.functional.binary_cross_entropy_with_logits(logits, target, reduction="none")
    n = mask.sum().clamp(min=1.0)
    prob = torch.sigmoid(logits) * mask
    inter = (prob * target).sum()
    dice = 1 - (2 * inter + 1) / (prob.sum() + (target * mask).sum() + 1)
    return (bce * mask).sum() / n + 0.5 * dice


def _causal(model: nn.Module) -> bool:
    """Whether a slice's logits depend on earlier slices only (PoreFormer's causal attention)."""
    return bool(getattr(getattr(model, "config", None), "causal", False))


def _batch(rng, volumes, labels, points, crop, causal=False):
    k = int(rng.integers(len(points)))
    voxel = points[k][int(rng.integers(len(points[k])))]
    sl = _crop_around(rng, volumes[k].shape, voxel, crop)
    if causal:  # the crop ends at the voxel's slice: it sees the slices before it, as when streamed
        n, c = volumes[k].shape[0], min(crop[0], volumes[k].shape[0])
        z = max(0, min(int(voxel[0]) - c + 1, n - c))
        sl = (slice(z, z + c),) + sl[1:]
    x, lab = volumes[k][sl], labels[k][sl]
    if rng.random() < 0.5:
        x, lab = x[:, ::-1], lab[:, ::-1]
    if rng.random() < 0.5:
        x, lab = x[:, :, ::-1], lab[:, :, ::-1]
    turns = int(rng.integers(4)) if x.shape[1] == x.shape[2] else 0
    x, lab = np.rot90(x, turns, axes=(1, 2)), np.rot90(lab, turns, axes=(1, 2))
    return np.ascontiguousarray(x), np.ascontiguousarray(lab), sl[0].start


def _held_mse(model, volumes, held, crop) -> float:
    """MSE of the network's probabilities on the held-back voxels, each held-back voxel predicted in
    a crop that ends at its slice (the causal model sees the slices before it, as when streamed)."""
    sq, n = 0.0, 0
    model.eval()
    with torch.no_grad():
        for vol, lab in zip(volumes, held):
            zs = np.flatnonzero((lab != UNLABELLED).any(axis=(1, 2)))
            for z in zs:
                z0 = max(0, int(z) - crop[0] + 1)
                x = torch.from_numpy(np.ascontiguousarray(vol[z0:z + 1]))[None]
                p = torch.sigmoid(_forward(model, x, z0))[0, -1].numpy()
                m = lab[z] != UNLABELLED
                sq += float(((p[m] - (lab[z][m] == PORE)) ** 2).sum())
                n += int(m.sum())
    model.train()
    return sq / max(n, 1)


def tune_network(model: nn.Module, volumes: list, train: list, held: list, *, steps: int = STEPS,
                 minutes: Optional[float] = None, seed: int = 0, lr: float = LR, crop: tuple = CROP,
                 causal_crops: bool = True, ema: float = EMA, progress: ProgressFn = None) -> dict:
    """Fine-tune ``model`` in place on ``train`` (label codes per normalized volume of ``volumes``),
    checked on ``held``; leaves the best network (the best moving average of its weights, with
    ``ema`` > 0) in ``model`` and returns ``{"steps", "best_step", "ema", "seconds", "history",
    "stopped"}`` (``stopped``: why it ended)."""
    if not 0.0 <= ema < 1.0:
        raise ValueError(f"the moving average's decay lies in [0, 1), got {ema!r}")
    torch.manual_seed(seed)
    points = [np.argwhere(t != UNLABELLED) for t in train]
    vols = [np.asarray(v, np.float32) for v in volumes]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=1e-4)
    model.train()
    causal = causal_crops and _causal(model)
    t0 = time.perf_counter()
    best = _held_mse(model, vols, held, crop)
    history = [{"step": 0, "held_mse": best}]
    best_state, best_step, since, stopped = copy.deepcopy(model.state_dict()), 0, 0, "steps"
    checked = copy.deepcopy(model) if ema > 0 else model  # the moving average, or the network itself
    step = 0
    for step in range(1, steps + 1):
        rng = np.random.default_rng([seed, step])
        x, lab, z0 = _batch(rng, vols, train, points, crop, causal)
        xt = torch.from_numpy(x)[None]
        target = torch.from_numpy((lab == PORE).astype(np.float32))[None]
        mask = torch.from_numpy((lab != UNLABELLED).astype(np.float32))[None]
        loss = _loss(_forward(model, xt, z0).float(), target, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if checked is not model:
            with torch.no_grad():
                avg = checked.state_dict()
                for k, v in model.state_dict().items():
                    if v.is_floating_point():
                        avg[k].mul_(ema).add_(v, alpha=1.0 - ema)
                    else:
                        avg[k].copy_(v)
        if progress is not None:
            progress(step, steps, "fine-tuning")
        if step % CHECK_EVERY == 0 or step == steps:
            mse = _held_mse(checked, vols, held, crop)
            history.append({"step": step, "loss": loss.item(), "held_mse": mse})
            if mse < best - 1e-6:
                best, best_step, since = mse, step, 0
                best_state = copy.deepcopy(checked.state_dict())
            else:
                since += 1
            if since >= PATIENCE:
                stopped = f"no better held-back MSE in {PATIENCE} checks"
                break
        if minutes is not None and time.perf_counter() - t0 > 60.0 * minutes:
            stopped = f"{minutes:g} minutes"
            break
    model.load_state_dict(best_state)
    model.eval()
    return {"steps": step, "best_step": best_step, "ema": ema, "seconds": round(time.perf_counter() - t0, 1),
            "history": history, "stopped": stopped}
