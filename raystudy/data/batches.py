"""How images become batches on the training device: the tensor cache and the two data paths.

Two data paths serve the same splits (config key ``data_path``):
- ``torchvision``: per-image PIL transforms in a DataLoader, the reference definition;
- ``cache``: each pool decoded once into a uint8 tensor file on disk (fixed size per dataset,
  memory-mapped and shared by every run), batches cut from it and transformed on the training
  device in one batched resample (``raystudy.data.augment``). The demo's ready tensors take this
  path without a disk cache: they simply live on the device.

Which images belong to which split is ``raystudy.data.splits``'s business; this module only
knows pools (``.items``, ``.labels``) and views of them.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from raystudy import paths
from raystudy.data import augment

CACHE_VERSION = 3  # bump when the decoding recipe or a split changes: old caches are not reused
CACHE_BUILDER = f"raystudy-tensor-cache-{CACHE_VERSION}"  # 2: caches carry a manifest


# ---------------------------------------------------------------- the torchvision path


def train_batches(
    ds: Dataset, batch_size: int, seed: int, num_workers: int = 0, pin_memory: bool = False, state: dict | None = None
) -> LoaderBatches:
    """An endless stream of shuffled training batches, reproducible from ``seed``; resumable."""
    return LoaderBatches(ds, batch_size, seed, num_workers, pin_memory, state)


class _EpochOrder(torch.utils.data.Sampler):
    """The batches of the current epoch's permutation from batch ``k`` on (read at each ``iter``)."""

    def __init__(self, owner: LoaderBatches):
        self.owner = owner

    def __iter__(self):
        o = self.owner
        for k in range(o.k, o.per_epoch):
            yield o.perm[k * o.batch_size : (k + 1) * o.batch_size].tolist()

    def __len__(self) -> int:
        return self.owner.per_epoch


