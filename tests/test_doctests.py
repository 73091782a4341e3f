"""The Examples in the docstrings run, and say what they show: every module's doctests, as the
README's test command runs them (examples marked ``# doctest: +SKIP`` need files or a GPU)."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil

import numpy as np
import pytest

import ctpore


def _modules() -> list[str]:
    names = ["ctpore"]
    for info in pkgutil.walk_packages(ctpore.__path__, prefix="ctpore."):
        spec = importlib.util.find_spec(info.name)
        python = spec is not None and str(spec.origin).endswith(".py")  # not the C kernel (ctypes loads it)
        if ".tests" not in info.name and python:
            names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    if name.startswith("ctpore.app.napari"):
        pytest.importorskip("napari", reason="the napari plugin's modules need napari")
    monkeypatch.chdir(tmp_path)  # an example that writes a file writes it here
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name, globs={"np": np, **vars(module)}):
        runner.run(test)
    res = runner.summarize(verbose=False)
    assert res.failed == 0, f"{res.failed} of {res.attempted} examples in {name} failed (see the output above)"
