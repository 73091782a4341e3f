"""Helpers several test files share (pytest puts this folder on sys.path: ``from helpers import ...``)."""

from __future__ import annotations

import numpy as np
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


def blob_volume(dtype=np.uint16, shape=(10, 12, 14), seed=0) -> np.ndarray:
    """A small scan ``(Z, Y, X)``: two blobs of low values (pores) in a noisy bright solid (uint8:
    the same divided by 256)."""
    rng = np.random.default_rng(seed)
    z, y, x = np.indices(shape)
    vol = 40000 + rng.integers(0, 8000, shape)
    vol[(z - 4) ** 2 + (y - 5) ** 2 + (x - 5) ** 2 < 10] = 9000
    vol[(z - 6) ** 2 + (y - 8) ** 2 + (x - 10) ** 2 < 6] = 12000
    if np.dtype(dtype) == np.uint8:
        vol //= 256
    return vol.astype(dtype)


def write_nifti(path, vol: np.ndarray, spacing_mm) -> object:
    """``vol`` (Z, Y, X) as a NIfTI with ``spacing_mm`` (z, y, x) in mm, as scanners' exports are
    (x fastest); the twin a new format's reader is checked against. Returns ``path``."""
    import nibabel as nib

    img = nib.Nifti1Image(vol.transpose(2, 1, 0), np.diag([spacing_mm[2], spacing_mm[1], spacing_mm[0], 1.0]))
    img.header.set_xyzt_units("mm")
    nib.save(img, str(path))
    return path
