"""The check of a found sample's outer voxels against its inside (:class:`ctpore.data.rim.RimCheck`):
a container wall counted as sample has no pores, and where it is thinner than the shell the check
reads (a few voxels under the surface), the rim itself shows it."""

from __future__ import annotations

import numpy as np
import pytest

from ctpore.data.rim import RIM, RIM_SHARE, RimCheck


def core(pore_free_layer: int, porosity: float = 0.2, seed: int = 0):
    """(pores, outside) of 8 slices of a core of radius 40 in air whose pores are spread at random,
    but none in its outer ``pore_free_layer`` voxels (a wall of that thickness counted as sample)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.indices((96, 96))
    r = np.hypot(yy - 47.5, xx - 47.5)
    outside = np.broadcast_to(r > 40, (8, 96, 96)).copy()
    pores = (rng.random((8, 96, 96)) < porosity) & ~outside
    pores &= r <= 40 - pore_free_layer
    return pores, outside


def check(pores, outside) -> dict:
    rc = RimCheck()
    for p, o in zip(pores, outside):
        rc.add(p, o)
    return rc.result()


def test_a_core_with_pores_to_its_surface_passes():
    res = check(*core(0))
    assert not res["differs"]
    assert res["rim_porosity"] == pytest.approx(0.2, abs=0.03)
    assert res["inside_porosity"] == pytest.approx(0.2, abs=0.02)


@pytest.mark.parametrize("thickness", [RIM, RIM + 4])
def test_a_pore_free_wall_counted_as_sample_is_seen_in_the_rim_or_the_shell(thickness):
    res = check(*core(thickness))
    assert res["differs"]
    assert res["rim_porosity"] < RIM_SHARE * res["inside_porosity"]
    if thickness == RIM:  # the shell under the rim holds pores: only the rim shows the thin wall
        assert res["shell_porosity"] >= 0.25 * res["inside_porosity"]


def test_a_sample_almost_without_pores_is_not_judged():
    res = check(*core(RIM, porosity=0.01))
    assert not res["differs"]


@pytest.mark.parametrize("code", [2, 3])
def test_the_rim_is_judged_only_across_air(code):
    """Where the outside is a cut (code 2) or a wall touching the sample (code 3: its rim is cleared
    as air's is, but a wall's contact is no sign of a wall counted as sample), its outer voxels are
    not judged: a core whose left half faces air (code 1) and whose right half touches its tube,
    with no pore in the outer voxels of that right half, shows the rim's porosity of its left half
    only (0.2; half of that were the right half's rim judged too)."""
    pores, outside = core(0)
    right = np.zeros(outside.shape, bool)
    right[..., 48:] = True
    rim = ~outside & ~_deeper_than(outside, RIM)
    pores &= ~(right & rim)  # no pore in the right half's rim
    codes = np.where(outside, np.where(right, code, 1), 0).astype(np.uint8)
    res = check(pores, codes)
    assert res["rim_porosity"] == pytest.approx(0.2, abs=0.03) and not res["differs"]


def _deeper_than(outside: np.ndarray, depth: int) -> np.ndarray:
    """The voxels more than ``depth`` voxels (4-connected, in-slice) from ``outside``."""
    from scipy import ndimage as ndi

    return np.stack([ndi.binary_erosion(~o, iterations=depth, border_value=1) for o in outside])
