"""Training data: scans in memory (simulated or labelled) and the batch of each step.

The batch of step ``s`` is a pure function of (pool, config, ``s``): crops and augmentation are
drawn from ``np.random.default_rng([seed, s])``, so a resumed run sees exactly the batches of an
uninterrupted one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Optional

import numpy as np
import torch

from ctpore.data.io import read_label, read_volume
from ctpore.data.normalize import normalize_volume
from ctpore.data.splits import check_config_seeds, train_seed, val_seed
from ctpore.data.synthetic import draw_small_pores, draw_zoom, make_pair
from ctpore.errors import InputError
from ctpore.pipelines.train.config import DataConfig, TrainConfig
from ctpore.progress import ProgressFn

__all__ = ["Pool", "Batch", "simulated_pool", "labelled_pool", "make_augmenter", "MAX_Z0", "make_batch",
           "topology_targets", "add_topology_targets"]


@dataclass
class Pool:
    """Normalized scans and their truths, in memory: ``scans[i]``, ``truths[i]`` are (Z, Y, X).

    ``skeletons[i]`` (uint8 (2, Z, Y, X): the tubed skeletons of the pores and of the solid) and
    ``throats[i]`` (int (N, 3): the voxels where either phase narrows to 1-3 voxels) are filled by
    :func:`add_topology_targets` when the training config needs them.
    """

    scans: list
    truths: list
    names: list
    skeletons: Optional[list] = None
    throats: Optional[list] = None


def topology_targets(truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The tubed skeletons of both phases and the throat voxels of a truth volume.

    Skeleton recall (Kirchhoff et al. 2024) scores how much of each phase's skeleton a prediction
    keeps; the skeleton (:func:`skimage.morphology.skeletonize`) is thickened by its 6 face
    neighbours inside the phase (a "tubed" skeleton), computed once per scan rather than per step.
    A throat voxel is a skeleton voxel of either phase whose distance to the other phase is at most
    1.5 voxels: there that phase is at most about 3 voxels across, so one voxel lost or added there
    can cut or join a path.

    Returns
    -------
    skeletons : numpy.ndarray
        uint8 (2, Z, Y, X): channel 0 the pores', channel 1 the solid's tubed skeleton.
    throats : numpy.ndarray
        int64 (N, 3) voxel indices.
    """
    from scipy import ndimage as ndi
    from skimage.morphology import skeletonize

    phase = truth.astype(bool)
    cross = ndi.generate_binary_structure(3, 1)
    skels, necks = [], []
    for mask in (phase, ~phase):
        skel = skeletonize(mask) > 0
        skels.append((ndi.binary_dilation(skel, cross) & mask).astype(np.uint8))
        width = ndi.distance_transform_edt(mask)
        necks.append(np.argwhere(skel & (width <= 1.5)))
    return np.stack(skels), np.concatenate(necks).astype(np.int64)


def add_topology_targets(pool: Pool, progress: ProgressFn = None) -> Pool:
    """``pool`` with :attr:`Pool.skeletons` and :attr:`Pool.throats` filled (in place)."""
    skeletons, throats = [], []
    for i, truth in enumerate(pool.truths):
        sk, th = topology_targets(truth)
        skeletons.append(sk)
        throats.append(th)
        if progress is not None:
            progress(i + 1, len(pool.truths), "skeletons and throats of the training scans")
    pool.skeletons, pool.throats = skeletons, throats
    return pool


class Batch(NamedTuple):
    """One training step's input: windows ``x`` (B, Z, Y', X'), labels ``y`` (B, Z, Y, X) of the
    crop inside them, the first slice's absolute depth, the input-only ``margins`` (top, bottom,
    left, right), and the tubed skeletons (B, 2, Z, Y, X) of the labels' two phases, or None."""

    x: torch.Tensor
    y: torch.Tensor
    z_first: int
    margins: tuple
    skeletons: Optional[torch.Tensor] = None


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
        scan, truth, info = make_pair(base + i, shape=size, zoom=draw_zoom(base + i, data.zoom_max),
                                      small_pores=draw_small_pores(base + i, data.small_pores))
        scans.append(normalize_volume(scan))
        truths.append(truth.astype(np.float32))
        names.append(f"sim-{base + i}-{info.get('family', '')}")
        if progress is not None:
            progress(i + 1, n, "simulating validation scans" if val else "simulating training scans")
    return Pool(scans, truths, names)


def labelled_pool(images_dir, labels_dir, progress: ProgressFn = None) -> Pool:
    """Scans and labels matched by sorted file name: every entry of the folders that a reader of
    the format table (:data:`~ctpore.data.io.registry.READERS`) reads, files or folders of slices
    (NIfTI, TIFF, HDF5, MetaImage, NRRD, OME-Zarr, ...); a MetaImage's raw data file is not an entry."""
    from ctpore.data.io.registry import file_kind, supported_help

    def listing(d):
        d = Path(d)
        if not d.is_dir():
            raise InputError("not a folder", path=d)
        files = sorted(p for p in d.iterdir() if not p.name.startswith(".") and file_kind(p))
        if not files:
            raise InputError(f"no scan in this folder that ctpore reads ({supported_help()})", path=d)
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


