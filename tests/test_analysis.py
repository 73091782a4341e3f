"""``ctpore analyze``: Minkowski functionals, connectivity and local thickness, each checked against an
independent truth (analytic shapes, whole-volume labelling, a brute-force thickness) and streamed
equal to whole, under a memory budget smaller than the volume."""

from __future__ import annotations

import json
import math

import nibabel as nib
import numpy as np
import pytest
from scipy import ndimage as ndi
from skimage.measure import label as sk_label

from ctpore.data.minkowski import MinkowskiAccumulator, breadth_lut, minkowski_measures, surface_lut, tile_histogram
from ctpore.data.percolation import PoreConnectivity, plane_counts, sample_faces
from ctpore.pipelines.bench.analysis import drainage_matches, plane_area_in_box
from ctpore.data.thickness import distance_map, largest_distance, streamed_thickness, thickness_radii


def _blobs(shape, seed, sigma=2.0, level=0.5):
    rng = np.random.default_rng(seed)
    return (ndi.gaussian_filter(rng.random(shape), sigma) > level).astype(np.uint8)


def _core(shape):
    z, y, x = np.indices(shape)
    r = min(shape[1], shape[2]) / 2 - 1.5
    return ((y - (shape[1] - 1) / 2) ** 2 + (x - (shape[2] - 1) / 2) ** 2 < r * r) & (z >= 2) & (z < shape[0] - 2)


# -- Minkowski functionals --------------------------------------------------------------------------


@pytest.mark.parametrize("radius", [10.0, 14.5])
def test_ball_surface_and_mean_breadth_are_within_3_percent(radius):
    n = int(2 * radius + 8)
    z, y, x = np.indices((n, n, n)) - (n - 1) / 2 - 0.23
    ball = (z * z + y * y + x * x < radius * radius).astype(np.uint8)
    m = minkowski_measures(ball)
    assert m["surface_area"] == pytest.approx(4 * math.pi * radius**2, rel=0.03)
    assert m["mean_breadth"] == pytest.approx(2 * radius, rel=0.03)


def test_a_ball_in_anisotropic_voxels():
    z, y, x = np.indices((50, 100, 100))
    ball = (((2.0 * z - 49.3) ** 2 + (y - 49.6) ** 2 + (x - 50.2) ** 2) < 40**2).astype(np.uint8)
    m = minkowski_measures(ball, spacing=(0.02, 0.01, 0.01))
    assert m["surface_area"] == pytest.approx(4 * math.pi * 0.4**2, rel=0.03)
    assert m["mean_breadth"] == pytest.approx(0.8, rel=0.03)


def test_a_cylinder_through_the_volume_counts_only_its_side():
    # the caps lie on the volume's border, which is not surface
    n, r = 40, 12.3
    z, y, x = np.indices((n, 50, 50))
    cyl = ((y - 24.6) ** 2 + (x - 24.2) ** 2 < r * r).astype(np.uint8)
    assert minkowski_measures(cyl)["surface_area"] == pytest.approx(2 * math.pi * r * (n - 1), rel=0.03)


@pytest.mark.parametrize("seed", range(6))
def test_planes_at_random_orientations_are_within_3_percent(seed):
    rng = np.random.default_rng(1000 + seed)
    normal = rng.normal(size=3)
    normal /= np.linalg.norm(normal)
    size = 64
    c = float(normal @ np.full(3, (size - 1) / 2)) + rng.uniform(-3, 3)
    idx = np.indices((size, size, size)).reshape(3, -1).T
    half = (idx @ normal < c).reshape(size, size, size).astype(np.uint8)
    area = plane_area_in_box(normal, c, size)
    assert minkowski_measures(half)["surface_area"] == pytest.approx(area, rel=0.03)


def test_streamed_minkowski_equals_whole_with_a_sample():
    vol = _blobs((37, 30, 33), 1)
    smp = _core(vol.shape)
    whole = minkowski_measures(vol, smp, spacing=(0.01, 0.01, 0.01))
    for slab in (1, 5, 16):
        acc = MinkowskiAccumulator((0.01, 0.01, 0.01))
        for z in range(0, vol.shape[0], slab):
            acc.add(vol[z:z + slab], smp[z:z + slab])
        assert acc.measures() == whole
    # the tiles counted are those wholly inside the sample: the outside is no surface
    inside = ndi.binary_erosion(smp, np.ones((2, 2, 2)), origin=(-1, -1, -1), border_value=0)
    assert int(tile_histogram(vol, smp).sum()) == int(inside[:-1, :-1, :-1].sum())


