"""PoreFormer: a per-slice 2D U-Net with causal attention across slices at every scale.

Every pixel column ``(y, x)`` of a CT stack is a sequence of tokens, one per slice ``z``; a
causal inter-slice multi-head attention (d_model 64, 4 heads, a z-position encoding added into
V) runs on the full-resolution tokens and learns how pore channels run from slice to slice. The
in-plane work around it is a small 2D U-Net applied to each slice on its own, with an
inter-slice attention block at its coarse levels too (as video U-Nets put temporal attention at
every level), so most of the compute and the long in-plane and slice-to-slice reach sit at
1/4 and 1/8 of the resolution::

    x (B, Z, Y, X)  -> slices as a batch (Z*B, 1, Y, X)
      stem   3x3 conv (full resolution, stem_channels)
      down   per level l = 1..L: stride-2 3x3 conv, 3x3 conv   (1/2, 1/4, 1/8, ...)
             + level_attention[l] blocks across slices on the level's pixel columns
      up     bilinear x2 and a 1x1 conv fusing the skip, back to 1/2
      tokens d_model = 1x1(up(1/2 features)) + 1x1(stem features)   (full resolution)
      n_layers x  t = t + Attn(LN(t)),  V = W_v LN(t) + pos_enc(z)   (causal, window W)
      head   LN, linear -> (B, Z, Y, X) logits

Nothing but the attention looks across slices, and the attention only looks back, so the
output at slice ``z`` depends on slices ``<= z`` only. Tokens are kept column-major,
``(B*Y*X, Z, C)``: the layout attention kernels read and write without copies.

All convolutions pad by replicating the edge, so the plane's border creates no structure; a
plane whose size is not a multiple of :attr:`PoreFormerConfig.align` is padded the same way at
its bottom and right. In the plane every output pixel sees a square of radius
:attr:`PoreFormerConfig.halo`, so tiles read with that halo (starting on multiples of
:attr:`PoreFormerConfig.align`) stitch exactly; only the tile's core becomes full-resolution
tokens (:attr:`PoreFormerConfig.token_halo` is 0).

There is no BatchNorm or GroupNorm: statistics mixed over slices or over the tile would break
causality and make a tiled, streamed prediction differ from the full pass. The only norm is a
per-token LayerNorm over channels.

The z-position encoding is added into V (not into the tokens): a learned linear map of
sinusoidal features of the ABSOLUTE slice index ``z``, so it is defined for any number of slices.
Streaming passes the chunk offset ``z0`` so a chunk sees the same encoding as the full pass.

This module holds the model: its layers, what it tells about itself and its memory estimate. The
forward pass that runs them is :mod:`ctpore.models.poreformer_forward`; the blocks it is built
from (the attention block, the convolution helpers, the z features) are :mod:`ctpore.models.blocks`.
"""

from __future__ import annotations

import copy
from collections import Counter

import torch
from torch import nn

from ctpore.models.backends import resolve_backend
from ctpore.models.blocks import Block, conv3x3
from ctpore.models.kv_cache import KVCache
from ctpore.models.numerics import band_tokens
from ctpore.models.poreformer_config import PoreFormerConfig
from ctpore.models.poreformer_forward import forward_pass

__all__ = ["PoreFormer", "PoreFormerConfig"]

