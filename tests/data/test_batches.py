"""The cache path: a tensor cache on disk, views over it, batches on the device, the loop fed by it."""

import pickle
import threading

import numpy as np
import pytest
import torch

from raystudy import paths
from raystudy.data import batches
from raystudy.data.source import ArrayImages, Pool
from raystudy.data.splits import build_splits, resolve_data_path
from raystudy.models import registry
from raystudy.train import engine
from raystudy.train.config import ConfigError, FinetuneConfig, validate
from raystudy.train.plan import resolve


def array_pool(n=300, hw=(32, 32), seed=0):
    rng = np.random.default_rng(seed)
    imgs = rng.integers(0, 256, (n, *hw, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, n)
    return imgs, Pool(ArrayImages(imgs, labels), labels)


def test_cache_reads_back_bit_identical(tmp_path):
    imgs, pool = array_pool()
    logs = []
    p = batches.tensor_cache("toy", "train", pool, 32, tmp_path, cache=tmp_path, log=logs.append)
    assert p.images.dtype == torch.uint8 and p.images.shape == (300, 3, 32, 32)
    assert torch.equal(p.images, torch.from_numpy(imgs).permute(0, 3, 1, 2))  # native size: exact
    assert torch.equal(p.sizes, torch.tensor([[32, 32]]).expand(300, 2))
    assert np.array_equal(p.labels.numpy(), pool.labels)
    # a second open maps the same file, decodes nothing, reads the same bits
    again = batches.tensor_cache("toy", "train", pool, 32, tmp_path, cache=tmp_path, log=logs.append)
    assert len(logs) == 1 and again.path == p.path
    assert torch.equal(again.images, p.images)
    assert not list(paths.tensor_cache(tmp_path).glob("*.tmp*"))  # written atomically, nothing left over


def test_cache_squashes_to_a_fixed_size_and_keeps_original_sizes(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    shapes = [(300, 200), (120, 260), (256, 256), (40, 50)]
    items = [(Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)), i) for i, (h, w) in enumerate(shapes)]
    pool = Pool(items, np.arange(4))
    p = batches.tensor_cache("toy", "test", pool, 64, tmp_path, cache=tmp_path, log=None)
    assert p.images.shape == (4, 3, 64, 64)
    assert p.sizes.tolist() == [list(s) for s in shapes]
    for k, (img, _) in enumerate(items):  # exactly what one decode of the image gives
        assert torch.equal(p.images[k], batches.decode(img, 64)[0])


def test_cache_key_follows_the_recipe(tmp_path):
    _, pool = array_pool(50)
    a = batches.tensor_cache("toy", "train", pool, 32, tmp_path, cache=tmp_path, log=None)
    b = batches.tensor_cache("toy", "train", pool, 16, tmp_path, cache=tmp_path, log=None)
    c = batches.tensor_cache("toy", "test", pool, 32, tmp_path, cache=tmp_path, log=None)
    assert len({a.path, b.path, c.path}) == 3 and b.images.shape[-1] == 16


