"""Training of PoreFormer (and of the U-Net baselines) on simulated CT and on labelled scans.

Rooms
-----
``config``   the training config (YAML in, checked; the data hash that names the training scans).
``batches``  scans in memory and the batch of each step (a pure function of the step).
``loop``     the loop: seeded per step, checkpointed, resumable to the same weights; validation.
``export``   post-processing chosen and calibration fitted on validation scans, weights written;
             :func:`refit_postprocessing` redoes that for an existing weights file.

The losses are in :mod:`ctpore.models.losses`, checkpoints and weights files in
:mod:`ctpore.models.weights`, and the seed ranges of the splits in :mod:`ctpore.data.splits`.
"""

from __future__ import annotations

from ctpore.data.splits import BENCH_SEED_BASE, SEED_STRIDE, VAL_OFFSET
from ctpore.pipelines.train.batches import MAX_Z0, Pool, labelled_pool, make_batch, simulated_pool
from ctpore.pipelines.train.config import (
    DATA_KEYS_ADDED,
    LOSS_KEYS_ADDED,
    TRAIN_KEYS_ADDED,
    DataConfig,
    LossConfig,
    TrainConfig,
    config_from_dict,
    config_to_dict,
    data_config_hash,
    load_train_config,
)
from ctpore.pipelines.train.export import (
    CONFIDENCES,
    POSTPROCESSING_SCANS,
    export_weights,
    postprocessing_pool,
    refit_postprocessing,
    select_postprocessing,
    topology_score,
)
from ctpore.pipelines.train.loop import TrainResult, build_model, lr_at, train, validate

__all__ = [
    "BENCH_SEED_BASE",
    "SEED_STRIDE",
    "VAL_OFFSET",
    "MAX_Z0",
    "Pool",
    "labelled_pool",
    "make_batch",
    "simulated_pool",
    "DATA_KEYS_ADDED",
    "LOSS_KEYS_ADDED",
    "TRAIN_KEYS_ADDED",
    "DataConfig",
    "LossConfig",
    "TrainConfig",
    "config_from_dict",
    "config_to_dict",
    "data_config_hash",
    "load_train_config",
    "CONFIDENCES",
    "POSTPROCESSING_SCANS",
    "export_weights",
    "postprocessing_pool",
    "refit_postprocessing",
    "select_postprocessing",
    "topology_score",
    "TrainResult",
    "build_model",
    "lr_at",
    "train",
    "validate",
]
