"""Oxford's Flowers102 and Oxford-IIIT Pet: torchvision datasets with named splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raystudy.data.source import (
    RGB,
    TORCHVISION_WHERE,
    DatasetInfo,
    DatasetUnavailable,
    Pool,
    Source,
    download_failed,
)


def split_dataset(cls_name: str, name: str, where: str, splits: dict[str, str], **kw):
    """The loader of torchvision's ``cls_name``: each role (train, val, test) read from its named split."""

    def load(root: Path, download: bool) -> Source:
        import torchvision.datasets as tvd

        cls = getattr(tvd, cls_name)
        pools = {}
        for role, split in splits.items():
            try:
                ds = cls(str(root), split=split, download=download, **kw)
            except RuntimeError as e:
                raise DatasetUnavailable(f"dataset {name!r}: not found under {root} ({e}); {where}") from None
            except OSError as e:
                raise download_failed(name, root, e) from None
            pools[role] = Pool(RGB(ds), np.asarray(ds._labels))
        return Source(pools["train"], pools["test"], pools.get("val"))

    return load


DATASETS = (
    DatasetInfo(
        "flowers102",
        102,
        split_dataset("Flowers102", "flowers102", TORCHVISION_WHERE, {"train": "train", "val": "val", "test": "test"}),
        TORCHVISION_WHERE,
        download="https://www.robots.ox.ac.uk/~vgg/data/flowers/102/",
        study=True,
    ),
    DatasetInfo(
        "pets",
        37,
        split_dataset(
            "OxfordIIITPet", "pets", TORCHVISION_WHERE, {"train": "trainval", "test": "test"}, target_types="category"
        ),
        TORCHVISION_WHERE,
        download="https://www.robots.ox.ac.uk/~vgg/data/pets/data/images.tar.gz",
        study=True,
    ),
)
