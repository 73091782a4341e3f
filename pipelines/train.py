"""Training of PoreFormer (and of the U-Net baselines) on simulated CT and on labelled scans.

The run is a pure function of its config: the batch of step ``s`` is drawn from
``np.random.default_rng([seed, s])`` and torch is re-seeded at every step, so a run resumed from a
checkpoint ends with exactly the weights of an uninterrupted one. A checkpoint is one safetensors
file (model and AdamW tensors; step, config and history as JSON metadata): nothing is unpickled.

Loss: BCE + soft Dice + soft clDice (Shit et al., CVPR 2021), the last a topology-aware term that
rewards keeping thin pore throats connected, which is what the Euler number counts.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from ctpore.data.errors import InputError, NonFiniteError
from ctpore.data.normalize import normalize_volume
from ctpore.pipelines import ProgressFn

#: Seeds of simulated training/validation scans are ``data.seed * SEED_STRIDE + i`` (+ VAL_OFFSET
#: for validation). The benchmark draws its scans from BENCH_SEED_BASE upwards, a range no
#: training config can reach, so held-out scans are never trained on.
SEED_STRIDE = 1_000_000
VAL_OFFSET = 500_000
BENCH_SEED_BASE = 10**12


@dataclass
class DataConfig:
    source: str = "synthetic"        # "synthetic" or "labelled" (set by --images/--labels)
    seed: int = 1                    # seeds of the simulated scans derive from it (see SEED_STRIDE)
    n_train: int = 48                # simulated training volumes (generated once, then cropped)
    n_val: int = 4                   # simulated validation volumes (full volumes are scored)
    volume_size: int = 64            # edge of each simulated cubic volume
    crop: tuple = (32, 48, 48)       # training crop (Z, Y, X): the voxels the loss covers
    context: int = 0                 # extra in-plane pixels read around each crop as input only
    augment: bool = True             # MONAI flips, in-plane 90° turns, intensity/gamma/noise changes
    zoom_max: float = 1.0            # half the simulated scans have features enlarged up to this factor


#: DataConfig keys added after weights and checkpoints were first written, at the value that means
#: "the same data as before": a stored config without them has these, and the data hash omits them.
DATA_KEYS_ADDED = {"context": 0, "zoom_max": 1.0}


@dataclass
class LossConfig:
    bce: float = 1.0                 # weight of binary cross-entropy
    dice: float = 1.0                # weight of soft Dice loss
    cldice: float = 0.5              # weight of soft clDice (0 = off)
    cldice_iters: int = 3            # soft-skeleton iterations


@dataclass
class TrainConfig:
    model: str = "poreformer"        # "poreformer", "unet2d" or "unet3d"
    model_config: dict = field(default_factory=dict)  # PoreFormerConfig fields / U-Net config
    data: DataConfig = field(default_factory=DataConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    steps: int = 1000                # optimizer steps
    batch_size: int = 2              # crops per step
    lr: float = 3e-3                 # peak learning rate (AdamW), cosine decay after warm-up
    warmup: int = 50                 # linear warm-up steps
    weight_decay: float = 1e-4       # AdamW weight decay
    grad_clip: float = 1.0           # gradient-norm clip
    seed: int = 0                    # seeds batches, augmentation and initialisation
    val_every: int = 100             # validate every this many steps (and at the end)
    ckpt_every: int = 50             # checkpoint every this many steps (and at the end)
    threads: int = 0                 # torch threads (0: leave torch's default)
    amp: bool = True                 # mixed precision (bf16) on CUDA; ignored on CPU
    threshold: float = 0.5           # probability threshold shipped with the weights
    min_size: int = 0                # speck removal (voxels) shipped with the weights


def _from_dict(cls, d: dict):
    known = {f for f in cls.__dataclass_fields__}
    unknown = set(d) - known
    if unknown:
        raise InputError(f"unknown {cls.__name__} keys: {', '.join(sorted(unknown))}")
    return cls(**d)


def load_train_config(path: Union[str, os.PathLike]) -> TrainConfig:
    """Read a training config (YAML). Unknown keys are an error, not silently ignored."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise InputError("no such config file", path=path) from None
    except yaml.YAMLError as exc:
        raise InputError(f"not valid YAML ({exc})", path=path) from None
    return config_from_dict(raw, path)


