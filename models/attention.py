"""One multi-head attention module with a backend chosen once: flash, sdpa or math.

The module works on sequences laid out ``(B, Z, C)``: in PoreFormer ``B`` is every pixel column
``(y, x)`` of a tile and ``Z`` the slices. It has a packed QKV projection, optional causality, an
optional look-back window ``W`` (slice ``z`` attends to ``z-W+1 ... z``), grouped-query attention
(``n_kv_heads`` < ``n_heads``; ``n_kv_heads=1`` is multi-query), an optional additive term for V
(PoreFormer's z-position encoding) and a key/value cache for streaming.

The backends (flash, sdpa, math; ``auto`` picks one) and the causal alignment of queries and
keys are described in :mod:`ctpore.models.attention_dispatch`, which picks the kernel for each
call; the backend itself is resolved once, when the module is built
(:func:`ctpore.models.backends.resolve_backend`). Besides the module: the one check of the
attention settings (:func:`attention_problems`), the non-finite check that names a layer
(:func:`check_finite`) and the entropy of attention weights (:func:`attention_entropy`).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ctpore.errors import InputError, NonFiniteError
from ctpore.models.attention_dispatch import attend
from ctpore.models.backends import resolve_backend
from ctpore.models.kv_cache import KVCache

__all__ = [
    "MultiHeadAttention",
    "attention_entropy",
    "attention_problems",
    "check_finite",
]


def attention_problems(
    d_model: int,
    n_heads: int,
    n_kv_heads: int | None,
    causal: bool,
    window: int | None,
    dropout: float,
) -> list[str]:
    """What is wrong with these attention settings: one message per problem, empty when none.

    The one set of checks behind :class:`MultiHeadAttention` and
    :class:`~ctpore.models.poreformer_config.PoreFormerConfig`.

    Examples
    --------
    >>> attention_problems(64, 4, None, True, 24, 0.0)
    []
    >>> attention_problems(30, 4, None, False, 8, 0.0)
    ['d_model must be divisible by n_heads, got 30 and 4', 'a look-back window needs causal attention (causal: true)']
    """
    bad = []
    if n_heads < 1 or d_model % n_heads != 0:
        bad.append(f"d_model must be divisible by n_heads, got {d_model} and {n_heads}")
    if n_kv_heads is not None and (n_kv_heads < 1 or n_heads % n_kv_heads != 0):
        bad.append(f"n_kv_heads must divide n_heads ({n_heads}), got {n_kv_heads}")
    if window is not None:
        if isinstance(window, bool) or int(window) != window or window < 1:
            bad.append(f"window must be an integer >= 1 or None (null in YAML), got {window!r}")
        elif not causal:
            bad.append("a look-back window needs causal attention (causal: true)")
    if not 0.0 <= dropout < 1.0:
        bad.append(f"dropout must be >= 0 and < 1, got {dropout}")
    return bad


def check_finite(t: torch.Tensor, layer: str, tensor: str) -> None:
    """Raise :class:`NonFiniteError` naming ``layer`` and ``tensor`` if ``t`` has NaN/Inf.

    Parameters
    ----------
    t : torch.Tensor
    layer : str
        Module name, e.g. ``"blocks.1.attn"``.
    tensor : str
        What ``t`` is, e.g. ``"q"``.

    Raises
    ------
    NonFiniteError
        ``"layer blocks.1.attn: q has 3 non-finite values"``.
    """
    finite = torch.isfinite(t)
    if not bool(finite.all()):
        n = int((~finite).sum())
        raise NonFiniteError(f"layer {layer}: {tensor} has {n} non-finite values")


def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of each head's attention distributions.

    Parameters
    ----------
    weights : torch.Tensor
        ``(B, H, Zq, Zk)``, every row a probability distribution over keys (zeros allowed:
        ``0 log 0 = 0``).

    Returns
    -------
    torch.Tensor
        ``(H,)`` float32: for each head the entropy ``-sum_k p log p`` averaged over batch and
        queries. A head that looks at one slice scores 0; one spread evenly over ``n`` slices
        scores ``log n``.

    Examples
    --------
    >>> import math
    >>> w = torch.full((1, 1, 1, 4), 0.25)
    >>> round(float(attention_entropy(w)[0]), 4) == round(math.log(4), 4)
    True
    """
    if weights.dim() != 4:
        raise ValueError(f"weights must be (B, H, Zq, Zk), got shape {tuple(weights.shape)}")
    p = weights.float()
    plogp = torch.where(p > 0, p * torch.log(p.clamp_min(torch.finfo(p.dtype).tiny)), 0.0)
    return (-plogp.sum(-1)).mean(dim=(0, 2))  # (H,)


