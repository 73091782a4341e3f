"""One scan split into Z-slabs across a 2-worker Dask cluster gives the single run's outputs.

The truth is ``reconstruct_file`` in one process with the same options: every voxel of the pores,
the probability and the sample mask (every pyramid level), and every metric but the seconds (and
the split's own entry). Also: a worker killed mid-slab is run again to the same bytes, and a driver
killed mid-run leaves work that a rerun finishes, computing only the slabs it had not recorded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr")

from ctpore.data.io import geometry_from_array, save_volume  # noqa: E402
from ctpore.data.synthetic import make_pair  # noqa: E402
from ctpore.pipelines.reconstruct import reconstruct_file  # noqa: E402
from ctpore.pipelines.split import reconstruct_split  # noqa: E402
from helpers import run_cli  # noqa: E402

SLAB = 64  # slices a slab: 4 slabs of each 256-slice scan
SCANS = {"core.nii": ("core-air-offcentre", 5), "plain.nii.gz": (None, 6), "tube.tif": ("tube-gap", 7),
         "block.nii": ("block-turned", 8)}  # (a block's outline is voted over each slab of 16 slices)
NOT_COMPARED = {"seconds", "stage_seconds", "split"}


@pytest.fixture(scope="module")
def scans(tmp_path_factory):
    """Four 256-slice scans (an off-centre core in air, a plain stack, a core in a tube, a turned block)
    in three formats, and each one's single-process run."""
    folder = tmp_path_factory.mktemp("split")
    out = {}
    for name, (scene, seed) in SCANS.items():
        vol, _truth, info = make_pair(seed, shape=(256, 64, 64), scene=scene)
        spacing = tuple(info["scene"]["spacing_mm"]) if scene else (0.01, 0.01, 0.01)
        path = save_volume(folder / name, np.asarray(vol), geometry_from_array(vol.shape, spacing))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            single = reconstruct_file(path, folder / "one", output_format="ome-zarr")
        out[name] = (path, single)
    return folder, out


@pytest.fixture(scope="module")
def client():
    import dask

    with dask.config.set({"distributed.scheduler.allowed-failures": 3}), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                     dashboard_address=None) as cluster, distributed.Client(cluster) as c:
        yield c


def split(path, outdir, client, **kw) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return reconstruct_split(path, outdir, client, slab_slices=SLAB, **kw)


def assert_same(single: dict, got: dict, also_skip: tuple = ()) -> None:
    for kind in ("pores", "prob", "sample"):
        there = Path(single[kind]).exists()
        assert Path(got[kind]).exists() == there, kind
        if there:
            a, b = zarr.open_group(str(single[kind]), mode="r"), zarr.open_group(str(got[kind]), mode="r")
            assert sorted(a.array_keys()) == sorted(b.array_keys())
            for k in a.array_keys():
                assert np.array_equal(a[k][:], b[k][:]), (kind, k)
    m1, m2 = single["result"], got["result"]
    def compared(m):
        return {k: v for k, v in m.items() if k not in NOT_COMPARED and k not in also_skip}

    assert compared(m1) == compared(m2)


@pytest.mark.parametrize("name", list(SCANS))
def test_a_scan_split_into_four_slabs_equals_the_single_run(scans, client, name, tmp_path):
    folder, runs = scans
    path, single = runs[name]
    got = split(path, tmp_path, client)
    assert got["result"]["split"]["slabs"] == 4
    assert_same(single, got)
    if name != "plain.nii.gz":  # a sample was found: the test compares its mask too
        assert single["result"]["sample"]["outside_voxels"] > 0
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no work folder, no store left behind


@pytest.mark.parametrize("options", [{"chunk_slices": 40}, {"sample": "all", "sample_margin": 2}],
                         ids=["chunks-of-40", "sample-all"])