def config_from_dict(raw: dict, path=None) -> TrainConfig:
    try:
        raw = dict(raw)
        data = _from_dict(DataConfig, raw.pop("data", {}) or {})
        data.crop = tuple(int(c) for c in data.crop)
        loss = _from_dict(LossConfig, raw.pop("loss", {}) or {})
        cfg = _from_dict(TrainConfig, raw)
    except InputError as exc:
        raise InputError(exc.message, path=path) from None
    except TypeError as exc:
        raise InputError(f"bad config ({exc})", path=path) from None
    cfg.data, cfg.loss = data, loss
    from ctpore.data.synthetic import check_zoom

    try:
        data.zoom_max = check_zoom(data.zoom_max, "data.zoom_max")
    except InputError as exc:
        raise InputError(exc.message, path=path) from None
    if cfg.model not in ("poreformer", "unet2d", "unet3d"):
        raise InputError(f"model must be poreformer, unet2d or unet3d, got {cfg.model!r}", path=path)
    return cfg


def config_to_dict(cfg: TrainConfig) -> dict:
    d = asdict(cfg)
    d["data"]["crop"] = list(cfg.data.crop)
    return d


def data_config_hash(cfg: TrainConfig) -> str:
    """sha256 of the canonical JSON of the data section: which scans the weights were trained on."""
    data = asdict(cfg.data)
    for key, before in DATA_KEYS_ADDED.items():
        if data.get(key, before) == before:
            data.pop(key, None)  # the data of configs written before the key existed: the same hash
    blob = json.dumps(data, sort_keys=True, default=list).encode()
    return hashlib.sha256(blob).hexdigest()


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


def build_model(cfg: TrainConfig) -> nn.Module:
    """The network a config names, freshly initialised (seeded by ``cfg.seed``)."""
    torch.manual_seed(cfg.seed)
    if cfg.model == "poreformer":
        from ctpore.models.poreformer import PoreFormer, PoreFormerConfig

        return PoreFormer(PoreFormerConfig(**cfg.model_config))
    from ctpore.models.baselines import build_unet

    return build_unet({"kind": cfg.model, **cfg.model_config})


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


@dataclass
class Pool:
    """Normalized scans and their truths, in memory: ``scans[i]``, ``truths[i]`` are (Z, Y, X)."""

    scans: list
    truths: list
    names: list


def simulated_pool(data: DataConfig, val: bool = False, progress: ProgressFn = None) -> Pool:
    from ctpore.data.synthetic import draw_zoom, make_pair

    n = data.n_val if val else data.n_train
    base = data.seed * SEED_STRIDE + (VAL_OFFSET if val else 0)
    scans, truths, names = [], [], []
    size = (data.volume_size,) * 3
    for i in range(n):
        scan, truth, info = make_pair(base + i, shape=size, zoom=draw_zoom(base + i, data.zoom_max))
        scans.append(normalize_volume(scan))
        truths.append(truth.astype(np.float32))
        names.append(f"sim-{base + i}-{info.get('family', '')}")
        if progress is not None:
            progress(i + 1, n, "simulating validation scans" if val else "simulating training scans")
    return Pool(scans, truths, names)


