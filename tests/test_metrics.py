"""Tests for ctpore.data.metrics against analytic truth, skimage, and a literal BoneJ port."""

from __future__ import annotations

import json

import numpy as np
import pytest
import skimage.measure
from hypothesis import given, settings
from hypothesis import strategies as st

from ctpore.errors import InputError, NonFiniteError
from ctpore.data.metrics import (
    check_binary,
    comparison_metrics,
    connectivity_density,
    connectivity_index,
    euler_number,
    n_components,
    porosity,
    volume_metrics,
)

BOTH = (6, 26)


def ball(shape, centre, radius):
    zz, yy, xx = np.indices(shape)
    c = np.asarray(centre)
    return ((zz - c[0]) ** 2 + (yy - c[1]) ** 2 + (xx - c[2]) ** 2) <= radius**2


# --------------------------------------------------------------------------------------------
# Euler number: analytic cases
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("conn", BOTH)
def test_solid_cube_has_chi_1(conn):
    v = np.zeros((8, 9, 10), np.uint8)
    v[2:6, 2:7, 3:8] = 1
    assert euler_number(v, conn) == 1
    assert n_components(v, conn) == 1


@pytest.mark.parametrize("conn", BOTH)
def test_cube_filling_whole_volume_has_chi_1(conn):
    # the volume is treated as surrounded by solid, so an all-pore volume is one solid block
    assert euler_number(np.ones((4, 5, 6), bool), conn) == 1


@pytest.mark.parametrize("conn", BOTH)
def test_empty_volume_has_chi_0(conn):
    v = np.zeros((5, 5, 5), np.uint8)
    assert euler_number(v, conn) == 0
    assert n_components(v, conn) == 0


@pytest.mark.parametrize("conn", BOTH)
def test_pore_cube_with_solid_inclusion_has_chi_2(conn):
    # pore phase = a shell around an enclosed solid island: 1 component + 1 cavity = 2
    v = np.zeros((9, 9, 9), np.uint8)
    v[1:8, 1:8, 1:8] = 1
    v[3:6, 3:6, 3:6] = 0
    assert euler_number(v, conn) == 2


@pytest.mark.parametrize("conn", BOTH)
def test_pore_ball_with_solid_inclusion_has_chi_2(conn):
    v = ball((21, 21, 21), (10, 10, 10), 8.5) & ~ball((21, 21, 21), (10, 10, 10), 3.5)
    assert euler_number(v, conn) == 2


@pytest.mark.parametrize("conn", BOTH)
def test_square_solid_torus_has_chi_0(conn):
    v = np.zeros((7, 13, 13), np.uint8)
    v[2:5, 2:11, 2:11] = 1
    v[2:5, 5:8, 5:8] = 0  # hole through the slab: a thick square ring
    assert euler_number(v, conn) == 0


@pytest.mark.parametrize("conn", BOTH)
def test_round_solid_torus_has_chi_0(conn):
    # (sqrt(x^2 + y^2) - R)^2 + z^2 <= r^2 with R = 8, r = 3: thick enough that the
    # digitisation has no diagonal-only contacts, so both connectivities see one torus
    zz, yy, xx = np.indices((11, 27, 27)) - np.array([5, 13, 13])[:, None, None, None]
    v = (np.hypot(yy, xx) - 8.0) ** 2 + zz**2 <= 3.0**2
    assert euler_number(v, conn) == 0
    assert n_components(v, conn) == 1


@pytest.mark.parametrize("conn", BOTH)
def test_two_disjoint_balls_have_chi_2(conn):
    v = ball((12, 12, 24), (6, 6, 6), 4) | ball((12, 12, 24), (6, 6, 17), 4)
    assert euler_number(v, conn) == 2
    assert n_components(v, conn) == 2


@pytest.mark.parametrize("conn", BOTH)
def test_pore_cube_with_one_and_two_solid_tunnels(conn):
    v = np.zeros((9, 9, 9), np.uint8)
    v[1:8, 1:8, 1:8] = 1
    v[4, 4, :] = 0  # a solid bar through the pore cube along x: one tunnel, chi = 1 - 1
    assert euler_number(v, conn) == 0
    v[2, :, 4] = 0  # a second, disjoint bar along y (different z): chi = 1 - 2
    assert euler_number(v, conn) == -1


