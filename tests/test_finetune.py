"""``ctpore finetune``: sparse labels read and refused as the convention says, the hold-out, the
held-back figures against hand-made truths, the refit, and a short tuning that reloads and repeats."""

from __future__ import annotations

import json
import os

import nibabel as nib
import numpy as np
import pytest
from helpers import run_cli

from ctpore.data.io import read_volume
from ctpore.data.sparse_labels import PORE, SOLID, read_sparse_labels
from ctpore.errors import InputError
from ctpore.pipelines.finetune.holdout import HOLD_SHARE, held_figures, hold_out
from ctpore.pipelines.finetune.refit import refit_on_labels
from ctpore.pipelines.finetune.tune import EMA

SHAPE = (24, 40, 40)  # (Z, Y, X)


def _save(path, zyx, affine=None):
    img = nib.Nifti1Image(np.ascontiguousarray(np.asarray(zyx).T), np.diag([0.02, 0.02, 0.02, 1]) if affine is None
                          else affine)
    img.header.set_xyzt_units("mm")
    nib.save(img, path)
    return path


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    """A simulated scan, its truth, and sparse labels on three XY slices taken from the truth."""
    from ctpore.data.synthetic import make_pair

    tmp = tmp_path_factory.mktemp("ft")
    scan, truth, _ = make_pair(7, shape=SHAPE)
    labels = np.zeros(SHAPE, np.uint8)
    for z in (4, 12, 20):
        labels[z] = np.where(truth[z] == 1, PORE, SOLID)
    return {"scan": _save(tmp / "scan.nii.gz", scan), "truth": truth, "labels": _save(tmp / "lab.nii.gz", labels),
            "dense": _save(tmp / "dense.nii.gz", truth.astype(np.uint8)), "tmp": tmp, "array": labels}


# -- reading the labels ----------------------------------------------------------------------------


@pytest.mark.parametrize("case, want", [
    ("empty", "no voxel is labelled"),
    ("pore-only", "give --dense"),
    ("solid-only", "paint some pore"),
    ("values", "found also 7"),
    ("shape", "differs from the scan's"),
    ("affine", "affine"),
])
def test_bad_labels_are_refused_with_one_line_that_says_what_to_do(scene, case, want, tmp_path):
    lab = np.zeros(SHAPE, np.uint8)
    if case == "pore-only":
        lab[3, 5:9, 5:9] = 1
    elif case == "solid-only":
        lab[3] = 2
    elif case == "values":
        lab[3, 0, 0], lab[4] = 7, 2
        lab[5, 1, 1] = 1
    elif case == "shape":
        lab = np.ones((SHAPE[0] - 1, *SHAPE[1:]), np.uint8)
    path = _save(tmp_path / "l.nii.gz", lab, np.diag([0.04, 0.02, 0.02, 1]) if case == "affine" else None)
    if case == "affine":
        lab[2] = 2
        lab[2, :4, :4] = 1
        _save(path, lab, np.diag([0.04, 0.02, 0.02, 1]))
    _vol, geom = read_volume(scene["scan"])
    with pytest.raises(InputError, match=want):
        read_sparse_labels(path, geom)


def test_a_dense_truth_is_read_only_with_dense_and_then_labels_every_voxel(scene):
    _vol, geom = read_volume(scene["scan"])
    with pytest.raises(InputError, match="--dense"):
        read_sparse_labels(scene["dense"], geom)
    lab = read_sparse_labels(scene["dense"], geom, dense=True)
    np.testing.assert_array_equal(lab, np.where(scene["truth"] == 1, PORE, SOLID))


def test_the_command_refuses_unpaired_labels_and_leaves_nothing(scene, capsys, tmp_path):
    out = tmp_path / "w.safetensors"
    code, _o, err = run_cli(["finetune", scene["scan"], "--scan", scene["scan"], "--labels", scene["labels"],
                             "-o", out], capsys)
    assert code == 2 and "pair up" in err and len(err.strip().splitlines()) == 1
    code, _o, err = run_cli(["finetune", scene["scan"], "--labels", scene["dense"], "-o", out], capsys)
    assert code == 2 and "--dense" in err
    assert not out.exists() and not list(tmp_path.iterdir())


