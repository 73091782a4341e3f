"""The sample found by its shape, on the set-ups scanners make: a dry core in air (centred, off the
centre), in a bright tube with an air gap, in a tube as grey as the mid-range, inside a synchrotron's
circular field of view, with brine-filled pores in a tube, wider than the field of view, a block in
air turned 20 degrees; and, as files: HDF5 in the DXchange layout with a circular field of view, an
anisotropic core, a folder of TIFF slices of a core in a tube.

Each scan is simulated by the project's own scanner model with its true sample (the voxels whose
centre lies inside the sample's geometry) and reconstructed twice by the shipped model: with the
sample found (``auto``) and with the true sample given as a mask. The found sample must match the
true one (IoU >= 0.97); the porosity must be within 0.01 of the true mask's run and the pore count
(b0) within 10% of it (at least one pore either way, since 10% of a handful is less than one);
no pore lies outside the found sample. Brine-filled pores are judged on the sample only. (Pore
voxels outside the *true* sample can remain where the found surface lies a fraction of a voxel
out: the mouths of pores open at the surface; ``ctpore bench sample`` measures them.)

The seeds are the set-up's index in :data:`SETUPS` from 3000, fixed before any of these ran.
"""

from __future__ import annotations

import json
import warnings

import nibabel as nib
import numpy as np
import pytest

from ctpore.data.synthetic import make_pair
from ctpore.data.synthetic.scenes import Scene
from ctpore.models.weights import default_weights_path

pytestmark = pytest.mark.skipif(default_weights_path() is None, reason="no shipped weights")

SHAPE = (24, 160, 160)
VOXEL_MM = 0.01

#: The set-ups of the table; brine-filled pores are judged on the sample only.
SETUPS = ("core-air", "core-air-offcentre", "tube-gap", "tube-grey", "fov-circle", "brine-tube",
          "core-wider-than-fov", "block-turned", "core-anisotropic", "tube-touching")


def scene_scan(name: str, seed: int):
    """A scan of the set-up ``name`` (its sizes from the scene's own stream of ``seed``)."""
    scan, truth, info = make_pair(seed, shape=SHAPE, scene=name)
    return scan, truth, info["sample"], Scene.from_dict(info["scene"])


@pytest.fixture(scope="module")
def predictor():
    from ctpore.pipelines.reconstruct import build_predictor

    return build_predictor("auto")


def both_runs(scan, true_sample, spacing, predictor):
    from ctpore.pipelines.reconstruct import reconstruct

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = reconstruct(scan, spacing_mm=spacing, predictor=predictor)
        given = reconstruct(scan, spacing_mm=spacing, predictor=predictor, sample=true_sample.astype(np.uint8))
    return found, given


def check(found, given, true_sample, dry: bool = True):
    sample = found.sample.astype(bool) if found.sample is not None else np.ones(true_sample.shape, bool)
    iou = (sample & true_sample).sum() / (sample | true_sample).sum()
    pores = found.pores.astype(bool)
    assert iou >= 0.97, f"sample IoU {iou:.4f}"
    assert not np.any(pores & ~sample)  # no pore outside the found sample
    if not dry:
        return iou
    a, b = found.metrics, given.metrics
    assert abs(a["porosity"] - b["porosity"]) <= 0.01, (a["porosity"], b["porosity"])
    assert abs(a["n_pores"] - b["n_pores"]) <= max(1, 0.1 * b["n_pores"]), (a["n_pores"], b["n_pores"])
    return iou


@pytest.mark.parametrize("name", SETUPS)
def test_each_setup_is_measured_as_with_its_true_sample(name, predictor):
    seed = 3000 + SETUPS.index(name)
    scan, _truth, true_sample, scene = scene_scan(name, seed)
    found, given = both_runs(scan, true_sample, scene.spacing_mm, predictor)
    check(found, given, true_sample, dry=name != "brine-tube")
    info = found.metrics["sample"]
    assert info["mode"] == "auto" and info["confident"]
    if name == "block-turned":
        assert info["kind"] == "outline"
    elif name != "core-wider-than-fov":
        assert info["kind"] == "cylinder"
        # the fitted geometry, in mm, against the scene's own
        r = info["cylinder"]["radius_mm"]
        assert abs(r - scene.radius_mm) <= 0.5 * VOXEL_MM, (r, scene.radius_mm)
    if scene.wall_mm > 0 and name != "tube-touching":
        assert abs(info["wall"]["thickness_mm"] - scene.wall_mm) <= 0.5 * VOXEL_MM
        assert info["wall"]["voxels"] > 0
    # what the figures would be if the region left out were pore: more, and said beside the porosity
    assert found.metrics["porosity_if_region_is_pore"] > found.metrics["porosity"]


