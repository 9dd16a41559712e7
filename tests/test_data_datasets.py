import numpy as np
import pytest
import torch

from raystudy.commands import data as data_command
from raystudy.data import batches, datasets
from raystudy.errors import ConfigError


def test_registry_has_the_studys_11_benchmarks_and_the_demo():
    assert len(datasets.STUDY_DATASETS) == 11
    assert set(datasets.STUDY_DATASETS) <= set(datasets.DATASETS)
    assert datasets.DATASETS["domainnet_sketch"].num_classes == 345
    assert datasets.DATASETS["pets"].num_classes == 37
    assert datasets.DATASETS["flowers102"].num_classes == 102
    assert {"digits", "digits_c", "digits_blur", "digits_rotate", "digits_occlude"} <= set(datasets.DATASETS)


def test_split_pool_is_seeded_disjoint_and_80_20():
    labels = np.repeat(np.arange(10), 50)
    tr0, va0 = datasets.split_pool(labels, seed=0)
    tr0b, va0b = datasets.split_pool(labels, seed=0)
    tr1, va1 = datasets.split_pool(labels, seed=42)
    assert np.array_equal(va0, va0b) and np.array_equal(tr0, tr0b)
    assert not np.array_equal(va0, va1)
    assert len(va0) == 100 and len(tr0) == 400
    assert not set(tr0) & set(va0)
    assert set(tr0) | set(va0) == set(range(500))


def test_low_data_per_class_keeps_ten_per_class():
    labels = np.repeat(np.arange(7), 40)
    tr, va = datasets.split_pool(labels, seed=3, low_data=True, low_data_split="per_class")
    counts = np.bincount(labels[tr], minlength=7)
    assert (counts == 10).all()
    assert not set(tr) & set(va)


def test_low_data_is_vtab1k_800_train_200_val_seeded_and_test_unchanged():
    labels = np.repeat(np.arange(10), 150)
    tr, va = datasets.split_pool(labels, seed=3, low_data=True)
    assert (len(tr), len(va)) == (800, 200) and not set(tr) & set(va)
    again, other = (
        datasets.split_pool(labels, seed=3, low_data=True),
        datasets.split_pool(labels, seed=4, low_data=True),
    )
    assert np.array_equal(again[0], tr) and np.array_equal(again[1], va)
    assert not np.array_equal(other[0], tr)
    with pytest.raises(ConfigError, match="vtab1k draws 800 \\+ 200 images, but the training pool holds 280"):
        datasets.split_pool(np.repeat(np.arange(7), 40), seed=0, low_data=True)
    kw = dict(seed=0, img_size=16, mean=(0.5,), std=(0.5,), data_path="cache")
    full, low = datasets.build_splits("digits_c", **kw), datasets.build_splits("digits_c", low_data=True, **kw)
    assert (len(low.train), len(low.val)) == (800, 200) and len(low.test) == len(full.test) == 359


def test_fixed_test_split_does_not_depend_on_the_run():
    a = datasets._fixed_split(1000)
    b = datasets._fixed_split(1000)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert len(a[1]) == 200


