"""The README's Layout table names the layers tests/test_imports.py enforces, its links lead somewhere,
and the test files it and the docs name are where the tests are."""

import re
from pathlib import Path

from tests import test_imports

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def layout_tree(text: str) -> list[str]:
    """The dotted names of the tree under ``## Layout``, in its order: a root folder as its package,
    an entry under it (``models/``, ``grid.py``) as ``raystudy.models``, ``raystudy.grid``."""
    section = text.split("\n## Layout", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    names, root = [], None
    for line in block.splitlines():
        nested = line[:1] in "├└│ "
        for token in line.lstrip("├└│─ ").split():
            m = re.fullmatch(r"(\w+)(/|\.py)", token)
            if not m:
                break
            if not nested:
                root, nested = m.group(1), True
                names.append(root)
            else:
                names.append(f"{root}.{m.group(1)}")
    return names


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of every heading in ``path``, fenced code left out."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_the_layout_tree_names_every_layer_test_imports_enforces_in_order():
    tree = layout_tree(README.read_text())
    layered = {name for layer in test_imports.LAYERS for name in layer}
    assert layered <= set(tree), f"not in the README's tree: {sorted(layered - set(tree))}"
    missing = [n for n in tree if n not in test_imports.modules() and not (ROOT / n.replace(".", "/")).is_dir()]
    assert not missing, f"the README's tree names what is not there: {missing}"
    order = [test_imports.layer_of(n) for n in tree if n.startswith("raystudy.")]
    assert order == sorted(order), "raystudy's entries are not in layer order"


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


def test_every_test_file_the_readme_and_docs_name_exists():
    # test files move with the modules they mirror: a page still naming one at its old path is caught here
    bad = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for path in re.findall(r"\btests/[\w/]*test_\w+\.py", page.read_text()):
            if not (ROOT / path).is_file():
                bad.append(f"{page.relative_to(ROOT)}: {path}")
    assert not bad, "\n".join(bad)