def test_a_dxchange_hdf5_with_a_circular_field_of_view(tmp_path, capsys):
    h5py = pytest.importorskip("h5py")
    from helpers import run_cli

    scan, _truth, true_sample, scene = scene_scan("fov-circle", 3100)
    with h5py.File(tmp_path / "tomo.h5", "w") as f:
        f.create_dataset("/exchange/data", data=scan)
        det = f.create_group("/measurement/instrument/detector")
        for axis in ("x", "y"):
            d = det.create_dataset(f"actual_pixel_size_{axis}", data=VOXEL_MM * 1000)
            d.attrs["units"] = "um"
    code, _, err = run_cli(["reconstruct", tmp_path / "tomo.h5", "-o", tmp_path / "out"], capsys)
    assert code == 0, err
    m = json.loads((tmp_path / "out" / "tomo_metrics.json").read_text())
    sample = np.asarray(nib.load(tmp_path / "out" / "tomo_sample.nii.gz").dataobj).T.astype(bool)
    assert m["sample"]["kind"] == "cylinder"  # (the zeros beyond the field of view: constant, or air clipped to 0)
    assert (sample & true_sample).sum() / (sample | true_sample).sum() >= 0.97
    assert (tmp_path / "out" / "tomo_sample.png").is_file()


def test_an_anisotropic_core_is_a_circle_in_mm(predictor):
    scan, _truth, true_sample, scene = scene_scan("core-anisotropic", 3101)
    dz, dy, dx = scene.spacing_mm
    assert dy != dx and dz != dx  # an ellipse in voxels
    found, given = both_runs(scan, true_sample, scene.spacing_mm, predictor)
    check(found, given, true_sample)


def test_a_tiff_folder_of_a_core_in_a_tube(tmp_path, capsys):
    tifffile = pytest.importorskip("tifffile")
    from helpers import run_cli

    scan, _truth, true_sample, scene = scene_scan("tube-gap", 3102)
    folder = tmp_path / "slices"
    folder.mkdir()
    for z in range(scan.shape[0]):
        tifffile.imwrite(str(folder / f"core_{z:03d}.tif"), scan[z], imagej=True,
                         resolution=(1 / (VOXEL_MM * 1000), 1 / (VOXEL_MM * 1000)), metadata={"unit": "um"})
    code, _, err = run_cli(["reconstruct", folder, "-o", tmp_path / "out"], capsys)
    assert code == 0, err
    m = json.loads((tmp_path / "out" / "slices_metrics.json").read_text())
    sample = np.asarray(nib.load(tmp_path / "out" / "slices_sample.nii.gz").dataobj).T.astype(bool)
    assert m["sample"]["kind"] == "cylinder" and "wall" in m["sample"]
    assert (sample & true_sample).sum() / (sample | true_sample).sum() >= 0.97


def test_a_tilted_core_is_fitted_along_its_axis():
    """A core whose axis leans (its centre drifts by 9 and 6 voxels over the stack) is a cylinder fitted
    with that drift; a straight cylinder through it would cut its ends."""
    from ctpore.data.sample import find_sample

    tilt = (0.15, -0.10)  # mm of drift per mm along Z
    scene = Scene(kind="cylinder", spacing_mm=(VOXEL_MM,) * 3, radius_mm=30 * VOXEL_MM, tilt=tilt)
    scan, _truth, info = make_pair(5, shape=(64, 96, 96), family="grains", porosity=0.2, scene=scene)
    true_sample = info["sample"]
    fit = find_sample(scan, scene.spacing_mm)
    cyl = fit.envelope.cylinder
    assert fit.kind == "cylinder"
    per_slice = np.multiply(tilt, VOXEL_MM)  # the fit's drift is in mm per slice
    assert np.allclose(cyl.drift_mm, per_slice, rtol=0.15), cyl.drift_mm
    inside = fit.outside(scan.astype(np.float32), 0)[0] == 0
    assert (inside & true_sample).sum() / (inside | true_sample).sum() >= 0.97
    for z in (0, 63):  # the ends, where a straight cylinder would be off by 5 voxels
        assert (inside[z] & true_sample[z]).sum() / (inside[z] | true_sample[z]).sum() >= 0.95