def test_a_split_run_with_options_equals_the_single_run_with_them(scans, client, tmp_path, options):
    """Chunks of 40 slices do not divide the slabs of 64 (a slab's last chunk runs past it, as in the
    single run); ``--sample all`` takes every voxel of a core in air (a margin is not applied, and
    both say why). Voxels, metrics and warnings the same."""
    path, _ = scans[1]["core.nii"]
    with warnings.catch_warnings(record=True) as w1:
        warnings.simplefilter("always")
        single = reconstruct_file(path, tmp_path / "one", output_format="ome-zarr", **options)
    with warnings.catch_warnings(record=True) as w2:
        warnings.simplefilter("always")
        got = reconstruct_split(path, tmp_path / "split", client, slab_slices=SLAB, **options)
    assert_same(single, got)
    assert [(x.category, str(x.message)) for x in w1] == [(x.category, str(x.message)) for x in w2]


def test_a_scan_without_contrast_split_equals_the_single_run(client, tmp_path):
    """A constant scan (the model is not run: every voxel solid, probability 0) and its warnings."""
    vol = np.full((192, 40, 40), 1200.0, np.float32)
    path = save_volume(tmp_path / "flat.nii", vol, geometry_from_array(vol.shape, (0.01, 0.01, 0.01)))
    with warnings.catch_warnings(record=True) as w1:
        warnings.simplefilter("always")
        single = reconstruct_file(path, tmp_path / "one", output_format="ome-zarr")
    with warnings.catch_warnings(record=True) as w2:
        warnings.simplefilter("always")
        got = reconstruct_split(path, tmp_path / "split", client, slab_slices=SLAB)
    assert_same(single, got)
    assert [str(x.message) for x in w1] == [str(x.message) for x in w2]


def test_a_worker_killed_mid_slab_is_run_again_to_the_same_bytes(scans, client, tmp_path):
    path, single = scans[1]["core.nii"]
    result, errors = {}, []

    def driver():
        try:
            result["got"] = split(path, tmp_path, client)
        except BaseException as exc:  # noqa: BLE001 (the test thread reports it)
            errors.append(exc)

    pids = client.run(os.getpid)  # {worker address: its process}
    thread = threading.Thread(target=driver)
    thread.start()
    killed = None
    deadline = time.time() + 120
    while killed is None and time.time() < deadline and thread.is_alive():
        busy = [w for w, tasks in client.processing().items() if tasks]
        if busy:
            killed = busy[0]
            os.kill(pids[killed], signal.SIGKILL)  # the worker's process dies mid-task
        time.sleep(0.02)
    thread.join(300)
    assert killed is not None, "no task was ever seen running"
    assert not errors, errors
    assert killed not in set(client.scheduler_info()["workers"])  # it really died (its nanny started another)
    assert_same(single, result["got"])


