"""The networks and everything about them: the attention engine, PoreFormer, baselines, losses, weights.

Rooms
-----
``attention``           one multi-head attention module, its backend (flash, sdpa, math) chosen once.
``attention_dispatch``  which kernel computes each attention call, and the kernels (math, sdpa, flash).
``backends``            which attention backends can run here; ``auto`` resolved once.
``window_kernel``       ctpore's C kernel for windowed causal attention on CPU (loaded with ctypes).
``kv_cache``            keys and values of earlier slices, kept between streamed chunks.
``poreformer_config``   PoreFormer's hyper-parameters (saved inside every weights file).
``poreformer``          PoreFormer itself: its layers, what it tells about itself, its memory estimate.
``poreformer_forward``  PoreFormer's forward pass: the per-slice U-Net, then the full-resolution bands.
``blocks``              PoreFormer's building blocks: the attention block, conv helpers, z features.
``numerics``            PoreFormer's precision and band size: the band per device, fp32 parts, folded head.
``unet``, ``classical``   the baselines: MONAI U-Nets; global Otsu and the Fiji pipeline.
``losses``              BCE + soft Dice + soft clDice + skeleton recall.
``weights``             all weights in and out (safetensors only), with their post-processing.
``weights_checks``      what a weights file must be first: safetensors (pickles refused), tensors that fit.
"""

from __future__ import annotations

__all__ = ["PoreFormer", "PoreFormerConfig", "MultiHeadAttention"]


def __getattr__(name: str):
    if name == "PoreFormer":
        from ctpore.models.poreformer import PoreFormer

        return PoreFormer
    if name == "PoreFormerConfig":
        from ctpore.models.poreformer_config import PoreFormerConfig

        return PoreFormerConfig
    if name == "MultiHeadAttention":
        from ctpore.models.attention import MultiHeadAttention

        return MultiHeadAttention
    raise AttributeError(f"module 'ctpore.models' has no attribute {name!r}")