def _tokenwise(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Apply a per-token op to ``(B, Z, C)`` that may be a transposed view of ``(Z, B, C)``.

    PoreFormer keeps tokens slice-major; running the op on the contiguous base avoids a copy.
    """
    if x.dim() == 3 and not x.is_contiguous() and x.transpose(0, 1).is_contiguous():
        return fn(x.transpose(0, 1)).transpose(0, 1)
    return fn(x)


class MultiHeadAttention(nn.Module):
    """Multi-head (grouped-query) self-attention over ``(B, Z, C)`` with a fixed backend.

    Parameters
    ----------
    d_model : int
        Token width ``C``.
    n_heads : int
        Query heads ``H``; ``d_model`` must be divisible by it. Head size ``D = d_model / H``.
    n_kv_heads : int, optional
        Key/value heads ``Hkv`` (GQA; 1 = MQA). Must divide ``n_heads``. Default ``n_heads``.
    causal : bool
        A position attends only to itself and earlier positions.
    window : int, optional
        Look-back window ``W >= 1``: position ``z`` attends to ``z-W+1 ... z``. Needs ``causal``.
    dropout : float
        Dropout on the attention weights and on the output projection, only while training.
    backend : {"auto", "flash", "sdpa", "math"}
        Resolved once here; see :mod:`ctpore.models.attention_dispatch`.
    bias : bool
        Biases in the QKV and output projections.
    name : str
        Used in non-finite errors ("layer <name>: q has ..."); PoreFormer sets its module path.

    Examples
    --------
    >>> mha = MultiHeadAttention(64, 4, causal=True, backend="math")
    >>> y, w = mha(torch.randn(2, 5, 64), need_weights=True)
    >>> tuple(y.shape), tuple(w.shape)
    ((2, 5, 64), (2, 4, 5, 5))
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        causal: bool = True,
        window: int | None = None,
        dropout: float = 0.0,
        backend: str = "auto",
        bias: bool = True,
        name: str = "attn",
    ):
        super().__init__()
        problems = attention_problems(d_model, n_heads, n_kv_heads, causal, window, dropout)
        if problems:
            raise InputError("; ".join(problems))
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = d_model // n_heads
        self.causal = causal
        self.window = None if window is None else int(window)
        self.dropout = float(dropout)
        self.name = name
        self.requested_backend = backend
        self.backend = resolve_backend(backend, self.head_dim)
        self.kv_dim = n_kv_heads * self.head_dim
        # Packed projection: [q (H*D) | k (Hkv*D) | v (Hkv*D)].
        self.qkv = nn.Linear(d_model, d_model + 2 * self.kv_dim, bias=bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)
        self.resid_drop = nn.Dropout(dropout)
        self._row_masks: dict = {}  # the last mask of the multi-query SDPA path, by (Zq, Zk, device)
        #: How many calls each kernel served: what really ran, whatever was asked for (flash
        #: only takes fp16/bf16 CUDA tensors; other calls go through sdpa).
        self.ran: Counter = Counter()

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
            f"causal={self.causal}, window={self.window}, backend={self.backend!r}"
        )

    # --------------------------------------------------------------------------------------
    def project(
        self, x: torch.Tensor, pos_v: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Packed projection of ``x`` into per-head q, k, v (with ``pos_v`` added into V).

        Parameters
        ----------
        x : torch.Tensor
            ``(B, Z, C)``.
        pos_v : torch.Tensor, optional
            Added to V: ``(Z, Hkv*D)`` or broadcastable to ``(B, Z, Hkv*D)``.

        Returns
        -------
        q : torch.Tensor
            ``(B, Z, H, D)``
        k, v : torch.Tensor
            ``(B, Z, Hkv, D)``
        """
        b, z, _ = x.shape
        if not torch.is_grad_enabled() and x.is_contiguous():
            # Two products from the packed weight: q comes out contiguous, as the kernels read it.
            w, bias = self.qkv.weight, self.qkv.bias
            c = self.d_model
            q = F.linear(x, w[:c], None if bias is None else bias[:c])
            k, v = F.linear(x, w[c:], None if bias is None else bias[c:]).split(self.kv_dim, dim=-1)
        else:
            q, k, v = _tokenwise(self.qkv, x).split([self.d_model, self.kv_dim, self.kv_dim], dim=-1)
        if pos_v is not None:
            # V = W_v x + pos_enc(z); in place (into the fresh qkv buffer) when no grad is taken,
            # where a wider pos_v (fp32 under autocast) is added before the one rounding to V's dtype.
            v = v + pos_v.to(v.dtype) if torch.is_grad_enabled() else v.add_(pos_v)
        q = q.view(b, z, self.n_heads, self.head_dim)  # (B, Z, H, D)
        k = k.view(b, z, self.n_kv_heads, self.head_dim)  # (B, Z, Hkv, D)
        v = v.view(b, z, self.n_kv_heads, self.head_dim)  # (B, Z, Hkv, D)
        return q, k, v

    def heads_slice_major(self, x: torch.Tensor, pos_v: torch.Tensor | None, cache: KVCache | None,
                          cache_rows: slice | None, n_rows: int) -> torch.Tensor | None:
        """The heads' outputs, concatenated (no output projection), of slice-major tokens ``x``
        ``(Zq, N, C)``, or None where this path does not apply (then call :meth:`forward` on
        ``(N, Zq, C)``): it takes a look-back-window ``cache`` (None: not this path).

        For inference on CPU with a look-back-window KV cache and ctpore's C kernel: q, k and v stay
        in ``x``'s slice-major layout, the kernel reads them in place and writes ``(Zq, N, C)``, so
        a caller holding slice-major maps (channels-last, slices outermost) makes no transposing
        copy. Each token's arithmetic is :meth:`forward`'s, so the values are its values.
        """
        from ctpore.models.window_kernel import available, window_attention

        if (torch.is_grad_enabled() or self.training or x.device.type != "cpu" or not x.is_contiguous()
                or cache is None or cache.window is None or not self.causal or self.window is None or not available()):
            return None
        z, n, c = x.shape
        # project's products on (Zq, N) rows (each token's own), the z term per slice; (N, Zq, ...) views
        q, k, v = (t.transpose(0, 1) for t in self.project(x, None if pos_v is None else pos_v.unsqueeze(1)))
        out = window_attention(q, k, v, self.window, cache.past(cache_rows))
        if out is None:
            return None
        cache.append(k, v, cache_rows, n_rows)
        self.ran["window"] += 1
        return out.transpose(0, 1).reshape(z, n, c)

    def forward(
        self,
        x: torch.Tensor,
        pos_v: torch.Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
        check: bool = False,
        cache_rows: slice | None = None,
        n_rows: int | None = None,
        project_out: bool = True,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend over the sequence axis.

        Parameters
        ----------
        x : torch.Tensor
            ``(B, Zq, C)``: the new positions.
        pos_v : torch.Tensor, optional
            Term added into V for these positions, ``(Zq, Hkv*D)``.
        cache : KVCache, optional
            Earlier positions' keys/values; updated in place. The queries are the last ``Zq``
            of the ``len(cache) + Zq`` key positions.
        need_weights : bool
            Also return the weights ``(B, H, Zq, Zk)``; computed by the ``math`` path whatever
            the backend.
        check : bool
            Raise :class:`NonFiniteError` naming this layer if q, k, v or the output has
            NaN/Inf.
        cache_rows, n_rows : slice, int, optional
            ``x`` is the band ``cache_rows`` of ``n_rows`` sequences (see :meth:`KVCache.extend`).
        project_out : bool
            Apply the output projection (False: the heads' outputs, concatenated, for a caller
            that folds the projection into what follows).

        Returns
        -------
        torch.Tensor or tuple
            ``(B, Zq, C)``, and the weights if ``need_weights``.
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (B, Z, {self.d_model}), got shape {tuple(x.shape)}")
        q, k, v = self.project(x, pos_v)
        if check:
            check_finite(q, self.name, "q")
            check_finite(k, self.name, "k")
            check_finite(v, self.name, "v")
        p = self.dropout if self.training else 0.0
        if cache is not None and cache.window is not None:
            # the cached positions are read where they lie (joined to k, v only where a kernel needs
            # them joined), then the cache keeps what the next chunk needs of this one's
            past = cache.past(cache_rows)
            out, weights, ran = attend(self.backend, q, k, v, p, self.causal, self.window, need_weights,
                                       self._row_masks, past)
            cache.append(k, v, cache_rows, n_rows)
        else:
            if cache is not None:
                k, v = cache.extend(k, v, cache_rows, n_rows)  # (B, Zk, Hkv, D)
            out, weights, ran = attend(self.backend, q, k, v, p, self.causal, self.window, need_weights,
                                       self._row_masks)
        self.ran[ran] += 1
        b, zq = out.shape[0], out.shape[1]
        out = out.reshape(b, zq, self.d_model)  # (B, Zq, C)
        if project_out:
            if not torch.is_autocast_enabled(out.device.type):  # a bf16 copy's fp32 last projection
                out = out.to(self.proj.weight.dtype)
            out = self.resid_drop(_tokenwise(self.proj, out))
        if check:
            check_finite(out, self.name, "output")
        return (out, weights) if need_weights else out
