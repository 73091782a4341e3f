"""PoreFormer weights in and out: safetensors only, the config saved beside the tensors.

A weights file is a safetensors file whose metadata holds ``"config"`` (the
:class:`~ctpore.models.poreformer.PoreFormerConfig` as JSON), ``"format"``
(``"ctpore.poreformer"``), ``"ctpore_version"`` and any extra string metadata given to
:func:`save_weights`. Pickle-based checkpoints (``.pt``, ``.pth``, ``.ckpt``, ...) are refused:
unpickling runs code from the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

import torch

from ctpore.data.errors import InputError

__all__ = [
    "FORMAT",
    "default_weights_path",
    "load_model",
    "read_metadata",
    "save_weights",
    "sha256_file",
]

FORMAT = "ctpore.poreformer"
_PICKLE_SUFFIXES = {".pt", ".pth", ".ckpt", ".pkl", ".pickle"}
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit on the JSON header


def _refuse(path: Path, why: str) -> InputError:
    return InputError(
        f"is not a safetensors file ({why}); ctpore never unpickles weights (it could run "
        "code). Convert it with ctpore.models.weights.save_weights in an environment you "
        "trust: build PoreFormer(config), load_state_dict(torch.load(path, weights_only=True)), "
        "then save_weights(model, 'poreformer.safetensors')",
        path=path,
    )


def _check_safetensors(path: str | Path) -> Path:
    """Refuse what is not a readable safetensors file, with a message that says why."""
    p = Path(path)
    if not p.exists():
        raise InputError("no such weights file", path=p)
    if p.is_dir():
        raise InputError("is a directory, expected a .safetensors weights file", path=p)
    if p.suffix.lower() in _PICKLE_SUFFIXES:
        raise _refuse(p, f"a {p.suffix} file is a pickle checkpoint")
    try:
        with open(p, "rb") as fh:
            head = fh.read(8)
            size = p.stat().st_size
            if head[:4] == b"PK\x03\x04":
                raise _refuse(p, "a zip archive, as torch.save writes")
            if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
                raise _refuse(p, "it starts with a pickle header")
            if len(head) < 8:
                raise _refuse(p, "too short")
            (n,) = struct.unpack("<Q", head)
            if n < 2 or n > _MAX_HEADER or 8 + n > size or fh.read(1) != b"{":
                raise _refuse(p, "no safetensors header")
    except OSError as exc:
        raise InputError(f"cannot read the weights file ({exc.strerror})", path=p) from exc
    return p


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    str
        64 hex digits.
    """
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except OSError as exc:
        raise InputError(f"cannot read the file ({exc.strerror})", path=path) from exc
    return h.hexdigest()


def default_weights_path() -> Path | None:
    """The package's shipped weights, ``models/weights/poreformer.safetensors``, or None."""
    p = Path(__file__).resolve().parent / "weights" / "poreformer.safetensors"
    return p if p.is_file() else None


def save_weights(model: torch.nn.Module, path: str | Path, metadata: dict | None = None) -> Path:
    """Write a PoreFormer's weights and config to a safetensors file (atomically).

    Parameters
    ----------
    model : PoreFormer
        Its ``state_dict()`` is saved (on CPU) and its ``config`` as JSON under ``"config"``.
    path : str or Path
        Destination; written to a temporary file in the same folder, then renamed.
    metadata : dict, optional
        Extra metadata, string keys; values that are not strings are stored as JSON.
        ``config`` and ``format`` are reserved.

    Returns
    -------
    Path
        ``path``.
    """
    from safetensors.torch import save_file  # noqa: PLC0415

    from ctpore import __version__  # noqa: PLC0415

    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_json"):
        raise InputError(f"save_weights needs a PoreFormer, got {type(model).__name__}")
    meta: dict[str, str] = {}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str):
            raise InputError(f"metadata keys must be strings, got {key!r}")
        if key in ("config", "format"):
            raise InputError(f"metadata key {key!r} is reserved for ctpore")
        meta[key] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    meta.setdefault("ctpore_version", __version__)
    meta["format"] = FORMAT
    meta["config"] = config.to_json()
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata of a weights file, without loading the tensors.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    dict
        The stored string metadata, except ``"config"``, which is decoded to a dict.

    Raises
    ------
    InputError
        For a missing, pickle or otherwise non-safetensors file.
    """
    from safetensors import safe_open  # noqa: PLC0415

    p = _check_safetensors(path)
    try:
        with safe_open(str(p), framework="pt") as fh:
            meta = dict(fh.metadata() or {})
    except Exception as exc:  # safetensors raises its own error types
        raise InputError(f"not a readable safetensors file ({exc})", path=p) from exc
    if "config" in meta:
        try:
            meta["config"] = json.loads(meta["config"])
        except json.JSONDecodeError as exc:
            raise InputError(f"the stored model config is not valid JSON ({exc})", path=p) from exc
    return meta


def load_model(
    path: str | Path,
    device: str | torch.device | None = None,
    attention_backend: str | None = None,
):
    """Build a PoreFormer from a safetensors weights file.

    Parameters
    ----------
    path : str or Path
        A file written by :func:`save_weights`.
    device : str or torch.device, optional
        Where to put the model (default CPU).
    attention_backend : str, optional
        Override the stored backend (``auto``, ``flash``, ``sdpa``, ``math``).

    Returns
    -------
    PoreFormer
        In eval mode.

    Raises
    ------
    InputError
        For a pickle checkpoint (never unpickled), a file that is not safetensors, a missing
        config, or tensors that do not fit the config.
    """
    from safetensors.torch import load_file  # noqa: PLC0415

    from ctpore.models.poreformer import PoreFormer, PoreFormerConfig  # noqa: PLC0415

    meta = read_metadata(path)
    p = Path(path)
    if "config" not in meta:
        raise InputError("the weights file has no 'config' metadata; was it written by "
                         "ctpore.models.weights.save_weights?", path=p)
    cfg_dict = dict(meta["config"])
    if attention_backend is not None:
        cfg_dict["attention_backend"] = attention_backend
    try:
        config = PoreFormerConfig.from_dict(cfg_dict)
        model = PoreFormer(config)
    except InputError as exc:
        raise InputError(exc.message, path=p) from exc
    try:
        state = load_file(str(p), device="cpu")
    except Exception as exc:
        raise InputError(f"cannot read the tensors ({exc})", path=p) from exc
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    problems = [f"missing {', '.join(missing)}"] if missing else []
    problems += [f"unexpected {', '.join(unexpected)}"] if unexpected else []
    problems += [
        f"{k}: file {tuple(v.shape)} vs model {tuple(expected[k].shape)}"
        for k, v in state.items()
        if k in expected and v.shape != expected[k].shape
    ]
    if problems:
        raise InputError("the tensors do not fit the stored config: " + "; ".join(problems),
                         path=p)
    model.load_state_dict(state, strict=True)
    if device is not None:
        model.to(device)
    return model.eval()
