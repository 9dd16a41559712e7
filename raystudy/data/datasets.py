"""Datasets: a registry of the study's 11 benchmarks and the offline demo, with the paper's splits.

Every dataset yields a *training pool* and a *test* set. The validation set is 20% of the pool,
split by the run's seed (Flowers102: its official val split). CIFAR-10-C and DomainNet have no
official test split, so a fixed 80/20 split (the reference code's: independent of the run) makes one.
Train transform: RandomResizedCrop + horizontal flip; eval: Resize + CenterCrop, as the paper.
``build_splits`` gives the splits as views for either data path (``raystudy.data.batches``).

    python -m raystudy data        # the registry and where each dataset's files are expected
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
from raystudy.errors import ConfigError

if TYPE_CHECKING:  # torch is imported where tensors are made: the registry alone (every CLI's
    import torch  # config check) stays free of torch's seconds of import
    from torch.utils.data import Dataset

    from raystudy.data.batches import TensorPool

VAL_FRACTION = 0.2
TEST_FRACTION = 0.2  # for datasets without an official test split
LOW_DATA_PER_CLASS = 10
VTAB_TRAIN, VTAB_VAL = 800, 200  # VTAB-1k: the paper's low-data regime
CIFAR10C_CORRUPTIONS = ("contrast", "gaussian_noise", "motion_blur", "snow", "speckle_noise")
CIFAR10C_SEVERITY = 5
DOMAINNET_DOMAINS = ("clipart", "sketch")
DATA_PATHS = ("auto", "torchvision", "cache")


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


@dataclass(frozen=True)
class Splits:
    """The train, validation and test datasets of a run, and the number of classes."""

    train: Dataset
    val: Dataset
    test: Dataset
    num_classes: int


# ---------------------------------------------------------------- raw containers


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


# ---------------------------------------------------------------- loaders


def _require(path: Path, name: str, where: str) -> Path:
    if not path.exists():
        raise DatasetUnavailable(f"dataset {name!r}: expected files at {path}, not found; {where}")
    return path


def _download_failed(name: str, root: Path, e: OSError) -> DatasetUnavailable:
    """A download that could not reach its server, in one line (urllib's URLError wraps the
    socket error that says why, e.g. ``Connection refused``)."""
    inner = getattr(e, "reason", None)
    why = getattr(inner, "strerror", None) or inner or e.strerror or e
    return DatasetUnavailable(
        f"dataset {name!r}: download failed ({why}); on a machine with network run "
        f"python -m raystudy prefetch --datasets {name} and copy the files under {root}"
    )


def _cifar(cls_name: str, name: str, where: str):
    def load(root: Path, download: bool) -> Source:
        import torchvision.datasets as tvd

        cls = getattr(tvd, cls_name)
        try:
            tr, te = (cls(str(root), train=t, download=download) for t in (True, False))
        except RuntimeError as e:  # torchvision: "Dataset not found or corrupted."
            raise DatasetUnavailable(f"dataset {name!r}: not found under {root} ({e}); {where}") from None
        except OSError as e:  # a download that cannot reach its server (urllib's URLError)
            raise _download_failed(name, root, e) from None
        return Source(
            Pool(ArrayImages(tr.data, tr.targets), np.asarray(tr.targets)),
            Pool(ArrayImages(te.data, te.targets), np.asarray(te.targets)),
        )

    return load


def _split_dataset(cls_name: str, name: str, where: str, splits: dict[str, str], **kw):
    """torchvision datasets with named splits (Flowers102, OxfordIIITPet)."""

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
                raise _download_failed(name, root, e) from None
            pools[role] = Pool(_RGB(ds), np.asarray(ds._labels))
        return Source(pools["train"], pools["test"], pools.get("val"))

    return load


class _RGB:
    """Some Pets images are grey or RGBA; the model wants RGB."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        img, label = self.ds[i]
        return img.convert("RGB"), label


def _fixed_split(n: int, frac: float = TEST_FRACTION) -> tuple[np.ndarray, np.ndarray]:
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


