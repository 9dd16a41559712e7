"""The README's Layout table names the layers tests/test_imports.py enforces, and its links lead somewhere."""

import re
from pathlib import Path

import test_imports

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def module_name(cell: str) -> str:
    """The dotted module a README name stands for: packages and ``analysis.*`` as written, the
    rest under ``raystudy.`` (``errors`` -> ``raystudy.errors``, ``driver.tune`` -> ``raystudy.driver.tune``)."""
    if cell in test_imports.PACKAGES or cell.split(".")[0] in test_imports.PACKAGES:
        return cell
    return f"raystudy.{cell}"


def layout_table(text: str) -> list[set[str]]:
    """The modules column of the table under ``## Layout``, one set of dotted names per row."""
    section = text.split("\n## Layout", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # past the header and its rule
    return [{module_name(name) for name in re.findall(r"`([^`]+)`", row.split("|")[2])} for row in rows]


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of every heading in ``path``, fenced code left out."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_the_layout_table_lists_the_layers_test_imports_enforces_in_order():
    table = layout_table(README.read_text())
    layers = [set(layer) for layer in test_imports.LAYERS]
    assert len(table) == len(layers), f"README has {len(table)} layers, test_imports.LAYERS {len(layers)}"
    for i, (row, layer) in enumerate(zip(table, layers)):
        assert row == layer, (
            f"layer {i}: only in the README {sorted(row - layer)}, only in test_imports.LAYERS {sorted(layer - row)}"
        )


def test_every_docs_page_the_readme_links_exists():
    targets = [t for t in LINK.findall(README.read_text()) if t.startswith("docs/")]
    assert targets, "the README links no docs page"
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).is_file()]
    assert not missing, f"README links missing docs pages: {missing}"


def test_every_relative_link_and_anchor_in_the_readme_and_docs_resolves():
    bad = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not bad, "\n".join(bad)
