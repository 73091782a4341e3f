"""The README's quick start does what it says and leaves nothing untracked in a clone."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def quickstart_commands() -> list[list[str]]:
    """The ``ctpore`` commands of the README's first quick-start line (the installs left out)."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Quick start.*?```bash\n(.*?)\n```", readme, re.S)
    assert block, "the README has no quick-start block"
    first = block.group(1).splitlines()[0]
    cmds = [shlex.split(c) for c in first.split("&&")]
    return [c for c in cmds if c and c[0] == "ctpore"]


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_the_quick_start_leaves_its_outputs_and_nothing_untracked(tmp_path):
    cmds = quickstart_commands()
    assert [c[1] for c in cmds] == ["simulate", "reconstruct"]
    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for cmd in cmds:
        proc = subprocess.run([sys.executable, "-m", "ctpore.app.cli", *cmd[1:]], cwd=tmp_path,
                              capture_output=True, text=True, env={"CTPORE_NO_PROGRESS": "1", "PATH": "/usr/bin:/bin",
                                                                   "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr
    for name in ("scan_0000_pores.nii.gz", "scan_0000_prob.nii.gz", "scan_0000_metrics.json"):
        assert (tmp_path / "out" / name).is_file(), name  # what the README says it leaves
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=tmp_path,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    assert status == ["?? .gitignore"], status