def _cifar10c(corruption: str, name: str, where: str):
    def load(root: Path, download: bool) -> Source:
        d = _require(root / "CIFAR-10-C", name, where)
        imgs = np.load(_require(d / f"{corruption}.npy", name, where), mmap_mode="r")
        labels = np.load(_require(d / "labels.npy", name, where))
        lo = (CIFAR10C_SEVERITY - 1) * 10_000  # rows are severities 1..5, 10k images each
        imgs, labels = imgs[lo : lo + 10_000], labels[lo : lo + 10_000]
        return _pool_test(ArrayImages(imgs, labels), labels, reference_split)

    return load


# Images in DomainNet clipart's cleaned release (groundtruth/clipart.zip), the one the paper's code
# downloads: the reference's src/vitef/data/images/domainnet.py:98-100.
DOMAINNET_CLEANED_CLIPART = 48_129


def check_image_count(name: str, root: str | Path | None, expected: int) -> None:
    """Refuse, in one line, a class-folder dataset ``name`` under ``root`` whose image count is
    not ``expected`` (0: any). A folder not there is left to the trial's own message."""
    if not expected or not name.startswith("domainnet_"):
        return
    folder = Path(root or paths.data_root()) / "domainnet" / name.removeprefix("domainnet_")
    if not folder.is_dir():
        return
    found = sum(1 for p in folder.rglob("*") if p.suffix.lower() in userdata.IMAGE_EXTS)
    if found != expected:
        raise ConfigError(
            f"dataset {name!r}: {found:,} images under {folder}, expected {expected:,} (expect_images): "
            "another release gives another seeded split and test set; "
            + (DN_CLIPART if name == "domainnet_clipart" else "see the download note")
        )


def _domainnet(domain: str, name: str, where: str):
    def load(root: Path, download: bool) -> Source:
        from torchvision.datasets import ImageFolder

        d = _require(root / "domainnet" / domain, name, where)
        ds = ImageFolder(str(d))
        return _pool_test(_RGB(ds), np.asarray(ds.targets), reference_split)

    return load


class _Subset:
    def __init__(self, items, idx):
        self.items, self.idx = items, idx

    def __len__(self) -> int:
        return len(self.idx)

    def __getitem__(self, i: int):
        return self.items[int(self.idx[i])]


def _pool_test(items, labels: np.ndarray, split=_fixed_split) -> Source:
    pool, test = split(len(labels))
    return Source(Pool(_Subset(items, pool), labels[pool]), Pool(_Subset(items, test), labels[test]))


# The demo: scikit-learn's 1,797 handwritten digits (8x8), upscaled to 16x16, and shifts of them in
# the spirit of CIFAR-10-C, one target dataset each, every corruption drawn once from a fixed seed.
DEMO_NOISE = 0.3
DEMO_BLUR_SIGMA = 2.0  # pixels of the 16x16 image; a lighter blur leaves the source model nearly as accurate
DEMO_ROTATION = (30.0, 60.0)  # degrees, either way
DEMO_OCCLUDER = 6  # side of the bright square, pixels
DEMO_SEED = 1234
DEMO_SHIFTS = {  # dataset -> (shift, what it does), as ``python -m raystudy data`` lists them
    "digits_c": ("invert_noise", "contrast inversion + Gaussian noise"),
    "digits_blur": ("blur", "Gaussian blur"),
    "digits_rotate": ("rotate", "rotation by 30-60 degrees"),
    "digits_occlude": ("occlude", "a bright 6x6 square"),
}


