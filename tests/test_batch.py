"""ctpore batch: a LocalCluster of 2 workers; bad scans fail alone, runs resume, dead workers retry."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from ctpore.app.cli import main
from ctpore.data.synthetic import make_pair
from ctpore.pipelines.batch import REPORT_NAME, run_batch
from ctpore.pipelines.batch_manifest import read_manifest, select_part

pytest.importorskip("distributed")


def write(path: Path, arr: np.ndarray) -> Path:
    nib.save(nib.Nifti1Image(np.ascontiguousarray(arr.T), np.diag([0.01, 0.01, 0.01, 1.0])), path)
    return path


@pytest.fixture
def six(tmp_path):
    """Four good scans with labels, a truncated one and a 2D one, listed in a CSV manifest."""
    rows = ["scan,label"]
    for i in range(4):
        scan, truth, _ = make_pair(i, shape=(24, 32, 32))
        write(tmp_path / f"s{i}.nii.gz", scan)
        write(tmp_path / f"t{i}.nii.gz", truth)
        rows.append(f"s{i}.nii.gz,t{i}.nii.gz")
    (tmp_path / "cut.nii.gz").write_bytes((tmp_path / "s0.nii.gz").read_bytes()[:3000])
    write(tmp_path / "flat.nii.gz", np.zeros((1, 16, 16), np.uint16))
    rows += ["cut.nii.gz,", "flat.nii.gz,"]
    (tmp_path / "m.csv").write_text("\n".join(rows) + "\n")
    return tmp_path


def report(out: Path) -> list[dict]:
    lines = (out / REPORT_NAME).read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_bad_scans_fail_alone_and_the_exit_code_says_so(six, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["batch", str(six / "m.csv"), "-o", str(six / "out"), "--method", "otsu", "--workers", "2"])
    assert exc.value.code == 3
    recs = {Path(r["scan"]).name: r for r in report(six / "out")}
    assert {n for n, r in recs.items() if r["status"] == "done"} == {f"s{i}.nii.gz" for i in range(4)}
    assert "truncated" in recs["cut.nii.gz"]["error"] and "2D" in recs["flat.nii.gz"]["error"]
    for i in range(4):
        m = recs[f"s{i}.nii.gz"]["metrics"]
        assert {"mse", "dice", "euler_error_rel"} <= set(m)  # the label column scores each scan
        assert json.loads((six / "out" / f"s{i}_metrics.json").read_text())["dice"] == m["dice"]
    names = sorted(p.name for p in (six / "out").iterdir())
    assert not [n for n in names if n.startswith(("cut", "flat", "."))]  # nothing for the broken ones
    out = capsys.readouterr().out
    assert "4 done, 0 already done, 2 failed" in out and "mean MSE" in out


@pytest.mark.parametrize("make, match", [
    (lambda d: d / "none.txt", "no such manifest"),
    (lambda d: (d / "empty.txt").write_text("# nothing\n\n") and d / "empty.txt", "lists no scans"),
    (lambda d: (d / "gone.txt").write_text("missing.nii.gz\n") and d / "gone.txt", "does not exist"),
    (lambda d: (d / "nocol.csv").write_text("path,label\na,b\n") and d / "nocol.csv", "needs a 'scan' column"),
    (lambda d: (d / "twice.txt").write_text("s0.nii.gz\nsub/s0.nii.gz\n") and d / "twice.txt", "output names"),
])
def test_bad_manifests_are_refused_before_any_work(six, capsys, make, match):
    (six / "sub").mkdir()
    (six / "sub" / "s0.nii.gz").write_bytes((six / "s0.nii.gz").read_bytes())
    with pytest.raises(SystemExit) as exc:
        main(["batch", str(make(six)), "-o", str(six / "out"), "--method", "otsu"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0]
    assert not (six / "out").exists()


def test_parts_split_the_manifest_deterministically(six):
    tasks = read_manifest(six / "m.csv")
    parts = [select_part(tasks, f"{i}/3") for i in (1, 2, 3)]
    assert sorted(t.row for p in parts for t in p) == sorted(t.row for t in tasks)
    assert [t.row for t in parts[1]] == [t.row for t in select_part(read_manifest(six / "m.csv"), "2/3")]


def _weights(tmp_path: Path) -> Path:
    import torch

    from ctpore.models import PoreFormer, PoreFormerConfig
    from ctpore.models.weights import save_weights

    torch.manual_seed(0)
    model = PoreFormer(PoreFormerConfig(d_model=16, n_heads=2, stem_channels=4, level_channels=(8, 16),
                                        level_attention=(0, 1))).eval()
    return save_weights(model, tmp_path / "tiny.safetensors", {"threshold": "0.5", "min_size": "4"})


def _slow_scans(tmp_path: Path, n: int) -> Path:
    scan, _, _ = make_pair(7, shape=(48, 96, 96))
    for i in range(n):
        write(tmp_path / f"g{i}.nii", np.roll(scan, 5 * i, axis=2))
    (tmp_path / "g.txt").write_text("".join(f"g{i}.nii\n" for i in range(n)))
    return tmp_path / "g.txt"


def test_a_killed_run_resumes_and_does_every_scan_once(tmp_path):
    manifest, w = _slow_scans(tmp_path, 6), _weights(tmp_path)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "ctpore.app.cli", "batch", str(manifest), "-o", str(out), "--weights", str(w),
           "--workers", "2"]
    env = dict(os.environ, CTPORE_NO_PROGRESS="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if (out / REPORT_NAME).exists() and len(report(out)) >= 1:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole job dies: driver, scheduler and workers
    proc.wait()
    first = report(out)
    assert 1 <= len(first) < 6, "the run was not stopped part-way"
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    recs = report(out)
    for i in range(6):
        mine = [r for r in recs if Path(r["scan"]).name == f"g{i}.nii"]
        done = [r for r in mine if r["status"] == "done"]
        assert len(done) <= 1 and len(done) + sum(r["status"] == "skipped" for r in mine) >= 1, mine
        assert json.loads((out / f"g{i}_metrics.json").read_text())["shape_zyx"] == [48, 96, 96]
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no partial files


def test_a_scan_whose_worker_dies_is_retried(tmp_path):
    import dask
    from distributed import Client, LocalCluster

    manifest, w = _slow_scans(tmp_path, 4), _weights(tmp_path)
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address=None) as cluster, Client(cluster) as client:
            killed = []
            pids = client.run(os.getpid)  # worker address -> its process

            def kill_a_busy_worker():
                deadline = time.time() + 120
                while time.time() < deadline and not killed:
                    busy = [addr for addr, keys in client.processing().items() if keys and addr in pids]
                    if busy:
                        time.sleep(0.3)  # inside the task
                        os.kill(pids[busy[0]], signal.SIGKILL)
                        killed.append(busy[0])
                    time.sleep(0.05)

            threading.Thread(target=kill_a_busy_worker, daemon=True).start()
            retried = []
            res = run_batch(manifest, tmp_path / "out", scheduler=cluster.scheduler_address, retries=2,
                            options={"weights": w}, on_retry=retried.append)
    assert killed
    assert res["done"] == 4 and res["failed"] == 0
    assert max(r["attempts"] for r in res["records"]) == 2  # one scan ran twice: its worker died
    again = sorted(r["scan"] for r in res["records"] if r["attempts"] == 2)  # those the dead worker held
    assert sorted((r["scan"], r["attempt"], r["of"]) for r in retried) == [(s, 2, 3) for s in again]  # all said


# -- batch talks as it goes -------------------------------------------------------------------


def _busiest(pids: list[int]) -> int:
    """The process among ``pids`` that used the most CPU over the next 0.3 s (a worker in a task)."""
    def cpu(pid):
        try:
            return sum(int(v) for v in open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[11:13])
        except OSError:
            return 0
    before = {p: cpu(p) for p in pids}
    time.sleep(0.3)
    return max(pids, key=lambda p: cpu(p) - before[p])


def _workers_of(session: int) -> list[int]:
    """The Dask worker processes a ``ctpore batch`` started (spawned into its session)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline").read()
            sid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[3])
        except (OSError, ValueError, IndexError):
            continue
        if sid == session and "spawn_main" in cmd:
            out.append(int(pid))
    return out


