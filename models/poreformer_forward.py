"""PoreFormer's forward pass: the per-slice U-Net with its level attention, then the full-resolution
tokens, their attention and the head, in bands of rows.

:class:`~ctpore.models.poreformer.PoreFormer` holds the layers and their plan (see its module);
:meth:`~ctpore.models.poreformer.PoreFormer.forward` and
:meth:`~ctpore.models.poreformer.PoreFormer.attention_maps` both run :func:`forward_pass` on it.
In inference the full-resolution part works a band of rows of the token region at a time
(:func:`~ctpore.models.numerics.band_tokens`), so its memory follows the band, not the tile, and
the last block's output projection folds into the head (:func:`fold_last_block`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ctpore.errors import InputError
from ctpore.models.attention import check_finite
from ctpore.models.blocks import channels_last, gelu_, up2, z_features
from ctpore.models.kv_cache import KVCache
from ctpore.models.numerics import band_tokens, folded_head, no_autocast

__all__ = ["fold_last_block", "forward_pass"]


def fold_last_block(model):
    """``(W_t, W_a, b)`` with ``head(t + proj(a)) = t @ W_t + a @ W_a + b``, or None.

    Valid when the last full-resolution block of the PoreFormer ``model`` is attention only (its
    output is ``t + proj(a)``) and the head reads it directly, as PoreFormer's does: the fold saves
    the output projection and the residual add over every full-resolution token.
    """
    if not len(model.blocks) or model.blocks[-1].mlp is not None or model.training:
        return None
    proj, head = model.blocks[-1].attn.proj, model.head
    with no_autocast(head.weight.device.type):  # in the weights' dtype, whatever autocast says
        w_t = head.weight.t()  # (C, 1)
        w_a = (head.weight @ proj.weight).t()  # (C, 1)
        bias = head.bias + (head.weight @ proj.bias if proj.bias is not None else 0.0)
    return w_t, w_a, bias


def _level_attention(h, blocks, z, b, zfeat, caches, need_weights, check, maps, scale):
    """Run a level's attention blocks on the pixel columns of the map ``h`` (Z*B, C, hy, hx)."""
    _, c, hy, hx = h.shape
    t = h.permute(0, 2, 3, 1).reshape(z, b * hy * hx, c).transpose(0, 1).contiguous()  # (N, Z, C)
    for blk in blocks:
        t, w = blk(t, zfeat, None if caches is None else caches.pop(0), need_weights, check)
        if w is not None:
            maps.append((scale, (hy, hx), w))
    return channels_last(t.transpose(0, 1).reshape(z * b, hy, hx, c).permute(0, 3, 1, 2))


def forward_pass(
    model,
    x: torch.Tensor,
    z0: int,
    cache: list[KVCache] | None,
    need_weights: bool,
    margins: tuple[int, int, int, int] | None = None,
):
    """The logits of the PoreFormer ``model`` for ``x``, and the attention weights if asked.

    Arguments as for :meth:`~ctpore.models.poreformer.PoreFormer.forward`. Returns ``(logits,
    maps)``: ``maps`` holds ``(scale, (hy, hx), weights (B*hy*hx, H, Zq, Zk))`` per attention block
    with ``need_weights`` (coarse levels first), else nothing.
    """
    cfg = model.config
    if not torch.is_tensor(x) or x.dim() != 4:
        shape = tuple(x.shape) if hasattr(x, "shape") else type(x).__name__
        raise InputError(f"PoreFormer takes a (B, Z, Y, X) tensor, got {shape}")
    if not x.is_floating_point():
        raise InputError(f"PoreFormer takes a float tensor, got {x.dtype}")
    n_blocks = sum(len(level) for level in model.level_blocks) + len(model.blocks)
    if cache is not None:
        if len(cache) != n_blocks:
            raise ValueError(f"need {n_blocks} KV caches, got {len(cache)}")
        for c in cache:
            if c.next_z is not None and c.next_z != z0:
                raise ValueError(f"this chunk starts at slice {z0} but the KV cache ends at {c.next_z}")
    check = cfg.check_finite if cfg.check_finite is not None else model.training
    b, z, y, xx = x.shape
    mt, mb, ml, mr = (0, 0, 0, 0) if margins is None else (int(m) for m in margins)
    oy, ox = y - mt - mb, xx - ml - mr  # the token region
    if min(mt, mb, ml, mr) < 0 or oy < 1 or ox < 1:
        raise ValueError(f"margins {margins} do not leave a region of the {y} x {xx} input")
    zfeat = z_features(z0, z, cfg.pos_features, cfg.pos_max_period, x.device, x.dtype)
    caches = None if cache is None else list(cache)
    maps: list = []

    # Slices outermost: (Z*B, 1, Y, X), padded to the coarsest grid at the bottom/right.
    img = x.transpose(0, 1).reshape(z * b, 1, y, xx)
    a = cfg.align
    py, px = (-y) % a, (-xx) % a
    if py or px:
        img = F.pad(img, (0, px, 0, py), mode="replicate")
    with no_autocast(img.device.type):  # the stem in the input's precision (fp32), autocast or not
        s0 = channels_last(gelu_(model.stem(img)).to(model.down[0].weight.dtype))  # (Z*B, C0, Y', X')
    if check:
        check_finite(s0, "encoder", "output")
    feats, h = [s0], s0
    for lv in range(cfg.n_levels):
        h = channels_last(gelu_(model.down[lv](h)))
        h = channels_last(gelu_(model.conv[lv](h)))
        if len(model.level_blocks[lv]):
            h = _level_attention(h, model.level_blocks[lv], z, b, zfeat, caches, need_weights,
                                 check, maps, 2 ** (lv + 1))
        feats.append(h)
    u = feats[-1]
    for lv in range(cfg.n_levels - 1, 0, -1):  # back up to 1/2 resolution
        skip = feats[lv]
        u = F.interpolate(u, size=skip.shape[-2:], mode="bilinear", align_corners=False)
        u = channels_last(gelu_(model.fuse[lv - 1](torch.cat([u, skip], dim=1))))
    u = model.up_proj(u)  # (Z*B, d, Y'/2, X'/2): projected before upsampling (both are linear)
    full = [None if caches is None else caches.pop(0) for _ in model.blocks]
    logits = _full_resolution(model, x, u, s0, (mt, mb, ml, mr), zfeat, full, need_weights, check, maps)
    if cache is not None:
        for c in cache:
            c.next_z = z0 + z
    if check:
        check_finite(logits, "head", "logits")
    return logits, maps


