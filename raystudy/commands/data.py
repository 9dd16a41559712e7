"""``raystudy data``: the dataset registry, where its files live and their caches.

python -m raystudy data
"""

from __future__ import annotations

import sys

from raystudy import paths
from raystudy.data.registry import DATASETS


def build_parser():
    """The argument parser of ``python -m raystudy data``."""
    from raystudy.errors import OneLineParser

    return OneLineParser(
        prog="raystudy data",
        description="List the dataset registry, where its files live and their caches.",
    )


def main(argv: list[str] | None = None) -> int:
    """Print the dataset registry, the data root and the tensor cache; returns the exit status."""
    build_parser().parse_args(argv)
    root = paths.data_root()
    print(f"data root: {root}  (set RAYSTUDY_DATA or data_root to change)")
    print(f"tensor cache (data_path: cache): {paths.tensor_cache()}  (set RAYSTUDY_CACHE to change)")
    print(f"{'dataset':<26}{'classes':>8}{'cache':>9}  source")
    for info in DATASETS.values():
        size = f"{info.cache_size}px" if info.image else "tokens" if info.tokens else "memory"
        print(f"{info.name:<26}{info.num_classes:>8}{size:>9}  {info.where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