def _start(cmd: list[str]) -> tuple[subprocess.Popen, list[str]]:
    env = dict(os.environ, CTPORE_NO_PROGRESS="1", OMP_NUM_THREADS="1")
    env.pop("PYTHONUNBUFFERED", None)  # as in a user's shell: a pipe gets what ctpore flushes, no more
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    err: list[str] = []
    threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()
    return proc, err


def test_batch_prints_each_scan_as_it_ends_while_later_scans_still_run(tmp_path):
    small, _, _ = make_pair(1, shape=(16, 32, 32))
    big, _, _ = make_pair(2, shape=(96, 160, 160))
    write(tmp_path / "small.nii.gz", small)
    write(tmp_path / "big.nii.gz", big)
    (tmp_path / "m.txt").write_text("big.nii.gz\nsmall.nii.gz\n")
    out = tmp_path / "out"
    proc, err = _start([sys.executable, "-m", "ctpore.app.cli", "batch", str(tmp_path / "m.txt"), "-o", str(out),
                        "--weights", str(_weights(tmp_path)), "--workers", "2"])
    lines, seen = [], None
    try:
        for line in proc.stdout:  # read while the process runs
            lines.append(line.rstrip())
            if "small.nii.gz" in line:
                seen = (proc.poll(), (out / "big_metrics.json").exists(), len(report(out)))
                break
        rest = proc.stdout.read()
    finally:
        proc.wait(timeout=300)
    assert seen == (None, False, 1), (seen, lines, err)  # small's line came while big was still running
    assert lines[0].startswith("Dask dashboard: http://127.0.0.1:")  # the address first, before any scan
    assert lines[-1].startswith("[1/2] small.nii.gz  done  porosity")
    assert "[2/2] big.nii.gz  done" in rest and "2 done, 0 already done, 0 failed" in rest
    assert proc.returncode == 0, err
    # the scans' warnings (no length unit in these files) come out as reconstruct prints them
    warned = [e for e in err if "warning" in e.lower()]
    assert warned and all(e.startswith("ctpore: warning: ") for e in warned), err
    assert any("small.nii.gz" in e and "length unit" in e for e in warned)
    assert not [e for e in err if "CtporeWarning" in e or "warnings.warn" in e]