def test_the_luts_see_no_measure_in_full_tiles_and_the_same_surface_from_either_phase():
    for sp in ((1.0, 1.0, 1.0), (2.0, 1.0, 1.0)):
        s, b = surface_lut(sp), breadth_lut(sp)
        assert abs(s[255]) < 1e-12 and abs(b[255]) < 1e-12  # every section's shares of a full tile add to 0
        assert np.allclose(s, s[::-1])  # a tile's pore-solid interface is the solid-pore one (code 255 - c)


# -- connectivity -------------------------------------------------------------------------------------


def _reference_connectivity(pores, smp, faces):
    lab = sk_label(pores & smp, connectivity=3)
    near = ndi.binary_dilation(~smp, np.ones((3, 3, 3)))
    for a in range(3):
        sl = [slice(None)] * 3
        for end in (0, -1):
            sl[a] = end
            near[tuple(sl)] = True
    conn = np.setdiff1d(np.unique(lab[near]), [0])
    n = smp.sum()
    perc = []
    for a, f in enumerate(faces):
        if f is None:
            perc.append(None)
            continue
        both = np.intersect1d(np.unique(np.take(lab, f[0], axis=a)), np.unique(np.take(lab, f[1], axis=a)))
        perc.append(np.isin(lab, both[both > 0]).sum() / n)
    return np.isin(lab, conn).sum() / n, perc


@pytest.mark.parametrize("with_sample", [False, True])
@pytest.mark.parametrize("level", [0.45, 0.5, 0.53])
def test_connected_and_percolating_porosity_equal_whole_volume_labelling(with_sample, level):
    pores = _blobs((34, 28, 30), 7, 1.5, level)
    smp = _core(pores.shape) if with_sample else np.ones(pores.shape, bool)
    faces = sample_faces(plane_counts(smp, smp.shape) if with_sample else None, pores.shape)
    assert (faces[1] is None and faces[2] is None) if with_sample else all(f is not None for f in faces)
    pc = PoreConnectivity(pores.shape, faces)
    for z in range(0, pores.shape[0], 6):
        pc.add(pores[z:z + 6], smp[z:z + 6] if with_sample else None)
    r = pc.result()
    connected, perc = _reference_connectivity(pores.astype(bool), smp, faces)
    assert r["connected_porosity"] == pytest.approx(connected, abs=1e-12)
    porosity = (pores.astype(bool) & smp).sum() / smp.sum()
    assert r["connected_porosity"] + r["isolated_porosity"] == pytest.approx(porosity)
    for got, want, yes in zip(r["percolating_porosity_zyx"], perc, r["percolates_zyx"]):
        assert (got is None and want is None and yes is None) or (got == pytest.approx(want, abs=1e-12)
                                                                  and yes == (want > 0))


# -- local thickness ----------------------------------------------------------------------------------


def _brute_thickness(pores):
    """max r such that some centre with distance >= r lies closer than r: every voxel pair, directly."""
    d = distance_map(pores)
    pts = np.argwhere(pores)
    out = np.zeros(pores.shape, np.int16)
    for v in pts:
        dist = np.sqrt(((pts - v) ** 2).sum(axis=1))
        best = 0
        for r in range(1, int(d.max()) + 1):
            if np.any((d[tuple(pts.T)] >= r) & (dist < r)):
                best = r
        out[tuple(v)] = best
    return out


def test_thickness_equals_its_brute_force_definition():
    pores = _blobs((12, 12, 12), 3, 1.2, 0.48)
    assert np.array_equal(thickness_radii(pores), _brute_thickness(pores))


def test_thickness_of_a_ball_and_a_plate():
    n = 31
    z, y, x = np.indices((n, n, n)) - 15
    ball = (z * z + y * y + x * x <= 12 * 12).astype(np.uint8)
    radii = thickness_radii(ball)[ball == 1]
    # the inscribed ball (radius floor of the centre's distance, 12) covers all but the outermost shell
    assert radii.max() == 12 and np.mean(radii == 12) > 0.9
    plate = np.zeros((40, 40, 40), np.uint8)
    plate[:, :, 10:19] = 1  # 9 voxels: its middle lies 5 from the solid on either side
    r = thickness_radii(plate)[:, :, 10:19]
    assert np.all(r == 5)  # a ball of radius 5 at the middle covers what is closer than 5: all of it


