"""Training data: scans in memory (simulated or labelled) and the batch of each step.

The batch of step ``s`` is a pure function of (pool, config, ``s``): crops and augmentation are
drawn from ``np.random.default_rng([seed, s])``, so a resumed run sees exactly the batches of an
uninterrupted one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ctpore.data.io import read_label, read_volume
from ctpore.data.normalize import normalize_volume
from ctpore.data.splits import check_config_seeds, train_seed, val_seed
from ctpore.data.synthetic import draw_zoom, make_pair
from ctpore.errors import InputError
from ctpore.pipelines.train.config import DataConfig, TrainConfig
from ctpore.progress import ProgressFn

__all__ = ["Pool", "simulated_pool", "labelled_pool", "make_augmenter", "MAX_Z0", "make_batch"]


@dataclass
class Pool:
    """Normalized scans and their truths, in memory: ``scans[i]``, ``truths[i]`` are (Z, Y, X)."""

    scans: list
    truths: list
    names: list


def simulated_pool(data: DataConfig, val: bool = False, progress: ProgressFn = None) -> Pool:
    """The training (or, with ``val``, the validation) scans of ``data``, simulated and normalized.

    Seeds :func:`~ctpore.data.splits.train_seed` / :func:`~ctpore.data.splits.val_seed` ``(data.seed,
    i)``; ranges that overlap another split's are an InputError before any scan is simulated
    (:func:`~ctpore.data.splits.check_config_seeds`, also for a DataConfig built without the loader).
    """
    check_config_seeds(data.seed, data.n_train, data.n_val)
    n = data.n_val if val else data.n_train
    base = val_seed(data.seed, 0) if val else train_seed(data.seed, 0)
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


def make_augmenter():
    """The MONAI augmentation of training crops: flips, in-plane 90° turns, intensity changes."""
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


