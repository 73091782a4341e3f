"""Shared test fixtures, and the display the Qt viewer tests need (skipped with the reason without one)."""

import os
import subprocess
import sys

import pytest
import torch

#: Fixtures that start a Qt application: their tests need a display (an X server, Xvfb, Wayland...).
QT_FIXTURES = {"make_napari_viewer", "qtbot", "qapp"}

#: Started in a child process, so that a display that cannot be had aborts the child, not the tests.
_PROBE = """
from qtpy.QtGui import QOpenGLContext
from qtpy.QtWidgets import QApplication
app = QApplication([])
ctx = QOpenGLContext()
print(QApplication.platformName(), ctx.create())
"""


def display_problem() -> str | None:
    """Why no Qt application with OpenGL (napari's canvas) can start here, or None when one can.

    pytest-xvfb has already started Xvfb (and set DISPLAY) when it is installed and finds
    ``Xvfb`` on the PATH. Without a display Qt aborts the whole process ("Fatal Python error:
    Aborted"), so the check runs in a child process.
    """
    if sys.platform.startswith("linux") and not any(
            os.environ.get(v) for v in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")):
        return ("no display: the napari viewer tests need one (an X server, or Xvfb, which pytest-xvfb starts "
                "when it is on the PATH: apt-get install xvfb, as .ci/run does)")
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no display: a Qt application could not start ({exc})"
    if out.returncode != 0:
        said = [ln for ln in out.stderr.splitlines() if ln.strip() and "Fatal Python" not in ln]
        return (f"no display: a Qt application could not start on DISPLAY={os.environ.get('DISPLAY', '')!r} "
                f"({said[0].strip() if said else f'exit code {out.returncode}'})")
    words = out.stdout.split()
    if words[-1:] != ["True"]:
        return f"no OpenGL on the Qt platform {words[0] if words else '?'!r}, which napari's canvas needs"
    return None


def pytest_collection_modifyitems(config, items):
    needs = [item for item in items if QT_FIXTURES & set(getattr(item, "fixturenames", ()))]
    if not needs:
        return
    why = display_problem()
    if why is not None:
        for item in needs:
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture
def one_thread():
    """Small tensors: one intra-op thread. Two threads gain nothing here, and when the cores are
    shared with another busy process, OpenMP's waiting makes each tiny op up to ~70x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def no_window_kernel(monkeypatch):
    """ctpore's C attention kernel turned off (``CTPORE_WINDOW_KERNEL=0``, read by child processes
    too): PyTorch's kernels run, as where the kernel is not built."""
    from ctpore.models import window_kernel

    monkeypatch.setenv("CTPORE_WINDOW_KERNEL", "0")
    window_kernel._library.cache_clear()
    yield
    monkeypatch.delenv("CTPORE_WINDOW_KERNEL")
    window_kernel._library.cache_clear()
