"""A user's own image data: scanned from where ``data`` points, checked, and split as the paper splits.

``data`` is one of:
- a folder with one subfolder per class, or with ``train/`` (and ``val/``, ``test/``) subfolders
  each holding class subfolders (splits used as given);
- a ``.csv`` or ``.parquet`` file with columns ``path`` (relative to the file, or absolute),
  ``label`` and an optional ``split`` (train, val, test);
- a Hugging Face ``datasets`` dataset saved with ``save_to_disk`` (a folder), or ``hf:NAME`` for
  one on the hub (the optional ``datasets`` package: ``pip install -e ".[hf]"``; hub datasets are
  cached under ``<data root>/hf``). Their image and label columns are found from the features (an
  ``Image`` and a ``ClassLabel``), their splits used as given (``validation`` is the val split).

Without a given test split, a fixed test split is drawn: ``TEST_FRACTION`` of each class by a fixed
seed, so it never changes across runs; the run's 80/20 train/val split of the rest is the
registry's (``datasets.split_pool``). ``verify`` decodes every image once and caches its verdict
by the file list with sizes and mtimes. Pure over the file system: no Ray, no MLflow, no torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raystudy import paths
from raystudy.errors import ConfigError

IMAGE_EXTS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
SPLITS = ("train", "val", "test")
TEST_FRACTION = 0.2
TEST_SEED = 0  # the fixed test split's: the same images whatever the run's seed
MIN_POOL = 4  # images per class a training pool needs: the run's 80/20 train/val leaves some on each side
NAME = re.compile(r"[A-Za-z0-9_-]{1,100}")
HF_PREFIX = "hf:"
TABLE_EXTS = (".csv", ".parquet")
VERDICT_VERSION = 1


class DataError(ConfigError):
    """Bad user data: one line naming the location, what is wrong and what is allowed."""


class CorruptImage(RuntimeError):
    """An image that cannot be decoded at training time (it changed after the check); names the file."""


@dataclass(frozen=True)
class Scan:
    """What ``data`` holds, listed but not decoded: the classes in a stable order and, per split
    given (``train`` always; ``val``, ``test`` when the data names them), the items and labels.

    An item is a file path, or ``split/index`` of a Hugging Face dataset (``kind`` says which)."""

    location: str
    kind: str  # folder | table | hf
    classes: tuple[str, ...]
    items: dict[str, tuple[str, ...]]
    labels: dict[str, np.ndarray]
    fingerprint: str  # a hash of the file list with sizes and mtimes (hf: of its arrow files)
    ignored: tuple[str, ...] = ()  # files skipped: not images by their extension


@dataclass(frozen=True)
class Part:
    """Items and labels of one split."""

    items: tuple[str, ...]
    labels: np.ndarray


@dataclass(frozen=True)
class Partition:
    """The splits of a scan: the training pool, the given validation split (or None: the run
    draws it from the pool), and the test split, given or the fixed one."""

    pool: Part
    val: Part | None
    test: Part
    test_given: bool
    root: str = ""  # the folder the items' paths are hashed relative to

    @property
    def test_hash(self) -> str:
        """A hash of the test split's items (relative to the data's folder) and labels: the same
        split, the same hash, wherever the data is copied."""
        return items_hash(self.test, self.root)


def items_hash(part: Part, root: str = "") -> str:
    """SHA-256 (16 hex digits) of ``part``'s items (relative to ``root`` where under it) and labels, in order."""

    def rel(item: str) -> str:
        return os.path.relpath(item, root) if root and item.startswith(root + os.sep) else item

    body = "\n".join(f"{rel(i)}\t{int(y)}" for i, y in zip(part.items, part.labels))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def check_name(name: str) -> str:
    """``name`` as a user dataset's label: a plain name (letters, digits, ``_``, ``-``)."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ConfigError(f"dataset {name!r} for your own data must be a plain name (letters, digits, _ and -)")
    return name


def resolve(data: str, base: str | os.PathLike | None = None) -> str:
    """``data`` with a relative path made absolute against ``base`` (default: the working
    directory); ``hf:NAME`` as it is."""
    if not data or data.startswith(HF_PREFIX):
        return data
    return os.path.abspath(os.path.join(base or os.getcwd(), os.path.expanduser(data)))


def check_location(data: str) -> None:
    """``data`` names something that can be read: an existing folder, a .csv or .parquet file, or
    ``hf:NAME``; DataError otherwise. Cheap: nothing is listed."""
    if data.startswith(HF_PREFIX):
        if not data[len(HF_PREFIX) :].strip():
            raise DataError(f"data {data!r}: give the hub dataset's name after hf:")
        return
    p = Path(data)
    if not p.exists():
        raise DataError(
            f"data {data!r} does not exist; give a folder of class folders, a .csv or .parquet file, "
            "a dataset saved with save_to_disk, or hf:NAME"
        )
    if p.is_file() and p.suffix.lower() not in TABLE_EXTS:
        raise DataError(f"data {data!r} is a {p.suffix or 'plain'} file; a data file must be .csv or .parquet")


# ---------------------------------------------------------------- scanning


def scan(data: str) -> Scan:
    """``data`` listed into classes, items and labels per given split; DataError in one line for
    a missing location, fewer than two classes, or a table naming files or classes that are not there."""
    check_location(data)
    p = Path(data)
    if data.startswith(HF_PREFIX) or (p / "dataset_dict.json").is_file() or (p / "state.json").is_file():
        out = _hf_scan(data)
    elif p.is_file():
        out = _scan_table(p)
    else:
        out = _scan_folder(p)
    if len(out.classes) < 2:
        raise DataError(
            f"data {data!r} has {len(out.classes)} class{'es' if len(out.classes) != 1 else ''} "
            f"({', '.join(out.classes) or 'none'}); a classifier needs at least 2"
        )
    return out


def _images_under(folder: Path) -> tuple[list[Path], list[Path]]:
    """(image files, other files) under ``folder``, at any depth, sorted; hidden files skipped."""
    files = sorted(f for f in folder.rglob("*") if f.is_file() and not any(s.startswith(".") for s in f.parts[-1:]))
    images = [f for f in files if f.suffix.lower() in IMAGE_EXTS]
    return images, [f for f in files if f.suffix.lower() not in IMAGE_EXTS]


def _class_folders(folder: Path) -> list[Path]:
    return sorted(d for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))


def _scan_folder(root: Path) -> Scan:
    """A folder of class folders, or of ``train/``, ``val/``, ``test/`` each of class folders."""
    subs = {d.name for d in _class_folders(root)}
    given = "train" in subs and subs <= set(SPLITS)
    if not given and subs & set(SPLITS) and "train" not in subs:
        have = ", ".join(f"{d}/" for d in sorted(subs & set(SPLITS)))
        raise DataError(
            f"data {str(root)!r} has {have} but no train/: give train/ "
            "(and optionally val/, test/), each with one folder per class"
        )
    tops = {s: root / s for s in SPLITS if s in subs} if given else {"train": root}
    classes = tuple(d.name for d in _class_folders(tops["train"]))
    items, labels, ignored = {}, {}, []
    for split, top in tops.items():
        names = [d.name for d in _class_folders(top)]
        extra = [n for n in names if n not in classes]
        if extra:
            raise DataError(
                f"data {str(root)!r}: {split}/ has class folder(s) {', '.join(extra)} that train/ lacks; "
                f"classes: {', '.join(classes)}"
            )
        found: list[tuple[str, int]] = []
        for c in names:
            images, other = _images_under(top / c)
            found += [(str(f), classes.index(c)) for f in images]
            ignored += [str(f) for f in other]
        items[split] = tuple(f for f, _ in found)
        labels[split] = np.asarray([y for _, y in found], dtype=np.int64)
    files = [f for s in items.values() for f in s]
    return Scan(str(root), "folder", classes, items, labels, fingerprint(files), tuple(ignored))


def _read_table(p: Path):
    """The table at ``p`` as a DataFrame of strings; DataError naming what it lacks."""
    import pandas as pd

    try:
        df = pd.read_csv(p, dtype=str, keep_default_na=False) if p.suffix.lower() == ".csv" else pd.read_parquet(p)
    except Exception as e:  # noqa: BLE001 - pandas and pyarrow raise many kinds for one unreadable file
        raise DataError(f"data {str(p)!r} is not a readable {p.suffix} table ({type(e).__name__})") from None
    missing = [c for c in ("path", "label") if c not in df.columns]
    if missing:
        raise DataError(
            f"data {str(p)!r} lacks the column(s) {', '.join(missing)}; columns: path, label and optionally split"
        )
    df = df.astype(str).apply(lambda col: col.str.strip())
    if "split" not in df.columns:
        df["split"] = "train"
    df.loc[df["split"] == "", "split"] = "train"
    return df


def _scan_table(p: Path) -> Scan:
    """A CSV or Parquet table of ``path``, ``label`` and optional ``split``."""
    df = _read_table(p)
    bad = sorted(set(df["split"]) - set(SPLITS))
    if bad:
        raise DataError(f"data {str(p)!r}: split value(s) {', '.join(bad)} unknown; valid: {', '.join(SPLITS)}")
    if (df["label"] == "").any():
        row = int((df["label"] == "").to_numpy().argmax()) + 2
        raise DataError(f"data {str(p)!r}: row {row} has no label; every row needs one")
    if "train" not in set(df["split"]):
        raise DataError(f"data {str(p)!r}: no training rows (split train or empty); the classes come from them")
    classes = tuple(sorted(set(df.loc[df["split"] == "train", "label"])))
    strays = df[~df["label"].isin(classes)]
    if len(strays):
        others = f", nor do {len(strays) - 1} other row(s)" if len(strays) > 1 else ""
        raise DataError(
            f"data {str(p)!r}: label {strays['label'].iloc[0]!r} ({strays['split'].iloc[0]} row) names no class of "
            f"the training rows{others}; classes: {', '.join(classes)}"
        )
    df["file"] = [str(Path(f) if Path(f).is_absolute() else p.parent / f) for f in df["path"]]
    absent = [w for w, f in zip(df["path"], df["file"]) if not Path(f).is_file()]
    if absent:
        others = f", nor {len(absent) - 1} other(s)" if len(absent) > 1 else ""
        raise DataError(
            f"data {str(p)!r}: path {absent[0]!r} does not exist{others}; "
            "paths are relative to the table's folder, or absolute"
        )
    index = {c: i for i, c in enumerate(classes)}
    items, labels = {}, {}
    for split in SPLITS:
        rows = df[df["split"] == split]
        if len(rows):
            items[split] = tuple(rows["file"])
            labels[split] = np.asarray([index[c] for c in rows["label"]], dtype=np.int64)
    return Scan(str(p), "table", classes, items, labels, fingerprint([str(p), *df["file"]]))


def fingerprint(files: Sequence[str]) -> str:
    """A hash of ``files`` with each one's size and mtime: what changes when the data changes."""
    h = hashlib.sha256()
    for f in files:
        st = os.stat(f)
        h.update(f"{f}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------- splits


def fixed_test(labels: np.ndarray, frac: float = TEST_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """(pool, test) indices of ``labels``: ``frac`` of each class (at least one image) for test,
    drawn by ``TEST_SEED``: the same split on every call, whatever the run's seed."""
    rng = np.random.default_rng(TEST_SEED)
    test = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        n = max(1, int(round(len(members) * frac)))
        test.append(rng.permutation(members)[:n])
    test_idx = np.sort(np.concatenate(test)) if test else np.zeros(0, dtype=np.int64)
    return np.setdiff1d(np.arange(len(labels)), test_idx), test_idx


def partition(s: Scan) -> Partition:
    """The splits of ``s``: those given, the fixed test split where none is; DataError for a
    class with too few images for them (how many it has, how many it needs)."""
    train = Part(s.items["train"], s.labels["train"])
    val = Part(s.items["val"], s.labels["val"]) if "val" in s.items else None
    if "test" in s.items:
        pool, test, given = train, Part(s.items["test"], s.labels["test"]), True
    else:
        _check_counts(s, train.labels, MIN_POOL + 1, "the fixed test split and the run's train/val split")
        keep, held = fixed_test(train.labels)
        pool = Part(tuple(train.items[i] for i in keep), train.labels[keep])
        test, given = Part(tuple(train.items[i] for i in held), train.labels[held]), False
    _check_counts(s, pool.labels, 1 if val is not None else MIN_POOL, "the run's train/val split")
    root = s.location if s.kind == "folder" else str(Path(s.location).parent) if s.kind == "table" else ""
    return Partition(pool, val, test, given, root)


def _check_counts(s: Scan, labels: np.ndarray, need: int, what: str) -> None:
    """Every class of ``s`` with at least ``need`` images in ``labels``; DataError naming the first short one."""
    counts = np.bincount(labels, minlength=len(s.classes))
    short = [i for i, n in enumerate(counts) if n < need]
    if short:
        i = short[0]
        others = f"; {len(short) - 1} other class(es) too" if len(short) > 1 else ""
        raise DataError(
            f"data {s.location!r}: class {s.classes[i]!r} has {counts[i]} image(s) for training, "
            f"{what} needs at least {need}{others}"
        )


def summary(data: str) -> dict[str, str]:
    """What identifies a run's data, for its record: the location, the number of classes and of
    files, the files' fingerprint, the test split's size and the hash of its items (listed, not
    decoded)."""
    s = scan(data)
    p = partition(s)
    return {
        "location": data,
        "classes": str(len(s.classes)),
        "files": str(sum(len(v) for v in s.items.values())),
        "fingerprint": s.fingerprint,
        "test_size": str(len(p.test.labels)),
        "test_hash": p.test_hash,
        "test_split": "given" if p.test_given else "fixed",
    }


def change(seen: dict[str, str], now: dict[str, str]) -> str | None:
    """What changed between the ``summary`` a run recorded (``seen``) and ``now``: files added or
    removed (by count), changed (the same count, other sizes or times), the test split's hash;
    None if nothing did. A record from before files were counted compares its test split alone."""
    parts = []
    if "files" in seen:
        added = int(now["files"]) - int(seen["files"])
        if added:
            parts.append(f"{abs(added)} file(s) {'added' if added > 0 else 'removed'}")
        elif seen.get("fingerprint") != now["fingerprint"]:
            parts.append("files changed (sizes or times)")
    if seen.get("test_hash") != now["test_hash"]:
        parts.append(
            f"the test split's hash {seen.get('test_hash')} is now {now['test_hash']} "
            f"({seen.get('test_size')} images, now {now['test_size']})"
        )
    elif parts:
        parts.append(f"the test split unchanged (hash {now['test_hash']})")
    return ", ".join(parts) or None


# ---------------------------------------------------------------- images


def open_image(s: Scan, item: str, mode: str = "RGB"):
    """The image ``item`` of ``s`` as a PIL image in ``mode`` (RGB, or L: grey); CorruptImage
    naming the file if it cannot be decoded."""
    img = raw_image(s, item)
    if img.mode in ("P", "PA"):
        img = img.convert("RGBA")  # a palette may carry transparency: PIL converts it through RGBA
    if img.mode != "RGB":
        img = img.convert("RGB")
    return img if mode == "RGB" else img.convert(mode)


def raw_image(s: Scan, item: str):
    """The image ``item`` of ``s`` as stored (any mode), decoded; CorruptImage naming it if it cannot be."""
    if s.kind == "hf":
        return _hf_image(s, item)
    return _decode(item)


def _decode(path: str):
    """The PIL image at ``path``, fully decoded; CorruptImage naming it if it is not an image or is truncated."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img.load()
            return img
    except (OSError, UnidentifiedImageError, SyntaxError, ValueError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CorruptImage(f"image {path!r} cannot be decoded ({why})") from None


class Images:
    """The items of one split as a dataset pool: ``[i] -> (RGB PIL image, label)``."""

    def __init__(self, s: Scan, part: Part, mode: str = "RGB"):
        self.scan, self.items, self.labels, self.mode = s, part.items, part.labels, mode

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return open_image(self.scan, self.items[i], self.mode), int(self.labels[i])


# ---------------------------------------------------------------- the full check


def verify(data: str, cache: str | os.PathLike | None = None) -> list[str]:
    """Scan ``data``, split it and decode every image once; the note lines to print (images
    converted to RGB, files skipped). DataError in one line on bad data. The verdict is cached
    under ``cache`` (default: the raystudy cache) by the file list with sizes and mtimes, so a
    rerun on unchanged data lists the files but decodes none."""
    s = scan(data)
    partition(s)  # too few images per class: before any decoding
    folder = (Path(cache) if cache else paths.cache()) / "data_checks"
    verdict = folder / f"{s.fingerprint}-v{VERDICT_VERSION}.json"
    if verdict.is_file():
        try:
            saved = json.loads(verdict.read_text())
        except (OSError, ValueError):
            saved = None
        if isinstance(saved, dict) and "notes" in saved:
            if saved.get("error"):
                raise DataError(saved["error"])
            return list(saved["notes"])
    try:
        notes = _decode_all(s)
        error = ""
    except DataError as e:
        notes, error = [], str(e)
    _save_verdict(verdict, {"notes": notes, "error": error})
    if error:
        raise DataError(error)
    return notes


def _save_verdict(path: Path, verdict: dict) -> None:
    """Write ``verdict`` atomically; a cache that cannot be written only costs the next check its time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(verdict))
        os.replace(tmp, path)
    except OSError:
        pass


def _decode_all(s: Scan) -> list[str]:
    """Decode every image of ``s``; the notes (modes converted, files ignored), or DataError
    naming the first image that cannot be decoded and how many others."""
    modes: Counter[str] = Counter()
    bad: list[str] = []
    for split in s.items:
        for item in s.items[split]:
            try:
                img = raw_image(s, item)
            except CorruptImage:
                bad.append(item)
                continue
            if img.mode != "RGB":
                modes[img.mode] += 1
    if bad:
        others = f", and {len(bad) - 1} other(s)" if len(bad) > 1 else ""
        raise DataError(
            f"data {s.location!r}: {bad[0]!r} is not an image or is truncated{others}; remove or replace it"
        )
    notes = []
    if modes:
        kinds = ", ".join(f"{m} {n}" for m, n in sorted(modes.items()))
        notes.append(f"note: data {s.location!r}: {sum(modes.values())} image(s) not RGB ({kinds}); converted to RGB")
    if s.ignored:
        notes.append(
            f"note: data {s.location!r}: {len(s.ignored)} file(s) ignored, not images by their extension "
            f"(first: {s.ignored[0]!r})"
        )
    return notes


# ---------------------------------------------------------------- Hugging Face datasets


SPLIT_NAMES = {"train": "train", "validation": "val", "val": "val", "test": "test"}
_LOADED: dict[str, tuple[Any, str]] = {}  # location -> (the dataset dict, its image column), loaded once per process


def hub_cache() -> Path:
    """Where hub datasets are cached: ``<data root>/hf``."""
    return paths.data_root() / "hf"


def _hf():
    try:
        import datasets
    except ImportError:
        raise DataError('reading a Hugging Face dataset needs the datasets package: pip install -e ".[hf]"') from None
    return datasets


def _hf_load(data: str):
    """The dataset dict at ``data`` (a ``save_to_disk`` folder or ``hf:NAME``); DataError in one line."""
    hf = _hf()
    # its progress bars (reading, preparing the splits) would come between a command's lines, or
    # make a refusal of one line several
    shown = hf.is_progress_bar_enabled()
    hf.disable_progress_bars()
    try:
        if data.startswith(HF_PREFIX):
            ds = hf.load_dataset(data[len(HF_PREFIX) :], cache_dir=str(hub_cache()))
        else:
            ds = hf.load_from_disk(data)
    except Exception as e:  # noqa: BLE001 - the hub and the disk format raise many kinds
        why = (str(e).splitlines() or [type(e).__name__])[0][:200]
        where = "the hub (no network? prefetch it where there is one)" if data.startswith(HF_PREFIX) else "disk"
        raise DataError(f"data {data!r}: cannot load it from {where}: {why}") from None
    finally:
        if shown:
            hf.enable_progress_bars()
    return ds if isinstance(ds, hf.DatasetDict) else hf.DatasetDict({"train": ds})


def _columns(data: str, features) -> tuple[str, str]:
    """(image column, label column) of ``features``: the first ``Image`` and ``ClassLabel``."""
    hf = _hf()
    image = next((k for k, f in features.items() if isinstance(f, hf.Image)), None)
    label = next((k for k, f in features.items() if isinstance(f, hf.ClassLabel)), None)
    if image is None or label is None:
        raise DataError(
            f"data {data!r}: needs an Image column and a ClassLabel column; its features: {', '.join(features)}"
        )
    return image, label


def _hf_scan(data: str) -> Scan:
    """A Hugging Face dataset as a ``Scan``: items ``split/index``, labels from the ClassLabel column."""
    ds = _hf_load(data)
    unknown = [k for k in ds if k not in SPLIT_NAMES]
    if unknown or "train" not in ds:
        raise DataError(
            f"data {data!r}: splits {', '.join(ds)}; needs train, and optionally validation (or val) and test"
        )
    image, label = _columns(data, ds["train"].features)
    _LOADED[data] = (ds.cast_column(image, _hf().Image(decode=False)), image)  # bytes: PIL decodes, as for files
    items, labels = {}, {}
    for name, split in ds.items():
        role = SPLIT_NAMES[name]
        items[role] = tuple(f"{name}/{i}" for i in range(len(split)))
        labels[role] = np.asarray(split[label], dtype=np.int64)
    return Scan(data, "hf", tuple(ds["train"].features[label].names), items, labels, _fingerprint(data, ds))


def _fingerprint(data: str, ds) -> str:
    """The saved folder's files with sizes and mtimes; a hub dataset's own fingerprints."""
    if data.startswith(HF_PREFIX):
        return hashlib.sha256("".join(ds[k]._fingerprint for k in ds).encode()).hexdigest()[:16]
    return fingerprint(sorted(str(f) for f in Path(data).rglob("*") if f.is_file()))


def _hf_image(s: Scan, item: str):
    """The PIL image of ``item`` (``split/index``) of ``s``; CorruptImage naming it if it cannot be decoded."""
    if s.location not in _LOADED:
        _hf_scan(s.location)
    ds, column = _LOADED[s.location]
    split, _, i = item.rpartition("/")
    try:
        from io import BytesIO

        from PIL import Image

        img = ds[split][int(i)][column]
        raw = Image.open(BytesIO(img["bytes"])) if img.get("bytes") else Image.open(img["path"])
        raw.load()
        return raw
    except (OSError, SyntaxError, ValueError) as e:
        raise CorruptImage(f"image {item!r} of {s.location!r} cannot be decoded ({type(e).__name__}: {e})") from None