@pytest.mark.parametrize("sampling", [(1.0, 1.0, 1.0), (2.0, 1.0, 1.0)])
def test_streamed_thickness_equals_whole(sampling):
    pores = _blobs((46, 30, 30), 11, 2.5, 0.5)
    whole = thickness_radii(pores, sampling)
    read = lambda a, b: pores[a:b]  # noqa: E731
    assert largest_distance(read, pores.shape[0], 5, sampling) == distance_map(pores, sampling).max()
    got = np.concatenate([r for _, _, r in streamed_thickness(read, pores.shape[0], 5, sampling)])
    assert np.array_equal(got, whole)


# -- the command ----------------------------------------------------------------------------------


def _write(path, vol, spacing=(0.01, 0.01, 0.01), units=True):
    img = nib.Nifti1Image(np.ascontiguousarray(np.asarray(vol, np.uint8).T), np.diag([*spacing[::-1], 1.0]))
    if units:
        img.header.set_xyzt_units("mm")
    else:
        img.header.set_xyzt_units(0)
    nib.save(img, path)
    return path


def test_analyze_streamed_under_a_small_budget_equals_whole(tmp_path):
    from ctpore.data.io.geometry import geometry_from_array
    from ctpore.pipelines.analysis import analyze_volume

    pores = _blobs((64, 96, 96), 5, 2.0, 0.52)
    smp = _core(pores.shape)
    geom = geometry_from_array(pores.shape, (0.01, 0.01, 0.01))
    from ctpore.pipelines.budget import BASE_BYTES, MARGIN_BYTES

    whole = analyze_volume(pores, geom, sample=smp)
    # a budget of 12 slices: slabs, a distance map in a file, and 3D tiles for the thickness
    budget = 24 * 12 * pores.shape[1] * pores.shape[2]
    small = analyze_volume(pores, geom, sample=smp, memory_gb=(BASE_BYTES + MARGIN_BYTES + budget) / 2**30,
                           tmp_dir=tmp_path)
    assert small["slab_slices"] == 12 and small["thickness_tile"].split("x")[1] != "96", small["thickness_tile"]
    assert whole["thickness_tile"].startswith("64x96x96")
    for k in whole:
        if k not in ("seconds", "slab_slices", "thickness_tile"):
            assert small[k] == whole[k], k
    assert list(tmp_path.iterdir()) == []  # the maps' files were nameless
    # the figures against their own whole-volume definitions
    inside = pores.astype(bool) & smp
    assert whole["porosity"] == inside.sum() / smp.sum()
    radii = thickness_radii(inside, (1.0, 1.0, 1.0))
    assert whole["psd_counts"] == np.bincount(radii.ravel()).tolist()
    # the drainage curve against PoreSpy's algorithm (porosimetry, method "dt") on the whole volume
    inlet = whole["faces_zyx"][0][0]
    drained = _drainage_by_definition(inside, inlet)
    assert whole["drainage"]["inlet_slice"] == inlet and drained.any()
    assert drainage_matches(whole["drainage"], drained, int(inside.sum()), 0.01)