@pytest.mark.parametrize("seed", [3201, 3205])
def test_a_straight_core_seen_only_in_the_corners_is_not_tilted(seed):
    """A core wider than the field of view shows its surface in a few sectors at the corners only: the
    centres of groups of slices are too noisy to tilt its axis by, and a tilt that fits its surface
    points worse than a straight axis is not kept (the scene's axis stands straight)."""
    from ctpore.data.sample import find_sample

    scan, _truth, true_sample, scene = scene_scan("core-wider-than-fov", seed)
    assert scene.tilt == (0.0, 0.0)
    fit = find_sample(scan, scene.spacing_mm)
    assert fit.kind == "cylinder"
    drift_vox = np.hypot(*fit.envelope.cylinder.drift_mm) * SHAPE[0] / VOXEL_MM  # over the stack
    assert drift_vox < 0.5, drift_vox
    inside = fit.outside(scan.astype(np.float32), 0)[0] == 0
    assert (inside & true_sample).sum() / (inside | true_sample).sum() >= 0.99



def test_a_core_wider_than_the_field_of_view_with_pores_cut_by_the_edge_is_a_cylinder():
    """A core wider than the field of view shows air in its corners only, a few sectors each; a pore
    cut by the slice's edge shows a little "air" there too, and gives a false surface point well inside
    the core, at every edge. A least-squares fit settles between the two kinds of point, spreads by
    several voxels and gives way to an outline, which cuts the corners (development scene 2606108:
    IoU 0.979, 12 pores for 6). The fit is restarted from the circle most points agree on that leaves
    none outside it (a pore puts a point inside a surface, never outside), and refitted on the points
    where that circle lies within the slice. Over 12 scenes (seeds fixed before this ran; seed 3700
    was an outline 1.3 voxels small before) every fit is a cylinder, its radius the scene's to a
    tenth of a voxel in the median, and within half a voxel in 11 of them."""
    from ctpore.data.sample import find_sample

    errors = []
    for seed in range(3700, 3712):
        scan, _truth, _true_sample, scene = scene_scan("core-wider-than-fov", seed)
        fit = find_sample(scan, scene.spacing_mm)
        assert fit.kind == "cylinder", (seed, fit.kind, fit.envelope.spread_vox)
        counts = fit.info()["fit"]  # sectors of every phase the restart read, each counted once
        assert counts["surface_points"] + counts["cut_sectors"] <= counts["sectors"], (seed, counts)
        errors.append((fit.envelope.cylinder.radius_mm - scene.radius_mm) / VOXEL_MM)
    errors = np.abs(errors)
    assert float(np.median(errors)) <= 0.1, np.round(errors, 2)
    assert int((errors <= 0.5).sum()) >= 11, np.round(errors, 2)


def test_a_core_whose_surface_a_vesicle_opens_through_every_slice_is_a_cylinder():
    """An off-centre core in air with a vesicle open at its surface through all of a short scan
    (development scene 2601300): a third of the surface points lie inside the surface, on the
    vesicle's far wall. The fit, and its refit from the circle most points agree on, settled between
    them and the true ones, spread by 2.5 voxels and gave way to an outline that cut the vesicle's
    mouth off (IoU 0.87, called confident). Kept on the points on the circle most points agree on
    (two thirds of them, none outside), the cylinder is the core's."""
    from ctpore.data.sample import find_sample

    scan, _truth, true_sample, scene = scene_scan("core-air-offcentre", 2601300)
    fit = find_sample(scan, scene.spacing_mm)
    assert fit.kind == "cylinder" and fit.confident, fit.info()
    assert abs(fit.envelope.cylinder.radius_mm - scene.radius_mm) <= 0.5 * VOXEL_MM, fit.info()
    inside = fit.outside(scan.astype(np.float32), 0)[0] == 0
    assert (inside & true_sample).sum() / (inside | true_sample).sum() >= 0.97