# -- the hold-out and the figures ------------------------------------------------------------------


def test_one_labelled_plane_in_three_is_held_back_in_the_view_painted():
    lab = np.zeros((10, 12, 14), np.uint8)
    for x in (1, 4, 7, 10, 13):  # YZ planes
        lab[:, :, x] = SOLID
        lab[2:5, 3:6, x] = PORE
    split = hold_out(lab)
    assert split.axis == 2 and split.planes == [1, 4, 7, 10, 13] and split.held_planes == [4, 13]
    assert not np.any((split.train != 0) & (split.held != 0))
    np.testing.assert_array_equal(np.where(split.held != 0, split.held, split.train), lab)


def test_with_fewer_planes_a_block_of_each_plane_is_held_back():
    lab = np.zeros((6, 50, 30), np.uint8)
    lab[2] = SOLID
    lab[2, 10:20, 5:15] = PORE
    split = hold_out(lab)
    share = np.count_nonzero(split.held) / np.count_nonzero(lab)
    assert split.held_planes == [] and abs(share - HOLD_SHARE) < 0.05
    rows = np.nonzero(split.held[2])[0]
    assert rows.min() >= np.nonzero(split.train[2])[0].max()  # a block: the last rows, apart from the rest


def test_the_boundary_shift_and_the_euler_numbers_against_drawn_squares():
    """A square pore predicted one voxel wider on every side reads about +1, one voxel narrower about
    -1, the same 0; the 2D Euler numbers are those of skimage on the held-back plane."""
    from skimage.measure import euler_number

    yy, xx = np.mgrid[:40, :40]
    disc = lambda r: (np.abs(yy - 20) <= r) & (np.abs(xx - 20) <= r)  # noqa: E731
    lab = np.zeros((9, 40, 40), np.uint8)
    for z in (1, 4, 7):
        lab[z] = np.where(disc(10), PORE, SOLID)
    lab[4, 2:5, 2:5] = PORE  # a second pore in the held-back plane only
    split = hold_out(lab)
    assert split.held_planes == [4]
    for r, want in ((10, 0.0), (11, 1.0), (9, -1.0)):
        prob = np.zeros(lab.shape, np.float32)
        prob[:] = disc(r)
        prob[4, 2:5, 2:5] = 1.0
        f = held_figures(prob, 0.5, split)
        assert abs(f["boundary_shift_vox"] - want) < 0.2, (r, f)
    f = held_figures(np.zeros(lab.shape, np.float32), 0.5, split)
    assert f["euler_2d"] == [[0, int(euler_number(lab[4] == PORE, connectivity=2))]] and f["euler_2d_error"] == 2


def test_the_refit_finds_the_labellers_threshold():
    """Labels whose pores end where the probability reaches 0.8 (a labeller who draws them thinner):
    the refitted threshold is 0.8, and the calibration maps the probabilities to those labels; with
    the z-neighbour refit in front (pulled towards the identity, so no exact threshold), its pores
    still agree with the labeller's almost everywhere."""
    rng = np.random.default_rng(3)
    prob = rng.random((4, 32, 32)).astype(np.float32)
    labels = np.where(prob >= 0.8, PORE, SOLID).astype(np.uint8)
    labels[1] = 0
    from ctpore.data.postprocess import Postprocessing

    post, tried = refit_on_labels([prob], [labels], Postprocessing(threshold=0.5), z_neighbours=False)
    assert post.threshold == pytest.approx(0.8) and post.calibration is not None
    assert tried["threshold_dice"][0.8] == pytest.approx(1.0)
    mixed, _ = refit_on_labels([prob], [labels], Postprocessing(threshold=0.5))
    pores = mixed.apply(prob)[0].astype(bool)
    truth = labels[labels > 0] == PORE
    agree = 2 * np.count_nonzero(pores[labels > 0] & truth) / (np.count_nonzero(pores[labels > 0]) + truth.sum())
    assert mixed.zmix is not None and agree > 0.97


