"""prefetch: cached items are checked on disk only; missing ones are fetched, or named when they cannot be."""

import dataclasses
import socket
import time

import numpy as np
import pytest

from raystudy.commands import prefetch
from raystudy.data.registry import DATASETS
from raystudy.data.source import DatasetUnavailable, Pool, Source
from raystudy.models import registry

TINY = "vit_tiny_patch16_224.augreg_in21k"  # a small timm ViT whose hub cache entry a test can build


def hub_cache_entry(cache, full, fname="model.safetensors"):
    """Lay out ``full``'s weights in a Hugging Face cache the way huggingface_hub does."""
    import timm
    from safetensors.torch import save_file

    repo_dir = cache / ("models--" + registry.hf_hub_id(full).replace("/", "--"))
    snap = repo_dir / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text("abc123")
    src = timm.create_model(full.split(".")[0], pretrained=False, num_classes=0)
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, snap / fname)


def data_root_with_manual_datasets(root):
    """CIFAR-10-C (snow), a DomainNet domain and ImageNet val, as small as their loaders accept."""
    from PIL import Image

    c = root / "CIFAR-10-C"
    c.mkdir(parents=True)
    np.save(c / "snow.npy", np.zeros((20, 32, 32, 3), dtype=np.uint8))
    np.save(c / "labels.npy", np.zeros(20, dtype=np.int64))
    for folder in ("domainnet/sketch/airplane", "imagenet/val/n01440764"):
        (root / folder).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(root / folder / "0.jpg")
    return root


@pytest.fixture()
def no_network(monkeypatch):
    """Any connection attempt fails the test: the machine is offline and must not notice."""

    def refuse(*a, **k):
        pytest.fail(f"network used: {a[:1]}")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(registry, "hub_reachable", refuse)


@pytest.fixture()
def offline(monkeypatch):
    """No network: connections fail the way they do on an offline machine."""

    def unreachable(*a, **k):
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", unreachable)


@pytest.fixture()
def hf_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))  # restored after the test; main() overwrites both
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    return cache


def test_with_everything_cached_no_network_is_used(tmp_path, hf_cache, no_network, capsys):
    hub_cache_entry(hf_cache, TINY)
    root = data_root_with_manual_datasets(tmp_path / "data")
    rc = prefetch.main(
        [
            "--model",
            TINY,
            "--datasets",
            "cifar10c_snow,domainnet_sketch,imagenet_val,digits_c",
            "--data-root",
            str(root),
            "--hf-cache",
            str(hf_cache),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    lines = out.splitlines()
    assert len(lines) == 5 and all(line.startswith("cached") for line in lines), out
    assert f"{TINY}" in lines[0] and "model.safetensors" in lines[0]


def test_offline_each_missing_item_gets_one_line_naming_it(tmp_path, hf_cache, offline, capsys):
    t0 = time.time()
    rc = prefetch.main(
        [
            "--model",
            "vit_base,vit_huge",
            "--datasets",
            "cifar10,pets,cifar10c_snow,domainnet_clipart",
            "--data-root",
            str(tmp_path / "data"),
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 1
    assert time.time() - t0 < 30  # no minute of hub retries
    lines = out.splitlines()
    assert len(lines) == 6 and all(line.startswith("error: could not fetch") for line in lines), out
    assert "vit_base (vit_base_patch16_224.orig_in21k)" in lines[0] and "huggingface.co is unreachable" in lines[0]
    assert "vit_huge (vit_huge_patch14_224.orig_in21k)" in lines[1]
    assert "'cifar10'" in lines[2] and "www.cs.toronto.edu is unreachable" in lines[2]
    assert "'pets'" in lines[3] and "www.robots.ox.ac.uk is unreachable" in lines[3]
    assert "'cifar10c_snow'" in lines[4] and "zenodo.org" in lines[4]  # where to get it by hand
    assert "'domainnet_clipart'" in lines[5] and "ai.bu.edu" in lines[5]
    assert "4 of 6 not available" not in err and "6 of 6 not available" in err


def test_missing_weights_are_downloaded_safetensors_first(tmp_path, hf_cache, monkeypatch, capsys):
    from huggingface_hub.errors import EntryNotFoundError

    calls = []

    def fake_download(repo, fname, **kw):
        calls.append((repo, fname))
        if fname == "model.safetensors":
            raise EntryNotFoundError("no safetensors in this repo")
        return str(tmp_path / fname)

    monkeypatch.setattr(registry, "hub_reachable", lambda *a, **k: True)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", fake_download)
    assert prefetch.main(["--model", "vit_large"]) == 0
    assert calls == [
        ("timm/vit_large_patch16_224.orig_in21k", "model.safetensors"),
        ("timm/vit_large_patch16_224.orig_in21k", "pytorch_model.bin"),
    ]
    assert capsys.readouterr().out.startswith("fetched vit_large")


def test_missing_torchvision_dataset_is_downloaded_only_after_the_disk_check(tmp_path, monkeypatch, capsys):
    seen = []
    real = DATASETS["cifar100"]

    def fake_load(root, download):
        seen.append(download)
        if not download:
            raise DatasetUnavailable("dataset 'cifar100': not found")
        return Source(Pool([], np.zeros(5)), Pool([], np.zeros(2)))

    monkeypatch.setitem(DATASETS, "cifar100", dataclasses.replace(real, load=fake_load))
    monkeypatch.setattr(registry, "hub_reachable", lambda host, *a, **k: host == "www.cs.toronto.edu")
    assert prefetch.main(["--datasets", "cifar100", "--data-root", str(tmp_path)]) == 0
    assert seen == [False, True]
    assert capsys.readouterr().out.startswith("fetched cifar100: 7 images")


def test_check_reports_and_never_downloads(tmp_path, hf_cache, monkeypatch, capsys):
    monkeypatch.setattr(registry, "hub_reachable", lambda *a, **k: pytest.fail("--check touched the network"))
    rc = prefetch.main(["--model", "vit_base,vit_demo", "--datasets", "study", "--check", "--data-root", str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    assert rc == 1 and len(out) == 13
    assert out[0].startswith("missing vit_base") and out[1].startswith("local   vit_demo")
    assert all(line.startswith("missing dataset") for line in out[2:])


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--model", "vit_bse"], "unknown model 'vit_bse'"),
        (["--datasets", "cifar11"], "unknown dataset 'cifar11'"),
        ([], "nothing to fetch"),
        (["--datasets", "hf:"], "give the hub dataset's name after hf:"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, msg, capsys):
    assert prefetch.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and msg in err and len(err.splitlines()) == 1


def test_a_hub_dataset_missing_offline_is_one_line_naming_it(capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # never the network in a test
    assert prefetch.main(["--datasets", "hf:raystudy-nobody/no-such-data", "--check"]) == 1
    out = capsys.readouterr()
    line = [ln for ln in out.out.splitlines() if "no-such-data" in ln]
    assert len(line) == 1 and line[0].startswith("missing dataset 'hf:raystudy-nobody/no-such-data': not cached"), out
