"""A layer without pores under a core's found surface (:mod:`ctpore.data.layer`): a tube as grey as
the material pressed against the core is found by the pores it lacks, to within a pixel and a half of its
true thickness (erring inwards), and a core's own outer band poor in pores, or a core in air, keeps its
surface."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage as ndi

from ctpore.data.layer import pore_free_layer, take_pore_free_layer, wall_has_pores
from ctpore.data.profiles import Cylinder

N, R = 128, 52.0  # slice size and the outer surface's radius (pixels)
LEVELS = {"air": 0.0, "material": 1.0}
GRID = (1.0, 1.0, 1.0)


def scan(wall: float, wall_level: float = 0.85, band: float = 0.0, seed: int = 0, noise: float = 0.08,
         density: float = 0.025):
    """8 slices of a core (pores 5 pixels across, a porosity near 0.3) inside a ring ``wall``
    pixels thick of grey ``wall_level`` touching it, in air; ``band``: the pores' density rising
    linearly from 0 at the core's surface to the full one that many pixels under it (a core's own
    outer band poor in pores; ``density``: of the pores' seeds, 0.025 a porosity near 0.3). Blurred by a
    pixel, with noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.indices((N, N))
    r = np.hypot(yy - (N - 1) / 2, xx - (N - 1) / 2)
    core_r = R - wall
    out = []
    for _ in range(8):
        seeds = rng.random((N, N)) < density
        if band > 0:
            seeds &= rng.random((N, N)) < np.clip((core_r - r) / band, 0.0, 1.0)
        pores = ndi.binary_dilation(seeds, iterations=2)
        sl = np.where(r <= core_r, np.where(pores, 0.0, 1.0), np.where(r <= R, wall_level, 0.0))
        out.append(ndi.gaussian_filter(sl, 1.0) + rng.normal(0, noise, sl.shape))
    return [s.astype(np.float32) for s in out]


CYL = Cylinder(((N - 1) / 2, (N - 1) / 2), (0.0, 0.0), R, 0.0)


@pytest.mark.parametrize("wall", [3.0, 4.5, 6.0])
@pytest.mark.parametrize("level", [0.85, 1.0, 1.3])
def test_a_pore_free_wall_is_found_to_within_a_pixel_and_a_half_erring_inwards(wall, level):
    """The pores next to the wall are brightened by the blur: the core seems to begin up to a pixel
    and a half deeper than it does (the sample is found inwards, never outwards by over half a pixel)."""
    slices = scan(wall, level)
    found = pore_free_layer(slices, [None] * 8, list(range(8)), CYL, LEVELS, GRID)
    assert found is not None
    thickness, grey = found
    assert -0.5 <= thickness - wall <= 1.5, (thickness, wall)
    assert abs(grey - level) < 0.3  # its grey level (a thin one blurred with the air and the core)


def test_a_wall_around_a_core_with_few_pores_is_found():
    """A core with a dark share of 0.04 inside, as a core of thin tubes has: its pores still show the wall."""
    slices = scan(5.0, density=0.006)
    found = pore_free_layer(slices, [None] * 8, list(range(8)), CYL, LEVELS, GRID)
    assert found is not None and -0.5 <= found[0] - 5.0 <= 1.5, found


@pytest.mark.parametrize("band", [0.0, 6.0, 12.0])
def test_a_core_in_air_or_with_an_outer_band_poor_in_pores_keeps_its_surface(band):
    slices = scan(0.0, band=band)
    assert pore_free_layer(slices, [None] * 8, list(range(8)), CYL, LEVELS, GRID) is None


def test_a_thick_wall_is_left_to_the_walls_own_fit():
    """A layer deeper than the rule reads (12 pixels) is not taken for a tube pressed on the core."""
    slices = scan(12.0)
    assert pore_free_layer(slices, [None] * 8, list(range(8)), CYL, LEVELS, GRID) is None


def test_a_core_almost_without_pores_is_not_judged():
    rng = np.random.default_rng(1)
    yy, xx = np.indices((N, N))
    r = np.hypot(yy - (N - 1) / 2, xx - (N - 1) / 2)
    slices = [(np.where(r <= R, 1.0, 0.0) + rng.normal(0, 0.08, (N, N))).astype(np.float32) for _ in range(8)]
    assert pore_free_layer(slices, [None] * 8, list(range(8)), CYL, LEVELS, GRID) is None


def test_the_layer_becomes_the_wall_and_the_sample_the_cylinder_within_it():
    from ctpore.data.envelope import Envelope

    env = Envelope("cylinder", cylinder=CYL, levels=dict(LEVELS), zs=tuple(range(8)))
    assert take_pore_free_layer(env, scan(5.0), [None] * 8, GRID)
    assert abs(env.cylinder.radius_mm - (R - 5.0)) <= 1.0
    assert env.wall["r_out"] == R and env.wall["r_in"] == pytest.approx(env.cylinder.radius_mm)
    assert env.wall["thickness_mm"] == pytest.approx(R - env.cylinder.radius_mm)
    assert env.note("a layer without pores at the surface") is not None
    assert not take_pore_free_layer(env, scan(5.0), [None] * 8, GRID)  # a wall is there now


def _ring_slices(level: float, noise: float, pores: bool, seed: int = 1):
    """6 slices of a ring 8 pixels thick of grey ``level`` (air 0, a core of 1 inside it); ``pores``:
    with pores 7 pixels across, as dark as the air, in about a fifth to a third of it. Blurred by a
    pixel, with noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.indices((N, N))
    r = np.hypot(yy - (N - 1) / 2, xx - (N - 1) / 2)
    out = []
    for _ in range(6):
        holes = np.zeros((N, N), bool)
        if pores:
            holes = ndi.binary_dilation(rng.random((N, N)) < 0.006, np.ones((3, 3), bool), iterations=3)
        sl = np.where((r > R - 8) & (r <= R) & ~holes, level, np.where(r < R - 8, 1.0, 0.0))
        out.append((ndi.gaussian_filter(sl, 1.0) + rng.normal(0, noise, sl.shape)).astype(np.float32))
    return out


RING = {"outer": Cylinder(((N - 1) / 2, (N - 1) / 2), (0.0, 0.0), R, 0.0), "r_out": R, "r_in": R - 8}


@pytest.mark.parametrize("level, noise", [(0.9, 0.08), (0.45, 0.08), (0.45, 0.25), (1.6, 0.3)])
def test_a_uniform_wall_holds_no_pores(level, noise):
    """wall_has_pores: a uniform ring, bright or grey, at any noise, holds none (its dark voxels are
    the ones its own scatter puts below halfway from the air)."""
    for seed in (1, 2, 3):
        assert not wall_has_pores(RING, _ring_slices(level, noise, False, seed), [None] * 6, range(6), GRID, 0.0)


@pytest.mark.parametrize("level, noise", [(0.9, 0.08), (0.45, 0.08), (1.6, 0.3)])
def test_a_layer_with_pores_as_dark_as_the_air_is_no_wall(level, noise):
    """wall_has_pores: the same rings with pores as dark as the air (a grain pack's outer part taken for
    a wall) hold them. (A grey ring whose halfway to the air lies within about two of its scatters, 0.45
    at a noise of 0.25 here, is not told apart so: its pores widen its scatter as much as they darken it.)"""
    for seed in (1, 2, 3):
        assert wall_has_pores(RING, _ring_slices(level, noise, True, seed), [None] * 6, range(6), GRID, 0.0)