@pytest.mark.parametrize(
    "other, expected",
    [
        ((0, 1, 1), {26: 1, 6: 2}),  # shares only an edge with (0, 0, 0)
        ((1, 1, 1), {26: 1, 6: 2}),  # shares only a corner
        ((0, 0, 1), {26: 1, 6: 1}),  # shares a face: the same for both
    ],
)
def test_diagonal_contacts_depend_on_connectivity(other, expected):
    v = np.zeros((2, 2, 2), np.uint8)
    v[0, 0, 0] = 1
    v[other] = 1
    for conn in BOTH:
        assert euler_number(v, conn) == expected[conn]
        assert n_components(v, conn) == expected[conn]


def test_diagonal_cubes_depend_on_connectivity():
    # two 2x2x2 cubes meeting at one corner point
    v = np.zeros((4, 4, 4), np.uint8)
    v[:2, :2, :2] = 1
    v[2:, 2:, 2:] = 1
    assert euler_number(v, 26) == 1
    assert euler_number(v, 6) == 2


def test_diagonal_diamond_is_a_loop_only_with_26_connectivity():
    # four voxels around an empty centre, each touching the next along an edge only:
    # 26-connected they form one ring (chi = 1 - 1 = 0); 6-connected, four separate voxels
    v = np.zeros((1, 3, 3), np.uint8)
    v[0, 0, 1] = v[0, 1, 0] = v[0, 1, 2] = v[0, 2, 1] = 1
    assert euler_number(v, 26) == 0
    assert euler_number(v, 6) == 4
    assert n_components(v, 26) == 1
    assert n_components(v, 6) == 4


@pytest.mark.parametrize("k", [1, 3, 5])
def test_n_components_of_k_separated_balls(k):
    shape = (12, 12, 12 * k)
    v = np.zeros(shape, bool)
    for i in range(k):
        v |= ball(shape, (6, 6, 6 + 12 * i), 4)
    for conn in BOTH:
        assert n_components(v, conn) == k
        assert euler_number(v, conn) == k


# --------------------------------------------------------------------------------------------
# Euler number: agreement with skimage
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("density", [0.1, 0.3, 0.5, 0.7, 0.9])
@pytest.mark.parametrize("seed", [0, 1])
def test_euler_matches_skimage_on_random_volumes(density, seed):
    rng = np.random.default_rng(seed)
    v = rng.random((24, 31, 29)) < density
    assert euler_number(v, 26) == skimage.measure.euler_number(v, connectivity=3)
    assert euler_number(v, 6) == skimage.measure.euler_number(v, connectivity=1)


