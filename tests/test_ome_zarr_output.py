"""--output-format ome-zarr: the same volumes as the NIfTI outputs, a pyramid of every second voxel,
the spacing in the store, whole or not at all, through reconstruct, batch and napari's reader."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from helpers import run_cli

zarr = pytest.importorskip("zarr")

from ctpore.data.io import geometry_from_array, load_scan  # noqa: E402
from ctpore.data.io.omezarr_write import OmeZarrWriter, level_shapes  # noqa: E402
from ctpore.data.synthetic import make_pair  # noqa: E402
from ctpore.pipelines.disk import run_needs  # noqa: E402
from ctpore.pipelines.outputs import output_paths  # noqa: E402


def nifti(path: Path, vol: np.ndarray, spacing=(0.02, 0.01, 0.01)) -> Path:
    img = nib.Nifti1Image(np.ascontiguousarray(vol.T), np.diag([spacing[2], spacing[1], spacing[0], 1.0]))
    img.header.set_xyzt_units("mm")
    nib.save(img, str(path))
    return path


def levels(store: Path) -> list[np.ndarray]:
    attrs = json.loads((store / ".zattrs").read_text())["multiscales"][0]
    return [zarr.open_array(str(store / d["path"]), mode="r")[:] for d in attrs["datasets"]]


def test_the_writer_keeps_every_voxel_and_every_second_one_per_level(tmp_path):
    """Slabs of uneven sizes (none aligned with the chunks) against numpy's own slicing."""
    rng = np.random.default_rng(0)
    vol = rng.integers(0, 1000, (37, 530, 300)).astype(np.float32)
    geom = geometry_from_array(vol.shape, (0.5, 0.1, 0.2))
    with OmeZarrWriter(tmp_path / "v.ome.zarr", geom, np.float32) as w:
        z = 0
        while z < vol.shape[0]:
            n = int(rng.integers(1, 9))
            w.write(vol[z:z + n])
            z += n
    got = levels(tmp_path / "v.ome.zarr")
    assert [g.shape for g in got] == level_shapes(vol.shape) and len(got) == 3  # 530 -> 265 -> 133
    for k, g in enumerate(got):
        assert np.array_equal(g, vol[::2**k, ::2**k, ::2**k])
    ms = json.loads((tmp_path / "v.ome.zarr" / ".zattrs").read_text())["multiscales"][0]
    assert [d["coordinateTransformations"][0]["scale"] for d in ms["datasets"]] == \
        [[0.5 * 2**k, 0.1 * 2**k, 0.2 * 2**k] for k in range(3)]
    assert [a["unit"] for a in ms["axes"]] == ["millimeter"] * 3
    with load_scan(tmp_path / "v.ome.zarr") as scan:  # ctpore reads back what it wrote
        assert scan.geometry.spacing_mm == (0.5, 0.1, 0.2) and np.array_equal(scan.read(), vol)
    assert [p.name for p in tmp_path.iterdir()] == ["v.ome.zarr"]


def test_a_failed_write_leaves_nothing_and_an_old_store_whole(tmp_path):
    vol = np.ones((6, 20, 20), np.uint8)
    geom = geometry_from_array(vol.shape, (1.0, 1.0, 1.0))
    with OmeZarrWriter(tmp_path / "v.ome.zarr", geom, np.uint8) as w:
        w.write(vol)
    with pytest.raises(RuntimeError), OmeZarrWriter(tmp_path / "v.ome.zarr", geom, np.uint8) as w:
        w.write(vol[:3] * 0)
        raise RuntimeError("killed half-way")
    assert [p.name for p in tmp_path.iterdir()] == ["v.ome.zarr"]
    assert np.array_equal(levels(tmp_path / "v.ome.zarr")[0], vol)  # the old store, untouched
    with pytest.raises(ValueError, match="never written"), OmeZarrWriter(tmp_path / "v.ome.zarr", geom, np.uint8) as w:
        w.write(vol[:3])
    assert [p.name for p in tmp_path.iterdir()] == ["v.ome.zarr"]
    with OmeZarrWriter(tmp_path / "v.ome.zarr", geom, np.uint8) as w:  # replaced whole
        w.write(vol * 0)
    assert not levels(tmp_path / "v.ome.zarr")[0].any() and len(list(tmp_path.iterdir())) == 1


def test_reconstruct_writes_the_same_volumes_as_nifti(tmp_path, capsys):
    scan, _truth, _ = make_pair(2, shape=(24, 40, 40))
    src = nifti(tmp_path / "s.nii", scan)
    for fmt, out in (("nifti", "a"), ("ome-zarr", "b")):
        code, _o, err = run_cli(["reconstruct", src, "-o", tmp_path / out, "--method", "otsu",
                                 "--output-format", fmt], capsys)
        assert code == 0, err
    for kind in ("pores", "prob"):
        want = np.asarray(nib.load(str(tmp_path / "a" / f"s_{kind}.nii.gz")).dataobj).T
        got = levels(tmp_path / "b" / f"s_{kind}.ome.zarr")
        assert got[0].dtype == want.dtype and np.array_equal(got[0], want)
    a, b = (json.loads((tmp_path / d / "s_metrics.json").read_text()) for d in "ab")
    for t in ("seconds", "stage_seconds"):  # timings
        a.pop(t), b.pop(t)
    assert a == b  # the same figures, whatever the format
    ms = json.loads((tmp_path / "b" / "s_pores.ome.zarr" / ".zattrs").read_text())["multiscales"][0]
    assert ms["datasets"][0]["coordinateTransformations"][0]["scale"] == b["spacing_mm_zyx"] == [0.02, 0.01, 0.01]
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["s_metrics.json", "s_pores.ome.zarr",
                                                                  "s_prob.ome.zarr"]