def test_a_causal_networks_crops_end_at_the_drawn_slice_and_others_hold_it_anywhere():
    """PoreFormer's slice sees only the slices before it, so its crops end at the labelled voxel's
    slice (with the crop's full depth where the scan has it); a U-Net's crops hold the voxel anywhere."""
    from ctpore.models import PoreFormer, PoreFormerConfig
    from ctpore.models.unet import UNet3D
    from ctpore.pipelines.finetune.tune import CROP, _batch, _causal

    assert _causal(PoreFormer(PoreFormerConfig(level_channels=(8, 8), level_attention=(0, 1))))
    assert not _causal(UNet3D())
    vol = np.zeros((40, 70, 70), np.float32)
    lab = np.zeros(vol.shape, np.uint8)
    lab[30, 5:60, 5:60] = PORE
    lab[3, 5:60, 5:60] = SOLID  # nearer the top than a crop is deep
    points = [np.argwhere(lab != 0)]
    ends, starts = set(), set()
    for step in range(60):
        rng = np.random.default_rng([0, step])
        x, y, z0 = _batch(rng, [vol], [lab], points, CROP, causal=True)
        drawn = np.flatnonzero((y != 0).any(axis=(1, 2)))
        assert drawn.size == 1 and x.shape[0] == CROP[0]
        assert drawn[0] == x.shape[0] - 1 or (z0 == 0 and z0 + drawn[0] == 3)
        ends.add(int(z0 + drawn[0]))
        x, y, z0 = _batch(np.random.default_rng([0, step]), [vol], [lab], points, CROP, causal=False)
        starts.add(int(np.flatnonzero((y != 0).any(axis=(1, 2)))[0]))
    assert ends == {3, 30} and len(starts) > 3  # both drawn slices, and the U-Net's anywhere in its crop


# -- a short tuning ----------------------------------------------------------------------------------


def test_a_short_tuning_writes_weights_that_reload_repeat_and_name_themselves(scene, capsys):
    tmp = scene["tmp"]
    args = ["finetune", scene["scan"], "--labels", scene["labels"], "--steps", "3", "--seed", "1", "--json"]
    code, out1, err = run_cli([*args, "-o", tmp / "a.safetensors"], capsys)
    assert code == 0, err
    rep = json.loads(out1)
    assert {"before", "refit", "after"} <= set(rep) and rep["tuning"]["steps"] == 3
    code, _o, err = run_cli([*args, "-o", tmp / "b.safetensors"], capsys)
    assert code == 0, err
    from safetensors.torch import load_file

    from ctpore.models.weights import read_metadata

    a, b = load_file(tmp / "a.safetensors"), load_file(tmp / "b.safetensors")
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)  # the same seed: the same weights
    meta = read_metadata(tmp / "a.safetensors")
    prov = json.loads(meta["finetune"])
    assert prov["label_counts"][0]["pore"] + prov["label_counts"][0]["solid"] == 3 * SHAPE[1] * SHAPE[2]
    assert prov["steps"] == 3 and set(prov["held_back"]) == {"before", "refit", "after"}
    assert prov["ema"] == rep["tuning"]["ema"] == EMA
    for run in ("r1", "r2"):
        code, _o, err = run_cli(["reconstruct", scene["scan"], "-o", tmp / run, "--weights", tmp / "a.safetensors"],
                                capsys)
        assert code == 0, err
    m = json.loads((tmp / "r1" / "scan_metrics.json").read_text())
    assert "fine-tuned" in m["model"]["name"]
    for name in ("scan_pores.nii.gz", "scan_prob.nii.gz"):  # the files, byte for byte
        assert (tmp / "r1" / name).read_bytes() == (tmp / "r2" / name).read_bytes()