@settings(max_examples=150, deadline=None)
@given(
    shape=st.tuples(*[st.integers(1, 7)] * 3),
    density=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_euler_matches_skimage_hypothesis(shape, density, seed):
    v = (np.random.default_rng(seed).random(shape) < density).astype(np.uint8)
    assert euler_number(v, 26) == skimage.measure.euler_number(v, connectivity=3)
    assert euler_number(v, 6) == skimage.measure.euler_number(v, connectivity=1)


def test_euler_on_volume_larger_than_one_slab():
    # 300 x 300 planes: the configuration histogram is built in several z-slabs
    rng = np.random.default_rng(3)
    v = rng.random((100, 300, 300)) < 0.4
    assert euler_number(v, 26) == skimage.measure.euler_number(v, connectivity=3)


# --------------------------------------------------------------------------------------------
# Connectivity density (BoneJ)
# --------------------------------------------------------------------------------------------
# BoneJ: delta_chi = chi - (chi2 / 2 + chi1 / 4 + chi0 / 8), connectivity = 1 - delta_chi,
# density = connectivity / (Z * Y * X * voxel volume). chi is the Euler characteristic of the
# pore phase (closed voxel cubes) inside the stack; chi2, chi1, chi0 those of the pore phase on
# the stack's boundary surface, on its 12 edges, and the number of pore stack corners. A cut
# face is shared with 2 neighbouring samples, a stack edge with 4, a corner with 8.


def test_connectivity_rod_through_sample():
    # A straight pore channel along z from z = 0 to z = Z, away from the stack's side faces.
    # chi = 1 (a rod); on the boundary it shows as 2 separate unit squares (top, bottom):
    # chi2 = 2, chi1 = chi0 = 0. delta_chi = 1 - 2/2 = 0: in the infinite structure a straight
    # rod adds nothing to the Euler characteristic. BoneJ's connectivity = 1 - 0 = 1.
    v = np.zeros((5, 5, 5), np.uint8)
    v[:, 2, 2] = 1
    assert connectivity_index(v) == 1.0
    assert connectivity_density(v) == pytest.approx(1 / 125)


def test_connectivity_rod_along_stack_edge():
    # The same rod run along the stack edge (y = 0, x = 0). chi = 1.
    # Faces: x = 0 and y = 0 each hold a 1 x Z strip (chi 1), z = 0 and z = Z a unit square:
    # sum over faces = 4. Edges: the z-edge (y=0, x=0) holds the whole rod (1) and the four
    # edges through the two touched corners hold one unit segment each: sum = 5. Corners: 2.
    # chi2 = 4 - 5 + 2 = 1 (one folded disc), chi1 = 5 - 2*2 = 1 (a tree), chi0 = 2.
    # correction = 1/2 + 1/4 + 2/8 = 1, so delta_chi = 0 again and connectivity = 1.
    v = np.zeros((4, 4, 4), np.uint8)
    v[:, 0, 0] = 1
    assert connectivity_index(v) == 1.0


def test_connectivity_ball_inside_is_zero():
    # A ball that touches no stack face: no correction, delta_chi = chi = 1, so 1 - 1 = 0.
    v = ball((11, 11, 11), (5, 5, 5), 4)
    assert connectivity_index(v) == 0.0
    assert connectivity_density(v) == 0.0


def test_connectivity_torus_inside_is_one_loop():
    # A ring inside the stack: chi = 0, delta_chi = 0, connectivity = 1 = one loop.
    v = np.zeros((7, 13, 13), np.uint8)
    v[2:5, 2:11, 2:11] = 1
    v[2:5, 5:8, 5:8] = 0
    assert connectivity_index(v) == 1.0


def test_connectivity_window_grid_counts_its_loops():
    # A flat 7 x 7 grid of rods shaped like a window with 2 x 2 panes (a frame plus a cross),
    # inside the stack. It is one component with 4 holes: chi = 1 - 4 = -3 (for both
    # connectivities: all contacts are face contacts). No boundary contact, so
    # delta_chi = -3 and connectivity = 1 - (-3) = 4, the number of loops.
    v = np.zeros((5, 9, 9), np.uint8)
    g = v[2, 1:8, 1:8]
    g[[0, 3, 6], :] = 1
    g[:, [0, 3, 6]] = 1
    assert euler_number(v, 26) == -3
    assert euler_number(v, 6) == -3
    assert connectivity_index(v) == 4.0
    assert connectivity_density(v) == pytest.approx(4 / (5 * 9 * 9))


def test_connectivity_lattice_node():
    # Three rods crossing at the centre, each running from face to face ("jack"): the unit
    # cell of a cubic lattice of rods. chi = 1 (a tree); it meets the 6 faces in 6 separate
    # unit squares, chi2 = 6, no edges or corners. delta_chi = 1 - 6/2 = -2: per cell the
    # lattice has 1 node and 3 rods, chi = 1 - 3 = -2. BoneJ: connectivity = 1 - (-2) = 3.
    v = np.zeros((5, 5, 5), np.uint8)
    v[:, 2, 2] = v[2, :, 2] = v[2, 2, :] = 1
    assert connectivity_index(v) == 3.0


def test_connectivity_all_pore_sample():
    # All pore: chi = 1; boundary = the whole cube surface, chi2 = 2 (a sphere);
    # chi1 = 8 vertices - 12 edges = -4; chi0 = 8. correction = 1 - 1 + 1 = 1 -> delta_chi = 0.
    assert connectivity_index(np.ones((3, 4, 5), np.uint8)) == 1.0


def test_connectivity_negative_is_reported_not_clipped():
    # Three separate balls inside: chi = 3 = delta_chi, so BoneJ's connectivity is 1 - 3 = -2.
    shape = (10, 10, 30)
    v = ball(shape, (5, 5, 5), 3) | ball(shape, (5, 5, 15), 3) | ball(shape, (5, 5, 25), 3)
    assert connectivity_index(v) == -2.0
    assert connectivity_density(v) == pytest.approx(-2 / 3000)


def test_connectivity_of_empty_volume_is_zero():
    # documented deviation from BoneJ (which would report 1 / volume for no pores at all)
    assert connectivity_density(np.zeros((4, 4, 4), np.uint8)) == 0.0


def test_connectivity_density_scales_with_voxel_volume():
    v = np.zeros((7, 13, 13), np.uint8)
    v[2:5, 2:11, 2:11] = 1
    v[2:5, 5:8, 5:8] = 0  # connectivity 1
    spacing = (0.02, 0.005, 0.004)
    expected = 1.0 / (7 * 13 * 13 * 0.02 * 0.005 * 0.004)
    assert connectivity_density(v, spacing) == pytest.approx(expected, rel=1e-12)
    rng = np.random.default_rng(5)
    r = rng.random((12, 10, 14)) < 0.5
    assert connectivity_density(r, spacing) * np.prod(spacing) == pytest.approx(
        connectivity_density(r), rel=1e-12
    )


def _bonej_correct_for_edges(stack: np.ndarray) -> float:
    """Literal port of BoneJ's legacy Connectivity.correctForEdges (org.doube.bonej).

    Loops as in the Java source (getStackVertices, getStackEdges, getStackFaces,
    getFaceVertices, getFaceEdges, getEdgeVertices); zero outside the stack. Needs every
    dimension >= 2, like the original.
    """
    depth, height, width = stack.shape

    def px(x, y, z):
        inside = 0 <= x < width and 0 <= y < height and 0 <= z < depth
        return 1 if inside and stack[z, y, x] else 0

    zs, ys, xs = (0, depth - 1), (0, height - 1), (0, width - 1)
    f = sum(px(x, y, z) for z in zs for y in ys for x in xs)

    n_stack_edges = 0
    for z in zs:
        for y in ys:
            n_stack_edges += sum(px(x, y, z) for x in range(1, width - 1))
        for x in xs:
            n_stack_edges += sum(px(x, y, z) for y in range(1, height - 1))
    for y in ys:
        for x in xs:
            n_stack_edges += sum(px(x, y, z) for z in range(1, depth - 1))

    n_stack_faces = 0
    for z in zs:
        n_stack_faces += sum(
            px(x, y, z) for y in range(1, height - 1) for x in range(1, width - 1)
        )
    for y in ys:
        n_stack_faces += sum(
            px(x, y, z) for z in range(1, depth - 1) for x in range(1, width - 1)
        )
    for x in xs:
        n_stack_faces += sum(
            px(x, y, z) for y in range(1, height - 1) for z in range(1, depth - 1)
        )

    a = 0  # getFaceVertices
    for z in zs:
        for y in range(height + 1):
            for x in range(width + 1):
                a += bool(px(x, y, z) or px(x, y - 1, z) or px(x - 1, y - 1, z) or px(x - 1, y, z))
    for x in xs:
        for y in range(height + 1):
            for z in range(1, depth):
                a += bool(px(x, y, z) or px(x, y - 1, z) or px(x, y - 1, z - 1) or px(x, y, z - 1))
    for y in ys:
        for x in range(1, width):
            for z in range(1, depth):
                a += bool(px(x, y, z) or px(x, y, z - 1) or px(x - 1, y, z - 1) or px(x - 1, y, z))

    b = 0  # getFaceEdges
    for z in zs:
        for y in range(height + 1):
            for x in range(width + 1):
                if px(x, y, z):
                    b += 2
                else:
                    b += px(x, y - 1, z) + px(x - 1, y, z)
    for y in ys:
        for z in range(1, depth):
            for x in range(width):
                b += bool(px(x, y, z) or px(x, y, z - 1))
        for z in range(depth):
            for x in range(width + 1):
                b += bool(px(x, y, z) or px(x - 1, y, z))
    for x in xs:
        for z in range(1, depth):
            for y in range(height):
                b += bool(px(x, y, z) or px(x, y, z - 1))
        for z in range(depth):
            for y in range(1, height):
                b += bool(px(x, y, z) or px(x, y - 1, z))

    n_edge_vertices = 0  # getEdgeVertices
    for z in zs:
        for y in ys:
            n_edge_vertices += sum(bool(px(x, y, z) or px(x - 1, y, z)) for x in range(1, width))
        for x in xs:
            n_edge_vertices += sum(bool(px(x, y, z) or px(x, y - 1, z)) for y in range(1, height))
    for x in xs:
        for y in ys:
            n_edge_vertices += sum(bool(px(x, y, z) or px(x, y, z - 1)) for z in range(1, depth))

    e = n_stack_edges + 3 * f
    c = n_stack_faces + 2 * e - 3 * f
    d = n_edge_vertices + f
    chi_zero, chi_one, chi_two = f, d - e, a - b + c
    return chi_two / 2 + chi_one / 4 + chi_zero / 8


@settings(max_examples=120, deadline=None)
@given(
    shape=st.tuples(*[st.integers(2, 6)] * 3),
    density=st.floats(0.05, 1.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_connectivity_matches_literal_bonej_port(shape, density, seed):
    v = (np.random.default_rng(seed).random(shape) < density).astype(np.uint8)
    if not v.any():
        return  # the empty volume is the documented deviation, tested above
    delta_chi = skimage.measure.euler_number(v, connectivity=3) - _bonej_correct_for_edges(v)
    assert connectivity_index(v) == 1.0 - delta_chi


@settings(max_examples=80, deadline=None)
@given(
    shape=st.tuples(*[st.integers(1, 8)] * 3),
    density=st.floats(0.05, 1.0),
    seed=st.integers(0, 2**32 - 1),
    perm=st.permutations([0, 1, 2]),
    flips=st.tuples(st.booleans(), st.booleans(), st.booleans()),
)
def test_connectivity_is_invariant_under_cube_symmetries(shape, density, seed, perm, flips):
    # Topology does not care how the sample is turned: any axis permutation and flip (the 48
    # symmetries of the cube) must give the same connectivity and Euler numbers. This checks
    # that every face, edge and corner of the stack is treated alike, including 1-voxel dims.
    v = np.random.default_rng(seed).random(shape) < density
    w = np.transpose(v, perm)
    w = w[tuple(slice(None, None, -1) if f else slice(None) for f in flips)]
    assert connectivity_index(w) == connectivity_index(v)
    for conn in BOTH:
        assert euler_number(w, conn) == euler_number(v, conn)


# Note: delta-chi is NOT additive over a cut of a voxel volume into blocks (neither here nor in
# BoneJ): a pore voxel across the cut touches the shared face, which the block on the other
# side cannot see. So no such property is tested.


# --------------------------------------------------------------------------------------------
# volume_metrics, porosity
# --------------------------------------------------------------------------------------------


def test_porosity_hand_counted():
    v = np.zeros((2, 2, 5), np.uint8)
    v[0, 0, :3] = 1
    assert porosity(v) == 3 / 20
    assert porosity(v.astype(bool)) == 3 / 20


def test_volume_metrics_keys_types_and_values():
    # two balls and a diagonal pair of voxels that only 26-connectivity joins
    shape = (12, 12, 30)
    v = ball(shape, (6, 6, 6), 4) | ball(shape, (6, 6, 17), 4)
    v[0, 0, 28] = v[1, 1, 29] = True
    m = volume_metrics(v, spacing_mm=(0.5, 0.5, 0.5))
    assert set(m) == {
        "porosity",
        "euler_number",
        "euler_number_6",
        "connectivity_density_per_mm3",
        "n_pores",
        "n_tunnels",
        "n_cavities",
        "sample_voxels",
    }
    assert m["sample_voxels"] == v.size  # no sample mask: every voxel
    assert m["n_tunnels"] == 0 and m["n_cavities"] == 0  # three solid-free blobs: no loop, no cavity
    assert type(m["porosity"]) is float and type(m["connectivity_density_per_mm3"]) is float
    assert type(m["euler_number"]) is int and type(m["euler_number_6"]) is int
    assert type(m["n_pores"]) is int
    json.dumps(m)
    assert m["porosity"] == pytest.approx(v.sum() / v.size)
    assert m["euler_number"] == 3 and m["euler_number_6"] == 4 and m["n_pores"] == 3
    # the diagonal pair touches the stack faces; the whole must agree with the single function
    assert m["connectivity_density_per_mm3"] == connectivity_density(v, (0.5, 0.5, 0.5))


# --------------------------------------------------------------------------------------------
# comparison_metrics
# --------------------------------------------------------------------------------------------


def test_comparison_hand_computed():
    truth = np.array([1, 1, 0, 0], np.uint8).reshape(1, 1, 4)
    pred = np.array([1, 0, 1, 0], np.uint8).reshape(1, 1, 4)
    m = comparison_metrics(pred, truth)
    # pred differs from truth in 2 of 4 voxels: mse = 2/4
    assert m["mse"] == pytest.approx(0.5)
    # |P n T| = 1, |P| = |T| = 2: dice = 2*1/4, iou = 1/(2+2-1)
    assert m["dice"] == pytest.approx(0.5)
    assert m["iou"] == pytest.approx(1 / 3)
    assert m["porosity_pred"] == 0.5 and m["porosity_truth"] == 0.5
    assert m["porosity_error"] == 0.0
    # pred = two separate voxels (chi 2), truth = one pair of face neighbours (chi 1)
    assert m["euler_number_pred"] == 2 and m["euler_number_truth"] == 1
    assert m["euler_error_rel"] == pytest.approx(1.0)

    prob = np.array([0.9, 0.2, 0.6, 0.0]).reshape(1, 1, 4)
    m = comparison_metrics(pred, truth, prob)
    # (0.9-1)^2 + (0.2-1)^2 + (0.6-0)^2 + 0 = 0.01 + 0.64 + 0.36 = 1.01; / 4
    assert m["mse"] == pytest.approx(1.01 / 4)
    assert m["dice"] == pytest.approx(0.5)  # dice still from the binary prediction
    json.dumps(m)


def test_comparison_porosity_and_euler_errors():
    truth = np.zeros((1, 3, 3), np.uint8)  # empty: chi 0, the denominator is max(0, 1) = 1
    pred = np.zeros((1, 3, 3), np.uint8)
    pred[0, 0, 0] = pred[0, 2, 2] = pred[0, 0, 2] = 1  # three separate voxels: chi 3
    m = comparison_metrics(pred, truth)
    assert m["porosity_error"] == pytest.approx(3 / 9)
    assert m["euler_error_rel"] == pytest.approx(3.0)
    assert m["dice"] == 0.0 and m["iou"] == 0.0
    assert m["mse"] == pytest.approx(3 / 9)

    truth = np.zeros((1, 3, 6), np.uint8)
    truth[0, 1, ::2] = 1  # chi 3
    pred = np.zeros((1, 3, 6), np.uint8)
    pred[0, 1, :] = 1  # one bar: chi 1 -> |1 - 3| / 3
    m = comparison_metrics(pred, truth)
    assert m["euler_error_rel"] == pytest.approx(2 / 3)
    # |P n T| = 3, |P| = 6, |T| = 3: dice = 6/9, iou = 3/6
    assert m["dice"] == pytest.approx(6 / 9)
    assert m["iou"] == pytest.approx(0.5)


def test_comparison_of_two_empty_volumes_is_perfect():
    z = np.zeros((3, 3, 3), np.uint8)
    m = comparison_metrics(z, z.copy())
    assert m["dice"] == 1.0 and m["iou"] == 1.0 and m["mse"] == 0.0


def test_comparison_shape_mismatch_names_both_shapes():
    with pytest.raises(InputError, match=r"\(2, 3, 4\).*\(2, 3, 5\)"):
        comparison_metrics(np.zeros((2, 3, 4)), np.zeros((2, 3, 5)))
    with pytest.raises(InputError, match=r"\(2, 3, 3\).*\(2, 3, 4\)"):
        comparison_metrics(np.zeros((2, 3, 4)), np.zeros((2, 3, 4)), np.zeros((2, 3, 3)))


def test_comparison_rejects_bad_probabilities():
    z = np.zeros((2, 2, 2), np.uint8)
    with pytest.raises(NonFiniteError):
        comparison_metrics(z, z, np.full((2, 2, 2), np.nan))
    with pytest.raises(InputError, match=r"\[0, 1\]"):
        comparison_metrics(z, z, np.full((2, 2, 2), 1.5))


# --------------------------------------------------------------------------------------------
# check_binary and other input errors
# --------------------------------------------------------------------------------------------


def test_check_binary_accepts_bool_int_float():
    for a in (np.array([True, False]), np.array([1, 0], np.int64), np.array([1.0, 0.0])):
        out = check_binary(a)
        assert out.dtype == np.uint8 and out.tolist() == [1, 0]


def test_check_binary_names_path_and_values():
    a = np.array([0, 1, 2, 2, 3, 255])
    with pytest.raises(InputError) as info:
        check_binary(a, path="scan_labels.nii.gz", what="label")
    msg = str(info.value)
    assert "scan_labels.nii.gz" in msg and "label" in msg
    assert "2, 3, 255" in msg and "4 voxels" in msg


def test_check_binary_shows_at_most_five_values():
    a = np.arange(0, 12, dtype=np.int16)
    with pytest.raises(InputError) as info:
        check_binary(a)
    msg = str(info.value)
    assert "2, 3, 4, 5, 6" in msg and "7" not in msg.split("6")[1].split("distinct")[0]
    assert "of 10 distinct" in msg


def test_check_binary_rejects_nan_and_fractions():
    with pytest.raises(InputError, match=r"0\.5.*nan"):
        check_binary(np.array([0.0, 0.5, np.nan]))


def test_metrics_reject_non_binary_and_wrong_ndim():
    with pytest.raises(InputError, match="binary"):
        euler_number(np.full((2, 2, 2), 7))
    with pytest.raises(InputError, match="3D"):
        porosity(np.zeros((4, 4)))
    with pytest.raises(InputError, match="connectivity"):
        euler_number(np.zeros((2, 2, 2)), connectivity=18)
    with pytest.raises(InputError, match="spacing"):
        connectivity_density(np.zeros((2, 2, 2)), spacing_mm=(1.0, 0.0, 1.0))


def test_boundary_voxels_and_the_error_split_against_a_direct_count():
    from scipy import ndimage as ndi

    from ctpore.pipelines.bench.error_split import BoundaryErrorSplit, boundary_voxels

    rng = np.random.default_rng(3)
    truth = ndi.gaussian_filter(rng.random((14, 15, 16)), 1.5) > 0.5
    # reference: a voxel is on the boundary when a face neighbour inside the volume is of the other phase
    st = ndi.generate_binary_structure(3, 1)
    ref = (truth & ~ndi.binary_erosion(truth, st, border_value=1)) | (~truth & ndi.binary_dilation(truth, st))
    edge = boundary_voxels(truth)
    assert edge.any() and (~edge).any()
    assert (edge == ref).all()
    probs = [rng.random(truth.shape), np.where(truth, 0.9, 0.2)]
    split = BoundaryErrorSplit()
    for p in probs:
        split.add(p, truth)
    s = split.summary()
    e = np.concatenate([((p - truth) ** 2).ravel() for p in probs])
    m = np.concatenate([edge.ravel()] * 2)
    assert s["boundary_share"] == pytest.approx(m.mean())
    assert s["mse_boundary"] == pytest.approx(e[m].mean()) and s["mse_interior"] == pytest.approx(e[~m].mean())
    assert s["boundary_error_share"] == pytest.approx(e[m].sum() / e.sum())
    given = BoundaryErrorSplit()  # an edge computed once for several methods: the same split
    for p in probs:
        given.add(p, truth, edge)
    assert given.summary() == s
    with pytest.raises(ValueError, match="differ in shape"):
        split.add(probs[0][:-1], truth)


def test_the_registry_refuses_a_second_metric_of_one_key():
    """register_metric never replaces a metric silently: a key already there is refused, and the
    registry is left as it was."""
    from ctpore.data.metrics import METRICS, Metric, register_metric

    before = list(METRICS)
    with pytest.raises(ValueError, match="'porosity' is registered already"):
        register_metric(Metric("porosity", lambda acc: 0.0))
    assert METRICS == before
