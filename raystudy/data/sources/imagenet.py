"""ImageNet-1k's validation images, placed by hand: the probes' pretraining distribution."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raystudy.data.source import RGB, DatasetInfo, Pool, Source, require

WHERE = (
    "place the ImageNet-1k validation images, one folder per class, so that "
    "<data_root>/imagenet/val/<wnid>/*.JPEG exist (https://image-net.org, licence required)"
)


def imagenet_val(name: str, where: str):
    """ImageNet val as a test-only pool: the pretraining distribution the plasticity probes draw x from."""

    def load(root: Path, download: bool) -> Source:
        from torchvision.datasets import ImageFolder

        ds = ImageFolder(str(require(root / "imagenet" / "val", name, where)))
        empty = Pool([], np.zeros(0, dtype=np.int64))
        return Source(empty, Pool(RGB(ds), np.asarray(ds.targets)))

    return load


DATASETS = (DatasetInfo("imagenet_val", 1000, imagenet_val("imagenet_val", WHERE), WHERE),)
