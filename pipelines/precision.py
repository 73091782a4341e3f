"""Precision and device: what a run of PoreFormer computes in, and on what (PyTorch's device, checked).

``precision="auto"`` runs CUDA under bf16 autocast (fp16 where the GPU lacks bf16), so that the
FlashAttention kernels, which take only half precision, are what runs. On a CPU that multiplies
bf16 in hardware (AVX512-BF16, AMX) it runs a bf16 copy of the model (:func:`cpu_weights_dtype`):
the in-plane convolutions and the projections are the most of its arithmetic, and bf16 products
run several times faster there; the stem and the z-position maps stay fp32. Elsewhere, and with
``precision="fp32"``, the stored model runs as it is.
Every CUDA call acts on the device asked for (``cuda:1`` never touches ``cuda:0``). The GPU is
kept busy between chunks by :mod:`ctpore.pipelines.staging` (read-ahead, pinned buffers,
non-blocking copies, writes behind).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ctpore.errors import InputError

__all__ = ["PRECISIONS", "autocast_dtype", "bf16_copy_dtype", "cpu_native_bf16", "cpu_weights_dtype", "precision_name",
           "resolve_device"]


#: Inference precisions: ``auto`` is bf16 autocast on CUDA (fp16 where the GPU lacks bf16), so
#: that the flash kernels, which take only fp16/bf16, are what run; on a CPU that multiplies bf16
#: in hardware, the model's weights in bf16 (:func:`cpu_weights_dtype`); fp32 on other CPUs.
PRECISIONS = ("auto", "fp32", "bf16", "fp16")


@functools.lru_cache(maxsize=1)
def cpu_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (x86 AVX512-BF16 or AMX-BF16).

    Read from ``/proc/cpuinfo`` (Linux). Elsewhere, or where it cannot be read: False, so
    ``precision="auto"`` stays fp32 (oneDNN emulates bf16 on other CPUs, slower than fp32).
    """
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def cpu_weights_dtype(precision: str, dev: torch.device) -> torch.dtype | None:
    """The dtype PoreFormer's weights and activations take on CPU (None: fp32 as stored).

    ``bf16`` (and ``auto`` on a CPU with native bf16, :func:`cpu_native_bf16`) runs a copy of
    the model in bf16 (:meth:`PoreFormer.with_weights_in`), measured faster on CPU than bf16
    autocast, which casts around every product. On CUDA: None (autocast, see :func:`autocast_dtype`).
    """
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if dev.type != "cpu":
        return None
    if precision == "bf16" or (precision == "auto" and cpu_native_bf16()):
        return torch.bfloat16
    return None


def bf16_copy_dtype(model: Any, precision: str, dev: torch.device) -> torch.dtype | None:
    """The dtype of the copy of ``model`` that ``precision`` runs on ``dev`` (None: the model itself).
    A model without :meth:`~ctpore.models.PoreFormer.with_weights_in` runs under autocast instead."""
    half = cpu_weights_dtype(precision, dev)
    return half if half is not None and hasattr(model, "with_weights_in") else None


def precision_name(precision: str, dev: torch.device) -> str:
    """What ``precision`` runs as on ``dev``: ``fp32``, ``bf16`` or ``fp16`` (recorded in the metrics)."""
    dtype = cpu_weights_dtype(precision, dev) or autocast_dtype(precision, dev)
    return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device`` as a ``torch.device``, or an :class:`InputError` saying why it cannot be used.

    Examples
    --------
    >>> resolve_device("cpu")
    device(type='cpu')
    """
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InputError(f"device {device!r} is not a device PyTorch knows ({exc}); use cpu or cuda") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {device!r}: this PyTorch has no usable CUDA GPU "
                             f"(torch {torch.__version__}); use --device cpu, or install a CUDA build of torch")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(f"device {device!r}: there are {torch.cuda.device_count()} CUDA GPU(s), "
                             f"numbered from 0")
    elif dev.type != "cpu":
        raise InputError(f"device {device!r} is not supported; use cpu or cuda")
    return dev


def autocast_dtype(precision: str, dev: torch.device) -> torch.dtype | None:
    """The autocast dtype of a precision on a device (None: plain fp32)."""
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if dev.type == "cpu" and cpu_weights_dtype(precision, dev) is not None:
        return None  # bf16 weights on CPU, not autocast
    if precision == "auto":
        if dev.type != "cuda":
            return None
        return torch.bfloat16 if torch.cuda.get_device_capability(dev)[0] >= 8 else torch.float16  # that GPU's
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