def test_drainage_fills_an_ink_bottle_only_at_its_neck(tmp_path):
    """A wide chamber behind a narrow channel from the top face (an ink bottle): the local thickness
    sees the chamber's size, the drainage fills it only once the fluid passes the channel's; a
    chamber reached from no face is never filled; in a file (a small budget) as in memory, and as
    PoreSpy's algorithm gives it."""
    from ctpore.data.io.geometry import geometry_from_array
    from ctpore.pipelines.analysis import analyze_volume
    from ctpore.pipelines.budget import BASE_BYTES, MARGIN_BYTES

    pores = np.zeros((120, 32, 32), np.uint8)
    pores[:12, 14:19, 14:19] = 1            # a channel 5 voxels wide from the top face
    pores[10:26, 6:27, 6:27] = 1            # a chamber 21 wide (and 16 high) below it
    pores[30:36, 10:16, 10:16] = 1          # a closed cavity
    geom = geometry_from_array(pores.shape, (0.01, 0.01, 0.01))
    whole = analyze_volume(pores, geom)
    drained = _drainage_by_definition(pores.astype(bool), 0)
    chamber = drained[18, 16, 16]
    assert chamber == 3 and 2 * chamber < whole["thickness_d90"] / 0.01  # the neck's radius, not the chamber's
    assert not drained[33].any()  # the cavity
    assert whole["drainage"]["inlet_slice"] == 0
    assert drainage_matches(whole["drainage"], drained, int(pores.sum()), 0.01)
    assert whole["drainage"]["invaded"][-1] == pytest.approx(1 - 216 / pores.sum())
    budget = 24 * 42 * pores.shape[1] * pores.shape[2]  # slabs of 42 slices, the maps in files
    small = analyze_volume(pores, geom, memory_gb=(BASE_BYTES + MARGIN_BYTES + budget) / 2**30, tmp_dir=tmp_path)
    assert small["slab_slices"] < pores.shape[0] and small["drainage"] == whole["drainage"]


def _drainage_by_definition(pores: np.ndarray, inlet: int) -> np.ndarray:
    """PoreSpy 3.2's porosimetry (drainage_dt, smooth, its default sizes) written out on the whole
    volume: for each distinct distance r of a pore voxel, from the largest, the pore voxels whose
    distance rounded down is at least r and that join the inlet plane (6-connected), the voxels closer
    than r to them, each voxel keeping its first r."""
    dt = ndi.distance_transform_edt(pores)
    level = np.floor(dt)
    out = np.zeros(pores.shape)
    for r in np.unique(dt[pores])[::-1]:
        labels, _ = ndi.label(level >= r)
        kept = np.isin(labels, np.unique(labels[inlet][labels[inlet] > 0]))
        if kept.any():
            out[(out == 0) & (ndi.distance_transform_edt(~kept) < r)] = r
    return out * pores


def test_the_command_writes_every_output_with_registered_keys(tmp_path):
    from click.testing import CliRunner

    from ctpore.app.cli import cli
    from ctpore.data.metrics import METRICS

    pores = _blobs((40, 48, 48), 9, 2.0, 0.5)
    _write(tmp_path / "rock_pores.nii.gz", pores)
    _write(tmp_path / "rock_sample.nii.gz", _core(pores.shape))
    res = CliRunner().invoke(cli, ["analyze", str(tmp_path / "rock_pores.nii.gz"), "--json"])
    assert res.exit_code == 0, res.output
    rec = json.loads(res.output)
    for name in ("rock_analysis.json", "rock_thickness.nii.gz", "rock_psd.csv", "rock_psd.png", "rock_drainage.csv"):
        assert (tmp_path / name).exists(), name
    assert rec["sample"].endswith("rock_sample.nii.gz")  # found beside the pores
    registered = {m.key for m in METRICS}
    figures = [k for k in rec if k not in ("source", "sample", "prob", "spacing_mm_zyx", "thickness_map_unit",
                                          "faces_zyx", "largest_radius", "seconds", "memory_gb", "outputs")]
    assert set(figures) <= registered and "thickness_d50_mm" in figures
    thick = np.asarray(nib.load(tmp_path / "rock_thickness.nii.gz").dataobj).T
    assert thick.shape == pores.shape and thick[~_core(pores.shape)].max() == 0
    rows = (tmp_path / "rock_psd.csv").read_text().splitlines()
    assert rows[0].startswith("diameter_mm,") and float(rows[-1].split(",")[-1]) == pytest.approx(1.0)


def test_unknown_units_name_the_figures_per_voxel(tmp_path):
    from ctpore.pipelines.analysis_run import analyze

    _write(tmp_path / "a_pores.nii.gz", _blobs((20, 24, 24), 2), units=False)
    rec = analyze(tmp_path / "a_pores.nii.gz")
    assert "surface_area_voxel2" in rec and "thickness_d50_voxel" in rec and "surface_area_mm2" not in rec
    assert rec["spacing_mm_zyx"] is None