def test_concurrent_runs_decode_the_cache_once(tmp_path):
    imgs, pool = array_pool(200)
    logs, pools = [], []

    def open_it():
        pools.append(batches.tensor_cache("toy", "train", pool, 32, tmp_path, cache=tmp_path, log=logs.append))

    threads = [threading.Thread(target=open_it) for _ in range(3)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(logs) == 1 and len(pools) == 3
    assert all(torch.equal(p.images, pools[0].images) for p in pools)


def test_a_cached_pool_pickles_as_its_memory_map(tmp_path):
    _, pool = array_pool(2000)
    p = batches.tensor_cache("toy", "train", pool, 32, tmp_path, cache=tmp_path, log=None)
    blob = pickle.dumps(p)
    assert len(blob) < 10_000  # DataLoader workers reopen the map, the pixels are not copied
    q = pickle.loads(blob)
    assert torch.equal(q.images, p.images) and torch.equal(q.labels, p.labels)


def test_cache_path_has_the_same_splits_and_close_eval_images(tmp_path, image_folder):
    image_folder(tmp_path)
    kw = dict(seed=3, img_size=224, mean=(0.5,) * 3, std=(0.5,) * 3, root=tmp_path)
    tv = build_splits("domainnet_sketch", **kw)
    ca = build_splits("domainnet_sketch", **kw, data_path="cache", cache=tmp_path / "c")
    assert isinstance(ca.train, batches.CachedView) and ca.train.pool is ca.val.pool
    assert ca.train.pool.images.shape[-2:] == (256, 256)  # DomainNet's cache size
    assert np.array_equal(ca.train.indices.numpy(), tv.train.indices)
    assert np.array_equal(ca.val.indices.numpy(), tv.val.indices)
    assert len(ca.test) == len(tv.test) == 4
    for i in range(len(tv.test)):
        (xc, yc), (xt, yt) = ca.test[i], tv.test[i]
        assert yc == yt and xc.shape == xt.shape == (3, 224, 224)
        assert (xc - xt).abs().mean() < 2 * 2.5 / 255  # normalised by std 0.5: twice the pixel units
    xc, _ = ca.train[0]
    assert xc.shape == (3, 224, 224)


def test_device_batches_cover_an_epoch_and_are_seeded(tmp_path):
    _, pool = array_pool(100)
    p = batches.tensor_cache("toy", "train", pool, 32, tmp_path, cache=tmp_path, log=None)
    idx = np.arange(10, 90)
    view = batches.CachedView(p, idx, train=True, size=48, mean=(0.5,) * 3, std=(0.5,) * 3)
    cpu = torch.device("cpu")
    a, b = batches.device_batches(view, 16, 0, cpu), batches.device_batches(view, 16, 0, cpu)
    seen = []
    for _ in range(5):  # one epoch: 80 images, 5 batches
        (xa, ya), (xb, yb) = next(a), next(b)
        assert xa.shape == (16, 3, 48, 48) and torch.equal(xa, xb) and torch.equal(ya, yb)
        seen.append(ya)
    labels = torch.cat(seen)
    assert sorted(labels.tolist()) == sorted(pool.labels[idx].tolist())
    c = batches.device_batches(view, 16, 1, cpu)
    assert not torch.equal(next(c)[0], next(batches.device_batches(view, 16, 0, cpu))[0])


def test_data_path_is_validated_with_one_line():
    with pytest.raises(ConfigError) as e:
        validate(FinetuneConfig(data_path="gpu"))
    assert str(e.value) == "unknown data_path 'gpu'; valid: auto, torchvision, cache"
    assert resolve_data_path("auto", "digits_c") == "cache"
    assert resolve_data_path("auto", "cifar10") == "torchvision"


def test_demo_on_both_paths_evaluates_identically(fast_config):
    """The demo's ready tensors are only normalised: both paths hand the model the same images."""
    cfg = fast_config()
    torch.manual_seed(0)
    model, tv, _ = engine.build(resolve(cfg.replace(data_path="torchvision")))
    ca = build_splits("digits_c", seed=0, img_size=16, mean=(0.5,), std=(0.5,), data_path="cache")
    cpu = torch.device("cpu")
    a = engine.evaluate(model, batches.eval_batches(tv.val, 100, cpu), cpu)
    b = engine.evaluate(model, batches.eval_batches(ca.val, 100, cpu), cpu)
    assert a["acc"] == b["acc"] and a["loss"] == pytest.approx(b["loss"], rel=1e-6)


@pytest.mark.parametrize("path", ["torchvision", "cache"])
def test_the_loop_runs_on_either_path(path, fast_config):
    res = engine.train(resolve(fast_config(condition="MHA", data_path=path)))
    assert res["status"] == "finished" and 0 <= res["test_acc"] <= 1


def test_the_hot_loop_reads_nothing_back_from_the_device(fast_config):
    """No .item(), no bool(tensor), no tolist() between steps: every host read of a tensor goes
    through aten::_local_scalar_dense (or a copy to a host list), which the profiler records."""
    from torch.profiler import ProfilerActivity, profile

    cfg = fast_config(condition="full", data_path="cache")
    torch.manual_seed(0)
    model, splits, _ = engine.build(resolve(cfg))
    cpu = torch.device("cpu")
    opt = engine.build_optimizer(model, cfg, cpu)
    groups = engine.trainable_groups(model)
    stream = batches.train_stream(batches.place(splits, cpu).train, 32, 0, cpu)
    engine.train_step(model, [next(stream)], opt, groups, 1.0, cpu)  # warm (lru caches)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            engine.train_step(model, [next(stream)], opt, groups, 1.0, cpu)
    names = {e.key for e in prof.key_averages()}
    assert not names & {"aten::_local_scalar_dense", "aten::item", "aten::is_nonzero"}, names


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_no_host_device_sync_in_the_hot_loop_on_gpu(fast_config):
    cfg = fast_config(condition="full", data_path="cache")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model, splits, _ = engine.build(resolve(cfg))
    model.to(dev)
    opt = engine.build_optimizer(model, cfg, dev)
    groups = engine.trainable_groups(model)
    stream = batches.train_stream(batches.place(splits, dev).train, 32, 0, dev)
    engine.train_step(model, [next(stream)], opt, groups, 1.0, dev)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            engine.train_step(model, [next(stream)], opt, groups, 1.0, dev)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_an_image_dataset_trains_from_its_tensor_cache(tmp_path, monkeypatch, image_folder):
    """End to end: DomainNet-like PNG folders, decoded once into the default cache, a timm ViT at 224."""
    monkeypatch.setenv("RAYSTUDY_CACHE", str(tmp_path / "cache"))
    image_folder(tmp_path, n=6)
    cfg = FinetuneConfig(
        model="vit_tiny_patch16_224",
        pretrained=False,
        dataset="domainnet_sketch",
        data_root=str(tmp_path),
        data_path="cache",
        condition="LN1",
        steps=2,
        warmup_steps=1,
        batch_size=4,
        eval_every=2,
        log_every=1,
        eval_batch_size=8,
    )
    res = engine.train(resolve(cfg))
    assert res["status"] == "finished" and 0 <= res["test_acc"] <= 1
    made = sorted(
        p.name.split("-")[2] for p in paths.tensor_cache(tmp_path / "cache").iterdir() if not p.name.startswith(".")
    )
    assert made == ["256px", "256px"]  # train pool and test, decoded once each
    engine.train(resolve(cfg.replace(seed=1)))  # another run reuses them
    assert len([p for p in paths.tensor_cache(tmp_path / "cache").iterdir() if not p.name.startswith(".")]) == 2


@pytest.mark.parametrize("data_path", ["torchvision", "cache"])
def test_the_normalisation_a_config_names_is_what_reaches_the_model(tmp_path, monkeypatch, data_path, image_folder):
    """The same pixels, normalised by the checkpoint's (0.5, 0.5) or ImageNet's mean/std."""
    monkeypatch.setenv("RAYSTUDY_CACHE", str(tmp_path / "cache"))
    image_folder(tmp_path, n=6)
    base = FinetuneConfig(
        model="vit_tiny_patch16_224",
        pretrained=False,
        dataset="domainnet_sketch",
        data_root=str(tmp_path),
        data_path=data_path,
    )
    seen = {}
    for norm in ("checkpoint", "imagenet"):
        _, splits, _ = engine.build(resolve(base.replace(normalization=norm)))
        seen[norm] = torch.stack([splits.test[i][0] for i in range(len(splits.test))])
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (registry.IMAGENET_MEAN, registry.IMAGENET_STD))
    pixels = seen["checkpoint"] * 0.5 + 0.5
    assert torch.allclose(seen["imagenet"], (pixels - mean) / std, atol=1e-5)
    assert not torch.allclose(seen["imagenet"], seen["checkpoint"], atol=1e-2)
    with pytest.raises(ConfigError, match="normalization 'imagenet' is for RGB models; vit_demo takes 1"):
        validate(FinetuneConfig(normalization="imagenet"))


def test_a_corrupt_tensor_cache_is_found_and_rebuilt(tmp_path):
    imgs, pool = array_pool(n=40)
    logs = []
    p = batches.tensor_cache("toy", "train", pool, 32, tmp_path, cache=tmp_path, log=logs.append)
    want_images, want_labels = p.images.clone(), p.labels.clone()
    folder = p.path
    del p
    # labels shifted by one: the same size, silently wrong
    labels = np.load(folder / "labels.npy")
    np.save(folder / "labels.npy", np.roll(labels, 1))
    logs.clear()
    q = batches.tensor_cache("toy", "train", pool, 32, tmp_path, cache=tmp_path, log=logs.append)
    assert torch.equal(q.labels, want_labels)
    assert any("labels.npy" in line and "rebuilding" in line for line in logs), logs
    del q
    # images truncated
    with open(folder / "images.npy", "r+b") as f:
        f.truncate(1000)
    logs.clear()
    r = batches.tensor_cache("toy", "train", pool, 32, tmp_path, cache=tmp_path, log=logs.append)
    assert torch.equal(r.images, want_images) and torch.equal(r.labels, want_labels)
    assert any("images.npy" in line and "rebuilding" in line for line in logs), logs
