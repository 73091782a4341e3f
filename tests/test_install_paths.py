"""Install paths that work: a command whose extra is missing says the pip command (exit 2), and the
test suite runs without a display (the napari viewer tests skip with the reason)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from helpers import run_cli

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def manifest(tmp_path) -> Path:
    nib.save(nib.Nifti1Image(np.zeros((8, 8, 8), np.float32), np.eye(4)), tmp_path / "a.nii.gz")
    (tmp_path / "m.txt").write_text("a.nii.gz\n")
    return tmp_path / "m.txt"


@pytest.mark.parametrize("missing", [("distributed",), ("dask", "distributed")])
def test_batch_without_the_cluster_extra_says_the_pip_command(manifest, tmp_path, monkeypatch, capsys, missing):
    for name in missing:
        monkeypatch.setitem(sys.modules, name, None)  # "import name" now raises ImportError
    code, out, err = run_cli(["batch", manifest, "-o", tmp_path / "out"], capsys)
    [line] = err.strip().splitlines()
    assert code == 2 and "internal error" not in line and "Traceback" not in err
    assert "pip install 'dask[distributed]>=2024.1'" in line and "pip install '.[cluster]'" in line, line
    assert not (tmp_path / "out").exists()  # before any work


def test_run_batch_without_distributed_says_the_pip_command(manifest, tmp_path, monkeypatch):
    from ctpore.errors import InputError
    from ctpore.pipelines.batch import run_batch

    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(InputError, match=r"pip install '\.\[cluster\]'"):
        run_batch(manifest, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_batch_command_without_distributed_installed(manifest, tmp_path):
    """The console entry in a fresh process, with a ``distributed`` that cannot be imported first on its path."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "distributed.py").write_text("raise ModuleNotFoundError(\"No module named 'distributed'\")\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-m", "ctpore.app.cli", "batch", str(manifest), "-o", str(tmp_path / "o")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        "ctpore: error: ctpore batch runs on Dask's distributed scheduler, which is not installed here (No module "
        "named 'distributed'); install it with: pip install 'dask[distributed]>=2024.1' (or install ctpore with its "
        "cluster extra: pip install '.[cluster]' in its folder)"]


def _without_display(tmp_path: Path, **extra) -> dict:
    """An environment with no display and no Xvfb on the PATH (only this Python's folder)."""
    bindir = Path(sys.executable).parent
    if (bindir / "Xvfb").exists():
        pytest.skip(f"Xvfb is in {bindir}, the folder of this Python")
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env.update(PATH=str(bindir), CTPORE_NO_PROGRESS="1", **extra)
    assert shutil.which("Xvfb", path=env["PATH"]) is None
    return env


@pytest.mark.parametrize("case", ["no display", "a display that cannot be opened"])
def test_the_napari_tests_skip_with_a_reason_without_a_display(tmp_path, case):
    pytest.importorskip("napari")
    env = _without_display(tmp_path, **({"DISPLAY": ":97"} if case != "no display" else {}))
    res = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "tests" / "test_napari.py"), "-q", "-rs",
                          "-p", "no:cacheprovider", "-k", "widget or pores_show"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    said = res.stdout + res.stderr
    assert res.returncode == 0 and "Fatal Python error" not in said, said[-3000:]
    assert re.search(r"^3 skipped, \d+ deselected in ", said.strip().splitlines()[-1]), said[-3000:]
    why = ("no display: the napari viewer tests need one" if case == "no display"
           else "no display: a Qt application could not start on DISPLAY=':97'")
    assert f"SKIPPED [3] tests/test_napari.py: {why}" in said, said[-3000:]
