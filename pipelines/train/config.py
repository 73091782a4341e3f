"""The training config: what a run trains, on which data, with which loss and budget.

Read from YAML by :func:`load_train_config`; unknown keys are an error, and so are seed ranges that
reach another split's scans (:func:`ctpore.data.splits.check_config_seeds`). The config is stored in
every checkpoint and exported weights file, and the hash of its data section
(:func:`data_config_hash`) names the scans the weights were trained on.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Union

import yaml

from ctpore.data.splits import check_config_seeds
from ctpore.data.synthetic import check_zoom
from ctpore.data.synthetic.small_pores import check_fraction
from ctpore.errors import InputError

__all__ = [
    "DataConfig",
    "LossConfig",
    "TrainConfig",
    "DATA_KEYS_ADDED",
    "LOSS_KEYS_ADDED",
    "TRAIN_KEYS_ADDED",
    "load_train_config",
    "config_from_dict",
    "config_to_dict",
    "data_config_hash",
]


@dataclass
class DataConfig:
    source: str = "synthetic"        # "synthetic" or "labelled" (set by --images/--labels)
    seed: int = 1                    # seeds of the simulated scans derive from it (data.splits): 0-999999, not 2
    n_train: int = 48                # simulated training volumes (generated once, then cropped), <= 500000
    n_val: int = 4                   # simulated validation volumes (full volumes are scored), <= 500000
    volume_size: int = 64            # edge of each simulated cubic volume
    crop: tuple = (32, 48, 48)       # training crop (Z, Y, X): the voxels the loss covers
    context: int = 0                 # extra in-plane pixels read around each crop as input only
    augment: bool = True             # MONAI flips, in-plane 90° turns, intensity/gamma/noise changes
    zoom_max: float = 1.0            # half the simulated scans have features enlarged up to this factor
    small_pores: float = 0.0         # share of simulated scans given small isolated pores (1.1-2 voxels in radius)
    throat_crops: float = 0.0        # share of training crops placed on a throat (a 1-3-voxel neck of either phase)


#: DataConfig keys added after weights and checkpoints were first written, at the value that means
#: "the same data as before": a stored config without them has these, and the data hash omits them.
DATA_KEYS_ADDED = {"context": 0, "zoom_max": 1.0, "small_pores": 0.0, "throat_crops": 0.0}

#: LossConfig keys added after weights and checkpoints were first written, at the value that means
#: "the same loss as before".
LOSS_KEYS_ADDED = {"skeleton_recall": 0.0}

#: TrainConfig keys added after checkpoints were first written, at the value that means "as before".
TRAIN_KEYS_ADDED = {"init_weights": ""}


@dataclass
class LossConfig:
    bce: float = 1.0                 # weight of binary cross-entropy
    dice: float = 1.0                # weight of soft Dice loss
    cldice: float = 0.5              # weight of soft clDice (0 = off)
    cldice_iters: int = 3            # soft-skeleton iterations
    skeleton_recall: float = 0.0     # weight of skeleton recall on pores and solid (0 = off)


@dataclass
class TrainConfig:
    model: str = "poreformer"        # a trainable method: "poreformer", "unet2d" or "unet3d"
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
    init_weights: str = ""           # weights file (safetensors) whose network starts the run ("" = fresh);
                                     # its steps and seconds count in the exported budget


def _from_dict(cls, d: dict):
    known = {f for f in cls.__dataclass_fields__}
    unknown = set(d) - known
    if unknown:
        raise InputError(f"unknown {cls.__name__} keys: {', '.join(sorted(unknown))}")
    return cls(**d)


def load_train_config(path: Union[str, os.PathLike]) -> TrainConfig:
    """Read a training config (YAML): :func:`config_from_dict` on its contents.

    Unknown keys are an error, not silently ignored; so are seed ranges that overlap another
    split's (:func:`ctpore.data.splits.check_config_seeds`).

    Raises
    ------
    InputError
        Naming ``path``: a missing file, bad YAML, an unknown key or a bad value.
    """
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise InputError("no such config file", path=path) from None
    except yaml.YAMLError as exc:
        raise InputError(f"not valid YAML ({exc})", path=path) from None
    return config_from_dict(raw, path)


def config_from_dict(raw: dict, path=None) -> TrainConfig:
    """A checked :class:`TrainConfig` from the dict of a YAML file or of a weights file's metadata.

    Parameters
    ----------
    raw : dict
        The config's keys; missing ones take the defaults, unknown ones are an error.
    path : str or Path, optional
        Where ``raw`` was read from, named in errors.

    Raises
    ------
    InputError
        An unknown key, a bad value, or a ``data.seed``/``n_train``/``n_val`` whose training or
        validation scans would overlap another split's (another config's, or the held-out
        evaluation scans: :func:`ctpore.data.splits.check_config_seeds`).
    """
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
    try:
        data.zoom_max = check_zoom(data.zoom_max, "data.zoom_max")
        data.small_pores = check_fraction(data.small_pores, "data.small_pores")
        data.throat_crops = check_fraction(data.throat_crops, "data.throat_crops")
        if not (isinstance(loss.skeleton_recall, (int, float)) and loss.skeleton_recall >= 0):
            raise InputError(f"loss.skeleton_recall must be a weight >= 0, got {loss.skeleton_recall!r}")
    except InputError as exc:
        raise InputError(exc.message, path=path) from None
    if not isinstance(cfg.init_weights, str):
        raise InputError(f"init_weights must be a path to a weights file (or empty), got {cfg.init_weights!r}",
                         path=path)
    check_config_seeds(data.seed, data.n_train, data.n_val, path)  # before any scan is simulated
    from ctpore.pipelines.methods import trainable_names

    if cfg.model not in trainable_names():
        raise InputError(f"model must be one of {', '.join(trainable_names())}, got {cfg.model!r}", path=path)
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


