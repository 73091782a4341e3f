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
