"""The README's tables of figures are copied from files that commands wrote (docs/*.md), never typed."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def table_rows(text: str) -> list[str]:
    """The data rows of the Markdown tables in ``text`` (not headers or rules)."""
    rows = [line.strip() for line in text.splitlines() if line.strip().startswith("|")]
    return [r for r in rows if not re.fullmatch(r"\|[\s:|-]+\|", r) and re.search(r"\d", r)]


def test_readme_figure_tables_come_from_the_docs_files():
    readme = (ROOT / "README.md").read_text()
    sources = {name: (ROOT / "docs" / name).read_text() for name in ("performance.md", "benchmark.md")}
    further = ROOT / "docs" / "further" / "benchmark.md"
    if further.exists():
        sources["further/benchmark.md"] = further.read_text()
    found = [row for row in table_rows(readme) if any(row in text for text in sources.values())]
    figures = [row for row in table_rows(readme) if re.search(r"\d\.\d", row)]
    assert figures, "the README shows no table of figures"
    missing = [row for row in figures if row not in found]
    assert not missing, f"README rows with figures not in docs/*.md: {missing}"


def test_readme_names_the_commands_that_made_its_figures():
    readme = (ROOT / "README.md").read_text()
    for name in ("performance.md", "benchmark.md"):
        made_by = re.search(r"Reproduce: `([^`]+)`", (ROOT / "docs" / name).read_text())
        assert made_by and made_by.group(1).split(" --")[0] in readme, name


def test_every_measured_figure_in_the_readme_stands_in_a_docs_file():
    """Figures in the README's prose (numbers with a decimal point, and counts of %, x, GB or seconds)
    are copied from docs/ too."""
    readme = (ROOT / "README.md").read_text()
    readme = re.sub(r"Python\s*(≥|>=)?\s*\d+\.\d+(\s*\(\d+\.\d+ tested\))?", "", readme)  # versions
    sources = "\n".join(p.read_text() for p in sorted((ROOT / "docs").rglob("*.md")))
    sources += "\n".join(p.read_text() for p in sorted((ROOT / "docs").rglob("*.json")))
    figures = set(re.findall(r"(?<![\d.])-?\d+\.\d+(?![\d.]|th\b)", readme))  # not "the 99.5th percentile"
    # a figure with its unit ("0.97x", "1.09 GB", "25%") must stand in a docs file with that unit
    prose = re.sub(r"```.*?```", "", readme, flags=re.S)  # code: settings, not figures
    prose = re.sub(r"default \d+(\.\d+)?", "", prose)  # an option's default is a setting
    with_unit = re.findall(r"(?<![\w.–-])(-?\d+(?:\.\d+)?)(\s?)(%|x\b|GB\b|s\b|seconds\b|voxels/s)", prose)
    figures |= {n + sp + u for n, sp, u in with_unit if not re.fullmatch(r"[0-9]", n)}  # one digit: a count
    assert figures, "the README quotes no figure"
    missing = sorted(f for f in figures if f not in sources and f.lstrip("-") not in sources)
    assert not missing, f"README figures found in no docs file: {missing}"


def test_the_napari_section_says_what_a_machine_without_a_screen_needs():
    """Every system package .ci/run installs for the viewer tests is named in the README's napari
    section, with Xvfb and pytest-xvfb (which the test extra brings)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## In napari", 1)[1].split("\n## ", 1)[0]
    ci = (ROOT / ".ci" / "run").read_text()
    packages = re.search(r"apt-get install[^\n]*\\\n\s*([^>\n]+)", ci).group(1).split()
    assert "xvfb" in packages and any(p.startswith("libxcb") for p in packages), packages
    missing = [p for p in packages if p not in section]
    assert not missing, f"the napari section does not name {missing}"
    assert "Xvfb" in section and "pytest-xvfb" in section
    assert "pytest-xvfb" in (ROOT / "pyproject.toml").read_text()
