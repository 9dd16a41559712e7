"""The benchmark sources: their files, where they are expected, and the paper's test images."""

import numpy as np
import pytest
import torch

from raystudy.data.source import DatasetUnavailable
from raystudy.data.sources.domainnet import DOMAINNET_CLEANED_CLIPART, check_image_count
from raystudy.data.splits import build_splits
from raystudy.errors import ConfigError


@pytest.mark.parametrize(
    "name,needle", [("cifar10c_snow", "CIFAR-10-C"), ("domainnet_clipart", "domainnet"), ("cifar10", "download")]
)
def test_missing_files_name_the_expected_path(tmp_path, name, needle):
    with pytest.raises(DatasetUnavailable) as e:
        build_splits(name, seed=0, img_size=224, mean=(0.5,) * 3, std=(0.5,) * 3, root=tmp_path)
    msg = str(e.value)
    assert str(tmp_path) in msg and needle in msg and "\n" not in msg


def test_cifar10c_reads_severity_5(tmp_path):
    d = tmp_path / "CIFAR-10-C"
    d.mkdir()
    imgs = np.lib.format.open_memmap(d / "snow.npy", mode="w+", dtype=np.uint8, shape=(50_000, 32, 32, 3))
    imgs[40_000:] = 255  # severity 5 rows white, the rest black
    imgs.flush()
    np.save(d / "labels.npy", np.tile(np.arange(10), 5_000))
    s = build_splits("cifar10c_snow", seed=0, img_size=32, mean=(0.5,) * 3, std=(0.5,) * 3, root=tmp_path)
    assert len(s.train) + len(s.val) + len(s.test) == 10_000 and len(s.test) == 2_000
    x, _ = s.test[0]
    assert x.shape == (3, 32, 32) and torch.allclose(x, torch.ones_like(x))


def test_domainnet_folders_and_paper_transforms(tmp_path):
    from PIL import Image

    for c in ("apple", "bus"):
        (tmp_path / "domainnet" / "sketch" / c).mkdir(parents=True)
        for i in range(10):
            Image.new("RGB", (300, 200), (i * 20, 0, 0)).save(tmp_path / "domainnet" / "sketch" / c / f"{i}.png")
    s = build_splits("domainnet_sketch", seed=0, img_size=224, mean=(0.5,) * 3, std=(0.5,) * 3, root=tmp_path)
    assert len(s.test) == 4 and len(s.train) + len(s.val) == 16
    xt, _ = s.train[0]
    xe, _ = s.test[0]
    assert xt.shape == xe.shape == (3, 224, 224)


def test_a_domainnet_folder_of_another_release_is_refused_by_its_image_count(tmp_path):
    # the paper's clipart is the cleaned release (the reference's src/vitef/data/images/domainnet.py:98-100)

    d = tmp_path / "domainnet" / "clipart" / "apple"
    d.mkdir(parents=True)
    for i in range(2):
        (d / f"{i}.jpg").write_bytes(b"x")
    check_image_count("domainnet_clipart", tmp_path, 2)
    check_image_count("domainnet_clipart", tmp_path, 0)  # 0: any
    check_image_count("domainnet_sketch", tmp_path, 5)  # not there: the trial says so
    with pytest.raises(ConfigError, match="2 images under .* expected 3 .*groundtruth/clipart.zip"):
        check_image_count("domainnet_clipart", tmp_path, 3)
    assert DOMAINNET_CLEANED_CLIPART == 48_129
