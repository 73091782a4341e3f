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

    With a window ``W`` it keeps the last ``W - 1`` positions (a slice never needs more), in a
    buffer allocated once. With ``window=None`` it keeps every position, in a buffer that grows
    by doubling (or is sized once from ``capacity``), so appending a chunk costs only that
    chunk's copy; memory then grows with the number of slices seen.

    A chunk may be processed in bands of sequences (pixel columns): :meth:`extend` with
    ``rows`` reads and updates only those sequences, and :meth:`commit` then advances the cache
    by the chunk's length once every band is done.

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
        self._k: torch.Tensor | None = None  # (B, slots, Hkv, D): W - 1 slots, or the capacity
        self._v: torch.Tensor | None = None
        self._spare: tuple[torch.Tensor, torch.Tensor] | None = None  # append's buffers, swapped in at commit
        self._swap = False
        self._len = 0
        self.next_z: int | None = None

    def __len__(self) -> int:
        return self._len

    @property
    def k(self) -> torch.Tensor | None:
        """Cached keys ``(B, Zc, Hkv, D)`` (None before the first chunk)."""
        return None if self._k is None else self._k[:, : self._len]

    @property
    def v(self) -> torch.Tensor | None:
        """Cached values ``(B, Zc, Hkv, D)`` (None before the first chunk)."""
        return None if self._v is None else self._v[:, : self._len]

    def _slots(self, extra: int) -> int:
        if self.window is not None:
            return max(self.window - 1, 0)
        return max(self._len + extra, self.capacity or 0)

    def extend(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        rows: slice | None = None,
        n_rows: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this chunk's keys/values; return all keys/values the chunk's queries need.

        Parameters
        ----------
        k, v : torch.Tensor
            ``(B, Zq, Hkv, D)`` of the new positions (``B`` = the band's sequences with ``rows``).
        rows : slice, optional
            The band of sequences ``k`` and ``v`` belong to. Without it the chunk is whole and
            the cache advances at once; with it the caller calls :meth:`commit` after the last
            band of the chunk.
        n_rows : int, optional
            The total number of sequences (needed with ``rows`` on the first chunk).

        Returns
        -------
        tuple of torch.Tensor
            ``(B, Zc + Zq, Hkv, D)`` each: cached positions followed by the new ones.
        """
        b, zq, h, d = k.shape
        total = b if rows is None else n_rows if self._k is None else self._k.shape[0]
        if total is None:
            raise ValueError("the first chunk streamed in bands needs n_rows, the number of sequences")
        if self._k is not None and self._k.shape[0] != total:
            raise ValueError(
                f"KV cache holds {self._k.shape[0]} sequences, got {total}: one cache per tile"
            )
        sel = slice(None) if rows is None else rows
        slots = self._slots(zq)
        if self._k is None or (self.window is None and slots > self._k.shape[1]):
            self._grow(total, max(slots, 2 * (0 if self._k is None else self._k.shape[1])), h, d, k)
        old_k, old_v = self._k[sel, : self._len], self._v[sel, : self._len]
        if self.window is None:
            self._k[sel, self._len : self._len + zq] = k
            self._v[sel, self._len : self._len + zq] = v
            k_all, v_all = self._k[sel, : self._len + zq], self._v[sel, : self._len + zq]
        else:
            k_all = torch.cat([old_k, k], dim=1) if self._len else k  # (B, Zc+Zq, Hkv, D)
            v_all = torch.cat([old_v, v], dim=1) if self._len else v
            keep = min(k_all.shape[1], slots)
            if keep:
                self._k[sel, :keep] = k_all[:, k_all.shape[1] - keep :]
                self._v[sel, :keep] = v_all[:, v_all.shape[1] - keep :]
        if rows is None:
            self.commit(zq)
        return k_all, v_all

    def past(self, rows: slice | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The cached keys and values of the sequences ``rows`` (all without), ``(B, Zc, Hkv, D)``
        views of the buffer, or None when nothing is cached. A kernel reads them in place, then
        :meth:`append` takes the chunk's own keys and values, and no copy joins the two; they stay
        valid until the chunk is committed (:meth:`append` writes a second buffer)."""
        if self._k is None or not self._len:
            return None
        sel = slice(None) if rows is None else rows
        return self._k[sel, : self._len], self._v[sel, : self._len]

    def append(self, k: torch.Tensor, v: torch.Tensor, rows: slice | None = None, n_rows: int | None = None) -> None:
        """:meth:`extend` without the joined keys and values it returns (for a caller that read
        :meth:`past` in place): only the positions the cache keeps are copied, into a second buffer
        that :meth:`commit` swaps in (the positions shift forward with no overlapping copy, and
        :meth:`past` of a later band still reads the chunk's cache)."""
        if self.window is None or not self._len or (rows is None and self._k.shape[0] != k.shape[0]):
            self.extend(k, v, rows, n_rows)  # nothing cached yet (every band of the chunk), or a mismatch it names
            return
        zq = k.shape[1]
        sel = slice(None) if rows is None else rows
        keep = min(self._len + zq, self._slots(zq))
        if self._spare is None or self._spare[0].shape != self._k.shape:
            self._spare = (torch.empty_like(self._k), torch.empty_like(self._v))
        new = min(zq, keep)  # from this chunk, the rest from the cache's last positions
        old = keep - new
        for buf, cached, fresh in zip(self._spare, (self._k, self._v), (k, v)):
            buf[sel, :old] = cached[sel, self._len - old : self._len]
            buf[sel, old:keep] = fresh[:, zq - new :]
        self._swap = True
        if rows is None:
            self.commit(zq)

    def commit(self, zq: int) -> None:
        """Advance the cache by a chunk of ``zq`` positions (after its last band)."""
        if self._swap:  # what append wrote becomes the cache
            (self._k, self._v), self._spare = self._spare, (self._k, self._v)
            self._swap = False
        new = self._len + zq
        self._len = new if self.window is None else min(new, max(self.window - 1, 0))

    def _grow(self, n: int, slots: int, h: int, d: int, like: torch.Tensor) -> None:
        bufs = []
        for old in (self._k, self._v):
            buf = like.new_empty((n, max(slots, 1), h, d))
            if old is not None and self._len:
                buf[:, : self._len].copy_(old[:, : self._len])
            bufs.append(buf)
        self._k, self._v = bufs
