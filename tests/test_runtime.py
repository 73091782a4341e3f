"""Process-wide settings: the allocator tuning and the process's memory."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ctpore.runtime import current_rss


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc on Linux")
def test_tuned_allocator_keeps_freed_memory_for_reuse():
    # In a fresh process: after freeing a 200 MB block, the tuned process still holds it (for the
    # next chunk), the default one has handed it back to the kernel.
    code = """
import sys
from ctpore.runtime import current_rss, tune_allocator
if sys.argv[1] == "tuned":
    assert tune_allocator()
import numpy as np
a = np.ones(200 * 2**20 // 8)
held = current_rss()
del a
print(held - current_rss())
"""
    freed = {m: int(subprocess.run([sys.executable, "-c", code, m], capture_output=True, text=True,
                                   check=True).stdout) for m in ("tuned", "default")}
    assert freed["default"] > 150 * 2**20
    assert freed["tuned"] < 20 * 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc on Linux")
def test_current_rss_sees_an_allocation():
    code = """
import numpy as np
from ctpore.runtime import current_rss
before = current_rss()
a = np.ones(100 * 2**20 // 8)
print(current_rss() - before)
"""
    grown = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 90 * 2**20 < grown < 130 * 2**20
    assert current_rss() > 0


_POLICY = """
import os, sys
from ctpore.runtime import openmp_policy_is_ours, quiet_openmp
if sys.argv[1] == "torch-first":
    import torch  # noqa: F401
print(quiet_openmp(), os.environ.get("OMP_WAIT_POLICY"), openmp_policy_is_ours())
"""


@pytest.mark.parametrize("preset, order, expected", [
    (None, "ours-first", "True PASSIVE True"),       # unset: ctpore lets idle OpenMP threads sleep
    ("ACTIVE", "ours-first", "False ACTIVE False"),  # the user's own policy stays
    (None, "torch-first", "False None False"),       # too late once torch (and OpenMP) loaded
])
def test_quiet_openmp_sets_the_policy_only_before_torch_and_never_over_the_users(preset, order, expected):
    import os

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if preset:
        env["OMP_WAIT_POLICY"] = preset
    out = subprocess.run([sys.executable, "-c", _POLICY, order], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split("\n")[-2] == expected


def test_the_ctpore_command_sets_it_and_the_speed_bench_runs_other_programs_without_it():
    import os

    code = ("import os, sys, json; from ctpore.app.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "import ctpore.pipelines.bench.speed as s\n"
            "seen = []\n"
            "done = s.subprocess.CompletedProcess([], 0, '[0.1, 1, 0]', '')\n"
            "s.subprocess.run = lambda cmd, **k: seen.append(k['env'].get('OMP_WAIT_POLICY')) or done\n"
            "s._run(['python', '-V'])\n"
            "print(json.dumps([os.environ.get('OMP_WAIT_POLICY'), seen[0]]))")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip().splitlines()[-1] == '["PASSIVE", null]'
