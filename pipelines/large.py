"""Scans of any size: PoreFormer's outputs and metrics computed slab by slab.

``ctpore reconstruct`` (and :func:`ctpore.pipelines.reconstruct.reconstruct_file`) takes this
path with PoreFormer, so that its memory does not grow with the number of slices, and scans far
larger than memory (the probability map, the pores and the input alone take 9 bytes a voxel)
finish within the budget:

1. :func:`~ctpore.pipelines.stream.predict` streams the scan through the model tile by tile (each
   tile through all its slices with its own KV cache) and writes every block of probabilities to
   a :class:`BlockSpill`, a temporary file beside the outputs, one region per tile, so a block is
   one write and a slab of slices is one read per tile.
2. The spill is read back in slabs of slices, in z order. Speck removal needs the size of every
   connected component, so the slabs are read three times: to size the pore components
   (26-connected, joined across slab boundaries by :class:`~ctpore.data.topology.SlabComponents`),
   to size the solid islands left once the small pores are gone (6-connected), and to write: each
   slab thresholded, cleaned, calibrated, appended to the output files
   (:class:`~ctpore.data.io.write.SlabWriter`, ``.nii.gz`` compressed on the fly) and fed to the
   metrics (:class:`~ctpore.data.topology.StreamingTopology`: the Euler number is additive over
   the vertex planes between slices), with the truth read slab by slab beside it when given.

Memory is then the model's working set plus a few slabs, whatever the number of slices; the
figures are exact, equal to those of the in-memory path.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from ctpore.data.calibration import apply_calibration
from ctpore.data.io import Scan, load_scan
from ctpore.data.io.write import SlabWriter
from ctpore.data.slabs import SlabComponents, StreamingTopology
from ctpore.errors import InputError
from ctpore.progress import ProgressFn

__all__ = ["BlockSpill", "plan_budget", "postprocess_slabs", "reconstruct_large", "slab_bytes"]


class BlockSpill:
    """A ``(Z, Y, X)`` float32 volume on disk, written in tile blocks and read back in slabs.

    Stands as ``predict``'s ``out``: ``spill[z0:z1, y0:y1, x0:x1] = block``. Each tile (the
    ``(y0:y1, x0:x1)`` of its blocks) gets its own region of the file, slices one after the
    other, so writing a block is one write and :meth:`read` of a slab one read per tile. The
    data goes through the page cache, not the process's memory. The file has no name (it is
    unlinked as soon as it is made), so it vanishes with :meth:`close` or with the process.
    """

    def __init__(self, folder: str | os.PathLike, shape: tuple[int, int, int]):
        self.shape = tuple(int(s) for s in shape)
        fd, name = tempfile.mkstemp(prefix=".ctpore-spill-", suffix=".f32", dir=folder)
        os.unlink(name)  # nameless from the start: even a killed run leaves nothing behind
        self._fd = fd
        self._tiles: dict[tuple[int, int, int, int], int] = {}  # (y0, y1, x0, x1) -> byte offset
        self._end = 0

    def __setitem__(self, key, value) -> None:
        zs, ys, xs = key
        box = (ys.start, ys.stop, xs.start, xs.stop)
        h, w = box[1] - box[0], box[3] - box[2]
        if box not in self._tiles:
            self._tiles[box] = self._end
            self._end += self.shape[0] * h * w * 4
        block = np.ascontiguousarray(value, dtype=np.float32)
        if block.shape != (zs.stop - zs.start, h, w):
            raise ValueError(f"block {block.shape} does not fit {key}")
        os.pwrite(self._fd, block.tobytes(), self._tiles[box] + zs.start * h * w * 4)

    def read(self, z0: int, z1: int) -> np.ndarray:
        """Slices ``z0:z1`` as ``(n, Y, X)`` float32."""
        n = z1 - z0
        out = np.empty((n, *self.shape[1:]), np.float32)
        for (y0, y1, x0, x1), off in self._tiles.items():
            h, w = y1 - y0, x1 - x0
            raw = os.pread(self._fd, n * h * w * 4, off + z0 * h * w * 4)
            out[:, y0:y1, x0:x1] = np.frombuffer(raw, np.float32).reshape(n, h, w)
        return out

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> "BlockSpill":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def slab_bytes(plane: tuple[int, int], n: int) -> int:
    """Working memory of post-processing one slab of ``n`` slices: the probabilities (4 bytes a
    voxel), the labels of the components (8) and a few masks and temporaries (~12)."""
    return int(n * plane[0] * plane[1] * 24)


def postprocess_slabs(
    spill: BlockSpill,
    geometry,
    paths: dict,
    threshold: float,
    min_size: int,
    calibration: dict | None,
    slab: int,
    truth: str | os.PathLike | None = None,
    slice_axis: int | None = None,
    progress: ProgressFn = None,
) -> dict:
    """Pores, calibrated probabilities and metrics from the spilled raw probabilities, slab by slab.

    Writes ``paths["pores"]`` and ``paths["prob"]`` (each whole or not at all) and returns the
    metrics that :func:`ctpore.data.metrics.volume_metrics` (and, with ``truth``,
    :func:`~ctpore.data.metrics.comparison_metrics`) give on the whole volume.
    """
    nz, ny, nx = spill.shape
    cuts = [(s0, min(nz, s0 + slab)) for s0 in range(0, nz, slab)]
    steps = len(cuts) * (3 if min_size > 1 else 1)
    done = 0

    def tick(stage: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, steps, stage)

    pores_cc = solid_cc = None
    if min_size > 1:  # as clean_specks: small pore components go, then the small solid islands
        pores_cc = SlabComponents(26)
        for a, b in cuts:
            pores_cc.add(spill.read(a, b) >= threshold)
            tick("sizing pores")
        small_pores = pores_cc.small(min_size)
        solid_cc = SlabComponents(6)
        for i, (a, b) in enumerate(cuts):
            pores = spill.read(a, b) >= threshold
            pores &= ~small_pores[pores_cc.labels(pores, i)]
            solid_cc.add(~pores)
            tick("sizing solid islands")
        small_solid = solid_cc.small(min_size)
    topo = StreamingTopology()
    truth_scan: Scan | None = None
    sums = {"sq": 0.0, "pred": 0, "truth": 0, "inter": 0}
    truth_topo = None
    if truth is not None:
        axis = slice_axis if slice_axis is not None else (geometry.slice_axis if geometry.format == "nifti" else None)
        truth_scan = load_scan(truth, slice_axis=axis)
        if tuple(truth_scan.shape) != tuple(spill.shape):
            truth_scan.close()
            raise InputError(f"label shape (Z, Y, X) = {truth_scan.shape} differs from the scan's {spill.shape}",
                             truth)
        truth_topo = StreamingTopology(components=False)
    try:
        with SlabWriter(paths["pores"], geometry, np.uint8) as pores_out, \
                SlabWriter(paths["prob"], geometry, np.float32) as prob_out:
            for i, (s0, s1) in enumerate(cuts):
                prob = spill.read(s0, s1)
                pores = prob >= threshold  # on the raw probability
                if pores_cc is not None:
                    pores &= ~small_pores[pores_cc.labels(pores, i)]
                    solid = ~pores
                    pores |= small_solid[solid_cc.labels(solid, i)]
                pores = pores.view(np.uint8)
                if calibration is not None:
                    apply_calibration(prob, calibration, out=prob)
                topo.add(pores)
                pores_out.write(pores)
                prob_out.write(prob)
                if truth_scan is not None:
                    t = _binary_slab(truth_scan, s0, s1, truth)
                    truth_topo.add(t)
                    d = prob.astype(np.float64) - t
                    sums["sq"] += float(np.einsum("ijk,ijk->", d, d))
                    sums["pred"] += int(np.count_nonzero(pores))
                    sums["truth"] += int(np.count_nonzero(t))
                    sums["inter"] += int(np.count_nonzero(pores & t))
                tick("writing pores and metrics")
    finally:
        if truth_scan is not None:
            truth_scan.close()
    n = nz * ny * nx
    metrics = {
        "porosity": topo.n_pore_voxels / n,
        "euler_number": topo.euler_number(26),
        "euler_number_6": topo.euler_number(6),
        "connectivity_density_per_mm3": topo.connectivity_density(geometry.spacing_mm),
        "n_pores": topo.n_components(),
    }
    if truth_topo is not None:
        chi_p, chi_t = metrics["euler_number"], truth_topo.euler_number(26)
        n_p, n_t, inter = sums["pred"], sums["truth"], sums["inter"]
        union = n_p + n_t - inter
        metrics.update(
            mse=sums["sq"] / n,
            dice=1.0 if n_p + n_t == 0 else 2.0 * inter / (n_p + n_t),
            iou=1.0 if union == 0 else inter / union,
            porosity_error=abs(n_p - n_t) / n,
            euler_error_rel=abs(chi_p - chi_t) / max(abs(chi_t), 1),
            euler_number_pred=chi_p,
            euler_number_truth=chi_t,
            porosity_pred=n_p / n,
            porosity_truth=n_t / n,
        )
    return metrics


def _binary_slab(scan: Scan, s0: int, s1: int, path) -> np.ndarray:
    t = scan.read_slices(s0, s1)
    odd = (t != 0) & (t != 1)
    if odd.any():
        vals = ", ".join(f"{v:g}" for v in np.unique(t[odd])[:10])
        raise InputError(f"a label must hold only 0 (solid) and 1 (pore), found also {vals}; binarize it first "
                         "(1 = pore)", path)
    return t.astype(np.uint8)



def plan_budget(model, shape: tuple[int, int, int], memory_gb: float, rss: float, device=None,
                gpu_memory_gb: float | None = None) -> tuple[int, tuple[int, int]]:
    """How ``reconstruct_large`` spends ``memory_gb`` for the whole process, ``rss`` bytes already used:
    the slab of post-processing (slices) and the model's ``(tile, chunk_slices)``.

    A quarter of what is left goes to the slab, the rest (less a margin) to the model's tiles; on
    CUDA the tiles follow the GPU's memory instead (``gpu_memory_gb``, see
    :func:`~ctpore.pipelines.stream.plan_for_device`) and the rest bounds the host's staging.
    """
    from ctpore.pipelines.stream import plan_for_device

    budget = memory_gb * 2**30 - rss - 64 * 2**20
    slab = max(1, min(shape[0], 64, int(budget * 0.25) // max(1, slab_bytes(shape[1:], 1))))
    return slab, plan_for_device(model, shape, budget - slab_bytes(shape[1:], slab), device, gpu_memory_gb)


def reconstruct_large(
    scan_path: str | os.PathLike,
    paths: dict,
    *,
    weights=None,
    device: str = "cpu",
    slice_axis: int | None = None,
    truth=None,
    memory_gb: float = 1.5,
    precision: str = "auto",
    chunk_slices: int | None = None,
    tile: int | None = None,
    progress: ProgressFn = None,
    attention_backend: str | None = None,
    gpu_memory_gb: float | None = None,
) -> dict:
    """``ctpore reconstruct`` with PoreFormer, slab by slab: writes ``paths`` and returns the metrics.

    The same outputs and metrics as the in-memory :func:`~ctpore.pipelines.reconstruct.reconstruct`
    (see the module docstring), within
    ``memory_gb`` for the whole process.
    """
    import time

    from ctpore import __version__
    from ctpore.data.normalize import NormalizedVolume, has_contrast, robust_range, warn_no_contrast
    from ctpore.models.weights import load_for_inference, sha256_file
    from ctpore.pipelines.outputs import finish_metrics, run_fields
    from ctpore.pipelines.stream import predict, resolve_device
    from ctpore.runtime import current_rss

    t0 = time.perf_counter()
    dev = resolve_device(device)
    folder = Path(paths["metrics"]).parent  # the caller made it
    with load_scan(scan_path, slice_axis=slice_axis) as scan:  # a bad scan is said before the weights load
        model, meta, post, wpath = load_for_inference(weights, dev, attention_backend)
        shape, geometry = tuple(scan.shape), scan.geometry
        slab, plan = plan_budget(model, shape, memory_gb, current_rss(), dev, gpu_memory_gb)
        tile = plan[0] if tile is None else tile
        chunk_slices = plan[1] if chunk_slices is None else chunk_slices
        lo, hi = robust_range(scan)
        with _windowed(scan, folder, shape, tile, model.halo, progress) as source, BlockSpill(folder, shape) as spill:
            model.reset_backends_ran()
            clipped = 0
            if has_contrast(lo, hi):
                view = NormalizedVolume(source, lo, hi)
                predict(model, view, chunk_slices=chunk_slices, tile=tile, device=dev,
                        progress=progress, out=spill, precision=precision)
                clipped = view.clipped_voxels(progress)  # counted (and said) only when values were clipped
            else:  # nothing to see: no pores, said in a warning
                warn_no_contrast(lo)
                for z0 in range(0, shape[0], slab):
                    z1 = min(shape[0], z0 + slab)
                    spill[z0:z1, 0:shape[1], 0:shape[2]] = np.zeros((z1 - z0, *shape[1:]), np.float32)
            metrics = postprocess_slabs(spill, geometry, paths, post.threshold, post.min_size,
                                        post.calibration, slab, truth=truth, slice_axis=slice_axis,
                                        progress=progress)
    info = {"model": {"name": meta.get("name", wpath.stem), "sha256": sha256_file(wpath)},
            "device": str(dev), "attention_backend": model.backends_ran()}
    metrics.update(run_fields(shape, geometry, "poreformer", info))
    metrics["clipped_voxels"] = clipped
    if "mse" in metrics:
        metrics["mse_of"] = "probability"
    finish_metrics(metrics, geometry, str(scan_path))
    metrics["seconds"] = round(time.perf_counter() - t0, 3)
    metrics["ctpore_version"] = __version__
    return metrics


class _RawCopy:
    """A scan copied to a nameless temporary float32 file (z-major), read back window by window."""

    def __init__(self, scan: Scan, folder: Path, progress: ProgressFn):
        self.shape = tuple(int(s) for s in scan.shape)
        nz, ny, nx = self.shape
        fd, name = tempfile.mkstemp(prefix=".ctpore-scan-", suffix=".f32", dir=folder)
        os.unlink(name)
        self._fd = fd
        step = max(1, (64 << 20) // (4 * ny * nx))
        for z0 in range(0, nz, step):
            block = np.ascontiguousarray(scan.read_slices(z0, min(nz, z0 + step)), np.float32)
            os.pwrite(fd, block.tobytes(), z0 * ny * nx * 4)
            if progress is not None:
                progress(min(nz, z0 + step), nz, "decompressing the scan")

    def read_window(self, z0: int, z1: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        _nz, ny, nx = self.shape
        out = np.empty((z1 - z0, y1 - y0, x1 - x0), np.float32)
        for i, z in enumerate(range(z0, z1)):
            raw = os.pread(self._fd, (y1 - y0) * nx * 4, (z * ny + y0) * nx * 4)
            out[i] = np.frombuffer(raw, np.float32).reshape(y1 - y0, nx)[:, x0:x1]
        return out

    def __getitem__(self, key: slice) -> np.ndarray:
        z0, z1, _ = key.indices(self.shape[0])
        return self.read_window(z0, z1, 0, self.shape[1], 0, self.shape[2])

    def close(self) -> None:
        os.close(self._fd)


@contextmanager
def _windowed(scan: Scan, folder: Path, shape, tile: int, halo: int, progress: ProgressFn) -> Iterator:
    """``scan``, or, when it is compressed and the plane takes several tiles, a temporary
    uncompressed copy beside the outputs (nameless, so nothing is left behind): each tile streams
    through every slice, and reading a window of an uncompressed copy costs only that window (a
    ``.nii.gz`` would be decompressed again for every tile)."""
    from ctpore.pipelines.stream import plan_tiles

    compressed = scan.path.name.lower().endswith(".gz")
    if not compressed or len(plan_tiles(shape[1], shape[2], tile, halo)) == 1:
        yield scan
        return
    copy = _RawCopy(scan, folder, progress)
    try:
        yield copy
    finally:
        copy.close()