def make_augmenter(skeletons: bool = False):
    """The MONAI augmentation of training crops: flips, in-plane 90° turns, intensity changes.

    With ``skeletons`` the flips and turns also move the ``"skel"`` entry (the labels' skeletons);
    they draw the same random numbers either way, so the images and labels are the same."""
    from monai.transforms import (
        Compose, RandAdjustContrastd, RandFlipd, RandGaussianNoised, RandRotate90d,
        RandScaleIntensityd, RandShiftIntensityd,
    )

    keys = ["image", "label"] + (["skel"] if skeletons else [])
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


def _crop_start(rng, shape, window, throats, throat_share: float) -> tuple[int, int, int]:
    """Where a window of ``window`` voxels starts in a scan of ``shape``: anywhere, or (with
    probability ``throat_share``, when the scan has throats) so that it holds a random throat voxel."""
    if throat_share > 0 and rng.random() < throat_share and throats is not None and len(throats):
        p = throats[int(rng.integers(len(throats)))]
        return tuple(int(rng.integers(max(0, c - d + 1), min(c, s - d) + 1)) for c, s, d in zip(p, shape, window))
    return tuple(int(rng.integers(0, s - d + 1)) for s, d in zip(shape, window))


def make_batch(pool: Pool, cfg: TrainConfig, step: int, augmenter=None, skeletons: bool = False) -> Batch:
    """The batch of ``step``: a pure function of (pool, config, step).

    Returns a :class:`Batch`: input windows ``x`` (B, Z, Y + top + bottom, X + left + right),
    labels ``y`` (B, Z, Y, X) of the crop inside them, the first slice's absolute depth, and
    ``margins = (top, bottom, left, right)``, the input-only pixels around the crop (up to
    ``data.context`` a side, fewer where the scan ends; one offset for the whole batch). At
    inference every pixel away from the scan's edges has real neighbours; with a context the
    network meets that in training too instead of zero padding at every crop border. With
    ``skeletons`` (the pool's :attr:`Pool.skeletons` must be filled), ``Batch.skeletons`` holds the
    labels' tubed skeletons, cropped and augmented with them. A share ``data.throat_crops`` of the
    windows is placed on a throat of the pool's :attr:`Pool.throats` (no random number is drawn for
    it when the share is 0, so older configs see the batches they always saw).
    """
    rng = np.random.default_rng([cfg.seed, step])
    z_first = int(rng.integers(MAX_Z0))
    cz, cy, cx = cfg.data.crop
    ctx = int(cfg.data.context)
    share = float(getattr(cfg.data, "throat_crops", 0.0))
    xs, ys, ss = [], [], []
    for _b in range(cfg.batch_size):
        i = int(rng.integers(len(pool.scans)))
        scan, truth = pool.scans[i], pool.truths[i]
        z, y, x = scan.shape
        dz, dy, dx = min(cz, z), min(cy, y), min(cx, x)
        wy, wx = min(dy + 2 * ctx, y), min(dx + 2 * ctx, x)  # the input window
        throats = pool.throats[i] if pool.throats is not None else None
        z0, y0, x0 = _crop_start(rng, (z, y, x), (dz, wy, wx), throats, share)
        box = (slice(z0, z0 + dz), slice(y0, y0 + wy), slice(x0, x0 + wx))
        img, lab = scan[box], truth[box]
        skel = pool.skeletons[i][(slice(None),) + box] if skeletons else None
        if augmenter is not None:
            augmenter.set_random_state(seed=int(rng.integers(2**31 - 1)))
            item = {"image": img[None].copy(), "label": lab[None].copy()}
            if skeletons:
                item["skel"] = skel.copy()
            out = augmenter(item)
            img = np.asarray(out["image"])[0]
            lab = np.asarray(out["label"])[0]
            if skeletons:
                skel = np.asarray(out["skel"])
        xs.append(np.ascontiguousarray(img, dtype=np.float32))
        ys.append(np.ascontiguousarray(lab, dtype=np.float32))
        if skeletons:
            ss.append(np.ascontiguousarray(skel, dtype=np.float32))
    margins = (0, 0, 0, 0)
    if ctx:
        (wy, wx), (dy, dx) = xs[0].shape[1:], (min(cy, xs[0].shape[1]), min(cx, xs[0].shape[2]))
        oy, ox = int(rng.integers(0, wy - dy + 1)), int(rng.integers(0, wx - dx + 1))
        margins = (oy, wy - dy - oy, ox, wx - dx - ox)
        ys = [lab[:, oy:oy + dy, ox:ox + dx] for lab in ys]
        ss = [sk[:, :, oy:oy + dy, ox:ox + dx] for sk in ss]
    return Batch(torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys)), z_first, margins,
                 torch.from_numpy(np.stack(ss)) if skeletons else None)