def test_calibrate_only_keeps_the_network(scene, capsys):
    from safetensors.torch import load_file

    from ctpore.models.weights import weights_dir

    out = scene["tmp"] / "c.safetensors"
    code, _o, err = run_cli(["finetune", scene["scan"], "--labels", scene["labels"], "--calibrate-only", "-o", out],
                            capsys)
    assert code == 0, err
    a, b = load_file(out), load_file(weights_dir() / "poreformer.safetensors")
    assert all(bool((a[k] == b[k]).all()) for k in b)


def test_the_commands_default_to_the_pipelines_number_of_steps():
    """``finetune`` and ``bench adapt`` state their default steps without importing the pipeline (a
    command starts light); they must be the pipeline's :data:`STEPS`, which the API and the tuning use."""
    import inspect

    from ctpore.app.bench_cli import bench
    from ctpore.app.finetune_cli import finetune as finetune_cmd
    from ctpore.pipelines.bench.adapt import bench_adapt
    from ctpore.pipelines.finetune import STEPS, finetune
    from ctpore.pipelines.finetune.tune import tune_network

    def option(cmd):
        return next(p.default for p in cmd.params if p.name == "steps")

    assert option(finetune_cmd) == option(bench.commands["adapt"]) == STEPS
    assert all(inspect.signature(f).parameters["steps"].default == STEPS for f in (finetune, tune_network, bench_adapt))


def test_bench_adapt_quick_runs_every_rung_and_writes_its_report(tmp_path, capsys):
    """``ctpore bench adapt --quick``: the other scanner's scan, every method and rung scored on the
    slices away from the labelled ones, and the report written with the command that wrote it."""
    code, out, err = run_cli(["bench", "adapt", "--quick", "-o", tmp_path, "--workdir", tmp_path / "w"], capsys)
    assert code == 0, err
    res = json.loads((tmp_path / "adapt.json").read_text())
    assert res["command"].startswith("ctpore bench adapt --quick")
    want = {"otsu", "poreformer", "unet2d", "unet3d", "poreformer refit k=3", "poreformer tuned k=1",
            "poreformer tuned k=3", "unet2d tuned k=3", "unet3d tuned k=3"}
    assert set(res["means"]) == want
    for m in res["means"].values():
        assert 0.0 <= m["mse"] <= 1.0 and 0.0 <= m["dice"] <= 1.0 and m["euler_error"] >= 0
    text = (tmp_path / "adapt.md").read_text()
    assert "| poreformer tuned k=3 |" in text and "](adapt.png)" in text
    assert f"seconds on {res['cpu']}." in text and f"{os.cpu_count()} cores" in res["cpu"]  # speed beside its CPU
    from PIL import Image

    with Image.open(tmp_path / "adapt.png") as im:  # two rows of four slices of the 64 x 64 quick scan, doubled
        assert im.size[0] > 4 * 2 * 64 and im.size[1] > 2 * 2 * 64


def test_the_other_scanner_and_labeller_are_what_the_bench_says():
    """The labeller's boundary lies a voxel outside (or inside) the truth's; the scored blocks keep
    their distance from every labelled slice; the scanner's pores are darker than its solid."""
    from ctpore.pipelines.bench.adapt import GAP, labeller, labelled_slices, other_scanner, scored_blocks

    truth = np.zeros((12, 32, 32), np.uint8)
    truth[:, 10:20, 10:20] = 1
    out, inn = labeller(truth, True), labeller(truth, False)
    assert out.sum() > truth.sum() > inn.sum() and np.all(out >= truth) and np.all(inn <= truth)
    zs = labelled_slices(64, 3)
    assert zs == [16, 32, 48]
    for z0, z1 in scored_blocks(64, zs):
        assert all(abs(z - s) >= GAP for z in range(z0, z1) for s in zs)
    scan = other_scanner(truth, np.random.default_rng(0)).astype(float)
    assert scan[:, 12:18, 12:18].mean() < scan[:, 24:, 24:].mean()


