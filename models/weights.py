"""All weights in and out: safetensors only, the config and post-processing saved beside the tensors.

A PoreFormer weights file is a safetensors file whose metadata holds ``"config"`` (the
:class:`~ctpore.models.poreformer_config.PoreFormerConfig` as JSON), ``"format"``
(``"ctpore.poreformer"``), ``"ctpore_version"`` and any extra string metadata given to
:func:`save_weights`. A U-Net weights file holds its config dict under ``"config"``. Exported
weights also carry their post-processing (threshold, speck size, the probability calibration),
read back by :func:`read_postprocessing`. A training checkpoint
(:func:`save_checkpoint`) holds the model and optimizer tensors, with the step, config and history
as metadata. Pickle-based checkpoints (``.pt``, ``.pth``, ``.ckpt``, ...) are refused: unpickling
runs code from the file (the checks on a file before its tensors are used are
:mod:`ctpore.models.weights_checks`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from ctpore.atomic import atomic_write
from ctpore.data.postprocess import Postprocessing
from ctpore.errors import InputError
from ctpore.models.weights_checks import check_fit, check_safetensors

__all__ = [
    "FORMAT",
    "Postprocessing",
    "default_weights_path",
    "load_checkpoint",
    "load_for_inference",
    "load_model",
    "load_network",
    "load_unet",
    "read_metadata",
    "read_postprocessing",
    "save_checkpoint",
    "save_weights",
    "sha256_file",
    "weights_dir",
]

FORMAT = "ctpore.poreformer"
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


def weights_dir() -> Path:
    """The folder of the shipped weights (``models/weights``)."""
    return Path(__file__).resolve().parent / "weights"


def default_weights_path() -> Path | None:
    """The package's shipped weights, ``models/weights/poreformer.safetensors``, or None."""
    p = weights_dir() / "poreformer.safetensors"
    return p if p.is_file() else None


def save_weights(model: torch.nn.Module, path: str | Path, metadata: dict | None = None) -> Path:
    """Write a network's weights and config to a safetensors file, whole or not at all.

    Parameters
    ----------
    model : PoreFormer or U-Net
        Its ``state_dict()`` is saved (on CPU) and its ``config`` under ``"config"``: a PoreFormer's
        :class:`PoreFormerConfig` as JSON with ``"format"`` and ``"ctpore_version"``; a U-Net's
        config dict (``{"kind", "channels", "strides"}``) as JSON.
    path : str or Path
        Destination (its folder is created); written through :func:`ctpore.atomic.atomic_write`.
    metadata : dict, optional
        Extra metadata, string keys; values that are not strings are stored as JSON.
        ``config`` and ``format`` are reserved.

    Returns
    -------
    Path
        ``path``.
    """
    from safetensors.torch import save_file

    from ctpore.version import __version__

    config = getattr(model, "config", None)
    is_poreformer = hasattr(config, "to_json")
    if not is_poreformer and not (isinstance(config, dict) and "kind" in config):
        raise InputError(f"save_weights needs a PoreFormer or a U-Net, got {type(model).__name__}")
    meta: dict[str, str] = {}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str):
            raise InputError(f"metadata keys must be strings, got {key!r}")
        if key in ("config", "format"):
            raise InputError(f"metadata key {key!r} is reserved for ctpore")
        meta[key] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    if is_poreformer:
        meta.setdefault("ctpore_version", __version__)
        meta["format"] = FORMAT
        meta["config"] = config.to_json()
    else:
        meta["config"] = json.dumps(config)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(p) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
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
    from safetensors import safe_open

    p = check_safetensors(path)
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
    from safetensors.torch import load_file

    from ctpore.models.poreformer import PoreFormer
    from ctpore.models.poreformer_config import PoreFormerConfig

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
    check_fit(state, model.state_dict(), p, meta)
    model.load_state_dict(state, strict=True)
    if device is not None:
        model.to(device)
    return model.eval()


def load_unet(path: str | Path) -> torch.nn.Module:
    """Build a U-Net baseline from its safetensors weights file (in eval mode).

    Raises
    ------
    InputError
        For a missing or non-safetensors file, or one without a U-Net config.
    """
    from safetensors.torch import load_file

    from ctpore.models.unet import build_unet

    p = Path(path)
    if not p.exists():
        kind = p.stem
        raise InputError(f"no trained {kind} weights; train them with configs/train_{kind}.yaml", path=p)
    meta = read_metadata(p)
    config = meta.get("config")
    if not isinstance(config, dict) or "kind" not in config:
        raise InputError("the weights file holds no U-Net config", path=p)
    try:
        model = build_unet(config)
    except InputError as exc:
        raise InputError(exc.message, path=p) from None
    try:
        state = load_file(str(p), device="cpu")
    except Exception as exc:  # safetensors raises its own error types
        raise InputError(f"cannot read the tensors ({exc})", path=p) from exc
    check_fit(state, model.state_dict(), p, meta)
    model.load_state_dict(state)
    return model.eval()