def test_a_retried_scan_is_said_as_retried_with_no_error_line(tmp_path):
    manifest, w = _slow_scans(tmp_path, 4), _weights(tmp_path)
    out = tmp_path / "out"
    proc, err = _start([sys.executable, "-m", "ctpore.app.cli", "batch", str(manifest), "-o", str(out),
                        "--weights", str(w), "--workers", "2"])
    lines, killed = [], None
    for line in proc.stdout:
        lines.append(line.rstrip())
        if killed is None and "  done  " in line:  # both workers are busy now: kill the busier one
            killed = _busiest(_workers_of(proc.pid))
            os.kill(killed, signal.SIGKILL)
    proc.wait(timeout=300)
    assert killed and proc.returncode == 0, (lines, err)
    assert [ln for ln in lines if "retried: its worker died (attempt 2 of 3)" in ln], lines
    assert not [e for e in err if "ERROR" in e], err  # the scheduler's error for the dead worker is left out
    recs = report(out)
    assert sorted(Path(r["scan"]).name for r in recs) == [f"g{i}.nii" for i in range(4)]
    assert max(r["attempts"] for r in recs) == 2


def test_the_summary_has_one_row_per_scan_its_latest_attempt(six, capsys):
    import csv

    args = ["batch", str(six / "m.csv"), "-o", str(six / "out"), "--method", "otsu", "--workers", "2"]
    with pytest.raises(SystemExit):
        main(args)
    first = {Path(r["scan"]).name: r for r in csv.DictReader((six / "out" / "batch_summary.csv").open())}
    assert len(first) == 6
    assert {n: r["status"] for n, r in first.items()} == {n: r["status"] for n, r in
                                                          ((Path(r["scan"]).name, r) for r in report(six / "out"))}
    assert float(first["s0.nii.gz"]["dice"]) == next(r["metrics"]["dice"] for r in report(six / "out")
                                                       if r["scan"].endswith("s0.nii.gz"))
    assert "truncated" in first["cut.nii.gz"]["error"]
    out = capsys.readouterr().out
    assert out.count("  done  porosity") == 4 and out.count("  failed: ") == 2  # a line per scan
    with pytest.raises(SystemExit):
        main(args)  # again: the good scans are skipped, the bad ones fail again
    assert len(report(six / "out")) == 12  # the report is appended to...
    again = {Path(r["scan"]).name: r for r in csv.DictReader((six / "out" / "batch_summary.csv").open())}
    assert len(again) == 6  # ...the summary keeps one row per scan
    for i in range(4):  # the attempt that made the outputs, not the skip
        assert again[f"s{i}.nii.gz"] == first[f"s{i}.nii.gz"]
    assert again["cut.nii.gz"]["ended"] >= first["cut.nii.gz"]["ended"]
    assert "skipped (outputs complete from an earlier run)" in capsys.readouterr().out
    assert not [p.name for p in (six / "out").iterdir() if p.name.startswith(".")]  # written whole


