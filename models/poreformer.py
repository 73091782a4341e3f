"""PoreFormer: per-slice 2D encoder, causal attention across slices, a pore logit per voxel.

The model treats each pixel column ``(y, x)`` of a CT stack as a sequence of tokens over the
slices ``z`` (one token of ``d_model`` = 64 features per voxel)::

    x (B, Z, Y, X)
      -> encoder: 2D convs on each slice alone           (B*Z, C, Y, X)   in-plane context only
         + context branch (optional): each slice average-pooled by ``context_scale``, dilated
           3x3 convs on the pooled grid, bilinear upsampling, added to the tokens (far reach)
      -> tokens across slices: sequences (B*Y*X, Z, C), stored slice-major (Z, B*Y*X, C)
      -> n_layers x block:
             t = t + Attn(LN(t)),  V = W_v LN(t) + pos_enc(z)   (causal, optional window W)
             t = t + FC2(GELU(DWConv3x3_inplane(FC1(LN(t)))))   (nothing crosses slices)
      -> LN, linear                                      (B, Z, Y, X) logits

Nothing but the attention looks across slices, and the attention only looks back, so the
output at slice ``z`` depends on slices ``<= z`` only (and, with a window ``W``, on slices
``z-W+1 ... z`` of the attention input; stacked layers reach ``n_layers * (W-1)`` slices back).
In the plane every pixel sees a square of radius :attr:`PoreFormerConfig.halo`; only the
blocks' share of it (:attr:`PoreFormerConfig.block_reach`) needs tokens, the rest is read by
the per-slice convs, so a streamed tile makes tokens for its core plus a few pixels only.

There is no BatchNorm or GroupNorm: statistics mixed over slices or over the tile would break
causality and make a tiled, streamed prediction differ from the full pass. The only norm is a
per-token LayerNorm over channels.

The z-position encoding is added into V (not into the tokens): a learned linear map of
sinusoidal features of the ABSOLUTE slice index ``z``, so it is defined for any number of slices.
Streaming passes the chunk offset ``z0`` so a chunk sees the same encoding as the full pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ctpore.errors import InputError
from ctpore.models.attention import MultiHeadAttention, check_finite, resolve_backend
from ctpore.models.kv_cache import KVCache
from ctpore.models.poreformer_config import PoreFormerConfig

__all__ = ["PoreFormer", "PoreFormerConfig", "z_features"]


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


def _plane_conv(h: torch.Tensor, conv: nn.Conv2d, plane: tuple[int, int, int]) -> torch.Tensor:
    """Apply a 2D conv in the plane of each slice to slice-major tokens ``(Z, B*Y*X, C)``.

    The tokens' memory is ``(Z, B, Y, X, C)``, i.e. a channels-last image batch, so this is a
    view, a conv and a view: no copies.
    """
    b, y, x = plane
    z, n, c = h.shape
    img = h.reshape(z * b, y, x, c).permute(0, 3, 1, 2)  # (Z*B, C, Y, X), channels-last
    out = conv(img)  # (Z*B, C', Y, X)
    return out.permute(0, 2, 3, 1).reshape(z, n, out.shape[1])  # (Z, B*Y*X, C')


def _gelu(h: torch.Tensor) -> torch.Tensor:
    """GELU, in place when no gradient is recorded (saves a large allocation in inference)."""
    return F.gelu(h) if torch.is_grad_enabled() else torch.ops.aten.gelu_(h)


def _add(t: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``t + u``, in place into ``t`` when no gradient is recorded."""
    return t + u if torch.is_grad_enabled() else t.add_(u)


