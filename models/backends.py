"""Which attention kernel can run here: flash (flash-attn on CUDA), sdpa (PyTorch) or math.

The choice is made once, when an attention module is built (:func:`resolve_backend`). flash-attn
is imported only when asked for, never when this module loads, and only where CUDA and a GPU of
compute capability >= 8 are present.
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch

from ctpore.errors import InputError

__all__ = ["BACKENDS", "flash_available", "flash_capable", "load_flash", "resolve_backend"]

BACKENDS = ("auto", "flash", "sdpa", "math")

_flash_cache: dict[str, object] = {}


def load_flash() -> tuple[Callable | None, str]:
    """Import ``flash_attn_func`` once; return ``(fn, "")`` or ``(None, why_not)``."""
    if "fn" in _flash_cache:
        return _flash_cache["fn"], _flash_cache["why"]  # type: ignore[return-value]
    fn, why = None, ""
    if not torch.cuda.is_available():
        why = "CUDA is not available"
    else:
        try:  # every visible GPU by its index (none made current); the kernel runs on capable ones
            major = max(torch.cuda.get_device_capability(i)[0] for i in range(torch.cuda.device_count()))
        except Exception as exc:  # a broken driver: report, do not crash
            major, why = 0, f"cannot read the GPU's compute capability ({exc})"
        if major < 8 and not why:
            why = f"the GPU's compute capability is {major}.x; flash-attn needs >= 8.0"
        if not why:
            try:
                from flash_attn import flash_attn_func  # optional, lazy
            except (ImportError, OSError) as exc:
                why = (f"flash-attn cannot be imported ({exc}); install it with "
                       "pip install flash-attn --no-build-isolation (see docs/gpu.md)")
            else:
                if "window_size" not in inspect.signature(flash_attn_func).parameters:
                    why = "flash-attn is too old (no window_size); install flash-attn>=2.3"
                else:
                    fn = flash_attn_func
    _flash_cache["fn"], _flash_cache["why"] = fn, why
    return fn, why


def flash_capable(device: torch.device) -> bool:
    """Whether flash-attn's kernel can run on the CUDA ``device`` (compute capability >= 8.0).

    Asked of that device by its index (cached per device), so a run on ``cuda:1`` never
    queries ``cuda:0``.
    """
    if device.type != "cuda":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = f"cc{index}"
    if key not in _flash_cache:
        try:
            _flash_cache[key] = torch.cuda.get_device_capability(index)[0] >= 8
        except Exception:  # a broken driver: sdpa takes the call
            _flash_cache[key] = False
    return bool(_flash_cache[key])


def flash_available() -> bool:
    """Whether the ``flash`` backend can run here.

    True only with CUDA, a GPU of compute capability >= 8 and an importable ``flash-attn``
    (>= 2.3). The import happens on the first call, never when this module loads.

    Returns
    -------
    bool
    """
    return load_flash()[0] is not None


def resolve_backend(name: str, head_dim: int | None = None) -> str:
    """Turn a requested backend into the one that will run.

    Parameters
    ----------
    name : {"auto", "flash", "sdpa", "math"}
        The request. ``auto`` takes ``flash`` where available (and the head size suits it),
        else ``sdpa``.
    head_dim : int, optional
        Size of one head; flash-attn needs a multiple of 8 up to 256.

    Returns
    -------
    str
        ``"flash"``, ``"sdpa"`` or ``"math"``.

    Raises
    ------
    InputError
        For an unknown name, or ``flash`` asked for where it cannot run (the message says why).
    """
    if name not in BACKENDS:
        raise InputError(f"attention_backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    head_ok = head_dim is None or (head_dim % 8 == 0 and head_dim <= 256)
    if name == "auto":
        return "flash" if (head_ok and flash_available()) else "sdpa"
    if name == "flash":
        _fn, why = load_flash()
        if why:
            raise InputError(f"attention_backend 'flash' is not available: {why}; use 'sdpa'")
        if not head_ok:
            raise InputError(
                f"attention_backend 'flash' needs a head size that is a multiple of 8 up to 256, "
                f"got {head_dim}; use 'sdpa'"
            )
    return name