def test_a_stem_holds_one_runs_volumes_whatever_the_format(tmp_path, capsys):
    scan, _truth, _ = make_pair(3, shape=(16, 32, 32))
    src = nifti(tmp_path / "s.nii", scan)
    assert run_cli(["reconstruct", src, "-o", tmp_path / "o", "--method", "otsu"], capsys)[0] == 0
    code, _o, err = run_cli(["reconstruct", src, "-o", tmp_path / "o", "--method", "otsu",
                             "--output-format", "ome-zarr"], capsys)
    assert code == 2 and "output exists" in err and "--overwrite" in err
    assert (tmp_path / "o" / "s_pores.nii.gz").exists()  # the earlier outputs are kept
    code, _o, err = run_cli(["reconstruct", src, "-o", tmp_path / "o", "--method", "otsu",
                             "--output-format", "ome-zarr", "--overwrite"], capsys)
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["s_metrics.json", "s_pores.ome.zarr",
                                                                  "s_prob.ome.zarr"]


def test_the_disk_estimate_counts_the_stores():
    shape = (100, 200, 300)
    voxels = 100 * 200 * 300
    needs = {n.what: n.nbytes for n in run_needs(shape, output_paths("s.nii", "out", "ome-zarr"), spool=True)}
    assert needs["prob output"] >= 4 * voxels * 8 // 7 and needs["pores output"] >= voxels * 8 // 7
    assert "output slabs" not in needs  # stores are written in z order: nothing waits in another axis order
    nifti_needs = {n.what for n in run_needs(shape, output_paths("s.nii", "out"), spool=True)}
    assert "output slabs" in nifti_needs


def test_the_commands_offer_every_output_format():
    from click.testing import CliRunner

    from ctpore.app.cli import cli
    from ctpore.pipelines.outputs import OUTPUT_FORMATS

    for command in ("reconstruct", "batch"):
        [opt] = [p for p in cli.commands[command].params if p.name == "output_format"]
        assert list(opt.type.choices) == list(OUTPUT_FORMATS), command
    assert "nifti|ome-zarr" in CliRunner().invoke(cli, ["reconstruct", "--help"]).output.replace(" ", "")


def test_batch_writes_and_resumes_ome_zarr(tmp_path, capsys):
    pytest.importorskip("distributed")
    for i in range(2):
        nifti(tmp_path / f"s{i}.nii", make_pair(i, shape=(16, 32, 32))[0])
    (tmp_path / "m.txt").write_text("s0.nii\ns1.nii\n")
    args = ["batch", tmp_path / "m.txt", "-o", tmp_path / "out", "--method", "otsu", "--workers", "1",
            "--output-format", "ome-zarr"]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    for i in range(2):
        want = run_cli(["reconstruct", tmp_path / f"s{i}.nii", "-o", tmp_path / "api", "--method", "otsu"], capsys)
        assert want[0] == 0
        pores = np.asarray(nib.load(str(tmp_path / "api" / f"s{i}_pores.nii.gz")).dataobj).T
        assert np.array_equal(levels(tmp_path / "out" / f"s{i}_pores.ome.zarr")[0], pores)
    code, out, err = run_cli(args, capsys)  # resumed: both are done in this format
    assert code == 0 and "0 done, 2 already done" in out, out


def test_napari_opens_a_store_lazily_level_by_level(tmp_path):
    pytest.importorskip("napari")
    from ctpore.app.napari.layers import scan_layer, volume_of

    vol = np.random.default_rng(1).random((10, 600, 40)).astype(np.float32)
    with OmeZarrWriter(tmp_path / "v.ome.zarr", geometry_from_array(vol.shape, (0.3, 0.1, 0.1)), np.float32) as w:
        w.write(vol)
    data, meta, kind = scan_layer(tmp_path / "v.ome.zarr")
    assert kind == "image" and meta["multiscale"] and meta["scale"] == (0.3, 0.1, 0.1)
    assert [d.shape for d in data] == [(10, 600, 40), (5, 300, 20), (3, 150, 10)]
    assert not any(isinstance(d, np.ndarray) for d in data)  # Zarr arrays: read when shown
    assert np.array_equal(volume_of(data), vol)  # reconstructing a multiscale layer uses its full level


def test_without_zarr_the_run_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    src = nifti(tmp_path / "s.nii", make_pair(4, shape=(16, 32, 32))[0])
    monkeypatch.setitem(__import__("sys").modules, "zarr", None)  # import zarr -> ImportError
    code, _o, err = run_cli(["reconstruct", src, "-o", tmp_path / "o", "--method", "otsu",
                             "--output-format", "ome-zarr"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "writing OME-Zarr needs the Python package zarr" in err and "pip install" in err
    assert not (tmp_path / "o").exists()  # nothing made, nothing computed