class PoreFormer(nn.Module):
    """Causal inter-slice transformer on a per-slice 2D U-Net, giving a pore logit per voxel.

    Parameters
    ----------
    config : PoreFormerConfig, optional
        Default: ``PoreFormerConfig()``, the shipped architecture.

    Examples
    --------
    >>> model = PoreFormer(PoreFormerConfig(level_channels=(8, 8), level_attention=(0, 1))).eval()
    >>> x = torch.randn(1, 6, 10, 12)  # (B, Z, Y, X), already normalized
    >>> model(x).shape
    torch.Size([1, 6, 10, 12])
    """

    def __init__(self, config: PoreFormerConfig | None = None):
        super().__init__()
        self.config = cfg = config if config is not None else PoreFormerConfig()
        chans = (cfg.stem_channels, *cfg.level_channels)
        self.stem = conv3x3(1, cfg.stem_channels)
        self.down = nn.ModuleList(conv3x3(chans[lv - 1], chans[lv], stride=2) for lv in range(1, len(chans)))
        self.conv = nn.ModuleList(
            conv3x3(chans[lv], chans[lv], dilation=cfg.level_dilation if lv == cfg.n_levels else 1)
            for lv in range(1, len(chans))
        )
        self.level_blocks = nn.ModuleList(
            nn.ModuleList(
                Block(c, cfg, None, cfg.level_window, int(round(c * cfg.mlp_ratio)), f"level{lv}.{i}")
                for i in range(n)
            )
            for lv, (c, n) in enumerate(zip(cfg.level_channels, cfg.level_attention), start=1)
        )
        self.fuse = nn.ModuleList(nn.Conv2d(chans[lv + 1] + chans[lv], chans[lv], 1) for lv in range(1, cfg.n_levels))
        self.up_proj = nn.Conv2d(chans[1], cfg.d_model, 1)
        self.stem_proj = nn.Conv2d(cfg.stem_channels, cfg.d_model, 1)
        self.blocks = nn.ModuleList(
            Block(cfg.d_model, cfg, cfg.n_kv_heads, cfg.window, 0, f"blocks.{i}") for i in range(cfg.n_layers)
        )
        # The head reads the residual stream directly (no norm in between), so in inference the
        # last block's output projection folds into it (see poreformer_forward.fold_last_block).
        self.head = nn.Linear(cfg.d_model, 1)

    # ---------------------------------------------------------------------------------------
    @property
    def halo(self) -> int:
        """In-plane receptive-field radius in pixels (see :attr:`PoreFormerConfig.halo`)."""
        return self.config.halo

    @property
    def token_halo(self) -> int:
        """Token margin a tile needs around its core (see :attr:`PoreFormerConfig.token_halo`)."""
        return self.config.token_halo

    @property
    def z_reach(self) -> int | None:
        """Earlier slices one slice's output depends on (see :attr:`PoreFormerConfig.z_reach`)."""
        return self.config.z_reach

    @property
    def align(self) -> int:
        """Tile windows must start on multiples of this (see :attr:`PoreFormerConfig.align`)."""
        return self.config.align

    def _attention_blocks(self) -> list[Block]:
        return [b for level in self.level_blocks for b in level] + list(self.blocks)

    @property
    def attention_block_names(self) -> list[str]:
        """Names of the attention blocks, in the order of :meth:`new_cache` and :meth:`attention_maps`."""
        return [b.name for b in self._attention_blocks()]

    def attention_layout(self) -> list[dict]:
        """What each attention block sees, in the order of :attr:`attention_block_names`.

        Returns
        -------
        list of dict
            ``name`` (the module path), ``scale`` (in-plane downsampling of the block's pixel
            columns: 1 at full resolution, 8 at 1/8), ``window`` (look-back in slices: slice
            ``z`` attends to ``z-window+1 .. z``; None = every earlier slice), ``n_heads``,
            ``head_dim``.

        Examples
        --------
        >>> m = PoreFormer(PoreFormerConfig(level_channels=(8, 8), level_attention=(0, 1), level_window=6, window=4))
        >>> [(d["name"], d["scale"], d["window"]) for d in m.attention_layout()]
        [('level2.0', 4, 6), ('blocks.0', 1, 4)]
        """
        out = []
        for lv, level in enumerate(self.level_blocks, start=1):
            out += [{"name": b.name, "scale": 2**lv, "window": b.attn.window, "n_heads": b.attn.n_heads,
                     "head_dim": b.attn.head_dim} for b in level]
        out += [{"name": b.name, "scale": 1, "window": b.attn.window, "n_heads": b.attn.n_heads,
                 "head_dim": b.attn.head_dim} for b in self.blocks]
        return out

    @property
    def attention_backend(self) -> str:
        """The backend the full-resolution attention runs (resolved, never ``auto``)."""
        blocks = self._attention_blocks()
        return self.blocks[0].attn.backend if len(self.blocks) else (blocks[0].attn.backend if blocks else "none")

    def backends_ran(self) -> str:
        """The attention kernels that really ran since the model was built (or :meth:`reset_backends_ran`).

        ``"flash"``, ``"sdpa"``, ``"window"`` (ctpore's C kernel on CPU) or ``"math"``; where
        several ran (say flash at full resolution and sdpa for a shape flash refuses), joined by
        ``+``, the most used first; ``"none"`` before any call.
        """
        return "+".join(k for k, _ in Counter(self.backend_calls()).most_common()) or "none"

    def backend_calls(self) -> dict:
        """How many times each attention kernel ran since the model was built (or
        :meth:`reset_backends_ran`): what :meth:`backends_ran` orders (runs of parts of a scan add up)."""
        total: Counter = Counter()
        for blk in self._attention_blocks():
            total.update(blk.attn.ran)
        return dict(total)

    def reset_backends_ran(self) -> None:
        """Forget which kernels ran (see :meth:`backends_ran`)."""
        for blk in self._attention_blocks():
            blk.attn.ran.clear()

    def n_params(self) -> int:
        """Number of trainable parameters."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def with_weights_in(self, dtype: torch.dtype) -> "PoreFormer":
        """An inference copy whose convolutions, norms and attention blocks hold ``dtype`` weights.

        Used for bf16 on a CPU that multiplies bf16 in hardware: the activations stay in ``dtype``
        from layer to layer (autocast would cast around every product). What stays in the
        original precision (fp32): the stem, which reads the fp32 scan; the z-position maps,
        whose term is rounded once where it is added into V; the head and the last block's output
        projection, which fold into it (:func:`~ctpore.models.numerics.folded_head` runs their product in bf16 on CPU).
        The copy shares :meth:`backends_ran`'s counters with this model. This model is unchanged.

        Examples
        --------
        >>> m = PoreFormer(PoreFormerConfig(level_channels=(8, 8), level_attention=(0, 1))).eval()
        >>> half = m.with_weights_in(torch.bfloat16)
        >>> half.down[0].weight.dtype, half.head.weight.dtype, m.down[0].weight.dtype
        (torch.bfloat16, torch.float32, torch.float32)
        """
        twin = copy.deepcopy(self)
        kept = [twin.stem, twin.head] + [b.pos for b in twin._attention_blocks() if b.pos is not None]
        if len(twin.blocks):
            kept.append(twin.blocks[-1].attn.proj)
        keep = {id(p) for m in kept for p in m.parameters()}
        with torch.no_grad():
            for p in twin.parameters():
                if id(p) not in keep:
                    p.data = p.data.to(dtype)
        for mine, theirs in zip(self._attention_blocks(), twin._attention_blocks()):
            theirs.attn.ran = mine.attn.ran
        return twin.eval()

    def set_attention_backend(self, name: str) -> None:
        """Switch every attention layer to backend ``name`` (weights unchanged)."""
        for blk in self._attention_blocks():
            blk.attn.backend = resolve_backend(name, blk.attn.head_dim)
            blk.attn.requested_backend = name
        self.config.attention_backend = name

    def inference_bytes(self, window: tuple[int, int], core: tuple[int, int], chunk: int,
                        dtype_bytes: int = 4, device: torch.device | str | None = None) -> int:
        """Working memory (bytes) of streaming one tile: a ``window`` read for a ``core``, ``chunk``
        slices at a time, caches included (an estimate from the activations' sizes; the
        allocator's slack is left to the caller's margin).

        Parameters
        ----------
        window, core : (int, int)
            ``(rows, columns)`` of the tile's window (core plus halo) and of its core.
        chunk : int
            Slices per forward call.
        dtype_bytes : int
            Bytes per activation (4: fp32; under bf16 autocast most are 2, so 4 is an upper bound).
            With 2 (the bf16 copy, :meth:`with_weights_in`) the input, its padding and the fp32 stem
            output before its cast are still counted at 4 bytes.
        device : torch.device or str, optional
            Where the model runs: the full-resolution band is :func:`band_tokens` of it (larger
            on CUDA). Default: CPU.
        """
        cfg = self.config
        wpx, cpx = window[0] * window[1], core[0] * core[1]
        # Floats per window pixel and slice alive at the peak of the per-slice 2D part: the
        # input and its padding, the stem features (kept to the end) with a padded copy and
        # the conv output, each level's maps (three at a time), the projected 1/2 features.
        per_px = 2 + 3 * cfg.stem_channels + 2 * cfg.d_model / 4
        per_px += sum(3 * c / 4**lv for lv, c in enumerate(cfg.level_channels, start=1))
        per_px += sum(n * (6 * c + 2 * c * cfg.mlp_ratio) / 4**lv
                      for lv, (c, n) in enumerate(zip(cfg.level_channels, cfg.level_attention), start=1))
        act = chunk * wpx * per_px
        # One band of full-resolution tokens: up + stem projections, tokens, norm, q, k/v with
        # the cached ones, the attention output and the head.
        kv = (cfg.n_kv_heads or cfg.n_heads) * (cfg.d_model // cfg.n_heads)
        n_band = min(band_tokens(device), chunk * cpx)
        w = cfg.window or 64
        band = n_band * (5 * cfg.d_model + 2 * kv * (1 + (w - 1) / max(chunk, 1)) + 8)
        # KV caches: W - 1 slices of keys and values per attention block.
        caches = cfg.n_layers * (w - 1) * cpx * 2 * kv
        lw = cfg.level_window or 64
        caches += sum(n * (lw - 1) * (wpx / 4**lv) * 2 * c
                      for lv, (c, n) in enumerate(zip(cfg.level_channels, cfg.level_attention), start=1))
        fp32_parts = 0 if dtype_bytes >= 4 else (4 - dtype_bytes) * chunk * wpx * (2 + cfg.stem_channels)
        return int(dtype_bytes * (act + band + caches) + fp32_parts)

    def new_cache(self, capacity: int | None = None) -> list[KVCache]:
        """Fresh KV caches (one per attention block) for streaming one tile through the slices.

        Parameters
        ----------
        capacity : int, optional
            Number of slices that will be streamed; lets a full cache (window None) allocate
            once instead of growing.
        """
        return [KVCache(b.attn.window, capacity) for b in self._attention_blocks()]

    # ---------------------------------------------------------------------------------------
    def forward(
        self,
        x: torch.Tensor,
        z0: int = 0,
        cache: list[KVCache] | None = None,
        margins: tuple[int, int, int, int] | None = None,
    ) -> torch.Tensor:
        """Pore logits.

        Parameters
        ----------
        x : torch.Tensor
            ``(B, Z, Y, X)`` float, already normalized.
        z0 : int
            Absolute index of ``x``'s first slice (for the z encoding); streaming passes the
            chunk offset.
        cache : list of KVCache, optional
            From :meth:`new_cache`; when given, ``x`` continues the slices already seen
            (``z0`` must be where the previous chunk ended) and the caches are updated.
        margins : (top, bottom, left, right), optional
            Pixels at the edges of ``x`` that are read only as in-plane context (the tile halo):
            the logits cover ``x`` without them, and only that region becomes full-resolution
            tokens. Default: none.

        Returns
        -------
        torch.Tensor
            ``(B, Z, Y - top - bottom, X - left - right)`` logits (sigmoid gives the pore
            probability).
        """
        return forward_pass(self, x, z0, cache, need_weights=False, margins=margins)[0]

    @torch.no_grad()
    def attention_maps(
        self,
        x: torch.Tensor,
        z0: int = 0,
        region: tuple[int | slice, int | slice] | None = None,
        cache: list[KVCache] | None = None,
        margins: tuple[int, int, int, int] | None = None,
        with_logits: bool = False,
    ) -> list[torch.Tensor] | tuple[list[torch.Tensor], torch.Tensor]:
        """Per-block, per-head attention weights, computed with the explicit (math) path.

        Parameters
        ----------
        x : torch.Tensor
            ``(B, Z, Y, X)``.
        z0 : int
            Absolute index of the first slice.
        region : (ys, xs), optional
            Pixels to keep, ints or slices over Y and X of ``x`` (an int keeps a length-1
            axis). Default: every pixel (with ``margins``: every pixel of the token region).
        cache, margins
            As for :meth:`forward`: stream a tile through the slices in chunks (the weights then
            cover the cached slices too) and keep only ``x`` without the margins as tokens;
            ``region`` must then lie inside that token region.
        with_logits : bool
            Also return the logits of the token region, ``(B, Z, Y', X')`` (as :meth:`forward`).

        Returns
        -------
        list of torch.Tensor
            One per attention block, in the order of :attr:`attention_block_names` (coarse
            levels first, then the full-resolution blocks), ``(B, Ry, Rx, H, Zq, Zk)``:
            ``[..., h, i, j]`` is how much query slice ``z0 + i`` of that pixel column attends
            to key slice ``z0 + Zq - Zk + j`` in head ``h`` (``Zk = Zq`` without a cache; with
            one, the keys start with the cached slices). A coarse level's block attends over
            its own pixel columns; each pixel gets the column that contains it.
        """
        logits, maps = forward_pass(self, x, z0, cache, need_weights=True, margins=margins)
        b, _z, y, xx = x.shape
        mt, mb, ml, mr = (0, 0, 0, 0) if margins is None else (int(m) for m in margins)
        ys, xs = (slice(mt, y - mb), slice(ml, xx - mr)) if region is None else region
        ys = torch.arange(y)[slice(ys, ys + 1) if isinstance(ys, int) else ys]
        xs = torch.arange(xx)[slice(xs, xs + 1) if isinstance(xs, int) else xs]
        out = []
        for scale, (hy, hx), w in maps:  # w: (B*hy*hx, H, Zq, Zk)
            w = w.view(b, hy, hx, *w.shape[1:])
            # full-resolution tokens cover the region without the margins; coarse maps the padded plane
            ry, rx = (ys - mt, xs - ml) if scale == 1 else (ys // scale, xs // scale)
            outside = ry.numel() and rx.numel() and (min(ry.min(), rx.min()) < 0 or ry.max() >= hy or rx.max() >= hx)
            if scale == 1 and outside:
                raise ValueError(f"region {region} is not inside the token region of margins {margins}")
            out.append(w[:, ry][:, :, rx].clone())
        return (out, logits) if with_logits else out
