"""CIFAR-10-C at severity 5, one dataset per corruption, from the files unpacked by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raystudy.data.source import ArrayImages, DatasetInfo, Source, pool_test, reference_split, require

CIFAR10C_CORRUPTIONS = ("contrast", "gaussian_noise", "motion_blur", "snow", "speckle_noise")
CIFAR10C_SEVERITY = 5
WHERE = (
    "download CIFAR-10-C from https://zenodo.org/records/2535967 and unpack it so that "
    "<data_root>/CIFAR-10-C/<corruption>.npy and labels.npy exist"
)


def cifar10c(corruption: str, name: str, where: str):
    """The loader of one corruption: its severity's 10,000 images, split 80/20 as the paper's code."""

    def load(root: Path, download: bool) -> Source:
        d = require(root / "CIFAR-10-C", name, where)
        imgs = np.load(require(d / f"{corruption}.npy", name, where), mmap_mode="r")
        labels = np.load(require(d / "labels.npy", name, where))
        lo = (CIFAR10C_SEVERITY - 1) * 10_000  # rows are severities 1..5, 10k images each
        imgs, labels = imgs[lo : lo + 10_000], labels[lo : lo + 10_000]
        return pool_test(ArrayImages(imgs, labels), labels, reference_split)

    return load


DATASETS = tuple(
    DatasetInfo(f"cifar10c_{c}", 10, cifar10c(c, f"cifar10c_{c}", WHERE), WHERE, cache_size=32, study=True)
    for c in CIFAR10C_CORRUPTIONS
)
