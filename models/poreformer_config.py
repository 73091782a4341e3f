"""PoreFormer's hyper-parameters: one dataclass, saved inside every weights file.

The dataclass defaults are a plain base that a config overrides field by field; the model that
ships (and that ``ctpore bench speed`` times) is described in ``configs/model.yaml``, read by
:meth:`PoreFormerConfig.from_yaml` with no argument. A weights file stores the whole config it
was trained with, so changing a default never changes a trained model.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctpore.errors import InputError
from ctpore.models.attention import attention_problems

__all__ = ["PoreFormerConfig", "SHIPPED_CONFIG"]

#: The shipped model's config (``configs/model.yaml``).
SHIPPED_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "model.yaml"


@dataclass
class PoreFormerConfig:
    """PoreFormer's hyper-parameters; saved with the weights. The shipped model: ``from_yaml()``."""

    d_model: int = 64  # token width per voxel (small per-pixel features)
    n_heads: int = 4  # query heads; head size d_model / n_heads = 16
    n_kv_heads: int | None = None  # key/value heads for GQA (1 = MQA); None = n_heads
    n_layers: int = 2  # inter-slice attention blocks
    window: int | None = None  # look-back W: slice z attends to z-W+1..z; None = all earlier
    causal: bool = True  # a slice sees only itself and earlier slices (needed for streaming)
    attention_backend: str = "auto"  # "auto" | "flash" | "sdpa" | "math"; math is the reference
    dropout: float = 0.0  # on attention weights and residual branches, only while training
    encoder_channels: tuple[int, ...] = (16, 32)  # one k x k conv + GELU per entry, per slice
    encoder_kernel: int = 3  # odd kernel size of the encoder convs
    context_scale: int = 0  # in-plane context branch: average-pool factor (>= 2); 0 = off
    context_channels: tuple[int, ...] = (16, 32, 32)  # one 3x3 conv + GELU per entry, pooled
    context_dilations: tuple[int, ...] = (1, 2, 4)  # dilation of each context conv (pooled px)
    mlp_ratio: float = 1.0  # MLP hidden width = round(d_model * mlp_ratio)
    mlp_dwconv: bool = True  # in-plane depthwise conv inside each MLP (widens the halo)
    dwconv_kernel: int = 3  # odd kernel size of that depthwise conv
    pos_in_v: bool = True  # add the z-position encoding into V (False: no z encoding at all)
    pos_features: int = 16  # number of sinusoidal features of z (even: sin and cos pairs)
    pos_max_period: float = 10000.0  # longest sinusoid period, in slices
    check_finite: bool | None = None  # NaN/Inf guard per layer: None = on in training only

    def __post_init__(self) -> None:
        self.encoder_channels = tuple(int(c) for c in self.encoder_channels)
        self.context_channels = tuple(int(c) for c in self.context_channels)
        self.context_dilations = tuple(int(d) for d in self.context_dilations)
        bad = []

        def need(ok: bool, msg: str) -> None:
            if not ok:
                bad.append(msg)

        need(self.d_model >= 1, f"d_model must be >= 1, got {self.d_model}")
        bad += attention_problems(self.d_model, self.n_heads, self.n_kv_heads, self.causal, self.window,
                                  self.dropout)
        need(self.n_layers >= 0, f"n_layers must be >= 0, got {self.n_layers}")
        need(all(c >= 1 for c in self.encoder_channels),
             f"encoder_channels must be >= 1, got {list(self.encoder_channels)}")
        need(self.encoder_kernel >= 1 and self.encoder_kernel % 2 == 1,
             f"encoder_kernel must be odd, got {self.encoder_kernel}")
        need(self.dwconv_kernel >= 1 and self.dwconv_kernel % 2 == 1,
             f"dwconv_kernel must be odd, got {self.dwconv_kernel}")
        need(self.context_scale == 0 or self.context_scale >= 2,
             f"context_scale must be 0 (off) or an integer >= 2, got {self.context_scale}")
        if self.context_scale:
            need(len(self.context_channels) >= 1 and all(c >= 1 for c in self.context_channels),
                 f"context_channels must be >= 1, got {list(self.context_channels)}")
            need(len(self.context_dilations) == len(self.context_channels)
                 and all(d >= 1 for d in self.context_dilations),
                 "context_dilations needs one dilation >= 1 per context channel entry, got "
                 f"{list(self.context_dilations)}")
        need(self.mlp_ratio > 0, f"mlp_ratio must be > 0, got {self.mlp_ratio}")
        need(self.pos_features >= 2 and self.pos_features % 2 == 0,
             f"pos_features must be even and >= 2, got {self.pos_features}")
        need(self.pos_max_period > 1, f"pos_max_period must be > 1, got {self.pos_max_period}")
        if bad:
            raise InputError("bad PoreFormer config: " + "; ".join(bad))

    @property
    def encoder_reach(self) -> int:
        """In-plane radius, in pixels, of the full-resolution encoder convs."""
        return len(self.encoder_channels) * (self.encoder_kernel // 2)

    @property
    def context_reach(self) -> int:
        """In-plane radius, in pixels, of the pooled context branch (0 when it is off).

        A pixel's bilinear upsampling reads the pooled cells within one cell of its own; each
        pooled cell sees ``R = sum(dilations)`` cells around it (3x3 convs), and a cell spans
        ``context_scale`` pixels, so the reach is ``(R + 2) * scale - 1``.
        """
        if not self.context_scale:
            return 0
        return (sum(self.context_dilations) + 2) * self.context_scale - 1

    @property
    def block_reach(self) -> int:
        """In-plane radius, in pixels, of the blocks' depthwise convs (the token halo)."""
        return self.n_layers * (self.dwconv_kernel // 2) if self.mlp_dwconv else 0

    @property
    def align(self) -> int:
        """Tiles must start on multiples of this (the pooling grid); 1 without context."""
        return self.context_scale or 1

    @property
    def halo(self) -> int:
        """In-plane receptive-field radius in pixels (the tile halo for exact stitching).

        The block convs' reach plus the larger of the encoder's and the context branch's,
        rounded up to a multiple of :attr:`align` so tiles keep the pooling grid.
        """
        r = self.block_reach + max(self.encoder_reach, self.context_reach)
        return -(-r // self.align) * self.align

    @property
    def mlp_hidden(self) -> int:
        """Hidden width of each block's MLP."""
        return max(1, int(round(self.d_model * self.mlp_ratio)))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (tuples as lists)."""
        d = dataclasses.asdict(self)
        d["encoder_channels"] = list(self.encoder_channels)
        d["context_channels"] = list(self.context_channels)
        d["context_dilations"] = list(self.context_dilations)
        return d

    def to_json(self) -> str:
        """The config as a JSON string (what :mod:`ctpore.models.weights` stores)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PoreFormerConfig:
        """Build from a dict; unknown keys are an :class:`InputError`."""
        if not isinstance(d, dict):
            raise InputError(f"a PoreFormer config must be a mapping, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InputError(
                f"unknown PoreFormer config keys: {', '.join(unknown)}; known: "
                f"{', '.join(sorted(known))}"
            )
        return cls(**d)

    @classmethod
    def from_yaml(cls, path: str | Path | None = None) -> PoreFormerConfig:
        """Read a config from YAML (default: ``configs/model.yaml``, the shipped model).

        The file may hold the fields at top level or under a ``model:`` key.
        """
        import yaml  # noqa: PLC0415 (only needed here)

        p = Path(path) if path is not None else SHIPPED_CONFIG
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8"))
        except OSError as exc:
            raise InputError(f"cannot read the model config ({exc.strerror})", path=p) from exc
        except yaml.YAMLError as exc:
            raise InputError(f"not valid YAML ({exc})", path=p) from exc
        if isinstance(data, dict) and "model" in data and isinstance(data["model"], dict):
            data = data["model"]
        try:
            return cls.from_dict(data or {})
        except InputError as exc:
            raise InputError(exc.message, path=p) from exc