class _Resumable:
    """An endless batch stream that can say where it is (``state_dict``) and start again there.

    The order comes from ``g_idx``: each epoch's permutation is drawn from its state at the
    epoch's start, which the state keeps with the number of batches already taken.
    """

    def _setup(self, n: int, batch_size: int, g_idx: torch.Generator, state: dict | None):
        if n == 0:
            raise ValueError("no training images")
        self.n, self.batch_size, self.g_idx = n, batch_size, g_idx
        self.per_epoch = max(1, n // batch_size)  # drop the last partial batch
        self.perm, self.k, self.epoch_state = None, 0, None
        if state is not None:
            g_idx.set_state(state["order"])
            self._new_epoch()
            self.k = state["k"]

    def _new_epoch(self) -> None:
        self.epoch_state = self.g_idx.get_state()
        self.perm = torch.randperm(self.n, generator=self.g_idx, device=self.g_idx.device)
        self.k = 0

    def __iter__(self):
        return self

    def state_dict(self) -> dict:
        """The position in the batch order (epoch's RNG state and batch index), to resume from."""
        if self.perm is None:
            return {"order": self.g_idx.get_state(), "k": 0}
        return {"order": self.epoch_state, "k": self.k}


class LoaderBatches(_Resumable):
    """The torchvision path's stream: a DataLoader over a resumable order.

    Resuming continues the order exactly. Per-image augmentation draws from the global RNG
    (no workers: the loop's, which the checkpoint keeps) or from the workers' own seeds (then
    a resumed run's augmentation differs from an uninterrupted run's).
    """

    def __init__(
        self,
        ds: Dataset,
        batch_size: int,
        seed: int,
        num_workers: int = 0,
        pin_memory: bool = False,
        state: dict | None = None,
    ):
        self._setup(len(ds), batch_size, torch.Generator().manual_seed(seed), state)
        self.loader = DataLoader(
            ds,
            batch_sampler=_EpochOrder(self),
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=num_workers > 0,
            generator=torch.Generator().manual_seed(seed + 2),
        )
        self._it = None

    def __next__(self):
        if self.perm is None or self.k >= self.per_epoch:
            self._new_epoch()
            self._it = None
        if self._it is None:
            self._it = iter(self.loader)
        batch = next(self._it)
        self.k += 1
        return batch


def eval_loader(ds: Dataset, batch_size: int, num_workers: int = 0, pin_memory: bool = False) -> DataLoader:
    """A DataLoader over ``ds`` in order (no shuffling), for evaluation."""
    return DataLoader(ds, batch_size=batch_size, shuffle=False, num_workers=num_workers, pin_memory=pin_memory)


# ---------------------------------------------------------------- the cache path


@dataclass(frozen=True)
class TensorPool:
    """A pool as tensors: images (N, C, S, S), their original (height, width), labels.

    Images are uint8 in [0, 255] (a tensor cache, squashed to S×S) or floats in [0, 1] (the
    demo's, already at the model's size); ``value_range`` says which. ``path``: the cache
    directory it was memory-mapped from, if any.
    """

    images: torch.Tensor
    sizes: torch.Tensor
    labels: torch.Tensor
    value_range: float = 255.0
    path: Path | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def to(self, device: torch.device | str) -> TensorPool:
        """The same pool with its tensors on ``device``."""
        return TensorPool(
            self.images.to(device), self.sizes.to(device), self.labels.to(device), self.value_range, self.path
        )

    def __reduce__(self):
        # DataLoader workers reopen the memory map instead of copying the pool through pickle.
        if self.path is not None and self.images.device.type == "cpu":
            return open_pool, (self.path,)
        return TensorPool, (self.images, self.sizes, self.labels, self.value_range, self.path)


def tensor_pool(pool) -> TensorPool:
    """A pool of ready float images (the demo's) held as one tensor, without a disk cache."""
    n = len(pool.labels)
    images = torch.stack([pool.items[i][0] for i in range(n)])
    sizes = torch.tensor([images.shape[-2:]], dtype=torch.int64).expand(n, 2).contiguous()
    return TensorPool(images, sizes, torch.as_tensor(pool.labels, dtype=torch.int64), 1.0)


def tensor_cache(
    name: str,
    role: str,
    pool,
    size: int,
    root: str | os.PathLike,
    cache: str | os.PathLike | None = None,
    log: Callable[[str], None] | None = print,
    ident: str = "",
) -> TensorPool:
    """``pool`` decoded once into a uint8 (N, 3, size, size) tensor file, memory-mapped.

    Every image is squashed to size×size (bilinear, PIL) unless it is that size already, and its
    original (height, width) is kept. The directory name carries a hash of the recipe (cache
    version, dataset, role, size, count, data root; ``ident``, what identifies your own data: its
    file list with sizes and mtimes), so a changed recipe never reads a stale cache; a file lock
    makes concurrent runs decode it once; the directory appears atomically.
    """
    if len(pool.labels) == 0:  # imagenet_val's training pool: nothing to decode
        return TensorPool(
            torch.zeros(0, 3, size, size, dtype=torch.uint8),
            torch.zeros(0, 2, dtype=torch.int64),
            torch.zeros(0, dtype=torch.int64),
        )
    recipe = {
        "version": CACHE_VERSION,
        "dataset": name,
        "role": role,
        "size": size,
        "n": len(pool.labels),
        "root": str(Path(root).resolve()),
    }
    if ident:  # only where given: the benchmarks' caches keep their keys
        recipe["data"] = ident
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:10]
    base = paths.tensor_cache(cache)
    base.mkdir(parents=True, exist_ok=True)
    path = base / f"{name}-{role}-{size}px-{key}"
    manifest = path / "manifest.json"
    if not path.exists() or paths.manifest_problem(manifest, CACHE_BUILDER) is not None:
        with open(base / f".{path.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            problem = paths.manifest_problem(manifest, CACHE_BUILDER) if path.exists() else None
            if problem is not None:  # truncated, edited, half-copied: decode it again
                if log:
                    log(f"tensor cache {path} is corrupt ({problem}); rebuilding it")
                shutil.rmtree(path)
            if not path.exists():
                if log:
                    log(
                        f"decoding {name} ({role}, {len(pool.labels)} images) once into a "
                        f"{size}x{size} tensor cache at {path}"
                    )
                tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
                _write_cache(tmp, pool, size, recipe)
                os.replace(tmp, path)  # atomic: a reader never sees half a cache
    return open_pool(path)


def open_pool(path: str | os.PathLike) -> TensorPool:
    """A tensor cache directory, memory-mapped: runs on one machine share its pages."""
    path = Path(path)
    # Copy-on-write map: a writable array without a copy (nothing ever writes to it).
    images = torch.from_numpy(np.load(path / "images.npy", mmap_mode="c"))
    sizes = torch.from_numpy(np.load(path / "sizes.npy"))
    labels = torch.from_numpy(np.load(path / "labels.npy"))
    return TensorPool(images, sizes, labels, 255.0, path)


def decode(img, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A PIL image as uint8 (3, size, size), squashed if needed, and its original (height, width)."""
    from PIL import Image

    if img.mode != "RGB":
        img = img.convert("RGB")
    w, h = img.size
    if (w, h) != (size, size):
        img = img.resize((size, size), Image.BILINEAR)
    x = torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1).contiguous()
    return x, torch.tensor([h, w], dtype=torch.int64)


class _Decoded(Dataset):
    def __init__(self, items: Sequence, size: int):
        self.items, self.size = items, size

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return decode(self.items[i][0], self.size)


def _write_cache(tmp: Path, pool, size: int, recipe: dict) -> None:
    n = len(pool.labels)
    workers = min(len(os.sched_getaffinity(0)), 16) if n >= 4096 else 0
    images = np.lib.format.open_memmap(tmp / "images.npy", mode="w+", dtype=np.uint8, shape=(n, 3, size, size))
    sizes = np.zeros((n, 2), dtype=np.int64)
    k = 0
    for x, hw in DataLoader(_Decoded(pool.items, size), batch_size=256, num_workers=workers):
        images[k : k + len(x)] = x.numpy()
        sizes[k : k + len(x)] = hw.numpy()
        k += len(x)
    images.flush()
    del images
    np.save(tmp / "sizes.npy", sizes)
    np.save(tmp / "labels.npy", np.asarray(pool.labels, dtype=np.int64))
    (tmp / "meta.json").write_text(json.dumps(recipe, indent=1))
    paths.write_manifest(
        tmp / "manifest.json", [tmp / f for f in ("images.npy", "sizes.npy", "labels.npy", "meta.json")], CACHE_BUILDER
    )


class CachedView(Dataset):
    """A split of a TensorPool: the cache path's View.

    ``batch`` transforms many images at once on any device (RandomResizedCrop + flip for a
    training view, Resize + CenterCrop for an eval view, then normalisation; the demo's ready
    tensors are only normalised). ``__getitem__`` does the same for one image on the pool's
    device, for code that wants a plain Dataset (probes, DataLoaders).
    """

    def __init__(
        self,
        pool: TensorPool,
        indices,
        *,
        train: bool,
        size: int,
        mean: Sequence[float],
        std: Sequence[float],
        augment: bool = True,
    ):
        self.pool, self.train, self.size, self.augment = pool, train, size, augment
        self.mean, self.std = tuple(mean), tuple(std)
        self.indices = torch.as_tensor(np.asarray(indices, dtype=np.int64)).to(pool.labels.device)
        if not augment and tuple(pool.images.shape[-2:]) != (size, size):
            raise ValueError(f"ready tensors of size {tuple(pool.images.shape[-2:])} need a transform to {size}x{size}")

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        x, y = self.batch(self.indices[i : i + 1])
        return x[0], int(y[0])

    def like(self, pool: TensorPool | None = None, indices=None) -> CachedView:
        """The same view over another pool (moved) or a subset of its indices."""
        idx = self.indices if indices is None else indices
        return CachedView(
            self.pool if pool is None else pool,
            idx.cpu(),
            train=self.train,
            size=self.size,
            mean=self.mean,
            std=self.std,
            augment=self.augment,
        )

    def batch(
        self, idx: torch.Tensor, generator: torch.Generator | None = None, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pool items ``idx`` transformed, on ``device`` (default: the pool's); (x, y).

        A pool held on the host feeding a GPU is gathered here and copied without blocking.
        """
        p = self.pool
        x, sizes, y = p.images[idx], p.sizes[idx], p.labels[idx]
        if device is not None and x.device.type != device.type:
            pin = device.type == "cuda"
            x, sizes, y = ((t.pin_memory() if pin else t).to(device, non_blocking=pin) for t in (x, sizes, y))
        if not self.augment:
            return augment.normalise(x, self.mean, self.std, p.value_range), y
        if self.train:
            return augment.train_batch(x, sizes, self.size, self.mean, self.std, generator, p.value_range), y
        return augment.eval_batch(x, sizes, self.size, self.mean, self.std, p.value_range), y


def place(splits, device: torch.device, budget: float = 0.25):
    """``splits`` with their tensor pools on ``device``, each moved once (train and val share one).

    On a GPU a pool larger than ``budget`` of the free memory stays on the host; its batches are
    gathered there and copied as they are cut. Views with per-image transforms are unchanged.
    """
    moved: dict[int, TensorPool] = {}

    def put(ds):
        if not isinstance(ds, CachedView):
            return ds
        key = id(ds.pool)
        if key not in moved:
            fits = True
            if device.type == "cuda":
                nbytes = ds.pool.images.numel() * ds.pool.images.element_size()
                fits = nbytes < budget * torch.cuda.mem_get_info(device)[0]
            moved[key] = ds.pool.to(device) if fits else ds.pool
        return ds.like(pool=moved[key])

    return dataclasses.replace(splits, train=put(splits.train), val=put(splits.val), test=put(splits.test))


def shard(ds: Dataset, rank: int, size: int) -> Dataset:
    """Every ``size``-th item from ``rank``: one DDP rank's part of an eval set."""
    if size == 1:
        return ds
    if isinstance(ds, CachedView):
        return ds.like(indices=ds.indices[rank::size])
    return torch.utils.data.Subset(ds, range(rank, len(ds), size))


def device_batches(
    view: CachedView, batch_size: int, seed: int, device: torch.device, state: dict | None = None
) -> DeviceBatches:
    """An endless stream of shuffled, augmented training batches on ``device``, from ``seed``."""
    return DeviceBatches(view, batch_size, seed, device, state)


class DeviceBatches(_Resumable):
    """The cache path's stream. Shuffling and augmentation draw from their own generators on
    the devices that hold the pool and run the model: nothing here waits for the device."""

    def __init__(self, view: CachedView, batch_size: int, seed: int, device: torch.device, state: dict | None = None):
        self.view, self.device = view, device
        self.g_aug = torch.Generator(device=device).manual_seed(seed + 1)
        self._setup(len(view), batch_size, torch.Generator(device=view.indices.device).manual_seed(seed), state)
        if state is not None:
            self.g_aug.set_state(state["aug"])

    def __next__(self):
        if self.perm is None or self.k >= self.per_epoch:
            self._new_epoch()
        idx = self.view.indices[self.perm[self.k * self.batch_size : (self.k + 1) * self.batch_size]]
        self.k += 1
        return self.view.batch(idx, self.g_aug, self.device)

    def state_dict(self) -> dict:
        """The position in the batch order and the augmentation RNG's state, to resume from."""
        return {**super().state_dict(), "aug": self.g_aug.get_state()}


class DeviceEval:
    """An eval split's batches on ``device``, in order; iterable any number of times."""

    def __init__(self, view: CachedView, batch_size: int, device: torch.device):
        self.view, self.batch_size, self.device = view, batch_size, device

    def __len__(self) -> int:
        return -(-len(self.view) // self.batch_size)

    def __iter__(self):
        idx = self.view.indices
        for k in range(0, len(idx), self.batch_size):
            yield self.view.batch(idx[k : k + self.batch_size], None, self.device)


def train_stream(
    ds: Dataset, batch_size: int, seed: int, device: torch.device, num_workers: int = 0, state: dict | None = None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless training batches on ``device``, by whichever path built ``ds``.

    ``stream.state_dict()`` says where it is; ``state=`` that continues from there.
    """
    if isinstance(ds, CachedView):
        return device_batches(ds, batch_size, seed, device, state)
    return _OnDevice(train_batches(ds, batch_size, seed, num_workers, device.type == "cuda", state), device)


class _OnDevice:
    def __init__(self, stream: LoaderBatches, device: torch.device):
        self.stream, self.device = stream, device

    def __iter__(self):
        return self

    def __next__(self):
        pin = self.device.type == "cuda"
        x, y = next(self.stream)
        return x.to(self.device, non_blocking=pin), y.to(self.device, non_blocking=pin)

    def state_dict(self) -> dict:
        """The wrapped stream's state, to resume from."""
        return self.stream.state_dict()


def eval_batches(
    ds: Dataset, batch_size: int, device: torch.device, num_workers: int = 0
) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """An eval split's batches (on ``device`` for the cache path; the loop moves the others)."""
    if isinstance(ds, CachedView):
        return DeviceEval(ds, batch_size, device)
    return eval_loader(ds, batch_size, num_workers, pin_memory=device.type == "cuda")