def _kill_driver_after_first_record(path, outdir, client) -> list:
    """Start a split run in a process of its own, SIGKILL it once one slab is recorded; the records."""
    work = Path(outdir) / f".{Path(path).name.split('.')[0]}.split"
    code = textwrap.dedent(f"""
        import warnings
        from distributed import Client
        from ctpore.pipelines.split import reconstruct_split
        warnings.simplefilter("ignore")
        reconstruct_split({str(path)!r}, {str(outdir)!r}, Client({client.scheduler.address!r}), slab_slices={SLAB})
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "CTPORE_NO_PROGRESS": "1"})
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not list(work.glob("*/record-*.json")):
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    first = list(work.glob("*/record-*.json"))
    assert 1 <= len(first) < 4, f"the driver was killed with {len(first)} of 4 slabs recorded"
    assert not (Path(outdir) / "core_metrics.json").exists()  # nothing looks finished
    return first


def test_a_driver_killed_mid_run_is_finished_by_a_rerun_that_computes_only_the_missing_slabs(scans, client, tmp_path):
    path, single = scans[1]["core.nii"]
    _kill_driver_after_first_record(path, tmp_path, client)
    time.sleep(2.0)  # slabs still running on the workers when the driver died end (and record themselves)
    work = tmp_path / ".core.split"
    done = {p.name: p.read_text() for p in work.glob("*/record-*.json")}
    got = split(path, tmp_path, client)
    assert_same(single, got)
    assert not work.exists()
    assert got["result"]["split"]["slabs_done_before"] == len(done) < 4  # only the missing slabs were computed
    assert all("outside" in json.loads(text) for text in done.values())


def test_a_rerun_with_other_options_never_takes_the_killed_runs_work(scans, client, tmp_path):
    """The killed driver's slabs still run on the workers while a rerun with another margin starts
    (no wait): none of their records or store writes reach the rerun's outputs."""
    path, _ = scans[1]["core.nii"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        single = reconstruct_file(path, tmp_path / "one", output_format="ome-zarr", sample_margin=2)
    _kill_driver_after_first_record(path, tmp_path / "split", client)
    got = split(path, tmp_path / "split", client, sample_margin=2)
    assert got["result"]["split"]["slabs_done_before"] == 0
    assert_same(single, got)
    assert not any(p.name.startswith(".") for p in (tmp_path / "split").iterdir())


def test_a_one_process_run_removes_a_killed_split_runs_work(scans, client, tmp_path):
    path, _ = scans[1]["core.nii"]
    _kill_driver_after_first_record(path, tmp_path, client)
    time.sleep(2.0)  # the killed driver's running slabs end
    assert (tmp_path / ".core.split").is_dir() and list(tmp_path.glob(".core_*.split*.ome.zarr"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reconstruct_file(path, tmp_path, output_format="ome-zarr")
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_the_command_line_splits_a_scan_on_a_local_cluster(scans, tmp_path, capsys):
    path, single = scans[1]["core.nii"]
    code, out, _err = run_cli(["reconstruct", path, "-o", tmp_path, "--workers", "2", "--slab-slices", SLAB], capsys)
    assert code == 0, out
    got = json.loads((tmp_path / "core_metrics.json").read_text())
    assert got["split"]["slabs"] == 4 and got["porosity"] == single["result"]["porosity"]
    assert got["n_pores"] == single["result"]["n_pores"]


@pytest.mark.parametrize("args, what", [
    (["--truth", "x.nii"], "--truth"), (["--analyze"], "--analyze"), (["--method", "otsu"], "--method otsu"),
    (["--tmp-dir", "."], "--tmp-dir"), (["--sample", "mask.nii"], "--sample MASK")])
def test_what_a_split_run_does_not_take_is_refused_in_one_line_before_any_work(scans, tmp_path, args, what, capsys):
    path, _ = scans[1]["core.nii"]
    code, _out, err = run_cli(["reconstruct", path, "-o", tmp_path / "out", "--workers", "2", *args], capsys)
    assert code == 2
    assert what in err and "run those in one process" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_nifti_outputs_are_streamed_from_the_stores_with_the_single_runs_voxels(scans, client, tmp_path):
    import nibabel as nib

    folder, runs = scans
    path, _ = runs["core.nii"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        single = reconstruct_file(path, tmp_path / "one")  # NIfTI, the default
    got = split(path, tmp_path / "split", client, output_format="nifti")
    for kind in ("pores", "prob", "sample"):
        a, b = nib.load(single[kind]), nib.load(got[kind])
        assert str(got[kind]).endswith(".nii.gz")
        assert np.array_equal(np.asarray(a.dataobj), np.asarray(b.dataobj)), kind
        assert np.allclose(a.affine, b.affine) and a.get_data_dtype() == b.get_data_dtype()
    assert got["result"]["stage_seconds"]["nifti"] > 0
    names = [sorted(p.name for p in (tmp_path / d).iterdir()) for d in ("split", "one")]
    assert names[0] == names[1]  # the same files, no store or work folder left


def test_a_split_run_the_disk_cannot_hold_is_refused_before_any_work(scans, client, tmp_path, monkeypatch):
    import shutil

    from ctpore.errors import InputError
    from ctpore.pipelines import disk as disk_mod

    path, _ = scans[1]["core.nii"]
    real = shutil.disk_usage
    monkeypatch.setattr(disk_mod.shutil, "disk_usage", lambda p: real(p)._replace(free=900))
    submitted = []
    monkeypatch.setattr(client, "map", lambda *a, **k: submitted.append(1))
    out = tmp_path / "out"
    with pytest.raises(InputError, match="not enough free disk space"):
        split(path, out, client)
    assert not submitted and not out.exists()  # no slab ran, nothing was made


def test_a_sample_the_margin_erodes_away_is_refused_before_any_slab_runs(scans, client, tmp_path, monkeypatch):
    from ctpore.errors import InputError

    path, _ = scans[1]["core.nii"]
    with pytest.raises(InputError, match="no voxel is left for the sample") as single:
        reconstruct_file(path, tmp_path / "one", sample_margin=40)
    submitted = []
    monkeypatch.setattr(client, "map", lambda *a, **k: submitted.append(1))
    with pytest.raises(InputError, match="no voxel is left for the sample") as got:
        split(path, tmp_path / "split", client, sample_margin=40)
    assert str(got.value) == str(single.value)
    assert not submitted and not (tmp_path / "split").exists()


def test_a_batch_with_more_workers_than_scans_splits_each_scan_across_them(scans, tmp_path):
    from ctpore.pipelines.batch import run_batch

    path, single = scans[1]["core.nii"]
    manifest = tmp_path / "scans.txt"
    manifest.write_text(f"{path}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = run_batch(manifest, tmp_path / "out", workers=2, options={"output_format": "ome-zarr"})
    [rec] = res["records"]
    assert rec["status"] == "done" and rec["split"] and rec["metrics"]["split"]["workers"] == 2
    got = {k: tmp_path / "out" / Path(single[k]).name for k in ("pores", "prob", "sample", "metrics")}
    assert_same(single, {**got, "result": json.loads(got["metrics"].read_text())}, also_skip=("batch",))
    again = run_batch(manifest, tmp_path / "out", workers=2, options={"output_format": "ome-zarr"})
    assert again["skipped"] == 1  # done, with these options: a rerun skips it


def test_a_batch_runs_a_split_scan_again_when_a_slabs_worker_died(scans, tmp_path, monkeypatch):
    """A worker lost for good (the scheduler's KilledWorker) fails the first try; the batch runs the
    scan again, as it does an unsplit scan whose worker died, and the retry's outputs are whole."""
    from types import SimpleNamespace

    from distributed import KilledWorker

    import ctpore.pipelines.split as split_mod
    from ctpore.pipelines.batch import run_batch

    path, single = scans[1]["core.nii"]
    real, calls, retried = split_mod.reconstruct_split, [], []

    def dies_once(*args, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise KilledWorker("slab-0", SimpleNamespace(address="tcp://127.0.0.1:1"), 0)
        return real(*args, **kw)

    monkeypatch.setattr(split_mod, "reconstruct_split", dies_once)
    manifest = tmp_path / "scans.txt"
    manifest.write_text(f"{path}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = run_batch(manifest, tmp_path / "out", workers=2, retries=1, on_retry=retried.append,
                        options={"output_format": "ome-zarr"})
    [rec] = res["records"]
    assert rec["status"] == "done" and rec["attempts"] == 2 and len(retried) == 1
    assert "KilledWorker" in retried[0]["error"]
    assert json.loads((tmp_path / "out" / "core_metrics.json").read_text())["porosity"] == single["result"]["porosity"]


def test_a_scan_that_goes_bad_mid_run_is_one_line_and_leaves_nothing(tmp_path):
    """The scan file is cut short while the slabs run (a network file system's failure): the command
    says so in one line, exit 2, with no worker's log on the terminal, and leaves no output, work
    folder or unfinished store (the plan's scan changed: no rerun could take them up)."""
    vol, _truth, info = make_pair(5, shape=(512, 48, 48), scene="core-air")
    path = save_volume(tmp_path / "c.nii", np.asarray(vol), geometry_from_array(vol.shape, info["scene"]["spacing_mm"]))
    out = tmp_path / "out"
    cli = "import sys; from ctpore.app.cli import main; sys.exit(main())"
    proc = subprocess.Popen([sys.executable, "-c", cli, "reconstruct", str(path), "-o", str(out), "--workers", "2",
                             "--slab-slices", str(SLAB)], env={**os.environ, "CTPORE_NO_PROGRESS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not list(out.glob(".c.split/*/record-*.json")):
        time.sleep(0.005)
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size // 2)
    _stdout, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "c.nii" in err
    assert not out.exists() or not list(out.iterdir()), sorted(p.name for p in out.iterdir())


def test_a_batch_splits_the_scans_of_its_last_partial_round(scans, tmp_path):
    """Three scans on two workers: two run whole, one per worker; the third, which would leave a
    worker idle, is split across both, with the single run's outputs."""
    from ctpore.pipelines.batch import run_batch

    folder, runs = scans
    names = ["plain.nii.gz", "tube.tif", "core.nii"]
    manifest = tmp_path / "scans.txt"
    manifest.write_text("".join(f"{runs[n][0]}\n" for n in names))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = run_batch(manifest, tmp_path / "out", workers=2, options={"output_format": "ome-zarr"})
    recs = {Path(r["scan"]).name: r for r in res["records"]}
    assert all(r["status"] == "done" for r in recs.values()) and res["done"] == 3
    assert [bool(recs[n].get("split")) for n in names] == [False, False, True]
    for n in names:
        single = runs[n][1]
        got = {k: tmp_path / "out" / Path(single[k]).name for k in ("pores", "prob", "sample", "metrics")}
        assert_same(single, {**got, "result": json.loads(got["metrics"].read_text())}, also_skip=("batch",))


def test_a_batch_on_gpu_workers_splits_its_scan_with_each_slab_holding_a_gpu(scans, tmp_path, monkeypatch):
    """Workers that advertise a GPU (as dask-cuda's and a SLURM recipe's do): the scan is split when this
    process sees a GPU too (it plans the slabs' tiles for one; here it is said to, and the run is asked
    for the CPU), each slab's prediction is submitted holding one GPU, and the outputs are the single
    run's."""
    import dask

    import ctpore.pipelines.batch as batch

    path, single = scans[1]["core.nii"]
    manifest = tmp_path / "scans.txt"
    manifest.write_text(f"{path}\n")
    asked = []
    real_map = distributed.Client.map

    def recorded(self, fn, *a, **k):
        asked.append((k.get("key"), k.get("resources")))
        return real_map(self, fn, *a, **k)

    monkeypatch.setattr(distributed.Client, "map", recorded)
    monkeypatch.setattr(batch, "cuda_count", lambda: 1)
    with dask.config.set({"distributed.scheduler.allowed-failures": 3}), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                     dashboard_address=None, resources={"GPU": 1}) as cluster, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = batch.run_batch(manifest, tmp_path / "out", scheduler=cluster.scheduler_address,
                              options={"output_format": "ome-zarr", "device": "cpu"})
    [rec] = res["records"]
    assert rec["status"] == "done" and rec["split"], rec
    assert ("ctpore-slabs", {"GPU": 1}) in asked  # the predictions hold a GPU
    assert all(r is None for k, r in asked if k != "ctpore-slabs")  # the joins and passes do not
    got = {k: tmp_path / "out" / Path(single[k]).name for k in ("pores", "prob", "sample", "metrics")}
    assert_same(single, {**got, "result": json.loads(got["metrics"].read_text())}, also_skip=("batch",))
