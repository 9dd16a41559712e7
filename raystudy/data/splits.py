"""The paper's splits of a dataset for one run, viewed for either data path.

Every dataset yields a *training pool* and a *test* set (``raystudy.data.registry``). The validation
set is 20% of the pool, split by the run's seed (Flowers102: its official val split). CIFAR-10-C and
DomainNet have no official test split, so a fixed 80/20 split (the reference code's: independent of
the run) makes one. ``build_splits`` gives the splits as views: per-image transforms
(``raystudy.data.transforms``) or the tensor cache's batches (``raystudy.data.batches``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from raystudy import paths
from raystudy.data import userdata
from raystudy.data.registry import dataset_info, user_source
from raystudy.data.source import VAL_FRACTION, DatasetInfo, Pool
from raystudy.data.transforms import transforms
from raystudy.errors import ConfigError

if TYPE_CHECKING:  # torch is imported where tensors are made: the registry alone (every CLI's
    from torch.utils.data import Dataset  # config check) stays free of torch's seconds of import

    from raystudy.data.batches import TensorPool

LOW_DATA_PER_CLASS = 10
VTAB_TRAIN, VTAB_VAL = 800, 200  # VTAB-1k: the paper's low-data regime
DATA_PATHS = ("auto", "torchvision", "cache")


@dataclass(frozen=True)
class Splits:
    """The train, validation and test datasets of a run, and the number of classes."""

    train: Dataset
    val: Dataset
    test: Dataset
    num_classes: int


class View:
    """A subset of a pool with a transform: how train, val and test share one pool (a map-style
    dataset, all a DataLoader needs)."""

    def __init__(self, items: Sequence, indices: np.ndarray, transform: Callable | None):
        self.items, self.indices, self.transform = items, np.asarray(indices), transform

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        img, label = self.items[int(self.indices[i])]
        return (self.transform(img) if self.transform else img), label


def check_vtab1k_pool(data: str) -> None:
    """Your own data at ``data`` holds enough images for ``low_data_split: vtab1k`` (800 training
    and 200 validation images drawn from its pool, or from its given train and val splits);
    ConfigError naming the pool size and the fix otherwise."""
    p = userdata.partition(userdata.scan(data))
    sizes = [("training pool", len(p.pool.labels), VTAB_TRAIN + (VTAB_VAL if p.val is None else 0))]
    if p.val is not None:
        sizes.append(("given val split", len(p.val.labels), VTAB_VAL))
    for what, have, need in sizes:
        if have < need:
            raise ConfigError(
                f"data {data!r}: low_data_split vtab1k draws {VTAB_TRAIN} + {VTAB_VAL} images, but the "
                f"{what} holds {have}; use low_data_split: per_class"
            )


def split_pool(
    labels: np.ndarray, seed: int, low_data: bool = False, frac: float = VAL_FRACTION, low_data_split: str = "vtab1k"
) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) indices of a pool: val is ``frac`` of it, chosen by ``seed``.

    ``low_data``: with ``low_data_split="vtab1k"`` (the paper's), 800 training and 200
    validation images drawn from the pool by ``seed`` (VTAB-1k); with ``"per_class"``, the usual
    validation split and 10 training images per class (chosen by the same seed).
    """
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(labels))
    if low_data and low_data_split == "vtab1k":
        if len(labels) < VTAB_TRAIN + VTAB_VAL:
            raise ConfigError(
                f"low_data_split vtab1k draws {VTAB_TRAIN} + {VTAB_VAL} images, but the "
                f"training pool holds {len(labels)}; use low_data_split: per_class"
            )
        return np.sort(perm[:VTAB_TRAIN]), np.sort(perm[VTAB_TRAIN : VTAB_TRAIN + VTAB_VAL])
    n_val = int(round(len(labels) * frac))
    val, train = np.sort(perm[:n_val]), perm[n_val:]
    if low_data:
        train = subsample_per_class(labels, train, LOW_DATA_PER_CLASS, rng)
    return np.sort(train), val


