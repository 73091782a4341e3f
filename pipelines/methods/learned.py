"""The learned methods as predictors: PoreFormer (streamed) and the U-Net baselines (in memory)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from ctpore.errors import InputError
from ctpore.pipelines.methods import Untiled
from ctpore.progress import ProgressFn

__all__ = ["PoreFormerPredictor", "UNetPredictor", "poreformer", "unet", "poreformer_network", "unet_network"]

PathLike = Union[str, os.PathLike]


class PoreFormerPredictor:
    """PoreFormer streamed through the scan: in-plane tiles (with a halo) and chunks of slices (with
    KV caches), so its memory follows ``budget_bytes``, not the scan (:mod:`ctpore.pipelines.stream`)."""

    name = "poreformer"

    def __init__(self, weights: Optional[PathLike] = None, device: str = "cpu",
                 attention_backend: Optional[str] = None):
        from ctpore.models.weights import load_for_inference, sha256_file
        from ctpore.pipelines.precision import resolve_device

        self.device = resolve_device(device)  # a usage error before any weights are read
        self.model, meta, self.post, path = load_for_inference(weights, self.device, attention_backend)
        self.info = {"model": {"name": meta.get("name", path.stem), "sha256": sha256_file(path)},
                     "device": str(self.device), "attention_backend": None}
        self.halo = int(self.model.halo)

    def plan(self, shape, budget_bytes: float, gpu_memory_gb: Optional[float] = None,
             precision: str = "auto") -> tuple[int, int]:
        """The fastest ``(tile, chunk_slices)`` whose working memory fits ``budget_bytes`` of host
        memory (on CUDA: the GPU's free memory, at most ``gpu_memory_gb``, while the host's staging
        buffers fit ``budget_bytes``; :func:`~ctpore.pipelines.stream_plan.plan_for_device`)."""
        from ctpore.pipelines.stream_plan import plan_for_device

        return plan_for_device(self.model, shape, budget_bytes, self.device, gpu_memory_gb, precision)

    def predict(self, volume: Any, out: Any, *, budget_bytes: float, progress: ProgressFn = None,
                chunk_slices: Optional[int] = None, tile: Optional[int] = None, precision: str = "auto") -> dict:
        from ctpore.pipelines.precision import precision_name
        from ctpore.pipelines.stream import predict

        if tile is None or chunk_slices is None:
            plan_tile, plan_chunk = self.plan(tuple(volume.shape), budget_bytes, precision=precision)
            tile = plan_tile if tile is None else tile
            chunk_slices = plan_chunk if chunk_slices is None else chunk_slices
        self.model.reset_backends_ran()
        predict(self.model, volume, chunk_slices=chunk_slices, tile=tile, device=self.device, progress=progress,
                out=out, precision=precision)
        return {"attention_backend": self.model.backends_ran(), "tile": int(tile), "chunk_slices": int(chunk_slices),
                "precision": precision_name(precision, self.device)}


class UNetPredictor(Untiled):
    """A U-Net baseline (:mod:`ctpore.models.unet`) on the whole normalized scan, tiled by MONAI's
    sliding window: it holds the scan in memory, as users run it."""

    # MONAI's sliding window tiles inside the scan held in memory: no halo or plan of its own

    def __init__(self, kind: str, weights: Optional[PathLike] = None, device: str = "cpu",
                 attention_backend: Optional[str] = None):
        from ctpore.models.weights import load_unet, read_postprocessing, sha256_file, weights_dir
        from ctpore.pipelines.precision import resolve_device

        self.name = kind
        self.device = resolve_device(device)
        path = Path(weights) if weights is not None else weights_dir() / f"{kind}.safetensors"
        if not path.is_file():
            raise InputError(f"no {kind} weights here; train them with configs/train_{kind}.yaml or give "
                             "--weights", path=path)
        self.model = load_unet(path)
        if getattr(self.model, "kind", kind) != kind:
            raise InputError(f"holds {self.model.kind} weights, not {kind}", path=path)
        self.post = read_postprocessing(path)  # chosen on validation scans at export
        self.info = {"model": {"name": kind, "sha256": sha256_file(path)}, "device": str(self.device),
                     "attention_backend": None}

    def predict(self, volume: Any, out: Any, *, budget_bytes: float, progress: ProgressFn = None,
                chunk_slices: Optional[int] = None, tile: Optional[int] = None, precision: str = "auto") -> dict:
        from ctpore.models.unet import predict_unet

        nz, ny, nx = (int(s) for s in volume.shape)
        vol = np.asarray(volume[0:nz], np.float32)
        if progress is not None:
            progress(0, 1, "predict")
        out[0:nz, 0:ny, 0:nx] = predict_unet(self.model, vol, device=str(self.device))
        if progress is not None:
            progress(1, 1, "predict")
        return {}


def poreformer(weights: Optional[PathLike] = None, device: str = "cpu",
               attention_backend: Optional[str] = None) -> PoreFormerPredictor:
    """The ``poreformer`` method's factory."""
    return PoreFormerPredictor(weights, device, attention_backend)


def unet(kind: str, weights: Optional[PathLike] = None, device: str = "cpu",
         attention_backend: Optional[str] = None) -> UNetPredictor:
    """The ``unet2d`` / ``unet3d`` methods' factory."""
    return UNetPredictor(kind, weights, device, attention_backend)


def poreformer_network(model_config: dict):
    """A freshly initialised PoreFormer of ``model_config`` (:class:`PoreFormerConfig` fields)."""
    from ctpore.models.poreformer import PoreFormer
    from ctpore.models.poreformer_config import PoreFormerConfig

    return PoreFormer(PoreFormerConfig(**model_config))


def unet_network(kind: str, model_config: dict):
    """A freshly initialised U-Net baseline of ``kind`` (``unet2d``/``unet3d``)."""
    from ctpore.models.unet import build_unet

    return build_unet({"kind": kind, **model_config})