def test_the_real_geometry_is_scanned_once_and_labelled_a_voxel_inside_and_outside(tmp_path):
    """The bench's real-geometry cases: one scan of the label by the other scanner (its pores darker
    than its solid), and the label drawn by each labeller: the inside one's pores within the label's
    and the label's within the outside one's, every difference a voxel from the label's boundary."""
    from scipy import ndimage as ndi

    from ctpore.pipelines.bench.adapt import real_cases

    label = np.zeros((16, 32, 32), np.uint8)
    label[:, 8:20, 6:18] = 1
    label[:, 24:28, 22:30] = 1
    cases = real_cases(_save(tmp_path / "label.nii.gz", label))
    assert [c[0] for c in cases] == ["inside", "outside"]
    (_s1, scan_in, inside), (_s2, scan_out, outside) = cases
    assert np.array_equal(scan_in, scan_out) and scan_in.shape == label.shape
    assert scan_in[label == 1].mean() < scan_in[label == 0].mean()
    assert np.all(inside <= label) and np.all(label <= outside) and inside.sum() < label.sum() < outside.sum()
    # a voxel of the boundary: within one voxel (6-connected) of the other phase
    edge = np.where(label == 1, ndi.distance_transform_edt(label) <= 1,
                    ndi.distance_transform_edt(1 - label) <= 1)
    assert not np.any((inside != label) & ~edge) and not np.any((outside != label) & ~edge)


def test_the_adapt_report_gives_the_real_geometry_a_table_of_its_own(tmp_path):
    """The real geometry's rows come in their own section, one per labeller and method, and stay out
    of the simulated scans' tables."""
    from ctpore.pipelines.bench.adapt import write_adapt_report

    fig = {"mse": 0.0123, "dice": 0.9456, "euler_error": 7, "adapt_seconds": 12.3}
    sim = {"seed": 2700000, "family": "grains", "labeller": "inside", "methods": {"otsu": dict(fig)}}
    real = [{"seed": f"real-{side}", "family": "real: leopard_porespy", "labeller": side, "shape": [100, 90, 80],
             "methods": {"otsu": {**fig, "euler_error": 40 + i}}} for i, side in enumerate(("inside", "outside"))]
    res = {"shape": [24, 64, 64], "n_scans": 1, "means": {"otsu": fig}, "cases": [sim],
           "real": {"label": "label.nii.gz", "cases": real}}
    _j, md = write_adapt_report(res, tmp_path, "ctpore bench adapt")
    text = md.read_text()
    head, sep, tail = text.partition("## A real pore geometry")
    assert sep and "leopard_porespy, 100 x 90 x 80 voxels" in tail
    assert "| inside | otsu | 0.0123 | 0.946 | 40 | 12 |" in tail
    assert "| outside | otsu | 0.0123 | 0.946 | 41 | 12 |" in tail
    assert "| 40 |" not in head and "| 41 |" not in head
    assert json.loads((tmp_path / "adapt.json").read_text())["real"]["cases"][1]["labeller"] == "outside"


def _fragment_scene(side: int = 30, fragment: tuple = (1, 2)):
    """Three slices, the middle one labelled: one labelled pore, which the model sees as a sure
    square of ``side`` and, past a line it misses (p 0.05 < every threshold), a fragment of
    ``fragment`` pixels it is unsure of (p 0.6)."""
    n = side + 12
    prob = np.full((3, n, n), 0.01, np.float32)
    prob[:, 4:4 + side, 4:4 + side] = 0.99
    prob[:, 4:4 + side, 4 + side] = 0.05
    fy, fx = fragment
    prob[:, 6:6 + fy, 5 + side:5 + side + fx] = 0.6
    truth = np.zeros(prob.shape, bool)
    truth[:, 4:4 + side, 4:5 + side] = True
    truth[:, 6:6 + fy, 5 + side:5 + side + fx] = True
    labels = np.zeros(prob.shape, np.uint8)
    labels[1] = np.where(truth[1], PORE, SOLID)
    return prob, labels


