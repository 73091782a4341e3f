"""Where PoreFormer's precision and band size are decided: the full-resolution band per device,
autocast switched off for the cheap, precision-sensitive parts, and the folded head in fp32."""

from __future__ import annotations

import torch

__all__ = ["band_tokens", "no_autocast", "folded_head"]

#: Full-resolution tokens processed at a time in inference (a band of rows of the tile): bounds
#: the working memory of the full-resolution part and keeps its tensors in the CPU's caches.
_BAND_TOKENS = 1 << 17

#: Rows of the fp32 head computed at a time when the tokens are in half precision (autocast):
#: bounds the fp32 copy of the tokens the head reads.
_HEAD_ROWS = 1 << 18


def band_tokens(device: torch.device | str | None = None) -> int:
    """Full-resolution tokens PoreFormer processes at a time in inference on ``device``.

    On CPU a band fits the caches; a GPU wants large launches, so its band is 32 times larger.
    :meth:`PoreFormer.inference_bytes` and the forward pass both take it from here.

    Examples
    --------
    >>> band_tokens("cuda") // band_tokens("cpu")
    32
    """
    kind = torch.device(device).type if device is not None else "cpu"
    return _BAND_TOKENS * (32 if kind == "cuda" else 1)


def no_autocast(device_type: str):
    """A context in which autocast is off: what runs inside keeps its inputs' dtype (fp32).

    PoreFormer runs its cheap, precision-sensitive parts (the stem, the z-position encoding and
    the head) in fp32 this way when the rest runs under bf16/fp16 autocast.
    """
    return torch.autocast(device_type, enabled=False)


def folded_head(tok: torch.Tensor, a: torch.Tensor, w_t: torch.Tensor, w_a: torch.Tensor,
                 bias: torch.Tensor) -> torch.Tensor:
    """``tok @ w_t + a @ w_a + bias`` (``(N, 1)``) in the weights' dtype, autocast or not.

    Tokens in the weights' dtype (fp32 inference) take one ``addmm`` and one in-place ``addmm_``;
    on CPU, bf16 tokens of the bf16 copy of the model (no autocast) take the same two products in
    bf16 (the logit rounded to bf16); under autocast half-precision tokens are widened
    ``_HEAD_ROWS`` rows at a time, so the logits are computed in fp32 without an fp32 copy of the
    whole band.
    """
    copy = tok.device.type == "cpu" and not torch.is_autocast_enabled("cpu")  # the bf16 copy, not autocast
    with no_autocast(tok.device.type):
        if tok.dtype == w_t.dtype and a.dtype == w_a.dtype:
            return torch.addmm(bias, tok, w_t).addmm_(a, w_a)
        if copy and tok.dtype == a.dtype:
            # bf16 weights on CPU: the products in the tokens' dtype (oneDNN accumulates each in
            # fp32; the logit is rounded to bf16 after each of the two); widening the tokens cost
            # more than the rest of the full-resolution products together.
            dt = tok.dtype
            return torch.addmm(bias.to(dt), tok, w_t.to(dt)).addmm_(a, w_a.to(dt)).to(w_t.dtype)
        out = torch.empty((tok.shape[0], 1), dtype=w_t.dtype, device=tok.device)
        for i in range(0, tok.shape[0], _HEAD_ROWS):
            rows = slice(i, i + _HEAD_ROWS)
            torch.addmm(bias, tok[rows].to(w_t.dtype), w_t, out=out[rows])
            out[rows].addmm_(a[rows].to(w_a.dtype), w_a)
        return out