def test_a_core_in_a_tube_whose_pores_open_along_a_third_of_its_surface_is_fitted_to_its_surface():
    """A core in a bright tube with an air gap, vesicles open at its surface along a third of it
    (development scene 2602528): their far walls put surface points inside the core's surface, and
    the plain fit inside the wall settled between them and the true ones, 3.5 voxels off the axis and
    2.4 short in radius, with points left outside it (material beyond a surface, which no pore
    explains); IoU 0.87, called confident. Restarted, as a core in air is, from the circle most points
    agree on, it is the core's."""
    from ctpore.data.sample import find_sample

    scan, _truth, true_sample, scene = scene_scan("tube-gap", 2602528)
    fit = find_sample(scan, scene.spacing_mm)
    assert fit.kind == "cylinder" and fit.envelope.wall is not None and fit.confident, fit.info()
    assert abs(fit.envelope.cylinder.radius_mm - scene.radius_mm) <= 0.5 * VOXEL_MM, fit.info()
    inside = fit.outside(scan.astype(np.float32), 0)[0] == 0
    assert (inside & true_sample).sum() / (inside | true_sample).sum() >= 0.97


@pytest.mark.parametrize("name,seed", [("tube-grey", 3342), ("tube-grey", 3351), ("tube-grey", 3354),
                                       ("tube-touching", 3300), ("tube-touching", 3328),
                                       ("tube-touching", 2609158), ("tube-touching", 2609187),
                                       ("tube-touching", 2609199)])
def test_a_tube_about_as_grey_as_the_core_is_found_where_it_was_missed(name, seed):
    """Walls the fit used to miss, so that the tube and its gap counted as sample (IoU 0.69 to 0.88;
    these seeds were found by running the fit over seeds 3300 on, with the earlier fit): a grey tube
    whose blurred profile a thin ring blurred more than the scanner blurs explained as well (the
    wall's edges are now blurred no more than the core's surface), a few sectors with a large pore at
    the surface outweighing the rest (the fit's loss is now robust), a clearly uniform wall of small
    gain, a rough core overlapping its tube by more than 1.5 voxels. And a core touching a tube much
    darker than itself (seed 2609158, from the development seeds of ``ctpore bench sample``'s scenes):
    the outermost surface found was the core's, the wall's fit reached 3 voxels beyond it, and the
    wall left out of the sample was drawn from that surface inwards, a ring of the core (IoU 0.86).
    And a bright tube 3 voxels thick that the fit explained as the core's disc reaching 3 voxels into
    it, their levels added (development scene 2609187; IoU 0.87 with the tube counted as sample).
    And a wall a third of the core's grey and 7 voxels thick (development scene 2609199, IoU 0.77),
    whose fit with the core's disc held inside it started from one point and ended worse than the core
    alone explains the profiles (gain -0.07); it now also starts from the free fit's four most
    promising starts."""
    from ctpore.data.sample import find_sample

    scan, _truth, true_sample, scene = scene_scan(name, seed)
    fit = find_sample(scan, scene.spacing_mm)
    assert fit.kind == "cylinder" and fit.envelope.wall is not None
    if name == "tube-grey":  # (a touching wall's inner surface is put where the core ends)
        assert abs(fit.envelope.wall["thickness_mm"] - scene.wall_mm) <= 1.5 * VOXEL_MM
    inside = fit.outside(scan.astype(np.float32), 0)[0] == 0
    assert (inside & true_sample).sum() / (inside | true_sample).sum() >= 0.97