class Block(nn.Module):
    """Pre-norm inter-slice block: attention (z encoding in V), then a per-slice MLP."""

    def __init__(self, cfg: PoreFormerConfig, name: str):
        super().__init__()
        self.name = name
        d = cfg.d_model
        self.ln1 = nn.LayerNorm(d)
        self.attn = MultiHeadAttention(
            d, cfg.n_heads, cfg.n_kv_heads, causal=cfg.causal, window=cfg.window,
            dropout=cfg.dropout, backend=cfg.attention_backend, name=f"{name}.attn",
        )
        # V = W_v x + pos_enc(z), pos_enc(z) = W_pos sinusoidal(z): one vector per kv head.
        self.pos = nn.Linear(cfg.pos_features, self.attn.kv_dim, bias=False) if cfg.pos_in_v \
            else None
        self.ln2 = nn.LayerNorm(d)
        hidden = cfg.mlp_hidden
        self.fc1 = nn.Linear(d, hidden)
        self.dw = (
            nn.Conv2d(hidden, hidden, cfg.dwconv_kernel, padding=cfg.dwconv_kernel // 2,
                      groups=hidden)
            if cfg.mlp_dwconv else None
        )
        self.fc2 = nn.Linear(hidden, d)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(
        self,
        t: torch.Tensor,
        plane: tuple[int, int, int],
        zfeat: torch.Tensor,
        cache: KVCache | None = None,
        need_weights: bool = False,
        check: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Slice-major tokens ``t`` (Zq, B*Y*X, C) -> same shape, and attention weights if asked.

        ``plane`` is ``(B, Y, X)``; ``zfeat`` the ``(Zq, pos_features)`` z features.
        """
        pos_v = self.pos(zfeat) if self.pos is not None else None  # (Zq, Hkv*D)
        # The attention sees sequences (N, Zq, C): a transposed view, no copy.
        a = self.attn(self.ln1(t).transpose(0, 1), pos_v=pos_v, cache=cache,
                      need_weights=need_weights, check=check)
        w = None
        if need_weights:
            a, w = a
        t = _add(t, a.transpose(0, 1))  # (Zq, N, C)
        h = self.fc1(self.ln2(t))  # (Zq, N, hidden)
        if self.dw is not None:
            h = _plane_conv(h, self.dw, plane)
        t = _add(t, self.drop(self.fc2(_gelu(h))))
        if check:
            check_finite(t, self.name, "output")
        return t, w


class PoreFormer(nn.Module):
    """Causal inter-slice transformer giving a pore logit per voxel.

    Parameters
    ----------
    config : PoreFormerConfig, optional
        Default: ``PoreFormerConfig()`` (60,865 parameters).

    Examples
    --------
    >>> model = PoreFormer(PoreFormerConfig(n_layers=1)).eval()
    >>> x = torch.randn(1, 6, 10, 12)  # (B, Z, Y, X), already normalized
    >>> model(x).shape
    torch.Size([1, 6, 10, 12])
    """

    def __init__(self, config: PoreFormerConfig | None = None):
        super().__init__()
        self.config = cfg = config if config is not None else PoreFormerConfig()
        layers: list[nn.Module] = []
        c_in = 1
        for c in cfg.encoder_channels:
            layers += [nn.Conv2d(c_in, c, cfg.encoder_kernel, padding=cfg.encoder_kernel // 2),
                       nn.GELU()]
            c_in = c
        layers.append(nn.Conv2d(c_in, cfg.d_model, 1))  # each pixel -> a d_model token
        self.encoder = nn.Sequential(*layers)
        # In-plane context: each slice average-pooled by context_scale (mean and local standard
        # deviation), dilated 3x3 convs on the pooled grid, projected to d_model and upsampled
        # bilinearly into the tokens. Cheap (1/scale^2 of the pixels) and it reaches far: the
        # background level under beam-hardening cupping, the pore-size scale, the noise level.
        self.context: nn.Sequential | None = None
        self.context_proj: nn.Conv2d | None = None
        if cfg.context_scale:
            ctx: list[nn.Module] = []
            c_in = 2
            for c, dil in zip(cfg.context_channels, cfg.context_dilations):
                ctx += [nn.Conv2d(c_in, c, 3, padding=dil, dilation=dil), nn.GELU()]
                c_in = c
            self.context = nn.Sequential(*ctx)
            self.context_proj = nn.Conv2d(c_in, cfg.d_model, 1)
        self.blocks = nn.ModuleList(Block(cfg, f"blocks.{i}") for i in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, 1)

    # ---------------------------------------------------------------------------------------
    @property
    def halo(self) -> int:
        """In-plane receptive-field radius in pixels (see :attr:`PoreFormerConfig.halo`)."""
        return self.config.halo

    @property
    def token_halo(self) -> int:
        """In-plane radius of the blocks alone: the token margin a tile needs around its core."""
        return self.config.block_reach

    @property
    def align(self) -> int:
        """Tile windows must start on multiples of this (see :attr:`PoreFormerConfig.align`)."""
        return self.config.align

    @property
    def attention_backend(self) -> str:
        """The backend the attention layers run (resolved, never ``auto``)."""
        return self.blocks[0].attn.backend if len(self.blocks) else "none"

    def n_params(self) -> int:
        """Number of trainable parameters."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def set_attention_backend(self, name: str) -> None:
        """Switch every attention layer to backend ``name`` (weights unchanged)."""
        resolved = resolve_backend(name, self.config.d_model // self.config.n_heads)
        for blk in self.blocks:
            blk.attn.backend = resolved
            blk.attn.requested_backend = name
        self.config.attention_backend = name

    def new_cache(self, capacity: int | None = None) -> list[KVCache]:
        """Fresh per-layer KV caches for streaming one tile through the slices.

        Parameters
        ----------
        capacity : int, optional
            Number of slices that will be streamed; lets a full cache (``window=None``)
            allocate once instead of growing.
        """
        return [KVCache(self.config.window, capacity) for _ in self.blocks]

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
            Pixels at the edges of ``x`` that are read only as in-plane context (the tile halo
            beyond :attr:`token_halo`): the logits cover ``x`` without them, and only that
            region becomes tokens. Default: none (logits for every pixel of ``x``).

        Returns
        -------
        torch.Tensor
            ``(B, Z, Y - top - bottom, X - left - right)`` logits (sigmoid gives the pore
            probability).
        """
        return self._run(x, z0, cache, need_weights=False, margins=margins)[0]

    @torch.no_grad()
    def attention_maps(
        self,
        x: torch.Tensor,
        z0: int = 0,
        region: tuple[int | slice, int | slice] | None = None,
    ) -> list[torch.Tensor]:
        """Per-layer, per-head attention weights, computed with the explicit (math) path.

        Parameters
        ----------
        x : torch.Tensor
            ``(B, Z, Y, X)``.
        z0 : int
            Absolute index of the first slice.
        region : (ys, xs), optional
            Pixels to keep, ints or slices over Y and X (an int keeps a length-1 axis).
            Default: every pixel (memory ``B*Y*X*H*Z*Z`` floats per layer).

        Returns
        -------
        list of torch.Tensor
            One per layer, ``(B, Ry, Rx, H, Z, Z)``: ``[..., h, zq, zk]`` is how much slice
            ``zq`` of that pixel column attends to slice ``zk`` in head ``h``.
        """
        _, maps = self._run(x, z0, None, need_weights=True)
        b, _z, y, xx = x.shape
        ys, xs = (slice(None), slice(None)) if region is None else region
        ys = slice(ys, ys + 1) if isinstance(ys, int) else ys
        xs = slice(xs, xs + 1) if isinstance(xs, int) else xs
        out = []
        for w in maps:  # (B*Y*X, H, Z, Z)
            out.append(w.view(b, y, xx, *w.shape[1:])[:, ys, xs].clone())
        return out

    def _context(self, img: torch.Tensor) -> torch.Tensor:
        """Context features ``(N, d_model, Y, X)`` of slices ``img`` ``(N, 1, Y, X)``.

        The pooling grid starts at ``img``'s first pixel, so a tile must start on a multiple of
        :attr:`align`; the last partial cell is filled by replicating the edge pixels, which a
        tile ending at the plane's edge does exactly as the full pass does.
        """
        s = self.config.context_scale
        y, xx = img.shape[-2:]
        py, px = (-y) % s, (-xx) % s
        if py or px:
            img = F.pad(img, (0, px, 0, py), mode="replicate")
        mean = F.avg_pool2d(img, s)
        var = (F.avg_pool2d(img * img, s) - mean * mean).clamp_min(0.0)
        c = torch.cat([mean, torch.sqrt(var + 1e-6)], dim=1)
        for layer in self.context:
            c = _gelu(c) if isinstance(layer, nn.GELU) else layer(c)
        c = self.context_proj(c)  # project before upsampling: both are linear, this is cheaper
        c = F.interpolate(c, scale_factor=s, mode="bilinear", align_corners=False)
        return c[:, :, :y, :xx]

    def _run(
        self,
        x: torch.Tensor,
        z0: int,
        cache: list[KVCache] | None,
        need_weights: bool,
        margins: tuple[int, int, int, int] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        cfg = self.config
        if not torch.is_tensor(x) or x.dim() != 4:
            shape = tuple(x.shape) if hasattr(x, "shape") else type(x).__name__
            raise InputError(f"PoreFormer takes a (B, Z, Y, X) tensor, got {shape}")
        if not x.is_floating_point():
            raise InputError(f"PoreFormer takes a float tensor, got {x.dtype}")
        if cache is not None:
            if len(cache) != len(self.blocks):
                raise ValueError(f"need {len(self.blocks)} KV caches, got {len(cache)}")
            for c in cache:
                if c.next_z is not None and c.next_z != z0:
                    raise ValueError(
                        f"this chunk starts at slice {z0} but the KV cache ends at {c.next_z}"
                    )
        check = cfg.check_finite if cfg.check_finite is not None else self.training
        b, z, y, xx = x.shape
        mt, mb, ml, mr = (0, 0, 0, 0) if margins is None else (int(m) for m in margins)
        oy, ox = y - mt - mb, xx - ml - mr  # the token region
        if min(mt, mb, ml, mr) < 0 or oy < 1 or ox < 1:
            raise ValueError(f"margins {margins} do not leave a region of the {y} x {xx} input")
        # Slices outermost: (Z*B, 1, Y, X). Features then live as (Z, B, Y, X, C) in memory, a
        # channels-last image batch for the in-plane convs and slice-major tokens (Z, N, C)
        # for the rest, so no layout copies are needed between them.
        img = x.transpose(0, 1).reshape(z * b, 1, y, xx)
        # The encoder reads the token region plus its own reach (or up to x's edge, which is
        # the plane's edge whenever a margin is shorter than the reach).
        e = cfg.encoder_reach
        et, eb, el, er = min(mt, e), min(mb, e), min(ml, e), min(mr, e)
        h = img[:, :, mt - et : y - mb + eb, ml - el : xx - mr + er]
        for layer in self.encoder:
            h = _gelu(h) if isinstance(layer, nn.GELU) else layer(h)
            if isinstance(layer, nn.Conv2d):
                h = h.contiguous(memory_format=torch.channels_last)  # no-op after the first
        if et or eb or el or er:
            h = h[:, :, et : et + oy, el : el + ox]
        if self.context is not None:
            h = _add(h, self._context(img)[:, :, mt : mt + oy, ml : ml + ox])
        if check:
            check_finite(h, "encoder", "output")
        y, xx = oy, ox
        t = h.permute(0, 2, 3, 1).reshape(z, b * y * xx, h.shape[1])  # (Z, N, C)
        zfeat = z_features(z0, z, cfg.pos_features, cfg.pos_max_period, x.device, x.dtype)
        maps: list[torch.Tensor] = []
        for i, blk in enumerate(self.blocks):
            t, w = blk(t, (b, y, xx), zfeat, None if cache is None else cache[i],
                       need_weights, check)
            if w is not None:
                maps.append(w)
        if cache is not None:
            for cc in cache:
                cc.next_z = z0 + z
        logits = self.head(self.norm(t))  # (Z, N, 1)
        logits = logits.view(z, b, y, xx).transpose(0, 1).contiguous()  # (B, Z, Y, X)
        if check:
            check_finite(logits, "head", "logits")
        return logits, maps
