"""The networks and everything about them: the attention engine, PoreFormer, baselines, losses, weights.

Rooms
-----
``attention``          one multi-head attention module, its backend (flash, sdpa, math) chosen once.
``kv_cache``           keys and values of earlier slices, kept between streamed chunks.
``poreformer_config``  PoreFormer's hyper-parameters (saved inside every weights file).
``poreformer``         PoreFormer itself.
``unet``, ``classical``  the baselines: MONAI U-Nets; global Otsu and the Fiji pipeline.
``losses``             BCE + soft Dice + soft clDice.
``weights``            all weights in and out (safetensors only), with their post-processing.
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