def test_digits_are_scikit_learns_read_without_importing_it():
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    images, target = datasets.digits_arrays()
    d = load_digits()
    assert np.array_equal(images, d.images) and np.array_equal(target, d.target) and target.dtype == np.int64
    code = (
        "import sys; from raystudy.data import datasets; datasets.demo_digits('blur'); print('sklearn' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_demo_shift_is_real_and_labels_unchanged():
    x, y = datasets.demo_digits()
    xc, yc = datasets.demo_digits("invert_noise")
    assert x.shape == (1797, 1, 16, 16) and np.array_equal(y, yc)
    assert 0 <= xc.min() and xc.max() <= 1
    # contrast inversion: mean brightness flips
    assert x.mean() < 0.4 and xc.mean() > 0.6
    assert torch.equal(xc, datasets.demo_digits("invert_noise")[0])  # fixed noise


@pytest.fixture(scope="module")
def clean_and_shifted():
    x, y = datasets.demo_digits()
    return x, y, {shift: datasets.demo_digits(shift) for shift, _ in datasets.DEMO_SHIFTS.values()}


@pytest.mark.parametrize("name", list(datasets.DEMO_SHIFTS))
def test_every_demo_shift_is_a_registered_fixed_dataset_of_the_same_digits(name, clean_and_shifted):
    x, y, shifted = clean_and_shifted
    shift = datasets.DEMO_SHIFTS[name][0]
    xs, ys = shifted[shift]
    assert datasets.check_dataset(name).num_classes == 10
    assert xs.shape == x.shape and xs.dtype == torch.float32 and np.array_equal(ys, y)
    assert 0 <= xs.min() and xs.max() <= 1
    assert torch.equal(xs, datasets.demo_digits(shift)[0])  # seeded: the same images every call
    assert (xs - x).abs().amax(dim=(1, 2, 3)).gt(0.05).float().mean() > 0.9  # nearly every image moved
    s = datasets.build_splits(name, seed=0, img_size=16, mean=(0.5,), std=(0.5,))
    assert (len(s.train), len(s.val), len(s.test)) == (1078, 360, 359)


def _edge_energy(x: torch.Tensor) -> torch.Tensor:
    """Per image, the sum of squared differences between neighbouring pixels: what a blur removes."""
    return x.diff(dim=-1).pow(2).sum(dim=(1, 2, 3)) + x.diff(dim=-2).pow(2).sum(dim=(1, 2, 3))


def test_blur_smooths_edges_and_keeps_the_ink(clean_and_shifted):
    x, _, shifted = clean_and_shifted
    xb = shifted["blur"][0]
    assert (_edge_energy(xb) < 0.5 * _edge_energy(x)).all()
    # a normalised kernel moves ink around; only what spills past the border is lost
    ink = xb.sum(dim=(1, 2, 3)) / x.sum(dim=(1, 2, 3))
    assert ink.min() > 0.7 and ink.max() <= 1.0 + 1e-5


def _orientation(x: torch.Tensor) -> torch.Tensor:
    """Angle (degrees, mod 180) of each image's principal axis, from its central second moments."""
    r, c = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    w = x[:, 0] / x[:, 0].sum(dim=(1, 2), keepdim=True)
    mr, mc = (w * r).sum(dim=(1, 2), keepdim=True), (w * c).sum(dim=(1, 2), keepdim=True)
    rr, cc, rc = (
        (w * (r - mr) ** 2).sum(dim=(1, 2)),
        (w * (c - mc) ** 2).sum(dim=(1, 2)),
        (w * (r - mr) * (c - mc)).sum(dim=(1, 2)),
    )
    return torch.rad2deg(0.5 * torch.atan2(2 * rc, cc - rr)) % 180


def test_rotation_turns_the_digits_by_30_to_60_degrees(clean_and_shifted):
    x, y, shifted = clean_and_shifted
    xr = shifted["rotate"][0]
    ones = torch.as_tensor(y == 1)  # ones are elongated: their principal axis is well defined
    turn = (_orientation(xr[ones]) - _orientation(x[ones])).abs() % 180
    turn = torch.minimum(turn, 180 - turn)
    assert 25 < turn.median() < 65 and (turn > 20).float().mean() > 0.8
    assert (_edge_energy(xr) > 0.7 * _edge_energy(x)).all()  # turned, not blurred


def test_occlusion_paints_one_bright_square_and_leaves_the_rest(clean_and_shifted):
    x, _, shifted = clean_and_shifted
    xo = shifted["occlude"][0]
    side = datasets.DEMO_OCCLUDER
    changed = xo != x
    assert (xo[changed] == 1.0).all()
    for img, ch in zip(xo[:200, 0], changed[:200, 0]):
        rows, cols = ch.any(dim=1).nonzero(), ch.any(dim=0).nonzero()
        assert rows.max() - rows.min() < side and cols.max() - cols.min() < side
        windows = img.unfold(0, side, 1).unfold(1, side, 1)
        assert (windows == 1.0).all(dim=-1).all(dim=-1).any()  # a whole square is bright


def test_demo_splits_are_60_20_20():
    s = datasets.build_splits("digits_c", seed=0, img_size=16, mean=(0.5,), std=(0.5,))
    n = len(s.train) + len(s.val) + len(s.test)
    assert n == 1797
    assert abs(len(s.test) / n - 0.2) < 0.01 and abs(len(s.val) / n - 0.2) < 0.01
    x, y = s.train[0]
    assert x.shape == (1, 16, 16) and -1 <= x.min() and x.max() <= 1


@pytest.mark.parametrize(
    "name,needle", [("cifar10c_snow", "CIFAR-10-C"), ("domainnet_clipart", "domainnet"), ("cifar10", "download")]
)
def test_missing_files_name_the_expected_path(tmp_path, name, needle):
    with pytest.raises(datasets.DatasetUnavailable) as e:
        datasets.build_splits(name, seed=0, img_size=224, mean=(0.5,) * 3, std=(0.5,) * 3, root=tmp_path)
    msg = str(e.value)
    assert str(tmp_path) in msg and needle in msg and "\n" not in msg


def test_cifar10c_reads_severity_5(tmp_path):
    d = tmp_path / "CIFAR-10-C"
    d.mkdir()
    imgs = np.lib.format.open_memmap(d / "snow.npy", mode="w+", dtype=np.uint8, shape=(50_000, 32, 32, 3))
    imgs[40_000:] = 255  # severity 5 rows white, the rest black
    imgs.flush()
    np.save(d / "labels.npy", np.tile(np.arange(10), 5_000))
    s = datasets.build_splits("cifar10c_snow", seed=0, img_size=32, mean=(0.5,) * 3, std=(0.5,) * 3, root=tmp_path)
    assert len(s.train) + len(s.val) + len(s.test) == 10_000 and len(s.test) == 2_000
    x, _ = s.test[0]
    assert x.shape == (3, 32, 32) and torch.allclose(x, torch.ones_like(x))


def test_domainnet_folders_and_paper_transforms(tmp_path):
    from PIL import Image

    for c in ("apple", "bus"):
        (tmp_path / "domainnet" / "sketch" / c).mkdir(parents=True)
        for i in range(10):
            Image.new("RGB", (300, 200), (i * 20, 0, 0)).save(tmp_path / "domainnet" / "sketch" / c / f"{i}.png")
    s = datasets.build_splits("domainnet_sketch", seed=0, img_size=224, mean=(0.5,) * 3, std=(0.5,) * 3, root=tmp_path)
    assert len(s.test) == 4 and len(s.train) + len(s.val) == 16
    xt, _ = s.train[0]
    xe, _ = s.test[0]
    assert xt.shape == xe.shape == (3, 224, 224)


def test_eval_transform_is_resize_then_center_crop():
    from PIL import Image
    from torchvision.transforms import functional as TF

    _, ev = datasets.transforms(224, (0.0,) * 3, (1.0,) * 3)
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 48, 3), dtype=np.uint8))
    want = TF.to_tensor(TF.center_crop(TF.resize(img, 224), 224))
    assert torch.allclose(ev(img), want)


