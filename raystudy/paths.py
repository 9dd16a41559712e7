"""Where raystudy keeps what it builds or downloads; a leaf module that imports nothing of raystudy.

- ``cache()``: demo weights and tensor caches, ``$RAYSTUDY_CACHE`` or ``~/.cache/raystudy``;
- ``data_root()``: datasets, ``$RAYSTUDY_DATA`` or ``<cache>/data``.
Both are read from the environment when called, never at import.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache() -> Path:
    """Demo weights and tensor caches: ``$RAYSTUDY_CACHE`` or ``~/.cache/raystudy``."""
    return Path(os.environ.get("RAYSTUDY_CACHE", Path.home() / ".cache" / "raystudy"))


def data_root() -> Path:
    """Datasets: ``$RAYSTUDY_DATA`` or ``<cache>/data``."""
    return Path(os.environ.get("RAYSTUDY_DATA", cache() / "data"))


def tensor_cache(root: str | os.PathLike | None = None) -> Path:
    """Decoded-image tensor caches (``data_path: cache``) under ``root`` or ``cache()``."""
    return (Path(root) if root else cache()) / "tensors"
