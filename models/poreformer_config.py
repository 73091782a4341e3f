"""PoreFormer's hyper-parameters: one dataclass, saved inside every weights file.

The dataclass defaults are the shipped model; ``configs/model.yaml`` describes it field by field
and :meth:`PoreFormerConfig.from_yaml` reads it. A weights file stores the whole config it was
trained with, so changing a default never changes a trained model.
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

    # The full-resolution tokens and their inter-slice attention
    d_model: int = 64  # token width per voxel at full resolution
    n_heads: int = 4  # query heads of every attention block; head size = width / n_heads
    n_kv_heads: int | None = 1  # key/value heads of the full-resolution attention (1: multi-query)
    n_layers: int = 1  # attention blocks on the full-resolution tokens
    window: int | None = 8  # their look-back W: slice z attends to z-W+1..z; None = all earlier
    causal: bool = True  # a slice sees only itself and earlier slices (needed for streaming)
    attention_backend: str = "auto"  # "auto" | "flash" | "sdpa" | "math"; math is the reference
    dropout: float = 0.0  # on attention weights and residual branches, only while training
    # The per-slice 2D U-Net around them (all in-plane work, most of it at coarse scales)
    stem_channels: int = 16  # 3x3 conv features at full resolution
    level_channels: tuple[int, ...] = (32, 64, 64)  # channels at 1/2, 1/4, 1/8 resolution, ...
    level_attention: tuple[int, ...] = (0, 1, 1)  # inter-slice attention blocks at each level
    level_window: int | None = 24  # look-back of the coarse levels' attention
    level_dilation: int = 2  # dilation of the second 3x3 conv at the coarsest level
    mlp_ratio: float = 2.0  # MLP width of the coarse levels' attention blocks, per channel
    # The z-position encoding added into V
    pos_in_v: bool = True  # add the z-position encoding into V (False: no z encoding at all)
    pos_features: int = 16  # number of sinusoidal features of z (even: sin and cos pairs)
    pos_max_period: float = 10000.0  # longest sinusoid period, in slices
    check_finite: bool | None = None  # NaN/Inf guard per layer: None = on in training only

    def __post_init__(self) -> None:
        self.level_channels = tuple(int(c) for c in self.level_channels)
        self.level_attention = tuple(int(n) for n in self.level_attention)
        bad = []

        def need(ok: bool, msg: str) -> None:
            if not ok:
                bad.append(msg)

        need(self.d_model >= 1, f"d_model must be >= 1, got {self.d_model}")
        bad += attention_problems(self.d_model, self.n_heads, self.n_kv_heads, self.causal, self.window,
                                  self.dropout)
        need(self.n_layers >= 0, f"n_layers must be >= 0, got {self.n_layers}")
        need(self.stem_channels >= 1, f"stem_channels must be >= 1, got {self.stem_channels}")
        need(len(self.level_channels) >= 1 and all(c >= 1 for c in self.level_channels),
             f"level_channels needs at least one level, each >= 1, got {list(self.level_channels)}")
        need(len(self.level_attention) == len(self.level_channels) and all(n >= 0 for n in self.level_attention),
             f"level_attention needs one count >= 0 per level, got {list(self.level_attention)}")
        for c, n in zip(self.level_channels, self.level_attention):
            if n:
                bad += attention_problems(c, self.n_heads, None, self.causal, self.level_window, self.dropout)
        need(self.level_dilation >= 1, f"level_dilation must be >= 1, got {self.level_dilation}")
        need(self.mlp_ratio >= 0, f"mlp_ratio must be >= 0, got {self.mlp_ratio}")
        need(self.pos_features >= 2 and self.pos_features % 2 == 0,
             f"pos_features must be even and >= 2, got {self.pos_features}")
        need(self.pos_max_period > 1, f"pos_max_period must be > 1, got {self.pos_max_period}")
        if bad:
            raise InputError("bad PoreFormer config: " + "; ".join(dict.fromkeys(bad)))

    @property
    def n_levels(self) -> int:
        """Coarse levels of the 2D U-Net (level l has 1/2**l of the resolution)."""
        return len(self.level_channels)

    @property
    def align(self) -> int:
        """Tiles must start on multiples of this (the coarsest grid): ``2**n_levels``."""
        return 2**self.n_levels

    @property
    def halo(self) -> int:
        """In-plane receptive-field radius in full-resolution pixels (the tile halo), a multiple of :attr:`align`.

        Each 3x3 conv at level l reaches ``2**l`` pixels (times its dilation), a stride-2 conv
        into level l ``2**(l-1)``, and each bilinear upsampling from level l one level-l pixel.
        """
        r = 1  # the stem conv
        for lev in range(1, self.n_levels + 1):
            dil = self.level_dilation if lev == self.n_levels else 1
            r += 2 ** (lev - 1) + dil * 2**lev + 2**lev
        return -(-r // self.align) * self.align

    @property
    def z_reach(self) -> int | None:
        """How many earlier slices one slice's output depends on, or None where that is unbounded.

        Every convolution works within a slice; only the attention blocks mix slices, and each
        looks back ``W - 1`` slices (its window ``W``). The blocks run in series (the coarse levels'
        one after the other, the full-resolution blocks last), so the reach is their sum:
        ``2 * (24 - 1) + (8 - 1) = 53`` for the shipped model. A block that sees every earlier
        slice (window None), or a model that sees later slices (not causal), has no bounded reach.
        """
        windows = [self.level_window] * sum(self.level_attention) + [self.window] * self.n_layers
        if not self.causal or any(w is None for w in windows):
            return None
        return sum(int(w) - 1 for w in windows)

    @property
    def token_halo(self) -> int:
        """Pixels of full-resolution tokens a tile needs around its core: none (nothing mixes them in-plane)."""
        return 0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (tuples as lists)."""
        d = dataclasses.asdict(self)
        d["level_channels"] = list(self.level_channels)
        d["level_attention"] = list(self.level_attention)
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
        import yaml  # only needed here

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
