"""The house rules, checked on the source: layers point down, no cycles, no private imports.

``app -> pipelines -> models -> data``; ``models`` and ``data`` never import ``pipelines`` or
``app``; ``data`` never imports ``models`` (``models`` may use ``data``: a weights file's
post-processing is a :mod:`ctpore.data.postprocess` object). The top-level plumbing (``errors``, ``progress``,
``atomic``, ``version``) imports nothing of ctpore but ``errors``; the package root's own edges (its lazy
attributes) count like any other, so a module importing the root back is a cycle. No module imports a private name
(``_x``) of another module, and no two modules import each other, directly or in a ring.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUMBING = {"errors", "progress", "atomic", "version"}


PACKAGES = ("app", "pipelines", "models", "data", "configs")


def _modules() -> dict[str, Path]:
    out = {}
    files = [*ROOT.glob("*.py"), *(f for pkg in PACKAGES for f in (ROOT / pkg).rglob("*.py"))]
    for path in files:
        rel = path.relative_to(ROOT)
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(["ctpore", *parts])] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, list[str]]]:
    """``(module imported, names taken from it)`` for every ctpore import in a module, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.startswith("ctpore"):
                names = [a.name for a in node.names]
                # ``from ctpore.pkg import submodule`` imports the submodule
                subs = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in MODULES]
                found += [(s, []) for s in subs]
                found.append((mod, [n for n in names if f"{mod}.{n}" not in MODULES]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("ctpore")]
    return found


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "top"


def test_the_source_tree_was_found():
    assert {"ctpore.models.poreformer", "ctpore.pipelines.reconstruct", "ctpore.data.io.scan",
            "ctpore.app.cli", "ctpore.errors"} <= set(MODULES)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_layers_point_down_and_no_private_names_are_imported(name):
    allowed = {
        "app": {"app", "pipelines", "models", "data", "configs", "top"},
        "pipelines": {"pipelines", "models", "data", "configs", "top"},
        "models": {"models", "data", "top"},
        "data": {"data", "top"},
        "configs": {"top"},
    }
    layer = _layer(name) if name.split(".")[1:2] != [] and name.split(".")[1] in allowed else "top"
    for mod, names in _imports(name, MODULES[name]):
        target = mod.split(".")[1] if len(mod.split(".")) > 1 and mod.split(".")[1] in allowed else "top"
        if layer == "top":
            assert mod in ("ctpore", "ctpore.errors") or name == "ctpore", f"{name} imports {mod}"
        else:
            assert target in allowed[layer], f"{name} ({layer}) imports {mod} ({target})"
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        assert not private, f"{name} imports private {private} from {mod}"


def test_no_import_cycles():
    graph = {name: {m for m, _ in _imports(name, path) if m in MODULES and m != name}
             for name, path in MODULES.items()}
    # a package's __init__ importing its own submodules (to re-export them) is not a cycle; the root
    # package's edges all count (its lazy attributes import the pipelines, which must not import it back)
    for name in graph:
        if name != "ctpore":
            graph[name] = {m for m in graph[name] if not m.startswith(name + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                ring = stack[stack.index(m):] + [m]
                raise AssertionError("import cycle: " + " -> ".join(ring))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)


MAX_LINES = 400


def test_no_module_is_over_the_cap():
    """One idea a file: a module that grows past 400 lines is split along what it holds."""
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_every_module_is_named_in_the_architecture_map():
    """docs/architecture.md is the newcomer's map: every module of the package (a package's
    ``__init__.py`` apart) is named in it by its file name, so a module added or
    moved without its line in the map fails here."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"\b([A-Za-z0-9_]+\.(?:py|c))\b", text))
    missing = sorted(str(path.relative_to(ROOT)) for path in MODULES.values()
                     if path.name != "__init__.py" and path.name not in named)
    assert not missing, f"not named in docs/architecture.md: {missing}"


def test_every_package_is_in_the_installed_list():
    # ``pip install .`` (the README's quick start) ships only the packages pyproject.toml lists
    text = (ROOT / "pyproject.toml").read_text()
    table = text.split("[tool.setuptools]")[1].split("[tool.setuptools.package-dir]")[0]
    listed = set(re.findall(r'"(ctpore(?:\.[a-z_]+)*)"', table))
    found = {"ctpore." + ".".join(p.parent.relative_to(ROOT).parts) if p.parent != ROOT else "ctpore"
             for pkg in PACKAGES for p in (ROOT / pkg).rglob("__init__.py")} | {"ctpore"}
    assert found - listed == set(), f"packages missing from pyproject.toml's list: {sorted(found - listed)}"
