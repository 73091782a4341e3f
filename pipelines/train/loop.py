"""The training loop: one function of its config, checkpointed, resumable to the same weights.

The batch of step ``s`` is drawn from ``np.random.default_rng([seed, s])`` and torch is re-seeded
at every step, so a run resumed from a checkpoint ends with exactly the weights of an
uninterrupted one. A checkpoint is one safetensors file (model and AdamW tensors; step, config
and history as JSON metadata): nothing is unpickled. Validation logs MSE, Dice, Euler error and
the attention entropy per head.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch
from torch import nn

from ctpore.atomic import atomic_write
from ctpore.data.metrics import comparison_metrics
from ctpore.errors import InputError, NonFiniteError
from ctpore.models.attention import attention_entropy as head_entropy
from ctpore.models.losses import loss_terms, total_loss
from ctpore.models.poreformer import PoreFormer
from ctpore.models.weights import load_checkpoint, load_network, read_metadata, save_checkpoint, sha256_file
from ctpore.pipelines.methods import get_method
from ctpore.pipelines.train.batches import (Pool, add_topology_targets, labelled_pool, make_augmenter, make_batch,
                                            simulated_pool)
from ctpore.pipelines.train.config import (DATA_KEYS_ADDED, LOSS_KEYS_ADDED, TRAIN_KEYS_ADDED, TrainConfig,
                                          config_to_dict)
from ctpore.progress import ProgressFn

__all__ = ["build_model", "start_from", "init_record", "predict_full", "attention_entropy", "validate",
           "TrainResult", "lr_at", "train"]


def build_model(cfg: TrainConfig) -> nn.Module:
    """The network a config names, freshly initialised (seeded by ``cfg.seed``)."""
    torch.manual_seed(cfg.seed)
    return get_method(cfg.model).network(dict(cfg.model_config))


def start_from(model: nn.Module, cfg: TrainConfig) -> dict:
    """Load the network of ``cfg.init_weights`` into ``model`` (a warm start); returns its provenance.

    The file must hold the same network (same kind, same tensor shapes): a warm start continues a
    model, it does not convert one. Returns ``{"init_weights": {"file", "sha256", "steps",
    "train_seconds", "data_config_sha256"}}``, the record the run keeps in its history so that the
    exported budget counts the steps and seconds that made the starting weights.
    """
    path = Path(cfg.init_weights)
    if not path.is_file():
        raise InputError("init_weights: no such weights file (give a .safetensors file ctpore wrote)", path=path)
    start = load_network(path)
    want, got = model.state_dict(), start.state_dict()
    if type(start) is not type(model) or {k: tuple(v.shape) for k, v in want.items()} != {
            k: tuple(v.shape) for k, v in got.items()}:
        raise InputError(f"init_weights holds a different network than model '{cfg.model}' with this "
                         "model_config; start from weights of the same model", path=path)
    model.load_state_dict(got, strict=True)
    meta = read_metadata(path)
    return {"init_weights": {"file": path.name, "sha256": sha256_file(path), "steps": int(meta.get("steps", 0)),
                             "train_seconds": float(meta.get("train_seconds", 0.0)),
                             "data_config_sha256": meta.get("data_config_sha256", "")}}


def init_record(history: list) -> Optional[dict]:
    """The warm start's provenance kept in a run's history (:func:`start_from`), or None."""
    for rec in history:
        if "init_weights" in rec:
            return rec["init_weights"]
    return None


def check_finite(step: int, **tensors: torch.Tensor) -> None:
    """Raise :class:`NonFiniteError` naming the first tensor with a NaN/Inf."""
    for name, t in tensors.items():
        if not torch.isfinite(t).all():
            bad = int((~torch.isfinite(t)).sum())
            raise NonFiniteError(f"step {step}: {name} has {bad} non-finite value(s); "
                                 "training stopped (lower the learning rate or check the data)")


@torch.inference_mode()
def predict_full(model: nn.Module, scan: np.ndarray, device) -> np.ndarray:
    x = torch.from_numpy(np.ascontiguousarray(scan, np.float32))[None].to(device)
    return torch.sigmoid(model(x))[0].float().cpu().numpy()


def attention_entropy(model: nn.Module, x: torch.Tensor) -> Optional[list]:
    """Mean attention entropy per head (nats), averaged over layers and pixels; None for a U-Net.

    The seed's over/under-fitting diagnostic: validation entropy well below training entropy
    suggests memorising, well above suggests the heads have not learnt where to look.
    """
    maps_fn = getattr(model, "attention_maps", None)
    if maps_fn is None:
        return None
    b, z, y, w = x.shape
    ys, xs = slice(0, y, max(1, y // 8)), slice(0, w, max(1, w // 8))  # an 8x8 grid of pixels
    maps = maps_fn(x, region=(ys, xs))  # per layer (B, Ry, Rx, H, Z, Z)
    per_layer = [head_entropy(m.flatten(0, 2)) for m in maps]  # (H,) each
    return [float(v) for v in torch.stack(per_layer).mean(0)]


def validate(model: nn.Module, pool: Pool, device) -> dict:
    """Mean MSE, Dice, porosity error and relative errors of the Euler number and of the Betti
    numbers b0 (pores) and b1 (tunnels) over the validation scans, thresholded at 0.5."""
    model.eval()
    rows = []
    for scan, truth in zip(pool.scans, pool.truths):
        prob = predict_full(model, scan, device)
        rows.append(comparison_metrics((prob >= 0.5).astype(np.uint8), truth.astype(np.uint8), prob=prob,
                                       betti=True))
    model.train()
    keys = ("mse", "dice", "euler_error_rel", "porosity_error", "b0_error_rel", "b1_error_rel")
    return {f"val_{k}": float(np.mean([r[k] for r in rows])) for k in keys}


@dataclass
class TrainResult:
    model: nn.Module
    history: list
    checkpoint: Path
    steps: int
    seconds: float
    config: TrainConfig


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up then cosine decay to 5% of the peak."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def train(
    cfg: TrainConfig,
    run_dir: Union[str, os.PathLike],
    *,
    resume: bool = True,
    images_dir=None,
    labels_dir=None,
    device: str = "cpu",
    stop_after: Optional[int] = None,
    progress: ProgressFn = None,
) -> TrainResult:
    """Train a model as ``cfg`` says, checkpointing into ``run_dir``.

    Parameters
    ----------
    cfg : TrainConfig
    run_dir : path
        Holds ``checkpoint.safetensors`` and ``history.jsonl``; an existing checkpoint is resumed
        (when ``resume``) and must come from the same config.
    images_dir, labels_dir : path, optional
        Train on labelled scans (matched by sorted name) instead of simulated ones.
    device : str
    stop_after : int, optional
        Stop (after checkpointing) once this step is reached, as an interruption would.
    progress : callable, optional
        ``progress(step, steps, "train loss=...")``.
    """
    t0 = time.perf_counter()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    dev = torch.device(device)
    if cfg.init_weights and not Path(cfg.init_weights).is_file():  # before minutes of simulation
        raise InputError("init_weights: no such weights file (give a .safetensors file ctpore wrote)",
                         path=cfg.init_weights)
    if images_dir is not None or labels_dir is not None:
        if images_dir is None or labels_dir is None:
            raise InputError("give both --images and --labels")
        cfg = copy.deepcopy(cfg)
        cfg.data.source = "labelled"
        train_pool = labelled_pool(images_dir, labels_dir, progress)
        val_pool = Pool(train_pool.scans[:1], train_pool.truths[:1], train_pool.names[:1])
    else:
        train_pool = simulated_pool(cfg.data, progress=progress)
        val_pool = simulated_pool(cfg.data, val=True, progress=progress)

    need_skeletons = cfg.loss.skeleton_recall > 0
    if need_skeletons or cfg.data.throat_crops > 0:
        add_topology_targets(train_pool, progress)
    model = build_model(cfg).to(dev)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
    ckpt = run_dir / "checkpoint.safetensors"
    history: list = []
    start = 0
    if resume and ckpt.exists():
        start, history, saved_cfg = load_checkpoint(ckpt, model, opt)
        saved_cfg = {**TRAIN_KEYS_ADDED, **saved_cfg, "data": {**DATA_KEYS_ADDED, **saved_cfg.get("data", {})},
                     "loss": {**LOSS_KEYS_ADDED, **saved_cfg.get("loss", {})}}
        # ``threads`` is how the run is executed, not what it computes: it may change on resume.
        if {**saved_cfg, "threads": 0} != {**config_to_dict(cfg), "threads": 0}:
            raise InputError("this run folder holds a checkpoint of a different config; use another "
                             "--run-dir or --no-resume", path=ckpt)
    elif cfg.init_weights:
        history.append({"step": 0, **start_from(model, cfg)})
    augment = make_augmenter(skeletons=need_skeletons) if cfg.data.augment else None
    use_amp = cfg.amp and dev.type == "cuda"

    step = start
    end = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    while step < end:
        torch.manual_seed(cfg.seed * 1_000_003 + step)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        x, y, z_first, margins, skel = make_batch(train_pool, cfg, step, augment, skeletons=need_skeletons)
        x, y = x.to(dev), y.to(dev)
        # PoreFormer makes tokens for the crop only and reads the margins as context; a U-Net
        # runs on the whole window and its logits are cropped: both see the same input.
        tokens_in_crop = isinstance(model, PoreFormer)
        kw = {"z0": z_first, "margins": margins} if tokens_in_crop else {}
        try:
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_amp):
                logits = model(x, **kw)
                if not tokens_in_crop and any(margins):
                    mt, mb, ml, mr = margins
                    logits = logits[..., mt:logits.shape[-2] - mb, ml:logits.shape[-1] - mr]
        except NonFiniteError as exc:  # the model's own guard names the layer and tensor
            raise NonFiniteError(f"step {step}: {exc}; training stopped (lower the learning rate "
                                 "or check the data)") from None
        logits = logits.float()
        terms = loss_terms(logits, y, cfg.loss, None if skel is None else skel.to(dev))
        loss = total_loss(terms, cfg.loss)
        check_finite(step, logits=logits, **{f"loss term '{k}'": v for k, v in terms.items()})
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        check_finite(step, gradient_norm=gnorm)
        opt.step()
        step += 1
        rec: dict[str, Any] = {"step": step, "loss": loss.item(), **{k: v.item() for k, v in terms.items()},
                               "lr": lr_at(step - 1, cfg)}
        if step % cfg.val_every == 0 or step == cfg.steps:
            rec.update(validate(model, val_pool, dev))
            ent_t = attention_entropy(model, x[:1])
            vx = torch.from_numpy(val_pool.scans[0][: cfg.data.crop[0], : cfg.data.crop[1], : cfg.data.crop[2]])
            ent_v = attention_entropy(model, vx[None].to(dev))
            if ent_t is not None:
                rec["attn_entropy_train"], rec["attn_entropy_val"] = ent_t, ent_v
        if "val_mse" in rec or step % 10 == 0:
            history.append(rec)
        if step % cfg.ckpt_every == 0 or step == end:
            save_checkpoint(ckpt, model, opt, step, config_to_dict(cfg), history)
        if progress is not None:
            progress(step, cfg.steps, "train")
    with atomic_write(run_dir / "history.jsonl") as tmp, open(tmp, "w") as fh:
        for rec in history:
            fh.write(json.dumps(rec) + "\n")
    return TrainResult(model=model, history=history, checkpoint=ckpt, steps=step,
                       seconds=time.perf_counter() - t0, config=cfg)


#: Speck sizes (voxels) tried when choosing the post-processing on validation scans.