def labelled_pool(images_dir, labels_dir, progress: ProgressFn = None) -> Pool:
    """Scans and labels matched by sorted file name (NIfTI or TIFF)."""
    from ctpore.data.io import read_label, read_volume

    exts = (".nii", ".nii.gz", ".tif", ".tiff")

    def listing(d):
        d = Path(d)
        if not d.is_dir():
            raise InputError("not a folder", path=d)
        files = sorted(p for p in d.iterdir() if p.name.lower().endswith(exts))
        if not files:
            raise InputError("no NIfTI or TIFF files in this folder", path=d)
        return files

    images, labels = listing(images_dir), listing(labels_dir)
    if len(images) != len(labels):
        raise InputError(f"{len(images)} images but {len(labels)} labels; they are matched by sorted name",
                         path=labels_dir)
    scans, truths, names = [], [], []
    for i, (im, lb) in enumerate(zip(images, labels)):
        vol, geom = read_volume(im)
        truth = read_label(lb, like=geom)
        scans.append(normalize_volume(vol))
        truths.append(truth.astype(np.float32))
        names.append(im.name)
        if progress is not None:
            progress(i + 1, len(images), "reading labelled scans")
    return Pool(scans, truths, names)


def _augmenter():
    from monai.transforms import (
        Compose, RandAdjustContrastd, RandFlipd, RandGaussianNoised, RandRotate90d,
        RandScaleIntensityd, RandShiftIntensityd,
    )

    keys = ["image", "label"]
    # Arrays are (C, Z, Y, X): spatial axes 0 = Z, 1 = Y, 2 = X.
    return Compose([
        RandFlipd(keys, prob=0.5, spatial_axis=0),
        RandFlipd(keys, prob=0.5, spatial_axis=1),
        RandFlipd(keys, prob=0.5, spatial_axis=2),
        RandRotate90d(keys, prob=0.5, spatial_axes=(1, 2)),
        RandScaleIntensityd("image", factors=0.15, prob=0.5),
        RandShiftIntensityd("image", offsets=0.1, prob=0.5),
        RandAdjustContrastd("image", gamma=(0.8, 1.25), prob=0.3),
        RandGaussianNoised("image", std=0.03, prob=0.3),
    ])


#: Training crops are given a random absolute depth in [0, MAX_Z0) for PoreFormer's z encoding, so
#: that the model meets the depths of long stacks in training and does not rely on a crop
#: starting at slice 0.
MAX_Z0 = 4096


def make_batch(
    pool: Pool, cfg: TrainConfig, step: int, augmenter=None
) -> tuple[torch.Tensor, torch.Tensor, int, tuple[int, int, int, int]]:
    """The batch of ``step``: a pure function of (pool, config, step).

    Returns ``(x, y, z_first, margins)``: input windows ``x`` (B, Z, Y + top + bottom, X + left +
    right), labels ``y`` (B, Z, Y, X) of the crop inside them, the first slice's absolute depth,
    and ``margins = (top, bottom, left, right)``, the input-only pixels around the crop (up to
    ``data.context`` a side, fewer where the scan ends; one offset for the whole batch). At
    inference every pixel away from the scan's edges has real neighbours; with a context the
    network meets that in training too instead of zero padding at every crop border.
    """
    rng = np.random.default_rng([cfg.seed, step])
    z_first = int(rng.integers(MAX_Z0))
    cz, cy, cx = cfg.data.crop
    ctx = int(cfg.data.context)
    xs, ys = [], []
    for b in range(cfg.batch_size):
        i = int(rng.integers(len(pool.scans)))
        scan, truth = pool.scans[i], pool.truths[i]
        z, y, x = scan.shape
        dz, dy, dx = min(cz, z), min(cy, y), min(cx, x)
        wy, wx = min(dy + 2 * ctx, y), min(dx + 2 * ctx, x)  # the input window
        z0, y0, x0 = (int(rng.integers(0, s - d + 1)) for s, d in ((z, dz), (y, wy), (x, wx)))
        img = scan[z0:z0 + dz, y0:y0 + wy, x0:x0 + wx]
        lab = truth[z0:z0 + dz, y0:y0 + wy, x0:x0 + wx]
        if augmenter is not None:
            augmenter.set_random_state(seed=int(rng.integers(2**31 - 1)))
            out = augmenter({"image": img[None].copy(), "label": lab[None].copy()})
            img = np.asarray(out["image"])[0]
            lab = np.asarray(out["label"])[0]
        xs.append(np.ascontiguousarray(img, dtype=np.float32))
        ys.append(np.ascontiguousarray(lab, dtype=np.float32))
    margins = (0, 0, 0, 0)
    if ctx:
        (wy, wx), (dy, dx) = xs[0].shape[1:], (min(cy, xs[0].shape[1]), min(cx, xs[0].shape[2]))
        oy, ox = int(rng.integers(0, wy - dy + 1)), int(rng.integers(0, wx - dx + 1))
        margins = (oy, wy - dy - oy, ox, wx - dx - ox)
        ys = [lab[:, oy:oy + dy, ox:ox + dx] for lab in ys]
    return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys)), z_first, margins