def test_a_touching_walls_inner_surface_is_not_fitted_inside_the_core():
    """Where a core touches its tube, the sample ends at the wall's inner surface, and the fit puts
    that surface where the two phases' grey levels and textures meet. The texture's variance falls
    inside the surface as the blur mixes it with the uniform wall (as the square of the sample's share
    for a texture coarser than the blur). A fit reading it as a plain blurred step put the surface
    0.17 voxel inside the core on average on development scenes of the bench's sizes (0.5 where the
    blur is largest) and left a shell of the core out. Over 16 scenes (seeds fixed before this ran;
    the plain step's mean error on them was 0.06 voxel inside, now 0.05 outside), a wall is found and
    the fitted inner surface lies on the scenes' own one on average, to 0.12 voxel."""
    from ctpore.data.sample import find_sample

    errors = []
    for seed in range(3400, 3416):
        scan, _truth, _true_sample, scene = scene_scan("tube-touching", seed)
        fit = find_sample(scan, scene.spacing_mm)
        wall = fit.envelope.wall
        if wall is None:
            continue
        errors.append((wall["r_in"] - scene.radius_mm - scene.gap_mm) / VOXEL_MM)  # about the wall's axis
    assert len(errors) >= 14, f"a wall was found in {len(errors)} of 16"
    assert abs(float(np.mean(errors))) <= 0.12, np.round(errors, 2)


def test_a_core_in_a_bright_tube_is_fitted_to_its_own_radius():
    """Inside a wall the core's surface is where each sector's profile, the wall's blurred step taken
    off, crosses halfway from the air to the material just inside it, as the outer surface is found.
    Halfway to the material deep inside put it too far out: beam hardening darkens a core towards its
    axis, and the wider the blur the further out that lower level is crossed (development scenes of
    the bench's sizes: 0.15 voxel out on average, 0.45 at most). Over 12 scenes of a core in a bright
    tube with an air gap (seeds fixed before this ran), the fitted radius is the scene's own on
    average, to 0.08 voxel, and within 0.1 voxel of it on average in size (the development scenes'
    0.15 before and 0.05 after; the signed mean alone did not fail before here: 0.07, in size 0.13)."""
    from ctpore.data.sample import find_sample

    errors = []
    for seed in range(3600, 3612):
        scan, _truth, _true_sample, scene = scene_scan("tube-gap", seed)
        fit = find_sample(scan, scene.spacing_mm)
        if fit.envelope.wall is not None:
            errors.append((fit.envelope.cylinder.radius_mm - scene.radius_mm) / VOXEL_MM)
    assert len(errors) >= 11, f"a wall was found in {len(errors)} of 12"
    assert abs(float(np.mean(errors))) <= 0.08, np.round(errors, 2)
    assert float(np.mean(np.abs(errors))) <= 0.1, np.round(errors, 2)


def test_a_sample_whose_fit_inside_its_wall_does_not_hold_together_is_uncertain():
    """Inside a wall the sample stays a cylinder however its surface points spread about it (no
    outline is tried there). When they spread by several voxels the cylinder is no surface of the
    sample, and the result must say it is uncertain, not report a porosity as if it were sure: a
    square block (0.9 mm a side, turned 20 degrees) in a bright tube, whose surface points spread
    about the circle fitted inside the wall by half the block's corner. (Development scene 2609164,
    a core touching a bright tube whose inner fit spread by 8 voxels, was the case this came from;
    since the inner surface is found against the material just inside it, that fit holds.) A scene
    whose fit holds (3000 + the set-up's index, as above) stays confident."""
    from ctpore.data.sample import find_sample

    block = Scene(kind="block", spacing_mm=(VOXEL_MM,) * 3, half_sides_mm=(0.45, 0.45), angle_deg=20.0,
                  radius_mm=0.64, gap_mm=0.02, wall_mm=0.05, wall_attenuation=2.0)  # the wall about its corners
    scan, _truth, _info = make_pair(4, shape=(16, 160, 160), family="vesicles", porosity=0.2, scene=block)
    fit = find_sample(scan, block.spacing_mm)
    assert fit.kind == "cylinder" and fit.envelope.wall is not None
    assert fit.envelope.spread_vox > 3.0 and not fit.confident
    assert fit.info()["confident"] is False
    scan, _truth, true_sample, scene = scene_scan("tube-touching", 3000 + SETUPS.index("tube-touching"))
    fit = find_sample(scan, scene.spacing_mm)
    assert fit.envelope.wall is not None and fit.confident