def test_a_grey_volume_is_refused_in_one_line_and_nothing_is_left(tmp_path):
    from click.testing import CliRunner

    from ctpore.app.cli import main

    grey = np.random.default_rng(0).integers(0, 200, (16, 16, 16)).astype(np.uint8)
    _write(tmp_path / "g_pores.nii.gz", grey)
    with pytest.raises(SystemExit) as exc:
        main(["analyze", str(tmp_path / "g_pores.nii.gz")])
    assert exc.value.code == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g_pores.nii.gz"]
    del CliRunner


def test_the_edt_package_and_scipy_give_the_same_thickness(monkeypatch):
    pytest.importorskip("edt", reason="the analysis extra's edt is not installed: nothing to compare")
    pores = _blobs((30, 34, 28), 4, 2.0, 0.5)
    for sampling in ((1.0, 1.0, 1.0), (2.0, 1.0, 1.0)):
        fast = thickness_radii(pores, sampling)
        with monkeypatch.context() as m:
            m.setitem(__import__("sys").modules, "edt", None)  # import edt then fails: scipy's transform
            slow = thickness_radii(pores, sampling)
        assert np.array_equal(fast, slow)


def _turned_block(shape, deg, half=(24.0, 20.0)):
    """A block turned by ``deg`` in the slice plane (the voxels whose centre lies inside), and its
    own coordinates: ``u`` along the side nearest x, ``v`` along the side nearest y (from its centre)."""
    a = math.radians(deg)
    z, y, x = np.indices(shape, dtype=np.float64)
    y, x = y - (shape[1] - 1) / 2, x - (shape[2] - 1) / 2
    u, v = x * math.cos(a) + y * math.sin(a), -x * math.sin(a) + y * math.cos(a)
    return (np.abs(u) <= half[0]) & (np.abs(v) <= half[1]), z, u, v


@pytest.mark.parametrize("deg", [20.0, -33.0])
def test_a_turned_block_percolates_along_its_own_sides(deg):
    """A block turned in the slice plane has faces across y and x on slanted planes. A channel along
    its side nearest x joins those two faces and no others; one along z joins top and bottom; a blob
    inside joins none. The percolating porosity along each of the block's axes is its channel's
    voxels (counted from the construction) over the sample's, streamed as whole."""
    from ctpore.data.percolation import TurnedFace

    shape = (20, 84, 84)
    smp, z, u, v = _turned_block(shape, deg)
    along_u = (np.abs(v - 8) <= 2.5) & (np.abs(z - 10) <= 2.5) & smp  # face to face across x
    along_z = (np.hypot(u + 10, v + 8) <= 3.0) & smp  # top to bottom
    blob = np.hypot(np.hypot(u - 8, v + 8), z - 10) <= 4.0
    pores = (along_u | along_z | blob).astype(np.uint8)
    counts = plane_counts(smp, shape)
    footprint = smp.any(axis=0)
    faces = sample_faces(counts, shape, footprint)
    assert faces[0] == (0, shape[0] - 1)
    assert isinstance(faces[1], TurnedFace) and faces[1].turned_deg == pytest.approx(deg, abs=1.0)
    assert sample_faces(counts, shape)[1:] == [None, None]  # without the footprint: no faces across
    n = smp.sum()
    for slab in (3, shape[0]):
        pc = PoreConnectivity(shape, faces)
        for z0 in range(0, shape[0], slab):
            pc.add(pores[z0:z0 + slab], smp[z0:z0 + slab])
        r = pc.result()
        assert r["percolates_zyx"] == [True, False, True]
        assert r["percolating_porosity_zyx"] == pytest.approx([along_z.sum() / n, 0.0, along_u.sum() / n], abs=1e-12)


def test_the_analysis_of_a_turned_block_says_its_faces_are_turned():
    """Through analyze_volume (as napari's dock runs it): the record gives the turned faces and the
    dock's text says the percolation across y and x is along the block's sides."""
    from ctpore.app.napari.measure import analyze_layer, figures_text

    shape = (12, 72, 72)
    smp, z, u, v = _turned_block(shape, 25.0, half=(20.0, 18.0))
    pores = ((np.abs(v) <= 2.5) & (np.abs(z - 6) <= 2.5) & smp).astype(np.uint8)  # across x, face to face
    res = analyze_layer(pores, (0.01, 0.01, 0.01), smp)
    assert res["faces_zyx"][1] == res["faces_zyx"][2] == {"turned_deg": pytest.approx(25.0, abs=1.0)}
    assert res["percolates_zyx"] == [False, False, True]
    assert "along the block's sides, turned" in figures_text(res)


