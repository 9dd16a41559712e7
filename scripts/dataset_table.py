"""The dataset table of docs/finetune.md, written from the registry (``raystudy.data.registry``).

    python scripts/dataset_table.py      # rewrite the table between its markers, if it changed

tests/test_data_registry.py fails while the page's table and the registry disagree. Bad input
exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout

PAGE = ROOT / "docs" / "finetune.md"
BEGIN = "<!-- dataset table: written from the registry by python scripts/dataset_table.py -->"
END = "<!-- end of the dataset table -->"


def table() -> str:
    """The registry as a Markdown table: name, classes, whether the study runs it, its files."""
    from raystudy.data.registry import DATASETS

    rows = ["| dataset | classes | in the study | files |", "|---|---|---|---|"]
    for info in DATASETS.values():
        if info.download:
            files = "torchvision downloads them (`--download`, `raystudy prefetch`)"
        elif info.image:
            files = "placed by hand: `raystudy data` says where"
        else:
            files = "none: built in memory"
        rows.append(f"| `{info.name}` | {info.num_classes} | {'yes' if info.study else ''} | {files} |")
    return "\n".join(rows)


def updated(text: str) -> str:
    """``text`` (the page) with the table between its markers written anew; ValueError without them."""
    head, sep, rest = text.partition(BEGIN + "\n")
    _, sep2, tail = rest.partition(END)
    if not (sep and sep2):
        raise ValueError(f"{PAGE.relative_to(ROOT)}: the table's markers are missing")
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    """Rewrite the page's table if it differs from the registry's; the exit status."""
    from raystudy.errors import OneLineParser

    OneLineParser(prog="python scripts/dataset_table.py", description=__doc__.splitlines()[0]).parse_args(argv)
    text = PAGE.read_text()
    try:
        new = updated(text)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if new != text:
        PAGE.write_text(new)
    print(f"{PAGE.relative_to(ROOT)}: the dataset table {'written' if new != text else 'already up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