def test_a_thin_tube_the_fit_missed_is_said_to_be_counted_as_sample(predictor, monkeypatch):
    """A tube 3 voxels thick, as grey as the core it touches (development scene 2609159), where the fit
    does not find it (the rule for a layer without pores switched off here, as it would miss a tube
    whose layer shows noise as dark): the tube counts as sample (IoU 0.88). Its rim has no pores while
    the inside has, so the result says it is uncertain and warns, where the shell a few voxels under
    the surface (inside the core) saw nothing amiss."""
    import ctpore.data.layer as layer
    from ctpore.pipelines.reconstruct import reconstruct

    monkeypatch.setattr(layer, "pore_free_layer", lambda *args, **kwargs: None)
    scan, _truth, _true_sample, scene = scene_scan("tube-touching", 2609159)
    with pytest.warns(Warning, match="outer voxels differ from its inside"):
        found = reconstruct(scan, spacing_mm=scene.spacing_mm, predictor=predictor)
    info = found.metrics["sample"]
    assert info["confident"] is False and info["rim_check"]["differs"]
    assert info["rim_check"]["shell_porosity"] >= 0.25 * info["rim_check"]["inside_porosity"]


@pytest.mark.parametrize("seed", [2609159, 2629172, 2629071, 2629095, 2629187, 2629211])
def test_a_tube_pressed_against_the_core_is_found_by_the_pores_it_lacks(seed):
    """Tubes 3 to 7 voxels thick, about as grey as the core and touching it all round (development
    scenes): no rise of their own in the profiles, so the cylinder was fitted to the tube's outside
    and the tube counted as sample (IoU 0.77 to 0.88; the porosity of 2629172 0.349 against the true
    mask's 0.409). The layer under the found surface has no pores where the core has them: it is the
    wall, the sample the cylinder within it (up to a voxel and a half inwards: the blur brightens the
    core's outermost pores). The last two are cores of thin tubes, with a dark share inside of 0.036
    and 0.023."""
    from ctpore.data.layer import LAYER_NOTE
    from ctpore.data.sample import find_sample

    scan, _truth, true_sample, scene = scene_scan("tube-touching", seed)
    fit = find_sample(scan, scene.spacing_mm)
    assert fit.kind == "cylinder" and LAYER_NOTE in fit.describe(), fit.describe()
    assert fit.envelope.wall is not None and fit.info()["wall"]["thickness_mm"] > 0
    inside = fit.outside(scan.astype(np.float32), 0)[0] == 0
    assert (inside & true_sample).sum() / (inside | true_sample).sum() >= 0.95
    depth = (fit.envelope.wall["r_out"] - scene.radius_mm) / VOXEL_MM  # the tube and any gap, in voxels
    assert -0.5 <= fit.envelope.wall["thickness_mm"] / VOXEL_MM - depth <= 1.5  # as tests/test_layer.py


def test_a_tube_pressed_against_the_core_leaves_the_porosity_as_with_the_true_mask(predictor):
    """End to end, on development scene 2629172: the porosity within 0.01 of the run given the true
    sample (0.349 against 0.409 with the tube counted as sample, which only the check of the outer
    voxels after the model ran said to be uncertain), and the result is confident."""
    scan, _truth, true_sample, scene = scene_scan("tube-touching", 2629172)
    found, given = both_runs(scan, true_sample, scene.spacing_mm, predictor)
    check(found, given, true_sample)
    assert found.metrics["sample"]["confident"] and not found.metrics["sample"]["rim_check"]["differs"]


def test_a_grain_pack_wider_than_the_field_of_view_gets_no_wall_of_its_own_grains():
    """Development scene 2626244: a grain pack cut by the field of view, air only in the slice's
    corners, its pores as dark as that air. Its outer part was fitted as a container wall 0.22 mm
    thick around a cylinder through its pores (IoU 0.62). A wall is uniform; that one held pores (a
    dark share of 0.28 where its scatter explains 0.06): it is no wall, and the sample is the
    material's outline."""
    from ctpore.data.layer import POROUS_WALL_NOTE
    from ctpore.data.sample import find_sample

    scan, _truth, true_sample, scene = scene_scan("core-wider-than-fov", 2626244)
    fit = find_sample(scan, scene.spacing_mm)
    assert fit.envelope.wall is None and POROUS_WALL_NOTE in fit.describe(), fit.describe()
    inside = fit.outside(scan.astype(np.float32), 0)[0] == 0 if fit.has_outside else np.ones(scan.shape, bool)
    assert (inside & true_sample).sum() / (inside | true_sample).sum() >= 0.99


