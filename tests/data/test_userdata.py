"""Your own data (raystudy.data.userdata): each kind scanned on generated images, the splits' sizes, the
fixed test split and its hash stable across calls, modes converted, the verdict cached, a corrupt
file at training time named, and the tensor cache keyed by the data."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from raystudy.data import userdata
from raystudy.data.splits import build_splits
from raystudy.train.config import KEYS_ADDED, FinetuneConfig, load_config, trial_key, validate
from tests.helpers import class_folders


@pytest.fixture
def photos(tmp_path) -> Path:
    """A class-folder tree: three classes of eight RGB images, plus a grey PNG and a CMYK JPEG."""
    root = tmp_path / "photos"
    class_folders(root, size=20)
    Image.new("L", (20, 20), 30).save(root / "cat" / "grey.png")
    Image.new("CMYK", (20, 20), (0, 50, 100, 0)).save(root / "dog" / "cmyk.jpg")
    (root / "dog" / "notes.txt").write_text("not an image")
    return root


def test_a_class_folder_tree_is_scanned_in_a_stable_order(photos):
    s = userdata.scan(str(photos))
    assert s.kind == "folder" and s.classes == ("cat", "dog", "eel")
    assert list(s.items) == ["train"] and len(s.items["train"]) == 26
    assert np.bincount(s.labels["train"]).tolist() == [9, 9, 8]
    assert s.ignored == (str(photos / "dog" / "notes.txt"),)
    again = userdata.scan(str(photos))  # the same listing, the same order
    assert again.items == s.items and again.fingerprint == s.fingerprint


def test_the_fixed_test_split_is_a_fifth_of_each_class_and_never_changes(photos, tmp_path):
    p = userdata.partition(userdata.scan(str(photos)))
    assert not p.test_given and p.val is None
    assert np.bincount(p.test.labels).tolist() == [2, 2, 2]  # round(0.2 * 9), round(0.2 * 8)
    assert len(p.pool.labels) == 20 and not set(p.pool.items) & set(p.test.items)
    again = userdata.partition(userdata.scan(str(photos)))
    assert again.test.items == p.test.items and again.test_hash == p.test_hash
    # the hash names the files relative to the data's folder: a copy elsewhere hashes the same
    copy = tmp_path / "elsewhere" / "photos"
    shutil.copytree(photos, copy)
    assert userdata.partition(userdata.scan(str(copy))).test_hash == p.test_hash
    assert userdata.summary(str(photos))["test_hash"] == p.test_hash
    assert userdata.summary(str(photos))["test_size"] == "6"


def test_splits_per_run_seed_the_test_split_fixed(photos):
    kw = dict(img_size=16, mean=(0.5,) * 3, std=(0.5,) * 3, data=str(photos))
    a = build_splits("photos", seed=0, **kw)
    b = build_splits("photos", seed=1, **kw)
    assert a.num_classes == 3
    assert (len(a.train), len(a.val), len(a.test)) == (16, 4, 6)  # the pool's 80/20, per seed
    assert list(a.val.indices) != list(b.val.indices)
    assert list(a.test.indices) == list(b.test.indices)
    x, y = a.train[0]
    assert x.shape == (3, 16, 16) and 0 <= y < 3
    grey = build_splits("photos", seed=0, img_size=16, mean=(0.5,), std=(0.5,), data=str(photos), channels=1)
    assert grey.test[0][0].shape == (1, 16, 16)


def test_given_splits_are_used_as_given(tmp_path):
    for split, n in (("train", 6), ("val", 2), ("test", 3)):
        class_folders(tmp_path / "d" / split, classes=("a", "b"), n=n, size=20)
    s = userdata.scan(str(tmp_path / "d"))
    assert s.classes == ("a", "b") and {k: len(v) for k, v in s.items.items()} == {"train": 12, "val": 4, "test": 6}
    splits = build_splits("d", seed=0, img_size=8, mean=(0.5,) * 3, std=(0.5,) * 3, data=str(tmp_path / "d"))
    assert (len(splits.train), len(splits.val), len(splits.test)) == (12, 4, 6)
    assert userdata.partition(s).test_given


def test_a_csv_and_a_parquet_table(tmp_path):
    files = sorted(class_folders(tmp_path / "img", classes=("x", "y"), n=6, size=20).rglob("*.png"))
    rows = [(str(f.relative_to(tmp_path)), f.parent.name, "test" if f.stem == "0" else "") for f in files]
    (tmp_path / "t.csv").write_text("path,label,split\n" + "".join(f"{p},{lab},{sp}\n" for p, lab, sp in rows))
    s = userdata.scan(str(tmp_path / "t.csv"))
    assert s.kind == "table" and s.classes == ("x", "y")
    assert len(s.items["train"]) == 10 and len(s.items["test"]) == 2
    assert all(Path(i).is_file() for i in s.items["train"])
    import pandas as pd

    pd.DataFrame({"path": [str(f) for f in files], "label": [f.parent.name for f in files]}).to_parquet(
        tmp_path / "t.parquet"
    )
    p = userdata.partition(userdata.scan(str(tmp_path / "t.parquet")))
    assert len(p.pool.labels) + len(p.test.labels) == 12 and not p.test_given


def test_modes_are_converted_and_said_once(photos, tmp_path):
    Image.new("RGBA", (20, 20), (1, 2, 3, 4)).save(photos / "eel" / "alpha.png")
    Image.new("P", (20, 20), 3).save(photos / "eel" / "palette.png")
    s = userdata.scan(str(photos))
    for item in s.items["train"]:
        assert userdata.open_image(s, item).mode == "RGB"
        assert userdata.open_image(s, item, "L").mode == "L"
    notes = userdata.verify(str(photos), tmp_path / "cache")
    assert len(notes) == 2, notes
    assert "4 image(s) not RGB (CMYK 1, L 1, P 1, RGBA 1); converted to RGB" in notes[0]
    assert "1 file(s) ignored" in notes[1]


def test_the_verdict_is_cached_by_the_file_list(photos, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    notes = userdata.verify(str(photos), cache)
    decoded = []
    monkeypatch.setattr(userdata, "_decode_all", lambda s: decoded.append(s) or [])
    assert userdata.verify(str(photos), cache) == notes and decoded == []  # the verdict, no decoding
    (photos / "cat" / "0.png").write_bytes(b"changed: no longer an image")
    monkeypatch.undo()
    with pytest.raises(userdata.DataError, match="0.png' is not an image or is truncated"):
        userdata.verify(str(photos), cache)
    with pytest.raises(userdata.DataError, match="0.png' is not an image"):  # the bad verdict is kept too
        userdata.verify(str(photos), cache)


def test_a_file_that_breaks_after_the_check_fails_with_its_name(photos, tmp_path):
    userdata.verify(str(photos), tmp_path / "cache")
    splits = build_splits("photos", seed=0, img_size=16, mean=(0.5,) * 3, std=(0.5,) * 3, data=str(photos))
    first = splits.train.items.items[int(splits.train.indices[0])]
    Path(first).write_bytes(Path(first).read_bytes()[:40])  # truncated
    with pytest.raises(userdata.CorruptImage, match=os.path.basename(first)):
        splits.train[0]


def test_the_tensor_cache_works_on_own_images_and_keys_on_the_file_list(photos, tmp_path):
    kw = dict(img_size=16, mean=(0.5,) * 3, std=(0.5,) * 3, data=str(photos), data_path="cache", cache=tmp_path / "c")
    a = build_splits("photos", seed=0, **kw)
    x, y = a.train[0]
    assert x.shape == (3, 16, 16)
    built = sorted(p.name for p in (tmp_path / "c" / "tensors").iterdir() if not p.name.startswith("."))
    assert len(built) == 2  # train and test
    os.utime(photos / "eel" / "0.png", ns=(1, 1))  # the data changed: its cache is made anew
    build_splits("photos", seed=0, **kw)
    again = sorted(p.name for p in (tmp_path / "c" / "tensors").iterdir() if not p.name.startswith("."))
    assert len(again) == 4


def test_the_data_key_leaves_every_recorded_trial_key_as_it_was(photos):
    assert KEYS_ADDED["data"] == "" and FinetuneConfig().data == ""
    plain = FinetuneConfig().to_dict()
    assert trial_key(plain) == trial_key({k: v for k, v in plain.items() if k != "data"})
    own = validate(load_config("demo", dataset="photos", data=str(photos)))
    assert trial_key(own.to_dict()) != trial_key({**own.to_dict(), "data": ""})


def test_a_hugging_face_dataset_saved_to_disk(tmp_path):
    hf = pytest.importorskip("datasets")
    imgs = [Image.new("RGB", (10, 10), (i * 20, 0, 0)) for i in range(10)]
    features = hf.Features({"img": hf.Image(), "y": hf.ClassLabel(names=["no", "yes"])})
    train = hf.Dataset.from_dict({"img": imgs, "y": [i % 2 for i in range(10)]}, features=features)
    test = hf.Dataset.from_dict({"img": imgs[:4], "y": [0, 1, 0, 1]}, features=features)
    hf.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "hfds"))
    s = userdata.scan(str(tmp_path / "hfds"))
    assert (
        s.kind == "hf"
        and s.classes == ("no", "yes")
        and {k: len(v) for k, v in s.items.items()}
        == {
            "train": 10,
            "test": 4,
        }
    )
    assert userdata.open_image(s, "train/3").size == (10, 10)
    assert userdata.verify(str(tmp_path / "hfds"), tmp_path / "cache") == []
    splits = build_splits("hfds", seed=0, img_size=8, mean=(0.5,) * 3, std=(0.5,) * 3, data=str(tmp_path / "hfds"))
    assert (len(splits.train) + len(splits.val), len(splits.test), splits.num_classes) == (10, 4, 2)