def _invert_noise(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    import torch

    noise = torch.randn(x.shape, generator=g)
    return (1.0 - x + DEMO_NOISE * noise).clamp(0.0, 1.0)


def _blur(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    import torch

    r = int(3 * DEMO_BLUR_SIGMA)
    k = torch.exp(-0.5 * (torch.arange(-r, r + 1, dtype=torch.float32) / DEMO_BLUR_SIGMA) ** 2)
    k = k / k.sum()
    # separable: rows then columns; zero padding is the digits' own background
    x = torch.nn.functional.conv2d(x, k.view(1, 1, 1, -1), padding=(0, r))
    return torch.nn.functional.conv2d(x, k.view(1, 1, -1, 1), padding=(r, 0)).clamp(0.0, 1.0)


def _rotate(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    import torch

    lo, hi = DEMO_ROTATION
    deg = (lo + (hi - lo) * torch.rand(len(x), generator=g)) * torch.randint(0, 2, (len(x),), generator=g).mul(2).sub(1)
    a = torch.deg2rad(deg)
    theta = torch.stack(
        [
            torch.stack([a.cos(), -a.sin(), torch.zeros_like(a)], 1),
            torch.stack([a.sin(), a.cos(), torch.zeros_like(a)], 1),
        ],
        1,
    )
    grid = torch.nn.functional.affine_grid(theta, list(x.shape), align_corners=False)
    return torch.nn.functional.grid_sample(x, grid, align_corners=False).clamp(0.0, 1.0)


def _occlude(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    import torch

    s, side = DEMO_OCCLUDER, x.shape[-1]
    top, left = (torch.randint(0, side - s + 1, (len(x),), generator=g) for _ in range(2))
    rows, cols = torch.arange(side).view(1, -1, 1), torch.arange(side).view(1, 1, -1)
    inside = (
        (rows >= top.view(-1, 1, 1))
        & (rows < top.view(-1, 1, 1) + s)
        & (cols >= left.view(-1, 1, 1))
        & (cols < left.view(-1, 1, 1) + s)
    )
    return x.masked_fill(inside.unsqueeze(1), 1.0)


_SHIFT_FNS = {"invert_noise": _invert_noise, "blur": _blur, "rotate": _rotate, "occlude": _occlude}


def demo_digits(shift: str | None = None) -> tuple[torch.Tensor, np.ndarray]:
    """Digits as (N, 1, 16, 16) floats in [0, 1], clean or with ``shift`` (a ``DEMO_SHIFTS`` kind).

    Every shift draws from its own generator seeded with ``DEMO_SEED``: the same images each call.
    """
    import torch

    images, target = digits_arrays()
    x = torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = torch.nn.functional.interpolate(x, size=(16, 16), mode="bilinear", align_corners=False)
    if shift is not None:
        x = _SHIFT_FNS[shift](x, torch.Generator().manual_seed(DEMO_SEED))
    return x, target


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits, (1797, 8, 8) images in 0..16 and their labels, as
    ``sklearn.datasets.load_digits`` gives them, read from the file scikit-learn ships: importing
    scikit-learn costs every trial process seconds of CPU, reading the file milliseconds."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetUnavailable(
            "the demo digits ship with scikit-learn, which is not installed: pip install scikit-learn"
        )
    data = np.loadtxt(Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz", delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)


def _imagenet_val(name: str, where: str):
    """ImageNet val as a test-only pool: the pretraining distribution the plasticity probes draw x from."""

    def load(root: Path, download: bool) -> Source:
        from torchvision.datasets import ImageFolder

        ds = ImageFolder(str(_require(root / "imagenet" / "val", name, where)))
        empty = Pool([], np.zeros(0, dtype=np.int64))
        return Source(empty, Pool(_RGB(ds), np.asarray(ds.targets)))

    return load


def _demo(shift: str | None):
    def load(root: Path, download: bool) -> Source:
        x, y = demo_digits(shift)
        return _pool_test(TensorImages(x, y), y)

    return load


# Token data for GPT-2, generated offline from a fixed seed: sequences of TOKEN_LEN ids below
# TOKEN_VOCAB (so they fit every GPT-2 size). tokens_rule: 4 classes; class c has TOKEN_PLANTED
# of its positions replaced by ids = c (mod 4), so its residue class is the most frequent one,
# a rule a mean-pooled model can learn. tokens_random: uniform ids, the probes' stand-in for
# pretraining text (test split only).
TOKEN_VOCAB, TOKEN_LEN, TOKEN_PLANTED, TOKEN_CLASSES = 256, 32, 12, 4


def rule_tokens(n: int = 2000, seed: int = 4321) -> tuple[torch.Tensor, np.ndarray]:
    """(ids (n, TOKEN_LEN) int64, labels (n,)) of tokens_rule."""
    import torch

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, TOKEN_CLASSES, n)
    ids = rng.integers(0, TOKEN_VOCAB, (n, TOKEN_LEN))
    for i, c in enumerate(labels):
        pos = rng.choice(TOKEN_LEN, TOKEN_PLANTED, replace=False)
        ids[i, pos] = TOKEN_CLASSES * rng.integers(0, TOKEN_VOCAB // TOKEN_CLASSES, TOKEN_PLANTED) + c
    return torch.from_numpy(ids), labels.astype(np.int64)


def _tokens_rule(root: Path, download: bool) -> Source:
    from raystudy.models.gpt2 import TokenRows

    ids, labels = rule_tokens()
    return _pool_test(TokenRows(ids, labels), labels)


def _tokens_random(root: Path, download: bool) -> Source:
    import torch

    from raystudy.models.gpt2 import TokenRows

    ids = torch.from_numpy(np.random.default_rng(8765).integers(0, TOKEN_VOCAB, (1024, TOKEN_LEN)))
    labels = np.zeros(len(ids), dtype=np.int64)
    return Source(Pool([], np.zeros(0, dtype=np.int64)), Pool(TokenRows(ids, labels), labels))


_TV = (
    "prefetch it (python -m raystudy prefetch --datasets NAME), pass download=true (--download) "
    "to fetch it with torchvision, or place the files there"
)
_C10C = (
    "download CIFAR-10-C from https://zenodo.org/records/2535967 and unpack it so that "
    "<data_root>/CIFAR-10-C/<corruption>.npy and labels.npy exist"
)
_IN = (
    "place the ImageNet-1k validation images, one folder per class, so that "
    "<data_root>/imagenet/val/<wnid>/*.JPEG exist (https://image-net.org, licence required)"
)
_DN_CLIPART_URL = "http://csr.bu.edu/ftp/visda/2019/multi-source/groundtruth/clipart.zip"  # the cleaned release
DN_CLIPART = f"the paper's is the cleaned release, {_DN_CLIPART_URL}"
_DN = (
    "download DomainNet from https://ai.bu.edu/M3SDA/ (clipart: the cleaned release, "
    f"{_DN_CLIPART_URL}, as the paper; sketch: "
    "http://csr.bu.edu/ftp/visda/2019/multi-source/sketch.zip) and unpack each domain so that "
    "<data_root>/domainnet/<domain>/<class>/*.jpg exist"
)

DATASETS: dict[str, DatasetInfo] = {}


def _register(info: DatasetInfo) -> None:
    DATASETS[info.name] = info


# CIFAR's tensor cache keeps the native 32x32 pixels; the others are squashed to 256x256 squares
# (their original height and width are kept, so crops still cover the regions torchvision's do).
_CIFAR_URL = "https://www.cs.toronto.edu/~kriz/{}-python.tar.gz"
_register(
    DatasetInfo(
        "cifar10", 10, _cifar("CIFAR10", "cifar10", _TV), _TV, cache_size=32, download=_CIFAR_URL.format("cifar-10")
    )
)
_register(
    DatasetInfo(
        "cifar100",
        100,
        _cifar("CIFAR100", "cifar100", _TV),
        _TV,
        cache_size=32,
        download=_CIFAR_URL.format("cifar-100"),
    )
)
for _c in CIFAR10C_CORRUPTIONS:
    _register(DatasetInfo(f"cifar10c_{_c}", 10, _cifar10c(_c, f"cifar10c_{_c}", _C10C), _C10C, cache_size=32))
for _d in DOMAINNET_DOMAINS:
    _register(DatasetInfo(f"domainnet_{_d}", 345, _domainnet(_d, f"domainnet_{_d}", _DN), _DN))
_register(
    DatasetInfo(
        "flowers102",
        102,
        _split_dataset("Flowers102", "flowers102", _TV, {"train": "train", "val": "val", "test": "test"}),
        _TV,
        download="https://www.robots.ox.ac.uk/~vgg/data/flowers/102/",
    )
)
_register(
    DatasetInfo(
        "pets",
        37,
        _split_dataset("OxfordIIITPet", "pets", _TV, {"train": "trainval", "test": "test"}, target_types="category"),
        _TV,
        download="https://www.robots.ox.ac.uk/~vgg/data/pets/data/images.tar.gz",
    )
)
_register(DatasetInfo("imagenet_val", 1000, _imagenet_val("imagenet_val", _IN), _IN))
# The demo splits 60/20/20: val is a quarter of the 80% pool.
_register(DatasetInfo("digits", 10, _demo(None), "ships with scikit-learn", image=False, val_fraction=0.25))
for _name, (_shift, _what) in DEMO_SHIFTS.items():
    _register(
        DatasetInfo(_name, 10, _demo(_shift), f"ships with scikit-learn; {_what}", image=False, val_fraction=0.25)
    )
_register(
    DatasetInfo(
        "tokens_rule", TOKEN_CLASSES, _tokens_rule, "generated (seeded)", image=False, tokens=True, val_fraction=0.25
    )
)
_register(DatasetInfo("tokens_random", 1, _tokens_random, "generated (seeded)", image=False, tokens=True))

# The study's 11 benchmarks, in its order.
STUDY_DATASETS = (
    "cifar10",
    "cifar100",
    *(f"cifar10c_{c}" for c in CIFAR10C_CORRUPTIONS),
    *(f"domainnet_{d}" for d in DOMAINNET_DOMAINS),
    "flowers102",
    "pets",
)


def check_dataset(name: str) -> DatasetInfo:
    """The registry entry of dataset ``name``, or ConfigError naming the valid ones."""
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; valid: {', '.join(DATASETS)}, or your own images with data=PATH")
    return DATASETS[name]


USER_CACHE_SIZE = 256  # your own images in the tensor cache: squares as the benchmarks' that are not CIFAR


def dataset_info(name: str, data: str = "") -> DatasetInfo:
    """The entry of ``name``: the registry's, or with ``data`` one for your own images there
    (its classes counted when it is scanned). Cheap: ``data`` is checked to exist, not listed."""
    if not data:
        return check_dataset(name)
    if name in DATASETS:
        raise ConfigError(f"dataset {name!r} names a registry dataset; give your own data (data={data}) another name")
    userdata.check_name(name)
    userdata.check_location(data)
    return DatasetInfo(name, 0, _user_load(data), f"your own images at {data}", cache_size=USER_CACHE_SIZE)


def _user_load(data: str):
    def load(root: Path, download: bool) -> Source:
        return user_source(data)[0]

    return load


def user_source(data: str, mode: str = "RGB") -> tuple[Source, userdata.Scan]:
    """Your own images at ``data`` as a Source (images in ``mode``) and the scan it came from: the
    splits given, or the fixed test split and the rest as the training pool."""
    s = userdata.scan(data)
    p = userdata.partition(s)

    def pool(part: userdata.Part | None) -> Pool | None:
        return None if part is None else Pool(userdata.Images(s, part, mode), part.labels)

    return Source(pool(p.pool), pool(p.test), pool(p.val)), s


# ---------------------------------------------------------------- splits and transforms


def transforms(img_size: int, mean: Sequence[float], std: Sequence[float], image: bool = True):
    """The paper's (train, eval) transforms; for ready tensors (the demo) only normalisation."""
    from torchvision import transforms as T

    norm = T.Normalize(mean, std)
    if not image:
        return norm, norm
    train = T.Compose([T.RandomResizedCrop(img_size), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    evaluate = T.Compose([T.Resize(img_size), T.CenterCrop(img_size), T.ToTensor(), norm])
    return train, evaluate


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