def test_a_block_whose_corners_pores_cut_in_turn_is_still_a_block():
    """A turned block whose corners large pores cut, each slice's hull an octagon that fills less of
    its smallest rectangle than a block's outline (development scene 2607102: the hulls of 10 of the
    16 fit slices filled under 90%, and the corners were cut off the sample, IoU 0.91). The pores do
    not cut the same corners in every slice, so the material of the fit's slices together fills the
    rectangle, and the sample is the block."""
    from ctpore.data.sample import find_sample

    scan, _truth, true_sample, scene = scene_scan("block-turned", 2607102)
    fit = find_sample(scan, scene.spacing_mm)
    assert fit.kind == "outline" and fit.envelope.outline.block
    inside = fit.outside(scan.astype(np.float32), 0)[0] == 0
    assert (inside & true_sample).sum() / (inside | true_sample).sum() >= 0.97


def test_a_core_whose_outer_band_is_free_of_pores_gets_no_wall_more_textured_than_itself():
    """An off-centre core in air whose outer band holds no pore while large ones fill its middle
    (development scene 2601438): the band, brighter than the middle, was taken for a tube the core
    touched (a gain of 47, the core's disc reaching 2.6 voxels into it), though it was four times as
    textured as the core (IoU 0.79, called confident). A wall the sample's disc reaches into is no
    more textured than the sample, as one held inside it already had to be (true walls, over 286 taken
    on development scenes, had 0.87 of the sample's texture at most where the disc reached in)."""
    from ctpore.data.sample import find_sample

    scan, _truth, true_sample, scene = scene_scan("core-air-offcentre", 2601438)
    fit = find_sample(scan, scene.spacing_mm)
    assert fit.kind == "cylinder" and fit.envelope.wall is None, fit.info()
    inside = fit.outside(scan.astype(np.float32), 0)[0] == 0
    assert (inside & true_sample).sum() / (inside | true_sample).sum() >= 0.97


def test_a_core_in_air_whose_outer_layer_a_textured_wall_explains_gets_no_wall():
    """The check that goes with fitting a wall again with the core held inside it: the outer layer
    of a core in air (development scene 2600101) is explained by the core's disc reaching 5 voxels
    into a "wall" of a level of its own; held inside, that wall is three times as textured as the
    core, and is no wall."""
    from ctpore.data.sample import find_sample

    scan, _truth, true_sample, scene = scene_scan("core-air", 2600101)
    fit = find_sample(scan, scene.spacing_mm)
    assert fit.kind == "cylinder" and fit.envelope.wall is None
    inside = fit.outside(scan.astype(np.float32), 0)[0] == 0
    assert (inside & true_sample).sum() / (inside | true_sample).sum() >= 0.97


@pytest.mark.parametrize("seed", [2608994, 2608830])
def test_a_core_whose_outer_layer_holds_fewer_pores_gets_no_wall_touching_it(seed):
    """Anisotropic cores of large vesicles whose outer 10 voxels hold half the porosity of their
    middle (development scenes 2608994 and 2608830): that layer, a little brighter and less textured
    than the core, was taken for a tube the core touched, 14 voxels thick (a gain of 6 and 8, texture
    0.64 and 0.60 of the core's), and the sample shrank to the core's middle (IoU 0.60 and 0.58, called
    confident). A wall touching the core at the core's own level must be clearly uniform: it holds no
    pores."""
    from ctpore.data.sample import find_sample

    scan, _truth, true_sample, scene = scene_scan("core-anisotropic", seed)
    fit = find_sample(scan, scene.spacing_mm)
    assert fit.kind == "cylinder" and fit.envelope.wall is None, fit.info()
    inside = fit.outside(scan.astype(np.float32), 0)[0] == 0
    assert (inside & true_sample).sum() / (inside | true_sample).sum() >= 0.97