def test_a_core_has_no_turned_faces():
    smp = np.broadcast_to(_core((8, 60, 60))[4], (8, 60, 60))
    assert smp.any()
    faces = sample_faces(plane_counts(smp, smp.shape), smp.shape, smp.any(axis=0))
    assert faces[1:] == [None, None]


def test_reconstruct_with_analyze_puts_the_figures_in_the_metrics(tmp_path):
    from ctpore.data.synthetic import make_pair
    from ctpore.pipelines.reconstruct import reconstruct_file

    scan, _label, _ = make_pair(2800123, shape=(24, 40, 40), family="vesicles")
    img = nib.Nifti1Image(np.ascontiguousarray(scan.T.astype(np.float32)), np.diag([0.01, 0.01, 0.01, 1.0]))
    img.header.set_xyzt_units("mm")
    nib.save(img, tmp_path / "s.nii.gz")
    out = reconstruct_file(tmp_path / "s.nii.gz", tmp_path / "out", "otsu", analyze=True, sample="all")
    m = out["result"]
    rec = json.loads((tmp_path / "out" / "s_analysis.json").read_text())
    for key in ("thickness_d50_mm", "surface_area_mm2", "connected_porosity", "percolating_porosity_zyx"):
        assert m[key] == rec[key], key
    assert rec["porosity"] == m["porosity"] and rec["euler_number"] == m["euler_number"]
    assert rec["porosity_expected"] is not None  # the probability beside the pores was read


def test_an_ome_zarr_pore_store_gives_an_ome_zarr_thickness_map(tmp_path):
    pytest.importorskip("zarr", reason="OME-Zarr needs the formats extra (zarr)")
    from ctpore.data.io import geometry_from_array, load_scan
    from ctpore.data.io.omezarr_write import OmeZarrWriter
    from ctpore.pipelines.analysis_run import analyze

    pores = _blobs((20, 32, 32), 6)
    with OmeZarrWriter(tmp_path / "c_pores.ome.zarr", geometry_from_array(pores.shape, (0.02, 0.01, 0.01)),
                       np.uint8) as w:
        w.write(pores)
    rec = analyze(tmp_path / "c_pores.ome.zarr")
    with load_scan(tmp_path / "c_thickness.ome.zarr") as scan:
        thick = scan.read()
    radii = thickness_radii(pores, (2.0, 1.0, 1.0))
    assert np.array_equal(thick, (2.0 * radii * 0.01).astype(np.float32))
    assert rec["thickness_d50_mm"] is not None and rec["spacing_mm_zyx"] == [0.02, 0.01, 0.01]


def test_a_disk_array_reads_and_writes_windows(tmp_path):
    from ctpore.data.thickness import DiskArray

    a = np.random.default_rng(0).random((7, 9, 11)).astype(np.float32)
    d = DiskArray(tmp_path, a.shape, np.float32)
    assert list(tmp_path.iterdir()) == []  # nameless from the start
    d[:] = a
    d[2:5, 3:8, 1:10] = 2 * a[2:5, 3:8, 1:10]
    a[2:5, 3:8, 1:10] *= 2
    assert np.array_equal(d[:], a) and np.array_equal(d[1:6, 0:4, 5:11], a[1:6, 0:4, 5:11])
    assert np.array_equal(d[3], a[3:4])
    d.close()


def test_a_killed_analysiss_temporary_is_removed_and_a_live_ones_kept(tmp_path):
    import os
    import subprocess
    import sys

    from ctpore.atomic import host_tag
    from ctpore.pipelines.analysis_run import analyze

    _write(tmp_path / "k_pores.nii.gz", _blobs((20, 24, 24), 3))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid no longer runs
    orphan = tmp_path / f".k_thickness.tmp-{host_tag()}-{dead.pid}-0badc0de.nii.gz"
    live = tmp_path / f".k_thickness.tmp-{host_tag()}-{os.getpid()}-0a0a0a0a.nii.gz"  # a run still writing
    for p in (orphan, live):
        p.write_bytes(b"partial")
    analyze(tmp_path / "k_pores.nii.gz")
    assert not orphan.exists() and live.exists()
    assert (tmp_path / "k_thickness.nii.gz").exists()
