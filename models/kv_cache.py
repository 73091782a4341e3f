"""Keys and values of earlier slices, kept between the chunks of a streamed stack.

The attention's counterpart of a convolution cache: a stack streams through the model a chunk of
slices at a time, and each attention layer keeps the keys and values that later slices may still
attend to (the last ``W - 1`` with a look-back window ``W``; all of them without one).
"""

from __future__ import annotations

import torch

__all__ = ["KVCache"]


class KVCache:
    """Keys and values of earlier slices for one attention layer, for streaming.

    With a window ``W`` it keeps the last ``W - 1`` positions (a slice never needs more). With
    ``window=None`` it keeps every position, in a buffer that grows by doubling (or is sized
    once from ``capacity``), so appending a chunk costs only that chunk's copy; memory then
    grows with the number of slices seen.

    Parameters
    ----------
    window : int or None
        The layer's look-back window.
    capacity : int, optional
        Expected total number of positions: a full cache (``window=None``) allocates it once.
        Ignored with a window.

    Attributes
    ----------
    next_z : int or None
        Absolute slice index the next query chunk must start at (None before the first chunk).
    """

    def __init__(self, window: int | None, capacity: int | None = None):
        self.window = window
        self.capacity = capacity
        self._k: torch.Tensor | None = None  # window: (B, Zc, Hkv, D); None: (B, cap, Hkv, D)
        self._v: torch.Tensor | None = None
        self._len = 0
        self.next_z: int | None = None

    def __len__(self) -> int:
        return self._len

    @property
    def k(self) -> torch.Tensor | None:
        """Cached keys ``(B, Zc, Hkv, D)`` (None before the first chunk)."""
        return self._view(self._k)

    @property
    def v(self) -> torch.Tensor | None:
        """Cached values ``(B, Zc, Hkv, D)`` (None before the first chunk)."""
        return self._view(self._v)

    def _view(self, buf: torch.Tensor | None) -> torch.Tensor | None:
        if buf is None:
            return None
        return buf if self.window is not None else buf[:, : self._len]

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this chunk's keys/values; return all keys/values the chunk's queries need.

        Parameters
        ----------
        k, v : torch.Tensor
            ``(B, Zq, Hkv, D)`` of the new positions.

        Returns
        -------
        tuple of torch.Tensor
            ``(B, Zc + Zq, Hkv, D)`` each: cached positions followed by the new ones.
        """
        if self._k is not None and self._k.shape[0] != k.shape[0]:
            raise ValueError(
                f"KV cache holds {self._k.shape[0]} sequences, got {k.shape[0]}: one cache per tile"
            )
        if self.window is None:
            return self._append(k, v)
        if self._k is None:
            k_all, v_all = k, v
        else:
            k_all = torch.cat([self._k, k], dim=1)  # (B, Zc+Zq, Hkv, D)
            v_all = torch.cat([self._v, v], dim=1)
        zk = k_all.shape[1]
        keep = min(zk, self.window - 1)
        # Copy, so the cache does not pin the larger (Zc + Zq) buffer.
        self._k = k_all[:, zk - keep :].clone()
        self._v = v_all[:, zk - keep :].clone()
        self._len = keep
        return k_all, v_all

    def _append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Full cache: write into a (B, cap, Hkv, D) buffer, grown by doubling."""
        b, zq, h, d = k.shape
        need = self._len + zq
        cap = 0 if self._k is None else self._k.shape[1]
        if need > cap:
            new_cap = max(need, 2 * cap, self.capacity or 0)
            bufs = []
            for old in (self._k, self._v):
                buf = k.new_empty((b, new_cap, h, d))
                if old is not None and self._len:
                    buf[:, : self._len].copy_(old[:, : self._len])
                bufs.append(buf)
            self._k, self._v = bufs
        self._k[:, self._len : need].copy_(k)
        self._v[:, self._len : need].copy_(v)
        self._len = need
        return self._k[:, :need], self._v[:, :need]