def load_network(path: str | Path, device: str | torch.device | None = None) -> torch.nn.Module:
    """The network of any weights file this project writes (PoreFormer or a U-Net), in eval mode."""
    meta = read_metadata(path)
    if meta.get("format") == FORMAT:
        return load_model(path, device=device)
    model = load_unet(path)
    return model if device is None else model.to(device)


def read_postprocessing(path: str | Path, meta: dict | None = None) -> Postprocessing:
    """The post-processing stored with a weights file (defaults where it stores none).

    Parameters
    ----------
    path : str or Path
        The weights file (named in errors).
    meta : dict, optional
        Its metadata, when already read (:func:`read_metadata`).

    Raises
    ------
    InputError
        For a malformed stored value; the message says how to refit it.
    """
    meta = read_metadata(path) if meta is None else meta
    return Postprocessing.from_metadata(meta, path)


def load_for_inference(path: str | Path | None = None, device: str | torch.device | None = None,
                       attention_backend: str | None = None):
    """A PoreFormer ready to reconstruct: ``(model, metadata, Postprocessing, path)``.

    ``path`` None: the shipped weights (an :class:`InputError` says what to do when there are
    none). ``attention_backend`` overrides the stored one.
    """
    p = Path(path) if path is not None else default_weights_path()
    if p is None:
        raise InputError("no PoreFormer weights are installed; give --weights FILE.safetensors or use --method otsu")
    try:
        stat = p.resolve().stat()
    except OSError:
        stat = None  # load_model says what is wrong with the path
    if stat is None:
        model = load_model(p, device=device, attention_backend=attention_backend)
        meta = read_metadata(p)
        return model, meta, read_postprocessing(p, meta), p
    try:
        cached = _cached_for_inference(str(p.resolve()), stat.st_size, stat.st_mtime_ns, str(device),
                                       attention_backend)
    except InputError as exc:  # name the file as the user gave it, not its resolved path
        if exc.path is None or exc.path != p.resolve():
            raise
        raise InputError(exc.message, path=p) from None
    return cached + (p,)


@functools.lru_cache(maxsize=2)
def _cached_for_inference(path: str, size: int, mtime_ns: int, device: str, attention_backend: str | None):
    """The weights read once per process (a batch worker runs many scans with the same file);
    the key includes the file's size and modification time, so a changed file is read again."""
    model = load_model(path, device=None if device == "None" else device, attention_backend=attention_backend)
    meta = read_metadata(path)
    return model, meta, read_postprocessing(path, meta)


def save_checkpoint(path: str | Path, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int,
                    config: dict, history: list) -> None:
    """Write a training checkpoint: model and optimizer tensors, step, config and history as metadata."""
    from safetensors.torch import save_file

    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    osd = opt.state_dict()
    for idx, st in osd["state"].items():
        for k, v in st.items():
            t = v if torch.is_tensor(v) else torch.tensor(v)
            tensors[f"optim.{idx}.{k}"] = t.detach().cpu().contiguous()
    meta = {
        "step": str(step),
        "train_config": json.dumps(config),
        "param_groups": json.dumps(osd["param_groups"]),
        "history": json.dumps(history),
    }
    with atomic_write(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)


def load_checkpoint(path: str | Path, model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[int, list, dict]:
    """Load a checkpoint into ``model`` and ``opt``; return ``(step, history, train config dict)``."""
    from safetensors import safe_open

    p = check_safetensors(path)
    try:
        with safe_open(str(p), framework="pt") as fh:
            meta = fh.metadata() or {}
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    except Exception as exc:  # safetensors raises its own error types
        raise InputError(f"not a readable safetensors checkpoint ({exc})", path=p) from exc
    if not {"step", "param_groups", "history", "train_config"} <= set(meta):
        raise InputError("is not a ctpore training checkpoint (no step, optimizer or history metadata); "
                         "use another --run-dir or --no-resume", path=p)
    weights = {k[6:]: v for k, v in tensors.items() if k.startswith("model.")}
    check_fit(weights, model.state_dict(), p, what="model of this run's config",
               advice="; use another --run-dir or --no-resume")
    model.load_state_dict(weights)
    state: dict = {}
    for k, v in tensors.items():
        if k.startswith("optim."):
            _, idx, name = k.split(".", 2)
            state.setdefault(int(idx), {})[name] = v
    opt.load_state_dict({"state": state, "param_groups": json.loads(meta["param_groups"])})
    return int(meta["step"]), json.loads(meta["history"]), json.loads(meta["train_config"])
