"""Disk before work, and one writer per output.

- A run is refused before any work, exit 2 with one line (needed, free, where), when the disk
  cannot hold what it writes; ``--tmp-dir`` takes the temporary volumes (and is checked too); a disk
  that fills up anyway is exit 2 with that kind of line, and nothing is left behind. Checked with a
  mocked free-space figure and, where this machine lets a test mount one, on real small file systems.
- A run claims its outputs with a lock file; a second run of the same stem exits 2 at once naming
  the first; stale locks are taken over; ``ctpore batch`` reports a scan another run holds as held,
  and two drivers on one manifest do every scan once.
"""

from __future__ import annotations

import csv
import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from helpers import run_cli

from ctpore.data.io import load_scan
from ctpore.data.synthetic import make_pair
from ctpore.errors import InputError
from ctpore.pipelines import disk as disk_mod
from ctpore.pipelines import reconstruct as reconstruct_mod
from ctpore.pipelines import spill as spill_mod
from ctpore.pipelines.disk import gzip_bound, peaks, run_needs
from ctpore.pipelines.claims import LOCK_STALE_S, OutputsHeld, claim_outputs, lock_path, read_lock
from ctpore.pipelines.outputs import output_paths
from ctpore.pipelines.methods import Untiled

SHAPE = (24, 40, 36)  # (Z, Y, X)


def write_scan(path: Path, data: np.ndarray, axis: int = 2) -> Path:
    """``data`` (Z, Y, X) as NIfTI with its slices along file axis ``axis`` (2: (x, y, z); 0: (z, x, y)), mm."""
    order, spacing = {2: ((2, 1, 0), [0.02, 0.02, 0.05]), 0: ((0, 2, 1), [0.05, 0.02, 0.02])}[axis]
    img = nib.Nifti1Image(np.ascontiguousarray(data.transpose(order)), np.diag([*spacing, 1.0]))
    img.header.set_xyzt_units("mm")
    nib.save(img, path)
    return path


@pytest.fixture
def scan_file(tmp_path) -> Path:
    scan, _truth, _ = make_pair(5, shape=SHAPE)
    return write_scan(tmp_path / "rock.nii.gz", scan)


@pytest.fixture
def tiny_weights(tmp_path) -> str:
    import torch

    from ctpore.models import PoreFormer, PoreFormerConfig
    from ctpore.models.weights import save_weights

    torch.manual_seed(0)
    model = PoreFormer(PoreFormerConfig(d_model=16, n_heads=2, stem_channels=4, level_channels=(8, 16),
                                        level_attention=(0, 1), level_window=6, window=4)).eval()
    return str(save_weights(model, tmp_path / "tiny.safetensors", {"threshold": "0.5", "min_size": "4"}))