def test_a_core_edge_brightened_by_cupping_is_not_taken_for_its_tube():
    """A core of vesicles touching a tube dimmer than itself (development scene 2629024), its edge
    brightened by beam-hardening cupping: the wall's fit let the core's disc reach 1.3 voxels into the
    wall, within the blur, where the two levels add up and explain the bright edge as wall. The wall
    came out 8.4 voxels thick against 5.2 and the core ended 2 to 3 voxels short (IoU 0.935, called
    confident). A disc reaching more than half a voxel into its wall is now held inside it, where that
    keeps the wall's level."""
    from ctpore.data.sample import find_sample

    scan, _truth, true_sample, scene = scene_scan("tube-touching", 2629024)
    fit = find_sample(scan, scene.spacing_mm)
    assert fit.kind == "cylinder" and fit.envelope.wall is not None, fit.info()
    assert abs(fit.envelope.wall["thickness_mm"] - scene.wall_mm) <= 1.0 * VOXEL_MM, fit.envelope.wall
    inside = fit.outside(scan.astype(np.float32), 0)[0] == 0
    assert (inside & true_sample).sum() / (inside | true_sample).sum() >= 0.97


@pytest.mark.parametrize("seed", [2629071, 2629095])
def test_a_tube_the_fit_can_only_place_at_its_thinnest_makes_the_sample_uncertain(seed):
    """A bright tube around a core of large pores (development scenes 2629071 and 2629095): the wall's
    best fit is a ring at the thinnest wall the fit allows, blurred more than it is thick, where the
    tube is 4.9 and 3.4 voxels thick. It passed every other test of a wall and was rejected for its
    thickness, and the tube was counted as sample (IoU 0.80 and 0.85) with the fit called confident.
    Such a sample is either right or said to be uncertain, with the reason."""
    from ctpore.data.sample import find_sample
    from ctpore.data.wall import THIN_WALL_NOTE

    scan, _truth, true_sample, scene = scene_scan("tube-touching", seed)
    fit = find_sample(scan, scene.spacing_mm)
    inside = fit.outside(scan.astype(np.float32), 0)[0] == 0
    iou = (inside & true_sample).sum() / (inside | true_sample).sum()
    assert iou >= 0.97 or not fit.info()["confident"], (iou, fit.describe())
    if iou < 0.97:
        assert THIN_WALL_NOTE in fit.describe() and "a wall may be counted as sample" in fit.describe()


@pytest.mark.parametrize("name,seed", [("tube-grey", 2623093), ("tube-touching", 2629037)])
def test_a_tube_fitted_right_with_a_large_gain_is_taken_though_not_clearly_uniform(name, seed):
    """Tubes touching their core, or nearly, at about its level (development scenes 2623093 and
    2629037): the wall's fit placed them right (thickness within a third of a voxel) and lowered the profiles'
    cost by 18 and 23 of the core's scatters squared per sector, but their texture (0.40 and 0.54 of
    the core's, the blur mixing the core into them) was above the clearly-uniform bound that a gain
    under 25 needed, and the tube was counted as sample, confidently (IoU 0.69 and 0.74). A wall that
    differs from the sample needs no other evidence from a gain of 12 (cores' own outer layers taken
    for walls had gains of 8 at most)."""
    from ctpore.data.sample import find_sample

    scan, _truth, true_sample, scene = scene_scan(name, seed)
    fit = find_sample(scan, scene.spacing_mm)
    assert fit.kind == "cylinder" and fit.envelope.wall is not None, fit.info()
    inside = fit.outside(scan.astype(np.float32), 0)[0] == 0
    assert (inside & true_sample).sum() / (inside | true_sample).sum() >= 0.97


@pytest.mark.parametrize("setup, seed", [("core-air", 2620290), ("fov-circle", 2624302)])
def test_a_vesicle_open_across_much_of_a_core_is_no_sawn_face(setup, seed):
    """Development scenes 2620290 and 2624302: vesicles open at the surface through every slice left
    a fifth to a quarter of the sectors with no material from the axis out, which was taken for half
    a core sawn along its axis; the outline cut the vesicles off (IoU 0.53 and 0.61, porosity 0.25 and
    0.50 for 0.56 and 0.68). The vesicle's air is no segment of the circle: the sample is the core."""
    from ctpore.data.sample import find_sample

    scan, _truth, true_sample, scene = scene_scan(setup, seed)
    fit = find_sample(scan, scene.spacing_mm)
    assert fit.kind == "cylinder", fit.describe()
    inside = fit.outside(scan.astype(np.float32), 0)[0] == 0
    assert (inside & true_sample).sum() / (inside | true_sample).sum() >= 0.97