def test_train_batches_are_endless_and_seeded():
    s = datasets.build_splits("digits", seed=0, img_size=16, mean=(0.5,), std=(0.5,))
    a = batches.train_batches(s.train, 64, seed=1)
    b = batches.train_batches(s.train, 64, seed=1)
    for _ in range(len(s.train) // 64 + 3):  # past one epoch
        xa, ya = next(a)
        xb, yb = next(b)
        assert torch.equal(ya, yb) and xa.shape[0] == 64


def test_data_cli_lists_the_registry(capsys):
    assert data_command.main([]) == 0
    out = capsys.readouterr().out
    assert "cifar10c_speckle_noise" in out and "zenodo" in out


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
    pool, test = datasets.reference_split(n)
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
    src = datasets.DATASETS["cifar10c_contrast"].load(tmp_path, False)
    _, want_test = _reference_indices(10_000)
    assert len(src.test.items) == 2_000
    got = [np.asarray(src.test.items[i][0])[0, 0] for i in range(len(src.test.items))]
    assert [int(p[0]) * 256 + int(p[1]) - 40_000 for p in got] == want_test.tolist()
    assert np.array_equal(src.test.labels, (want_test + 40_000) % 10)


def test_the_registry_holds_each_download_source():
    # torchvision downloads these (prefetch, download=true); the others are placed by hand
    fetched = {n for n, info in datasets.DATASETS.items() if info.download}
    assert fetched == {"cifar10", "cifar100", "flowers102", "pets"}
    assert all(datasets.DATASETS[n].download.startswith("https://") for n in fetched)


def test_a_new_dataset_is_one_registry_entry(monkeypatch):
    # docs/development.md's recipe: a loader returning a Source and one DatasetInfo in the
    # registry; the splits, views and checks take it from there
    def load(root, download):
        x = torch.rand(50, 1, 16, 16)
        y = np.arange(50) % 5
        return datasets.Source(
            datasets.Pool(datasets.TensorImages(x[:40], y[:40]), y[:40]),
            datasets.Pool(datasets.TensorImages(x[40:], y[40:]), y[40:]),
        )

    info = datasets.DatasetInfo("toy", 5, load, "generated in the test", image=False)
    monkeypatch.setitem(datasets.DATASETS, "toy", info)
    assert datasets.check_dataset("toy") is info
    s = datasets.build_splits("toy", seed=0, img_size=16, mean=(0.5,), std=(0.5,), data_path="cache")
    assert (len(s.train) + len(s.val), len(s.test), s.num_classes) == (40, 10, 5)


def test_a_domainnet_folder_of_another_release_is_refused_by_its_image_count(tmp_path):
    # the paper's clipart is the cleaned release (the reference's src/vitef/data/images/domainnet.py:98-100)
    from raystudy.data import datasets
    from raystudy.errors import ConfigError

    d = tmp_path / "domainnet" / "clipart" / "apple"
    d.mkdir(parents=True)
    for i in range(2):
        (d / f"{i}.jpg").write_bytes(b"x")
    datasets.check_image_count("domainnet_clipart", tmp_path, 2)
    datasets.check_image_count("domainnet_clipart", tmp_path, 0)  # 0: any
    datasets.check_image_count("domainnet_sketch", tmp_path, 5)  # not there: the trial says so
    with pytest.raises(ConfigError, match="2 images under .* expected 3 .*groundtruth/clipart.zip"):
        datasets.check_image_count("domainnet_clipart", tmp_path, 3)
    assert datasets.DOMAINNET_CLEANED_CLIPART == 48_129
