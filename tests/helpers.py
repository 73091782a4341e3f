"""Helpers several test files share (pytest puts this folder on sys.path: ``from helpers import ...``)."""

from __future__ import annotations

import pytest

from ctpore.app.cli import main
from ctpore.models import PoreFormerConfig


def run_cli(args, capsys):
    """Run the ctpore command in-process; return (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def small(**kw) -> PoreFormerConfig:
    """A PoreFormer small enough for a test (every part present: levels, blocks, grouped heads)."""
    base = dict(d_model=32, n_heads=4, n_layers=2, stem_channels=4, level_channels=(8, 16),
                level_attention=(0, 1), window=5, n_kv_heads=2)
    base.update(kw)
    return PoreFormerConfig(**base)