def _full_resolution(model, x, u, s0, margins, zfeat, caches, need_weights, check, maps) -> torch.Tensor:
    """Full-resolution tokens, their attention and the head, in bands of rows of the token region.

    The working memory of this part follows the band, not the tile (in inference; training
    and attention maps take the region whole). ``u`` is the projected 1/2-resolution map,
    ``s0`` the stem features; returns the logits ``(B, Z, oy, ox)``.
    """
    b, z, y, xx = x.shape
    mt, mb, ml, mr = margins
    oy, ox, d = y - mt - mb, xx - ml - mr, model.config.d_model
    per_band = band_tokens(x.device)  # a GPU wants large launches
    whole = torch.is_grad_enabled() or need_weights or b > 1
    band = oy if whole else max(1, min(oy, per_band // max(1, ox * z)))
    fold = None if (torch.is_grad_enabled() or need_weights or check) else fold_last_block(model)
    logits = torch.empty((b, z, oy, ox), dtype=x.dtype, device=x.device)
    for r0 in range(0, oy, band):
        r1 = min(oy, r0 + band)
        rows = slice(ox * r0, ox * r1) if band < oy else None  # this band's pixel columns
        up = up2(u, (mt + r0, mt + r1), (ml, xx - mr), s0.shape[-2:])  # (Z*B, d, rb, ox)
        st = model.stem_proj(s0[:, :, mt + r0 : mt + r1, ml : xx - mr])
        if check:
            check_finite(up, "decoder", "output")
        rb = r1 - r0
        n_run = len(model.blocks) - (fold is not None)
        # the add in the maps' own (channels-last) layout; into the stem's fresh map where no
        # gradient is taken (the same sums: addition commutes)
        summed = st.add_(up) if not torch.is_grad_enabled() and st.dtype == up.dtype else up + st
        if fold is not None and not n_run and b == 1:
            lg = _folded_slice_major(model, summed, zfeat, caches[-1], rows, oy * ox, fold)
            if lg is not None:
                logits[0, :, r0:r1] = lg.view(z, rb, ox)
                continue
        # column-major (B*rb*ox, Z, d): one transposing copy (measured twice as fast as an add that
        # writes the transposed layout)
        tok = summed.permute(0, 2, 3, 1).reshape(z, b * rb * ox, d).transpose(0, 1).contiguous()
        for blk, c in zip(model.blocks[:n_run], caches):
            tok, w = blk(tok, zfeat, c, need_weights, check, rows, b * oy * ox)
            if w is not None:
                maps.append((1, (oy, ox), w))
        if fold is None:
            with no_autocast(tok.device.type):  # the logits in the head's precision (fp32)
                lg = model.head(tok.to(model.head.weight.dtype))  # (N, Z, 1)
        else:  # head(t + proj(a)) = head(t) + (head . proj)(a): no projection, no residual add
            last = model.blocks[-1]
            a = last.attn(last.ln1(tok), pos_v=last.pos_term(zfeat), cache=caches[-1],
                          cache_rows=rows, n_rows=b * oy * ox, project_out=False)
            lg = folded_head(tok.view(-1, d), a.reshape(-1, d), *fold)
        logits[:, :, r0:r1] = lg.view(b, rb, ox, z).permute(0, 3, 1, 2)
    if band < oy:
        for c in caches:
            if c is not None:
                c.commit(z)
    return logits


def _folded_slice_major(model, summed, zfeat, cache, rows, n_rows, fold):
    """The logits ``(Z*rb*ox, 1)`` of a band whose only full-resolution block folds into the head, with
    the tokens slice-major: ``summed`` is the band's token map ``(Z, d, rb, ox)``, channels-last, so its
    memory already is ``(Z, rb*ox, d)`` and no transposing copy is made (the attention reads it there:
    :meth:`~ctpore.models.attention.MultiHeadAttention.heads_slice_major`). None where that path does
    not apply; the values are those of the column-major path."""
    z, d = summed.shape[0], summed.shape[1]
    if not summed.is_contiguous(memory_format=torch.channels_last):
        return None
    tok = summed.permute(0, 2, 3, 1).reshape(z, -1, d)  # (Z, N, d), a view
    last = model.blocks[-1]
    a = last.attn.heads_slice_major(last.ln1(tok), last.pos_term(zfeat), cache, rows, n_rows)
    return None if a is None else folded_head(tok.reshape(-1, d), a.reshape(-1, d), *fold)
