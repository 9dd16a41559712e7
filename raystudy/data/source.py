"""What every dataset source builds on: the registry's record, the raw pools a loader returns, and
the containers and fixed splits the loaders share.

A source module (``raystudy.data.sources``) lists its ``DatasetInfo`` records; each record's loader
``(root, download) -> Source`` gives the raw pools, which ``raystudy.data.splits`` splits and views.
Nothing here imports torch: the registry (every CLI's config check) stays free of its import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

VAL_FRACTION = 0.2
TEST_FRACTION = 0.2  # for datasets without an official test split

TORCHVISION_WHERE = (
    "prefetch it (python -m raystudy prefetch --datasets NAME), pass download=true (--download) "
    "to fetch it with torchvision, or place the files there"
)


class DatasetUnavailable(RuntimeError):
    """A dataset's files are missing; the message names the path expected and where to get them."""


@dataclass(frozen=True)
class Pool:
    """Raw images before any split: ``items[i] -> (image, label)`` and the labels as an array."""

    items: Sequence
    labels: np.ndarray


@dataclass(frozen=True)
class Source:
    """A dataset's raw pools: training, test, and its official validation split if it has one."""

    train_pool: Pool
    test: Pool
    val: Pool | None = None  # an official validation split, if the dataset has one


@dataclass(frozen=True)
class DatasetInfo:
    """One entry of the dataset registry: its name, classes, loader and where its files come from."""

    name: str
    num_classes: int
    load: Callable[[Path, bool], Source]
    where: str  # where to get the files
    image: bool = True  # PIL images (False: the demo's ready tensors)
    tokens: bool = False  # token-id sequences, for GPT-2 (no transform, no tensor cache)
    val_fraction: float = VAL_FRACTION
    cache_size: int = 256  # side of the tensor cache's squares (data_path: cache)
    download: str = ""  # where torchvision downloads it from (``download=true``, prefetch); empty: by hand
    study: bool = False  # one of the paper's benchmarks (the registry's order is the study's)


class ArrayImages:
    """uint8 images (N, H, W, C) as PIL images, without copying the array."""

    def __init__(self, images: np.ndarray, labels: Sequence[int]):
        self.images, self.labels = images, np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        from PIL import Image

        return Image.fromarray(self.images[i]), int(self.labels[i])


class TensorImages:
    """Float images (N, C, H, W) in [0, 1]: the demo's, already at the model's size."""

    def __init__(self, images: torch.Tensor, labels: Sequence[int]):
        self.images, self.labels = images, np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.images[i], int(self.labels[i])


class RGB:
    """Some Pets images are grey or RGBA; the model wants RGB."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        img, label = self.ds[i]
        return img.convert("RGB"), label


class Subset:
    """The items of ``items`` at ``idx``, in that order."""

    def __init__(self, items, idx):
        self.items, self.idx = items, idx

    def __len__(self) -> int:
        return len(self.idx)

    def __getitem__(self, i: int):
        return self.items[int(self.idx[i])]


def require(path: Path, name: str, where: str) -> Path:
    """``path``, or DatasetUnavailable naming it and ``where`` to get dataset ``name``'s files."""
    if not path.exists():
        raise DatasetUnavailable(f"dataset {name!r}: expected files at {path}, not found; {where}")
    return path


def download_failed(name: str, root: Path, e: OSError) -> DatasetUnavailable:
    """A download that could not reach its server, in one line (urllib's URLError wraps the
    socket error that says why, e.g. ``Connection refused``)."""
    inner = getattr(e, "reason", None)
    why = getattr(inner, "strerror", None) or inner or e.strerror or e
    return DatasetUnavailable(
        f"dataset {name!r}: download failed ({why}); on a machine with network run "
        f"python -m raystudy prefetch --datasets {name} and copy the files under {root}"
    )


def fixed_split(n: int, frac: float = TEST_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """A run-independent (pool, test) split of range(n): seed 0, always the same (the demo's)."""
    perm = np.random.default_rng(0).permutation(n)
    n_test = int(round(n * frac))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def reference_split(n: int, train_size: float = 0.8) -> tuple[np.ndarray, np.ndarray]:
    """The paper's (pool, test) split of range(n) for CIFAR-10-C and DomainNet, as its code draws it.

    The reference permutes with numpy's legacy global seed 42, keeps the first ``int(0.8 n)``
    indices for training and the rest for test, and sorts each; the same images in the same
    order matter, since the plasticity probe pairs test images in order.
    """
    perm = np.random.RandomState(42).permutation(n)
    n_train = int(train_size * n)
    return np.sort(perm[:n_train]), np.sort(perm[n_train:])


def pool_test(items, labels: np.ndarray, split=fixed_split) -> Source:
    """A Source of ``items`` with no official test split: ``split`` cuts it into pool and test."""
    pool, test = split(len(labels))
    return Source(Pool(Subset(items, pool), labels[pool]), Pool(Subset(items, test), labels[test]))