# ---------------------------------------------------------------------------------------------
# Loss
# ---------------------------------------------------------------------------------------------


def _soft_erode(x: torch.Tensor) -> torch.Tensor:  # x: (B, 1, Z, Y, X)
    p1 = -F.max_pool3d(-x, (3, 1, 1), 1, (1, 0, 0))
    p2 = -F.max_pool3d(-x, (1, 3, 1), 1, (0, 1, 0))
    p3 = -F.max_pool3d(-x, (1, 1, 3), 1, (0, 0, 1))
    return torch.min(torch.min(p1, p2), p3)


def _soft_dilate(x: torch.Tensor) -> torch.Tensor:
    return F.max_pool3d(x, 3, 1, 1)


def soft_skeleton(x: torch.Tensor, iters: int) -> torch.Tensor:
    """Soft morphological skeleton (Shit et al. 2021) of probabilities ``x`` (B, Z, Y, X)."""
    x = x.unsqueeze(1)
    skel = F.relu(x - _soft_dilate(_soft_erode(x)))
    for _ in range(iters):
        x = _soft_erode(x)
        delta = F.relu(x - _soft_dilate(_soft_erode(x)))
        skel = skel + F.relu(delta - skel * delta)
    return skel.squeeze(1)


def loss_terms(logits: torch.Tensor, target: torch.Tensor, loss: LossConfig) -> dict:
    """Each loss term (unweighted) as a scalar tensor."""
    prob = torch.sigmoid(logits)
    terms = {"bce": F.binary_cross_entropy_with_logits(logits, target)}
    eps = 1.0
    inter = (prob * target).sum()
    terms["dice"] = 1 - (2 * inter + eps) / (prob.sum() + target.sum() + eps)
    if loss.cldice > 0:
        sp, st = soft_skeleton(prob, loss.cldice_iters), soft_skeleton(target, loss.cldice_iters)
        tprec = ((sp * target).sum() + eps) / (sp.sum() + eps)
        tsens = ((st * prob).sum() + eps) / (st.sum() + eps)
        terms["cldice"] = 1 - 2 * tprec * tsens / (tprec + tsens)
    return terms


def total_loss(terms: dict, loss: LossConfig) -> torch.Tensor:
    return sum(getattr(loss, k) * v for k, v in terms.items())


def check_finite(step: int, **tensors: torch.Tensor) -> None:
    """Raise :class:`NonFiniteError` naming the first tensor with a NaN/Inf."""
    for name, t in tensors.items():
        if not torch.isfinite(t).all():
            bad = int((~torch.isfinite(t)).sum())
            raise NonFiniteError(f"step {step}: {name} has {bad} non-finite value(s); "
                                 "training stopped (lower the learning rate or check the data)")


# ---------------------------------------------------------------------------------------------
# Checkpoints (safetensors only)
# ---------------------------------------------------------------------------------------------


def save_checkpoint(path: Path, model: nn.Module, opt: torch.optim.Optimizer, step: int, cfg: TrainConfig,
                    history: list) -> None:
    from safetensors.torch import save_file

    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    osd = opt.state_dict()
    for idx, st in osd["state"].items():
        for k, v in st.items():
            t = v if torch.is_tensor(v) else torch.tensor(v)
            tensors[f"optim.{idx}.{k}"] = t.detach().cpu().contiguous()
    meta = {
        "step": str(step),
        "train_config": json.dumps(config_to_dict(cfg)),
        "param_groups": json.dumps(osd["param_groups"]),
        "history": json.dumps(history),
    }
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, path)