def leftovers(folder: Path) -> list[str]:
    """Hidden files in ``folder``: temporaries, locks (a finished or failed run leaves none)."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) if folder.exists() else []


def free_space(monkeypatch, free_of) -> None:
    """Make ``shutil.disk_usage`` report ``free_of(path)`` bytes free (the module that checks uses it)."""
    real = shutil.disk_usage
    monkeypatch.setattr(disk_mod.shutil, "disk_usage", lambda p: real(p)._replace(free=int(free_of(Path(p)))))


# -- disk before work (a mocked free-space figure) ---------------------------------------------


def test_a_run_the_disk_cannot_hold_is_refused_before_any_work(tmp_path, scan_file, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(reconstruct_mod, "run_reconstruction", lambda *a, **k: ran.append(1))
    free_space(monkeypatch, lambda p: 900)
    out = tmp_path / "out" / "deeper"
    code, _, err = run_cli(["reconstruct", scan_file, "-o", out, "--method", "otsu"], capsys)
    assert code == 2 and not ran, err
    [line] = err.strip().splitlines()
    # needed (at least the raw probabilities, 4 bytes a voxel), free, where
    assert line.startswith(f"ctpore: error: {out}: not enough free disk space"), line
    assert "900 B is free" in line and "raw probabilities" in line and "prob output" in line
    needed = line.split("writes up to ")[1].split(" here")[0]
    value, unit = needed.split()
    assert float(value) * {"kB": 1e3, "MB": 1e6}[unit] >= 4 * np.prod(SHAPE) * 0.999
    assert not (tmp_path / "out").exists()  # nothing made, not even the folders


def test_tmp_dir_takes_the_temporaries_and_both_places_are_checked(tmp_path, scan_file, monkeypatch, capsys):
    tmp, out = tmp_path / "scratch", tmp_path / "out"
    tmp.mkdir()
    voxels = int(np.prod(SHAPE))
    # two file systems: the output folder holds the outputs' bound but not the raw probabilities too
    monkeypatch.setattr(disk_mod, "file_system", lambda f: 1 if tmp in (Path(f), *Path(f).parents) else 0)
    room = {"out": gzip_bound(voxels) + gzip_bound(4 * voxels) + (64 << 10) + 2 * voxels, "tmp": 1 << 40}
    free_space(monkeypatch, lambda p: room["tmp" if tmp in (p, *p.parents) else "out"])
    made = []
    real_mkstemp = tempfile.mkstemp

    def mkstemp(*a, **k):
        made.append((k.get("prefix"), Path(k.get("dir"))))
        return real_mkstemp(*a, **k)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    real_nameless = spill_mod.nameless_file

    def nameless(folder, prefix):
        made.append((prefix, Path(folder)))
        return real_nameless(folder, prefix)

    monkeypatch.setattr(spill_mod, "nameless_file", nameless)
    code, _, err = run_cli(["reconstruct", scan_file, "-o", out, "--method", "otsu"], capsys)
    assert code == 2 and "raw probabilities" in err and str(out) in err and not made, err  # without --tmp-dir
    code, _, err = run_cli(["reconstruct", scan_file, "-o", out, "--method", "otsu", "--tmp-dir", tmp], capsys)
    assert code == 0, err
    assert made and all(d == tmp for _, d in made), made  # the spill (and any copy) went to --tmp-dir
    room["tmp"] = 900
    code, _, err = run_cli(["reconstruct", scan_file, "-o", out, "--method", "otsu", "--tmp-dir", tmp,
                            "--overwrite"], capsys)
    assert code == 2 and f"{tmp}: not enough free disk space" in err and "900 B is free" in err, err
    assert leftovers(out) == [] and leftovers(tmp) == []
    code, _, err = run_cli(["reconstruct", scan_file, "-o", out, "--tmp-dir", tmp_path / "none", "--overwrite"],
                           capsys)
    assert code == 2 and "--tmp-dir must be an existing folder" in err


def core(scan: np.ndarray) -> np.ndarray:
    """``scan`` as a cylindrical core: every voxel outside a centred circle set to 0."""
    _, ny, nx = scan.shape
    yy, xx = np.ogrid[:ny, :nx]
    out = scan.copy()
    out[:, (yy - (ny - 1) / 2) ** 2 + (xx - (nx - 1) / 2) ** 2 > (0.42 * min(ny, nx)) ** 2] = 0
    return out


@pytest.mark.parametrize("suffix, tile, axis, outside", [(".nii.gz", 16, 2, False), (".nii", 16, 2, False),
                                                         (".nii.gz", 64, 2, False), (".nii.gz", 16, 0, False),
                                                         (".nii", 16, 2, True), (".nii.gz", 16, 0, True)])
def test_the_estimate_names_the_temporaries_a_run_makes(tmp_path, tiny_weights, monkeypatch, suffix, tile, axis,
                                                        outside):
    """The copy of a scan, the outside's mask and the spooled slabs are counted exactly when a run makes
    them, and the sample mask output exactly when it is written."""
    from ctpore.pipelines.reconstruct import reconstruct_file

    scan, _, _ = make_pair(3, shape=SHAPE)
    path = write_scan(tmp_path / f"s{suffix}", core(scan) if outside else scan, axis)
    with load_scan(path, slice_axis=axis) as s:
        assert s.shape == SHAPE
    made, estimated = [], []
    real_mkstemp, real_tempfile, real_check = tempfile.mkstemp, tempfile.TemporaryFile, disk_mod.check_disk

    def recorded(real):
        def make(*a, **k):
            made.append((k.get("prefix") or "", Path(k.get("dir") or "")))
            return real(*a, **k)
        return make

    monkeypatch.setattr(tempfile, "mkstemp", recorded(real_mkstemp))
    monkeypatch.setattr(tempfile, "TemporaryFile", recorded(real_tempfile))
    real_nameless = spill_mod.nameless_file
    monkeypatch.setattr(spill_mod, "nameless_file",
                        lambda folder, prefix: (made.append((prefix, Path(folder))), real_nameless(folder, prefix))[1])
    monkeypatch.setattr(disk_mod, "check_disk", lambda needs: (estimated.extend(needs), real_check(needs))[1])
    out = reconstruct_file(path, tmp_path / "out", weights=tiny_weights, tile=tile, slice_axis=axis,
                           tmp_dir=tmp_path)
    assert bool(out["result"]["sample"]["outside_voxels"]) == outside
    copy = "copy of the scan with its outside filled" if outside else "uncompressed copy of the scan"
    kinds = {".ctpore-spill-": "raw probabilities", ".ctpore-scan-": copy, ".ctpore-sample-": "outside mask",
             ".ctpore-slabs-": "output slabs"}
    temporaries = [n for n in estimated if n.what in kinds.values()]
    assert {kinds[p] for p, _ in made if p.startswith(".ctpore-")} == {n.what for n in temporaries}, (made, estimated)
    assert all(d == tmp_path for p, d in made if p.startswith(".ctpore-"))  # all in --tmp-dir
    assert all(n.folder == tmp_path for n in temporaries)
    written = {k for k in ("pores", "prob", "sample") if Path(out[k]).exists()}
    assert {n.what for n in estimated if n.what.endswith(" output")} == {f"{k} output" for k in written}


class RandomProbability(Untiled):
    """A predictor whose probabilities are uniform noise: what gzip shrinks least."""

    name = "random"

    def __init__(self):
        from ctpore.data.postprocess import Postprocessing

        self.post = Postprocessing(threshold=0.5)
        self.info = {"model": {"name": "random", "sha256": None}, "device": "cpu", "attention_backend": None}

    def predict(self, volume, out, *, budget_bytes, progress=None, chunk_slices=None, tile=None, precision="auto"):
        nz, ny, nx = volume.shape
        out[0:nz, 0:ny, 0:nx] = np.random.default_rng(0).random((nz, ny, nx), dtype=np.float32)
        return {}


def test_outputs_are_within_their_bound(tmp_path, scan_file, monkeypatch):
    """Noise probabilities (and pores) are written within the bound the check counts, 4 and 1 bytes a voxel."""
    from ctpore.pipelines.reconstruct import reconstruct_file

    estimated = []
    real_check = disk_mod.check_disk
    monkeypatch.setattr(disk_mod, "check_disk", lambda needs: (estimated.extend(needs), real_check(needs))[1])
    out = reconstruct_file(scan_file, tmp_path / "out", predictor=RandomProbability())
    bound = {n.what: n.nbytes for n in estimated}
    for k in ("pores", "prob"):
        assert Path(out[k]).stat().st_size <= bound[f"{k} output"], k
    assert Path(out["metrics"]).stat().st_size <= bound["metrics and headers"]
    assert Path(out["prob"]).stat().st_size >= 0.85 * bound["prob output"]  # noise comes close: no loose bound


@pytest.mark.parametrize("code_, name", [(errno.ENOSPC, "the disk filled up"),
                                         (errno.EDQUOT, "the disk quota is full")])
@pytest.mark.parametrize("where", ["spill", "writer"])
def test_a_disk_that_fills_up_anyway_is_exit_2_and_leaves_nothing(tmp_path, scan_file, monkeypatch, capsys, code_,
                                                                  name, where):
    from ctpore.data.io.write import SlabWriter
    from ctpore.pipelines.spill import BlockSpill

    def full(*a, **k):
        raise OSError(code_, os.strerror(code_))

    monkeypatch.setattr(*((BlockSpill, "__setitem__") if where == "spill" else (SlabWriter, "write")), full)
    out = tmp_path / "out"
    code, _, err = run_cli(["reconstruct", scan_file, "-o", out, "--method", "otsu"], capsys)
    [line] = err.strip().splitlines()
    assert code == 2 and f"{out}: {name} during the run" in line and "is free now" in line, err
    assert "it writes up to" in line and "internal error" not in line
    assert not out.exists()  # no outputs, no temporaries, no lock, not the folder it made


def test_other_write_errors_stay_internal(tmp_path, scan_file, monkeypatch, capsys):
    from ctpore.pipelines.spill import BlockSpill

    def broken(*a, **k):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(BlockSpill, "__setitem__", broken)
    code, _, err = run_cli(["reconstruct", scan_file, "-o", tmp_path / "out", "--method", "otsu"], capsys)
    assert code == 1 and "internal error: OSError" in err
    assert not (tmp_path / "out").exists()


# -- disk before work (real small file systems) ------------------------------------------------


def _mount_runner() -> list[str] | None:
    """A command prefix that runs a shell script in a private mount namespace (as root there), or None."""
    if shutil.which("unshare") is None:
        return None
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", 'd=$(mktemp -d) && mount -t tmpfs -o size=1m tmpfs "$d" '
                            '&& umount "$d" && rmdir "$d"'], capture_output=True)
    return ["unshare", "-rm", "sh", "-c"] if probe.returncode == 0 else None


def on_tmpfs(script: str, size: int, folder: Path, env=None) -> subprocess.CompletedProcess:
    """Run ``script`` (sh) with a tmpfs of ``size`` bytes mounted on ``folder``; it may print what it
    finds there (the mount goes with the namespace)."""
    runner = _mount_runner()
    if runner is None:
        pytest.skip("cannot mount a small file system here (no unshare, or user namespaces are off)")
    folder.mkdir(exist_ok=True)
    full = f'mount -t tmpfs -o size={size} tmpfs "{folder}" || exit 99\n{script}'
    return subprocess.run([*runner, full], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, CTPORE_NO_PROGRESS="1", **(env or {})))


def _estimate(scan: Path, out: Path) -> int:
    with load_scan(scan) as s:
        shape = s.shape
    [(_, peak, _)] = peaks(run_needs(shape, output_paths(scan, out)))
    return peak


def test_on_a_real_small_disk_a_run_is_refused_before_work_or_fits(tmp_path, scan_file):
    fs = tmp_path / "fs"
    need = _estimate(scan_file, fs / "out")
    voxels = int(np.prod(SHAPE))
    assert 9 * voxels <= need <= 9 * voxels + (256 << 10)  # 4 (raw) + 1 (pores) + 4 (prob) bytes a voxel
    cmd = f'"{sys.executable}" -m ctpore.app.cli reconstruct "{scan_file}" -o "{fs}/out" --method otsu'
    show = f'; echo "rc=$?"; find "{fs}" -mindepth 1'
    small = on_tmpfs(cmd + show, need - (64 << 10), fs)  # less than the estimate: refused before any work
    assert "rc=2" in small.stdout and "not enough free disk space" in small.stderr, (small.stdout, small.stderr)
    assert small.stdout.split("rc=2")[1].split() == [], small.stdout  # the file system is left empty
    pages = -(-need // 4096) * 4096 + 4096  # the estimate, and the page of the lock file made before the check
    fits = on_tmpfs(cmd + show, pages, fs)  # as large as that: the run is done
    assert "rc=0" in fits.stdout, (fits.stdout, fits.stderr)
    assert sorted(fits.stdout.split("rc=0")[1].split()) == [f"{fs}/out"] + [
        f"{fs}/out/rock_{k}" for k in ("metrics.json", "pores.nii.gz", "prob.nii.gz")], fits.stdout


def test_on_a_real_disk_that_fills_up_the_run_ends_with_exit_2_and_nothing_left(tmp_path, scan_file):
    fs = tmp_path / "fs"
    fake_free = ("import shutil, sys; real = shutil.disk_usage; "
                 "shutil.disk_usage = lambda p: real(p)._replace(free=1 << 40); "  # the check sees room
                 "from ctpore.app.cli import main; main(sys.argv[1:])")
    cmd = (f'"{sys.executable}" -c "{fake_free}" reconstruct "{scan_file}" -o "{fs}/out" --method otsu; '
           f'echo "rc=$?"; ls -A "{fs}"')
    res = on_tmpfs(cmd, 4 * int(np.prod(SHAPE)) // 2, fs)  # not even the raw probabilities fit
    assert "rc=2" in res.stdout, (res.stdout, res.stderr)
    [line] = res.stderr.strip().splitlines()
    assert line.startswith(f"ctpore: error: {fs}/out: the disk filled up during the run (No space left on device)")
    assert res.stdout.split("rc=2")[1].split() == []  # nothing half-written, and no folder


def test_with_tmp_dir_a_small_output_disk_holds_the_outputs(tmp_path, scan_file):
    fs, scratch = tmp_path / "fs", tmp_path / "scratch"
    scratch.mkdir()
    voxels = int(np.prod(SHAPE))
    size = gzip_bound(voxels) + gzip_bound(4 * voxels) + (80 << 10)  # the outputs' bound, not the raw probabilities
    cmd = (f'"{sys.executable}" -m ctpore.app.cli reconstruct "{scan_file}" -o "{fs}/out" --method otsu; '
           f'echo "rc=$?"; "{sys.executable}" -m ctpore.app.cli reconstruct "{scan_file}" -o "{fs}/out" '
           f'--method otsu --tmp-dir "{scratch}"; echo "rc=$?"; ls -A "{fs}/out"')
    res = on_tmpfs(cmd, size, fs)
    codes = [w for w in res.stdout.split() if w.startswith("rc=")]
    assert codes == ["rc=2", "rc=0"], (res.stdout, res.stderr)  # refused without --tmp-dir, done with it
    assert "not enough free disk space" in res.stderr and "raw probabilities" in res.stderr
    assert sorted(res.stdout.split("rc=0")[1].split()) == ["rock_metrics.json", "rock_pores.nii.gz",
                                                           "rock_prob.nii.gz"]


# -- one writer per output ---------------------------------------------------------------------


def _lock(paths: dict, **rec) -> Path:
    lock = lock_path(paths)
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps({"since": "2030-01-01T00:00:00+0000", **rec}))
    return lock


@pytest.fixture
def live_pid():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_claim_makes_a_lock_with_who_holds_it_and_removes_it(tmp_path):
    paths = output_paths(tmp_path / "rock.nii.gz", tmp_path / "out" / "sub")
    with claim_outputs(paths) as rec:
        held, _ = read_lock(lock_path(paths))
        assert held == rec and held["pid"] == os.getpid() and held["host"] == socket.gethostname()
        assert lock_path(paths).name == ".rock.lock"
        with claim_outputs(paths):  # the same thread: the same claim
            pass
        assert lock_path(paths).exists()
        refused = []

        def other():
            try:
                with claim_outputs(paths):
                    pass
            except OutputsHeld as exc:
                refused.append(exc)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert refused and refused[0].holder == rec and f"pid {os.getpid()}" in str(refused[0])
    assert not (tmp_path / "out").exists()  # the lock and the folders it made (they stayed empty)
    with pytest.raises(RuntimeError):
        with claim_outputs(paths):
            raise RuntimeError("boom")
    assert not (tmp_path / "out").exists()


def test_a_fresh_claim_refuses_outputs_another_run_wrote_meanwhile(tmp_path):
    paths = output_paths(tmp_path / "rock.nii.gz", tmp_path)
    paths["metrics"].write_text("{}")
    with pytest.raises(InputError, match="output exists"):
        with claim_outputs(paths, fresh=True):
            pass
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("case", ["live here", "live elsewhere"])
def test_a_run_held_by_another_is_refused_at_once_and_its_files_untouched(tmp_path, scan_file, capsys, live_pid,
                                                                          case):
    out = tmp_path / "out"
    paths = output_paths(scan_file, out)
    host = socket.gethostname() if case == "live here" else "elsewhere"
    lock = _lock(paths, pid=live_pid if case == "live here" else 4242, host=host)
    partial = out / ".rock_prob.tmp-12345678.nii.gz"  # the first run's output being written
    partial.write_bytes(b"half")
    before = lock.read_bytes()
    code, _, err = run_cli(["reconstruct", scan_file, "-o", out, "--method", "otsu", "--overwrite"], capsys)
    [line] = err.strip().splitlines()
    pid = live_pid if case == "live here" else 4242
    assert code == 2 and f"another ctpore run is writing these outputs (pid {pid} on {host}, since 2030-01-01" in line
    assert lock.read_bytes() == before and partial.read_bytes() == b"half"
    assert not any(p.exists() for p in paths.values())


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()


@pytest.mark.parametrize("case", ["dead", "zombie", "reused pid", "old elsewhere", "unreadable"])
def test_a_stale_lock_is_taken_over_with_a_warning(tmp_path, scan_file, capsys, case):
    out = tmp_path / "out"
    paths = output_paths(scan_file, out)
    here = socket.gethostname()
    zombie = None
    if case == "dead":
        lock = _lock(paths, pid=_dead_pid(), host=here)
    elif case == "zombie":  # a killed run whose parent has not reaped it: it exists, but runs no more
        if not Path("/proc/self/stat").exists():
            pytest.skip("no /proc here")
        zombie = subprocess.Popen([sys.executable, "-c", "pass"])
        deadline = time.time() + 60
        while _stat(zombie.pid)[0] != "Z" and time.time() < deadline:
            time.sleep(0.01)
        lock = _lock(paths, pid=zombie.pid, host=here, proc_start=int(_stat(zombie.pid)[19]))
    elif case == "reused pid":  # a live process, but not the one that started at that time
        lock = _lock(paths, pid=os.getpid(), host=here, proc_start=1)
    elif case == "old elsewhere":
        lock = _lock(paths, pid=4242, host="elsewhere")
        old = time.time() - LOCK_STALE_S - 60
        os.utime(lock, (old, old))
    else:
        lock = lock_path(paths)
        out.mkdir()
        lock.write_text("{")
        old = time.time() - 3600
        os.utime(lock, (old, old))
    code, _, err = run_cli(["reconstruct", scan_file, "-o", out, "--method", "otsu"], capsys)
    if zombie is not None:
        zombie.wait()
    assert code == 0, err
    assert "ctpore: warning:" in err and "took over a stale lock" in err, err
    assert all(paths[k].exists() for k in ("pores", "prob", "metrics")) and not lock.exists()


def test_two_reconstructs_of_one_scan_one_works_the_other_exits_2_at_once(tmp_path, tiny_weights):
    from ctpore.models.weights import sha256_file
    from ctpore.pipelines.reconstruct import DEFAULTS, reconstruct

    scan, _, _ = make_pair(9, shape=(64, 96, 96))
    path = write_scan(tmp_path / "slow.nii.gz", scan)
    out = tmp_path / "out"
    env = dict(os.environ, CTPORE_NO_PROGRESS="1", OMP_NUM_THREADS="1")
    cli = [sys.executable, "-m", "ctpore.app.cli", "reconstruct", str(path), "-o", str(out)]
    first = subprocess.Popen([*cli, "--weights", tiny_weights, "--chunk-slices", "1"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = lock_path(output_paths(path, out))
    deadline = time.time() + 120
    while not lock.exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert lock.exists(), first.communicate()
    # another method, and --overwrite: had it run, its outputs would differ from the first one's
    second = subprocess.run([*cli, "--method", "otsu", "--overwrite"], env=env, capture_output=True, text=True,
                            timeout=120)
    first_still_running = first.poll() is None
    f_out, f_err = first.communicate(timeout=600)
    assert first.returncode == 0, f_err
    assert first_still_running, "the first run ended before the second started: no overlap was tested"
    assert second.returncode == 2
    [line] = second.stderr.strip().splitlines()
    assert f"another ctpore run is writing these outputs (pid {first.pid} on {socket.gethostname()}" in line
    m = json.loads((out / "slow_metrics.json").read_text())
    assert m["method"] == "poreformer" and m["model"]["sha256"] == sha256_file(tiny_weights)
    assert f"{m['seconds']:.1f} s" in f_out  # the metrics are the first run's
    api = reconstruct(path, weights=tiny_weights, chunk_slices=1, memory_gb=float(DEFAULTS["memory_gb"]))
    with load_scan(out / "slow_pores.nii.gz") as s:
        np.testing.assert_array_equal(s.read(), api.pores)  # whole, and the first run's
    assert leftovers(out) == []


# -- ctpore batch ------------------------------------------------------------------------------


def test_batch_reports_a_scan_another_run_holds_and_one_it_finished(tmp_path, scan_file, live_pid):
    from ctpore.pipelines.batch_manifest import ScanTask
    from ctpore.pipelines.batch import run_task

    out = tmp_path / "out"
    key = {"method": "otsu", "weights_sha256": None, "precision": None, "device_type": "cpu"}
    task = ScanTask(str(scan_file))
    lock = _lock(output_paths(scan_file, out), pid=live_pid, host=socket.gethostname())
    rec = run_task(task, str(out), {"method": "otsu"}, key)
    assert rec["status"] == "held" and rec["holder"]["pid"] == live_pid, rec
    assert sorted(p.name for p in out.iterdir()) == [".rock.lock"]  # nothing written, its lock kept
    lock.unlink()
    assert run_task(task, str(out), {"method": "otsu"}, key)["status"] == "done"
    again = run_task(task, str(out), {"method": "otsu"}, key)  # finished by another run since this one looked
    assert again["status"] == "skipped" and again["reason"] == "outputs complete from another run"
    assert leftovers(out) == []


def test_batch_clears_the_stale_lock_of_a_scan_it_skips_as_done(tmp_path, scan_file, live_pid):
    from ctpore.pipelines.batch_manifest import ScanTask
    from ctpore.pipelines.batch import run_task
    from ctpore.pipelines.claims import clear_stale_lock

    out = tmp_path / "out"
    key = {"method": "otsu", "weights_sha256": None, "precision": None, "device_type": "cpu"}
    assert run_task(ScanTask(str(scan_file)), str(out), {"method": "otsu"}, key)["status"] == "done"
    paths = output_paths(scan_file, out)
    lock = _lock(paths, pid=live_pid, host=socket.gethostname())  # a live run's lock stays
    assert not clear_stale_lock(paths) and lock.exists()
    lock = _lock(paths, pid=_dead_pid(), host=socket.gethostname())  # killed as its outputs were whole
    assert clear_stale_lock(paths) and not lock.exists()


def test_batch_lines_and_summary_say_held(tmp_path):
    from ctpore.app.batch_console import final_line, scan_line
    from ctpore.pipelines.batch_summary import latest_records

    held = {"scan": "/d/a.nii", "status": "held", "holder": {"pid": 7, "host": "h", "since": "t"}}
    assert scan_line(held) == "a.nii  held by another run (pid 7 on h, since t): not done here"
    s = {"done": 1, "skipped": 0, "failed": 0, "held": 2}
    assert final_line(s, tmp_path, "x.csv").startswith("1 done, 0 already done, 0 failed, 2 held by another run")
    for before, after, latest in [("done", "held", "done"), ("held", "done", "done"), ("failed", "held", "held")]:
        report = tmp_path / f"{before}-{after}.jsonl"
        report.write_text(f'{{"scan": "a", "status": "{before}"}}\n{{"scan": "a", "status": "{after}"}}\n')
        assert latest_records(report)["a"]["status"] == latest


def test_two_batch_drivers_on_one_manifest_do_every_scan_once(tmp_path, tiny_weights):
    pytest.importorskip("distributed")
    scan, _, _ = make_pair(7, shape=(48, 96, 96))
    names = [f"g{i}" for i in range(4)]
    for i, n in enumerate(names):
        write_scan(tmp_path / f"{n}.nii", np.roll(scan, 5 * i, axis=2))
    (tmp_path / "m.txt").write_text("".join(f"{n}.nii\n" for n in names))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "ctpore.app.cli", "batch", str(tmp_path / "m.txt"), "-o", str(out),
           "--weights", tiny_weights, "--workers", "1"]
    env = dict(os.environ, CTPORE_NO_PROGRESS="1", OMP_NUM_THREADS="1")
    # started together (a job resubmitted while the first still runs): both find every scan to do
    first, second = (subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for _ in range(2))
    outs = [p.communicate(timeout=600) for p in (first, second)]
    assert first.returncode == 0 and second.returncode == 0, outs
    recs = [json.loads(line) for line in (out / "batch_report.jsonl").read_text().splitlines()]
    for n in names:
        mine = [r for r in recs if Path(r["scan"]).name == f"{n}.nii"]
        assert sum(r["status"] == "done" for r in mine) == 1, mine  # written by exactly one run
        assert {r["status"] for r in mine} <= {"done", "skipped", "held"}, mine
        assert json.loads((out / f"{n}_metrics.json").read_text())["shape_zyx"] == [48, 96, 96]
    assert leftovers(out) == []
    done = [int(o.strip().splitlines()[-1].split(" done,")[0]) for o, _ in outs]  # each driver's last line
    assert sum(done) == len(names), outs
    with open(out / "batch_summary.csv") as fh:  # one row per scan, whichever driver wrote it last
        assert sorted((Path(r["scan"]).name, r["status"]) for r in csv.DictReader(fh)) == [
            (f"{n}.nii", "done") for n in names]


def _o_tmpfile_works(folder) -> bool:
    try:
        os.close(os.open(folder, os.O_TMPFILE | os.O_RDWR, 0o600))
        return True
    except (AttributeError, OSError):
        return False


def test_a_spill_file_never_has_a_name_where_the_file_system_allows(tmp_path, monkeypatch):
    """The raw probabilities' spill file was made with a name and unlinked at once: a batch killed
    between the two left a ``.ctpore-spill-*.f32`` in the output folder (a killed-run test caught one).
    Where the file system makes nameless files (``O_TMPFILE``), no name is ever made; elsewhere, as
    before, it is removed at once."""
    from ctpore.pipelines.spill import BlockSpill, nameless_file

    if not _o_tmpfile_works(tmp_path):
        pytest.skip("this file system has no O_TMPFILE")
    monkeypatch.setattr(tempfile, "mkstemp", lambda *a, **k: pytest.fail("a named temporary file was made"))
    with BlockSpill(tmp_path, (4, 3, 5)) as spill:
        block = np.arange(60, dtype=np.float32).reshape(4, 3, 5)
        spill[0:4, 0:3, 0:5] = block
        assert list(tmp_path.iterdir()) == []
        np.testing.assert_array_equal(spill.read(1, 3), block[1:3])
    monkeypatch.undo()
    monkeypatch.delattr(os, "O_TMPFILE")  # a file system without it: named, then unlinked
    fd = nameless_file(tmp_path, ".ctpore-spill-")
    os.close(fd)
    assert list(tmp_path.iterdir()) == []