def test_the_refit_chooses_the_pores_by_the_labelled_planes_topology_not_their_dice():
    """Keeping the unsure fragment raises the Dice a little and splits the one labelled pore in
    two; the evidence rule's confidence that drops it gives the labels' one component, and is chosen."""
    from ctpore.data.postprocess import Postprocessing
    from ctpore.data.topology import n_components

    prob, labels = _fragment_scene()
    post, tried = refit_on_labels([prob], [labels], Postprocessing(threshold=0.5, confidence=None),
                                  z_neighbours=False)
    cands = tried["candidates"]
    assert cands["z-refit none"]["dice"] > cands["z-refit 0.9"]["dice"]
    assert cands["z-refit none"]["euler_2d_error"] == 1 and cands["z-refit 0.9"]["euler_2d_error"] == 0
    assert post.confidence is not None and n_components(post.apply(prob)[0][1:2]) == 1


def test_the_topology_is_never_bought_with_more_than_a_sliver_of_dice():
    """The same, with a fragment too large to drop: the confidence that removes it has the labels'
    topology but costs more Dice than the slack allows, so the fragment stays."""
    from ctpore.data.postprocess import Postprocessing
    from ctpore.pipelines.finetune.refit import DICE_SLACK

    prob, labels = _fragment_scene(side=9, fragment=(4, 3))
    post, tried = refit_on_labels([prob], [labels], Postprocessing(threshold=0.5, confidence=0.9),
                                  z_neighbours=False)
    cands = tried["candidates"]
    assert cands["z-refit 0.9"]["euler_2d_error"] < cands["z-refit none"]["euler_2d_error"]
    assert cands["z-refit none"]["dice"] - cands["z-refit 0.9"]["dice"] > DICE_SLACK
    assert post.confidence is None


def test_where_every_candidate_draws_the_same_topology_the_weights_own_rules_stay():
    """Candidates that tie on the labelled planes' Euler numbers: the z-refitted probabilities and
    the weights' own confidence are kept (they were chosen on many scans; two planes cannot overrule
    them)."""
    from ctpore.data.postprocess import Postprocessing

    prob, labels = _fragment_scene(side=9, fragment=(4, 3))
    prob[prob == np.float32(0.6)] = 0.995  # the fragment now sure: every confidence keeps it
    labels[1, 4:13, 13] = 0  # and the line it is cut by not labelled
    post, tried = refit_on_labels([prob], [labels], Postprocessing(threshold=0.5, confidence=0.97))
    assert len({c["euler_2d_error"] for c in tried["candidates"].values()}) == 1
    assert post.confidence == 0.97 and tried["pores_on"] == "z-refit" and not post.pores_on_raw


def test_the_tuning_keeps_the_moving_average_of_the_weights_not_the_last_step():
    """The live weights follow the optimiser alone, so a tuning with and without the average takes
    the same step; after one step the average kept is ema * before + (1 - ema) * after."""
    import torch
    from helpers import small

    from ctpore.models import PoreFormer
    from ctpore.pipelines.finetune.tune import tune_network

    rng = np.random.default_rng(0)
    vol = rng.normal(size=(12, 32, 32)).astype(np.float32)
    train, held = np.zeros(vol.shape, np.uint8), np.zeros(vol.shape, np.uint8)
    train[[3, 9]], held[6] = PORE, PORE  # every labelled voxel pore: one step lowers the held-back MSE

    def tuned(ema):
        torch.manual_seed(0)
        model = PoreFormer(small())
        before = {k: v.clone() for k, v in model.state_dict().items()}
        rep = tune_network(model, [vol], [train], [held], steps=1, ema=ema, crop=(8, 32, 32))
        assert rep["best_step"] == 1  # the step was kept, not the start
        return before, model.state_dict()

    before, live = tuned(0.0)
    _before, avg = tuned(0.75)
    moved = [k for k, v in live.items() if v.is_floating_point() and not torch.equal(v, before[k])]
    assert moved
    for k in moved:
        assert torch.allclose(avg[k], 0.75 * before[k] + 0.25 * live[k], atol=1e-6)
        assert not torch.allclose(avg[k], live[k])