def load_checkpoint(path: Path, model: nn.Module, opt: torch.optim.Optimizer) -> tuple[int, list, dict]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata()
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    state: dict = {}
    for k, v in tensors.items():
        if k.startswith("optim."):
            _, idx, name = k.split(".", 2)
            state.setdefault(int(idx), {})[name] = v
    opt.load_state_dict({"state": state, "param_groups": json.loads(meta["param_groups"])})
    return int(meta["step"]), json.loads(meta["history"]), json.loads(meta["train_config"])


# ---------------------------------------------------------------------------------------------
# Validation and diagnostics
# ---------------------------------------------------------------------------------------------


@torch.inference_mode()
def _predict_full(model: nn.Module, scan: np.ndarray, device) -> np.ndarray:
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
    from ctpore.models.attention import attention_entropy as head_entropy

    b, z, y, w = x.shape
    ys, xs = slice(0, y, max(1, y // 8)), slice(0, w, max(1, w // 8))  # an 8x8 grid of pixels
    maps = maps_fn(x, region=(ys, xs))  # per layer (B, Ry, Rx, H, Z, Z)
    per_layer = [head_entropy(m.flatten(0, 2)) for m in maps]  # (H,) each
    return [float(v) for v in torch.stack(per_layer).mean(0)]


def validate(model: nn.Module, pool: Pool, device) -> dict:
    from ctpore.data.metrics import comparison_metrics

    model.eval()
    rows = []
    for scan, truth in zip(pool.scans, pool.truths):
        prob = _predict_full(model, scan, device)
        rows.append(comparison_metrics((prob >= 0.5).astype(np.uint8), truth.astype(np.uint8), prob=prob))
    model.train()
    keys = ("mse", "dice", "euler_error_rel", "porosity_error")
    return {f"val_{k}": float(np.mean([r[k] for r in rows])) for k in keys}


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------


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
        saved_cfg = {**saved_cfg, "data": {**DATA_KEYS_ADDED, **saved_cfg.get("data", {})}}
        # ``threads`` is how the run is executed, not what it computes: it may change on resume.
        if {**saved_cfg, "threads": 0} != {**config_to_dict(cfg), "threads": 0}:
            raise InputError("this run folder holds a checkpoint of a different config; use another "
                             "--run-dir or --no-resume", path=ckpt)
    augmenter = _augmenter() if cfg.data.augment else None
    use_amp = cfg.amp and dev.type == "cuda"

    step = start
    end = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    while step < end:
        torch.manual_seed(cfg.seed * 1_000_003 + step)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        x, y, z_first, margins = make_batch(train_pool, cfg, step, augmenter)
        x, y = x.to(dev), y.to(dev)
        # PoreFormer makes tokens for the crop only and reads the margins as context; a U-Net
        # runs on the whole window and its logits are cropped: both see the same input.
        kw = {"z0": z_first, "margins": margins} if cfg.model == "poreformer" else {}
        try:
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_amp):
                logits = model(x, **kw)
                if cfg.model != "poreformer" and any(margins):
                    mt, mb, ml, mr = margins
                    logits = logits[..., mt:logits.shape[-2] - mb, ml:logits.shape[-1] - mr]
        except NonFiniteError as exc:  # the model's own guard names the layer and tensor
            raise NonFiniteError(f"step {step}: {exc}; training stopped (lower the learning rate "
                                 "or check the data)") from None
        logits = logits.float()
        terms = loss_terms(logits, y, cfg.loss)
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
            save_checkpoint(ckpt, model, opt, step, cfg, history)
        if progress is not None:
            progress(step, cfg.steps, "train")
    with open(run_dir / "history.jsonl", "w") as fh:
        for rec in history:
            fh.write(json.dumps(rec) + "\n")
    return TrainResult(model=model, history=history, checkpoint=ckpt, steps=step,
                       seconds=time.perf_counter() - t0, config=cfg)


#: Speck sizes (voxels) tried when choosing the post-processing on validation scans.
MIN_SIZES = (0, 4, 8, 16, 32)

#: Simulated scans from the validation seed range (``data.seed * SEED_STRIDE + VAL_OFFSET + i``,
#: the first ``data.n_val`` of them the run's validation set) on which the post-processing is
#: chosen and the calibration fitted at export. Twelve were too few: the reliability of the first
#: twelve differed from that of the next 36 by up to 0.13 at the same raw probability, and a map
#: fitted on them raised the MSE on further unseen scans.
POSTPROCESSING_SCANS = 48


def postprocessing_pool(data: DataConfig, progress: ProgressFn = None) -> Pool:
    """The :data:`POSTPROCESSING_SCANS` validation-range scans (never trained on, never benchmarked)."""
    wider = copy.copy(data)
    wider.n_val = max(POSTPROCESSING_SCANS, data.n_val)
    return simulated_pool(wider, val=True, progress=progress)


def select_postprocessing(model: nn.Module, pool: Pool, device="cpu", threshold: float = 0.5,
                          return_probs: bool = False) -> dict:
    """Choose speck removal (and, for a causal model, bidirectional averaging) on validation scans.

    Every option is scored by the mean relative Euler error, ties broken by MSE, on ``pool`` (the
    validation scans, never the benchmark's); the probability calibration is then fitted on the
    same scans with the chosen option (see :mod:`ctpore.data.calibration`). Returns
    ``{"min_size", "bidirectional", "table", "calibration"}`` (and ``"probs"``, the chosen raw
    probabilities of the pool's scans, with ``return_probs``).
    """
    from ctpore.data.calibration import fit_calibration
    from ctpore.data.metrics import comparison_metrics
    from ctpore.models.baselines import clean_specks

    model.eval()
    causal = hasattr(model, "attention_maps")
    table = []
    forward = [_predict_full(model, scan, device) for scan in pool.scans]
    probs_by = {False: forward}
    if causal:  # a second pass over the reversed stack, averaged with the first (as reconstruct does)
        probs_by[True] = [0.5 * (f + _predict_full(model, np.ascontiguousarray(scan[::-1]), device)[::-1])
                          for f, scan in zip(forward, pool.scans)]
    for bidir, probs in probs_by.items():
        for ms in MIN_SIZES:
            rows = []
            for prob, truth in zip(probs, pool.truths):
                pores = (prob >= threshold).astype(np.uint8)
                if ms > 1:
                    pores = clean_specks(pores, ms)
                rows.append(comparison_metrics(pores, truth.astype(np.uint8), prob=prob))
            table.append({"bidirectional": bidir, "min_size": ms,
                          "euler_error_rel": float(np.mean([r["euler_error_rel"] for r in rows])),
                          "mse": float(np.mean([r["mse"] for r in rows])),
                          "dice": float(np.mean([r["dice"] for r in rows]))})
    best = min(table, key=lambda r: (round(r["euler_error_rel"], 6), r["mse"]))
    chosen = probs_by[best["bidirectional"]]
    cal = fit_calibration(zip(chosen, pool.truths))
    post = {"min_size": best["min_size"], "bidirectional": best["bidirectional"], "table": table,
            "calibration": cal}
    if return_probs:
        post["probs"] = chosen
    return post


def export_weights(result: TrainResult, path: Union[str, os.PathLike], name: Optional[str] = None,
                   device: str = "cpu", progress: ProgressFn = None) -> Path:
    """Write the trained network as a weights safetensors file with its provenance.

    The post-processing (speck size, bidirectional averaging) is chosen and the probability
    calibration fitted on :func:`postprocessing_pool` (the run's validation scans and more from the
    same seed range) and stored with the weights, so ``ctpore reconstruct`` applies exactly what
    was chosen.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cfg = result.config
    name = name or cfg.model
    if progress is not None:
        progress(0, 1, "choosing post-processing on validation scans")
    if cfg.data.source == "synthetic":
        post = select_postprocessing(result.model, postprocessing_pool(cfg.data, progress), device, cfg.threshold)
    else:
        post = {"min_size": cfg.min_size, "bidirectional": False, "table": [], "calibration": None}
    meta = {
        "name": name,
        "threshold": str(cfg.threshold),
        "min_size": str(post["min_size"]),
        "bidirectional": str(post["bidirectional"]).lower(),
        "postprocessing_validation": json.dumps(post["table"]),
        "calibration": json.dumps(post["calibration"]),
        "data_config_sha256": data_config_hash(cfg),
        "train_config": json.dumps(config_to_dict(cfg)),
        "steps": str(result.steps),
        "train_seconds": f"{result.seconds:.0f}",
        "final_validation": json.dumps(result.history[-1] if result.history else {}),
    }
    _write_weights(result.model, cfg.model, path, meta)
    if progress is not None:
        progress(1, 1, "choosing post-processing on validation scans")
    return path


def _write_weights(model: nn.Module, kind: str, path: Path, meta: dict) -> None:
    """Write a trained network with its (string) metadata, atomically, readable by everyone."""
    if kind == "poreformer":
        from ctpore.models.weights import save_weights

        save_weights(model, path, metadata=meta)
    else:
        from safetensors.torch import save_file

        meta = {**meta, "config": json.dumps(model.config)}
        sd = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            save_file(sd, str(tmp), metadata=meta)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    from ctpore.pipelines.reconstruct import chmod_default

    chmod_default(path)  # safetensors writes 0600; shipped files are readable by everyone


def refit_postprocessing(path: Union[str, os.PathLike], device: str = "cpu", progress: ProgressFn = None) -> dict:
    """Choose the post-processing and fit the calibration of a trained weights file again, in place.

    For weights exported before :data:`POSTPROCESSING_SCANS` or calibration existed. The file's own
    training config names its validation seed range (simulated; a file trained on labelled scans
    has none and is refused); :func:`select_postprocessing` runs on
    :func:`postprocessing_pool` exactly as at export, and the file is rewritten with the same
    tensors and provenance and the new ``min_size``, ``bidirectional``, ``calibration`` and
    ``postprocessing_validation``.

    Returns
    -------
    dict
        What :func:`select_postprocessing` returned, plus the pool's mean MSE before
        (``mse_raw``) and after (``mse``) calibration.
    """
    from ctpore.data.calibration import apply_calibration
    from ctpore.models.weights import read_metadata

    path = Path(path)
    meta = read_metadata(path)
    if "train_config" not in meta:
        raise InputError("the weights file has no training config, so no validation scans to "
                         "choose its post-processing on", path=path)
    cfg = config_from_dict(json.loads(meta["train_config"]), path)
    if cfg.data.source != "synthetic":
        raise InputError("weights trained on labelled scans have no held-out validation scans to "
                         "choose their post-processing on", path=path)
    if cfg.model == "poreformer":
        from ctpore.models.weights import load_model

        model = load_model(path, device=device)
    else:
        from ctpore.pipelines.bench import _load_unet

        model = _load_unet(cfg.model, path, calibrated=False).to(device)  # the map is refitted
    pool = postprocessing_pool(cfg.data, progress)
    post = select_postprocessing(model, pool, device, cfg.threshold, return_probs=True)
    probs = post.pop("probs")
    post["mse_raw"] = float(np.mean([np.mean((p - t) ** 2) for p, t in zip(probs, pool.truths)]))
    post["mse"] = float(np.mean([np.mean((apply_calibration(p, post["calibration"]) - t) ** 2)
                                 for p, t in zip(probs, pool.truths)]))
    out = {k: v for k, v in meta.items() if k not in ("config", "format")}
    out.update(min_size=str(post["min_size"]), bidirectional=str(post["bidirectional"]).lower(),
               postprocessing_validation=json.dumps(post["table"]), calibration=json.dumps(post["calibration"]))
    _write_weights(model, cfg.model, path, out)
    return post