def _console_output(tty: bool) -> str:
    """What BatchConsole prints for three scans, its stdout a terminal (a pty, 100 columns) or a pipe."""
    import fcntl
    import pty
    import struct
    import termios

    code = ("from ctpore.app.batch_console import BatchConsole\n"
            "with BatchConsole(3) as c:\n"
            "    c.start({'dashboard': 'http://127.0.0.1:1/status', 'todo': 3, 'skipped': 0})\n"
            "    for i in range(3):\n"
            "        c.record({'scan': f's{i}.nii', 'status': 'done', 'metrics': {'porosity': 0.5}})\n")
    env = {k: v for k, v in os.environ.items() if k != "CTPORE_NO_PROGRESS"}
    if not tty:
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout
    main_fd, sub_fd = pty.openpty()
    fcntl.ioctl(sub_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=sub_fd, stderr=subprocess.DEVNULL)
    os.close(sub_fd)
    out = b""
    while True:
        try:
            chunk = os.read(main_fd, 4096)
        except OSError:  # the other end closed
            break
        if not chunk:
            break
        out += chunk
    proc.wait()
    os.close(main_fd)
    return out.decode()


def test_a_bar_over_the_scans_only_when_stdout_is_a_terminal():
    piped, term = _console_output(False), _console_output(True)
    for out in (piped, term):
        assert [ln for ln in out.replace("\r", "\n").splitlines() if ln.startswith("[")] == [
            f"[{i + 1}/3] s{i}.nii  done  porosity 0.5000  Euler -  pores -  [0.0 s]" for i in range(3)]
    assert "batch:" in term and "/3 [" in term  # tqdm's bar, between the lines
    assert "batch:" not in piped and "\r" not in piped


def test_a_line_a_killed_run_left_unended_does_not_swallow_the_next_record(tmp_path):
    from ctpore.pipelines.batch import _Report
    from ctpore.pipelines.batch_summary import latest_records

    path = tmp_path / REPORT_NAME
    done = {"scan": "a.nii", "status": "ok", "attempts": 1}
    path.write_text(json.dumps(done) + "\n" + '{"scan": "b.nii", "stat')  # killed mid-line
    rec = {"scan": "c.nii", "status": "ok", "attempts": 1}
    _Report(path).add(rec)
    _Report(path).add({**rec, "scan": "d.nii"})
    got = latest_records(path)
    assert list(got) == ["a.nii", "c.nii", "d.nii"] and got["c.nii"] == rec
    assert path.read_text().endswith("\n") and path.read_text().count("\n") == 4  # the torn line ended once


def test_a_stale_lock_warning_names_the_scans_path_and_the_output_folder(tmp_path, capsys):
    """Two scans of one file name in different folders (run into two output folders, as the stem rule
    asks): each stale-lock warning names its own scan's path and output folder."""
    import socket

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a run killed long ago: its pid is gone
    scan, _, _ = make_pair(0, shape=(16, 24, 24))
    lines = {}
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        path = write(tmp_path / sub / "rock.nii.gz", scan)
        (tmp_path / f"{sub}.txt").write_text(f"{sub}/rock.nii.gz\n")
        out = tmp_path / f"out_{sub}"
        out.mkdir()
        (out / ".rock.lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(),
                                                    "since": "2020-01-01T00:00:00"}))
        with pytest.raises(SystemExit) as exc:
            main(["batch", str(tmp_path / f"{sub}.txt"), "-o", str(out), "--method", "otsu", "--workers", "1"])
        err = capsys.readouterr().err
        assert exc.value.code == 0, err
        [line] = [ln for ln in err.splitlines() if "stale lock" in ln]
        assert line.startswith(f"ctpore: warning: {path}: took over a stale lock"), line
        assert str(out.absolute()) in line and f"process {dead.pid} is gone" in line, line
        assert not (out / ".rock.lock").exists() and (out / "rock_metrics.json").exists()
        lines[sub] = line
    assert lines["a"] != lines["b"]


@pytest.mark.parametrize("message,kept", [
    ("Couldn't gather keys: {'ctpore-g0.nii-1-23433': 'memory'}", False),  # a result lost with its worker
    ("Task ctpore-g1.nii-2 marked as failed because 4 workers died while trying to run it", False),
    ("something else went wrong", True),
])
def test_the_schedulers_errors_for_work_lost_with_a_dead_worker_are_left_out(message, kept):
    """A worker killed while the client gathers a result it held makes the scheduler log "Couldn't
    gather keys" (Dask computes the result again); like the error for a task whose worker died, the
    batch leaves it out of its output unless verbose. Any other scheduler error still shows."""
    import logging

    from ctpore.pipelines.batch_logs import quiet_dask

    seen = []

    class Catch(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    sched = logging.getLogger("distributed.scheduler")
    handler = Catch()
    sched.addHandler(handler)
    try:
        with quiet_dask():
            sched.error(message)
        with quiet_dask(verbose=True):
            sched.error(message)
    finally:
        sched.removeHandler(handler)
    assert seen == ([message] * 2 if kept else [message])
