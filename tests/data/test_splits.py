"""The paper's splits: seeded validation, the low-data draws, the views a run trains on."""

import numpy as np
import pytest
import torch

from raystudy.data import batches
from raystudy.data.splits import build_splits, split_pool
from raystudy.errors import ConfigError


def test_split_pool_is_seeded_disjoint_and_80_20():
    labels = np.repeat(np.arange(10), 50)
    tr0, va0 = split_pool(labels, seed=0)
    tr0b, va0b = split_pool(labels, seed=0)
    tr1, va1 = split_pool(labels, seed=42)
    assert np.array_equal(va0, va0b) and np.array_equal(tr0, tr0b)
    assert not np.array_equal(va0, va1)
    assert len(va0) == 100 and len(tr0) == 400
    assert not set(tr0) & set(va0)
    assert set(tr0) | set(va0) == set(range(500))


def test_low_data_per_class_keeps_ten_per_class():
    labels = np.repeat(np.arange(7), 40)
    tr, va = split_pool(labels, seed=3, low_data=True, low_data_split="per_class")
    counts = np.bincount(labels[tr], minlength=7)
    assert (counts == 10).all()
    assert not set(tr) & set(va)


def test_low_data_is_vtab1k_800_train_200_val_seeded_and_test_unchanged():
    labels = np.repeat(np.arange(10), 150)
    tr, va = split_pool(labels, seed=3, low_data=True)
    assert (len(tr), len(va)) == (800, 200) and not set(tr) & set(va)
    again, other = (
        split_pool(labels, seed=3, low_data=True),
        split_pool(labels, seed=4, low_data=True),
    )
    assert np.array_equal(again[0], tr) and np.array_equal(again[1], va)
    assert not np.array_equal(other[0], tr)
    with pytest.raises(ConfigError, match="vtab1k draws 800 \\+ 200 images, but the training pool holds 280"):
        split_pool(np.repeat(np.arange(7), 40), seed=0, low_data=True)
    kw = dict(seed=0, img_size=16, mean=(0.5,), std=(0.5,), data_path="cache")
    full, low = build_splits("digits_c", **kw), build_splits("digits_c", low_data=True, **kw)
    assert (len(low.train), len(low.val)) == (800, 200) and len(low.test) == len(full.test) == 359


def test_demo_splits_are_60_20_20():
    s = build_splits("digits_c", seed=0, img_size=16, mean=(0.5,), std=(0.5,))
    n = len(s.train) + len(s.val) + len(s.test)
    assert n == 1797
    assert abs(len(s.test) / n - 0.2) < 0.01 and abs(len(s.val) / n - 0.2) < 0.01
    x, y = s.train[0]
    assert x.shape == (1, 16, 16) and -1 <= x.min() and x.max() <= 1


def test_train_batches_are_endless_and_seeded():
    s = build_splits("digits", seed=0, img_size=16, mean=(0.5,), std=(0.5,))
    a = batches.train_batches(s.train, 64, seed=1)
    b = batches.train_batches(s.train, 64, seed=1)
    for _ in range(len(s.train) // 64 + 3):  # past one epoch
        xa, ya = next(a)
        xb, yb = next(b)
        assert torch.equal(ya, yb) and xa.shape[0] == 64
