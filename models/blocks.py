"""Building blocks of PoreFormer: the z-position features, the in-plane convolution helpers and
the pre-norm inter-slice attention block.

Kept apart from :mod:`ctpore.models.poreformer` (the architecture) and
:mod:`ctpore.models.poreformer_forward` (its forward pass), which both use them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ctpore.models.attention import MultiHeadAttention, check_finite
from ctpore.models.kv_cache import KVCache
from ctpore.models.poreformer_config import PoreFormerConfig

__all__ = ["Block", "channels_last", "conv3x3", "gelu_", "up2", "z_features"]


def z_features(
    z0: int,
    n: int,
    n_features: int,
    max_period: float,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Sinusoidal features of the absolute slice indices ``z0 ... z0+n-1``.

    Computed in float64 so that large ``z`` (thousands of slices) keep their phase, then cast.

    Parameters
    ----------
    z0 : int
        Absolute index of the first slice.
    n : int
        Number of slices.
    n_features : int
        Even number of features: ``n_features/2`` frequencies from 1 to ``1/max_period``
        radians per slice, geometrically spaced; sin then cos.
    max_period : float
    device, dtype
        Of the result.

    Returns
    -------
    torch.Tensor
        ``(n, n_features)``.
    """
    half = n_features // 2
    freqs = max_period ** (-torch.arange(half, dtype=torch.float64, device=device) / half)
    z = torch.arange(z0, z0 + n, dtype=torch.float64, device=device)
    ang = z[:, None] * freqs[None, :]  # (n, half)
    return torch.cat([torch.sin(ang), torch.cos(ang)], dim=-1).to(dtype)  # (n, n_features)


def gelu_(h: torch.Tensor) -> torch.Tensor:
    """GELU, in place when no gradient is recorded (saves a large allocation in inference)."""
    return F.gelu(h) if torch.is_grad_enabled() else torch.ops.aten.gelu_(h)


def conv3x3(c_in: int, c_out: int, stride: int = 1, dilation: int = 1) -> nn.Conv2d:
    """3x3 conv that pads by replicating the edge (a border is not a structure)."""
    return nn.Conv2d(c_in, c_out, 3, stride=stride, padding=dilation, dilation=dilation,
                     padding_mode="replicate")


def channels_last(h: torch.Tensor) -> torch.Tensor:
    return h.contiguous(memory_format=torch.channels_last)


def up2(h: torch.Tensor, rows: tuple[int, int], cols: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """Rows ``rows`` and columns ``cols`` of the bilinear x2 upsampling of ``h`` to ``size``.

    Equal to ``interpolate(h, size=size, mode="bilinear")[..., r0:r1, c0:c1]`` (half-pixel
    centres, edges clamped) but upsamples only the part of ``h`` those pixels read.
    """
    (r0, r1), (c0, c1) = rows, cols
    hy, hx = h.shape[-2:]
    a0, a1 = max(0, r0 // 2 - 1), min(hy, (r1 - 1) // 2 + 2)
    b0, b1 = max(0, c0 // 2 - 1), min(hx, (c1 - 1) // 2 + 2)
    part = h[:, :, a0:a1, b0:b1]
    # The part's own edges are clamped; crop by one coarse pixel where it is not the real edge.
    out = F.interpolate(part, scale_factor=2, mode="bilinear", align_corners=False)
    out = out[:, :, : min(2 * a1, size[0]) - 2 * a0, : min(2 * b1, size[1]) - 2 * b0]
    return out[:, :, r0 - 2 * a0 : r1 - 2 * a0, c0 - 2 * b0 : c1 - 2 * b0]


class Block(nn.Module):
    """Pre-norm inter-slice block on column-major tokens ``(N, Z, C)``: attention (z encoding
    in V), then, where ``mlp_hidden`` > 0, a per-token MLP."""

    def __init__(self, d: int, cfg: PoreFormerConfig, n_kv_heads: int | None, window: int | None,
                 mlp_hidden: int, name: str):
        super().__init__()
        self.name = name
        self.ln1 = nn.LayerNorm(d)
        self.attn = MultiHeadAttention(
            d, cfg.n_heads, n_kv_heads, causal=cfg.causal, window=window,
            dropout=cfg.dropout, backend=cfg.attention_backend, name=f"{name}.attn",
        )
        # V = W_v x + pos_enc(z), pos_enc(z) = W_pos sinusoidal(z): one vector per kv head.
        self.pos = nn.Linear(cfg.pos_features, self.attn.kv_dim, bias=False) if cfg.pos_in_v else None
        self.mlp = None
        if mlp_hidden:
            self.mlp = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, mlp_hidden), nn.GELU(),
                                     nn.Linear(mlp_hidden, d), nn.Dropout(cfg.dropout))

    def pos_term(self, zfeat: torch.Tensor) -> torch.Tensor | None:
        """The z-position term added into V, ``(Zq, Hkv*D)`` (None without ``pos_in_v``).

        In the weights' precision (fp32) under autocast too: it is rounded once, where it is added
        into V.
        """
        if self.pos is None:
            return None
        with torch.autocast(zfeat.device.type, enabled=False):
            return self.pos(zfeat.to(self.pos.weight.dtype))

    def forward(self, t: torch.Tensor, zfeat: torch.Tensor, cache: KVCache | None = None,
                need_weights: bool = False, check: bool = False, rows: slice | None = None,
                n_rows: int | None = None):
        """Tokens ``(N, Zq, C)`` -> same shape, and the attention weights ``(N, H, Zq, Zk)`` if asked.

        ``rows``/``n_rows``: ``t`` is that band of the tile's columns (see :meth:`KVCache.extend`).
        """
        pos_v = self.pos_term(zfeat)
        a = self.attn(self.ln1(t), pos_v=pos_v, cache=cache, need_weights=need_weights, check=check,
                      cache_rows=rows, n_rows=n_rows)
        w = None
        if need_weights:
            a, w = a
        t = t + a if torch.is_grad_enabled() else t.add_(a)
        if self.mlp is not None:
            m = self.mlp(t)
            t = t + m if torch.is_grad_enabled() else t.add_(m)
        if check:
            check_finite(t, self.name, "output")
        return t, w
