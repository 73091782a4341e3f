"""The README and the hand-written pages in docs/ quote figures copied from files that commands wrote
(docs/*.md written by ``ctpore bench``, and the JSON beside them), never typed; their links resolve, and the
README stays short, linking a page for each feature."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 260  # "README at most ~250 lines": a later feature adds a short section that links its own page

# the pages that commands write (each says which command on its first lines): the sources of every figure
GENERATED = ("benchmark.md", "performance.md", "sample.md", "further/benchmark.md", "adapt.md", "analysis.md",
             "flow.md", "scale.md")


def generated_pages() -> dict[str, str]:
    return {name: (DOCS / name).read_text() for name in GENERATED if (DOCS / name).exists()}


def handwritten_pages() -> list[Path]:
    """The README and every docs page that no command writes (architecture.md, training.md, ...)."""
    made = {DOCS / name for name in GENERATED}
    return [ROOT / "README.md"] + [p for p in sorted(DOCS.rglob("*.md")) if p not in made]


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def sources_text() -> str:
    """What figures may be copied from: the pages commands wrote and every JSON in docs/."""
    text = "\n".join(generated_pages().values())
    return text + "\n" + "\n".join(p.read_text() for p in sorted(DOCS.rglob("*.json")))


def table_rows(text: str) -> list[str]:
    """The data rows of the Markdown tables in ``text`` (not headers or rules)."""
    rows = [line.strip() for line in text.splitlines() if line.strip().startswith("|")]
    return [r for r in rows if not re.fullmatch(r"\|[\s:|-]+\|", r) and re.search(r"\d", r)]


def test_the_generated_pages_say_which_command_wrote_them():
    pages = generated_pages()
    assert {"benchmark.md", "performance.md", "sample.md"} <= set(pages)
    for name, text in pages.items():
        head = "\n".join(text.splitlines()[:4])
        assert re.search(r"(Reproduce:|Written by) `ctpore bench ", head), name


def test_the_readme_is_short():
    """README at most ~250 lines, from here on: details go to a page in docs/, linked from the README."""
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES}): move details to docs/"


def test_readme_figure_tables_come_from_the_docs_files():
    readme = (ROOT / "README.md").read_text()
    figures = [row for row in table_rows(readme) if re.search(r"\d\.\d", row)]
    assert figures, "the README shows no table of figures"


@pytest.mark.parametrize("page", handwritten_pages(), ids=page_id)
def test_figure_tables_come_from_the_generated_files(page):
    sources = generated_pages()
    figures = [row for row in table_rows(page.read_text()) if re.search(r"\d\.\d", row)]
    missing = [row for row in figures if not any(row in text for text in sources.values())]
    assert not missing, f"{page_id(page)} rows with figures in no file a command wrote: {missing}"


def test_readme_names_the_commands_that_made_its_figures():
    readme = (ROOT / "README.md").read_text()
    for name in ("performance.md", "benchmark.md"):
        made_by = re.search(r"Reproduce: `([^`]+)`", (DOCS / name).read_text())
        assert made_by and made_by.group(1).split(" --")[0] in readme, name


def quoted_figures(text: str) -> set[str]:
    """Figures in a page (numbers with a decimal point, and counts of %, x, GB or seconds)."""
    text = re.sub(r"Python\s*(≥|>=)?\s*\d+\.\d+(\s*\(\d+\.\d+ tested\))?", "", text)  # versions
    figures = set(re.findall(r"(?<![\d.])-?\d+\.\d+(?![\d.]|th\b)", text))  # not "the 99.5th percentile"
    # a figure with its unit ("0.97x", "1.09 GB", "25%") must stand in a source with that unit
    prose = re.sub(r"```.*?```", "", text, flags=re.S)  # code: settings, not figures
    prose = re.sub(r"default \d+(\.\d+)?", "", prose)  # an option's default is a setting
    with_unit = re.findall(r"(?<![\w.–-])(-?\d+(?:\.\d+)?)(\s?)(%|x\b|GB\b|s\b|seconds\b|voxels/s)", prose)
    return figures | {n + sp + u for n, sp, u in with_unit if not re.fullmatch(r"[0-9]", n)}  # one digit: a count


def test_the_readme_quotes_figures():
    assert quoted_figures((ROOT / "README.md").read_text()), "the README quotes no figure"


@pytest.mark.parametrize("page", handwritten_pages(), ids=page_id)
def test_every_measured_figure_stands_in_a_file_a_command_wrote(page):
    """Figures in the README's and the hand-written pages' prose are copied from the generated docs
    pages or the JSON in docs/, not from one another."""
    sources = sources_text()
    missing = sorted(f for f in quoted_figures(page.read_text()) if f not in sources and f.lstrip("-") not in sources)
    assert not missing, f"{page_id(page)}: figures found in no file a command wrote: {missing}"


def anchors(md: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown text."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.sub(r"```.*?```", "", md, flags=re.S), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("page", handwritten_pages(), ids=page_id)
def test_relative_links_and_their_anchors_resolve(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans: options in brackets, not links
    broken = []
    for target in re.findall(r"\]\(([^()\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked here
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            broken.append(target)
    assert not broken, f"{page_id(page)}: broken links {broken}"


def test_the_readme_links_every_handwritten_docs_page():
    """Each feature's page is reached from the README (a short section, or the commands table, links it)."""
    readme = (ROOT / "README.md").read_text()
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in re.findall(r"\]\((docs/[^()\s]+)\)", readme)}
    orphans = [page_id(p) for p in handwritten_pages()[1:] if p.resolve() not in linked]
    assert not orphans, f"docs pages the README does not link: {orphans}"


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


def test_no_docs_file_names_a_path_of_the_machine_that_wrote_it():
    """A clone has none of this machine's folders: the figures' files record commits, not paths."""
    root = Path(__file__).resolve().parent.parent
    found = {str(p.relative_to(root)): m.group(0) for p in [root / "README.md", *(root / "docs").rglob("*")]
             if p.is_file() and p.suffix in (".md", ".json")
             for m in [re.search(r'"(/(?:work|tmp|root|home)/[^"]*)"', p.read_text())] if m}
    assert not found, found
