"""The attention engine, PoreFormer, baselines and weights I/O."""

from __future__ import annotations

__all__ = ["PoreFormer", "PoreFormerConfig", "MultiHeadAttention"]


def __getattr__(name: str):
    if name in ("PoreFormer", "PoreFormerConfig"):
        from ctpore.models import poreformer

        return getattr(poreformer, name)
    if name == "MultiHeadAttention":
        from ctpore.models.attention import MultiHeadAttention

        return MultiHeadAttention
    raise AttributeError(f"module 'ctpore.models' has no attribute {name!r}")
