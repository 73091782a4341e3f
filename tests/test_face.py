"""The air beyond a sawn or broken core's face (:mod:`ctpore.data.face`), against the segment of the
circle a straight cut leaves, computed analytically."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import ndimage as ndi

from ctpore.data.face import FACE_SHRINK, air_face
from ctpore.data.profiles import Cylinder

R, CY, CX, PX = 40.0, 60.0, 66.0, 0.01
AIR, MATERIAL = 200.0, 1000.0


def _slices(solid: np.ndarray, seed: int = 3):
    rng = np.random.default_rng(seed)
    scan = ndi.gaussian_filter(np.where(solid, MATERIAL, AIR), (0, 1.0, 1.0)) + rng.normal(0, 60, solid.shape)
    return [s.astype(np.float32) for s in scan]


def _face(slices):
    c = Cylinder((CY * PX, CX * PX), (0.0, 0.0), R * PX, 0.0)
    return air_face(slices, [None] * len(slices), np.arange(len(slices)), (PX, PX, PX), c,
                    AIR + 0.25 * (MATERIAL - AIR), 1.5 * PX)


def _grid(nz: int = 8):
    _, yy, xx = np.indices((nz, 128, 128)).astype(float)
    return yy - CY, xx - CX


@pytest.mark.parametrize("d, turn", [(-15, 0), (0, 70), (10, 200), (22, 315)])
def test_the_air_beyond_a_straight_cut_is_its_segment_of_the_circle(d, turn):
    """A core cut along its axis ``d`` voxels from it (the material on the axis' side where ``d`` > 0):
    the air found beyond the face is the segment of the circle (less its blurred rim) that the cut
    leaves, as its area gives it."""
    y, x = _grid()
    u = y * math.cos(math.radians(turn)) + x * math.sin(math.radians(turn))
    found = _face(_slices((np.hypot(y, x) <= R) & (u <= d)))
    assert found is not None
    r = R - FACE_SHRINK
    segment = (math.acos(d / r) - d / r * math.sqrt(1 - (d / r) ** 2)) / math.pi
    assert abs(found["share"] - segment) <= 0.03, (found, segment)
    assert found["segment_iou"] >= 0.95


@pytest.mark.parametrize("hole", ["round", "slot", "none"])
def test_pores_open_at_the_surface_are_no_face(hole):
    """A round vesicle centred on the surface, 40 voxels across, or a slot 24 wide and 25 deep with a
    flat bottom (straight, but its air is no segment of the circle): no face. Nor a whole core."""
    y, x = _grid()
    solid = np.hypot(y, x) <= R
    if hole == "round":
        solid &= np.hypot(y - R, x) > 20
    elif hole == "slot":
        solid &= ~((np.abs(x) <= 12) & (y >= R - 25))
    assert _face(_slices(solid)) is None

