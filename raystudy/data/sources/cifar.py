"""CIFAR-10 and CIFAR-100, read (or downloaded) with torchvision."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raystudy.data.source import (
    TORCHVISION_WHERE,
    ArrayImages,
    DatasetInfo,
    DatasetUnavailable,
    Pool,
    Source,
    download_failed,
)


def cifar(cls_name: str, name: str, where: str):
    """The loader of torchvision's ``cls_name`` (CIFAR10, CIFAR100): its train and test sets."""

    def load(root: Path, download: bool) -> Source:
        import torchvision.datasets as tvd

        cls = getattr(tvd, cls_name)
        try:
            tr, te = (cls(str(root), train=t, download=download) for t in (True, False))
        except RuntimeError as e:  # torchvision: "Dataset not found or corrupted."
            raise DatasetUnavailable(f"dataset {name!r}: not found under {root} ({e}); {where}") from None
        except OSError as e:  # a download that cannot reach its server (urllib's URLError)
            raise download_failed(name, root, e) from None
        return Source(
            Pool(ArrayImages(tr.data, tr.targets), np.asarray(tr.targets)),
            Pool(ArrayImages(te.data, te.targets), np.asarray(te.targets)),
        )

    return load


# CIFAR's tensor cache keeps the native 32x32 pixels; the others are squashed to 256x256 squares
# (their original height and width are kept, so crops still cover the regions torchvision's do).
_URL = "https://www.cs.toronto.edu/~kriz/{}-python.tar.gz"
DATASETS = tuple(
    DatasetInfo(
        name,
        classes,
        cifar(cls_name, name, TORCHVISION_WHERE),
        TORCHVISION_WHERE,
        cache_size=32,
        download=_URL.format(archive),
        study=True,
    )
    for name, classes, cls_name, archive in (
        ("cifar10", 10, "CIFAR10", "cifar-10"),
        ("cifar100", 100, "CIFAR100", "cifar-100"),
    )
)
