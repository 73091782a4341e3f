"""Which simulated scans are for training, validation and the benchmark: seed ranges in one place.

A simulated scan is a pure function of its seed (:func:`ctpore.data.synthetic.make_pair`), so a
split is a range of seeds. A training config with ``data.seed = s`` trains on seeds
``s * SEED_STRIDE + i`` and validates (and chooses its post-processing) on
``s * SEED_STRIDE + VAL_OFFSET + i``. The benchmark draws its held-out scans from
``BENCH_SEED_BASE`` upwards, far beyond the training ranges, so held-out scans are never trained on.
"""

from __future__ import annotations

__all__ = ["SEED_STRIDE", "VAL_OFFSET", "BENCH_SEED_BASE", "train_seed", "val_seed"]

#: Seeds of one training config's scans start at ``data.seed * SEED_STRIDE``.
SEED_STRIDE = 1_000_000

#: Validation scans start this far after the training scans of the same config.
VAL_OFFSET = 500_000

#: First seed of the benchmark's held-out simulated scans.
BENCH_SEED_BASE = 10**12


def train_seed(data_seed: int, i: int) -> int:
    """Seed of training scan ``i`` of a config with ``data.seed = data_seed``."""
    return data_seed * SEED_STRIDE + i


def val_seed(data_seed: int, i: int) -> int:
    """Seed of validation scan ``i`` of a config with ``data.seed = data_seed``."""
    return data_seed * SEED_STRIDE + VAL_OFFSET + i