def subsample_per_class(labels: np.ndarray, idx: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """At most ``k`` of ``idx`` per class (drawn by ``rng``), sorted."""
    keep = []
    for c in np.unique(labels[idx]):
        members = idx[labels[idx] == c]
        keep.append(rng.choice(members, size=min(k, len(members)), replace=False))
    return np.sort(np.concatenate(keep))


def resolve_data_path(data_path: str, name: str, data: str = "") -> str:
    """``torchvision`` or ``cache``: ``auto`` takes the cache path for ready tensors (the demo)."""
    if data_path not in DATA_PATHS:
        raise ConfigError(f"unknown data_path {data_path!r}; valid: {', '.join(DATA_PATHS)}")
    if data_path == "auto":
        info = dataset_info(name, data)
        return "torchvision" if info.image or info.tokens else "cache"
    return data_path


def build_splits(
    name: str,
    *,
    seed: int,
    img_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    root: str | Path | None = None,
    download: bool = False,
    low_data: bool = False,
    low_data_split: str = "vtab1k",
    data_path: str = "torchvision",
    cache: str | Path | None = None,
    augment_train: bool = True,
    data: str = "",
    channels: int = 3,
) -> Splits:
    """Train/val/test datasets of ``name`` for a run with ``seed``.

    ``data_path="cache"`` gives CachedViews over the tensor cache (decoded on first use, under
    ``cache`` or the default cache) instead of Views with per-image transforms; the split
    indices are the same on both paths. ``augment_train=False``: training images get the eval
    transform (features for a linear probe). The test split never changes, low data or not.
    ``data``: ``name`` is your own images there (``raystudy.data.userdata``), read with ``channels``
    channels (1: grey, for a grey model such as the demo's); the classes come from the data.
    """
    info = dataset_info(name, data)
    root = Path(root) if root else paths.data_root()
    ident = ""
    if data:
        if channels != 3 and data_path == "cache":
            raise ConfigError(
                f"data_path cache keeps RGB images; a {channels}-channel model on your own data takes "
                "data_path torchvision"
            )
        src, scanned = user_source(data, "RGB" if channels == 3 else "L")
        info = dataclasses.replace(info, num_classes=len(scanned.classes))
        ident = scanned.fingerprint
    else:
        src = info.load(root, download)
    path = resolve_data_path(data_path, name, data)  # resolved here: your own data is no registry entry
    view = _view_maker(name, info, root, img_size, mean, std, path, cache, ident)
    pool = src.train_pool
    if src.val is not None:  # an official validation split
        train_idx, val_idx = _official_split(pool, src.val, seed, low_data, low_data_split)
        val = view("val", src.val, val_idx, False)
    else:
        train_idx, val_idx = split_pool(pool.labels, seed, low_data, info.val_fraction, low_data_split)
        val = view("train", pool, val_idx, False)
    return Splits(
        train=view("train", pool, train_idx, augment_train),
        val=val,
        test=view("test", src.test, np.arange(len(src.test.labels)), False),
        num_classes=info.num_classes,
    )


@dataclass(frozen=True)
class SplitSpec:
    """What ``build_splits`` takes for one dataset, but ``augment_train`` and ``cache``: a trial's,
    resolved once (``raystudy.train.plan``), then built as often as the trial needs it."""

    name: str
    seed: int
    img_size: int | None
    mean: tuple[float, ...]
    std: tuple[float, ...]
    root: str | None = None
    download: bool = False
    low_data: bool = False
    low_data_split: str = "vtab1k"
    data_path: str = "torchvision"
    data: str = ""
    channels: int = 3

    def build(self, augment_train: bool = True) -> Splits:
        """The splits (``augment_train=False``: training images get the eval transform)."""
        return build_splits(
            self.name,
            seed=self.seed,
            img_size=self.img_size,
            mean=self.mean,
            std=self.std,
            root=self.root,
            download=self.download,
            low_data=self.low_data,
            low_data_split=self.low_data_split,
            data_path=self.data_path,
            augment_train=augment_train,
            data=self.data,
            channels=self.channels,
        )


def _view_maker(
    name: str,
    info: DatasetInfo,
    root: Path,
    img_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    data_path: str,
    cache: str | Path | None,
    ident: str = "",
) -> Callable[[str, Pool, np.ndarray, bool], Dataset]:
    """The function that views ``(role, pool, idx, train)`` of ``name`` as a dataset on its data path.

    Token datasets get plain views; the cache path gets CachedViews over one tensor pool per role
    (``ident``: what identifies your own data, in the cache's key); the torchvision path gets
    Views with the train or eval transform.
    """
    from raystudy.data.batches import CachedView, tensor_cache, tensor_pool

    if info.tokens:  # ready ids: plain views on either data path, nothing to decode or normalise

        def view(role: str, pool: Pool, idx: np.ndarray, train: bool) -> Dataset:
            return View(pool.items, idx, None)
    elif resolve_data_path(data_path, name) == "cache":
        pools: dict[str, TensorPool] = {}

        def view(role: str, pool: Pool, idx: np.ndarray, train: bool) -> Dataset:
            if role not in pools:
                pools[role] = (
                    tensor_cache(name, role, pool, info.cache_size, root, cache, ident=ident)
                    if info.image
                    else tensor_pool(pool)
                )
            return CachedView(pools[role], idx, train=train, size=img_size, mean=mean, std=std, augment=info.image)
    else:
        train_tf, eval_tf = transforms(img_size, mean, std, info.image)

        def view(role: str, pool: Pool, idx: np.ndarray, train: bool) -> Dataset:
            return View(pool.items, idx, train_tf if train else eval_tf)

    return view


def _official_split(
    pool: Pool, val: Pool, seed: int, low_data: bool, low_data_split: str
) -> tuple[np.ndarray, np.ndarray]:
    """Train and val indices into ``pool`` and the official ``val`` pool: all of each, or their low-data draw."""
    rng = np.random.default_rng(seed)
    train_idx, val_idx = np.arange(len(pool.labels)), np.arange(len(val.labels))
    if low_data and low_data_split == "vtab1k":  # 800 from train, 200 from val
        train_idx = np.sort(rng.permutation(len(train_idx))[:VTAB_TRAIN])
        val_idx = np.sort(rng.permutation(len(val_idx))[:VTAB_VAL])
    elif low_data:
        train_idx = subsample_per_class(pool.labels, train_idx, LOW_DATA_PER_CLASS, rng)
    return train_idx, val_idx
