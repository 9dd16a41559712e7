"""What the sources share: the fixed test splits, the paper's among them."""

import numpy as np
import pytest

from raystudy.data.registry import DATASETS
from raystudy.data.source import fixed_split, reference_split


def test_fixed_test_split_does_not_depend_on_the_run():
    a = fixed_split(1000)
    b = fixed_split(1000)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert len(a[1]) == 200


def _reference_indices(n):
    """The reference code's split (vitef.utils.deterministic_split, then np.sort), as it is written there."""
    st0 = np.random.get_state()
    np.random.seed(42)
    indices = np.random.permutation(range(n))
    np.random.set_state(st0)
    n_train = int(0.8 * n)
    return np.sort(indices[:n_train]), np.sort(indices[n_train:])


@pytest.mark.parametrize("n", [10_000, 48_129, 7])
def test_reference_split_is_the_papers(n):
    pool, test = reference_split(n)
    want_pool, want_test = _reference_indices(n)
    assert np.array_equal(pool, want_pool) and np.array_equal(test, want_test)


def test_cifar10c_tests_on_the_papers_images_in_its_order(tmp_path):
    # A CIFAR-10-C folder whose image i carries its row number in its pixels: the loader's test
    # pool must hold the reference's rows of severity 5, sorted.
    d = tmp_path / "CIFAR-10-C"
    d.mkdir()
    rows = np.arange(50_000)
    imgs = np.lib.format.open_memmap(d / "contrast.npy", mode="w+", dtype=np.uint8, shape=(50_000, 4, 4, 3))
    imgs[:, 0, 0, 0], imgs[:, 0, 0, 1] = rows // 256, rows % 256
    imgs.flush()
    np.save(d / "labels.npy", rows % 10)
    src = DATASETS["cifar10c_contrast"].load(tmp_path, False)
    _, want_test = _reference_indices(10_000)
    assert len(src.test.items) == 2_000
    got = [np.asarray(src.test.items[i][0])[0, 0] for i in range(len(src.test.items))]
    assert [int(p[0]) * 256 + int(p[1]) - 40_000 for p in got] == want_test.tolist()
    assert np.array_equal(src.test.labels, (want_test + 40_000) % 10)
